"""The one timer of the benchmarks: the median wall time of repeated runs, here or in a clean subprocess."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable


def median_time(fn: Callable[[], object], repeat: int = 7, warmup: int = 0) -> float:
    """The median wall time of `fn()` over `repeat` runs, after `warmup` untimed runs."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def seconds_without_coretype(code: str) -> float:
    """Runs `code` in a subprocess with OPENBLAS_CORETYPE removed (numpy's BLAS at full speed on this
    machine) and returns the number it prints last: a time in seconds."""
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])
