"""Pooling ops of the `relay.nn` namespace: nn.max_pool2d, nn.avg_pool2d, the global pools, and
nn.max_pool2d_argmax (ONNX MaxPool's Indices) and nn.roi_align (ONNX RoiAlign).

Each op is declared in one `register_op` chain (description, arguments, attrs,
relation, pattern, numpy reference, compute, CPU schedule) after the functions
it names; its Python constructor follows, checked against it (`@constructor`).
The constructors are re-exported by `kiln.relay.op.nn`, so users write
`relay.nn.max_pool2d(...)`.

Output sizes follow `kiln.relay.op.conv.window_out_size`: with ``ceil_mode``
the division rounds up and, as in PyTorch, a last window that would start in
the trailing padding is dropped.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import attrs
import numpy as np

from kiln import te
from kiln.ir.attrs import Attrs, bool_value, one_of
from kiln.ir.types import Dim, TensorType, Type
from kiln.registry import OpPattern, attr, register_op
from kiln.relay.expr import Call, Expr, call
from kiln.relay.op._nn_util import accumulator
from kiln.relay.op._reg import constructor
from kiln.relay.op._rel import RelationError, tensor_args
from kiln.relay.op._schedule import KEEP, op_attr, schedule_injective_stage, static_size, worth_parallel
from kiln.relay.op.conv import (
    from_nchw,
    overhangs,
    padding_field,
    pair_field,
    rank4,
    read_window,
    taps,
    to_nchw,
    window_out_size,
)
from kiln.relay.op.conv_grad import (
    avg_pool2d_grad,
    global_avg_pool2d_grad,
    global_max_pool2d_grad,
    max_pool2d_grad,
)
from kiln.relay.op.conv_schedules import DATA_AXES, batch_shape, batch_type_shape, nchw_shape, pick
from kiln.tir import expr as tx
from kiln.tir.expr import PrimExpr

Array = np.ndarray[Any, Any]


# --- nn.max_pool2d, nn.avg_pool2d -----------------------------------------------------------------


@attrs.frozen
class Pool2DAttrs(Attrs):
    """The window of a 2-D pool (the fields that nn.max_pool2d and nn.avg_pool2d share)."""

    pool_size: tuple[int, int] = pair_field((1, 1), 1, "window (h, w)")
    strides: tuple[int, int] = pair_field((1, 1), 1, "step of the window (h, w)")
    padding: tuple[int, int, int, int] = padding_field()
    dilation: tuple[int, int] = pair_field((1, 1), 1, "spacing of the window taps (h, w)")
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
    rank4(data, 0, "data", attrs.layout)
    n, c, h, w = pick(data.shape, DATA_AXES[attrs.layout])
    oh, ow = _pool_out_hw(h, w, attrs)
    return TensorType(nchw_shape(n, c, oh, ow, attrs.layout), data.dtype)


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
    return taps(xp, (kh, kw), (sh, sw), (dh, dw), (oh, ow)), (oh, ow)


def _max_pool2d_ref(attrs: MaxPool2DAttrs, data: Array) -> Array:
    x = to_nchw(data, attrs.layout)
    lowest = -np.inf if np.issubdtype(x.dtype, np.floating) else np.iinfo(x.dtype).min
    taps, _ = _pool_windows(x, attrs, lowest, lowest)
    out: Array | None = None
    for _, _, window in taps:
        out = window.copy() if out is None else np.maximum(out, window)
    assert out is not None  # pool_size >= 1, so there is a tap
    return from_nchw(out.astype(data.dtype), attrs.layout)


def _avg_pool2d_ref(attrs: AvgPool2DAttrs, data: Array) -> Array:
    x = to_nchw(data, attrs.layout)
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
    return from_nchw(out.astype(data.dtype), attrs.layout)


def _lowest(dtype: str) -> PrimExpr:
    """The identity of max in `dtype`: what padded taps read, so that they never win."""
    if tx.is_float(dtype):
        return te.const(float("-inf"), dtype)
    return te.const(int(np.iinfo(np.dtype(dtype)).min), dtype)


class _Window:
    """A pool's window over the NCHW coordinates of an output element: its taps, read with padding guarded."""

    def __init__(self, attrs: Pool2DAttrs, data: te.Tensor, out_type: Type) -> None:
        self.attrs, self.data = attrs, data
        self.shape = batch_type_shape(out_type)
        _, _, self.h, self.w = pick(batch_shape(data), DATA_AXES[attrs.layout])
        _, _, oh, ow = pick(self.shape, DATA_AXES[attrs.layout])
        (kh, kw), (sh, sw), (dh, dw) = attrs.pool_size, attrs.strides, attrs.dilation
        pt, pl, _, _ = attrs.padding
        self.guard = (overhangs(oh, self.h, sh, dh, kh, pt), overhangs(ow, self.w, sw, dw, kw, pl))
        self.ry, self.rx = te.reduce_axis((0, kh), "ry"), te.reduce_axis((0, kw), "rx")

    def row(self, y: PrimExpr, ry: PrimExpr) -> PrimExpr:
        """The input row of tap ry of output row y (may lie in the padding)."""
        return y * self.attrs.strides[0] + ry * self.attrs.dilation[0] - self.attrs.padding[0]

    def col(self, x: PrimExpr, rx: PrimExpr) -> PrimExpr:
        """The input column of tap rx of output column x (may lie in the padding)."""
        return x * self.attrs.strides[1] + rx * self.attrs.dilation[1] - self.attrs.padding[1]

    def read(self, n: PrimExpr, c: PrimExpr, y: PrimExpr, x: PrimExpr, fill: PrimExpr) -> PrimExpr:
        """The tap (ry, rx) of output element (n, c, y, x); `fill` off the input."""
        return read_window(self.data, self.attrs.layout, n, c, self.row(y, self.ry), self.col(x, self.rx),
                           (self.h, self.w), self.guard, fill)

    def tap(self, n: PrimExpr, c: PrimExpr, y: PrimExpr, x: PrimExpr, ry: int, rx: int, fill: PrimExpr) -> PrimExpr:
        """The tap (ry, rx) of output element (n, c, y, x), a window position given as numbers; `fill` off the input."""
        return read_window(self.data, self.attrs.layout, n, c, self.row(y, tx.const(ry)), self.col(x, tx.const(rx)),
                           (self.h, self.w), self.guard, fill)

    def compute(self, body: Callable[[PrimExpr, PrimExpr, PrimExpr, PrimExpr], PrimExpr], name: str,
                marks: dict[str, Any] | None = None) -> te.Tensor:
        """The output tensor of `body(n, c, y, x)`, in the attrs' layout, its compute carrying `marks`."""
        if self.attrs.layout == "NCHW":
            return te.compute(self.shape, body, name=name, attrs=marks)
        return te.compute(self.shape, lambda n, y, x, c: body(n, c, y, x), name=name, attrs=marks)


