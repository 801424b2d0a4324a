"""Reducers (`sum`, `max`, `min`, `prod`, `comm_reducer`), math intrinsics, `if_then_else`, `cast`.

These names shadow Python builtins on purpose (TVM's `te.sum`, `te.max`), so
they live in their own module and nothing here uses the builtins.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from kiln.te.tensor import CommReducer, IndexLike, IterKind, IterVar, Reduce, TEError, as_index
from kiln.tir import expr as tx
from kiln.tir.expr import ExprLike, PrimExpr


class Reducer(Protocol):
    """A reduction function made by `comm_reducer`."""

    def __call__(
        self,
        expr: IndexLike,
        axis: IterVar | Sequence[IterVar] | IndexLike | None = None,
        where: ExprLike | None = None,
    ) -> PrimExpr: ...


def comm_reducer(
    fcombine: Callable[[PrimExpr, PrimExpr], PrimExpr],
    fidentity: Callable[[str], PrimExpr | int | float],
    name: str = "reduce",
) -> Reducer:
    """A commutative reducer, e.g. `te.comm_reducer(lambda x, y: x + y, lambda t: tx.const(0, t))`.

    The returned function reduces `expr` over `axis` (an IterVar or a list of
    them), optionally only `where` a condition holds: `my_sum(A[i, k], axis=k)`.
    Called with two expressions instead, it combines them (`te.max(a, b)`).

    Args:
        fcombine: combines the accumulator with one value.
        fidentity: the identity element for a dtype.
        name: the reducer's name, shown in error messages.

    Returns:
        The reduction function.
    """

    def identity(dtype: str) -> PrimExpr:
        return tx.as_expr(fidentity(dtype), dtype)

    reducer = CommReducer(name, fcombine, identity)

    def reduce(
        expr: IndexLike, axis: IterVar | Sequence[IterVar] | IndexLike | None = None, where: ExprLike | None = None
    ) -> PrimExpr:
        source = as_index(expr)
        if axis is None:
            raise TEError(f"te.{name}: give the reduction axis (axis=k) or a second operand")
        if isinstance(axis, IterVar) and axis.kind is IterKind.REDUCE:
            axes: tuple[IterVar, ...] = (axis,)
        elif isinstance(axis, (PrimExpr, int, float)):
            return fcombine(source, tx.as_expr(axis, source.dtype))
        else:
            axes = tuple(axis)
        for iv in axes:
            if not isinstance(iv, IterVar) or iv.kind is not IterKind.REDUCE:
                raise TEError(f"te.{name}: axis must be reduce_axis IterVars, got {iv!r}")
        cond = tx.const(True) if where is None else tx.as_expr(where)
        return Reduce(source.dtype, reducer, source, axes, cond)

    return reduce


def _lowest(dtype: str) -> PrimExpr:
    if tx.is_float(dtype):
        return tx.const(float("-inf"), dtype)
    return tx.const(int(np.iinfo(np.dtype(dtype)).min), dtype)


def _highest(dtype: str) -> PrimExpr:
    if tx.is_float(dtype):
        return tx.const(float("inf"), dtype)
    return tx.const(int(np.iinfo(np.dtype(dtype)).max), dtype)


sum = comm_reducer(lambda x, y: x + y, lambda t: tx.const(0, t), name="sum")
prod = comm_reducer(lambda x, y: x * y, lambda t: tx.const(1, t), name="prod")
max = comm_reducer(tx.max_, _lowest, name="max")
min = comm_reducer(tx.min_, _highest, name="min")


# ---------------------------------------------------------------------------
# Math intrinsics
# ---------------------------------------------------------------------------


def _float_arg(name: str, x: IndexLike) -> PrimExpr:
    e = as_index(x)
    if not tx.is_float(e.dtype):
        raise TEError(f"te.{name} takes a floating-point expression, got {e.dtype} {e}; cast it first")
    return e


def exp(x: IndexLike) -> PrimExpr:
    """e ** x."""
    return tx.call("exp", _float_arg("exp", x))


def log(x: IndexLike) -> PrimExpr:
    """The natural logarithm."""
    return tx.call("log", _float_arg("log", x))


def sqrt(x: IndexLike) -> PrimExpr:
    """The square root."""
    return tx.call("sqrt", _float_arg("sqrt", x))


def rsqrt(x: IndexLike) -> PrimExpr:
    """1 / sqrt(x)."""
    return tx.call("rsqrt", _float_arg("rsqrt", x))


def tanh(x: IndexLike) -> PrimExpr:
    """The hyperbolic tangent."""
    return tx.call("tanh", _float_arg("tanh", x))


def sigmoid(x: IndexLike) -> PrimExpr:
    """1 / (1 + exp(-x))."""
    return tx.call("sigmoid", _float_arg("sigmoid", x))


def erf(x: IndexLike) -> PrimExpr:
    """The error function."""
    return tx.call("erf", _float_arg("erf", x))


def pow(x: IndexLike, y: IndexLike) -> PrimExpr:
    """x ** y (floating point)."""
    base = _float_arg("pow", x)
    return tx.call("pow", base, tx.as_expr(as_index(y) if isinstance(y, IterVar) else y, base.dtype))


def floor(x: IndexLike) -> PrimExpr:
    """Rounds down."""
    return tx.call("floor", _float_arg("floor", x))


def ceil(x: IndexLike) -> PrimExpr:
    """Rounds up."""
    return tx.call("ceil", _float_arg("ceil", x))


def round(x: IndexLike) -> PrimExpr:
    """Rounds to the nearest integer."""
    return tx.call("round", _float_arg("round", x))


def abs(x: IndexLike) -> PrimExpr:
    """|x| (integers too)."""
    e = as_index(x)
    if tx.is_float(e.dtype):
        return tx.call("abs", e)
    return tx.select(e < 0, -e, e)


def sin(x: IndexLike) -> PrimExpr:
    """The sine."""
    return tx.call("sin", _float_arg("sin", x))


def cos(x: IndexLike) -> PrimExpr:
    """The cosine."""
    return tx.call("cos", _float_arg("cos", x))


# ---------------------------------------------------------------------------
# Conditionals and casts
# ---------------------------------------------------------------------------


def if_then_else(cond: ExprLike, true_value: IndexLike, false_value: IndexLike) -> PrimExpr:
    """`true_value if cond else false_value`.

    Lowered to `tx.select`, whose two sides the back ends may both evaluate;
    keep loads in the branches in bounds (clamp the index) when that matters.
    """
    c = tx.as_expr(cond)
    if c.dtype != "bool":
        raise TEError(f"if_then_else: the condition must be bool, got {c.dtype} {c}")
    t = as_index(true_value) if isinstance(true_value, IterVar) else true_value
    f = as_index(false_value) if isinstance(false_value, IterVar) else false_value
    return tx.select(c, t, f)


select = if_then_else


def cast(x: IndexLike, dtype: str) -> PrimExpr:
    """`x` converted to `dtype` (TVM's `x.astype(dtype)`)."""
    return tx.cast(dtype, as_index(x))


def const(value: int | float | bool, dtype: str | None = None) -> PrimExpr:
    """A constant of `dtype` (int32 / float32 / bool by default)."""
    return tx.const(value, dtype)


__all__ = [
    "abs",
    "cast",
    "ceil",
    "comm_reducer",
    "const",
    "cos",
    "erf",
    "exp",
    "floor",
    "if_then_else",
    "log",
    "max",
    "min",
    "pow",
    "prod",
    "round",
    "rsqrt",
    "select",
    "sigmoid",
    "sin",
    "sqrt",
    "sum",
    "tanh",
]
