"""Reductions: sum, mean, max, min, prod; argmax, argmin; the scans cumsum and cumprod.

Every reduction takes `axis` (None for all axes, or a tuple of axes; negative
axes count from the end), `keepdims` (keep each reduced axis as a dim of 1) and
`exclude` (reduce over every axis *not* in `axis`), with TVM's meaning. Each
op is declared in one `register_op` chain (description, argument, attrs,
relation, pattern, numpy reference, compute, schedule) after the functions it
names, in a loop over its family's table; its Python constructor follows,
checked against it (`@constructor`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import attrs
import numpy as np

from kiln import te
from kiln.ir.attrs import Attrs, FieldError, bool_value, int_range, int_tuple, optional, to_opt_int_tuple
from kiln.ir.dtype import DataType
from kiln.ir.types import Dim, SumDim, SymDim, TensorType, Type
from kiln.registry import Op, OpPattern, attr, register_op
from kiln.relay.expr import Call, Expr, call
from kiln.relay.op._nn_util import accumulator, shape_dims, wide
from kiln.relay.op._reg import constructor
from kiln.relay.op._rel import RelationError, normalize_axis, tensor_args
from kiln.relay.op._schedule import KEEP, schedule_injective_stage, schedule_reduce
from kiln.relay.op.cuda_reduce import ROW_REDUCE, schedule_rows_cuda
from kiln.relay.op.reduce_grad import GRADIENTS, cumprod_grad, cumsum_grad
from kiln.target import Target
from kiln.te.ops import Reducer
from kiln.tir import expr as tx
from kiln.tir.expr import IntImm, PrimExpr

Array = np.ndarray[Any, Any]

# TVM's support level of the reduction ops
_LEVEL = 4


@attrs.frozen
class ReduceAttrs(Attrs):
    """Attributes of sum, mean, max, min and prod."""

    axis: tuple[int, ...] | None = attrs.field(
        default=None,
        converter=to_opt_int_tuple,
        validator=optional(int_tuple()),
        metadata={"doc": "the axes to reduce (None: all axes); negative axes count from the end"},
    )
    keepdims: bool = attrs.field(
        default=False, validator=bool_value, metadata={"doc": "keep each reduced axis as a dim of size 1"}
    )
    exclude: bool = attrs.field(
        default=False, validator=bool_value, metadata={"doc": "reduce over the axes NOT in axis instead"}
    )


def _single_axis(_: Any, field: attrs.Attribute[Any], value: Any) -> None:
    ok = value is None or (
        isinstance(value, tuple) and len(value) == 1 and isinstance(value[0], int) and not isinstance(value[0], bool)
    )
    if not ok:
        raise FieldError(field.name, "None or a single axis (an arg-reduction reduces one axis or all)", value)


@attrs.frozen
class ArgReduceAttrs(Attrs):
    """Attributes of argmax and argmin."""

    axis: tuple[int, ...] | None = attrs.field(
        default=None,
        converter=to_opt_int_tuple,
        validator=_single_axis,
        metadata={"doc": "the axis to reduce (None: all axes, giving the index into the flattened tensor)"},
    )
    keepdims: bool = attrs.field(
        default=False, validator=bool_value, metadata={"doc": "keep the reduced axis as a dim of size 1"}
    )
    exclude: bool = attrs.field(
        default=False, validator=bool_value, metadata={"doc": "reduce over the axes NOT in axis instead"}
    )
    select_last_index: bool = attrs.field(
        default=False, validator=bool_value, metadata={"doc": "on ties, the last index instead of the first"}
    )


AnyReduceAttrs = ReduceAttrs | ArgReduceAttrs


def reduce_axes(ndim: int, axis: Sequence[int] | None, exclude: bool = False) -> list[int]:
    """The axes a reduction reduces, ascending and non-negative.

    Args:
        ndim: the rank of the reduced tensor.
        axis: the `axis` attribute (None for all axes; negative axes count from the end).
        exclude: whether to reduce the axes not in `axis` instead (ignored when `axis` is None, as in TVM).

    Returns:
        The reduced axes.

    Raises:
        RelationError: an axis is out of range or given twice.
    """
    if axis is None:
        return list(range(ndim))
    seen: dict[int, int] = {}
    for a in axis:
        n = normalize_axis(a, ndim)
        if n in seen:
            raise RelationError(
                f"axis {a} is given twice in axis {tuple(axis)} (it names dim {n} of a tensor of rank {ndim}, "
                f"as axis {seen[n]} does)"
            )
        seen[n] = a
    if exclude:
        return [i for i in range(ndim) if i not in seen]
    return sorted(seen)


def reduced_shape(shape: Sequence[Dim], axes: Sequence[int], keepdims: bool) -> tuple[Dim, ...]:
    """The shape after reducing `axes` of `shape` (dims of 1 in their place when `keepdims`)."""
    reduced = set(axes)
    if keepdims:
        return tuple(1 if i in reduced else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in reduced)


def _make_relation(
    name: str, numeric: bool, nonempty: bool, out_dtype: str | None = None
) -> Callable[[list[Type], AnyReduceAttrs], Type | None]:
    def relation(arg_types: list[Type], attrs: AnyReduceAttrs) -> Type | None:
        tensors = tensor_args(arg_types)
        if tensors is None:
            return None
        data = tensors[0]
        if numeric and data.dtype.is_bool:
            raise RelationError("expected a numeric tensor, found dtype bool", arg=0)
        axes = reduce_axes(data.ndim, attrs.axis, attrs.exclude)
        if isinstance(attrs, ArgReduceAttrs) and len(axes) not in (1, data.ndim):
            raise RelationError(
                f"{name} reduces one axis or all of them, but axis {attrs.axis} with exclude={attrs.exclude} "
                f"leaves axes {tuple(axes)} of a tensor of rank {data.ndim}"
            )
        if nonempty:
            for a in axes:
                if data.shape[a] == 0:
                    raise RelationError(
                        f"axis {a} of shape {_shape_str(data.shape)} has size 0: "
                        f"the {name} of no elements is undefined",
                        arg=0,
                    )
        dtype = DataType.of(out_dtype) if out_dtype is not None else data.dtype
        return TensorType(reduced_shape(data.shape, axes, attrs.keepdims), dtype)

    relation.__name__ = relation.__qualname__ = f"{name}_rel"
    return relation


def _shape_str(shape: Sequence[Dim]) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


# --- te computes, shared -----------------------------------------------------------------

# max and min of bools: any and all (the numeric reducers start from the dtype's lowest / highest number)
_BOOL_REDUCERS = {
    "max": te.comm_reducer(tx.any_of, lambda t: tx.const(False), name="any"),
    "min": te.comm_reducer(tx.all_of, lambda t: tx.const(True), name="all"),
}
_REDUCERS: dict[str, Reducer] = {"sum": te.sum, "prod": te.prod, "max": te.max, "min": te.min}


def _reducer(kind: str, dtype: str) -> Reducer:
    return _BOOL_REDUCERS[kind] if dtype == "bool" else _REDUCERS[kind]


def _extent(d: PrimExpr) -> int:
    if not isinstance(d, IntImm):
        raise te.TEError(f"a reduction compute needs static shapes; found dim {d}")
    return d.value


def _count(dims: Sequence[PrimExpr]) -> int | PrimExpr:
    """The number of elements of `dims`: an int when all are static, else an int32 expression of the
    kernel's size variables."""
    if all(isinstance(d, IntImm) for d in dims):
        return int(np.prod([_extent(d) for d in dims]))
    total: PrimExpr = tx.const(1)
    for d in dims:
        total = total * d
    return total


