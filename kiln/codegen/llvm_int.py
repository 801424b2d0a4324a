"""Integer arithmetic of the LLVM back end: the loop IR's integer nodes as LLVM instructions.

Signed int32/int64 add/sub/mul carry `nsw` (their overflow is undefined, as in C
and TVM: index arithmetic then widens and vectorizes); int8/int16 and the unsigned
types wrap. Division and modulo by zero give 0 (as numpy), never a trap, and
`//`, `%` floor; shifts out of [0, width) are defined (0, or -1 for a negative
value shifted right), where LLVM's are poison.
"""

from __future__ import annotations

import llvmlite.ir as ir

from kiln.codegen.jit import CodegenError
from kiln.tir.expr import (
    Add,
    BinaryOp,
    BitAnd,
    BitOr,
    BitXor,
    Div,
    FloorDiv,
    FloorMod,
    IntImm,
    Max,
    Min,
    Mul,
    ShiftLeft,
    ShiftRight,
    Sub,
)


def signed(dtype: str) -> bool:
    """Whether integer `dtype` is signed (bool and the uint types are not)."""
    return not dtype.startswith("uint") and dtype != "bool"


def binary(b: ir.IRBuilder, e: BinaryOp, x: ir.Value, y: ir.Value) -> ir.Value:
    """Integer node `e` of operands `x`, `y` (registers of `e.a.dtype`), emitted at builder `b`."""
    dt = e.a.dtype
    is_signed = signed(dt)
    flags: tuple[str, ...] = ("nsw",) if dt in ("int32", "int64") else ()
    if isinstance(e, Add):
        return b.add(x, y, flags=flags)
    if isinstance(e, Sub):
        return b.sub(x, y, flags=flags)
    if isinstance(e, Mul):
        return b.mul(x, y, flags=flags)
    if isinstance(e, (Min, Max)):
        op = "<" if isinstance(e, Min) else ">"
        c = b.icmp_signed(op, x, y) if is_signed else b.icmp_unsigned(op, x, y)
        return b.select(c, x, y)
    if isinstance(e, (Div, FloorDiv, FloorMod)):
        return _division(b, e, x, y, is_signed)
    if isinstance(e, (BitAnd, BitOr, BitXor)):
        return {BitAnd: b.and_, BitOr: b.or_, BitXor: b.xor}[type(e)](x, y)
    if isinstance(e, (ShiftLeft, ShiftRight)):
        return _shift(b, e, x, y, is_signed)
    raise CodegenError(f"unknown integer operation {type(e).__name__}")


def _shift(b: ir.IRBuilder, e: BinaryOp, x: ir.Value, y: ir.Value, is_signed: bool) -> ir.Value:
    """shl, lshr or ashr, guarded (a select or clamp) unless the amount is a constant in [0, width)."""
    top = ir.Constant(x.type, x.type.width - 1)
    if isinstance(e.b, IntImm) and 0 <= e.b.value < x.type.width:
        return b.shl(x, y) if isinstance(e, ShiftLeft) else b.ashr(x, y) if is_signed else b.lshr(x, y)
    in_range = b.icmp_unsigned("<=", y, top)  # unsigned: a negative amount is out of range too
    if isinstance(e, ShiftRight) and is_signed:  # by width - 1 every bit is the sign bit: a clamp, no select
        return b.ashr(x, b.select(in_range, y, top))
    out = b.shl(x, y) if isinstance(e, ShiftLeft) else b.lshr(x, y)
    return b.select(in_range, out, ir.Constant(x.type, 0))  # a select passes on only the chosen value's poison

def _division(b: ir.IRBuilder, e: BinaryOp, x: ir.Value, y: ir.Value, is_signed: bool) -> ir.Value:
    """Truncating Div, flooring FloorDiv/FloorMod; division by 0 gives 0 and never traps."""
    ty = x.type
    zero, one = ir.Constant(ty, 0), ir.Constant(ty, 1)
    const_ok = isinstance(e.b, IntImm) and e.b.value not in (0, -1)
    is_zero = is_m1 = None
    if not const_ok:
        is_zero = b.icmp_unsigned("==", y, zero)
        bad = is_zero
        if is_signed:
            is_m1 = b.icmp_signed("==", y, ir.Constant(ty, -1))
            bad = b.or_(is_zero, is_m1)
        y = b.select(bad, one, y)
    if not is_signed:
        r = b.urem(x, y) if isinstance(e, FloorMod) else b.udiv(x, y)
        return r if is_zero is None else b.select(is_zero, zero, r)
    q, r = b.sdiv(x, y), b.srem(x, y)
    if is_m1 is not None:  # x / -1 is -x (wrapping), and its remainder 0
        q = b.select(is_m1, b.sub(zero, x), q)
    fix = b.and_(b.icmp_signed("!=", r, zero), b.icmp_signed("<", b.xor(r, y), zero))
    if isinstance(e, Div):
        out = q
    elif isinstance(e, FloorDiv):
        out = b.sub(q, b.zext(fix, ty))
    else:
        out = b.add(r, b.select(fix, y, zero))
    return out if is_zero is None else b.select(is_zero, zero, out)
