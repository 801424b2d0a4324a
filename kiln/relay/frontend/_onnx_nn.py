"""ONNX converters of the nn ops: convolutions, pools, normalizations and Resize / Upsample.

Windows (Conv, ConvTranspose, MaxPool, AveragePool) follow the ONNX spec: `pads`
is ``[x1_begin, x2_begin, ..., x1_end, x2_end]``, `auto_pad` SAME_UPPER /
SAME_LOWER pad to ``ceil(in / stride)`` outputs (the odd pixel at the end for
SAME_UPPER, at the beginning for SAME_LOWER), VALID pads nothing. kiln's ops are
2-D, so a 1-D conv or pool runs as a 2-D one over (1, W) and is squeezed back,
and 3-D ones (static shapes only) are decomposed: a pool is separable, so it
pools (H, W) with D folded into the channels, then D with (H, W) flattened; a
convolution is a sum over the kernel's depth taps of 2-D convolutions with the
depth folded into the batch (a transposed one spreads each tap's result to its
output depths). Other ranks are an error naming the node. LpPool is
``(sum |x|^p)^(1/p)``, the sum an average over the padded window times the
kernel's size; MaxPool's Indices output (1-D and 2-D) is nn.max_pool2d_argmax.
CausalConvWithState is a depthwise 1-D Conv over the past state and the input.
The sampling ops (GridSample, AffineGrid, RoiAlign, DeformConv) are in
`_onnx_image`, imported at the end of this module so that they register.

BatchNormalization in training mode (opset 14+) computes the batch statistics
and the updated running ones from reductions; InstanceNormalization and the
LayerNormalization statistics outputs are composed from reductions, and
LayerNormalization's Y alone goes to nn.layer_norm over the flattened trailing
axes. Resize and Upsample lower to image.resize; their roi, scales and sizes
must be constants, since kiln compiles static shapes. Resize with antialias
(linear or cubic) multiplies each changed axis by its constant weight matrix,
computed here with the reference's widened filter.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import attrs
import numpy as np

from kiln import relay
from kiln.ir.span import Span
from kiln.ir.types import Dim
from kiln.relay.expr import Expr, TupleGetItem
from kiln.relay.frontend.onnx import OnnxNode, onnx_converter, onnx_dtype
from kiln.relay.op.image import ResizeAxis, source_coordinate
from kiln.relay.op.indexing import check_axes

# --- windows: kernel, strides, dilations, pads ----------------------------------------------------


@attrs.frozen
class _Window:
    """A sliding window over `nd` spatial dims, each list one entry per dim; pads split into begin / end."""

    kernel: list[int]
    strides: list[int]
    dilations: list[int]
    begin: list[int]
    end: list[int]

    def dims(self, *which: int) -> _Window:
        """The window over the spatial dims `which`; -1 adds a dim of kernel 1 (a lifted 1-D window)."""
        def take(values: list[int], unit: int) -> list[int]:
            return [unit if i < 0 else values[i] for i in which]

        return _Window(take(self.kernel, 1), take(self.strides, 1), take(self.dilations, 1),
                       take(self.begin, 0), take(self.end, 0))

    @property
    def padding(self) -> tuple[int, ...]:
        """kiln's 2-D padding: (top, left, bottom, right)."""
        return (*self.begin, *self.end)


def _ints(node: OnnxNode, name: str, nd: int, default: int) -> list[int]:
    """The attribute `name` with one int per spatial dim, or `default` for each."""
    values = node.ints_attr(name, None)
    if values is None:
        return [default] * nd
    if len(values) != nd:
        raise node.error(f"attribute {name!r} is {values}: expected {nd} values, one per spatial dim")
    return values


