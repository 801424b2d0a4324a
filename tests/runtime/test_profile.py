"""Per-kernel profiles (kiln.runtime.profile, GraphExecutor.profile): rows, sums, names, outputs.

No test asserts a speed: timings on a shared machine say nothing; what is checked is that
every launch and kernel is accounted for, the sums and shares agree, and the profiled runs
compute what plain runs do.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import cuda_standin
import numpy as np
import pytest

from kiln import relay
from kiln.ir.span import Span, span_scope
from kiln.relay.backend.build_module import build
from kiln.runtime import ExecutorError, Library
from kiln.runtime.library import Graph, Launch, Slot
from kiln.runtime.profile import made_by

RNG = np.random.default_rng(5)


def _softmax(a: np.ndarray) -> np.ndarray:
    e = np.exp(a - a.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def shared_kernel_model() -> tuple[Library, Callable[[np.ndarray], np.ndarray]]:
    """dense+relu, then softmax twice: the two softmax calls are one kernel launched twice."""
    w = RNG.standard_normal((16, 32)).astype("float32")
    x = relay.var("x", shape=(8, 32))
    with span_scope(Span("dense_1")):
        h = relay.nn.relu(relay.nn.dense(x, relay.const(w)))
    with span_scope(Span("softmax_2")):
        h = relay.nn.softmax(h)
    with span_scope(Span("softmax_3")):
        out = relay.nn.softmax(h)
    lib = build(relay.Function([x], out))
    return lib, lambda a: _softmax(_softmax(np.maximum(a @ w.T, 0)))


def test_every_launch_and_kernel_is_a_row_and_the_rows_sum_to_the_total() -> None:
    lib, twin = shared_kernel_model()
    assert len(lib.graph.launches) == 3 and len(lib.kernels) == 2
    ex = lib.create_executor()
    x = RNG.standard_normal((8, 32)).astype("float32")
    prof = ex.profile(repeat=5, x=x)

    assert [t.index for t in prof.launches] == [0, 1, 2]
    assert [t.kernel for t in prof.launches] == [lib.kernels[launch.kernel].name for launch in lib.graph.launches]
    assert sorted(k.kernel for k in prof.kernels) == sorted(m.name for m in lib.kernels)
    assert all(t.seconds >= 0 for t in prof.launches) and prof.repeat == 5
    assert math.isclose(sum(t.seconds for t in prof.launches), prof.total_seconds)
    assert math.isclose(sum(k.seconds for k in prof.kernels), prof.total_seconds)
    assert math.isclose(sum(k.share for k in prof.kernels), 1.0)
    assert [k.seconds for k in prof.kernels] == sorted((k.seconds for k in prof.kernels), reverse=True)

    (softmax,) = [k for k in prof.kernels if k.ops == ("nn.softmax",)]
    assert softmax.calls == 2 and softmax.sources == ("softmax_2", "softmax_3")
    assert math.isclose(softmax.seconds, sum(t.seconds for t in prof.launches if t.kernel == softmax.kernel))
    (dense,) = [k for k in prof.kernels if k.calls == 1]
    assert dense.ops == ("nn.dense", "nn.relu") and dense.sources == ("dense_1",)
    assert dense.outputs == softmax.outputs == ("float32[8, 16]",)

    text = str(prof)
    assert text.startswith("per-kernel profile: 2 kernels, 3 launches, median of 5 runs\n")
    for k in prof.kernels:
        assert k.kernel in text
    assert "nn.dense+nn.relu (at dense_1)" in text and "nn.softmax (at softmax_2, softmax_3)" in text
    assert "float32[8, 16]" in text and "100%" in text and "a whole run:" in text
    assert "other" not in text
    np.testing.assert_allclose(ex.get_output(0), twin(x), rtol=1e-5, atol=1e-6)


def test_a_profiled_run_computes_what_a_plain_run_does() -> None:
    lib, twin = shared_kernel_model()
    ex = lib.create_executor()
    x = RNG.standard_normal((8, 32)).astype("float32")
    ex.profile(repeat=3, warmup=0, x=x)  # the first timed run goes through the checked launches
    first = ex.get_output(0)
    np.testing.assert_allclose(first, twin(x), rtol=1e-5, atol=1e-6)
    ex.profile(repeat=2, x=x)  # the fast path
    second = ex.get_output(0)
    assert second is not first  # fresh outputs, as for run()
    np.testing.assert_allclose(second, twin(x), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(second, ex(x=x))


def test_the_table_shows_the_top_rows_then_the_rest_and_can_list_launches() -> None:
    pytest.importorskip("onnx")
    from kiln.relay.frontend import from_onnx
    from kiln.testing import onnx_models

    mod, params = from_onnx(onnx_models.cnn())
    lib = build(mod, params=params)
    ex = lib.create_executor()
    image = RNG.standard_normal((1, 3, 32, 32)).astype("float32")
    prof = ex.profile(repeat=3, input=image)
    assert len(prof.kernels) == len(lib.kernels) >= 5
    lines = prof.table(top=3).splitlines()
    assert len(lines) == 2 + 3 + 3  # title, header, three kernels, "other", total, whole run
    assert lines[5].startswith(f"other ({len(prof.kernels) - 3})")
    assert lines[6].split()[:2] == ["total", str(len(lib.graph.launches))]
    text = str(prof)
    assert "nn.conv2d" in text and "(at /Conv_1" in text and "nn.max_pool2d (at /MaxPool_4)" in text
    by_launch = prof.table(top=100, by="launch").splitlines()
    assert by_launch[1].split()[0] == "launch"
    assert sorted(line.split()[0] for line in by_launch[2:2 + len(prof.launches)]) == sorted(
        f"#{t.index}" for t in prof.launches)
    with pytest.raises(ValueError, match="by is 'kernel' or 'launch'"):
        prof.table(by="op")
    np.testing.assert_allclose(ex.get_output(0), ex(input=image), rtol=0, atol=0)


@pytest.mark.parametrize("repeat", [0, -1, True, 2.5])
def test_repeat_must_be_a_positive_int(repeat: Any) -> None:
    lib, _ = shared_kernel_model()
    with pytest.raises(ExecutorError, match="repeat must be an int of at least 1"):
        lib.create_executor().profile(repeat=repeat, x=np.zeros((8, 32), np.float32))


def test_profile_checks_its_inputs_as_run_does() -> None:
    lib, _ = shared_kernel_model()
    ex = lib.create_executor()
    with pytest.raises(ExecutorError, match="inputs not set"):
        ex.profile(repeat=1)
    with pytest.raises(ExecutorError, match="expected shape"):
        ex.profile(repeat=1, x=np.zeros((8, 31), np.float32))


def test_made_by_reads_the_ops_and_sources_from_the_value_names() -> None:
    def graph(name: str) -> Graph:
        slots = [Slot((2,), "float32", "input", "x"), Slot((2,), "float32", "output", name)]
        return Graph(slots, [Launch(0, (0,), (1,))], [0], [1], {})

    assert made_by(graph("nn.dense"), Launch(0, (0,), (1,))) == (("nn.dense",), ())
    assert made_by(graph("nn.conv2d+nn.relu (at conv_1, relu_2)"), Launch(0, (0,), (1,))) == (
        ("nn.conv2d", "nn.relu"), ("conv_1", "relu_2"))
    assert made_by(graph("split (at a, b, c, ...)[1]"), Launch(0, (0,), (1,))) == (("split",), ("a", "b", "c", "..."))
    assert made_by(graph("exp (at model.py:12)"), Launch(0, (0,), (1,))) == (("exp",), ("model.py:12",))
    assert made_by(graph(""), Launch(0, (0,), (1,))) == ((), ())


@cuda_standin.needs_gxx
def test_a_cuda_library_is_profiled_through_the_host_stand_in(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    launches = cuda_standin.install(monkeypatch, tmp_path)
    x = relay.var("x", shape=(4, 8))
    lib = build(relay.Function([x], relay.nn.relu(relay.exp(x))), target="cuda -arch=sm_90")
    a = RNG.standard_normal((4, 8)).astype("float32")
    prof = lib.create_executor().profile(repeat=2, x=a)
    assert [k.ops for k in prof.kernels] == [("exp", "nn.relu")] and prof.kernels[0].calls == 1
    assert len(launches) == 3  # a warm-up run and two timed ones
    assert "float32[4, 8]" in str(prof)
