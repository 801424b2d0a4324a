"""A quantized MLP and its float twin, in kiln and onnxruntime, in one run.

Three layers 768 -> 3072 -> 768 -> 768 on 128 rows (random weights), as ONNX graphs (`onnx.helper`):

- float: MatMul + Add (bias) + Relu, twice, then MatMul + Add.
- qlinear: QuantizeLinear (uint8) -> QLinearMatMul (int8 weights, per tensor) x3 -> DequantizeLinear,
  the static form of onnxruntime's quantizer (the Relus are the intermediate outputs' zero point 0).
- dynamic: per layer DynamicQuantizeLinear -> MatMulInteger (int8 weights) -> Cast -> Mul (the two
  scales) -> Add (bias) -> Relu, as onnxruntime.quantization.quantize_dynamic writes a MatMul.

Each model is built with kiln (`from_onnx`, `relay.build`, llvm) and run in onnxruntime (CPU, 2
threads), timed in turn (`repeat` calls per round, `rounds` rounds). Prints the median and the
minimum per call, GOP/s (2 * M * K * N per layer), and the ratio kiln time / onnxruntime time (lower
is better for kiln), and checks that kiln's output matches onnxruntime's: the quantized models to a
step of the output's quantization (the rounding of a requantized value may differ by one), the float
one to 1e-3 relative. `python bench/quant.py [repeat] [rounds]`.
"""

from __future__ import annotations

import itertools
import sys
import time
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from timing import median_time

from kiln import relay
from kiln.relay.frontend import from_onnx
from kiln.target import Target

ROWS = 128
WIDTHS = (768, 3072, 768, 768)  # the layers' input and output widths
THREADS = 2


