"""The gradients (`FPrimalGradient`) of image.resize and image.grid_sample (`image.py`). See
`kiln.relay.op._grad` for the contract; integer data gets None.

image.resize: with static shapes the op is affine in its input and separable, one 1-D interpolation per
resized axis (each axis's exclude_outside normalization is its own, and tf_crop_and_resize's fill is a
constant). So each resized axis is a matrix M (out x in), built here in numpy by running the op's own
reference along that one axis on an identity basis with extrapolation_value 0 (a filled row does not
depend on the input: it is zero); the gradient is the output gradient times M along each axis, in
reverse order, as a matmul with a constant. Every method and coordinate mode is covered.

image.grid_sample: each output point p reads taps (a product of per-axis taps), the tap at input
position s with weight W(p, s). The data's gradient is the scatter-add of `grad * W` at the taps' flat
positions; the grid's is, per spatial axis a, the sum over the taps of `data * grad * dW/dx_a`, times
dx_a/dgrid (the denormalization's scale, 0 where border or reflection clamps it, -1 where reflection
mirrors it). The taps are computed in Relay from the grid with the reference's steps (the coordinate
rounded through float32 as ONNX); nearest's grid gradient is 0 (piecewise constant). Every method
(nearest, linear, cubic), padding mode and rank is covered; at a kink (a pixel, a border, a mirror)
the one-sided derivative of the piece the coordinate lies in is taken.

The image constructors are not imported here: `image.py` imports this module before it defines them.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np

from kiln.ir.dtype import DataType
from kiln.relay.expr import Call, Expr, const
from kiln.relay.op._grad import dtype_of, shape_of
from kiln.relay.op.indexing import gather_elements, scatter_elements, strided_slice
from kiln.relay.op.reduce import sum
from kiln.relay.op.shape import broadcast_to, reshape, stack
from kiln.relay.op.tensor import (
    add,
    cast,
    clip,
    divide,
    equal,
    floor,
    floor_mod,
    greater,
    greater_equal,
    less,
    less_equal,
    logical_and,
    logical_or,
    multiply,
    round,
    subtract,
    where,
)

Grads = list[Expr | None]



def _is_float(e: Expr) -> bool:
    return DataType.of(dtype_of(e)).is_float


# --- image.resize ---------------------------------------------------------------------------------


def resize_matrix(a: Any, k: int, size_in: int) -> np.ndarray[Any, Any]:
    """The interpolation matrix (out x in, float64) of the k-th resized axis of `a` (ResizeAttrs), whose input
    extent is `size_in`: the reference resizing an identity basis along that axis alone.

    Args:
        a: the call's ResizeAttrs.
        k: the position of the axis in `a.axes`.
        size_in: the input extent of the axis.

    Returns:
        M with `out = M @ x` along the axis; a row of a position outside the input (tf_crop_and_resize) is 0.
    """
    from kiln.relay.op.image import _resize_ref

    n = len(a.axes)
    one = attrs.evolve(
        a, axes=(1,), size=(a.size[k],), extrapolation_value=0.0,
        scales=None if a.scales is None else (a.scales[k],),
        roi=None if a.roi is None else (a.roi[k], a.roi[n + k]),
    )
    basis = _resize_ref(one, np.eye(size_in, dtype=np.float64))  # (in, out): column o is row o of M
    matrix: np.ndarray[Any, Any] = np.asarray(basis, np.float64).T
    return matrix


def resize_grad(call: Call, grad: Expr) -> Grads:
    """The output gradient times each resized axis's interpolation matrix (transposed), axis by axis."""
    from kiln.relay.op.image import _checked_axes, _plan
    from kiln.relay.op.matmul import matmul

    (data,) = call.args
    if not _is_float(data):
        return [None]
    a: Any = call.attrs
    shape = shape_of(data)
    dtype = dtype_of(data)
    axes = _checked_axes(a, len(shape))
    active = {ax.axis for ax in _plan(a, shape)}
    g, gshape = grad, list(shape_of(call))
    for k in reversed(range(len(axes))):
        axis = axes[k]
        if axis not in active:  # the reference leaves an identity axis alone
            continue
        m = resize_matrix(a, k, shape[axis])
        before, after = int(np.prod(gshape[:axis])), int(np.prod(gshape[axis + 1:]))
        g3 = reshape(g, (before, gshape[axis], after))
        g = matmul(const(np.ascontiguousarray(m.T), dtype), g3)  # (in, out) @ (B, out, R): (B, in, R)
        gshape[axis] = shape[axis]
        g = reshape(g, tuple(gshape))
    return [g]


# --- image.grid_sample ----------------------------------------------------------------------------


def _c(value: float, dtype: str) -> Expr:
    return const(value, dtype)


def _poly(r: Expr, coeffs: Sequence[float], dtype: str) -> Expr:
    """c0 + c1 r + c2 r^2 + ... by Horner's rule."""
    out = _c(coeffs[-1], dtype)
    for c in reversed(coeffs[:-1]):
        out = add(multiply(out, r), _c(c, dtype))
    return out


