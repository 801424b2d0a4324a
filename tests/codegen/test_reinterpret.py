"""The `reinterpret` intrinsic (a value's bits read as another dtype of one width) and the Relay op on it.

Checked against numpy's `.view`, bit for bit: NaN payloads, -0.0, the infinities and
subnormals, float16 (which the LLVM back end keeps in float32 registers) both ways,
constant folding, the loop-IR interpreter, CUDA C compiled to cubins, and `relay.reinterpret`.
"""

from __future__ import annotations

import numpy as np
import pytest
import tir_interp

import kiln
from kiln import relay, te, tir
from kiln.codegen import nvrtc

# Bit patterns that a conversion (rather than a bit cast) would lose.
_SPECIAL = {
    32: [0x7FC00001, 0x7F800001, 0xFFC12345, 0x80000000, 0x7F800000, 0xFF800000, 0x00000001, 0x807FFFFF,
         0x3F800000, 0x00000000, 0x7F7FFFFF, 0xDEADBEEF],
    64: [0x7FF8000000000001, 0xFFF0000000000001, 0x8000000000000000, 0x7FF0000000000000, 0xFFF0000000000000,
         0x0000000000000001, 0x3FF0000000000000, 0x0123456789ABCDEF, 0xFFFFFFFFFFFFFFFF],
    16: [0x7E01, 0xFE55, 0x8000, 0x7C00, 0xFC00, 0x0001, 0x83FF, 0x3C00, 0x0000, 0x7BFF, 0xBEEF],
}
_PAIRS = [("float32", "int32"), ("float32", "uint32"), ("int32", "float32"), ("uint32", "float32"),
          ("float64", "int64"), ("float64", "uint64"), ("int64", "float64"), ("uint64", "float64"),
          ("float16", "int16"), ("float16", "uint16"), ("int16", "float16"), ("uint16", "float16"),
          ("int32", "uint32"), ("uint8", "int8"), ("int64", "uint64")]


def _bits_of(dtype: str) -> np.ndarray:
    """The special bit patterns of `dtype`'s width, as an array of `dtype` (a bit cast, not a conversion)."""
    width = np.dtype(dtype).itemsize * 8
    pats = _SPECIAL.get(width, [0, 1, 0x7F, 0x80, 0xFF])
    rng = np.random.default_rng(width)
    rand = rng.integers(0, 2**width - 1, 21, dtype=np.uint64, endpoint=True)
    return np.concatenate([np.array(pats, np.uint64), rand]).astype(f"uint{width}").view(dtype)


def _build(src: str, dst: str, vectorized: bool, target: str = "llvm"):
    a = te.placeholder((tir.Var("n"),) if target.startswith("llvm") else (300,), src, name="A")
    c = te.compute(a.shape, lambda i: te.reinterpret(a[i], dst), name="C")
    s = te.create_schedule([c])
    if not target.startswith("llvm"):
        bx, tx = s[c].split(c.op.axis[0], factor=64)
        s[c].bind(bx, te.thread_axis("blockIdx.x"))
        s[c].bind(tx, te.thread_axis("threadIdx.x"))
    elif vectorized:
        _, inner = s[c].split(c.op.axis[0], factor=8)
        s[c].vectorize(inner)
    return kiln.build(s, [a, c], target=target)


def _same_bits(got: np.ndarray, want: np.ndarray) -> None:
    unsigned = f"uint{got.dtype.itemsize * 8}"
    np.testing.assert_array_equal(got.view(unsigned), want.view(unsigned))


@pytest.mark.parametrize("vectorized", [False, True])
@pytest.mark.parametrize(("src", "dst"), _PAIRS)
def test_llvm_reinterpret_matches_numpy_view_bit_for_bit(src, dst, vectorized):
    a = _bits_of(src)
    if "float16" in (src, dst):  # float16 lives in float32 registers: quiet NaNs keep their payloads
        a = _quiet_half_nans(a)
    out = np.zeros(a.shape, dst)
    _build(src, dst, vectorized)(a, out)
    _same_bits(out, a.view(dst))


