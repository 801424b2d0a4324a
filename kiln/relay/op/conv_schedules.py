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
- "stem" (no groups, up to `_STEM_MAX_C` input channels, a window larger than
  1x1: the first convolution of a CNN): vectorized along the output row, `bo`
  channels x `nv` vectors, each weight a broadcast scalar, each tap a
  contiguous load from the phase planes of the padded input (`phase_planes`:
  a column stride reads no gathers), made per row of outputs inside the
  parallel loop, so that the tile indexes them from constants (indexed from
  the row on the cores, LLVM could not prove the int32 offsets from wrapping
  and vectorized the tile behind overflow checks, its accumulators in
  memory). "ovec" would store each output element alone, after only
  C * KH * KW / L vector multiply-adds (1.7 for a 3x3 over RGB).
- "depthwise" (groups == input channels): vectorized along the output row,
  `by` rows x `nv` vectors of a channel in registers, one broadcast weight
  per tap, the whole kernel unrolled (up to 5x5), so that the tile loads each
  input row once for all its output rows. The padded input is made per
  channel, right before the channel's tiles read it (so it is in cache): one
  plane per phase of a column stride, all phases in one pass over the row
  (`phase_planes`). Phase planes are made a strip of rows at a time; the
  channels of a single tile (7^2) are made and computed in groups.

Zero padding is a copy stage whose loops tir's loop partitioning cuts where
the padding starts and ends (`PARTITION_SELECTS`), so the copy in between is a
plain vectorized loop. Other convolutions (grouped but not depthwise, NHWC,
a tail of output channels that the tiles cannot cover) keep the row-vectorized
compute of `kiln.relay.op.conv`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from kiln import te
from kiln.ir.dtype import DataType
from kiln.ir.types import SymDim, Type
from kiln.relay.op._nn_util import (
    clamp,
    dtype_of,
    narrowed,
    product_sum_dtype,
    shape_dims,
    static_shape,
    tensor_shape,
)
from kiln.relay.op._schedule import KEEP, divisor_at_most, op_attr, split_epilogue, vector_lanes
from kiln.tir import expr as tx
from kiln.tir.expr import PrimExpr
from kiln.tir.transform import PARTITION_SELECTS

T = TypeVar("T")

# Where N, C, H, W sit in each data layout, and O, I, H, W in each kernel layout.
DATA_AXES = {"NCHW": (0, 1, 2, 3), "NHWC": (0, 3, 1, 2)}
KERNEL_AXES = {"OIHW": (0, 1, 2, 3), "HWIO": (3, 2, 0, 1), "IOHW": (1, 0, 2, 3)}


def pick(shape: Sequence[T], axes: tuple[int, ...]) -> tuple[T, ...]:
    """The entries of `shape` at `axes`: e.g. (N, C, H, W) of a shape in a layout, with DATA_AXES[layout]."""
    return tuple(shape[i] for i in axes)


def nchw_shape(n: T, c: T, h: T, w: T, layout: str) -> tuple[T, ...]:
    """(n, c, h, w) in `layout`'s order: a shape, or the index of an element."""
    return (n, c, h, w) if layout == "NCHW" else (n, h, w, c)


def static_kernel_dims(weight: te.Tensor, attrs: Any) -> tuple[int, int, int, int]:
    """(O, I, KH, KW) of a lowered weight tensor."""
    shape = tensor_shape(weight)
    block = attrs.kernel_block
    if block:
        return shape[0] * block, shape[1], shape[2], shape[3]
    o, i, kh, kw = pick(shape, KERNEL_AXES[attrs.kernel_layout])
    return o, i, kh, kw


