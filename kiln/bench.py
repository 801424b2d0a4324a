"""`kiln bench`: a compiled model's run time on random inputs, beside onnxruntime's on the same inputs.

Times are medians of `repeat` runs after warm-up runs, printed with their minimum and 90th percentile; a
warning says when the runs spread widely (p90 over 1.5x the minimum: another process held a core).
onnxruntime runs first (its worker threads stop spinning before kiln is timed), with its default
session options; kiln runs the library relay.build made for the target. The
ratio printed is onnxruntime's time over kiln's: above 1, kiln is faster.
The outputs of both are compared, so a fast wrong answer shows. With
`per_kernel`, each kernel launch is then timed on its own
(`GraphExecutor.profile`) and the kernels are printed by time.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections.abc import Callable, Mapping
from typing import IO, Any

import numpy as np

from kiln.errors import KilnError
from kiln.ir.module import IRModule


def run_seconds(fn: Callable[[], Any], repeat: int = 7, warmup: int = 0) -> list[float]:
    """The wall time of each of `repeat` runs of `fn()`, after `warmup` untimed runs."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def median_seconds(fn: Callable[[], Any], repeat: int = 7, warmup: int = 0) -> float:
    """The median wall time of `fn()` over `repeat` runs, after `warmup` untimed runs."""
    return statistics.median(run_seconds(fn, repeat, warmup))


def random_inputs(specs: Mapping[str, tuple[tuple[int, ...], str]], seed: int = 0) -> dict[str, np.ndarray]:
    """Random arrays for inputs given as name → (shape, dtype): normal floats, small non-negative ints."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, (shape, dtype) in specs.items():
        dt = np.dtype(dtype)
        if dt.kind == "f":
            out[name] = rng.standard_normal(shape).astype(dt)
        elif dt.kind == "b":
            out[name] = rng.integers(0, 2, shape).astype(dt)
        else:
            out[name] = rng.integers(0, 4, shape).astype(dt)
    return out


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:9.3f} ms"


_WIDE = 1.5  # p90 / min above this: the runs disagree too much for one number to stand for them


def _line(name: str, seconds: list[float], stream: IO[str]) -> float:
    """Prints a runner's min, median and p90 (and a warning when they spread widely); returns the median."""
    ordered = sorted(seconds)
    med, p90 = statistics.median(ordered), ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]
    print(f"{name:12} {_ms(med)}  (median of {len(ordered)}; min {_ms(ordered[0]).strip()}, "
          f"p90 {_ms(p90).strip()})", file=stream)
    if ordered[0] > 0 and p90 / ordered[0] > _WIDE:
        print(f"  warning: {name}'s times spread widely (p90 is {p90 / ordered[0]:.3g}x the minimum): another "
              "process may hold a core; rerun, or raise --repeat", file=stream)
    return med


def compare(
    model: Any,
    mod: IRModule,
    params: Mapping[str, np.ndarray] | None,
    target: str = "llvm",
    repeat: int = 50,
    onnxruntime: bool = True,
    out: IO[str] | None = None,
    per_kernel: bool = False,
    html: str | None = None,
) -> dict[str, float]:
    """Compiles `mod`, times it on random inputs and, for an ONNX model, times onnxruntime beside it.

    Args:
        model: what `mod` was imported from: a file path, or an onnx.ModelProto (given to onnxruntime).
        mod, params: the module to compile and the values of its parameters.
        target: the kiln target.
        repeat: timed runs of each; the median is reported.
        onnxruntime: whether to time onnxruntime on `model` too.
        out: where to print (default stdout).
        per_kernel: then time each kernel launch over `repeat` runs and print the kernels by time.
        html: also write that per-kernel profile to this file as an HTML bar chart (`kiln.runtime.draw`).

    Returns:
        The times in seconds by runner ("kiln", and "onnxruntime" when it ran), and the
        largest difference between their outputs ("max_abs_diff", with onnxruntime).
    """
    from kiln import relay

    stream = out if out is not None else sys.stdout
    start = time.perf_counter()
    lib = relay.build(mod, target=target, params=params)
    compile_s = time.perf_counter() - start
    slots = [lib.graph.slots[s] for s in lib.graph.inputs]
    if not all(isinstance(d, int) for s in slots for d in s.shape):
        raise KilnError("kiln bench needs static input shapes: give them with --shape NAME=D0,D1,...")
    inputs = random_inputs({s.name: (s.dims, str(s.dtype)) for s in slots})
    described = ", ".join(f"{s.name} {s.dtype}{list(s.shape)}" for s in slots)
    label = os.fspath(model) if isinstance(model, str | os.PathLike) else getattr(model.graph, "name", "model")
    print(f"model: {label}  (inputs: {described or 'none'})", file=stream)
    print(f"kiln: compiled {len(lib.kernels)} kernels for {lib.target.summary()} in {compile_s:.2f} s", file=stream)
    times: dict[str, float] = {}
    reference = None
    if onnxruntime:
        session = _ort_session(model, stream)
        if session is not None:
            feeds = {k: v for k, v in inputs.items() if k in {i.name for i in session.get_inputs()}}
            reference = session.run(None, feeds)
            ort_runs = run_seconds(lambda: session.run(None, feeds), repeat, warmup=3)
    ex = lib.create_executor()
    result = ex(**inputs)
    outputs = list(result) if isinstance(result, tuple) else [result]
    times["kiln"] = _line("kiln", run_seconds(lambda: ex(**inputs), repeat, warmup=3), stream)
    if reference is not None:
        times["onnxruntime"] = _line("onnxruntime", ort_runs, stream)
        ratio = times["onnxruntime"] / times["kiln"]
        print(f"kiln speed vs onnxruntime: {ratio:.3g}x ({'faster' if ratio >= 1 else 'slower'}; medians)",
              file=stream)
        diffs = [float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)), initial=0.0))
                 for a, b in zip(outputs, reference, strict=False)]
        times["max_abs_diff"] = max(diffs, default=0.0)
        print(f"max |kiln - onnxruntime| over the outputs: {times['max_abs_diff']:.3g}", file=stream)
    if per_kernel or html:
        profile = ex.profile(repeat=repeat, warmup=1, **inputs)
        if per_kernel:
            print(file=stream)
            print(profile, file=stream)
        if html:
            from kiln.runtime.draw import profile_html

            with open(html, "w", encoding="utf-8") as f:
                f.write(profile_html(profile, f"kiln per-kernel profile: {label}"))
            print(f"wrote the per-kernel profile to {html}", file=stream)
    return times


def _ort_session(model: Any, stream: IO[str]) -> Any:
    try:
        import onnxruntime as ort
    except ImportError:
        print("onnxruntime is not installed: timing kiln alone (pip install onnxruntime)", file=stream)
        return None
    try:
        source = os.fspath(model) if isinstance(model, str | os.PathLike) else model.SerializeToString()
        return ort.InferenceSession(source, providers=["CPUExecutionProvider"])
    except Exception as err:  # onnxruntime's own exception types
        print(f"onnxruntime cannot load the model ({str(err).splitlines()[0]}): timing kiln alone", file=stream)
        return None
