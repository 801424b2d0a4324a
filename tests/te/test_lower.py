"""Tensor expressions and their default lowering: the loop IR they make, and its numerics against numpy."""

from __future__ import annotations

import re

import numpy as np
import pytest
import tir_interp
from te_helpers import loops, rand, run

from kiln import te, tir
from kiln.errors import KilnError
from kiln.tir import allreduce

# ---------------------------------------------------------------------------
# Building tensors
# ---------------------------------------------------------------------------


def test_tensors_know_shape_dtype_op_and_axis_names_come_from_the_lambda() -> None:
    A = te.placeholder((3, 4), dtype="float16", name="A")
    B = te.compute((3, 4), lambda row, col: A[row, col] * 2, name="B")
    assert A.name == "A" and A.dtype == "float16" and [int(str(d)) for d in A.shape] == [3, 4]
    assert isinstance(A.op, te.PlaceholderOp) and isinstance(B.op, te.ComputeOp)
    assert [iv.name for iv in B.op.axis] == ["row", "col"]
    assert B.dtype == "float16" and B.op.input_tensors == [A]


def test_compute_with_star_args_names_axes_i0_i1() -> None:
    A = te.placeholder((2, 5), name="A")
    B = te.compute(A.shape, lambda *i: A[i] + 1.0, name="B")
    assert [iv.name for iv in B.op.axis] == ["i0", "i1"]


def test_compute_arity_mismatch_names_the_compute() -> None:
    A = te.placeholder((2, 5), name="A")
    with pytest.raises(te.TEError, match="compute 'B'.*2 dims.*1 arguments"):
        te.compute((2, 5), lambda i: A[i, 0], name="B")


def test_wrong_number_of_indices_raises() -> None:
    A = te.placeholder((2, 5), name="A")
    with pytest.raises(KilnError, match="tensor 'A' has 2 dims, indexed with 1"):
        te.compute((2,), lambda i: A[i], name="B")


def test_a_reduction_inside_an_expression_is_rejected() -> None:
    A = te.placeholder((4, 4), name="A")
    k = te.reduce_axis((0, 4), name="k")
    with pytest.raises(te.TEError, match="reduction must be the whole body"):
        te.compute((4,), lambda i: te.sum(A[i, k], axis=k) * 2.0, name="B")


def test_reducer_needs_reduce_axes() -> None:
    A = te.placeholder((4, 4), name="A")
    with pytest.raises(te.TEError, match="reduce_axis"):
        te.compute((4,), lambda i: te.sum(A[i, 0], axis=[te.thread_axis("threadIdx.x")]), name="B")


def test_math_functions_become_intrinsic_calls() -> None:
    x = tir.Var("x", "float32")
    for fn, name in [
        (te.exp, "exp"),
        (te.log, "log"),
        (te.sqrt, "sqrt"),
        (te.tanh, "tanh"),
        (te.erf, "erf"),
        (te.sigmoid, "sigmoid"),
        (te.floor, "floor"),
        (te.ceil, "ceil"),
        (te.round, "round"),
        (te.rsqrt, "rsqrt"),
        (te.abs, "abs"),
        (te.sin, "sin"),
        (te.cos, "cos"),
    ]:
        e = fn(x)
        assert isinstance(e, tir.Call) and e.name == name and e.dtype == "float32"
    assert isinstance(te.pow(x, 2.0), tir.Call)
    with pytest.raises(te.TEError, match="te.exp takes a floating-point"):
        te.exp(tir.Var("i"))


# ---------------------------------------------------------------------------
# Default lowering and numerics
# ---------------------------------------------------------------------------


def test_elementwise_lowers_to_one_loop_per_axis_and_matches_numpy() -> None:
    A = te.placeholder((3, 5), name="A")
    B = te.placeholder((3, 5), name="B")
    C = te.compute((3, 5), lambda i, j: te.exp(A[i, j]) * B[i, j] + 1.0, name="C")
    func = te.lower(te.create_schedule(C), [A, B, C], name="ew")
    assert [(str(f.loop_var), str(f.extent)) for f in loops(func)] == [("i", "3"), ("j", "5")]
    assert "C[i, j] = exp(A[i, j]) * B[i, j] + 1.0" in str(func)
    a, b = rand(3, 5), rand(3, 5)
    (c,) = run(func, [a, b], [(3, 5)])
    np.testing.assert_allclose(c, np.exp(a) * b + 1, rtol=1e-5)


