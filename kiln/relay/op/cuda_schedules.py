"""GPU schedules that tile through shared memory and registers (the `cuda` implementations).

The generic GPU schedule (`_schedule.schedule_cuda`) gives every output element
a thread and runs its reduction serially from global memory: right for any op,
and bound by memory traffic for products. The schedules here are TVM's for CUDA:

- **Products** (`schedule_product`, nn.dense / nn.matmul / nn.batch_matmul):
  a block computes a `bm x bn` tile of C with 16 x 16 threads, each thread a
  `tm x tn` sub-tile (`bm = 16 tm`) accumulated in registers (a "local" stage
  computed at the thread's loop). The reduction runs in steps of `bk`: at each
  step the block's threads copy the `bm x bk` panel of a and the `bk x bn`
  panel of b into shared memory together (the copies' loops are bound to the
  same threads: cooperative fetching), then each thread reads its rows and
  columns from there, `tm + tn` shared loads for `tm * tn` multiply-adds.
  The group's elementwise epilogue (bias, activation) is applied to the
  register tile as it is written out. Tiles shrink (8 x 8, 4 x 4, 2 x 2 per
  thread) until the grid has enough blocks to fill the device.
- **Convolutions** (`schedule_conv2d`, NCHW, one group): the same scheme with
  output channels as rows and a block of output pixels (rows x columns of the
  image) as columns: the reduction over (input channel, kernel row, kernel
  column) steps through `bc` input channels at a time, staging the weights of
  the block's channels and the input window its pixels read (the padded
  input stage inlined into the copy). Each thread keeps `tm` channels x `tn`
  neighbouring pixels of one row in registers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from kiln import te
from kiln.relay.op._nn_util import tensor_shape
from kiln.relay.op._schedule import schedule_cuda, split_epilogue, static_size
from kiln.te.arith import free_vars, loads
from kiln.te.tensor import TensorBuffer

_THREADS = 16  # threads per block along each of the two axes of a tile
WINDOW = "kiln.cuda_window"  # ComputeOp attr of a cuda conv2d: the padded input stage its windows read
_SHARED_PANEL = 32 * 1024  # bytes of one staged weight panel at most (two panels fit the default 48 KiB)
_MIN_BLOCKS = 132  # blocks that give every multiprocessor of an H100-class device one


def _product_tiles(batch: int, m: int, n: int) -> tuple[int, int]:
    """Per-thread rows and columns (tm, tn) of a product's register tile: the largest of 8, 4, 2 whose
    grid still has `_MIN_BLOCKS` blocks (or 2, for a small product: a 1-wide tile reuses nothing it loads).
    """
    for t in (8, 4):
        side = _THREADS * t
        if batch * -(-m // side) * -(-n // side) >= _MIN_BLOCKS:
            return t, t
    return 2, 2


def _k_first(op: te.ComputeOp, operand: te.Tensor) -> list[int]:
    """A layout of `operand`'s shared panel with the axis that `op` reads along its reduction first.

    A thread then reads its tm (tn) neighbouring rows (columns) at one k from
    consecutive addresses (vector loads), and the threads of a warp, at other
    columns, from other banks. Kept as it is, a (N, K) weight put the columns
    of neighbouring threads `bk` floats apart: every thread on one bank.
    """
    k = op.reduce_axis[0].var
    axes = list(range(len(operand.shape)))
    for ld in loads(op.body):
        if isinstance(ld.buffer, TensorBuffer) and ld.buffer.tensor is not None and ld.buffer.tensor.op is operand.op:
            along = [d for d, i in enumerate(ld.indices) if any(v is k for v in free_vars(i))]
            if len(along) == 1:
                return [along[0], *(d for d in axes if d != along[0])]
    return axes


def schedule_product(sch: te.Schedule, anchor_outs: Sequence[te.Tensor], outs: Sequence[te.Tensor],
                     target: Any) -> None:
    """Shared-memory and register tiling of a product C[..., m, n] = sum over k (see the module docstring)."""
    (c,) = anchor_outs
    shape = tensor_shape(c)
    if len(shape) < 2 or static_size(c) is None or not isinstance(c.op, te.ComputeOp) or len(c.op.reduce_axis) != 1:
        schedule_cuda(sch, anchor_outs, outs, target)
        return
    *batch_shape, m, n = (int(d) for d in shape)
    tm, tn = _product_tiles(math.prod(batch_shape), m, n)
    bk = 16 if tm >= 4 else 8
    tiled, comp = split_epilogue(sch, c, outs, cache=True)
    sch[comp].set_scope("local")
    stage = sch[tiled]
    *batch, sm, sn = stage.op.axis
    mb, mr = stage.split(sm, factor=_THREADS * tm)
    mt, mi = stage.split(mr, factor=tm)
    nb, nr = stage.split(sn, factor=_THREADS * tn)
    nt, ni = stage.split(nr, factor=tn)
    stage.reorder(*batch, mb, nb, mt, nt, mi, ni)
    if batch:
        stage.bind(stage.fuse(*batch) if len(batch) > 1 else batch[0], te.thread_axis("blockIdx.z"))
    stage.bind(mb, te.thread_axis("blockIdx.y"))
    stage.bind(nb, te.thread_axis("blockIdx.x"))
    stage.bind(mt, te.thread_axis("threadIdx.y"))
    stage.bind(nt, te.thread_axis("threadIdx.x"))
    stage.unroll(mi)
    stage.unroll(ni)

    local = sch[comp]
    local.compute_at(stage, nt)
    ko, ki = local.split(local.op.reduce_axis[0], factor=bk)
    *_, lm, ln = local.op.axis
    local.reorder(ko, ki, lm, ln)
    local.unroll(ki)
    local.unroll(lm)
    local.unroll(ln)
    for operand in dict.fromkeys(local.op.input_tensors):  # a and b, once each (a @ a reads one tensor)
        _stage_panel(sch, operand, local, ko, _k_first(local.op, operand))


def _stage_panel(sch: te.Schedule, operand: te.Tensor, local: te.Stage, step: Any, axes: Any) -> None:
    """A shared copy of what `local` reads of `operand` in one iteration of `step` (laid out by `axes`),
    filled by the block's 16 x 16 threads together, each copying every 256th element."""
    fill = sch[sch.cache_read(operand, "shared", [local], axes=axes)]
    fill.compute_at(local, step)
    flat = fill.fuse(*fill.op.axis) if len(fill.op.axis) > 1 else fill.op.axis[0]
    rest, tx = fill.split(flat, factor=_THREADS)
    _, ty = fill.split(rest, factor=_THREADS)
    fill.bind(ty, te.thread_axis("threadIdx.y"))
    fill.bind(tx, te.thread_axis("threadIdx.x"))


