"""The Relay graph fuzzer of kiln.testing.fuzz: random well-typed graphs, compiled against two references.

The fuzz run itself goes to a child process (`python -m kiln.testing.fuzz`), so
a graph whose build or run kills the process fails this test with that graph
printed, instead of killing the test runner. `pytest --fuzz-long=SECONDS` keeps
it going with fresh seeds for that long; by default it checks a fixed,
derandomized set of graphs in about 30 s.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from kiln import relay, te
from kiln.ir.types import TensorType, TupleType
from kiln.registry import OpPattern, register_implementation
from kiln.relay.op._reg import elementwise_compute
from kiln.relay.op._schedule import default_schedule
from kiln.testing import fuzz

# Graphs with dims of size 0 are drawn: the executor runs them (empty values) since 86b157e.
ZERO_DIMS = True
DEFAULT_EXAMPLES = 200
ROOT = Path(__file__).resolve().parents[2]


def fuzz_long_seconds(config: pytest.Config) -> float:
    """The --fuzz-long budget in seconds (0 when the option is absent or not given)."""
    try:
        value = config.getoption("--fuzz-long", default=0)
    except ValueError:  # the option is not registered
        return 0.0
    return float(value or 0)


def test_random_graphs_compile_to_the_results_of_the_interpreter_and_numpy(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    seconds = fuzz_long_seconds(request.config)
    progress = tmp_path / "current_graph.txt"
    command = [sys.executable, "-m", "kiln.testing.fuzz", "--examples", str(DEFAULT_EXAMPLES),
               "--progress", str(progress)]
    if not ZERO_DIMS:
        command.append("--no-zero-dims")
    if seconds > 0:
        command += ["--seconds", str(seconds)]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=max(600.0, 3 * seconds), check=False
    )
    if done.returncode < 0:
        graph = progress.read_text() if progress.exists() else "(no graph was started)"
        pytest.fail(f"the fuzzer's process died of {signal.Signals(-done.returncode).name} checking\n{graph}")
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-12000:]
    assert "no difference found" in done.stdout


@settings(max_examples=150, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(fuzz.relay_graphs(zero_dims=ZERO_DIMS))
def test_generated_graphs_type_check_to_the_types_of_numpys_outputs(case: fuzz.FuzzCase) -> None:
    # well typed by construction: the relations agree with the numpy values the generator computed
    func = relay.infer_type(case.func)
    ret = func.body.checked_type
    assert isinstance(ret, TupleType) == case.multiple
    types, todo = [], [ret]
    while todo:  # the tensor types in order, nested tuples flattened
        ty = todo.pop(0)
        if isinstance(ty, TupleType):
            todo[:0] = list(ty.fields)
        else:
            types.append(ty)
    assert len(types) == len(case.expected)
    for ty, want in zip(types, case.expected, strict=True):
        assert ty == TensorType(want.shape, str(want.dtype))


def test_check_case_finds_a_wrong_kernel() -> None:
    # a negative that adds 1, preferred to the library's: the fuzzer must see it
    wrong = elementwise_compute(lambda attrs, x: te.cast(-x + 1, x.dtype), "negative")
    register_implementation("negative", wrong, default_schedule(OpPattern.ELEMWISE), name="wrong", priority=100)
    x = relay.var("x0", shape=(2, 3))
    case = fuzz.FuzzCase(
        relay.Function([x], relay.negative(x)), {"x0": np.ones((2, 3), "float32")},
        (-np.ones((2, 3), "float32"),), False,
    )
    with pytest.raises(AssertionError, match=r"output 0 \(compiled vs numpy\): 6 of 6 elements differ"):
        fuzz.check_case(case)


def test_check_case_names_outputs_of_the_wrong_shape() -> None:
    x = relay.var("x0", shape=(2, 3))
    case = fuzz.FuzzCase(relay.Function([x], relay.negative(x)), {"x0": np.ones((2, 3), "float32")},
                         (np.ones((3, 2), "float32"),), False)
    with pytest.raises(AssertionError, match=r"output 0 \(compiled vs numpy\): float32\[2, 3\] where "
                                             r"float32\[3, 2\] was expected"):
        fuzz.check_case(case)


def test_check_case_allows_rounding_but_not_a_relative_error_of_1e_3() -> None:
    # an exp that is 0.1% too large, where the case allows a few ulps: the fuzzer must see it
    wrong = elementwise_compute(lambda attrs, x: te.exp(x) * te.const(1.001, x.dtype), "exp")
    def case(n: int) -> fuzz.FuzzCase:
        x = relay.var("x0", shape=(n,))
        data = np.array([0.25, -1.0, 2.0, 0.0, 1.5][:n], "float32")
        return fuzz.FuzzCase(relay.Function([x], relay.exp(x)), {"x0": data}, (np.exp(data),), False, (False,), (8e-6,))

    fuzz.check_case(case(5))  # the library's exp is within the allowed rounding
    # (another shape: the kernel cache of te_compiler would serve the kernel compiled before the registration)
    register_implementation("exp", wrong, default_schedule(OpPattern.ELEMWISE), name="wrong", priority=100)
    message = r"output 0 \(compiled vs numpy\): max abs error 0\.00739 \(allowed 3\.2e-05\)"
    with pytest.raises(AssertionError, match=message):
        fuzz.check_case(case(4))