_UNROLL_TAPS = 49  # windows up to 7x7 are unrolled inside the row loop
_TAPS = "kiln.pool.taps"  # ComputeOp attr of a max pool written as one expression of its taps (no reduction)
_FLAT = "kiln.pool.flat"  # ComputeOp attr of the window maxima along a flat channel plane (`_max_pool2d_flat`)
_SHORT_ROW = 16  # output rows shorter than one vector of float32: the flat form


def _tree(values: list[PrimExpr], combine: Callable[[PrimExpr, PrimExpr], PrimExpr]) -> PrimExpr:
    """`combine` over `values` as a balanced tree: independent operations, not one chain of latencies."""
    while len(values) > 1:
        values = [combine(*values[i:i + 2]) if i + 1 < len(values) else values[i] for i in range(0, len(values), 2)]
    return values[0]


def _greater(a: PrimExpr, b: PrimExpr) -> PrimExpr:
    """`a if a > b else b`: the maximum of two numbers, one `maxps` on x86 (which gives b where either is NaN)."""
    return tx.select(a > b, a, b)


def _unordered(a: PrimExpr, b: PrimExpr) -> PrimExpr:
    """Whether a or b is NaN (LLVM folds the two tests into one unordered compare)."""
    return tx.any_of(tx.Call("bool", "isnan", (a,)), tx.Call("bool", "isnan", (b,)))


def _max_of_taps(taps: list[PrimExpr]) -> PrimExpr:
    """The maximum of `taps`, NaN where any tap is NaN (as numpy's maximum).

    llvm.maximum per tap costs six instructions on AVX-512 (the sign of zero and the NaN fixed on every
    step, one chain through all taps); here the taps take one plain max each, in a tree, one unordered
    compare per pair of taps, and a single select of NaN at the end.
    """
    most = _tree(taps, _greater)
    if not tx.is_float(taps[0].dtype):
        return most
    pairs = [_unordered(*taps[i:i + 2]) if i + 1 < len(taps) else _unordered(taps[i], taps[i])
             for i in range(0, len(taps), 2)]
    return tx.select(_tree(pairs, tx.any_of), te.const(float("nan"), taps[0].dtype), most)


