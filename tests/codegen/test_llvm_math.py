"""Inline float32 math (kiln.codegen.llvm_math) against numpy over the whole float32 range."""

from __future__ import annotations

import math

import numpy as np
import pytest

import kiln
from kiln import tir

_erf = np.vectorize(math.erf, otypes=[np.float64])
REFS = {
    "exp": np.exp,
    "log": np.log,
    "tanh": np.tanh,
    "sigmoid": lambda v: 1 / (1 + np.exp(-v)),
    "erf": _erf,
}
# max ulp for results that are normal floats (the module docstring states the measured values)
MAX_ULP = {"exp": 1.5, "log": 1.5, "tanh": 2.0, "sigmoid": 3.0, "erf": 8.0}
SPECIALS = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 1e-40, -1e-40, 1.17549435e-38,
                     88.72, 88.73, 89.0, -87.3, -103.9, -104.0, -200.0, 3.4e38, -3.4e38, 0.625, -0.625, 4.0, -4.0,
                     9.0, 1.0, -1.0, 0.5], np.float32)


@pytest.fixture(autouse=True)
def _no_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KILN_CACHE", "0")


def _kernel(fn: str, dtype: str = "float32", target: str = "llvm") -> kiln.runtime.module.Module:
    n = tir.Var("n")
    A, B = tir.buffer("A", (n,), dtype), tir.buffer("B", (n,), dtype)
    i = tir.Var("i")
    body = tir.for_range(i, n, tir.BufferStore(B, tir.call(fn, A.load(i)), (i,)), tir.ForKind.VECTORIZED)
    return kiln.build(tir.PrimFunc(f"math_{fn}_{dtype}", [A, B], body), target=target)


@pytest.fixture(scope="module")
def inputs() -> np.ndarray:
    # every 1009th float32 bit pattern (all exponents, both signs, denormals, inf, NaN) plus special values
    bits = np.arange(0, 2**32, 1009, dtype=np.uint64).astype(np.uint32)
    return np.ascontiguousarray(np.concatenate([bits.view(np.float32), SPECIALS]))


def _run(fn: str, x: np.ndarray, dtype: str = "float32", target: str = "llvm") -> np.ndarray:
    y = np.empty_like(x)
    _kernel(fn, dtype, target)(x, y)
    return y


# exp and sigmoid scale by vscalefps (llvm.ldexp) with AVX-512, by exponent bits without it
_TARGETS = [(fn, "llvm") for fn in sorted(REFS)] + [(fn, "llvm -mattr=-avx512f") for fn in ("exp", "sigmoid")]


@pytest.mark.parametrize(("fn", "target"), _TARGETS)
def test_float32_math_accuracy_over_the_whole_range(fn, target, inputs):
    y = _run(fn, inputs, target=target)
    with np.errstate(all="ignore"):
        r = REFS[fn](inputs.astype(np.float64))
        r32 = r.astype(np.float32)
    np.testing.assert_array_equal(np.isnan(y), np.isnan(r32), err_msg="NaN where numpy has none, or none where it has")
    np.testing.assert_array_equal(np.isposinf(y), np.isposinf(r32))
    np.testing.assert_array_equal(np.isneginf(y), np.isneginf(r32))
    fin = np.isfinite(r32)
    normal = fin & (np.abs(r) >= np.finfo(np.float32).tiny)
    ulp = np.abs(y[normal].astype(np.float64) - r[normal]) / np.spacing(np.abs(r32[normal])).astype(np.float64)
    assert ulp.max() <= MAX_ULP[fn], f"{fn}: {ulp.max():.2f} ulp at x={inputs[normal][ulp.argmax()]}"
    tiny = fin & ~normal  # results below the normal range: absolute error
    assert np.all(np.abs(y[tiny].astype(np.float64) - r[tiny]) <= 4e-39)


def _floats_between(lo: float, hi: float) -> np.ndarray:
    """Every float32 in [lo, hi] (lo < hi, both of one sign or lo < 0 < hi)."""
    def bits(v: float) -> int:
        return int(np.array(v, np.float32).view(np.int32))

    def span(a: float, b: float) -> np.ndarray:  # a <= b, both >= 0
        return np.arange(bits(a), bits(b) + 1, dtype=np.int32).view(np.float32)

    if lo >= 0:
        return span(lo, hi)
    if hi <= 0:
        return -span(-hi, -lo)
    return np.concatenate([-span(0.0, -lo), span(0.0, hi)])


# every float32 where exp's arithmetic changes regime: the top of the range (inf from 88.7228 on), where
# results become denormal (-87.34) and then 0 (-103.97), and where n = round(x / ln2) steps (x = ln2/2,
# 3 ln2/2, 40.5 ln2: the reduced argument at either end of [-ln2/2, ln2/2], the polynomial at its worst)
_EXP_WINDOWS = [(88.0, 88.8), (-87.6, -87.0), (-104.5, -102.5), (0.340, 0.354), (-0.354, -0.340),
                (1.03, 1.05), (-1.05, -1.03), (28.05, 28.09), (-28.09, -28.05)]


