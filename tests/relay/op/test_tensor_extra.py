"""The remainder, bitwise, float-class, trigonometric and hyperbolic ops of tensor.py (its `_MATH_*` tables).

Types and errors of their relations, printing and parsing, their numpy references, and their te computes
compiled for the host CPU against those references on special values (0, +-inf, NaN, the dtype's extremes,
shifts past the width) and odd shapes with broadcasting; and as CUDA C, compiled to a CUBIN and run through
the host stand-in of tests/cuda_standin.py (on a real GPU too where there is one).
"""

from __future__ import annotations

import shutil
from typing import Any

import cuda_standin
import numpy as np
import pytest
from op_helpers import (
    assert_outputs_match,
    build_op,
    check_build,
    compile_op,
    ref,
    reference_outputs,
    run_on_device,
)

from kiln import relay
from kiln.ir.types import SizeVar, TensorType
from kiln.registry import Op, OpPattern, attr
from kiln.relay import parse
from kiln.relay.analysis import structural_equal
from kiln.relay.op import tensor
from kiln.relay.printer import astext
from kiln.relay.type_infer import TypeInferenceError, infer_type

UNARY = [name for name, *_ in tensor._MATH_UNARY] + ["isnan", "isinf"]
BINARY = [name for name, *_ in tensor._MATH_BINARY]
INTEGER_OPS = {"bitwise_not", "bitwise_and", "bitwise_or", "bitwise_xor", "left_shift", "right_shift"}
INTS = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]
rng = np.random.default_rng(0)


def _infer(call: relay.Expr) -> Any:
    return infer_type(call).checked_type


def _var(name: str, shape: tuple[Any, ...], dtype: str) -> relay.Var:
    return relay.var(name, shape=shape, dtype=dtype)


# --- relations ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", UNARY)
def test_unary_ops_keep_the_shape_and_give_their_dtype(name: str) -> None:
    dtype = "int16" if name in INTEGER_OPS else "float64"
    out = _infer(getattr(tensor, name)(_var("x", (SizeVar("n"), 3), dtype)))
    assert out == TensorType((SizeVar("n"), 3), "bool" if name in ("isnan", "isinf") else dtype)
    op = Op.get(name)
    op.verify()
    assert op.get_attr(attr.TOpPattern) is OpPattern.ELEMWISE and op.has_attr(attr.FCompute)


@pytest.mark.parametrize("name", BINARY)
def test_binary_ops_broadcast(name: str) -> None:
    dtype = "int8" if name in INTEGER_OPS else "float32"
    out = _infer(getattr(tensor, name)(_var("a", (4, 1, 3), dtype), _var("b", (5, 1), dtype)))
    assert out == TensorType((4, 5, 3), dtype)
    assert Op.get(name).get_attr(attr.TOpPattern) is OpPattern.BROADCAST


@pytest.mark.parametrize("name", sorted(INTEGER_OPS))
@pytest.mark.parametrize("dtype", ["float32", "bool"])
def test_bitwise_ops_refuse_floats_and_bools(name: str, dtype: str) -> None:
    args = [_var(f"x{i}", (2,), dtype) for i in range(len(Op.get(name).arguments))]
    with pytest.raises(TypeInferenceError, match=f"op {name}, argument .*expected an integer tensor, found dtype "
                                                 f"{dtype}"):
        _infer(getattr(tensor, name)(*args))


@pytest.mark.parametrize("name", [n for n in UNARY if n not in INTEGER_OPS])
def test_float_ops_refuse_integers(name: str) -> None:
    with pytest.raises(TypeInferenceError, match=f"op {name}, argument data .*expected a floating-point tensor"):
        _infer(getattr(tensor, name)(_var("x", (2,), "int32")))


def test_binary_ops_refuse_mixed_dtypes_and_shapes() -> None:
    with pytest.raises(TypeInferenceError, match="op left_shift, argument rhs .*expected dtype uint8 .*found int8"):
        _infer(tensor.left_shift(_var("a", (2,), "uint8"), _var("b", (2,), "int8")))
    with pytest.raises(TypeInferenceError, match="op fmod, argument rhs .*dim 0 is 2 against 3"):
        _infer(tensor.fmod(_var("a", (2,), "float32"), _var("b", (3,), "float32")))


@pytest.mark.parametrize("name", UNARY + BINARY)
def test_calls_print_and_parse_back(name: str) -> None:
    dtype = "int32" if name in INTEGER_OPS else "float32"
    args = [_var(f"x{i}", (2, SizeVar("n")), dtype) for i in range(len(Op.get(name).arguments))]
    f = relay.Function(args, getattr(tensor, name)(*args))
    back = parse(astext(f))
    assert astext(back, show_types=False) == astext(f, show_types=False)
    assert structural_equal(back, f, map_free_vars=True)


# --- references --------------------------------------------------------------------------------------