def _quiet_half_nans(a: np.ndarray) -> np.ndarray:
    """`a` with its float16 NaNs quiet: widening to a float32 register quiets a signalling one (F16C too)."""
    a = a.copy()
    bits = a.view("uint16")
    nan = ((bits & 0x7C00) == 0x7C00) & ((bits & 0x03FF) != 0)
    bits[nan] |= 0x0200
    return a


# the host; x86-64 and x86-64-v2 have no F16C (kiln's own half conversions); x86-64 with F16C named
@pytest.mark.parametrize("target", ["llvm -mcpu=x86-64", "llvm -mcpu=x86-64-v2", "llvm -mcpu=x86-64 -mattr=+avx,+f16c"])
@pytest.mark.parametrize(("src", "dst"), [("float16", "int16"), ("uint16", "float16")])
def test_llvm_float16_bits_survive_with_and_without_f16c(src, dst, target):
    a = _quiet_half_nans(_bits_of(src))
    out = np.zeros(a.shape, dst)
    _build(src, dst, True, target)(a, out)
    _same_bits(out, a.view(dst))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_llvm_float_round_trip_through_ints_keeps_every_bit(dtype):
    it = "int32" if dtype == "float32" else "int64"
    a = te.placeholder((tir.Var("n"),), dtype, name="A")
    c = te.compute(a.shape, lambda i: te.reinterpret(te.reinterpret(a[i], it) ^ tir.const(0, it), dtype), name="C")
    mod = kiln.build(te.create_schedule([c]), [a, c])
    x = _bits_of(dtype)
    out = np.zeros_like(x)
    mod(x, out)
    _same_bits(out, x)  # signalling NaNs included: a bit cast never touches the float unit


def test_reinterpret_of_constants_folds_like_numpy_view():
    assert tir.reinterpret(tir.const(-0.0, "float32"), "int32").value == -(2**31)
    assert tir.reinterpret(tir.const(1.0, "float16"), "uint16").value == 0x3C00
    assert tir.reinterpret(tir.const(-1, "int64"), "uint64").value == 2**64 - 1
    assert tir.reinterpret(tir.const(0x3F800000, "int32"), "float32").value == 1.0
    inf = tir.reinterpret(tir.const(0xFC00, "uint16"), "float16")
    assert isinstance(inf, tir.FloatImm) and inf.value == float("-inf")
    nan = tir.reinterpret(tir.const(0x7FC00001, "int32"), "float32")  # a payload a Python float would not keep
    assert isinstance(nan, tir.Call) and nan.name == "reinterpret" and nan.dtype == "float32"
    x = tir.Var("x", "float32")
    assert tir.reinterpret(x, "float32") is x
    assert tir.call("reinterpret", x, dtype="uint32").dtype == "uint32"


def test_simplify_folds_reinterpret_once_its_argument_is_constant():
    x = tir.Var("x", "int32")
    e = tir.Analyzer().simplify(tir.reinterpret(x * 0 + 0x40000000, "float32"))
    assert isinstance(e, tir.FloatImm) and e.value == 2.0


@pytest.mark.parametrize(("src", "dst", "message"), [
    ("float32", "int64", r"float32 \(32 bits\) as int64 \(64 bits\): the widths differ"),
    ("bool", "uint8", "reinterpret of bool as uint8: it takes the dtypes"),
    ("float32", None, "needs the dtype"),
])
def test_reinterpret_refuses_other_widths_and_dtypes_without_bits(src, dst, message):
    with pytest.raises(tir.TIRError, match=message):
        tir.reinterpret(tir.Var("x", src), dst)


