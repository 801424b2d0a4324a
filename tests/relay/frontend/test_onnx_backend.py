"""ONNX's backend node tests, every op type, run through kiln's compiled path as ONNX's runner feeds them.

onnx 1.23 does not ship the test data (model.onnx, test_data_set_*/*.pb) in its
wheel, so the cases are generated from `onnx.backend.test.case`: each is a
small model with its inputs and expected outputs. A case counts when every
graph input and output is a tensor of a standard dtype (float16/32/64,
int8-64, uint8-64, bool) — whatever its op types.

Every graph input is given at run time, as ONNX's backend runner gives it:
nothing is bound as a constant before the import. `OnnxRunner` imports and
compiles each case with `relay.build` for the host CPU; where an input's value
decides a shape (a Reshape's shape, TopK's k, ...), it compiles per distinct
value. Outputs must match ONNX's expected outputs with the backend runner's
tolerances. The cases listed in `onnx_known_failures.txt` (one
`name  # reason` per line) are strict xfails: a case that starts passing fails
the run until its line is removed. `python tests/relay/frontend/test_onnx_backend.py [substring]`
runs the cases and prints the failing ones in that file's format.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from kiln import relay  # noqa: E402

# float, uint8, int8, uint16, int16, int32, int64, bool, float16, double, uint32, uint64, bfloat16
_STANDARD = {1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 13, 16}
_KNOWN_FILE = Path(__file__).with_name("onnx_known_failures.txt")
# The share of cases that must pass; raise it as cases start passing (onnxruntime's CPU provider: ~91%).
PASS_RATE_BAR = 0.96


def _standard(value_infos: Any) -> bool:
    for vi in value_infos:
        if not vi.type.HasField("tensor_type") or vi.type.tensor_type.elem_type not in _STANDARD:
            return False
    return True


def collect() -> list[Any]:
    """The backend node cases whose inputs and outputs are tensors of standard dtypes, by name."""
    from onnx.backend.test.case import node

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = node.collect_testcases(None)
    out = [c for c in cases if _standard(c.model.graph.input) and _standard(c.model.graph.output)]
    return sorted(out, key=lambda c: c.name)


def known_failures() -> dict[str, str]:
    """name → reason, from onnx_known_failures.txt."""
    known = {}
    for line in _KNOWN_FILE.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            name, _, reason = line.partition("#")
            known[name.strip()] = reason.strip()
    return known


def _array(value: Any) -> np.ndarray:
    if isinstance(value, onnx.TensorProto):
        from onnx import numpy_helper

        return numpy_helper.to_array(value)
    return np.asarray(value)


def run_case(case: Any) -> None:
    """Imports, compiles and runs `case` with every input given at run time; raises on a mismatch."""
    runner = relay.frontend.OnnxRunner(case.model)
    input_names = [i.name for i in case.model.graph.input]
    for inputs, expected in case.data_sets:
        feeds = {n: _array(v) for n, v in zip(input_names, inputs, strict=True)}
        got = runner(**feeds)
        got = list(got) if isinstance(got, tuple) else [got]
        assert len(got) == len(expected), f"{len(got)} outputs, expected {len(expected)}"
        for i, (g, want) in enumerate(zip(got, expected, strict=True)):
            want = _array(want)
            g = np.asarray(g)
            assert g.dtype == want.dtype, f"output {i}: dtype {g.dtype}, expected {want.dtype}"
            assert g.shape == want.shape, f"output {i}: shape {g.shape}, expected {want.shape}"
            rtol = case.rtol if case.rtol is not None else 1e-3
            atol = case.atol if case.atol is not None else 1e-7
            if want.dtype == np.float16:
                rtol, atol = max(rtol, 1e-3), max(atol, 1e-3)
            if want.dtype.name == "bfloat16":  # as ONNX's own runner compares them: two bfloat16 ulps
                rtol, g, want = max(rtol, 2**-6), g.astype(np.float32), want.astype(np.float32)
            np.testing.assert_allclose(g, want, rtol=rtol, atol=atol, err_msg=f"output {i}")


CASES = collect()
KNOWN = known_failures()


def _params() -> list[Any]:
    marks = []
    for case in CASES:
        reason = KNOWN.get(case.name)
        mark = [pytest.mark.xfail(reason=reason, strict=True)] if reason is not None else []
        marks.append(pytest.param(case, id=case.name, marks=mark))
    return marks


# `make test` runs with --dist loadgroup: the whole suite in one worker process, which must survive it
# (a crash anywhere fails the run).
@pytest.mark.xdist_group("onnx_node_suite")
@pytest.mark.parametrize("case", _params())
def test_node(case: Any) -> None:
    run_case(case)


def test_known_failures_are_cases_and_few() -> None:
    names = {c.name for c in CASES}
    stale = sorted(set(KNOWN) - names)
    assert not stale, f"onnx_known_failures.txt lists cases that do not exist: {stale}"
    assert all(KNOWN.values()), "every known failure needs its reason after '#'"
    passing = len(CASES) - len(KNOWN)
    assert passing / len(CASES) >= PASS_RATE_BAR, f"{passing} of {len(CASES)} pass; the bar is {PASS_RATE_BAR:.0%}"


def _failure(case: Any) -> str | None:
    """Why `case` fails (kiln's first line of the error), or None when it passes."""
    try:
        run_case(case)
    except Exception as err:  # a report of every failure
        first = (str(err).strip().splitlines() or [""])[0]
        return f"{type(err).__name__}: {first}"[:300]
    return None


def _in_child(case: Any, conn: Any) -> None:
    conn.send(_failure(case))


def _list_failures(pattern: str = "", workers: int = 2, timeout: float = 300.0) -> int:
    """Runs the cases whose names contain `pattern`, each in a forked child, and prints the failing ones."""
    import multiprocessing
    import time

    ctx = multiprocessing.get_context("fork")
    pending = [c for c in CASES if pattern in c.name]
    running: list[tuple[Any, Any, Any, float]] = []
    failed = 0
    total = len(pending)
    while pending or running:
        while pending and len(running) < workers:
            case = pending.pop(0)
            receive, send = ctx.Pipe(False)
            child = ctx.Process(target=_in_child, args=(case, send))
            child.start()
            send.close()
            running.append((case, child, receive, time.monotonic()))
        time.sleep(0.01)
        for item in list(running):
            case, child, receive, started = item
            if receive.poll():
                try:
                    why = receive.recv()
                except EOFError:
                    why = f"the process died (exit code {child.exitcode})"
            elif not child.is_alive():
                why = f"the process died (exit code {child.exitcode})"
            elif time.monotonic() - started > timeout:
                child.kill()
                why = f"hangs (more than {timeout:.0f} s)"
            else:
                continue
            child.join()
            running.remove(item)
            if why is not None:
                failed += 1
                print(f"{case.name}  # {why}", flush=True)
    print(f"# {total - failed} of {total} cases pass", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(_list_failures(sys.argv[1] if len(sys.argv) > 1 else ""))
