"""kiln's CUDA kernels beside cupy (and torch) on the same GPU, in one run.

Prints, with the GPU's name:
- the elementwise chain of bench/kernels.py, sigmoid(x*2+1)*tanh(x) on 2^26
  float32, as achieved GB/s (8 bytes moved per element) and as a ratio to cupy
  evaluating the same expression (unfused, and fused with `cupy.fuse`);
- a 4096^3 float32 matmul (`nn.matmul` through relay.build) as TFLOP/s and as a
  ratio to `cupy.matmul` (cuBLAS);
- the demo CNN at batch 32 against torch on the same GPU, when torch is there.

Aims from issue 6: the chain above 80% of the memory bandwidth, the matmul
above half of cuBLAS. Needs a CUDA GPU; without one it says so and exits 0.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import kiln
from kiln import relay, te
from kiln.testing import models


def gpu_time(fn: Callable[[], object], cupy: Any, repeat: int = 20) -> float:
    """The median seconds of `fn()` on the GPU, by CUDA events, after two warm-up runs."""
    for _ in range(2):
        fn()
    cupy.cuda.Device().synchronize()
    times = []
    for _ in range(repeat):
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, stop) / 1e3)
    return statistics.median(times)


def chain_kernel(n: int, target: str, threads: int = 256) -> Any:
    """The fused chain, one element per thread."""
    x = te.placeholder((n,), name="x")
    y = te.compute((n,), lambda i: te.sigmoid(x[i] * 2.0 + 1.0) * te.tanh(x[i]), name="y")
    s = te.create_schedule(y)
    bx, tx = s[y].split(y.op.axis[0], factor=threads)
    s[y].bind(bx, te.thread_axis("blockIdx.x"))
    s[y].bind(tx, te.thread_axis("threadIdx.x"))
    return kiln.build(s, [x, y], target=target, name="chain")


def main() -> int:
    try:
        import cupy
    except ImportError:
        print("bench/gpu.py: cupy is not installed (pip install -e '.[cuda]'); nothing to measure")
        return 0
    if not cupy.cuda.is_available():
        print("bench/gpu.py: no CUDA GPU on this machine; nothing to measure")
        return 0
    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    peak_gbs = 2 * props["memoryClockRate"] * 1e3 * props["memoryBusWidth"] / 8 / 1e9
    target = "cuda"  # the GPU's own arch
    print(f"GPU: {name}, theoretical memory bandwidth {peak_gbs:.0f} GB/s; cupy {cupy.__version__}")

    n = 1 << 26
    x = cupy.random.standard_normal(n, dtype=cupy.float32)
    y = cupy.empty_like(x)
    mod = chain_kernel(n, target)
    mod(x, y)
    expect = 1 / (1 + cupy.exp(-(x * 2 + 1))) * cupy.tanh(x)
    np.testing.assert_allclose(y.get(), expect.get(), rtol=1e-5, atol=1e-6)
    fused = cupy.fuse(lambda v: 1 / (1 + cupy.exp(-(v * 2 + 1))) * cupy.tanh(v))
    t_kiln = gpu_time(lambda: mod(x, y), cupy)
    t_cupy = gpu_time(lambda: 1 / (1 + cupy.exp(-(x * 2 + 1))) * cupy.tanh(x), cupy)
    t_fuse = gpu_time(lambda: fused(x), cupy)
    gbs = 8 * n / t_kiln / 1e9
    print(f"elementwise chain 2^26 f32: kiln {t_kiln * 1e3:.3f} ms, {gbs:.0f} GB/s ({gbs / peak_gbs:.0%} of peak); "
          f"cupy {t_cupy * 1e3:.3f} ms ({t_cupy / t_kiln:.2f}x), cupy.fuse {t_fuse * 1e3:.3f} ms "
          f"({t_fuse / t_kiln:.2f}x)")

    size = 4096
    a = relay.var("a", shape=(size, size))
    b = relay.var("b", shape=(size, size))
    start = time.perf_counter()
    lib = relay.build(relay.Function([a, b], relay.nn.matmul(a, b)), target=target)
    compile_s = time.perf_counter() - start
    ex = lib.create_executor()
    av = cupy.random.random((size, size), dtype=cupy.float32)
    bv = cupy.random.random((size, size), dtype=cupy.float32)
    out = ex(a=av, b=bv)
    np.testing.assert_allclose(out.get(), cupy.matmul(av, bv).get(), rtol=1e-3)
    t_kiln = gpu_time(lambda: ex(a=av, b=bv), cupy, repeat=5)
    t_blas = gpu_time(lambda: cupy.matmul(av, bv), cupy, repeat=5)
    flops = 2 * size**3
    print(f"matmul 4096^3 f32: kiln {t_kiln * 1e3:.2f} ms, {flops / t_kiln / 1e12:.1f} TFLOP/s "
          f"(compile {compile_s:.1f} s); cuBLAS {t_blas * 1e3:.2f} ms, {flops / t_blas / 1e12:.1f} TFLOP/s; "
          f"ratio {t_blas / t_kiln:.2f}x")

    try:
        import torch
    except ImportError:
        print("torch is not installed: the CNN comparison is skipped")
        return 0
    func, params = models.cnn(batch=32)
    lib = relay.build(func, target=target, params=params)
    ex = lib.create_executor()
    xv = cupy.random.standard_normal((32, 3, 224, 224), dtype=cupy.float32)
    got = ex(x=xv).get()
    np.testing.assert_allclose(got, models.cnn_numpy(xv.get(), params), rtol=1e-3, atol=1e-4)
    t_kiln = gpu_time(lambda: ex(x=xv), cupy, repeat=10)
    net = _torch_cnn(torch, params)
    xt = torch.as_tensor(xv.get(), device="cuda")
    with torch.no_grad():
        np.testing.assert_allclose(net(xt).cpu().numpy(), got, rtol=1e-3, atol=1e-4)
        t_torch = gpu_time(lambda: net(xt), cupy, repeat=10)
    print(f"CNN batch 32: kiln {t_kiln * 1e3:.2f} ms, torch {t_torch * 1e3:.2f} ms ({t_torch / t_kiln:.2f}x)")
    return 0


def _torch_cnn(torch: Any, p: dict[str, np.ndarray]) -> Callable[[Any], Any]:
    """The demo CNN in torch, eager, on the GPU, from the same weights."""
    t = {k: torch.as_tensor(v, device="cuda") for k, v in p.items()}
    f = torch.nn.functional

    def net(x: Any) -> Any:
        for i in range(2):
            x = f.conv2d(x, t[f"conv{i}_w"], padding=1)
            x = f.batch_norm(x, t[f"bn{i}_mean"], t[f"bn{i}_var"], t[f"bn{i}_gamma"], t[f"bn{i}_beta"], eps=1e-5)
            x = f.max_pool2d(f.relu(x), 2)
        x = x.mean(dim=(2, 3))
        return x @ t["fc_w"].T + t["fc_b"]

    return net


if __name__ == "__main__":
    sys.exit(main())
