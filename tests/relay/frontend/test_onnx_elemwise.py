"""The ONNX converters of kiln/relay/frontend/_onnx_elemwise.py, beyond ONNX's backend cases.

Models of one node are built with onnx.helper, imported, compiled for the host CPU and run with every
input fed at run time; their outputs must match onnx's reference evaluator (which follows each op's
specification), dtypes and shapes included. The cases cover the attributes the backend cases leave at
their defaults, odd and broadcast shapes, integer dtypes, and the errors for bad attributes and dtypes.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from onnx import helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

from kiln import relay  # noqa: E402
from kiln.relay.expr import Call  # noqa: E402
from kiln.relay.frontend import OnnxImportError  # noqa: E402
from kiln.relay.visitor import post_order  # noqa: E402

Array = np.ndarray[Any, Any]
rng = np.random.default_rng(0)


def one_node(op_type: str, inputs: dict[str, Array], opset: int, out_dtype: Any = None, **attrs: Any) -> Any:
    """A model of one `op_type` node named "n" reading `inputs` (graph inputs, all fed at run time)."""
    node = helper.make_node(op_type, list(inputs), ["y"], name="n", **attrs)
    elem = helper.np_dtype_to_tensor_dtype(next(iter(inputs.values())).dtype if out_dtype is None
                                           else np.dtype(out_dtype))
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
         for k, v in inputs.items()],
        [helper.make_tensor_value_info("y", elem, None)],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def run(m: Any, inputs: dict[str, Array]) -> Array:
    mod, params = relay.frontend.from_onnx(m)
    return np.asarray(relay.build(mod, target="llvm", params=params).create_executor()(**inputs))


def check(op_type: str, inputs: dict[str, Array], opset: int, rtol: float = 1e-5, out_dtype: Any = None,
          **attrs: Any) -> Array:
    """kiln's output matches onnx's reference evaluator (NaN where it has NaN); returns kiln's."""
    m = one_node(op_type, inputs, opset, out_dtype, **attrs)
    got = run(m, inputs)
    with np.errstate(all="ignore"):
        (want,) = ReferenceEvaluator(m).run(None, inputs)
    want = np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.dtype, want.shape)
    if got.dtype.kind == "f":
        np.testing.assert_allclose(got, want, rtol=rtol, atol=1e-6 if got.dtype != np.float16 else 1e-3)
    else:
        np.testing.assert_array_equal(got, want)
    return got


def ops_of(m: Any) -> list[str]:
    mod, _ = relay.frontend.from_onnx(m)
    return [str(getattr(n.op, "name", n.op)) for n in post_order(mod["main"].body) if isinstance(n, Call)]


# --- Mod, Reciprocal --------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["int8", "int32", "int64", "uint8", "float16", "float32", "float64"])
@pytest.mark.parametrize("fmod", [0, 1])
def test_mod_floors_or_truncates_with_broadcasting(dtype: str, fmod: int) -> None:
    if np.dtype(dtype).kind == "f":
        a = (rng.standard_normal((2, 3, 5)) * 20).astype(dtype)
        b = np.array([3.5, -2.25, 0.75, -7.0, 1.0], dtype)
    else:
        a = rng.integers(-100 if dtype.startswith("i") else 0, 100, (2, 3, 5)).astype(dtype)
        b = np.array([3, 7, 2, 9, 1] if dtype.startswith("u") else [3, -7, 2, -9, 1], dtype)
    got = check("Mod", {"a": a, "b": b}, 13, fmod=fmod)
    if fmod == 0 and dtype.startswith("i"):  # the sign of the divisor
        assert ((got == 0) | (np.sign(got) == np.sign(b))).all()


def test_mod_of_floats_at_opset_28_keeps_the_ieee_special_cases() -> None:
    a = np.array([np.inf, 5.0, 1.5, -1.5, 0.0, np.nan, 7.0], np.float32)
    b = np.array([2.0, 0.0, np.inf, np.inf, -3.0, 1.0, -2.0], np.float32)
    got = run(one_node("Mod", {"a": a, "b": b}, 28), {"a": a, "b": b})
    with np.errstate(invalid="ignore"):
        want = np.mod(a, b)
    np.testing.assert_array_equal(got, want)  # [nan, nan, 1.5, inf, 0, nan, -1]


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_reciprocal(dtype: str) -> None:
    x = np.array([[2.0, -0.5, 0.0, -0.0, np.inf, 3.0, 1e-3]], dtype)
    got = check("Reciprocal", {"x": x}, 13)
    assert got[0, 2] == np.inf and got[0, 3] == -np.inf


