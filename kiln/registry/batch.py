"""Registration events, watchers, deferred batches and scopes, over every registry.

All registries share one re-entrant lock. That is what lets `deferred()` commit a
batch that spans op, target-kind and tag registrations atomically, and lets
`scope()` snapshot and restore all of them together.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol, cast

import attrs

from kiln.errors import RegistryError
from kiln.registry.site import Site

LOCK = threading.RLock()
_TLS = threading.local()


class Snapshottable(Protocol):
    """What a registry offers to batches and scopes."""

    def find(self, name: str) -> Any: ...
    def _snapshot(self) -> object: ...
    def _restore(self, state: Any) -> None: ...


_REGISTRIES: dict[str, Snapshottable] = {}


def registries() -> dict[str, Snapshottable]:
    """Returns every registry by kind ("op", "target kind", "target tag")."""
    with LOCK:
        return dict(_REGISTRIES)


def add_registry(kind: str, registry: Snapshottable) -> None:
    """Makes `registry` part of every deferred batch and scope."""
    with LOCK:
        if kind in _REGISTRIES:
            raise RegistryError(f"a registry of kind {kind!r} exists already")
        _REGISTRIES[kind] = registry


@attrs.frozen
class RegistrationEvent:
    """What a watcher is told about one registration.

    `outcome` is "ok" (applied), "overridden" (a higher plevel replaced a value),
    "ignored" (a lower plevel lost to an existing value), "error" (refused; the
    message says why) or "rolled_back" (applied inside a `deferred()` batch that
    was then rolled back).
    """

    registry: str
    name: str
    action: str
    outcome: str
    site: Site
    attr: str | None = None
    plevel: int | None = None
    message: str = ""


Watcher = Callable[[RegistrationEvent], None]
_WATCHERS: list[Watcher] = []


def add_watcher(fn: Watcher) -> Watcher:
    """Calls `fn(event)` for every registration from now on; returns `fn`.

    Watchers run after the registration, outside the registry lock, in the
    registering thread; in a `deferred()` batch, when the batch ends. A watcher
    that raises does not undo the registration or keep the other watchers from
    hearing of it; its error is raised from the registering call afterwards.
    """
    with LOCK:
        _WATCHERS.append(fn)
    return fn


def remove_watcher(fn: Watcher) -> None:
    """Stops calling `fn`."""
    with LOCK:
        _WATCHERS.remove(fn)


def _pending() -> list[RegistrationEvent]:
    events: list[RegistrationEvent] | None = getattr(_TLS, "events", None)
    if events is None:
        events = _TLS.events = []
    return events


def _batch() -> _Batch | None:
    return cast("_Batch | None", getattr(_TLS, "batch", None))


def _deliver() -> None:
    events = _pending()
    if not events:
        return
    todo = list(events)
    events.clear()
    with LOCK:
        watchers = list(_WATCHERS)
    failure: BaseException | None = None
    for event in todo:
        for fn in watchers:
            try:
                fn(event)
            except Exception as err:  # every watcher hears every event; the first error is re-raised
                failure = failure or err
    if failure is not None:
        raise RegistryError(f"a registry watcher raised {type(failure).__name__}: {failure}") from failure


@contextmanager
def mutation() -> Iterator[None]:
    """Holds the lock for one registration; delivers its events afterwards."""
    try:
        with LOCK:
            yield
    finally:
        if _batch() is None:
            _deliver()


def touch(kind: str, name: str) -> None:
    """Records that entry `name` of registry `kind` changed (for the batch's commit checks)."""
    batch = _batch()
    if batch is not None:
        batch.touched.add((kind, name))


def emit(event: RegistrationEvent) -> None:
    """Queues `event` for the watchers; an error inside a batch dooms the batch."""
    batch = _batch()
    if batch is not None and event.outcome == "error":
        batch.errors.append(event)
    _pending().append(event)


@attrs.define
class _Batch:
    states: dict[str, object]
    touched: set[tuple[str, str]] = attrs.Factory(set)
    errors: list[RegistrationEvent] = attrs.Factory(list)


# Checks run on the entries a deferred batch touched, before it commits;
# each raises RegistryError for an entry whose declaration is incomplete.
_COMMIT_CHECKS: dict[str, Callable[[Any], None]] = {}


def add_commit_check(kind: str, check: Callable[[Any], None]) -> None:
    """Runs `check(key)` on every entry of registry `kind` that a deferred batch touched."""
    _COMMIT_CHECKS[kind] = check


def _snapshot_all() -> dict[str, object]:
    return {kind: reg._snapshot() for kind, reg in _REGISTRIES.items()}


def _restore_all(states: dict[str, object]) -> None:
    for kind, reg in _REGISTRIES.items():
        if kind in states:
            reg._restore(states[kind])


@contextmanager
def deferred() -> Iterator[None]:
    """Batches registrations and commits them all or none.

    Inside the block, registrations apply at once for this thread; other threads
    wait for the block to end, so they never see half of a batch. An exception,
    or any registration error (even one caught inside the block), rolls back the
    whole batch. Entries the batch touched are checked for completeness (an op
    declaring 3 inputs has 3 arguments) before it commits. Watchers hear of the
    batch's registrations when it ends: as they were, or as "rolled_back".
    Nested batches join the outermost one.
    """
    if _batch() is not None:
        yield
        return
    try:
        with LOCK:
            batch = _Batch(_snapshot_all())
            _TLS.batch = batch
            try:
                yield
                _check_batch(batch)
            except BaseException:
                _restore_all(batch.states)
                events = _pending()
                events[:] = [
                    e if e.outcome in ("error", "ignored") else attrs.evolve(e, outcome="rolled_back")
                    for e in events
                ]
                raise
            finally:
                _TLS.batch = None
    finally:
        _deliver()


def _check_batch(batch: _Batch) -> None:
    if batch.errors:
        first = batch.errors[0]
        raise RegistryError(
            f"deferred registration batch rolled back: {len(batch.errors)} registration(s) failed; "
            f"first: {first.message} (at {first.site})"
        )
    for kind, name in sorted(batch.touched):
        check = _COMMIT_CHECKS.get(kind)
        key = _REGISTRIES[kind].find(name)
        if check is not None and key is not None:
            check(key)


@contextmanager
def scope() -> Iterator[None]:
    """Snapshots every registry and restores it when the block ends.

    Tests use it to register throwaway ops. Registrations made by other threads
    while the block runs are undone too, and so are those of a module first
    imported inside the block (Python will not import it again): `import kiln`
    registers kiln's own op library before any scope can open.
    """
    with LOCK:
        states = _snapshot_all()
    try:
        yield
    finally:
        with LOCK:
            _restore_all(states)
