"""Row machinery shared by the ops that normalize along the last axis (softmax, log_softmax, layer_norm).

Their llvm "rows" implementations see the tensor as rows (the leading dims flattened) of n values
and compute everything of one row before the next: per-row statistics by `row_reduce` (vectorized
reductions with several accumulators, then a tree across lanes), then the output row, vectorized.
`schedule_rows` places those stages: the rows on the cores when there is enough work, every stage
of a row inside the loop over rows, so that a row is read from memory once and then from the cache.
A tensor that does not stay in the L2 caches (`streams`) also has the next row prefetched while a
pass that computes rather than reads (softmax's exp, log_softmax's sum of exp) goes over this row,
so that memory is busy while the row is computed from the cache, and the next row's first pass
finds it there.

A compute marks its output with `ROWS` (the lane count) and, where it wants them, `BLOCKS` (short
rows taken by blocks of `lanes` rows); internal stages are marked `KEEP` and, for the schedule,
`ALONG` (a buffer along the row, vectorized like the output) or `ACROSS` (one value a row,
one vector across the rows of a block); `AHEAD` marks the one that prefetches the next row.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from kiln import te
from kiln.ir import graph
from kiln.ir.dtype import DataType
from kiln.ir.types import SumDim, SymDim, dim_mul
from kiln.relay.op._nn_util import accumulator
from kiln.relay.op._schedule import (
    KEEP,
    op_attr,
    schedule_generic,
    schedule_injective_stage,
    static_size,
    worth_parallel,
)
from kiln.target import Target
from kiln.tir import expr as tx
from kiln.tir.expr import PrimExpr

ROWS = "kiln.rows"  # ComputeOp attr of a rows implementation's output: its lane count
BLOCKS = "kiln.rows.blocks"  # ComputeOp attr of that output: take short rows by blocks of `lanes` rows
ALONG = "kiln.rows.along"  # ComputeOp attr of an internal (rows, n) stage: vectorized along the row
ACROSS = "kiln.rows.across"  # ComputeOp attr of an internal (rows,) stage: one vector across a block's rows
_ACCUMULATORS = 4  # vectors of partial results per row: independent chains hide the max's and add's latency
_WIDE, _LANES, _HALF = "_wide", "_lanes", "_half"  # name suffixes of the stages of `row_reduce`
_BLOCK_BYTES = 32 * 1024  # the rows of a block: read several times, so they stay in L1
AHEAD = "kiln.rows.ahead"  # ComputeOp attr of a `_wide` or `ALONG` stage: prefetch the next row while on this one
_STREAM_BYTES = 8 * 1024 * 1024  # input and output together from this size on come from L3 or memory


def streams(shape: Sequence[int | SymDim | SumDim], dtype: str) -> bool:
    """Whether a rows kernel's input and output of `shape` and `dtype` come from L3 or memory on every run:
    several times the bytes the cores' L2 caches hold (1 MiB each on this host's Zen 5). Prefetching the
    next row measured faster from 8 MiB on (softmax of 1024x1024 f32: 160 us instead of 170, of 2048x2048
    0.95 ms instead of 1.06), about even at 4 MiB, and only costs instructions below, where the rows stay
    cached. A symbolic shape is taken as cached: the prefetch only pays at sizes beyond a typical batch of
    attention rows (1 x 12 x 128 x 128 floats are 1.5 MiB in and out)."""
    dims = [d for d in shape if isinstance(d, int)]
    if len(dims) != len(shape):
        return False
    return 2 * math.prod(dims) * DataType.of(dtype).bytes >= _STREAM_BYTES


def row_count(dims: Sequence[int | SymDim | SumDim]) -> int | SymDim | SumDim:
    """The number of rows of a tensor whose leading dims are `dims`: an int, or a symbolic dim (`12*n*s`)."""
    count: int | SymDim | SumDim = 1
    for d in dims:
        count = dim_mul(count, d)  # type: ignore[assignment]  # ints and monomials stay ints and monomials
    return count


def _index_dim(d: int | SymDim | SumDim) -> int | PrimExpr:
    """A dim for index arithmetic: an int as it is, a symbolic dim as the kernel's size variables."""
    return d if isinstance(d, int) else te.as_index(d)


def add(a: PrimExpr, b: PrimExpr) -> PrimExpr:
    """a + b, the combiner of a sum."""
    return a + b