def _cubic_taps(r: Expr, dtype: str) -> list[tuple[Expr, Expr]]:
    """(weight, d weight / d r) of the taps floor(x) - 1 ... floor(x) + 2 at fraction r: Keys' kernel, a = -0.75,
    as `image._cubic_weights` (the outer taps are a u^3 - 5a u^2 + 8a u - 4a at u = r + 1 and u = 2 - r)."""
    a = -0.75
    one, two = _c(1.0, dtype), _c(2.0, dtype)
    outer, inner = [-4 * a, 8 * a, -5 * a, a], [1.0, 0.0, -(a + 3), a + 2]
    d_outer, d_inner = [8 * a, -10 * a, 3 * a], [0.0, -2 * (a + 3), 3 * (a + 2)]
    u0, s, u3 = add(r, one), subtract(one, r), subtract(two, r)
    neg = _c(-1.0, dtype)
    return [
        (_poly(u0, outer, dtype), _poly(u0, d_outer, dtype)),
        (_poly(r, inner, dtype), _poly(r, d_inner, dtype)),
        (_poly(s, inner, dtype), multiply(neg, _poly(s, d_inner, dtype))),
        (_poly(u3, outer, dtype), multiply(neg, _poly(u3, d_outer, dtype))),
    ]


def _reflect(x: Expr, lo: float, hi: float, dtype: str) -> tuple[Expr, Expr]:
    """`image._reflect_np` of `x` in Relay, and its slope d result / d x (1 inside, -1 or 1 mirrored, 0 where
    a zero span pins it to `lo`)."""
    below, above = less(x, _c(lo, dtype)), greater(x, _c(hi, dtype))
    out = logical_or(below, above)
    one, minus = _c(1.0, dtype), _c(-1.0, dtype)
    span = hi - lo
    if span == 0:
        return where(out, _c(lo, dtype), x), where(out, _c(0.0, dtype), one)
    dx = where(below, subtract(_c(lo, dtype), x), subtract(x, _c(hi, dtype)))
    flips = floor(divide(dx, _c(span, dtype)))
    r = subtract(dx, multiply(flips, _c(span, dtype)))
    even = equal(floor_mod(flips, _c(2.0, dtype)), _c(0.0, dtype))
    lo_r, hi_r = add(_c(lo, dtype), r), subtract(_c(hi, dtype), r)
    mirrored = where(below, where(even, lo_r, hi_r), where(even, hi_r, lo_r))
    # below: r grows as x falls, so lo + r has slope -1; above: hi - r has slope -1; the odd flips +1
    return where(out, mirrored, x), where(out, where(even, minus, one), one)


@attrs.frozen
class _AxisTaps:
    """The taps of every output point along one spatial axis, each (N, taps, P): flat-position contribution
    (index * stride, int32), weight (0 off the input under zeros padding) and d weight / d grid coordinate
    (None for nearest)."""

    offset: Expr
    weight: Expr
    dweight: Expr | None
    taps: int


def _axis_taps(g: Expr, wide: str, size: int, stride: int, attrs_: Any, ft: str, shape: tuple[int, int]) -> _AxisTaps:
    """`image._gs_taps_np` in Relay for the normalized coordinates `g` (N, P) of an axis of `size`, denormalized
    in `wide` (float64 for a float64 grid, else float32, as the forward op); the taps' flat positions step by
    `stride`, weights and derivatives are in `ft`."""
    from kiln.relay.op.image import FIRST_TAP, _borders

    n, p = shape
    align, padding, method = attrs_.align_corners, attrs_.padding_mode, attrs_.method
    lo, hi = _borders(size, align)
    gw = cast(g, wide)
    one = _c(1.0, wide)
    # the reference's order of operations, then float32 (as ONNX): the taps agree with the forward op's
    x: Expr
    if align:
        x = multiply(multiply(add(gw, one), _c(0.5, wide)), _c(size - 1.0, wide))
        scale = (size - 1) / 2.0
    else:
        x = multiply(subtract(multiply(add(gw, one), _c(float(size), wide)), one), _c(0.5, wide))
        scale = size / 2.0
    x = cast(cast(x, "float32"), ft)
    if method == "nearest":
        x = round(x)
    out = logical_or(less(x, _c(lo, ft)), greater(x, _c(hi, ft)))
    slope: Expr = _c(scale, ft)
    if padding == "border":
        x = where(out, clip(x, 0.0, size - 1.0), x)
        slope = where(out, _c(0.0, ft), slope)
    elif padding == "reflection":
        # mirrored in float64, then float32, as the reference
        x, mirror = _reflect(cast(x, "float64"), lo, hi, "float64")
        x = cast(cast(x, "float32"), ft)
        slope = multiply(slope, cast(mirror, ft))
    if method == "nearest":
        pixels, weights, dweights = [x], [_c(1.0, ft)], None
    else:
        base = floor(x)
        r = subtract(x, base)
        taps: list[tuple[Expr, Expr]]
        if method == "linear":
            taps = [(subtract(_c(1.0, ft), r), _c(-1.0, ft)), (r, _c(1.0, ft))]
        else:
            taps = _cubic_taps(r, ft)
        pixels = [add(base, _c(float(FIRST_TAP[method] + t), ft)) for t in range(len(taps))]
        weights = [w for w, _ in taps]
        dweights = [multiply(dw, slope) for _, dw in taps]
    indices: list[Expr] = []
    masked: list[Expr] = []
    dmasked: list[Expr] = []
    for t, pixel in enumerate(pixels):
        i: Expr = pixel
        inside = logical_and(greater_equal(i, _c(0.0, ft)), less_equal(i, _c(size - 1.0, ft)))
        if padding == "reflection":
            i = _reflect(cast(i, "float64"), lo, hi, "float64")[0]
        indices.append(cast(clip(i, 0.0, size - 1.0), "int32"))
        w, dw = weights[t], None if dweights is None else dweights[t]
        if padding == "zeros":  # a tap off the input reads 0: its weight (and derivative) is 0
            keep = cast(inside, ft)
            w = multiply(w, keep)
            dw = None if dw is None else multiply(dw, keep)
        masked.append(broadcast_to(w, (n, p)))
        if dw is not None:
            dmasked.append(broadcast_to(dw, (n, p)))
    offset = multiply(stack(indices, axis=1), const(stride, "int32"))
    return _AxisTaps(offset, stack(masked, axis=1), stack(dmasked, axis=1) if dmasked else None, len(pixels))


