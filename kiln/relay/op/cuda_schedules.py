"""GPU schedules that tile through shared memory and registers (the `cuda` implementations).

The generic GPU schedule (`_schedule.schedule_cuda`) gives every output element
a thread and runs its reduction serially from global memory: right for any op,
and bound by memory traffic for products. The schedules here are TVM's for CUDA (convolutions: `cuda_conv`):

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
from kiln.relay.op._schedule import narrowed_total, schedule_cuda, split_epilogue, static_size, summed
from kiln.te.arith import free_vars, loads
from kiln.te.tensor import Reduce, TensorBuffer
from kiln.tir.async_copy import ASYNC_COPY
from kiln.tir.expr import BufferLoad, Cast, IntImm, Mul, PrimExpr
from kiln.tir.transform import substitute

THREADS = 16  # threads per block along each of the two axes of a tile
SHARED_PANEL = 32 * 1024  # bytes of one staged weight panel at most (two panels fit the default 48 KiB)
MIN_BLOCKS = 132  # blocks that give every multiprocessor of an H100-class device one


def _product_tiles(batch: int, m: int, n: int) -> tuple[int, int]:
    """Per-thread rows and columns (tm, tn) of a product's register tile: the largest of 8, 4, 2 whose
    grid still has `MIN_BLOCKS` blocks (or 2, for a small product: a 1-wide tile reuses nothing it loads).
    """
    for t in (8, 4):
        side = THREADS * t
        if batch * -(-m // side) * -(-n // side) >= MIN_BLOCKS:
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
    c = summed(sch, anchor_outs[0], outs)
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
    mb, mr = stage.split(sm, factor=THREADS * tm)
    mt, mi = stage.split(mr, factor=tm)
    nb, nr = stage.split(sn, factor=THREADS * tn)
    nt, ni = stage.split(nr, factor=tn)
    stage.reorder(*batch, mb, nb, mt, nt, mi, ni)
    _bind_blocks(stage, batch, mb, nb)
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
        stage_panel(sch, operand, local, ko, _k_first(local.op, operand))


def _bind_blocks(stage: te.Stage, batch: Sequence[Any], rows: Any, cols: Any) -> None:
    """A product's grid: its batch axes (fused) on blockIdx.z, its row and column tiles on y and x."""
    if batch:
        stage.bind(stage.fuse(*batch) if len(batch) > 1 else batch[0], te.thread_axis("blockIdx.z"))
    stage.bind(rows, te.thread_axis("blockIdx.y"))
    stage.bind(cols, te.thread_axis("blockIdx.x"))


def stage_panel(sch: te.Schedule, operand: te.Tensor, local: te.Stage, step: Any, axes: Any,
                 order: Sequence[int] | None = None) -> None:
    """A shared copy of what `local` reads of `operand` in one iteration of `step` (laid out by `axes`),
    filled by the block's 16 x 16 threads together, each copying every 256th element; `order` (of the
    copy's axes) puts the operand's own innermost axis innermost where `axes` moved it, so that a warp
    reads consecutive addresses of global memory."""
    fill = sch[sch.cache_read(operand, "shared", [local], axes=axes)]
    fill.compute_at(local, step)
    copy = [fill.op.axis[i] for i in order] if order is not None else list(fill.op.axis)
    fill.reorder(*copy)
    flat = fill.fuse(*copy) if len(copy) > 1 else copy[0]
    rest, tx = fill.split(flat, factor=THREADS)
    _, ty = fill.split(rest, factor=THREADS)
    fill.bind(ty, te.thread_axis("threadIdx.y"))
    fill.bind(tx, te.thread_axis("threadIdx.x"))


# --- tensor cores: float16 and bfloat16 products through mma.sync ---------------------------------------

TENSORCORE_DTYPES = ("float16", "bfloat16")  # the operand dtypes of mma.sync.m16n8k16 with float32 sums
TENSORCORE = "kiln.tensorcore"  # ComputeOp attr of a product's fragment stage: its `Tiles`
_WARP_M, _WARP_N = 64, 64  # a warp's tile: 4 x 8 tiles of 16 x 8, 128 float32 accumulators per thread
Tiles = tuple[int, int, int, int]  # (bm, bn) of a block, (wm, wn) of a warp