def test_references_follow_c_and_numpy() -> None:
    a, b = np.array([7, -7, 7, -7], np.int32), np.array([3, 3, -3, -3], np.int32)
    assert ref("fmod", a, b).tolist() == [1, -1, 1, -1]  # the sign of a
    assert ref("floor_mod", a, b).tolist() == [1, 2, -2, -1]  # the sign of b
    x = np.array([-128, -1, 5, 127], np.int8)
    assert ref("right_shift", x, np.array([1, 9, -1, 7], np.int8)).tolist() == [-64, -1, 0, 0]
    assert ref("left_shift", x, np.array([1, 1, 8, 1], np.int8)).tolist() == [0, -2, 0, -2]
    assert ref("bitwise_not", x).tolist() == [127, 0, -6, -128]
    f = np.array([np.nan, np.inf, -np.inf, 1.0], np.float32)
    assert ref("isnan", f).tolist() == [True, False, False, False]
    assert ref("isinf", f).tolist() == [False, True, True, False]
    assert ref("isinf", f).dtype == np.bool_ and ref("atanh", f).dtype == np.float32


# --- compiled ----------------------------------------------------------------------------------------


def _ints(dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """Random values over the whole range of `dtype`, its extremes, 0, 1 and -1 among them."""
    info = np.iinfo(dtype)
    x = rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True).reshape(-1)
    special = [info.min, info.max, 0, 1] + ([-1] if info.min < 0 else [])
    n = min(len(special), x.size)
    x[:n] = special[:n]
    return x.reshape(shape)


@pytest.mark.parametrize("dtype", INTS)
@pytest.mark.parametrize("name", ["bitwise_and", "bitwise_or", "bitwise_xor"])
def test_bitwise_ops_compile_for_every_integer_dtype(name: str, dtype: str) -> None:
    a, b = _ints(dtype, (3, 7)), _ints(dtype, (7,))
    check_build(name, a, b)
    check_build(name, a, np.ascontiguousarray(a[::-1]))


@pytest.mark.parametrize("dtype", INTS)
def test_bitwise_not_flips_every_bit(dtype: str) -> None:
    x = _ints(dtype, (2, 9))
    check_build("bitwise_not", x)
    np.testing.assert_array_equal(build_op("bitwise_not", x)[0], np.invert(x))


@pytest.mark.parametrize("dtype", INTS)
@pytest.mark.parametrize("name", ["left_shift", "right_shift"])
def test_shifts_past_the_width_or_negative_give_the_sign_fill(name: str, dtype: str) -> None:
    bits = np.iinfo(dtype).bits
    x = _ints(dtype, (4, 1))
    low = -3 if dtype.startswith("int") else 0
    s = np.array([*range(low, bits + 3), 255 if dtype.startswith("u") else 127], dtype)
    check_build(name, x, s)  # numpy: 0 past the width (-1 for a negative x shifted right), wraps on the left


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_fmod_and_floor_mod_are_exact_with_ieee_special_cases(dtype: str) -> None:
    a = (rng.standard_normal(60) * 100).astype(dtype)
    b = (rng.standard_normal(60) * 3).astype(dtype)
    special = [(0.0, 2.0), (-0.0, -2.0), (np.inf, 2.0), (-np.inf, 2.0), (3.0, 0.0), (0.0, 0.0), (np.nan, 1.0),
               (1.0, np.nan), (1.5, np.inf), (-1.5, np.inf), (1.5, -np.inf), (np.inf, np.inf), (7.5, 2.5),
               (-7.5, 2.5), (5.0, -3.0), (1e4, 0.1)]
    for i, (x, y) in enumerate(special):
        a[i], b[i] = x, y
    for name in ("fmod", "floor_mod"):
        check_build(name, a, b, rtol=0, atol=0)  # numpy's fmod is exact; so is kiln's


def test_fmod_of_a_large_quotient_is_still_exact() -> None:
    a = np.array([1e7, -1e7, 123456.789, 2.0**40], np.float32)
    b = np.array([0.1, 0.1, 1e-3, 3.0], np.float32)
    check_build("fmod", a, b, rtol=0, atol=0)
    check_build("fmod", a.astype(np.float64) * 1e3, b.astype(np.float64), rtol=0, atol=0)  # quotients < 2**53


@pytest.mark.parametrize("dtype", INTS)
def test_integer_fmod_and_floor_mod_by_zero_and_minus_one(dtype: str) -> None:
    a = _ints(dtype, (3, 5))
    b = np.array([0, 1, 3, 7, -1 if dtype.startswith("int") else 200], dtype)
    check_build("fmod", a, b)
    check_build("floor_mod", a, b)
    np.testing.assert_array_equal(build_op("fmod", a, b)[0][:, 0], np.zeros(3, dtype))  # x % 0 is 0, as numpy


SPECIAL = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 1e-6, -1e-6, 1e-30, 2.5, 30.0, -30.0, 100.0,
           1e20, -1e20]
