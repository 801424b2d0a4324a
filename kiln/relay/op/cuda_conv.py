"""The cuda convolution (nn.conv2d's `cuda` implementation): its compute and its schedules, TVM's for CUDA.

The compute reads a padded input stage (`conv_schedules.padded_input`, kept for
the schedule), so that the windows are affine in the output's indices; its
`Window` attr tells the schedule the layout, groups, strides and dilation.

- **One group** (NCHW / OIHW, NHWC / HWIO): the scheme of the products
  (`cuda_schedules.schedule_product`) with output channels as rows and a block
  of output pixels (rows x columns of the image) as columns: the reduction
  over (input channel, kernel row, kernel column) steps through `bc` input
  channels at a time, staging the weights of the block's channels and the
  input window its pixels read (the padded input stage inlined into the
  copy). Each thread keeps `tm` channels x `tn` neighbouring pixels of one row
  in registers. NHWC's window is staged channel-first, as NCHW's, so that a
  warp's pixels read distinct banks, while the copy reads global memory
  channel-innermost (coalesced).
- **Split input channels** (split-K): where even the smallest tiles leave the
  device without `MIN_BLOCKS` blocks (ResNet-50's last stage at batch 1: 7 x 7
  pixels, 512 channels, 16 blocks), the input channels are cut into parts,
  each part's sums a grid of blocks of its own (float32 partial sums in a
  workspace), then a second kernel adds the parts up, one thread per output,
  and applies the group's epilogue.
- **Grouped and depthwise** (groups > 1): one output channel and `tn` pixels a
  thread, 16 channels a block, the window of the block's groups staged in
  shared memory (TVM's depthwise schedule). A group size that neither divides
  16 nor is a multiple of it would make a block straddle groups unevenly (a
  symbolic window); such convolutions take the generic schedule.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kiln import te
from kiln.ir.types import Type
from kiln.relay.op._nn_util import dtype_of, product_sum_dtype, static_shape, tensor_shape
from kiln.relay.op._schedule import schedule_cuda, split_epilogue, static_size, summed
from kiln.relay.op.conv_schedules import (
    DATA_AXES,
    conv_output,
    group_channel,
    kernel_at,
    nchw_shape,
    padded_input,
    pick,
    static_kernel_dims,
)
from kiln.relay.op.cuda_schedules import MIN_BLOCKS, SHARED_PANEL, THREADS, stage_panel
from kiln.tir.expr import PrimExpr

WINDOW = "kiln.cuda_window"  # ComputeOp attr of a cuda conv2d's sum: its `Window`
_SPLIT_CHANNELS = 32  # input channels of a part at least (two steps of 16)


@dataclass(frozen=True, eq=False)
class Window:
    """What a cuda conv2d's schedule reads of its compute: the padded input stage that its windows read,
    the data layout ("NCHW", weights OIHW, or "NHWC", weights HWIO), the groups, strides and dilation."""

    pad: te.Tensor
    layout: str
    groups: int
    strides: tuple[int, int]
    dilation: tuple[int, int]

    def conv_axes(self, axes: Sequence[Any]) -> tuple[Any, Any, Any, Any]:
        """(batch, channel, row, column) of `axes` in the data layout's order."""
        b, p, q, r = axes
        return (b, r, p, q) if self.layout == "NHWC" else (b, p, q, r)


