"""`kiln bench`'s report: each runner's median with its minimum and 90th percentile, and a warning when the
runs spread widely (the machine is shared: a number that the runs do not agree on is not a result)."""

from __future__ import annotations

import io

from kiln.bench import _line


def test_a_runner_prints_min_median_and_p90_and_returns_the_median() -> None:
    out = io.StringIO()
    assert _line("kiln", [0.0021, 0.0020, 0.0022, 0.0020, 0.0021], out) == 0.0021
    assert out.getvalue() == "kiln             2.100 ms  (median of 5; min 2.000 ms, p90 2.200 ms)\n"


def test_a_wide_spread_is_a_warning() -> None:
    out = io.StringIO()
    _line("onnxruntime", [0.001] * 8 + [0.0625, 0.0625], out)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("onnxruntime      1.000 ms  (median of 10; min 1.000 ms, p90 62.500 ms)")
    assert lines[1] == ("  warning: onnxruntime's times spread widely (p90 is 62.5x the minimum): another process "
                        "may hold a core; rerun, or raise --repeat")
