"""kiln's kernels beside numpy and onnxruntime on the same data, in one run.

Elementwise, row sum and matmul against numpy: prints each median time and
the ratio (numpy time / kiln time: higher is better for kiln). numpy's matmul
is also timed in a subprocess without OPENBLAS_CORETYPE (this machine's
environment pins OpenBLAS to its AVX2 kernels); the faster of the two is the
bar. The bars from the issue: elementwise >= 6x numpy, row sum >= 2x numpy,
matmul >= 0.5x the faster numpy.

Convolutions of real CNNs (ResNet-50, MobileNetV2), batch 1, NCHW float32:
each a one-node ONNX model, imported with from_onnx and built with relay.build,
beside onnxruntime on 2 threads. Prints both GFLOP/s and the ratio
(onnxruntime time / kiln time); the bar is 1.0. `python bench/kernels.py conv`
runs these rows alone, `python bench/kernels.py conv 3->` those whose name contains "3->".

Max pools of real CNNs (SqueezeNet 1.1, ResNet-50), batch 1, NCHW float32, beside a one-node ONNX
MaxPool in onnxruntime on 2 threads: the ratio is onnxruntime time / kiln time, the bar 1.0.
`python bench/kernels.py pool` runs these rows alone.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import numpy as np
from timing import median_time, seconds_without_coretype

# The zmm column reads each kernel's assembly, which code loaded from kiln's disk caches does not carry.
os.environ["KILN_CACHE"] = "0"

import kiln
from kiln import relay, te
from kiln.target import Target


def elementwise_kernel(n: int) -> kiln.runtime.module.Module:
    """y = sigmoid(x * 2 + 1) * tanh(x), fused, parallel over chunks, vectorized 16 wide.

    Each chunk prefetches the next chunk of x: the body is long enough (about 60 vector instructions
    per cache line) that the out-of-order window alone keeps too few misses in flight, which made
    the kernel three times slower from DRAM than from L2 before.
    """
    X = te.placeholder((n,), name="x")
    Y = te.compute((n,), lambda i: te.sigmoid(X[i] * 2.0 + 1.0) * te.tanh(X[i]), name="y")
    s = te.create_schedule(Y)
    outer, inner = s[Y].split(Y.op.axis[0], factor=16 * 64)
    s[Y].parallel(outer)
    s[Y].vectorize(inner)
    s[Y].prefetch(X, outer)
    return kiln.build(s, [X, Y], name="fused_elementwise")


def row_sum_kernel(rows: int, cols: int, lanes: int = 32) -> kiln.runtime.module.Module:
    """sum(axis=-1): per row, `lanes` partial sums vectorized along the row, then a short final sum."""
    A = te.placeholder((rows, cols), name="a")
    ko = te.reduce_axis((0, cols // lanes), name="ko")
    partial = te.compute((rows, lanes), lambda i, j: te.sum(A[i, ko * lanes + j], axis=ko), name="partial")
    ki = te.reduce_axis((0, lanes), name="ki")
    out = te.compute((rows,), lambda i: te.sum(partial[i, ki], axis=ki), name="row_sum")
    s = te.create_schedule(out)
    s[out].parallel(out.op.axis[0])
    s[partial].compute_at(s[out], out.op.axis[0])
    pi, pj = s[partial].op.axis
    s[partial].reorder(pi, s[partial].op.reduce_axis[0], pj)
    s[partial].vectorize(pj)
    return kiln.build(s, [A, out], name="row_sum")


def matmul_kernel(m: int, n: int, k: int, bn: int = 64, bm: int = 4) -> kiln.runtime.module.Module:
    """C = A @ B, GotoBLAS-style: A packed into (m/bm, k, bm) strips and B into (n/bn, k, bn) panels,
    a bm x bn tile of C in registers (bm * bn / 16 zmm accumulators), vectorized over bn.

    The column panels are the outer, parallel loop: each core keeps its 256 KiB panel of B in
    L2 while the strips of A stream past it (with the row tiles outside, the whole of packed B
    came from L3 for every row tile, and the kernel ran at a third of the speed).
    """
    A = te.placeholder((m, k), name="A")
    B = te.placeholder((k, n), name="B")
    packed_a = te.compute((m // bm, k, bm), lambda x, y, z: A[x * bm + z, y], name="packedA")
    packed_b = te.compute((n // bn, k, bn), lambda x, y, z: B[y, x * bn + z], name="packedB")
    r = te.reduce_axis((0, k), name="k")
    C = te.compute(
        (m, n), lambda i, j: te.sum(packed_a[i // bm, r, i % bm] * packed_b[j // bn, r, j % bn], axis=r), name="C"
    )
    s = te.create_schedule(C)
    CC = s.cache_write(C, "local")
    mo, no, _, ni = s[C].tile(*s[C].op.axis, bm, bn)
    s[C].reorder(no, mo)
    s[C].parallel(no)
    s[C].vectorize(ni)
    s[CC].compute_at(s[C], mo)
    ci, cj = s[CC].op.axis
    s[CC].reorder(s[CC].op.reduce_axis[0], ci, cj)
    s[CC].unroll(ci)
    s[CC].vectorize(cj)
    for packed in (packed_a, packed_b):
        px, _, pz = s[packed].op.axis
        s[packed].parallel(px)
        s[packed].vectorize(pz)
    return kiln.build(s, [A, B, C], name="matmul")


_NUMPY_MATMUL = """
import time, statistics, numpy as np
rng = np.random.default_rng(0)
a = rng.random(({m}, {k}), dtype=np.float32); b = rng.random(({k}, {n}), dtype=np.float32)
a @ b
t = []
for _ in range(7):
    s = time.perf_counter(); a @ b; t.append(time.perf_counter() - s)
