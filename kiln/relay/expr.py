"""Relay expressions: Var, GlobalVar, Constant, Call, Tuple, TupleGetItem, Let, If, Function.

Expressions are frozen `attrs` classes that compare by identity (a Var is
itself, not any var with its name); `structural_equal` compares graphs. The one
mutable slot is `checked_type`, written once by `InferType`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

import attrs
import numpy as np

from kiln.errors import KilnError
from kiln.ir.attrs import Attrs
from kiln.ir.dtype import DataType
from kiln.ir.span import Span
from kiln.ir.types import TensorType, Type, tensor_type
from kiln.registry import Op


class ExprError(KilnError, TypeError):
    """An expression was built from parts that do not fit."""


def _tuple_of_exprs(values: Sequence[Any]) -> tuple[Expr, ...]:
    out = tuple(values)
    for v in out:
        if not isinstance(v, Expr):
            raise ExprError(f"expected a relay expression, got {type(v).__name__} {v!r:.60}")
    return out


@attrs.frozen(eq=False, repr=False)
class Expr:
    """Base of every expression. `span` says where it came from."""

    span: Span | None = attrs.field(default=None, kw_only=True)
    _checked_type: Type | None = attrs.field(default=None, init=False)

    @property
    def checked_type(self) -> Type:
        """The type InferType gave this expression."""
        if self._checked_type is None:
            raise ExprError(f"the type of {type(self).__name__} is not inferred yet: run relay.transform.InferType")
        return self._checked_type

    @property
    def has_type(self) -> bool:
        """Whether InferType has typed this expression."""
        return self._checked_type is not None

    def set_checked_type(self, t: Type) -> None:
        """Records the inferred type (for InferType only)."""
        object.__setattr__(self, "_checked_type", t)

    def children(self) -> tuple[Expr, ...]:
        """The sub-expressions, in evaluation order."""
        return ()

    def __str__(self) -> str:
        from kiln.relay.printer import astext

        return str(astext(self))

    def __repr__(self) -> str:
        return f"<{type(self).__name__} at {id(self):#x}>"


@attrs.frozen(eq=False, repr=False)
class Var(Expr):
    """A local variable: a function parameter or a let binding."""

    name_hint: str
    type_annotation: Type | None = None

    def __repr__(self) -> str:
        return f"Var({self.name_hint!r})"


@attrs.frozen(eq=False, repr=False)
class GlobalVar(Expr):
    """The name of a function in an IRModule."""

    name_hint: str

    def __repr__(self) -> str:
        return f"GlobalVar({self.name_hint!r})"


def _frozen_array(value: Any) -> np.ndarray[Any, Any]:
    array = np.array(value, copy=True, order="C")
    if not array.dtype.isnative:  # one byte order for every constant: the machine's
        array = array.astype(array.dtype.newbyteorder("="))
    DataType.of(array.dtype)  # refuse dtypes kiln does not have
    array.setflags(write=False)
    return array


@attrs.frozen(eq=False, repr=False)
class Constant(Expr):
    """A constant tensor (read-only numpy array)."""

    data: np.ndarray[Any, Any] = attrs.field(converter=_frozen_array)

    @property
    def type(self) -> TensorType:
        """The constant's tensor type."""
        return tensor_type(self.data.shape, self.data.dtype)


@attrs.frozen(eq=False, repr=False)
class Call(Expr):
    """A call of an op (with attrs) or of a function value."""

    op: Op | Expr
    args: tuple[Expr, ...] = attrs.field(converter=_tuple_of_exprs)
    attrs: Attrs | None = None

    def children(self) -> tuple[Expr, ...]:
        return self.args if isinstance(self.op, Op) else (self.op, *self.args)


@attrs.frozen(eq=False, repr=False)
class Tuple(Expr):
    """A tuple of values."""

    fields: tuple[Expr, ...] = attrs.field(converter=_tuple_of_exprs)

    def children(self) -> tuple[Expr, ...]:
        return self.fields


@attrs.frozen(eq=False, repr=False)
class TupleGetItem(Expr):
    """Field `index` of a tuple value."""

    tuple_value: Expr
    index: int

    def children(self) -> tuple[Expr, ...]:
        return (self.tuple_value,)


