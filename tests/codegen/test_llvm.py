"""The LLVM back end: loop IR compiled and run, compared with numpy."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

import kiln
from kiln import te, tir
from kiln.codegen import jit
from kiln.codegen.llvm import emit_llvm_ir
from kiln.ir.dtype import DataType
from kiln.runtime import linker, pool
from kiln.runtime.module import KernelMemoryError
from kiln.target import Target
from kiln.tir.allreduce import allreduce


@pytest.fixture(autouse=True)
def _no_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KILN_CACHE", "0")


def elementwise(name, dtype_in, dtype_out, fn, nargs=2, kind=tir.ForKind.SERIAL):
    n = tir.Var("n")
    ins = [tir.buffer(f"A{k}", (n,), dtype_in) for k in range(nargs)]
    out = tir.buffer("B", (n,), dtype_out)
    i = tir.Var("i")
    body = tir.for_range(i, n, tir.BufferStore(out, fn(*[b.load(i) for b in ins]), (i,)), kind)
    return kiln.build(tir.PrimFunc(name, [*ins, out], body))


def _rand(dtype, n=257, seed=0):
    rng = np.random.default_rng(seed)
    if dtype == "bool":
        return rng.integers(0, 2, n).astype(np.bool_)
    if np.dtype(dtype).kind == "f":
        return rng.standard_normal(n).astype(dtype) * 10
    info = np.iinfo(dtype)
    return rng.integers(max(info.min, -100), min(info.max, 100), n, endpoint=True).astype(dtype)


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64", "int8", "uint8", "int16"])
@pytest.mark.parametrize("kind", [tir.ForKind.SERIAL, tir.ForKind.VECTORIZED])
def test_elementwise_add_mul_matches_numpy_for_each_dtype(dtype, kind):
    m = elementwise("addmul", dtype, dtype, lambda a, b: a * b + a - b, kind=kind)
    a, b = _rand(dtype, seed=1), _rand(dtype, seed=2)
    out = np.zeros_like(a)
    m(a, b, out)
    with np.errstate(over="ignore"):
        expected = a * b + a - b
    np.testing.assert_allclose(out, expected, rtol=1e-6 if dtype == "float32" else 1e-12)


@pytest.mark.parametrize("kind", [tir.ForKind.SERIAL, tir.ForKind.VECTORIZED])
def test_float16_is_stored_as_half_and_computed_in_float(kind):
    m = elementwise("half", "float16", "float16", lambda a, b: a * b + a, kind=kind)
    a, b = _rand("float16", seed=1), _rand("float16", seed=2)
    out = np.zeros_like(a)
    m(a, b, out)
    # one rounding to half at the store, of the float32 result
    want = (a.astype(np.float32) * b.astype(np.float32) + a.astype(np.float32)).astype(np.float16)
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize(("src", "dst"), [("float32", "float16"), ("float64", "float16"), ("int32", "float16"),
                                          ("float16", "float64"), ("float16", "int32"), ("float16", "float32")])
def test_casts_to_and_from_float16_round_like_numpy(src, dst):
    m = elementwise("cast16", src, dst, lambda a: tir.cast(dst, a), nargs=1)
    a = _rand(src, seed=5) * (7 if np.dtype(src).kind == "i" else 1)
    a = a.astype(src) / (3 if np.dtype(src).kind == "f" else 1)
    out = np.zeros(a.shape, dst)
    m(a.astype(src), out)
    np.testing.assert_array_equal(out, a.astype(src).astype(dst))


# Targets for every float16 path: the host (F16C where it has it), x86-64 and x86-64-v2 (no
# F16C: LLVM would call compiler-rt's __truncdfhf2 / __truncsfhf2 / __extendhfsf2, which no
# library defines), and x86-64 with F16C named explicitly.
_HALF_TARGETS = ["llvm", "llvm -mcpu=x86-64", "llvm -mcpu=x86-64-v2", "llvm -mcpu=x86-64 -mattr=+avx,+f16c"]


def _cast_kernel(src: str, dst: str, target: str, kind: tir.ForKind):
    n = tir.Var("n")
    a, out = tir.buffer("A", (n,), src), tir.buffer("B", (n,), dst)
    i = tir.Var("i")
    body = tir.for_range(i, n, tir.BufferStore(out, tir.cast(dst, a.load(i)), (i,)), kind)
    return kiln.build(tir.PrimFunc("cast16", [a, out], body), target=target)


def _bits(dtype: str, values: list[int]) -> np.ndarray:
    unsigned = {"float16": np.uint16, "float32": np.uint32, "float64": np.uint64}[dtype]
    return np.array(values, unsigned).view(dtype)


def _half_inputs(src: str) -> np.ndarray:
    """Special values (ties, both sides of the denormal and overflow edges, NaN, inf, -0) and random ones."""
    rng = np.random.default_rng(13)
    if src == "float16":  # every half
        return np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    if np.dtype(src).kind in "iub":
        special = [0, 1, -1, 2047, 2049, 4097, 65504, 65505, 65519, 65520, 65535, -65520, -65519, 2**24 + 1]
        info = np.iinfo(src) if src != "bool" else None
        if info is None:
            return np.array([0, 1, 1, 0], np.bool_)
        vals = np.array([v for v in special if info.min <= v <= info.max], np.int64)
        rand = rng.integers(max(info.min, -70000), min(info.max, 70000), 4000, endpoint=True)
        return np.concatenate([vals, rand]).astype(src)
    f = np.dtype(src).type
    ulp = np.float64(2.0**-11)
    special = [0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1.0, 1 + ulp, 1 + 3 * ulp, 1 + ulp + 2.0**-40,
               1 + ulp - 2.0**-40, 1 + ulp + 2.0**-25, 65504.0, 65519.99, 65520.0, 65536.0, 1e10, 1e300, -1e300,
               2.0**-14, 2.0**-14 - 2.0**-25, 2.0**-15, 2.0**-24, 2.0**-25, 2.0**-25 + 2.0**-50, 3 * 2.0**-25,
               2.0**-26, 1e-30, 5e-324, 1.1754944e-38, 6.1e-5, 6.103e-5, 0.1, 1 / 3, 2049.0, 2051.0, 4095.5]
    with np.errstate(over="ignore"):
        vals = np.array(special, np.float64).astype(src)
    width = {"float32": np.uint32, "float64": np.uint64}[src]
    info = np.iinfo(width)
    random_bits = rng.integers(0, info.max, 20000, dtype=width, endpoint=True).view(src)
    # magnitudes around float16's range: exponents from 2**-30 to 2**17, random mantissas
    around = rng.uniform(-1, 1, 20000) * np.exp2(rng.integers(-30, 17, 20000))
    # exact ties of float16's rounding: a half's mantissa plus half an ulp, from the normal and denormal range
    ties = (np.arange(2048, 4096, dtype=np.float64) + 0.5) * np.exp2(rng.integers(-25, 5, 2048))
    with np.errstate(over="ignore"):
        ours = [vals, random_bits, around.astype(src), ties.astype(src), -ties.astype(src)]
    return np.concatenate([v.astype(f) for v in ours])


def _assert_same_bits(got: np.ndarray, want: np.ndarray, inputs: np.ndarray) -> None:
    """Bit-exact, except that a NaN only has to be a NaN of the same sign (payloads differ by CPU)."""
    if np.dtype(want.dtype).kind != "f":
        np.testing.assert_array_equal(got, want)
        return
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(np.signbit(got[nan]), np.signbit(want[nan]))
    width = {2: np.uint16, 4: np.uint32, 8: np.uint64}[want.dtype.itemsize]
    bad = np.flatnonzero((got.view(width) != want.view(width)) & ~nan)
    assert bad.size == 0, [(inputs[k], got[k], want[k]) for k in bad[:5]]


@pytest.mark.parametrize("target", _HALF_TARGETS)
@pytest.mark.parametrize("kind", [tir.ForKind.SERIAL, tir.ForKind.VECTORIZED])
@pytest.mark.parametrize(("src", "dst"), [("float64", "float16"), ("float32", "float16"), ("float16", "float32"),
                                          ("float16", "float64"), ("int32", "float16"), ("int64", "float16"),
                                          ("uint8", "float16"), ("int8", "float16"), ("bool", "float16")])
def test_float16_conversions_are_bit_exact_with_numpy_on_every_x86_cpu(target, kind, src, dst):
    m = _cast_kernel(src, dst, target, kind)
    asm = m.get_source("asm")
    assert "hf2" not in asm  # no compiler-rt conversion call (__truncdfhf2, __truncsfhf2, __extendhfsf2)
    if "+f16c" in (Target(target).get("mattr") or ()) and "float32" in (src, dst):
        assert "vcvtp" in asm  # F16C's vcvtps2ph / vcvtph2ps where the target has them
    a = _half_inputs(src)
    out = np.zeros(a.shape, dst)
    m(a, out)
    with np.errstate(over="ignore", invalid="ignore"):
        want = a.astype(dst)
    _assert_same_bits(out, want, a)


@pytest.mark.parametrize("target", _HALF_TARGETS)
def test_float16_loads_and_stores_round_once_on_every_x86_cpu(target):
    """float16 in memory: widened exactly on load, rounded to nearest even on store, with F16C or without."""
    n = tir.Var("n")
    a, b, out = tir.buffer("A", (n,), "float16"), tir.buffer("B", (n,), "float32"), tir.buffer("C", (n,), "float16")
    i = tir.Var("i")
    value = tir.cast("float16", tir.cast("float32", a.load(i)) * b.load(i))
    body = tir.for_range(i, n, tir.BufferStore(out, value, (i,)), tir.ForKind.VECTORIZED)
    m = kiln.build(tir.PrimFunc("half_io", [a, b, out], body), target=target)
    x = _half_inputs("float16")
    y = np.random.default_rng(3).uniform(-4, 4, x.size).astype(np.float32)
    got = np.zeros_like(x)
    m(x, y, got)
    with np.errstate(over="ignore", invalid="ignore"):
        want = (x.astype(np.float32) * y).astype(np.float16)
    _assert_same_bits(got, want, x)


def test_relay_cast_float64_to_float16_with_nan_and_inf_on_baseline_x86():
    from kiln import relay

    x = relay.var("x", shape=(16,), dtype="float64")
    lib = relay.build(relay.Function([x], relay.cast(x, "float16")), target="llvm -mcpu=x86-64")
    a = np.array([np.nan, np.inf, -np.inf, 1e10, -65520, 65519.9, 1e-8, 3e-8, 0.1, -0.0, 1 + 2.0**-11 + 2.0**-40,
                  2.0**-24, 5e-324, 4095.5, 1.0, -2.5])
    got = np.asarray(lib.create_executor()(x=a))
    with np.errstate(over="ignore"):
        _assert_same_bits(got, a.astype(np.float16), a)


def test_float16_constants_hold_float16_values():
    m = elementwise("half_const", "float16", "float32", lambda a: tir.cast("float32", a * tir.FloatImm("float16", 0.1)),
                    nargs=1)
    a = np.ones(8, np.float16)
    out = np.zeros(8, np.float32)
    m(a, out)
    np.testing.assert_array_equal(out, np.float32(np.float16(0.1)))


def test_bool_logic_matches_numpy():
    m = elementwise("logic", "bool", "bool", lambda a, b: tir.logical_not(tir.binary(tir.And, a, b)))
    a, b = _rand("bool", seed=1), _rand("bool", seed=2)
    out = np.zeros_like(a)
    m(a, b, out)
    np.testing.assert_array_equal(out, ~(a & b))


def test_comparison_and_select_and_cast():
    m = elementwise("sel", "float32", "int32",
                    lambda a, b: tir.select(a < b, tir.cast("int32", a), tir.cast("int32", b) * 2))
    a, b = _rand("float32", seed=3), _rand("float32", seed=4)
    out = np.zeros(a.shape, np.int32)
    m(a, b, out)
    np.testing.assert_array_equal(out, np.where(a < b, a.astype(np.int32), b.astype(np.int32) * 2))


def test_float_min_max_propagate_nan_like_numpy():
    m = elementwise("mm", "float32", "float32", lambda a, b: tir.min_(a, b) + tir.max_(a, b) * 2.0)
    a = np.array([1, np.nan, -3, 5, np.inf], np.float32)
    b = np.array([2, 1, np.nan, -5, 1], np.float32)
    out = np.zeros_like(a)
    m(a, b, out)
    np.testing.assert_array_equal(out, np.minimum(a, b) + np.maximum(a, b) * 2)


@pytest.mark.parametrize("dtype", ["int32", "int64", "int8"])
def test_integer_division_and_modulo_with_negatives(dtype):
    a = np.array([7, -7, 7, -7, 0, 5, -5, 3, -128 if dtype == "int8" else -100], dtype)
    b = np.array([2, 2, -2, -2, 3, 0, 0, -1, -1], dtype)
    for op, ref in [(tir.FloorDiv, np.floor_divide), (tir.FloorMod, np.remainder)]:
        m = elementwise(f"{op.__name__.lower()}_{dtype}", dtype, dtype, lambda x, y, op=op: tir.binary(op, x, y))
        out = np.zeros_like(a)
        m(a, b, out)
        with np.errstate(divide="ignore", over="ignore"):
            np.testing.assert_array_equal(out, ref(a, b), err_msg=op.__name__)
    m = elementwise(f"div_{dtype}", dtype, dtype, lambda x, y: tir.binary(tir.Div, x, y))
    out = np.zeros_like(a)
    m(a, b, out)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        trunc = np.where(b == 0, 0, np.trunc(a.astype(np.float64) / np.where(b == 0, 1, b)))
    np.testing.assert_array_equal(out, trunc.astype(np.int64).astype(dtype))


def test_division_by_constant_and_unsigned():
    m = elementwise("divc", "int32", "int32", lambda x, y: x // 4 + x % 3 * 100 + y - y, nargs=2)
    a = np.arange(-20, 20, dtype=np.int32)
    out = np.zeros_like(a)
    m(a, a.copy(), out)
    np.testing.assert_array_equal(out, a // 4 + a % 3 * 100)
    u = elementwise("divu", "uint8", "uint8", lambda x, y: x // y + x % y)
    a8 = np.array([200, 7, 255, 9], np.uint8)
    b8 = np.array([3, 0, 16, 9], np.uint8)
    out8 = np.zeros_like(a8)
    u(a8, b8, out8)
    with np.errstate(divide="ignore"):
        np.testing.assert_array_equal(out8, a8 // b8 + a8 % b8)


def test_float_floor_div_mod():
    m = elementwise("ffm", "float64", "float64", lambda x, y: x // y * 10.0 + x % y)
    a = np.array([7.5, -7.5, 7.5, -7.5], np.float64)
    b = np.array([2.0, 2.0, -2.0, -2.0], np.float64)
    out = np.zeros_like(a)
    m(a, b, out)
    np.testing.assert_allclose(out, a // b * 10 + a % b)


def test_float_to_int_casts_saturate():
    m = elementwise("sat", "float32", "int8", lambda x: tir.cast("int8", x), nargs=1)
    a = np.array([1.9, -1.9, 300, -300, np.nan], np.float32)
    out = np.zeros(a.shape, np.int8)
    m(a, out)
    np.testing.assert_array_equal(out, [1, -1, 127, -128, 0])


@pytest.mark.parametrize("src", ["float32", "float64"])
@pytest.mark.parametrize("dst", ["int8", "uint8", "int16", "int32", "int64"])
def test_vectorized_float_to_int_casts_saturate_at_every_bound(src, dst):
    """Clamps + a plain conversion (vectorized) give what llvm.fptosi.sat gave: truncation toward zero,
    the type's bounds past them (also just past, where the float cannot hold the bound), NaN as 0."""
    info = np.iinfo(dst)
    top, low = float(info.max) + 1, float(info.min)
    special = [np.nan, np.inf, -np.inf, 1e30, -1e30, top, top * 2, np.nextafter(top, 0), low, low - 1, low * 2,
               -0.5, 0.5, 2.7, -2.7, 127.9, -128.5, 255.5, 65535.9]
    a = np.resize(np.array(special, src), 53)  # 3 vectors and a scalar tail
    m = elementwise(f"sat_{src}_{dst}", src, dst, lambda x: tir.cast(dst, x), nargs=1, kind=tir.ForKind.VECTORIZED)
    out = np.zeros(a.shape, dst)
    m(a, out)
    want = [0 if np.isnan(v) else max(int(info.min), min(int(info.max), int(np.trunc(v)) if np.isfinite(v)
                                                          else (int(info.max) if v > 0 else int(info.min))))
            for v in a.astype(np.float64)]
    np.testing.assert_array_equal(out.astype(object), np.array(want, dtype=object))


