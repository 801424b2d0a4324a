"""Convolution and pooling ops: nn.conv2d, nn.conv2d_transpose, nn.max_pool2d, nn.avg_pool2d, global pools.

Each op is registered in one chain: description, arguments, attrs, relation,
pattern, numpy reference; its Python constructor sits next to it. The
constructors are re-exported by `kiln.relay.op.nn`, so users write
`relay.nn.conv2d(...)`.

Spatial output sizes follow TVM and PyTorch: ``(in + pad_before + pad_after -
dilation * (kernel - 1) - 1) // stride + 1``; for pools with ``ceil_mode`` the
division rounds up and, as in PyTorch, a last window that would start in the
trailing padding is dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import attrs
import numpy as np

from kiln.ir.attrs import Attrs, FieldError, bool_value, int_range, int_tuple, one_of, optional
from kiln.ir.dtype import DataType, DTypeError
from kiln.ir.types import ANY, AnyDim, Dim, TensorType, Type, dim_add
from kiln.registry import OpPattern
from kiln.relay.expr import Call, Expr, call
from kiln.relay.op._reg import register_nn_op
from kiln.relay.op._rel import RelationError, same_dtype, tensor_args

Array = np.ndarray[Any, Any]

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


def _pair_field(default: tuple[int, int], lo: int, doc: str) -> Any:
    return attrs.field(default=default, converter=to_pair, validator=int_tuple(2, lo=lo), metadata={"doc": doc})


def _padding_field(doc: str = "(top, left, bottom, right); 1 or 2 values are expanded") -> Any:
    return attrs.field(default=(0, 0, 0, 0), converter=to_padding4, validator=int_tuple(4, lo=0), metadata={"doc": doc})


# --- Shape helpers --------------------------------------------------------------------------------


def differ(a: Dim, b: Dim) -> bool:
    """Whether two dims are known to differ (both static and unequal)."""
    return isinstance(a, int) and isinstance(b, int) and a != b


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


# Where N, C, H, W sit in each data layout, and O, I, H, W in each kernel layout.
_DATA_AXES = {"NCHW": (0, 1, 2, 3), "NHWC": (0, 3, 1, 2)}
_KERNEL_AXES = {"OIHW": (0, 1, 2, 3), "HWIO": (3, 2, 0, 1), "IOHW": (1, 0, 2, 3)}


def _pick(shape: tuple[Dim, ...], axes: tuple[int, ...]) -> tuple[Dim, ...]:
    return tuple(shape[i] for i in axes)


def _nchw_shape(n: Dim, c: Dim, h: Dim, w: Dim, layout: str) -> tuple[Dim, ...]:
    return (n, c, h, w) if layout == "NCHW" else (n, h, w, c)


def _rank4(t: TensorType, arg: int, what: str, layout: str) -> None:
    if t.ndim != 4:
        raise RelationError(f"expected {what} of rank 4 ({layout}), found rank {t.ndim}: {t}", arg=arg)


def _to_nchw(x: Array, layout: str) -> Array:
    return x if layout == "NCHW" else x.transpose(0, 3, 1, 2)


def _from_nchw(x: Array, layout: str) -> Array:
    return x if layout == "NCHW" else x.transpose(0, 2, 3, 1)


def _taps(xp: Array, kernel: tuple[int, int], strides: tuple[int, int], dilation: tuple[int, int],
          out_hw: tuple[int, int]) -> Iterator[tuple[int, int, Array]]:
    """Yields (kh, kw, window) for each kernel tap; window is xp's (..., OH, OW) slice the tap reads."""
    (kh_n, kw_n), (sh, sw), (dh, dw), (oh, ow) = kernel, strides, dilation, out_hw
    for kh in range(kh_n):
        for kw in range(kw_n):
            h0, w0 = kh * dh, kw * dw
            yield kh, kw, xp[..., h0 : h0 + sh * (oh - 1) + 1 : sh, w0 : w0 + sw * (ow - 1) + 1 : sw]


# --- nn.conv2d ------------------------------------------------------------------------------------


def _default_kernel_layout(self: Conv2DAttrs) -> str:
    return "HWIO" if self.data_layout == "NHWC" else "OIHW"