@attrs.frozen(eq=False, repr=False)
class Let(Expr):
    """`let var = value; body`."""

    var: Var
    value: Expr
    body: Expr

    def children(self) -> tuple[Expr, ...]:
        return (self.var, self.value, self.body)


@attrs.frozen(eq=False, repr=False)
class If(Expr):
    """`if (cond) { true_branch } else { false_branch }`; cond is a bool scalar."""

    cond: Expr
    true_branch: Expr
    false_branch: Expr

    def children(self) -> tuple[Expr, ...]:
        return (self.cond, self.true_branch, self.false_branch)


def _vars(values: Sequence[Var]) -> tuple[Var, ...]:
    out = tuple(values)
    for v in out:
        if not isinstance(v, Var):
            raise ExprError(f"function parameters are Vars, got {type(v).__name__} {v!r:.60}")
    return out


_ATTR_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _is_attr_value(value: Any) -> bool:
    if isinstance(value, tuple):
        return all(_is_attr_value(v) for v in value)
    return value is None or isinstance(value, bool | int | float | str | DataType)


def _function_attrs(values: Mapping[str, Any] | None) -> Mapping[str, Any]:
    out = dict(values or {})
    for key, value in out.items():
        if not isinstance(key, str) or not _ATTR_NAME.fullmatch(key):
            raise ExprError(f"function attribute names are identifiers, got {key!r}")
        if not _is_attr_value(value):
            raise ExprError(
                f"function attribute {key} must be a bool, int, float, str, None, dtype or a tuple of them, "
                f"got {type(value).__name__} {value!r:.60}"
            )
    return MappingProxyType(out)


@attrs.frozen(eq=False, repr=False)
class Function(Expr):
    """A function: parameters, body, optional result type, and attributes.

    `attrs` is a read-only mapping such as `{"Primitive": 1}`, which FuseOps
    puts on the functions it makes of fused groups.
    """

    params: tuple[Var, ...] = attrs.field(converter=_vars)
    body: Expr
    ret_type: Type | None = None
    attrs: Mapping[str, Any] = attrs.field(factory=dict, converter=_function_attrs)

    def children(self) -> tuple[Expr, ...]:
        return (*self.params, self.body)

    @property
    def is_primitive(self) -> bool:
        """Whether the function is a fused group (attribute Primitive is set and nonzero)."""
        return bool(self.attrs.get("Primitive", 0))

    def with_attrs(self, **values: Any) -> Function:
        """A copy of the function (same params and body) with attributes added or replaced."""
        return Function(self.params, self.body, self.ret_type, {**self.attrs, **values}, span=self.span)

    # What an IRModule asks of the class of the functions it holds (kiln.ir knows nothing of Relay).
    @staticmethod
    def make_global_var(name: str) -> GlobalVar:
        """The name of a Relay function in a module."""
        return GlobalVar(name)

    @staticmethod
    def print_module(mod: Any) -> str:
        """A module of Relay functions in kiln's text format."""
        from kiln.relay.printer import astext  # the printer reads expressions: it imports this module

        return str(astext(mod))


# ---------------------------------------------------------------------------
# Builders
# ---------------------------------------------------------------------------


def var(
    name: str,
    type_annotation: Type | None = None,
    shape: Sequence[Any] | None = None,
    dtype: Any = "float32",
) -> Var:
    """A variable; `shape` (ints, SizeVars, names or None for unknown) and `dtype` make its type."""
    if type_annotation is None and shape is not None:
        type_annotation = tensor_type(shape, dtype)
    return Var(name, type_annotation, span=Span.from_caller())


def const(value: Any, dtype: Any = None) -> Constant:
    """A constant from a numpy array or Python scalar/list (float32 for Python floats, int32 for ints)."""
    if dtype is not None:
        array = np.asarray(value, dtype=DataType.of(dtype).numpy())
    else:
        array = np.asarray(value)
        if not isinstance(value, np.ndarray | np.generic):
            if array.dtype == np.float64:
                array = array.astype(np.float32)
            elif array.dtype == np.int64:
                array = array.astype(np.int32)
    return Constant(array, span=Span.from_caller())


def call(op_name: str, args: Sequence[Expr], attrs: Attrs | None = None) -> Call:
    """A call of the registered op `op_name` (used by the op constructors)."""
    return Call(Op.get(op_name), tuple(args), attrs, span=Span.from_caller())