print(statistics.median(t))
"""


def numpy_matmul_without_coretype(m: int, n: int, k: int) -> float:
    """numpy's matmul time in a subprocess with OPENBLAS_CORETYPE removed."""
    return seconds_without_coretype(_NUMPY_MATMUL.format(m=m, n=n, k=k))


# (name, C, O, H=W, kernel, stride, pad, groups): ResNet-50's 3x3, 1x1 and stride-2 convolutions and
# the stems of CNNs (3 input channels: ResNet-50's 7x7, SqueezeNet 1.1's 3x3 unpadded, MobileNetV2's and
# EfficientNet-B0's 3x3), a deep 3x3, MobileNetV2's depthwise convolutions.
CONVS = [
    ("conv 3x3 64->64 56^2", 64, 64, 56, 3, 1, 1, 1),
    ("conv 1x1 256->64 56^2", 256, 64, 56, 1, 1, 0, 1),
    ("conv 3x3/2 128->128 56^2", 128, 128, 56, 3, 2, 1, 1),
    ("conv 7x7/2 3->64 224^2 (stem)", 3, 64, 224, 7, 2, 3, 1),
    ("conv 3x3/2 3->64 224^2 (SqueezeNet)", 3, 64, 224, 3, 2, 0, 1),
    ("conv 3x3/2 3->32 224^2 (MobileNetV2)", 3, 32, 224, 3, 2, 1, 1),
    ("conv 3x3 512->512 7^2", 512, 512, 7, 3, 1, 1, 1),
    ("depthwise 3x3 32ch 112^2", 32, 32, 112, 3, 1, 1, 32),
    ("depthwise 3x3/2 96ch 112^2", 96, 96, 112, 3, 2, 1, 96),
]


