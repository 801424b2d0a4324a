"""The reduction ops (kiln/relay/op/reduce.py): relations, numpy references, errors, constructors."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from op_helpers import assert_registered_complete, check_build, reference, relation

from kiln.ir.attrs import AttrsError
from kiln.ir.types import ANY, IncompleteType, SizeVar, TensorType, TupleType
from kiln.registry import Op, OpPattern, attr
from kiln.relay.expr import Call, var
from kiln.relay.op import reduce
from kiln.relay.op._rel import RelationError
from kiln.relay.op.reduce import ArgReduceAttrs, ReduceAttrs

REDUCE_OPS = ["sum", "mean", "max", "min", "prod"]
ARG_OPS = ["argmax", "argmin"]
NUMPY = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min, "prod": np.prod}
n, m = SizeVar("n"), SizeVar("m")
rng = np.random.default_rng(0)


def make_attrs(op: str, **kw: Any) -> Any:
    cls = ArgReduceAttrs if op in ARG_OPS else ReduceAttrs
    return cls.make(op, **kw)


def check_reference_matches_relation(op: str, attrs: Any, x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """The reference's output has exactly the type the relation gives; returns that output."""
    out = reference(op, attrs, x)
    assert TensorType(out.shape, out.dtype) == relation(op, [TensorType(x.shape, x.dtype)], attrs)
    return out


# --- registration ----------------------------------------------------------------------


@pytest.mark.parametrize("op", REDUCE_OPS + ARG_OPS)
def test_reduction_ops_are_registered_complete(op: str) -> None:
    assert_registered_complete(op, OpPattern.COMM_REDUCE, ["data"], ArgReduceAttrs if op in ARG_OPS else ReduceAttrs, 4)


# --- output types ----------------------------------------------------------------------

STATIC_SHAPES = [(), (5,), (2, 3), (2, 3, 4), (1, 2, 3, 2)]


def _axis_choices(ndim: int) -> list[Any]:
    choices: list[Any] = [None]
    if ndim:
        choices += [0, -1, (0,)]
    if ndim >= 2:
        choices += [(0, -1), (-2,)]
    if ndim >= 3:
        choices += [(0, 2), (2, 0, 1)]
    return choices


@pytest.mark.parametrize("op", REDUCE_OPS)
@pytest.mark.parametrize("shape", STATIC_SHAPES)
@pytest.mark.parametrize("keepdims", [False, True])
def test_reduce_type_and_values_match_numpy_over_a_grid(op: str, shape: tuple[int, ...], keepdims: bool) -> None:
    x = rng.standard_normal(shape).astype(np.float32)
    for axis in _axis_choices(len(shape)):
        attrs = make_attrs(op, axis=axis, keepdims=keepdims)
        out = check_reference_matches_relation(op, attrs, x)
        np_axis = tuple(a % x.ndim for a in ((axis,) if isinstance(axis, int) else axis)) if axis is not None else None
        expected = NUMPY[op](x, axis=np_axis, keepdims=keepdims)
        np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("shape", "axis", "keepdims", "exclude", "expected"),
    [
        ((n, 3, 4), 1, False, False, (n, 4)),
        ((n, 3, 4), (0, 2), True, False, (1, 3, 1)),
        ((n, 3, 4), 0, False, True, (n,)),
        ((n, 3, 4), 0, True, True, (n, 1, 1)),
        ((2, n, m), None, False, False, ()),
        ((2, n, m), None, True, False, (1, 1, 1)),
        ((2, n, m), -1, False, False, (2, n)),
        ((2, n, m), (-1, 0), False, True, (2, m)),
        ((ANY, 3), 1, False, False, (ANY,)),
    ],
)
@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reduce_type_with_symbolic_dims(
    op: str, shape: tuple[Any, ...], axis: Any, keepdims: bool, exclude: bool, expected: tuple[Any, ...]
) -> None:
    attrs = make_attrs(op, axis=axis, keepdims=keepdims, exclude=exclude)
    assert relation(op, [TensorType(shape, "float16")], attrs) == TensorType(expected, "float16")


