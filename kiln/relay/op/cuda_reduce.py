"""GPU row reductions: each row spread over the threads of a warp or a block (the `cuda` "rows" implementations).

The generic GPU schedule (`_schedule.schedule_cuda`) gives each output element
a thread and runs its reduction serially: a softmax over rows of 128 keeps
one thread per row busy for 128 dependent steps, and the rest of the device
idle. Here each row gets `threads_per_row` threads of threadIdx.x, thread t
taking the row's elements t, t + T, t + 2T, ... (neighbouring threads read
neighbouring addresses); each thread accumulates in a register, then the row's
threads combine their results with warp shuffles, and through shared memory
across warps (an all-reduce: `kiln.tir.allreduce`, bound by `Stage.bind` of
the reduction axis to threadIdx.x). Every thread then holds the row's value,
so the next reduction of the row (softmax's sum after its maximum, layer
norm's variance after its mean) and the output along the row follow in the
same kernel, from registers: one kernel per row, several rows a block.

`schedule_rows_cuda` schedules the ops whose compute marks its output with
`ROW_REDUCE`: the reductions (sum, mean, max, min, prod, argmax, argmin, over
any axes) and softmax, log_softmax and layer_norm along the last axis. The
output's row axes are fused and split into blocks of `rows_per_block` rows
(blockIdx.x, threadIdx.y); each reduction the output reads is a "local" stage
computed per row, its reduction axes fused and split by the thread count; an
output along the row (softmax, layer norm) is split the same way, its elements
written by the threads that reduced them. The mark's value tells whether the
reduced elements of a row are contiguous in memory; where they are not (a
reduction over a leading axis), threads reading one row read far apart, and
the generic schedule, whose neighbouring threads read neighbouring rows, is
kept unless there are too few rows to occupy the device.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from kiln import te
from kiln.relay.op._rows import internal_stages
from kiln.relay.op._schedule import (
    bind_stage_cuda,
    divisor_at_most,
    op_attr,
    reduce_extent,
    schedule_cuda,
    static_size,
)
from kiln.target import Target

ROW_REDUCE = "kiln.cuda.row_reduce"  # ComputeOp attr of an output: schedule_rows_cuda; the rows are contiguous
WARP = 32
_WARP_ROW = 1024  # rows up to this long take a warp (or fewer lanes) each, unless there are few rows
_PER_THREAD = 8  # elements a thread keeps at least when a row is spread past a warp
_MAX_THREADS = 1024  # threads a row takes at most (a block)
_BLOCK = 256  # threads of a block of several short rows
_FILL = 64 * 1024  # threads below which the device (132 SMs x 2048 threads) idles: wider rows instead
_FEW_ROWS = 2048  # rows below which a strided reduction is spread over threads anyway
_LONG_ROW = 64  # ... when each of its rows has at least this many elements


def threads_per_row(rows: int, n: int) -> int:
    """The threads that reduce one row of `n` elements, a power of two: the smallest power of two that
    covers the row up to a warp; more (up to a block) while each keeps `_PER_THREAD` elements, for rows
    longer than `_WARP_ROW` or when `rows` rows at that width would leave the device idle."""
    t = min(WARP, 1 << max(n - 1, 0).bit_length())
    while t < _MAX_THREADS and n >= 2 * t * _PER_THREAD and (n > _WARP_ROW or rows * t < _FILL):
        t *= 2
    return t


def rows_per_block(rows: int, threads: int) -> int:
    """Rows a block takes (along threadIdx.y): a divisor of `rows`, so that no row is past the end and
    guarded (a guard on threadIdx.y would put the row's all-reduce under a condition), for blocks of
    about `_BLOCK` threads."""
    return divisor_at_most(rows, max(1, _BLOCK // threads))


def _reductions(out: te.Tensor) -> list[te.Tensor]:
    """The reductions of the compute that produces `out`, producers first, `out` last if it reduces."""
    found = [t for t in internal_stages(out) if isinstance(t.op, te.ComputeOp) and t.op.reduce_axis]
    return [*found, out] if isinstance(out.op, te.ComputeOp) and out.op.reduce_axis else found


def _across_threads(s: te.Stage, threads: int) -> None:
    """The stage's reduction axes fused, split by `threads`, the inner part bound to threadIdx.x."""
    axes = list(s.op.reduce_axis)
    k = axes[0] if len(axes) == 1 else s.fuse(*axes)
    _, inner = s.split(k, factor=threads)
    s.bind(inner, te.thread_axis("threadIdx.x"))


def schedule_rows_cuda(sch: te.Schedule, anchor_outs: Sequence[te.Tensor], outs: Sequence[te.Tensor],
                       target: Target) -> None:
    """Rows over warps or blocks, their reductions across threads (see the module docstring). An unmarked
    compute (the generic one: another axis, an empty tensor), symbolic shapes, rows of fewer than two
    elements, or a strided reduction of many rows get `schedule_cuda`."""
    out = anchor_outs[0]
    contiguous = op_attr(out, ROW_REDUCE)
    reductions = _reductions(out)
    if contiguous is None or not reductions or static_size(out) is None:
        schedule_cuda(sch, anchor_outs, outs, target)
        return
    first = reductions[0]
    rows, n = static_size(first) or 0, reduce_extent(first)
    same = all(static_size(r) == rows and reduce_extent(r) == n for r in reductions)
    if not same or rows == 0 or n < 2 or (not contiguous and (rows >= _FEW_ROWS or n < _LONG_ROW)):
        schedule_cuda(sch, anchor_outs, outs, target)
        return
    threads = threads_per_row(rows, n)
    per_block = rows_per_block(rows, threads)
    for t in outs:
        if t.op is not out.op:
            bind_stage_cuda(sch, t)
    stage = sch[out]
    along = len(stage.op.axis) > len(first.shape)  # an output along the row: softmax, layer norm
    row_axes = list(stage.op.axis[:-1] if along else stage.op.axis)
    row = stage.fuse(*row_axes)  # no axes (one row): a new axis of one
    if per_block > 1:
        block, row = stage.split(row, factor=per_block)
        stage.bind(block, te.thread_axis("blockIdx.x"))
        stage.bind(row, te.thread_axis("threadIdx.y"))
    else:
        stage.bind(row, te.thread_axis("blockIdx.x"))
    if along:
        outer, inner = stage.split(stage.op.axis[-1], factor=threads)
        stage.reorder(inner, outer)
        stage.bind(inner, te.thread_axis("threadIdx.x"))
    for r in reductions:
        if r.op is out.op:
            _across_threads(stage, threads)
            continue
        s = sch[r]
        s.compute_at(stage, row)
        s.set_scope("local")  # every thread holds the row's value
        _across_threads(s, threads)


def launch_shape(rows: int, n: int) -> tuple[int, int, int]:
    """(threads per row, rows per block, blocks) that `schedule_rows_cuda` gives `rows` rows of `n`."""
    threads = threads_per_row(rows, n)
    per_block = rows_per_block(rows, threads)
    return threads, per_block, math.ceil(rows / per_block)


__all__ = ["ROW_REDUCE", "launch_shape", "rows_per_block", "schedule_rows_cuda", "threads_per_row"]
