"""Vision ops: nn.roi_align (bilinear pooling of regions of interest, as ONNX RoiAlign).

Each op is declared in one `register_op` chain after the functions it names; its
Python constructor follows, checked against it (`@constructor`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import numpy as np

from kiln import te
from kiln.ir.attrs import Attrs, bool_value, float_value, int_range, one_of
from kiln.ir.types import TensorType, Type
from kiln.registry import OpPattern, attr, register_op
from kiln.relay.expr import Call, Expr, call
from kiln.relay.op._nn_util import accumulator, clamp, differ, static_shape, tensor_shape
from kiln.relay.op._reg import constructor
from kiln.relay.op._rel import RelationError, tensor_args
from kiln.relay.op.conv import (
    pair_field,
)
from kiln.relay.op.vision_grad import roi_align_grad
from kiln.tir import expr as tx
from kiln.tir.expr import PrimExpr

Array = np.ndarray[Any, Any]


# --- nn.roi_align ---------------------------------------------------------------------------------


@attrs.frozen
class RoiAlignAttrs(Attrs):
    """Attributes of nn.roi_align (ONNX RoiAlign's, with a fixed sampling grid)."""

    output_size: tuple[int, int] = pair_field((1, 1), 1, "the pooled output (h, w)")
    sampling_ratio: int = attrs.field(
        default=2, validator=int_range(lo=1), metadata={"doc": "samples per output bin along each axis"}
    )
    spatial_scale: float = attrs.field(
        default=1.0, converter=float, validator=float_value, metadata={"doc": "from roi coordinates to pixels"}
    )
    mode: str = attrs.field(default="avg", validator=one_of("avg", "max"), metadata={"doc": "how samples combine"})
    half_pixel: bool = attrs.field(
        default=True, validator=bool_value, metadata={"doc": "shift the roi by -0.5 pixel (ONNX's half_pixel)"}
    )


def _roi_align_rel(arg_types: list[Type], attrs: RoiAlignAttrs) -> Type | None:
    tensors = tensor_args(arg_types)
    if tensors is None:
        return None
    data, rois, batch = tensors
    if data.ndim != 4 or not data.dtype.is_float:
        raise RelationError(f"expected float data (N, C, H, W), found {data}", arg=0)
    if rois.ndim != 2 or differ(rois.shape[1], 4) or rois.dtype != data.dtype:
        raise RelationError(f"expected rois (num_rois, 4) of dtype {data.dtype}, found {rois}", arg=1)
    if batch.ndim != 1 or differ(batch.shape[0], rois.shape[0]) or not batch.dtype.is_int:
        raise RelationError(f"expected integer batch indices ({rois.shape[0]},), one per roi, found {batch}", arg=2)
    return TensorType((rois.shape[0], data.shape[1], *attrs.output_size), data.dtype)


def _roi_bins(attrs: RoiAlignAttrs, roi: Any, maximum: Callable[[Any, float], Any]) -> tuple[Any, Any, Any, Any]:
    """(start h, start w, bin h, bin w) of rois `roi(k)` (k: x1, y1, x2, y2), in the rois' arithmetic."""
    offset = 0.5 if attrs.half_pixel else 0.0
    x1, y1, x2, y2 = (roi(k) * attrs.spatial_scale - offset for k in range(4))
    height, width = y2 - y1, x2 - x1
    if not attrs.half_pixel:  # the legacy mode makes every roi at least one pixel
        height, width = maximum(height, 1.0), maximum(width, 1.0)
    return y1, x1, height / attrs.output_size[0], width / attrs.output_size[1]


def _bilinear_taps(pos: Any, size: int, floor: Callable[[Any], Any], select: Callable[[Any, Any, Any], Any],
                   ) -> tuple[Any, Any, Any, Any]:
    """(low index, high index, low weight, high weight) of sample position `pos` (>= 0) along an axis."""
    low = floor(pos)
    last = low >= size - 1
    low = select(last, float(size - 1), low)
    high = select(last, float(size - 1), low + 1.0)
    frac = select(last, 0.0, pos - low)
    return low, high, 1.0 - frac, frac


def _roi_align_ref(attrs: RoiAlignAttrs, data: Array, rois: Array, batch: Array) -> Array:
    n, _, h, w = data.shape
    oh, ow = attrs.output_size
    g = attrs.sampling_ratio
    y1, x1, bh, bw = (v[:, None, None] for v in _roi_bins(attrs, lambda k: rois[:, k].astype(np.float64), np.maximum))
    steps = (np.arange(g) + 0.5) / g
    # sample positions: (rois, out, samples)
    ys = y1 + np.arange(oh)[None, :, None] * bh + steps[None, None, :] * bh
    xs = x1 + np.arange(ow)[None, :, None] * bw + steps[None, None, :] * bw
    img = data[np.clip(batch, 0, n - 1)].astype(np.float64)  # (rois, C, H, W)
    r = np.arange(len(rois))[:, None, None, None, None]
    valid_y, valid_x = (ys >= -1.0) & (ys <= h), (xs >= -1.0) & (xs <= w)
    ylo, yhi, wy0, wy1 = _bilinear_taps(np.maximum(ys, 0), h, np.floor, np.where)
    xlo, xhi, wx0, wx1 = _bilinear_taps(np.maximum(xs, 0), w, np.floor, np.where)

    def at(yi: Array, xi: Array) -> Array:  # (rois, C, OH, gy, OW, gx)
        picked = img[r, :, yi.astype(np.int64)[:, :, :, None, None], xi.astype(np.int64)[:, None, None, :, :]]
        return np.moveaxis(picked, -1, 1)

    def weight(a: Array, b: Array) -> Array:
        return (a[:, :, :, None, None] * b[:, None, None, :, :])[:, None]

    terms = [weight(wy0, wx0) * at(ylo, xlo), weight(wy0, wx1) * at(ylo, xhi),
             weight(wy1, wx0) * at(yhi, xlo), weight(wy1, wx1) * at(yhi, xhi)]
    valid = (valid_y[:, :, :, None, None] & valid_x[:, None, None, :, :])[:, None]
    if attrs.mode == "avg":
        out = np.where(valid, sum(terms), 0.0).sum(axis=(3, 5)) / (g * g)
    else:
        out = np.where(valid, np.max(np.stack(terms), axis=0), 0.0).max(axis=(3, 5))
    pooled: Array = out.astype(data.dtype)
    return pooled


def _roi_align_compute(attrs: RoiAlignAttrs, inputs: list[te.Tensor], out_type: Type) -> list[te.Tensor]:
    """Each output bin: its g x g samples (a reduction), each bilinear from the 4 pixels around it."""
    data, rois, batch = inputs
    n, _, h, w = tensor_shape(data)
    g = attrs.sampling_ratio
    acc = accumulator(data.dtype)
    iy, ix = te.reduce_axis((0, g), "iy"), te.reduce_axis((0, g), "ix")

    def select(cond: PrimExpr, a: Any, b: Any) -> PrimExpr:
        return te.if_then_else(cond, a, b)

    def element(r: PrimExpr, c: PrimExpr, ph: PrimExpr, pw: PrimExpr) -> PrimExpr:
        b = clamp(te.cast(batch[r], "int32"), n)
        y1, x1, bh, bw = _roi_bins(attrs, lambda k: te.cast(rois[r, k], acc), tx.max_)
        yy = y1 + te.cast(ph, acc) * bh + (te.cast(iy, acc) + 0.5) * bh / float(g)
        xx = x1 + te.cast(pw, acc) * bw + (te.cast(ix, acc) + 0.5) * bw / float(g)
        valid = tx.all_of(yy >= -1.0, yy <= float(h), xx >= -1.0, xx <= float(w))
        ylo, yhi, wy0, wy1 = _bilinear_taps(tx.max_(yy, 0.0), h, te.floor, select)
        xlo, xhi, wx0, wx1 = _bilinear_taps(tx.max_(xx, 0.0), w, te.floor, select)

        def at(yi: PrimExpr, xi: PrimExpr) -> PrimExpr:
            return te.cast(data[b, c, clamp(te.cast(yi, "int32"), h), clamp(te.cast(xi, "int32"), w)], acc)

        terms = [wy0 * wx0 * at(ylo, xlo), wy0 * wx1 * at(ylo, xhi), wy1 * wx0 * at(yhi, xlo),
                 wy1 * wx1 * at(yhi, xhi)]
        zero = te.const(0.0, acc)
        if attrs.mode == "avg":
            return te.sum(te.if_then_else(valid, terms[0] + terms[1] + terms[2] + terms[3], zero), axis=[iy, ix])
        most = tx.max_(tx.max_(terms[0], terms[1]), tx.max_(terms[2], terms[3]))
        return te.max(te.if_then_else(valid, most, zero), axis=[iy, ix])

    pooled = te.compute(static_shape(out_type), element, name="roi_align_samples")
    scale = 1.0 / (g * g) if attrs.mode == "avg" else 1.0
    return [te.compute(static_shape(out_type), lambda *i: te.cast(pooled[i] * scale, data.dtype), name="roi_align")]


(register_op("nn.roi_align").describe("bilinear average (or max) pooling of regions of interest, as ONNX RoiAlign")
    .add_argument("data", "Tensor", "the input, (N, C, H, W)")
    .add_argument("rois", "Tensor", "the regions, (num_rois, 4): x1, y1, x2, y2 in input coordinates")
    .add_argument("batch_indices", "Tensor", "the image of each region, (num_rois,)")
    .set_attrs_type(RoiAlignAttrs)
    .add_type_rel("RoiAlign", _roi_align_rel)
    .set_support_level(5)
    .set_attr(attr.TOpPattern, OpPattern.OPAQUE)
    .set_attr(attr.FReference, _roi_align_ref)
    .set_attr(attr.FCompute, _roi_align_compute)
    .set_attr(attr.FPrimalGradient, roi_align_grad))


@constructor("nn.roi_align")
def roi_align(
    data: Expr,
    rois: Expr,
    batch_indices: Expr,
    output_size: Any = (1, 1),
    sampling_ratio: int = 2,
    spatial_scale: float = 1.0,
    mode: str = "avg",
    half_pixel: bool = True,
) -> Call:
    """Pools each region of interest to `output_size` bins, as ONNX RoiAlign.

    Args:
        data: the input, (N, C, H, W), a float dtype.
        rois: the regions, (num_rois, 4): x1, y1, x2, y2, scaled by `spatial_scale` to pixels.
        batch_indices: the image of `data` each region is taken from, (num_rois,), an integer dtype
            (clamped into [0, N)).
        output_size: the bins of each region, an int or (h, w).
        sampling_ratio: the bilinear samples per bin along each axis (ONNX's adaptive 0 is not supported).
        spatial_scale: the factor from roi coordinates to pixels.
        mode: "avg" (the mean of the samples) or "max" (the maximum, over the samples, of the largest
            of each sample's four weighted pixels, as ONNX).
        half_pixel: shift the scaled roi by -0.5 (ONNX's half_pixel; False is output_half_pixel, which also
            makes each roi at least one pixel).

    Returns:
        The call of nn.roi_align: (num_rois, C, h, w).
    """
    return call("nn.roi_align", [data, rois, batch_indices], RoiAlignAttrs.make(
        "nn.roi_align", output_size=output_size, sampling_ratio=sampling_ratio, spatial_scale=spatial_scale,
        mode=mode, half_pixel=half_pixel))
