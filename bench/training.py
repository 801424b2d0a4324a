"""One SGD training step of the MLP (batch 64, 784 -> 512 -> 512 -> 10, relu, softmax cross-entropy), in
kiln, numpy and (where installed) PyTorch, on the same data in one run.

kiln's step is `kiln.testing.train.sgd_step`: forward, loss, `relay.transform.gradient` and the update
`p - lr * g` in one Relay function, compiled by `relay.build` into one library. numpy's is the same step
written by hand in float32 (BLAS matmuls); it is timed here and again in a subprocess without
OPENBLAS_CORETYPE (this machine's environment pins OpenBLAS to its AVX2 kernels), and the faster of the two
is the bar. PyTorch's is eager autograd plus an in-place SGD update, on 2 threads.

Each step is checked first: the three give the same loss and parameters after one step (1e-4). Then each is
timed over `repeat` calls; the median, minimum and spread (p90 / min) are printed with GFLOP/s (the
forward's, dX's and dW's products: 2 * 64 * (784*512 + 512*512 + 512*10) each, less dX of the first layer)
and the ratio kiln time / other time (below 1: kiln is faster).
`python bench/training.py [repeat]`.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable
from itertools import pairwise
from typing import Any

import numpy as np
from timing import seconds_without_coretype

from kiln.bench import run_seconds
from kiln.testing import models, train

Array = np.ndarray[Any, Any]
BATCH, SIZES, LR = 64, (784, 512, 512, 10), 0.1
FLOPS = 2 * BATCH * (3 * sum(a * b for a, b in pairwise(SIZES)) - SIZES[0] * SIZES[1])


def data(seed: int = 0) -> tuple[Array, Array, dict[str, Array]]:
    """The batch (two Gaussian blobs, 10 classes' labels), and the MLP's initial parameters."""
    _, params = models.mlp(batch=BATCH, sizes=SIZES, seed=seed)
    x, _ = train.blobs(BATCH, (SIZES[0],), seed=seed)
    labels = np.arange(BATCH, dtype=np.int64) % SIZES[-1]
    return x, labels, params


def numpy_step(x: Array, labels: Array, p: dict[str, Array]) -> tuple[float, dict[str, Array]]:
    """The step by hand in float32 (`train.numpy_mlp_step`): forward, mean softmax cross-entropy, backward, update."""
    return train.numpy_mlp_step(x, labels, p, LR)


def torch_step(x: Array, labels: Array, p: dict[str, Array]) -> Callable[[], tuple[float, dict[str, Array]]] | None:
    """PyTorch's eager step on copies of `p` (restored before each call), or None without torch."""
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(2)
    xt, lt = torch.from_numpy(x), torch.from_numpy(labels)
    start = {k: torch.from_numpy(v.copy()) for k, v in p.items()}
    live = {k: v.clone().requires_grad_(True) for k, v in start.items()}
    layers = len(SIZES) - 1

    def step() -> tuple[float, dict[str, Array]]:
        with torch.no_grad():
            for k, v in live.items():
                v.copy_(start[k])
                v.grad = None
        h = xt
        for i in range(layers):
            h = torch.nn.functional.linear(h, live[f"w{i}"], live[f"b{i}"])
            if i < layers - 1:
                h = torch.relu(h)
        loss = torch.nn.functional.cross_entropy(h, lt)
        loss.backward()
        with torch.no_grad():
            for v in live.values():
                v.sub_(LR * v.grad)
        return float(loss.detach()), {k: v.detach().numpy() for k, v in live.items()}

    return step


def seconds(fn: Callable[[], Any], repeat: int) -> list[float]:
    """Wall times of `repeat` calls of `fn`, after 3 untimed ones."""
    return run_seconds(fn, repeat, warmup=3)


def describe(name: str, times: list[float], base: float | None = None) -> str:
    med, low = statistics.median(times), min(times)
    p90 = sorted(times)[int(0.9 * (len(times) - 1))]
    line = (f"{name:34} median {med * 1e3:7.3f} ms  min {low * 1e3:7.3f} ms  p90/min {p90 / low:4.2f}  "
            f"{FLOPS / med / 1e9:6.1f} GFLOP/s")
    return line if base is None else line + f"  kiln / this {base / med:5.2f}x"


_ELSEWHERE = """
import sys, statistics
sys.path.insert(0, {bench!r})
from training import data, numpy_step, seconds
x, labels, p = data()
print(statistics.median(seconds(lambda: numpy_step(x, labels, p), {repeat})))
"""


def main(repeat: int = 50) -> None:
    x, labels, params = data()
    func, _ = models.mlp(batch=BATCH, sizes=SIZES)
    start = time.perf_counter()
    step = train.sgd_step(func, lr=LR)
    print(f"MLP {'-'.join(map(str, SIZES))}, batch {BATCH}, one SGD step ({FLOPS / 1e6:.0f} MFLOP); "
          f"kiln compiled it in {time.perf_counter() - start:.1f} s")
    args = [params[name] for name in step.params]
    loss, new = step(x, labels, params)
    want_loss, want = numpy_step(x, labels, params)
    assert abs(loss - want_loss) < 1e-4, (loss, want_loss)
    for k in want:
        np.testing.assert_allclose(new[k], want[k], rtol=1e-4, atol=1e-4, err_msg=k)
    t_kiln = seconds(lambda: step.run(x, labels, *args), repeat)
    base = statistics.median(t_kiln)
    print(describe("kiln (one library)", t_kiln))
    print(describe("numpy (OPENBLAS_CORETYPE as set)", seconds(lambda: numpy_step(x, labels, params), repeat), base))
    bench = os.path.dirname(os.path.abspath(__file__))
    free = seconds_without_coretype(_ELSEWHERE.format(bench=bench, repeat=repeat))
    print(f"{'numpy (no OPENBLAS_CORETYPE)':34} median {free * 1e3:7.3f} ms  {FLOPS / free / 1e9:32.1f} GFLOP/s"
          f"  kiln / this {base / free:5.2f}x")
    torch_fn = torch_step(x, labels, params)
    if torch_fn is None:
        print("PyTorch: not installed (pip install torch for the comparison)")
        return
    t_loss, t_new = torch_fn()
    assert abs(t_loss - want_loss) < 1e-4, (t_loss, want_loss)
    for k in want:
        np.testing.assert_allclose(t_new[k], want[k], rtol=1e-4, atol=1e-4, err_msg=k)
    print(describe("PyTorch eager (2 threads)", seconds(torch_fn, repeat), base))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 50)