@pytest.mark.parametrize("op", REDUCE_OPS)
@pytest.mark.parametrize("dtype", ["float32", "int32", "int64", "uint8"])
def test_reduce_keeps_the_input_dtype(op: str, dtype: str) -> None:
    x = rng.integers(1, 4, size=(3, 4)).astype(dtype)
    out = check_reference_matches_relation(op, make_attrs(op, axis=1), x)
    assert out.dtype == np.dtype(dtype)


def test_mean_of_integers_truncates_toward_zero() -> None:
    x = np.array([[1, 2], [-1, -2]], dtype=np.int32)
    out = reference("mean", make_attrs("mean", axis=1), x)
    assert out.tolist() == [1, -1]  # 1.5 -> 1, -1.5 -> -1, as C's integer division


@pytest.mark.parametrize("op", REDUCE_OPS)
def test_exclude_reduces_the_axes_not_named(op: str) -> None:
    x = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    out = check_reference_matches_relation(op, make_attrs(op, axis=(1, -1), exclude=True), x)
    np.testing.assert_allclose(out, NUMPY[op](x, axis=(0, 2)), rtol=1e-5)


@settings(max_examples=50, deadline=None)
@given(
    shape=st.lists(st.integers(1, 4), min_size=0, max_size=4),
    data=st.data(),
    op=st.sampled_from(REDUCE_OPS),
    keepdims=st.booleans(),
    exclude=st.booleans(),
)
def test_reduce_relation_agrees_with_reference_on_random_axes(
    shape: list[int], data: st.DataObject, op: str, keepdims: bool, exclude: bool
) -> None:
    ndim = len(shape)
    axes = data.draw(st.lists(st.integers(0, ndim - 1), unique=True, max_size=ndim)) if ndim else []
    signed = [a - ndim if data.draw(st.booleans()) else a for a in axes]
    x = rng.standard_normal(shape).astype(np.float32)
    attrs = make_attrs(op, axis=tuple(signed), keepdims=keepdims, exclude=exclude)
    out = check_reference_matches_relation(op, attrs, x)
    reduced = tuple(i for i in range(ndim) if (i in axes) != exclude)
    np.testing.assert_allclose(out, NUMPY[op](x, axis=reduced, keepdims=keepdims), rtol=1e-4, atol=1e-5)


# --- argmax, argmin ----------------------------------------------------------------------


@pytest.mark.parametrize("op", ARG_OPS)
@pytest.mark.parametrize("shape", [(7,), (3, 4), (2, 3, 4)])
@pytest.mark.parametrize("keepdims", [False, True])
def test_arg_reduce_matches_numpy_and_is_int32(op: str, shape: tuple[int, ...], keepdims: bool) -> None:
    x = rng.standard_normal(shape).astype(np.float32)
    fn = np.argmax if op == "argmax" else np.argmin
    for axis in [None, 0, -1]:
        out = check_reference_matches_relation(op, make_attrs(op, axis=axis, keepdims=keepdims), x)
        assert out.dtype == np.int32
        if axis is None:
            expected = np.asarray(fn(x)).reshape((1,) * x.ndim if keepdims else ())
        else:
            expected = fn(x, axis=axis, keepdims=keepdims)
        np.testing.assert_array_equal(out, expected)


@pytest.mark.parametrize(
    ("shape", "axis", "keepdims", "exclude", "expected"),
    [
        ((n, 4), 1, False, False, (n,)),
        ((n, 4), 0, True, False, (1, 4)),
        ((n, 4), None, False, False, ()),
        ((n, 4), 0, False, True, (n,)),
        ((2, n, m), -2, True, False, (2, 1, m)),
    ],
)
@pytest.mark.parametrize("op", ARG_OPS)
def test_arg_reduce_type_with_symbolic_dims(
    op: str, shape: tuple[Any, ...], axis: Any, keepdims: bool, exclude: bool, expected: tuple[Any, ...]
) -> None:
    attrs = make_attrs(op, axis=axis, keepdims=keepdims, exclude=exclude)
    assert relation(op, [TensorType(shape, "float32")], attrs) == TensorType(expected, "int32")