def _weights(seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [((rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32),
             (rng.standard_normal(n) * 0.1).astype(np.float32)) for k, n in itertools.pairwise(WIDTHS)]


def _model(nodes: list[Any], inits: list[Any], x_type: int, y_type: int, name: str) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", x_type, [ROWS, WIDTHS[0]])],
                              [helper.make_tensor_value_info("y", y_type, [ROWS, WIDTHS[-1]])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def float_model(weights: list[tuple[np.ndarray, np.ndarray]]) -> onnx.ModelProto:
    """MatMul + Add + Relu per layer (no Relu after the last)."""
    nodes, inits, x = [], [], "x"
    for i, (w, b) in enumerate(weights):
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        last = i == len(weights) - 1
        nodes += [helper.make_node("MatMul", [x, f"w{i}"], [f"m{i}"]),
                  helper.make_node("Add", [f"m{i}", f"b{i}"], ["y" if last else f"a{i}"])]
        if not last:
            nodes.append(helper.make_node("Relu", [f"a{i}"], [f"r{i}"]))
        x = f"r{i}"
    return _model(nodes, inits, TensorProto.FLOAT, TensorProto.FLOAT, "mlp_float")


def _quantized_weight(w: np.ndarray) -> tuple[np.ndarray, np.float32]:
    scale = np.float32(np.abs(w).max() / 127)
    return np.clip(np.rint(w / scale), -127, 127).astype(np.int8), scale


def qlinear_model(weights: list[tuple[np.ndarray, np.ndarray]], x: np.ndarray) -> onnx.ModelProto:
    """QuantizeLinear -> QLinearMatMul per layer -> DequantizeLinear (no bias: QLinearMatMul has none).

    The activations' scales come from a float run on `x` (calibration); the intermediate outputs are
    uint8 with zero point 0, which is the Relu; the last is uint8 around 128."""
    act = x
    scales = [np.float32(np.abs(x).max() / 127)]
    for i, (w, _) in enumerate(weights):
        act = act @ w
        if i < len(weights) - 1:
            act = np.maximum(act, 0)
        scales.append(np.float32(np.abs(act).max() / (255 if i < len(weights) - 1 else 127)))
    inits = [numpy_helper.from_array(np.array(scales[0]), "s0"), numpy_helper.from_array(np.uint8(128), "z0")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s0", "z0"], ["q0"])]
    for i, (w, _) in enumerate(weights):
        wq, ws = _quantized_weight(w)
        zy = np.uint8(0 if i < len(weights) - 1 else 128)
        inits += [numpy_helper.from_array(wq, f"w{i}"), numpy_helper.from_array(np.array(ws), f"ws{i}"),
                  numpy_helper.from_array(np.int8(0), f"wz{i}"),
                  numpy_helper.from_array(np.array(scales[i + 1]), f"s{i + 1}"),
                  numpy_helper.from_array(zy, f"z{i + 1}")]
        nodes.append(helper.make_node("QLinearMatMul", [f"q{i}", f"s{i}", f"z{i}", f"w{i}", f"ws{i}", f"wz{i}",
                                                        f"s{i + 1}", f"z{i + 1}"], [f"q{i + 1}"]))
    n = len(weights)
    nodes.append(helper.make_node("DequantizeLinear", [f"q{n}", f"s{n}", f"z{n}"], ["y"]))
    return _model(nodes, inits, TensorProto.FLOAT, TensorProto.FLOAT, "mlp_qlinear")


def dynamic_model(weights: list[tuple[np.ndarray, np.ndarray]]) -> onnx.ModelProto:
    """DynamicQuantizeLinear -> MatMulInteger -> Cast -> Mul (scales) -> Add -> Relu per layer."""
    nodes, inits, x = [], [], "x"
    for i, (w, b) in enumerate(weights):
        wq, ws = _quantized_weight(w)
        inits += [numpy_helper.from_array(wq, f"w{i}"), numpy_helper.from_array(np.array(ws), f"ws{i}"),
                  numpy_helper.from_array(np.int8(0), f"wz{i}"), numpy_helper.from_array(b, f"b{i}")]
        last = i == len(weights) - 1
        nodes += [
            helper.make_node("DynamicQuantizeLinear", [x], [f"xq{i}", f"xs{i}", f"xz{i}"]),
            helper.make_node("MatMulInteger", [f"xq{i}", f"w{i}", f"xz{i}", f"wz{i}"], [f"p{i}"]),
            helper.make_node("Cast", [f"p{i}"], [f"pf{i}"], to=TensorProto.FLOAT),
            helper.make_node("Mul", [f"xs{i}", f"ws{i}"], [f"sc{i}"]),
            helper.make_node("Mul", [f"pf{i}", f"sc{i}"], [f"m{i}"]),
            helper.make_node("Add", [f"m{i}", f"b{i}"], ["y" if last else f"a{i}"]),
        ]
        if not last:
            nodes.append(helper.make_node("Relu", [f"a{i}"], [f"r{i}"]))
        x = f"r{i}"
    return _model(nodes, inits, TensorProto.FLOAT, TensorProto.FLOAT, "mlp_dynamic")


def ort_session(model: onnx.ModelProto) -> Any:
    """An onnxruntime CPU session of `model` on `THREADS` threads."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = THREADS
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def timed(runs: dict[str, Any], rounds: int, repeat: int) -> dict[str, tuple[float, float]]:
    """Per run, (median of the rounds' medians, minimum of the rounds' single fastest calls), the
    runs timed in turn so that a busy moment of the machine falls on all of them."""
    medians: dict[str, list[float]] = {name: [] for name in runs}
    mins: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, fn in runs.items():
            time.sleep(0.05)  # onnxruntime's workers stop spinning
            medians[name].append(median_time(fn, repeat=repeat, warmup=2))
            mins[name].append(min(median_time(fn, repeat=1) for _ in range(3)))
    return {name: (float(np.median(medians[name])), float(min(mins[name]))) for name in runs}


def main() -> None:
    repeat = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    host = Target("llvm")
    vnni = "+avx512vnni" in (host.get("mattr") or ())
    print(f"host: {host['mcpu']}, avx512vnni: {vnni}; {ROWS} rows, widths {WIDTHS}, onnxruntime on {THREADS} threads")
    weights = _weights()
    x = np.random.default_rng(1).standard_normal((ROWS, WIDTHS[0])).astype(np.float32)
    ops = sum(2 * ROWS * k * n for k, n in itertools.pairwise(WIDTHS))
    models = {"float": float_model(weights), "qlinear": qlinear_model(weights, x), "dynamic": dynamic_model(weights)}
    print(f"{'model':8} {'kiln med ms':>11} {'kiln min':>9} {'ORT med ms':>10} {'ORT min':>8} {'kiln GOP/s':>10} "
          f"{'ORT GOP/s':>9} {'kiln/ORT':>8}  match")
    for name, model in models.items():
        session = ort_session(model)
        (want,) = session.run(None, {"x": x})
        mod, params = from_onnx(model)
        ex = relay.build(mod, target="llvm", params=params).create_executor()
        got = np.asarray(ex(x=x))
        if name == "float":
            match = bool(np.allclose(got, want, rtol=1e-3, atol=1e-3 * float(np.abs(want).max())))
        else:  # one output quantum: the last layer's scale
            step = float(np.abs(want).max()) / 127 * 1.01 if name == "qlinear" else 0.0
            diff = float(np.abs(got - want).max())
            match = diff <= step if step else bool(np.allclose(got, want, rtol=1e-2, atol=1e-2 * np.abs(want).max()))
        t = timed({"ort": lambda s=session: s.run(None, {"x": x}), "kiln": lambda e=ex: e(x=x)}, rounds, repeat)
        (k_med, k_min), (o_med, o_min) = t["kiln"], t["ort"]
        print(f"{name:8} {k_med * 1e3:11.3f} {k_min * 1e3:9.3f} {o_med * 1e3:10.3f} {o_min * 1e3:8.3f} "
              f"{ops / k_med / 1e9:10.1f} {ops / o_med / 1e9:9.1f} {k_med / o_med:8.2f}  "
              f"{'ok' if match else 'DIFFERS'} (max|diff| {float(np.abs(got - want).max()):.3g})")


if __name__ == "__main__":
    main()
