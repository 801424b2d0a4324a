"""Algorithm ops: topk (TVM's `relay/op/algorithm` family: the ops that order elements).

Each op is declared in one `register_op` chain (description, arguments, attrs,
relation, support level, pattern, numpy reference, compute) after the functions
it names; its Python constructor follows, checked against it (`@constructor`).

topk ranks each element against its row instead of sorting (or, for long rows and
a small k, picks its k elements one pass at a time), so that it is a plain te
compute on every target.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs
import numpy as np

from kiln import te
from kiln.ir.attrs import Attrs, bool_value, int_range
from kiln.ir.dtype import DataType
from kiln.ir.types import TensorType, TupleType, Type
from kiln.registry import OpPattern, attr, register_op
from kiln.relay.expr import Call, Expr, call
from kiln.relay.op._reg import constructor
from kiln.relay.op._rel import RelationError, normalize_axis, tensor_args
from kiln.relay.op.indexing import DATA_ARG, Array, clamp, shape_str, static_shape
from kiln.relay.op.indexing_grad import topk_grad
from kiln.tir import expr as tx

# --- topk -----------------------------------------------------------------------------------


@attrs.frozen
class TopKAttrs(Attrs):
    """Which k elements topk keeps along which axis."""

    k: int = attrs.field(validator=int_range(0), metadata={"doc": "how many elements to keep"})
    axis: int = attrs.field(default=-1, validator=int_range(), metadata={"doc": "the axis to search"})
    largest: bool = attrs.field(default=True, validator=bool_value, metadata={"doc": "the largest (else smallest)"})


def _topk_rel(arg_types: list[Type], attrs: TopKAttrs) -> Type | None:
    tensors = tensor_args(arg_types)
    if tensors is None:
        return None
    (data,) = tensors
    if data.ndim == 0:
        raise RelationError("expected a tensor of rank 1 or more, found a scalar", arg=0)
    axis = normalize_axis(attrs.axis, data.ndim)
    dim = data.shape[axis]
    if isinstance(dim, int) and attrs.k > dim:
        raise RelationError(f"k {attrs.k} is larger than axis {axis} of shape {shape_str(data.shape)}", arg=0)
    shape = (*data.shape[:axis], attrs.k, *data.shape[axis + 1 :])
    return TupleType([TensorType(shape, data.dtype), TensorType(shape, DataType.of("int64"))])


def _topk_ref(attrs: TopKAttrs, x: Array) -> tuple[Array, Array]:
    axis = normalize_axis(attrs.axis, x.ndim)
    position = np.indices(x.shape)[axis]
    # ascending by value, ties by position (NaN sorts last); the largest: descending, ties still by position
    order = np.flip(np.lexsort((-position, x), axis=axis), axis) if attrs.largest else np.lexsort((position, x), axis)
    index = np.take(order, np.arange(attrs.k), axis=axis)
    return np.take_along_axis(x, index, axis=axis), index.astype(np.int64)


# topk ranks every element against its row (O(n^2) per row, in three stages whatever k is) unless that
# is more than _RANK_MAX_WORK comparisons in all and k is small: then it picks its k elements one pass at a
# time (O(k n) per row, but three stages per pick, each costing compile time)
_SELECT_MAX_K, _RANK_MAX_WORK = 16, 2**26


def _topk_compute(attrs: TopKAttrs, inputs: list[te.Tensor], out_type: Type) -> list[te.Tensor]:
    """The positions of the k first elements of each row in the order: larger first (smaller for
    largest=False), a NaN the largest value as numpy sorts it, equal values by position (ties go to the
    lower index); then the values at those positions."""
    (x,) = inputs
    dims, axis = static_shape(x), normalize_axis(attrs.axis, x.ndim)
    n, k = dims[axis], attrs.k
    shape = (*dims[:axis], k, *dims[axis + 1 :])
    if 0 in shape:
        return [te.compute(shape, lambda *i: tx.const(0, str(x.dtype)), name="topk_values"),
                te.compute(shape, lambda *i: tx.const(0, "int64"), name="topk_indices")]
    m = te.reduce_axis((0, n), name="m")
    is_float = tx.is_float(str(x.dtype))

    def before(a: tx.PrimExpr, b: tx.PrimExpr) -> tx.PrimExpr:
        """Whether value `a` comes strictly before value `b`."""
        if not is_float:
            return a > b if attrs.largest else a < b
        if attrs.largest:
            return tx.any_of(a > b, tx.all_of(tx.ne(a, a), tx.eq(b, b)))
        return tx.any_of(a < b, tx.all_of(tx.ne(b, b), tx.eq(a, a)))

    def same(a: tx.PrimExpr, b: tx.PrimExpr) -> tx.PrimExpr:
        return tx.any_of(tx.eq(a, b), tx.all_of(tx.ne(a, a), tx.ne(b, b))) if is_float else tx.eq(a, b)

    def ahead(va: tx.PrimExpr, ia: tx.PrimExpr, vb: tx.PrimExpr, ib: tx.PrimExpr) -> tx.PrimExpr:
        """Whether element (value va, position ia) comes before element (vb, ib) in the order."""
        return tx.any_of(before(va, vb), tx.all_of(same(va, vb), ia < ib))

    def at(i: Sequence[tx.PrimExpr], j: tx.PrimExpr) -> tuple[tx.PrimExpr, ...]:
        return (*i[:axis], j, *i[axis + 1 :])

    if k <= _SELECT_MAX_K and int(np.prod(dims, dtype=np.int64)) * n > _RANK_MAX_WORK:
        position = _topk_select(x, axis, k, m, ahead, attrs.largest)
    else:
        def rank(*i: tx.PrimExpr) -> tx.PrimExpr:
            return te.sum(tx.select(ahead(x[at(i, m.var)], m.var, x[i], i[axis]), tx.const(1), tx.const(0)), axis=m)

        ranks = te.compute(dims, rank, name="topk_rank")

        def position(*i: tx.PrimExpr) -> tx.PrimExpr:
            hit = tx.eq(ranks[at(i, m.var)], i[axis])
            return te.min(tx.select(hit, tx.cast("int64", m.var), tx.const(n, "int64")), axis=m)

    indices = te.compute(shape, position, name="topk_indices")

    def value(*i: tx.PrimExpr) -> tx.PrimExpr:
        return x[at(i, tx.cast("int32", clamp(indices[i], 0, n - 1)))]

    return [te.compute(shape, value, name="topk_values"), indices]


def _topk_select(x: te.Tensor, axis: int, k: int, m: te.IterVar,
                 ahead: Callable[..., tx.PrimExpr], largest: bool) -> Callable[..., tx.PrimExpr]:
    """topk's positions, one pass per pick: pass p reduces over the elements after pick p - 1 in the order,
    first to their best non-NaN value, then to the first position that holds it (or a NaN, which comes
    before every value for the largest and after every value for the smallest)."""
    dims = static_shape(x)
    n, rows = dims[axis], (*dims[:axis], *dims[axis + 1 :])
    is_float = tx.is_float(str(x.dtype))
    best_of = te.max if largest else te.min
    picks: list[te.Tensor] = []

    def full(r: Sequence[tx.PrimExpr], j: tx.PrimExpr) -> tuple[tx.PrimExpr, ...]:
        return (*r[:axis], j, *r[axis:])

    for p in range(k):
        def candidate(r: Sequence[tx.PrimExpr], p: int = p) -> tx.PrimExpr:
            if p == 0:
                return tx.const(True)
            prev = picks[p - 1][tuple(r)]
            return ahead(x[full(r, prev)], prev, x[full(r, m.var)], m.var)

        def best(*r: tx.PrimExpr, candidate: Callable[..., tx.PrimExpr] = candidate) -> tx.PrimExpr:
            v = x[full(r, m.var)]
            valid = tx.all_of(candidate(r), tx.eq(v, v)) if is_float else candidate(r)
            return best_of(v, axis=m, where=valid)

        top = te.compute(rows, best, name=f"topk_best{p}")

        def key(*r: tx.PrimExpr, candidate: Callable[..., tx.PrimExpr] = candidate,
                top: te.Tensor = top) -> tx.PrimExpr:
            v, cand = x[full(r, m.var)], candidate(r)
            # first (key < n) the hits that come first, then (n <= key < 2n) the others
            hit = tx.all_of(cand, tx.eq(v, top[r]))
            if not is_float:
                return te.min(tx.select(hit, m.var, n), axis=m)
            nan = tx.all_of(cand, tx.ne(v, v))
            first, then = (nan, hit) if largest else (hit, nan)
            return te.min(tx.select(first, m.var, tx.select(then, m.var + n, 2 * n)), axis=m)

        keys = te.compute(rows, key, name=f"topk_key{p}")
        picks.append(te.compute(rows, lambda *r, keys=keys: tx.select(keys[r] >= n, keys[r] - n, keys[r]),
                                name=f"topk_pick{p}"))

    def position(*i: tx.PrimExpr) -> tx.PrimExpr:
        r = (*i[:axis], *i[axis + 1 :])
        out: tx.PrimExpr = picks[k - 1][r]
        for p in range(k - 2, -1, -1):
            out = tx.select(tx.eq(i[axis], p), picks[p][r], out)
        return tx.cast("int64", out)

    return position


(register_op("topk").describe("the k largest (or smallest) elements along an axis, sorted, and their indices")
    .add_argument(*DATA_ARG)
    .set_attrs_type(TopKAttrs)
    .add_type_rel("TopK", _topk_rel)
    .set_support_level(6)
    .set_attr(attr.TOpPattern, OpPattern.OPAQUE)
    .set_attr(attr.FReference, _topk_ref)
    .set_attr(attr.FCompute, _topk_compute)
    .set_attr(attr.FPrimalGradient, topk_grad))


@constructor("topk")
def topk(data: Expr, k: int, axis: int = -1, largest: bool = True) -> Call:
    """The `k` largest (or smallest) elements of `data` along `axis`, in order, and their int64 indices (a tuple);
    equal elements keep their order, so ties go to the lower index."""
    return call("topk", [data], TopKAttrs.make("topk", k=k, axis=axis, largest=largest))
