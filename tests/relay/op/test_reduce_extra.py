"""The scan ops cumsum and cumprod (kiln/relay/op/reduce.py): relation, reference, compute, errors.

The numpy references are checked against hand-computed values (ONNX's examples), the compiled
scans against the references over a grid of shapes, axes, flags and dtypes, and the compute's form:
ceil(log2 n) elementwise steps kept apart, no reduction, no bounds check past the first; axes of 256
and more in blocks of 16, a few passes whatever their length.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from op_helpers import (
    assert_registered_complete,
    assert_relation_waits,
    check_build,
    cuda_source_of,
    op_function,
    ref,
    rel,
    rel_error,
)

from kiln import relay, te
from kiln.ir.attrs import AttrsError
from kiln.ir.types import SizeVar, TensorType
from kiln.registry import OpPattern
from kiln.relay.expr import Call
from kiln.relay.op.reduce import ScanAttrs, cumprod, cumsum

SCANS = ["cumsum", "cumprod"]
n = SizeVar("n")


@pytest.mark.parametrize("op", SCANS)
def test_scan_ops_are_registered_complete(op: str) -> None:
    assert_registered_complete(op, OpPattern.OPAQUE, ["data"], ScanAttrs, 3)
    assert_relation_waits(op)


# --- references: ONNX's examples -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("exclusive", "reverse", "total", "product"),
    [
        (False, False, [1, 3, 6], [1, 2, 6]),
        (True, False, [0, 1, 3], [1, 1, 2]),
        (False, True, [6, 5, 3], [6, 6, 3]),
        (True, True, [5, 3, 0], [6, 3, 1]),
    ],
)
def test_references_match_onnx_examples(exclusive: bool, reverse: bool, total: list[int], product: list[int]) -> None:
    x = np.array([1, 2, 3], np.int32)
    got_sum = ref("cumsum", x, exclusive=exclusive, reverse=reverse)
    got_prod = ref("cumprod", x, exclusive=exclusive, reverse=reverse)
    assert got_sum.dtype == got_prod.dtype == np.int32
    np.testing.assert_array_equal(got_sum, total)
    np.testing.assert_array_equal(got_prod, product)


def test_reference_scans_the_named_axis() -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(ref("cumsum", x, axis=-1), [[0, 1, 3], [3, 7, 12]])
    np.testing.assert_array_equal(ref("cumsum", x, axis=0, exclusive=True), [[0, 0, 0], [0, 1, 2]])


# --- relations -----------------------------------------------------------------------------------


@pytest.mark.parametrize("op", SCANS)
def test_scan_type_is_the_input_type_with_symbolic_dims(op: str) -> None:
    t = TensorType((n, 3), "int64")
    assert rel(op, [t], axis=1) == t
    assert rel(op, [t], axis=-2) == t


@pytest.mark.parametrize("op", SCANS)
def test_scan_relation_errors_name_the_problem(op: str) -> None:
    with rel_error("axis 2 is out of range", arg=None):
        rel(op, [TensorType((2, 3), "float32")], axis=2)
    with rel_error("expected a numeric tensor, found dtype bool"):
        rel(op, [TensorType((2,), "bool")])
    with rel_error("scans along an axis; found a 0-d tensor"):
        rel(op, [TensorType((), "float32")])


def test_bad_scan_attrs_raise_attrs_error() -> None:
    x = relay.var("x", shape=(3,))
    with pytest.raises(AttrsError, match="op cumsum: attribute exclusive"):
        cumsum(x, exclusive="yes")  # type: ignore[arg-type]
    with pytest.raises(AttrsError, match="op cumprod: attribute axis"):
        cumprod(x, axis=1.5)  # type: ignore[arg-type]


def test_scan_constructors_build_calls_that_type_check() -> None:
    x = relay.var("x", shape=(n, 4))
    call = cumprod(x, axis=1, exclusive=True, reverse=True)
    assert isinstance(call, Call) and call.attrs == ScanAttrs(axis=1, exclusive=True, reverse=True)
    f = relay.infer_type(relay.Function([x], cumsum(call, axis=-1)))
    assert f.body.checked_type == TensorType((n, 4))


def test_a_bad_scan_axis_is_reported_with_the_op() -> None:
    x = relay.var("x", shape=(2, 3))
    with pytest.raises(relay.TypeInferenceError, match="op cumsum: axis -3 is out of range"):
        relay.infer_type(relay.Function([x], cumsum(x, axis=-3)))


# --- compiled ------------------------------------------------------------------------------------

GRID = [
    # shape, axis
    ((1,), 0),
    ((2,), 0),
    ((7,), 0),
    ((3, 8), 1),
    ((5, 3), 0),
    ((2, 9, 3), 1),
    ((2, 3, 17), -1),
]


def _data(shape: tuple[int, ...], dtype: str) -> np.ndarray[Any, Any]:
    # small values with signs: products stay exact in every dtype for the lengths of the grid
    r = np.random.default_rng(1)
    return r.choice(np.array([-2, -1, 1, 2, 3]), shape).astype(dtype) if "int" in dtype else \
        r.uniform(-1.5, 1.5, shape).astype(dtype)


@pytest.mark.parametrize(("exclusive", "reverse"), [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize(("shape", "axis"), GRID)
@pytest.mark.parametrize("op", SCANS)
def test_scans_compile_and_match_reference(op: str, shape: tuple[int, ...], axis: int, exclusive: bool,
                                           reverse: bool) -> None:
    dtype = "float32" if op == "cumsum" else "int32"
    check_build(op, _data(shape, dtype), rtol=1e-5, atol=1e-5, axis=axis, exclusive=exclusive, reverse=reverse)


@pytest.mark.parametrize("dtype", ["float64", "int64", "int8", "float16"])
@pytest.mark.parametrize("op", SCANS)
def test_scans_compile_for_more_dtypes(op: str, dtype: str) -> None:
    x = _data((3, 6), dtype)
    tol = 2e-3 if dtype == "float16" else 1e-6
    check_build(op, x, rtol=tol, atol=tol, axis=1, exclusive=True)


@pytest.mark.parametrize(("exclusive", "reverse"), [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize(("shape", "axis"), [((256,), 0), ((2, 300), 1), ((301, 3), 0), ((2, 1000, 2), -2)])
def test_long_scans_in_blocks_compile_and_match_reference(shape: tuple[int, ...], axis: int, exclusive: bool,
                                                          reverse: bool) -> None:
    """Axes of 256 and more are scanned in blocks of 16: partial last blocks, every flag, exact integers."""
    r = np.random.default_rng(3)
    check_build("cumsum", r.integers(-9, 10, shape).astype("int64"), axis=axis, exclusive=exclusive, reverse=reverse)
    check_build("cumprod", r.choice(np.array([-1, 1, 1]), shape).astype("int32"), axis=axis, exclusive=exclusive,
                reverse=reverse)


def test_a_long_scan_takes_a_few_passes_whatever_its_length() -> None:
    """In blocks: log2(16) passes in the blocks, log2(n / 16) over the blocks' totals, and the last one."""
    from kiln.registry import Op, attr

    for length in (256, 4096, 100_000):
        x = te.placeholder((2, length), "float32", name="x")
        (out,) = Op.get("cumsum").get_attr(attr.FCompute)(ScanAttrs(axis=1), [x], TensorType((2, length), "float32"))
        seen: dict[int, te.Tensor] = {}
        todo = [out]
        while todo:
            t = todo.pop()
            if isinstance(t.op, te.ComputeOp) and id(t.op) not in seen:
                assert not t.op.reduce_axis
                seen[id(t.op)] = t
                todo.extend(t.op.input_tensors)
        full = [t for t in seen.values() if math.prod(int(getattr(d, "value", 0)) for d in t.shape) >= 2 * length]
        blocks = math.ceil(math.log2(math.ceil(length / 16)))
        assert len(full) == 4 + 1 + 1  # the first read of the input, 4 steps in the blocks, the output
        assert len(seen) == len(full) + blocks + 1


