"""Flattens multi-dimensional buffer accesses to 1-D row-major offsets.

`flatten(func)` returns a PrimFunc whose buffers (parameters and allocations)
are all one-dimensional, of `prod(shape)` elements, indexed by an int64 offset
`((i0 * d1 + i1) * d2 + i2) ...`. Indices are widened to int64 before they are
multiplied, so arrays over 2**31 elements index correctly; in a static buffer
of fewer elements the offset is computed in int32 and widened once. Parameters keep
their order; `flat.attrs["size_vars"]` keeps the original function's symbolic
dims (the flat shapes are products of them). Statement nesting is walked
recursively (it is as deep as the loop nest); expressions too (they are small).
"""

from __future__ import annotations

from kiln.tir.expr import Add as _Add
from kiln.tir.expr import (
    BinaryOp,
    Buffer,
    BufferLoad,
    Call,
    Cast,
    Not,
    PrimExpr,
    Select,
    TIRError,
    binary,
    cast,
    const,
)
from kiln.tir.expr import Mul as _Mul
from kiln.tir.functor import let_chain
from kiln.tir.stmt import (
    Allocate,
    BufferStore,
    Evaluate,
    For,
    IfThenElse,
    LetStmt,
    PrimFunc,
    SeqStmt,
    Stmt,
)


def flat_size(buf: Buffer) -> PrimExpr:
    """The number of elements of `buf`, as an int64 expression."""
    size: PrimExpr = const(1, "int64")
    for d in buf.shape:
        size = binary(_Mul, size, cast("int64", d))
    return size


def flat_offset(buf: Buffer, indices: tuple[PrimExpr, ...]) -> PrimExpr:
    """The row-major int64 offset of `buf[indices]`.

    Raises:
        TIRError: when the number of indices is not the buffer's ndim.
    """
    if len(indices) != buf.ndim:
        raise TIRError(f"buffer {buf.name} has {buf.ndim} dims, indexed with {len(indices)}")
    if not indices:
        return const(0, "int64")
    narrow = _static_size(buf) < 2**31 and all(i.dtype == "int32" for i in indices)
    if narrow:  # every offset inside the buffer fits int32: widened once, so the simplifier can fold
        off = indices[0]  # (x // 55) * 55 + x % 55 back to x (casts in between would hide it)
        for d, i in zip(buf.shape[1:], indices[1:], strict=True):
            off = binary(_Add, binary(_Mul, off, cast("int32", d)), i)
        return cast("int64", off)
    off = cast("int64", indices[0])
    for d, i in zip(buf.shape[1:], indices[1:], strict=True):
        off = binary(_Add, binary(_Mul, off, cast("int64", d)), cast("int64", i))
    return off


def _static_size(buf: Buffer) -> int:
    """The number of elements of `buf`, or 2**63 when a dim is symbolic."""
    size = 1
    for d in buf.shape:
        value = getattr(d, "value", None)
        if not isinstance(value, int):
            return 2**63
        size *= value
    return size


class _Flattener:
    def __init__(self) -> None:
        self.flat: dict[int, Buffer] = {}

    def buffer(self, buf: Buffer) -> Buffer:
        got = self.flat.get(id(buf))
        if got is None:
            got = Buffer(buf.name, (flat_size(buf),), buf.dtype, buf.scope)
            self.flat[id(buf)] = got
        return got

    def expr(self, e: PrimExpr) -> PrimExpr:
        if isinstance(e, BufferLoad):
            idx = tuple(self.expr(i) for i in e.indices)
            return BufferLoad(e.dtype, self.buffer(e.buffer), (flat_offset(e.buffer, idx),))
        if isinstance(e, BinaryOp):
            a, b = self.expr(e.a), self.expr(e.b)
            return e if (a is e.a and b is e.b) else type(e)(e.dtype, a, b)
        if isinstance(e, Not):
            a = self.expr(e.a)
            return e if a is e.a else Not(e.dtype, a)
        if isinstance(e, Cast):
            v = self.expr(e.value)
            return e if v is e.value else Cast(e.dtype, v)
        if isinstance(e, Select):
            return Select(e.dtype, self.expr(e.cond), self.expr(e.true_value), self.expr(e.false_value))
        if isinstance(e, Call):
            return Call(e.dtype, e.name, tuple(self.expr(a) for a in e.args))
        return e

    def stmt(self, s: Stmt) -> Stmt:
        if isinstance(s, BufferStore):
            idx = tuple(self.expr(i) for i in s.indices)
            return BufferStore(self.buffer(s.buffer), self.expr(s.value), (flat_offset(s.buffer, idx),))
        if isinstance(s, SeqStmt):
            return SeqStmt(tuple(self.stmt(c) for c in s.stmts))
        if isinstance(s, For):
            return For(s.loop_var, self.expr(s.min), self.expr(s.extent), s.kind, self.stmt(s.body),
                       s.thread_tag, s.annotations)
        if isinstance(s, Allocate):
            return Allocate(self.buffer(s.buffer), self.stmt(s.body))
        if isinstance(s, IfThenElse):
            other = None if s.else_case is None else self.stmt(s.else_case)
            return IfThenElse(self.expr(s.cond), self.stmt(s.then_case), other)
        if isinstance(s, LetStmt):  # a chain of lets in a loop: it is as long as a kernel's shared values
            chain = let_chain(s)
            values = [self.expr(let.value) for let in chain]
            body = self.stmt(chain[-1].body)
            for let, value in zip(reversed(chain), reversed(values), strict=True):
                body = LetStmt(let.var, value, body)
            return body
        if isinstance(s, Evaluate):
            return Evaluate(self.expr(s.value))
        raise TIRError(f"flatten: unknown statement {type(s).__name__}")


def flatten(func: PrimFunc) -> PrimFunc:
    """`func` with every buffer one-dimensional and every access a row-major int64 offset."""
    f = _Flattener()
    params = tuple(f.buffer(b) for b in func.params)
    body = f.stmt(func.body)
    return PrimFunc(func.name, params, body, {**func.attrs, "size_vars": tuple(func.size_vars)})
