"""Symbolic shapes: one build for every size, against a static build of one size, in one run.

Models: the zoo's BERT-base encoder (2 layers, from token ids and an attention mask) and GPT-2 small blocks
(2 blocks), exported with dynamic batch and sequence axes as torch.onnx.export writes them
(`kiln.testing.zoo`, `batch="batch", seq="sequence"`); a BERT-base encoder layer built in relay
(`kiln.testing.models`, hidden 768, 12 heads, FFN 3072) on x (n, s, 768); the MLP 784-512-512-10 on
x (n, 784). Each is built three ways: static at the measured size (an ONNX model: the same file, its input
dims fixed with `shape=`); symbolic; symbolic with `specialize=` at that size (a static fast path inside
the symbolic library). The executors (and onnxruntime, for the ONNX models) run the same input in turn,
`repeat` calls per round over `rounds` rounds; the table gives each one's median and minimum per call and its
ratio to the static build (the issue's bars: symbolic within 1.15x, specialized within 1.02x). Then the
symbolic builds run other sizes, checked against onnxruntime or numpy, with no build in between.
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
    """Seconds per call of each run, `repeat` calls per round, the runs taking turns each round (in an order
    rotated each round: the first run of a round meets caches and idle threads the last one left)."""
    out: dict[str, list[float]] = {name: [] for name in runs}
    for fn in runs.values():
        fn()
    names = list(runs)
    for r in range(rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            fn = runs[name]
            start = time.perf_counter()
            for _ in range(repeat):
                fn()
            out[name].append((time.perf_counter() - start) / repeat)
    return out


def _report(label: str, runs: dict[str, Callable[[], Any]], repeat: int, rounds: int) -> None:
    times = _times(runs, repeat, rounds)
    base = statistics.median(times["static"])
    for kind, ts in times.items():
        med = statistics.median(ts)
        print(f"  {label}: {kind:11} median {med * 1e3:8.3f} ms  min {min(ts) * 1e3:8.3f} ms  "
              f"x static {med / base:5.3f}")


def _libraries(label: str, build: Callable[[str], Any]) -> dict[str, Any]:
    libs = {}
    for kind in ("static", "symbolic", "specialized"):
        start = time.perf_counter()
        libs[kind] = build(kind)
        print(f"{label}: {kind:11} build {time.perf_counter() - start:6.1f} s, {len(libs[kind].kernels)} kernels")
    return libs


def compare(label: str, build: Callable[[Any, Any], Any], shape: tuple[int, ...], names: tuple[str, ...],
            repeat: int, rounds: int) -> Any:
    """Builds the static, symbolic and specialized libraries of a relay model and prints their times at `shape`."""
    x = np.random.default_rng(0).standard_normal(shape).astype("float32")

    def make(kind: str) -> Any:
        func, params = build(*(shape[: len(names)] if kind == "static" else names))
        spec = {n: [v] for n, v in zip(names, shape, strict=False)} if kind == "specialized" else None
        return relay.build(func, params=params, specialize=spec)

    executors = {kind: lib.create_executor() for kind, lib in _libraries(label, make).items()}
    outs = {kind: ex(x=x) for kind, ex in executors.items()}
    for kind in ("symbolic", "specialized"):
        np.testing.assert_allclose(outs[kind], outs["static"], rtol=1e-4, atol=1e-4)
    _report(f"{label} {shape}", {kind: (lambda ex=ex: ex(x=x)) for kind, ex in executors.items()}, repeat, rounds)
    return executors["symbolic"]


def compare_onnx(name: str, batch: int, seq: int, repeat: int, rounds: int) -> None:
    """The zoo model `name` with dynamic axes, built three ways and run beside onnxruntime at (batch, seq); then
    the symbolic build at other sizes against onnxruntime."""
    import onnxruntime as ort

    from kiln.relay.frontend import from_onnx
    from kiln.testing import zoo

    model = zoo.build(name, batch="batch", seq="sequence")
    sizes = {"batch": batch, "sequence": seq}

    def make(kind: str) -> Any:
        fixed = {i.name: [batch, seq, *(d.dim_value for d in i.type.tensor_type.shape.dim[2:])]
                 for i in model.graph.input}
        mod, params = from_onnx(model, shape=fixed if kind == "static" else None)
        spec = {k: [v] for k, v in sizes.items()} if kind == "specialized" else None
        return relay.build(mod, params=params, specialize=spec)

    executors = {kind: lib.create_executor() for kind, lib in _libraries(name, make).items()}
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    feed = zoo.inputs(model, sizes=sizes)
    want = session.run(None, feed)[0]
    for ex in executors.values():
        np.testing.assert_allclose(ex(**feed), want, rtol=1e-4, atol=1e-4)
    runs: dict[str, Callable[[], Any]] = {kind: (lambda ex=ex: ex(**feed)) for kind, ex in executors.items()}
    runs["onnxruntime"] = lambda: session.run(None, feed)
    _report(f"{name} ({batch}, {seq})", runs, repeat, rounds)
    for b, s in [(1, 1), (3, 17), (8, 128), (1, 384)]:
        feed = zoo.inputs(model, seed=b * s, sizes={"batch": b, "sequence": s})
        start = time.perf_counter()
        got = executors["symbolic"](**feed)
        seconds = time.perf_counter() - start
        err = float(np.max(np.abs(got - session.run(None, feed)[0])))
        print(f"  {name} symbolic at ({b}, {s}): {seconds * 1e3:8.2f} ms (first call), max |error| vs "
              f"onnxruntime {err:.1e}")


def main(repeat: int = 10, rounds: int = 7) -> None:
    for name in ("bert_base", "gpt2_blocks"):
        compare_onnx(name, 1, 128, repeat, rounds)
    hidden, heads = 768, 12
    ex = compare("encoder", lambda n, s: models.encoder(n, s), (1, 128, hidden), ("n", "s"), repeat, rounds)
    _, params = models.encoder(1, 1)
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
