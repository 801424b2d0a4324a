"""ONNX's backend node tests, run through kiln's compiled path.

onnx 1.23 does not ship the test data (model.onnx, test_data_set_*/*.pb) in its
wheel, so the cases are generated from `onnx.backend.test.case`: each is a
one-node model with its inputs and expected outputs. A case counts when its
node is one of the op types the ONNX frontend promises (OP_TYPES) and every
input and output has a standard dtype (float16/32/64, int8-64, uint8, bool).

Each case is imported with `from_onnx`, compiled with `relay.build` for the
host CPU and run; outputs must match ONNX's expected outputs with the backend
runner's tolerances. The cases listed in `onnx_known_failures.txt` (one
`name  # reason` per line) are strict xfails: a case that starts passing fails
the run until its line is removed. `python tests/relay/frontend/test_onnx_backend.py` runs
every case and prints the failing ones in that file's format.
"""

from __future__ import annotations

import re
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from kiln import relay  # noqa: E402

OP_TYPES = frozenset([
    "Add", "Sub", "Mul", "Div", "Pow", "Neg", "Abs", "Sqrt", "Exp", "Log", "Relu", "LeakyRelu", "PRelu",
    "Sigmoid", "Tanh", "Erf", "Gelu", "HardSigmoid", "HardSwish", "Clip", "Where", "Equal", "Less", "Greater",
    "Not", "And", "Or", "Max", "Min", "Sum", "Mean", "MatMul", "Gemm", "Conv", "ConvTranspose", "MaxPool",
    "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "BatchNormalization", "InstanceNormalization",
    "LayerNormalization", "Softmax", "LogSoftmax", "Dropout", "Reshape", "Transpose", "Concat", "Split",
    "Squeeze", "Unsqueeze", "Flatten", "Slice", "Gather", "Pad", "Cast", "Expand", "Tile", "Shape",
    "Identity", "Constant", "ConstantOfShape", "Range", "ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin",
    "ReduceProd", "ArgMax", "ArgMin", "Resize", "Upsample",
])
_STANDARD = {1, 2, 3, 5, 6, 7, 9, 10, 11}  # float, uint8, int8, int16, int32, int64, bool, float16, double
_KNOWN_FILE = Path(__file__).with_name("onnx_known_failures.txt")


def _standard(value_infos: Any) -> bool:
    for vi in value_infos:
        if not vi.type.HasField("tensor_type") or vi.type.tensor_type.elem_type not in _STANDARD:
            return False
    return True


def collect() -> list[Any]:
    """The backend node cases of OP_TYPES with standard dtypes, by name."""
    from onnx.backend.test.case import node

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = node.collect_testcases(None)
    out = []
    for case in cases:
        graph = case.model.graph
        if len(graph.node) != 1 or graph.node[0].op_type not in OP_TYPES:
            continue
        if _standard(graph.input) and _standard(graph.output):
            out.append(case)
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


def _with_constant_inputs(model: Any, values: dict[str, np.ndarray]) -> Any:
    """`model` with the graph inputs named in `values` made initializers holding those values."""
    from onnx import numpy_helper

    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    keep = [vi for vi in graph.input if vi.name not in values]
    graph.initializer.extend(numpy_helper.from_array(v, name) for name, v in values.items())
    del graph.input[:]
    graph.input.extend(keep)
    return model


def _import(case: Any, inputs: list[np.ndarray]) -> tuple[Any, Any, Any]:
    """(model, mod, params) for `case`, with the inputs the import needs as constants bound to their values."""
    by_name = dict(zip((i.name for i in case.model.graph.input), inputs, strict=False))
    node = case.model.graph.node[0]
    bound: dict[str, np.ndarray] = {}
    while True:
        model = _with_constant_inputs(case.model, bound) if bound else case.model
        try:
            mod, params = relay.frontend.from_onnx(model)
            return model, mod, params
        except relay.frontend.OnnxImportError as err:
            found = re.search(r"input #(\d+) \(\w+\) must be a constant", str(err))
            name = node.input[int(found.group(1))] if found else None
            if name is None or name not in by_name or name in bound:
                raise
            bound[name] = by_name[name]


def run_case(case: Any) -> None:
    """Imports, compiles and runs `case`; raises AssertionError (or kiln's error) on a mismatch.

    kiln compiles static shapes, so an input that the converter needs as a
    constant (axes, a shape, pads, scales, ...) and that the case feeds as a
    graph input is bound to the case's value: each time the import reports
    "input #i (...) must be a constant", that input becomes an initializer.
    """
    for inputs, expected in case.data_sets:
        inputs, expected = [_array(v) for v in inputs], [_array(v) for v in expected]
        model, mod, params = _import(case, inputs)
        _run(model, mod, params, inputs, expected, case)


def _run(model: Any, mod: Any, params: Any, inputs: Any, expected: Any, case: Any) -> None:
    lib = relay.build(mod, target="llvm", params=params)
    names = {i.name for i in model.graph.input}
    input_names = [i.name for i in case.model.graph.input]
    feeds = {n: np.asarray(v) for n, v in zip(input_names, inputs, strict=False) if n in names}
    got = lib.create_executor()(**feeds)
    got = list(got) if isinstance(got, tuple) else [got]
    assert len(got) == len(expected), f"{len(got)} outputs, expected {len(expected)}"
    for i, (g, want) in enumerate(zip(got, expected, strict=True)):
        want = np.asarray(want)
        g = np.asarray(g)
        assert g.dtype == want.dtype, f"output {i}: dtype {g.dtype}, expected {want.dtype}"
        assert g.shape == want.shape, f"output {i}: shape {g.shape}, expected {want.shape}"
        rtol = case.rtol if case.rtol is not None else 1e-3
        atol = case.atol if case.atol is not None else 1e-7
        if want.dtype == np.float16:
            rtol, atol = max(rtol, 1e-3), max(atol, 1e-3)
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


@pytest.mark.parametrize("case", _params())
def test_node(case: Any) -> None:
    run_case(case)


def test_known_failures_are_cases_and_few() -> None:
    names = {c.name for c in CASES}
    stale = sorted(set(KNOWN) - names)
    assert not stale, f"onnx_known_failures.txt lists cases that do not exist: {stale}"
    assert all(KNOWN.values()), "every known failure needs its reason after '#'"
    passing = len(CASES) - len(KNOWN)
    assert passing / len(CASES) >= 0.95, f"{passing} of {len(CASES)} pass; the bar is 95%"


def test_every_promised_op_type_has_cases() -> None:
    covered = {c.model.graph.node[0].op_type for c in CASES}
    assert covered == OP_TYPES


def _list_failures(pattern: str = "") -> int:
    failed = run = 0
    for case in CASES:
        if pattern not in case.name:
            continue
        run += 1
        try:
            run_case(case)
        except Exception as err:  # a report of every failure
            failed += 1
            first = (str(err).strip().splitlines() or [type(err).__name__])[0]
            print(f"{case.name}  # {type(err).__name__}: {first}"[:300], flush=True)
    print(f"# {run - failed} of {run} cases pass", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(_list_failures(sys.argv[1] if len(sys.argv) > 1 else ""))