def test_reduction_with_local_accumulator():
    n, k = tir.Var("n"), tir.Var("k")
    A, B = tir.buffer("A", (n, k)), tir.buffer("B", (n,))
    acc = tir.buffer("acc", (1,), scope="local")
    i, j = tir.Var("i"), tir.Var("j")
    body = tir.for_range(i, n, tir.Allocate(acc, tir.seq(
        tir.BufferStore(acc, tir.const(0.0), (tir.const(0),)),
        tir.for_range(j, k, tir.BufferStore(acc, acc.load(0) + A.load(i, j), (tir.const(0),))),
        tir.BufferStore(B, acc.load(0), (i,)),
    )))
    m = kiln.build(tir.PrimFunc("rowsum", [A, B], body))
    a = np.random.default_rng(0).standard_normal((37, 1000)).astype(np.float32)
    out = np.zeros(37, np.float32)
    m(a, out)
    np.testing.assert_allclose(out, a.sum(axis=1), rtol=1e-4, atol=1e-4)


def test_parallel_loop_matches_numpy_and_runs_on_the_pool():
    n = tir.Var("n")
    A, B = tir.buffer("A", (n, 4)), tir.buffer("B", (n, 4))
    i, j = tir.Var("i"), tir.Var("j")
    body = tir.for_range(i, n, tir.for_range(
        j, 4, tir.BufferStore(B, tir.call("exp", A.load(i, j)) * 2.0 + 1, (i, j)), tir.ForKind.VECTORIZED),
        tir.ForKind.PARALLEL)
    m = kiln.build(tir.PrimFunc("par", [A, B], body), target="llvm -num-cores=2")
    for rows in (0, 1, 3, 1001):
        a = np.random.default_rng(rows).standard_normal((rows, 4)).astype(np.float32)
        out = np.zeros_like(a)
        m(a, out)
        np.testing.assert_allclose(out, np.exp(a) * 2 + 1, rtol=1e-6)
    assert pool.PARALLEL_FOR in m.get_source("ll")


