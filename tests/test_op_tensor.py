"""Elementwise and broadcasting ops: inferred types, errors, and their numpy references."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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