def test_broadcast_adds_a_row_vector_to_each_row() -> None:
    A = te.placeholder((4, 3), name="A")
    b = te.placeholder((3,), name="b")
    C = te.compute((4, 3), lambda i, j: A[i, j] + b[j], name="C")
    func = te.lower(te.create_schedule(C), [A, b, C])
    a, bb = rand(4, 3), rand(3)
    (c,) = run(func, [a, bb], [(4, 3)])
    np.testing.assert_allclose(c, a + bb, rtol=1e-6)


def test_sum_reduction_initializes_then_accumulates() -> None:
    A = te.placeholder((4, 6), name="A")
    k = te.reduce_axis((0, 6), name="k")
    B = te.compute((4,), lambda i: te.sum(A[i, k], axis=k), name="B")
    func = te.lower(te.create_schedule(B), [A, B])
    text = str(func)
    assert "B[i] = 0.0" in text
    assert "for k in range(6):" in text
    assert text.index("B[i] = 0.0") < text.index("for k in range(6):")
    a = rand(4, 6)
    (out,) = run(func, [a], [(4,)])
    np.testing.assert_allclose(out, a.sum(1), rtol=1e-5)


@pytest.mark.parametrize(
    ("reducer", "ref"),
    [(te.max, np.max), (te.min, np.min), (te.prod, np.prod), (te.sum, np.sum)],
)
def test_builtin_reducers_match_numpy(reducer: te.ops.Reducer, ref: object) -> None:
    A = te.placeholder((3, 5), name="A")
    k = te.reduce_axis((0, 5), name="k")
    B = te.compute((3,), lambda i: reducer(A[i, k], axis=k), name="B")
    func = te.lower(te.create_schedule(B), [A, B])
    a = rand(3, 5)
    (out,) = run(func, [a], [(3,)])
    np.testing.assert_allclose(out, ref(a, axis=1), rtol=1e-5)  # type: ignore[operator]


def test_max_reduction_starts_from_minus_infinity() -> None:
    A = te.placeholder((2, 3), name="A")
    k = te.reduce_axis((0, 3), name="k")
    B = te.compute((2,), lambda i: te.max(A[i, k], axis=k), name="B")
    assert "-inf" in str(te.lower(te.create_schedule(B), [A, B]))


def test_reduction_over_two_axes_and_a_where_condition() -> None:
    A = te.placeholder((3, 4, 5), name="A")
    k1 = te.reduce_axis((0, 4), name="k1")
    k2 = te.reduce_axis((0, 5), name="k2")
    B = te.compute((3,), lambda i: te.sum(A[i, k1, k2], axis=[k1, k2], where=k1 < k2), name="B")
    func = te.lower(te.create_schedule(B), [A, B])
    a = rand(3, 4, 5)
    mask = np.arange(4)[:, None] < np.arange(5)[None, :]
    (out,) = run(func, [a], [(3,)])
    np.testing.assert_allclose(out, (a * mask).sum((1, 2)), rtol=1e-5)


def test_comm_reducer_defines_a_custom_reduction() -> None:
    absmax = te.comm_reducer(lambda x, y: tir.max_(x, te.abs(y)), lambda t: tir.const(0, t), name="absmax")
    A = te.placeholder((3, 4), name="A")
    k = te.reduce_axis((0, 4), name="k")
    B = te.compute((3,), lambda i: absmax(A[i, k], axis=k), name="B")
    a = rand(3, 4)
    (out,) = run(te.lower(te.create_schedule(B), [A, B]), [a], [(3,)])
    np.testing.assert_allclose(out, np.abs(a).max(1))


def test_reducer_with_two_operands_combines_them() -> None:
    x, y = tir.Var("x", "float32"), tir.Var("y", "float32")
    assert isinstance(te.max(x, y), tir.Max)


def test_if_then_else_pads_and_cast_changes_dtype() -> None:
    A = te.placeholder((4,), name="A")
    P = te.compute(
        (6,), lambda i: te.if_then_else(tir.all_of(i >= 1, i < 5), A[tir.min_(tir.max_(i - 1, 0), 3)], 0.0), name="P"
    )
    Q = te.compute((6,), lambda i: te.cast(P[i] * 10.0, "int32"), name="Q")
    func = te.lower(te.create_schedule(Q), [A, Q])
    a = rand(4)
    out = np.zeros(6, "int32")
    tir_interp.run(func, a, out)
    np.testing.assert_array_equal(out, np.trunc(np.pad(a, 1) * np.float32(10)).astype("int32"))


