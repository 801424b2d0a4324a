"""Helpers shared by the op family modules: shape checks, te index helpers, accumulation dtypes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

import numpy as np

from kiln import te
from kiln.ir.dtype import NARROW_FLOATS
from kiln.ir.types import Dim, SumDim, SymDim, TensorType, TupleType, Type
from kiln.relay.expr import Constant
from kiln.relay.op._rel import RelationError, normalize_axis
from kiln.tir import expr as tx
from kiln.tir.expr import PrimExpr

Array = np.ndarray[Any, Any]
T = TypeVar("T")


def accumulator(dtype: str) -> str:
    """The dtype a sum of `dtype` values accumulates in: float32 for narrower floats (float16 steps of
    0.25 at 300 lose every addend under 0.125), int64 for integers, the dtype itself otherwise."""
    if tx.is_float(dtype):
        return "float32" if dtype in NARROW_FLOATS else dtype
    return "int64"


def product_sum_dtype(dtype: str) -> str:
    """The dtype a product or convolution of `dtype` outputs sums in: float32 for float16 and bfloat16 (as
    torch and cuBLAS sum them; summed in their own precision, K terms lose about log2(K) bits), else `dtype`."""
    return "float32" if dtype in NARROW_FLOATS else dtype


def narrowed(total: te.Tensor, dtype: str, name: str) -> te.Tensor:
    """`total` (a sum in `product_sum_dtype(dtype)`) as `dtype`: itself where they agree, else one conversion
    per element (a stage the cuda schedules look through: `_schedule.summed`)."""
    if total.dtype == dtype:
        return total
    return te.compute(total.shape, lambda *i: te.cast(total[i], dtype), name=name)


def wide(x: Any) -> Any:
    """`x` in float32 where it is float16 or bfloat16 (ml_dtypes'), else `x`: a numpy reference computes
    narrow floats in float32, as their computes do, rounding once at the end."""
    return x.astype(np.float32) if x.dtype.name in NARROW_FLOATS else x


FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")  # what the row-wise implementations take
TILED_DTYPES = ("float32", "float64")  # the dtypes of the register-tiled llvm products and convolutions


def packable_weight(args: Sequence[Any], arg_types: Sequence[Type]) -> TensorType | None:
    """The weight's type when a call's weight (its second argument) is a constant that its op's
    FAlterOpLayout may pack at build time: both operands tensors of one dtype of `TILED_DTYPES`."""
    data, weight = arg_types[:2]
    if not (isinstance(args[1], Constant) and isinstance(data, TensorType) and isinstance(weight, TensorType)):
        return None
    dtype = str(weight.dtype)
    return weight if dtype == str(data.dtype) and dtype in TILED_DTYPES else None


def differ(a: Dim, b: Dim) -> bool:
    """Whether two dims are known to differ (both static and unequal)."""
    return isinstance(a, int) and isinstance(b, int) and a != b


def data_axis(axis: int, ndim: int) -> int:
    """normalize_axis, blaming the data argument."""
    try:
        return normalize_axis(axis, ndim)
    except RelationError as err:
        err.arg = 0
        raise


def along(v: Array, axis: int, ndim: int) -> Array:
    """A 1-D array shaped to broadcast along `axis` of an ndim-D array."""
    shape = [1] * ndim
    shape[axis] = -1
    return v.reshape(shape)


def tuple_type(*fields: Type) -> TupleType:
    """A tuple type of `fields`."""
    # typed as tuple[Type, ...]: mypy refuses a tuple of TensorTypes for TupleType's `converter=tuple`
    return TupleType(fields)


def check_vector(t: TensorType, size: Dim, arg: int, what: str, data: TensorType, axis: int) -> None:
    """Checks that `t` is a vector of `size` (data's dim `axis`)."""
    if t.ndim != 1 or differ(t.shape[0], size):
        raise RelationError(f"expected {what} of shape ({size},) (dim {axis} of data {data}), found {t}", arg=arg)


DimExpr = int | PrimExpr  # a dim in a compute: an int, or an expression of the kernel's size variables


def te_dims(t: te.Tensor) -> tuple[DimExpr, ...]:
    """The dims of a te tensor: ints where static, expressions of the kernel's size variables where symbolic
    (so a static shape builds the very index expressions it always did)."""
    return tuple(int(d.value) if isinstance(d, tx.IntImm) else d for d in t.shape)


def same_dims(a: te.Tensor, b: te.Tensor) -> bool:
    """Whether two te tensors have the same shape (symbolic dims compared as expressions)."""
    from kiln.tir.functor import same_expr

    return len(a.shape) == len(b.shape) and all(
        x.value == y.value if isinstance(x, tx.IntImm) and isinstance(y, tx.IntImm) else same_expr(x, y)
        for x, y in zip(a.shape, b.shape, strict=True))


def shape_dims(ty: Type) -> tuple[int | SymDim | SumDim, ...]:
    """The dims of a tensor type for te (`te.compute(shape_dims(out_type), ...)`): ints, and symbolic dims
    (`n`, `2*n`), which te makes the kernel's size variables. ANY raises te.TEError."""
    assert isinstance(ty, TensorType)
    if not all(isinstance(d, (int, SymDim, SumDim)) for d in ty.shape):
        raise te.TEError(f"needs static or symbolic dims; found {ty}")
    return tuple(ty.shape)  # type: ignore[arg-type]


def is_static(ty: Type) -> bool:
    """Whether every dim of a tensor type is an int."""
    assert isinstance(ty, TensorType)
    return all(isinstance(d, int) for d in ty.shape)


def static_shape(ty: Type) -> tuple[int, ...]:
    """The static shape of a tensor type, for the computes that need every dim (a symbolic one raises
    te.TEError, which lowering reports with the op's name)."""
    assert isinstance(ty, TensorType)
    if not all(isinstance(d, int) for d in ty.shape):
        raise te.TEError(f"needs static shapes; found {ty} (symbolic dims are not supported by this compute yet)")
    return tuple(int(d) for d in ty.shape)  # type: ignore[arg-type]


def dtype_of(ty: Type) -> str:
    """The dtype name of a tensor type (the first field's for a tuple type)."""
    if isinstance(ty, TupleType):
        return dtype_of(ty.fields[0])
    assert isinstance(ty, TensorType)
    return str(ty.dtype)


def clamp(index: PrimExpr, size: int) -> PrimExpr:
    """`index` clamped into [0, size): keeps a guarded load in bounds, since a select may evaluate both sides."""
    return tx.max_(tx.min_(index, size - 1), 0)


def without(index: Sequence[T], axis: int) -> tuple[T, ...]:
    """`index` without the entry at `axis` (the index of a reduction's result)."""
    return (*index[:axis], *index[axis + 1:])


def insert(index: Sequence[PrimExpr], axis: int, value: PrimExpr) -> tuple[PrimExpr, ...]:
    """`index` with `value` inserted at `axis` (the index a reduction over `axis` reads)."""
    return (*index[:axis], value, *index[axis:])


def tensor_shape(t: te.Tensor) -> tuple[int, ...]:
    """The static shape of a te tensor built by lowering (a symbolic dim raises te.TEError, as `static_shape`)."""
    if not all(isinstance(d, tx.IntImm) for d in t.shape):
        raise te.TEError(f"needs static shapes; found {t.name} of shape ({', '.join(map(str, t.shape))}) "
                         "(symbolic dims are not supported by this compute yet)")
    return tuple(int(d.value) for d in t.shape)  # type: ignore[attr-defined]
