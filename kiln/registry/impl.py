"""Implementations of an op: members of its `FStrategy` attribute family.

An op may have several implementations, each keyed by a target kind (or "*"
for any), a dtype constraint on its tensor inputs (or none), an optional label
and a priority: TensorFlow's kernel registry
(`Name("MatMul").Device(DEVICE_CPU).TypeConstraint<T>("T").Label("eigen")`)
and TVM's op strategies in one mechanism. They live in the op's column store
like every attribute: `.add_implementation("tiled", compute, schedule,
target="llvm")` in the op's chain (or `register_implementation(op, ...)`
outside it) sets `FStrategy[llvm:tiled]`, with the same plevel rules (the
same implementation twice at one plevel is an error naming both sites; a
higher plevel overrides), the same scopes, batches and watchers.

The op's `FCompute`, scheduled by its `FSchedule[kind]` (or `FSchedule`, or
the target kind's default schedule for the op's pattern), is one more
implementation: "generic", priority 0, at the plevel of what it was made of.
Lowering (`kiln.relay.backend.strategy`) picks among them; a label forced
through `PassContext(config={"relay.backend.use_label": {"nn.dense":
"naive"}})` restricts the choice to implementations carrying it.
"""

from __future__ import annotations

from collections.abc import Iterable

from kiln.errors import RegistryError
from kiln.registry.attr import Compute, FStrategy, Implementation, Schedule
from kiln.registry.op import Op, OpRegEntry, op_registry


class NoImplementationError(RegistryError):
    """No implementation of an op matches the target, dtypes and label asked for."""


def register_implementation(
    op_name: str,
    compute: Compute,
    schedule: Schedule | None,
    *,
    name: str,
    target: str = "*",
    dtypes: Iterable[str] | None = None,
    label: str | None = None,
    priority: int = 10,
    plevel: int = 10,
) -> Implementation:
    """Adds an implementation of `op_name` (`OpRegEntry.add_implementation`, outside a chain).

    Returns:
        The implementation that lowering sees for it now (a higher plevel's, if one is set).
    """
    entry = OpRegEntry(Op.get(op_name)).add_implementation(
        name, compute, schedule, target=target, dtypes=dtypes, label=label, priority=priority, plevel=plevel)
    impl = entry.key.get_attr(FStrategy[f"{target}:{name}"])
    assert impl is not None
    return impl


def implementations(op_name: str) -> tuple[Implementation, ...]:
    """The implementations registered for `op_name` (its `FStrategy` family), in the order they were set.

    The generic implementation made of `FCompute` is not among them: it depends on the target
    (`kiln.relay.backend.strategy.implementations_for` lists both).
    """
    op = Op.get(op_name)
    return tuple(slot.value for slot in op_registry().family_slots(FStrategy, op).values())
