"""Creation ops: full, zeros, ones, zeros_like, ones_like, shape_of, arange.

Each op is declared in one `register_op` chain (description, arguments, attrs,
relation, support level, pattern, numpy reference, compute) after the functions
it names; its Python constructor follows, checked against it (`@constructor`).
zeros, ones and arange take no inputs: their attrs alone give the output type.
The attrs of full, zeros and ones extend shape.py's `ShapeAttrs` (the output shape).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import numpy as np

from kiln import te
from kiln.ir.attrs import Attrs, FieldError, float_value, to_dtype
from kiln.ir.dtype import DataType
from kiln.ir.types import Dim, SumDim, SymDim, TensorType, Type, dim_add, dim_subst, parse_dim
from kiln.registry import OpPattern, attr, register_op
from kiln.relay.expr import Call, Expr, call, const
from kiln.relay.op._grad import collapse_sum_to
from kiln.relay.op._grad import shape_of as static_shape_of
from kiln.relay.op._nn_util import shape_dims, te_dims
from kiln.relay.op._reg import constructor
from kiln.relay.op._rel import RelationError, identity_shape, same_dtype, shape_relation, tensor_args
from kiln.relay.op.indexing import DATA_ARG as _DATA
from kiln.relay.op.indexing import Array, static_shape
from kiln.relay.op.shape import ShapeAttrs
from kiln.tir import expr as tx

_F32 = DataType.of("float32")


def _to_opt_dtype(value: Any) -> DataType | None:
    return None if value is None else DataType.of(value)


# --- full, zeros, ones, zeros_like, ones_like, shape_of, arange ---------------------------


@attrs.frozen
class FullAttrs(ShapeAttrs):
    """Output shape and dtype of full."""

    dtype: DataType | None = attrs.field(
        default=None, converter=_to_opt_dtype, metadata={"doc": "the output dtype (None: fill_value's)"}
    )


def _full_rel(arg_types: list[Type], attrs: FullAttrs) -> Type | None:
    tensors = tensor_args(arg_types)
    if tensors is None:
        return None
    if tensors[0].ndim != 0:
        raise RelationError(f"expected a scalar (rank-0) fill_value, found {tensors[0]}", arg=0)
    return TensorType(attrs.shape, attrs.dtype or tensors[0].dtype)


def _full_ref(attrs: FullAttrs, value: Array) -> Array:
    return np.full(attrs.shape, value, dtype=attrs.dtype.numpy() if attrs.dtype else value.dtype)


def _full_compute(attrs: FullAttrs, inputs: list[te.Tensor], out_type: Type) -> list[te.Tensor]:
    value = inputs[0]
    assert isinstance(out_type, TensorType)
    dtype = str(out_type.dtype)
    return [te.compute(shape_dims(out_type), lambda *i: te.cast(value[()], dtype), name="full")]


def _full_grad(fwd: Call, grad: Expr) -> list[Expr | None]:
    # every output element is the fill value: its gradient is the sum of the output's
    from kiln.relay.op.tensor import CastAttrs  # (tensor.py imports this module's neighbours)

    value = fwd.args[0]
    dtype = value.checked_type.dtype  # type: ignore[attr-defined]
    if not dtype.is_float:
        return [None]
    summed = collapse_sum_to(grad, static_shape_of(fwd), static_shape_of(value))
    return [call("cast", [summed], CastAttrs.make("cast", dtype=dtype))]


def _fill_like_grad(fwd: Call, grad: Expr) -> list[Expr | None]:
    # the output does not depend on the input's values, only on its shape
    return [call("zeros_like", [fwd.args[0]])]


(register_op("full").describe("a tensor of a given shape filled with a scalar")
    .add_argument("fill_value", "Tensor", "the value (a rank-0 tensor)")
    .set_attrs_type(FullAttrs).add_type_rel("Full", _full_rel)
    .set_support_level(3).set_attr(attr.TOpPattern, OpPattern.ELEMWISE)
    .set_attr(attr.FReference, _full_ref)
    .set_attr(attr.FCompute, _full_compute)
    .set_attr(attr.FPrimalGradient, _full_grad))


@constructor("full")
def full(fill_value: Expr | float, shape: Sequence[int], dtype: Any = None) -> Call:
    """A tensor of `shape` and `dtype` (None: fill_value's) filled with `fill_value` (rank-0, or a number)."""
    full_attrs = FullAttrs.make("full", shape=shape, dtype=dtype)
    value = fill_value if isinstance(fill_value, Expr) else const(fill_value, full_attrs.dtype)
    return call("full", [value], full_attrs)


@attrs.frozen
class InitAttrs(ShapeAttrs):
    """Output shape and dtype of zeros and ones."""

    dtype: DataType = attrs.field(default=_F32, converter=to_dtype, metadata={"doc": "the output dtype"})


def _init_rel(arg_types: list[Type], attrs: InitAttrs) -> Type:
    return TensorType(attrs.shape, attrs.dtype)


def _fill_compute(fill: int, out_type: Type) -> list[te.Tensor]:
    """The compute of zeros, ones, zeros_like and ones_like: `fill` in the output's type."""
    assert isinstance(out_type, TensorType)
    value = te.const(fill, str(out_type.dtype))
    return [te.compute(shape_dims(out_type), lambda *i: value, name="fill")]


for _name, _fill in [("zeros", 0), ("ones", 1)]:
    (register_op(_name).describe(f"a tensor of a given shape and dtype filled with {_fill}")
        .set_num_inputs(0).set_attrs_type(InitAttrs).add_type_rel("InitOp", _init_rel)
        .set_support_level(3).set_attr(attr.TOpPattern, OpPattern.ELEMWISE)
        .set_attr(attr.FReference, lambda attrs, _fill=_fill: np.full(attrs.shape, _fill, attrs.dtype.numpy()))
        .set_attr(attr.FCompute, lambda attrs, inputs, out_type, _fill=_fill: _fill_compute(_fill, out_type))
        .set_attr(attr.FPrimalGradient, lambda call, grad: []))  # no arguments, nothing to differentiate
    (register_op(f"{_name}_like").describe(f"a tensor of the input's shape and dtype filled with {_fill}")
        .add_argument("data", "Tensor", "the tensor whose shape and dtype the output takes")
        .add_type_rel("Identity", shape_relation(identity_shape, same_dtype))
        .set_support_level(3).set_attr(attr.TOpPattern, OpPattern.ELEMWISE)
        .set_attr(attr.FReference, lambda attrs, x, _fill=_fill: np.full_like(x, _fill))
        .set_attr(attr.FCompute, lambda attrs, inputs, out_type, _fill=_fill: _fill_compute(_fill, out_type))
        .set_attr(attr.FPrimalGradient, _fill_like_grad))


@constructor("zeros")
def zeros(shape: Sequence[int], dtype: Any = "float32") -> Call:
    """A tensor of `shape` and `dtype` filled with 0."""
    return call("zeros", [], InitAttrs.make("zeros", shape=shape, dtype=dtype))


@constructor("ones")
def ones(shape: Sequence[int], dtype: Any = "float32") -> Call:
    """A tensor of `shape` and `dtype` filled with 1."""
    return call("ones", [], InitAttrs.make("ones", shape=shape, dtype=dtype))


@constructor("zeros_like")
def zeros_like(data: Expr) -> Call:
    """0 in the shape and dtype of `data`."""
    return call("zeros_like", [data])


@constructor("ones_like")
def ones_like(data: Expr) -> Call:
    """1 in the shape and dtype of `data`."""
    return call("ones_like", [data])


def _int_dtype(_: Any, field: attrs.Attribute[Any], value: Any) -> None:
    if value.kind != "int":
        raise FieldError(field.name, "a signed integer dtype such as 'int32' or 'int64'", str(value))


@attrs.frozen
class ShapeOfAttrs(Attrs):
    """The dtype of shape_of's output."""

    dtype: DataType = attrs.field(
        default=DataType.of("int32"), converter=to_dtype, validator=_int_dtype, metadata={"doc": "the output dtype"}
    )


def _shape_of_rel(arg_types: list[Type], attrs: ShapeOfAttrs) -> Type | None:
    tensors = tensor_args(arg_types)
    return None if tensors is None else TensorType((tensors[0].ndim,), attrs.dtype)


def _shape_of_compute(attrs: ShapeOfAttrs, inputs: list[te.Tensor], out_type: Type) -> list[te.Tensor]:
    dtype = str(attrs.dtype)
    # a symbolic dim is the kernel's size variable, bound from the input's shape
    dims = [te.const(d, dtype) if isinstance(d, int) else te.cast(d, dtype) for d in te_dims(inputs[0])]

    def element(i: tx.PrimExpr) -> tx.PrimExpr:
        value = dims[-1] if dims else te.const(0, dtype)
        for k in range(len(dims) - 2, -1, -1):
            value = tx.select(tx.eq(i, k), dims[k], value)
        return value

    return [te.compute(static_shape(out_type), element, name="shape_of")]


(register_op("shape_of").describe("the shape of a tensor, as a 1-d integer tensor")
    .add_argument(*_DATA).set_attrs_type(ShapeOfAttrs)
    .add_type_rel("ShapeOf", _shape_of_rel)
    .set_support_level(10).set_attr(attr.TOpPattern, OpPattern.OPAQUE)
    .set_attr(attr.FReference, lambda attrs, x: np.array(x.shape, dtype=attrs.dtype.numpy()))
    .set_attr(attr.FCompute, _shape_of_compute)
    .set_attr(attr.TNonDifferentiable, "its output is the input's integer shape, not a function of its values"))


@constructor("shape_of")
def shape_of(data: Expr, dtype: Any = "int32") -> Call:
    """The shape of `data` as a 1-d tensor of `dtype`."""
    return call("shape_of", [data], ShapeOfAttrs.make("shape_of", dtype=dtype))


def _nonzero_number(_: Any, field: attrs.Attribute[Any], value: Any) -> None:
    float_value(_, field, value)
    if value == 0:
        raise FieldError(field.name, "a non-zero number", value)


def _stop(value: Any) -> Any:
    """Converter: a size as the text format writes it ("n") becomes a symbolic dim."""
    return parse_dim(value) if isinstance(value, str) else value


def _stop_value(_: Any, field: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, SymDim | SumDim):
        float_value(_, field, value)


@attrs.frozen
class ArangeAttrs(Attrs):
    """The range of arange: start, start + step, ... up to but not including stop."""

    start: float = attrs.field(validator=float_value, metadata={"doc": "the first value"})
    stop: float | Dim = attrs.field(converter=_stop, validator=_stop_value,
                                    metadata={"doc": "the end (excluded): a number, or a size such as n"})
    step: float = attrs.field(default=1, validator=_nonzero_number, metadata={"doc": "the spacing (non-zero)"})
    dtype: DataType = attrs.field(default=_F32, converter=to_dtype, metadata={"doc": "the output dtype"})

    @property
    def length(self) -> Dim:
        """How many values the range holds: max(0, ceil((stop - start) / step)); stop - start for a
        symbolic stop (unit step, integer start: the relation checks)."""
        if not isinstance(self.stop, int | float):
            return dim_add(self.stop, -int(self.start))
        n = math.ceil((self.stop - self.start) / self.step)
        return n if n > 0 else 0

    def with_sizes(self, sizes: Mapping[str, int]) -> ArangeAttrs:
        stop = self.stop
        return attrs.evolve(self, stop=dim_subst(stop, sizes)) if isinstance(stop, SymDim | SumDim) else self


def _arange_rel(arg_types: list[Type], attrs: ArangeAttrs) -> Type:
    if isinstance(attrs.stop, SymDim | SumDim) and (attrs.step != 1 or attrs.start != int(attrs.start)):
        raise RelationError(f"a range to the size {attrs.stop} needs an integer start and step 1, found start "
                            f"{attrs.start} and step {attrs.step}")
    return TensorType((attrs.length,), attrs.dtype)


def _arange_ref(attrs: ArangeAttrs) -> Array:
    assert isinstance(attrs.length, int)
    # start + i * step, then cast: TVM's definition (numpy.arange differs for int dtypes with float starts)
    return (attrs.start + np.arange(attrs.length, dtype=np.float64) * attrs.step).astype(attrs.dtype.numpy())


def _arange_compute(attrs: ArangeAttrs, inputs: list[te.Tensor], out_type: Type) -> list[te.Tensor]:
    start, step = te.const(float(attrs.start), "float64"), te.const(float(attrs.step), "float64")
    dtype = str(attrs.dtype)

    def element(i: tx.PrimExpr) -> tx.PrimExpr:
        return te.cast(start + te.cast(i, "float64") * step, dtype)

    return [te.compute(shape_dims(out_type), element, name="arange")]


(register_op("arange").describe("evenly spaced values start, start + step, ... up to stop (excluded)")
    .set_num_inputs(0).set_attrs_type(ArangeAttrs).add_type_rel("Arange", _arange_rel)
    .set_support_level(3).set_attr(attr.TOpPattern, OpPattern.OPAQUE)
    .set_attr(attr.FReference, _arange_ref)
    .set_attr(attr.FCompute, _arange_compute)
    .set_attr(attr.FSizeCheck, lambda attrs, arg_types: [(int(attrs.start), attrs.stop, "the range's end")]
              if isinstance(attrs.stop, SymDim | SumDim) else [])
    .set_attr(attr.FPrimalGradient, lambda call, grad: []))  # no arguments, nothing to differentiate


@constructor("arange")
def arange(start: float | Dim, stop: float | Dim | None = None, step: float = 1, dtype: Any = "float32") -> Call:
    """Values `start, start + step, ...` up to `stop` (excluded) as `dtype`; `arange(n)` is `arange(0, n)`.

    `stop` may be a size (`SizeVar("s")`), with an integer start and step 1: the range's length is then
    `s - start`."""
    if stop is None:
        start, stop = 0, start
    return call("arange", [], ArangeAttrs.make("arange", start=start, stop=stop, step=step, dtype=dtype))
