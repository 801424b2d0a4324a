"""The MLP and the CNN of the main job: kiln beside numpy (and onnxruntime when installed).

Prints per model: compile seconds, the median run time of kiln, of numpy on the
same weights (the MLP's dense layers through BLAS, the CNN's convolutions as an
im2col matmul) and of onnxruntime (the same weights, built with onnx.helper),
and the ratios (other time / kiln time: higher is better for kiln). numpy also
runs in a subprocess without OPENBLAS_CORETYPE (this machine's environment pins
OpenBLAS to its AVX2 kernels); the faster of the two is the bar.
Bars from the issue: MLP >= 0.7x numpy, CNN >= 0.5x onnxruntime.
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np
from timing import median_time, seconds_without_coretype

from kiln import relay
from kiln.testing import models


def onnx_session(kind: str, params: dict[str, np.ndarray], batch: int) -> Any | None:
    """An onnxruntime session of the same model, or None without onnxruntime."""
    try:
        import onnxruntime as ort
        from onnx import TensorProto, helper, numpy_helper
    except ImportError:
        return None
    nodes, inits = [], [numpy_helper.from_array(v, k) for k, v in params.items()]
    if kind == "mlp":
        n = len(params) // 2
        cur = "x"
        for i in range(n):
            nodes.append(helper.make_node("Gemm", [cur, f"w{i}", f"b{i}"], [f"g{i}"], transB=1))
            cur = f"g{i}"
            if i < n - 1:
                nodes.append(helper.make_node("Relu", [cur], [f"r{i}"]))
                cur = f"r{i}"
        x_shape = [batch, params["w0"].shape[1]]
    else:
        cur = "x"
        for i in range(2):
            nodes += [
                helper.make_node("Conv", [cur, f"conv{i}_w"], [f"c{i}"], pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
                helper.make_node("BatchNormalization", [f"c{i}", f"bn{i}_gamma", f"bn{i}_beta", f"bn{i}_mean",
                                                        f"bn{i}_var"], [f"n{i}"], epsilon=1e-5),
                helper.make_node("Relu", [f"n{i}"], [f"r{i}"]),
                helper.make_node("MaxPool", [f"r{i}"], [f"p{i}"], kernel_shape=[2, 2], strides=[2, 2]),
            ]
            cur = f"p{i}"
        nodes += [helper.make_node("GlobalAveragePool", [cur], ["gap"]),
                  helper.make_node("Flatten", ["gap"], ["flat"]),
                  helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["g"], transB=1)]
        cur = "g"
        x_shape = [batch, 3, 224, 224]
    graph = helper.make_graph(nodes, kind, [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info(cur, TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


_NUMPY_ELSEWHERE = """
import sys, numpy as np
sys.path.insert(0, {bench!r})
from timing import median_time
from kiln.testing import models
func, params = models.{kind}()
rng = np.random.default_rng(1)
x = rng.standard_normal({shape}).astype("float32")
print(median_time(lambda: models.{kind}_numpy(x, params), warmup=2))
"""


def numpy_without_coretype(kind: str, shape: tuple[int, ...]) -> float:
    """numpy's time on the model in a subprocess with OPENBLAS_CORETYPE removed (its BLAS at full speed)."""
    bench = os.path.dirname(os.path.abspath(__file__))
    return seconds_without_coretype(_NUMPY_ELSEWHERE.format(bench=bench, kind=kind, shape=shape))


def run(kind: str) -> None:
    rng = np.random.default_rng(1)
    if kind == "mlp":
        func, params = models.mlp()
        x = rng.standard_normal((64, 784)).astype("float32")

        def ref() -> np.ndarray:
            return models.mlp_numpy(x, params)
    else:
        func, params = models.cnn()
        x = rng.standard_normal((1, 3, 224, 224)).astype("float32")

        def ref() -> np.ndarray:
            return models.cnn_numpy(x, params)
    start = time.perf_counter()
    lib = relay.build(func, params=params)
    compile_s = time.perf_counter() - start
    ex = lib.create_executor()
    y = ex(x=x)
    np.testing.assert_allclose(y, ref(), rtol=1e-3, atol=1e-4)
    t_kiln = median_time(lambda: ex(x=x), warmup=2)
    t_env = median_time(ref, warmup=2)
    t_free = numpy_without_coretype(kind, x.shape)
    t_np = min(t_env, t_free)  # the faster numpy is the bar
    line = (f"{kind:4} compile {compile_s:6.2f} s  kiln {t_kiln * 1e3:8.2f} ms  numpy {t_np * 1e3:8.2f} ms "
            f"({t_np / t_kiln:5.2f}x; {t_env * 1e3:.2f} ms with OPENBLAS_CORETYPE, {t_free * 1e3:.2f} without)")
    sess = onnx_session(kind, params, x.shape[0])
    if sess is not None:
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], y, rtol=1e-3, atol=1e-4)
        t_ort = median_time(lambda: sess.run(None, {"x": x}), warmup=2)
        line += f"  onnxruntime {t_ort * 1e3:8.2f} ms ({t_ort / t_kiln:5.2f}x)"
    print(line + f"  kernels {len(lib.kernels)}, planned {lib.planned_bytes / 2**20:.1f} MiB")


if __name__ == "__main__":
    run("mlp")
    run("cnn")