@pytest.mark.parametrize("target", ["llvm", "llvm -mattr=-avx512f"])
def test_exp_within_one_ulp_where_its_arithmetic_changes_regime(target: str) -> None:
    x = np.concatenate([_floats_between(lo, hi) for lo, hi in _EXP_WINDOWS])
    y = _run("exp", x, target=target)
    with np.errstate(over="ignore"):
        r = np.exp(x.astype(np.float64))
        r32 = r.astype(np.float32)
    np.testing.assert_array_equal(np.isposinf(y), np.isposinf(r32))  # inf exactly where numpy's rounds to inf
    normal = np.isfinite(r32) & (r >= np.finfo(np.float32).tiny)
    ulp = np.abs(y[normal].astype(np.float64) - r[normal]) / np.spacing(r32[normal]).astype(np.float64)
    assert ulp.max() <= 1.0, f"{ulp.max():.2f} ulp at x={x[normal][ulp.argmax()]}"
    tiny = np.isfinite(r32) & ~normal  # denormal results: within a denormal step, and 0 where numpy's round to 0
    assert np.all(np.abs(y[tiny].astype(np.float64) - r[tiny]) <= 1.5 * 2.0**-149)
    assert np.all(y[r32 == 0] == 0)


def test_special_values(inputs):
    x = np.array([0.0, -0.0, -1.0, np.inf, -np.inf, np.nan, 1e-45], np.float32)
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(_run("log", x)[:6], [-np.inf, -np.inf, np.nan, np.inf, np.nan, np.nan])
    assert np.isclose(_run("log", x)[6], np.log(np.float64(x[6])), rtol=1e-6)
    big = np.array([100.0, 89.0, -110.0, -np.inf, np.inf, np.nan], np.float32)
    np.testing.assert_array_equal(_run("exp", big), [np.inf, np.inf, 0.0, 0.0, np.inf, np.nan])
    sat = np.array([20.0, -20.0, np.inf, -np.inf, np.nan], np.float32)
    np.testing.assert_array_equal(_run("tanh", sat), [1, -1, 1, -1, np.nan])
    np.testing.assert_array_equal(_run("erf", sat), [1, -1, 1, -1, np.nan])
    np.testing.assert_array_equal(_run("sigmoid", np.array([200, -200, np.inf, -np.inf, np.nan], np.float32)),
                                  [1, 0, 1, 0, np.nan])
    np.testing.assert_array_equal(_run("exp", np.array([0.0, -0.0], np.float32)), [1.0, 1.0])
    # the last finite result and the first inf, the last denormal (2**-149) and the first 0, NaN of either sign
    edge = np.array([88.72283, 88.72284, -103.97208, -103.972084, -1e30, np.float32(-np.nan)], np.float32)
    with np.errstate(over="ignore"):
        want = np.exp(edge.astype(np.float64)).astype(np.float32)
    assert np.isfinite(want[0]) and np.isinf(want[1]) and want[2] == 2.0**-149 and want[3] == 0
    np.testing.assert_array_equal(_run("exp", edge), want)


@pytest.mark.parametrize("fn", ["sqrt", "rsqrt", "floor", "ceil", "round", "abs", "sin", "cos"])
def test_llvm_intrinsic_math_matches_numpy(fn):
    refs = {"sqrt": np.sqrt, "rsqrt": lambda v: 1 / np.sqrt(v), "floor": np.floor, "ceil": np.ceil,
            "round": np.round, "abs": np.abs, "sin": np.sin, "cos": np.cos}
    x = np.array([0.0, 0.5, 1.5, 2.5, -2.5, 3.7, -3.7, 100.0, np.inf, np.nan, 1e-40], np.float32)
    if fn in ("sqrt", "rsqrt"):
        x = np.abs(x)
    with np.errstate(all="ignore"):
        np.testing.assert_allclose(_run(fn, x), refs[fn](x), rtol=2e-7)


@pytest.mark.parametrize("fn", sorted(REFS))
def test_float64_math_matches_numpy(fn):
    x = np.array([-30.0, -2.5, -0.1, 0.0, 1e-300, 0.7, 3.0, 40.0, np.inf, np.nan], np.float64)
    if fn == "log":
        x = np.abs(x)
    with np.errstate(all="ignore"):
        np.testing.assert_allclose(_run(fn, x, "float64"), REFS[fn](x), rtol=1e-14)


def test_pow_and_fma_and_isnan():
    n = tir.Var("n")
    A, B, C = tir.buffer("A", (n,)), tir.buffer("B", (n,)), tir.buffer("C", (n,), "bool")
    i = tir.Var("i")
    a = A.load(i)
    body = tir.for_range(i, n, tir.seq(
        tir.BufferStore(B, tir.call("pow", a, 2.5) + tir.call("fma", a, a, 1.0), (i,)),
        tir.BufferStore(C, tir.call("isnan", a, dtype="bool"), (i,)),
    ))
    m = kiln.build(tir.PrimFunc("powfma", [A, B, C], body))
    x = np.array([0.5, 2.0, 3.0, np.nan], np.float32)
    b, c = np.zeros_like(x), np.zeros(4, np.bool_)
    m(x, b, c)
    np.testing.assert_allclose(b, x**2.5 + x * x + 1, rtol=1e-6)
    np.testing.assert_array_equal(c, np.isnan(x))