# --- bitwise ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["int8", "int16", "int32", "int64", "uint8"])
@pytest.mark.parametrize("op_type", ["BitwiseAnd", "BitwiseOr", "BitwiseXor"])
def test_bitwise_binary_ops(op_type: str, dtype: str) -> None:
    info = np.iinfo(dtype)
    a = rng.integers(info.min, info.max, (3, 4), dtype=dtype, endpoint=True)
    b = rng.integers(info.min, info.max, (4,), dtype=dtype, endpoint=True)
    check(op_type, {"a": a, "b": b}, 18)


def test_bitwise_not() -> None:
    for dtype in ("int8", "int64", "uint8"):
        info = np.iinfo(dtype)
        check("BitwiseNot", {"x": np.array([info.min, info.max, 0, 1], dtype)}, 18)


@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
@pytest.mark.parametrize(("dtype", "opset"), [("uint8", 11), ("int8", 28), ("int32", 28), ("int64", 28)])
def test_bit_shift_past_the_width_and_by_negative_amounts(direction: str, dtype: str, opset: int) -> None:
    info = np.iinfo(dtype)
    x = np.array([[info.min], [info.max], [1], [5]], dtype)
    low = -2 if opset >= 28 and info.min < 0 else 0
    s = np.arange(low, info.bits + 2).astype(dtype)
    got = run(one_node("BitShift", {"x": x, "s": s}, opset, direction=direction), {"x": x, "s": s})
    shift = np.left_shift if direction == "LEFT" else np.right_shift
    np.testing.assert_array_equal(got, shift(x, s))  # numpy's shifts are ONNX's (0 or -1 past the width)


# --- IsNaN, IsInf -----------------------------------------------------------------------------------

SPECIAL = np.array([[np.nan, np.inf, -np.inf], [0.0, -2.5, 3.4e38]], np.float32)


@pytest.mark.parametrize(("positive", "negative"), [(1, 1), (1, 0), (0, 1), (0, 0)])
def test_is_inf_detects_the_signs_asked_for(positive: int, negative: int) -> None:
    got = check("IsInf", {"x": SPECIAL}, 20, out_dtype=np.bool_, detect_positive=positive, detect_negative=negative)
    assert got[0].tolist() == [False, bool(positive), bool(negative)]


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_is_nan(dtype: str) -> None:
    with np.errstate(over="ignore"):  # 3.4e38 is inf in float16
        x = SPECIAL.astype(dtype)
    got = check("IsNaN", {"x": x}, 13, out_dtype=np.bool_)
    assert got.tolist() == [[True, False, False], [False, False, False]]


# --- activations ------------------------------------------------------------------------------------


def _x(dtype: str = "float32") -> Array:
    x = rng.standard_normal((2, 3, 7)) * 3
    x.reshape(-1)[:4] = [0.0, -0.0, 40.0, -40.0]
    return x.astype(dtype)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize(
    ("op_type", "opset", "attrs"),
    [
        ("Elu", 6, {}), ("Elu", 22, {"alpha": 0.3}),
        ("Selu", 6, {}), ("Selu", 22, {"alpha": 2.0, "gamma": 0.5}),
        ("Celu", 12, {}), ("Celu", 12, {"alpha": 2.5}),
        ("Mish", 18, {}),
        ("Swish", 24, {}), ("Swish", 24, {"alpha": 1.702}),
        ("Softsign", 1, {}),
        ("ThresholdedRelu", 10, {}), ("ThresholdedRelu", 22, {"alpha": -0.5}),
        ("Shrink", 9, {}), ("Shrink", 9, {"lambd": 1.5, "bias": 0.25}),
    ],
)
def test_activations(op_type: str, opset: int, attrs: dict[str, Any], dtype: str) -> None:
    if op_type == "Celu" and dtype != "float32":
        opset = 28  # Celu takes float32 only before opset 28
    check(op_type, {"x": _x(dtype)}, opset, rtol=2e-3 if dtype == "float16" else 1e-5, **attrs)