def row_reduce(combine: Callable[[PrimExpr, PrimExpr], PrimExpr], identity: float,
               rows: tuple[int | SymDim | SumDim, ...], n: int, lanes: int,
               value: Callable[[tuple[PrimExpr, ...], PrimExpr], PrimExpr], name: str, ahead: bool = False,
               ) -> te.Tensor:
    """`combine` of `value(row, k)` over k < n, per row, in stages that vectorize.

    `_wide`: `_ACCUMULATORS` vectors of `lanes` partial results over the row's whole groups of that many
    vectors (one vector register each, independent chains); `_lanes`: those and the vectors past the
    last group combined into one vector; `_half...`: its halves combined until two lanes are left (a
    tree, not a chain of `lanes` scalar steps); then those two and the last n % lanes values. A select
    reads both of its sides, so each reads in bounds (clamped indices). With `ahead`, the schedule
    prefetches the next row while `_wide` goes over this one (`schedule_rows`).
    """
    reducer = te.comm_reducer(combine, lambda dtype: te.const(identity, dtype), name=name)
    vectors, tail = divmod(n, lanes)
    groups, rest = divmod(vectors, _ACCUMULATORS)
    if groups:
        g = te.reduce_axis((0, groups), name=f"{name}_g")
        wide = te.compute(
            (*rows, _ACCUMULATORS, lanes),
            lambda *jal: reducer(value(jal[:-2], (g * _ACCUMULATORS + jal[-2]) * lanes + jal[-1]), axis=g),
            name=f"{name}{_WIDE}", attrs={KEEP: True, AHEAD: ahead})
    width = 1  # the lanes of partial results left
    if vectors:
        a = te.reduce_axis((0, (_ACCUMULATORS if groups else 0) + rest), name=f"{name}_a")

        def lane(*jl: PrimExpr) -> PrimExpr:
            j, k = jl[:-1], jl[-1]
            if not groups:
                return reducer(value(j, a * lanes + k), axis=a)
            index = (*j, tx.min_(a, _ACCUMULATORS - 1) if rest else a, k)
            got: PrimExpr = wide[index]
            if rest:  # a < _ACCUMULATORS: an accumulator; then the vectors past the last group
                past = value(j, (groups * _ACCUMULATORS + tx.max_(a - _ACCUMULATORS, 0)) * lanes + k)
                got = te.if_then_else(a < _ACCUMULATORS, got, past)
            return reducer(got, axis=a)

        part = te.compute((*rows, lanes), lane, name=f"{name}{_LANES}", attrs={KEEP: True})
        width = lanes
        while width > 2:
            width //= 2

            def half(*jl: PrimExpr, p: te.Tensor = part, w: int = width) -> PrimExpr:
                upper = (*jl[:-1], jl[-1] + w)
                return combine(p[jl], p[upper])

            part = te.compute((*rows, width), half, name=f"{name}{_HALF}{width}", attrs={KEEP: True})
    r = te.reduce_axis((0, (width if vectors else 0) + tail), name=f"{name}_r")

    def horizontal(*j: PrimExpr) -> PrimExpr:
        if not vectors:
            return reducer(value(j, r), axis=r)
        index = (*j, tx.min_(r, width - 1) if tail else r)
        got: PrimExpr = part[index]
        if tail:  # r < width: a partial result; then the values past the last whole vector
            got = te.if_then_else(r < width, got, value(j, vectors * lanes + tx.max_(r - width, 0)))
        return reducer(got, axis=r)

    return te.compute(rows, horizontal, name=name)


def flat(index: Sequence[PrimExpr], dims: Sequence[int | SymDim | SumDim]) -> PrimExpr:
    """The row-major number of `index` in a tensor of `dims` (0 for no dims; symbolic dims allowed)."""
    number: PrimExpr = te.const(0, "int32")
    for i, d in zip(index, dims, strict=True):
        number = number * _index_dim(d) + i
    return number


def unflat(number: PrimExpr, dims: Sequence[int | SymDim | SumDim]) -> tuple[PrimExpr, ...]:
    """The index of row-major number `number` in a tensor of `dims` (symbolic dims allowed)."""
    index = []
    for d in reversed(dims[1:]):
        index.append(number % _index_dim(d))
        number = number // _index_dim(d)
    return (number, *reversed(index)) if dims else ()