def test_parallel_loop_inside_serial_loop_with_let():
    n = tir.Var("n")
    A = tir.buffer("A", (3, n), "int32")
    i, j, t = tir.Var("i"), tir.Var("j"), tir.Var("t")
    inner = tir.for_range(j, n, tir.BufferStore(A, t + j, (i, j)), tir.ForKind.PARALLEL)
    body = tir.for_range(i, 3, tir.LetStmt(t, i * 1000, inner))
    m = kiln.build(tir.PrimFunc("nested", [A], body), target="llvm -num-cores=2")
    a = np.zeros((3, 50), np.int32)
    m(a)
    np.testing.assert_array_equal(a, np.arange(3)[:, None] * 1000 + np.arange(50))


@pytest.mark.parametrize("extent", [1, 7, 16, 37, 100])
def test_vectorized_loop_with_tail(extent):
    A, B = tir.buffer("A", (extent,)), tir.buffer("B", (extent,))
    i = tir.Var("i")
    body = tir.for_range(i, extent, tir.BufferStore(B, A.load(i) * 3.0, (i,)), tir.ForKind.VECTORIZED)
    m = kiln.build(tir.PrimFunc(f"tail{extent}", [A, B], body))
    a = np.arange(extent, dtype=np.float32)
    out = np.zeros_like(a)
    m(a, out)
    np.testing.assert_array_equal(out, a * 3)