def _window(node: OnnxNode, spatial: Sequence[Dim], kernel: list[int]) -> _Window:
    """The window of a Conv or pool node over the input's `spatial` dims, its pads resolved from auto_pad."""
    nd = len(spatial)
    strides, dilations = _ints(node, "strides", nd, 1), _ints(node, "dilations", nd, 1)
    if any(s < 1 for s in strides) or any(d < 1 for d in dilations):
        raise node.error(f"strides {strides} and dilations {dilations} must be at least 1")
    auto_pad = node.attr("auto_pad", "NOTSET") or "NOTSET"
    if auto_pad == "NOTSET":
        pads = node.ints_attr("pads", None)  # absent: no padding; given, even empty: one per side
        pads = [0] * (2 * nd) if pads is None else pads
        if len(pads) != 2 * nd or any(p < 0 for p in pads):
            raise node.error(f"attribute 'pads' is {pads}: expected {2 * nd} values >= 0 "
                             "(the begins of the spatial dims, then their ends)")
        return _Window(kernel, strides, dilations, pads[:nd], pads[nd:])
    if auto_pad == "VALID":
        return _Window(kernel, strides, dilations, [0] * nd, [0] * nd)
    if auto_pad not in ("SAME_UPPER", "SAME_LOWER"):
        raise node.error(f"attribute 'auto_pad' is {auto_pad!r}: expected NOTSET, SAME_UPPER, SAME_LOWER or VALID")
    begin, end = [], []
    for size, k, s, d in zip(spatial, kernel, strides, dilations, strict=True):
        if not isinstance(size, int):
            raise node.error(f"auto_pad {auto_pad} needs static spatial dims, found {tuple(map(str, spatial))}")
        total = max(0, (-(-size // s) - 1) * s + (k - 1) * d + 1 - size)
        small, large = total // 2, total - total // 2
        begin.append(small if auto_pad == "SAME_UPPER" else large)
        end.append(large if auto_pad == "SAME_UPPER" else small)
    return _Window(kernel, strides, dilations, begin, end)


def _kernel(node: OnnxNode, weight_spatial: Sequence[int]) -> list[int]:
    """The kernel of a Conv / ConvTranspose: the weight's spatial dims, checked against kernel_shape."""
    declared = node.ints_attr("kernel_shape", None)
    if declared is not None and list(declared) != list(weight_spatial):
        raise node.error(f"attribute kernel_shape {declared} does not match the weight's spatial dims "
                         f"{list(weight_spatial)}")
    return list(weight_spatial)


def _spatial_rank(node: OnnxNode, what: str) -> int:
    """The number of spatial dims of input 0 (N, C, spatial...): 1, 2 or 3."""
    nd = node.ndim(0) - 2
    if nd not in (1, 2, 3):
        raise node.error(f"{nd}-D {what} (input of rank {nd + 2}) is not supported: kiln supports 1-D, 2-D and 3-D")
    return nd


# --- Conv, ConvTranspose --------------------------------------------------------------------------


def _bias(node: OnnxNode, out: Expr, index: int) -> Expr:
    bias = node.optional_input(index)
    return out if bias is None else relay.nn.bias_add(out, bias, axis=1)


def _weight(node: OnnxNode, nd: int) -> tuple[int, ...]:
    weight = node.static_shape(1, "the weight W")
    if len(weight) != nd + 2:
        raise node.error(f"the weight has shape {weight}; expected rank {nd + 2} like the input")
    return weight


def _slice(e: Expr, begin: int, end: int, stride: int = 1, axis: int = 2) -> Expr:
    """`e[begin:end:stride]` along `axis` (the depth of a 3-D input or weight by default)."""
    return relay.strided_slice(e, [begin], [end], [stride], axes=[axis])


def _pad_axis(node: OnnxNode, e: Expr, axis: int, before: int, after: int) -> Expr:
    """`e` with zeros added before and after along `axis`."""
    if not before and not after:
        return e
    widths = [(before, after) if i == axis else (0, 0) for i in range(node.ndim(e))]
    return relay.nn.pad(e, widths, relay.const(0, dtype=node.dtype(e)))


@onnx_converter("Conv", since=1)
def _conv(node: OnnxNode) -> Expr:
    nd = _spatial_rank(node, "convolution")
    x, w = node.input(0), node.input(1, "W")
    weight = _weight(node, nd)
    win = _window(node, node.shape(0)[2:], _kernel(node, weight[2:]))
    groups = node.int_attr("group", 1)

    def conv2d(data: Expr, kernel: Expr, plane: _Window) -> Expr:
        return relay.nn.conv2d(data, kernel, strides=plane.strides, padding=plane.padding,
                               dilation=plane.dilations, groups=groups)

    if nd == 1:
        return _bias(node, relay.squeeze(conv2d(relay.expand_dims(x, 2), relay.expand_dims(w, 2),
                                                win.dims(-1, 0)), axis=2), 2)
    if nd == 2:
        return _bias(node, conv2d(x, w, win), 2)
    # 3-D: a sum over the kernel's depth taps of 2-D convolutions, the output depths folded into the batch.
    n, c, d, h, wd = node.static_shape(0)
    o, ig, kd, kh, kw = weight
    (sd, dd), depth = (win.strides[0], win.dilations[0]), d + win.begin[0] + win.end[0]
    od = (depth - dd * (kd - 1) - 1) // sd + 1
    if od < 1:
        raise node.error(f"the output depth would be {od}: input depth {d}, pads ({win.begin[0]}, {win.end[0]}), "
                         f"kernel {kd}, stride {sd}, dilation {dd}")
    xt = relay.transpose(_pad_axis(node, x, 2, win.begin[0], win.end[0]), (0, 2, 1, 3, 4))
    total: Expr | None = None
    for k in range(kd):
        taps = relay.reshape(_slice(xt, k * dd, k * dd + sd * (od - 1) + 1, sd, axis=1), (n * od, c, h, wd),
                             allowzero=True)
        y = conv2d(taps, relay.reshape(_slice(w, k, k + 1), (o, ig, kh, kw), allowzero=True), win.dims(1, 2))
        total = y if total is None else relay.add(total, y)
    assert total is not None  # kd >= 1
    _, _, oh, ow = node.static_shape(total)
    return _bias(node, relay.transpose(relay.reshape(total, (n, od, o, oh, ow), allowzero=True), (0, 2, 1, 3, 4)), 2)


@onnx_converter("CausalConvWithState", since=27)
def _causal_conv_with_state(node: OnnxNode) -> list[Expr]:
    # The past state (zeros by default) in front of the input, a depthwise 1-D convolution without padding,
    # and the last k - 1 positions of the padded input as the present state.
    x, w = node.input(0), node.input(1, "weight")
    if node.ndim(0) != 3:
        raise node.error(f"expected an input (batch, channels, length), found shape {node.shape(0)}")
    n, c, _ = node.static_shape(0)
    weight = node.static_shape(1, "the weight")
    if len(weight) != 3 or weight[:2] != (c, 1) or weight[2] < 1:
        raise node.error(f"the weight has shape {weight}: expected ({c}, 1, k), one kernel per channel")
    k = weight[2]
    activation = node.attr("activation", "none")
    if activation not in ("none", "silu", "swish"):
        raise node.error(f"attribute activation is {activation!r}: expected none, silu or swish")
    past = node.optional_input(3)
    if past is None:
        past = relay.zeros((n, c, k - 1), str(node.dtype(0)))
    elif node.shape(3) != (n, c, k - 1):
        raise node.error(f"past_state has shape {node.shape(3)}: expected {(n, c, k - 1)}")
    padded: Expr = relay.concatenate([past, x], axis=2) if k > 1 else x
    length = node.static_shape(padded)[2]
    y: Expr = relay.squeeze(relay.nn.conv2d(relay.expand_dims(padded, 2), relay.expand_dims(w, 2), groups=c), axis=2)
    y = _bias(node, y, 2)
    if activation != "none":
        y = relay.multiply(y, relay.sigmoid(y))
    return [y, relay.strided_slice(padded, [length - (k - 1)], [length], axes=[2])]


def _transpose_crops(node: OnnxNode, spatial: Sequence[Dim], win: _Window, output_padding: list[int],
                     ) -> tuple[list[int], list[int]]:
    """ConvTranspose's crops (begin, end) of ``full = stride * (in - 1) + (kernel - 1) * dilation + 1``.

    A negative crop extends the output with zeros (ONNX's output_padding is a negative end crop).
    With `output_shape`, or auto_pad SAME_* (output ``in * stride``), the crop is the difference, split
    as the spec says: the larger half at the end for SAME_UPPER, at the beginning otherwise.
    """
    nd = len(spatial)
    output_shape = node.ints_attr("output_shape", None)
    auto_pad = node.attr("auto_pad", "NOTSET") or "NOTSET"
    if auto_pad not in ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"):
        raise node.error(f"attribute 'auto_pad' is {auto_pad!r}: expected NOTSET, SAME_UPPER, SAME_LOWER or VALID")
    if output_shape is None and auto_pad not in ("SAME_UPPER", "SAME_LOWER"):
        begin, end = ([0] * nd, [0] * nd) if auto_pad == "VALID" else (win.begin, win.end)
        return list(begin), [e - p for e, p in zip(end, output_padding, strict=True)]
    sizes = [d for d in spatial if isinstance(d, int)]
    if len(sizes) != nd:
        raise node.error(f"output_shape and auto_pad {auto_pad} need static spatial dims, found "
                         f"{tuple(map(str, spatial))}")
    if output_shape is None:
        output_shape = [size * s for size, s in zip(sizes, win.strides, strict=True)]
    if len(output_shape) not in (nd, nd + 2):
        raise node.error(f"attribute output_shape {output_shape} needs {nd} spatial dims")
    begin, end = [], []
    for i, out in enumerate(output_shape[-nd:]):
        full = win.strides[i] * (sizes[i] - 1) + (win.kernel[i] - 1) * win.dilations[i] + 1
        total = full + output_padding[i] - out
        small, large = total // 2, total - total // 2
        if total < 0:  # an output larger than the full one: zeros at the end
            b, e = 0, total
        else:
            b, e = (small, large) if auto_pad == "SAME_UPPER" else (large, small)
        begin.append(b)
        end.append(e - output_padding[i])
    return begin, end


def _conv_transpose2d(node: OnnxNode, x: Expr, w: Expr, win: _Window, groups: int) -> Expr:
    """conv2d_transpose with `win`'s begin / end as crops of the full output (negative: zeros added).

    kiln's output_padding adds zero rows at the end below max(stride, dilation); more is an nn.pad.
    """
    grow = [max(-e, 0) for e in win.end]
    extra = [min(g, max(s, d) - 1) for g, s, d in zip(grow, win.strides, win.dilations, strict=True)]
    out: Expr = relay.nn.conv2d_transpose(
        x, w, strides=win.strides, dilation=win.dilations, groups=groups, output_padding=extra,
        padding=(*[max(b, 0) for b in win.begin], *[max(e, 0) for e in win.end]))
    for i in range(2):
        out = _pad_axis(node, out, 2 + i, max(-win.begin[i], 0), grow[i] - extra[i])
    return out


def _place(node: OnnxNode, e: Expr, axis: int, start: int, size: int) -> Expr | None:
    """`e` put at `start` along `axis` of zeros of extent `size`, cropped to fit; None when nothing fits."""
    length = node.static_shape(e)[axis]
    lo, hi = max(0, -start), min(length, size - start)
    if hi <= lo:
        return None
    if (lo, hi) != (0, length):
        e = _slice(e, lo, hi, axis=axis)
    return _pad_axis(node, e, axis, max(start, 0), size - max(start, 0) - (hi - lo))


@onnx_converter("ConvTranspose", since=1)
def _conv_transpose(node: OnnxNode) -> Expr:
    nd = _spatial_rank(node, "transposed convolution")
    x, w = node.input(0), node.input(1, "W")
    weight = _weight(node, nd)
    pads = node.ints_attr("pads", None)
    pads = [0] * (2 * nd) if pads is None else pads
    if len(pads) != 2 * nd:
        raise node.error(f"attribute 'pads' is {pads}: expected {2 * nd} values")
    win = _Window(_kernel(node, weight[2:]), _ints(node, "strides", nd, 1), _ints(node, "dilations", nd, 1),
                  pads[:nd], pads[nd:])
    begin, end = _transpose_crops(node, node.shape(0)[2:], win, _ints(node, "output_padding", nd, 0))
    win = attrs.evolve(win, begin=begin, end=end)
    groups = node.int_attr("group", 1)
    if nd == 1:
        out = _conv_transpose2d(node, relay.expand_dims(x, 2), relay.expand_dims(w, 2), win.dims(-1, 0), groups)
        return _bias(node, relay.squeeze(out, axis=2), 2)
    if nd == 2:
        return _bias(node, _conv_transpose2d(node, x, w, win, groups), 2)
    # 3-D: each depth tap k is a 2-D transposed convolution of every input depth (folded into the batch),
    # which lands at output depths i * stride + k * dilation: spread by the stride, shifted, summed.
    n, c, d, h, wd = node.static_shape(0)
    _, og, kd, kh, kw = weight
    sd, dd = win.strides[0], win.dilations[0]
    size = sd * (d - 1) + dd * (kd - 1) + 1 - begin[0] - end[0]
    if size < 1:
        raise node.error(f"the output depth would be {size}: input depth {d}, crops ({begin[0]}, {end[0]}), "
                         f"kernel {kd}, stride {sd}, dilation {dd}")
    xt = relay.reshape(relay.transpose(x, (0, 2, 1, 3, 4)), (n * d, c, h, wd), allowzero=True)
    total: Expr | None = None
    for k in range(kd):
        tap = relay.reshape(_slice(w, k, k + 1), (c, og, kh, kw), allowzero=True)
        y = _conv_transpose2d(node, xt, tap, win.dims(1, 2), groups)
        _, o, oh, ow = node.static_shape(y)
        y = relay.reshape(y, (n, d, o, oh, ow), allowzero=True)
        if sd > 1:  # input depth i at i * sd: sd - 1 zero planes after each
            y = _pad_axis(node, relay.expand_dims(y, 2), 2, 0, sd - 1)
            y = relay.reshape(y, (n, d * sd, o, oh, ow), allowzero=True)
        placed = _place(node, y, 1, k * dd - begin[0], size)
        if placed is not None:
            total = placed if total is None else relay.add(total, placed)
    assert total is not None  # the last tap ends at the full output's end, which the crops keep
    return _bias(node, relay.transpose(total, (0, 2, 1, 3, 4)), 2)


# --- MaxPool, AveragePool, the global pools -------------------------------------------------------


def _pool2d(x: Expr, kind: str, win: _Window, ceil_mode: bool, count_include_pad: bool) -> Expr:
    if kind == "max":
        return relay.nn.max_pool2d(x, pool_size=win.kernel, strides=win.strides, dilation=win.dilations,
                                   padding=win.padding, ceil_mode=ceil_mode)
    return relay.nn.avg_pool2d(x, pool_size=win.kernel, strides=win.strides, dilation=win.dilations,
                               padding=win.padding, ceil_mode=ceil_mode, count_include_pad=count_include_pad)


def _pool(node: OnnxNode, kind: str, x: Expr | None = None, count_include_pad: bool | None = None) -> Expr:
    """The pool `kind` ("max" or "avg") of `x` (default: input 0) with the node's window."""
    nd = _spatial_rank(node, "pooling")
    kernel = node.ints_attr("kernel_shape")
    assert kernel is not None  # required
    if len(kernel) != nd:
        raise node.error(f"attribute kernel_shape {kernel} needs {nd} values for an input of rank {nd + 2}")
    x = node.input(0) if x is None else x
    win = _window(node, node.shape(0)[2:], kernel)
    if any(p >= k for p, k in zip(win.begin + win.end, kernel + kernel, strict=True)):
        # a window wholly in the padding has no elements: its max or average is not defined
        raise node.error(f"pads {win.begin + win.end} must be smaller than the kernel {kernel}")
    ceil_mode = node.bool_attr("ceil_mode", False)
    if count_include_pad is None:
        count_include_pad = node.bool_attr("count_include_pad", False)
    if nd == 2:
        return _pool2d(x, kind, win, ceil_mode, count_include_pad)
    if nd == 1:
        out = _pool2d(relay.expand_dims(x, 2), kind, win.dims(-1, 0), ceil_mode, count_include_pad)
        return relay.squeeze(out, axis=2)
    # 3-D: a window is the product of its dims' ranges, so max and sum separate; so does the average's
    # divisor (the taps counted in a window are a box too), so pooling (H, W) then D is exact.
    n, c, d, h, w = node.static_shape(0)
    hw = _pool2d(relay.reshape(x, (n, c * d, h, w), allowzero=True), kind, win.dims(1, 2), ceil_mode, count_include_pad)
    _, _, oh, ow = node.static_shape(hw)
    depth = win.dims(0, -1)
    out = _pool2d(relay.reshape(hw, (n, c, d, oh * ow), allowzero=True), kind, depth, ceil_mode, count_include_pad)
    return relay.reshape(out, (n, c, node.static_shape(out)[2], oh, ow), allowzero=True)


@onnx_converter("MaxPool", since=1)
def _max_pool(node: OnnxNode) -> Expr | list[Expr]:
    storage_order = node.bool_attr("storage_order", False)
    y = _pool(node, "max")
    if len(node.outputs) < 2 or not node.outputs[1]:
        return y
    # Indices: where each maximum is, in the flattened input (1-D and 2-D; a 1-D pool is a 2-D one of height 1)
    nd = _spatial_rank(node, "pooling")
    if nd == 3:
        raise node.error("the Indices output of a 3-D MaxPool is not supported (1-D and 2-D are)")
    kernel = node.ints_attr("kernel_shape")
    assert kernel is not None  # _pool checked it
    win = _window(node, node.shape(0)[2:], kernel)
    x = node.input(0)
    if nd == 1:
        x, win = relay.expand_dims(x, 2), win.dims(-1, 0)
    indices = relay.nn.max_pool2d_argmax(
        x, pool_size=win.kernel, strides=win.strides, dilation=win.dilations, padding=win.padding,
        ceil_mode=node.bool_attr("ceil_mode", False), storage_order=storage_order)
    return [y, relay.squeeze(indices, axis=2) if nd == 1 else indices]


@onnx_converter("AveragePool", since=1)
def _avg_pool(node: OnnxNode) -> Expr:
    return _pool(node, "avg")


@onnx_converter("LpPool", since=1)
def _lp_pool(node: OnnxNode) -> Expr:
    # (sum of |x|^p over the window)^(1/p): the sum is the average over the padded window (the padding
    # reads 0) times the kernel's size. Opset 1's p is a float, later ones an int.
    p = node.float_attr("p", 2.0)
    if not p > 0:
        raise node.error(f"attribute p is {p}: expected a value > 0")
    kernel = node.ints_attr("kernel_shape")
    assert kernel is not None  # required
    x, dtype = node.input(0), node.dtype(0)
    powered = relay.multiply(x, x) if p == 2 else relay.power(relay.abs(x), relay.const(p, dtype=dtype))
    mean = _pool(node, "avg", powered, count_include_pad=True)
    total = relay.multiply(mean, relay.const(float(math.prod(kernel)), dtype=dtype))
    return relay.sqrt(total) if p == 2 else relay.power(total, relay.const(1.0 / p, dtype=dtype))


def _global_pool(node: OnnxNode, kind: str) -> Expr:
    rank = node.ndim(0)
    if rank < 3:
        raise node.error(f"expected an input of rank 3 or more (N, C, spatial...), found rank {rank}")
    x = node.input(0)
    if rank == 4:
        return relay.nn.global_max_pool2d(x) if kind == "max" else relay.nn.global_avg_pool2d(x)
    axes = list(range(2, rank))
    return relay.max(x, axes, keepdims=True) if kind == "max" else relay.mean(x, axes, keepdims=True)


@onnx_converter("GlobalAveragePool", since=1)
def _global_avg_pool(node: OnnxNode) -> Expr:
    return _global_pool(node, "avg")


@onnx_converter("GlobalMaxPool", since=1)
def _global_max_pool(node: OnnxNode) -> Expr:
    return _global_pool(node, "max")


# --- BatchNormalization, InstanceNormalization, LayerNormalization -------------------------------


def _channel_vectors(node: OnnxNode, names: Sequence[tuple[int, str]]) -> None:
    """Checks that each input (index, name) is a vector of one value per channel (dim 1 of input 0)."""
    channels = node.shape(0)[1]
    for i, what in names:
        shape = node.shape(i)
        if len(shape) != 1 or shape[0] != channels:
            raise node.error(f"input #{i} ({what}) has shape {shape}: expected ({channels},), one value per "
                             f"channel of X {node.shape(0)}")


def _moments(x: Expr, axes: list[int], keepdims: bool) -> tuple[Expr, Expr]:
    """(mean, population variance) of `x` over `axes`."""
    mean = relay.mean(x, axes, keepdims=True)
    centered = relay.subtract(x, mean)
    var = relay.mean(relay.multiply(centered, centered), axes, keepdims=keepdims)
    return (mean if keepdims else relay.squeeze(mean, axes)), var


@onnx_converter("BatchNormalization", since=1)
def _batch_norm(node: OnnxNode) -> Expr | list[Expr]:
    if node.int_attr("spatial", 1) != 1:
        raise node.error("spatial=0 (statistics per activation, not per channel) is not supported")
    x, scale, bias, mean, var = (node.input(i, what) for i, what in enumerate(("X", "scale", "B", "mean", "var")))
    if node.ndim(0) < 2:
        raise node.error(f"expected an input of rank 2 or more (N, C, ...), found shape {node.shape(0)}")
    _channel_vectors(node, [(1, "scale"), (2, "B"), (3, "mean"), (4, "var")])
    eps = float(node.attr("epsilon", 1e-5))
    training = node.bool_attr("training_mode", False) if node.opset >= 14 else False
    extra = [o for o in node.outputs[1:] if o]
    if not training:
        if extra:
            raise node.error(f"outputs {extra} exist in training mode only (opset < 14: "
                             "saved statistics are not supported)")
        norm = relay.nn.batch_norm(x, scale, bias, mean, var, axis=1, epsilon=eps)
        return TupleGetItem(norm, 0, span=Span.from_caller())
    rank = node.ndim(0)
    dtype = node.dtype(0)
    batch_mean, batch_var = _moments(x, [0, *range(2, rank)], keepdims=False)
    y = TupleGetItem(relay.nn.batch_norm(x, scale, bias, batch_mean, batch_var, axis=1, epsilon=eps), 0,
                     span=Span.from_caller())
    momentum = float(node.attr("momentum", 0.9))
    keep, take = relay.const(momentum, dtype=dtype), relay.const(1 - momentum, dtype=dtype)

    def running(old: Expr, new: Expr) -> Expr:
        return relay.add(relay.multiply(old, keep), relay.multiply(new, take))

    return [y, running(mean, batch_mean), running(var, batch_var)]


@onnx_converter("InstanceNormalization", since=1)
def _instance_norm(node: OnnxNode) -> Expr:
    x, scale, bias = node.input(0), node.input(1, "scale"), node.input(2, "B")
    rank = node.ndim(0)
    if rank < 3:
        raise node.error(f"expected an input of rank 3 or more (N, C, spatial...), found rank {rank}")
    _channel_vectors(node, [(1, "scale"), (2, "B")])
    dtype = node.dtype(0)
    mean, var = _moments(x, list(range(2, rank)), keepdims=True)
    inv = relay.rsqrt(relay.add(var, relay.const(node.float_attr("epsilon", 1e-5), dtype=dtype)))
    normalized = relay.multiply(relay.subtract(x, mean), inv)
    out = relay.multiply(normalized, relay.expand_dims(scale, 1, num_newaxis=rank - 2))
    return relay.nn.bias_add(out, bias, axis=1)


@onnx_converter("LayerNormalization", since=17)
def _layer_norm(node: OnnxNode) -> Expr | list[Expr]:
    x, scale, bias = node.input(0), node.input(1, "Scale"), node.optional_input(2)
    shape = node.shape(0)
    rank = len(shape)
    axis = node.int_attr("axis", -1)
    if not -rank <= axis < rank:
        raise node.error(f"attribute axis is {axis}: expected a value in [{-rank}, {rank}) for an input of rank {rank}")
    axis %= rank
    node.check_broadcasts_to(scale, shape[axis:], "the Scale")
    if bias is not None:
        node.check_broadcasts_to(bias, shape[axis:], "the bias B")
    eps = float(node.attr("epsilon", 1e-5))
    dtype = node.dtype(0)
    stash = onnx_dtype(node.int_attr("stash_type", 1), f"{node}: stash_type")
    stats = any(node.outputs[1:])
    inner = [d for d in shape[axis:] if isinstance(d, int)]
    if not stats and stash == dtype and eps > 0 and len(inner) == rank - axis and 0 not in inner:
        # One axis for nn.layer_norm: the normalized dims flattened; Scale and B broadcast to them first.
        # Where they are one axis already, no reshape: each would be a copy kernel of its own, and the
        # one before would keep the residual add in front from fusing into the layer norm.
        size = math.prod(inner)
        one_axis = axis == rank - 1

        def flat(v: Expr) -> Expr:
            if list(node.shape(v)) != inner:
                v = relay.broadcast_to(v, inner)
            return v if one_axis else relay.reshape(v, (size,), allowzero=True)

        beta = flat(bias) if bias is not None else relay.zeros((size,), dtype)
        data = x if one_axis else relay.reshape(x, (*[0] * axis, size))
        out = relay.nn.layer_norm(data, flat(scale), beta, axis=-1, epsilon=eps, center=bias is not None)
        return out if one_axis else relay.reshape(out, [0] * axis + inner)
    xs = x if stash == dtype else relay.cast(x, stash)
    axes = list(range(axis, rank))
    mean, var = _moments(xs, axes, keepdims=True)
    inv_std = relay.rsqrt(relay.add(var, relay.const(eps, dtype=stash)))
    normalized: Expr = relay.multiply(relay.subtract(xs, mean), inv_std)
    if stash != dtype:
        normalized = relay.cast(normalized, dtype)
    y = relay.multiply(normalized, scale)
    if bias is not None:
        y = relay.add(y, bias)
    return [y, mean, inv_std]


# --- Resize, Upsample -----------------------------------------------------------------------------


def _const_floats(node: OnnxNode, index: int, what: str) -> list[float] | None:
    """The values of an optional constant input, or None when it is absent or empty."""
    if node.optional_input(index) is None:
        return None
    value = node.value(index, what)
    return None if value.size == 0 else [float(v) for v in value.reshape(-1)]


def _resize_sizes(node: OnnxNode, shape: Sequence[int], axes: list[int], scales: list[float] | None,
                  sizes: list[float] | None, policy: str) -> tuple[list[int], list[float] | None]:
    """The output extents of `axes`, and the scales the coordinate transform uses (None: out / in)."""
    k = len(axes)
    if (scales is None) == (sizes is None):
        raise node.error("give exactly one of the inputs scales and sizes (a non-empty constant)")
    if scales is not None:
        if len(scales) != k:
            raise node.error(f"scales {scales} has {len(scales)} values but {k} axes are resized")
        if any(not s > 0 for s in scales):
            raise node.error(f"scales {scales} must all be > 0")
        return _extents(node, [math.floor(shape[a] * s) for a, s in zip(axes, scales, strict=True)], axes), scales
    assert sizes is not None
    if len(sizes) != k:
        raise node.error(f"sizes {[int(s) for s in sizes]} has {len(sizes)} values but {k} axes are resized")
    if any(s < 1 for s in sizes):
        raise node.error(f"sizes {[int(s) for s in sizes]} must all be at least 1")
    if policy == "stretch":
        return [int(s) for s in sizes], None
    if policy not in ("not_larger", "not_smaller"):
        raise node.error(f"keep_aspect_ratio_policy is {policy!r}: expected stretch, not_larger or not_smaller")
    ratios = [s / shape[a] for a, s in zip(axes, sizes, strict=True)]
    scale = min(ratios) if policy == "not_larger" else max(ratios)
    return _extents(node, [int(scale * shape[a] + 0.5) for a in axes], axes), [scale] * k


def _extents(node: OnnxNode, sizes: list[int], axes: list[int]) -> list[int]:
    empty = [a for a, s in zip(axes, sizes, strict=True) if s < 1]
    if empty:
        raise node.error(f"the scales make axes {empty} of the output empty (output extents {sizes})")
    return sizes


def _asymmetric_resize(x: Expr, sizes: list[int], axes: list[int], mode: str, scales: list[float] | None) -> Expr:
    """Resize-10 and Upsample: asymmetric coordinates; nearest rounds down, or up on a shrinking axis.

    The spec leaves nearest's rounding open; this is onnxruntime's. Nearest is a gather per axis, so the
    shrinking axes (rounding up) and the others (rounding down) are two resizes.
    """
    assert scales is not None
    if mode != "nearest":
        return relay.image.resize(x, sizes, axes, method=mode, coordinate_transformation_mode="asymmetric",
                                  scales=scales)
    for shrink, rounding in ((False, "floor"), (True, "ceil")):
        picked = [i for i, s in enumerate(scales) if (s < 1) == shrink]
        if picked:
            x = relay.image.resize(x, [sizes[i] for i in picked], [axes[i] for i in picked], method="nearest",
                                   coordinate_transformation_mode="asymmetric", nearest_mode=rounding,
                                   scales=[scales[i] for i in picked])
    return x


def _antialias_weights(ax: ResizeAxis, mode: str, method: str, a: float, exclude_outside: bool) -> np.ndarray:
    """The (out, in) matrix of a linear or cubic resize along `ax` with ONNX's antialias filter.

    Downsampling widens the filter by 1 / scale, so every output reads a window of
    inputs; the coefficients, their normalization and the choice of the window's
    inputs are the reference's (onnx.reference's Resize).
    """
    scale = min(ax.scale, 1.0)
    y = np.arange(ax.size_out, dtype=np.float64)
    x = np.broadcast_to(np.asarray(source_coordinate(ax, mode, y), np.float64), y.shape)
    ratio = np.where(x == np.floor(x), 1.0, x - np.floor(x))  # an integer x takes the pixel on its left
    start = math.floor((-1 if method == "linear" else -2) / scale) + 1
    t = np.abs((np.arange(start, 2 - start)[None, :] - ratio[:, None]) * scale)
    if method == "linear":
        coeffs = np.clip(1 - t, 0, 1)
    else:
        cubic = np.where(t < 2, a * t**3 - 5 * a * t**2 + 8 * a * t - 4 * a, 0.0)
        coeffs = np.where(t <= 1, (a + 2) * t**3 - (a + 3) * t**2 + 1, cubic)
    coeffs = coeffs / coeffs.sum(axis=1, keepdims=True)
    n = coeffs.shape[1]
    pad = math.ceil(n / 2)  # the n inputs nearest to x, ties to the smaller index
    p = np.floor(x + pad)
    frac = x + pad - p
    if n % 2 == 0:
        first = np.where(frac == 0, -(n // 2), 1 - n // 2)
    else:
        first = np.where(frac <= 0.5, -((n - 1) // 2), 1 - (n - 1) // 2)
    idx = (p + first).astype(np.int64)[:, None] + np.arange(n)[None, :] - pad
    if exclude_outside:
        coeffs = np.where((idx >= 0) & (idx < ax.size_in), coeffs, 0.0)
        total = coeffs.sum(axis=1, keepdims=True)
        coeffs = coeffs / np.where(total == 0, 1.0, total)
    weights = np.zeros((ax.size_out, ax.size_in))
    np.add.at(weights, (np.repeat(np.arange(ax.size_out), n), np.clip(idx, 0, ax.size_in - 1).reshape(-1)),
              coeffs.reshape(-1))
    return weights


def _antialias_resize(node: OnnxNode, x: Expr, sizes: list[int], axes: list[int], scales: list[float] | None,
                      mode: str, method: str) -> Expr:
    """Resize with antialias: each changed axis as a product with its constant weight matrix (nn.dense)."""
    shape, dtype = list(node.static_shape(0)), node.dtype(0)
    if method not in ("linear", "cubic") or mode == "tf_crop_and_resize" or not dtype.is_float:
        raise node.error(f"antialias is supported for float data with mode linear or cubic and coordinates other "
                         f"than tf_crop_and_resize, not {method}, {mode} and {dtype}")
    a, exclude = node.float_attr("cubic_coeff_a", -0.75), node.bool_attr("exclude_outside", False)
    for k, axis in enumerate(axes):
        scale = scales[k] if scales is not None else sizes[k] / shape[axis]
        ax = ResizeAxis(axis, shape[axis], sizes[k], scale, (0.0, 1.0))
        if ax.is_identity(mode):
            continue
        weights = relay.const(_antialias_weights(ax, mode, method, a, exclude).astype(dtype.numpy()))
        perm = [i for i in range(len(shape)) if i != axis] + [axis]
        rows = math.prod(shape[i] for i in perm[:-1])
        moved = relay.reshape(relay.transpose(x, perm), (rows, shape[axis]), allowzero=True)
        shape[axis] = sizes[k]
        resized = relay.reshape(relay.nn.dense(moved, weights), [shape[i] for i in perm], allowzero=True)
        x = relay.transpose(resized, [perm.index(i) for i in range(len(shape))])
    return x


@onnx_converter("Resize", since=10)
def _resize(node: OnnxNode) -> Expr:
    shape = node.static_shape(0)
    rank = len(shape)
    mode = node.attr("mode", "nearest")
    modes = ("nearest", "linear", "cubic") if node.opset >= 11 else ("nearest", "linear")
    if mode not in modes:
        raise node.error(f"mode is {mode!r}: expected one of {', '.join(modes)}")
    axes = node.ints_attr("axes", None)
    if axes is None:
        axes = list(range(rank))
    axes = check_axes(axes, rank, "attribute axes entry")
    if node.opset < 11:
        sizes, scales = _resize_sizes(node, shape, axes, _const_floats(node, 1, "scales"), None, "stretch")
        return _asymmetric_resize(node.input(0), sizes, axes, mode, scales)
    sizes, scales = _resize_sizes(node, shape, axes, _const_floats(node, 2, "scales"),
                                  _const_floats(node, 3, "sizes"), node.attr("keep_aspect_ratio_policy", "stretch"))
    coordinate_mode = node.attr("coordinate_transformation_mode", "half_pixel")
    nearest_mode = node.attr("nearest_mode", "round_prefer_floor")
    if coordinate_mode == "tf_half_pixel_for_nn":  # opsets 11-12: x = (y + 0.5) / scale, half_pixel's x + 0.5
        shifted = {"round_prefer_floor": "ceil", "floor": "round_prefer_ceil"}  # round(x + 0.5) as a rounding of x
        if mode != "nearest" or nearest_mode not in shifted:
            raise node.error(f"coordinate_transformation_mode tf_half_pixel_for_nn is supported with mode nearest "
                             f"and nearest_mode round_prefer_floor or floor, not {mode} and {nearest_mode}")
        coordinate_mode, nearest_mode = "half_pixel", shifted[nearest_mode]
    if node.bool_attr("antialias", False):
        return _antialias_resize(node, node.input(0), sizes, axes, scales, coordinate_mode, mode)
    roi = None
    if coordinate_mode == "tf_crop_and_resize":
        roi = _const_floats(node, 1, "roi")
        if roi is not None:
            if len(roi) == 2 * rank and len(axes) != rank:
                roi = [roi[a] for a in axes] + [roi[rank + a] for a in axes]
            if len(roi) != 2 * len(axes):
                raise node.error(f"roi {roi} needs {2 * len(axes)} values: the starts, then the ends, of the "
                                 f"resized axes {axes}")
    return relay.image.resize(
        node.input(0), sizes, axes, method=mode, coordinate_transformation_mode=coordinate_mode,
        nearest_mode=nearest_mode,
        cubic_coeff_a=float(node.attr("cubic_coeff_a", -0.75)),
        exclude_outside=node.bool_attr("exclude_outside", False),
        extrapolation_value=float(node.attr("extrapolation_value", 0.0)), roi=roi, scales=scales)


@onnx_converter("Upsample", since=7)
def _upsample(node: OnnxNode) -> Expr:
    shape = node.static_shape(0)
    mode = node.attr("mode", "nearest")
    if mode not in ("nearest", "linear"):
        raise node.error(f"mode is {mode!r}: expected nearest or linear")
    given = node.attr("scales", None)
    scales = [float(s) for s in given] if given is not None else _const_floats(node, 1, "scales")
    if scales is None or len(scales) != len(shape):
        raise node.error(f"scales {scales} needs {len(shape)} values, one per axis of the input")
    axes = list(range(len(shape)))
    sizes, scales = _resize_sizes(node, shape, axes, scales, None, "stretch")
    return _asymmetric_resize(node.input(0), sizes, axes, mode, scales)



from kiln.relay.frontend import _onnx_image  # noqa: E402, F401  (GridSample, AffineGrid: they register)