def _dims(out_type: TensorType) -> tuple[int | SymDim | SumDim, ...]:
    """The output's dims for te: ints, and symbolic dims (the kernel's size variables)."""
    return shape_dims(out_type)


def _input_index(
    ndim: int, axes: Sequence[int], keepdims: bool, out_index: Sequence[PrimExpr], rvs: Sequence[PrimExpr]
) -> tuple[PrimExpr, ...]:
    """The element of the reduced tensor that output element `out_index` reads at reduction point `rvs`."""
    outs, reds = iter(out_index), iter(rvs)
    index = []
    for d in range(ndim):
        if d in axes:
            index.append(next(reds))
            if keepdims:
                next(outs)  # the kept dim of 1
        else:
            index.append(next(outs))
    return tuple(index)


def _reduce(
    x: te.Tensor, attrs: AnyReduceAttrs, shape: Sequence[int | SymDim | SumDim], kind: str, dtype: str, name: str,
    mark: dict[str, Any] | None = None,
) -> te.Tensor:
    """`x` reduced by reducer `kind` over the axes `attrs` names, its elements first cast to `dtype`; `mark`
    becomes the compute's attrs."""
    axes = reduce_axes(x.ndim, attrs.axis, attrs.exclude)
    rvs = [te.reduce_axis((0, x.shape[a]), name=f"k{a}") for a in axes]
    reducer = _reducer(kind, dtype)

    def element(*out_index: PrimExpr) -> PrimExpr:
        value = te.cast(x[_input_index(x.ndim, axes, attrs.keepdims, out_index, rvs)], dtype)
        return reducer(value, axis=rvs) if rvs else value

    return te.compute(tuple(shape), element, name=name, attrs=mark)