@pytest.mark.parametrize(("extent", "stride", "widths"), [
    (56, 1, [8, 16]),  # 48 in vectors of 16, then one of 8 (not 8 scalar iterations: LLVM's remainder)
    (57, 1, [8, 16]),  # ... and one scalar
    (7, 1, [2, 4]),
    (56, 2, [8, 16]),  # a strided read: LLVM would even leave its last whole vector to scalar code
    (13, 2, [4, 8]),
])
def test_the_rest_of_a_vectorized_loop_runs_as_narrower_vectors(extent, stride, widths):
    A, B = tir.buffer("A", (extent * stride,)), tir.buffer("B", (extent,))
    i = tir.Var("i")
    body = tir.for_range(i, extent, tir.BufferStore(B, A.load(i * stride) * 3.0, (i,)), tir.ForKind.VECTORIZED)
    func = tir.PrimFunc(f"rest{extent}_{stride}", [A, B], body)
    m = kiln.build(func)
    a = np.arange(extent * stride, dtype=np.float32)
    out = np.zeros(extent, np.float32)
    m(a, out)
    np.testing.assert_array_equal(out, a[::stride] * 3)
    if linker.has_feature(Target("llvm"), "avx512f"):
        ir_text = emit_llvm_ir(func, Target("llvm"))
        assert sorted(int(w) for w in re.findall(r'"llvm.loop.vectorize.width", i32 (\d+)', ir_text)) == widths


