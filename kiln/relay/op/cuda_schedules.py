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
_MIN_BLOCKS = 132  # blocks that give every multiprocessor of an H100-class device one


def _product_tiles(batch: int, m: int, n: int) -> tuple[int, int]:
    """Per-thread rows and columns (tm, tn) of a product's register tile: the largest of 8, 4, 2 whose
    grid still has `_MIN_BLOCKS` blocks (or 2, for a small product).

    Never 1: the guard of a tile past the edge of C then depends on the thread
    loops alone, lowering places it around them, and the barriers of the
    shared panels inside would be under a condition that differs between threads.
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
        panel = sch.cache_read(operand, "shared", [local], axes=_k_first(local.op, operand))
        fill = sch[panel]
        fill.compute_at(local, ko)
        flat = fill.fuse(*fill.op.axis) if len(fill.op.axis) > 1 else fill.op.axis[0]
        rest, tx = fill.split(flat, factor=_THREADS)
        _, ty = fill.split(rest, factor=_THREADS)
        fill.bind(ty, te.thread_axis("threadIdx.y"))
        fill.bind(tx, te.thread_axis("threadIdx.x"))
