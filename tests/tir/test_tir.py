"""Loop IR: simplifier, passes (partition, unroll, substitute), functor, printer."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Callable, Iterator

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tir_interp import eval_expr, run

from kiln import tir
from kiln.tir.functor import StmtExprMutator, post_order_visit, used_vars
from kiln.tir.simplify import Analyzer, linear_form, simplify, simplify_stmt
from kiln.tir.stmt import Allocate, BufferStore, Evaluate, For, ForKind, IfThenElse, LetStmt, PrimFunc, SeqStmt
from kiln.tir.transform import PARTITION_SELECTS, loop_partition, simplify_func, substitute, unroll_loops

vi, vj, vk = tir.Var("i"), tir.Var("j"), tir.Var("k")
vx = tir.Var("x", "float32")
C = tir.const


def _text(e: tir.PrimExpr) -> str:
    return str(e)


# ---------------------------------------------------------------------------
# folding
# ---------------------------------------------------------------------------

FOLDING = [
    (tir.Cast("int8", C(300)), "int8(44)"),
    (tir.Cast("bool", C(3)), "True"),
    (tir.Cast("int32", C(2.9)), "2"),
    (tir.Cast("int32", C(-2.9)), "-2"),
    (tir.Cast("float32", C(3)), "3.0"),
    (tir.Select("int32", C(True), vi, vj), "i"),
    (tir.Select("int32", C(False), vi, vj), "j"),
    (tir.Select("int32", vi < vj, vk, vk), "k"),
    (tir.Min("int32", C(3), C(5)), "3"),
    (tir.Max("int32", C(3), C(5)), "5"),
    (tir.Min("int32", vi, vi + 1), "i"),
    (tir.Max("int32", vi + 3, vi + 1), "i + 3"),
    (tir.Not("bool", C(True)), "False"),
    (tir.Not("bool", tir.Not("bool", vi < vj)), "i < j"),
    (tir.Not("bool", vi < vj), "i >= j"),
    (tir.And("bool", vi < vj, C(True)), "i < j"),
    (tir.And("bool", vi < vj, C(False)), "False"),
    (tir.Or("bool", C(True), vi < vj), "True"),
    (tir.Or("bool", vi < vj, C(False)), "i < j"),
    (tir.And("bool", vi < vj, vi < vj), "i < j"),
    (tir.Mul("int32", vi, C(1)), "i"),
    (tir.Mul("int32", C(1), vi), "i"),
    (tir.Add("int32", vi, C(0)), "i"),
    (tir.Add("int32", C(0), vi), "i"),
    (tir.Mul("int32", vi, C(0)), "0"),
    (tir.Sub("int32", vi, vi), "0"),
    (tir.FloorDiv("int32", vi, C(1)), "i"),
    (tir.FloorMod("int32", vi, C(1)), "0"),
    (tir.FloorDiv("int32", C(0), vi), "0"),
    (tir.FloorDiv("int32", C(-7), C(2)), "-4"),
    (tir.Div("int32", C(-7), C(2)), "-3"),
    (tir.EQ("bool", vi + 1, vi + 1), "True"),
    (tir.NE("bool", vi + 1, vi), "True"),
    (tir.Mul("float32", vx, C(1.0)), "x"),
    (tir.Add("float32", vx, C(0.0)), "x"),
    (tir.Div("float32", vx, C(1.0)), "x"),
    (tir.Add("float32", C(1.5), C(2.0)), "3.5"),
]


@pytest.mark.parametrize(("expr", "expected"), FOLDING, ids=[t for _, t in FOLDING])
def test_simplify_folds_constants_and_identities(expr: tir.PrimExpr, expected: str) -> None:
    assert _text(simplify(expr)) == expected


def test_float_times_zero_is_kept_because_of_nan_and_inf() -> None:
    assert _text(simplify(tir.Mul("float32", vx, C(0.0)))) == "x * 0.0"


# ---------------------------------------------------------------------------
# affine canonical form
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("build", "expected"),
    [
        (lambda: (vi * 4 + vj) + 1 - vi * 4, "j + 1"),
        (lambda: vi * 16 + vj, "i * 16 + j"),
        (lambda: vj + vi * 16, "i * 16 + j"),
        (lambda: (vi + 1) * 2 - vi, "i + 2"),
        (lambda: vi * (vj + 1) - vj * vi, "i"),
        (lambda: 3 - vi * 2, "3 - i * 2"),
        (lambda: 0 - vi, "0 - i"),
        (lambda: (vi * 8 + 4) // 4, "i * 2 + 1"),
        (lambda: vk - (vk // 16) * 16, "k % 16"),
    ],
)
def test_affine_expressions_reach_a_canonical_form(build: Callable[[], tir.PrimExpr], expected: str) -> None:
    assert _text(simplify(build())) == expected


def test_canonical_form_does_not_depend_on_operand_order() -> None:
    assert _text(simplify(vi + vj * 3 + vk)) == _text(simplify(vk + (vj + vj + vj) + vi))


VARS = [vi, vj, vk]
_leaf = st.one_of(st.sampled_from(VARS), st.integers(-20, 20).map(lambda v: C(v)))


def _extend(children: st.SearchStrategy[tir.PrimExpr]) -> st.SearchStrategy[tir.PrimExpr]:
    pair = st.tuples(children, children)
    divisor = st.tuples(children, st.integers(1, 9))
    return st.one_of(
        pair.map(lambda t: t[0] + t[1]),
        pair.map(lambda t: t[0] - t[1]),
        pair.map(lambda t: t[0] * t[1]),
        divisor.map(lambda t: t[0] // t[1]),
        divisor.map(lambda t: t[0] % t[1]),
        divisor.map(lambda t: tir.binary(tir.Div, t[0], t[1])),
        pair.map(lambda t: tir.min_(t[0], t[1])),
        pair.map(lambda t: tir.max_(t[0], t[1])),
        st.tuples(children, children, children).map(lambda t: tir.select(t[0] < t[1], t[1], t[2])),
    )


EXPRS = st.recursive(_leaf, _extend, max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(EXPRS, st.lists(st.tuples(*[st.integers(-40, 40)] * 3), min_size=1, max_size=5))
def test_simplified_expression_has_the_same_value_everywhere(e: tir.PrimExpr, points: list[tuple[int, ...]]) -> None:
    s = simplify(e)
    for p in points:
        env = dict(zip(VARS, p, strict=True))
        assert eval_expr(s, env) == eval_expr(e, env), f"{e}  ->  {s}"


@settings(max_examples=300, deadline=None)
@given(
    EXPRS,
    st.lists(st.tuples(st.integers(-8, 8), st.integers(1, 20)), min_size=3, max_size=3),
    st.lists(st.tuples(*[st.integers(0, 10**6)] * 3), min_size=1, max_size=5),
)
def test_simplified_expression_under_bounds_has_the_same_value_within_them(
    e: tir.PrimExpr, ranges: list[tuple[int, int]], seeds: list[tuple[int, ...]]
) -> None:
    bounds = {v: (C(lo), C(lo + ext)) for v, (lo, ext) in zip(VARS, ranges, strict=True)}
    s = simplify(e, bounds)
    for seed in seeds:
        env = {v: lo + r % ext for v, (lo, ext), r in zip(VARS, ranges, seed, strict=True)}
        assert eval_expr(s, env) == eval_expr(e, env), f"{e}  ->  {s}  with {bounds}"


@settings(max_examples=100, deadline=None)
@given(EXPRS, EXPRS, st.lists(st.tuples(*[st.integers(-40, 40)] * 3), min_size=1, max_size=4))
def test_simplified_comparison_has_the_same_truth_value(
    a: tir.PrimExpr, b: tir.PrimExpr, points: list[tuple[int, ...]]
) -> None:
    for cond in (a < b, a <= b, tir.eq(a, b), tir.ne(a, b), tir.logical_not(a > b)):
        s = simplify(cond)
        for p in points:
            env = dict(zip(VARS, p, strict=True))
            assert bool(eval_expr(s, env)) == bool(eval_expr(cond, env)), f"{cond}  ->  {s}"


# ---------------------------------------------------------------------------
# linear forms as values (what te's bound inference builds on)
# ---------------------------------------------------------------------------


def test_linear_forms_compare_by_atoms_and_coefficients_and_subtract() -> None:
    a, b = linear_form(vi * 4 + vj + 1), linear_form(vj + 1 + vi * 2 + vi * 2)
    assert a == b and a is not b
    assert a != linear_form(vi * 4 + vj) and a != linear_form(vi * 4 + vk + 1)
    assert linear_form(tir.Cast("int64", vi) + 1) != linear_form(vi + 1)  # another dtype
    d = a.sub(linear_form(vi * 4))
    assert d == linear_form(vj + 1) and str(Analyzer().expr_of(d)) == "j + 1"
    assert a.sub(b).is_const and a.sub(b).const == 0
    assert repr(a) == "Linear(int32: 4*i + 1*j + 1)"


def test_linear_form_rebuilds_to_the_simplified_expression() -> None:
    for e in (vi * 4 + vj - vi * 4, (vi * 8 + 4) // 4, (vi + 1) * 2 - vi, 3 - vi * 2):
        assert str(Analyzer().expr_of(linear_form(e))) == str(simplify(e))


def test_min_of_and_max_of_decide_where_the_difference_has_a_sign() -> None:
    ana = Analyzer()
    a, b = linear_form(vi * 4), linear_form(vi * 4 + 3)
    assert ana.min_of(a, b) is a and ana.max_of(a, b) is b and ana.min_of(b, a) is a
    m = linear_form(vj % 4)
    assert ana.max_of(m, linear_form(C(3))) == linear_form(C(3))  # j % 4 <= 3
    assert str(ana.expr_of(ana.min_of(a, linear_form(vj)))) == "min(i * 4, j)"
    with ana.bound(vj, C(0), C(2)):
        assert ana.min_of(linear_form(vj), linear_form(C(5))) == linear_form(vj)


def test_floordiv_of_a_linear_form_matches_simplifying_the_division() -> None:
    ana = Analyzer()
    for e, c in ((vi * 8 + 4, 4), (vi * 4 + vj, 2), (vi + 7, 1), (C(-7), 2)):
        assert ana.floordiv(linear_form(e), c) == linear_form(e // c)
    assert str(ana.expr_of(ana.floordiv(linear_form(vi * 4 + vj), 2))) == "i * 2 + j // 2"


# ---------------------------------------------------------------------------
# bounds: floordiv / floormod, conditions, min / max
# ---------------------------------------------------------------------------


def test_floordiv_and_floormod_of_split_index_use_the_inner_bound() -> None:
    io, ii = tir.Var("io"), tir.Var("ii")
    bounds = {ii: (0, 16)}
    assert _text(simplify((io * 16 + ii) // 16, bounds)) == "io"
    assert _text(simplify((io * 16 + ii) % 16, bounds)) == "ii"
    assert _text(simplify((io * 16 + ii + 16) // 16, bounds)) == "io + 1"
    assert _text(simplify((io * 32 + ii) // 16, bounds)) == "io * 2"


def test_floordiv_without_bounds_keeps_only_the_unknown_remainder() -> None:
    io, ii = tir.Var("io"), tir.Var("ii")
    assert _text(simplify((io * 16 + ii) // 16)) == "io + ii // 16"
    assert _text(simplify((io * 16 + ii) % 16)) == "ii % 16"


def test_truncating_division_becomes_floor_division_only_when_nonnegative() -> None:
    assert _text(simplify(tir.binary(tir.Div, vi * 8 + vj, C(8)), {vj: (0, 8), vi: (0, 10)})) == "i"
    assert _text(simplify(tir.binary(tir.Div, vi * 8 + vj, C(8)))) == "(i * 8 + j) / 8"


def test_conditions_decided_by_constant_loop_bounds() -> None:
    io, ii = tir.Var("io"), tir.Var("ii")
    bounds = {io: (0, 4), ii: (0, 16)}
    assert _text(simplify(io * 16 + ii < 64, bounds)) == "True"
    assert _text(simplify(io * 16 + ii >= 64, bounds)) == "False"
    assert _text(simplify(io * 16 + ii < 63, bounds)) == "io * 16 + ii < 63"


def test_conditions_decided_by_symbolic_bounds() -> None:
    n = tir.Var("n")
    io, ii = tir.Var("io"), tir.Var("ii")
    assert _text(simplify(vi < n, {vi: (0, n)})) == "True"
    assert _text(simplify(vi >= n, {vi: (0, n)})) == "False"
    assert _text(simplify(io * 16 + ii < n, {n: (0, None), io: (0, n // 16), ii: (0, 16)})) == "True"
    assert _text(simplify(tir.min_(n // 16, (n + 15) // 16), {n: (0, None)})) == "n // 16"


def test_min_max_decided_by_bounds() -> None:
    assert _text(simplify(tir.min_(vi, 100), {vi: (0, 50)})) == "i"
    assert _text(simplify(tir.max_(vi, 100), {vi: (0, 50)})) == "100"
    assert _text(simplify(tir.min_(vi, vj), {vi: (0, 50)})) == "min(i, j)"


# ---------------------------------------------------------------------------
# simplify_stmt
# ---------------------------------------------------------------------------


def _guarded_func(extent: int) -> tuple[PrimFunc, tir.Var, tir.Var]:
    a, b = tir.buffer("A", [64]), tir.buffer("B", [64])
    io, ii = tir.Var("io"), tir.Var("ii")
    store = BufferStore(b, a.load(io * 16 + ii) + 1.0, [io * 16 + ii])
    body = tir.for_range(io, 4, tir.for_range(ii, 16, IfThenElse(io * 16 + ii < extent, store)))
    return PrimFunc("f", [a, b], body), io, ii


def test_always_true_guard_disappears() -> None:
    f, _, _ = _guarded_func(64)
    out = simplify_func(f)
    assert "if" not in str(out)
    assert isinstance(out.body, For) and isinstance(out.body.body, For)
    assert isinstance(out.body.body.body, BufferStore)


def test_always_false_branch_disappears_and_else_is_kept() -> None:
    b = tir.buffer("B", [4], "int32")
    s = tir.for_range(vi, 4, IfThenElse(vi >= 4, BufferStore(b, C(1), [vi]), BufferStore(b, C(2), [vi])))
    assert str(simplify_stmt(s)) == "for i in range(4):\n    B[i] = 2"
    assert str(simplify_stmt(tir.for_range(vi, 4, IfThenElse(vi >= 4, BufferStore(b, C(1), [vi]))))) == "pass"


def test_zero_extent_loop_is_dropped_and_extent_one_loop_is_inlined() -> None:
    b = tir.buffer("B", [8], "int32")
    s = tir.seq(
        tir.for_range(vi, 0, BufferStore(b, C(1), [vi])),
        tir.for_range(vj, 1, BufferStore(b, vj + 5, [vj * 2]), start=3),
    )
    assert str(simplify_stmt(s)) == "B[6] = 8"


def test_extent_one_loop_rewrites_allocation_shapes_that_use_its_variable() -> None:
    out = tir.buffer("O", [4])
    tmp = tir.buffer("T", [vj + 1], scope="local")
    inner = Allocate(tmp, tir.seq(BufferStore(tmp, C(2.0), [vj]), BufferStore(out, tmp.load(vj), [vj])))
    s = simplify_stmt(tir.for_range(vj, 1, inner, start=2))
    assert isinstance(s, Allocate) and _text(s.buffer.shape[0]) == "3"
    stores = [n for n in _nodes(s) if isinstance(n, BufferStore)]
    assert all(st.buffer is s.buffer for st in stores if st.buffer.name == "T")
    arr = np.zeros(4, "float32")
    run(PrimFunc("f", [out], s), arr)
    np.testing.assert_array_equal(arr, [0, 0, 2, 0])


def test_thread_bound_loop_of_extent_one_stays() -> None:
    b = tir.buffer("B", [1])
    loop = For(vi, C(0), C(1), ForKind.THREAD_BINDING, BufferStore(b, C(1.0), [vi]), "threadIdx.x")
    assert isinstance(simplify_stmt(loop), For)


def test_let_of_an_unused_variable_is_dropped_and_a_used_one_kept() -> None:
    b = tir.buffer("B", [4], "int32")
    v = tir.Var("v")
    used = LetStmt(v, vi * 2, BufferStore(b, v, [vi]))
    unused = LetStmt(v, vi * 2, BufferStore(b, vi, [vi]))
    kept, dropped = simplify_stmt(tir.for_range(vi, 4, used)), simplify_stmt(tir.for_range(vi, 4, unused))
    assert isinstance(kept, For) and isinstance(kept.body, LetStmt)
    assert isinstance(dropped, For) and isinstance(dropped.body, BufferStore)


def test_let_value_bounds_decide_conditions() -> None:
    b = tir.buffer("B", [4], "int32")
    v = tir.Var("v")
    s = tir.for_range(vi, 4, LetStmt(v, vi + 1, IfThenElse(v > 0, BufferStore(b, v, [vi]))))
    assert "if" not in str(simplify_stmt(s))


# ---------------------------------------------------------------------------
# loop_partition
# ---------------------------------------------------------------------------


def _split_func(extent: int | None, f: int = 16) -> PrimFunc:
    """`B[i] = A[i] * 2` split by `f` with the guard te writes (extent None: symbolic n)."""
    n: tir.PrimExpr = tir.Var("n") if extent is None else C(extent)
    a, b = tir.buffer("A", [n]), tir.buffer("B", [n])
    io, ii = tir.Var("io"), tir.Var("ii")
    store = BufferStore(b, a.load(io * f + ii) * 2.0, [io * f + ii])
    inner = tir.for_range(ii, f, IfThenElse(io * f + ii < n, store), ForKind.VECTORIZED)
    return PrimFunc("scale", [a, b], tir.for_range(io, (n + (f - 1)) // f, inner))


def _check_same_result(before: PrimFunc, after: PrimFunc, sizes: list[int]) -> None:
    for size in sizes:
        outs = []
        for func in (before, after):
            a = np.arange(size, dtype="float32")
            b = np.full(size, -1.0, "float32")
            run(func, a, b)
            outs.append(b)
        np.testing.assert_array_equal(outs[0], outs[1])
        np.testing.assert_array_equal(outs[1], np.arange(size, dtype="float32") * 2)


def _vector_loops(func: PrimFunc) -> list[For]:
    return [n for n in _nodes(func.body) if isinstance(n, For) and n.kind is ForKind.VECTORIZED]


def test_loop_partition_constant_extent_main_part_has_no_guard() -> None:
    before = _split_func(100)
    after = loop_partition(before)
    main = after.body
    assert isinstance(main, SeqStmt) and isinstance(main.stmts[0], For)
    assert _text(main.stmts[0].extent) == "6"
    vec = _vector_loops(after)
    assert isinstance(vec[0].body, BufferStore)  # main: no condition
    assert _text(vec[-1].extent) == "4" and isinstance(vec[-1].body, BufferStore)  # tail: reduced extent
    _check_same_result(before, after, [100])


def test_loop_partition_dividing_extent_leaves_one_loop_without_guard() -> None:
    before = _split_func(64)
    after = loop_partition(before)
    assert isinstance(after.body, For) and "if" not in str(after)
    _check_same_result(before, after, [64])


def test_loop_partition_symbolic_extent() -> None:
    before = _split_func(None)
    after = loop_partition(before)
    assert isinstance(after.body, SeqStmt)
    main, tail = after.body.stmts
    assert isinstance(main, For) and _text(main.extent) == "n // 16"
    assert isinstance(main.body, For) and main.body.kind is ForKind.VECTORIZED
    assert isinstance(main.body.body, BufferStore)
    assert isinstance(tail, For) and _text(tail.min) == "n // 16"
    _check_same_result(before, after, [0, 1, 15, 16, 17, 40, 64])


def test_loop_partition_two_guards_one_loop_at_a_time() -> None:
    h, w = tir.Var("h"), tir.Var("w")
    a, b = tir.buffer("A", [h, w]), tir.buffer("B", [h, w])
    yo, xo, yi, xi = (tir.Var(s) for s in ("yo", "xo", "yi", "xi"))
    y, x = yo * 4 + yi, xo * 8 + xi
    store = BufferStore(b, a.load(y, x) + 1.0, [y, x])
    body = IfThenElse(tir.all_of(y < h, x < w), store)
    nest = tir.for_range(
        yo,
        (h + 3) // 4,
        tir.for_range(xo, (w + 7) // 8, tir.for_range(yi, 4, tir.for_range(xi, 8, body, ForKind.VECTORIZED))),
    )
    before = PrimFunc("add1", [a, b], nest)
    after = loop_partition(before)
    assert isinstance(_vector_loops(after)[0].body, BufferStore)
    for shape in [(4, 8), (5, 9), (3, 17), (0, 5)]:
        outs = []
        for func in (before, after):
            arr_b = np.full(shape, -1.0, "float32")
            run(func, np.ones(shape, "float32"), arr_b)
            outs.append(arr_b)
        np.testing.assert_array_equal(outs[0], outs[1])
        np.testing.assert_array_equal(outs[1], np.full(shape, 2.0, "float32"))


def test_loop_partition_leaves_loops_without_guards_alone() -> None:
    b = tir.buffer("B", [16])
    f = PrimFunc("f", [b], tir.for_range(vi, 16, BufferStore(b, C(1.0), [vi])))
    assert str(loop_partition(f)) == str(f)


def _pad_func(annotate: bool, stride: int = 1) -> PrimFunc:
    """`B[y, x] = A[y - 1, x * stride - 2]` inside, 0 in the padding: the select and clamps te's pad writes."""
    h, w, wp = 5, 7, 12
    a, b = tir.buffer("A", [h, w]), tir.buffer("B", [h + 2, wp])
    y, x = tir.Var("y"), tir.Var("x")
    col = x * stride - 2
    inside = tir.all_of(y - 1 >= 0, y - 1 < h, col >= 0, col < w)
    value = a.load(tir.max_(tir.min_(y - 1, h - 1), 0), tir.max_(tir.min_(col, w - 1), 0))
    store = BufferStore(b, tir.select(inside, value, C(0.0, "float32")), [y, x])
    notes = {PARTITION_SELECTS: None} if annotate else {}
    inner = For(x, C(0), C(wp), ForKind.VECTORIZED, store, "", notes)
    return PrimFunc("pad", [a, b], For(y, C(0), C(h + 2), ForKind.SERIAL, inner, "", notes))