def test_unrolled_loops_constant_and_symbolic():
    n = tir.Var("n")
    A = tir.buffer("A", (n, 4), "int64")
    i, j = tir.Var("i"), tir.Var("j")
    body = tir.for_range(i, n, tir.for_range(
        j, 4, tir.BufferStore(A, tir.cast("int64", i * 10 + j), (i, j)), tir.ForKind.UNROLLED), tir.ForKind.UNROLLED)
    m = kiln.build(tir.PrimFunc("unr", [A], body))
    a = np.zeros((5, 4), np.int64)
    m(a)
    np.testing.assert_array_equal(a, np.arange(5)[:, None] * 10 + np.arange(4))


def test_if_then_else_and_evaluate():
    n = tir.Var("n")
    A = tir.buffer("A", (n,), "int32")
    i = tir.Var("i")
    body = tir.for_range(i, n, tir.seq(
        tir.Evaluate(tir.call("abs", tir.cast("float32", i))),
        tir.IfThenElse(tir.eq(i % 2, 0), tir.BufferStore(A, i, (i,)), tir.BufferStore(A, -i, (i,))),
        tir.IfThenElse(i > 5, tir.BufferStore(A, A.load(i) + 100, (i,))),
    ))
    m = kiln.build(tir.PrimFunc("ite", [A], body))
    a = np.zeros(10, np.int32)
    m(a)
    r = np.arange(10)
    np.testing.assert_array_equal(a, np.where(r % 2 == 0, r, -r) + np.where(r > 5, 100, 0))


