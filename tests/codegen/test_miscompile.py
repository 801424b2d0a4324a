"""Compiled reshape/transpose/reshape chains against numpy: index arithmetic that LLVM once miscompiled.

`reshape(transpose(reshape(x, (2, 5, 4, 3)), (0, 2, 1, 3)), (2, 2, 10, 3))` came out wrong at 30 of 120
elements: LLVM 22.1's SLP vectorizer bundled an `add nuw x, 3` with `sub nuw` lanes as `sub nuw x, -3`
(poison) in the unrolled index arithmetic of the loop's remainders (llvm/llvm-project#209023). The
LLVM back end now marks kernels that divide a loop variable, and they are optimized without SLP.

`exp(d)[:, 0] * zeros + k[:, 0] * v[:, 0]` (reshaped to (2, 4, 8, 1) and (2, 4, 1, 8)), ONNX's gated
LinearAttention, came out wrong at half its elements: LLVM 22.1's loop vectorizer reads
`v[(j & 7) | base]` (InstCombine's form of `v[base + j % 8]`) as consecutive over all 16 lanes, so lanes
8 to 15 read `v[base + 8 ...]`. Only loops too big to unroll first (the exp) reach it. Vectorized loops that
divide their variable by 2^k now get at most 2^k lanes and no interleaving (`llvm_lanes.lane_period`).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from kiln import relay, te, tir
from kiln.codegen import llvm_lanes, llvm_process
from kiln.codegen.llvm import CodeGenLLVM, emit_llvm_ir
from kiln.ir import graph
from kiln.target import Target
from kiln.tir.functor import children


@pytest.fixture(autouse=True)
def _no_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KILN_CACHE", "0")


def _chain(s0, s1, perm, s2):
    """Builds reshape(transpose(reshape(x, s1), perm), s2) for llvm and runs it on an arange."""
    x = relay.var("x", relay.TensorType(s0, "float32"))
    body = relay.reshape(relay.transpose(relay.reshape(x, s1), perm), s2)
    mod = relay.transform.InferType()(relay.IRModule.from_expr(relay.Function([x], body)))
    a = np.arange(math.prod(s0), dtype=np.float32).reshape(s0)
    got = np.asarray(relay.build(mod, target="llvm").create_executor()(x=a))
    return got, a.reshape(s1).transpose(perm).reshape(s2)


@pytest.mark.parametrize(("s0", "s1", "s2"), [
    ((2, 5, 12), (2, 5, 4, 3), (2, 2, 10, 3)),
    ((2, 20, 3), (2, 5, 4, 3), (2, 2, 10, 3)),
    ((2, 5, 4, 3), (2, 5, 4, 3), (2, 2, 10, 3)),
    ((3, 5, 12), (3, 5, 4, 3), (3, 2, 10, 3)),
])
def test_reported_chain_matches_numpy(s0, s1, s2):
    got, want = _chain(s0, s1, (0, 2, 1, 3), s2)
    np.testing.assert_array_equal(got, want)


_GRID = [
    ((2, 5, 12), (2, 5, 4, 3), (0, 2, 1, 3), (2, 4, 5, 3)),
    ((2, 5, 6), (2, 5, 2, 3), (0, 2, 1, 3), (2, 10, 3)),
    ((3, 35), (3, 5, 7), (0, 2, 1), (3, 7, 5)),
    ((3, 35), (3, 5, 7), (2, 0, 1), (7, 15)),
    ((105,), (3, 5, 7), (1, 2, 0), (5, 21)),
    ((5, 7, 3), (5, 7, 3), (2, 1, 0), (3, 35)),
    ((2, 3, 35), (2, 3, 5, 7), (0, 3, 1, 2), (2, 7, 15)),
    ((2, 3, 35), (2, 3, 5, 7), (3, 1, 0, 2), (21, 10)),
    ((6, 35), (2, 3, 5, 7), (1, 0, 3, 2), (3, 2, 7, 5)),
    ((7, 5, 9), (7, 5, 3, 3), (0, 2, 1, 3), (7, 3, 15)),
    ((3, 7, 10), (3, 7, 5, 2), (0, 2, 3, 1), (3, 5, 14)),
    ((4, 5, 21), (4, 5, 7, 3), (0, 2, 1, 3), (4, 7, 5, 3)),
]


@pytest.mark.parametrize(("s0", "s1", "perm", "s2"), _GRID)
def test_reshape_transpose_reshape_grid_matches_numpy(s0, s1, perm, s2):
    got, want = _chain(s0, s1, perm, s2)
    np.testing.assert_array_equal(got, want)


def _copy_kernel(div: bool) -> tir.PrimFunc:
    if div:
        a = te.placeholder((6, 5, 7), "float32", name="A")
        b = te.compute((6, 35), lambda i, j: a[i, j % 5, j // 5], name="B")
    else:
        a = te.placeholder((6, 35), "float32", name="A")
        b = te.compute((6, 35), lambda i, j: a[i, j] * 2.0, name="B")
    return te.lower(te.create_schedule(b), [a, b], "copy")


def test_kernels_that_divide_a_loop_variable_are_optimized_without_slp():
    target = Target("llvm")
    assert not llvm_process.wants_slp(emit_llvm_ir(_copy_kernel(div=True), target))
    assert llvm_process.wants_slp(emit_llvm_ir(_copy_kernel(div=False), target))


def _slices(b, t, h, d, c, nonlinear):
    """`nonlinear(x)` of slice 0 of (b, t, h*d), reshaped to (b, h, d, 1), times `x` of (b, h, d, c), plus a slice of
    k reshaped to (b, h, d, 1) times a slice of v reshaped to (b, h, 1, d): the broadcasts of gated LinearAttention."""
    x = relay.var("x", relay.TensorType((b, h, d, c), "float32"))
    dkv = [relay.var(n, relay.TensorType((b, t, h * d), "float32")) for n in "dkv"]

    def sl(e, shape):
        return relay.reshape(relay.strided_slice(e, [0], [1], axes=[1]), shape)

    body = relay.add(relay.multiply(x, sl(nonlinear(dkv[0]), (b, h, d, 1))),
                     relay.multiply(sl(dkv[1], (b, h, d, 1)), sl(dkv[2], (b, h, 1, d))))
    mod = relay.transform.InferType()(relay.IRModule.from_expr(relay.Function([x, *dkv], body)))
    rng = np.random.default_rng(0)
    args = {"x": rng.standard_normal((b, h, d, c)).astype(np.float32),
            **{n: rng.standard_normal((b, t, h * d)).astype(np.float32) for n in "dkv"}}
    got = np.asarray(relay.build(mod, target="llvm").create_executor()(**args))
    first = {n: args[n][:, 0].reshape(b, h, d) for n in "dkv"}
    return got, first, args["x"]


@pytest.mark.parametrize(("b", "t", "h", "d"), [(2, 4, 4, 8), (2, 3, 4, 4), (2, 3, 2, 8)])
def test_masked_lane_broadcast_matches_numpy(b, t, h, d):
    got, f, x = _slices(b, t, h, d, d, relay.exp)
    want = x * np.exp(f["d"])[..., None] + f["k"][..., None] * f["v"][:, :, None, :]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_reported_linear_attention_broadcast_matches_numpy():
    b, t, h, d = 2, 4, 4, 8
    x = relay.var("x", relay.TensorType((b, t, h * d), "float32"))
    kv = [relay.var(n, relay.TensorType((b, t, h * d), "float32")) for n in "kv"]

    def sl(e, shape):
        return relay.reshape(relay.strided_slice(e, [0], [1], axes=[1]), shape)

    zeros = relay.zeros((b, h, d, d), "float32")
    body = relay.add(relay.multiply(zeros, sl(relay.exp(x), (b, h, d, 1))),
                     relay.multiply(sl(kv[0], (b, h, d, 1)), sl(kv[1], (b, h, 1, d))))
    mod = relay.transform.InferType()(relay.IRModule.from_expr(relay.Function([x, *kv], body)))
    rng = np.random.default_rng(0)
    a = {n: rng.standard_normal((b, t, h * d)).astype(np.float32) for n in ("x", "k", "v")}
    got = np.asarray(relay.build(mod, target="llvm").create_executor()(**a))
    want = a["k"][:, 0].reshape(b, h, d, 1) * a["v"][:, 0].reshape(b, h, 1, d)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def _lanes(expr):
    """The lane period of a 32-lane vectorized copy B[i, j] = A[i, expr(j)] of (4, 32) from (4, 64)."""
    a = te.placeholder((4, 64), "float32", name="A")
    b = te.compute((4, 32), lambda i, j: a[i, expr(j)], name="B")
    s = te.create_schedule(b)
    s[b].vectorize(b.op.axis[1])
    loop = next(n for n in _loops(te.lower(s, [a, b], "copy").body) if n.kind is tir.ForKind.VECTORIZED)
    return llvm_lanes.lane_period(loop.body, loop.loop_var)


def _loops(stmt):
    return [n for n in graph.post_order([stmt], children) if isinstance(n, tir.For)]


@pytest.mark.parametrize(("expr", "period"), [
    (lambda j: j, None),
    (lambda j: j % 8, 8),
    (lambda j: j // 4 * 16 + j % 4, 4),
    (lambda j: (j * 2) % 8, 4),
    (lambda j: (j * 8) % 8, None),
    (lambda j: j % 6 + j // 6, None),
    (lambda j: (j // 2 + 3) % 16, 2),
    (lambda j: (j + 5) % 16 + 32 - 32, 16),
])
def test_lane_period_is_the_shortest_wrap_of_a_power_of_two_division(expr, period):
    assert _lanes(expr) == period


def _vector_md(expr):
    a = te.placeholder((4, 64), "float32", name="A")
    b = te.compute((4, 32), lambda i, j: te.exp(a[i, expr(j)]), name="B")
    s = te.create_schedule(b)
    s[b].vectorize(b.op.axis[1])
    text = emit_llvm_ir(te.lower(s, [a, b], "copy"), Target("llvm"))
    width = [int(line.split("i32")[1].strip(" }")) for line in text.splitlines() if "llvm.loop.vectorize.width" in line]
    return width, "llvm.loop.interleave.count" in text


def test_loops_that_mask_their_lane_variable_get_no_more_lanes_than_the_mask():
    lanes = CodeGenLLVM(Target("llvm")).vector_bits // 32  # 4 to 16, by the host's vector registers
    assert _vector_md(lambda j: j % 2 + j // 2 * 8) == ([2], True)
    assert _vector_md(lambda j: j + 1) == ([lanes], False)
