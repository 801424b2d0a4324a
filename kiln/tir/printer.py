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


def _expr(e: PrimExpr, names: _Names) -> str:
    if isinstance(e, Var):
        return names(e)
    if isinstance(e, IntImm):
        if e.dtype == "bool":
            return "True" if e.value else "False"
        return str(e.value) if e.dtype == "int32" else f"{e.dtype}({e.value})"
    if isinstance(e, FloatImm):
        return repr(e.value) if e.dtype == "float32" else f"{e.dtype}({e.value!r})"
    if isinstance(e, (Min, Max)):
        return f"{e.symbol}({_expr(e.a, names)}, {_expr(e.b, names)})"
    if isinstance(e, BinaryOp):
        return f"({_expr(e.a, names)} {e.symbol} {_expr(e.b, names)})"
    if isinstance(e, Not):
        return f"(not {_expr(e.a, names)})"
    if isinstance(e, Cast):
        return f"{e.dtype}({_expr(e.value, names)})"
    if isinstance(e, Select):
        return f"select({_expr(e.cond, names)}, {_expr(e.true_value, names)}, {_expr(e.false_value, names)})"
    if isinstance(e, Call):
        return f"{e.name}({', '.join(_expr(a, names) for a in e.args)})"
    if isinstance(e, BufferLoad):
        return f"{names(e.buffer)}[{', '.join(_expr(i, names) for i in e.indices)}]"
    raise TypeError(f"unknown loop-IR expression {type(e).__name__}")


def _stmt(s: Stmt, names: _Names, indent: int, out: list[str]) -> None:
    pad = "    " * indent
    stack: list[tuple[Stmt, int]] = [(s, indent)]
    while stack:
        s, indent = stack.pop()
        pad = "    " * indent
        if isinstance(s, SeqStmt):
            stack.extend((c, indent) for c in reversed(s.stmts))
        elif isinstance(s, BufferStore):
            idx = ", ".join(_expr(i, names) for i in s.indices)
            out.append(f"{pad}{names(s.buffer)}[{idx}] = {_expr(s.value, names)}")
        elif isinstance(s, For):
            lo, ext = _expr(s.min, names), _expr(s.extent, names)
            rng = f"range({ext})" if lo == "0" else f"range({lo}, {lo} + {ext})"
            kind = "" if s.kind is ForKind.SERIAL else f"  # {s.kind.value}"
            if s.kind is ForKind.THREAD_BINDING:
                kind = f"  # bound to {s.thread_tag}"
            if s.annotations:
                kind += f"  pragmas: {dict(s.annotations)}"
            out.append(f"{pad}for {names(s.loop_var)} in {rng}:{kind}")
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
        f"{names(b)}: {b.dtype}[{', '.join(_expr(d, names) for d in b.shape)}]" for b in f.params
    )
    out = [f"def {f.name}({params}):"]
    _stmt(f.body, names, 1, out)
    return "\n".join(out)