def test_symbolic_shapes_same_kernel_different_sizes():
    m = elementwise("sym", "float32", "float32", lambda a: a + 1.0, nargs=1, kind=tir.ForKind.VECTORIZED)
    for size in (0, 1, 15, 16, 17, 1000):
        a = np.arange(size, dtype=np.float32)
        out = np.zeros_like(a)
        m(a, out)
        np.testing.assert_array_equal(out, a + 1)


def test_ir_is_verified_before_optimization():
    with pytest.raises(jit.CodegenError, match="LLVM rejected the generated IR"):
        jit.optimize("define void @f() {\n  ret i32 0\n}\n", Target("llvm"))


def test_gpu_loop_on_llvm_target_is_an_error():
    A = tir.buffer("A", (4,))
    i = tir.Var("i")
    loop = tir.For(i, tir.const(0), tir.const(4), tir.ForKind.THREAD_BINDING, tir.BufferStore(A, tir.const(1.0), (i,)),
                   "threadIdx.x")
    with pytest.raises(jit.CodegenError, match=r"bound to threadIdx\.x"):
        kiln.build(tir.PrimFunc("gpu", [A], loop))


def test_an_all_reduce_across_gpu_threads_on_llvm_is_an_error():
    A = tir.buffer("A", (4,))
    acc = tir.buffer("acc", (1,), scope="local")
    body = tir.Allocate(acc, tir.seq(tir.BufferStore(acc, A.load(0), (0,)), allreduce(acc.load(0), tir.max_, 32),
                                     tir.BufferStore(A, acc.load(0), (0,))))
    with pytest.raises(jit.CodegenError, match="a reduction across GPU threads .* compiles for cuda targets only"):
        kiln.build(tir.PrimFunc("red", [A], body))


@pytest.mark.parametrize("kind", [tir.ForKind.SERIAL, tir.ForKind.VECTORIZED])
def test_bfloat16_converts_exactly_as_ml_dtypes_rounds(kind):
    """bfloat16 is a storage type: every one of its values widens exactly, and float32 (random bit patterns,
    ties, overflow, NaN) and float64 (through float32, as ml_dtypes does) round to nearest even as ml_dtypes."""
    bf16 = DataType.of("bfloat16").numpy()
    every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(bf16)
    out = np.zeros(every.shape, np.float32)
    _cast_kernel("bfloat16", "float32", "llvm", kind)(every, out)
    np.testing.assert_array_equal(out.view(np.uint32), every.astype(np.float32).view(np.uint32))
    rng = np.random.default_rng(7)
    # exact ties: odd integers in [256, 512) lie halfway between neighbouring bfloat16 values (8-bit significands)
    ties = np.arange(257, 512, 2, dtype=np.float32) * np.exp2(rng.integers(-120, 120, 128)).astype(np.float32)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 3.39e38, 3.4e38, 1e-40, 1 + 2**-8, 1 + 3 * 2**-8],
                       np.float32)
    for src, values in (("float32", np.concatenate([special, ties, -ties,
                                                    rng.integers(0, 2**32, 20000, np.uint32).view(np.float32)])),
                        ("float64", rng.standard_normal(5000) * np.exp2(rng.integers(-130, 130, 5000)))):
        got = np.zeros(values.shape, bf16)
        with np.errstate(over="ignore", invalid="ignore"):
            _cast_kernel(src, "bfloat16", "llvm", kind)(values, got)
            want = values.astype(bf16)
        nan = np.isnan(want.astype(np.float32))
        np.testing.assert_array_equal(got.view(np.uint16)[~nan], want.view(np.uint16)[~nan], err_msg=src)
        assert np.isnan(got.astype(np.float32)[nan]).all(), src


def test_function_attributes_and_loop_metadata_in_ir():
    n = tir.Var("n")
    A, B = tir.buffer("A", (n,)), tir.buffer("B", (n,))
    i = tir.Var("i")
    body = tir.for_range(i, n, tir.BufferStore(B, A.load(i), (i,)), tir.ForKind.VECTORIZED)
    target = Target("llvm")
    text = emit_llvm_ir(tir.PrimFunc("attrs", [A, B], body), target)
    assert f'"target-cpu"="{target["mcpu"]}"' in text
    assert '"target-features"=' in text
    assert "noalias" in text
    assert "llvm.loop.vectorize.enable" in text and "llvm.loop.vectorize.width" in text