def _cuda_mark(x: te.Tensor, attrs: AnyReduceAttrs, cuda: bool) -> dict[str, Any] | None:
    """For the cuda "rows" implementation: the output's mark for `schedule_rows_cuda`, which says whether
    each output's elements are contiguous in `x` (the reduced axes are its last ones)."""
    if not cuda:
        return None
    axes = reduce_axes(x.ndim, attrs.axis, attrs.exclude)
    return {ROW_REDUCE: axes == list(range(x.ndim - len(axes), x.ndim))}


def _schedule_two_stage(
    sch: te.Schedule, anchor_outs: Sequence[te.Tensor], outs: Sequence[te.Tensor], target: Target
) -> None:
    """`schedule_reduce`, with the reduction that mean, argmax and argmin compute first on the cores too."""
    first = [
        t for a in anchor_outs for t in a.op.input_tensors if isinstance(t.op, te.ComputeOp) and t.op.reduce_axis
    ]
    schedule_reduce(sch, [*first, *anchor_outs], outs, target)


# --- sum, mean, max, min, prod ---------------------------------------------------------


def _reduce_reference(fn: Callable[..., Any]) -> Callable[[ReduceAttrs, Array], Array]:
    def reference(attrs: ReduceAttrs, x: Array) -> Array:
        axes = tuple(reduce_axes(x.ndim, attrs.axis, attrs.exclude))
        out = fn(wide(x), axis=axes, keepdims=attrs.keepdims)  # float16, bfloat16: in float32, as the compute
        # mean of ints truncates toward zero, as TVM's integer division of the sum
        return np.asarray(out).astype(x.dtype, copy=False)

    reference.__name__ = reference.__qualname__ = f"{getattr(fn, '__name__', 'reduce')}_reference"
    return reference


def _reduce_compute(
    kind: str, cuda: bool = False
) -> Callable[[ReduceAttrs, list[te.Tensor], TensorType], list[te.Tensor]]:
    """The compute of reduction `kind`; with `cuda`, its output marked for `schedule_rows_cuda`."""

    def compute(attrs: ReduceAttrs, inputs: list[te.Tensor], out_type: TensorType) -> list[te.Tensor]:
        (x,) = inputs
        shape = _dims(out_type)
        mark = _cuda_mark(x, attrs, cuda)
        if kind in ("sum", "prod") and tx.is_float(x.dtype) and accumulator(x.dtype) != x.dtype:
            total = _reduce(x, attrs, shape, kind, accumulator(x.dtype), f"T_{kind}_acc")
            return [te.compute(shape, lambda *i: te.cast(total[i], x.dtype), name=f"T_{kind}", attrs=mark)]
        return [_reduce(x, attrs, shape, kind, x.dtype, f"T_{kind}", mark)]

    compute.__name__ = compute.__qualname__ = f"{kind}_{'cuda_' if cuda else ''}compute"
    return compute


def _mean_compute(cuda: bool = False) -> Callable[[ReduceAttrs, list[te.Tensor], TensorType], list[te.Tensor]]:
    """The sum, then divided by the count: of floats in their dtype (float32 for narrower ones); of
    integers summed in int64 and divided truncating (the reference truncates the exact mean toward zero).
    With `cuda`, the output is marked for `schedule_rows_cuda`."""

    def compute(attrs: ReduceAttrs, inputs: list[te.Tensor], out_type: TensorType) -> list[te.Tensor]:
        (x,) = inputs
        shape, dtype = _dims(out_type), x.dtype
        count = _count([x.shape[a] for a in reduce_axes(x.ndim, attrs.axis, attrs.exclude)])
        acc = accumulator(dtype)
        total = _reduce(x, attrs, shape, "sum", acc, "T_mean_sum")
        # a symbolic count (a mean over `s`): the size variable, converted once per element
        n = tx.const(count, acc) if isinstance(count, int) else tx.cast(acc, count)
        return [te.compute(shape, lambda *i: te.cast(total[i] / n, dtype), name="T_mean",
                           attrs=_cuda_mark(x, attrs, cuda))]

    compute.__name__ = compute.__qualname__ = f"mean_{'cuda_' if cuda else ''}compute"
    return compute


