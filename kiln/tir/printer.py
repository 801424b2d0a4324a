"""Readable Python-like text of loop IR: `print(prim_func)` shows what will be compiled.

Variables are named by their `name`, with a `_N` suffix where two distinct
vars share a name, so the text is canonical: structurally equal functions
print the same, which makes it usable as a structural key.
"""

from __future__ import annotations

from kiln.tir.expr import (
    BinaryOp,
    Buffer,
    BufferLoad,
    Call,
    Cast,
    FloatImm,
    IntImm,
    Max,
    Min,
    Not,
    PrimExpr,
    Select,
    Var,
)
from kiln.tir.stmt import (
    Allocate,
    BufferStore,
    Evaluate,
    For,
    ForKind,
    IfThenElse,
    LetStmt,
    PrimFunc,
    SeqStmt,
    Stmt,
)


class _Names:
    def __init__(self) -> None:
        self.names: dict[int, str] = {}
        self.used: set[str] = set()

    def __call__(self, obj: Var | Buffer) -> str:
        key = id(obj)
        if key not in self.names:
            base = obj.name
            name, n = base, 0
            while name in self.used:
                n += 1
                name = f"{base}_{n}"
            self.used.add(name)
            self.names[key] = name
        return self.names[key]


# Python's binding strengths: the text parses back to the same tree.
_PREC = {
    "or": 1,
    "and": 2,
    "not": 3,
    "==": 4,
    "!=": 4,
    "<": 4,
    "<=": 4,
    ">": 4,
    ">=": 4,
    "|": 5,
    "^": 6,
    "&": 7,
    "<<": 8,
    ">>": 8,
    "+": 9,
    "-": 9,
    "*": 10,
    "/": 10,
    "//": 10,
    "%": 10,
}
_UNARY = 11  # a negative literal, `-x`
_ATOM = 12


def _expr(e: PrimExpr, names: _Names) -> str:
    return _expr_prec(e, names)[0]


def _paren(e: PrimExpr, names: _Names, need: int) -> str:
    """`e`'s text, parenthesized when it binds less tightly than `need`."""
    text, prec = _expr_prec(e, names)
    return text if prec >= need else f"({text})"


def _expr_prec(e: PrimExpr, names: _Names) -> tuple[str, int]:
    if isinstance(e, Var):
        return names(e), _ATOM
    if isinstance(e, IntImm):
        if e.dtype == "bool":
            return ("True" if e.value else "False"), _ATOM
        if e.dtype == "int32":
            return str(e.value), (_ATOM if e.value >= 0 else _UNARY)
        return f"{e.dtype}({e.value})", _ATOM
    if isinstance(e, FloatImm):
        if e.dtype == "float32":
            return repr(e.value), (_ATOM if e.value >= 0 or e.value != e.value else _UNARY)
        return f"{e.dtype}({e.value!r})", _ATOM
    if isinstance(e, (Min, Max)):
        return f"{e.symbol}({_expr(e.a, names)}, {_expr(e.b, names)})", _ATOM
    if isinstance(e, BinaryOp):
        p = _PREC[e.symbol]
        if p == _PREC["<"]:  # comparisons chain in Python: parenthesize comparison operands
            return f"{_paren(e.a, names, p + 1)} {e.symbol} {_paren(e.b, names, p + 1)}", p
        return f"{_paren(e.a, names, p)} {e.symbol} {_paren(e.b, names, p + 1)}", p
    if isinstance(e, Not):
        return f"not {_paren(e.a, names, _PREC['not'])}", _PREC["not"]
    if isinstance(e, Cast):
        return f"{e.dtype}({_expr(e.value, names)})", _ATOM
    if isinstance(e, Select):
        return f"select({_expr(e.cond, names)}, {_expr(e.true_value, names)}, {_expr(e.false_value, names)})", _ATOM
    if isinstance(e, Call):
        # The result dtype is shown where it is not the first argument's (isnan -> bool).
        ret = "" if e.args and e.args[0].dtype == e.dtype else f"<{e.dtype}>"
        return f"{e.name}{ret}({', '.join(_expr(a, names) for a in e.args)})", _ATOM
    if isinstance(e, BufferLoad):
        return f"{names(e.buffer)}[{', '.join(_expr(i, names) for i in e.indices)}]", _ATOM
    raise TypeError(f"unknown loop-IR expression {type(e).__name__}")