def test_integer_scans_wrap_as_numpy() -> None:
    x = np.full((40,), 7, np.int8)
    check_build("cumprod", x)
    check_build("cumsum", np.full((300,), 100, np.int8))


def test_a_long_scan_is_accurate() -> None:
    x = np.random.default_rng(2).random((2, 5000)).astype(np.float32)
    got = relay.build(relay.IRModule.from_expr(op_function("cumsum", x, axis=1)), target="llvm")
    out = np.asarray(got.create_executor()(x0=x))
    np.testing.assert_allclose(out, np.cumsum(x.astype(np.float64), axis=1), rtol=1e-5)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("length", [1, 2, 5, 16, 17])
def test_scan_compute_is_log2_elementwise_steps_without_bounds_checks(length: int, reverse: bool) -> None:
    """ceil(log2 n) doubling steps after the first (shifting) one, none a reduction: n log n work, not n^2;
    only the first, which reads the input, has a select (the steps read the identities they carry)."""
    from kiln.registry import Op, attr
    from kiln.tir import expr as tx
    from kiln.tir.functor import post_order_visit

    x = te.placeholder((3, length), "float32", name="x")
    attrs = ScanAttrs(axis=1, exclusive=True, reverse=reverse)
    (out,) = Op.get("cumsum").get_attr(attr.FCompute)(attrs, [x], TensorType((3, length), "float32"))
    stages, t = [], out
    while isinstance(t.op, te.ComputeOp):
        assert not t.op.reduce_axis
        stages.append(t)
        (t,) = t.op.input_tensors
    steps = math.ceil(math.log2(length)) if length > 1 else 0
    assert len(stages) == steps + 1 and t is x
    checks: list[tuple[str, object]] = []

    def collect(name: str) -> Callable[[object], None]:
        return lambda e: checks.append((name, e)) if isinstance(e, (tx.Select, tx.Min, tx.Max)) else None

    for stage in stages[:-1]:
        post_order_visit(stage.op.body, collect(stage.name))
    assert not checks
    found: list[object] = []
    post_order_visit(stages[-1].op.body, found.append)
    assert any(isinstance(e, tx.Select) for e in found)  # the first step checks the input's bounds


def test_scans_generate_cuda_source() -> None:
    source = cuda_source_of("cumsum", _data((4, 9), "float32"), axis=1, reverse=True)
    # one kernel a step, the first reading the input itself
    assert source.count("__global__") == math.ceil(math.log2(9))
    # in blocks: 4 steps in the blocks, 5 over the 19 blocks' totals, the output
    source = cuda_source_of("cumprod", _data((2, 40, 300), "int32"), axis=-1, exclusive=True)
    assert source.count("__global__") == 4 + 5 + 1
