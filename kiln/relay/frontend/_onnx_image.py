"""ONNX converters of the sampling ops: GridSample, AffineGrid, RoiAlign and DeformConv.

GridSample lowers to image.grid_sample, which gathers each output element's
taps itself; opset 16 spells its modes bilinear / bicubic and takes 4-D inputs
only, opset 20 renamed them linear / cubic and allows any rank.

AffineGrid is a product of theta with a constant grid of homogeneous base
coordinates (the centres of the output's pixels, normalized to [-1, 1]): its
`size` input decides the output's shape, so it is read as a value. The base
grid is built here in float64 with the spacing of ONNX's reference
(``linspace`` over the normalized range), so the product is one nn.dense.

RoiAlign lowers to nn.roi_align with a fixed sampling grid (sampling_ratio >= 1;
the adaptive 0 would size each roi's loops from its run-time coordinates).

DeformConv (2-D) samples every kernel tap at its offset position with
image.grid_sample (bilinear, zeros outside, align_corners: the positions
normalized so that -1 and 1 are the first and last pixel, as ONNX's reference
does), scales the samples by the mask, and multiplies the resulting columns by
the weight with nn.dense, one product per group.

AffineGrid's base grid puts an axis of one position at -1 with align_corners,
as ONNX's reference (onnxruntime puts it at 1, PyTorch at 0).

This module registers when `_onnx_nn` imports it.
"""

from __future__ import annotations

import math

import numpy as np

from kiln import relay
from kiln.relay.expr import Expr
from kiln.relay.frontend.onnx import OnnxNode, onnx_converter

# --- GridSample -----------------------------------------------------------------------------------

_OPSET16_MODES = {"bilinear": "linear", "nearest": "nearest", "bicubic": "cubic"}


@onnx_converter("GridSample", since=16)
def _grid_sample(node: OnnxNode) -> Expr:
    mode = node.attr("mode", "bilinear" if node.opset < 20 else "linear")
    if node.opset < 20:
        if mode not in _OPSET16_MODES:
            raise node.error(f"attribute mode is {mode!r}: expected bilinear, nearest or bicubic (opset {node.opset})")
        if node.ndim(0) != 4:
            raise node.error(f"opset {node.opset} samples 4-D inputs (N, C, H, W) only, found shape {node.shape(0)}")
        mode = _OPSET16_MODES[mode]
    elif mode not in ("linear", "nearest", "cubic"):
        raise node.error(f"attribute mode is {mode!r}: expected linear, nearest or cubic")
    padding_mode = node.attr("padding_mode", "zeros")
    if padding_mode not in ("zeros", "border", "reflection"):
        raise node.error(f"attribute padding_mode is {padding_mode!r}: expected zeros, border or reflection")
    return relay.image.grid_sample(node.input(0), node.input(1, "grid"), method=mode, padding_mode=padding_mode,
                                   align_corners=node.bool_attr("align_corners", False))


# --- AffineGrid -----------------------------------------------------------------------------------


def _base_grid(spatial: list[int], align_corners: bool) -> np.ndarray:
    """The homogeneous base coordinates (x, y[, z], 1) of every output position, (prod(spatial), nd + 1).

    Entry 0 is the last spatial axis (x), as GridSample reads it.
    """
    axes = []
    for size in spatial:
        if align_corners:
            # An axis of one position: -1 as ONNX's reference (onnxruntime gives 1, PyTorch 0); the spec is silent.
            axes.append(np.linspace(-1.0, 1.0, size) if size > 1 else np.full(1, -1.0))
        else:
            axes.append((np.arange(size) * 2.0 + 1.0) / size - 1.0)
    mesh = np.meshgrid(*axes, indexing="ij")  # one array per spatial axis, shaped `spatial`
    coords = [m.reshape(-1) for m in reversed(mesh)]
    return np.stack([*coords, np.ones(math.prod(spatial))], axis=-1)


