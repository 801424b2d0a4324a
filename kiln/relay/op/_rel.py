"""Building blocks for type relations.

A relation is a pure function `(arg_types, attrs) -> out_type | None`; None
means "not yet" (an input type is still unknown). On bad input it raises
`RelationError(message, arg=i)`; the solver adds the op, the argument's name,
the span and the IR excerpt.

Ops whose type follows from a plain forward shape rule use `shape_relation`:
it waits for complete tensor inputs, checks they are tensors, and calls the
shape rule and the dtype rule.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from kiln.ir.dtype import DataType
from kiln.ir.types import (
    ANY,
    AnyDim,
    Dim,
    TensorType,
    TupleType,
    Type,
    is_complete,
)
from kiln.registry.attr import RelationError as RelationError  # the op library raises it

Shape = tuple[Dim, ...]
ShapeRule = Callable[[list[Shape], Any], Sequence[Dim]]
DTypeRule = Callable[[list[DataType], Any], DataType]
Relation = Callable[[list[Type], Any], "Type | None"]


def tensor_args(arg_types: Sequence[Type]) -> list[TensorType] | None:
    """The args as tensors; None while any is incomplete; RelationError for a non-tensor."""
    if not all(is_complete(t) for t in arg_types):
        return None
    out = []
    for i, t in enumerate(arg_types):
        if not isinstance(t, TensorType):
            raise RelationError(f"expected a tensor, found {t}", arg=i)
        out.append(t)
    return out


def same_dtype(dtypes: list[DataType], attrs: Any) -> DataType:
    """dtype rule: all inputs share one dtype, which the output has."""
    for i, d in enumerate(dtypes[1:], start=1):
        if d != dtypes[0]:
            raise RelationError(f"expected dtype {dtypes[0]} (the dtype of the first argument), found {d}", arg=i)
    return dtypes[0]


def bool_dtype(dtypes: list[DataType], attrs: Any) -> DataType:
    """dtype rule: inputs share one dtype; the output is bool (comparisons)."""
    same_dtype(dtypes, attrs)
    return DataType.of("bool")


def float_dtype(dtypes: list[DataType], attrs: Any) -> DataType:
    """dtype rule: one floating-point dtype in and out (exp, sigmoid, ...)."""
    out = same_dtype(dtypes, attrs)
    if not out.is_float:
        raise RelationError(f"expected a floating-point tensor, found dtype {out}", arg=0)
    return out


def shape_relation(shape_rule: ShapeRule, dtype_rule: DTypeRule = same_dtype) -> Relation:
    """Wraps a forward shape rule and a dtype rule into a type relation."""

    def relation(arg_types: list[Type], attrs: Any) -> Type | None:
        tensors = tensor_args(arg_types)
        if tensors is None:
            return None
        dtype = dtype_rule([t.dtype for t in tensors], attrs)
        shape = shape_rule([t.shape for t in tensors], attrs)
        return TensorType(tuple(shape), dtype)

    relation.__name__ = getattr(shape_rule, "__name__", "shape_relation")
    relation.__qualname__ = getattr(shape_rule, "__qualname__", relation.__name__)
    return relation


def identity_shape(shapes: list[Shape], attrs: Any) -> Shape:
    """Shape rule: the output has the first input's shape."""
    return shapes[0]


def broadcast_dim(a: Dim, b: Dim) -> Dim | None:
    """numpy's rule for one dim pair; None when the dims cannot broadcast."""
    if a == b:
        return a
    if a == 1:
        return b
    if b == 1:
        return a
    if isinstance(a, AnyDim) or isinstance(b, AnyDim):
        return ANY
    if isinstance(a, int) or isinstance(b, int):
        # two sizes, or a size variable against a fixed size: the variable would have to be that size (or 1)
        # at run time, which no kernel checks, so the types must say it
        return None
    return ANY


def broadcast_shapes(shapes: Sequence[Shape]) -> Shape:
    """numpy broadcasting of several shapes; RelationError names the argument that does not fit."""
    out: list[Dim] = []
    rank = max((len(s) for s in shapes), default=0)
    for i, shape in enumerate(shapes):
        padded: list[Dim] = [1] * (rank - len(shape)) + list(shape)
        if i == 0:
            out = padded
            continue
        for axis, (a, b) in enumerate(zip(out, padded, strict=True)):
            d = broadcast_dim(a, b)
            if d is None:
                shown = ", ".join(f"({', '.join(map(str, s))})" for s in shapes)
                hint = "" if isinstance(a, int) and isinstance(b, int) else (
                    ": a size variable broadcasts only against itself or 1; give that dim as the fixed size")
                raise RelationError(f"shapes {shown} do not broadcast: dim {axis} is {a} against {b}{hint}", arg=i)
            out[axis] = d
    return tuple(out)


def broadcast_shape(shapes: list[Shape], attrs: Any) -> Shape:
    """Shape rule: numpy broadcasting of all inputs."""
    return broadcast_shapes(shapes)


def normalize_axis(axis: int, ndim: int, what: str = "axis") -> int:
    """`axis` in [-ndim, ndim) as a non-negative index; RelationError otherwise."""
    if not -ndim <= axis < ndim:
        raise RelationError(
            f"{what} {axis} is out of range for a tensor of rank {ndim} (allowed: {-ndim} to {ndim - 1})"
        )
    return axis % ndim if ndim else 0


def tuple_of_tensors(t: Type, arg: int) -> list[TensorType] | None:
    """The fields of a tuple argument as tensors (None while incomplete)."""
    if not is_complete(t):
        return None
    if not isinstance(t, TupleType):
        raise RelationError(f"expected a tuple of tensors, found {t}", arg=arg)
    fields = []
    for f in t.fields:
        if not isinstance(f, TensorType):
            raise RelationError(f"expected a tuple of tensors, found a field of type {f}", arg=arg)
        fields.append(f)
    return fields
