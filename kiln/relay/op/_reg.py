"""What the op family modules share to declare their ops.

Every op is declared in its family module by one `register_op(...)` chain:
description, arguments, attrs class, type relation, pattern, numpy reference,
compute, schedules per target kind and more implementations. Its Python
constructor follows it, marked `@constructor(name)`, which checks its
parameters against that declaration.

The elementwise families (the unary and binary math ops) are declared by
`register_unary` / `register_binary`, which build that chain for each member;
this module is marked as a registration helper, so the sites the registry
records are the family module's lines. It also holds the te side of
elementwise and broadcasting ops: `broadcast_index` maps an output element to
an input's element, and `elementwise_compute` turns a scalar function of the
inputs' elements into an op's compute.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import attrs

from kiln import te
from kiln.errors import RegistryError
from kiln.registry import Op, OpPattern, attr, mark_registration_helper, register_op
from kiln.relay.op._rel import DTypeRule, broadcast_shape, identity_shape, same_dtype, shape_relation
from kiln.tir.expr import IntImm, PrimExpr, const

mark_registration_helper(__file__)

Ref = Callable[..., Any]
Compute = Callable[[Any, list[te.Tensor], Any], list[te.Tensor]]


def broadcast_index(t: te.Tensor, out_index: Sequence[PrimExpr]) -> tuple[PrimExpr, ...]:
    """The index of `t`'s element that numpy broadcasting maps to output element `out_index`.

    `t`'s dims align with the output's last dims; a dim of size 1 is read at 0.

    Args:
        t: an input tensor of rank at most the output's.
        out_index: the output element's index, one expression per output dim.

    Returns:
        The index into `t`, one expression per dim of `t`.
    """
    lead = len(out_index) - t.ndim
    return tuple(
        const(0) if isinstance(d, IntImm) and d.value == 1 else out_index[lead + j] for j, d in enumerate(t.shape)
    )


def elementwise_compute(fn: Callable[..., PrimExpr], name: str) -> Compute:
    """The compute of an op whose output element is `fn(attrs, *input elements)`, the inputs broadcast.

    Args:
        fn: `(attrs, x, y, ...) -> expression`, one scalar expression per input.
        name: the name of the computed tensor.

    Returns:
        The compute, `(attrs, inputs, out_type) -> [tensor of out_type's shape]`.
    """

    def compute(attrs: Any, inputs: list[te.Tensor], out_type: Any) -> list[te.Tensor]:
        def element(*index: PrimExpr) -> PrimExpr:
            return fn(attrs, *(t[broadcast_index(t, index)] for t in inputs))

        # "T_add", as TVM names them: a tensor named "exp" would shadow libm's exp in the kernel's module
        return [te.compute(tuple(out_type.shape), element, name=f"T_{name}")]

    compute.__name__ = compute.__qualname__ = f"{name}_compute"
    return compute


F = TypeVar("F", bound=Callable[..., Any])


def constructor(op_name: str) -> Callable[[F], F]:
    """Marks a function as the Python constructor of op `op_name`, checked against the op's declaration.

    Its parameters must be the op's arguments, in order, and fields of the op's
    attrs class (TVM's `pad(data, pad_width, pad_value, pad_mode)` mixes them;
    a field left out takes its default).
    The op must be declared (registered) before its constructor.

    Raises:
        RegistryError: naming the op and the parameters that do not match.
    """

    def wrap(fn: F) -> F:
        op = Op.get(op_name)
        params = list(inspect.signature(fn).parameters)
        args = [a.name for a in op.arguments]
        fields = [f.name for f in attrs.fields(op.attrs_type)] if op.attrs_type is not None else []
        extra = [p for p in params if p not in args and p not in fields]
        if [p for p in params if p in args] != args or extra:
            raise RegistryError(
                f"constructor {fn.__qualname__} of op {op_name}: its parameters {params} must be the op's "
                f"arguments {args}, in order, and fields of {getattr(op.attrs_type, '__name__', 'no attrs class')} "
                f"{fields}" + (f"; neither: {extra}" if extra else "")
            )
        fn.__kiln_op__ = op_name  # type: ignore[attr-defined]
        return fn

    return wrap


def register_unary(
    name: str,
    description: str,
    reference: Ref,
    dtype_rule: DTypeRule = same_dtype,
    attrs_type: type | None = None,
    pattern: OpPattern = OpPattern.ELEMWISE,
    te_expr: Callable[[PrimExpr], PrimExpr] | None = None,
    compute: Compute | None = None,
) -> None:
    """Declares a one-input elementwise op whose output has its input's shape.

    Its compute is `compute`, or with `te_expr` (the output element as a function
    of the input element) the elementwise compute of that.
    """
    entry = (
        register_op(name)
        .describe(description)
        .add_argument("data", "Tensor", "the input")
        .add_type_rel("Identity", shape_relation(identity_shape, dtype_rule))
        .set_support_level(1)
        .set_attr(attr.TOpPattern, pattern)
        .set_attr(attr.FReference, reference)
    )
    if attrs_type is not None:
        entry.set_attrs_type(attrs_type)
    if te_expr is not None:
        expr = te_expr
        compute = elementwise_compute(lambda attrs, x: expr(x), name)
    if compute is not None:
        entry.set_attr(attr.FCompute, compute)


def register_binary(
    name: str,
    description: str,
    reference: Ref,
    dtype_rule: DTypeRule = same_dtype,
    te_expr: Callable[[PrimExpr, PrimExpr], PrimExpr] | None = None,
) -> None:
    """Declares a two-input op with numpy broadcasting.

    With `te_expr` (the output element as a function of the two input elements)
    its compute is the broadcasting elementwise compute of that.
    """
    entry = (
        register_op(name)
        .describe(description)
        .add_argument("lhs", "Tensor", "the left operand")
        .add_argument("rhs", "Tensor", "the right operand")
        .add_type_rel("Broadcast", shape_relation(broadcast_shape, dtype_rule))
        .set_support_level(1)
        .set_attr(attr.TOpPattern, OpPattern.BROADCAST)
        .set_attr(attr.FReference, reference)
    )
    if te_expr is not None:
        expr = te_expr
        entry.set_attr(attr.FCompute, elementwise_compute(lambda attrs, a, b: expr(a, b), name))