def test_arg_reduce_ties_pick_first_or_last_index() -> None:
    x = np.array([[3, 1, 3], [0, 0, -1]], dtype=np.float32)
    first = reference("argmax", make_attrs("argmax", axis=1), x)
    last = reference("argmax", make_attrs("argmax", axis=1, select_last_index=True), x)
    assert first.tolist() == [0, 0] and last.tolist() == [2, 1]
    flat_last = reference("argmin", make_attrs("argmin", select_last_index=True), np.array([[0, 5], [0, 1]]))
    assert int(flat_last) == 2


def test_arg_reduce_of_a_scalar_is_index_zero() -> None:
    out = check_reference_matches_relation("argmax", make_attrs("argmax"), np.array(4.0, dtype=np.float32))
    assert out.shape == () and int(out) == 0


# --- errors ----------------------------------------------------------------------------


@pytest.mark.parametrize("op", REDUCE_OPS + ARG_OPS)
def test_axis_out_of_range_names_the_axis_and_rank(op: str) -> None:
    with pytest.raises(RelationError, match=r"axis 2 is out of range for a tensor of rank 2 \(allowed: -2 to 1\)"):
        relation(op, [TensorType((2, 3))], make_attrs(op, axis=2))
    with pytest.raises(RelationError, match=r"axis -3 is out of range for a tensor of rank 2"):
        relation(op, [TensorType((2, 3))], make_attrs(op, axis=-3))


@pytest.mark.parametrize("op", REDUCE_OPS)
def test_duplicate_axes_are_an_error(op: str) -> None:
    with pytest.raises(RelationError, match=r"axis -1 is given twice in axis \(1, -1\).*rank 2"):
        relation(op, [TensorType((2, 3))], make_attrs(op, axis=(1, -1)))


@pytest.mark.parametrize("op", ["sum", "mean", "prod"])
def test_arithmetic_reductions_refuse_bool(op: str) -> None:
    with pytest.raises(RelationError, match="expected a numeric tensor, found dtype bool") as info:
        relation(op, [TensorType((2, 3), "bool")], make_attrs(op))
    assert info.value.arg == 0


def test_max_and_min_accept_bool() -> None:
    assert relation("max", [TensorType((2, 3), "bool")], make_attrs("max", axis=0)) == TensorType((3,), "bool")


@pytest.mark.parametrize("op", ["max", "min", *ARG_OPS])
def test_selecting_reductions_over_an_empty_axis_are_an_error(op: str) -> None:
    with pytest.raises(RelationError, match=rf"axis 1 of shape \(2, 0\) has size 0: the {op} of no elements"):
        relation(op, [TensorType((2, 0))], make_attrs(op, axis=1))


def test_sum_over_an_empty_axis_is_zero() -> None:
    out = check_reference_matches_relation("sum", make_attrs("sum", axis=1), np.zeros((2, 0), np.float32))
    assert out.tolist() == [0.0, 0.0]


@pytest.mark.parametrize("op", ARG_OPS)
def test_arg_reduce_over_several_axes_is_refused(op: str) -> None:
    with pytest.raises(AttrsError, match=rf"op {op}: attribute axis must be None or a single axis.*got \(0, 1\)"):
        make_attrs(op, axis=(0, 1))
    with pytest.raises(RelationError, match=rf"{op} reduces one axis or all of them.*leaves axes \(1, 2\)"):
        relation(op, [TensorType((2, 3, 4))], make_attrs(op, axis=0, exclude=True))


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"keepdims": 1}, r"op sum: attribute keepdims must be true or false, got 1"),
        ({"exclude": "yes"}, r"op sum: attribute exclude must be true or false, got 'yes'"),
        ({"axis": 1.5}, r"op sum: attribute axis must be a list of ints, got 1.5"),
        ({"axis": ["a"]}, r"op sum: attribute axis must be a list of ints"),
        ({"axes": 1}, r"op sum has no attribute axes \(did you mean 'axis'"),
    ],
)
def test_bad_reduce_attrs_raise_attrs_error(kw: dict[str, Any], message: str) -> None:
    with pytest.raises(AttrsError, match=message):
        ReduceAttrs.make("sum", **kw)


def test_reduce_of_a_non_tensor_is_an_error() -> None:
    with pytest.raises(RelationError, match="expected a tensor, found") as info:
        relation("sum", [TupleType([TensorType((2,))])], make_attrs("sum"))
    assert info.value.arg == 0