def test_activations_fuse_into_one_kernel() -> None:
    mod, params = relay.frontend.from_onnx(one_node("Selu", {"x": _x()}, 6))
    lib = relay.build(mod, target="llvm", params=params)
    assert len(lib.kernels) == 1


@pytest.mark.parametrize("dtype", ["int8", "int32", "uint8"])
def test_shrink_of_integers(dtype: str) -> None:
    x = np.arange(-6 if dtype.startswith("i") else 0, 7).astype(dtype)
    check("Shrink", {"x": x}, 9, lambd=1.5, bias=2.0)


# --- trigonometric and hyperbolic -------------------------------------------------------------------

TRIG = {"Tan": (7, 1.4), "Asin": (7, 0.99), "Acos": (7, 0.99), "Atan": (7, 50.0), "Sinh": (9, 10.0),
        "Cosh": (9, 10.0), "Asinh": (9, 100.0), "Acosh": (9, 10.0), "Atanh": (9, 0.99)}


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("op_type", sorted(TRIG))
def test_trigonometric_and_hyperbolic(op_type: str, dtype: str) -> None:
    opset, scale = TRIG[op_type]
    x = rng.uniform(-1, 1, (3, 5, 3)) * scale
    if op_type == "Acosh":
        x = np.abs(x) + 1.0
    check(op_type, {"x": x.astype(dtype)}, opset, rtol={"float16": 2e-3, "float32": 1e-5, "float64": 1e-12}[dtype])
    assert ops_of(one_node(op_type, {"x": x.astype(dtype)}, opset)) == [op_type.lower()]


# --- errors -----------------------------------------------------------------------------------------


def test_bad_attributes_are_errors_naming_the_node() -> None:
    x = np.ones(3, np.float32)
    with pytest.raises(OnnxImportError, match=r"Mod node 'n'.*attribute 'fmod' is 2: expected 0 or 1"):
        relay.frontend.from_onnx(one_node("Mod", {"a": x, "b": x}, 13, fmod=2))
    u = np.ones(3, np.uint8)
    with pytest.raises(OnnxImportError, match=r"BitShift node 'n'.*attribute 'direction' is 'UP': expected 'LEFT' "
                                              r"or 'RIGHT'"):
        relay.frontend.from_onnx(one_node("BitShift", {"x": u, "s": u}, 11, direction="UP"))
    with pytest.raises(OnnxImportError, match=r"Celu node 'n'.*attribute 'alpha' must not be 0"):
        relay.frontend.from_onnx(one_node("Celu", {"x": x}, 12, alpha=0.0))
    with pytest.raises(OnnxImportError, match=r"IsInf node 'n'.*attribute 'detect_positive' is 3: expected 0 or 1"):
        relay.frontend.from_onnx(one_node("IsInf", {"x": x}, 20, out_dtype=np.bool_, detect_positive=3))


def test_dtypes_the_ops_do_not_take_are_errors() -> None:
    with pytest.raises(OnnxImportError, match=r"BitwiseAnd node 'n' \(opset 18\): input #0 \(A\) is float, which "
                                              r"BitwiseAnd does not take"):
        relay.frontend.from_onnx(one_node("BitwiseAnd", {"a": np.ones(2, np.float32), "b": np.ones(2, np.float32)},
                                          18))
    with pytest.raises(OnnxImportError, match=r"Atan node 'n' \(opset 7\): input #0 \(input\) is int32"):
        relay.frontend.from_onnx(one_node("Atan", {"x": np.ones(2, np.int32)}, 7))
    with pytest.raises(OnnxImportError, match=r"BitShift node 'n' \(opset 11\): input #0 \(X\) is int8"):
        relay.frontend.from_onnx(one_node("BitShift", {"x": np.ones(2, np.int8), "s": np.ones(2, np.int8)}, 11,
                                          direction="LEFT"))