def window_compute(attrs: Any, inputs: list[te.Tensor], out_type: Type) -> list[te.Tensor] | None:
    """The compute of an NCHW / OIHW or NHWC / HWIO convolution, of any groups, on cuda (see the module
    docstring); None for other layouts (the direct compute serves them)."""
    data, weight = inputs
    layout = attrs.data_layout
    if (layout, attrs.kernel_layout) not in (("NCHW", "OIHW"), ("NHWC", "HWIO")):
        return None
    o_total, ig, kh, kw = static_kernel_dims(weight, attrs)
    shape = static_shape(out_type)
    out_dtype = dtype_of(out_type)
    dtype = product_sum_dtype(out_dtype)
    n, _, oh, ow = pick(shape, DATA_AXES[layout])
    pt, pl, _, _ = attrs.padding
    (sh, sw), (dh, dw) = attrs.strides, attrs.dilation
    hw_axes = DATA_AXES[layout][2:]
    pad = padded_input(data, (pt, pl), ((oh - 1) * sh + (kh - 1) * dh + 1, (ow - 1) * sw + (kw - 1) * dw + 1),
                       (hw_axes[0], hw_axes[1]))
    parts = conv_splits(n, o_total, oh, ow, ig) if attrs.groups == 1 and layout == "NCHW" else 1
    rc = te.reduce_axis((0, ig // parts), "rc")
    ry, rx = te.reduce_axis((0, kh), "ry"), te.reduce_axis((0, kw), "rx")

    def conv(n: PrimExpr, o: PrimExpr, y: PrimExpr, x: PrimExpr, part: PrimExpr | int) -> PrimExpr:
        i = rc + part * (ig // parts)
        v = pad[nchw_shape(n, group_channel(o, i, attrs, o_total, ig), y * sh + ry * dh, x * sw + rx * dw, layout)]
        return te.sum(te.cast(v, dtype) * te.cast(kernel_at(weight, attrs, o, i, ry, rx), dtype), axis=[rc, ry, rx])

    window = {WINDOW: Window(pad, layout, attrs.groups, attrs.strides, attrs.dilation)}
    if parts == 1:
        return [conv_output(shape, layout, lambda n, o, y, x: conv(n, o, y, x, 0), out_dtype, window)]
    sums = te.compute((parts, *shape), lambda p, n, o, y, x: conv(n, o, y, x, p), name="conv2d_parts", attrs=window)
    rp = te.reduce_axis((0, parts), "rp")  # NCHW: the parts' sums added up
    return [conv_output(shape, layout, lambda n, o, y, x: te.sum(sums[rp, n, o, y, x], axis=rp), out_dtype)]


def conv_splits(n: int, o: int, oh: int, ow: int, ig: int) -> int:
    """Into how many parts (a power of two) a convolution's input channels are split: until the grid has
    `MIN_BLOCKS` blocks, while each part keeps `_SPLIT_CHANNELS` channels. 1 where the tiles fill the device.
    """
    parts = 1
    while ig % (2 * parts) == 0 and ig // (2 * parts) >= _SPLIT_CHANNELS and _blocks(n * parts, o, oh, ow) < MIN_BLOCKS:
        parts *= 2
    return parts


def _blocks(n: int, o: int, oh: int, ow: int) -> int:
    tm, tn, hx, wx = _conv_tiles(n, o, oh, ow)
    return n * -(-o // (THREADS * tm)) * -(-oh // hx) * -(-ow // (wx * tn))


def _pixel_tiles(oh: int, ow: int, limit: int) -> tuple[int, int]:
    """(tn, wx): tn neighbouring output columns per thread (at most `limit`), wx threads across a row (a
    power of two; the other 16 / wx go down the rows): the block's pixel tile that wastes the fewest
    pixels past the image's edges (7 x 8 columns by 2 rows for 56 x 56, 4 x 2 by 8 for 7 x 7)."""
    def waste(tw: tuple[int, int]) -> tuple[int, int]:
        cols, rows = tw[0] * tw[1], THREADS // tw[1]
        return -(-ow // cols) * cols * -(-oh // rows) * rows - oh * ow, -tw[0]

    return min(((tn, wx) for tn in range(limit, 1, -1) for wx in (16, 8, 4, 2, 1)), key=waste)


def _conv_tiles(n: int, o: int, oh: int, ow: int) -> tuple[int, int, int, int]:
    """(tm, tn, hx, wx) of a convolution: tm channels x tn pixels per thread, the block's 16 pixel threads as
    hx rows x wx columns; the largest tile whose grid has `MIN_BLOCKS` blocks (or the smallest)."""
    best = (2, 2, 8, 2)
    for tm, limit in ((8, 8), (4, 8), (4, 4), (2, 4), (2, 2)):
        if tm > 2 and THREADS * tm > o:
            continue  # a block of channels the layer does not have
        tn, wx = _pixel_tiles(oh, ow, limit)
        hx = THREADS // wx
        best = (tm, tn, hx, wx)
        if n * -(-o // (THREADS * tm)) * -(-oh // hx) * -(-ow // (wx * tn)) >= MIN_BLOCKS:
            break
    return best


def schedule_conv2d(sch: te.Schedule, anchor_outs: Sequence[te.Tensor], outs: Sequence[te.Tensor],
                    target: Any) -> None:
    """Shared-memory and register tiling of a convolution, NCHW or NHWC (see the module docstring)."""
    c = summed(sch, anchor_outs[0], outs)
    if not isinstance(c.op, te.ComputeOp) or static_size(c) is None:
        schedule_cuda(sch, anchor_outs, outs, target)
        return
    if c.op.attrs.get(WINDOW) is None:  # the parts of a split reduction added up
        sums = next((t for t in c.op.input_tensors if isinstance(t.op, te.ComputeOp) and t.op.attrs.get(WINDOW)),
                    None)
        if sums is None:
            schedule_cuda(sch, anchor_outs, outs, target)
            return
        _add_parts(sch, c, outs)
        c, outs = sums, []
    assert isinstance(c.op, te.ComputeOp)
    window = c.op.attrs[WINDOW]
    pad = window.pad
    weight = next(t for t in c.op.input_tensors if t.op is not pad.op)
    shape = [int(d) for d in tensor_shape(c)]
    parts = shape[0] if len(shape) == 5 else 1
    n, o, oh, ow = window.conv_axes(shape[-4:])
    wshape = [int(d) for d in tensor_shape(weight)]
    kh, kw, ig = (wshape[2], wshape[3], wshape[1]) if window.layout == "NCHW" else wshape[:3]
    og = o // window.groups
    if window.groups > 1 and og % THREADS and THREADS % og:
        schedule_cuda(sch, anchor_outs, outs, target)  # a block's channels would straddle groups unevenly
        return
    if window.groups > 1:
        _schedule_grouped_conv2d(sch, c, outs, window, (oh, ow, kh, kw, ig, og))
        return
    tm, tn, hx, wx = _conv_tiles(n * parts, o, oh, ow)
    bc = 16
    while bc > 1 and (bc > ig // parts or THREADS * tm * bc * kh * kw * 4 > SHARED_PANEL):
        bc //= 2
    local, step = _tile_conv(sch, c, outs, window, (tm, tn, hx, wx), bc)
    # OIHW channel-last (a thread's tm channels in a row); HWIO is channel-last already
    stage_panel(sch, weight, local, step, (1, 2, 3, 0) if window.layout == "NCHW" else None)


def _tile_conv(sch: te.Schedule, c: te.Tensor, outs: Sequence[te.Tensor], window: Window,
               tiles: tuple[int, int, int, int], bc: int) -> tuple[te.Stage, Any]:
    """The block and thread tiles of a convolution's output, `tiles` = (tm, tn, hx, wx): 16 tm channels x hx
    rows x wx tn columns a block, tm channels x tn neighbouring columns of one row a thread (channels on
    threadIdx.y, pixels on threadIdx.x). The sums, computed at each thread, step through bc input channels,
    the input window of each step staged in shared memory; returns the local stage and its step axis."""
    tm, tn, hx, wx = tiles
    tiled, comp = split_epilogue(sch, c, outs, cache=True)
    sch[comp].set_scope("local")
    if isinstance(window.pad.op, te.ComputeOp):
        sch[window.pad].compute_inline()  # the window's copy into shared memory reads the input, zeros at the edge
    stage = sch[tiled]
    *part, b, so, sy, sx = (*stage.op.axis[:-4], *window.conv_axes(stage.op.axis[-4:]))  # part: of a split sum
    ob, orr = stage.split(so, factor=THREADS * tm)
    ot, oi = stage.split(orr, factor=tm)
    yb, yt = stage.split(sy, factor=hx)
    xb, xr = stage.split(sx, factor=wx * tn)
    xt, xi = stage.split(xr, factor=tn)
    stage.reorder(*part, b, yb, xb, ob, ot, yt, xt, oi, xi)
    stage.bind(stage.fuse(*part, b, yb, xb), te.thread_axis("blockIdx.x"))
    stage.bind(ob, te.thread_axis("blockIdx.y"))
    stage.bind(ot, te.thread_axis("threadIdx.y"))
    pixels = stage.fuse(yt, xt)
    stage.bind(pixels, te.thread_axis("threadIdx.x"))
    stage.unroll(oi)
    stage.unroll(xi)
    local = sch[comp]
    local.compute_at(stage, pixels)
    rc, ry, rx = local.op.reduce_axis
    step, rci = local.split(rc, factor=bc)
    _, lo, ly, lx = window.conv_axes(local.op.axis[-4:])
    local.reorder(step, rci, ry, rx, lo, ly, lx)
    for axis in (ry, rx, lo, ly, lx):
        local.unroll(axis)
    if window.layout == "NCHW":
        stage_panel(sch, window.pad, local, step, None)
    else:  # the window channel-first as in NCHW (a warp's pixels on distinct banks), copied channel-innermost
        stage_panel(sch, window.pad, local, step, (3, 0, 1, 2), order=(1, 2, 3, 0))
    return local, step


def _add_parts(sch: te.Schedule, total: te.Tensor, outs: Sequence[te.Tensor]) -> None:
    """The sum of a split convolution's parts, with the group's epilogue: one thread per output element."""
    tiled, _ = split_epilogue(sch, total, outs)
    stage = sch[tiled]
    fused = stage.fuse(*stage.op.axis)
    block, thread = stage.split(fused, factor=256)
    stage.bind(block, te.thread_axis("blockIdx.x"))
    stage.bind(thread, te.thread_axis("threadIdx.x"))
    if tiled is not total:
        sch[total].set_scope("local")
        sch[total].compute_at(stage, thread)


def _schedule_grouped_conv2d(sch: te.Schedule, c: te.Tensor, outs: Sequence[te.Tensor], window: Window,
                             dims: tuple[int, int, int, int, int, int]) -> None:
    """A convolution of several groups (depthwise where each group is one channel) of og output channels,
    og dividing 16 or 16 dividing og: one output channel and tn neighbouring pixels of a row per thread, 16
    channels a block; the reduction steps through bc input channels of each group, staging the window that
    the block's channels read (bc channels of each of their groups)."""
    oh, ow, kh, kw, ig, og = dims
    tn, wx = _pixel_tiles(oh, ow, 4)
    hx = THREADS // wx
    (sh, sw), (dh, dw) = window.strides, window.dilation
    rows, cols = (hx - 1) * sh + (kh - 1) * dh + 1, (wx * tn - 1) * sw + (kw - 1) * dw + 1
    spanned = max(THREADS // og, 1)  # the groups of a block's 16 channels (og divides 16, or 16 divides og)
    bc = 16
    while bc > 1 and (bc > ig or ((spanned - 1) * ig + bc) * rows * cols * 4 > SHARED_PANEL):
        bc //= 2
    _tile_conv(sch, c, outs, window, (1, tn, hx, wx), bc)