_REDUCE: list[tuple[str, str, Callable[..., Any], bool, bool, Callable[..., Any], Callable[..., None] | None]] = [
    # name, description, numpy function, numeric only, refuses empty axes, compute (given whether it is the
    # cuda one), CPU schedule (None: the pattern's); sum and prod of narrow floats in two stages: the float32
    # sum, then the cast
    ("sum", "the sum of the elements over the given axes", np.sum, True, False, partial(_reduce_compute, "sum"),
     _schedule_two_stage),
    ("mean", "the mean of the elements over the given axes", np.mean, True, False, _mean_compute,
     _schedule_two_stage),
    ("max", "the largest element over the given axes", np.max, False, True, partial(_reduce_compute, "max"), None),
    ("min", "the smallest element over the given axes", np.min, False, True, partial(_reduce_compute, "min"), None),
    ("prod", "the product of the elements over the given axes", np.prod, True, False,
     partial(_reduce_compute, "prod"), _schedule_two_stage),
]

for _name, _doc, _fn, _numeric, _nonempty, _compute, _schedule in _REDUCE:
    _entry = (
        register_op(_name)
        .describe(_doc)
        .add_argument("data", "Tensor", "the tensor to reduce")
        .set_attrs_type(ReduceAttrs)
        .add_type_rel("Reduce", _make_relation(_name, _numeric, _nonempty))
        .set_support_level(_LEVEL)
        .set_attr(attr.TOpPattern, OpPattern.COMM_REDUCE)
        .set_attr(attr.FReference, _reduce_reference(_fn))
        .set_attr(attr.FCompute, _compute())
        .set_attr(attr.FPrimalGradient, GRADIENTS[_name])
        .add_implementation("rows", _compute(cuda=True), schedule_rows_cuda, target="cuda", priority=10)
    )
    if _schedule is not None:  # max and min: the pattern's schedule
        _entry.set_attr(attr.FSchedule["llvm"], _schedule)


def _make_reduce(name: str) -> Callable[..., Call]:
    def fn(
        data: Expr, axis: int | Sequence[int] | None = None, keepdims: bool = False, exclude: bool = False
    ) -> Call:
        return call(name, [data], ReduceAttrs.make(name, axis=axis, keepdims=keepdims, exclude=exclude))

    fn.__name__ = fn.__qualname__ = name
    description = Op.get(name).description
    fn.__doc__ = f"""{name}(data, axis=None, keepdims=False, exclude=False): {description}.

    Args:
        data: the tensor to reduce.
        axis: an axis or axes to reduce; None reduces all axes.
        keepdims: keep each reduced axis as a dim of size 1.
        exclude: reduce over the axes not in `axis` instead.

    Returns:
        The call of `{name}`.
    """
    return constructor(name)(fn)


sum = _make_reduce("sum")
mean = _make_reduce("mean")
max = _make_reduce("max")
min = _make_reduce("min")
prod = _make_reduce("prod")


# --- argmax, argmin --------------------------------------------------------------------


def _arg_reference(fn: Callable[..., Any]) -> Callable[[ArgReduceAttrs, Array], Array]:
    def reference(attrs: ArgReduceAttrs, x: Array) -> Array:
        axes = reduce_axes(x.ndim, attrs.axis, attrs.exclude)
        # one axis, or every axis: then the index into the row-major flattened tensor
        data, axis = (x, axes[0]) if len(axes) == 1 else (x.reshape(-1), 0)
        if attrs.select_last_index:
            data = np.flip(data, axis=axis)
        idx = np.asarray(fn(data, axis=axis))
        if attrs.select_last_index:
            idx = data.shape[axis] - 1 - idx
        return idx.reshape(reduced_shape(x.shape, axes, attrs.keepdims)).astype(np.int32)

    reference.__name__ = reference.__qualname__ = f"{getattr(fn, '__name__', 'arg')}_reference"
    return reference


