"""Convolution ops: nn.conv2d and nn.conv2d_transpose, and the window helpers the pools share.

Each op is declared in one `register_op` chain (description, arguments, attrs,
relation, pattern, numpy reference, compute and further implementations) after
the functions it names; its Python constructor follows, checked against it
(`@constructor`). The constructors are re-exported by `kiln.relay.op.nn`, so
users write `relay.nn.conv2d(...)`. The pools (`kiln.relay.op.pool`) use the
attribute converters, layout tables and window helpers defined here.

Spatial output sizes follow TVM and PyTorch: ``(in + pad_before + pad_after -
dilation * (kernel - 1) - 1) // stride + 1``; for pools with ``ceil_mode`` the
division rounds up and, as in PyTorch, a last window that would start in the
trailing padding is dropped.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from typing import Any, TypeVar

import attrs
import numpy as np

from kiln import te
from kiln.ir.attrs import Attrs, FieldError, int_range, int_tuple, one_of, optional
from kiln.ir.dtype import DataType, DTypeError
from kiln.ir.types import ANY, AnyDim, Dim, TensorType, Type, dim_add, dim_mul
from kiln.registry import OpPattern, attr, register_op
from kiln.relay.expr import Call, Constant, Expr, call
from kiln.relay.op._nn_util import (
    TILED_DTYPES,
    clamp,
    differ,
    dtype_of,
    packable_weight,
    product_sum_dtype,
    tensor_shape,
)
from kiln.relay.op._reg import constructor
from kiln.relay.op._rel import RelationError, same_dtype, tensor_args
from kiln.relay.op._schedule import KEEP, divisor_at_most, op_attr, schedule_generic, split_epilogue, vector_lanes
from kiln.relay.op.conv_grad import conv2d_grad, conv2d_transpose_grad
from kiln.relay.op.conv_schedules import (
    DATA_AXES,
    KERNEL_AXES,
    batch_shape,
    batch_type_shape,
    conv2d_cpu_compute,
    conv2d_cpu_schedule,
    conv_output,
    group_channel,
    kernel_at,
    nchw_shape,
    ovec_tiles,
    packed_block,
    pick,
    static_kernel_dims,
)
from kiln.relay.op.cuda_conv import schedule_conv2d, window_compute
from kiln.relay.op.indexing import strided_slice
from kiln.relay.op.shape import reshape, transpose
from kiln.tir import expr as tx
from kiln.tir.expr import PrimExpr

Array = np.ndarray[Any, Any]
T = TypeVar("T")

# --- Attribute converters shared by the nn family -------------------------------------------------


def to_pair(value: Any) -> Any:
    """Converter: an int ``s`` becomes ``(s, s)``; a sequence of ints a tuple (other values pass on)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, np.integer)):
        return (int(value), int(value))
    if isinstance(value, (list, tuple)):
        items = tuple(int(v) if isinstance(v, (int, np.integer)) and not isinstance(v, bool) else v for v in value)
        return items * 2 if len(items) == 1 else items
    return value


def to_opt_pair(value: Any) -> Any:
    """Converter: None stays None; otherwise as `to_pair`."""
    return None if value is None else to_pair(value)


def to_padding4(value: Any) -> Any:
    """Converter: 1, 2 or 4 padding values become ``(top, left, bottom, right)``, as TVM's get_pad_tuple2d."""
    items = to_pair(value)
    if isinstance(items, tuple) and len(items) == 2:
        return (items[0], items[1], items[0], items[1])
    return items


def optional_dtype(value: Any) -> DataType | None:
    """Converter for an optional out_dtype: None or "" mean "the input's dtype"."""
    if value is None or value == "":
        return None
    try:
        return DataType.of(value)
    except DTypeError:
        raise FieldError("out_dtype", "a dtype name such as 'float32', or None", value) from None


def dtype_or_none(_: Any, field: attrs.Attribute[Any], value: Any) -> None:
    """Validator: a DataType or None (after `optional_dtype`)."""
    if value is not None and not isinstance(value, DataType):
        raise FieldError(field.name, "a dtype or None", value)


def pair_field(default: tuple[int, int], lo: int, doc: str) -> Any:
    return attrs.field(default=default, converter=to_pair, validator=int_tuple(2, lo=lo), metadata={"doc": doc})


def padding_field(doc: str = "(top, left, bottom, right); 1 or 2 values are expanded") -> Any:
    return attrs.field(default=(0, 0, 0, 0), converter=to_padding4, validator=int_tuple(4, lo=0), metadata={"doc": doc})


# --- Shape helpers --------------------------------------------------------------------------------