@onnx_converter("AffineGrid", since=20)
def _affine_grid(node: OnnxNode) -> Expr:
    theta = node.input(0)
    size = [int(v) for v in node.value(1, "size").reshape(-1)]
    if len(size) not in (4, 5):
        raise node.error(f"input size is {size}: expected (N, C, H, W) or (N, C, D, H, W)")
    n, spatial = size[0], size[2:]
    nd = len(spatial)
    if n < 1 or any(s < 1 for s in spatial):
        raise node.error(f"input size is {size}: N and the spatial sizes must be at least 1")
    shape = node.shape(0)
    if len(shape) != 3 or shape[0] != n or shape[1] != nd or shape[2] != nd + 1:
        raise node.error(f"theta has shape {shape}: expected ({n}, {nd}, {nd + 1}) for size {size}")
    dtype = node.dtype(0)
    base = relay.const(_base_grid(spatial, node.bool_attr("align_corners", False)).astype(dtype.numpy()))
    # (positions, nd + 1) x (n * nd, nd + 1)^T: every batch's rows of theta at once
    product = relay.nn.dense(base, relay.reshape(theta, (n * nd, nd + 1), allowzero=True))
    grid = relay.transpose(relay.reshape(product, (math.prod(spatial), n, nd), allowzero=True), (1, 0, 2))
    return relay.reshape(grid, (n, *spatial, nd), allowzero=True)


# --- RoiAlign -------------------------------------------------------------------------------------


@onnx_converter("RoiAlign", since=10)
def _roi_align(node: OnnxNode) -> Expr:
    mode = node.attr("mode", "avg")
    if mode not in ("avg", "max"):
        raise node.error(f"attribute mode is {mode!r}: expected avg or max")
    transform = node.attr("coordinate_transformation_mode", "half_pixel" if node.opset >= 16 else "output_half_pixel")
    if transform not in ("half_pixel", "output_half_pixel"):
        raise node.error(f"attribute coordinate_transformation_mode is {transform!r}: expected half_pixel or "
                         "output_half_pixel")
    ratio = node.int_attr("sampling_ratio", 0)
    if ratio < 1:
        raise node.error(f"attribute sampling_ratio is {ratio}: kiln needs a fixed number of samples per bin (>= 1); "
                         "the adaptive 0 takes it from each roi's size at run time")
    size = (node.int_attr("output_height", 1), node.int_attr("output_width", 1))
    if min(size) < 1:
        raise node.error(f"output_height and output_width are {size}: expected values >= 1")
    return relay.nn.roi_align(
        node.input(0), node.input(1, "rois"), node.input(2, "batch_indices"), output_size=size, sampling_ratio=ratio,
        spatial_scale=node.float_attr("spatial_scale", 1.0), mode=mode, half_pixel=transform == "half_pixel")


# --- DeformConv -----------------------------------------------------------------------------------


def _deform_positions(node: OnnxNode, offset: Expr, kernel: tuple[int, int], out: tuple[int, int],
                      groups: int) -> Expr:
    """The normalized grid (N * offset_group, kh * kw * OH, OW, 2) of every tap's deformed position, (x, y).

    A tap's position is ``(begin + stride * i + dilation * k) + offset``; GridSample with align_corners
    maps -1 and 1 to the first and last pixel, as ONNX's reference samples it.
    """
    n, _, ih, iw = node.static_shape(0)
    (kh, kw), (oh, ow) = kernel, out
    strides, dilations = _pair(node, "strides", 1), _pair(node, "dilations", 1)
    pads = node.ints_attr("pads", None) or [0, 0, 0, 0]
    dtype = node.dtype(0)
    base = np.zeros((kh, kw, 2, oh, ow))
    base[:, :, 0] = (np.arange(kh)[:, None, None, None] * dilations[0] - pads[0]
                     + strides[0] * np.arange(oh)[None, None, :, None])
    base[:, :, 1] = (np.arange(kw)[None, :, None, None] * dilations[1] - pads[1]
                     + strides[1] * np.arange(ow)[None, None, None, :])
    scale = 2.0 / np.maximum(np.array([ih - 1.0, iw - 1.0]), 1.0)  # an axis of 1 pixel: its one pixel at -1
    pos = relay.add(relay.reshape(offset, (n, groups, kh, kw, 2, oh, ow), allowzero=True),
                    relay.const(base.astype(dtype.numpy())))
    grid = relay.subtract(relay.multiply(pos, relay.const(scale.reshape(2, 1, 1).astype(dtype.numpy()))),
                          relay.const(1.0, dtype=dtype))
    grid = relay.transpose(grid, (0, 1, 2, 3, 5, 6, 4))  # (N, G, kh, kw, OH, OW, (y, x))
    grid = relay.take(grid, relay.const(np.array([1, 0], np.int32)), axis=6)
    return relay.reshape(grid, (n * groups, kh * kw * oh, ow, 2), allowzero=True)


