"""Symbolic shapes: one build for every size, against a static build of one size, in one run.

Models (`kiln.testing.models`): a BERT-base encoder layer (hidden 768, 12 heads, FFN 3072) on x (n, s, 768),
and the MLP 784-512-512-10 on x (n, 784), weights bound as constants. Each is built three ways: static at the
measured size; symbolic (`relay.var("x", shape=("n", "s", 768))`); symbolic with `specialize=` at that size
(a static fast path inside the symbolic library). The three executors run the same input in turn, `repeat`
calls per round over `rounds` rounds; the table gives each one's median and minimum per call and its ratio to
the static build (the issue's bars: symbolic within 1.15x, specialized within 1.02x). Then the symbolic
encoder runs other sizes, checked against numpy, with no build in between.
`python bench/symbolic.py [repeat] [rounds]`.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from kiln import relay
from kiln.testing import models


def _times(runs: dict[str, Callable[[], Any]], repeat: int, rounds: int) -> dict[str, list[float]]:
    """Seconds per call of each run, `repeat` calls per round, the runs taking turns each round."""
    out: dict[str, list[float]] = {name: [] for name in runs}
    for fn in runs.values():
        fn()
    for _ in range(rounds):
        for name, fn in runs.items():
            start = time.perf_counter()
            for _ in range(repeat):
                fn()
            out[name].append((time.perf_counter() - start) / repeat)
    return out


def compare(label: str, build: Callable[[Any, Any], Any], shape: tuple[int, ...], names: tuple[str, ...],
            repeat: int, rounds: int) -> Any:
    """Builds the static, symbolic and specialized libraries of one model and prints their times at `shape`."""
    x = np.random.default_rng(0).standard_normal(shape).astype("float32")
    libs = {}
    for kind in ("static", "symbolic", "specialized"):
        start = time.perf_counter()
        dims = shape[: len(names)] if kind == "static" else names
        func, params = build(*dims)
        spec = {n: [v] for n, v in zip(names, shape, strict=False)} if kind == "specialized" else None
        libs[kind] = relay.build(func, params=params, specialize=spec)
        print(f"{label}: {kind:11} build {time.perf_counter() - start:6.1f} s, {len(libs[kind].kernels)} kernels")
    executors = {kind: lib.create_executor() for kind, lib in libs.items()}
    outs = {kind: ex(x=x) for kind, ex in executors.items()}
    for kind in ("symbolic", "specialized"):
        np.testing.assert_allclose(outs[kind], outs["static"], rtol=1e-4, atol=1e-4)
    times = _times({kind: (lambda ex=ex: ex(x=x)) for kind, ex in executors.items()}, repeat, rounds)
    base = statistics.median(times["static"])
    for kind, ts in times.items():
        med = statistics.median(ts)
        print(f"  {label} {shape}: {kind:11} median {med * 1e3:8.3f} ms  min {min(ts) * 1e3:8.3f} ms  "
              f"x static {med / base:5.3f}")
    return libs["symbolic"], build


def main(repeat: int = 10, rounds: int = 7) -> None:
    hidden, heads = 768, 12
    lib, _ = compare("encoder", lambda n, s: models.encoder(n, s), (1, 128, hidden), ("n", "s"), repeat, rounds)
    _, params = models.encoder(1, 1)
    ex = lib.create_executor()
    for n, s in [(1, 1), (3, 17), (8, 128), (1, 384)]:
        x = np.random.default_rng(n * s).standard_normal((n, s, hidden)).astype("float32")
        start = time.perf_counter()
        got = ex(x=x)
        seconds = time.perf_counter() - start
        err = float(np.max(np.abs(got - models.encoder_numpy(x, params, heads))))
        print(f"  encoder symbolic at ({n}, {s}): {seconds * 1e3:8.2f} ms (first call), max |error| {err:.1e}")
    compare("mlp", lambda n: models.mlp(n), (64, 784), ("n",), repeat, rounds)


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))
