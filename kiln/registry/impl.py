"""Implementations of an op: members of its `FStrategy` attribute family.

An op may have several implementations, each keyed by a target kind (or "*"
for any), a dtype constraint on its tensor inputs (or none), an optional label
and a priority: TensorFlow's kernel registry
(`Name("MatMul").Device(DEVICE_CPU).TypeConstraint<T>("T").Label("eigen")`)
and TVM's op strategies in one mechanism. They live in the op's column store
like every attribute: `register_implementation(op, ..., name="tiled",
target="llvm")` sets `FStrategy[llvm:tiled]`, with the same plevel rules (the
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
from kiln.registry.op import Op, op_registry
from kiln.registry.site import Site


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
    """Adds an implementation of `op_name`: sets its `FStrategy[target:name]` at `plevel`.

    Args:
        op_name: the op.
        compute: `(attrs, inputs, out_type) -> list of te tensors`.
        schedule: `(sch, anchor_outs, outs, target) -> None`; None for the target's default schedule.
        name: the implementation's name, unique per op and target.
        target: a target kind name, or "*" for every target.
        dtypes: the dtypes every tensor input must have; None for any.
        label: a label that `relay.backend.use_label` can force.
        priority: orders implementations of one plevel (higher wins).
        plevel: the attribute's plevel (a higher one overrides, as for every attribute).

    Returns:
        The implementation, as stored.
    """
    where = f"implementation {name!r} of op {op_name!r}"
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise RegistryError(f"{where}: priority must be an int, got {priority!r}")
    if not callable(compute) or not (schedule is None or callable(schedule)):
        raise RegistryError(f"{where}: compute must be a callable and schedule a callable or None")
    if not isinstance(name, str) or not name:
        raise RegistryError(f"implementation of op {op_name!r}: name must be a non-empty string, got {name!r}")
    impl = Implementation(op_name, name, compute, schedule, target, None if dtypes is None else frozenset(dtypes),
                          label, priority, plevel, Site.here())
    op_registry().update_attr(FStrategy[f"{target}:{name}"], Op.get(op_name), impl, plevel, impl.site)
    return impl


def implementations(op_name: str) -> tuple[Implementation, ...]:
    """The implementations registered for `op_name` (its `FStrategy` family), in the order they were set.

    The generic implementation made of `FCompute` is not among them: it depends on the target
    (`kiln.relay.backend.strategy.implementations_for` lists both).
    """
    op = Op.get(op_name)
    return tuple(slot.value for slot in op_registry().family_slots(FStrategy, op).values())