def test_interpreter_reads_bits_as_numpy_does():
    x = tir.Var("x", "float32")
    assert tir_interp.eval_expr(tir.reinterpret(x, "int32"), {x: -0.0}) == -(2**31)
    y = tir.Var("y", "uint16")
    assert tir_interp.eval_expr(tir.reinterpret(y, "float16"), {y: 0x3C00}) == 1.0


_CUDA_CALLS = {("float32", "int32"): "__float_as_int(", ("float32", "uint32"): "__float_as_uint(",
               ("int32", "float32"): "__int_as_float(", ("uint32", "float32"): "__uint_as_float(",
               ("float64", "int64"): "__double_as_longlong(", ("int64", "float64"): "__longlong_as_double(",
               ("float64", "uint64"): "(unsigned long long)__double_as_longlong(",
               ("uint64", "float64"): "__longlong_as_double((long long)",
               ("float16", "int16"): "__half_as_short(", ("float16", "uint16"): "__half_as_ushort(",
               ("int16", "float16"): "__short_as_half(", ("uint16", "float16"): "__ushort_as_half(",
               ("int32", "uint32"): "(unsigned int)(", ("uint8", "int8"): "(signed char)(",
               ("int64", "uint64"): "(unsigned long long)("}


@pytest.mark.parametrize(("src", "dst"), _PAIRS)
def test_cuda_reinterpret_uses_cuda_bit_casts_and_compiles_for_sm90(src, dst, monkeypatch):
    monkeypatch.setenv("KILN_CACHE", "0")
    source = _build(src, dst, False, target="cuda -arch=sm_90").get_source("cuda")
    assert _CUDA_CALLS[src, dst] in source
    assert nvrtc.compile_cuda(source, "sm_90")[:4] == b"\x7fELF"
    if "float16" in (src, dst):  # kiln's stand-in for cuda_fp16.h has the bit casts too
        monkeypatch.setattr(nvrtc, "fp16_include_dir", lambda: None)
        assert nvrtc.compile_cuda(source, "sm_90")[:4] == b"\x7fELF"


# -- the Relay op ------------------------------------------------------------------------------


def _relay_reinterpret(shape, src, dst):
    from kiln.relay.op.tensor import reinterpret

    x = relay.var("x", relay.TensorType(shape, src))
    return relay.transform.InferType()(relay.IRModule.from_expr(relay.Function([x], reinterpret(x, dst))))


@pytest.mark.parametrize(("src", "dst"), [("float32", "int32"), ("int32", "float32"), ("float16", "uint16"),
                                          ("uint64", "float64"), ("float64", "int64")])
def test_relay_reinterpret_compiles_and_matches_numpy_view(src, dst, monkeypatch):
    monkeypatch.setenv("KILN_CACHE", "0")
    flat = _bits_of(src)
    if "float16" in (src, dst):
        flat = _quiet_half_nans(flat)
    a = np.resize(flat, (3, 5, 7)).astype(src)
    mod = _relay_reinterpret((3, 5, 7), src, dst)
    assert str(mod["main"].body.checked_type) == str(relay.TensorType((3, 5, 7), dst))
    got = np.asarray(relay.build(mod, target="llvm").create_executor()(x=a))
    assert got.dtype == np.dtype(dst)
    _same_bits(got, a.view(dst))
    ref = np.asarray(relay.create_executor("debug", mod=mod)(x=a))
    _same_bits(ref, a.view(dst))


@pytest.mark.parametrize(("src", "dst", "message"), [
    ("float32", "int64", r"attribute dtype int64 has 64 bits, the input's float32 32: reinterpret needs one width"),
    ("bool", "uint8", "the input's dtype is bool, whose bits cannot be reinterpreted"),
    ("float16", "bfloat16", "attribute dtype is bfloat16"),
])
def test_relay_reinterpret_type_error_names_the_op_and_the_widths(src, dst, message):
    with pytest.raises(kiln.KilnError, match=message) as info:
        _relay_reinterpret((2, 3), src, dst)
    assert "reinterpret" in str(info.value)