def _max_pool2d_compute(attrs: MaxPool2DAttrs, inputs: list[te.Tensor], out_type: Type) -> list[te.Tensor]:
    """The maximum over each window; a window of up to `_UNROLL_TAPS` taps as one expression of its taps."""
    (data,) = inputs
    win = _Window(attrs, data, out_type)
    lowest = _lowest(data.dtype)
    (kh, kw) = attrs.pool_size
    if kh * kw > _UNROLL_TAPS:
        return [win.compute(lambda n, c, y, x: te.max(win.read(n, c, y, x, lowest), axis=[win.ry, win.rx]),
                            "max_pool2d")]

    ow = pick(win.shape, DATA_AXES[attrs.layout])[3]
    if attrs.layout == "NCHW" and win.guard == (False, False) and ow < _SHORT_ROW:
        return [_max_pool2d_flat(attrs, data, win.shape)]

    def body(n: PrimExpr, c: PrimExpr, y: PrimExpr, x: PrimExpr) -> PrimExpr:
        return _max_of_taps([win.tap(n, c, y, x, ry, rx, lowest) for ry in range(kh) for rx in range(kw)])

    return [win.compute(body, "max_pool2d", {_TAPS: True})]


def _max_pool2d_flat(attrs: MaxPool2DAttrs, data: te.Tensor, shape: Sequence[int]) -> te.Tensor:
    """An NCHW max pool of short output rows whose windows all lie in the input (no padding, no overhang).

    LLVM vectorizes no loop of fewer than 16 strided iterations (it makes gathers or scalars instead), so
    each channel plane is taken as one flat row, in two passes along it, each vectorized with contiguous
    loads into a buffer of the plane: the maximum of each column's window taps (read from the
    input at flat position i, the row i // W and column i % W of its top tap), then the maximum of those
    along the row (at flat positions i + rx * dilation). Positions whose window would wrap past a row's
    end are computed and never read: the output picks the positions of its windows.
    """
    n, c, oh, ow = shape
    w = batch_shape(data)[3]
    (kh, kw), (sh, sw), (dh, dw) = attrs.pool_size, attrs.strides, attrs.dilation
    span = (oh - 1) * sh * w + (ow - 1) * sw + 1  # flat positions up to the last window's top-left tap

    def column(b: PrimExpr, ch: PrimExpr, i: PrimExpr) -> PrimExpr:
        # i // W + k and i % W (not (i + k * W) // W): LLVM folds this flat offset back to i + k * W
        return _max_of_taps([data[b, ch, i // w + ry * dh, i % w] for ry in range(kh)])

    columns = te.compute((n, c, span + (kw - 1) * dw), column, name="max_pool2d_columns",
                         attrs={KEEP: True, _FLAT: True})
    # The windows at every `step`-th position: with step = the column stride, a long loop of strided loads
    # (which LLVM vectorizes), and each output row a contiguous run of them.
    step = sw if sh * w % sw == 0 else 1
    windows = te.compute(
        (n, c, (span - 1) // step + 1),
        lambda b, ch, k: _max_of_taps([columns[b, ch, k * step + rx * dw] for rx in range(kw)]),
        name="max_pool2d_windows", attrs={KEEP: True, _FLAT: True})
    return te.compute(shape, lambda b, ch, y, x: windows[b, ch, y * (sh * w // step) + x * (sw // step)],
                      name="max_pool2d", attrs={_TAPS: True})


def _avg_pool2d_compute(attrs: AvgPool2DAttrs, inputs: list[te.Tensor], out_type: Type) -> list[te.Tensor]:
    """The sum of the taps in the input, divided by the count of the taps that the divisor rule counts.

    The count factors into (taps of the row window) * (taps of the column window), each its own small
    reduction: the taps in the input or, with count_include_pad, in the explicitly padded input.
    """
    (data,) = inputs
    win = _Window(attrs, data, out_type)
    acc = accumulator(data.dtype)
    zero = te.const(0, data.dtype)
    total = win.compute(
        lambda n, c, y, x: te.sum(te.cast(win.read(n, c, y, x, zero), acc), axis=[win.ry, win.rx]), "avg_pool2d_sum"
    )
    pt, pl, pb, pr = attrs.padding if attrs.count_include_pad else (0, 0, 0, 0)
    _, _, oh, ow = pick(win.shape, DATA_AXES[attrs.layout])

    def count(size: int, before: int, after: int, position: Callable[[PrimExpr, PrimExpr], PrimExpr],
              r: te.IterVar) -> Callable[[PrimExpr], PrimExpr]:
        def body(i: PrimExpr) -> PrimExpr:
            p = position(i, r)
            inside = tx.all_of(p >= -before, p < size + after)
            return te.sum(te.if_then_else(inside, te.const(1, acc), te.const(0, acc)), axis=r)

        return body

    ky, kx = te.reduce_axis((0, attrs.pool_size[0]), "ky"), te.reduce_axis((0, attrs.pool_size[1]), "kx")
    rows = te.compute((oh,), count(win.h, pt, pb, win.row, ky), name="avg_pool2d_rows")
    cols = te.compute((ow,), count(win.w, pl, pr, win.col, kx), name="avg_pool2d_cols")

    def mean(n: PrimExpr, c: PrimExpr, y: PrimExpr, x: PrimExpr) -> PrimExpr:
        divisor = tx.max_(rows[y] * cols[x], te.const(1, acc))
        return te.cast(total[nchw_shape(n, c, y, x, attrs.layout)] / divisor, data.dtype)

    return [win.compute(mean, "avg_pool2d")]


def _pool_stages(anchor_outs: Sequence[te.Tensor]) -> list[te.Tensor]:
    """The pool's reductions over windows: the anchor and the reductions it reads (its own stages)."""
    stages = [t for a in anchor_outs for t in a.op.input_tensors
              if isinstance(t.op, te.ComputeOp) and t.op.reduce_axis and len(t.shape) > 1]  # not avg's counts
    return stages + [a for a in anchor_outs if isinstance(a.op, te.ComputeOp) and a.op.reduce_axis]


def _schedule_pool(sch: te.Schedule, anchor_outs: Sequence[te.Tensor], outs: Sequence[te.Tensor],
                   target: Any) -> None:
    """The rows of the output (all axes but the last, fused) on the cores; a global pool's channels; a max
    pool written as an expression of its taps by `_schedule_taps`.

    Along a row LLVM vectorizes on its own once the small window loops are
    unrolled; forcing vectors with the window loops outside (accumulating in the
    output) made LLVM give up and ran 3x slower.
    """
    for t in _pool_stages(anchor_outs):
        stage = sch[t]
        axes = list(stage.op.axis)
        if len(axes) == 2:  # a global pool's (N, C) sums: every channel's plane is a task for the cores
            stage.parallel(stage.fuse(*axes))
        elif len(axes) > 2:
            stage.parallel(stage.fuse(*axes[:-1]))
            extents = [r.dom.extent if r.dom is not None else None for r in stage.op.reduce_axis]
            if all(isinstance(e, tx.IntImm) for e in extents) and \
                    math.prod(e.value for e in extents if isinstance(e, tx.IntImm)) <= _UNROLL_TAPS:
                for r in stage.op.reduce_axis:  # the taps inside the row loop, which LLVM then vectorizes
                    stage.unroll(r)
    for a in anchor_outs:
        if op_attr(a, _TAPS):
            _schedule_taps(sch, a)
    for t in outs:
        if not (isinstance(t.op, te.ComputeOp) and (t.op.reduce_axis or t.op.attrs.get(_TAPS))):
            schedule_injective_stage(sch, t)


def _schedule_taps(sch: te.Schedule, t: te.Tensor) -> None:
    """A max pool written as an expression of its taps: the rows on the cores, LLVM vectorizing along each
    (the stride-2 taps as vpermt2ps, a short tail in scalars); in the flat form the channel planes on the
    cores, each plane's flat window maxima computed in its task, in local buffers, vectorized."""
    stage = sch[t]
    axes = list(stage.op.axis)
    flat = [f for f in t.op.input_tensors if op_attr(f, _FLAT)]
    flat += [f for g in flat for f in g.op.input_tensors if op_attr(f, _FLAT)]
    if not flat:
        if worth_parallel(static_size(t)):
            stage.parallel(stage.fuse(*axes[:-1]))
        return
    plane = stage.fuse(*axes[:2])
    if worth_parallel(static_size(t)):
        stage.parallel(plane)
    for f in flat:
        sch[f].compute_at(stage, plane)
        sch[f].set_scope("local")
        sch[f].vectorize(sch[f].op.axis[-1])


(register_op("nn.max_pool2d").describe("the maximum over each 2-D window")
    .add_argument("data", "Tensor", "the input, NCHW or NHWC")
    .set_attrs_type(MaxPool2DAttrs)
    .add_type_rel("MaxPool2d", _pool2d_rel)
    .set_support_level(2)
    .set_attr(attr.TOpPattern, OpPattern.OUT_ELEMWISE_FUSABLE)
    .set_attr(attr.FReference, _max_pool2d_ref)
    .set_attr(attr.FPrimalGradient, max_pool2d_grad)
    .set_attr(attr.FCompute, _max_pool2d_compute)
    .set_attr(attr.FSchedule["llvm"], _schedule_pool))


@constructor("nn.max_pool2d")
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


# --- nn.max_pool2d_argmax -------------------------------------------------------------------------


@attrs.frozen
class MaxPool2DArgmaxAttrs(Pool2DAttrs):
    """Attributes of nn.max_pool2d_argmax (NCHW only: the indices count NCHW positions)."""

    storage_order: bool = attrs.field(
        default=False, validator=bool_value,
        metadata={"doc": "count the positions of each plane column by column (else row by row)"},
    )


def _argmax_rel(arg_types: list[Type], attrs: MaxPool2DArgmaxAttrs) -> Type | None:
    if attrs.layout != "NCHW":
        raise RelationError(f"layout {attrs.layout!r} is not supported: the indices count NCHW positions", arg=0)
    out = _pool2d_rel(arg_types, attrs)
    return None if not isinstance(out, TensorType) else TensorType(out.shape, "int64")


def _flat_position(attrs: MaxPool2DArgmaxAttrs, nc: Any, h: Any, w: Any, hw: tuple[int, int]) -> Any:
    """The index ONNX gives input element (h, w) of plane `nc` (= n * C + c)."""
    height, width = hw
    inside = h + w * height if attrs.storage_order else h * width + w
    return nc * (height * width) + inside


def _max_pool2d_argmax_ref(attrs: MaxPool2DArgmaxAttrs, data: Array) -> Array:
    n, c, h, w = data.shape
    lowest = -np.inf if np.issubdtype(data.dtype, np.floating) else np.iinfo(data.dtype).min
    # each element's (h, w) rides along as two more "channels" of the windows; padding reads -1
    rows = np.broadcast_to(np.arange(h)[:, None], (h, w))
    cols = np.broadcast_to(np.arange(w)[None, :], (h, w))
    values, _ = _pool_windows(data.astype(np.float64), attrs, lowest, lowest)
    at_rows, shape = _pool_windows(np.broadcast_to(rows, (1, 1, h, w)).astype(np.int64), attrs, -1, -1)
    at_cols, _ = _pool_windows(np.broadcast_to(cols, (1, 1, h, w)).astype(np.int64), attrs, -1, -1)
    best = np.zeros((n, c, *shape))
    found = np.zeros((n, c, *shape), np.int64)
    seen = np.zeros((1, 1, *shape), bool)
    for (_, _, v), (_, _, y), (_, _, x) in zip(values, at_rows, at_cols, strict=True):
        # the first tap in scan order holding the window's maximum (a later equal value does not win),
        # or its first NaN
        inside = (y >= 0) & (x >= 0)
        better = inside & (~seen | (v > best) | (np.isnan(v) & ~np.isnan(best)))
        found = np.where(better, _flat_position(attrs, 0, y, x, (h, w)), found)
        best = np.where(better, v, best)
        seen = seen | inside
    planes = np.arange(n * c, dtype=np.int64).reshape(n, c, 1, 1) * (h * w)
    indices: Array = found + planes
    return indices


def _max_pool2d_argmax_compute(attrs: MaxPool2DArgmaxAttrs, inputs: list[te.Tensor],
                               out_type: Type) -> list[te.Tensor]:
    """The window maxima (a reduction), then the first tap in scan order that holds its window's maximum,
    as a chain of selects over the taps (last tap innermost), or the first NaN."""
    (data,) = inputs
    win = _Window(attrs, data, out_type)
    lowest = _lowest(data.dtype)
    best = win.compute(lambda n, c, y, x: te.max(win.read(n, c, y, x, lowest), axis=[win.ry, win.rx]),
                       "max_pool2d_argmax_best")
    _, channels, height, width = batch_shape(data)
    (kh, kw) = attrs.pool_size
    floating = tx.is_float(data.dtype)

    def body(n: PrimExpr, c: PrimExpr, y: PrimExpr, x: PrimExpr) -> PrimExpr:
        plane = te.cast(n * channels + c, "int64")
        found: PrimExpr = te.const(-1, "int64")
        for ry in reversed(range(kh)):
            for rx in reversed(range(kw)):
                h, w = win.row(y, tx.const(ry)), win.col(x, tx.const(rx))
                v = win.tap(n, c, y, x, ry, rx, lowest)
                hit = tx.eq(v, best[n, c, y, x])
                if floating:
                    hit = tx.any_of(hit, tx.ne(v, v))
                inside = tx.all_of(h >= 0, h < height, w >= 0, w < width, hit)
                at = _flat_position(attrs, plane, te.cast(h, "int64"), te.cast(w, "int64"), (height, width))
                found = te.if_then_else(inside, at, found)
        return found

    return [win.compute(body, "max_pool2d_argmax")]


(register_op("nn.max_pool2d_argmax").describe("the index of the maximum of each 2-D window, as ONNX MaxPool's")
    .add_argument("data", "Tensor", "the input, NCHW")
    .set_attrs_type(MaxPool2DArgmaxAttrs)
    .add_type_rel("MaxPool2dArgmax", _argmax_rel)
    .set_support_level(2)
    .set_attr(attr.TOpPattern, OpPattern.OPAQUE)
    .set_attr(attr.TNonDifferentiable, "its output is integer indices: no gradient flows through it")
    .set_attr(attr.FReference, _max_pool2d_argmax_ref)
    .set_attr(attr.FCompute, _max_pool2d_argmax_compute))


@constructor("nn.max_pool2d_argmax")
def max_pool2d_argmax(
    data: Expr,
    pool_size: Any = (1, 1),
    strides: Any = (1, 1),
    dilation: Any = (1, 1),
    padding: Any = (0, 0),
    ceil_mode: bool = False,
    storage_order: bool = False,
) -> Call:
    """Where nn.max_pool2d finds each maximum: ONNX MaxPool's Indices output.

    Args:
        data: the input, (N, C, H, W).
        pool_size: the window, an int or (h, w).
        strides: step of the window, an int or (h, w).
        dilation: spacing of the window taps, an int or (h, w).
        padding: an int, (h, w) or (top, left, bottom, right); padded taps are never picked.
        ceil_mode: round the output size up.
        storage_order: number each plane's elements column by column (h + w * H) rather than row by
            row (h * W + w).

    Returns:
        The call of nn.max_pool2d_argmax: int64 (N, C, OH, OW), each the index of its window's first
        maximum in the flattened input, counting the planes before it (``(n * C + c) * H * W + ...``).
    """
    return call("nn.max_pool2d_argmax", [data], MaxPool2DArgmaxAttrs.make(
        "nn.max_pool2d_argmax", pool_size=pool_size, strides=strides, dilation=dilation, padding=padding,
        ceil_mode=ceil_mode, storage_order=storage_order,
    ))


(register_op("nn.avg_pool2d").describe("the mean over each 2-D window")
    .add_argument("data", "Tensor", "the input, NCHW or NHWC")
    .set_attrs_type(AvgPool2DAttrs)
    .add_type_rel("AvgPool2d", _pool2d_rel)
    .set_support_level(2)
    .set_attr(attr.TOpPattern, OpPattern.OUT_ELEMWISE_FUSABLE)
    .set_attr(attr.FReference, _avg_pool2d_ref)
    .set_attr(attr.FPrimalGradient, avg_pool2d_grad)
    .set_attr(attr.FCompute, _avg_pool2d_compute)
    .set_attr(attr.FSchedule["llvm"], _schedule_pool))


@constructor("nn.avg_pool2d")
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
    rank4(data, 0, "data", attrs.layout)
    n, c, _, _ = pick(data.shape, DATA_AXES[attrs.layout])
    return TensorType(nchw_shape(n, c, 1, 1, attrs.layout), data.dtype)


def _global_ref(reduce: Callable[..., Any]) -> Callable[[GlobalPool2DAttrs, Array], Array]:
    def reference(attrs: GlobalPool2DAttrs, data: Array) -> Array:
        axes = (2, 3) if attrs.layout == "NCHW" else (1, 2)
        return np.asarray(reduce(data, axis=axes, keepdims=True)).astype(data.dtype)

    return reference


def _global_compute(mean: bool) -> Callable[[GlobalPool2DAttrs, list[te.Tensor], Type], list[te.Tensor]]:
    def compute(attrs: GlobalPool2DAttrs, inputs: list[te.Tensor], out_type: Type) -> list[te.Tensor]:
        (data,) = inputs
        _, _, h, w = pick(batch_shape(data), DATA_AXES[attrs.layout])
        shape = batch_type_shape(out_type)
        ry, rx = te.reduce_axis((0, h), "ry"), te.reduce_axis((0, w), "rx")
        acc = accumulator(data.dtype) if mean else data.dtype

        def tap(n: PrimExpr, c: PrimExpr) -> PrimExpr:
            return te.cast(data[nchw_shape(n, c, ry, rx, attrs.layout)], acc)

        def pool(n: PrimExpr, c: PrimExpr) -> PrimExpr:
            return te.sum(tap(n, c), axis=[ry, rx]) if mean else te.max(tap(n, c), axis=[ry, rx])

        name = "global_avg_pool2d" if mean else "global_max_pool2d"
        if attrs.layout == "NCHW":
            out = te.compute(shape[:2], pool, name=f"{name}_reduce")
        else:
            out = te.compute((shape[0], shape[3]), pool, name=f"{name}_reduce")
        div = te.const(h * w, acc)

        def finish(n: PrimExpr, c: PrimExpr) -> PrimExpr:
            return te.cast(out[n, c] / div, data.dtype) if mean else out[n, c]

        if attrs.layout == "NCHW":
            return [te.compute(shape, lambda n, c, y, x: finish(n, c), name=name)]
        return [te.compute(shape, lambda n, y, x, c: finish(n, c), name=name)]

    return compute


_GLOBAL_POOLS: list[tuple[str, str, str, Callable[..., Any], bool, Callable[..., Any]]] = [
    ("nn.global_avg_pool2d", "the mean over all of H and W", "GlobalAvgPool2d", np.mean, True, global_avg_pool2d_grad),
    ("nn.global_max_pool2d", "the maximum over all of H and W", "GlobalMaxPool2d", np.max, False,
     global_max_pool2d_grad),
]
for _name, _doc, _rel_name, _reduce, _mean, _grad in _GLOBAL_POOLS:
    (register_op(_name).describe(_doc)
        .add_argument("data", "Tensor", "the input, NCHW or NHWC")
        .set_attrs_type(GlobalPool2DAttrs)
        .add_type_rel(_rel_name, _global_pool2d_rel)
        .set_support_level(2)
        .set_attr(attr.TOpPattern, OpPattern.OUT_ELEMWISE_FUSABLE)
        .set_attr(attr.FReference, _global_ref(_reduce))
        .set_attr(attr.FPrimalGradient, _grad)
        .set_attr(attr.FCompute, _global_compute(_mean))
        .set_attr(attr.FSchedule["llvm"], _schedule_pool))


@constructor("nn.global_avg_pool2d")
def global_avg_pool2d(data: Expr, layout: str = "NCHW") -> Call:
    """The mean over each channel's whole H x W plane.

    Args:
        data: the input, (N, C, H, W) or (N, H, W, C).
        layout: "NCHW" or "NHWC".

    Returns:
        The call of nn.global_avg_pool2d: (N, C, 1, 1) or (N, 1, 1, C).
    """
    return call("nn.global_avg_pool2d", [data], GlobalPool2DAttrs.make("nn.global_avg_pool2d", layout=layout))


@constructor("nn.global_max_pool2d")
def global_max_pool2d(data: Expr, layout: str = "NCHW") -> Call:
    """The maximum over each channel's whole H x W plane.

    Args:
        data: the input, (N, C, H, W) or (N, H, W, C).
        layout: "NCHW" or "NHWC".

    Returns:
        The call of nn.global_max_pool2d: (N, C, 1, 1) or (N, 1, 1, C).
    """
    return call("nn.global_max_pool2d", [data], GlobalPool2DAttrs.make("nn.global_max_pool2d", layout=layout))