def window_out_size(
    size: Dim, kernel: Dim, stride: int, pad: tuple[int, int], dilation: int, what: str, ceil_mode: bool = False
) -> Dim:
    """The output length of a sliding window over one spatial dim.

    Args:
        size: the input length (static, symbolic or ANY).
        kernel: the window length.
        stride: the step between windows.
        pad: padding (before, after).
        dilation: the spacing of the window taps.
        what: names the dim in errors, e.g. "height".
        ceil_mode: round the division up (pools), dropping a last window that starts in the trailing padding.

    Returns:
        The output length; ANY where it depends on an unknown dim in a way that is not a plain offset.

    Raises:
        RelationError: the output would be empty.
    """
    if not isinstance(kernel, int):
        return ANY
    span = dilation * (kernel - 1) + 1
    if isinstance(size, int):
        total = size + pad[0] + pad[1] - span
        out = (total + (stride - 1 if ceil_mode else 0)) // stride + 1  # floor division, as PyTorch's div_rtn
        if ceil_mode and out > 0 and (out - 1) * stride >= size + pad[0]:
            out -= 1
        if out <= 0:
            raise RelationError(
                f"the output {what} would be {out}: input {what} {size}, kernel {kernel}, stride {stride}, "
                f"padding {pad}, dilation {dilation}; the padded input must be at least "
                f"dilation * (kernel - 1) + 1 = {span}",
                arg=0,
            )
        return out
    if isinstance(size, AnyDim) or stride != 1:
        return ANY
    offset = pad[0] + pad[1] - span + 1
    if ceil_mode and pad[1] >= span:
        offset -= 1
    return dim_add(size, offset)


def rank4(t: TensorType, arg: int, what: str, layout: str) -> None:
    if t.ndim != 4:
        raise RelationError(f"expected {what} of rank 4 ({layout}), found rank {t.ndim}: {t}", arg=arg)


def to_nchw(x: Array, layout: str) -> Array:
    return x if layout == "NCHW" else x.transpose(0, 3, 1, 2)


def from_nchw(x: Array, layout: str) -> Array:
    return x if layout == "NCHW" else x.transpose(0, 2, 3, 1)


def taps(xp: Array, kernel: tuple[int, int], strides: tuple[int, int], dilation: tuple[int, int],
          out_hw: tuple[int, int]) -> Iterator[tuple[int, int, Array]]:
    """Yields (kh, kw, window) for each kernel tap; window is xp's (..., OH, OW) slice the tap reads."""
    (kh_n, kw_n), (sh, sw), (dh, dw), (oh, ow) = kernel, strides, dilation, out_hw
    for kh in range(kh_n):
        for kw in range(kw_n):
            h0, w0 = kh * dh, kw * dw
            yield kh, kw, xp[..., h0 : h0 + sh * (oh - 1) + 1 : sh, w0 : w0 + sw * (ow - 1) + 1 : sw]


def overhangs(out: int, size: int, stride: int, dilation: int, kernel: int, pad_before: int) -> bool:
    """Whether a sliding window's taps reach outside [0, size): into the padding or the ceil_mode overhang."""
    return pad_before > 0 or (out - 1) * stride + dilation * (kernel - 1) - pad_before >= size


def read_window(data: te.Tensor, layout: str, n: PrimExpr, c: PrimExpr, y: PrimExpr, x: PrimExpr,
                size_hw: tuple[int, int], guard_hw: tuple[bool, bool], fill: PrimExpr) -> PrimExpr:
    """data[n, c, y, x] (NCHW coordinates, `data` in `layout`); `fill` where a guarded y or x is off the input.

    The load's coordinates are clamped, because a select may evaluate both of its sides.
    """
    conds: list[PrimExpr] = []
    coords: list[PrimExpr] = []
    for v, size, guard in zip((y, x), size_hw, guard_hw, strict=True):
        if guard:
            conds += [v >= 0, v < size]
            v = clamp(v, size)
        coords.append(v)
    value = data[nchw_shape(n, c, coords[0], coords[1], layout)]
    return te.if_then_else(tx.all_of(*conds), value, fill) if conds else value


# --- nn.conv2d ------------------------------------------------------------------------------------


def _default_kernel_layout(self: Conv2DAttrs) -> str:
    return "HWIO" if self.data_layout == "NHWC" else "OIHW"


_KERNEL_LAYOUT = re.compile(r"OIHW|HWIO|OIHW[1-9][0-9]*o")


def _kernel_layout(_: Any, field: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, str) or not _KERNEL_LAYOUT.fullmatch(value):
        raise FieldError(field.name, "'OIHW', 'HWIO' or 'OIHW<b>o' (b a positive int, e.g. 'OIHW16o')", value)