def _pair(node: OnnxNode, name: str, default: int) -> list[int]:
    values = node.ints_attr(name, None) or [default, default]
    if len(values) != 2 or min(values) < 1:
        raise node.error(f"attribute {name!r} is {values}: expected 2 values >= 1")
    return values


@onnx_converter("DeformConv", since=19)
def _deform_conv(node: OnnxNode) -> Expr:
    if node.ndim(0) != 4:
        raise node.error(f"only 2-D deformable convolutions (input N, C, H, W) are supported, found shape "
                         f"{node.shape(0)}")
    x, w, offset = node.input(0), node.input(1, "W"), node.input(2, "offset")
    n, c, ih, iw = node.static_shape(0)
    oc, cg, kh, kw = node.static_shape(1, "the weight W")
    groups, offset_groups = node.int_attr("group", 1), node.int_attr("offset_group", 1)
    if groups < 1 or offset_groups < 1 or c != cg * groups or oc % groups or c % offset_groups:
        raise node.error(f"X {node.shape(0)} and W {node.shape(1)} do not fit group {groups} and offset_group "
                         f"{offset_groups}: C must be W's dim 1 times group, and divide by offset_group")
    declared = node.ints_attr("kernel_shape", None)
    if declared is not None and list(declared) != [kh, kw]:
        raise node.error(f"attribute kernel_shape {declared} does not match the weight's spatial dims {[kh, kw]}")
    strides, dilations = _pair(node, "strides", 1), _pair(node, "dilations", 1)
    pads = node.ints_attr("pads", None) or [0, 0, 0, 0]
    if len(pads) != 4 or min(pads) < 0:
        raise node.error(f"attribute 'pads' is {pads}: expected 4 values >= 0")
    oh = (ih + pads[0] + pads[2] - (kh - 1) * dilations[0] - 1) // strides[0] + 1
    ow = (iw + pads[1] + pads[3] - (kw - 1) * dilations[1] - 1) // strides[1] + 1
    k, p = kh * kw, oh * ow
    if min(oh, ow) < 1 or node.shape(2) != (n, offset_groups * k * 2, oh, ow):
        raise node.error(f"offset has shape {node.shape(2)}: expected {(n, offset_groups * k * 2, oh, ow)} "
                         f"(N, offset_group * kh * kw * 2, output height, output width)")
    grid = _deform_positions(node, offset, (kh, kw), (oh, ow), offset_groups)
    planes = relay.reshape(x, (n * offset_groups, c // offset_groups, ih, iw), allowzero=True)
    sampled = relay.image.grid_sample(planes, grid, method="linear", padding_mode="zeros", align_corners=True)
    sampled = relay.reshape(sampled, (n, offset_groups, c // offset_groups, k, oh, ow), allowzero=True)
    mask = node.optional_input(4)
    if mask is not None:
        if node.shape(4) != (n, offset_groups * k, oh, ow):
            raise node.error(f"mask has shape {node.shape(4)}: expected {(n, offset_groups * k, oh, ow)}")
        sampled = relay.multiply(sampled, relay.reshape(mask, (n, offset_groups, 1, k, oh, ow), allowzero=True))
    # the columns (N * P, C * K), then one product per group of the convolution
    columns = relay.reshape(relay.transpose(relay.reshape(sampled, (n, c * k, p), allowzero=True), (0, 2, 1)),
                            (n * p, c * k), allowzero=True)
    weight = relay.reshape(w, (oc, cg * k), allowzero=True)
    og = oc // groups
    parts = []
    for g in range(groups):
        cols = columns if groups == 1 else relay.strided_slice(columns, [g * cg * k], [(g + 1) * cg * k], axes=[1])
        wg = weight if groups == 1 else relay.strided_slice(weight, [g * og], [(g + 1) * og], axes=[0])
        parts.append(relay.nn.dense(cols, wg))
    out = parts[0] if groups == 1 else relay.concatenate(parts, axis=1)
    out = relay.transpose(relay.reshape(out, (n, p, oc), allowzero=True), (0, 2, 1))
    out = relay.reshape(out, (n, oc, oh, ow), allowzero=True)
    bias = node.optional_input(3)
    return out if bias is None else relay.nn.bias_add(out, bias, axis=1)
