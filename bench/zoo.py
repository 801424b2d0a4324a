"""The model zoo (`kiln.testing.zoo`) compiled by kiln and timed beside onnxruntime: the benchmark that counts.

    .venv/bin/python bench/zoo.py [NAME ...] [--repeat N] [--loaded] [--small]

For each model (all of `zoo.ZOO` by default, at their real sizes; `--small`:
the test sizes), from the same ONNX bytes:

- cold compile: a fresh process with an empty kernel cache (`KILN_CACHE_DIR`
  pointed at a new temporary folder) times from_onnx + relay.build +
  create_executor; a fresh process because kiln also keeps compiled kernels
  in memory, which a cold compile must not find;
- warm compile: the same in another fresh process, with that cache now full
  (what a user's second run of the model pays, less Python's imports);
- the run: kiln (its default threads) and onnxruntime (intra_op_num_threads=2,
  sequential) on the same random feed, median and min over `--repeat` runs
  after warm-up runs, onnxruntime first as in `kiln bench`; the outputs must
  agree within rtol 1e-3 / atol 1e-4 (else the row says FAIL).

The table gives the ratio kiln / onnxruntime of the medians (below 1: kiln is
faster) and its geometric mean over the models that ran. With `--loaded`, an
extra timing pass runs beside one CPU-bound background process (a
`while True` loop), which is stopped afterwards whatever happens, and a second
table gives both runtimes' medians under load and their growth factors
(loaded / unloaded): how each one's thread pool copes with a busy core.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from kiln.bench import median_seconds
from kiln.testing import zoo

RTOL, ATOL = 1e-3, 1e-4
ORT_THREADS = 2
WARMUP = 2


def compile_seconds(path: str) -> tuple[Any, float]:
    """(executor, seconds) of compiling the ONNX file at `path`: from_onnx(bytes), relay.build, create_executor."""
    from kiln import relay
    from kiln.relay.frontend import from_onnx

    data = Path(path).read_bytes()
    start = time.perf_counter()
    mod, params = from_onnx(data)
    executor = relay.build(mod, params=params).create_executor()
    return executor, time.perf_counter() - start


def compile_in_child(path: str, cache: str) -> float:
    """The compile time of `path` in a fresh process whose kernel cache is the folder `cache`."""
    env = {**os.environ, "KILN_CACHE_DIR": cache}
    out = subprocess.run([sys.executable, __file__, "--compile-seconds", path], env=env, capture_output=True,
                         text=True)
    if out.returncode != 0:
        raise RuntimeError(out.stderr.strip().splitlines()[-1] if out.stderr.strip() else f"exit {out.returncode}")
    return float(json.loads(out.stdout.strip().splitlines()[-1]))


def timed(fn: Callable[[], Any], repeat: int) -> tuple[float, float]:
    """(median, min) seconds of `fn()` over `repeat` runs after warm-up runs, through kiln.bench.median_seconds."""
    times: list[float] = []

    def run() -> None:
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)

    median = median_seconds(run, repeat, warmup=WARMUP)
    return median, min(times[WARMUP:])


@contextlib.contextmanager
def busy_core() -> Iterator[None]:
    """One CPU-bound background process for the duration of the block, always stopped afterwards."""
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)  # let it start spinning
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def ort_session(model_bytes: bytes) -> Any:
    """An onnxruntime CPU session with ORT_THREADS intra-op threads, running nodes sequentially."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = ORT_THREADS
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    return ort.InferenceSession(model_bytes, options, providers=["CPUExecutionProvider"])