def test_unresolved_symbol_raises_before_any_call():
    with pytest.raises(linker.UnresolvedSymbolError, match="kiln_no_such_symbol_xyz"):
        linker.check_symbols(["expf", "kiln_no_such_symbol_xyz"], "k")
    mod_text = ("declare float @kiln_no_such_symbol_xyz(float)\n"
                "define float @k(float %x) {\n  %y = call float @kiln_no_such_symbol_xyz(float %x)\n"
                "  ret float %y\n}\n")
    mod, tm = jit.optimize(mod_text, Target("llvm"))
    symbols = jit.external_symbols(mod)
    assert symbols == ["kiln_no_such_symbol_xyz"]
    with pytest.raises(linker.UnresolvedSymbolError, match="kiln_no_such_symbol_xyz"):
        linker.Engine(jit.emit_object(mod, tm), Target("llvm"), symbols, "k")


@pytest.mark.skipif(not linker.has_feature(Target("llvm"), "avx512f"), reason="host has no AVX-512")
def test_vectorized_float32_kernel_uses_zmm_registers():
    m = elementwise("zmm", "float32", "float32", lambda a, b: a * b + 1.0, kind=tir.ForKind.VECTORIZED)
    assert "zmm" in m.get_source("asm")


def test_vectorized_exp_leaves_no_libm_call():
    m = elementwise("vexp", "float32", "float32", lambda a: tir.call("exp", a) + tir.call("tanh", a), nargs=1,
                    kind=tir.ForKind.VECTORIZED)
    asm = m.get_source("asm")
    assert "expf" not in asm and "tanhf" not in asm
    callees = re.findall(r"call [^@]*@([\w.]+)", m.get_source("ll"))
    assert callees and all(c.startswith("llvm.") for c in callees), callees
    assert "<16 x float>" in m.get_source("ll") or not linker.has_feature(Target("llvm"), "avx512f")