def _pad_result(func: PrimFunc, stride: int = 1) -> np.ndarray:
    a = np.arange(35, dtype="float32").reshape(5, 7) + 1
    b = np.full((7, 12), -1.0, "float32")
    run(func, a, b)
    return b


@pytest.mark.parametrize("stride", [1, 2])
def test_loop_partition_cuts_an_annotated_loop_where_its_selects_change(stride: int) -> None:
    before = _pad_func(True, stride)
    after = loop_partition(before)
    text = str(after)
    assert "select" not in text and "max(" not in text and "min(" not in text
    copies = [n for n in _vector_loops(after) if isinstance(n.body, BufferStore) and "A[" in str(n.body)]
    assert len(copies) == 1  # one row loop of plain copies; the zero rows and columns are loops of their own
    want = np.zeros((7, 12), "float32")
    a = np.arange(35, dtype="float32").reshape(5, 7) + 1
    cols = [x for x in range(12) if 0 <= x * stride - 2 < 7]
    want[1:6, cols] = a[:, [x * stride - 2 for x in cols]]
    np.testing.assert_array_equal(_pad_result(after, stride), want)
    np.testing.assert_array_equal(_pad_result(before, stride), want)


def test_loop_partition_cuts_an_annotated_parallel_loop_into_parallel_pieces() -> None:
    """concatenate's schedule: the parallel loop over the joined axis, cut where one piece ends."""
    a, b, out = tir.buffer("A", [3, 4]), tir.buffer("B", [2, 4]), tir.buffer("O", [5, 4])
    c, x = tir.Var("c"), tir.Var("x")
    value = tir.select(c < 3, a.load(tir.min_(c, 2), x), b.load(tir.max_(c - 3, 0), x))
    inner = For(x, C(0), C(4), ForKind.VECTORIZED, BufferStore(out, value, [c, x]))
    func = PrimFunc("cat", [a, b, out], For(c, C(0), C(5), ForKind.PARALLEL, inner, "", {PARTITION_SELECTS: None}))
    after = loop_partition(func)
    loops = [n for n in _nodes(after.body) if isinstance(n, For) and n.kind is ForKind.PARALLEL]
    assert [(n.min.value, n.extent.value) for n in loops] == [(0, 3), (3, 2)] and "select" not in str(after)
    arr_a, arr_b = np.arange(12, dtype="float32").reshape(3, 4), -np.arange(8, dtype="float32").reshape(2, 4)
    got = np.zeros((5, 4), "float32")
    run(after, arr_a, arr_b, got)
    np.testing.assert_array_equal(got, np.concatenate([arr_a, arr_b]))


