"""The model zoo of kiln.testing.zoo: every model, at its small size, compiled by kiln and checked against onnxruntime.

Each small model keeps its architecture's graph (every op kind, every block
kind) at a size that compiles in seconds; its outputs must be non-degenerate
(finite, spread out) and kiln's must match onnxruntime's within rtol 1e-3 /
atol 1e-4. The real sizes are checked by their parameter counts, which equal
torchvision's, and timed by bench/zoo.py.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from kiln import relay  # noqa: E402
from kiln.relay.frontend import from_onnx  # noqa: E402
from kiln.testing import zoo  # noqa: E402


def _ort(model: Any, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return list(session.run(None, feed))


def _parameters(model: Any) -> int:
    """Trainable parameters as torch counts them: no running statistics, no constants export adds."""
    skip = ("running_", "const", "shape")
    return sum(int(np.prod(i.dims)) for i in model.graph.initializer if not any(s in i.name for s in skip))


@pytest.mark.parametrize("name", list(zoo.ZOO))
def test_small_zoo_model_matches_onnxruntime_with_spread_out_outputs(name: str) -> None:
    model = zoo.build(name, small=True)
    feed = zoo.inputs(model, seed=1)
    (want,) = _ort(model, feed)
    mod, params = from_onnx(model)
    got = relay.build(mod, params=params).create_executor()(**feed)
    assert np.isfinite(want).all()
    assert want.std() > 0.1, f"{name}: outputs nearly constant (std {want.std():.3g})"
    assert np.abs(want).max() < 100, f"{name}: outputs blow up (max {np.abs(want).max():.3g})"
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize(("name", "count"), [("squeezenet1_1", 1_235_496), ("mobilenet_v2", 3_504_872)])
def test_real_size_has_torchvisions_parameter_count(name: str, count: int) -> None:
    assert _parameters(zoo.build(name)) == count


def test_folding_batch_norms_leaves_no_batch_norm_and_the_same_outputs() -> None:
    kept = zoo.build("resnet50", small=True)
    folded = zoo.build("resnet50", small=True, fold_bn=True)
    ops = [n.op_type for n in kept.graph.node]
    assert "BatchNormalization" in ops and all(len(n.input) == 2 for n in kept.graph.node if n.op_type == "Conv")
    assert "BatchNormalization" not in [n.op_type for n in folded.graph.node]
    feed = zoo.inputs(kept)
    np.testing.assert_allclose(_ort(folded, feed)[0], _ort(kept, feed)[0], rtol=1e-4, atol=1e-4)


def test_every_batch_norm_has_running_statistics_measured_on_random_images() -> None:
    model = zoo.build("mobilenet_v2", small=True)
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    norms = [n for n in model.graph.node if n.op_type == "BatchNormalization"]
    assert len(norms) > 10
    for norm in norms:
        mean, var = inits[norm.input[3]], inits[norm.input[4]]
        assert np.isfinite(mean).all() and (var >= 0).all()
        assert np.abs(mean).max() > 0 and not np.allclose(var, 1.0)  # measured, not the default init


def test_inputs_gives_token_ids_below_the_vocabulary_and_a_padding_mask() -> None:
    model = zoo.build("bert_base", small=True)
    feed = zoo.inputs(model)
    assert set(feed) == {"input_ids", "attention_mask"}
    assert feed["input_ids"].dtype == np.int64 and 0 <= feed["input_ids"].min() <= feed["input_ids"].max() < 100
    assert feed["attention_mask"].tolist() == [[1] * 12 + [0] * 4]


def test_unknown_model_names_the_zoo() -> None:
    with pytest.raises(KeyError, match="resnet50"):
        zoo.build("resnet51")


@pytest.mark.parametrize("name", list(zoo.ZOO))
def test_small_zoo_model_compiles_to_cubins_for_sm80_and_sm90(name: str) -> None:
    """What CI can check of the zoo on cuda without a GPU: every kernel of every model compiles (NVRTC), for
    both archs; bench/gpu.py runs the real sizes on a GPU against onnxruntime."""
    pytest.importorskip("cupy")
    from kiln.runtime.cubin import read_cubin

    mod, params = from_onnx(zoo.build(name, small=True))
    for arch in ("sm_80", "sm_90"):
        lib = relay.build(mod, target=f"cuda -arch={arch}", params=params)
        assert lib.kernels
        for kernel in lib.kernels:
            assert read_cubin(kernel.cubin).sm == int(arch[3:]), (name, kernel.name)


def test_bert_as_the_dynamo_exporter_writes_it_matches_onnxruntime_within_1e_4() -> None:
    model = zoo.build("bert_exported", small=True, seq=24)
    ops = {n.op_type for n in model.graph.node}
    assert {"GatherND", "GatherElements", "Reciprocal", "Range", "Expand", "Shape", "Slice"} <= ops
    feed = zoo.inputs(model, seed=2)
    (want,) = _ort(model, feed)
    got = relay.frontend.OnnxRunner(model)(**feed)
    assert np.abs(got - want).max() <= 1e-4