def _arg_compute(
    kind: str, cuda: bool = False
) -> Callable[[ArgReduceAttrs, list[te.Tensor], TensorType], list[te.Tensor]]:
    """argmax (`kind` "max") or argmin ("min"): the extreme value first, then the first (or last) index
    holding it, or holding a NaN, as numpy's NaN is the extreme. All axes give the row-major flat index.
    With `cuda`, the output is marked for `schedule_rows_cuda` (both reductions across a row's threads:
    the extreme, then the smallest or largest index holding it; neither depends on the order)."""

    def compute(attrs: ArgReduceAttrs, inputs: list[te.Tensor], out_type: TensorType) -> list[te.Tensor]:
        (x,) = inputs
        shape = _dims(out_type)
        axes = reduce_axes(x.ndim, attrs.axis, attrs.exclude)
        if not axes:  # a 0-d tensor: its one element
            return [te.compute(shape, lambda *i: tx.const(0), name=f"T_arg{kind}")]
        best = _reduce(x, attrs, shape, kind, x.dtype, f"T_arg{kind}_value")
        extents = [x.shape[a] for a in axes]  # IntImms, or size variables (a symbolic axis)
        rvs = [te.reduce_axis((0, e), name=f"k{a}") for a, e in zip(axes, extents, strict=True)]
        flat: PrimExpr = tx.const(0)
        for rv, e in zip(rvs, extents, strict=True):
            flat = flat * e + rv
        past = _count(extents)  # no index: larger than every flat index

        def element(*out_index: PrimExpr) -> PrimExpr:
            v = x[_input_index(x.ndim, axes, attrs.keepdims, out_index, rvs)]
            hit = tx.eq(v, best[out_index])
            if tx.is_float(v.dtype):
                hit = tx.any_of(hit, tx.ne(v, v))
            if attrs.select_last_index:
                return te.max(tx.select(hit, flat, -1), axis=rvs)
            return te.min(tx.select(hit, flat, past), axis=rvs)

        return [te.compute(shape, element, name=f"T_arg{kind}", attrs=_cuda_mark(x, attrs, cuda))]

    compute.__name__ = compute.__qualname__ = f"arg{kind}_{'cuda_' if cuda else ''}compute"
    return compute


for _name, _doc, _fn, _kind in [
    ("argmax", "the index of the largest element along an axis (int32)", np.argmax, "max"),
    ("argmin", "the index of the smallest element along an axis (int32)", np.argmin, "min"),
]:
    (
        register_op(_name)
        .describe(_doc)
        .add_argument("data", "Tensor", "the tensor to search")
        .set_attrs_type(ArgReduceAttrs)
        .add_type_rel("ArgReduce", _make_relation(_name, numeric=False, nonempty=True, out_dtype="int32"))
        .set_support_level(_LEVEL)
        .set_attr(attr.TOpPattern, OpPattern.COMM_REDUCE)
        .set_attr(attr.FReference, _arg_reference(_fn))
        .set_attr(attr.FCompute, _arg_compute(_kind))
        .set_attr(attr.TNonDifferentiable, "its output is an integer index: no gradient flows through it")
        .add_implementation("rows", _arg_compute(_kind, cuda=True), schedule_rows_cuda, target="cuda", priority=10)
        .set_attr(attr.FSchedule["llvm"], _schedule_two_stage)
    )


def _arg_attrs(
    name: str, axis: int | Sequence[int] | None, keepdims: bool, exclude: bool, select_last_index: bool
) -> ArgReduceAttrs:
    return ArgReduceAttrs.make(
        name, axis=axis, keepdims=keepdims, exclude=exclude, select_last_index=select_last_index
    )


@constructor("argmax")
def argmax(
    data: Expr,
    axis: int | Sequence[int] | None = None,
    keepdims: bool = False,
    exclude: bool = False,
    select_last_index: bool = False,
) -> Call:
    """The int32 index of the largest element along `axis`.

    Args:
        data: the tensor to search.
        axis: the axis to reduce; None searches the flattened tensor.
        keepdims: keep the reduced axis as a dim of size 1.
        exclude: reduce over the axes not in `axis` instead (that must leave one axis).
        select_last_index: on ties, the last index instead of the first.

    Returns:
        The call of `argmax`.
    """
    return call("argmax", [data], _arg_attrs("argmax", axis, keepdims, exclude, select_last_index))