def test_loop_partition_leaves_selects_of_loops_without_the_annotation() -> None:
    before = _pad_func(False)
    assert str(loop_partition(before)).count("select") == 1


def test_simplify_merges_a_quotient_and_its_remainder_back() -> None:
    p, po, pi = tir.Var("p"), tir.Var("po"), tir.Var("pi")
    assert _text(simplify((p // 56) * 56 + p % 56)) == "p"
    assert _text(simplify(((p // 56) * 56 + p % 56) * 3 + 1)) == "p * 3 + 1"
    q = po * 64 + pi
    assert _text(simplify((q // 56) * 56 + q % 56)) == "po * 64 + pi"  # a fused axis split: affine again
    assert _text(simplify((p // 56) * 28 + p % 56)) == "p // 56 * 28 + p % 56"  # not a quotient's multiple


@settings(max_examples=200, deadline=None)
@given(EXPRS, st.integers(2, 9), st.integers(-3, 3), st.lists(st.tuples(*[st.integers(-40, 40)] * 3), min_size=1,
                                                              max_size=4))
def test_merged_quotient_and_remainder_keep_their_value(
    e: tir.PrimExpr, c: int, k: int, points: list[tuple[int, ...]]
) -> None:
    merged = (e // c) * (c * k) + (e % c) * k + vi
    s = simplify(merged)
    for point in points:
        env = dict(zip(VARS, point, strict=True))
        assert eval_expr(s, env) == eval_expr(merged, env)


# ---------------------------------------------------------------------------
# unroll_loops, substitute
# ---------------------------------------------------------------------------


def test_unroll_replaces_small_constant_loops_by_copies() -> None:
    a, b = tir.buffer("A", [4]), tir.buffer("B", [4])
    f = PrimFunc("f", [a, b], tir.for_range(vi, 4, BufferStore(b, a.load(vi), [vi]), ForKind.UNROLLED))
    out = unroll_loops(f)
    assert str(out.body) == "B[0] = A[0]\nB[1] = A[1]\nB[2] = A[2]\nB[3] = A[3]"


def test_unroll_gives_inner_loops_fresh_variables_and_keeps_semantics() -> None:
    a, b = tir.buffer("A", [3, 5]), tir.buffer("B", [3, 5])
    v = tir.Var("v", "float32")
    tmp = tir.buffer("T", [1], scope="local")
    inner = tir.for_range(
        vj,
        5,
        LetStmt(
            v,
            a.load(vi, vj),
            Allocate(tmp, tir.seq(BufferStore(tmp, v * 3.0, [C(0)]), BufferStore(b, tmp.load(0), [vi, vj]))),
        ),
    )
    f = PrimFunc("f", [a, b], tir.for_range(vi, 3, inner, ForKind.UNROLLED, start=0))
    out = unroll_loops(f)
    loops = [n for n in _nodes(out.body) if isinstance(n, For)]
    assert len(loops) == 3 and len({id(loop.loop_var) for loop in loops}) == 3
    assert "for j_2 in range(5)" in str(out)
    arr_a = np.arange(15, dtype="float32").reshape(3, 5)
    arr_b = np.zeros((3, 5), "float32")
    run(out, arr_a, arr_b)
    np.testing.assert_array_equal(arr_b, arr_a * 3)


def test_unroll_keeps_large_and_symbolic_loops() -> None:
    n = tir.Var("n")
    b = tir.buffer("B", [n])
    big = tir.for_range(vi, 32, BufferStore(b, C(1.0), [vi]), ForKind.UNROLLED)
    sym = tir.for_range(vj, n, BufferStore(b, C(1.0), [vj]), ForKind.UNROLLED)
    f = PrimFunc("f", [b], tir.seq(big, sym))
    assert str(unroll_loops(f)) == str(f)
    unrolled = unroll_loops(f, max_extent=32).body
    assert isinstance(unrolled, SeqStmt) and isinstance(unrolled.stmts[0], BufferStore)


def test_substitute_folds_constants_and_returns_the_same_object_when_unchanged() -> None:
    e = vi * 4 + vj
    assert _text(substitute(e, {vi: C(2)})) == "8 + j"
    assert substitute(e, {vk: C(2)}) is e
    b = tir.buffer("B", [4], "int32")
    s = tir.for_range(vj, 4, BufferStore(b, vi + vj, [vj]))
    assert str(substitute(s, {vi: C(7)})) == "for j in range(4):\n    B[j] = 7 + j"


# ---------------------------------------------------------------------------
# functor
# ---------------------------------------------------------------------------


def _nodes(node: tir.Stmt | tir.PrimExpr) -> list[tir.Stmt | tir.PrimExpr]:
    out: list[tir.Stmt | tir.PrimExpr] = []
    post_order_visit(node, out.append)
    return out


def test_post_order_visit_sees_children_before_parents() -> None:
    e = (vi + vj) * vk
    assert [type(n).__name__ for n in _nodes(e)] == ["Var", "Var", "Add", "Var", "Mul"]


def test_mutator_rebuilds_only_what_changed() -> None:
    b = tir.buffer("B", [4], "int32")
    s = tir.seq(BufferStore(b, vi, [C(0)]), BufferStore(b, vj, [C(1)]))

    class RenameJ(StmtExprMutator):
        def visit_var(self, e: tir.Var) -> tir.PrimExpr:
            return vk if e is vj else e

    out = RenameJ().visit_stmt(s)
    assert isinstance(out, SeqStmt) and isinstance(s, SeqStmt)
    assert out.stmts[0] is s.stmts[0] and out.stmts[1] is not s.stmts[1]
    assert RenameJ().visit_stmt(s.stmts[0]) is s.stmts[0]


def test_long_statement_lists_need_no_deep_recursion() -> None:
    b = tir.buffer("B", [1], "int32")
    s = SeqStmt(tuple(BufferStore(b, vi + k, [C(0)]) for k in range(sys.getrecursionlimit() * 2)))
    assert len(_nodes(s)) > len(s.stmts)
    assert isinstance(simplify_stmt(s), SeqStmt)
    assert used_vars(s) == {vi}
    assert str(s).count("\n") == len(s.stmts) - 1


# ---------------------------------------------------------------------------
# printer
# ---------------------------------------------------------------------------


def _showcase() -> PrimFunc:
    n = tir.Var("n")
    a, b = tir.buffer("A", [n, 16]), tir.buffer("B", [n, 16])
    tmp = tir.buffer("acc", [16], scope="local")
    i, j, t = tir.Var("i"), tir.Var("j"), tir.Var("t")
    s = tir.Var("s", "float32")
    inner = tir.seq(
        tir.for_range(j, 16, BufferStore(tmp, a.load(i, j), [j]), ForKind.VECTORIZED),
        For(t, C(0), C(4), ForKind.UNROLLED, Evaluate(tir.call("exp", tmp.load(t))), annotations={"step": 2, "a": 1}),
        LetStmt(
            s,
            tir.select(i < 3, tmp.load(0), C(0.0)),
            IfThenElse(
                tir.any_of(tir.logical_not(i < 2), tir.eq(i % 2, 0)),
                BufferStore(b, s * (a.load(i, 0) + 1.0), [i, C(0)]),
                BufferStore(b, tir.cast("float32", i), [i, C(0)]),
            ),
        ),
    )
    body = tir.for_range(i, n, Allocate(tmp, inner), ForKind.PARALLEL)
    return PrimFunc("showcase", [a, b], body, {"target": "llvm"})


SHOWCASE = """\
def showcase(A: float32[n, 16], B: float32[n, 16]):
    # attrs: target='llvm'
    for i in range(n):  # parallel
        acc = allocate((16), float32, 'local')
        for j in range(16):  # vectorized
            acc[j] = A[i, j]
        for t in range(4):  # unrolled pragmas: a=1, step=2
            exp(acc[t])
        s = select(i < 3, acc[0], 0.0)
        if not i < 2 or i % 2 == 0:
            B[i, 0] = s * (A[i, 0] + 1.0)
        else:
            B[i, 0] = float32(i)"""


def test_printer_shows_loop_kinds_allocations_lets_ifs_and_pragmas() -> None:
    assert str(_showcase()) == SHOWCASE


@pytest.mark.parametrize(
    ("build", "expected"),
    [
        (lambda: (vi - (vj - vk)) * (vi + vj), "(i - (j - k)) * (i + j)"),
        (lambda: vi - vj - vk, "i - j - k"),
        (lambda: tir.binary(tir.LT, vi < vj, vj < vk), "(i < j) < (j < k)"),
        (lambda: tir.all_of(vi < vj, tir.any_of(vj < vk, vk < vi)), "i < j and (j < k or k < i)"),
        (lambda: tir.binary(tir.FloorDiv, vi, vj) * 3, "i // j * 3"),
        (lambda: vi * (vj // 2), "i * (j // 2)"),
        (lambda: vi * -1, "i * -1"),
        (lambda: tir.cast("int64", vi) + tir.const(3, "int64"), "int64(i) + int64(3)"),
        (lambda: tir.call("isnan", vx, dtype="bool"), "isnan<bool>(x)"),
    ],
)
def test_printer_parenthesizes_by_precedence(build: Callable[[], tir.PrimExpr], expected: str) -> None:
    assert _text(build()) == expected


def test_printer_names_distinct_vars_that_share_a_name_apart() -> None:
    i2 = tir.Var("i")
    assert _text(vi + i2) == "i + i_1"


def _make(
    extent: int = 8, kind: ForKind = ForKind.SERIAL, dtype: str = "float32", name: str = "B", scale: float = 2.0
) -> PrimFunc:
    a, b = tir.buffer("A", [extent], dtype), tir.buffer(name, [extent], dtype)
    i = tir.Var("i")
    return PrimFunc(
        "f", [a, b], tir.for_range(i, extent, BufferStore(b, a.load(i) * tir.const(scale, dtype), [i]), kind)
    )


def test_structurally_equal_functions_print_identically() -> None:
    assert str(_make()) == str(_make())
    assert str(_make(kind=ForKind.VECTORIZED)) == str(_make(kind=ForKind.VECTORIZED))


@pytest.mark.parametrize(
    "variant",
    [
        {"extent": 9},
        {"kind": ForKind.PARALLEL},
        {"dtype": "float64"},
        {"name": "C"},
        {"scale": 3.0},
    ],
)
def test_functions_that_differ_print_differently(variant: dict[str, object]) -> None:
    assert str(_make(**variant)) != str(_make())  # type: ignore[arg-type]  # the parametrized kwargs fit _make


def test_simplify_output_is_deterministic_across_separately_built_functions() -> None:
    assert str(loop_partition(_split_func(None))) == str(loop_partition(_split_func(None)))


@pytest.mark.parametrize(("extent", "factor"), [(1, 4), (3, 4), (17, 4), (30, 7), (49, 7), (8, 8), (5, 16)])
def test_loop_partition_keeps_semantics_for_assorted_extents_and_factors(extent: int, factor: int) -> None:
    before = _split_func(extent, factor)
    after = loop_partition(before)
    _check_same_result(before, after, [extent])
    sym = _split_func(None, factor)
    _check_same_result(sym, loop_partition(sym), [extent])
    if extent >= factor:
        assert isinstance(_vector_loops(after)[0].body, BufferStore)


# ---------------------------------------------------------------------------
# high-rank reshapes: the flattened index `((i0*2 + i1)*2 + i2)...` divided and reduced
# by every input dim once took the simplifier exponential time (rank 9: 25 s, rank 10: 80 s)
# ---------------------------------------------------------------------------

BUILD_GUARD_S = 60  # not a benchmark: each case builds in well under a second


@contextlib.contextmanager
def _build_guard(what: str) -> Iterator[None]:
    """Fails (rather than hanging the suite) when the block runs past BUILD_GUARD_S."""
    if not hasattr(signal, "SIGALRM") or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum: int, frame: object) -> None:
        raise AssertionError(f"{what} did not build within {BUILD_GUARD_S} s (exponential simplification?)")

    old = signal.signal(signal.SIGALRM, expire)
    signal.alarm(BUILD_GUARD_S)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _build_layout_chain(shape: tuple[int, ...], steps: list[tuple[str, list[int]]]) -> None:
    """Builds `x + 1`, then each reshape ("r") / transpose ("t") of `steps`, then `* 2`: one fused kernel."""
    from kiln import relay

    x = relay.var("x", shape=shape)
    data = np.random.default_rng(len(steps)).standard_normal(shape).astype("float32")
    y = relay.add(x, relay.const(1.0))
    want = data + 1
    for kind, arg in steps:
        if kind == "r":
            y, want = relay.reshape(y, arg), want.reshape(arg)
        else:
            y, want = relay.transpose(y, arg), np.transpose(want, arg)
    with _build_guard(f"{shape} -> {steps}"):
        lib = relay.build(relay.Function([x], relay.multiply(y, relay.const(2.0))))
    np.testing.assert_array_equal(lib.create_executor()(x=data), want * 2)


@pytest.mark.parametrize(
    "newshape",
    [
        [2, 2, 2, 8, 2, 2, 2, 8, 6],
        [2, 2, 2, 8, 2, 2, 2, 8, 2, 3],
        [2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 4, 6],
        [3, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 8],
    ],
)
def test_high_rank_reshapes_build_quickly_and_match_numpy(newshape: list[int]) -> None:
    _build_layout_chain((8, 16, 12, 16), [("r", newshape)])


def test_high_rank_reshape_transpose_chains_build_quickly_and_match_numpy() -> None:
    rank12 = [2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 4, 6]
    interleave = [11, 0, 10, 1, 9, 2, 8, 3, 7, 4, 6, 5]
    _build_layout_chain((8, 16, 12, 16), [("r", rank12), ("t", interleave), ("r", [3, 8, 1024]), ("r", rank12),
                                         ("t", list(range(11, -1, -1))), ("r", [96, 256])])
    _build_layout_chain((2, 3, 2, 3, 2, 3, 2, 3, 2, 3), [("t", list(range(9, -1, -1))), ("r", [6, 6, 6, 6, 6]),
                                                        ("t", [4, 3, 2, 1, 0]), ("r", [2, 3] * 5)])