def _pixel_tiles(oh: int, ow: int, limit: int) -> tuple[int, int]:
    """(tn, wx): tn neighbouring output columns per thread (at most `limit`), wx threads across a row (a
    power of two; the other 16 / wx go down the rows): the block's pixel tile that wastes the fewest
    pixels past the image's edges (7 x 8 columns by 2 rows for 56 x 56, 4 x 2 by 8 for 7 x 7)."""
    def waste(tw: tuple[int, int]) -> tuple[int, int]:
        cols, rows = tw[0] * tw[1], _THREADS // tw[1]
        return -(-ow // cols) * cols * -(-oh // rows) * rows - oh * ow, -tw[0]

    return min(((tn, wx) for tn in range(limit, 1, -1) for wx in (16, 8, 4, 2, 1)), key=waste)


def _conv_tiles(n: int, o: int, oh: int, ow: int) -> tuple[int, int, int, int]:
    """(tm, tn, hx, wx) of a convolution: tm channels x tn pixels per thread, the block's 16 pixel threads as
    hx rows x wx columns; the largest tile whose grid has `_MIN_BLOCKS` blocks (or the smallest)."""
    best = (2, 2, 8, 2)
    for tm, limit in ((8, 8), (4, 8), (4, 4), (2, 4), (2, 2)):
        if tm > 2 and _THREADS * tm > o:
            continue  # a block of channels the layer does not have
        tn, wx = _pixel_tiles(oh, ow, limit)
        hx = _THREADS // wx
        best = (tm, tn, hx, wx)
        if n * -(-o // (_THREADS * tm)) * -(-oh // hx) * -(-ow // (wx * tn)) >= _MIN_BLOCKS:
            break
    return best


def schedule_conv2d(sch: te.Schedule, anchor_outs: Sequence[te.Tensor], outs: Sequence[te.Tensor],
                    target: Any) -> None:
    """Shared-memory and register tiling of an NCHW convolution (see the module docstring)."""
    (c,) = anchor_outs
    pad = c.op.attrs.get(WINDOW) if isinstance(c.op, te.ComputeOp) else None
    if pad is None or static_size(c) is None:
        schedule_cuda(sch, anchor_outs, outs, target)
        return
    assert isinstance(c.op, te.ComputeOp)
    weight = next(t for t in c.op.input_tensors if t.op is not pad.op)
    n, o, oh, ow = (int(d) for d in tensor_shape(c))
    _, ig, kh, kw = (int(d) for d in tensor_shape(weight))
    tm, tn, hx, wx = _conv_tiles(n, o, oh, ow)
    bc = 16
    while bc > 1 and (bc > ig or _THREADS * tm * bc * kh * kw * 4 > _SHARED_PANEL):
        bc //= 2
    tiled, comp = split_epilogue(sch, c, outs, cache=True)
    sch[comp].set_scope("local")
    if isinstance(pad.op, te.ComputeOp):
        sch[pad].compute_inline()  # the window's copy into shared memory reads the input, zeros at the edge
    stage = sch[tiled]
    b, so, sy, sx = stage.op.axis
    ob, orr = stage.split(so, factor=_THREADS * tm)
    ot, oi = stage.split(orr, factor=tm)
    yb, yt = stage.split(sy, factor=hx)
    xb, xr = stage.split(sx, factor=wx * tn)
    xt, xi = stage.split(xr, factor=tn)
    stage.reorder(b, yb, xb, ob, ot, yt, xt, oi, xi)
    stage.bind(stage.fuse(b, yb, xb), te.thread_axis("blockIdx.x"))
    stage.bind(ob, te.thread_axis("blockIdx.y"))
    stage.bind(ot, te.thread_axis("threadIdx.y"))
    pixels = stage.fuse(yt, xt)
    stage.bind(pixels, te.thread_axis("threadIdx.x"))
    stage.unroll(oi)
    stage.unroll(xi)

    local = sch[comp]
    local.compute_at(stage, pixels)
    rc, ry, rx = local.op.reduce_axis
    rco, rci = local.split(rc, factor=bc)
    *_, lo, ly, lx = local.op.axis
    local.reorder(rco, rci, ry, rx, lo, ly, lx)
    for axis in (ry, rx, lo, ly, lx):
        local.unroll(axis)
    _stage_panel(sch, pad, local, rco, None)
    _stage_panel(sch, weight, local, rco, (1, 2, 3, 0))  # channel-last: a thread's tm channels in a row
