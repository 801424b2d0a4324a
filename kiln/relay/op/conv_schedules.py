"""The CPU forms of nn.conv2d for NCHW data: register-tiled micro-kernels for the convolutions of CNNs.

`conv2d_cpu_compute` picks a form per call (the "tiled" implementation of
`kiln.relay.op.conv` calls it), `conv2d_cpu_schedule` schedules the form it
picked (the NCHW output's compute carries the form's name in its attrs). Each
form computes into a tile stage that its schedule places inside the loops of
the group's output (the conv itself, or its elementwise epilogue: bias,
activation, residual add), so the tile is written back from registers once,
epilogue applied:

- "ovec" (NCHW convolutions without groups): vectorized over output channels.
  The weight is read in blocks of L output channels, (O/L, C, KH, KW, L)
  (L lanes: 16 float32): a constant weight is packed so at build time
  (`FAlterOpLayout`, kernel layout OIHW<L>o), any other by a stage of the
  kernel. The tile holds `bo` channel vectors x `bx` output positions of one
  row (up to 24 accumulators) and each step of the (C, KH, KW) reduction
  loads `bo` weight vectors and broadcasts `bx` input values straight from
  NCHW, so strides, dilation and odd widths cost nothing. The tile stage is
  padded to whole tiles (a zero weight block, a few extra columns of padded
  input), so its loops carry no guards; only the write-back skips the padding.
- "pixels" (1x1, stride 1, few input channels): vectorized along the output
  row, `bo` channels x `nv` vectors, each weight a broadcast scalar; the
  output is stored in whole vectors where "ovec" stores an element at a time.
- "depthwise" (groups == input channels): vectorized along the output row,
  `by` rows x `nv` vectors of a channel in registers, one broadcast weight
  per tap. The padded input is made per channel, right before the channel's
  tiles read it (so it is in cache), one plane per phase of a column stride.

Zero padding is a copy stage whose loops tir's loop partitioning cuts where
the padding starts and ends (`PARTITION_SELECTS`), so the copy in between is a
plain vectorized loop. Other convolutions (grouped but not depthwise, NHWC,
a tail of output channels that the tiles cannot cover) keep the row-vectorized
compute of `kiln.relay.op.conv`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from kiln import te
from kiln.relay.op._nn_util import clamp, dtype_of, static_shape, tensor_shape
from kiln.relay.op._schedule import KEEP, divisor_at_most, op_attr, split_epilogue, vector_lanes
from kiln.tir import expr as tx
from kiln.tir.expr import PrimExpr
from kiln.tir.transform import PARTITION_SELECTS

FORM = "conv2d.form"  # attr of the NCHW output's compute: which form of this module computed it
_MAX_ACC = 24  # accumulators of a tile: 32 vector registers, less the operands of one step
_UNROLL_TAPS = 3  # kernel widths up to this are unrolled in the micro-kernel (with a column stride of 1)
_STAGE_TILE_WORK = 1024  # multiply-adds per output from which the tile is written back through memory
_PIXELS_MAX_C = 192  # input channels up to which a 1x1 convolution may be vectorized along the row
_PANEL_TASKS = 8  # channel tiles from which they, not rows, run on the cores (each packing its weights)

Compute = Callable[[Any, list[te.Tensor], Any], list[te.Tensor]]
KernelAt = Callable[[PrimExpr, PrimExpr, PrimExpr, PrimExpr], PrimExpr]  # (o, i, ky, kx) -> the weight there


def packed_block(dtype: str) -> int:
    """The output channels per block of the weight layout OIHW<b>o that the "ovec" form reads as it is."""
    return vector_lanes(dtype)


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def padded_input(data: te.Tensor, pads: tuple[int, int], size_hw: tuple[int, int], stride: int = 1,
                 phase: int = 0) -> te.Tensor:
    """Columns `phase`, `phase + stride`, ... of `data` (NCHW) in a `size_hw` plane with zeros around it
    (`pads` (top, left) before it, the rest after): the plane a stride-`stride` window reads at
    `phase`, so that the window's reads are contiguous. `data` itself when that adds nothing.
    """
    n, c, h, w = tensor_shape(data)
    (pt, pl), (hp, wp) = pads, size_hw
    if (pt, pl, hp, wp, stride) == (0, 0, h, w, 1):
        return data
    zero = te.const(0, data.dtype)

    def at(b: PrimExpr, ch: PrimExpr, y: PrimExpr, x: PrimExpr) -> PrimExpr:
        conds: list[PrimExpr] = []
        coords: list[PrimExpr] = []
        col = x * stride + phase - pl
        for v, size, guard in ((y - pt, h, pt > 0 or hp > h), (col, w, True)):
            if guard:  # a select may evaluate both sides: the load's index stays in bounds
                conds += [v >= 0, v < size]
                v = clamp(v, size)
            coords.append(v)
        value = data[b, ch, coords[0], coords[1]]
        return te.if_then_else(tx.all_of(*conds), value, zero)

    name = "pad" if stride == 1 else f"pad_phase{phase}"
    return te.compute((n, c, hp, wp), at, name=name, attrs={KEEP: True})


def _schedule_pad(sch: te.Schedule, pad: te.Tensor, parallel: bool) -> None:
    """The copy loop of a padded input: cut where the padding starts and ends (the copy in between
    vectorized), its rows on the cores when it is made at the root."""
    stage = sch[pad]
    *outer, y, x = stage.op.axis
    if parallel:
        stage.parallel(stage.fuse(*outer, y))
    else:
        stage.pragma(y, PARTITION_SELECTS)
    stage.pragma(x, PARTITION_SELECTS)
    stage.vectorize(x)


def _inline_anchor(sch: te.Schedule, c: te.Tensor, outs: Sequence[te.Tensor]) -> te.Stage:
    """The stage whose loops carry the tiles: the group's epilogue (the NCHW anchor, a plain
    read of the blocked stage, inlined into it), else the anchor itself."""
    tiled, _ = split_epilogue(sch, c, outs)
    if tiled.op is not c.op:
        sch[c].compute_inline()
    return sch[tiled]


# --- "ovec": vectorized over output channels ------------------------------------------------------


def ovec_tiles(o: int, ow: int, lanes: int) -> tuple[int, int] | None:
    """(bo channel vectors, bx positions) of the register tile; None where no tile covers O.

    Least work first (the blocked stage is padded to whole tiles in x), then more
    accumulators, then fewer loads per FMA. bo divides the channel blocks, and a
    tail of channels (O not a multiple of L) only fits a tile of all blocks:
    a guarded write-back of an unrolled tail leaves bounds the checker cannot
    follow.
    """
    blocks = _ceil(o, lanes)
    best: tuple[tuple[int, int, float], tuple[int, int]] | None = None
    for bo in range(1, 5):
        if blocks % bo or (o % lanes and bo != blocks):
            continue
        for bx in range(1, _MAX_ACC // bo + 1):
            key = (_ceil(ow, bx) * bx, -bo * bx, (bo + bx) / (bo * bx))
            if best is None or key < best[0]:
                best = (key, (bo, bx))
    return None if best is None else best[1]


def ovec_compute(data: te.Tensor, weight: te.Tensor, attrs: Any, shape: tuple[int, ...], dtype: str,
                 kernel: tuple[int, int, int, int], kernel_at: KernelAt, block: int) -> te.Tensor | None:
    """The convolution as a (N, O/L, OH, OWp, L) sum over the packed weight, read back as NCHW.

    A weight already in blocks of L output channels (`block`, from AlterOpLayout) is read as it
    is; any other is packed by a stage of the kernel (`kernel_at` reads it, `kernel` is its
    (O, I, KH, KW)).
    """
    n, c, h, w = tensor_shape(data)
    o, _, kh, kw = kernel
    _, _, oh, ow = shape
    lanes = vector_lanes(dtype)
    tiles = ovec_tiles(o, ow, lanes)
    if tiles is None:
        return None
    _, bx = tiles
    blocks, owp = _ceil(o, lanes), _ceil(ow, bx) * bx
    (sh, sw), (dh, dw) = attrs.strides, attrs.dilation
    pt, pl, pb, pr = attrs.padding
    hp = max(h + pt + pb, (oh - 1) * sh + (kh - 1) * dh + 1)
    wp = max(w + pl + pr, (owp - 1) * sw + (kw - 1) * dw + 1)  # the padded tile's last columns read zeros
    pad = padded_input(data, (pt, pl), (hp, wp))
    zero = te.const(0, dtype)

    def pack(blk: PrimExpr, ci: PrimExpr, ky: PrimExpr, kx: PrimExpr, lane: PrimExpr) -> PrimExpr:
        oc = blk * lanes + lane
        if o % lanes == 0:
            return te.cast(kernel_at(oc, ci, ky, kx), dtype)
        return te.if_then_else(oc < o, te.cast(kernel_at(tx.min_(oc, o - 1), ci, ky, kx), dtype), zero)

    packed = weight if block == lanes else \
        te.compute((blocks, c, kh, kw, lanes), pack, name="weight_packed", attrs={KEEP: True})
    rc, ry, rx = te.reduce_axis((0, c), "rc"), te.reduce_axis((0, kh), "ry"), te.reduce_axis((0, kw), "rx")

    def conv(b: PrimExpr, blk: PrimExpr, y: PrimExpr, x: PrimExpr, lane: PrimExpr) -> PrimExpr:
        v = te.cast(pad[b, rc, y * sh + ry * dh, x * sw + rx * dw], dtype)
        return te.sum(v * te.cast(packed[blk, rc, ry, rx, lane], dtype), axis=[rc, ry, rx])

    blocked = te.compute((n, blocks, oh, owp, lanes), conv, name="conv2d_blocked")
    staged = te.compute(blocked.shape, lambda *i: blocked[i], name="conv2d_tile", attrs={KEEP: True})
    return te.compute(shape, lambda b, oc, y, x: staged[b, oc // lanes, y, x, oc % lanes], name="conv2d",
                      attrs={FORM: "ovec", "tiles": tiles, "blocked": blocked, "staged": staged, "packed": packed,
                             "pad": pad, "unroll_taps": sw == 1 and kw <= _UNROLL_TAPS,
                             "stage_tile": c * kh * kw >= _STAGE_TILE_WORK})


def ovec_schedule(sch: te.Schedule, c: te.Tensor, outs: Sequence[te.Tensor]) -> None:
    """Per tile, the (C, KH, KW) reduction over bo x bx accumulators (a kernel row of 3 taps with
    stride 1 unrolled: neighbouring taps share broadcasts), then the write-back to NCHW with the
    epilogue.

    The write-back transposes bo * L channels x bx positions. For short reductions it is fully
    unrolled from the registers (LLVM turns it into 4x4 transposes and short vector stores, the
    fastest way, but large code that takes LLVM a second); from `_STAGE_TILE_WORK`
    multiply-adds per output, where it is a few per cent of the time, the tile is stored to a
    local buffer and written back by a loop (a third of the compile time).

    With few channel tiles (large images), row tiles of channel tiles run on the cores (a weight
    packed per run, at the root, first). With many (the deep, small layers, with large
    weights), channel tiles run on the cores, each packing its own panel of a weight that
    AlterOpLayout did not pack right before its rows read it, from cache.
    """
    bo, bx = op_attr(c, "tiles")
    blocked, packed, pad = op_attr(c, "blocked"), op_attr(c, "packed"), op_attr(c, "pad")
    lanes = vector_lanes(c.dtype)
    stage = _inline_anchor(sch, c, outs)
    n, o, y, x = stage.op.axis
    oo, oi = stage.split(o, factor=bo * lanes)
    xo, xi = stage.split(x, factor=bx)
    stage.reorder(n, oo, y, xo, oi, xi)
    batch, blocks = (int(d.value) for d in blocked.shape[:2])
    panels = batch * blocks // bo >= _PANEL_TASKS
    tasks = stage.fuse(n, oo) if panels else stage.fuse(n, oo, y)
    stage.parallel(tasks)
    stage.unroll(xi)
    staged = sch[op_attr(c, "staged")]
    if op_attr(c, "stage_tile"):
        staged.compute_at(stage, xo)
        staged.set_scope("local")
        _, sb, _, sx, sl = staged.op.axis
        staged.unroll(sb)
        staged.unroll(sx)
        staged.vectorize(sl)
    else:
        stage.unroll(oi)
        staged.compute_inline()
    tile = sch[blocked]
    tile.compute_at(stage, xo)
    tile.set_scope("local")
    tn, tb, ty, tx_, tl = tile.op.axis
    rc, ry, rx = tile.op.reduce_axis
    tile.reorder(tn, ty, rc, ry, rx, tb, tx_, tl)
    tile.unroll(tb)
    tile.unroll(tx_)
    tile.vectorize(tl)
    if op_attr(c, "unroll_taps"):
        tile.unroll(rx)
    if op_attr(packed, KEEP):
        pk = sch[packed]
        if panels:
            pk.compute_at(stage, tasks)
        else:
            pk.parallel(pk.fuse(*pk.op.axis[:2]))
    if op_attr(pad, KEEP):
        _schedule_pad(sch, pad, parallel=True)


# --- "depthwise": one channel per group, vectorized along the output row --------------------------


def depthwise_tiles(oh: int, ow: int, lanes: int) -> tuple[int, int]:
    """(by rows, nv vectors) of the register tile: whole rows of up to 8 vectors, by dividing OH."""
    vectors = _ceil(ow, lanes)
    nv = next(v for v in range(min(vectors, 8), 0, -1) if vectors % v == 0)
    return divisor_at_most(oh, max(1, 16 // nv)), nv


def depthwise_compute(data: te.Tensor, weight: te.Tensor, attrs: Any, shape: tuple[int, ...],
                      dtype: str) -> te.Tensor:
    """Each output channel's window sum over its input channel, in rows padded to whole vectors.

    With a column stride, the padded input is made as one plane per phase of the stride, so each
    tap reads its plane contiguously; the taps of a kernel row are written out one by one (each
    reads its own plane).
    """
    n, c, h, _ = tensor_shape(data)
    o, _, kh, kw = tensor_shape(weight)
    _, _, oh, ow = shape
    lanes = vector_lanes(dtype)
    by, nv = depthwise_tiles(oh, ow, lanes)
    owp = _ceil(ow, nv * lanes) * nv * lanes
    (sh, sw), (dh, dw) = attrs.strides, attrs.dilation
    pt, pl, pb, _ = attrs.padding
    hp = max(h + pt + pb, (oh - 1) * sh + (kh - 1) * dh + 1)
    wq = owp + (kw - 1) * dw // sw  # columns of each phase plane the padded tile reads
    phases = sorted({k * dw % sw for k in range(kw)})  # the planes some tap reads
    pads = {phase: padded_input(data, (pt, pl), (hp, wq), sw, phase) for phase in phases}
    mult = o // c  # output channels per input channel
    ry = te.reduce_axis((0, kh), "ry")

    def conv(b: PrimExpr, oc: PrimExpr, y: PrimExpr, x: PrimExpr) -> PrimExpr:
        ch = oc // mult if mult > 1 else oc
        terms = [te.cast(pads[kx * dw % sw][b, ch, y * sh + ry * dh, x + kx * dw // sw], dtype)
                 * te.cast(weight[oc, 0, ry, kx], dtype) for kx in range(kw)]
        total = terms[0]
        for t in terms[1:]:
            total = total + t
        return te.sum(total, axis=[ry])

    rows = te.compute((n, o, oh, owp), conv, name="conv2d_depthwise")
    return te.compute(shape, lambda b, oc, y, x: rows[b, oc, y, x], name="conv2d",
                      attrs={FORM: "depthwise", "tiles": (by, nv), "rows": rows, "pads": list(pads.values())})


def depthwise_schedule(sch: te.Schedule, c: te.Tensor, outs: Sequence[te.Tensor]) -> None:
    """Channels on the cores; per channel its padded plane, then by x nv tiles with the taps unrolled."""
    by, nv = op_attr(c, "tiles")
    rows = op_attr(c, "rows")
    lanes = vector_lanes(c.dtype)
    stage = _inline_anchor(sch, c, outs)
    n, o, y, x = stage.op.axis
    yo, yi = stage.split(y, factor=by)
    xo, xi = stage.split(x, factor=nv * lanes)
    xv, xl = stage.split(xi, factor=lanes)
    stage.reorder(n, o, yo, xo, yi, xv, xl)
    channel = stage.fuse(n, o)
    stage.parallel(channel)
    stage.unroll(yi)
    stage.unroll(xv)
    stage.vectorize(xl)
    _row_tile(sch, rows, stage, xo, 2, lanes)  # rows of one channel
    for pad in op_attr(c, "pads"):
        if op_attr(pad, KEEP):
            sch[pad].compute_at(stage, channel)
            _schedule_pad(sch, pad, parallel=False)


# --- "pixels": a 1x1 convolution vectorized along the output row ----------------------------------


def pixel_tiles(o: int, ow: int, lanes: int) -> tuple[int, int]:
    """(bo channels, nv vectors of a row) of the register tile: the row in as few tiles as it takes
    (a last, partial vector masked), then as many channels as 24 accumulators allow."""
    vectors = _ceil(ow, lanes)
    nv = _ceil(vectors, _ceil(vectors, 6))  # rows of up to 6 vectors in one tile, longer ones in equal tiles
    return divisor_at_most(o, _MAX_ACC // nv), nv


def pixels_compute(data: te.Tensor, shape: tuple[int, ...], dtype: str, kernel: tuple[int, int, int, int],
                   kernel_at: KernelAt) -> te.Tensor:
    """out[n, o, y, x] = sum over c of W[o, c] * X[n, c, y, x]: each weight a broadcast scalar, the
    input and the output contiguous along x."""
    rc = te.reduce_axis((0, kernel[1]), "rc")
    tap = tx.const(0)

    def conv(b: PrimExpr, oc: PrimExpr, y: PrimExpr, x: PrimExpr) -> PrimExpr:
        weight = te.cast(kernel_at(oc, rc, tap, tap), dtype)
        return te.sum(te.cast(data[b, rc, y, x], dtype) * weight, axis=rc)

    rows = te.compute(shape, conv, name="conv2d_pixels")
    tiles = pixel_tiles(shape[1], shape[3], vector_lanes(dtype))
    return te.compute(shape, lambda b, oc, y, x: rows[b, oc, y, x], name="conv2d",
                      attrs={FORM: "pixels", "tiles": tiles, "rows": rows})


def pixels_schedule(sch: te.Schedule, c: te.Tensor, outs: Sequence[te.Tensor]) -> None:
    """Row tiles of channel tiles on the cores; per tile, bo x nv accumulators over the C input channels.

    The tiles of a row are a loop of their own, outside the parallel one, so that loop partitioning
    takes the last, partial vector's guard out of the other tiles.
    """
    bo, nv = op_attr(c, "tiles")
    rows = op_attr(c, "rows")
    lanes = vector_lanes(c.dtype)
    stage = _inline_anchor(sch, c, outs)
    n, o, y, x = stage.op.axis
    oo, oi = stage.split(o, factor=bo)
    xo, xi = stage.split(x, factor=nv * lanes)
    xv, xl = stage.split(xi, factor=lanes)
    stage.reorder(n, y, oo, xo, oi, xv, xl)  # channel tiles inside rows: a row of input stays in cache
    stage.parallel(stage.fuse(n, y, oo))
    stage.unroll(oi)
    stage.unroll(xv)
    stage.vectorize(xl)
    _row_tile(sch, rows, stage, xo, 1, lanes)  # one row of several channels


def _row_tile(sch: te.Schedule, rows: te.Tensor, stage: te.Stage, at: Any, tiled: int, lanes: int) -> None:
    """The register tile of the row forms ("pixels", "depthwise"), computed at `at` of `stage`: the
    reduction outermost, then axis `tiled` of the tile (rows or channels) and the vectors of its row
    unrolled, the lanes vectorized."""
    tile = sch[rows]
    tile.compute_at(stage, at)
    tile.set_scope("local")
    axis = tile.op.axis[tiled]
    (r,) = tile.op.reduce_axis
    txv, txl = tile.split(tile.op.axis[-1], factor=lanes)
    tile.reorder(r, axis, txv, txl)
    tile.unroll(axis)
    tile.unroll(txv)
    tile.vectorize(txl)


# --- choosing and scheduling a form ---------------------------------------------------------------


def _pixels_pay(attrs: Any, kernel: tuple[int, int, int, int], shape: tuple[int, ...], lanes: int) -> bool:
    """Whether "pixels" takes a convolution: 1x1 over the input as it is (stride 1, no padding), with
    few input channels ("ovec" writes each output element back from a channel vector, a scalar store
    per C multiply-adds: most of its time for small C, where "pixels" stores whole vectors), and rows
    whose last vector is whole or half (LLVM vectorizes a loop of 12 lanes as 8 + 4 scalar, and the
    accumulators then stay in memory)."""
    one_by_one = kernel[2:] == (1, 1) and attrs.strides == (1, 1) and not any(attrs.padding)
    return one_by_one and kernel[1] <= _PIXELS_MAX_C and shape[3] % lanes in (0, lanes // 2)


def conv2d_cpu_compute(attrs: Any, inputs: list[te.Tensor], out_type: Any, *, fallback: Compute,
                       kernel: tuple[int, int, int, int], kernel_at: KernelAt, block: int) -> list[te.Tensor]:
    """The form for this convolution (see the module docstring); `fallback`'s compute for the rest.

    Args:
        attrs: the call's Conv2DAttrs.
        inputs: data and weight.
        out_type: the call's type.
        fallback: the compute of the convolutions no form here takes.
        kernel: the weight's (O, I, KH, KW), whatever its layout.
        kernel_at: reads the weight at (o, i, ky, kx).
        block: b of a weight in layout OIHW<b>o, else 0.

    Returns:
        The output tensor.
    """
    data, weight = inputs
    if attrs.data_layout != "NCHW" or not (attrs.kernel_layout == "OIHW" or block):
        return fallback(attrs, inputs, out_type)
    shape = static_shape(out_type)
    dtype = dtype_of(out_type)
    c = tensor_shape(data)[1]
    out: te.Tensor | None = None
    if attrs.groups == 1 and _pixels_pay(attrs, kernel, shape, vector_lanes(dtype)):
        out = pixels_compute(data, shape, dtype, kernel, kernel_at)
    elif attrs.groups == 1:
        out = ovec_compute(data, weight, attrs, shape, dtype, kernel, kernel_at, block)
    elif attrs.groups == c and shape[1] % c == 0 and not block:
        out = depthwise_compute(data, weight, attrs, shape, dtype)
    return [out] if out is not None else fallback(attrs, inputs, out_type)


def conv2d_cpu_schedule(sch: te.Schedule, anchor_outs: Sequence[te.Tensor], outs: Sequence[te.Tensor],
                        target: Any, fallback: Callable[..., None]) -> None:
    """Schedules the form `conv2d_cpu_compute` picked; `fallback` schedules the rest."""
    (c,) = anchor_outs
    form = op_attr(c, FORM)
    if form == "ovec":
        ovec_schedule(sch, c, outs)
    elif form == "pixels":
        pixels_schedule(sch, c, outs)
    elif form == "depthwise":
        depthwise_schedule(sch, c, outs)
    else:
        fallback(sch, anchor_outs, outs, target)
