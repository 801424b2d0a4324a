"""qnn.matmul_integer on AVX-512 VNNI: qnn.matmul_vnni, `vnni_packed`, and the `dot4_u8i8` intrinsic
(scalar, and as vpdpbusd in `codegen.llvm_x86`).

Numerics are checked against numpy on every host; the rewrite to qnn.matmul_vnni and the vpdpbusd in
the assembly only where the host has avx512vnni (relay.build's default target is the host's).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from op_helpers import assert_registered_complete, assert_relation_waits, check_build, ref, rel, rel_error
from op_helpers import vnni_packed_words as packed

import kiln
from kiln import relay, te
from kiln.ir.types import TensorType
from kiln.registry import OpPattern
from kiln.relay import parse
from kiln.relay.op import quantize as qnn
from kiln.relay.printer import astext
from kiln.target import Target
from kiln.tir import expr as tx
from kiln.tir.expr import TIRError

VNNI = {"+avx512f", "+avx512vnni"} <= set(Target("llvm").get("mattr") or ())
needs_vnni = pytest.mark.skipif(not VNNI, reason="the host has no AVX-512 VNNI")


def tt(shape: tuple[int, ...], dtype: str) -> TensorType:
    return TensorType(shape, dtype)


def matmul_integer_np(a: np.ndarray, b: np.ndarray, za: np.ndarray, zb: np.ndarray) -> np.ndarray:
    zr = za.astype(np.int64).reshape(-1, 1) if za.size > 1 else za.astype(np.int64).reshape(())
    return ((a.astype(np.int64) - zr) @ (b.astype(np.int64) - zb.astype(np.int64).reshape(-1))).astype(np.int32)


def operands(rng: np.random.Generator, m: int, k: int, n: int, per_row: bool, per_col: bool,
             batch: tuple[int, ...] = ()) -> tuple[np.ndarray, ...]:
    a = rng.integers(0, 256, (*batch, m, k), dtype=np.uint8)
    b = rng.integers(-128, 128, (k, n), dtype=np.int8)
    za = rng.integers(0, 256, (m,) if per_row else (), dtype=np.uint8)
    zb = rng.integers(-128, 128, (n,) if per_col else (), dtype=np.int8)
    return a, b, za, zb


def build(a: np.ndarray, b: np.ndarray, za: np.ndarray, zb: np.ndarray, constant_b: bool) -> Any:
    va = relay.var("a", shape=a.shape, dtype="uint8")
    vb = relay.var("b", shape=b.shape, dtype="int8")
    out = qnn.matmul_integer(va, relay.const(b) if constant_b else vb, relay.const(za), relay.const(zb))
    params = [va] if constant_b else [va, vb]
    return relay.build(relay.IRModule.from_expr(relay.Function(params, out)), target="llvm")


# -- the op's declaration -----------------------------------------------------------------------------------


def test_matmul_vnni_is_declared_completely() -> None:
    assert_registered_complete("qnn.matmul_vnni", OpPattern.OUT_ELEMWISE_FUSABLE,
                               ["a", "b_packed", "a_zero_point", "b_zero_point"], qnn.MatmulVnniAttrs, 10)
    assert_relation_waits("qnn.matmul_vnni")


def test_matmul_vnni_relation() -> None:
    out = rel("qnn.matmul_vnni", [tt((2, 3, 5), "uint8"), tt((2, 2, 16), "int32"), tt((3,), "uint8"),
                                  tt((17,), "int8")], units=17)
    assert out == tt((2, 3, 17), "int32")
    with rel_error(r"expected b packed by vnni_packed, int32 \(2, 2, 16\) \(K=5, N=17\)", arg=1):
        rel("qnn.matmul_vnni", [tt((3, 5), "uint8"), tt((2, 1, 16), "int32"), tt((), "uint8"), tt((), "int8")],
            units=17)
    with rel_error("expected a static uint8 tensor", arg=0):
        rel("qnn.matmul_vnni", [tt((3, 5), "int8"), tt((1, 2, 16), "int32"), tt((), "int8"), tt((), "int8")])
    with rel_error(r"expected an int8 zero point, a scalar or \(17,\)", arg=3):
        rel("qnn.matmul_vnni", [tt((3, 5), "uint8"), tt((2, 2, 16), "int32"), tt((), "uint8"), tt((16,), "int8")],
            units=17)
    with pytest.raises(kiln.errors.KilnError, match="units"):
        qnn.matmul_vnni(*(relay.var(x) for x in "abcd"), units=0)


def test_matmul_vnni_prints_and_parses_back() -> None:
    args = [relay.var("a", shape=(3, 5), dtype="uint8"), relay.var("b", shape=(2, 2, 16), dtype="int32"),
            relay.var("za", shape=(), dtype="uint8"), relay.var("zb", shape=(17,), dtype="int8")]
    f = relay.Function(args, qnn.matmul_vnni(*args, units=17))
    assert astext(parse(astext(f)), show_types=False) == astext(f, show_types=False)


@pytest.mark.parametrize(("k", "n"), [(1, 1), (3, 17), (8, 16), (255, 33)])
def test_vnni_packed_words(k: int, n: int) -> None:
    b = np.random.default_rng(k * n).integers(-128, 128, (k, n), dtype=np.int8)
    vb = relay.var("b", shape=b.shape, dtype="int8")
    lib = relay.build(relay.IRModule.from_expr(relay.Function([vb], qnn.vnni_packed(vb, k, n))), target="llvm")
    np.testing.assert_array_equal(np.asarray(lib.create_executor()(b=b)), packed(b))


# -- numerics: the op itself, and matmul_integer through relay.build --------------------------------------


@pytest.mark.parametrize(("m", "k", "n"), [(1, 1, 1), (3, 17, 17), (17, 64, 255), (64, 3, 1), (4, 8, 64)])
def test_matmul_vnni_compute(m: int, k: int, n: int) -> None:
    rng = np.random.default_rng(m + k + n)
    a, b, za, zb = operands(rng, m, k, n, per_row=m % 2 == 1, per_col=n % 2 == 1)
    np.testing.assert_array_equal(ref("qnn.matmul_vnni", a, packed(b), za, zb, units=n),
                                  matmul_integer_np(a, b, za, zb))
    check_build("qnn.matmul_vnni", a, packed(b), za, zb, units=n)


@pytest.mark.parametrize(("m", "k", "n", "per_row", "per_col", "constant_b", "batch"), [
    (1, 3, 1, False, False, True, ()),
    (3, 17, 17, True, False, True, ()),
    (17, 64, 255, True, True, True, ()),
    (64, 255, 64, False, True, False, ()),
    (5, 20, 33, False, False, True, (2,)),
])
def test_matmul_integer_u8_s8(m: int, k: int, n: int, per_row: bool, per_col: bool, constant_b: bool,
                              batch: tuple[int, ...]) -> None:
    rng = np.random.default_rng(m * k + n)
    a, b, za, zb = operands(rng, m, k, n, per_row, per_col, batch)
    lib = build(a, b, za, zb, constant_b)
    got = lib.create_executor()(a=a) if constant_b else lib.create_executor()(a=a, b=b)
    np.testing.assert_array_equal(np.asarray(got), matmul_integer_np(a, b, za, zb))


def test_extreme_values_accumulate_exactly() -> None:
    # |a - za| = 255 and |b - zb| = 255 at every k: the largest terms, summed over K = 1000 (6.5e7)
    a = np.full((2, 1000), 255, np.uint8)
    b = np.full((1000, 3), -128, np.int8)
    za, zb = np.array(0, np.uint8), np.array(127, np.int8)
    got = build(a, b, za, zb, constant_b=True).create_executor()(a=a)
    np.testing.assert_array_equal(np.asarray(got), matmul_integer_np(a, b, za, zb))


def test_dequantized_product_fuses() -> None:
    rng = np.random.default_rng(7)
    a, b, za, zb = operands(rng, 6, 40, 20, False, True)
    va = relay.var("a", shape=a.shape, dtype="uint8")
    prod = qnn.matmul_integer(va, relay.const(b), relay.const(za), relay.const(zb))
    out = qnn.dequantize(prod, relay.const(np.float32(0.5)), relay.const(np.int32(3)))
    lib = relay.build(relay.IRModule.from_expr(relay.Function([va], out)), target="llvm")
    want = (matmul_integer_np(a, b, za, zb).astype(np.float32) - 3) * np.float32(0.5)
    np.testing.assert_array_equal(np.asarray(lib.create_executor()(a=a)), want)


# -- the code: vpdpbusd where the host has VNNI -------------------------------------------------------------


@needs_vnni
def test_matmul_integer_is_vpdpbusd(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KILN_CACHE", "0")  # compiled here: its assembly is at hand
    rng = np.random.default_rng(1)
    a, b, za, zb = operands(rng, 8, 36, 40, True, True)
    lib = build(a, b, za, zb, constant_b=True)
    (kernel,) = lib.kernels  # b was packed at build time: one kernel, the product
    assert "dot4_u8i8" in kernel.get_source("tir")
    assert "vpdpbusd" in kernel.get_source("asm")
    np.testing.assert_array_equal(np.asarray(lib.create_executor()(a=a)), matmul_integer_np(a, b, za, zb))


def test_other_dtype_pairs_keep_the_int32_products() -> None:
    a = np.random.default_rng(2).integers(-128, 128, (3, 9), dtype=np.int8)
    b = np.random.default_rng(3).integers(0, 256, (9, 5), dtype=np.uint8)
    za, zb = np.array(-3, np.int8), np.array(200, np.uint8)
    va = relay.var("a", shape=a.shape, dtype="int8")
    out = qnn.matmul_integer(va, relay.const(b), relay.const(za), relay.const(zb))
    lib = relay.build(relay.IRModule.from_expr(relay.Function([va], out)), target="llvm")
    assert all("dot4_u8i8" not in k.get_source("tir") for k in lib.kernels)
    want = (a.astype(np.int64) + 3) @ (b.astype(np.int64) - 200)
    np.testing.assert_array_equal(np.asarray(lib.create_executor()(a=a)), want)


# -- the intrinsic ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("vectorize", [False, True])
def test_dot4_intrinsic(monkeypatch: pytest.MonkeyPatch, vectorize: bool) -> None:
    monkeypatch.setenv("KILN_CACHE", "0")
    rng = np.random.default_rng(4)
    x = rng.integers(-2**31, 2**31, 37, dtype=np.int64).astype(np.int32)
    y = rng.integers(-2**31, 2**31, 37, dtype=np.int64).astype(np.int32)
    xt, yt = te.placeholder((37,), "int32", name="x"), te.placeholder((37,), "int32", name="y")
    out = te.compute((37,), lambda i: tx.call("dot4_u8i8", xt[i], yt[i]), name="dot")
    sch = te.create_schedule(out)
    if vectorize:  # not the accumulation that llvm_x86 writes as vpdpbusd: LLVM vectorizes the scalar form
        sch[out].vectorize(sch[out].split(sch[out].op.axis[0], factor=16)[1])
    z = np.zeros(37, np.int32)
    kiln.build(sch, [xt, yt, out])(x, y, z)
    want = (x.view(np.uint8).reshape(37, 4).astype(np.int64) * y.view(np.int8).reshape(37, 4)).sum(axis=1)
    np.testing.assert_array_equal(z, want.astype(np.int32))


def test_dot4_takes_two_int32() -> None:
    with pytest.raises(TIRError, match="dot4_u8i8 takes two int32"):
        tx.call("dot4_u8i8", tx.const(1, "int32"), tx.const(1, "int8"))
    with pytest.raises(TIRError, match="dot4_u8i8 takes two int32"):
        tx.call("dot4_u8i8", tx.const(1, "int32"))
