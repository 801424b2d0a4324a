"""Relay's symbolic dims (`kiln.ir.types`: `n`, `2*n*s`, `p + s - 1`) as loop-IR expressions of size variables,
and back: te lowers a type's dims with `dim_expr`, and a kernel's signature writes its buffer dims with
`expr_dim` (the library reads them back with `dim_expr`)."""

from __future__ import annotations

from collections.abc import Callable

from kiln.ir.types import Dim, SizeVar, SumDim, SymDim, dim_add, dim_floordiv, dim_mul
from kiln.tir import expr as tx


def dim_expr(d: Dim, var: Callable[[str], tx.Var]) -> tx.PrimExpr:
    """`d` as an int32 expression, its size variables given by name by `var`."""
    if isinstance(d, int):
        return tx.const(d, "int32")
    if isinstance(d, SumDim):
        out = dim_expr(d.terms[0], var)
        for t in d.terms[1:]:
            out = out + dim_expr(t, var)
        return out + d.const if d.const else out
    if not isinstance(d, SymDim):
        raise ValueError(f"dim {d} has no expression")
    factors = [var(name) if isinstance(name, str) else dim_expr(name.num, var) // name.den
               for name, power in d.factors for _ in range(power)]
    out = factors[0] if d.coeff == 1 else tx.const(d.coeff, "int32") * factors[0]
    for v in factors[1:]:
        out = out * v
    return out


def expr_dim(e: tx.PrimExpr) -> Dim | None:
    """The dim an expression of constants and size variables (+, -, *, // by a constant) is, or None for
    another."""
    if isinstance(e, tx.IntImm):
        return int(e.value)
    if isinstance(e, tx.Var):
        return SizeVar(e.name)
    if isinstance(e, tx.FloorDiv) and isinstance(e.b, tx.IntImm) and int(e.b.value) >= 1:
        a = expr_dim(e.a)
        return None if a is None else dim_floordiv(a, int(e.b.value))
    if isinstance(e, (tx.Add, tx.Sub, tx.Mul)):
        a, b = expr_dim(e.a), expr_dim(e.b)
        if a is None or b is None:
            return None
        if isinstance(e, tx.Mul):
            return dim_mul(a, b)
        return dim_add(a, b if isinstance(e, tx.Add) else dim_mul(b, -1))
    return None