def schedule_rows(sch: te.Schedule, anchor_outs: Sequence[te.Tensor], outs: Sequence[te.Tensor],
                  target: Target) -> None:
    """The rows on the cores (when there is enough work); per row every internal stage of the compute,
    each loop along the row vectorized, the wide partial results one vector per accumulator.

    An output marked `BLOCKS` goes by blocks of `lanes` short rows: their statistics first, then the
    `ACROSS` stages as one vector for the block (a scalar log a row is a chain of some 60 cycles, a
    quarter of the time of a row of 128), then their outputs. A stage marked `AHEAD` (the `_wide`
    stage of a `row_reduce(..., ahead=True)`, or an `ALONG` stage) prefetches, with each step along this
    row, the same place in the next row. Elementwise producers fused into the group are already inlined
    into the reads of the input; other outputs of the group (none from FuseOps today) are scheduled as
    injective stages.
    """
    (out,) = anchor_outs
    lanes = op_attr(out, ROWS)
    if lanes is None:  # the generic compute (another axis, or an empty tensor)
        schedule_generic(sch, anchor_outs, outs, target)
        return
    for t in outs:
        if t.op is not out.op:
            schedule_injective_stage(sch, t)
    stage = sch[out]
    *row_axes, col = stage.op.axis
    _, inner = stage.split(col, factor=lanes)
    stage.vectorize(inner)
    *extents, n = [getattr(d, "value", None) for d in out.shape]
    assert isinstance(n, int)  # the rows computes need a static row length
    # the number of rows; None when symbolic (a batch, a sequence), taken as many
    count = math.prod(extents) if all(isinstance(d, int) for d in extents) else None  # type: ignore[arg-type]
    row = None  # one row: the stages stay at the root, in order
    blocked = False
    if row_axes:
        row = row_axes[0] if len(row_axes) == 1 else stage.fuse(*row_axes)
        row_bytes = n * DataType.of(accumulator(out.dtype)).bytes
        blocked = (bool(op_attr(out, BLOCKS)) and (count is None or count >= lanes)
                   and row_bytes * lanes <= _BLOCK_BYTES)
        if blocked:
            row, _ = stage.split(row, factor=lanes)
        if (count is None or count > 1) and worth_parallel(static_size(out)):
            stage.parallel(row)
    for t in internal_stages(out):
        s = sch[t]
        if s.attach_type is te.AttachType.INLINE:
            continue
        if row is not None:
            s.compute_at(stage, row)
        name = t.op.name
        if name.endswith(_WIDE):
            *_, acc, lane = s.op.axis
            (group,) = s.op.reduce_axis
            s.reorder(group, acc, lane)
            s.unroll(acc)
            s.vectorize(lane)
            if op_attr(t, AHEAD) and row is not None:
                _prefetch_next_row(s, t, group)
        elif name.endswith(_LANES) or _HALF in name:
            *_, lane = s.op.axis
            s.reorder(*s.op.reduce_axis, lane)
            s.vectorize(lane)
        elif op_attr(t, ALONG):
            along, lane = s.split(s.op.axis[-1], factor=lanes)
            s.vectorize(lane)
            if op_attr(t, AHEAD) and row is not None:
                _prefetch_next_row(s, t, along, n // lanes)
        elif op_attr(t, ACROSS) and blocked:
            s.vectorize(s.op.axis[0])


def _prefetch_next_row(s: te.Stage, t: te.Tensor, axis: te.IterVar, steps: int | None = None) -> None:
    """Iteration k of `axis` (along the row) prefetches what iteration k + `steps` (one row's worth, by
    default the axis's extent) would read: the same vectors of the next row, the rows being consecutive in
    memory. A prefetch never faults, so the last row's, past the tensor, are harmless; with a row of
    n % lanes != 0 they land a few values early, in the same cache lines or the one before.

    One line a vector, spread over the loop: a whole row's prefetches at the top of the row measured
    slower. Only the inputs the stage reads directly: `Stage.prefetch` cannot reach through an inlined
    producer.
    """
    if steps is None:
        extent = axis.dom.extent if axis.dom is not None else None
        steps = extent.value if isinstance(extent, tx.IntImm) else 0
    for x in t.op.input_tensors:
        if isinstance(x.op, te.PlaceholderOp) and steps > 0:
            s.prefetch(x, axis, steps)


def internal_stages(out: te.Tensor) -> list[te.Tensor]:
    """The stages of the compute that produces `out`, producers first: the reductions and the `KEEP`
    stages it reads (not the elementwise producers fused in front of it, which are inlined)."""
    # the last input first and each stage's last input first: the order the schedule attaches them in
    def reads(t: te.Tensor) -> list[te.Tensor]:
        return list(reversed(t.op.input_tensors)) if isinstance(t.op, te.ComputeOp) else []

    order = graph.post_order(reversed(out.op.input_tensors), reads, key=lambda t: id(t.op))
    return [t for t in order if isinstance(t.op, te.ComputeOp) and (t.op.reduce_axis or t.op.attrs.get(KEEP))]