def conv_model(c: int, o: int, size: int, kernel: int, stride: int, pad: int, groups: int) -> Any:
    """A one-node ONNX model: Conv of a (1, c, size, size) input with a random (o, c/groups, k, k) weight."""
    import onnx
    from onnx import helper

    rng = np.random.default_rng(0)
    weight = (rng.standard_normal((o, c // groups, kernel, kernel)) / np.sqrt(c // groups * kernel**2))
    node = helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=[kernel, kernel], strides=[stride, stride],
                            pads=[pad] * 4, group=groups)
    out = (size + 2 * pad - kernel) // stride + 1
    graph = helper.make_graph(
        [node], "conv", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, c, size, size])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, o, out, out])],
        [onnx.numpy_helper.from_array(weight.astype(np.float32), "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def ort_session(model: Any) -> Any:
    """An onnxruntime CPU session of `model` (a ModelProto) on 2 threads, as every row compares with."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def in_turn(runs: dict[str, Any], rounds: int, repeat: int, pause: float = 0.0) -> dict[str, float]:
    """Per run, the median of `rounds` medians of `repeat` calls, the runs timed in turn (after `pause`
    seconds each), so that a busy moment of the machine falls on all of them."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, fn in runs.items():
            time.sleep(pause)
            times[name].append(median_time(fn, repeat=repeat, warmup=2))
    return {name: float(np.median(ts)) for name, ts in times.items()}


def conv_rows(repeat: int = 20, rounds: int = 5, only: str = "") -> None:
    """Times each of `CONVS` (those whose name contains `only`) in kiln and in onnxruntime (2 threads)
    and prints GFLOP/s and the ratio.

    Each time is the median of `rounds` medians of `repeat` runs, onnxruntime's and kiln's taken in
    turn (onnxruntime first, its worker threads given a moment to stop spinning), so that a busy
    moment of the machine falls on both.
    """

    from kiln.relay.frontend import from_onnx

    rng = np.random.default_rng(1)
    print(f"{'convolution':38} {'kiln GF/s':>10} {'ORT GF/s':>9} {'ratio':>6} {'bar':>5}  max|diff|")
    for name, c, o, size, kernel, stride, pad, groups in CONVS:
        if only not in name:
            continue
        model = conv_model(c, o, size, kernel, stride, pad, groups)
        x = rng.standard_normal((1, c, size, size)).astype(np.float32)
        session = ort_session(model)
        (expected,) = session.run(None, {"x": x})
        mod, params = from_onnx(model)
        ex = relay.build(mod, target="llvm", params=params).create_executor()
        got = ex(x=x)
        runs = {"ort": lambda s=session, a=x: s.run(None, {"x": a}), "kiln": lambda e=ex, a=x: e(x=a)}
        t = in_turn(runs, rounds, repeat, pause=0.05)
        t_ort, t_k = t["ort"], t["kiln"]
        out = expected.shape[-1]
        flop = 2 * o * (c // groups) * kernel**2 * out * out
        diff = float(np.max(np.abs(np.asarray(got) - expected)))
        ratio = t_ort / t_k
        print(f"{name:38} {flop / t_k / 1e9:10.1f} {flop / t_ort / 1e9:9.1f} {ratio:6.2f} {1.0:5.1f}  {diff:.2g}"
              f"  {'ok' if ratio >= 1.0 else 'BELOW'}")


# softmax over the last axis beside onnxruntime: (shape, bar); the small shapes are reported, held to no bar
SOFTMAXES: list[tuple[tuple[int, ...], float | None]] = [((4096, 4096), 1.0), ((1, 1000), None), ((12, 128, 128), None)]


def softmax_rows(repeat: int = 20, rounds: int = 5) -> None:
    """kiln's nn.softmax along the last axis beside a one-node ONNX Softmax in onnxruntime (2 threads).

    "kernel": kiln's compiled kernel into a preallocated output beside onnxruntime with its output
    bound (io_binding); "run": the executor, `ex(x=x)`, beside `session.run` (both return new
    arrays). Each time is the median of `rounds` medians, the four taken in turn, so that a busy
    moment of the machine falls on all of them.
    """
    import onnx
    from onnx import helper

    rng = np.random.default_rng(2)
    print(f"{'softmax(axis=-1) f32':24} {'kiln ms':>9} {'ORT ms':>9} {'ratio':>6} {'bar':>5}  "
          f"{'kiln run':>9} {'ORT run':>9} {'ratio':>6}  zmm")
    for shape, bar in SOFTMAXES:
        values = [helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, list(shape)) for name in "xy"]
        node = helper.make_node("Softmax", ["x"], ["y"], axis=-1)
        model = helper.make_model(helper.make_graph([node], "softmax", values[:1], values[1:]),
                                  opset_imports=[helper.make_opsetid("", 13)])
        session = ort_session(model)
        x = rng.standard_normal(shape).astype(np.float32)
        y_ort, y_kiln = np.empty_like(x), np.empty_like(x)
        binding = session.io_binding()
        binding.bind_cpu_input("x", x)
        binding.bind_output("y", "cpu", 0, np.float32, list(shape), y_ort.ctypes.data)
        v = relay.var("x", shape=shape, dtype="float32")
        lib = relay.build(relay.Function([v], relay.nn.softmax(v)))
        (kernel,) = lib.kernels
        ex = lib.create_executor()
        kernel(x, y_kiln)
        session.run_with_iobinding(binding)
        assert np.allclose(y_kiln, y_ort, rtol=1e-5, atol=1e-6), f"softmax {shape} differs from onnxruntime"
        assert np.allclose(ex(x=x), session.run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)
        runs = {
            "kiln": lambda k=kernel, a=x, y=y_kiln: k(a, y),
            "ort": lambda s=session, b=binding: s.run_with_iobinding(b),
            "kiln run": lambda e=ex, a=x: e(x=a),
            "ort run": lambda s=session, a=x: s.run(None, {"x": a}),
        }
        reps = repeat if x.size >= 1 << 20 else repeat * 20  # microseconds: more runs for a steady median
        t = in_turn(runs, rounds, reps)
        ratio, run_ratio = t["ort"] / t["kiln"], t["ort run"] / t["kiln run"]
        label = "x".join(map(str, shape))
        bar_text, flag = ("-", "") if bar is None else (f"{bar:.1f}", "ok" if ratio >= bar else "BELOW")
        print(f"{label:24} {t['kiln'] * 1e3:9.3f} {t['ort'] * 1e3:9.3f} {ratio:6.2f} {bar_text:>5}  "
              f"{t['kiln run'] * 1e3:9.3f} {t['ort run'] * 1e3:9.3f} {run_ratio:6.2f}  "
              f"{'zmm' in kernel.get_source('asm')}  {flag}")


# max pools of real CNNs, all 3x3 stride 2: (name, input shape, padding, ceil_mode)
POOLS = [
    ("maxpool 3x3/2 ceil 64ch 111^2 (SqueezeNet)", (1, 64, 111, 111), 0, True),
    ("maxpool 3x3/2 ceil 128ch 55^2 (SqueezeNet)", (1, 128, 55, 55), 0, True),
    ("maxpool 3x3/2 ceil 256ch 27^2 (SqueezeNet)", (1, 256, 27, 27), 0, True),
    ("maxpool 3x3/2 pad 1 64ch 112^2 (ResNet-50)", (1, 64, 112, 112), 1, False),
]


def pool_rows(repeat: int = 40, rounds: int = 5) -> None:
    """kiln's nn.max_pool2d beside a one-node ONNX MaxPool in onnxruntime (2 threads), each through its run
    call; the times are medians of `rounds` medians, taken in turn as in `conv_rows`. The bar is 1.0."""
    import onnx
    from onnx import helper

    rng = np.random.default_rng(3)
    print(f"{'max pool (NCHW f32)':44} {'kiln ms':>9} {'ORT ms':>9} {'ratio':>6} {'bar':>5}")
    for name, shape, pad, ceil in POOLS:
        node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[pad] * 4,
                                ceil_mode=int(ceil))
        values = [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, list(shape)),
                  helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)]
        model = helper.make_model(helper.make_graph([node], "pool", values[:1], values[1:]),
                                  opset_imports=[helper.make_opsetid("", 13)])
        session = ort_session(model)
        v = relay.var("x", shape=shape, dtype="float32")
        pool = relay.nn.max_pool2d(v, pool_size=3, strides=2, padding=pad, ceil_mode=ceil)
        ex = relay.build(relay.Function([v], pool)).create_executor()
        x = rng.standard_normal(shape).astype(np.float32)
        assert np.array_equal(ex(x=x), session.run(None, {"x": x})[0]), f"{name} differs from onnxruntime"
        runs = {"ort": lambda s=session, a=x: s.run(None, {"x": a}), "kiln": lambda e=ex, a=x: e(x=a)}
        t = in_turn(runs, rounds, repeat, pause=0.05)
        t_ort, t_k = t["ort"], t["kiln"]
        ratio = t_ort / t_k
        flag = "ok" if ratio >= 1.0 else "BELOW"
        print(f"{name:44} {t_k * 1e3:9.3f} {t_ort * 1e3:9.3f} {ratio:6.2f} {1.0:5.1f}  {flag}")