def test_reduce_waits_for_an_incomplete_input() -> None:
    assert relation("sum", [IncompleteType()], make_attrs("sum")) is None
    assert relation("argmax", [IncompleteType()], make_attrs("argmax")) is None


# --- constructors ----------------------------------------------------------------------


@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reduce_constructors_build_calls(op: str) -> None:
    x = var("x", shape=(2, 3))
    c = getattr(reduce, op)(x, axis=1, keepdims=True)
    assert isinstance(c, Call) and c.op is Op.get(op) and c.args == (x,)
    assert c.attrs == ReduceAttrs(axis=(1,), keepdims=True, exclude=False)
    assert getattr(reduce, op)(x, axis=[0, 1]).attrs.axis == (0, 1)
    assert getattr(reduce, op)(x).attrs.axis is None


@pytest.mark.parametrize("op", ARG_OPS)
def test_arg_reduce_constructors_build_calls(op: str) -> None:
    x = var("x", shape=(2, 3))
    c = getattr(reduce, op)(x, axis=-1, select_last_index=True)
    assert c.op is Op.get(op)
    assert c.attrs == ArgReduceAttrs(axis=(-1,), keepdims=False, exclude=False, select_last_index=True)


def test_reduce_constructor_errors_name_the_op() -> None:
    with pytest.raises(AttrsError, match="op mean: attribute keepdims"):
        reduce.mean(var("x", shape=(2,)), keepdims="no")


# --- through type inference ---------------------------------------------------------------


def test_reductions_type_check_inside_a_function() -> None:
    from kiln import relay

    x = relay.var("x", shape=(n, 3, 4))
    f = relay.Function([x], relay.Tuple([relay.sum(x, axis=1), relay.argmin(x, axis=-1, keepdims=True)]))
    relay.infer_type(f)
    assert f.body.checked_type == TupleType([TensorType((n, 4)), TensorType((n, 3, 1), "int32")])


def test_a_bad_reduction_axis_is_reported_with_the_op_and_argument() -> None:
    from kiln import relay

    x = relay.var("x", shape=(2, 3))
    with pytest.raises(relay.TypeInferenceError, match=r"op max: axis 2 is out of range for a tensor of rank 2"):
        relay.infer_type(relay.Function([x], relay.max(x, axis=2)))


# --- compiled: each reduction's te compute, lowered and run, against its numpy reference ----------------

REDUCE_GRID = [
    # shape, axis, keepdims, exclude
    ((4, 17), None, False, False),
    ((4, 17), 1, True, False),
    ((2, 3, 5), (0, 2), False, False),
    ((2, 3, 5), (-1,), True, False),
    ((2, 3, 5), 1, False, True),
    ((1, 7, 1), (0,), False, False),
    ((6,), 0, True, False),
    ((), None, False, False),
    ((2, 3), (0, 1), False, True),  # excludes every axis: reduces none
]


def _data(shape: tuple[int, ...], dtype: str, seed: int = 0) -> np.ndarray[Any, Any]:
    """Small values with ties: integers in [-4, 4] (few zeros), floats around them, or bools."""
    r = np.random.default_rng(seed)
    if dtype == "bool":
        return np.asarray(r.random(shape) > 0.5)
    x = r.integers(-4, 5, shape) if dtype != "float32" else r.standard_normal(shape) * 2
    if dtype.startswith("u"):
        x = np.abs(x)
    return np.asarray(x, dtype)


