"""uint16, uint32 and uint64: the dtypes, the ONNX table, and their arithmetic and casts through relay.build (llvm).

Values sit above the signed maximum of their width (40000 for uint16, 2**31 + 7 for uint32, 2**63 + 5 for
uint64), where a signed division, comparison or sign extension would give a different answer than numpy.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from kiln import relay, tir
from kiln.ir.dtype import DataType, DTypeError
from kiln.relay.frontend.onnx import OnnxImportError, onnx_dtype

UINTS = ["uint16", "uint32", "uint64"]
# per dtype: values around and above the signed maximum, and divisors (never 0: that is its own test)
VALUES = {
    "uint16": ([40000, 65535, 3, 0, 32768, 65534, 7], [3, 2, 40000, 1, 32767, 65535, 60000]),
    "uint32": ([2**31 + 7, 2**32 - 1, 3, 0, 2**31, 2**32 - 2, 7],
               [3, 2, 2**31 + 1, 1, 2**31 - 1, 2**32 - 1, 4000000000]),
    "uint64": ([2**63 + 5, 2**64 - 1, 3, 0, 2**63, 2**64 - 2, 7],
               [3, 2, 2**63 + 1, 1, 2**63 - 1, 2**64 - 1, 2**64 - 3]),
}


def _run(func: relay.Function, *inputs: np.ndarray) -> list[np.ndarray]:
    lib = relay.build(relay.infer_type(func), target="llvm")
    out = lib.create_executor()(**{f"x{i}": a for i, a in enumerate(inputs)})
    return [np.asarray(o) for o in (out if isinstance(out, tuple) else (out,))]


@pytest.mark.parametrize("name", UINTS)
def test_datatype_knows_the_unsigned_types(name: str) -> None:
    dt = DataType.of(name)
    bits = int(name[4:])
    assert (dt.kind, dt.bits, dt.bytes) == ("uint", bits, bits // 8)
    assert dt.is_int and not dt.is_float and not dt.is_bool
    assert dt.numpy() == np.dtype(name) and DataType.of(np.dtype(name)) is dt and DataType.of(getattr(np, name)) is dt


def test_unknown_dtypes_still_fail_and_name_the_new_ones() -> None:
    with pytest.raises(DTypeError, match="unknown dtype 'uint128'.*uint16, uint32, uint64"):
        DataType.of("uint128")


def test_onnx_element_types_4_12_13_are_the_unsigned_types() -> None:
    assert [onnx_dtype(t, "x").name for t in (4, 12, 13, 2)] == ["uint16", "uint32", "uint64", "uint8"]
    with pytest.raises(OnnxImportError, match="input 'x' has ONNX type STRING, which kiln does not support"):
        onnx_dtype(8, "input 'x'")


def test_tir_constants_wrap_and_divide_exactly() -> None:
    big = tir.const(2**64 - 1, "uint64")
    assert tir.binary(tir.Add, big, tir.const(2, "uint64")).value == 1  # wraps as the machine does
    assert tir.binary(tir.Sub, tir.const(0, "uint16"), tir.const(1, "uint16")).value == 65535
    # (2**64 - 1) / 3 through a float64 quotient would be 6148914691236517376
    assert tir.binary(tir.Div, big, tir.const(3, "uint64")).value == (2**64 - 1) // 3
    assert tir.binary(tir.Div, tir.const(-(2**62) - 1, "int64"), tir.const(3, "int64")).value == -(2**62 + 1) // 3 + 1
    assert tir.cast("uint32", tir.const(-1, "int64")).value == 2**32 - 1
    assert tir.cast("int64", tir.const(2**63 + 5, "uint64")).value == -(2**63) + 5


BINARY: list[tuple[str, Any]] = [
    ("add", np.add), ("subtract", np.subtract), ("multiply", np.multiply), ("floor_divide", np.floor_divide),
    ("divide", np.floor_divide),  # integer divide truncates: the same for unsigned values
    ("floor_mod", np.mod), ("minimum", np.minimum), ("maximum", np.maximum), ("less", np.less),
    ("greater_equal", np.greater_equal), ("equal", np.equal), ("not_equal", np.not_equal),
]


@pytest.mark.parametrize("dtype", UINTS)
def test_elementwise_ops_match_numpy_above_the_signed_max(dtype: str) -> None:
    a, b = (np.array(v, dtype) for v in VALUES[dtype])
    x0, x1 = relay.var("x0", shape=a.shape, dtype=dtype), relay.var("x1", shape=(1, *b.shape), dtype=dtype)
    outs = [getattr(relay, name)(x0, x1) for name, _ in BINARY]
    got = _run(relay.Function([x0, x1], relay.Tuple(outs)), a, b[None])
    for (name, fn), g in zip(BINARY, got, strict=True):
        want = fn(a, b[None])
        assert g.dtype == want.dtype, name
        np.testing.assert_array_equal(g, want, err_msg=f"{name} on {dtype}")


@pytest.mark.parametrize("dtype", UINTS)
def test_division_by_zero_gives_zero(dtype: str) -> None:
    a = np.array(VALUES[dtype][0], dtype)
    x0, x1 = relay.var("x0", shape=a.shape, dtype=dtype), relay.var("x1", shape=a.shape, dtype=dtype)
    outs = [relay.divide(x0, x1), relay.floor_divide(x0, x1), relay.floor_mod(x0, x1)]
    for g in _run(relay.Function([x0, x1], relay.Tuple(outs)), a, np.zeros_like(a)):
        np.testing.assert_array_equal(g, np.zeros_like(a))


CAST_TARGETS = ["float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool", *UINTS]


@pytest.mark.parametrize("dtype", UINTS)
def test_casts_from_unsigned_zero_extend_and_convert_unsigned(dtype: str) -> None:
    a = np.array([*VALUES[dtype][0], 255, 256, 65535, 2**53 + 1 if dtype == "uint64" else 1], dtype)
    x0 = relay.var("x0", shape=a.shape, dtype=dtype)
    targets = [t for t in CAST_TARGETS if t != dtype]
    got = _run(relay.Function([x0], relay.Tuple([relay.cast(x0, t) for t in targets])), a)
    for t, g in zip(targets, got, strict=True):
        with np.errstate(over="ignore"):
            want = a.astype(t)
        assert g.dtype == want.dtype
        np.testing.assert_array_equal(g, want, err_msg=f"{dtype} -> {t}")


SOURCES: dict[str, list[Any]] = {
    "float64": [3.7, 40000.5, 1e19, 2.0**63 + 2**12, 0.0, 65535.0, 2.0**32 - 1],
    "float32": [3.7, 40000.5, 1e19, 4e9, 0.0, 65535.0, 2.0**31],
    "float16": [3.5, 60000.0, 1.0, 255.0, 0.0, 65504.0, 0.5],
    "int64": [-1, 2**62, 5, 0, -(2**63), 70000, 2**32 + 3],
    "int32": [-1, 2**31 - 1, 5, 0, -7, 70000, 65536],
    "int16": [-1, 32767, 5, 0, -32768, 7, 256],
    "int8": [-1, 127, -128, 0, 5, 6, 7],
    "uint8": [255, 0, 1, 2, 3, 4, 200],
    "bool": [True, False, True, True, False, False, True],
}


@pytest.mark.parametrize("dtype", UINTS)
def test_casts_to_unsigned_match_numpy_in_range(dtype: str) -> None:
    max_value = np.iinfo(dtype).max
    for src, values in SOURCES.items():
        a = np.array(values, src)
        if a.dtype.kind == "f":  # in range: out of it numpy's result is the CPU's, kiln saturates (below)
            wide = a.astype("float64")
            a = a[(wide >= 0) & (wide <= max_value) & (wide < 2.0 ** np.iinfo(dtype).bits)]
        x0 = relay.var("x0", shape=a.shape, dtype=src)
        (got,) = _run(relay.Function([x0], relay.cast(x0, dtype)), a)
        np.testing.assert_array_equal(got, a.astype(dtype), err_msg=f"{src} -> {dtype}")
        assert got.dtype == np.dtype(dtype)


@pytest.mark.parametrize("dtype", UINTS)
def test_float_to_unsigned_saturates_and_nan_is_zero(dtype: str) -> None:
    a = np.array([-1.0, -1e30, np.nan, np.inf, -np.inf, 1e30, 2.0**64, 0.5], "float64")
    x0 = relay.var("x0", shape=a.shape, dtype="float64")
    (got,) = _run(relay.Function([x0], relay.cast(x0, dtype)), a)
    top = np.iinfo(dtype).max
    np.testing.assert_array_equal(got, np.array([0, 0, 0, top, 0, top, top, 0], dtype))


def test_constants_above_the_signed_max_fold_and_compile() -> None:
    x0 = relay.var("x0", shape=(3,), dtype="uint64")
    c = relay.const(np.array(2**63 + 5, "uint64"))
    a = np.array([0, 2**63 - 5, 7], "uint64")
    (got,) = _run(relay.Function([x0], relay.add(x0, c)), a)
    np.testing.assert_array_equal(got, a + np.uint64(2**63 + 5))
