"""Helpers for the ops' gradients (`FPrimalGradient`), shared by the family modules.

An op's gradient is declared in its own chain:
`.set_attr(attr.FPrimalGradient, fn)` where `fn(call, grad) -> list[Expr | None]`
takes the forward call (typed: `call.args[i].checked_type`, `call.checked_type`)
and the gradient of its output (the same type as the output; a Tuple of
gradients for an op whose output is a tuple), and returns one gradient per
argument, each of that argument's type, or None where no gradient flows (an
integer index). Gradients are Relay expressions, so they are compiled, fused
and scheduled like the forward graph. An op that has no gradient says why with
`.set_attr(attr.TNonDifferentiable, "why")`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import overload

from kiln.errors import KilnError
from kiln.ir.attrs import Attrs
from kiln.ir.types import TensorType
from kiln.relay.expr import Call, Expr, Tuple, TupleGetItem, call


class OpGradientError(KilnError, ValueError):
    """An op's gradient cannot be formed for this call (a mode or layout it does not cover); names the op."""


def shape_of(e: Expr) -> tuple[int, ...]:
    """The static shape of a typed expression."""
    t = e.checked_type
    if not isinstance(t, TensorType) or not all(isinstance(d, int) for d in t.shape):
        raise TypeError(f"a gradient needs a tensor of static shape, found {t}")
    return tuple(int(d) for d in t.shape)  # type: ignore[arg-type]


def dtype_of(e: Expr) -> str:
    """The dtype of a typed tensor expression."""
    t = e.checked_type
    if not isinstance(t, TensorType):
        raise TypeError(f"a gradient needs a tensor, found {t}")
    return str(t.dtype)


@overload
def field(grad: Expr, i: int) -> Expr: ...


@overload
def field(grad: Sequence[Expr | None], i: int) -> Expr | None: ...


def field(grad: Expr | Sequence[Expr | None], i: int) -> Expr | None:
    """Field `i` of the gradient of a tuple output: of a Tuple the pass built, of any tuple expression, or of
    a Python sequence (a caller's, whose None means that no gradient reached that field)."""
    if isinstance(grad, Expr):
        return grad.fields[i] if isinstance(grad, Tuple) else TupleGetItem(grad, i)
    return grad[i]


def collapse_sum_to(grad: Expr, grad_shape: Sequence[int], shape: Sequence[int]) -> Expr:
    """`grad` (of the broadcast shape `grad_shape`) summed back to `shape`, as numpy broadcasting expanded it.

    The axes broadcasting added in front are summed away; the axes where `shape` has 1 and
    `grad_shape` more are summed with keepdims. Returns `grad` itself when the shapes agree.
    """
    grad_shape, shape = tuple(grad_shape), tuple(shape)
    if grad_shape == shape:
        return grad
    lead = len(grad_shape) - len(shape)
    axes = list(range(lead)) + [lead + i for i, d in enumerate(shape) if d == 1 and grad_shape[lead + i] != 1]
    out: Expr = call("sum", [grad], _sum_attrs(axes)) if axes else grad
    return call("reshape", [out], _reshape_attrs(shape)) if axes else out


def collapse_sum_like(grad: Expr, like: Expr) -> Expr:
    """`grad`, the gradient of a broadcast result, summed back to the shape of the typed input `like`.

    `grad` is typed here if it is not yet (its leaves must be typed), so its broadcast shape is known.
    """
    if not grad.has_type:
        from kiln.relay.type_infer import infer_type

        infer_type(grad, reuse=True)
    return collapse_sum_to(grad, shape_of(grad), shape_of(like))


def _sum_attrs(axes: list[int]) -> Attrs:
    from kiln.relay.op.reduce import ReduceAttrs

    return ReduceAttrs.make("sum", axis=tuple(axes), keepdims=False)


def _reshape_attrs(shape: tuple[int, ...]) -> Attrs:
    from kiln.relay.op.shape import ReshapeAttrs

    return ReshapeAttrs.make("reshape", newshape=shape)


__all__ = ["Call", "OpGradientError", "collapse_sum_like", "collapse_sum_to", "dtype_of", "field", "shape_of"]
