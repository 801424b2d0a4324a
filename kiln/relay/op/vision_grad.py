"""The gradient (`FPrimalGradient`) of nn.roi_align (`vision.py`). See `kiln.relay.op._grad` for the contract.

Each bilinear sample of a region reads 4 pixels of its image with weights that depend only on the rois, so
the data's gradient spreads `grad * weight` back to those pixels. The sample positions, their pixels and
their weights are computed from the rois with Relay arithmetic, as the op's reference does.

avg: a sample's weight factors into a row weight and a column weight, so each region's gradient is
`Ay^T grad Ax`, with Ay (bins, H) and Ax (bins, W) the rows' and columns' summed weights (one-hot rows
of the pixel indices, times the bilinear weights): two matrix products, no scatter.
max: each bin's gradient goes to the candidate (a sample's weighted pixel, ONNX's max) equal to the bin's
maximum, split evenly among ties as the max reduction's; the winners' shares are scattered onto their
pixels (`scatter_elements`, add).
Either way the regions' gradients are then summed into their images (a one-hot matrix product over the
batch indices, clamped into [0, N) as the op clamps them).

The rois and batch indices get no gradient: torchvision and ONNX training treat the boxes as
non-differentiable (the output is only piecewise smooth in them), and the indices are integers.
`vision.py` imports this module, so it does not import `vision.py`.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from kiln.relay.expr import Call, Expr, const
from kiln.relay.op._grad import dtype_of, shape_of
from kiln.relay.op.creation import zeros
from kiln.relay.op.indexing import gather_elements, scatter_elements, strided_slice, take
from kiln.relay.op.matmul import matmul
from kiln.relay.op.reduce import max, sum
from kiln.relay.op.shape import broadcast_to, concatenate, reshape
from kiln.relay.op.tensor import (
    add,
    cast,
    clip,
    divide,
    equal,
    floor,
    greater_equal,
    less_equal,
    logical_and,
    logical_not,
    maximum,
    multiply,
    subtract,
    where,
)

Grads = list[Expr | None]



class _Axis:
    """The bilinear taps of every sample along one axis (rows or columns) of every region: (R, bins * g)
    tensors of the low and high pixel index (as floats), their weights, and whether the sample is in range.
    `lo` is the roi column where the axis starts (x1: 0, y1: 1); the end is two columns on."""

    def __init__(self, rois: Expr, lo: int, bins: int, size: int, a: Any, dtype: str) -> None:
        rois_n = shape_of(rois)[0]

        def c(v: Any) -> Expr:
            return const(np.asarray(v, dtype))

        def coord(k: int) -> Expr:  # roi column k, (R, 1), in pixels
            col = reshape(strided_slice(rois, [k], [k + 1], axes=[1]), (rois_n, 1))
            return subtract(multiply(col, c(a.spatial_scale)), c(0.5 if a.half_pixel else 0.0))

        start = coord(lo)
        length = subtract(coord(lo + 2), start)
        if not a.half_pixel:  # the legacy mode makes every roi at least one pixel
            length = maximum(length, c(1.0))
        g = a.sampling_ratio
        steps = (np.arange(bins)[:, None] + (np.arange(g)[None, :] + 0.5) / g).reshape(1, bins * g)
        pos = add(start, multiply(c(steps), divide(length, c(float(bins)))))
        self.valid = logical_and(greater_equal(pos, c(-1.0)), less_equal(pos, c(float(size))))
        pos = maximum(pos, c(0.0))
        low = floor(pos)
        last = greater_equal(low, c(float(size - 1)))
        self.low = where(last, c(float(size - 1)), low)
        self.high = where(last, c(float(size - 1)), add(self.low, c(1.0)))
        self.w1 = where(last, c(0.0), subtract(pos, self.low))
        self.w0 = subtract(c(1.0), self.w1)
        self.rois, self.bins, self.g, self.size, self.dtype = rois_n, bins, g, size, dtype

    def summed_weights(self) -> Expr:
        """(R, bins, size): each pixel's bilinear weight summed over a bin's samples, / g (avg's mean)."""
        pixels = const(np.arange(self.size, dtype=self.dtype).reshape(1, 1, self.size))

        def column(e: Expr) -> Expr:
            return reshape(e, (self.rois, self.bins * self.g, 1))

        def onehot(index: Expr) -> Expr:
            return cast(equal(column(index), pixels), self.dtype)

        inside = column(cast(self.valid, self.dtype))
        per_sample = multiply(inside, add(multiply(column(self.w0), onehot(self.low)),
                                          multiply(column(self.w1), onehot(self.high))))
        scale = const(np.asarray(1.0 / self.g, self.dtype))
        return multiply(sum(reshape(per_sample, (self.rois, self.bins, self.g, self.size)), axis=2), scale)


def _into_images(per_roi: Expr, batch: Expr, data_shape: tuple[int, ...], dtype: str) -> Expr:
    """The regions' gradients (R, C, H, W) summed into their images (N, C, H, W)."""
    n, c, h, w = data_shape
    rois_n = shape_of(batch)[0]
    index = clip(batch, 0, n - 1)
    images = const(np.arange(n, dtype=dtype_of(batch)).reshape(n, 1))
    hot = cast(equal(images, reshape(index, (1, rois_n))), dtype)  # (N, R)
    return reshape(matmul(hot, reshape(per_roi, (rois_n, c * h * w))), data_shape)


def _avg(grad: Expr, ys: _Axis, xs: _Axis) -> Expr:
    """Each region's `Ay^T grad Ax`, (R, C, H, W)."""
    ay, ax = ys.summed_weights(), xs.summed_weights()
    rows = matmul(grad, reshape(ax, (xs.rois, 1, xs.bins, xs.size)))  # (R, C, OH, W)
    return matmul(reshape(ay, (ys.rois, 1, ys.bins, ys.size)), rows, transpose_a=True)


def _max(grad: Expr, data: Expr, batch: Expr, ys: _Axis, xs: _Axis) -> Expr:
    """Each bin's gradient on its maximal candidates' pixels (split among ties), (R, C, H, W)."""
    n, c, h, w = shape_of(data)
    rois_n, dtype = ys.rois, ys.dtype
    sample = (rois_n, c, ys.bins, ys.g, xs.bins, xs.g)
    count = ys.bins * ys.g * xs.bins * xs.g

    def along_y(e: Expr) -> Expr:
        return reshape(e, (rois_n, 1, ys.bins, ys.g, 1, 1))

    def along_x(e: Expr) -> Expr:
        return reshape(e, (rois_n, 1, 1, 1, xs.bins, xs.g))

    valid = broadcast_to(logical_and(along_y(ys.valid), along_x(xs.valid)), sample)
    image = reshape(take(data, clip(batch, 0, n - 1), axis=0), (rois_n, c, h * w))
    zero = const(np.asarray(0.0, dtype))
    pixels, weights, terms = [], [], []
    for yi, wy in ((ys.low, ys.w0), (ys.high, ys.w1)):
        for xi, wx in ((xs.low, xs.w0), (xs.high, xs.w1)):
            flat = add(multiply(along_y(yi), const(np.asarray(float(w), dtype))), along_x(xi))
            index = reshape(broadcast_to(cast(flat, "int32"), sample), (rois_n, c, count))
            weight = multiply(along_y(wy), along_x(wx))
            pixels.append(index)
            weights.append(weight)
            terms.append(multiply(weight, reshape(gather_elements(image, index, axis=2), sample)))
    best = functools.reduce(maximum, terms)
    most = max(where(valid, best, broadcast_to(zero, sample)), axis=(3, 5), keepdims=True)
    hits = [logical_and(valid, equal(t, most)) for t in terms]
    # an out-of-range sample counts as one candidate 0, which takes a share and passes it nowhere
    ties = cast(logical_and(logical_not(valid), equal(most, zero)), dtype)
    for hit in hits:
        ties = add(ties, cast(hit, dtype))
    ties = maximum(sum(ties, axis=(3, 5), keepdims=True), const(np.asarray(1.0, dtype)))
    share = divide(reshape(grad, (rois_n, c, ys.bins, 1, xs.bins, 1)), ties)
    updates = [reshape(multiply(cast(hit, dtype), multiply(share, weight)), (rois_n, c, count))
               for hit, weight in zip(hits, weights, strict=True)]
    spread = scatter_elements(zeros((rois_n, c, h * w), dtype), concatenate(pixels, 2), concatenate(updates, 2),
                              axis=2, reduction="add")
    return reshape(spread, (rois_n, c, h, w))


def roi_align_grad(call: Call, grad: Expr) -> Grads:
    """data: each sample's bilinear weights times the gradient, back on its pixels (avg: a sample's share
    1 / g^2 of its bin's; max: the bin's maximal candidates'), summed into the regions' images. rois and
    batch_indices: None (the boxes are taken as non-differentiable, as torchvision and ONNX training do;
    the indices are integers)."""
    data, rois, batch = call.args
    a: Any = call.attrs
    dtype = dtype_of(data)
    shape = shape_of(data)
    oh, ow = a.output_size
    ys = _Axis(rois, 1, oh, shape[2], a, dtype)
    xs = _Axis(rois, 0, ow, shape[3], a, dtype)
    per_roi = _avg(grad, ys, xs) if a.mode == "avg" else _max(grad, data, batch, ys, xs)
    return [_into_images(per_roi, batch, shape, dtype), None, None]