def _tensorcore_tiles(batch: int, m: int, n: int, k: int) -> Tiles | None:
    """The tiles of a product, or None where it does not divide into tensor-core tiles.

    On an H100, 4096^3: 64 x 64 warp tiles in 128 x 128 blocks ran at 260 TFLOP/s where
    64 x 32 ran at 177, 128 x 256 and 256 x 128 blocks at 157 and 166 (one sweep, float16 inputs).
    """
    if m % _WARP_M or n % _WARP_N or k % 16:
        return None
    bm = 128 if m % 128 == 0 and batch * (m // 128) * (n // 64) >= MIN_BLOCKS else 64
    bn = 128 if n % 128 == 0 and batch * (m // bm) * (n // 128) >= MIN_BLOCKS else 64
    return bm, bn, _WARP_M, _WARP_N


def _panel_step(k: int, bm: int, bn: int, target: Any) -> int:
    """The step through k: the largest of 64, 32, 16 dividing k whose panels (rows padded by 8 halves, either
    layout) fit the target's shared memory per block."""
    limit = int(target.get("max-shared-memory-per-block", 48 * 1024)) if target is not None else 48 * 1024
    for bk in (64, 32, 16):
        if k % bk == 0 and 2 * ((bm + 8) * (bk + 8) + (bn + 8) * (bk + 8)) <= limit:
            return bk
    return 16


def _operands(op: te.ComputeOp) -> tuple[PrimExpr, PrimExpr] | None:
    """The two factors of a product `sum(a * b)` whose inputs are both float16 or both bfloat16, each
    without its conversion."""
    body = op.body
    if not isinstance(body, Reduce) or body.combiner.name != "sum" or not _true(body.condition):
        return None
    src = body.source
    if not isinstance(src, Mul):
        return None
    factors = [f.value if isinstance(f, Cast) else f for f in (src.a, src.b)]
    if not all(isinstance(f, BufferLoad) for f in factors) or factors[0].dtype != factors[1].dtype \
            or factors[0].dtype not in TENSORCORE_DTYPES:
        return None
    return factors[0], factors[1]


def _true(cond: PrimExpr) -> bool:
    return isinstance(cond, IntImm) and bool(cond.value)


def tensorcore(compute: Any) -> Any:
    """A product's compute for tensor cores: `compute`'s product, recomputed in the layout of mma.sync.

    The product `p[..., m, n] = sum(a[..., m, k] * b[..., k, n])` that `compute` returns
    becomes two stages: the fragment stage, float32 sums indexed as each warp's lanes hold
    them (block row and column, warp row and column, lane, then the lane's 4 x 8 tiles and
    its 2 x 2 values in each), and `p` read back from it and converted to p's dtype. Where
    the shapes do not divide into tiles (m a multiple of 64, n of 64, k of 16) or are
    symbolic, `compute`'s product is returned as it is and gets the tiled schedule.
    """
    def product(attrs: Any, inputs: list[te.Tensor], out_type: Any) -> list[te.Tensor]:
        (p,) = compute(attrs, inputs, out_type)
        frag = _fragment_stage(narrowed_total(p) or p, p)
        return [p] if frag is None else [frag]
    return product


def _fragment_stage(total: te.Tensor, p: te.Tensor) -> te.Tensor | None:
    """The fragment stage of product `total` and its read-back as `p` (the product, or its narrowing)."""
    op = total.op
    dims = static_size(p) and tensor_shape(p)
    if not isinstance(op, te.ComputeOp) or not dims or len(dims) < 2 or len(op.reduce_axis) != 1:
        return None
    factors = _operands(op)
    k_axis = op.reduce_axis[0]
    assert k_axis.dom is not None
    k_extent = k_axis.dom.extent
    if factors is None or not isinstance(k_extent, IntImm):
        return None
    *batch, m, n = (int(d) for d in dims)
    tiles = _tensorcore_tiles(math.prod(batch), m, n, int(k_extent.value))
    if tiles is None:
        return None
    bm, bn, tm, tn = tiles
    k = te.reduce_axis((0, int(k_extent.value)), name="k")
    shape = (*batch, m // bm, n // bn, bm // tm, bn // tn, 32, tm // 16, tn // 8, 2, 2)

    def fragment(*i: PrimExpr) -> PrimExpr:
        *b, mb, nb, wm, wn, lane, mi, ni, h, j = i
        row = mb * bm + wm * tm + mi * 16 + h * 8 + lane // 4
        col = nb * bn + wn * tn + ni * 8 + lane % 4 * 2 + j
        vmap = {**{ax.var: v for ax, v in zip(op.axis, (*b, row, col), strict=True)}, k_axis.var: k}
        x, y = (substitute(f, vmap) for f in factors)
        return te.sum(te.cast(x, "float32") * te.cast(y, "float32"), axis=k)

    acc = te.compute(shape, fragment, name=f"{op.name}_fragments", attrs={TENSORCORE: tiles})

    def read_back(*i: PrimExpr) -> PrimExpr:
        *b, mm, nn = i
        at = (mm // bm, nn // bn, mm % bm // tm, nn % bn // tn, mm % 8 * 4 + nn % 8 // 2,
              mm % tm // 16, nn % tn // 8, mm % 16 // 8, nn % 2)
        return te.cast(acc[tuple(b) + at], p.dtype)

    return te.compute(dims, read_back, name=p.op.name)


def schedule_tensorcore(sch: te.Schedule, anchor_outs: Sequence[te.Tensor], outs: Sequence[te.Tensor],
                        target: Any) -> None:
    """A float16 or bfloat16 product on tensor cores (`tensorcore`'s stages), else the tiled schedule.

    Each block computes a bm x bn tile of the output with (bm / 64) x (bn / 64) warps;
    each warp a 64 x 64 tile, as 4 x 8 `mma.sync.m16n8k16` tiles whose float32
    accumulators stay in its lanes' registers (the fragment stage, computed at the
    lane's loop). The reduction steps through k in panels of bk: the block's threads
    copy the bm x bk part of a and the bk x bn part of b into shared memory in the
    operands' own layouts (reads along their rows stay coalesced) with each row
    padded by 8 halves (16 bytes: the rows that a fragment load reads fall in
    different banks), then each warp runs its 32 products per 16 k, its fragments
    loaded by ldmatrix where the panel allows (`kiln.codegen.cuda_mma`).
    The nest of a 16 x 8 tile's 2 x 2 x 16 multiply-adds is marked `kiln.mma` and
    becomes one tensor-core instruction (`kiln.tir.mma`). The epilogue reads the
    accumulators back as each lane holds them.
    """
    (c,) = anchor_outs
    frag = next((t.op for t in c.op.input_tensors if isinstance(t.op, te.ComputeOp) and t.op.attrs.get(TENSORCORE)),
                None) if isinstance(c.op, te.ComputeOp) else None
    if frag is None:
        schedule_product(sch, anchor_outs, outs, target)
        return
    acc = frag.output()
    bm, bn, tm, tn = frag.attrs[TENSORCORE]
    k_extent = frag.reduce_axis[0].dom.extent if frag.reduce_axis[0].dom is not None else None
    assert isinstance(k_extent, IntImm), "tensorcore() makes fragment stages of a static k"
    bk = _panel_step(int(k_extent.value), bm, bn, target)
    tiled, _ = split_epilogue(sch, c, outs)
    if tiled is not c:
        sch[c].compute_inline()
    stage = sch[tiled]
    *batch, sm, sn = stage.op.axis
    mb, mr = stage.split(sm, factor=bm)
    wm, mr = stage.split(mr, factor=tm)
    mi, mr = stage.split(mr, factor=16)
    h, g = stage.split(mr, factor=8)
    nb, nr = stage.split(sn, factor=bn)
    wn, nr = stage.split(nr, factor=tn)
    ni, nr = stage.split(nr, factor=8)
    t, j = stage.split(nr, factor=2)
    stage.reorder(*batch, mb, nb, wm, wn, g, t, mi, ni, h, j)
    _bind_blocks(stage, batch, mb, nb)
    stage.bind(wm, te.thread_axis("threadIdx.z"))
    stage.bind(wn, te.thread_axis("threadIdx.y"))
    lane = stage.fuse(g, t)
    stage.bind(lane, te.thread_axis("threadIdx.x"))
    for axis in (mi, ni, h, j):
        stage.unroll(axis)

    sch[acc].set_scope("local")
    local = sch[acc]
    local.compute_at(stage, lane)
    *outer, fm, fn, fh, fj = local.op.axis
    ko, kr = local.split(local.op.reduce_axis[0], factor=bk)
    kk, k16 = local.split(kr, factor=16)
    local.reorder(*outer, ko, kk, fm, fn, fh, fj, k16)
    for axis in (kk, fm, fn):
        local.unroll(axis)
    local.pragma(fh, "kiln.mma")
    for operand in dict.fromkeys(local.op.input_tensors):
        fill = sch[sch.cache_read(operand, "shared", [local])]  # the operand's layout: coalesced reads
        fill.compute_at(local, ko)
        fill.storage_align(fill.op.axis[-2], 16, 8)  # rows 16 bytes past a multiple of 32: other banks
        *rows, last = fill.op.axis
        lo, vec = fill.split(last, factor=8)  # 8 halves: one 16-byte copy per thread, asynchronous (cp.async)
        fill.vectorize(vec)
        fill.pragma(vec, ASYNC_COPY)
        flat = fill.fuse(*rows, lo)
        rest, tx = fill.split(flat, factor=32)
        rest, ty = fill.split(rest, factor=bn // tn)
        _, tz = fill.split(rest, factor=bm // tm)
        fill.bind(tz, te.thread_axis("threadIdx.z"))
        fill.bind(ty, te.thread_axis("threadIdx.y"))
        fill.bind(tx, te.thread_axis("threadIdx.x"))