def _spread(e: Expr, a: int, nd: int, taps: int, shape: tuple[int, int]) -> Expr:
    """(N, T, P) of axis a as (N, 1.., T, 1.., P): its tap dim at position 1 + a of nd tap dims, so that a
    product (or sum) over the axes broadcasts to every combination of their taps."""
    n, p = shape
    return reshape(e, (n, *([1] * a), taps, *([1] * (nd - 1 - a)), p))


def grid_sample_grad(call: Call, grad: Expr) -> Grads:
    """The data's gradient scattered back to the taps; the grid's from the taps' weight derivatives."""
    from kiln.relay.op.creation import zeros, zeros_like

    data, grid = call.args
    a: Any = call.attrs
    dshape, gshape = shape_of(data), shape_of(grid)
    n, c, sizes = dshape[0], dshape[1], dshape[2:]
    nd = len(sizes)
    p = int(np.prod(gshape[1:-1]))
    s = int(np.prod(sizes))
    ft = "float64" if "float64" in (dtype_of(data), dtype_of(grid)) else "float32"
    wide = "float64" if dtype_of(grid) == "float64" else "float32"
    per_axis = []
    for ax in range(nd):
        # grid entry nd - 1 - ax indexes spatial axis ax (entry 0 is x, the last axis)
        coord = reshape(strided_slice(grid, [nd - 1 - ax], [nd - ax], axes=[nd + 1]), (n, p))
        per_axis.append(_axis_taps(coord, wide, sizes[ax], int(np.prod(sizes[ax + 1:])), a, ft, (n, p)))
    taps = per_axis[0].taps  # the same method on every axis
    k = taps**nd  # taps per output point
    offsets = [_spread(t.offset, ax, nd, taps, (n, p)) for ax, t in enumerate(per_axis)]
    flat = offsets[0]
    for o in offsets[1:]:
        flat = add(flat, o)
    # every axis adds its own tap dim, so the sum (and the products below) hold all k combinations
    index = broadcast_to(reshape(flat, (n, 1, k * p)), (n, c, k * p))
    weights = [_spread(t.weight, ax, nd, taps, (n, p)) for ax, t in enumerate(per_axis)]
    g = reshape(cast(grad, ft), (n, c, 1, p))
    grads: Grads = [None, None]
    if _is_float(data):
        updates = reshape(multiply(g, reshape(functools.reduce(multiply, weights), (n, 1, k, p))), (n, c, k * p))
        flat_grad = scatter_elements(zeros((n, c, s), ft), index, updates, axis=2, reduction="add")
        grads[0] = cast(reshape(flat_grad, dshape), dtype_of(data))
    if a.method == "nearest":
        grads[1] = zeros_like(grid)
        return grads
    values = reshape(gather_elements(cast(reshape(data, (n, c, s)), ft), index, axis=2), (n, c, k, p))
    h = sum(multiply(g, values), axis=1)  # (N, K, P): the output gradient times each tap's value
    coords = []
    for ax in reversed(range(nd)):  # the grid's entries: the last spatial axis first
        dw = per_axis[ax].dweight
        assert dw is not None  # linear and cubic have weight derivatives
        factors = [_spread(dw, ax, nd, taps, (n, p)) if b == ax else weights[b] for b in range(nd)]
        coords.append(sum(multiply(h, reshape(functools.reduce(multiply, factors), (n, k, p))), axis=1))
    grads[1] = cast(reshape(stack(coords, axis=-1), gshape), dtype_of(grid))
    return grads
