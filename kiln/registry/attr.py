"""The op attribute keys, as named constants with the kind of value each expects.

Passes name these constants (`attr.TOpPattern`), never bare strings, so a typo
fails at import. `set_attr` refuses a value that the key does not accept.
New keys are declared with `registry.declare_attr_key`.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from typing import Any

import attrs

from kiln.errors import KilnError
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


class RelationError(KilnError, TypeError):
    """A type relation refused its inputs; `arg` is the index of the argument at fault, if one is."""

    def __init__(self, message: str, arg: int | None = None) -> None:
        super().__init__(message)
        self.arg = arg


@attrs.frozen
class TypeRelation:
    """A named type relation: `fn(arg_types, attrs) -> out_type | None`.

    None means "not yet": an input type is still unknown; bad input raises
    `RelationError`. The name is a label for messages and exports; it is not a
    global table entry.
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
Compute = Callable[..., Any]  # (attrs, inputs: list[te.Tensor], out_type) -> list[te.Tensor]
Schedule = Callable[..., Any]  # (sch, anchor_outs, outs, target) -> None


@attrs.frozen
class Implementation:
    """One way to compute and schedule an op: a member of its `FStrategy` family.

    Lowering takes, among the implementations that match the target kind, the
    input dtypes and (when one is forced) the label, the one of the highest
    plevel, then the highest priority, then the latest set. An op's `FCompute`
    with its `FSchedule` for the target is its "generic" implementation, of
    priority 0. Equal implementations (same functions, same keys) lower alike,
    so an implementation is part of the kernel cache's key.
    """

    op_name: str
    name: str
    compute: Compute
    schedule: Schedule | None  # None: the target kind's default schedule for the op's pattern
    target: str = "*"  # a target kind name, or "*" for every target
    dtypes: frozenset[str] | None = None  # every tensor input's dtype must be one of these; None: any
    label: str | None = None
    priority: int = 10
    plevel: int = 10
    site: Any = attrs.field(default=None, eq=False)  # where it was registered (a Site)

    def matches(self, target_kind: str, dtypes: Iterable[str], label: str | None) -> bool:
        """Whether this implementation serves `target_kind`, input `dtypes` and (if given) `label`."""
        if self.target not in ("*", target_kind):
            return False
        if self.dtypes is not None and any(d not in self.dtypes for d in dtypes):
            return False
        return label is None or self.label == label

    def rank(self) -> tuple[int, int]:
        """How lowering orders matching implementations: plevel first, then priority."""
        return (self.plevel, self.priority)

    def describe(self) -> str:
        """One line: name, target, dtypes, label, plevel, priority and where it was registered."""
        dts = "any dtype" if self.dtypes is None else "/".join(sorted(self.dtypes))
        label = f", label {self.label!r}" if self.label else ""
        return (f"{self.name} (target {self.target}, {dts}{label}, plevel {self.plevel}, "
                f"priority {self.priority}, at {self.site})")


FCompute: AttrKey[Compute] = AttrKey(
    "FCompute", "a callable", is_callable,
    "(attrs, inputs, out_type) -> list of te tensors: what the op computes, for every target",
)
FSchedule: AttrKey[Schedule] = AttrKey(
    "FSchedule", "a callable", is_callable,
    "(sch, anchor_outs, outs, target) -> None: schedules FCompute; FSchedule[kind] for one target kind",
    qualified_by="a target kind name",
)
FStrategy: AttrKey[Implementation] = AttrKey(
    "FStrategy", "an Implementation (use registry.register_implementation)", instance_of(Implementation),
    "more implementations of the op: FStrategy[target:name]",
    qualified_by="'target:name'",
)
FAlterOpLayout: AttrKey[Callable[..., Any]] = AttrKey(
    "FAlterOpLayout", "a callable", is_callable,
    "(attrs, args, arg_types, target) -> Expr | None: the call rewritten for one target kind, its constant "
    "operands in the layout its fast implementation reads (FoldConstant then transforms them at build time); "
    "FAlterOpLayout[kind]",
    qualified_by="a target kind name",
)
FPrimalGradient: AttrKey[Callable[..., Any]] = AttrKey(
    "FPrimalGradient", "a callable", is_callable, "(call, output_grad) -> list of input gradients"
)
TNonDifferentiable: AttrKey[str] = AttrKey(
    "TNonDifferentiable", "a str", instance_of(str),
    "why the op has no gradient (comparisons, argmax, integer shape ops): asking for one names the op and this",
)
TOpIsStateful: AttrKey[bool] = AttrKey(
    "TOpIsStateful", "a bool", instance_of(bool), "the op has side effects; passes must keep it"
)
FReference: AttrKey[Callable[..., Any]] = AttrKey(
    "FReference", "a callable", is_callable, "numpy reference: (attrs, *arrays) -> array or tuple"
)
FSizeCheck: AttrKey[Callable[..., Any]] = AttrKey(
    "FSizeCheck", "a callable", is_callable,
    "(attrs, arg_types) -> list of (small, large, what): what the relation assumed of symbolic dims, "
    "small <= large, checked when the sizes are known and before any kernel runs",
)

OP_ATTR_KEYS: tuple[AttrKey[Any], ...] = (
    TOpPattern,
    FTypeRelation,
    FCompute,
    FSchedule,
    FStrategy,
    FAlterOpLayout,
    FPrimalGradient,
    TNonDifferentiable,
    TOpIsStateful,
    FReference,
    FSizeCheck,
)