@attrs.frozen
class Conv2DAttrs(Attrs):
    """Attributes of nn.conv2d."""

    strides: tuple[int, int] = pair_field((1, 1), 1, "step of the window (h, w)")
    padding: tuple[int, int, int, int] = padding_field()
    dilation: tuple[int, int] = pair_field((1, 1), 1, "spacing of the kernel taps (h, w)")
    groups: int = attrs.field(default=1, validator=int_range(1), metadata={"doc": "number of channel groups"})
    channels: int | None = attrs.field(
        default=None, validator=optional(int_range(1)), metadata={"doc": "output channels (checked against weight)"}
    )
    kernel_size: tuple[int, int] | None = attrs.field(
        default=None, converter=to_opt_pair, validator=optional(int_tuple(2, lo=1)),
        metadata={"doc": "kernel (h, w) (checked against weight)"},
    )
    data_layout: str = attrs.field(default="NCHW", validator=one_of("NCHW", "NHWC"), metadata={"doc": "data layout"})
    kernel_layout: str = attrs.field(
        default=attrs.Factory(_default_kernel_layout, takes_self=True),
        validator=_kernel_layout,
        metadata={"doc": "weight layout; OIHW for NCHW data, HWIO for NHWC by default; OIHW<b>o: packed in "
                         "blocks of b output channels, (O/b, I, KH, KW, b) (AlterOpLayout makes it)"},
    )
    out_dtype: DataType | None = attrs.field(
        default=None, converter=optional_dtype, validator=dtype_or_none, metadata={"doc": "output dtype; None: data's"}
    )

    @property
    def kernel_block(self) -> int:
        """b of an OIHW<b>o kernel layout; 0 for the others."""
        return int(self.kernel_layout[4:-1]) if self.kernel_layout.endswith("o") else 0


def unpack_kernel(w: Array, block: int) -> Array:
    """A conv2d weight of layout OIHW<block>o, (O/block, I, KH, KW, block), as OIHW."""
    return w.transpose(0, 4, 1, 2, 3).reshape(-1, *w.shape[1:4]) if block else w


def kernel_dims(shape: Sequence[Dim], attrs: Conv2DAttrs) -> tuple[Dim, Dim, Dim, Dim]:
    """(O, I, KH, KW) of a weight `shape` in `attrs.kernel_layout`."""
    block = attrs.kernel_block
    if block:
        return dim_mul(shape[0], block), shape[1], shape[2], shape[3]
    o, i, kh, kw = pick(shape, KERNEL_AXES[attrs.kernel_layout])
    return o, i, kh, kw


def _check_channels(c: Dim, o: Dim, i: Dim, groups: int, weight: TensorType) -> None:
    """Checks data channels C against a weight with O outputs and I inputs per group."""
    if isinstance(c, int) and c % groups:
        raise RelationError(f"data has {c} channels, which groups={groups} does not divide", arg=0)
    if isinstance(o, int) and o % groups:
        raise RelationError(f"weight has {o} output channels, which groups={groups} does not divide", arg=1)
    if isinstance(c, int) and isinstance(i, int) and i * groups != c:
        raise RelationError(
            f"data has {c} channels but weight {weight} expects {i} per group * groups={groups} = {i * groups}",
            arg=1,
        )


def _check_declared(
    o: Dim, kh: Dim, kw: Dim, attrs: Conv2DAttrs | Conv2DTransposeAttrs, weight: TensorType
) -> tuple[Dim, Dim, Dim]:
    """Checks the channels and kernel_size attrs against the weight's (O, KH, KW); returns those, attrs applied."""
    if attrs.channels is not None:
        if differ(o, attrs.channels):
            raise RelationError(f"attribute channels is {attrs.channels} but weight {weight} has {o} outputs", arg=1)
        o = attrs.channels
    if attrs.kernel_size is not None:
        if differ(kh, attrs.kernel_size[0]) or differ(kw, attrs.kernel_size[1]):
            raise RelationError(
                f"attribute kernel_size is {attrs.kernel_size} but weight {weight} has kernel ({kh}, {kw})", arg=1
            )
        kh, kw = attrs.kernel_size
    return o, kh, kw


def _conv2d_rel(arg_types: list[Type], attrs: Conv2DAttrs) -> Type | None:
    tensors = tensor_args(arg_types)
    if tensors is None:
        return None
    data, weight = tensors
    rank4(data, 0, "data", attrs.data_layout)
    block = attrs.kernel_block
    if block:
        if weight.ndim != 5 or differ(weight.shape[4], block):
            raise RelationError(f"kernel_layout {attrs.kernel_layout} needs a weight (O/{block}, I, KH, KW, "
                                f"{block}), found {weight}", arg=1)
    else:
        rank4(weight, 1, "a weight", attrs.kernel_layout)
    n, c, h, w = pick(data.shape, DATA_AXES[attrs.data_layout])
    o, i, kh, kw = kernel_dims(weight.shape, attrs)
    _check_channels(c, o, i, attrs.groups, weight)
    o, kh, kw = _check_declared(o, kh, kw, attrs, weight)
    dtype = same_dtype([data.dtype, weight.dtype], attrs)
    pt, pl, pb, pr = attrs.padding
    oh = window_out_size(h, kh, attrs.strides[0], (pt, pb), attrs.dilation[0], "height")
    ow = window_out_size(w, kw, attrs.strides[1], (pl, pr), attrs.dilation[1], "width")
    return TensorType(nchw_shape(n, o, oh, ow, attrs.data_layout), attrs.out_dtype or dtype)