def test_intermediate_stage_gets_a_global_allocate() -> None:
    A = te.placeholder((5,), name="A")
    B = te.compute((5,), lambda i: A[i] * 2.0, name="B")
    C = te.compute((5,), lambda i: B[i] + 1.0, name="C")
    func = te.lower(te.create_schedule(C), [A, C])
    assert isinstance(func.body, tir.Allocate) and func.body.buffer.name == "B"
    assert func.body.buffer.scope == "global"
    a = rand(5)
    (c,) = run(func, [a], [(5,)])
    np.testing.assert_allclose(c, a * 2 + 1, rtol=1e-6)


def test_symbolic_sizes_become_buffer_dims_and_loop_extents() -> None:
    n = te.var("n")
    A = te.placeholder((n,), name="A")
    B = te.compute((n,), lambda i: A[i] * A[i], name="B")
    func = te.lower(te.create_schedule(B), [A, B])
    assert func.size_vars == [n]
    assert str(loops(func)[0].extent) == "n"
    for size in (1, 7):
        a = rand(size)
        (b,) = run(func, [a], [(size,)])
        np.testing.assert_allclose(b, a * a, rtol=1e-6)


def test_schedule_with_two_outputs_lowers_both() -> None:
    A = te.placeholder((4,), name="A")
    B = te.compute((4,), lambda i: A[i] + 1.0, name="B")
    C = te.compute((4,), lambda i: B[i] * 3.0, name="C")
    func = te.lower(te.create_schedule([B, C]), [A, B, C])
    a = rand(4)
    b, c = run(func, [a], [(4,), (4,)])
    np.testing.assert_allclose(b, a + 1, rtol=1e-6)
    np.testing.assert_allclose(c, (a + 1) * 3, rtol=1e-6)


def test_lower_requires_every_read_placeholder_in_args() -> None:
    A = te.placeholder((4,), name="A")
    B = te.compute((4,), lambda i: A[i] + 1.0, name="B")
    with pytest.raises(te.ScheduleError, match="placeholder 'A', which is not in args"):
        te.lower(te.create_schedule(B), [B])


def test_lower_requires_the_outputs_in_args() -> None:
    A = te.placeholder((4,), name="A")
    B = te.compute((4,), lambda i: A[i] + 1.0, name="B")
    with pytest.raises(te.ScheduleError, match="output 'B' must be one of args"):
        te.lower(te.create_schedule(B), [A])


def test_lowered_function_params_follow_args_order() -> None:
    A = te.placeholder((4,), name="A")
    B = te.placeholder((4,), name="B")
    C = te.compute((4,), lambda i: A[i] - B[i], name="C")
    func = te.lower(te.create_schedule(C), [C, B, A], name="sub")
    assert func.name == "sub" and [p.name for p in func.params] == ["C", "B", "A"]
    a, b = rand(4), rand(4)
    c = np.zeros(4, "float32")
    tir_interp.run(func, c, b, a)
    np.testing.assert_allclose(c, a - b)


# ---------------------------------------------------------------------------
# Reductions across GPU threads (a reduction axis bound to threadIdx.x)
# ---------------------------------------------------------------------------


def row_sum_across(rows: int = 6, n: int = 70, threads: int = 32, scope: str = "global"
                   ) -> tuple[te.Schedule, list[te.Tensor], te.Tensor]:
    """S[i] = sum over k of X[i, k], a row a block, k split by `threads` and its inner part on threadIdx.x;
    with scope "local", S is a per-thread stage computed at the row of a consumer T = S * 2."""
    X = te.placeholder((rows, n), name="X")
    k = te.reduce_axis((0, n), name="k")
    S = te.compute((rows,), lambda i: te.sum(X[i, k], axis=k), name="S")
    out = S if scope == "global" else te.compute((rows,), lambda i: S[i] * 2.0, name="T")
    s = te.create_schedule([out])
    s[out].bind(out.op.axis[0], te.thread_axis("blockIdx.x"))
    if scope != "global":
        s[S].compute_at(s[out], out.op.axis[0])
        s[S].set_scope(scope)
    _, ki = s[S].split(k, factor=threads)
    s[S].bind(ki, te.thread_axis("threadIdx.x"))
    return s, [X, out], S


