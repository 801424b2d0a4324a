"""The LLVM back end: loop IR compiled and run, compared with numpy."""

from __future__ import annotations

import re

import numpy as np
import pytest

import kiln
from kiln import tir
from kiln.codegen import jit
from kiln.codegen.llvm import emit_llvm_ir
from kiln.runtime.module import KernelMemoryError
from kiln.target import Target


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


def test_parallel_loop_matches_numpy_and_uses_openmp():
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
    if jit.have_openmp():
        assert "GOMP_parallel" in m.get_source("ll")


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


def test_unsupported_dtype_is_an_error():
    A = tir.buffer("A", (4,), "bfloat16")
    i = tir.Var("i")
    with pytest.raises(jit.CodegenError, match="does not support dtype 'bfloat16'"):
        kiln.build(tir.PrimFunc("half", [A], tir.for_range(i, 4, tir.BufferStore(A, A.load(i), (i,)))))


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
    with pytest.raises(jit.UnresolvedSymbolError, match="kiln_no_such_symbol_xyz"):
        jit.check_symbols(["expf", "kiln_no_such_symbol_xyz"], "k")
    mod_text = ("declare float @kiln_no_such_symbol_xyz(float)\n"
                "define float @k(float %x) {\n  %y = call float @kiln_no_such_symbol_xyz(float %x)\n"
                "  ret float %y\n}\n")
    mod, tm = jit.optimize(mod_text, Target("llvm"))
    symbols = jit.external_symbols(mod)
    assert symbols == ["kiln_no_such_symbol_xyz"]
    with pytest.raises(jit.UnresolvedSymbolError, match="kiln_no_such_symbol_xyz"):
        jit.Engine(jit.emit_object(mod, tm), Target("llvm"), symbols, "k")


@pytest.mark.skipif(not jit.has_feature(Target("llvm"), "avx512f"), reason="host has no AVX-512")
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
    assert "<16 x float>" in m.get_source("ll") or not jit.has_feature(Target("llvm"), "avx512f")


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