@pytest.mark.parametrize("dtype", ["float32", "int32"])
@pytest.mark.parametrize(("shape", "axis", "keepdims", "exclude"), REDUCE_GRID)
@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reductions_compile_and_match_reference(
    op: str, shape: tuple[int, ...], axis: Any, keepdims: bool, exclude: bool, dtype: str
) -> None:
    x = _data(shape, dtype)
    if op == "prod" and dtype == "int32":
        x = np.asarray(np.clip(x, -3, 3))  # 17 factors stay in int32
    check_build(op, x, axis=axis, keepdims=keepdims, exclude=exclude, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int64", "float64"])
@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reductions_compile_for_more_dtypes(op: str, dtype: str) -> None:
    # short rows: LLVM takes seconds over an int8 product of 40 (0.6 s at 16)
    x = _data((5, 12), dtype, seed=1)
    check_build(op, x, axis=1, rtol=1e-12, atol=1e-12)
    check_build(op, x, axis=0, keepdims=True, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("op", ["max", "min"])
def test_max_and_min_of_bools_compile(op: str) -> None:
    x = np.array([[True, False, True], [True, True, True], [False, False, False]])
    check_build(op, x, axis=1)
    check_build(op, x)


def test_integer_sums_wrap_and_means_truncate_toward_zero_when_compiled() -> None:
    x = np.array([[-7, 0], [7, 0], [-1, -2], [5, 6]], np.int32)
    check_build("mean", x, axis=1)
    check_build("mean", np.array([-128, -128, -127], np.int8))  # the sum is past int8, the mean is not
    check_build("sum", np.array([100, 100, 100], np.int8))  # wraps, as numpy's sum cast back to int8
    check_build("prod", np.array([100, 3], np.int8))


def test_reductions_propagate_nan_when_compiled() -> None:
    x = np.array([[1.0, np.nan, 3.0], [1.0, 2.0, -np.inf]], np.float32)
    for op in REDUCE_OPS:
        check_build(op, x, axis=1)


@pytest.mark.filterwarnings("ignore:Mean of empty slice", "ignore:invalid value encountered")
@pytest.mark.parametrize("op", ["sum", "prod", "mean"])
def test_reductions_over_an_empty_axis_compile(op: str) -> None:
    check_build(op, np.zeros((3, 0), np.float32), axis=1)


ARG_GRID = [
    # shape, axis, keepdims, exclude
    ((4, 17), None, False, False),
    ((4, 17), 1, False, False),
    ((4, 17), 0, True, True),
    ((2, 3, 5), 1, True, False),
    ((2, 3, 5), -1, False, False),
    ((2, 3, 5), None, True, False),
    ((1, 7, 1), None, False, False),
    ((6,), 0, False, False),
    ((), None, False, False),
]


@pytest.mark.parametrize("select_last_index", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "int32"])
@pytest.mark.parametrize(("shape", "axis", "keepdims", "exclude"), ARG_GRID)
@pytest.mark.parametrize("op", ARG_OPS)
def test_arg_reductions_compile_and_match_reference(
    op: str, shape: tuple[int, ...], axis: Any, keepdims: bool, exclude: bool, dtype: str, select_last_index: bool
) -> None:
    x = _data(shape, dtype)  # the int32 data has ties, where select_last_index matters
    check_build(op, x, axis=axis, keepdims=keepdims, exclude=exclude, select_last_index=select_last_index)


@pytest.mark.parametrize("op", ARG_OPS)
def test_arg_reductions_of_nan_bool_and_int8_compile(op: str) -> None:
    nan = np.array([[1.0, np.nan, 3.0, np.nan], [1.0, 5.0, 5.0, -1.0]], np.float32)
    for last in (False, True):
        check_build(op, nan, axis=1, select_last_index=last)  # numpy: the first (last) NaN wins
    check_build(op, _data((3, 5), "bool"), axis=0)
    check_build(op, _data((3, 5), "int8"), select_last_index=True)


def test_every_reduction_has_a_compute() -> None:
    for op in REDUCE_OPS + ARG_OPS:
        assert Op.get(op).has_attr(attr.FCompute), op


@pytest.mark.parametrize("op", ["sum", "mean", "prod"])
def test_float16_reductions_accumulate_in_float32(op: str) -> None:
    # 2401 addends of 1/7: a float16 accumulator stops growing by steps of 0.25 and ends at 324, not 343
    from kiln import relay

    x = relay.var("x", shape=(7, 7, 7, 7), dtype="float16")
    data = np.full((7, 7, 7, 7), 1 / 7 if op != "prod" else 1.0005, np.float16)
    got = relay.build(relay.Function([x], getattr(relay, op)(x))).create_executor()(x=data)
    want = NUMPY[op](data.astype(np.float64))
    assert got.dtype == np.float16
    np.testing.assert_allclose(float(got), want, rtol=2e-3)

