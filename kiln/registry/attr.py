"""The op attribute keys, as named constants with the kind of value each expects.

Passes name these constants (`attr.TOpPattern`), never bare strings, so a typo
fails at import. `set_attr` refuses a value that the key does not accept.
New keys are declared with `registry.declare_attr_key`.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any

import attrs

from kiln.registry.attr_registry import AttrKey, instance_of, is_callable


class OpPattern(enum.IntEnum):
    """How an op's output relates to its inputs; FuseOps groups calls by it.

    The values are TVM's, and their order matters: fusion may merge an op into
    a group whose pattern is at least as general.
    """

    ELEMWISE = 0  # out[i] depends on in[i] only
    BROADCAST = 1  # elementwise with broadcasting
    INJECTIVE = 2  # each output element reads some input elements (reshape, transpose)
    COMM_REDUCE = 3  # commutative reduction
    OUT_ELEMWISE_FUSABLE = 4  # complex op whose output elementwise ops can fuse (conv2d, dense)
    TUPLE = 7  # builds a tuple
    OPAQUE = 8  # never fused


@attrs.frozen
class TypeRelation:
    """A named type relation: `fn(arg_types, attrs) -> out_type | None`.

    None means "not yet": an input type is still unknown. The name is a label
    for messages and exports; it is not a global table entry.
    """

    name: str
    fn: Callable[..., Any] = attrs.field(eq=False)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)


TOpPattern: AttrKey[OpPattern] = AttrKey(
    "TOpPattern", "an OpPattern", instance_of(OpPattern), "fusion pattern of the op"
)
FTypeRelation: AttrKey[TypeRelation] = AttrKey(
    "FTypeRelation",
    "a TypeRelation (use add_type_rel)",
    instance_of(TypeRelation),
    "type relation computing the output type from the argument types and attrs",
)
FCompute: AttrKey[Callable[..., Any]] = AttrKey(
    "FCompute", "a callable", is_callable, "(attrs, inputs, out_type) -> list of te tensors"
)
FSchedule: AttrKey[Callable[..., Any]] = AttrKey(
    "FSchedule", "a callable", is_callable, "(attrs, outs, target) -> te schedule"
)
FStrategy: AttrKey[Callable[..., Any]] = AttrKey(
    "FStrategy", "a callable", is_callable, "(attrs, inputs, out_type, target) -> implementations"
)
FPrimalGradient: AttrKey[Callable[..., Any]] = AttrKey(
    "FPrimalGradient", "a callable", is_callable, "(call, output_grad) -> list of input gradients"
)
TOpIsStateful: AttrKey[bool] = AttrKey(
    "TOpIsStateful", "a bool", instance_of(bool), "the op has side effects; passes must keep it"
)
FReference: AttrKey[Callable[..., Any]] = AttrKey(
    "FReference", "a callable", is_callable, "numpy reference: (attrs, *arrays) -> array or tuple"
)

OP_ATTR_KEYS: tuple[AttrKey[Any], ...] = (
    TOpPattern,
    FTypeRelation,
    FCompute,
    FSchedule,
    FStrategy,
    FPrimalGradient,
    TOpIsStateful,
    FReference,
)
