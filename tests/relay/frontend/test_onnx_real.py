"""ONNX's real-model tests, as its backend runner feeds them: the nine CNNs onnx ships.

onnx ships each model of its "real" suite (ResNet-50, VGG-19, DenseNet-121,
Inception v1 and v2, AlexNet, ZFNet-512, SqueezeNet, ShuffleNet) as a "light"
model in `onnx/backend/test/data/light`: the real graph, its weights written as
ConstantOfShape nodes, with the expected output beside it. The runner feeds
each input `arange(n).reshape(shape) / n` (`Runner.generate_dummy_data(...,
random=False)`) and compares with the rtol/atol of the model's data.json; so
does this test, through `OnnxRunner` with every input given at run time.
DenseNet-121 and the two Inceptions take minutes to compile cold: they carry
the `models` mark, which `make test` leaves out and `make test-models` runs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import numpy_helper  # noqa: E402

from kiln.relay.frontend import OnnxRunner  # noqa: E402

_DATA = Path(onnx.__file__).parent / "backend" / "test" / "data"
MODELS = sorted(p.name.removeprefix("test_") for p in (_DATA / "real").iterdir() if (p / "data.json").is_file())
# a minute or more of cold compile each (a hundred distinct convolutions in DenseNet): `make test-models`
LARGE = {"densenet121", "inception_v1", "inception_v2"}


def _dummy(value_info: Any) -> np.ndarray:
    """The runner's input for `value_info`: arange(n) / n in its shape, float32 (free dims as 1)."""
    shape = tuple(d.dim_value if d.HasField("dim_value") else 1 for d in value_info.type.tensor_type.shape.dim)
    n = int(np.prod(shape))
    return (np.arange(n).reshape(shape) / n).astype(np.float32)


def test_the_nine_real_models_are_there() -> None:
    assert MODELS == ["bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50", "shufflenet",
                      "squeezenet", "vgg19", "zfnet512"]


@pytest.mark.parametrize("name", [pytest.param(n, marks=[pytest.mark.models] if n in LARGE else []) for n in MODELS])
def test_real_model_imports_compiles_and_matches(name: str) -> None:
    info = json.loads((_DATA / "real" / f"test_{name}" / "data.json").read_text())
    path = _DATA.parent.parent.parent.parent / info["url"]
    model = onnx.load(path)
    initializers = {i.name for i in model.graph.initializer}
    feeds = {vi.name: _dummy(vi) for vi in model.graph.input if vi.name not in initializers}
    want = numpy_helper.to_array(onnx.load_tensor(str(path).removesuffix(".onnx") + "_output_0.pb"))
    got = OnnxRunner(model)(**feeds)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=info["rtol"], atol=info["atol"])
