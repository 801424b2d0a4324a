"""te schedules compiled by the LLVM back end (`kiln.build`) and run natively, against numpy."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln import te

build = kiln.build

RNG = np.random.default_rng(7)


def test_tiled_matmul_64_with_cache_write_vectorize_parallel() -> None:
    A = te.placeholder((64, 64), name="A")
    B = te.placeholder((64, 64), name="B")
    k = te.reduce_axis((0, 64), name="k")
    C = te.compute((64, 64), lambda i, j: te.sum(A[i, k] * B[k, j], axis=k), name="C")
    s = te.create_schedule(C)
    CL = s.cache_write(C, "local")
    xo, yo, _, yi = s[C].tile(*s[C].op.axis, 8, 8)
    s[C].parallel(xo)
    s[C].vectorize(yi)
    s[CL].compute_at(s[C], yo)
    ci, cj = s[CL].op.axis
    ko, ki = s[CL].split(s[CL].op.reduce_axis[0], factor=4)
    s[CL].reorder(ko, ci, ki, cj)
    s[CL].vectorize(cj)
    mod = build(te.lower(s, [A, B, C], name="mm64"))
    a, b = RNG.random((64, 64), "float32"), RNG.random((64, 64), "float32")
    c = np.zeros((64, 64), "float32")
    mod(a, b, c)
    np.testing.assert_allclose(c, a @ b, rtol=1e-4)


def test_vectorized_elementwise_with_symbolic_size_and_tail() -> None:
    n = te.var("n")
    X = te.placeholder((n,), name="X")
    Y = te.compute((n,), lambda i: te.exp(X[i]) * 2.0 + 1.0, name="Y")
    s = te.create_schedule(Y)
    outer, inner = s[Y].split(Y.op.axis[0], factor=16)
    s[Y].parallel(outer)
    s[Y].vectorize(inner)
    mod = build(s, [X, Y])
    for size in (5, 16, 100):
        x = RNG.random(size, "float32")
        y = np.zeros(size, "float32")
        mod(x, y)
        np.testing.assert_allclose(y, np.exp(x) * 2 + 1, rtol=1e-5)


def test_row_max_reduction_with_split_reduction_axis() -> None:
    A = te.placeholder((10, 37), name="A")
    k = te.reduce_axis((0, 37), name="k")
    B = te.compute((10,), lambda i: te.max(A[i, k], axis=k), name="B")
    s = te.create_schedule(B)
    s[B].split(k, factor=8)
    mod = build(te.lower(s, [A, B]))
    a = RNG.standard_normal((10, 37)).astype("float32")
    b = np.zeros(10, "float32")
    mod(a, b)
    np.testing.assert_allclose(b, a.max(1))


def test_stencil_with_producer_computed_per_tile() -> None:
    A = te.placeholder((101,), name="A")
    P = te.compute((101,), lambda i: A[i] * 2.0, name="P")
    C = te.compute((100,), lambda i: P[i] + P[i + 1], name="C")
    s = te.create_schedule(C)
    xo, _ = s[C].split(C.op.axis[0], factor=8)
    s[P].compute_at(s[C], xo)
    mod = build(te.lower(s, [A, C]))
    a = RNG.random(101, "float32")
    c = np.zeros(100, "float32")
    mod(a, c)
    np.testing.assert_allclose(c, 2 * a[:-1] + 2 * a[1:], rtol=1e-6)


def test_a_schedule_that_reads_past_a_temporary_is_refused_not_run() -> None:
    from kiln.tir.bounds_check import OutOfBoundsError

    n, panel = 64, 24  # 64 // 24 = 2 panels hold 48 columns, but C reads all 64
    B = te.placeholder((8, n), name="B")
    packed = te.compute((n // panel, 8, panel), lambda x, y, z: B[y, x * panel + z], name="packed")
    C = te.compute((8, n), lambda i, j: packed[j // panel, i, j % panel] * 2.0, name="C")
    s = te.create_schedule(C)
    with pytest.raises(OutOfBoundsError, match="a read of buffer packed at axis 0 reaches indices"):
        build(s, [B, C])
