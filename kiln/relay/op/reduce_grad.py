"""The gradients (`FPrimalGradient`) of the reductions and scans of `reduce.py`: sum, mean, max, min, prod
and cumsum. See `kiln.relay.op._grad` for the contract.

The reductions' own constructors (sum, cumprod, cumsum) are imported where they are used: `reduce.py`
imports this module before it defines them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from kiln.relay.expr import Call, Expr, const
from kiln.relay.op._grad import shape_of
from kiln.relay.op.shape import broadcast_to, reshape, transpose
from kiln.relay.op.tensor import cast, divide, equal, multiply

Grads = list[Expr | None]


def attrs_of(call: Call) -> Any:
    """The call's attrs, of its op's attrs class (the op's relation checked them)."""
    return call.attrs


def _axes(call: Call) -> list[int]:
    """The axes the call reduces, ascending (its relation checked them)."""
    ndim = len(shape_of(call.args[0]))
    axis = attrs_of(call).axis
    if axis is None:
        return list(range(ndim))
    named = {a % ndim for a in axis}
    return [i for i in range(ndim) if (i not in named) == attrs_of(call).exclude]


def _spread(call: Call, e: Expr) -> Expr:
    """`e`, of the call's output shape, broadcast back to the input's shape along the reduced axes."""
    shape = shape_of(call.args[0])
    axes = set(_axes(call))
    kept = tuple(1 if i in axes else d for i, d in enumerate(shape))
    if not attrs_of(call).keepdims and kept != shape_of(call):
        e = reshape(e, kept)
    return broadcast_to(e, shape) if kept != shape else e


def _dtype(e: Expr) -> str:
    return str(e.checked_type.dtype)  # type: ignore[attr-defined]


def sum_grad(call: Call, grad: Expr) -> Grads:
    """g broadcast back over the reduced axes."""
    return [_spread(call, grad)]


def mean_grad(call: Call, grad: Expr) -> Grads:
    """g / n broadcast back over the reduced axes, n the number of elements each output averages."""
    shape = shape_of(call.args[0])
    n = math.prod(shape[a] for a in _axes(call))
    return [_spread(call, multiply(grad, const(np.asarray(1.0 / max(n, 1), _dtype(call)))))]


def extreme_grad(call: Call, grad: Expr) -> Grads:
    """max and min: g to the elements equal to the result, split evenly among ties (as TensorFlow and
    PyTorch's amax/amin): the gradient of each output sums to its g."""
    from kiln.relay.op.reduce import sum

    (x,) = call.args
    hit = cast(equal(x, _spread(call, call)), _dtype(x))
    ties = sum(hit, axis=_axes(call), keepdims=attrs_of(call).keepdims)
    return [multiply(hit, _spread(call, divide(grad, ties)))]


def prod_grad(call: Call, grad: Expr) -> Grads:
    """g times the product of the other elements of each reduced group: the exclusive running products
    from both ends, multiplied (exact where elements are 0, unlike prod / x). The reduced axes are moved
    last and flattened into one for the scans."""
    from kiln.relay.op.reduce import cumprod

    (x,) = call.args
    shape = shape_of(x)
    axes = _axes(call)
    kept = [i for i in range(len(shape)) if i not in axes]
    perm = [*kept, *axes]
    moved = tuple(shape[i] for i in perm)
    rows = (math.prod(shape[i] for i in kept), math.prod(shape[i] for i in axes))
    xt: Expr = transpose(x, perm) if perm != sorted(perm) else x
    flat = reshape(xt, rows)
    others: Expr = multiply(cumprod(flat, axis=1, exclusive=True), cumprod(flat, axis=1, exclusive=True, reverse=True))
    others = reshape(others, moved)
    if perm != sorted(perm):
        others = transpose(others, [int(i) for i in np.argsort(perm)])
    return [multiply(_spread(call, grad), others)]


def cumsum_grad(call: Call, grad: Expr) -> Grads:
    """The running sum of g in the other direction (exclusive if the scan was)."""
    from kiln.relay.op.reduce import cumsum

    a = attrs_of(call)
    return [cumsum(grad, axis=a.axis, exclusive=a.exclusive, reverse=not a.reverse)]


def cumprod_grad(call: Call, grad: Expr) -> Grads:
    """x_i's gradient: the sum over the outputs y_j that x_i is a factor of, of g_j times y_j's other
    factors. Exact where elements are 0 (unlike TensorFlow's reverse cumsum(g y) / x): each x_i gets its own
    copy of the scanned row with x_i set to 1, scanned again — n^2 work and memory per row of n."""
    from kiln.relay.op.reduce import cumprod, sum
    from kiln.relay.op.shape import broadcast_to, expand_dims
    from kiln.relay.op.tensor import where

    (x,) = call.args
    a = attrs_of(call)
    shape = shape_of(x)
    axis = a.axis % len(shape)
    n, dtype = shape[axis], _dtype(x)
    perm = [*(i for i in range(len(shape)) if i != axis), axis]
    moved: Expr = transpose(x, perm) if axis != len(shape) - 1 else x
    g: Expr = transpose(grad, perm) if axis != len(shape) - 1 else grad
    rows = (*(shape[i] for i in perm[:-1]), n, n)
    i, j = np.indices((n, n))
    own = const(i == j)  # [i, j]: x_i's own copy holds 1 at j = i
    copies = where(own, const(np.ones((), dtype)), broadcast_to(expand_dims(moved, -2), rows))
    others = cumprod(copies, axis=-1, exclusive=a.exclusive, reverse=a.reverse)
    # x_i is a factor of y_j: j after i in the scan's direction (i itself too unless exclusive)
    factor = (j > i if not a.reverse else j < i) | ((i == j) & (not a.exclusive))
    terms = multiply(multiply(others, expand_dims(g, -2)), const(factor.astype(dtype)))
    dx: Expr = sum(terms, axis=-1)
    if axis != len(shape) - 1:
        dx = transpose(dx, [int(k) for k in np.argsort(perm)])
    return [dx]


# the reductions' gradients by op name, for the loop that declares them
GRADIENTS: dict[str, Callable[[Call, Expr], Grads]] = {
    "sum": sum_grad, "mean": mean_grad, "max": extreme_grad, "min": extreme_grad, "prod": prod_grad,
}