@constructor("argmin")
def argmin(
    data: Expr,
    axis: int | Sequence[int] | None = None,
    keepdims: bool = False,
    exclude: bool = False,
    select_last_index: bool = False,
) -> Call:
    """The int32 index of the smallest element along `axis`.

    Args:
        data: the tensor to search.
        axis: the axis to reduce; None searches the flattened tensor.
        keepdims: keep the reduced axis as a dim of size 1.
        exclude: reduce over the axes not in `axis` instead (that must leave one axis).
        select_last_index: on ties, the last index instead of the first.

    Returns:
        The call of `argmin`.
    """
    return call("argmin", [data], _arg_attrs("argmin", axis, keepdims, exclude, select_last_index))


# --- cumsum, cumprod -------------------------------------------------------------------------------


@attrs.frozen
class ScanAttrs(Attrs):
    """Attributes of cumsum and cumprod."""

    axis: int = attrs.field(default=0, validator=int_range(), metadata={"doc": "the axis to scan along"})
    exclusive: bool = attrs.field(
        default=False, validator=bool_value, metadata={"doc": "each output leaves its own element out"}
    )
    reverse: bool = attrs.field(
        default=False, validator=bool_value, metadata={"doc": "scan from the end of the axis to its start"}
    )


def _make_scan_relation(name: str) -> Callable[[list[Type], ScanAttrs], Type | None]:
    def relation(arg_types: list[Type], attrs: ScanAttrs) -> Type | None:
        tensors = tensor_args(arg_types)
        if tensors is None:
            return None
        data = tensors[0]
        if data.dtype.is_bool:
            raise RelationError("expected a numeric tensor, found dtype bool", arg=0)
        if data.ndim == 0:
            raise RelationError(f"{name} scans along an axis; found a 0-d tensor", arg=0)
        normalize_axis(attrs.axis, data.ndim)
        return data

    relation.__name__ = relation.__qualname__ = f"{name}_rel"
    return relation


def _scan_reference(fn: Callable[..., Any], identity: int) -> Callable[[ScanAttrs, Array], Array]:
    def reference(attrs: ScanAttrs, x: Array) -> Array:
        axis = attrs.axis % x.ndim
        data = np.flip(x, axis) if attrs.reverse else x
        out = fn(data, axis=axis, dtype=x.dtype)
        if attrs.exclusive:
            pad = np.full_like(np.take(out, [0], axis=axis), identity)
            out = np.concatenate([pad, np.take(out, range(out.shape[axis] - 1), axis=axis)], axis=axis)
        return np.ascontiguousarray(np.flip(out, axis) if attrs.reverse else out)

    reference.__name__ = reference.__qualname__ = f"{getattr(fn, '__name__', 'scan')}_reference"
    return reference


_SCAN_BLOCK = 16  # elements of a block of a long scan: log2 of it full passes, then one more
_SCAN_BLOCKED = 256  # axes from this length on are scanned in blocks


def _doubling(combine: Callable[[PrimExpr, PrimExpr], PrimExpr], dims: tuple[int | SymDim | SumDim, ...], ax: int,
              first: Callable[[tuple[PrimExpr, ...], int], PrimExpr], name: str,
              last: Callable[[tuple[PrimExpr, ...]], tuple[tuple[PrimExpr, ...], Callable[[PrimExpr], PrimExpr]]]
              | None = None, keep: bool = False) -> te.Tensor:
    """The inclusive scan of a sequence of dims[ax] elements along dim `ax`, by doubling.

    With 2^K >= n, step d (d = 2^(K-1), ..., 2, 1) combines each element with the one d before
    it. The steps' shifts commute, so after all K each element holds the combination of the 2^K
    elements up to it, those before the start being the identity. So that no step needs a bounds
    check (a select of a clamped index: a gather when vectorized), each step's tensor starts with the
    identity in as many places as the steps still to come reach, and step k reads its input at j and
    j + d with no condition. `first(index, pad)` is the first tensor's element: the identity before
    position `pad`, the sequence's element index[ax] - pad after; it is inlined into the first step.
    The steps are marked `KEEP`, so that none is inlined into the next. `last`, if given, maps an
    index of the returned tensor to the scan's index it holds and a function of that element
    (a reversal and a cast); the returned tensor then has that function's dtype. With `keep`, the
    returned tensor is an internal stage of the op, marked `KEEP` too.
    """
    n = dims[ax]
    assert isinstance(n, int)  # the other dims may be symbolic
    count = (n - 1).bit_length() if n > 1 else 0  # 2^count >= n (max and sum are the ops here)
    pad = (1 << count) - 1

    def along(length: int) -> tuple[int | SymDim | SumDim, ...]:
        return (*dims[:ax], length, *dims[ax + 1:])

    def moved(index: tuple[PrimExpr, ...], to: PrimExpr) -> tuple[PrimExpr, ...]:
        return (*index[:ax], to, *index[ax + 1:])

    if not count:
        def only(*index: PrimExpr) -> PrimExpr:
            at, fn = last(index) if last is not None else (index, lambda v: v)
            return fn(first(at, 0))

        return te.compute(dims, only, name=name, attrs={KEEP: True} if keep else None)
    current = te.compute(along(n + pad), lambda *i: first(i, pad), name=f"{name}_0")
    for k in range(count):
        d = 1 << (count - 1 - k)
        pad -= d
        final = k == count - 1

        def step(*index: PrimExpr, prev: te.Tensor = current, d: int = d, final: bool = final) -> PrimExpr:
            at, fn = last(index) if final and last is not None else (index, lambda v: v)
            j = at[ax]
            return fn(combine(prev[moved(at, j + d)], prev[moved(at, j)]))

        current = te.compute(along(n + pad), step, name=name if final else f"{name}_{k + 1}",
                             attrs={KEEP: True} if keep or not final else None)
    return current