def _conv2d_nchw(x: Array, w: Array, attrs: Conv2DAttrs, out_dtype: np.dtype[Any]) -> Array:
    """x (N, C, H, W) * w (O, C/groups, KH, KW), accumulated in out_dtype."""
    n, _, h, wd = x.shape
    o, ig, kh, kw = w.shape
    g = attrs.groups
    pt, pl, pb, pr = attrs.padding
    (sh, sw), (dh, dw) = attrs.strides, attrs.dilation
    oh = (h + pt + pb - dh * (kh - 1) - 1) // sh + 1
    ow = (wd + pl + pr - dw * (kw - 1) - 1) // sw + 1
    xp = np.pad(x.astype(out_dtype), ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    xg = xp.reshape(n, g, ig, *xp.shape[2:])
    wg = w.astype(out_dtype).reshape(g, o // g, ig, kh, kw)
    out = np.zeros((n, g, o // g, oh, ow), dtype=out_dtype)
    for i, j, window in taps(xg, (kh, kw), (sh, sw), (dh, dw), (oh, ow)):
        out += np.einsum("ngihw,goi->ngohw", window, wg[:, :, :, i, j])
    return out.reshape(n, o, oh, ow)


def _conv2d_ref(attrs: Conv2DAttrs, data: Array, weight: Array) -> Array:
    out_dtype = attrs.out_dtype.numpy() if attrs.out_dtype else data.dtype
    w = weight.transpose(3, 2, 0, 1) if attrs.kernel_layout == "HWIO" else unpack_kernel(weight, attrs.kernel_block)
    out = _conv2d_nchw(to_nchw(data, attrs.data_layout), w, attrs, out_dtype)
    return from_nchw(out, attrs.data_layout)


def _conv2d_compute(attrs: Conv2DAttrs, inputs: list[te.Tensor], out_type: Type) -> list[te.Tensor]:
    """The direct convolution: a sum over (input channel of the group, kernel row, kernel column)."""
    data, weight = inputs
    layout = attrs.data_layout
    _, _, h, w = pick(batch_shape(data), DATA_AXES[layout])
    o_total, ig, kh, kw = static_kernel_dims(weight, attrs)
    shape = batch_type_shape(out_type)
    out_dtype = dtype_of(out_type)
    dtype = product_sum_dtype(out_dtype)
    _, _, oh, ow = pick(shape, DATA_AXES[layout])
    pt, pl, _, _ = attrs.padding
    (sh, sw), (dh, dw) = attrs.strides, attrs.dilation
    guard = (overhangs(oh, h, sh, dh, kh, pt), overhangs(ow, w, sw, dw, kw, pl))
    rc, ry, rx = te.reduce_axis((0, ig), "rc"), te.reduce_axis((0, kh), "ry"), te.reduce_axis((0, kw), "rx")
    zero = te.const(0, data.dtype)

    def conv(n: PrimExpr, o: PrimExpr, y: PrimExpr, x: PrimExpr) -> PrimExpr:
        c = group_channel(o, rc, attrs, o_total, ig)
        v = read_window(data, layout, n, c, y * sh + ry * dh - pt, x * sw + rx * dw - pl, (h, w), guard, zero)
        k = kernel_at(weight, attrs, o, rc, ry, rx)
        return te.sum(te.cast(v, dtype) * te.cast(k, dtype), axis=[rc, ry, rx])

    return [conv_output(shape, layout, conv, out_dtype)]


def _conv2d_cuda_compute(attrs: Conv2DAttrs, inputs: list[te.Tensor], out_type: Type) -> list[te.Tensor]:
    """`cuda_conv`'s compute (windows staged in shared memory), else the direct compute."""
    return window_compute(attrs, inputs, out_type) or _conv2d_compute(attrs, inputs, out_type)


def _conv2d_rows_compute(attrs: Conv2DAttrs, inputs: list[te.Tensor], out_type: Type) -> list[te.Tensor]:
    """NCHW/OIHW without groups, vectorized along the output row: the input padded once into a buffer,
    then the window sum unguarded. What the "tiled" implementation falls back to where its forms do
    not apply (output channels with a tail that its tiles cannot cover).

    Other layouts and grouped convolutions get the direct compute (and the generic schedule).
    """
    if attrs.data_layout != "NCHW" or attrs.kernel_layout != "OIHW" or attrs.groups != 1:
        return _conv2d_compute(attrs, inputs, out_type)
    data, weight = inputs
    n, c, h, w = batch_shape(data)
    _, _, kh, kw = tensor_shape(weight)
    shape = batch_type_shape(out_type)
    dtype = dtype_of(out_type)
    pt, pl, pb, pr = attrs.padding
    (sh, sw), (dh, dw) = attrs.strides, attrs.dilation
    if any(attrs.padding):
        zero = te.const(0, data.dtype)
        data = te.compute(
            (n, c, h + pt + pb, w + pl + pr),
            lambda b, ch, y, x: read_window(data, "NCHW", b, ch, y - pt, x - pl, (h, w), (True, True), zero),
            name="pad",
            attrs={KEEP: True},
        )
    rc, ry, rx = te.reduce_axis((0, c), "rc"), te.reduce_axis((0, kh), "ry"), te.reduce_axis((0, kw), "rx")

    def conv(b: PrimExpr, o: PrimExpr, y: PrimExpr, x: PrimExpr) -> PrimExpr:
        v = data[b, rc, y * sh + ry * dh, x * sw + rx * dw]
        return te.sum(te.cast(v, dtype) * te.cast(weight[o, rc, ry, rx], dtype), axis=[rc, ry, rx])

    lanes = vector_lanes(dtype)
    bx = next((v for v in (2 * lanes, lanes) if shape[3] % v == 0), divisor_at_most(shape[3], 2 * lanes))
    by = 2 if bx <= lanes and shape[2] % 2 == 0 else 1  # one vector wide: take two rows instead
    vectors = by * -(-bx // lanes)
    tiles = (divisor_at_most(shape[1], 16 // vectors), by, bx)  # 16 accumulators
    return [te.compute(shape, conv, name="conv2d", attrs={"tiles": tiles})]


def _conv2d_rows_schedule(sch: te.Schedule, anchor_outs: Sequence[te.Tensor], outs: Sequence[te.Tensor],
                          target: Any) -> None:
    """A tile of 8 output channels x two vectors of output (two of one row, or one of two rows) in registers.

    Each step of the window sum loads two input vectors and broadcasts eight
    weights: 16 FMAs for 10 loads. The elementwise epilogue runs on the tile
    while it is in registers. Row tiles of channel tiles run on the cores; the
    padded input is written row by row.
    """
    (c,) = anchor_outs
    tiles = op_attr(c, "tiles")
    if tiles is None:
        schedule_generic(sch, anchor_outs, outs, target)
        return
    bo, by, bx = tiles
    tiled, comp = split_epilogue(sch, c, outs, cache=True)
    stage = sch[tiled]
    n, o, y, x = stage.op.axis
    oo, oi = stage.split(o, factor=bo)
    yo, yi = stage.split(y, factor=by)
    xo, xi = stage.split(x, factor=bx)
    stage.reorder(n, oo, yo, xo, oi, yi, xi)
    stage.parallel(stage.fuse(n, oo, yo))
    stage.vectorize(xi)
    sch[comp].compute_at(stage, xo)
    cs = sch[comp]
    _, co, cy, cx = cs.op.axis
    rc, ry, rx = cs.op.reduce_axis
    cs.reorder(rc, ry, rx, co, cy, cx)
    cs.unroll(co)
    cs.unroll(cy)
    cs.vectorize(cx)
    for t in c.op.input_tensors:
        if op_attr(t, KEEP):
            rows = sch[t]
            rows.parallel(rows.fuse(*rows.op.axis[:-1]))


def _conv2d_tiled_compute(attrs: Conv2DAttrs, inputs: list[te.Tensor], out_type: Type) -> list[te.Tensor]:
    """The register-tiled CPU forms of `kiln.relay.op.conv_schedules` (vectorized over output channels,
    or depthwise along the row) where one applies, else the row-vectorized compute."""
    weight = inputs[1]
    return conv2d_cpu_compute(
        attrs, inputs, out_type, fallback=_conv2d_rows_compute, kernel=static_kernel_dims(weight, attrs),
        kernel_at=lambda o, i, ky, kx: kernel_at(weight, attrs, o, i, ky, kx), block=attrs.kernel_block,
    )


def _conv2d_tiled_schedule(sch: te.Schedule, anchor_outs: Sequence[te.Tensor], outs: Sequence[te.Tensor],
                           target: Any) -> None:
    """Schedules the form `_conv2d_tiled_compute` chose."""
    conv2d_cpu_schedule(sch, anchor_outs, outs, target, _conv2d_rows_schedule)


def _conv2d_alter_llvm(attrs: Conv2DAttrs, args: list[Expr], arg_types: list[Type], target: Any) -> Expr | None:
    """On llvm, the constant float weight of an NCHW convolution without groups is packed into
    (O/b, I, KH, KW, b) blocks once, at build time (FoldConstant runs the reshape and transpose): the
    "tiled" implementation then reads b output channels' weights with one vector load, where it would
    otherwise pack the weight on every run (as much time as the convolution itself for the large
    weights of deep layers). Output channels that do not fill whole blocks (a 1000-class 1x1
    convolution) are padded with zero weights and sliced off the result: the tiles have no form for a
    tail of channels, and the row-vectorized fallback ran SqueezeNet's classifier at 26 GFLOP/s."""
    data, weight = args
    wt = packable_weight(args, arg_types)
    if attrs.data_layout != "NCHW" or attrs.kernel_layout != "OIHW" or attrs.groups != 1 or wt is None:
        return None
    if attrs.out_dtype not in (None, wt.dtype):
        return None
    dtype = str(wt.dtype)
    o, i, kh, kw = wt.concrete_shape
    block = packed_block(dtype)
    pad = -o % block if ovec_tiles(o, 1, block) is None else 0  # a tail the tiles cannot cover (> 4 blocks)
    if o % block and not pad:
        return None  # a tail that one tile of all blocks covers: the tiles pack that weight themselves
    if pad:  # 1000 classes: zero output channels up to whole blocks, sliced off after the convolution
        assert isinstance(weight, Constant)  # packable_weight said so
        weight = Constant(np.concatenate([weight.data, np.zeros((pad, i, kh, kw), weight.data.dtype)]))
    packed = transpose(reshape(weight, (o // block + (pad > 0), block, i, kh, kw)), (0, 2, 3, 4, 1))
    out = conv2d(data, packed, attrs.strides, attrs.padding, attrs.dilation, attrs.groups,
                 None if attrs.channels is None else o + pad, attrs.kernel_size, attrs.data_layout,
                 f"OIHW{block}o", attrs.out_dtype)
    return strided_slice(out, [0], [o], axes=[1]) if pad else out


(register_op("nn.conv2d").describe("2-D convolution (cross-correlation) with strides, padding, dilation and groups")
    .add_argument("data", "Tensor", "the input, NCHW or NHWC")
    .add_argument("weight", "Tensor", "the kernel, OIHW, HWIO or OIHW<b>o (blocks of b outputs); I is C / groups")
    .set_attrs_type(Conv2DAttrs)
    .add_type_rel("Conv2d", _conv2d_rel)
    .set_support_level(2)
    .set_attr(attr.TOpPattern, OpPattern.OUT_ELEMWISE_FUSABLE)
    .set_attr(attr.FReference, _conv2d_ref)
    .set_attr(attr.FCompute, _conv2d_compute)
    .set_attr(attr.FAlterOpLayout["llvm"], _conv2d_alter_llvm)
    .set_attr(attr.FPrimalGradient, conv2d_grad)
    .add_implementation("tiled", _conv2d_tiled_compute, _conv2d_tiled_schedule, target="llvm",
                        dtypes=TILED_DTYPES, priority=10)
    .add_implementation("tiled", _conv2d_cuda_compute, schedule_conv2d, target="cuda",
                        priority=10))


@constructor("nn.conv2d")
def conv2d(
    data: Expr,
    weight: Expr,
    strides: Any = (1, 1),
    padding: Any = (0, 0),
    dilation: Any = (1, 1),
    groups: int = 1,
    channels: int | None = None,
    kernel_size: Any = None,
    data_layout: str = "NCHW",
    kernel_layout: str | None = None,
    out_dtype: Any = None,
) -> Call:
    """2-D convolution.

    Args:
        data: the input, (N, C, H, W) or (N, H, W, C).
        weight: the kernel, (O, C/groups, KH, KW) for OIHW or (KH, KW, C/groups, O) for HWIO.
        strides: step of the window, an int or (h, w).
        padding: an int, (h, w) or (top, left, bottom, right).
        dilation: spacing of the kernel taps, an int or (h, w).
        groups: number of channel groups (channels for a depthwise convolution).
        channels: the number of output channels, checked against the weight.
        kernel_size: (KH, KW), checked against the weight.
        data_layout: "NCHW" or "NHWC".
        kernel_layout: "OIHW" or "HWIO"; None picks the one that matches data_layout. "OIHW<b>o" (a weight
            (O/b, I, KH, KW, b)) is what AlterOpLayout makes of a constant OIHW weight.
        out_dtype: the output dtype; None for the input's.

    Returns:
        The call of nn.conv2d.
    """
    kw: dict[str, Any] = {} if kernel_layout is None else {"kernel_layout": kernel_layout}
    return call("nn.conv2d", [data, weight], Conv2DAttrs.make(
        "nn.conv2d", strides=strides, padding=padding, dilation=dilation, groups=groups, channels=channels,
        kernel_size=kernel_size, data_layout=data_layout, out_dtype=out_dtype, **kw,
    ))


# --- nn.conv2d_transpose --------------------------------------------------------------------------


@attrs.frozen
class Conv2DTransposeAttrs(Attrs):
    """Attributes of nn.conv2d_transpose (data NCHW, weight IOHW, as TVM)."""

    strides: tuple[int, int] = pair_field((1, 1), 1, "step of the window (h, w)")
    padding: tuple[int, int, int, int] = padding_field("cropped from the full output (top, left, bottom, right)")
    output_padding: tuple[int, int] = pair_field((0, 0), 0, "extra rows/cols added at the bottom/right")
    dilation: tuple[int, int] = pair_field((1, 1), 1, "spacing of the kernel taps (h, w)")
    groups: int = attrs.field(default=1, validator=int_range(1), metadata={"doc": "number of channel groups"})
    channels: int | None = attrs.field(
        default=None, validator=optional(int_range(1)), metadata={"doc": "output channels (checked against weight)"}
    )
    kernel_size: tuple[int, int] | None = attrs.field(
        default=None, converter=to_opt_pair, validator=optional(int_tuple(2, lo=1)),
        metadata={"doc": "kernel (h, w) (checked against weight)"},
    )
    data_layout: str = attrs.field(default="NCHW", validator=one_of("NCHW"), metadata={"doc": "data layout"})
    kernel_layout: str = attrs.field(default="IOHW", validator=one_of("IOHW"), metadata={"doc": "weight layout"})
    out_dtype: DataType | None = attrs.field(
        default=None, converter=optional_dtype, validator=dtype_or_none, metadata={"doc": "output dtype; None: data's"}
    )

    def __attrs_post_init__(self) -> None:
        for k in range(2):
            if self.output_padding[k] >= max(self.strides[k], self.dilation[k]):
                raise FieldError(
                    "output_padding",
                    f"smaller than the stride or the dilation (strides {self.strides}, dilation {self.dilation})",
                    self.output_padding,
                )


def _transpose_out_size(size: Dim, kernel: Dim, k: int, attrs: Conv2DTransposeAttrs, what: str) -> Dim:
    if not isinstance(kernel, int) or not isinstance(size, int):
        return ANY
    s, d, op = attrs.strides[k], attrs.dilation[k], attrs.output_padding[k]
    pad = (attrs.padding[k], attrs.padding[k + 2])
    out = (size - 1) * s + d * (kernel - 1) + 1 + op - pad[0] - pad[1]
    if out <= 0:
        raise RelationError(
            f"the output {what} would be {out}: input {what} {size}, kernel {kernel}, stride {s}, "
            f"padding {pad}, dilation {d}, output_padding {op}",
            arg=0,
        )
    return out


def _conv2d_transpose_rel(arg_types: list[Type], attrs: Conv2DTransposeAttrs) -> Type | None:
    tensors = tensor_args(arg_types)
    if tensors is None:
        return None
    data, weight = tensors
    rank4(data, 0, "data", "NCHW")
    rank4(weight, 1, "a weight", "IOHW")
    n, c, h, w = data.shape
    i, og, kh, kw = weight.shape
    g = attrs.groups
    if isinstance(c, int) and c % g:
        raise RelationError(f"data has {c} channels, which groups={g} does not divide", arg=0)
    if differ(c, i):
        raise RelationError(f"data has {c} channels but weight {weight} (IOHW) has {i} input channels", arg=1)
    o, kh, kw = _check_declared(og * g if isinstance(og, int) else ANY, kh, kw, attrs, weight)
    dtype = same_dtype([data.dtype, weight.dtype], attrs)
    oh = _transpose_out_size(h, kh, 0, attrs, "height")
    ow = _transpose_out_size(w, kw, 1, attrs, "width")
    return TensorType((n, o, oh, ow), attrs.out_dtype or dtype)


def _conv2d_transpose_ref(attrs: Conv2DTransposeAttrs, data: Array, weight: Array) -> Array:
    out_dtype = attrs.out_dtype.numpy() if attrs.out_dtype else data.dtype
    n, c, h, w = data.shape
    _, og, kh, kw = weight.shape
    g = attrs.groups
    (sh, sw), (dh, dw), (oph, opw) = attrs.strides, attrs.dilation, attrs.output_padding
    pt, pl, pb, pr = attrs.padding
    full_h, full_w = (h - 1) * sh + dh * (kh - 1) + 1 + oph, (w - 1) * sw + dw * (kw - 1) + 1 + opw
    full = np.zeros((n, g, og, full_h, full_w), dtype=out_dtype)
    xg = data.astype(out_dtype).reshape(n, g, c // g, h, w)
    wg = weight.astype(out_dtype).reshape(g, c // g, og, kh, kw)
    for i in range(kh):
        for j in range(kw):
            rows = slice(i * dh, i * dh + sh * (h - 1) + 1, sh)
            cols = slice(j * dw, j * dw + sw * (w - 1) + 1, sw)
            full[..., rows, cols] += np.einsum("ngihw,gio->ngohw", xg, wg[:, :, :, i, j])
    return full.reshape(n, g * og, full_h, full_w)[:, :, pt : full_h - pb, pl : full_w - pr]


def _conv2d_transpose_compute(attrs: Conv2DTransposeAttrs, inputs: list[te.Tensor],
                              out_type: Type) -> list[te.Tensor]:
    """Gathers, for each output element, the input taps that the scatter of the reference adds into it."""
    data, weight = inputs
    _, c_total, h, w = batch_shape(data)
    _, og, kh, kw = tensor_shape(weight)
    shape = batch_type_shape(out_type)
    dtype = dtype_of(out_type)
    cg = c_total // attrs.groups
    pt, pl, _, _ = attrs.padding
    (sh, sw), (dh, dw) = attrs.strides, attrs.dilation
    rc, ry, rx = te.reduce_axis((0, cg), "rc"), te.reduce_axis((0, kh), "ry"), te.reduce_axis((0, kw), "rx")

    def source(t: PrimExpr, stride: int, size: int, conds: list[PrimExpr]) -> PrimExpr:
        """The input row (or column) whose tap lands on full-output position t, its validity added to conds."""
        conds.append(t >= 0)
        if stride > 1:
            conds.append(tx.eq(t % stride, 0))
            t = t // stride
        conds.append(t < size)
        return clamp(t, size)

    def gather(n: PrimExpr, o: PrimExpr, y: PrimExpr, x: PrimExpr) -> PrimExpr:
        c = rc if attrs.groups == 1 else o // og * cg + rc
        conds: list[PrimExpr] = []
        iy = source(y + pt - ry * dh, sh, h, conds)
        ix = source(x + pl - rx * dw, sw, w, conds)
        k = weight[c, o if attrs.groups == 1 else o % og, ry, rx]
        value = te.cast(data[n, c, iy, ix], dtype) * te.cast(k, dtype)
        return te.sum(te.if_then_else(tx.all_of(*conds), value, te.const(0, dtype)), axis=[rc, ry, rx])

    return [te.compute(shape, gather, name="conv2d_transpose")]


(register_op("nn.conv2d_transpose")
    .describe("transposed 2-D convolution (the gradient of conv2d with respect to its input)")
    .add_argument("data", "Tensor", "the input, NCHW")
    .add_argument("weight", "Tensor", "the kernel, IOHW; O is output channels / groups")
    .set_attrs_type(Conv2DTransposeAttrs)
    .add_type_rel("Conv2dTranspose", _conv2d_transpose_rel)
    .set_support_level(2)
    .set_attr(attr.TOpPattern, OpPattern.OUT_ELEMWISE_FUSABLE)
    .set_attr(attr.FReference, _conv2d_transpose_ref)
    .set_attr(attr.FCompute, _conv2d_transpose_compute)
    .set_attr(attr.FPrimalGradient, conv2d_transpose_grad))


@constructor("nn.conv2d_transpose")
def conv2d_transpose(
    data: Expr,
    weight: Expr,
    strides: Any = (1, 1),
    padding: Any = (0, 0),
    output_padding: Any = (0, 0),
    dilation: Any = (1, 1),
    groups: int = 1,
    channels: int | None = None,
    kernel_size: Any = None,
    out_dtype: Any = None,
) -> Call:
    """Transposed 2-D convolution, NCHW data and IOHW weight.

    Args:
        data: the input, (N, C, H, W).
        weight: the kernel, (C, O/groups, KH, KW).
        strides: step of the window, an int or (h, w).
        padding: cropped from the full output: an int, (h, w) or (top, left, bottom, right).
        output_padding: rows/cols added at the bottom/right, each smaller than the stride or dilation.
        dilation: spacing of the kernel taps, an int or (h, w).
        groups: number of channel groups.
        channels: the number of output channels, checked against the weight.
        kernel_size: (KH, KW), checked against the weight.
        out_dtype: the output dtype; None for the input's.

    Returns:
        The call of nn.conv2d_transpose.
    """
    return call("nn.conv2d_transpose", [data, weight], Conv2DTransposeAttrs.make(
        "nn.conv2d_transpose", strides=strides, padding=padding, output_padding=output_padding,
        dilation=dilation, groups=groups, channels=channels, kernel_size=kernel_size, out_dtype=out_dtype,
    ))
