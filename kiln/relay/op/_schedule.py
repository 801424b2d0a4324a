"""Generic CPU schedules, and the helper that registers an op's compute with them.

Every op sets its te compute (`FCompute`) in its own declaration
(`relay/op/<family>.py`). Unless the op sets its own `FSchedule`, each target
kind schedules it by its `TOpPattern` (the kind's `FDefaultSchedule`, set
here: on llvm `schedule_injective` for elementwise, broadcast and injective
ops, `schedule_reduce` for reductions, `schedule_generic` otherwise; on cuda
`schedule_cuda`). Ops with better schedules set `FSchedule["llvm"]` or add
implementations (`.add_implementation(...)`).

A schedule is called as `schedule(sch, anchor_outs, outs, target)`: `sch` is
the schedule of a whole fused group, whose injective stages other than the
group's outputs are already inlined; `anchor_outs` are the tensors of the
group's anchor op (the one whose implementation was chosen to schedule the
group) and `outs` the group's outputs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from kiln import te
from kiln.ir.dtype import DataType
from kiln.registry import OpPattern
from kiln.relay.op._nn_util import same_dims
from kiln.target import FDefaultSchedule, Target, register_target_kind
from kiln.tir.expr import BufferLoad, Cast

_VECTOR_BYTES = 64  # one zmm register; LLVM narrows it on hosts without AVX-512
KEEP = "kiln.keep"  # ComputeOp attr: a compute's internal stage that its schedule places; lowering leaves it
_PARALLEL_MIN = 16 * 1024  # elements below which a kernel runs on one core (fork-join costs a few us)


def vector_lanes(dtype: str) -> int:
    """Elements of `dtype` in one vector register."""
    return max(1, _VECTOR_BYTES // DataType.of(dtype).bytes)


def op_attr(t: te.Tensor, key: str) -> Any:
    """Attribute `key` of the compute that produces `t` (None for a placeholder or a missing key)."""
    return t.op.attrs.get(key) if isinstance(t.op, te.ComputeOp) else None


def divisor_at_most(n: int, limit: int) -> int:
    """The largest divisor of `n` that is at most `limit` (a tile size that leaves no tail)."""
    return next(d for d in range(max(1, min(n, limit)), 0, -1) if n % d == 0)


def worth_parallel(work: int | None) -> bool:
    """Whether `work` (elements, or multiply-adds; None when unknown) pays for a fork-join on the cores."""
    return work is None or work >= _PARALLEL_MIN


def static_size(t: te.Tensor) -> int | None:
    size = 1
    for d in t.shape:
        value = getattr(d, "value", None)
        if not isinstance(value, int):
            return None
        size *= value
    return size


_ROW_MIN = 16  # elements of the trailing axes from which an injective stage is scheduled as rows


def schedule_injective_stage(sch: te.Schedule, t: te.Tensor) -> None:
    """One injective stage: all axes fused, split into vector-wide chunks, the chunks parallel.

    The innermost chunk is vectorized; blocks of chunks run on the cores when the
    tensor is large enough for it to pay (a symbolic one is taken as large). A
    tensor whose trailing static axes hold `_ROW_MIN` elements or more is done as
    rows instead (`_injective_rows`).
    """
    stage = sch[t]
    axes = list(stage.op.axis)
    if not axes:
        return
    if _injective_rows(stage, t):
        return
    fused = axes[0] if len(axes) == 1 else stage.fuse(*axes)
    lanes = vector_lanes(t.dtype)
    size = static_size(t)
    if size is not None and size < lanes:
        return
    outer, inner = stage.split(fused, factor=lanes)
    stage.vectorize(inner)
    if size is None or size >= _PARALLEL_MIN:
        block, _ = stage.split(outer, factor=64)
        stage.parallel(block)


def _injective_rows(stage: te.Stage, t: te.Tensor) -> bool:
    """Rows: the leading axes fused into rows (on the cores), the trailing axes (at least `_ROW_MIN`
    elements, fewest axes) fused into one vectorized loop per row. A value broadcast along the row (a
    per-channel scale or bias of NCHW data: squeeze-excite's gate) is then one scalar per row, where
    in a split of all axes fused its index was a division per lane (a gather). Returns False (nothing
    scheduled) for a single row, or no trailing axes of `_ROW_MIN` elements.

    Symbolic leading dims (a batch, a sequence: ("n", "s", 768)) make a symbolic number of rows, taken
    as many (on the cores). A symbolic last dim ((3, "n"), ("n", "s")) is the row by itself, split
    into vectors and a tail (a loop of its own, which te partitions), rather than all axes fused,
    whose every index would then be a division by the size variable."""
    dims = [getattr(d, "value", None) for d in t.shape]
    if len(dims) < 2:
        return False
    if not isinstance(dims[-1], int):
        _symbolic_rows(stage, t, dims)
        return True
    symbolic = [i for i, d in enumerate(dims) if not isinstance(d, int)]
    first = symbolic[-1] + 1 if symbolic else 0  # the row's axes start after the last symbolic one
    shape = [d if isinstance(d, int) else 0 for d in dims]  # 0: never read where it stands for a symbolic dim
    k = len(shape) - 1
    while k > first and math.prod(shape[k:]) < _ROW_MIN:
        k -= 1
    if k == 0 or k < first or math.prod(shape[k:]) < _ROW_MIN:
        return False
    if not symbolic and math.prod(shape[:k]) == 1:  # one row: all axes split into chunks spreads it on the cores
        return False
    axes = list(stage.op.axis)
    rows = axes[0] if k == 1 else stage.fuse(*axes[:k])
    row = axes[k] if k == len(axes) - 1 else stage.fuse(*axes[k:])
    lanes = vector_lanes(t.dtype)
    if math.prod(shape[k:]) % lanes and len(axes) - k > 1:
        # whole rows of several axes (14 x 14): a split would leave a tail guard on a quotient
        # ((o * 16 + i) // 14 < 14) that stays in the vector loop; LLVM vectorizes the row with its own tail
        stage.vectorize(row)
    else:
        _, inner = stage.split(row, factor=lanes)  # the tail: a loop of its own (partitioned)
        stage.vectorize(inner)
    if worth_parallel(None if symbolic else math.prod(shape)):
        stage.parallel(rows)
    return True


def _symbolic_rows(stage: te.Stage, t: te.Tensor, dims: list[int | None]) -> None:
    """Rows of a symbolic length: the leading axes fused into rows, the last axis split into vectors
    and a tail. The rows run on the cores, or, when there is one (static) row, blocks of 64 vectors."""
    *leading, col = stage.op.axis
    outer, inner = stage.split(col, factor=vector_lanes(t.dtype))
    stage.vectorize(inner)
    if all(isinstance(d, int) for d in dims[:-1]) and math.prod(dims[:-1]) == 1:  # type: ignore[arg-type]
        block, _ = stage.split(outer, factor=64)
        stage.parallel(block)
        return
    stage.parallel(leading[0] if len(leading) == 1 else stage.fuse(*leading))


def schedule_injective(sch: te.Schedule, anchor_outs: Sequence[te.Tensor], outs: Sequence[te.Tensor],
                       target: Target) -> None:
    """Elementwise, broadcast and injective groups: each output as `schedule_injective_stage`."""
    del anchor_outs, target
    for t in outs:
        schedule_injective_stage(sch, t)


def _schedule_rest(sch: te.Schedule, anchor_outs: Sequence[te.Tensor], outs: Sequence[te.Tensor]) -> None:
    """The group's outputs that are not the anchor's (an elementwise epilogue), as injective stages."""
    anchors = {id(t.op) for t in anchor_outs}
    for t in outs:
        if id(t.op) not in anchors:
            schedule_injective_stage(sch, t)


def schedule_reduce(sch: te.Schedule, anchor_outs: Sequence[te.Tensor], outs: Sequence[te.Tensor],
                    target: Target) -> None:
    """A reduction: its data-parallel axes fused and run on the cores (when the whole reduction is
    `_PARALLEL_MIN` elements or more), the reduction loops inside.

    Its elementwise inputs are already inlined into it; an elementwise epilogue
    runs as its own injective loop nest in the same kernel.
    """
    del target
    for t in anchor_outs:
        stage = sch[t]
        axes = list(stage.op.axis)
        if axes:
            fused = axes[0] if len(axes) == 1 else stage.fuse(*axes)
            size = static_size(t)
            work = None if size is None else size * reduce_extent(t)
            if (size is None or size >= 2) and worth_parallel(work):
                stage.parallel(fused)
    _schedule_rest(sch, anchor_outs, outs)


def reduce_extent(t: te.Tensor) -> int:
    extent = 1
    for iv in getattr(t.op, "reduce_axis", ()):
        value = getattr(iv.dom.extent, "value", None)
        extent *= value if isinstance(value, int) else 1
    return extent


def schedule_generic(sch: te.Schedule, anchor_outs: Sequence[te.Tensor], outs: Sequence[te.Tensor],
                     target: Target) -> None:
    """Any other op: its outermost output axis on the cores, the rest as the compute wrote it."""
    del target
    for t in anchor_outs:
        stage = sch[t]
        if stage.op.axis and (static_size(t) or _PARALLEL_MIN) >= _PARALLEL_MIN // 64:
            stage.parallel(stage.op.axis[0])
    _schedule_rest(sch, anchor_outs, outs)


def default_schedule(pattern: OpPattern) -> Callable[..., None]:
    """The generic schedule for an op of `pattern`."""
    if pattern <= OpPattern.INJECTIVE:
        return schedule_injective
    if pattern is OpPattern.COMM_REDUCE:
        return schedule_reduce
    return schedule_generic


_CUDA_THREADS = 256  # threads per block of the generic GPU schedule
_CUDA_ELEMENTS = 4  # elements per thread of an elementwise stage: loads in flight, 1/4 of the blocks
_CUDA_LANES = 4  # of them, neighbours read by one vector load (float4)
_CUDA_GRID = 4096  # blocks of an elementwise stage at most: beyond, each block strides over the tensor again


def bind_stage_cuda(sch: te.Schedule, t: te.Tensor, threads: int = _CUDA_THREADS) -> None:
    """GPU threads over the elements of `t`: its axes fused, split into blocks of `threads`.

    An elementwise stage (no reduction) of at least 4 blocks' worth gives each
    thread 4 neighbouring elements, a vectorized loop (past `_CUDA_GRID`
    blocks' worth, a grid-stride loop: each block takes every `_CUDA_GRID`-th
    tile in turn): where the offsets are
    provably aligned, one 16-byte load per input and one store (`float4`,
    `kiln.codegen.cuda_vector`), else 4 loads issued before the first result is
    needed; one element per thread leaves the memory system waiting on each
    thread's single load. The
    reductions of a stage, if any, run as serial loops in each thread. A 0-d
    stage (a full reduction) runs on one thread: its singleton axis is bound.
    """
    stage = sch[t]
    axes = list(stage.op.axis)
    if not axes:
        stage.bind(stage.fuse(), te.thread_axis("threadIdx.x"))
        return
    fused = axes[0] if len(axes) == 1 else stage.fuse(*axes)
    size = static_size(t)
    if not stage.op.reduce_axis and size is not None and size >= 4 * threads * _CUDA_ELEMENTS:
        block, rest = stage.split(fused, factor=threads * _CUDA_ELEMENTS)
        step, rest = stage.split(rest, factor=threads * _CUDA_LANES)  # each step: a warp reads 512 bytes
        thread, lanes = stage.split(rest, factor=_CUDA_LANES)
        if size > _CUDA_GRID * threads * _CUDA_ELEMENTS:  # a grid-stride loop: the grid sweeps the tensor
            sweep, block = stage.split(block, factor=_CUDA_GRID)
            stage.reorder(block, sweep, step, thread, lanes)
        stage.unroll(step)
        stage.vectorize(lanes)
    else:
        block, thread = stage.split(fused, factor=min(threads, size) if size else threads)
    stage.bind(block, te.thread_axis("blockIdx.x"))
    stage.bind(thread, te.thread_axis("threadIdx.x"))


def schedule_cuda(sch: te.Schedule, anchor_outs: Sequence[te.Tensor], outs: Sequence[te.Tensor],
                  target: Target) -> None:
    """The generic GPU schedule, for any op: every stage left at the root gets one thread per element.

    Injective groups run as one flattened grid. Reductions and other ops get a
    thread per output element with the reduction serial in it: correct for
    every op, fast for injective ones; ops with better GPU schedules register
    them as `cuda` implementations.
    """
    del anchor_outs, outs, target
    for stage in list(sch.stages):
        if stage.attach_type is te.AttachType.ROOT:
            bind_stage_cuda(sch, stage.op.output())


register_target_kind("llvm").set_attr(FDefaultSchedule, default_schedule)
register_target_kind("cuda").set_attr(FDefaultSchedule, lambda pattern: schedule_cuda)


def narrowed_total(anchor: te.Tensor) -> te.Tensor | None:
    """The sum that `anchor` converts to a narrow float (`_nn_util.narrowed`: `cast(total)`), or None."""
    op = anchor.op
    if not isinstance(op, te.ComputeOp) or op.reduce_axis or len(op.input_tensors) != 1:
        return None
    (total,) = op.input_tensors
    body = op.body
    if not (isinstance(total.op, te.ComputeOp) and total.op.reduce_axis and isinstance(body, Cast)
            and isinstance(body.value, BufferLoad)
            and all(i is ax.var for i, ax in zip(body.value.indices, op.axis, strict=True))):
        return None
    return total


def summed(sch: te.Schedule, anchor: te.Tensor, outs: Sequence[te.Tensor]) -> te.Tensor:
    """The sum under a narrow-float product's conversion (`narrowed_total`), that conversion inlined into
    its readers where it is not an output; else `anchor` itself."""
    total = narrowed_total(anchor)
    if total is None:
        return anchor
    if all(t.op is not anchor.op for t in outs):
        sch[anchor].compute_inline()
    return total


def split_epilogue(sch: te.Schedule, anchor: te.Tensor, outs: Sequence[te.Tensor],
                   cache: bool = False) -> tuple[te.Tensor, te.Tensor]:
    """For a tiled anchor: the tensor whose loops to tile, and the tensor that computes the anchor.

    When the group's one output is an elementwise epilogue of the anchor's shape
    (bias, activation), the epilogue's loops are tiled and the anchor is computed
    per tile (`compute_at` by the caller), so the anchor's tile stays in
    registers. Otherwise the anchor's own loops are tiled; with `cache` its
    values are accumulated in a local tile first (`cache_write`). Other outputs
    are scheduled as injective stages.
    """
    same = [t for t in outs if t.op is not anchor.op and same_dims(t, anchor)]
    if len(outs) == 1 and same:
        return same[0], anchor
    for t in outs:
        if t.op is not anchor.op:
            schedule_injective_stage(sch, t)
    return anchor, (sch.cache_write(anchor, "local") if cache else anchor)
