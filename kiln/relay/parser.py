"""The Relay text parser: `parse(text)` reads what `kiln.relay.printer.astext` writes.

Text with `def @name(...)` functions parses to an IRModule; any other text to
the expression it holds (`fn (%x: Tensor[(2,), float32]) { negative(%x) }`).
Every expression gets a `Span(source_name, line, column)`. `/* ty=... */`
comments are skipped (type inference sets types again); the annotations of
parameters and lets (`%x: T`) become `Var.type_annotation`.

A block (a function body, an If branch, a braced let) is a list of statements
and a result: `%N = expr;` names a value, `let %x: T = expr;` binds a var for
the rest of the block, `free_var %x: T;` declares a var bound nowhere. The
statements of a block are read in a loop, so a chain of 10,000 bindings or lets
never recurses; only brackets nested in the text itself do.

Errors raise `ParseError`, whose message gives `file:line:column`, the line of
source and a caret under the fault, and says what was expected.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import numpy as np

from kiln.errors import KilnError, did_you_mean
from kiln.ir.attrs import AttrsError
from kiln.ir.dtype import DTYPES, DataType
from kiln.ir.module import IRModule
from kiln.ir.span import Span
from kiln.ir.types import (
    ANY,
    Dim,
    FuncType,
    IncompleteType,
    SizeVar,
    TensorType,
    TupleType,
    Type,
    TypeVar,
    dim_add,
    dim_floordiv,
    dim_mul,
)
from kiln.registry import Op
from kiln.relay._text_common import (
    IDENT,
    METADATA_HEADER,
    NUMBER_TOKEN,
    attr_number,
    lists_to_tuples,
    literal_array,
    read_metadata_line,
    read_name,
)
from kiln.relay.expr import Call, Constant, Expr, Function, GlobalVar, If, Let, Tuple, TupleGetItem, Var


class ParseError(KilnError, ValueError):
    """The text is not valid kiln Relay text. `span` is where; `reason` is the message without the excerpt."""

    def __init__(self, message: str, span: Span | None = None, reason: str = "") -> None:
        super().__init__(message)
        self.span = span
        self.reason = reason or message


def parse(text: str, source_name: str = "<text>") -> Any:
    """Parses kiln Relay text.

    Args:
        text: what `astext` wrote, or text written by hand in the same format.
        source_name: the file name given to every span and error message.

    Returns:
        An IRModule when the text defines functions (`def @main(...) { ... }`),
        otherwise the expression (often a Function) that it holds.

    Raises:
        ParseError: the text is malformed; the message points at the fault.
    """
    parser = _Parser(text, source_name)
    try:
        return parser.parse_program()
    except RecursionError:
        raise parser.error("the text nests brackets too deeply to parse", parser.peek()) from None


# ---------------------------------------------------------------------------
# Tokens
# ---------------------------------------------------------------------------

_NAME_OR_QUOTED = r'(?:[A-Za-z_][A-Za-z0-9_]*|"(?:[^"\\\n]|\\.)*")'
_TOKEN = re.compile(
    "|".join(
        [
            r"(?P<space>[ \t\r\f\v]+)",
            r"(?P<newline>\n)",
            r"(?P<comment>//[^\n]*|/\*.*?\*/)",
            r"(?P<graph>%\d+)",
            rf"(?P<local>%{_NAME_OR_QUOTED})",
            rf"(?P<global>@{_NAME_OR_QUOTED})",
            rf"(?P<number>{NUMBER_TOKEN})",
            r"(?P<ident>[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)",
            r'(?P<string>"(?:[^"\\\n]|\\.)*")',
            r"(?P<qmark>\?)",
            r"(?P<punct>->|[()\[\]{},:;=.*<>+-])",
        ]
    ),
    re.DOTALL,
)
_DTYPE_NAMES = tuple(d.name for d in DTYPES)
_METADATA = re.compile(rf"^[ \t]*{re.escape(METADATA_HEADER)}[ \t]*\r?$", re.MULTILINE)


class _Token:
    __slots__ = ("col", "kind", "line", "text")

    def __init__(self, kind: str, text: str, line: int, col: int) -> None:
        self.kind = kind
        self.text = text
        self.line = line
        self.col = col

    def describe(self) -> str:
        return "end of input" if self.kind == "eof" else repr(self.text)


def _excerpt_error(reason: str, source: str, lines: list[str], line: int, col: int, width: int) -> ParseError:
    text = lines[line - 1].rstrip("\r") if 1 <= line <= len(lines) else ""
    start = max(0, col - 1 - 60) if len(text) > 120 else 0  # show a window of very long lines
    shown = text[start : start + 120]
    lead = "..." if start else ""
    tail = "..." if start + 120 < len(text) else ""
    offset = col - 1 - start
    pad = "".join("\t" if ch == "\t" else " " for ch in shown[:offset])
    width = max(1, min(width, len(shown) - offset))
    message = f"{source}:{line}:{col}: {reason}\n    {lead}{shown}{tail}\n    {' ' * len(lead)}{pad}{'^' * width}"
    return ParseError(message, Span(source, line, col), reason)


def _tokenize(text: str, source: str, lines: list[str]) -> list[_Token]:
    tokens: list[_Token] = []
    pos, line, line_start, end = 0, 1, 0, len(text)
    match = _TOKEN.match
    while pos < end:
        m = match(text, pos)
        if m is None:
            col = pos - line_start + 1
            if text.startswith("/*", pos):
                reason = "unterminated comment: '/*' has no closing '*/'"
            elif text[pos] == '"' or text.startswith(('%"', '@"'), pos):
                reason = "unterminated string (a string ends with '\"' on the same line)"
            else:
                reason = f"unexpected character {text[pos]!r}"
            raise _excerpt_error(reason, source, lines, line, col, 1)
        kind = m.lastgroup
        assert kind is not None
        if kind == "newline":
            line += 1
            line_start = m.end()
        elif kind == "comment":
            newlines = m.group().count("\n")
            if newlines:
                line += newlines
                line_start = pos + m.group().rfind("\n") + 1
        elif kind != "space":
            tokens.append(_Token(kind, m.group(), line, pos - line_start + 1))
        pos = m.end()
    if tokens:  # point "found end of input" just past the last token, where the text stopped
        last = tokens[-1]
        tokens.append(_Token("eof", "", last.line, last.col + len(last.text)))
    else:
        tokens.append(_Token("eof", "", 1, 1))
    return tokens


# ---------------------------------------------------------------------------
# The parser
# ---------------------------------------------------------------------------

_Binding = tuple[Expr, int, int]  # the value, and the line and column where its name was defined


class _Parser:
    def __init__(self, text: str, source: str) -> None:
        self.source = source
        self.lines = text.split("\n")
        found = _METADATA.search(text)
        main = text if found is None else text[: found.start()]
        self.has_metadata = found is not None
        self.meta_arrays: dict[int, np.ndarray[Any, Any]] = {}
        if found is not None:
            self._read_metadata(text[found.end() :], text.count("\n", 0, found.start()) + 2)
        self.tokens = _tokenize(main, source, self.lines)
        self.pos = 0
        self.scopes: list[dict[str, _Binding]] = []
        self.meta_consts: dict[int, Constant] = {}
        self.global_vars: dict[str, GlobalVar] = {}
        self.global_uses: dict[str, _Token] = {}
        self.ops: dict[str, Op] = {}

    # --- tokens -------------------------------------------------------------------

    def peek(self, ahead: int = 0) -> _Token:
        return self.tokens[min(self.pos + ahead, len(self.tokens) - 1)]

    def advance(self) -> _Token:
        tok = self.tokens[self.pos]
        if tok.kind != "eof":
            self.pos += 1
        return tok

    def at(self, text: str, ahead: int = 0) -> bool:
        tok = self.peek(ahead)
        return tok.text == text and tok.kind in ("punct", "ident")

    def accept(self, text: str) -> _Token | None:
        return self.advance() if self.at(text) else None

    def expect(self, text: str, why: str = "", opener: _Token | None = None, hint: str = "") -> _Token:
        if self.at(text):
            return self.advance()
        tok = self.peek()
        reason = f"expected '{text}'"
        if why:
            reason += f" {why}"
        if opener is not None:
            reason += f" (to close the '{opener.text}' at {opener.line}:{opener.col})"
        reason += f", found {tok.describe()}"
        raise self.error(reason + (f"; {hint}" if hint else ""), tok)

    def error(self, reason: str, tok: _Token) -> ParseError:
        return _excerpt_error(reason, self.source, self.lines, tok.line, tok.col, len(tok.text))

    def span(self, tok: _Token) -> Span:
        return Span(self.source, tok.line, tok.col)

    # --- names --------------------------------------------------------------------

    @staticmethod
    def _key(tok: _Token) -> str:
        return tok.text if tok.kind == "graph" else "%" + read_name(tok.text)

    def define(self, tok: _Token, value: Expr) -> None:
        key = self._key(tok)
        scope = self.scopes[-1]
        if key in scope:
            _, line, col = scope[key]
            raise self.error(f"{tok.text} is already defined in this block (at {line}:{col})", tok)
        scope[key] = (value, tok.line, tok.col)

    def lookup(self, tok: _Token) -> Expr:
        key = self._key(tok)
        for scope in reversed(self.scopes):
            found = scope.get(key)
            if found is not None:
                return found[0]
        visible = {k for scope in self.scopes for k in scope}
        hint = did_you_mean(key, visible)
        if tok.kind == "graph":
            raise self.error(f"undefined value {tok.text}: no '{tok.text} = ...;' comes before it{hint}", tok)
        raise self.error(f"undefined variable {tok.text}{hint}", tok)

    def global_var(self, tok: _Token) -> GlobalVar:
        name = read_name(tok.text)
        gvar = self.global_vars.get(name)
        if gvar is None:
            gvar = self.global_vars[name] = GlobalVar(name, span=self.span(tok))
        self.global_uses.setdefault(name, tok)
        return gvar

    # --- program and blocks ----------------------------------------------------------

    def parse_program(self) -> IRModule | Expr:
        if not self.at("def"):
            return self.parse_block(None)
        mod = IRModule()
        defined: dict[str, _Token] = {}
        while self.peek().kind != "eof":
            def_tok = self.expect("def", "(a module holds only 'def @name(...) { ... }' functions)")
            name_tok = self.advance()
            if name_tok.kind != "global":
                raise self.error(
                    f"expected a function name like @main after 'def', found {name_tok.describe()}", name_tok
                )
            name = read_name(name_tok.text)
            if name in defined:
                first = defined[name]
                raise self.error(f"function @{name} is defined twice (first at {first.line}:{first.col})", name_tok)
            defined[name] = name_tok
            gvar = self.global_var(name_tok)
            mod[gvar] = self.parse_function(def_tok)
        for name, tok in self.global_uses.items():
            if name not in defined:
                raise self.error(f"undefined function @{name}{did_you_mean(name, defined)}", tok)
        return mod

    def parse_block(self, opener: _Token | None) -> Expr:
        """Statements and a result, up to the `}` that closes `opener` (or the end of the text)."""
        self.scopes.append({})
        lets: list[tuple[Var, Expr, _Token]] = []
        while True:
            tok = self.peek()
            if tok.kind == "graph" and self.at("=", 1):
                self.pos += 2
                value = self.parse_expr()
                self.expect(";", f"after the binding of {tok.text}")
                self.define(tok, value)
            elif tok.kind == "ident" and tok.text == "let":
                self.advance()
                var_tok = self.peek()
                var = self.parse_var_decl("after 'let'")
                self.expect("=", f"after the let variable {var_tok.text}")
                value = self.parse_expr()
                self.expect(";", f"after the value of let {var_tok.text}")
                self.define(var_tok, var)
                lets.append((var, value, tok))
            elif tok.kind == "ident" and tok.text == "free_var":
                self.advance()
                var_tok = self.peek()
                self.define(var_tok, self.parse_var_decl("after 'free_var'"))
                self.expect(";", f"after the free variable {var_tok.text}")
            else:
                break
        result = self.parse_expr()
        if opener is not None:
            self.expect("}", "after the result of the block", opener, "a block ends with its result, such as %0")
        elif self.peek().kind != "eof":
            raise self.error(
                f"expected the end of the text after the result, found {self.peek().describe()}", self.peek()
            )
        self.scopes.pop()
        for var, value, tok in reversed(lets):
            result = Let(var, value, result, span=self.span(tok))
        return result

    def parse_var_decl(self, where: str) -> Var:
        tok = self.advance()
        if tok.kind != "local":
            raise self.error(f"expected a variable like %x {where}, found {tok.describe()}", tok)
        annotation = self.parse_type() if self.accept(":") else None
        return Var(read_name(tok.text), annotation, span=self.span(tok))

    def parse_function(self, start: _Token) -> Function:
        """`(params) -> ret { body }` after `fn` or `def @name`."""
        opener = self.expect("(", "to open the parameter list")
        self.scopes.append({})
        params: list[Var] = []
        fn_attrs: dict[str, Any] = {}
        while not self.at(")"):
            tok = self.peek()
            if tok.kind == "ident" and self.at("=", 1):  # attributes (Primitive=1) follow the parameters
                if tok.text in fn_attrs:
                    raise self.error(f"function attribute {tok.text} is given twice", tok)
                self.pos += 2
                fn_attrs[tok.text] = lists_to_tuples(self.parse_attr_value())
            elif fn_attrs:
                raise self.error("parameters come before the function attributes (name=value)", tok)
            else:
                param = self.parse_var_decl("as a parameter")
                self.define(tok, param)
                params.append(param)
            if not self.accept(","):
                break
        self.expect(")", "after the parameters", opener)
        ret = self.parse_type() if self.accept("->") else None
        body = self.parse_block(self.expect("{", "to open the function body"))
        self.scopes.pop()
        return Function(params, body, ret, fn_attrs, span=self.span(start))

    # --- expressions --------------------------------------------------------------------

    def parse_expr(self) -> Expr:
        start = self.peek()
        expr = self.parse_primary()
        while True:
            if self.at("("):
                opener = self.advance()
                args, attrs = self.parse_args(opener)
                if attrs:
                    raise self.error("only calls of ops take attributes, not calls of function values", attrs[0][0])
                expr = Call(expr, args, span=self.span(start))
            elif self.at("."):
                self.advance()
                tok = self.advance()
                if tok.kind != "number" or not tok.text.isdigit():
                    raise self.error(f"expected a field index after '.', found {tok.describe()}", tok)
                expr = TupleGetItem(expr, int(tok.text), span=self.span(start))
            else:
                return expr

    def parse_primary(self) -> Expr:
        tok = self.peek()
        kind, text = tok.kind, tok.text
        if kind in ("graph", "local"):
            self.advance()
            return self.lookup(tok)
        if kind == "global":
            self.advance()
            return self.global_var(tok)
        if kind == "number" or text in ("True", "False"):
            self.advance()
            try:
                return Constant(literal_array(text), span=self.span(tok))
            except ValueError as err:
                raise self.error(str(err), tok) from None
        if kind == "punct":
            if text == "(":
                return self.parse_tuple()
            if text == "[":
                return self.parse_array()
            if text == "{":
                return self.parse_block(self.advance())
        if kind == "ident":
            if text == "fn":
                return self.parse_function(self.advance())
            if text == "if":
                return self.parse_if()
            if text == "meta":
                return self.parse_meta()
            if self.at("(", 1) and text not in ("let", "free_var", "def"):
                return self.parse_op_call()
        raise self.error(f"expected an expression, found {tok.describe()}", tok)

    def parse_tuple(self) -> Expr:
        opener = self.advance()
        if self.accept(")"):
            return Tuple([], span=self.span(opener))
        first = self.parse_expr()
        if self.accept(")"):
            return first  # parentheses around one expression; (x,) is the 1-tuple
        fields = [first]
        while self.accept(","):
            if self.at(")"):
                break
            fields.append(self.parse_expr())
        self.expect(")", "after the tuple fields", opener)
        return Tuple(fields, span=self.span(opener))

    def parse_if(self) -> Expr:
        if_tok = self.advance()
        opener = self.expect("(", "after 'if'")
        cond = self.parse_expr()
        self.expect(")", "after the condition", opener)
        true_branch = self.parse_block(self.expect("{", "to open the true branch"))
        self.expect("else", "after the true branch of the if")
        false_branch = self.parse_block(self.expect("{", "to open the false branch"))
        return If(cond, true_branch, false_branch, span=self.span(if_tok))

    def parse_meta(self) -> Expr:
        meta_tok = self.advance()
        self.expect("[", "after 'meta'")
        kind = self.advance()
        if kind.text != "relay.Constant":
            raise self.error(f"expected relay.Constant (the only kind of metadata), found {kind.describe()}", kind)
        self.expect("]", "after relay.Constant")
        self.expect("[", "before the metadata index")
        index_tok = self.advance()
        if index_tok.kind != "number" or not index_tok.text.isdigit():
            raise self.error(f"expected a metadata index, found {index_tok.describe()}", index_tok)
        self.expect("]", "after the metadata index")
        index = int(index_tok.text)
        const = self.meta_consts.get(index)
        if const is None:
            if index not in self.meta_arrays:
                where = "the metadata section" if self.has_metadata else f"a metadata section (no '{METADATA_HEADER}')"
                raise self.error(f"meta[relay.Constant][{index}] is not defined in {where}", index_tok)
            const = self.meta_consts[index] = Constant(self.meta_arrays[index], span=self.span(meta_tok))
        return const

    def parse_array(self) -> Expr:
        opener = self.peek()
        nested = self.parse_list(self._array_element)
        shape: list[int] = []
        probe: Any = nested
        while isinstance(probe, list):
            shape.append(len(probe))
            if not probe:
                raise self.error("an array literal needs elements (write empty arrays in the metadata section)", opener)
            probe = probe[0]
        flat: list[tuple[np.ndarray[Any, Any], _Token]] = []
        stack: list[tuple[Any, int]] = [(nested, 0)]
        while stack:
            item, depth = stack.pop()
            if depth == len(shape):
                if isinstance(item, list):
                    raise self.error("ragged array literal: its rows differ in depth", opener)
                flat.append(item)
            elif not isinstance(item, list) or len(item) != shape[depth]:
                raise self.error(f"ragged array literal: expected {shape[depth]} items at depth {depth + 1}", opener)
            else:
                stack.extend((x, depth + 1) for x in reversed(item))
        dtype = flat[0][0].dtype
        for value, tok in flat:
            if value.dtype != dtype:
                raise self.error(f"array elements must share one dtype: found {dtype.name} and {value.dtype.name}", tok)
        data = np.concatenate([value.reshape(1) for value, _ in flat]).reshape(shape)
        return Constant(data, span=self.span(opener))

    def _array_element(self) -> tuple[np.ndarray[Any, Any], _Token]:
        tok = self.advance()
        if tok.kind != "number" and tok.text not in ("True", "False"):
            raise self.error(f"expected a literal such as 1f, 2i64 or True in the array, found {tok.describe()}", tok)
        try:
            return literal_array(tok.text), tok
        except ValueError as err:
            raise self.error(str(err), tok) from None

    def parse_list(self, element: Callable[[], Any]) -> Any:
        """A bracketed, possibly nested list of `element()`s."""
        opener = self.expect("[")
        items: list[Any] = []
        while not self.at("]"):
            items.append(self.parse_list(element) if self.at("[") else element())
            if not self.accept(","):
                break
        self.expect("]", "after the list items", opener)
        return items

    # --- op calls and attributes ----------------------------------------------------------

    def parse_args(self, opener: _Token) -> tuple[list[Expr], list[tuple[_Token, Any]]]:
        args: list[Expr] = []
        attrs: list[tuple[_Token, Any]] = []
        while not self.at(")"):
            tok = self.peek()
            if tok.kind == "ident" and self.at("=", 1):
                if any(key.text == tok.text for key, _ in attrs):
                    raise self.error(f"attribute {tok.text} is given twice", tok)
                self.pos += 2
                attrs.append((tok, self.parse_attr_value()))
            elif attrs:
                raise self.error("positional arguments come before the attributes (name=value)", tok)
            else:
                args.append(self.parse_expr())
            if not self.accept(","):
                break
        self.expect(")", "after the arguments", opener)
        return args, attrs

    def parse_op_call(self) -> Expr:
        name_tok = self.advance()
        name = name_tok.text
        op = self.ops.get(name)
        if op is None:
            try:
                op = self.ops[name] = Op.get(name)
            except KilnError:
                raise self.error(f"unknown op {name!r}{did_you_mean(name, Op.list_names())}", name_tok) from None
        args, attrs = self.parse_args(self.advance())
        attrs_type = op.attrs_type
        if attrs_type is None:
            if attrs:
                raise self.error(f"op {name} takes no attributes", attrs[0][0])
            return Call(op, args, None, span=self.span(name_tok))
        values = {key.text: lists_to_tuples(value) for key, value in attrs}
        make = getattr(attrs_type, "make", None)
        try:
            made = make(name, **values) if make is not None else attrs_type(**values)
        except (KilnError, TypeError, ValueError) as err:
            reason = str(err) if isinstance(err, AttrsError) else f"op {name}: {err}"
            at = name_tok
            for field in re.findall(r"attribute (\w+)", reason):
                at = next((key for key, _ in attrs if key.text == field), at)
                if at is not name_tok:
                    break
            raise self.error(reason, at) from None
        return Call(op, args, made, span=self.span(name_tok))

    def parse_attr_value(self) -> Any:
        if self.at("["):
            return self.parse_list(self.parse_attr_value)
        tok = self.advance()
        if tok.kind == "number":
            try:
                return attr_number(tok.text)
            except ValueError as err:
                raise self.error(str(err), tok) from None
        if tok.kind == "string":
            return json.loads(tok.text)
        if tok.kind == "ident":
            if tok.text in ("True", "False", "None"):
                return {"True": True, "False": False, "None": None}[tok.text]
            if tok.text in _DTYPE_NAMES:
                return DataType.of(tok.text)
        candidates = [*_DTYPE_NAMES, "True", "False", "None"]
        raise self.error(
            'expected an attribute value (a number, "string", [list], True, False, None or a dtype), '
            f"found {tok.describe()}{did_you_mean(tok.text, candidates)}",
            tok,
        )

    # --- types ------------------------------------------------------------------------------

    def parse_type(self) -> Type:
        tok = self.peek()
        if tok.kind == "ident" and tok.text == "Tensor":
            self.advance()
            opener = self.expect("[", "after Tensor")
            shape_open = self.expect("(", "to open the shape, as in Tensor[(1, 3), float32]")
            dims: list[Dim] = []
            while not self.at(")"):
                dims.append(self.parse_dim())
                if not self.accept(","):
                    break
            self.expect(")", "after the dims", shape_open)
            self.expect(",", "between the shape and the dtype")
            dtype = self.parse_dtype()
            self.expect("]", "after the dtype", opener)
            return TensorType(dims, dtype)
        if tok.kind == "punct" and tok.text == "(":
            opener = self.advance()
            fields: list[Type] = []
            trailing_comma = False
            while not self.at(")"):
                fields.append(self.parse_type())
                trailing_comma = self.accept(",") is not None
                if not trailing_comma:
                    break
            self.expect(")", "after the tuple's types", opener)
            return fields[0] if len(fields) == 1 and not trailing_comma else TupleType(fields)
        if tok.kind == "ident" and tok.text == "fn":
            return self.parse_func_type()
        if tok.kind == "qmark":
            self.advance()
            if self.peek().kind == "number" and self.peek().text.isdigit():
                self.advance()  # `?3`: the id of an incomplete type; a parsed one is always new
            return IncompleteType()
        if tok.kind == "ident" and "." not in tok.text and tok.text not in ("let", "fn", "if", "def"):
            self.advance()
            if tok.text in _DTYPE_NAMES:
                return TensorType((), tok.text)  # TVM writes scalar tensor types as their dtype
            return TypeVar(tok.text)
        raise self.error(f"expected a type such as Tensor[(1, 3), float32], found {tok.describe()}", tok)

    def parse_func_type(self) -> Type:
        self.advance()
        type_params: list[TypeVar] = []
        if self.at("<"):
            opener = self.advance()
            while not self.at(">"):
                tok = self.advance()
                if tok.kind != "ident" or not IDENT.fullmatch(tok.text):
                    raise self.error(f"expected a type parameter name, found {tok.describe()}", tok)
                type_params.append(TypeVar(tok.text))
                if not self.accept(","):
                    break
            self.expect(">", "after the type parameters", opener)
        opener = self.expect("(", "to open the argument types of the function type")
        args: list[Type] = []
        while not self.at(")"):
            args.append(self.parse_type())
            if not self.accept(","):
                break
        self.expect(")", "after the argument types", opener)
        self.expect("->", "before the result type of the function type")
        return FuncType(args, self.parse_type(), type_params)

    def parse_dtype(self) -> DataType:
        tok = self.advance()
        if tok.kind == "ident" and tok.text in _DTYPE_NAMES:
            return DataType.of(tok.text)
        raise self.error(f"unknown dtype {tok.describe()}{did_you_mean(tok.text, _DTYPE_NAMES)}", tok)

    def parse_dim(self) -> Dim:
        if self.peek().kind == "qmark":
            self.advance()
            return ANY
        start = self.peek()
        total = self._dim_sum()
        if isinstance(total, int) and total < 0:
            raise self.error(
                f"expected a dim (an int >= 0, a size variable such as n, or ?), found {start.describe()}", start)
        return total

    def _dim_sum(self) -> Dim:
        """`term (+|- term)*`, a term a product of ints, size variables and `floordiv(sum, int)`."""
        total: Dim = 0
        sign = 1
        while True:
            value: Dim = sign
            while True:
                value = dim_mul(value, self._dim_atom())
                if not self.accept("*"):
                    break
            total = dim_add(total, value)
            if self.accept("+"):
                sign = 1
            elif self.accept("-"):
                sign = -1
            else:
                return total

    def _dim_atom(self) -> Dim:
        tok = self.advance()
        if tok.kind == "number" and tok.text.lstrip("-").isdigit():
            return int(tok.text)
        if tok.kind == "ident" and tok.text == "floordiv" and self.at("("):
            opener = self.expect("(", "after floordiv")
            num = self._dim_sum()
            self.expect(",", "between floordiv's dim and divisor")
            den = self.advance()
            if den.kind != "number" or not den.text.isdigit() or int(den.text) < 1:
                raise self.error(f"expected floordiv's divisor (an int >= 1), found {den.describe()}", den)
            self.expect(")", "after floordiv's divisor", opener)
            return dim_floordiv(num, int(den.text))
        if tok.kind == "ident" and IDENT.fullmatch(tok.text):
            return SizeVar(tok.text)
        raise self.error(
            f"expected a dim (an int >= 0, a size variable such as n, or ?), found {tok.describe()}", tok)

    # --- metadata -------------------------------------------------------------------------------

    def _read_metadata(self, section: str, first_line: int) -> None:
        for offset, line in enumerate(section.split("\n")[1:]):
            if not line.strip():
                continue
            number = first_line + offset
            col = len(line) - len(line.lstrip()) + 1
            try:
                index, array = read_metadata_line(line)
            except ValueError as err:
                raise _excerpt_error(f"bad metadata line: {err}", self.source, self.lines, number, col, 1) from None
            if index in self.meta_arrays:
                raise _excerpt_error(
                    f"relay.Constant[{index}] is defined twice in the metadata", self.source, self.lines, number, col, 1
                )
            self.meta_arrays[index] = array