@attrs.frozen
class Conv2DAttrs(Attrs):
    """Attributes of nn.conv2d."""

    strides: tuple[int, int] = _pair_field((1, 1), 1, "step of the window (h, w)")
    padding: tuple[int, int, int, int] = _padding_field()
    dilation: tuple[int, int] = _pair_field((1, 1), 1, "spacing of the kernel taps (h, w)")
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
        validator=one_of("OIHW", "HWIO"),
        metadata={"doc": "weight layout; OIHW for NCHW data, HWIO for NHWC by default"},
    )
    out_dtype: DataType | None = attrs.field(
        default=None, converter=optional_dtype, validator=dtype_or_none, metadata={"doc": "output dtype; None: data's"}
    )


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
    _rank4(data, 0, "data", attrs.data_layout)
    _rank4(weight, 1, "a weight", attrs.kernel_layout)
    n, c, h, w = _pick(data.shape, _DATA_AXES[attrs.data_layout])
    o, i, kh, kw = _pick(weight.shape, _KERNEL_AXES[attrs.kernel_layout])
    _check_channels(c, o, i, attrs.groups, weight)
    o, kh, kw = _check_declared(o, kh, kw, attrs, weight)
    dtype = same_dtype([data.dtype, weight.dtype], attrs)
    pt, pl, pb, pr = attrs.padding
    oh = window_out_size(h, kh, attrs.strides[0], (pt, pb), attrs.dilation[0], "height")
    ow = window_out_size(w, kw, attrs.strides[1], (pl, pr), attrs.dilation[1], "width")
    return TensorType(_nchw_shape(n, o, oh, ow, attrs.data_layout), attrs.out_dtype or dtype)


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
    for i, j, window in _taps(xg, (kh, kw), (sh, sw), (dh, dw), (oh, ow)):
        out += np.einsum("ngihw,goi->ngohw", window, wg[:, :, :, i, j])
    return out.reshape(n, o, oh, ow)


def _conv2d_ref(attrs: Conv2DAttrs, data: Array, weight: Array) -> Array:
    out_dtype = attrs.out_dtype.numpy() if attrs.out_dtype else data.dtype
    w = weight if attrs.kernel_layout == "OIHW" else weight.transpose(3, 2, 0, 1)
    out = _conv2d_nchw(_to_nchw(data, attrs.data_layout), w, attrs, out_dtype)
    return _from_nchw(out, attrs.data_layout)


register_nn_op("nn.conv2d", "2-D convolution (cross-correlation) with strides, padding, dilation and groups",
               [("data", "the input, NCHW or NHWC"), ("weight", "the kernel, OIHW or HWIO; I is channels / groups")],
               _conv2d_rel, _conv2d_ref, OpPattern.OUT_ELEMWISE_FUSABLE, attrs_type=Conv2DAttrs, level=2)


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
        kernel_layout: "OIHW" or "HWIO"; None picks the one that matches data_layout.
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

    strides: tuple[int, int] = _pair_field((1, 1), 1, "step of the window (h, w)")
    padding: tuple[int, int, int, int] = _padding_field("cropped from the full output (top, left, bottom, right)")
    output_padding: tuple[int, int] = _pair_field((0, 0), 0, "extra rows/cols added at the bottom/right")
    dilation: tuple[int, int] = _pair_field((1, 1), 1, "spacing of the kernel taps (h, w)")
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
    _rank4(data, 0, "data", "NCHW")
    _rank4(weight, 1, "a weight", "IOHW")
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


register_nn_op("nn.conv2d_transpose", "transposed 2-D convolution (the gradient of conv2d with respect to its input)",
               [("data", "the input, NCHW"), ("weight", "the kernel, IOHW; O is output channels / groups")],
               _conv2d_transpose_rel, _conv2d_transpose_ref,
               OpPattern.OUT_ELEMWISE_FUSABLE, attrs_type=Conv2DTransposeAttrs, level=2)


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


# --- nn.max_pool2d, nn.avg_pool2d -----------------------------------------------------------------


@attrs.frozen
class Pool2DAttrs(Attrs):
    """The window of a 2-D pool (the fields that nn.max_pool2d and nn.avg_pool2d share)."""

    pool_size: tuple[int, int] = _pair_field((1, 1), 1, "window (h, w)")
    strides: tuple[int, int] = _pair_field((1, 1), 1, "step of the window (h, w)")
    padding: tuple[int, int, int, int] = _padding_field()
    dilation: tuple[int, int] = _pair_field((1, 1), 1, "spacing of the window taps (h, w)")
    layout: str = attrs.field(default="NCHW", validator=one_of("NCHW", "NHWC"), metadata={"doc": "data layout"})
    ceil_mode: bool = attrs.field(default=False, validator=bool_value, metadata={"doc": "round the output size up"})


@attrs.frozen
class MaxPool2DAttrs(Pool2DAttrs):
    """Attributes of nn.max_pool2d."""


@attrs.frozen
class AvgPool2DAttrs(Pool2DAttrs):
    """Attributes of nn.avg_pool2d."""

    count_include_pad: bool = attrs.field(
        default=False, validator=bool_value, metadata={"doc": "divide by the window size including padding"}
    )


