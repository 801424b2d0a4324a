"""Tails of splits that do not divide: the static bounds check over them, and their guards.

Loop partitioning and splits that do not divide leave tails whose extent is
`min(197 - o*64, 64)` or `max(646 - o*16, 0)`. Their accesses are in bounds only
through what the extent shares with the index (`o*64 + i <= 196`); the check
(kiln.tir.bounds_check, on the simplifier's bounds) must see that, and must
still refuse an access one past the end. A tail's guard that te writes through
a division (`(o*16 + i) // 14 < 14`) is simplified to an affine one, which loop
partitioning takes out of the main part.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tir_interp import eval_expr

from kiln import tir
from kiln.tir.bounds_check import OutOfBoundsError, check_accesses
from kiln.tir.simplify import Analyzer, simplify, simplify_stmt
from kiln.tir.stmt import BufferStore, For, ForKind, IfThenElse, PrimFunc
from kiln.tir.transform import loop_partition, simplify_func

C = tir.const
Extent = Callable[[tir.PrimExpr], tir.PrimExpr]


def _tail_copy(size: int, outer: int, extent: Extent, index: Callable[[tir.Var, tir.Var], tir.PrimExpr]) -> PrimFunc:
    """`for o in range(outer): for i in range(extent(o)): B[index(o, i)] = A[index(o, i)]`, A and B of `size`."""
    a, b = tir.buffer("A", (size,)), tir.buffer("B", (size,))
    o, i = tir.Var("o"), tir.Var("i")
    at = index(o, i)
    inner = tir.for_range(i, extent(o), BufferStore(b, a.load(at), [at]))
    return PrimFunc("tail", [a, b], tir.for_range(o, outer, inner))


def _min_tail(o: tir.PrimExpr) -> tir.PrimExpr:
    return tir.min_(197 - o * 64, 64)


def _max_tail(o: tir.PrimExpr) -> tir.PrimExpr:
    return tir.max_(646 - o * 16, 0)


def _main_part(o: tir.PrimExpr) -> tir.PrimExpr:
    return tir.min_(tir.max_(197 - o * 64, 0), 64)  # the form of a partitioned main part's extent


@pytest.mark.parametrize(("size", "outer", "extent", "stride"), [
    (197, 4, _min_tail, 64),
    (646, 41, _max_tail, 16),
    (646, 50, _max_tail, 16),  # outer iterations past the end run no inner iteration
    (197, 4, _main_part, 64),
])
def test_a_tail_whose_extent_is_a_min_or_max_is_accepted_and_one_past_it_refused(
    size: int, outer: int, extent: Extent, stride: int
) -> None:
    check_accesses(_tail_copy(size, outer, extent, lambda o, i: o * stride + i))
    with pytest.raises(OutOfBoundsError, match=f"reaches indices \\[1, {size}\\]"):
        check_accesses(_tail_copy(size, outer, extent, lambda o, i: o * stride + i + 1))
    with pytest.raises(OutOfBoundsError, match="a write of buffer B at axis 0"):
        check_accesses(_tail_copy(size - 1, outer, extent, lambda o, i: o * stride + i))


def test_a_min_extent_whose_bound_side_is_too_large_is_refused() -> None:
    # min(200 - o*64, 64): the last tile runs to 199 in a buffer of 197
    with pytest.raises(OutOfBoundsError, match=r"reaches indices \[0, 199\]"):
        check_accesses(_tail_copy(197, 4, lambda o: tir.min_(200 - o * 64, 64), lambda o, i: o * 64 + i))
    # the constant side alone bounds the index where the other side is past the buffer's end
    check_accesses(_tail_copy(197, 4, lambda o: tir.min_(300 - o * 48, 48), lambda o, i: o * 48 + i))


def test_a_tail_in_a_fused_loop_is_accepted() -> None:
    # te's split of a column axis fused with a batch axis: the tile's column is `f % 4`
    f, i = tir.Var("f"), tir.Var("i")
    a, b = tir.buffer("A", (12, 197)), tir.buffer("B", (12, 197))
    column = f % 4 * 64 + i
    body = BufferStore(b, a.load(f // 4, column), [f // 4, column])
    check_accesses(PrimFunc("fused", [a, b], tir.for_range(f, 48, tir.for_range(i, tir.min_(197 - f % 4 * 64, 64),
                                                                               body))))
    shifted = BufferStore(b, a.load(f // 4, column + 1), [f // 4, column])
    with pytest.raises(OutOfBoundsError, match=r"a read of buffer A at axis 1 reaches indices \[1, 197\]"):
        check_accesses(PrimFunc("fused", [a, b], tir.for_range(f, 48, tir.for_range(
            i, tir.min_(197 - f % 4 * 64, 64), shifted))))


def test_the_simplifier_decides_a_tail_guard_by_its_loop_extent() -> None:
    o, i = tir.Var("o"), tir.Var("i")
    a = tir.buffer("A", (197,))
    guarded = tir.IfThenElse(o * 64 + i < 197, BufferStore(a, C(0.0, "float32"), [o * 64 + i]))
    out = simplify_stmt(tir.for_range(o, 4, tir.for_range(i, _min_tail(o), guarded)))
    assert "if" not in str(out)
    ana = Analyzer()
    with ana.bound_range(o, C(0), C(50)), ana.bound_range(i, C(0), _max_tail(o)):
        assert str(ana.simplify(o * 16 + i < 646)) == "True"
    assert str(simplify(o * 16 + i < 646, {o: (0, 50), i: (0, _max_tail(o))})) == "o * 16 + i < 646"  # not a loop


# -- soundness: the bounds hold at every point of the loops, whatever the min/max extent ------------------


def _extents() -> st.SearchStrategy[Extent]:
    n, c, k = st.integers(-20, 120), st.integers(-8, 24), st.integers(-4, 40)
    affine = st.tuples(n, c).map(lambda t: (lambda o, n=t[0], c=t[1]: n - o * c))

    def combine(op: Callable[[tir.PrimExpr, tir.PrimExpr], tir.PrimExpr], x: Extent, y: Extent) -> Extent:
        return lambda o: op(x(o), y(o))

    const = k.map(lambda v: (lambda o, v=v: C(v)))
    leaf = st.one_of(affine, const)
    return st.recursive(leaf, lambda inner: st.one_of(
        st.tuples(inner, inner).map(lambda t: combine(tir.min_, *t)),
        st.tuples(inner, inner).map(lambda t: combine(tir.max_, *t)),
    ), max_leaves=4)


@settings(max_examples=300, deadline=None)
@given(_extents(), st.integers(1, 12), st.integers(-16, 16), st.integers(-3, 3), st.integers(-30, 30))
def test_the_bounds_of_an_index_under_a_min_max_extent_hold_everywhere(
    extent: Extent, outer: int, co: int, ci: int, d: int
) -> None:
    o, i = tir.Var("o"), tir.Var("i")
    index = o * co + i * ci + d
    ana = Analyzer()
    with ana.bound_range(o, C(0), C(outer)), ana.bound_range(i, C(0), extent(o)):
        lo, hi = ana.interval(index)
        for ov in range(outer):
            for iv in range(int(eval_expr(extent(o), {o: ov}))):
                value = eval_expr(index, {o: ov, i: iv})
                assert (lo is None or lo <= value) and (hi is None or value <= hi), (
                    f"{index} = {value} at o={ov}, i={iv} outside [{lo}, {hi}] (extent {extent(o)})")


# -- a guard through a floor division ------------------------------------------------------------------------


@pytest.mark.parametrize(("cond", "expected"), [
    (lambda x: x // 7 < 3, "x < 21"), (lambda x: x // 7 <= 3, "x < 28"), (lambda x: x // 7 > 3, "x >= 28"),
    (lambda x: x // 7 >= 3, "x >= 21"), (lambda x: 10 - x // 7 < 3, "x >= 56"), (lambda x: x // 7 + 2 < 5, "x < 21"),
])
def test_a_comparison_of_a_quotient_with_a_constant_becomes_one_of_the_dividend(
    cond: Callable[[tir.PrimExpr], tir.PrimExpr], expected: str
) -> None:
    assert str(simplify(cond(tir.Var("x")))) == expected


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 20), st.integers(-30, 30), st.sampled_from([1, -1]), st.sampled_from(["<", "<=", ">", ">="]),
       st.lists(st.integers(-400, 400), min_size=1, max_size=8))
def test_a_comparison_of_a_quotient_keeps_its_truth_value(c: int, r: int, s: int, op: str, xs: list[int]) -> None:
    x = tir.Var("x")
    d = (x // c) * s + r
    cond = {"<": d < 0, "<=": d <= 0, ">": d > 0, ">=": d >= 0}[op]
    out = simplify(cond)
    for v in xs:
        assert bool(eval_expr(out, {x: v})) == bool(eval_expr(cond, {x: v})), f"{cond} -> {out} at x={v}"


def test_the_tail_guard_of_a_split_of_fused_axes_is_partitioned_out() -> None:
    # a 14x14 image, its axes fused and split by 16: the guard of the row index is `(o*16 + i) // 14 < 14`
    a, b = tir.buffer("A", (14, 14)), tir.buffer("B", (14, 14))
    o, i = tir.Var("o"), tir.Var("i")
    p = o * 16 + i
    store = BufferStore(b, a.load(p // 14, p % 14) * 2.0, [p // 14, p % 14])
    body = tir.for_range(o, 13, tir.for_range(i, 16, IfThenElse(p // 14 < 14, store), ForKind.VECTORIZED))
    func = loop_partition(simplify_func(PrimFunc("rows", [a, b], body)))  # as the pipeline runs them
    main = func.body if isinstance(func.body, For) else func.body.stmts[0]  # type: ignore[attr-defined]
    assert isinstance(main, For) and str(main.extent) == "12" and "if" not in str(main)
    check_accesses(func)
