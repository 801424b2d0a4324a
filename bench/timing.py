"""The one timer of the benchmarks, here or in a clean subprocess.

`median_time(fn, repeat=7, warmup=0)` is `kiln.bench.median_seconds`, the timer of `kiln bench` and the demo.
"""

from __future__ import annotations

import os
import subprocess
import sys

from kiln.bench import median_seconds as median_time


def seconds_without_coretype(code: str) -> float:
    """Runs `code` in a subprocess with OPENBLAS_CORETYPE removed (numpy's BLAS at full speed on this
    machine) and returns the number it prints last: a time in seconds."""
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


__all__ = ["median_time", "seconds_without_coretype"]
