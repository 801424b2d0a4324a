"""Schedule primitives: each one's effect on the lowered loop IR, with numerics kept equal to numpy."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import pytest
import tir_interp
from te_helpers import RNG, loops, rand, run

import kiln
from kiln import te, tir


def allocs(func: tir.PrimFunc) -> list[tir.Allocate]:
    out: list[tir.Allocate] = []
    stack: list[tir.Stmt] = [func.body]
    while stack:
        s = stack.pop()
        if isinstance(s, tir.Allocate):
            out.append(s)
            stack.append(s.body)
        elif isinstance(s, (tir.For, tir.LetStmt)):
            stack.append(s.body)
        elif isinstance(s, tir.SeqStmt):
            stack.extend(reversed(s.stmts))
        elif isinstance(s, tir.IfThenElse):
            stack.extend(x for x in (s.else_case, s.then_case) if x is not None)
    return out


def nest(func: tir.PrimFunc) -> list[tuple[str, str]]:
    return [(str(f.loop_var), str(f.extent)) for f in loops(func)]


def vector_add(n: int | tir.Var = 16) -> tuple[te.Tensor, te.Tensor, te.Tensor]:
    A = te.placeholder((n,), name="A")
    B = te.placeholder((n,), name="B")
    C = te.compute((n,), lambda i: A[i] + B[i], name="C")
    return A, B, C


def matmul(n: int = 16, m: int = 12, k: int = 8) -> tuple[te.Tensor, te.Tensor, te.Tensor, te.IterVar]:
    A = te.placeholder((n, k), name="A")
    B = te.placeholder((k, m), name="B")
    kk = te.reduce_axis((0, k), name="k")
    C = te.compute((n, m), lambda i, j: te.sum(A[i, kk] * B[kk, j], axis=kk), name="C")
    return A, B, C, kk


def check_matmul(func: tir.PrimFunc, n: int = 16, m: int = 12, k: int = 8) -> None:
    a, b = rand(n, k), rand(k, m)
    (c,) = run(func, [a, b], [(n, m)])
    np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-5)


def check_add(func: tir.PrimFunc, n: int) -> None:
    a, b = rand(n), rand(n)
    (c,) = run(func, [a, b], [(n,)])
    np.testing.assert_allclose(c, a + b, rtol=1e-6)


# ---------------------------------------------------------------------------
# split, tails, symbolic extents
# ---------------------------------------------------------------------------


def test_split_by_a_dividing_factor_makes_two_loops_without_a_guard() -> None:
    A, B, C = vector_add(16)
    s = te.create_schedule(C)
    _xo, _xi = s[C].split(C.op.axis[0], factor=4)
    func = te.lower(s, [A, B, C])
    assert nest(func) == [("i_outer", "4"), ("i_inner", "4")]
    assert "if " not in str(func)
    assert "C[i_outer * 4 + i_inner]" in str(func)
    check_add(func, 16)


def test_split_with_a_tail_guards_the_body() -> None:
    A, B, C = vector_add(10)
    s = te.create_schedule(C)
    s[C].split(C.op.axis[0], factor=4)
    func = te.lower(s, [A, B, C])
    assert nest(func) == [("i_outer", "3"), ("i_inner", "4")]
    assert "if i_outer * 4 + i_inner < 10:" in str(func)
    check_add(func, 10)


def test_split_by_nparts_fixes_the_outer_extent() -> None:
    A, B, C = vector_add(10)
    s = te.create_schedule(C)
    s[C].split(C.op.axis[0], nparts=3)
    func = te.lower(s, [A, B, C])
    assert nest(func) == [("i_outer", "3"), ("i_inner", "4")]
    check_add(func, 10)


def test_split_of_a_symbolic_extent_rounds_up_and_guards() -> None:
    n = te.var("n")
    A, B, C = vector_add(n)
    s = te.create_schedule(C)
    s[C].split(C.op.axis[0], factor=16)
    func = te.lower(s, [A, B, C])
    assert nest(func)[0] == ("i_outer", "(n + 15) // 16")
    assert "if i_outer * 16 + i_inner < n:" in str(func)
    for size in (5, 16, 33):
        check_add(func, size)


def test_split_needs_a_positive_int_factor_and_exactly_one_of_factor_nparts() -> None:
    _A, _B, C = vector_add(8)
    s = te.create_schedule(C)
    with pytest.raises(te.ScheduleError, match="positive int"):
        s[C].split(C.op.axis[0], factor=0)
    with pytest.raises(te.ScheduleError, match="exactly one of factor, nparts"):
        s[C].split(C.op.axis[0], factor=2, nparts=2)


# ---------------------------------------------------------------------------
# reorder, tile, fuse
# ---------------------------------------------------------------------------


def test_reorder_swaps_the_loop_nest() -> None:
    A = te.placeholder((3, 4), name="A")
    B = te.compute((3, 4), lambda i, j: A[i, j] * 2.0, name="B")
    s = te.create_schedule(B)
    i, j = B.op.axis
    s[B].reorder(j, i)
    func = te.lower(s, [A, B])
    assert nest(func) == [("j", "4"), ("i", "3")]
    a = rand(3, 4)
    (b,) = run(func, [a], [(3, 4)])
    np.testing.assert_allclose(b, a * 2)


def test_tile_orders_outer_outer_inner_inner() -> None:
    A, B, C, _ = matmul()
    s = te.create_schedule(C)
    i, j = C.op.axis
    s[C].tile(i, j, 4, 5)
    func = te.lower(s, [A, B, C])
    assert [v for v, _ in nest(func)][:4] == ["i_outer", "j_outer", "i_inner", "j_inner"]
    assert "if j_outer * 5 + j_inner < 12:" in str(func)
    check_matmul(func)


def test_fuse_then_split_covers_every_element_once() -> None:
    A = te.placeholder((5, 6), name="A")
    B = te.compute((5, 6), lambda i, j: A[i, j] + 1.0, name="B")
    s = te.create_schedule(B)
    fused = s[B].fuse(*B.op.axis)
    assert fused.name == "i_j_fused"
    _fo, _fi = s[B].split(fused, factor=8)
    func = te.lower(s, [A, B])
    assert nest(func) == [("i_j_fused_outer", "4"), ("i_j_fused_inner", "8")]
    text = str(func)
    assert "// 6" in text and "% 6" in text and "if " in text
    a = rand(5, 6)
    (b,) = run(func, [a], [(5, 6)])
    np.testing.assert_allclose(b, a + 1)


def test_fuse_of_three_axes_makes_one_loop() -> None:
    A = te.placeholder((2, 3, 4), name="A")
    B = te.compute((2, 3, 4), lambda i, j, k: A[i, j, k] * 3.0, name="B")
    s = te.create_schedule(B)
    s[B].fuse(*B.op.axis)
    func = te.lower(s, [A, B])
    assert nest(func) == [("i_j_k_fused", "24")]
    a = rand(2, 3, 4)
    (b,) = run(func, [a], [(2, 3, 4)])
    np.testing.assert_allclose(b, a * 3, rtol=1e-6)


def test_fuse_of_no_axes_makes_an_outermost_loop_of_one_that_a_gpu_thread_can_run() -> None:
    A = te.placeholder((5, 4), name="A")
    k, r = te.reduce_axis((0, 5), name="k"), te.reduce_axis((0, 4), name="r")
    total = te.compute((), lambda: te.sum(A[k, r], axis=[k, r]), name="total")
    s = te.create_schedule(total)
    single = s[total].fuse()
    assert s[total].leaf_iter_vars[0] is single
    func = te.lower(s, [A, total])
    assert nest(func)[0] == ("singleton", "1")
    a = rand(5, 4)
    (b,) = run(func, [a], [()])
    np.testing.assert_allclose(b, a.sum(), rtol=1e-5)
    s = te.create_schedule(total)
    s[total].bind(s[total].fuse(), te.thread_axis("threadIdx.x"))
    (loop, *_) = loops(te.lower(s, [A, total]))
    assert (loop.kind, loop.thread_tag, str(loop.extent)) == (tir.ForKind.THREAD_BINDING, "threadIdx.x", "1")


def test_fuse_of_non_adjacent_axes_is_an_error() -> None:
    A = te.placeholder((2, 3, 4), name="A")
    B = te.compute((2, 3, 4), lambda i, j, k: A[i, j, k], name="B")
    s = te.create_schedule(B)
    i, _, k = B.op.axis
    with pytest.raises(te.ScheduleError, match="fuse on stage 'B'.*adjacent"):
        s[B].fuse(i, k)


def test_reduction_init_lands_before_the_first_reduction_loop_after_reorder() -> None:
    A, B, C, k = matmul(6, 5, 4)
    s = te.create_schedule(C)
    i, j = C.op.axis
    s[C].reorder(i, k, j)
    func = te.lower(s, [A, B, C])
    text = str(func)
    # for i: (for j: C = 0); for k: for j: C += ...
    assert [v for v, _ in nest(func)] == ["i", "j", "k", "j"]
    assert text.index("= 0.0") < text.index("for k in")
    check_matmul(func, 6, 5, 4)


def test_reduction_axis_outermost_inits_the_whole_output_first() -> None:
    A, B, C, k = matmul(6, 5, 4)
    s = te.create_schedule(C)
    i, j = C.op.axis
    s[C].reorder(k, i, j)
    func = te.lower(s, [A, B, C])
    assert [v for v, _ in nest(func)] == ["i", "j", "k", "i", "j"]
    check_matmul(func, 6, 5, 4)


def test_split_reduction_axis_with_tail_guards_only_the_update() -> None:
    A, B, C, k = matmul(4, 4, 7)
    s = te.create_schedule(C)
    s[C].split(k, factor=3)
    func = te.lower(s, [A, B, C])
    assert "if k_outer * 3 + k_inner < 7:" in str(func)
    check_matmul(func, 4, 4, 7)


# ---------------------------------------------------------------------------
# loop kinds and annotations
# ---------------------------------------------------------------------------


def test_vectorize_parallel_unroll_set_loop_kinds() -> None:
    A = te.placeholder((4, 6, 8), name="A")
    B = te.compute((4, 6, 8), lambda i, j, k: A[i, j, k] + 1.0, name="B")
    s = te.create_schedule(B)
    i, j, k = B.op.axis
    s[B].parallel(i)
    s[B].unroll(j)
    s[B].vectorize(k)
    func = te.lower(s, [A, B])
    assert [f.kind for f in loops(func)] == [tir.ForKind.PARALLEL, tir.ForKind.UNROLLED, tir.ForKind.VECTORIZED]
    assert "# vectorized" in str(func)
    a = rand(4, 6, 8)
    (b,) = run(func, [a], [(4, 6, 8)])
    np.testing.assert_allclose(b, a + 1)


def test_vectorize_or_parallel_of_a_reduction_axis_is_an_error() -> None:
    _, _, C, k = matmul()
    s = te.create_schedule(C)
    with pytest.raises(te.ScheduleError, match="vectorize on stage 'C': axis 'k' is a reduction axis"):
        s[C].vectorize(k)
    with pytest.raises(te.ScheduleError, match="parallel on stage 'C': axis 'k'"):
        s[C].parallel(k)


def test_bind_makes_thread_binding_loops() -> None:
    A, B, C = vector_add(256)
    s = te.create_schedule(C)
    bx, tx = s[C].split(C.op.axis[0], factor=64)
    s[C].bind(bx, te.thread_axis("blockIdx.x"))
    s[C].bind(tx, te.thread_axis("threadIdx.x"))
    func = te.lower(s, [A, B, C])
    fors = loops(func)
    assert [(f.kind, f.thread_tag, str(f.extent)) for f in fors] == [
        (tir.ForKind.THREAD_BINDING, "blockIdx.x", "4"),
        (tir.ForKind.THREAD_BINDING, "threadIdx.x", "64"),
    ]
    assert "bound to threadIdx.x" in str(func)
    check_add(func, 256)


def test_a_reduction_axis_binds_to_threadidx_x_only() -> None:
    _, _, C, k = matmul()
    s = te.create_schedule(C)
    ko, ki = s[C].split(k, factor=4)
    s[C].bind(ki, te.thread_axis("threadIdx.x"))  # a reduction across the threads of a warp
    assert s[C].iter_attrs[ki].kind is tir.ForKind.THREAD_BINDING
    for tag in ("threadIdx.y", "blockIdx.x"):
        with pytest.raises(te.ScheduleError, match=f"reduction axis 'k_outer' can be bound to threadIdx.x only.*{tag}"):
            s[C].bind(ko, te.thread_axis(tag))


def test_bind_needs_a_thread_axis() -> None:
    _A, _B, C = vector_add(8)
    s = te.create_schedule(C)
    with pytest.raises(te.ScheduleError, match="thread_axis"):
        s[C].bind(C.op.axis[0], C.op.axis[0])


def test_pragma_becomes_a_loop_annotation() -> None:
    A, B, C = vector_add(8)
    s = te.create_schedule(C)
    s[C].pragma(C.op.axis[0], "auto_unroll_max_step", 16)
    func = te.lower(s, [A, B, C])
    assert dict(loops(func)[0].annotations) == {"auto_unroll_max_step": 16}


def test_prefetch_reads_the_next_chunks_lines_at_the_top_of_the_loop() -> None:
    A, B, C = vector_add(1000)
    s = te.create_schedule(C)
    xo, xi = s[C].split(C.op.axis[0], factor=64)
    s[C].vectorize(xi)
    s[C].prefetch(A, xo, offset=2)
    func = te.lower(s, [A, B, C])
    assert nest(func) == [("i_outer", "16"), ("pf0", "4"), ("i_inner", "64")]
    assert "prefetch<int32>(A[i_outer * 64 + pf0 * 16 + 128])" in str(func)  # 16 float32 per 64-byte line
    check_add(func, 1000)
    a, b, c = rand(1000), rand(1000), np.zeros(1000, np.float32)
    kiln.build(func)(a, b, c)  # the last chunks prefetch past the end of A: not an out-of-bounds read
    np.testing.assert_allclose(c, a + b, rtol=1e-6)


def test_prefetch_of_a_2d_tile_covers_its_rows() -> None:
    A, B, C, _ = matmul(16, 12, 8)
    s = te.create_schedule(C)
    io, _, _, _ = s[C].tile(*C.op.axis, 4, 6)
    s[C].prefetch(A, io)
    func = te.lower(s, [A, B, C])
    assert "prefetch<int32>(A[i_outer * 4 + pf0 + 4, pf1 * 16])" in str(func)
    assert ("pf0", "4") in nest(func) and ("pf1", "1") in nest(func)
    check_matmul(func, 16, 12, 8)


def test_prefetch_errors_name_the_stage_tensor_and_axis() -> None:
    A, B, C = vector_add(64)
    D = te.placeholder((64,), name="D")
    s = te.create_schedule(C)
    xo, xi = s[C].split(C.op.axis[0], factor=16)
    with pytest.raises(te.ScheduleError, match="does not read tensor 'D'"):
        s[C].prefetch(D, xo)
    with pytest.raises(te.ScheduleError, match="offset must be an int >= 1"):
        s[C].prefetch(A, xo, offset=0)
    s[C].prefetch(A, xi)
    s[C].vectorize(xi)
    with pytest.raises(te.ScheduleError, match="of .A. at axis .i_inner. of stage .C.: the axis is vectorized"):
        te.lower(s, [A, B, C])


# ---------------------------------------------------------------------------
# compute_at, compute_inline, caches
# ---------------------------------------------------------------------------


def test_compute_at_computes_the_producer_per_consumer_tile() -> None:
    A = te.placeholder((16,), name="A")
    B = te.compute((16,), lambda i: A[i] * 2.0, name="B")
    C = te.compute((16,), lambda i: B[i] + 1.0, name="C")
    s = te.create_schedule(C)
    xo, _xi = s[C].split(C.op.axis[0], factor=4)
    s[B].compute_at(s[C], xo)
    func = te.lower(s, [A, C])
    (alloc,) = allocs(func)
    assert alloc.buffer.name == "B" and [str(d) for d in alloc.buffer.shape] == ["4"]
    assert [v for v, _ in nest(func)] == ["i_outer", "i", "i_inner"]
    text = str(func)
    assert "B[i] = A[i_outer * 4 + i] * 2.0" in text
    assert "C[i_outer * 4 + i_inner] = B[i_inner] + 1.0" in text
    a = rand(16)
    (c,) = run(func, [a], [(16,)])
    np.testing.assert_allclose(c, a * 2 + 1, rtol=1e-6)


def test_compute_at_of_a_stencil_computes_the_halo() -> None:
    A = te.placeholder((17,), name="A")
    B = te.compute((17,), lambda i: A[i] * 2.0, name="B")
    C = te.compute((16,), lambda i: B[i] + B[i + 1], name="C")
    s = te.create_schedule(C)
    xo, _ = s[C].split(C.op.axis[0], factor=4)
    s[B].compute_at(s[C], xo)
    func = te.lower(s, [A, C])
    (alloc,) = allocs(func)
    assert [str(d) for d in alloc.buffer.shape] == ["5"]
    assert "if " not in str(func)  # the halo stays inside A: no guard needed
    a = rand(17)
    (c,) = run(func, [a], [(16,)])
    np.testing.assert_allclose(c, 2 * a[:-1] + 2 * a[1:], rtol=1e-6)


def test_compute_at_with_a_tail_guards_the_producer_at_the_tensor_edge() -> None:
    A = te.placeholder((11,), name="A")
    B = te.compute((11,), lambda i: A[i] * 2.0, name="B")
    C = te.compute((10,), lambda i: B[i] + B[i + 1], name="C")
    s = te.create_schedule(C)
    xo, _ = s[C].split(C.op.axis[0], factor=4)
    s[B].compute_at(s[C], xo)
    func = te.lower(s, [A, C])
    assert "i_outer * 4 + i < 11" in str(func)
    a = rand(11)
    (c,) = run(func, [a], [(10,)])
    np.testing.assert_allclose(c, 2 * a[:-1] + 2 * a[1:], rtol=1e-6)


def test_compute_at_of_a_conv_like_producer_covers_tile_plus_kernel() -> None:
    A = te.placeholder((20,), name="A")
    W = te.placeholder((3,), name="W")
    P = te.compute((20,), lambda i: A[i] + 1.0, name="P")
    r = te.reduce_axis((0, 3), name="r")
    C = te.compute((18,), lambda i: te.sum(P[i + r] * W[r], axis=r), name="C")
    s = te.create_schedule(C)
    xo, _xi = s[C].split(C.op.axis[0], factor=6)
    s[P].compute_at(s[C], xo)
    func = te.lower(s, [A, W, C])
    (alloc,) = allocs(func)
    assert [str(d) for d in alloc.buffer.shape] == ["8"]  # 6 outputs + 3 taps - 1
    a, w = rand(20), rand(3)
    (c,) = run(func, [a, w], [(18,)])
    ref = np.convolve(a + 1, w[::-1], mode="valid")
    np.testing.assert_allclose(c, ref, rtol=1e-5, atol=1e-6)


def test_compute_at_2d_tiles_and_a_chain_of_two_producers() -> None:
    A = te.placeholder((8, 8), name="A")
    B = te.compute((8, 8), lambda i, j: A[i, j] + 1.0, name="B")
    D = te.compute((8, 8), lambda i, j: B[i, j] * 2.0, name="D")
    C = te.compute((8, 8), lambda i, j: D[i, j] - 3.0, name="C")
    s = te.create_schedule(C)
    _xo, yo, _xi, _yi = s[C].tile(*C.op.axis, 4, 2)
    s[D].compute_at(s[C], yo)
    s[B].compute_at(s[D], s[D].op.axis[0])
    func = te.lower(s, [A, C])
    shapes = {a.buffer.name: [str(d) for d in a.buffer.shape] for a in allocs(func)}
    assert shapes == {"D": ["4", "2"], "B": ["1", "2"]}
    a = rand(8, 8)
    (c,) = run(func, [a], [(8, 8)])
    np.testing.assert_allclose(c, (a + 1) * 2 - 3, rtol=1e-6)


def test_compute_at_into_a_stage_that_does_not_consume_it_is_an_error() -> None:
    A = te.placeholder((4,), name="A")
    B = te.compute((4,), lambda i: A[i] + 1.0, name="B")
    C = te.compute((4,), lambda i: A[i] * 2.0, name="C")
    s = te.create_schedule([B, C])
    with pytest.raises(te.ScheduleError, match="stage 'C' does not consume 'B'"):
        s[B].compute_at(s[C], C.op.axis[0])


def test_compute_at_when_another_reader_is_outside_the_loop_is_an_error() -> None:
    A = te.placeholder((8,), name="A")
    B = te.compute((8,), lambda i: A[i] + 1.0, name="B")
    C = te.compute((8,), lambda i: B[i] * 2.0, name="C")
    D = te.compute((8,), lambda i: B[i] + C[i], name="D")
    s = te.create_schedule(D)
    s[B].compute_at(s[C], C.op.axis[0])
    with pytest.raises(te.ScheduleError, match="stage 'D' reads it outside that loop"):
        te.lower(s, [A, D])


def test_compute_inline_substitutes_the_expression_and_drops_the_buffer() -> None:
    A = te.placeholder((6,), name="A")
    B = te.compute((6,), lambda i: A[i] * 2.0, name="B")
    C = te.compute((6,), lambda i: B[i] + B[5 - i], name="C")
    s = te.create_schedule(C)
    s[B].compute_inline()
    func = te.lower(s, [A, C])
    assert not allocs(func)
    assert "A[i] * 2.0 + A[5 - i] * 2.0" in str(func)
    a = rand(6)
    (c,) = run(func, [a], [(6,)])
    np.testing.assert_allclose(c, 2 * a + 2 * a[::-1], rtol=1e-6)


def inlined_chain(n: int, step: Callable[[te.Tensor, int], te.Tensor]) -> tuple[te.Schedule, te.Tensor, te.Tensor]:
    """A placeholder, then `n` stages each made by `step(previous, k)`; all but the last inlined."""
    A = te.placeholder((8,), name="A")
    stages = [A]
    for k in range(n):
        stages.append(step(stages[-1], k))
    s = te.create_schedule(stages[-1])
    for t in stages[1:-1]:
        s[t].compute_inline()
    return s, A, stages[-1]


def only_store(func: tir.PrimFunc) -> tir.BufferStore:
    (loop,) = loops(func)
    assert isinstance(loop.body, tir.BufferStore)
    return loop.body


def let_chain(func: tir.PrimFunc) -> tuple[list[tuple[tir.Var, tir.PrimExpr]], tir.BufferStore]:
    """The lets around the one store inside the one loop of `func`, outermost first, and the store."""
    (loop,) = loops(func)
    lets: list[tuple[tir.Var, tir.PrimExpr]] = []
    s = loop.body
    while isinstance(s, tir.LetStmt):
        lets.append((s.var, s.value))
        s = s.body
    assert isinstance(s, tir.BufferStore)
    return lets, s


def added_constants(exprs: list[tir.PrimExpr]) -> list[tir.Add]:
    """The `x + constant` nodes under `exprs`."""
    out: list[tir.Add] = []
    for e in exprs:
        tir.post_order_visit(e, lambda n: out.append(n) if isinstance(n, tir.Add) and isinstance(n.b, tir.FloatImm)
                             else None)
    return out


def test_a_2000_stage_inlined_chain_lowers_to_one_loop_without_deep_recursion() -> None:
    # 2,000 stages nest 2,000 deep: lowering must expand them from a work list, each stage once
    # (substituting each expansion into the next was quadratic and recursed once per stage)
    def step(x: te.Tensor, k: int) -> te.Tensor:
        return te.compute((8,), lambda i: x[i] + float(k), name=f"s{k}")

    n = 2000
    s, A, out = inlined_chain(n, step)
    start = time.perf_counter()
    func = te.lower(s, [A, out])
    assert time.perf_counter() - start < 30  # a hang guard, not a benchmark: it takes well under a second
    assert not allocs(func)
    # ((A[i] + 0.0) + 1.0) + ... + 1999.0, cut into lets of bounded height (walks recurse per level)
    lets, store = let_chain(func)
    assert 2000 // tir.share.MAX_HEIGHT <= len(lets) <= 2000
    added = [e.b.value for e in added_constants([*(v for _, v in lets), store.value])]
    assert sorted(added) == list(range(n))
    a = rand(8)
    (got,) = run(func, [a], [(8,)])
    np.testing.assert_allclose(got, a + sum(range(n)), rtol=1e-5)
    small_s, small_a, small_out = inlined_chain(5, step)
    a = rand(8)
    (got,) = run(te.lower(small_s, [small_a, small_out]), [a], [(8,)])
    np.testing.assert_allclose(got, a + 10.0, rtol=1e-6)


def test_inlining_a_stage_read_twice_shares_its_expression_instead_of_copying_it() -> None:
    # each stage reads the one before three times: unshared, 40 stages would be a tree of 3**40 nodes
    def step(x: te.Tensor, k: int) -> te.Tensor:
        return te.compute((8,), lambda i: x[i] * x[i] + x[i], name=f"d{k}")

    s, A, out = inlined_chain(40, step)
    func = te.lower(s, [A, out])
    # the previous stage's value is computed once, as a let, and read three times
    lets, store = let_chain(func)
    assert len(lets) == 39
    for (prev, _), (_, value) in zip(lets, [*lets[1:], (None, store.value)], strict=True):
        assert isinstance(value, tir.Add) and isinstance(value.a, tir.Mul)
        assert value.a.a is value.a.b is value.b is prev
    assert len(str(func)) < 40 * 60
    small_s, small_a, small_out = inlined_chain(3, step)
    a = RNG.uniform(0, 1, 8).astype("float32")  # no cancellation in x * x + x
    want = a
    for _ in range(3):
        want = want * want + want
    (got,) = run(te.lower(small_s, [small_a, small_out]), [a], [(8,)])
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_compute_inline_of_a_reduction_is_an_error() -> None:
    _, _, C, _ = matmul()
    D = te.compute(C.shape, lambda i, j: C[i, j] + 1.0, name="D")
    s = te.create_schedule(D)
    with pytest.raises(te.ScheduleError, match="compute_inline on stage 'C': a reduction cannot be inlined"):
        s[C].compute_inline()


def test_cache_read_copies_into_local_per_reduction_tile() -> None:
    A, B, C, k = matmul(8, 8, 8)
    s = te.create_schedule(C)
    AL = s.cache_read(A, "local", [C])
    i, j = C.op.axis
    xo, yo, xi, yi = s[C].tile(i, j, 4, 4)
    ko, ki = s[C].split(k, factor=2)
    s[C].reorder(xo, yo, ko, xi, ki, yi)
    s[AL].compute_at(s[C], ko)
    func = te.lower(s, [A, B, C])
    (alloc,) = allocs(func)
    assert alloc.buffer.name == "A_local" and alloc.buffer.scope == "local"
    assert [str(d) for d in alloc.buffer.shape] == ["4", "2"]
    check_matmul(func, 8, 8, 8)


def test_storage_align_pads_the_row_stride_of_a_cached_tile() -> None:
    A, B, C, k = matmul(8, 8, 8)
    s = te.create_schedule(C)
    AL = s.cache_read(A, "local", [C])
    xo, yo, xi, yi = s[C].tile(*C.op.axis, 4, 4)
    ko, ki = s[C].split(k, factor=4)
    s[C].reorder(xo, yo, ko, xi, ki, yi)
    s[AL].compute_at(s[C], ko)
    s[AL].storage_align(AL.op.axis[0], 16, 8)  # rows of 4 laid 8 apart: the next value = 8 (mod 16)
    func = te.lower(s, [A, B, C])
    (alloc,) = allocs(func)
    assert [str(d) for d in alloc.buffer.shape] == ["4", "8"]
    check_matmul(func, 8, 8, 8)  # the padding is never read
    with pytest.raises(te.ScheduleError, match="not the second-to-last axis"):
        s[AL].storage_align(AL.op.axis[1], 16, 8)
    with pytest.raises(te.ScheduleError, match="needs 0 <= offset < factor"):
        s[AL].storage_align(AL.op.axis[0], 8, 8)
    with pytest.raises(te.ScheduleError, match="an output's layout is the caller's"):
        s[C].storage_align(C.op.axis[0], 16, 8)


def test_cache_read_of_a_tensor_the_reader_does_not_read_is_an_error() -> None:
    _A, _B, C = vector_add(4)
    D = te.placeholder((4,), name="D")
    s = te.create_schedule(C)
    with pytest.raises(te.ScheduleError, match="stage 'C' does not read it"):
        s.cache_read(D, "local", [C])


def test_matmul_tiled_vectorized_parallel_with_cache_write() -> None:
    A, B, C, _k = matmul(16, 12, 8)
    s = te.create_schedule(C)
    CL = s.cache_write(C, "local")
    i, j = s[C].op.axis
    xo, yo, _xi, yi = s[C].tile(i, j, 4, 4)
    s[C].parallel(xo)
    s[C].vectorize(yi)
    s[CL].compute_at(s[C], yo)
    ci, cj = s[CL].op.axis
    (ck,) = s[CL].op.reduce_axis
    ko, ki = s[CL].split(ck, factor=4)
    s[CL].reorder(ko, ci, ki, cj)
    s[CL].vectorize(cj)
    func = te.lower(s, [A, B, C], name="mm")
    (alloc,) = allocs(func)
    assert alloc.buffer.name == "C_local" and alloc.buffer.scope == "local"
    assert [str(d) for d in alloc.buffer.shape] == ["4", "4"]
    kinds = [f.kind for f in loops(func)]
    assert kinds[0] is tir.ForKind.PARALLEL and tir.ForKind.VECTORIZED in kinds
    check_matmul(func, 16, 12, 8)


def test_axes_of_the_op_replaced_by_cache_write_are_rejected_with_a_hint() -> None:
    _A, _B, C, _ = matmul()
    s = te.create_schedule(C)
    s.cache_write(C, "local")
    with pytest.raises(te.ScheduleError, match=r"split on stage 'C': axis 'i' belongs to the op that a cache"):
        s[C].split(C.op.axis[0], factor=2)


def test_cache_write_after_scheduling_is_an_error() -> None:
    _A, _B, C = vector_add(8)
    s = te.create_schedule(C)
    s[C].split(C.op.axis[0], factor=2)
    with pytest.raises(te.ScheduleError, match="before scheduling stage 'C'"):
        s.cache_write(C, "local")


# ---------------------------------------------------------------------------
# misuse
# ---------------------------------------------------------------------------


def test_split_of_an_axis_not_in_the_stage_names_stage_and_axis() -> None:
    _A, _B, C = vector_add(8)
    D = te.compute((8,), lambda q: C[q] * 2.0, name="D")
    s = te.create_schedule(D)
    with pytest.raises(te.ScheduleError, match="split on stage 'C': axis 'q' is not an axis of this stage"):
        s[C].split(D.op.axis[0], factor=2)


def test_split_of_an_axis_already_split_says_so() -> None:
    _A, _B, C = vector_add(8)
    s = te.create_schedule(C)
    i = C.op.axis[0]
    s[C].split(i, factor=2)
    with pytest.raises(te.ScheduleError, match="axis 'i' was already split or fused away"):
        s[C].split(i, factor=2)


def test_reorder_of_an_unknown_axis_is_an_error() -> None:
    A = te.placeholder((3, 4), name="A")
    B = te.compute((3, 4), lambda i, j: A[i, j], name="B")
    s = te.create_schedule(B)
    stray = te.reduce_axis((0, 2), name="stray")
    with pytest.raises(te.ScheduleError, match="reorder on stage 'B': axis 'stray'.*leaf axes: i, j"):
        s[B].reorder(stray, B.op.axis[0])


def test_stage_of_a_placeholder_is_an_error() -> None:
    A, _, C = vector_add(4)
    s = te.create_schedule(C)
    with pytest.raises(te.ScheduleError, match="'A' is a placeholder"):
        s[A]


def test_inlining_an_output_is_an_error() -> None:
    _, _, C = vector_add(4)
    s = te.create_schedule(C)
    with pytest.raises(te.ScheduleError, match="output"):
        s[C].compute_inline()


def test_interpreter_catches_out_of_bounds_reads() -> None:
    A = te.placeholder((4,), name="A")
    B = te.compute((4,), lambda i: A[i + 1], name="B")
    func = te.lower(te.create_schedule(B), [A, B])
    with pytest.raises(IndexError):
        tir_interp.run(func, rand(4), np.zeros(4, "float32"))


def test_compute_at_with_symbolic_sizes_keeps_a_constant_tile_and_guards_the_edge() -> None:
    n = te.var("n")
    A = te.placeholder((n + 1,), name="A")
    B = te.compute((n + 1,), lambda i: A[i] * 2.0, name="B")
    C = te.compute((n,), lambda i: B[i] + B[i + 1], name="C")
    s = te.create_schedule(C)
    xo, _ = s[C].split(C.op.axis[0], factor=4)
    s[B].compute_at(s[C], xo)
    func = te.lower(s, [A, C])
    (alloc,) = allocs(func)
    assert [str(d) for d in alloc.buffer.shape] == ["5"]
    assert "i_outer * 4 + i < n + 1" in str(func)
    for size in (1, 4, 9):
        a = rand(size + 1)
        (c,) = run(func, [a], [(size,)])
        np.testing.assert_allclose(c, 2 * a[:-1] + 2 * a[1:], rtol=1e-6)


def test_compute_at_through_an_inlined_reader() -> None:
    A = te.placeholder((12,), name="A")
    P = te.compute((12,), lambda i: A[i] + 1.0, name="P")
    Q = te.compute((12,), lambda i: P[i] * P[i], name="Q")
    R = te.compute((10,), lambda i: Q[i] + Q[i + 2], name="R")
    s = te.create_schedule(R)
    s[Q].compute_inline()
    xo, _ = s[R].split(R.op.axis[0], factor=3)
    s[P].compute_at(s[R], xo)
    func = te.lower(s, [A, R])
    assert [a.buffer.name for a in allocs(func)] == ["P"]
    a = rand(12)
    (r,) = run(func, [a], [(10,)])
    p = (a + 1) ** 2
    np.testing.assert_allclose(r, p[:-2] + p[2:], rtol=1e-5)
