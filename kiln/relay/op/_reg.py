"""Registration helpers: one call registers an op with its whole chain.

This module is marked as a registration helper, so the registration site that
the registry records is the line that calls these helpers, not a line here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from kiln.registry import OpPattern, OpRegEntry, attr, mark_registration_helper, register_op
from kiln.relay.op._rel import DTypeRule, broadcast_shape, identity_shape, same_dtype, shape_relation

mark_registration_helper(__file__)

Ref = Callable[..., Any]


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
) -> None:
    """Registers a one-input elementwise op whose output has its input's shape."""
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


def register_binary(name: str, description: str, reference: Ref, dtype_rule: DTypeRule = same_dtype) -> None:
    """Registers a two-input op with numpy broadcasting."""
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
