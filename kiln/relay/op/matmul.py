"""Matrix products of the `relay.nn` namespace: nn.dense, nn.matmul and nn.batch_matmul.

Each op is declared in one `register_op` chain (description, arguments, attrs,
relation, pattern, numpy reference, compute and further implementations) after
the functions it names; its Python constructor follows, checked against it
(`@constructor`). The constructors are re-exported by `kiln.relay.op.nn`, so
users write `relay.nn.dense(...)` as in TVM. The computes (`FCompute`) are the
direct (untiled) definitions; the register-tiled CPU forms, which the three ops
share, are each op's "tiled" implementation, so the chains come after them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np

from kiln import te
from kiln.ir.attrs import Attrs, FieldError, bool_value, int_range, optional
from kiln.ir.dtype import DataType
from kiln.ir.types import Dim, TensorType, Type, dim_mul
from kiln.registry import OpPattern, attr, register_op
from kiln.relay.expr import Call, Expr, call
from kiln.relay.op import cuda_schedules
from kiln.relay.op._nn_util import (
    TILED_DTYPES,
    Array,
    DimExpr,
    differ,
    dtype_of,
    narrowed,
    packable_weight,
    product_sum_dtype,
    shape_dims,
    te_dims,
    wide,
)
from kiln.relay.op._reg import constructor
from kiln.relay.op._rel import RelationError, broadcast_dim, broadcast_shapes, same_dtype, tensor_args
from kiln.relay.op._schedule import (
    KEEP,
    divisor_at_most,
    op_attr,
    reduce_extent,
    schedule_generic,
    split_epilogue,
    static_size,
    vector_lanes,
    worth_parallel,
)
from kiln.relay.op.conv import dtype_or_none, optional_dtype
from kiln.relay.op.nn_grad import batch_matmul_grad, dense_grad, matmul_grad
from kiln.relay.op.shape import reshape, transpose
from kiln.tir.expr import PrimExpr
from kiln.tir.functor import same_expr
from kiln.tir.transform import PARTITION_SELECTS


def _out_dims(ty: Type) -> tuple[DimExpr, ...]:
    """The dims of an output type as `_dims` gives them (symbolic dims as the kernel's size expressions)."""
    return tuple(d if isinstance(d, int) else te.as_index(d) for d in shape_dims(ty))


def _divides(tile: int, extent: DimExpr) -> bool:
    """Whether `tile` is known to divide `extent` (never for a symbolic extent: it gets a tail)."""
    return isinstance(extent, int) and extent % tile == 0


def _round_up(extent: DimExpr, tile: int) -> DimExpr:
    """`extent` rounded up to a multiple of `tile`."""
    return -(-extent // tile) * tile if isinstance(extent, int) else (extent + (tile - 1)) // tile * tile

# --- nn.dense, nn.matmul, nn.batch_matmul: attrs, relations, references, direct computes ----------


_WEIGHT_LAYOUT = re.compile(r"NK|NK[1-9][0-9]*n")


def _weight_layout(_: Any, field: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, str) or not _WEIGHT_LAYOUT.fullmatch(value):
        raise FieldError(field.name, "'NK' or 'NK<b>n' (b a positive int, e.g. 'NK64n')", value)


@attrs.frozen
class DenseAttrs(Attrs):
    """Attributes of nn.dense."""

    units: int | None = attrs.field(default=None, validator=optional(int_range(1)), metadata={"doc": "outputs (N)"})
    out_dtype: DataType | None = attrs.field(
        default=None, converter=optional_dtype, validator=dtype_or_none, metadata={"doc": "output dtype; None: data's"}
    )
    weight_layout: str = attrs.field(default="NK", validator=_weight_layout, metadata={
        "doc": "NK: weight (N, K); NK<b>n: packed in blocks of b rows, (N/b, K, b) (AlterOpLayout makes it)"})

    @property
    def weight_block(self) -> int:
        """b of an NK<b>n weight layout; 0 for NK."""
        return 0 if self.weight_layout == "NK" else int(self.weight_layout[2:-1])


def _dense_rel(arg_types: list[Type], attrs: DenseAttrs) -> Type | None:
    tensors = tensor_args(arg_types)
    if tensors is None:
        return None
    data, weight = tensors
    if data.ndim < 1:
        raise RelationError(f"expected data of rank >= 1, (..., K), found {data}", arg=0)
    block = attrs.weight_block
    if weight.ndim != (3 if block else 2):
        want = f"rank 3, (units/{block}, K, {block})" if block else "rank 2, (units, K)"
        raise RelationError(f"expected a weight of {want} (weight_layout {attrs.weight_layout}), found {weight}", arg=1)
    if block and differ(weight.shape[2], block):
        raise RelationError(f"weight_layout {attrs.weight_layout} needs a weight (units/{block}, K, {block}), "
                            f"found {weight}", arg=1)
    units, k = (dim_mul(weight.shape[0], block), weight.shape[1]) if block else weight.shape
    if differ(data.shape[-1], k):
        raise RelationError(
            f"data {data} has K={data.shape[-1]} (its last dim) but weight {weight} has K={k} (its dim 1)", arg=1
        )
    if attrs.units is not None:
        if differ(units, attrs.units):
            raise RelationError(f"attribute units is {attrs.units} but weight {weight} has {units} rows", arg=1)
        units = attrs.units
    dtype = same_dtype([data.dtype, weight.dtype], attrs)
    return TensorType((*data.shape[:-1], units), attrs.out_dtype or dtype)


def unpack_weight(w: Array, block: int) -> Array:
    """A dense weight of layout NK<block>n, (N/block, K, block), as (N, K)."""
    return w.transpose(0, 2, 1).reshape(-1, w.shape[1]) if block else w


def _dense_ref(attrs: DenseAttrs, x: Array, w: Array) -> Array:
    dtype = attrs.out_dtype.numpy() if attrs.out_dtype else x.dtype
    w = unpack_weight(w, attrs.weight_block)
    return np.asarray(np.matmul(wide(x.astype(dtype)), wide(w.astype(dtype)).T)).astype(dtype)


def _dense_compute(attrs: DenseAttrs, inputs: list[te.Tensor], out_type: Type) -> list[te.Tensor]:
    x, w = inputs
    out_dtype = dtype_of(out_type)
    dtype = product_sum_dtype(out_dtype)
    k = te.reduce_axis((0, te_dims(w)[1]), name="k")
    block = attrs.weight_block

    def product(*i: PrimExpr) -> PrimExpr:
        row = (*i[:-1], k)
        n = i[-1]
        weight = w[n // block, k, n % block] if block else w[n, k]
        return te.sum(te.cast(x[row], dtype) * te.cast(weight, dtype), axis=k)

    total = te.compute(_out_dims(out_type), product, name="dense" if dtype == out_dtype else "dense_sum")
    return [narrowed(total, out_dtype, "dense")]


@attrs.frozen
class MatmulAttrs(Attrs):
    """Attributes of nn.matmul."""

    transpose_a: bool = attrs.field(default=False, validator=bool_value, metadata={"doc": "a is (..., K, M)"})
    transpose_b: bool = attrs.field(default=False, validator=bool_value, metadata={"doc": "b is (..., N, K)"})
    out_dtype: DataType | None = attrs.field(
        default=None, converter=optional_dtype, validator=dtype_or_none, metadata={"doc": "output dtype; None: a's"}
    )


@attrs.frozen
class BatchMatmulAttrs(Attrs):
    """Attributes of nn.batch_matmul; y is (B, N, K) by default, as in TVM."""

    transpose_a: bool = attrs.field(default=False, validator=bool_value, metadata={"doc": "x is (B, K, M)"})
    transpose_b: bool = attrs.field(default=True, validator=bool_value, metadata={"doc": "y is (B, N, K)"})
    out_dtype: DataType | None = attrs.field(
        default=None, converter=optional_dtype, validator=dtype_or_none, metadata={"doc": "output dtype; None: x's"}
    )


def _mm_dims(a: TensorType, b: TensorType, attrs: MatmulAttrs | BatchMatmulAttrs) -> tuple[Dim, Dim]:
    """(M, N) of a matrix product over the last two dims; checks the K dims agree."""
    m, ka = (a.shape[-1], a.shape[-2]) if attrs.transpose_a else (a.shape[-2], a.shape[-1])
    n, kb = (b.shape[-2], b.shape[-1]) if attrs.transpose_b else (b.shape[-1], b.shape[-2])
    if differ(ka, kb):
        where_a = "dim -2" if attrs.transpose_a else "dim -1"
        where_b = "dim -1" if attrs.transpose_b else "dim -2"
        raise RelationError(
            f"the reduction dims differ: {a} has K={ka} ({where_a}, transpose_a={attrs.transpose_a}) "
            f"but {b} has K={kb} ({where_b}, transpose_b={attrs.transpose_b})",
            arg=1,
        )
    return m, n


def _matmul_rel(arg_types: list[Type], attrs: MatmulAttrs) -> Type | None:
    tensors = tensor_args(arg_types)
    if tensors is None:
        return None
    a, b = tensors
    for i, t in enumerate(tensors):
        if t.ndim < 2:
            raise RelationError(f"expected a tensor of rank >= 2 (a matrix or a batch of them), found {t}", arg=i)
    m, n = _mm_dims(a, b, attrs)
    try:
        batch = broadcast_shapes([a.shape[:-2], b.shape[:-2]])
    except RelationError as err:
        raise RelationError(f"the batch dims of {a} and {b} do not broadcast: {err}", arg=1) from None
    dtype = same_dtype([a.dtype, b.dtype], attrs)
    return TensorType((*batch, m, n), attrs.out_dtype or dtype)


def _matmul_ref(attrs: MatmulAttrs | BatchMatmulAttrs, a: Array, b: Array) -> Array:
    dtype = attrs.out_dtype.numpy() if attrs.out_dtype else a.dtype
    a = np.swapaxes(a, -1, -2) if attrs.transpose_a else a
    b = np.swapaxes(b, -1, -2) if attrs.transpose_b else b
    return np.asarray(np.matmul(wide(a.astype(dtype)), wide(b.astype(dtype)))).astype(dtype)


def _batch_index(batch: Sequence[PrimExpr], shape: Sequence[DimExpr], out: Sequence[DimExpr]) -> tuple[PrimExpr, ...]:
    """The index into an operand's batch dims `shape` of the output's batch index `batch` (numpy
    broadcasting), the output's batch dims being `out`.

    A symbolic dim of the operand that is not the output's (`n` against 4, which the type relation
    allows) is 1 or the output's at run time: its index is clamped, which serves both.
    """
    own = batch[len(batch) - len(shape):]
    out = out[len(out) - len(shape):]

    def index(i: PrimExpr, d: DimExpr, o: DimExpr) -> PrimExpr:
        if isinstance(d, int):
            return te.const(0) if d == 1 else i
        return i if not isinstance(o, int) and same_expr(d, o) else te.min(i, d - 1)

    return tuple(index(i, d, o) for i, d, o in zip(own, shape, out, strict=True))


def _matmul_compute(attrs: MatmulAttrs | BatchMatmulAttrs, inputs: list[te.Tensor],
                    out_type: Type) -> list[te.Tensor]:
    """nn.matmul and nn.batch_matmul: out[..., m, n] = sum over k of a[..., m, k] * b[..., k, n]."""
    a, b = inputs
    a_shape, b_shape = te_dims(a), te_dims(b)
    shape = _out_dims(out_type)
    out_dtype = dtype_of(out_type)
    dtype = product_sum_dtype(out_dtype)
    k = te.reduce_axis((0, a_shape[-2] if attrs.transpose_a else a_shape[-1]), name="k")
    nb = len(shape) - 2

    def product(*i: PrimExpr) -> PrimExpr:
        batch, m, n = i[:nb], i[nb], i[nb + 1]
        ai = (*_batch_index(batch, a_shape[:-2], shape[:-2]), *((k, m) if attrs.transpose_a else (m, k)))
        bi = (*_batch_index(batch, b_shape[:-2], shape[:-2]), *((n, k) if attrs.transpose_b else (k, n)))
        return te.sum(te.cast(a[ai], dtype) * te.cast(b[bi], dtype), axis=k)

    total = te.compute(shape, product, name="matmul" if dtype == out_dtype else "matmul_sum")
    return [narrowed(total, out_dtype, "matmul")]


def _batch_matmul_rel(arg_types: list[Type], attrs: BatchMatmulAttrs) -> Type | None:
    tensors = tensor_args(arg_types)
    if tensors is None:
        return None
    x, y = tensors
    for i, t in enumerate(tensors):
        if t.ndim != 3:
            raise RelationError(f"expected a tensor of rank 3 (batch, rows, cols), found {t}", arg=i)
    m, n = _mm_dims(x, y, attrs)
    batch = broadcast_dim(x.shape[0], y.shape[0])
    if batch is None:
        raise RelationError(
            f"the batch dims differ: x {x} has {x.shape[0]}, y {y} has {y.shape[0]} (one may be 1)", arg=1
        )
    dtype = same_dtype([x.dtype, y.dtype], attrs)
    return TensorType((batch, m, n), attrs.out_dtype or dtype)


# --- CPU implementations: register-tiled products -------------------------------------------------
#
# Both forms keep a tile of C in vector registers and fuse the group's elementwise
# epilogue (bias, activation) into the tile, so C never goes through memory:
#
# - "inner" (b given as (N, K): nn.dense, batch_matmul's default, matmul with
#   transpose_b, when K > 4 M): both operands are contiguous along K, so a (bm, bn, L)
#   stage of partial sums runs along K L lanes at a time (8 vector loads feed 16 FMAs
#   for a 4x4 tile), and a short horizontal sum per element closes it. No packing.
# - "outer" (b given as (K, N), or as (N, K) with K <= 4 M): a (bm, bn) tile vectorized
#   along N; each step of K broadcasts bm values of a against bn / L vectors of b. b
#   given as (N, K) is read from a transposed copy (`padded_b`): the copy costs N K,
#   the inner form's horizontal sums M N L, which at attention's K = 64 made it 6x
#   slower than this form (12 x 197 x 197 x 64: 13 vs 83 GFLOP/s on one core).
# - "packed" (large products, either layout): the outer form over copies of a in
#   (M/bm, K, bm) strips and b in (N/bn, K, bn) panels, as GotoBLAS.
#
# Tile sizes need not divide M and N (`_tile`): a size without good divisors (197
# tokens) gets full tiles and a tail, which te guards and loop partitioning peels
# off, so the main tiles run unguarded.
#
# Symbolic dims (M, N, K, the batch: `relay.var("x", shape=("n", 768))`) are the kernel's
# size variables. A symbolic M or N is tiled as a large extent without good divisors: full
# tiles and a guarded tail, peeled by loop partitioning, so a static N (the dense layers of
# an MLP or BERT) keeps the static build's tiles, panels and parallel loop; only the packed
# form needs static dims (its copies' shapes are M and N over the tile).

_MAX_TILE = 4
_PACK_MIN = 1 << 26  # multiply-adds from which packing pays for its copies (1024^3: 0.3x -> 0.9x BLAS)


class _Product:
    """out[batch..., m, n] = sum over k of a[batch, m, k] * b[batch, n, k], a and b as the op's attrs give them.

    nn.dense is the case a (..., M, K), b (N, K) without batch dims.
    """

    def __init__(self, attrs: DenseAttrs | MatmulAttrs | BatchMatmulAttrs, inputs: list[te.Tensor],
                 out_type: Type) -> None:
        self.a, self.b = inputs
        self.shape = _out_dims(out_type)  # M, N, the batch dims may be symbolic
        self.dtype = dtype_of(out_type)
        self.nb = len(self.shape) - 2
        self.ta, self.tb = (False, True) if isinstance(attrs, DenseAttrs) else (attrs.transpose_a, attrs.transpose_b)
        self.block = attrs.weight_block if isinstance(attrs, DenseAttrs) else 0  # b packed as (N/block, K, block)
        a_shape = te_dims(self.a)
        self.k = a_shape[-2] if self.ta else a_shape[-1]  # static or symbolic (attention's probabilities @ V)
        self.b_nk = self.tb and not self.ta and not self.block  # both operands contiguous along K

    def a_at(self, batch: Sequence[PrimExpr], m: PrimExpr, k: PrimExpr) -> PrimExpr:
        """a's element (m, k) of output batch `batch`, in the output dtype."""
        ai = (*_batch_index(batch, te_dims(self.a)[:-2], self.shape[:-2]), *((k, m) if self.ta else (m, k)))
        return te.cast(self.a[ai], self.dtype)

    def b_at(self, batch: Sequence[PrimExpr], n: PrimExpr, k: PrimExpr) -> PrimExpr:
        """b's element (k, n) of output batch `batch`, in the output dtype."""
        if self.block:  # a packed dense weight: no batch dims
            return te.cast(self.b[n // self.block, k, n % self.block], self.dtype)
        bi = (*_batch_index(batch, te_dims(self.b)[:-2], self.shape[:-2]), *((n, k) if self.tb else (k, n)))
        return te.cast(self.b[bi], self.dtype)

    def term(self, i: Sequence[PrimExpr], k: PrimExpr) -> PrimExpr:
        """a[m, k] * b[k, n] at output index `i` (batch..., m, n), in the output dtype."""
        batch, m, n = i[: self.nb], i[self.nb], i[self.nb + 1]
        return self.a_at(batch, m, k) * self.b_at(batch, n, k)

    def packed(self, name: str, bm: int, bn: int) -> te.Tensor:
        """The packed form of a large product (no batch dims), as GotoBLAS: a copied into (M/bm, K, bm)
        strips and b into (N/bn, K, bn) panels, so the tile's loads are contiguous and each panel
        stays in L2 while the strips stream past it."""
        m, n = self.shape
        pa = te.compute((m // bm, self.k, bm), lambda x, y, z: self.a_at((), x * bm + z, y),
                        name=f"{name}_packed_a", attrs={KEEP: True})
        pb = te.compute((n // bn, self.k, bn), lambda x, y, z: self.b_at((), x * bn + z, y),
                        name=f"{name}_packed_b", attrs={KEEP: True})
        k = te.reduce_axis((0, self.k), name="k")
        return te.compute(self.shape, lambda i, j: te.sum(pa[i // bm, k, i % bm] * pb[j // bn, k, j % bn], axis=k),
                          name=name, attrs={"tiles": (bm, bn), "packs": (pa, pb)})

    def inner(self, name: str, tiles: tuple[int, int]) -> te.Tensor:
        """The inner form: partial sums `width` lanes wide along K, then their sum."""
        k, lanes = self.k, vector_lanes(self.dtype)
        width = next((w for w in (lanes, lanes // 2, lanes // 4) if k % w == 0), lanes)
        ko = te.reduce_axis((0, -(-k // width)), name="ko")

        def partial(*i: PrimExpr) -> PrimExpr:
            kk = ko * width + i[-1]
            if k % width == 0:
                return te.sum(self.term(i[:-1], kk), axis=ko)
            # the last step runs past K: its loads are clamped (a select may evaluate both sides)
            value = self.term(i[:-1], te.min(kk, k - 1))
            return te.sum(te.if_then_else(kk < k, value, te.const(0, self.dtype)), axis=ko)

        p = te.compute((*self.shape, width), partial, name=f"{name}_partial")
        kl = te.reduce_axis((0, width), name="kl")

        def total(*i: PrimExpr) -> PrimExpr:
            index = (*i, kl)
            return te.sum(p[index], axis=kl)

        return te.compute(self.shape, total, name=name, attrs={"tiles": tiles, "partial": p})

    def outer(self, name: str, tiles: tuple[int, int]) -> te.Tensor:
        """The outer form: the direct sum along K, scheduled with N in vectors.

        When the row tile does not divide M, the last tile's rows past M read a's last row (their
        results are never stored): the tile's loads stay in bounds and its loop stays unguarded.
        b given as (N, K) is read from its transposed copy (`padded_b`). When the column tile does
        not divide N (a column tail), b is read from a copy as (K, N') with N' a multiple of the
        tile, zero past N (`padded_b` again), and the sums are computed over N rounded up to whole
        vectors (`wide`, per tile, as the inner form's partial sums): the last tile's guard, which
        loop partitioning takes out of the main tiles, then leaves it whole vectors (16 lanes for
        197 = 3 * 64 + 5) where N itself would leave it scalar code. The output is the copy of
        `wide` that the tiles store.
        """
        k = te.reduce_axis((0, self.k), name="k")
        *_, m, n = self.shape
        tail = not _divides(tiles[1], n)
        padded = self.padded_b(name, tiles[1]) if (tail or self.tb) and not self.block else None

        def product(*i: PrimExpr) -> PrimExpr:
            if not _divides(tiles[0], m):
                i = (*i[:-2], te.min(i[-2], m - 1), i[-1])
            if padded is None:
                return te.sum(self.term(i, k), axis=k)
            batch, row, j = i[: self.nb], i[self.nb], i[self.nb + 1]
            bi = (*_batch_index(batch, te_dims(padded)[:-2], self.shape[:-2]), k, j)
            return te.sum(self.a_at(batch, row, k) * padded[bi], axis=k)

        if padded is None:
            return te.compute(self.shape, product, name=name, attrs={"tiles": tiles})
        if not tail:
            return te.compute(self.shape, product, name=name, attrs={"tiles": tiles, "pads": (padded,)})
        lanes = vector_lanes(self.dtype)
        # A symbolic N is rounded up to whole tiles: each tile's sums then run over the whole tile,
        # where whole vectors would leave the last tile a loop of symbolic extent, guarded per lane.
        width = _round_up(n, lanes if isinstance(n, int) else tiles[1])
        wide = te.compute((*self.shape[:-1], width), product, name=f"{name}_wide")

        def copy(*i: PrimExpr) -> PrimExpr:
            return wide[i]

        return te.compute(self.shape, copy, name=name, attrs={"tiles": tiles, "pads": (padded,), "wide": wide})

    def padded_b(self, name: str, bn: int) -> te.Tensor:
        """b as (b's batch..., K, N') in the output dtype, N' = N rounded up to a multiple of `bn`,
        zero past N.

        A column tile then loads from rows whose stride is a multiple of the tile: b's own stride N
        (197 tokens) left LLVM unable to prove the tile's int32 addresses free of overflow, so it
        versioned every vector loop behind a run-time check with a scalar copy, and the tile's
        accumulators went through memory (3x slower than at 192 tokens). With b given as (N, K)
        the copy is also the transpose that makes the tile's loads contiguous (N' = N when the
        tile divides it). It costs one pass over b, against M / bm reads of it by the tiles.
        """
        n = self.shape[-1]
        width = _round_up(n, bn)
        b_batch = te_dims(self.b)[:-2]

        def pad(*i: PrimExpr) -> PrimExpr:
            *batch, k, j = i
            index = (*batch, *((te.min(j, n - 1), k) if self.tb else (k, te.min(j, n - 1))))
            value = te.cast(self.b[index], self.dtype)
            return te.if_then_else(j < n, value, te.const(0, self.dtype))  # the load clamped: both sides run

        return te.compute((*b_batch, self.k, width), pad, name=f"{name}_padded_b", attrs={KEEP: True})


def _product_compute(attrs: DenseAttrs | MatmulAttrs | BatchMatmulAttrs, inputs: list[te.Tensor],
                     out_type: Type) -> list[te.Tensor]:
    """The tiled forms; a product with a 1-D side gets the direct compute (and the generic schedule).

    A symbolic M or N is tiled as a large one (`_tile`), with a tail; a symbolic M (or K) takes the
    outer form, and only static products are packed (the packed copies' shapes divide M by the tile).
    """
    if len(shape_dims(out_type)) < 2:
        if isinstance(attrs, DenseAttrs):
            return _dense_compute(attrs, inputs, out_type)
        return _matmul_compute(attrs, inputs, out_type)
    prod = _Product(attrs, inputs, out_type)
    name = "dense" if isinstance(attrs, DenseAttrs) else "matmul"
    *_, m, n = prod.shape
    lanes = vector_lanes(prod.dtype)
    if prod.block:  # b packed at build time (AlterOpLayout): the outer form reads its panels as they are
        return [prod.outer(name, (min(m, _MAX_TILE) if isinstance(m, int) else _MAX_TILE, prod.block))]
    k = prod.k
    if (isinstance(m, int) and isinstance(n, int) and isinstance(k, int) and prod.nb == 0
            and m * n * k >= _PACK_MIN and m % _MAX_TILE == 0 and n % (4 * lanes) == 0):
        return [prod.packed(name, _MAX_TILE, 4 * lanes)]
    bm = _tile(m, _MAX_TILE)
    if prod.b_nk and isinstance(m, int) and isinstance(k, int) and 4 * m < k:
        # few rows for K: a transposed copy of b would cost more than the sums
        return [prod.inner(name, (bm, _tile(n, {4: 4, 3: 5}.get(bm, 8))))]
    return [prod.outer(name, (bm, _tile(n, 4 * lanes, lanes)))]


def _tile(extent: DimExpr, want: int, align: int = 1) -> int:
    """The tile size along an axis of `extent` for a register tile `want` wide, a multiple of `align`
    (the vector width along a vectorized axis) where the extent allows.

    A divisor of the extent when one of at least half the tile exists (no tail); otherwise as
    many whole vectors as fit, up to the tile, which leave a tail: a size without good divisors
    (ViT's 197 tokens, a prime) would else get tiles of 1, a dot product per output, and a tile
    of 50 columns a remainder loop in every row of it. Loop partitioning takes the tail's guard
    out of the main tiles. A symbolic extent is taken as a large one without good divisors: `want`
    (a multiple of `align` where the callers ask for one), and a tail.
    """
    if not isinstance(extent, int):
        return want
    d = divisor_at_most(extent, want)
    if d % align == 0 and 2 * d >= min(extent, want):
        return d
    if extent < align:
        return extent  # narrower than a vector: one tile
    return min(want, extent // align * align)


def _schedule_product(sch: te.Schedule, anchor_outs: Sequence[te.Tensor], outs: Sequence[te.Tensor],
                      target: Any) -> None:
    """Tiles (batch..., m, n) of the product, or of its epilogue; column tiles outermost, on the cores.

    A column tile of b (bn rows of (N, K), or bn columns of (K, N)) stays in L1
    while the row tiles of a stream past it.
    """
    (c,) = anchor_outs
    tiles = op_attr(c, "tiles")
    if tiles is None:  # the direct compute of a product with a 1-D side
        schedule_generic(sch, anchor_outs, outs, target)
        return
    bm, bn = tiles
    partial = op_attr(c, "partial")
    wide = op_attr(c, "wide")  # the outer form's sums over whole vectors (a column tail): computed per tile
    per_tile = partial if partial is not None else wide
    lanes = vector_lanes(c.dtype)
    for pack in op_attr(c, "packs") or ():
        px, _, pz = sch[pack].op.axis
        sch[pack].parallel(px)
        sch[pack].vectorize(pz)
    for pad in op_attr(c, "pads") or ():
        *rows, col = sch[pad].op.axis
        row = sch[pad].fuse(*rows) if len(rows) > 1 else rows[0]
        if worth_parallel(static_size(pad)):
            sch[pad].parallel(row)
        sch[pad].pragma(col, PARTITION_SELECTS)  # a vectorized copy up to N, then zeros: no select per lane
        sch[pad].vectorize(col)
    tiled, comp = split_epilogue(sch, c, outs, per_tile is None)
    stage = sch[tiled]
    *batch, sm, sn = stage.op.axis
    mo, mi = stage.split(sm, factor=bm)
    no, ni = stage.split(sn, factor=bn)
    stage.reorder(*batch, no, mo, mi, ni)
    size = static_size(c)
    k = reduce_extent(c) * (reduce_extent(partial) if partial is not None else 1)  # inner form: lanes x chunks
    if worth_parallel(size * k if size is not None else None):
        # A column tail (bn not dividing N) is guarded by `no * bn + ni < N`: partitioning takes it out
        # of the main tiles by splitting the loop over `no`, which it cannot do once `no` is fused
        # with the batch (the guard then reads `fused % tiles`): the batch alone goes on the cores,
        # or `no` alone for a batch of 1 (its main part stays parallel, the tail runs after it).
        # A symbolic batch is taken as more than 1, a symbolic N as one with a column tail.
        *batch_shape, _, n = te_dims(c)
        tail = not _divides(bn, n)
        if tail and math.prod(d if isinstance(d, int) else 2 for d in batch_shape) > 1:
            stage.parallel(stage.fuse(*batch) if len(batch) > 1 else batch[0])
        elif tail:
            stage.parallel(no)
        else:
            stage.parallel(stage.fuse(*batch, no) if batch else no)
    if bn >= lanes:
        stage.vectorize(ni)
    if comp.op is not tiled.op:
        if wide is not None:
            sch[comp].compute_inline()  # the copy out of `wide`: the epilogue reads `wide` itself
        else:
            sch[comp].compute_at(stage, mo)
    inner = sch[per_tile if per_tile is not None else comp]
    if per_tile is not None:
        inner.compute_at(stage, mo)
    axes = list(inner.op.axis[-3:] if partial is not None else inner.op.axis[-2:])
    inner.reorder(inner.op.reduce_axis[0], *axes)
    for iv in axes[:-1]:
        inner.unroll(iv)
    inner.vectorize(axes[-1])



# --- nn.dense, nn.matmul, nn.batch_matmul: declarations and constructors --------------------------


def _dense_alter_llvm(attrs: DenseAttrs, args: list[Expr], arg_types: list[Type], target: Any) -> Expr | None:
    """On llvm, a constant float weight (N, K) with N a multiple of 4 vectors is packed into (N/b, K, b)
    panels once at build time: the tiled product then reads b contiguous outputs' weights per step of K
    instead of packing (gathering) the weight on every run."""
    data, weight = args
    wt = packable_weight(args, arg_types)
    if attrs.weight_layout != "NK" or wt is None:
        return None
    n, k = wt.concrete_shape
    block = 4 * vector_lanes(str(wt.dtype))
    if n % block:
        return None
    packed = transpose(reshape(weight, (n // block, block, k)), (0, 2, 1))
    return dense(data, packed, attrs.units, attrs.out_dtype, weight_layout=f"NK{block}n")


(register_op("nn.dense").describe("data @ weight.T: (..., K) x (N, K) -> (..., N)")
    .add_argument("data", "Tensor", "the input, (..., K)")
    .add_argument("weight", "Tensor", "the weight, (N, K)")
    .set_attrs_type(DenseAttrs)
    .add_type_rel("Dense", _dense_rel)
    .set_support_level(1)
    .set_attr(attr.TOpPattern, OpPattern.OUT_ELEMWISE_FUSABLE)
    .set_attr(attr.FReference, _dense_ref)
    .set_attr(attr.FCompute, _dense_compute)
    .set_attr(attr.FAlterOpLayout["llvm"], _dense_alter_llvm)
    .set_attr(attr.FPrimalGradient, dense_grad)
    .add_implementation("tiled", _product_compute, _schedule_product, target="llvm",
                        dtypes=TILED_DTYPES, priority=10)
    .add_implementation("tiled", _dense_compute, cuda_schedules.schedule_product, target="cuda", priority=10)
    .add_implementation("tensorcore", cuda_schedules.tensorcore(_dense_compute), cuda_schedules.schedule_tensorcore,
                        target="cuda", dtypes=cuda_schedules.TENSORCORE_DTYPES, priority=20))


@constructor("nn.dense")
def dense(data: Expr, weight: Expr, units: int | None = None, out_dtype: Any = None,
          weight_layout: str = "NK") -> Call:
    """A fully connected layer without bias: data @ weight.T.

    Args:
        data: the input, (..., K).
        weight: the weight, (N, K), or (N/b, K, b) for weight_layout "NK<b>n".
        units: N, checked against the weight.
        out_dtype: the output dtype; None for the input's.
        weight_layout: "NK", or "NK<b>n" for a weight packed in blocks of b rows.

    Returns:
        The call of nn.dense.
    """
    return call("nn.dense", [data, weight],
                DenseAttrs.make("nn.dense", units=units, out_dtype=out_dtype, weight_layout=weight_layout))


(register_op("nn.matmul").describe("matrix product of the last two dims, batch dims broadcast as numpy.matmul")
    .add_argument("tensor_a", "Tensor", "(..., M, K), or (..., K, M) with transpose_a")
    .add_argument("tensor_b", "Tensor", "(..., K, N), or (..., N, K) with transpose_b")
    .set_attrs_type(MatmulAttrs)
    .add_type_rel("Matmul", _matmul_rel)
    .set_attr(attr.FPrimalGradient, matmul_grad)
    .set_support_level(1)
    .set_attr(attr.TOpPattern, OpPattern.OUT_ELEMWISE_FUSABLE)
    .set_attr(attr.FReference, _matmul_ref)
    .set_attr(attr.FCompute, _matmul_compute)
    .add_implementation("tiled", _product_compute, _schedule_product, target="llvm",
                        dtypes=TILED_DTYPES, priority=10)
    .add_implementation("tiled", _matmul_compute, cuda_schedules.schedule_product, target="cuda", priority=10)
    .add_implementation("tensorcore", cuda_schedules.tensorcore(_matmul_compute), cuda_schedules.schedule_tensorcore,
                        target="cuda", dtypes=cuda_schedules.TENSORCORE_DTYPES, priority=20))


@constructor("nn.matmul")
def matmul(
    tensor_a: Expr, tensor_b: Expr, transpose_a: bool = False, transpose_b: bool = False, out_dtype: Any = None
) -> Call:
    """Matrix product, numpy.matmul style, with optional transposes of the last two dims.

    Args:
        tensor_a: (..., M, K), or (..., K, M) with transpose_a.
        tensor_b: (..., K, N), or (..., N, K) with transpose_b.
        transpose_a: whether tensor_a is given transposed.
        transpose_b: whether tensor_b is given transposed.
        out_dtype: the output dtype; None for the input's.

    Returns:
        The call of nn.matmul.
    """
    return call("nn.matmul", [tensor_a, tensor_b], MatmulAttrs.make(
        "nn.matmul", transpose_a=transpose_a, transpose_b=transpose_b, out_dtype=out_dtype
    ))


(register_op("nn.batch_matmul").describe("batched matrix product; y is (B, N, K) by default (transpose_b), as TVM")
    .add_argument("x", "Tensor", "(B, M, K), or (B, K, M) with transpose_a")
    .add_argument("y", "Tensor", "(B, N, K), or (B, K, N) if not transpose_b")
    .set_attrs_type(BatchMatmulAttrs)
    .add_type_rel("BatchMatmul", _batch_matmul_rel)
    .set_attr(attr.FPrimalGradient, batch_matmul_grad)
    .set_support_level(10)
    .set_attr(attr.TOpPattern, OpPattern.OUT_ELEMWISE_FUSABLE)
    .set_attr(attr.FReference, _matmul_ref)
    .set_attr(attr.FCompute, _matmul_compute)
    .add_implementation("tiled", _product_compute, _schedule_product, target="llvm",
                        dtypes=TILED_DTYPES, priority=10)
    .add_implementation("tiled", _matmul_compute, cuda_schedules.schedule_product, target="cuda", priority=10)
    .add_implementation("tensorcore", cuda_schedules.tensorcore(_matmul_compute), cuda_schedules.schedule_tensorcore,
                        target="cuda", dtypes=cuda_schedules.TENSORCORE_DTYPES, priority=20))


@constructor("nn.batch_matmul")
def batch_matmul(x: Expr, y: Expr, transpose_a: bool = False, transpose_b: bool = True, out_dtype: Any = None) -> Call:
    """Batched matrix product, TVM's convention (y transposed by default).

    Args:
        x: (B, M, K), or (B, K, M) with transpose_a.
        y: (B, N, K) with transpose_b (the default), or (B, K, N).
        transpose_a: whether x is given transposed.
        transpose_b: whether y is given transposed.
        out_dtype: the output dtype; None for the input's.

    Returns:
        The call of nn.batch_matmul: (B, M, N); a batch of 1 broadcasts.
    """
    return call("nn.batch_matmul", [x, y], BatchMatmulAttrs.make(
        "nn.batch_matmul", transpose_a=transpose_a, transpose_b=transpose_b, out_dtype=out_dtype
    ))
