"""Elementwise and broadcasting ops: inferred types, errors, and their numpy references."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from op_helpers import check_build

from kiln import relay
from kiln.ir.attrs import AttrsError
from kiln.ir.types import ANY, SizeVar, TensorType
from kiln.registry import Op, OpPattern, attr
from kiln.relay.op import tensor
from kiln.relay.type_infer import TypeInferenceError, infer_type

UNARY = [name for name, *_ in tensor._UNARY]
BINARY = [name for name, *_ in tensor._BINARY]
FLOAT_ONLY = {"exp", "log", "sqrt", "rsqrt", "sigmoid", "tanh", "erf", "floor", "ceil", "round", "sin", "cos"}
COMPARISONS = {"equal", "not_equal", "less", "less_equal", "greater", "greater_equal"}
SHAPES = [(), (3,), (2, 3), (SizeVar("n"), 4), (1, SizeVar("n"), None)]


def _dtype_for(name: str) -> str:
    return "bool" if name.startswith("logical") else "float32"


def _infer(call: relay.Expr) -> Any:
    return infer_type(call).checked_type


@pytest.mark.parametrize("name", UNARY)
@pytest.mark.parametrize("shape", SHAPES)
def test_unary_ops_keep_shape_and_dtype(name: str, shape: tuple[Any, ...]) -> None:
    x = relay.var("x", shape=shape, dtype=_dtype_for(name))
    out = _infer(getattr(tensor, name)(x))
    assert out == TensorType(shape, _dtype_for(name))
    assert Op.get(name).get_attr(attr.TOpPattern) is OpPattern.ELEMWISE


@pytest.mark.parametrize("name", sorted(FLOAT_ONLY))
def test_float_only_ops_refuse_integers(name: str) -> None:
    x = relay.var("x", shape=(2,), dtype="int32")
    with pytest.raises(TypeInferenceError, match=f"op {name}, argument data .*expected a floating-point tensor"):
        _infer(getattr(tensor, name)(x))


def test_logical_ops_need_bools_and_numeric_ops_refuse_them() -> None:
    with pytest.raises(TypeInferenceError, match="op logical_not, argument data .*expected a bool tensor"):
        _infer(relay.logical_not(relay.var("x", shape=(2,))))
    with pytest.raises(TypeInferenceError, match="op negative, argument data .*expected a numeric tensor"):
        _infer(relay.negative(relay.var("x", shape=(2,), dtype="bool")))


@pytest.mark.parametrize("name", UNARY)
def test_unary_references_match_numpy(name: str) -> None:
    rng = np.random.default_rng(0)
    x = rng.random((3, 4)) > 0.5 if name.startswith("logical") else (rng.random((3, 4)) * 4 + 0.1).astype(np.float32)
    ref = Op.get(name).get_attr(attr.FReference)
    assert ref is not None
    out = ref(None, x)
    assert out.shape == x.shape and out.dtype == x.dtype
    expected = {
        "negative": lambda: -x, "abs": lambda: np.abs(x), "exp": lambda: np.exp(x), "log": lambda: np.log(x),
        "sqrt": lambda: np.sqrt(x), "rsqrt": lambda: 1 / np.sqrt(x), "sigmoid": lambda: 1 / (1 + np.exp(-x)),
        "tanh": lambda: np.tanh(x), "erf": lambda: np.array([math.erf(v) for v in x.ravel()]).reshape(x.shape),
        "floor": lambda: np.floor(x), "ceil": lambda: np.ceil(x), "round": lambda: np.round(x),
        "sign": lambda: np.sign(x), "sin": lambda: np.sin(x), "cos": lambda: np.cos(x),
        "logical_not": lambda: np.logical_not(x),
    }[name]()
    np.testing.assert_allclose(out, expected, rtol=1e-6)


@pytest.mark.parametrize("name", BINARY)
@pytest.mark.parametrize(
    ("lhs", "rhs", "out"),
    [
        ((2, 3), (2, 3), (2, 3)),
        ((2, 3), (3,), (2, 3)),
        ((4, 1, 3), (5, 1), (4, 5, 3)),
        ((), (2, 2), (2, 2)),
        (("n", 3), (1, 3), ("n", 3)),
        (("n", 1), (1, "m"), ("n", "m")),
        (("n", 3), ("m", 3), (ANY, 3)),
    ],
)
def test_binary_ops_broadcast(name: str, lhs: tuple[Any, ...], rhs: tuple[Any, ...], out: tuple[Any, ...]) -> None:
    dtype = _dtype_for(name)
    call = getattr(tensor, name)(relay.var("a", shape=lhs, dtype=dtype), relay.var("b", shape=rhs, dtype=dtype))
    out_dtype = "bool" if name in COMPARISONS else dtype
    assert _infer(call) == TensorType(out, out_dtype)
    assert Op.get(name).get_attr(attr.TOpPattern) is OpPattern.BROADCAST


@pytest.mark.parametrize("name", ["add", "less", "maximum"])
def test_binary_ops_refuse_mismatched_shapes_and_dtypes(name: str) -> None:
    a = relay.var("a", shape=(2, 3))
    with pytest.raises(TypeInferenceError, match=f"op {name}, argument rhs .*dim 1 is 3 against 4"):
        _infer(getattr(tensor, name)(a, relay.var("b", shape=(2, 4))))
    with pytest.raises(TypeInferenceError, match=f"op {name}, argument rhs .*expected dtype float32 .*found int32"):
        _infer(getattr(tensor, name)(a, relay.var("b", shape=(2, 3), dtype="int32")))


_NUMPY_BINARY = {
    "add": np.add, "subtract": np.subtract, "multiply": np.multiply, "power": np.power,
    "maximum": np.maximum, "minimum": np.minimum, "floor_mod": np.mod, "equal": np.equal,
    "not_equal": np.not_equal, "less": np.less, "less_equal": np.less_equal, "greater": np.greater,
    "greater_equal": np.greater_equal, "logical_and": np.logical_and, "logical_or": np.logical_or,
}


@settings(max_examples=30, deadline=None)
@given(name=st.sampled_from(BINARY), seed=st.integers(0, 1000))
def test_binary_references_match_numpy_with_broadcasting(name: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    if name.startswith("logical"):
        a, b = rng.random((3, 1, 4)) > 0.5, rng.random((5, 1)) > 0.5
    else:
        a = (rng.random((3, 1, 4)) * 4 + 0.5).astype(np.float32)
        b = (rng.random((5, 1)) * 4 + 0.5).astype(np.float32)
    ref = Op.get(name).get_attr(attr.FReference)
    assert ref is not None
    out = ref(None, a, b)
    assert out.shape == (3, 5, 4)
    if name in _NUMPY_BINARY:
        np.testing.assert_allclose(out, _NUMPY_BINARY[name](a, b), rtol=1e-6)
    elif name == "divide":
        np.testing.assert_allclose(out, a / b, rtol=1e-6)
    elif name == "floor_divide":
        np.testing.assert_allclose(out, np.floor(a / b), rtol=1e-6)


def test_integer_division_truncates_like_c_and_floor_division_floors() -> None:
    a, b = np.array([7, -7], np.int32), np.array([2, 2], np.int32)
    divide = Op.get("divide").get_attr(attr.FReference)
    floor_divide = Op.get("floor_divide").get_attr(attr.FReference)
    assert divide is not None and floor_divide is not None
    assert divide(None, a, b).tolist() == [3, -3]
    assert floor_divide(None, a, b).tolist() == [3, -4]


def test_clip() -> None:
    x = relay.var("x", shape=("n", 2))
    call = relay.clip(x, -1.0, 2.5)
    assert _infer(call) == TensorType(("n", 2))
    ref = Op.get("clip").get_attr(attr.FReference)
    assert ref is not None
    data = np.array([-3.0, 0.5, 9.0], np.float32)
    np.testing.assert_array_equal(ref(call.attrs, data), [-1.0, 0.5, 2.5])
    with pytest.raises(AttrsError, match=r"op clip: attribute a_max must be a number >= a_min \(1.0\), got 0.0"):
        relay.clip(x, 1.0, 0.0)
    with pytest.raises(AttrsError, match="op clip: attribute a_min must be a number, got 'low'"):
        relay.clip(x, "low", 1.0)  # type: ignore[arg-type]  # the point: a bad value


@pytest.mark.parametrize("dtype", ["float16", "float64", "int8", "int64", "uint8", "bool"])
def test_cast(dtype: str) -> None:
    call = relay.cast(relay.var("x", shape=("n", 3)), dtype)
    assert _infer(call) == TensorType(("n", 3), dtype)
    ref = Op.get("cast").get_attr(attr.FReference)
    assert ref is not None
    assert ref(call.attrs, np.ones((2, 3), np.float32)).dtype == np.dtype(dtype)
    with pytest.raises(AttrsError, match="op cast: attribute dtype: unknown dtype 'float8'"):
        relay.cast(relay.var("x", shape=(2,)), "float8")


def test_where() -> None:
    c = relay.var("c", shape=("n", 1), dtype="bool")
    call = relay.where(c, relay.var("x", shape=(1, 3)), relay.var("y", shape=(3,)))
    assert _infer(call) == TensorType(("n", 3))
    with pytest.raises(TypeInferenceError, match="op where, argument condition .*expected a bool condition"):
        _infer(relay.where(relay.var("c", shape=(2,)), relay.var("x", shape=(2,)), relay.var("y", shape=(2,))))
    ref = Op.get("where").get_attr(attr.FReference)
    assert ref is not None
    out = ref(None, np.array([True, False]), np.array([1.0, 2.0]), np.array([3.0, 4.0]))
    assert out.tolist() == [1.0, 4.0]


def test_every_tensor_op_is_fully_registered() -> None:
    for name in [*UNARY, *BINARY, "clip", "cast", "where"]:
        op = Op.get(name)
        op.verify()
        assert op.description and op.arguments and op.support_level == 1
        for key in (attr.TOpPattern, attr.FTypeRelation, attr.FReference):
            assert op.has_attr(key), (name, key.name)


# --- compiled: each op's te compute, lowered and run, against its numpy reference -------------------

NUMERIC_UNARY = ["negative", "abs", "sign"]
POSITIVE_ONLY = {"log", "sqrt", "rsqrt"}
UNARY_SHAPES = [(), (1,), (17,), (2, 3, 5)]


def _values(shape: tuple[int, ...], dtype: str, seed: int = 0, positive: bool = False) -> np.ndarray:
    """Test data of `dtype`: halves and zeros among the floats, small integers, random bools."""
    rng = np.random.default_rng(seed)
    if dtype == "bool":
        return np.asarray(rng.random(shape) > 0.5)
    if np.dtype(dtype).kind in "iu":
        low = 1 if positive else (0 if dtype.startswith("u") else -5)
        return np.asarray(rng.integers(low, 6, shape), dtype)
    x = rng.standard_normal(shape) * 2
    x = np.where(rng.random(shape) < 0.25, np.round(x * 2) / 2, x)  # exact halves and integers
    return np.asarray(np.abs(x) + 0.1 if positive else x, dtype)


@pytest.mark.parametrize("shape", UNARY_SHAPES)
@pytest.mark.parametrize("name", UNARY)
def test_unary_ops_compile_and_match_reference(name: str, shape: tuple[int, ...]) -> None:
    dtype = _dtype_for(name)
    check_build(name, _values(shape, dtype, positive=name in POSITIVE_ONLY), rtol=2e-6, atol=1e-6)


OTHER_DTYPE_CASES = [
    (name, "float64") for name in sorted(FLOAT_ONLY)  # kernels named like the libm functions they call
] + [(name, dtype) for name in NUMERIC_UNARY for dtype in ["float64", "int8", "int32", "int64", "uint8"]]


@pytest.mark.parametrize(("name", "dtype"), OTHER_DTYPE_CASES)
def test_unary_ops_compile_for_other_dtypes(name: str, dtype: str) -> None:
    check_build(name, _values((3, 17), dtype, positive=name in POSITIVE_ONLY), rtol=1e-12, atol=1e-12)


def test_unary_ops_keep_nan_and_infinity() -> None:
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0], np.float32)
    for name in ["negative", "abs", "sign", "floor", "ceil", "round", "sigmoid", "tanh"]:
        check_build(name, x)


BINARY_SHAPES = [((2, 3), (2, 3)), ((4, 1, 3), (5, 1)), ((), (17,)), ((1,), (3, 1))]
DIVISIONS = {"divide", "floor_divide", "floor_mod"}


def _binary_operands(name: str, lhs: tuple[int, ...], rhs: tuple[int, ...], dtype: str) -> list[np.ndarray]:
    a, b = _values(lhs, dtype, 1, positive=name == "power"), _values(rhs, dtype, 2)
    if name in DIVISIONS:  # no division by zero, divisors of both signs
        b = np.where(b == 0, np.asarray(3, dtype), b).astype(dtype)
    if name == "power" and dtype != "float32":
        b = np.abs(b).astype(dtype)  # numpy refuses negative integer exponents
    if name in COMPARISONS and dtype == "float32":  # some equal pairs
        a, b = np.asarray(np.round(a), dtype), np.asarray(np.round(b), dtype)
    return [a, b]


@pytest.mark.parametrize(("lhs", "rhs"), BINARY_SHAPES)
@pytest.mark.parametrize("name", BINARY)
def test_binary_ops_compile_and_broadcast_like_numpy(name: str, lhs: tuple[int, ...], rhs: tuple[int, ...]) -> None:
    atol = 1e-5 if name == "floor_mod" else 1e-6  # a - floor(a / b) * b rounds where numpy's fmod is exact
    check_build(name, *_binary_operands(name, lhs, rhs, _dtype_for(name)), atol=atol)


@pytest.mark.parametrize("dtype", ["int8", "int32", "int64"])
@pytest.mark.parametrize("name", [n for n in BINARY if not n.startswith("logical")])
def test_binary_ops_compile_for_integers(name: str, dtype: str) -> None:
    check_build(name, *_binary_operands(name, (4, 1, 17), (3, 1), dtype))


def test_integer_division_by_negative_divisors_truncates_or_floors_like_numpy() -> None:
    a = np.array([7, -7, 7, -7, 0, 6, -6], np.int32)
    b = np.array([2, 2, -2, -2, 3, -3, -3], np.int32)
    for name in sorted(DIVISIONS):
        check_build(name, a, b)


@pytest.mark.parametrize("name", ["maximum", "minimum", "equal", "not_equal", "less", "greater_equal"])
def test_binary_ops_compile_for_bools(name: str) -> None:
    check_build(name, _values((2, 5), "bool", 1), _values((5,), "bool", 2))


@pytest.mark.parametrize("dtype", ["float32", "int8", "int32", "uint8"])
@pytest.mark.parametrize(("a_min", "a_max"), [(-1.5, 2.5), (0.2, 0.7), (-1000.0, 1000.0), (-2.0, -2.0)])
def test_clip_compiles_and_truncates_float_bounds_for_integers(dtype: str, a_min: float, a_max: float) -> None:
    # bounds past an integer dtype's range saturate (uint8 clipped to -2 is 0, not -2 wrapped to 254)
    x = np.arange(-6, 7).astype(dtype) if dtype.startswith("int") else \
        np.arange(0, 13).astype(dtype) if dtype == "uint8" else _values((3, 17), dtype)
    check_build("clip", x, a_min=a_min, a_max=a_max)
    if dtype == "uint8" and a_max < 0:
        ref = Op.get("clip").get_attr(attr.FReference)
        np.testing.assert_array_equal(ref(tensor.ClipAttrs.make("clip", a_min=a_min, a_max=a_max), x), np.zeros_like(x))


@pytest.mark.parametrize(
    ("src", "dst"),
    [("float32", "float64"), ("float32", "int32"), ("float32", "int8"), ("float32", "uint8"), ("float32", "bool"),
     ("float64", "float32"), ("int32", "float32"), ("int32", "int8"), ("int32", "int64"), ("int8", "int32"),
     ("uint8", "int32"), ("int64", "bool"), ("bool", "float32"), ("bool", "int32")],
)
def test_cast_compiles_for_dtype_pairs(src: str, dst: str) -> None:
    rng = np.random.default_rng(3)
    if src == "bool":
        x = rng.random((3, 17)) > 0.5
    elif dst == "uint8" or src == "uint8":
        x = rng.uniform(0, 255, (3, 17)).astype(src)
    else:
        x = rng.uniform(-300, 300, (3, 17)).astype(src)  # past int8's range: numpy and kiln both wrap
        x[0, :3] = 0
    if src.startswith("float") and dst == "int8":
        x = np.clip(x, -127, 127)  # float to out-of-range int is undefined in numpy
    check_build("cast", x, dtype=dst)


@pytest.mark.parametrize(
    "shapes", [((2, 3), (2, 3), (2, 3)), ((4, 1), (1, 3), (3,)), ((), (17,), (1,)), ((2, 1, 1), (), (5, 1))]
)
@pytest.mark.parametrize("dtype", ["float32", "int32"])
def test_where_compiles_and_broadcasts_all_three_operands(shapes: tuple[tuple[int, ...], ...], dtype: str) -> None:
    cond, x, y = shapes
    check_build("where", _values(cond, "bool"), _values(x, dtype, 1), _values(y, dtype, 2))


def test_every_tensor_op_has_a_compute() -> None:
    for name in [*UNARY, *BINARY, "clip", "cast", "where"]:
        assert Op.get(name).has_attr(attr.FCompute), name
