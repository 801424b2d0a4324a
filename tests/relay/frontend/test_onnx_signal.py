"""DFT, STFT and MelWeightMatrix: checked against numpy's FFT and onnx's reference evaluator."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

from kiln.relay.frontend import OnnxImportError, OnnxRunner, from_onnx  # noqa: E402

F, I64 = TensorProto.FLOAT, TensorProto.INT64
_RNG = np.random.default_rng(3)


def _dft_model(shape: tuple[int, ...], opset: int, **attrs: Any) -> Any:
    inputs = [helper.make_tensor_value_info("x", F, shape), helper.make_tensor_value_info("n", I64, [])]
    names = ["x", "n"]
    if opset >= 20:
        inputs.append(helper.make_tensor_value_info("axis", I64, []))
        names.append("axis")
    node = helper.make_node("DFT", names, ["y"], name="dft", **attrs)
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("y", F, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _complex(x: np.ndarray) -> np.ndarray:
    return x[..., 0] + 1j * x[..., 1] if x.shape[-1] == 2 else x[..., 0]


@pytest.mark.parametrize("parts", [1, 2])
@pytest.mark.parametrize("n", [6, 9, 12])  # cut, as long, padded (the axis holds 9)
@pytest.mark.parametrize("inverse", [False, True])
def test_dft_matches_numpys_fft_along_an_axis(parts: int, n: int, inverse: bool) -> None:
    x = _RNG.normal(size=(2, 3, 9, parts)).astype(np.float32)
    runner = OnnxRunner(_dft_model(x.shape, 20, inverse=int(inverse)))
    got = runner(x=x, n=np.array(n, np.int64), axis=np.array(2, np.int64))
    want = (np.fft.ifft if inverse else np.fft.fft)(_complex(x), n=n, axis=2)
    np.testing.assert_allclose(got[..., 0] + 1j * got[..., 1], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n", [8, 11])
def test_one_sided_forms_are_rfft_and_irfft(n: int) -> None:
    x = _RNG.normal(size=(2, n, 1)).astype(np.float32)
    got = OnnxRunner(_dft_model(x.shape, 17, onesided=1, axis=1))(x=x, n=np.array(n, np.int64))
    want = np.fft.rfft(x[..., 0], n=n, axis=1)
    np.testing.assert_allclose(got[..., 0] + 1j * got[..., 1], want, rtol=1e-5, atol=1e-5)
    spectrum = np.stack([want.real, want.imag], -1).astype(np.float32)
    back = OnnxRunner(_dft_model(spectrum.shape, 17, onesided=1, inverse=1, axis=1))(x=spectrum,
                                                                                       n=np.array(n, np.int64))
    np.testing.assert_allclose(back[..., 0], x[..., 0], rtol=1e-5, atol=1e-5)


def test_dft_errors_name_the_node() -> None:
    with pytest.raises(OnnxImportError, match=r"DFT node 'dft'.*onesided applies to real input"):
        from_onnx(_dft_model((2, 8, 2), 17, onesided=1, axis=1), values={"n": np.array(8, np.int64)})
    with pytest.raises(OnnxImportError, match=r"DFT node 'dft'.*dft_length is 0"):
        from_onnx(_dft_model((2, 8, 1), 17, axis=1), values={"n": np.array(0, np.int64)})


def test_stft_with_a_window_matches_the_reference() -> None:
    nodes = [helper.make_node("STFT", ["signal", "step", "window", "length"], ["y"], onesided=1)]
    inputs = [helper.make_tensor_value_info("signal", F, [2, 64, 1]), helper.make_tensor_value_info("step", I64, []),
              helper.make_tensor_value_info("window", F, [16]), helper.make_tensor_value_info("length", I64, [])]
    model = helper.make_model(helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", F, None)]),
                              opset_imports=[helper.make_opsetid("", 17)])
    feeds = {"signal": _RNG.normal(size=(2, 64, 1)).astype(np.float32), "step": np.array(6, np.int64),
             "window": np.hanning(16).astype(np.float32), "length": np.array(16, np.int64)}
    (want,) = ReferenceEvaluator(model).run(None, feeds)
    np.testing.assert_allclose(OnnxRunner(model)(**feeds), want, rtol=1e-4, atol=1e-5)


def test_mel_weight_matrix_matches_the_reference() -> None:
    names = ["bins", "dft", "rate", "low", "high"]
    types = [I64, I64, I64, F, F]
    node = helper.make_node("MelWeightMatrix", names, ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, t, []) for n, t in zip(names, types,
                                                                                                    strict=True)],
                              [helper.make_tensor_value_info("y", F, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    feeds = {"bins": np.array(8, np.int64), "dft": np.array(64, np.int64), "rate": np.array(8000, np.int64),
             "low": np.array(100.0, np.float32), "high": np.array(3500.0, np.float32)}
    (want,) = ReferenceEvaluator(model).run(None, feeds)
    np.testing.assert_array_equal(OnnxRunner(model)(**feeds), want)
