"""Registration helpers: one call registers an op with its whole chain.

This module is marked as a registration helper, so the registration site that
the registry records is the line that calls these helpers, not a line here.
It also holds the te side of elementwise and broadcasting ops: `broadcast_index`
maps an output element to an input's element, and `elementwise_compute` turns a
scalar function of the inputs' elements into an op's compute.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from kiln import te
from kiln.registry import OpPattern, OpRegEntry, attr, mark_registration_helper, register_op
from kiln.relay.op._rel import DTypeRule, broadcast_shape, identity_shape, same_dtype, shape_relation
from kiln.relay.op._schedule import register_compute
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


def register_nn_op(
    name: str, description: str, arguments: Sequence[tuple[str, str]], relation: Callable[..., Any],
    reference: Callable[..., Any], pattern: OpPattern, attrs_type: type | None = None, level: int = 1,
) -> OpRegEntry:
    """Registers an op of the nn family in one chain.

    Args:
        name: the op name, e.g. "nn.conv2d".
        description: what the op computes.
        arguments: (name, description) of each tensor input, in order.
        relation: the type relation.
        reference: the numpy reference, (attrs, *arrays) -> array or tuple.
        pattern: the fusion pattern.
        attrs_type: the attrs class, if the op has attributes.
        level: the support level.

    Returns:
        The op's registration entry.
    """
    entry = register_op(name).describe(description).set_num_inputs(len(arguments))
    for arg_name, arg_doc in arguments:
        entry.add_argument(arg_name, "Tensor", arg_doc)
    if attrs_type is not None:
        entry.set_attrs_type(attrs_type)
    rel_name = "".join(word.capitalize() for word in name.rsplit(".", 1)[-1].split("_"))
    return (
        entry.add_type_rel(rel_name, relation)
        .set_support_level(level)
        .set_attr(attr.TOpPattern, pattern)
        .set_attr(attr.FReference, reference)
    )


def register_unary(
    name: str,
    description: str,
    reference: Ref,
    dtype_rule: DTypeRule = same_dtype,
    attrs_type: type | None = None,
    pattern: OpPattern = OpPattern.ELEMWISE,
    te_expr: Callable[[PrimExpr], PrimExpr] | None = None,
) -> None:
    """Registers a one-input elementwise op whose output has its input's shape.

    With `te_expr` (the output element as a function of the input element) it
    also registers the op's compute.
    """
    entry = (
        register_op(name)
        .describe(description)
        .set_num_inputs(1)
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
        register_compute(name, elementwise_compute(lambda attrs, x: expr(x), name))


def register_binary(
    name: str,
    description: str,
    reference: Ref,
    dtype_rule: DTypeRule = same_dtype,
    te_expr: Callable[[PrimExpr, PrimExpr], PrimExpr] | None = None,
) -> None:
    """Registers a two-input op with numpy broadcasting.

    With `te_expr` (the output element as a function of the two input elements)
    it also registers the op's compute.
    """
    (
        register_op(name)
        .describe(description)
        .set_num_inputs(2)
        .add_argument("lhs", "Tensor", "the left operand")
        .add_argument("rhs", "Tensor", "the right operand")
        .add_type_rel("Broadcast", shape_relation(broadcast_shape, dtype_rule))
        .set_support_level(1)
        .set_attr(attr.TOpPattern, OpPattern.BROADCAST)
        .set_attr(attr.FReference, reference)
    )
    if te_expr is not None:
        expr = te_expr
        register_compute(name, elementwise_compute(lambda attrs, a, b: expr(a, b), name))