def _pool_out_hw(h: Dim, w: Dim, attrs: Pool2DAttrs) -> tuple[Dim, Dim]:
    pt, pl, pb, pr = attrs.padding
    oh = window_out_size(h, attrs.pool_size[0], attrs.strides[0], (pt, pb), attrs.dilation[0], "height",
                         attrs.ceil_mode)
    ow = window_out_size(w, attrs.pool_size[1], attrs.strides[1], (pl, pr), attrs.dilation[1], "width",
                         attrs.ceil_mode)
    return oh, ow


def _pool2d_rel(arg_types: list[Type], attrs: Pool2DAttrs) -> Type | None:
    tensors = tensor_args(arg_types)
    if tensors is None:
        return None
    (data,) = tensors
    _rank4(data, 0, "data", attrs.layout)
    n, c, h, w = _pick(data.shape, _DATA_AXES[attrs.layout])
    oh, ow = _pool_out_hw(h, w, attrs)
    return TensorType(_nchw_shape(n, c, oh, ow, attrs.layout), data.dtype)


def _pool_windows(
    x: Array, attrs: Pool2DAttrs, pad_fill: Any, overhang_fill: Any
) -> tuple[Iterator[tuple[int, int, Array]], tuple[int, int]]:
    """The taps over the padded NCHW input, and the output (OH, OW).

    The explicit padding holds pad_fill; the overhang that ceil_mode adds past it holds overhang_fill.
    """
    _, _, h, w = x.shape
    oh, ow = _pool_out_hw(h, w, attrs)
    assert isinstance(oh, int) and isinstance(ow, int)  # a static input has a static output
    pt, pl, pb, pr = attrs.padding
    (sh, sw), (dh, dw), (kh, kw) = attrs.strides, attrs.dilation, attrs.pool_size
    over_h = max(0, (oh - 1) * sh + dh * (kh - 1) + 1 - (h + pt + pb))
    over_w = max(0, (ow - 1) * sw + dw * (kw - 1) + 1 - (w + pl + pr))
    xp = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)), constant_values=pad_fill)
    xp = np.pad(xp, ((0, 0), (0, 0), (0, over_h), (0, over_w)), constant_values=overhang_fill)
    return _taps(xp, (kh, kw), (sh, sw), (dh, dw), (oh, ow)), (oh, ow)


def _max_pool2d_ref(attrs: MaxPool2DAttrs, data: Array) -> Array:
    x = _to_nchw(data, attrs.layout)
    lowest = -np.inf if np.issubdtype(x.dtype, np.floating) else np.iinfo(x.dtype).min
    taps, _ = _pool_windows(x, attrs, lowest, lowest)
    out: Array | None = None
    for _, _, window in taps:
        out = window.copy() if out is None else np.maximum(out, window)
    assert out is not None  # pool_size >= 1, so there is a tap
    return _from_nchw(out.astype(data.dtype), attrs.layout)


def _avg_pool2d_ref(attrs: AvgPool2DAttrs, data: Array) -> Array:
    x = _to_nchw(data, attrs.layout)
    floating = np.issubdtype(x.dtype, np.floating)
    taps, _ = _pool_windows(x.astype(np.float64 if floating else np.int64), attrs, 0, 0)
    total = sum(window for _, _, window in taps)
    # The divisor counts the taps in the input or, with count_include_pad, in the explicitly
    # padded input; never the ceil_mode overhang (as PyTorch).
    ones = np.ones((1, 1, *x.shape[2:]))
    count_taps, _ = _pool_windows(ones, attrs, 1 if attrs.count_include_pad else 0, 0)
    count = sum(window for _, _, window in count_taps)
    out = np.asarray(total) / np.maximum(count, 1)
    if not floating:
        out = np.trunc(out)
    return _from_nchw(out.astype(data.dtype), attrs.layout)


def _register_pool(name: str, description: str, attrs_type: type, reference: Callable[..., Array]) -> None:
    register_nn_op(name, description,
                   [("data", "the input, NCHW or NHWC")],
                   _pool2d_rel, reference, OpPattern.OUT_ELEMWISE_FUSABLE, attrs_type=attrs_type, level=2)


_register_pool("nn.max_pool2d", "the maximum over each 2-D window", MaxPool2DAttrs, _max_pool2d_ref)
_register_pool("nn.avg_pool2d", "the mean over each 2-D window", AvgPool2DAttrs, _avg_pool2d_ref)