def _staged(n: tir.PrimExpr, temp_size: tir.PrimExpr, kind: tir.ForKind) -> tir.PrimFunc:
    """B[i] = A[i] * 2 + 1 through a temporary of `temp_size` elements, allocated inside loop i."""
    A, B = tir.buffer("A", (n,)), tir.buffer("B", (n,))
    T = tir.buffer("T", (temp_size,), scope="global")
    i, j = tir.Var("i"), tir.Var("j")
    body = tir.for_range(i, 4, tir.Allocate(T, tir.seq(
        tir.for_range(j, n, tir.BufferStore(T, A.load(j) * 2.0, (j,)), tir.ForKind.VECTORIZED),
        tir.for_range(j, n // 4, tir.BufferStore(B, T.load(i * (n // 4) + j) + 1.0, (i * (n // 4) + j,))),
    )), kind)
    return tir.PrimFunc("staged", [A, B], body)


@pytest.mark.parametrize("kind", [tir.ForKind.SERIAL, tir.ForKind.PARALLEL])
def test_large_temporaries_live_on_the_heap(kind):
    n = 1 << 22  # 16 MiB: twice a default thread stack, which an alloca would overflow (a segfault)
    m = kiln.build(_staged(tir.const(n), tir.const(n), kind), target="llvm -num-cores=2")
    assert "aligned_alloc" in m.get_source("ll") and "free" in m.get_source("ll")
    a = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    out = np.zeros_like(a)
    m(a, out)
    np.testing.assert_allclose(out, a * 2 + 1, rtol=1e-6)


@pytest.mark.parametrize("kind", [tir.ForKind.SERIAL, tir.ForKind.PARALLEL])
@pytest.mark.parametrize("power", [3, 4])  # 2**48 floats: refused by malloc; 2**64: wraps int32 and int64 both
def test_a_temporary_too_large_to_allocate_raises_and_the_kernel_stays_usable(kind, power):
    n = tir.Var("n")
    size = n
    for _ in range(power - 1):
        size = size * n
    m = kiln.build(_staged(n, size, kind), target="llvm -num-cores=2")
    big = np.zeros(1 << 16, np.float32)
    with pytest.raises(KernelMemoryError, match=r"kernel 'staged': out of memory allocating its temporary "
                                                r"buffers \(T\[.*\] float32\) for sizes \{'n': 65536\}"):
        m(big, np.zeros_like(big))
    a = np.arange(8, dtype=np.float32)
    out = np.zeros_like(a)
    m(a, out)
    np.testing.assert_allclose(out, a * 2 + 1)


def test_a_vectorized_loop_reads_a_broadcast_operand_lane_by_lane() -> None:
    # found by the Relay fuzzer: with llvm.loop.unroll.disable beside the vectorize hints, LLVM read
    # B[j, 0, w] of this fused loop as 16 consecutive floats (384 of 512 elements wrong)
    a = te.placeholder((16, 2, 4, 4), "float32", name="A")
    b = te.placeholder((2, 1, 4), "float32", name="B")
    c = te.compute(a.shape, lambda i, j, k, w: a[i, j, k, w] + b[j, 0, w], name="C")
    s = te.create_schedule(c)
    _, inner = s[c].split(s[c].fuse(*c.op.axis), factor=16)
    s[c].vectorize(inner)
    mod = kiln.build(s, [a, b, c], name="broadcast_add")
    x = np.arange(512, dtype="float32").reshape(16, 2, 4, 4)
    y = np.arange(8, dtype="float32").reshape(2, 1, 4) * 1000
    out = np.zeros_like(x)
    mod(x, y, out)
    np.testing.assert_array_equal(out, x + y)


@pytest.mark.parametrize("name", ["exp", "log", "tanh", "erf", "sigmoid", "sqrt", "rsqrt", "sin"])
def test_float16_math_computes_in_float32_and_rounds_on_store(name: str) -> None:
    # float16 is a storage type held in float32 registers; its intrinsics used to be refused (CodegenError)
    x = te.placeholder((37,), "float16", name="x")
    y = te.compute(x.shape, lambda i: getattr(te, name)(x[i]), name="y")
    mod = kiln.build(te.create_schedule(y), [x, y], name=f"{name}_f16")
    data = np.linspace(0.25, 3.0, 37).astype("float16")
    out = np.zeros(37, "float16")
    mod(data, out)
    wide = data.astype(np.float64)
    exact = {"exp": np.exp, "log": np.log, "tanh": np.tanh, "sqrt": np.sqrt, "sin": np.sin,
             "rsqrt": lambda v: 1 / np.sqrt(v), "sigmoid": lambda v: 1 / (1 + np.exp(-v)),
             "erf": np.vectorize(math.erf)}[name](wide)
    np.testing.assert_allclose(out.astype(np.float64), exact, rtol=1e-3)  # float16's rounding: 2**-11


def test_affine_vectorized_loops_stay_whole_and_lane_divisions_are_only_kept_from_runtime_unrolling() -> None:
    # the LLVM workaround above is for loops whose lanes index by a division; an affine tile loop keeps
    # llvm.loop.unroll.disable, so LLVM vectorizes it as it is rather than unrolling it into gathers
    a = te.placeholder((16, 2, 4, 4), "float32", name="A")
    b = te.placeholder((2, 1, 4), "float32", name="B")
    c = te.compute(a.shape, lambda i, j, k, w: a[i, j, k, w] + b[j, 0, w], name="C")
    s = te.create_schedule(c)
    s[c].vectorize(s[c].split(s[c].fuse(*c.op.axis), factor=16)[1])
    dividing = emit_llvm_ir(te.lower(s, [a, b, c]), Target("llvm"))
    assert "llvm.loop.unroll.runtime.disable" in dividing and '"llvm.loop.unroll.disable"' not in dividing
    from kiln import relay

    x, w = relay.var("x", shape=(1, 2048)), relay.var("w", shape=(64, 2048))
    lib = relay.build(relay.Function([x, w], relay.nn.dense(x, w)))
    (kernel,) = lib.kernels
    assert '"llvm.loop.unroll.disable"' in emit_llvm_ir(kernel.func, Target("llvm"))
    if linker.has_feature(Target("llvm"), "avx512f"):
        asm = kernel.get_source("asm")
        assert "vgather" not in asm and "vfmadd231ps" in asm and "zmm" in asm


@pytest.mark.parametrize("exponent", [1.0, 2.0, 3.0, 4.0, 2.5])
def test_pow_by_a_small_integer_constant_is_products_and_vectorizes(exponent):
    m = elementwise(f"pow_{int(exponent * 2)}", "float32", "float32",
                    lambda x: tir.call("pow", x, tir.FloatImm("float32", exponent)), nargs=1,
                    kind=tir.ForKind.VECTORIZED)
    a = np.concatenate([np.random.default_rng(3).standard_normal(61) * 4, [0.0, -0.0, np.inf, -np.inf, np.nan]])
    a = a.astype(np.float32)
    out = np.zeros_like(a)
    m(a, out)
    with np.errstate(invalid="ignore"):
        np.testing.assert_allclose(out, np.power(a, np.float32(exponent)), rtol=3e-7)
    assert ("powf" in m.symbols) == (exponent == 2.5)  # only a fractional exponent calls libm