def _scan_compute(kind: str) -> Callable[[ScanAttrs, list[te.Tensor], TensorType], list[te.Tensor]]:
    """The inclusive (or exclusive) scan along the axis, as steps of doubling (`_doubling`): each an
    elementwise pass that vectorizes and runs on the cores (te has no sequential recurrence, and a
    prefix reduction per element would be n^2 work). The scan runs over the logical sequence: the
    input reversed with `reverse`, shifted by one with `exclusive`; the last pass writes it back in
    the input's order.

    An axis of n < `_SCAN_BLOCKED` takes ceil(log2 n) passes, n log n work. A longer one is scanned
    in blocks of `_SCAN_BLOCK`: each block on its own (log2 of the block's size passes), then the
    exclusive scan of the blocks' totals (n / 16 elements), then one pass that combines each element
    with its block's prefix: about 6 passes over the data, whatever n. Narrow floats are combined in
    float32, rounded once at the end."""
    op = tx.Add if kind == "sum" else tx.Mul

    def combine(a: PrimExpr, b: PrimExpr) -> PrimExpr:
        return tx.binary(op, a, b)

    def compute(attrs: ScanAttrs, inputs: list[te.Tensor], out_type: TensorType) -> list[te.Tensor]:
        (x,) = inputs
        shape = _dims(out_type)
        axis = attrs.axis % x.ndim
        n = shape[axis]
        if not isinstance(n, int):  # the doubling steps' count and padding follow from the length
            raise te.TEError(f"needs a static scan axis {axis}; found {out_type}")
        dtype = x.dtype
        acc = accumulator(dtype) if tx.is_float(dtype) else dtype
        identity = tx.const(0 if kind == "sum" else 1, acc)
        shift = 1 if attrs.exclusive else 0

        def flip(i: PrimExpr) -> PrimExpr:
            """The input's position of logical position i (and back)."""
            return (n - 1) - i if attrs.reverse else i

        def element(index: tuple[PrimExpr, ...], i: PrimExpr, inside: PrimExpr) -> PrimExpr:
            """The logical sequence's element i (the identity unless `inside`); i is clamped to the axis."""
            before = i - shift
            ok = tx.all_of(inside, before >= 0)
            at = (*index[:axis], flip(tx.min_(tx.max_(before, 0), n - 1)), *index[axis + 1:])
            return tx.select(ok, te.cast(x[at], acc), identity)

        def cast_back(v: PrimExpr) -> PrimExpr:
            return te.cast(v, dtype)

        if n < _SCAN_BLOCKED:
            def first(index: tuple[PrimExpr, ...], pad: int) -> PrimExpr:
                j = index[axis]
                return element(index, j - pad, j >= pad)

            def output(index: tuple[PrimExpr, ...]) -> tuple[tuple[PrimExpr, ...], Callable[[PrimExpr], PrimExpr]]:
                return (*index[:axis], flip(index[axis]), *index[axis + 1:]), cast_back

            return [_doubling(combine, shape, axis, first, f"T_cum{kind}", output)]

        b = _SCAN_BLOCK
        m = -(-n // b)
        outer, inner = shape[:axis], shape[axis + 1:]
        a = len(outer)

        def in_block(index: tuple[PrimExpr, ...], pad: int) -> PrimExpr:
            # index: (*outer, block, position + pad, *inner)
            j = index[a + 1] - pad
            i = index[a] * b + j
            return element((*index[:a], i, *index[a + 2:]), i, tx.all_of(j >= 0, i < n))

        local = _doubling(combine, (*outer, m, b, *inner), a + 1, in_block, f"T_cum{kind}_local", keep=True)

        def totals(index: tuple[PrimExpr, ...], pad: int) -> PrimExpr:
            # the blocks' totals shifted by one: the prefix of each block is the scan of those before it
            c = index[a] - pad - 1
            block = tx.min_(tx.max_(c, 0), m - 1)
            at: tuple[PrimExpr, ...] = (*index[:a], block, tx.const(b - 1), *index[a + 1:])
            return tx.select(c >= 0, local[at], identity)

        prefix = _doubling(combine, (*outer, m, *inner), a, totals, f"T_cum{kind}_blocks", keep=True)

        def out(*index: PrimExpr) -> PrimExpr:
            i = flip(index[a])
            rest = index[a + 1:]
            at_local = (*index[:a], i // b, i % b, *rest)
            at_prefix = (*index[:a], i // b, *rest)
            return cast_back(combine(local[at_local], prefix[at_prefix]))

        return [te.compute(shape, out, name=f"T_cum{kind}")]

    compute.__name__ = compute.__qualname__ = f"cum{kind}_compute"
    return compute


def _schedule_scan(sch: te.Schedule, anchor_outs: Sequence[te.Tensor], outs: Sequence[te.Tensor],
                   target: Target) -> None:
    """Each step of the scan its own elementwise loop nest: vectorized, on the cores when large."""
    del anchor_outs, target
    outputs = {id(t.op) for t in outs}
    for stage in list(sch.stages):
        op = stage.op
        if isinstance(op, te.ComputeOp) and stage.attach_type is te.AttachType.ROOT and (
            op.attrs.get(KEEP) or id(op) in outputs
        ):
            schedule_injective_stage(sch, op.output())


_SCANS: list[tuple[str, str, str, Callable[..., Any], int, Callable[..., Any]]] = [
    # name, description, kind, numpy function, identity, gradient
    ("cumsum", "the running sum along an axis (exclusive: of the elements before each)", "sum", np.cumsum, 0,
     cumsum_grad),
    ("cumprod", "the running product along an axis (exclusive: of the elements before each)", "prod", np.cumprod,
     1, cumprod_grad),
]
for _name, _doc, _kind, _np_fn, _identity, _grad in _SCANS:
    (
        register_op(_name)
        .describe(_doc)
        .add_argument("data", "Tensor", "the tensor to scan")
        .set_attrs_type(ScanAttrs)
        .add_type_rel("Scan", _make_scan_relation(_name))
        .set_support_level(3)
        # OPAQUE: a consumer must not inline the steps (each reads the previous one twice)
        .set_attr(attr.TOpPattern, OpPattern.OPAQUE)
        .set_attr(attr.FReference, _scan_reference(_np_fn, _identity))
        .set_attr(attr.FCompute, _scan_compute(_kind))
        .set_attr(attr.FSchedule["llvm"], _schedule_scan)
        .set_attr(attr.FPrimalGradient, _grad)
    )


@constructor("cumsum")
def cumsum(data: Expr, axis: int = 0, exclusive: bool = False, reverse: bool = False) -> Call:
    """The running sum of `data` along `axis`.

    Args:
        data: the tensor to scan.
        axis: the axis to scan along (negative counts from the end).
        exclusive: each output is the sum of the elements before it, leaving its own out (0 first).
        reverse: scan from the end of the axis to its start.

    Returns:
        The call of `cumsum`.
    """
    return call("cumsum", [data], ScanAttrs.make("cumsum", axis=axis, exclusive=exclusive, reverse=reverse))


@constructor("cumprod")
def cumprod(data: Expr, axis: int = 0, exclusive: bool = False, reverse: bool = False) -> Call:
    """The running product of `data` along `axis`.

    Args:
        data: the tensor to scan.
        axis: the axis to scan along (negative counts from the end).
        exclusive: each output is the product of the elements before it, leaving its own out (1 first).
        reverse: scan from the end of the axis to its start.

    Returns:
        The call of `cumprod`.
    """
    return call("cumprod", [data], ScanAttrs.make("cumprod", axis=axis, exclusive=exclusive, reverse=reverse))