def max_pool2d(
    data: Expr,
    pool_size: Any = (1, 1),
    strides: Any = (1, 1),
    dilation: Any = (1, 1),
    padding: Any = (0, 0),
    layout: str = "NCHW",
    ceil_mode: bool = False,
) -> Call:
    """2-D max pooling.

    Args:
        data: the input, (N, C, H, W) or (N, H, W, C).
        pool_size: the window, an int or (h, w).
        strides: step of the window, an int or (h, w).
        dilation: spacing of the window taps, an int or (h, w).
        padding: an int, (h, w) or (top, left, bottom, right); padded taps never win.
        layout: "NCHW" or "NHWC".
        ceil_mode: round the output size up.

    Returns:
        The call of nn.max_pool2d.
    """
    return call("nn.max_pool2d", [data], MaxPool2DAttrs.make(
        "nn.max_pool2d", pool_size=pool_size, strides=strides, dilation=dilation, padding=padding,
        layout=layout, ceil_mode=ceil_mode,
    ))


def avg_pool2d(
    data: Expr,
    pool_size: Any = (1, 1),
    strides: Any = (1, 1),
    dilation: Any = (1, 1),
    padding: Any = (0, 0),
    layout: str = "NCHW",
    ceil_mode: bool = False,
    count_include_pad: bool = False,
) -> Call:
    """2-D average pooling.

    Args:
        data: the input, (N, C, H, W) or (N, H, W, C).
        pool_size: the window, an int or (h, w).
        strides: step of the window, an int or (h, w).
        dilation: spacing of the window taps, an int or (h, w).
        padding: an int, (h, w) or (top, left, bottom, right).
        layout: "NCHW" or "NHWC".
        ceil_mode: round the output size up.
        count_include_pad: divide by the taps in the padded input, not only those in the input.

    Returns:
        The call of nn.avg_pool2d.
    """
    return call("nn.avg_pool2d", [data], AvgPool2DAttrs.make(
        "nn.avg_pool2d", pool_size=pool_size, strides=strides, dilation=dilation, padding=padding,
        layout=layout, ceil_mode=ceil_mode, count_include_pad=count_include_pad,
    ))


# --- nn.global_avg_pool2d, nn.global_max_pool2d ---------------------------------------------------


@attrs.frozen
class GlobalPool2DAttrs(Attrs):
    """Attributes of the global pools."""

    layout: str = attrs.field(default="NCHW", validator=one_of("NCHW", "NHWC"), metadata={"doc": "data layout"})


def _global_pool2d_rel(arg_types: list[Type], attrs: GlobalPool2DAttrs) -> Type | None:
    tensors = tensor_args(arg_types)
    if tensors is None:
        return None
    (data,) = tensors
    _rank4(data, 0, "data", attrs.layout)
    n, c, _, _ = _pick(data.shape, _DATA_AXES[attrs.layout])
    return TensorType(_nchw_shape(n, c, 1, 1, attrs.layout), data.dtype)


def _global_ref(reduce: Callable[..., Any]) -> Callable[[GlobalPool2DAttrs, Array], Array]:
    def reference(attrs: GlobalPool2DAttrs, data: Array) -> Array:
        axes = (2, 3) if attrs.layout == "NCHW" else (1, 2)
        return np.asarray(reduce(data, axis=axes, keepdims=True)).astype(data.dtype)

    return reference


_GLOBAL_POOLS: list[tuple[str, str, Callable[..., Any]]] = [
    ("nn.global_avg_pool2d", "the mean over all of H and W", np.mean),
    ("nn.global_max_pool2d", "the maximum over all of H and W", np.max),
]
for _name, _doc, _reduce in _GLOBAL_POOLS:
    register_nn_op(_name, _doc,
                   [("data", "the input, NCHW or NHWC")],
                   _global_pool2d_rel, _global_ref(_reduce),
                   OpPattern.OUT_ELEMWISE_FUSABLE, attrs_type=GlobalPool2DAttrs, level=2)


def global_avg_pool2d(data: Expr, layout: str = "NCHW") -> Call:
    """The mean over each channel's whole H x W plane.

    Args:
        data: the input, (N, C, H, W) or (N, H, W, C).
        layout: "NCHW" or "NHWC".

    Returns:
        The call of nn.global_avg_pool2d: (N, C, 1, 1) or (N, 1, 1, C).
    """
    return call("nn.global_avg_pool2d", [data], GlobalPool2DAttrs.make("nn.global_avg_pool2d", layout=layout))


def global_max_pool2d(data: Expr, layout: str = "NCHW") -> Call:
    """The maximum over each channel's whole H x W plane.

    Args:
        data: the input, (N, C, H, W) or (N, H, W, C).
        layout: "NCHW" or "NHWC".

    Returns:
        The call of nn.global_max_pool2d: (N, C, 1, 1) or (N, 1, 1, C).
    """
    return call("nn.global_max_pool2d", [data], GlobalPool2DAttrs.make("nn.global_max_pool2d", layout=layout))
