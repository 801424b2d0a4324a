"""Which implementation of an op lowering uses on a target: what `relay.build` reads from the registry.

An op's implementations are its `FStrategy` family (`registry.register_implementation`)
and its generic implementation: `FCompute`, scheduled by `FSchedule[kind]`, else
`FSchedule`, else the target kind's `FDefaultSchedule` for the op's pattern.
Among those that match the target kind, the input dtypes and a forced label,
the one of the highest plevel wins, then the highest priority, then the one set
last: a user's `set_attr(FCompute, f, plevel=20)` beats every implementation
the op library registered at plevel 10, and among the library's own the
priority decides ("tiled" at 10 over "generic" at 0).
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from kiln.registry import Implementation, NoImplementationError, Op, OpPattern, attr, implementations, op_registry
from kiln.target import FDefaultSchedule, Target, TargetKind


def generic_implementation(op: Op, kind: TargetKind) -> Implementation | None:
    """The implementation made of `op`'s FCompute and its FSchedule for `kind` (None without FCompute).

    Without an FSchedule its schedule is None: the target kind's default, which `select_implementation`
    resolves.
    """
    registry = op_registry()
    compute = registry.slot(attr.FCompute, op)
    if compute is None:
        return None
    schedule = registry.slot(attr.FSchedule[kind.name], op) or registry.slot(attr.FSchedule, op)
    plevel = compute.plevel if schedule is None else max(compute.plevel, schedule.plevel)
    return Implementation(op.name, "generic", compute.value, None if schedule is None else schedule.value,
                          kind.name, plevel=plevel, priority=0, site=compute.site)


def implementations_for(op: Op, kind: TargetKind) -> list[Implementation]:
    """Every implementation of `op` that serves target kind `kind` (any dtype, any label), generic first."""
    found = [i for i in implementations(op.name) if i.target in ("*", kind.name)]
    generic = generic_implementation(op, kind)
    return found if generic is None else [generic, *found]


def select_implementation(op: Op | str, target: Target | TargetKind | str, dtypes: Iterable[str],
                          label: str | None = None) -> Implementation:
    """The implementation lowering uses for a call of `op` on `target` with tensor inputs of `dtypes`.

    Raises:
        NoImplementationError: naming the op, target, dtypes and label, and listing what is registered.
    """
    op = op if isinstance(op, Op) else Op.get(op)
    kind = target.kind if isinstance(target, Target) else target if isinstance(target, TargetKind) else \
        TargetKind.get(target)
    dts = tuple(str(d) for d in dtypes)
    candidates = implementations_for(op, kind)
    best: Implementation | None = None
    for impl in candidates:  # in the order they were set: the later wins a tie
        if impl.matches(kind.name, dts, label) and (best is None or impl.rank() >= best.rank()):
            best = impl
    if best is None:
        asked = f"target {kind.name!r}, input dtypes {list(dts)}" + (f", label {label!r}" if label else "")
        listing = "; ".join(i.describe() for i in candidates) or "none (the op has no FCompute)"
        raise NoImplementationError(f"op {op.name!r} has no implementation for {asked}; registered: {listing}")
    if best.schedule is None:  # the target kind's default schedule for the op's pattern
        by_pattern = kind.get_attr(FDefaultSchedule)
        if by_pattern is None:
            raise NoImplementationError(f"op {op.name!r}: implementation {best.name!r} has no schedule, and target "
                                        f"kind {kind.name!r} has no default schedule (FDefaultSchedule)")
        best = attrs.evolve(best, schedule=by_pattern(op.get_attr(attr.TOpPattern, OpPattern.OPAQUE)))
    return best