def kernel_at(weight: te.Tensor, attrs: Any, o: PrimExpr, i: PrimExpr, ky: PrimExpr,
              kx: PrimExpr) -> PrimExpr:
    """The weight of output channel o, input channel i (of its group) and tap (ky, kx), in any kernel layout."""
    block = attrs.kernel_block
    if block:
        return weight[o // block, i, ky, kx, o % block]
    return weight[(o, i, ky, kx) if attrs.kernel_layout == "OIHW" else (ky, kx, i, o)]


def group_channel(o: PrimExpr, i: PrimExpr, attrs: Any, o_total: int, ig: int) -> PrimExpr:
    """The input channel that output channel o reads as the i-th of its group's ig (i itself for one group)."""
    if attrs.groups == 1:
        return i
    og = o_total // attrs.groups
    return (o if og == 1 else o // og) * ig + i


def conv_output(shape: Sequence[Any], layout: str, conv: Callable[..., PrimExpr], out_dtype: str,
                attrs: dict[str, Any] | None = None) -> te.Tensor:
    """nn.conv2d's output over `shape` (in `layout`'s order) from conv(n, o, y, x), a sum in
    `product_sum_dtype(out_dtype)`, converted to out_dtype where they differ (`narrowed`)."""
    name = "conv2d" if product_sum_dtype(out_dtype) == out_dtype else "conv2d_sum"
    if layout == "NCHW":
        total = te.compute(shape, lambda n, o, y, x: conv(n, o, y, x), name=name, attrs=attrs)
    else:
        total = te.compute(shape, lambda n, y, x, o: conv(n, o, y, x), name=name, attrs=attrs)
    return narrowed(total, out_dtype, "conv2d")


FORM = "conv2d.form"  # attr of the NCHW output's compute: which form of this module computed it
_MAX_ACC = 24  # accumulators of a tile: 32 vector registers, less the operands of one step
_UNROLL_TAPS = 3  # kernel widths up to this are unrolled in the micro-kernel (with a column stride of 1)
_STAGE_TILE_WORK = 1024  # multiply-adds per output from which the tile is written back through memory
_PIXELS_MAX_C = 192  # input channels up to which a 1x1 convolution may be vectorized along the row
_PANEL_TASKS = 8  # channel tiles from which they, not rows, run on the cores (each packing its weights)
_STEM_MAX_C = 4  # input channels up to which a convolution may be vectorized along the row ("stem")
_STEM_TASK_CHANNELS = 64  # output rows x channels of a "stem" task at least, where the rows divide OH
_DW_MAX_ACC = 14  # accumulators of a depthwise tile
_DW_UNROLL_TAPS = 25  # kernels up to 5x5 are unrolled whole in the depthwise tile (7x7 keeps a loop of rows)
_DW_STRIP_BYTES = 10 * 1024  # padded input rows made at a time
_DW_GROUP_BYTES = 16 * 1024  # padded input of the channels of one task, when a channel is one tile

Compute = Callable[[Any, list[te.Tensor], Any], list[te.Tensor]]
Batch = int | SymDim | PrimExpr  # a batch dim: static, or symbolic (a relay type's, or the kernel's size variable)
Dims = tuple[Any, ...]  # a shape whose batch dim (the first) is a `Batch`, its other dims ints
KernelAt = Callable[[PrimExpr, PrimExpr, PrimExpr, PrimExpr], PrimExpr]  # (o, i, ky, kx) -> the weight there


def packed_block(dtype: str) -> int:
    """The output channels per block of the weight layout OIHW<b>o that the "ovec" form reads as it is."""
    return vector_lanes(dtype)


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


# --- symbolic batch ------------------------------------------------------------------------------
# The convolutions and pools of a CNN compiled once for any batch size have a symbolic batch dim (N,
# the first in every layout) and static channels and spatial dims, which their tiles are chosen for.
# N only ever sizes a compute's loop (the kernel's size variable, an argument); a schedule decision that
# depends on it takes the smallest batch (1), which keeps the cores busy at any batch size.


def batch_shape(t: te.Tensor) -> Dims:
    """The shape of a te tensor built by lowering: its first dim (the batch) as it is (an int, or a
    symbolic size), the others ints (a symbolic one raises te.TEError, as `tensor_shape`)."""
    if not t.shape or isinstance(t.shape[0], tx.IntImm) or not all(isinstance(d, tx.IntImm) for d in t.shape[1:]):
        return tensor_shape(t)
    return (t.shape[0], *(int(d.value) for d in t.shape[1:] if isinstance(d, tx.IntImm)))


def batch_type_shape(ty: Type) -> Dims:
    """The shape of a tensor type for te: its first dim (the batch) an int or a symbolic dim, the others
    ints (a symbolic one raises te.TEError, as `static_shape`)."""
    dims = shape_dims(ty)
    if dims and isinstance(dims[0], SymDim) and all(isinstance(d, int) for d in dims[1:]):
        return dims
    return static_shape(ty)


def static_batch(d: Batch) -> int:
    """A batch dim for a schedule decision: its value, or 1 where it is symbolic."""
    if isinstance(d, tx.IntImm):
        return int(d.value)
    return d if isinstance(d, int) else 1


def padded_input(data: te.Tensor, pads: tuple[int, int], size_hw: tuple[int, int],
                 hw_axes: tuple[int, int] = (2, 3)) -> te.Tensor:
    """`data` (its rows and columns at `hw_axes`: (2, 3) for NCHW, (1, 2) for NHWC) in a `size_hw` plane
    with zeros around it (`pads` (top, left) before it, the rest after); `data` itself when that adds
    nothing.
    """
    shape = list(batch_shape(data))
    (ya, xa), (pt, pl), (hp, wp) = hw_axes, pads, size_hw
    h, w = shape[ya], shape[xa]
    if (pt, pl, hp, wp) == (0, 0, h, w):
        return data
    zero = te.const(0, data.dtype)

    def at(i0: PrimExpr, i1: PrimExpr, i2: PrimExpr, i3: PrimExpr) -> PrimExpr:
        index = [i0, i1, i2, i3]
        conds: list[PrimExpr] = []
        for axis, before, size, guard in ((ya, pt, h, pt > 0 or hp > h), (xa, pl, w, True)):
            v = index[axis] - before
            if guard:  # a select may evaluate both sides: the load's index stays in bounds
                conds += [v >= 0, v < size]
                v = clamp(v, size)
            index[axis] = v
        return te.if_then_else(tx.all_of(*conds), data[tuple(index)], zero)

    shape[ya], shape[xa] = hp, wp
    return te.compute(tuple(shape), at, name="pad", attrs={KEEP: True})


def _schedule_pad(sch: te.Schedule, pad: te.Tensor) -> None:
    """The copy loop of a padded input, made at the root: its rows on the cores, each row cut where
    the padding starts and ends (the copy in between vectorized)."""
    stage = sch[pad]
    *outer, y, x = stage.op.axis
    stage.parallel(stage.fuse(*outer, y))
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


def ovec_compute(data: te.Tensor, weight: te.Tensor, attrs: Any, shape: Dims, dtype: str,
                 kernel: tuple[int, int, int, int], kernel_at: KernelAt, block: int) -> te.Tensor | None:
    """The convolution as a (N, O/L, OH, OWp, L) sum over the packed weight, read back as NCHW.

    A weight already in blocks of L output channels (`block`, from AlterOpLayout) is read as it
    is; any other is packed by a stage of the kernel (`kernel_at` reads it, `kernel` is its
    (O, I, KH, KW)).
    """
    n, c, h, w = batch_shape(data)
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
    batch, blocks = static_batch(blocked.shape[0]), batch_shape(blocked)[1]  # a symbolic batch: as 1
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
        _schedule_pad(sch, pad)


# --- "depthwise": one channel per group, vectorized along the output row --------------------------


def depthwise_tiles(oh: int, ow: int, lanes: int, row_stride: int = 1) -> tuple[int, int]:
    """(by rows, nv vectors) of the register tile: rows of up to 8 vectors (nv divides the row's
    vectors), by dividing OH, at most `_DW_MAX_ACC` accumulators and 8 rows: with the kernel rows
    unrolled, a tile's input rows are loaded once for all its output rows, and more of them
    spill (LLVM hoists the loads). With a row stride, rows of several vectors are tiles of their
    own: output rows then share few input rows, and on both cores 96 channels of 112^2 (stride 2)
    ran at 56-60 GFLOP/s in tiles of one row, 42-45 in tiles of two."""
    vectors = _ceil(ow, lanes)
    nv = next(v for v in range(min(vectors, 8), 0, -1) if vectors % v == 0)
    if row_stride > 1 and nv > 1:
        return 1, nv
    return divisor_at_most(oh, max(1, min(8, _DW_MAX_ACC // nv))), nv


def depthwise_blocking(plane_rows: int, row_bytes: int, strided: bool, oh: int, sh: int, reach: int,
                       tile: tuple[int, int], one_tile: bool, channels: int) -> tuple[int, int]:
    """(strip, group): output rows whose padded input is made at a time (0: a channel's whole
    planes at once), and channels per task (their planes made together).

    Phase planes (a column stride) are made a strip at a time, of at most `_DW_STRIP_BYTES` of
    input rows (whole tiles of output rows; of the strips that fit, the one that copies the fewest
    rows, counting the rows strips share and a short last strip): the copy then writes lines in L1
    and the tiles read
    them from there, the next strip's copy close behind (on both cores, 96 channels of 112^2 ran
    at 48 instead of 32 GFLOP/s, 144 channels of 56^2 at 41 instead of 20, though their whole
    planes fit L1). A stride-1 plane is made whole: on both cores its strips were slower (100 vs
    55-60 GFLOP/s for 32 channels of 112^2), though faster on one. A channel of one tile (7^2) has
    too little work for a copy and loops of its own: `group` channels share them (up to
    `_DW_GROUP_BYTES` of planes, and at least `_PANEL_TASKS` tasks where the channels allow), and
    the copy of one is long done when its tile reads it (a load of a row just copied waits for the
    stores): 2.2x for 960 channels of 7^2. Not so with phase planes (7^2 from 14^2), which ran 5%
    slower in groups.

    Args:
        plane_rows: rows of a channel's planes.
        row_bytes: bytes of one row of them (all phases).
        strided: whether the columns have a stride (the planes are phases).
        oh: output rows.
        sh: row stride.
        reach: input rows one output row reads ((KH - 1) * dilation + 1).
        tile: (by, nv) of `depthwise_tiles`.
        one_tile: whether a tile covers a channel's output.
        channels: output channels (a group divides them).

    Returns:
        (strip, group).
    """
    by, _ = tile
    strip, group = 0, 1
    if strided and by < oh:
        def copied(s: int) -> tuple[int, int]:  # input rows copied for all strips (a last one may be short)
            return _ceil(oh, s) * ((s - 1) * sh + reach), -s
        fits = [s for s in range(by, oh, by) if ((s - 1) * sh + reach) * row_bytes <= _DW_STRIP_BYTES]
        strip = min(fits, key=copied, default=by)
    if one_tile and not strided:
        most = min(16, _DW_GROUP_BYTES // (plane_rows * row_bytes), channels // _PANEL_TASKS)
        group = divisor_at_most(channels, max(1, most))
    return strip, group


def phase_planes(data: te.Tensor, pads: tuple[int, int], rows: int, stride: int, cols: int) -> te.Tensor:
    """The zero-padded input of a column stride as (N, C, rows, stride, cols): plane p of a row holds
    the columns of phase p, so that a strided window reads each plane contiguously.

    Plane column q of phase p holds input column (q - first) * stride + (p - left) % stride, with
    first = ceil(left / stride): at q, the planes hold the `stride` input columns from
    (q - first) * stride on. One pass over q (the phases unrolled inside it) thus reads whole runs
    of the row, which LLVM loads as one interleaved group (a phase alone is a group with gaps,
    whose last vector LLVM leaves to scalar code), and the padding of every plane starts and ends
    at the same q: conditions on q alone, which loop partitioning cuts. `pads` is (top, left).
    """
    n, c, h, w = batch_shape(data)
    top, left = pads
    first = _ceil(left, stride)
    whole = w // stride  # plane columns from `first` on where every phase holds an input column
    zero = te.const(0, data.dtype)

    def at(b: PrimExpr, ch: PrimExpr, y: PrimExpr, p: PrimExpr, q: PrimExpr) -> PrimExpr:
        row = y - top
        col = (q - first) * stride + (p - left) % stride if stride > 1 else q - first
        value = data[b, ch, clamp(row, h), clamp(col, w)]  # a select evaluates both sides: stay in bounds
        inside = te.if_then_else(tx.all_of(row >= 0, row < h, q >= first, q < first + whole), value, zero)
        if w % stride == 0:
            return inside
        # the last run of the row is partial: it holds the phases below w % stride (p is a constant
        # once the phase loop is unrolled, so each plane keeps its copy or its zero)
        last = tx.all_of(row >= 0, row < h, q >= first + whole, q < first + whole + 1,
                         (p - left) % stride < w % stride)
        return te.if_then_else(last, value, inside)

    return te.compute((n, c, rows, stride, cols), at, name="pad" if stride == 1 else "pad_phases",
                      attrs={KEEP: True})


def depthwise_compute(data: te.Tensor, weight: te.Tensor, attrs: Any, shape: Dims,
                      dtype: str) -> te.Tensor:
    """Each output channel's window sum over its input channel, in rows padded to whole vectors.

    The input is read from its zero-padded copy, one plane per phase of the column stride
    (`phase_planes`), so each tap reads its plane contiguously; a convolution without padding or
    column stride whose rows are whole tiles reads the input itself. The taps of a kernel row are
    written out one by one.
    """
    n, c, h, w = batch_shape(data)
    o, _, kh, kw = tensor_shape(weight)
    _, _, oh, ow = shape
    lanes = vector_lanes(dtype)
    (sh, sw), (dh, dw) = attrs.strides, attrs.dilation
    by, nv = depthwise_tiles(oh, ow, lanes, sh)
    owp = _ceil(ow, nv * lanes) * nv * lanes
    pt, pl, pb, _ = attrs.padding
    hp = max(h + pt + pb, (oh - 1) * sh + (kh - 1) * dh + 1)
    first = _ceil(pl, sw)
    # tap kx reads phase (kx * dw) % sw, at column x + taps[kx] of its plane
    taps = [kx * dw // sw + first - _ceil(pl - kx * dw % sw, sw) for kx in range(kw)]
    wq = owp + max(taps)
    direct = sw == 1 and (pt, pl, hp, wq) == (0, 0, h, w)
    planes = data if direct else phase_planes(data, (pt, pl), hp, sw, wq)
    mult = o // c  # output channels per input channel
    ry = te.reduce_axis((0, kh), "ry")

    def conv(b: PrimExpr, oc: PrimExpr, y: PrimExpr, x: PrimExpr) -> PrimExpr:
        ch = oc // mult if mult > 1 else oc
        row = y * sh + ry * dh
        terms = [te.cast(planes[b, ch, row, x + taps[kx]] if direct else
                         planes[b, ch, row, kx * dw % sw, x + taps[kx]], dtype)
                 * te.cast(weight[oc, 0, ry, kx], dtype) for kx in range(kw)]
        total = terms[0]
        for t in terms[1:]:
            total = total + t
        return te.sum(total, axis=[ry])

    rows = te.compute((n, o, oh, owp), conv, name="conv2d_depthwise")
    strip, group = depthwise_blocking(hp, sw * wq * DataType.of(data.dtype).bytes, sw > 1, oh, sh, (kh - 1) * dh + 1,
                                      (by, nv), by == oh and owp == nv * lanes, o)
    return te.compute(shape, lambda b, oc, y, x: rows[b, oc, y, x], name="conv2d",
                      attrs={FORM: "depthwise", "tiles": (by, nv), "rows": rows, "group": group,
                             "planes": None if direct else planes, "strip": 0 if direct else strip,
                             "unroll_rows": kh * kw <= _DW_UNROLL_TAPS})


def depthwise_schedule(sch: te.Schedule, c: te.Tensor, outs: Sequence[te.Tensor]) -> None:
    """Tasks of `group` channels on the cores; per task (or per strip of a channel's rows) its padded
    planes, then by x nv tiles with the kernel unrolled (its rows too, up to `_DW_UNROLL_TAPS`
    taps)."""
    by, nv = op_attr(c, "tiles")
    rows = op_attr(c, "rows")
    strip, group = op_attr(c, "strip"), op_attr(c, "group")
    lanes = vector_lanes(c.dtype)
    stage = _inline_anchor(sch, c, outs)
    n, o, y, x = stage.op.axis
    oo, oi = stage.split(o, factor=group)
    outer = []
    if strip:
        ys, y = stage.split(y, factor=strip)
        outer.append(ys)
    yo, yi = stage.split(y, factor=by)
    xo, xi = stage.split(x, factor=nv * lanes)
    xv, xl = stage.split(xi, factor=lanes)
    stage.reorder(n, oo, oi, *outer, yo, xo, yi, xv, xl)
    task = stage.fuse(n, oo)
    stage.parallel(task)
    stage.unroll(yi)
    stage.unroll(xv)
    stage.vectorize(xl)
    _row_tile(sch, rows, stage, xo, 2, lanes)  # rows of one channel
    if op_attr(c, "unroll_rows"):
        sch[rows].unroll(sch[rows].op.reduce_axis[0])
    if op_attr(c, "planes") is None:
        return
    planes = sch[op_attr(c, "planes")]
    planes.compute_at(stage, outer[0] if strip else task)
    *_, py, pp, pq = planes.op.axis
    planes.reorder(py, pq, pp)  # the phases of a run in one pass: an interleaved read
    planes.pragma(py, PARTITION_SELECTS)
    planes.pragma(pq, PARTITION_SELECTS)
    planes.vectorize(pq)
    planes.unroll(pp)


# --- "pixels": a 1x1 convolution vectorized along the output row ----------------------------------


def pixel_tiles(o: int, ow: int, lanes: int) -> tuple[int, int]:
    """(bo channels, nv vectors of a row) of the register tile: the row in as few tiles as it takes
    (a last, partial vector masked), then as many channels as 24 accumulators allow."""
    vectors = _ceil(ow, lanes)
    nv = _ceil(vectors, _ceil(vectors, 6))  # rows of up to 6 vectors in one tile, longer ones in equal tiles
    return divisor_at_most(o, _MAX_ACC // nv), nv


def pixels_compute(data: te.Tensor, shape: Dims, dtype: str, kernel: tuple[int, int, int, int],
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
    """The register tile of the row forms ("pixels", "depthwise", "stem"), computed at `at` of `stage`:
    the reduction outermost, then axis `tiled` of the tile (rows or channels) and the vectors of its
    row unrolled, the lanes vectorized."""
    tile = sch[rows]
    tile.compute_at(stage, at)
    tile.set_scope("local")
    axis = tile.op.axis[tiled]
    txv, txl = tile.split(tile.op.axis[-1], factor=lanes)
    tile.reorder(*tile.op.reduce_axis, axis, txv, txl)
    tile.unroll(axis)
    tile.unroll(txv)
    tile.vectorize(txl)


# --- "stem": few input channels, any window, vectorized along the output row ----------------------


def stem_tiles(o: int, ow: int, lanes: int) -> tuple[int, int]:
    """(bo channels, nv vectors of a row) of the register tile: the row padded to the fewest whole
    vectors, then the most accumulators (bo divides O), then the fewest loads per multiply-add."""
    vectors = _ceil(ow, lanes)
    best: tuple[tuple[int, int, float], tuple[int, int]] | None = None
    for nv in range(1, min(vectors, 8) + 1):
        bo = divisor_at_most(o, _MAX_ACC // nv)
        key = (_ceil(vectors, nv) * nv, -bo * nv, (bo + nv) / (bo * nv))
        if best is None or key < best[0]:
            best = (key, (bo, nv))
    assert best is not None
    return best[1]


def stem_compute(data: te.Tensor, attrs: Any, shape: Dims, dtype: str, kernel: tuple[int, int, int, int],
                 kernel_at: KernelAt) -> te.Tensor:
    """out[n, o, y, x] = sum over (c, ky, kx) of W[o, c, ky, kx] * X[n, c, y*sh + ky*dh, x*sw + kx*dw], in
    rows padded to whole tiles: each weight a broadcast scalar, each tap a contiguous vector of a
    phase plane of the padded input (`phase_planes`: a column stride reads no gathers).
    """
    n, c, h, _ = batch_shape(data)
    o, _, kh, kw = kernel
    _, _, oh, ow = shape
    lanes = vector_lanes(dtype)
    bo, nv = stem_tiles(o, ow, lanes)
    owp = _ceil(ow, nv * lanes) * nv * lanes
    (sh, sw), (dh, dw) = attrs.strides, attrs.dilation
    pt, pl, pb, _ = attrs.padding
    hp = max(h + pt + pb, (oh - 1) * sh + (kh - 1) * dh + 1)
    first = _ceil(pl, sw)
    # tap kx reads phase (kx * dw) % sw at column x + kx * dw // sw + first - ceil((pl - phase) / sw) of its plane
    wq = owp + max(kx * dw // sw + first - _ceil(pl - kx * dw % sw, sw) for kx in range(kw))
    planes = phase_planes(data, (pt, pl), hp, sw, wq)
    rc, ry, rx = te.reduce_axis((0, c), "rc"), te.reduce_axis((0, kh), "ry"), te.reduce_axis((0, kw), "rx")

    def conv(b: PrimExpr, oc: PrimExpr, y: PrimExpr, x: PrimExpr) -> PrimExpr:
        phase = rx * dw % sw
        col = x + rx * dw // sw + first - (pl - phase + sw - 1) // sw
        value = te.cast(planes[b, rc, y * sh + ry * dh, phase, col], dtype)
        return te.sum(value * te.cast(kernel_at(oc, rc, ry, rx), dtype), axis=[rc, ry, rx])

    rows = te.compute((n, o, oh, owp), conv, name="conv2d_stem")
    return te.compute(shape, lambda b, oc, y, x: rows[b, oc, y, x], name="conv2d",
                      attrs={FORM: "stem", "tiles": (bo, nv), "rows": rows, "planes": planes,
                             "task_rows": divisor_at_most(oh, max(1, _STEM_TASK_CHANNELS // o))})


def stem_schedule(sch: te.Schedule, c: te.Tensor, outs: Sequence[te.Tensor]) -> None:
    """Rows of outputs on the cores, `task_rows` a task (two for 32 channels: MobileNetV2's stem ran at
    120-140 GFLOP/s instead of 90-120); per task, the phase planes of the input rows it reads (a few
    KiB, in L1: the input is copied up to KH / SH times over, against O multiply-adds per copied
    value), then per row the channel tiles x row tiles, each bo x nv accumulators over the (C, KH,
    KW) window, the kernel's columns unrolled (its rows too took 2.5x the compile time for
    SqueezeNet's stem, 15x for ResNet's, and ran no faster)."""
    bo, nv = op_attr(c, "tiles")
    rows = op_attr(c, "rows")
    lanes = vector_lanes(c.dtype)
    stage = _inline_anchor(sch, c, outs)
    n, o, y, x = stage.op.axis
    oo, oi = stage.split(o, factor=bo)
    xo, xi = stage.split(x, factor=nv * lanes)
    xv, xl = stage.split(xi, factor=lanes)
    yo, yi = stage.split(y, factor=op_attr(c, "task_rows"))
    stage.reorder(n, yo, yi, oo, xo, oi, xv, xl)
    task = stage.fuse(n, yo)
    stage.parallel(task)
    stage.unroll(oi)
    stage.unroll(xv)
    stage.vectorize(xl)
    _row_tile(sch, rows, stage, xo, 1, lanes)
    sch[rows].unroll(sch[rows].op.reduce_axis[2])
    planes = sch[op_attr(c, "planes")]
    planes.compute_at(stage, task)
    *_, py, pp, pq = planes.op.axis
    planes.reorder(py, pq, pp)  # the phases of a run in one pass: an interleaved read
    planes.pragma(pq, PARTITION_SELECTS)
    planes.vectorize(pq)
    planes.unroll(pp)


# --- choosing and scheduling a form ---------------------------------------------------------------


def _pixels_pay(attrs: Any, kernel: tuple[int, int, int, int], shape: Dims, lanes: int) -> bool:
    """Whether "pixels" takes a convolution: 1x1 over the input as it is (stride 1, no padding), with
    few input channels ("ovec" writes each output element back from a channel vector, a scalar store
    per C multiply-adds: most of its time for small C, where "pixels" stores whole vectors), and rows
    whose last vector is whole or half (LLVM vectorizes a loop of 12 lanes as 8 + 4 scalar, and the
    accumulators then stay in memory)."""
    one_by_one = kernel[2:] == (1, 1) and attrs.strides == (1, 1) and not any(attrs.padding)
    return one_by_one and kernel[1] <= _PIXELS_MAX_C and shape[3] % lanes in (0, lanes // 2)


def _stem_pays(c: int, kernel: tuple[int, int, int, int]) -> bool:
    """Whether "stem" takes a convolution without groups that "pixels" does not: few input channels
    and a window larger than 1x1 ("ovec" writes each output element back from a channel vector,
    a scalar store per C * KH * KW multiply-adds)."""
    return c <= _STEM_MAX_C and kernel[2] * kernel[3] > 1


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
    shape = batch_type_shape(out_type)
    dtype = dtype_of(out_type)
    c = batch_shape(data)[1]
    out: te.Tensor | None = None
    if attrs.groups == 1 and _pixels_pay(attrs, kernel, shape, vector_lanes(dtype)):
        out = pixels_compute(data, shape, dtype, kernel, kernel_at)
    elif attrs.groups == 1 and _stem_pays(c, kernel):
        out = stem_compute(data, attrs, shape, dtype, kernel, kernel_at)
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
    elif form == "stem":
        stem_schedule(sch, c, outs)
    else:
        fallback(sch, anchor_outs, outs, target)