def test_a_reduction_across_threads_accumulates_in_a_register_then_all_reduces() -> None:
    s, args, _ = row_sum_across()
    text = str(te.lower(s, args))
    lines = [line.strip() for line in text.splitlines()]
    start = lines.index("for k_inner in range(32):  # bound to threadIdx.x")
    assert lines[start:] == [
        "for k_inner in range(32):  # bound to threadIdx.x",
        "S_acc = allocate((1), float32, 'local')",
        "S_acc[0] = 0.0",
        "for k_outer in range(3):",  # the serial part, inside the thread loop, its tail guarded
        "if k_outer * 32 + k_inner < 70:",
        "S_acc[0] = S_acc[0] + X[i, k_outer * 32 + k_inner]",
        "kiln.warp_allreduce<int32>(S_acc[0], red_a + red_b, red_a, red_b, 32)",  # every thread takes part
        "if k_inner == 0:",  # one thread stores a global result
        "S[i] = S_acc[0]",
    ]


def test_a_local_result_across_threads_is_stored_by_every_thread() -> None:
    s, args, _ = row_sum_across(scope="local")
    func = te.lower(s, args)
    text = str(func)
    assert re.search(r"\n +S\[\w+\] = S_acc\[0\]\n", text) and "if k_inner == 0" not in text
    assert text.index("kiln.warp_allreduce") < text.index("T[i] = S[0] * 2.0")
    (red,) = [n for n in _stmts(func.body) if allreduce.as_allreduce(n) is not None]
    parts = allreduce.as_allreduce(red)
    assert parts is not None and parts.threads == 32 and parts.acc.buffer.scope == "local"


def test_the_all_reduce_takes_the_reducers_combiner() -> None:
    X = te.placeholder((4, 40), name="X")
    k = te.reduce_axis((0, 40), name="k")
    M = te.compute((4,), lambda i: te.max(X[i, k], axis=k), name="M")
    s = te.create_schedule([M])
    s[M].bind(M.op.axis[0], te.thread_axis("blockIdx.x"))
    s[M].bind(s[M].split(k, factor=8)[1], te.thread_axis("threadIdx.x"))
    text = str(te.lower(s, [X, M]))
    assert "M_acc[0] = -inf" in text and "kiln.warp_allreduce<int32>(M_acc[0], max(red_a, red_b)" in text


@pytest.mark.parametrize(
    ("schedule", "message"),
    [
        ("data_inside", "needs its data axes outside its reduction axes"),
        ("two_bound", "binds one reduction axis to threadIdx.x, got"),
    ],
)
def test_a_reduction_across_threads_refuses_what_it_cannot_lower(schedule: str, message: str) -> None:
    X = te.placeholder((4, 6, 64), name="X")
    k1, k2 = te.reduce_axis((0, 6), name="k1"), te.reduce_axis((0, 64), name="k2")
    S = te.compute((4, 6), lambda i, j: te.sum(X[i + j - j, k1, k2], axis=[k1, k2]), name="S")
    s = te.create_schedule([S])
    _, j = S.op.axis
    s[S].bind(s[S].split(k2, factor=32)[1], te.thread_axis("threadIdx.x"))
    if schedule == "data_inside":
        s[S].reorder(k1, j)
    else:
        s[S].bind(k1, te.thread_axis("threadIdx.x"))
    with pytest.raises(te.ScheduleError, match=message):
        te.lower(s, [X, S])


def _stmts(s: tir.Stmt) -> list[tir.Stmt]:
    """Every statement under `s`, in pre-order."""
    out: list[tir.Stmt] = []
    stack = [s]
    while stack:
        x = stack.pop()
        out.append(x)
        if isinstance(x, tir.SeqStmt):
            stack.extend(reversed(x.stmts))
        elif isinstance(x, (tir.For, tir.Allocate, tir.LetStmt)):
            stack.append(x.body)
        elif isinstance(x, tir.IfThenElse):
            stack.extend(y for y in (x.else_case, x.then_case) if y is not None)
    return out
