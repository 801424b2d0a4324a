"""The main job of `make demo` (kiln.demo), run on small versions of its two models."""

from __future__ import annotations

import sys

import attrs
import pytest

from kiln import demo, registry
from kiln.cli import main
from kiln.target import Target


def test_demo_shows_checks_and_times_both_models(capsys: pytest.CaptureFixture[str]) -> None:
    results = demo.main(demo.small_models(), repeat=1, onnx=False)
    out = capsys.readouterr().out
    assert [r.name for r in results] == ["mlp", "cnn"]
    for r in results:
        assert r.kernels > 0 and r.compile_s > 0 and r.kiln_s > 0 and r.numpy_s > 0
        assert r.max_abs_error < 1e-4
    assert "nn.conv2d" in results[1].ops and "nn.batch_norm" not in results[1].ops  # simplified away
    for heading in ("======== mlp", "======== cnn", "relay.transform.InferType", "relay.build's passes",
                    "fusion_report", "======== summary", "the registry behind it"):
        assert heading in out
    assert "nn.batch_norm(%0, %bn0_gamma" in out  # before the passes
    assert "Primitive=1" in out and "group 0 [out-elemwise-fusable]: nn.conv2d, add, nn.relu" in out
    assert out.count("against the reference interpreter: max abs error") == 2 and "MISMATCH" not in out
    assert "kiln runs at" in out and "x numpy's speed" in out
    losses = [float(v) for v in out.split("loss by step: ")[1].splitlines()[0].split()]
    assert len(losses) == 10 and losses[-1] < losses[0]  # the compiled SGD step trains


def test_a_wrong_result_stops_the_demo_with_an_error() -> None:
    model = demo.small_models()[0]
    wrong = attrs.evolve(model, numpy=lambda x: model.numpy(x) + 1)
    with pytest.raises(demo.DemoError, match="mlp: the compiled output differs from numpy"):
        demo.run_model(wrong, Target("llvm"), repeat=1)


def test_kiln_demo_runs_the_main_job_and_leaves_the_registry_as_it_was(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(demo, "default_models", demo.small_models)
    before = registry.Op.list_names()
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    assert out.count("kiln runs at") == 2
    assert registry.Op.list_names() == before


def test_without_the_onnx_extra_the_demo_says_what_it_would_add(monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "onnx", None)  # as if not installed: `import onnx` raises ImportError
    demo.run_onnx_models(repeat=1)
    assert capsys.readouterr().out == (
        "\n-- ONNX: skipped: the onnx package is not installed. pip install 'kiln[onnx]' adds this part: a CNN and "
        "a transformer block imported from ONNX, run and timed beside onnxruntime\n")