def bench_model(name: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """Builds, compiles, checks and times one zoo model; the row of the tables."""
    model = zoo.build(name, small=args.small)
    path = workdir / f"{name}.onnx"
    path.write_bytes(model.SerializeToString())
    cache = workdir / f"cache-{name}"  # made by kiln (0700) on the first store
    row: dict[str, Any] = {"model": name, "cold": compile_in_child(str(path), str(cache))}
    row["warm"] = compile_in_child(str(path), str(cache))
    previous = os.environ.get("KILN_CACHE_DIR")
    os.environ["KILN_CACHE_DIR"] = str(cache)
    try:
        executor, _ = compile_seconds(str(path))
    finally:
        if previous is None:
            del os.environ["KILN_CACHE_DIR"]
        else:
            os.environ["KILN_CACHE_DIR"] = previous
    feed = zoo.inputs(model, seed=1)
    session = ort_session(path.read_bytes())
    reference = session.run(None, feed)
    result = executor(**feed)
    outputs = list(result) if isinstance(result, tuple) else [result]
    row["error"] = max(float(np.max(np.abs(np.asarray(a, np.float64) - b))) for a, b in zip(outputs, reference,
                                                                                        strict=True))
    row["ok"] = all(np.allclose(a, b, rtol=RTOL, atol=ATOL) for a, b in zip(outputs, reference, strict=True))

    def run_ort() -> Any:
        return session.run(None, feed)

    def run_kiln() -> Any:
        return executor(**feed)

    row["ort"] = timed(run_ort, args.repeat)
    row["kiln"] = timed(run_kiln, args.repeat)
    if args.loaded:
        with busy_core():
            row["ort_loaded"] = timed(run_ort, args.repeat)
            row["kiln_loaded"] = timed(run_kiln, args.repeat)
    return row


def _ms(pair: tuple[float, float]) -> str:
    return f"{pair[0] * 1e3:9.2f} {pair[1] * 1e3:9.2f}"


def print_tables(rows: list[dict[str, Any]], loaded: bool) -> None:
    """The result table, the geometric mean of the ratios, and with `loaded` the table under load."""
    print()
    print(f"{'model':<16} {'cold s':>7} {'warm s':>7} {'kiln ms':>9} {'(min)':>9} {'ORT ms':>9} {'(min)':>9} "
          f"{'kiln/ORT':>8} {'max err':>9}  check")
    ratios = []
    for row in rows:
        if "failed" in row:
            print(f"{row['model']:<16} FAIL  {row['failed']}")
            continue
        ratio = row["kiln"][0] / row["ort"][0]
        ratios.append(ratio)
        check = "ok" if row["ok"] else f"FAIL (rtol {RTOL:g}, atol {ATOL:g})"
        print(f"{row['model']:<16} {row['cold']:7.1f} {row['warm']:7.2f} {_ms(row['kiln'])} {_ms(row['ort'])} "
              f"{ratio:8.2f} {row['error']:9.2e}  {check}")
    if ratios:
        print(f"geometric mean of kiln/ORT over {len(ratios)} models: "
              f"{math.exp(sum(map(math.log, ratios)) / len(ratios)):.2f}")
    if loaded:
        print("\nwith one core busy (a CPU-bound background process):")
        print(f"{'model':<16} {'kiln ms':>9} {'growth':>7} {'ORT ms':>9} {'growth':>7} {'kiln/ORT':>8}")
        for row in rows:
            if "kiln_loaded" not in row:
                continue
            kiln, ort = row["kiln_loaded"][0], row["ort_loaded"][0]
            print(f"{row['model']:<16} {kiln * 1e3:9.2f} {kiln / row['kiln'][0]:6.2f}x {ort * 1e3:9.2f} "
                  f"{ort / row['ort'][0]:6.2f}x {kiln / ort:8.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"zoo models (default: all): {', '.join(zoo.ZOO)}")
    parser.add_argument("--repeat", type=int, default=20, help="timed runs of each runtime (default 20)")
    parser.add_argument("--loaded", action="store_true", help="also time beside one CPU-bound process")
    parser.add_argument("--small", action="store_true", help="the test sizes of zoo.SMALL, not the real ones")
    parser.add_argument("--compile-seconds", metavar="PATH", help=argparse.SUPPRESS)  # the child of compile_in_child
    args = parser.parse_args(argv)
    if args.compile_seconds:
        print(json.dumps(compile_seconds(args.compile_seconds)[1]))
        return 0
    unknown = [n for n in args.names if n not in zoo.ZOO]
    if unknown:
        parser.error(f"not in the zoo: {', '.join(unknown)} (known: {', '.join(zoo.ZOO)})")
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        print("onnxruntime is not installed: nothing to compare with (pip install onnxruntime)")
        return 0
    rows = []
    with tempfile.TemporaryDirectory(prefix="kiln-zoo-") as tmp:
        for name in args.names or list(zoo.ZOO):
            print(f"== {name}: {zoo.ZOO[name][1]}", flush=True)
            try:
                row = bench_model(name, args, Path(tmp))
            except Exception as err:  # report the model and go on with the others
                traceback.print_exc()
                row = {"model": name, "failed": f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"}
            rows.append(row)
            if "kiln" in row:
                print(f"   cold {row['cold']:.1f} s, warm {row['warm']:.2f} s, kiln {row['kiln'][0] * 1e3:.2f} ms, "
                      f"ORT {row['ort'][0] * 1e3:.2f} ms, max err {row['error']:.2e}", flush=True)
    print_tables(rows, args.loaded)
    return 0 if all(r.get("ok") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