# each function's input scale: its interesting range (asin and friends on [-1, 1], acosh from 1)
DOMAIN = {"tan": 3.0, "atan": 100.0, "asin": 0.4, "acos": 0.4, "sinh": 20.0, "cosh": 20.0, "asinh": 1e3,
          "acosh": 5.0, "atanh": 0.4}


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("name", sorted(DOMAIN))
def test_trigonometric_and_hyperbolic_functions_match_numpy(name: str, dtype: str) -> None:
    x = rng.standard_normal((3, 41)) * DOMAIN[name]
    if name == "acosh":
        x = np.abs(x) + 1.0
    x.reshape(-1)[: len(SPECIAL)] = SPECIAL
    tiny = (rng.standard_normal(11) * 1e-4)  # near 0, where formulas cancel and series take over
    rtol = {"float16": 2e-3, "float32": 2e-6, "float64": 1e-14}[dtype]
    with np.errstate(all="ignore"):
        x16 = x.astype(dtype)
    check_build(name, x16, rtol=rtol, atol=0)
    if name not in ("acosh", "cosh"):
        check_build(name, tiny.astype(dtype), rtol=rtol, atol=0)


def test_inverse_functions_at_the_ends_of_their_domains() -> None:
    x = np.array([1.0, -1.0, 1.0 + 2**-23, -1.0 - 2**-23, 1.0 - 2**-24], np.float32)
    for name in ("asin", "acos", "atanh"):
        check_build(name, x, rtol=2e-6, atol=0)
    check_build("acosh", np.array([1.0, 1.0 + 2**-23, 1.0 - 2**-24, 3e38], np.float32), rtol=2e-6, atol=0)
    for name in ("sinh", "cosh"):  # past the overflow of exp(x), before their own
        check_build(name, np.array([89.0, -89.0, 89.5, 710.0], np.float32), rtol=2e-6, atol=0)
        check_build(name, np.array([709.9, -710.3, 711.0], np.float64), rtol=1e-14, atol=0)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_isnan_and_isinf(dtype: str) -> None:
    x = np.array([[np.nan, np.inf, -np.inf, 0.0, -1.0, np.finfo(dtype).max, np.finfo(dtype).tiny, -np.nan]], dtype)
    for name in ("isnan", "isinf"):
        check_build(name, x)
    assert build_op("isinf", x)[0].tolist() == [[False, True, True, False, False, False, False, False]]


# --- cuda: the same computes as CUDA C, to a CUBIN, run through the host stand-in (and on a GPU if any) -------

CUDA_CASES = {
    "fmod": (np.array([7.5, -7.5, np.inf, 1.5, 3.0], np.float32), np.array([2.0, 2.0, 1.0, np.inf, 0.0], np.float32)),
    "floor_mod": (np.array([7.5, -7.5, 1.5, -1.5], np.float64), np.array([-2.0, 2.0, np.inf, np.inf], np.float64)),
    "bitwise_and": (_ints("int32", (2, 5)), _ints("int32", (5,))),
    "bitwise_or": (_ints("uint8", (9,)), _ints("uint8", (9,))),
    "bitwise_xor": (_ints("int64", (7,)), _ints("int64", (7,))),
    "bitwise_not": (_ints("int16", (7,)),),
    "left_shift": (_ints("int32", (4, 1)), np.array([-1, 0, 1, 31, 32], np.int32)),
    "right_shift": (_ints("int8", (4, 1)), np.array([-1, 0, 1, 7, 8], np.int8)),
    "isnan": (np.array([np.nan, np.inf, 1.0], np.float32),),
    "isinf": (np.array([np.nan, -np.inf, 1.0], np.float64),),
    **{name: ((rng.uniform(-1, 1, 17) * DOMAIN[name] + (1.0 if name == "acosh" else 0.0)).astype(np.float32),)
       for name in sorted(DOMAIN)},
}


@pytest.mark.parametrize("name", sorted(CUDA_CASES))
def test_ops_compile_to_cuda_and_match_numpy_through_the_host_stand_in(name: str, monkeypatch: pytest.MonkeyPatch,
                                                                         tmp_path: Any) -> None:
    arrays = CUDA_CASES[name]
    want = reference_outputs(name, *arrays)
    targets = ["cuda -arch=sm_90"] + (["cuda"] if cuda_standin.HAS_GPU else [])
    for target in targets:
        if target == "cuda":  # a real GPU: its own arch, its own cupy
            import cupy

            got = [o.get() for o in run_on_device(compile_op(name, *arrays, target=target), *arrays, xp=cupy)]
            assert_outputs_match(name, got, want, 2e-6, 0.0)
            continue
        kernel = compile_op(name, *arrays, target=target)
        assert name.replace(".", "_") in kernel.module.code.source
        if shutil.which("g++") is None:
            continue
        cuda_standin.install(monkeypatch, tmp_path)
        outs = run_on_device(kernel, *arrays, xp=cuda_standin.FAKE_CUPY)
        assert_outputs_match(name, [o.get() for o in outs], want, 2e-6, 0.0)