def main() -> None:
    if sys.argv[1:] == ["pool"]:
        pool_rows()
        return
    if sys.argv[1:2] == ["conv"]:
        conv_rows(only=" ".join(sys.argv[2:]))
        return
    if sys.argv[1:] == ["softmax"]:
        softmax_rows()
        return
    rng = np.random.default_rng(0)
    host = Target("llvm")
    print(f"host: {host['mcpu']}, {host['num-cores']} cores; numpy {np.__version__}")
    rows = []

    n = 1 << 24
    x = rng.standard_normal(n).astype(np.float32)
    y = np.empty_like(x)
    mod = elementwise_kernel(n)
    mod(x, y)
    expected = (1 / (1 + np.exp(-(x * 2 + 1)))) * np.tanh(x)
    assert np.allclose(y, expected, atol=1e-5), "elementwise result differs from numpy"
    t_np = median_time(lambda: (1 / (1 + np.exp(-(x * 2 + 1)))) * np.tanh(x), warmup=2)
    t_k = median_time(lambda: mod(x, y), warmup=2)
    rows.append(("sigmoid(x*2+1)*tanh(x), 2^24 f32", t_np, t_k, 6.0, "zmm" in mod.get_source("asm")))

    a = rng.standard_normal((4096, 4096)).astype(np.float32)
    out = np.empty(4096, np.float32)
    mod = row_sum_kernel(4096, 4096)
    mod(a, out)
    assert np.allclose(out, a.sum(axis=-1), rtol=1e-3, atol=1e-2), "row sum differs from numpy"
    t_np = median_time(lambda: a.sum(axis=-1), warmup=2)
    t_k = median_time(lambda: mod(a, out), warmup=2)
    rows.append(("sum(axis=-1), 4096x4096 f32", t_np, t_k, 2.0, "zmm" in mod.get_source("asm")))

    size = 1024
    a = rng.random((size, size), dtype=np.float32)
    b = rng.random((size, size), dtype=np.float32)
    c = np.empty((size, size), np.float32)
    mod = matmul_kernel(size, size, size)
    mod(a, b, c)
    assert np.allclose(c, a @ b, rtol=1e-3), "matmul differs from numpy"
    t_np_env = median_time(lambda: a @ b, warmup=2)
    t_np_free = numpy_matmul_without_coretype(size, size, size)
    t_np = min(t_np_env, t_np_free)
    t_k = median_time(lambda: mod(a, b, c), warmup=2)
    gflops = 2 * size**3 / t_k / 1e9
    rows.append((f"matmul 1024^3 f32 ({gflops:.0f} GFLOP/s)", t_np, t_k, 0.5, "zmm" in mod.get_source("asm")))
    print(f"  numpy matmul: {t_np_env * 1e3:.2f} ms with OPENBLAS_CORETYPE, {t_np_free * 1e3:.2f} ms without")

    print(f"{'kernel':42} {'numpy ms':>9} {'kiln ms':>9} {'ratio':>7} {'bar':>5}  zmm")
    for name, t_np, t_k, bar, zmm in rows:
        ratio = t_np / t_k
        flag = "ok" if ratio >= bar else "BELOW"
        print(f"{name:42} {t_np * 1e3:9.2f} {t_k * 1e3:9.2f} {ratio:7.2f} {bar:5.1f}  {zmm}  {flag}")
    conv_rows()
    pool_rows()
    softmax_rows()


if __name__ == "__main__":
    main()
