"""What the simplifier knows of the bitwise nodes (`BitAnd` ... `ShiftRight`): identities and ranges.

Kept apart from `kiln.tir.simplify` (whose linear forms do not see into these
nodes: each is an atom there) so that the rules read as one table. The ranges
are conservative: where nothing simple is known they are the dtype's range
(unknown for int32/int64, whose range the simplifier does not model).
"""

from __future__ import annotations

from kiln.tir.expr import BinaryOp, BitAnd, BitOr, BitXor, IntImm, PrimExpr, ShiftLeft, ShiftRight, const

Interval = tuple[int | None, int | None]
_BITS = {"bool": 1, "int8": 8, "int16": 16, "int32": 32, "int64": 64, "uint8": 8, "uint16": 16, "uint32": 32,
         "uint64": 64}


def _all_ones(e: PrimExpr) -> bool:
    if not isinstance(e, IntImm):
        return False
    return e.value == -1 or (e.dtype[0] in "ub" and e.value == (1 << _BITS[e.dtype]) - 1)


def identity(cls: type[BinaryOp], a: PrimExpr, b: PrimExpr, same: bool) -> PrimExpr | None:
    """`cls(a, b)` without the node where an identity decides it (`x & 0`, `x | x`, `x << 0`, ...), else None.

    Args:
        cls: the bitwise node class.
        a: the simplified left operand.
        b: the simplified right operand.
        same: whether `a` and `b` are structurally equal.

    Returns:
        The simpler equal expression, or None.
    """
    zero_a, zero_b = isinstance(a, IntImm) and a.value == 0, isinstance(b, IntImm) and b.value == 0
    if cls in (ShiftLeft, ShiftRight):
        return a if zero_b else const(0, a.dtype) if zero_a else None
    if cls is BitXor and same:
        return const(0, a.dtype)
    if same:  # x & x, x | x
        return a
    for x, y, zero_y in ((a, b, zero_b), (b, a, zero_a)):
        if zero_y:  # x & 0 is 0; x | 0 and x ^ 0 are x
            return y if cls is BitAnd else x
        if _all_ones(y) and cls in (BitAnd, BitOr):  # x & ~0 is x, x | ~0 is ~0
            return x if cls is BitAnd else y
    return None


def interval(cls: type[BinaryOp], ia: Interval, ib: Interval) -> Interval | None:
    """Bounds of `cls(a, b)` for `a` in `ia` and `b` in `ib` (None: unknown); None where no rule applies.

    `a & b` with a side >= 0 lies in [0, that side's top]; `a | b` and `a ^ b` of sides >= 0 in
    [0, 2**k - 1] for k the bit length of the larger top; `a >> b` between min(lo, 0) and max(hi, 0)
    (out-of-range amounts give 0 or -1, which only a negative `a` can give).
    """
    (alo, ahi), (blo, bhi) = ia, ib
    if cls is BitAnd:
        tops = [hi for lo, hi in (ia, ib) if lo is not None and lo >= 0 and hi is not None]
        if tops:
            return 0, min(tops)
    if (cls in (BitOr, BitXor) and alo is not None and blo is not None and min(alo, blo) >= 0
            and ahi is not None and bhi is not None):
        return 0, (1 << max(ahi, bhi).bit_length()) - 1
    if cls is ShiftRight and alo is not None and ahi is not None:
        return min(alo, 0), max(ahi, 0)
    return None
