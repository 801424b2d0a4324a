"""The Relay text printer: `astext(module_or_expr)` writes what `kiln.relay.parser.parse` reads.

The text is in SSA form, as TVM prints it::

    def @main(%x: Tensor[(1, 8), float32]) -> Tensor[(1, 8), float32] {
      %0 = nn.relu(%x) /* ty=Tensor[(1, 8), float32] */;
      %1 = add(%0, 1f) /* ty=Tensor[(1, 8), float32] */;
      %1
    }

Every Call, Tuple, TupleGetItem, If, nested Function and non-tail Let is bound
to a `%N = ...;` line, once, however often the graph uses it. Each node is
bound in the innermost block that holds all of its uses (a node used only in
one branch of an If is printed inside that branch). A Let in tail position
flattens into `let %x = value;` followed by its body, so a chain of lets prints
as a flat list; any other Let prints as a braced block `%N = { let ...; ... }`.

A function's attributes follow its parameters, as TVM writes them:
`fn (%p0: Tensor[(1, 16), float32], Primitive=1) -> Tensor[(1, 16), float32] { ... }`.

Nothing recurses once per node: blocks are emitted by generators driven from
one explicit stack, so chains of any length print.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import attrs as attrs_lib

from kiln.ir import graph
from kiln.ir.attrs import Attrs
from kiln.ir.module import IRModule
from kiln.ir.types import TupleType, Type
from kiln.registry import Op
from kiln.relay._text_common import (
    METADATA_HEADER,
    attr_value_text,
    constant_text,
    metadata_line,
    name_text,
    type_text,
)
from kiln.relay.expr import (
    Call,
    Constant,
    Expr,
    Function,
    GlobalVar,
    If,
    Let,
    Tuple,
    TupleGetItem,
    Var,
)
from kiln.relay.visitor import post_order

_INDENT = "  "
_ATOMS = (Var, GlobalVar, Constant)
_TYPE_COMMENT_LIMIT = 400  # characters of a `/* ty=... */` comment before it ends in `...`

# A generator of output: each item is a finished line (its text and the nodes it binds) or a generator to run first.
_Emit = Iterator["tuple[str, tuple[Expr, ...]] | _Emit"]


def astext(obj: IRModule | Expr, show_types: bool = True, show_meta_data: bool = True) -> str:
    """The text of a module, function or expression.

    Args:
        obj: an IRModule (every function, as `def @name(...) { ... }`), a Function
            (`fn (...) { ... }`) or any other expression (its bindings and result).
        show_types: write the inferred type of each typed binding as `/* ty=... */`.
        show_meta_data: write the metadata section (large constants) at the end;
            without it the text cannot be parsed back if it refers to one.

    Returns:
        The text; `parse(astext(x))` rebuilds `x`.
    """
    meta = _Meta()
    chunks: list[str] = []
    if isinstance(obj, IRModule):
        for gvar, func in obj.items():
            if not isinstance(func, Function):
                raise TypeError(f"module function {gvar.name_hint!r} is a {type(func).__name__}, not a Function")
            chunks.append("\n".join(_FunctionPrinter(func, meta, show_types, gvar.name_hint).lines()))
    elif isinstance(obj, Expr):
        chunks.append("\n".join(_FunctionPrinter(obj, meta, show_types, None).lines()))
    else:
        raise TypeError(f"astext prints an IRModule or a relay expression, not {type(obj).__name__}")
    text = "\n\n".join(chunks)
    if show_meta_data and meta.arrays:
        body = "\n".join(metadata_line(i, c.data) for i, c in enumerate(meta.arrays))
        text += f"\n\n{METADATA_HEADER}\n{body}"
    return text + "\n"


def excerpt(func_or_mod: IRModule | Expr, node: Expr, context: int = 3, show_types: bool = True) -> str:
    """The printed text around the line that binds `node`, with that line marked.

    Used in diagnostics: the marked line carries `>` in the margin and a row of
    `^` under it; `context` lines are shown on each side. For a module, the
    function that holds `node` is printed.

    Args:
        func_or_mod: the function (or module, or any expression) that holds `node`.
        node: the expression to point at.
        context: how many lines to show above and below.
        show_types: write `/* ty=... */` comments.

    Returns:
        The excerpt, or "" if `node` is not part of `func_or_mod`.
    """
    name: str | None = None
    root: Expr | None = None
    if isinstance(func_or_mod, IRModule):
        for gvar, func in func_or_mod.items():
            if isinstance(func, Function) and any(n is node for n in post_order(func)):
                name, root = gvar.name_hint, func
                break
    elif any(n is node for n in post_order(func_or_mod)):
        root = func_or_mod
    if root is None:
        return ""
    printer = _FunctionPrinter(root, _Meta(), show_types, name)
    lines = printer.lines()
    index = printer.line_of(node)
    lo, hi = max(0, index - context), min(len(lines), index + context + 1)
    width = len(str(hi))
    out: list[str] = []
    for i in range(lo, hi):
        mark = ">" if i == index else " "
        out.append(f"{mark} {i + 1:>{width}} | {lines[i]}")
        if i == index:
            text = lines[i]
            start = len(text) - len(text.lstrip())
            out.append(f"  {'':>{width}} | {' ' * start}{'^' * max(1, len(text.rstrip()) - start)}")
    return "\n".join(out)


class _Meta:
    """The constants written to the metadata section, numbered in order of first reference."""

    def __init__(self) -> None:
        self.arrays: list[Constant] = []
        self.index: dict[int, int] = {}

    def ref(self, const: Constant) -> str:
        if id(const) not in self.index:
            self.index[id(const)] = len(self.arrays)
            self.arrays.append(const)
        return f"meta[relay.Constant][{self.index[id(const)]}]"


class _Scope:
    """A block of the text: a function body, an If branch, or the body of a Let."""

    __slots__ = ("depth", "nodes", "parent", "root")

    def __init__(self, root: Expr, parent: _Scope | None) -> None:
        self.root = root
        self.parent = parent
        self.depth: int = 0 if parent is None else parent.depth + 1
        self.nodes: list[Expr] = []  # the nodes bound in this block, in dependency order


def _common_scope(a: _Scope, b: _Scope) -> _Scope:
    while a.depth > b.depth:
        a = a.parent  # type: ignore[assignment]  # depth > 0 means there is a parent
    while b.depth > a.depth:
        b = b.parent  # type: ignore[assignment]  # as above
    while a is not b:
        a, b = a.parent, b.parent  # type: ignore[assignment]  # both share the root scope
    return a


class _FunctionPrinter:
    """Prints one top-level function (named for a module, else `fn`) or one expression."""

    def __init__(self, root: Expr, meta: _Meta, show_types: bool, global_name: str | None) -> None:
        self.root = root
        self.meta = meta
        self.show_types = show_types
        self.global_name = global_name
        self.names: dict[int, str] = {}  # id(Var) -> printed name
        self.used_names: set[str] = set()
        self.ssa: dict[int, str] = {}  # id(node) -> %N
        self.line_index: dict[int, int] = {}
        self.uses: dict[int, list[Expr]] = {}
        self.inlined: set[int] = set()  # let values written on their let line
        self.body_scope: dict[int, _Scope] = {}  # id(Function or Let) -> its body block
        self.branch_scopes: dict[int, tuple[_Scope, _Scope]] = {}  # id(If) -> its two blocks
        self.top = _Scope(root, None)
        self.free: list[Var] = []  # vars used but bound nowhere in `root`, declared by `free_var` lines
        self.literals: dict[int, str | None] = {}  # id(Constant) -> its inline text, None for metadata
        self._output: list[str] | None = None
        self.type_texts: dict[int, tuple[Type, str]] = {}  # id(type) -> (type, its comment text)
        self._analyse()

    # --- analysis -----------------------------------------------------------------

    def _analyse(self) -> None:
        nodes = _print_order(self.root)
        slot_uses: dict[int, int] = {}
        for node in nodes:
            for child in _operands(node):
                self.uses.setdefault(id(child), []).append(node)
                slot_uses[id(child)] = slot_uses.get(id(child), 0) + 1
        scope_of: dict[int, _Scope] = {id(self.root): self.top}
        for node in reversed(nodes):  # parents before children: each scope is final when reached
            here = scope_of.get(id(node))
            if here is None:  # an unused parameter or let var: declared, never used
                continue
            for child, inner in self._child_scopes(node, here):
                seen = scope_of.get(id(child))
                scope_of[id(child)] = inner if seen is None else _common_scope(seen, inner)
        bound_vars: set[int] = set()
        for node in nodes:
            if isinstance(node, Function):
                bound_vars.update(id(p) for p in node.params)
            elif isinstance(node, Let):
                bound_vars.add(id(node.var))
        self.free = [n for n in nodes if isinstance(n, Var) and id(n) not in bound_vars]
        for node in nodes:
            users = self.uses.get(id(node), [])
            if isinstance(node, Let | Tuple | TupleGetItem | Call | If | Function) and len(users) == 1:
                user = users[0]
                if isinstance(user, Let) and user.value is node and user.body is not node and node is not self.root:
                    self.inlined.add(id(node))
                    continue
            if self._is_bound(node, slot_uses.get(id(node), 0)):
                scope_of[id(node)].nodes.append(node)

    def _is_bound(self, node: Expr, n_uses: int) -> bool:
        if node is self.root and isinstance(node, Function):
            return False  # printed as the header of the text
        if isinstance(node, Constant):
            return n_uses > 1 and self._literal(node) is not None  # keep a shared literal shared
        return not isinstance(node, _ATOMS)

    def _child_scopes(self, node: Expr, here: _Scope) -> list[tuple[Expr, _Scope]]:
        if isinstance(node, If):
            branches = (_Scope(node.true_branch, here), _Scope(node.false_branch, here))
            self.branch_scopes[id(node)] = branches
            return [(node.cond, here), (node.true_branch, branches[0]), (node.false_branch, branches[1])]
        if isinstance(node, Let):
            body = self.body_scope[id(node)] = _Scope(node.body, here)
            return [(node.value, here), (node.body, body)]
        if isinstance(node, Function):
            body = self.body_scope[id(node)] = _Scope(node.body, here)
            return [(node.body, body)]
        return [(child, here) for child in _operands(node)]

    # --- names and references ---------------------------------------------------------

    def var_name(self, var: Var) -> str:
        name = self.names.get(id(var))
        if name is None:
            base = var.name_hint
            name, k = base, 0
            while name in self.used_names:
                k += 1
                name = f"{base}_{k}"
            self.used_names.add(name)
            name = self.names[id(var)] = name_text("%", name)
        return name

    def ref(self, node: Expr) -> str:
        if id(node) in self.ssa:
            return self.ssa[id(node)]
        if isinstance(node, Var):
            return self.var_name(node)
        if isinstance(node, GlobalVar):
            return name_text("@", node.name_hint)
        if isinstance(node, Constant):
            return self._literal(node) or self.meta.ref(node)
        # not bound in an enclosing block: only ill-formed IR (a node used outside its let's scope) gets here
        return f"%<unbound {type(node).__name__}>"

    def _literal(self, const: Constant) -> str | None:
        if id(const) not in self.literals:
            self.literals[id(const)] = constant_text(const.data)
        return self.literals[id(const)]

    def _decl(self, var: Var) -> str:
        ann = var.type_annotation
        return self.var_name(var) + ("" if ann is None else f": {type_text(ann)}")

    def _ty(self, node: Expr) -> str:
        # a comment, so long types are cut short: a 10,000-deep tuple would print its whole type per node
        if not (self.show_types and node.has_type):
            return ""
        return f" /* ty={_type_comment(node.checked_type, self.type_texts)} */"

    def _inline(self, node: Expr) -> str:
        if isinstance(node, Call):
            args = [self.ref(a) for a in node.args]
            if isinstance(node.op, Op):
                if node.attrs is not None:
                    args.extend(f"{k}={attr_value_text(v)}" for k, v in _non_default_attrs(node.attrs))
                return f"{node.op.name}({', '.join(args)})"
            return f"{self.ref(node.op)}({', '.join(args)})"
        if isinstance(node, Tuple):
            fields = [self.ref(f) for f in node.fields]
            return f"({fields[0]},)" if len(fields) == 1 else f"({', '.join(fields)})"
        if isinstance(node, TupleGetItem):
            return f"{self.ref(node.tuple_value)}.{node.index}"
        if isinstance(node, Constant):
            return self._literal(node) or self.meta.ref(node)
        return self.ref(node)

    def _fn_header(self, func: Function, lead: str) -> str:
        # attributes follow the parameters, as TVM writes them: fn (%p0: T, Primitive=1) -> T {
        items = [self._decl(p) for p in func.params]
        items.extend(f"{k}={attr_value_text(v)}" for k, v in func.attrs.items())
        params = ", ".join(items)
        ret = "" if func.ret_type is None else f" -> {type_text(func.ret_type)}"
        return f"{lead}({params}){ret} {{"

    # --- emission -----------------------------------------------------------------

    def lines(self) -> list[str]:
        """The printed lines (computed once)."""
        if self._output is None:
            self._output = self._run(self._emit_top())
        return self._output

    def line_of(self, node: Expr) -> int:
        """The index of the line that binds or first uses `node` (0 if it is not printed)."""
        self.lines()
        if id(node) in self.line_index:
            return self.line_index[id(node)]
        for user in self.uses.get(id(node), []):
            if id(user) in self.line_index:
                return self.line_index[id(user)]
        return 0

    def _run(self, top: _Emit) -> list[str]:
        out: list[str] = []
        stack: list[_Emit] = [top]
        while stack:
            item = next(stack[-1], None)
            if item is None:
                stack.pop()
            elif isinstance(item, tuple):
                text, nodes = item
                for node in nodes:
                    self.line_index.setdefault(id(node), len(out))
                out.append(text)
            else:
                stack.append(item)
        return out

    def _emit_top(self) -> _Emit:
        root = self.root
        if isinstance(root, Function):
            for p in root.params:  # parameters keep their own names; a clashing free var gets the suffix
                self.var_name(p)
        if self.global_name is not None:
            assert isinstance(root, Function)
            yield self._fn_header(root, f"def {name_text('@', self.global_name)}"), (root, *root.params)
        pad = _INDENT if self.global_name is not None else ""
        for var in self.free:
            yield f"{pad}free_var {self._decl(var)};", (var,)
        if isinstance(root, Function):
            if self.global_name is None:
                yield self._fn_header(root, "fn "), (root, *root.params)
            yield self._emit_scope(self.body_scope[id(root)], 1)
            yield "}", ()
        else:
            yield self._emit_scope(self.top, 0)

    def _emit_scope(self, scope: _Scope, depth: int) -> _Emit:
        for node in scope.nodes:
            if node is scope.root and isinstance(node, Let):
                yield self._emit_let(node, depth)  # a tail let flattens: its body ends this block
                return
            self.ssa[id(node)] = f"%{len(self.ssa)}"
            yield self._emit_binding(node, f"{self.ssa[id(node)]} = ", depth, (node,))
        yield _INDENT * depth + self.ref(scope.root), ()

    def _emit_let(self, let: Let, depth: int) -> _Emit:
        prefix = f"let {self._decl(let.var)} = "
        if id(let.value) in self.inlined:
            yield self._emit_binding(let.value, prefix, depth, (let, let.var, let.value))
        else:
            yield f"{_INDENT * depth}{prefix}{self.ref(let.value)};", (let, let.var)
        yield self._emit_scope(self.body_scope[id(let)], depth)

    def _emit_binding(self, node: Expr, prefix: str, depth: int, marks: tuple[Expr, ...]) -> _Emit:
        pad = _INDENT * depth
        if isinstance(node, If):
            true_scope, false_scope = self.branch_scopes[id(node)]
            yield f"{pad}{prefix}if ({self.ref(node.cond)}) {{", marks
            yield self._emit_scope(true_scope, depth + 1)
            yield f"{pad}}} else {{", ()
            yield self._emit_scope(false_scope, depth + 1)
            yield f"{pad}}}{self._ty(node)};", ()
        elif isinstance(node, Function):
            yield pad + self._fn_header(node, prefix + "fn "), (*marks, *node.params)
            yield self._emit_scope(self.body_scope[id(node)], depth + 1)
            yield f"{pad}}}{self._ty(node)};", ()
        elif isinstance(node, Let):
            yield f"{pad}{prefix}{{", marks
            yield self._emit_let(node, depth + 1)
            yield f"{pad}}}{self._ty(node)};", ()
        else:
            yield f"{pad}{prefix}{self._inline(node)}{self._ty(node)};", marks


def _type_comment(t: Type, cache: dict[int, tuple[Type, str]]) -> str:
    """`type_text(t)`, cut after about `_TYPE_COMMENT_LIMIT` characters, for a `/* ty=... */` comment.

    Each type's text is made once per printer from its parts' (cut) texts: the types of a
    graph of nested tuples nest as deep as it, and each node's type contains the last one's.
    """
    stack: list[tuple[Type, bool]] = [(t, False)]
    while stack:
        cur, ready = stack.pop()
        if id(cur) in cache:
            continue
        parts = list(cur.fields) if isinstance(cur, TupleType) else []
        if not ready and parts:
            stack.append((cur, True))
            stack.extend((p, False) for p in parts if id(p) not in cache)
            continue
        if isinstance(cur, TupleType):
            inner = ", ".join(cache[id(p)][1] for p in parts)
            text = f"({inner},)" if len(parts) == 1 else f"({inner})"
        else:
            text = type_text(cur, _TYPE_COMMENT_LIMIT)
        if len(text) > _TYPE_COMMENT_LIMIT:
            text = text[:_TYPE_COMMENT_LIMIT] + "..."
        cache[id(cur)] = (cur, text)
    return cache[id(t)][1]


def _print_order(root: Expr) -> list[Expr]:
    """Post order, except that a called function value comes after the call's arguments.

    So a fused group's `fn (...) { ... }` is printed just before the line that calls it.
    """
    def children(node: Expr) -> tuple[Expr, ...]:
        if isinstance(node, Call) and not isinstance(node.op, Op):
            return (*node.args, node.op)
        return node.children()

    return graph.post_order([root], children)


def _operands(node: Expr) -> tuple[Expr, ...]:
    """The sub-expressions that the text writes (a let's var is declared, not used)."""
    if isinstance(node, Let):
        return (node.value, node.body)
    if isinstance(node, Function):
        return (node.body,)
    return node.children()


def _non_default_attrs(value: Attrs) -> list[tuple[str, Any]]:
    """The attribute values that differ from their field's default, in declaration order."""
    cls: Any = type(value)  # an attrs class (Attrs itself is not one, so type it loosely)
    if not attrs_lib.has(cls):
        return []
    out: list[tuple[str, Any]] = []
    for field in attrs_lib.fields(cls):
        current = getattr(value, field.name)
        default = field.default
        if default is attrs_lib.NOTHING:
            out.append((field.name, current))
            continue
        if isinstance(default, attrs_lib.Factory):  # type: ignore[arg-type]  # Factory is a class at run time
            default = default.factory(value) if default.takes_self else default.factory()
        if field.converter is not None:
            with contextlib.suppress(Exception):  # a default its own converter refuses: compare it as written
                default = field.converter(default)
        if not _same_value(current, default):
            out.append((field.name, current))
    return out


def _same_value(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, tuple):
        return len(a) == len(b) and all(_same_value(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float):
        return repr(a) == repr(b)
    return bool(a == b)
