"""The registry under concurrency, in deferred batches, with watchers, and in scopes."""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator

import pytest

from kiln import registry
from kiln.errors import RegistryError
from kiln.registry import Op, OpPattern, RegistrationEvent, attr, register_op

THREADS = 8
PER_THREAD = 40


@pytest.fixture
def fast_switching() -> Iterator[None]:
    """Makes the interpreter switch threads as often as it can, to shake out races."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(old)


def _reference(attrs: object, x: object) -> object:
    return x


@pytest.mark.usefixtures("fast_switching")
def test_eight_threads_registering_and_reading_lose_nothing_and_see_no_half_built_op() -> None:
    rank = registry.declare_attr_key("TTestRank", "an int", registry.instance_of(int))
    built_in = len(Op.get_attr_map(attr.TOpPattern))
    start = threading.Barrier(2 * THREADS)
    writers_done = threading.Event()
    failures: list[str] = []

    def writer(t: int) -> None:
        start.wait()
        for i in range(PER_THREAD):
            with registry.deferred():  # a whole op at once
                (
                    register_op(f"conc.op_{t}_{i}")
                    .describe(f"op {t} {i}")
                    .set_num_inputs(2)
                    .add_argument("a", "Tensor")
                    .add_argument("b", "Tensor")
                    .set_attr(attr.TOpPattern, OpPattern.BROADCAST)
                    .set_attr(attr.FReference, _reference)
                )
            # every thread races on the same shared names, each at its own plevel
            registry.op_registry().register_or_get(f"conc.shared_{i}").set_attr(rank, t, plevel=t + 1)

    def reader() -> None:
        start.wait()
        while not writers_done.is_set():
            for name in Op.list_names():
                op = Op.get(name)
                if name.startswith("conc.op_"):
                    meta = op.meta
                    complete = (
                        meta.description
                        and len(meta.arguments) == 2
                        and meta.num_inputs == 2
                        and op.get_attr(attr.TOpPattern) is OpPattern.BROADCAST
                        and op.get_attr(attr.FReference) is _reference
                    )
                    if not complete:
                        failures.append(f"half-built {name}: {meta}")
            for op, value in Op.get_attr_map(attr.TOpPattern).items():
                if Op.get(op.name) is not op or (op.name.startswith("conc.") and value is not OpPattern.BROADCAST):
                    failures.append(f"inconsistent attr map entry {op}")

    writers = [threading.Thread(target=writer, args=(t,)) for t in range(THREADS)]
    readers = [threading.Thread(target=reader) for _ in range(THREADS)]
    for th in writers + readers:
        th.start()
    for th in writers:
        th.join()
    writers_done.set()
    for th in readers:
        th.join()

    assert failures == []
    names = Op.list_names()
    assert len(names) == len(set(names))
    ops = [Op.get(n) for n in names]
    assert [op.index for op in ops] == sorted(op.index for op in ops)
    assert len({op.index for op in ops}) == len(ops)
    for t in range(THREADS):
        for i in range(PER_THREAD):
            op = Op.get(f"conc.op_{t}_{i}")
            assert op.description == f"op {t} {i}" and op.num_inputs == 2
    for i in range(PER_THREAD):
        assert Op.get(f"conc.shared_{i}").get_attr(rank) == THREADS - 1  # the highest plevel won
    assert len(Op.get_attr_map(attr.TOpPattern)) == built_in + THREADS * PER_THREAD
    assert len(Op.get_attr_map(rank)) == PER_THREAD


# --- deferred ------------------------------------------------------------------


def test_deferred_commits_the_whole_batch() -> None:
    with registry.deferred():
        register_op("batch.a").set_num_inputs(1).add_argument("x", "Tensor")
        register_op("batch.b").set_attr(attr.TOpPattern, OpPattern.ELEMWISE)
        assert Op.get("batch.a").num_inputs == 1  # visible inside the batch to its own thread
    assert Op.get("batch.b").get_attr(attr.TOpPattern) is OpPattern.ELEMWISE


def test_deferred_rolls_back_everything_on_an_exception() -> None:
    register_op("batch.kept").set_attr(attr.TOpPattern, OpPattern.ELEMWISE)
    before = Op.list_names()
    with pytest.raises(ValueError, match="boom"), registry.deferred():
        register_op("batch.new").describe("new")
        Op.get("batch.kept").set_attr(attr.TOpPattern, OpPattern.OPAQUE, plevel=20)
        raise ValueError("boom")
    assert Op.list_names() == before
    assert Op.get("batch.kept").get_attr(attr.TOpPattern) is OpPattern.ELEMWISE


def test_deferred_rolls_back_even_when_the_error_was_caught_inside() -> None:
    register_op("batch.dup").set_attr(attr.TOpPattern, OpPattern.ELEMWISE)
    with pytest.raises(RegistryError, match="batch rolled back: 1 registration.*set twice at plevel 10"):  # noqa: SIM117
        with registry.deferred():
            register_op("batch.other").describe("other")
            with contextlib.suppress(RegistryError):
                Op.get("batch.dup").set_attr(attr.TOpPattern, OpPattern.OPAQUE)
    assert "batch.other" not in Op.list_names()


def test_deferred_refuses_an_incomplete_op_at_commit() -> None:
    with pytest.raises(RegistryError, match="batch.half declares 3 inputs"), registry.deferred():
        register_op("batch.half").set_num_inputs(3).add_argument("x", "Tensor")
    assert "batch.half" not in Op.list_names()


def test_nested_deferred_joins_the_outer_batch() -> None:
    with pytest.raises(KeyError), registry.deferred():
        with registry.deferred():
            register_op("batch.inner").describe("inner")
        assert "batch.inner" in Op.list_names()
        raise KeyError("outer fails")
    assert "batch.inner" not in Op.list_names()


def test_other_threads_never_see_an_open_batch() -> None:
    inside = threading.Event()
    seen: list[bool] = []

    def look() -> None:
        inside.wait()
        seen.append("batch.slow" in Op.list_names())

    looker = threading.Thread(target=look)
    looker.start()
    with registry.deferred():
        register_op("batch.slow").describe("first half")
        inside.set()
        looker.join(timeout=0.2)  # the looker blocks on the registry until the batch ends
        assert looker.is_alive()
        Op.get("batch.slow").set_attr(attr.TOpPattern, OpPattern.ELEMWISE)
    looker.join()
    assert seen == [True]


# --- watchers ---------------------------------------------------------------------


def test_watchers_see_every_registration_with_its_outcome() -> None:
    events: list[RegistrationEvent] = []
    watcher = registry.add_watcher(events.append)
    try:
        entry = register_op("watch.a").set_attr(attr.TOpPattern, OpPattern.ELEMWISE)
        entry.set_attr(attr.TOpPattern, OpPattern.OPAQUE, plevel=20)
        entry.set_attr(attr.TOpPattern, OpPattern.BROADCAST, plevel=5)
        with pytest.raises(RegistryError):
            entry.set_attr(attr.TOpPattern, OpPattern.BROADCAST, plevel=20)
        with pytest.raises(RegistryError):
            register_op("Watch")
        with pytest.raises(RegistryError):
            register_op("watch.a")  # defined already
    finally:
        registry.remove_watcher(watcher)
    register_op("watch.after")  # not seen: the watcher is gone
    summary = [(e.action, e.name, e.attr, e.plevel, e.outcome) for e in events]
    assert summary == [
        ("register", "watch.a", None, None, "ok"),
        ("set_attr", "watch.a", "TOpPattern", 10, "ok"),
        ("set_attr", "watch.a", "TOpPattern", 20, "overridden"),
        ("set_attr", "watch.a", "TOpPattern", 5, "ignored"),
        ("set_attr", "watch.a", "TOpPattern", 20, "error"),
        ("register", "Watch", None, None, "error"),
        ("register", "watch.a", None, None, "error"),
    ]
    assert events[0].registry == "op"
    assert "test_batch.py" in str(events[1].site)
    assert "set twice" in events[4].message


def test_watchers_hear_of_a_batch_when_it_ends() -> None:
    events: list[RegistrationEvent] = []
    watcher = registry.add_watcher(events.append)
    try:
        with registry.deferred():
            register_op("watch.ok").describe("fine")
            assert events == []  # nothing delivered while the batch is open
        assert [e.outcome for e in events] == ["ok", "ok"]
        events.clear()
        with pytest.raises(RuntimeError), registry.deferred():
            register_op("watch.gone").describe("rolled back")
            raise RuntimeError
        assert [(e.action, e.outcome) for e in events] == [
            ("register", "rolled_back"),
            ("set_description", "rolled_back"),
        ]
    finally:
        registry.remove_watcher(watcher)


def test_a_raising_watcher_does_not_silence_the_others() -> None:
    heard: list[str] = []

    def broken(event: RegistrationEvent) -> None:
        raise ValueError("watcher bug")

    def listening(event: RegistrationEvent) -> None:
        heard.append(event.name)

    registry.add_watcher(broken)
    registry.add_watcher(listening)
    try:
        with pytest.raises(RegistryError, match="a registry watcher raised ValueError: watcher bug"):
            register_op("watch.noisy")
    finally:
        registry.remove_watcher(broken)
        registry.remove_watcher(listening)
    assert heard == ["watch.noisy"]
    assert "watch.noisy" in Op.list_names()  # the registration stands


# --- scope --------------------------------------------------------------------------


def test_scope_restores_entries_attributes_and_metadata() -> None:
    pattern = Op.get_attr_map(attr.TOpPattern)
    built_in = len(pattern)
    register_op("scope.kept").describe("kept").set_attr(attr.TOpPattern, OpPattern.ELEMWISE)
    kept = Op.get("scope.kept")
    registry.declare_attr_key("TScoped", "an int", registry.instance_of(int))
    names = Op.list_names()
    with registry.scope():
        register_op("scope.throwaway").describe("gone soon").set_attr(attr.TOpPattern, OpPattern.OPAQUE)
        kept.set_attr(attr.TOpPattern, OpPattern.OPAQUE, plevel=99).add_argument("x", "T")
        registry.declare_attr_key("TInner", "an int", registry.instance_of(int))
        throwaway = Op.get("scope.throwaway")
        assert len(pattern) == built_in + 2
    assert Op.list_names() == names
    assert Op.get("scope.kept") is kept  # the same interned object survives
    assert kept.get_attr(attr.TOpPattern) is OpPattern.ELEMWISE
    assert kept.arguments == ()
    assert len(pattern) == built_in + 1
    assert registry.op_registry().attr_key("TScoped").name == "TScoped"
    with pytest.raises(LookupError, match="TInner"):
        registry.op_registry().attr_key("TInner")
    with pytest.raises(RegistryError, match="registered inside a registry.scope"):
        throwaway.get_attr(attr.TOpPattern)


def test_scope_restores_after_an_exception_and_covers_target_registries() -> None:
    from kiln.target import TargetKind, TargetTag, register_tag

    with pytest.raises(ZeroDivisionError), registry.scope():
        register_op("scope.err").describe("x")
        register_tag("test/gpu", {"kind": "cuda", "arch": "sm_75"})
        assert "test/gpu" in TargetTag.list_names()
        _ = 1 / 0
    assert "scope.err" not in Op.list_names()
    assert "test/gpu" not in TargetTag.list_names()
    assert TargetKind.list_names()[:2] == ["llvm", "cuda"]