def _stmt(s: Stmt, names: _Names, indent: int, out: list[str]) -> None:
    pad = "    " * indent
    stack: list[tuple[Stmt, int]] = [(s, indent)]
    while stack:
        s, indent = stack.pop()
        pad = "    " * indent
        if isinstance(s, SeqStmt):
            if not s.stmts:
                out.append(f"{pad}pass")
            stack.extend((c, indent) for c in reversed(s.stmts))
        elif isinstance(s, BufferStore):
            idx = ", ".join(_expr(i, names) for i in s.indices)
            out.append(f"{pad}{names(s.buffer)}[{idx}] = {_expr(s.value, names)}")
        elif isinstance(s, For):
            var = names(s.loop_var)
            ext = _expr(s.extent, names)
            if isinstance(s.min, IntImm) and s.min.value == 0 and s.min.dtype == s.extent.dtype:
                rng = f"range({ext})"
            else:
                end = s.min + s.extent if s.min.dtype == s.extent.dtype else s.extent
                rng = f"range({_expr(s.min, names)}, {_expr(end, names)})"
            if s.kind is ForKind.SERIAL:
                comment = ""
            elif s.kind is ForKind.THREAD_BINDING:
                comment = f"  # bound to {s.thread_tag}"
            else:
                comment = f"  # {s.kind.value}"
            if s.annotations:
                pragmas = ", ".join(f"{k}={s.annotations[k]!r}" for k in sorted(s.annotations))
                comment += f"{'' if comment else '  #'} pragmas: {pragmas}"
            out.append(f"{pad}for {var} in {rng}:{comment}")
            stack.append((s.body, indent + 1))
        elif isinstance(s, Allocate):
            b = s.buffer
            shape = ", ".join(_expr(d, names) for d in b.shape)
            out.append(f"{pad}{names(b)} = allocate(({shape}), {b.dtype}, {b.scope!r})")
            stack.append((s.body, indent))
        elif isinstance(s, IfThenElse):
            out.append(f"{pad}if {_expr(s.cond, names)}:")
            if s.else_case is not None:
                stack.append((s.else_case, indent + 1))
                stack.append((_ElseMarker(), indent))
            stack.append((s.then_case, indent + 1))
        elif isinstance(s, _ElseMarker):
            out.append(f"{pad}else:")
        elif isinstance(s, LetStmt):
            out.append(f"{pad}{names(s.var)} = {_expr(s.value, names)}")
            stack.append((s.body, indent))
        elif isinstance(s, Evaluate):
            out.append(f"{pad}{_expr(s.value, names)}")
        else:
            raise TypeError(f"unknown loop-IR statement {type(s).__name__}")


class _ElseMarker(Stmt):
    pass


def expr_text(e: PrimExpr) -> str:
    """One expression as text."""
    return _expr(e, _Names())


def stmt_text(s: Stmt) -> str:
    """A statement as indented text."""
    out: list[str] = []
    _stmt(s, _Names(), 0, out)
    return "\n".join(out)


def func_text(f: PrimFunc) -> str:
    """A PrimFunc as a Python-like `def` with its buffers' shapes and dtypes."""
    names = _Names()
    params = ", ".join(
        f"{names(b)}: {b.dtype}[{', '.join(_expr(d, names) for d in b.shape)}]"
        + ("" if b.scope == "global" else f" @ {b.scope}")
        for b in f.params
    )
    out = [f"def {f.name}({params}):"]
    size_dtypes = [f"{names(v)}: {v.dtype}" for v in f.size_vars if v.dtype != "int32"]
    if size_dtypes:
        out.append(f"    # sizes: {', '.join(size_dtypes)}")
    if f.attrs:
        out.append(f"    # attrs: {', '.join(f'{k}={f.attrs[k]!r}' for k in sorted(f.attrs))}")
    _stmt(f.body, names, 1, out)
    return "\n".join(out)
