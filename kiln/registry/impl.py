"""The implementation table: how each op is computed and scheduled, per target and dtype.

An op may have several implementations, each keyed by a target kind (or "*"
for any), a dtype constraint on its tensor inputs (or none), an optional label
and a priority: TensorFlow's kernel registry
(`Name("MatMul").Device(DEVICE_CPU).TypeConstraint<T>("T").Label("eigen")`)
and TVM's op strategies in one mechanism. Lowering asks `select` for the
highest-priority implementation that matches the target and the input dtypes;
a label (forced through `PassContext(config={"relay.backend.use_label":
{"nn.dense": "naive"}})`) restricts the choice to implementations carrying it.

An implementation's `compute(attrs, inputs, out_type)` returns te tensors; its
`schedule(sch, anchor_outs, outs, target)` schedules them inside a fused
group's schedule, where the group's other (injective) stages are already
inlined. The table takes part in `registry.deferred()` batches and
`registry.scope()` like every registry.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import attrs

from kiln.errors import RegistryError
from kiln.registry import batch
from kiln.registry.site import Site

Compute = Callable[..., Any]  # (attrs, inputs: list[te.Tensor], out_type) -> list[te.Tensor]
Schedule = Callable[..., Any]  # (sch, anchor_outs, outs, target) -> None


class NoImplementationError(RegistryError):
    """No implementation of an op matches the target, dtypes and label asked for."""


@attrs.frozen(eq=False)
class Implementation:
    """One way to compute and schedule an op."""

    op_name: str
    name: str
    compute: Compute
    schedule: Schedule
    target: str = "*"  # a target kind name, or "*" for every target
    dtypes: frozenset[str] | None = None  # every tensor input's dtype must be one of these; None: any
    label: str | None = None
    priority: int = 10
    site: Site | None = None

    def matches(self, target_kind: str, dtypes: Iterable[str], label: str | None) -> bool:
        """Whether this implementation serves `target_kind`, input `dtypes` and (if given) `label`."""
        if self.target not in ("*", target_kind):
            return False
        if self.dtypes is not None and any(d not in self.dtypes for d in dtypes):
            return False
        return label is None or self.label == label

    def describe(self) -> str:
        """One line: name, target, dtypes, label, priority and where it was registered."""
        dts = "any dtype" if self.dtypes is None else "/".join(sorted(self.dtypes))
        label = f", label {self.label!r}" if self.label else ""
        return f"{self.name} (target {self.target}, {dts}{label}, priority {self.priority}, at {self.site})"


class ImplementationTable:
    """Implementations per op name, guarded by the registry lock."""

    def __init__(self) -> None:
        self._impls: dict[str, tuple[Implementation, ...]] = {}

    # -- the Snapshottable protocol (deferred batches, scopes) ------------------------
    def find(self, name: str) -> Any:
        return self._impls.get(name)

    def _snapshot(self) -> object:
        return dict(self._impls)

    def _restore(self, state: Any) -> None:
        self._impls = dict(state)

    # -- registration and lookup --------------------------------------------------------
    def register(self, impl: Implementation) -> Implementation:
        """Adds `impl`; the same (op, name, target, label) twice is an error naming both sites."""
        with batch.LOCK:
            old = self._impls.get(impl.op_name, ())
            for other in old:
                if (other.name, other.target, other.label) == (impl.name, impl.target, impl.label):
                    raise RegistryError(
                        f"implementation {impl.name!r} of op {impl.op_name!r} for target {impl.target!r} is "
                        f"registered twice: at {other.site} and at {impl.site}; give it another name or label"
                    )
            self._impls[impl.op_name] = (*old, impl)
        return impl

    def of(self, op_name: str) -> tuple[Implementation, ...]:
        """Every implementation of `op_name`, in registration order."""
        with batch.LOCK:
            return self._impls.get(op_name, ())

    def select(self, op_name: str, target_kind: str, dtypes: Iterable[str], label: str | None = None) -> Implementation:
        """The highest-priority implementation matching (the latest registered among equals).

        Raises:
            NoImplementationError: naming the op, target, dtypes and label, and listing what is registered.
        """
        dts = tuple(dtypes)
        impls = self.of(op_name)
        best: Implementation | None = None
        for impl in impls:
            if impl.matches(target_kind, dts, label) and (best is None or impl.priority >= best.priority):
                best = impl
        if best is None:
            asked = f"target {target_kind!r}, input dtypes {list(dts)}" + (f", label {label!r}" if label else "")
            listing = "; ".join(i.describe() for i in impls) or "none"
            raise NoImplementationError(
                f"op {op_name!r} has no implementation for {asked}; registered: {listing}"
            )
        return best


TABLE = ImplementationTable()
batch.add_registry("implementation", TABLE)


def register_implementation(
    op_name: str,
    compute: Compute,
    schedule: Schedule,
    *,
    name: str = "generic",
    target: str = "*",
    dtypes: Iterable[str] | None = None,
    label: str | None = None,
    priority: int = 10,
) -> Implementation:
    """Registers an implementation of `op_name` (see the module docstring)."""
    if not isinstance(priority, int):
        raise RegistryError(f"implementation {name!r} of op {op_name!r}: priority must be an int, got {priority!r}")
    if not callable(compute) or not callable(schedule):
        raise RegistryError(f"implementation {name!r} of op {op_name!r}: compute and schedule must be callables")
    impl = Implementation(op_name, name, compute, schedule, target,
                          None if dtypes is None else frozenset(dtypes), label, priority, Site.here())
    return TABLE.register(impl)


def implementations(op_name: str) -> tuple[Implementation, ...]:
    """Every implementation registered for `op_name`."""
    return TABLE.of(op_name)


def select_implementation(
    op_name: str, target_kind: str, dtypes: Iterable[str], label: str | None = None
) -> Implementation:
    """`TABLE.select`: the implementation lowering uses."""
    return TABLE.select(op_name, target_kind, dtypes, label)
