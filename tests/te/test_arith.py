"""te's symbolic intervals (`bound`, `relax`, `hull`) over tir's linear forms, and the rewriting helpers."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tir_interp import eval_expr

from kiln import tir
from kiln.te import arith
from kiln.tir.simplify import Analyzer, Linear, linear_form

C = tir.const
io, ii, jj, n = tir.Var("io"), tir.Var("ii"), tir.Var("jj"), tir.Var("n")


def _ends(rng: tuple[Linear, Linear] | None) -> tuple[str, str] | None:
    if rng is None:
        return None
    ana = Analyzer()
    return str(ana.expr_of(rng[0])), str(ana.expr_of(rng[1]))


def test_te_has_no_linear_engine_of_its_own() -> None:
    # the linear forms, their canonical expressions and index simplification are tir's
    for name in ("Lin", "linearize", "lin_of", "lin_min", "lin_max", "atom", "simplify", "_key"):
        assert not hasattr(arith, name), name


def test_relax_a_split_index_over_its_loops() -> None:
    e = io * 4 + ii
    assert _ends(arith.relax(e, [(ii, C(4))])) == ("io * 4", "io * 4 + 3")
    assert _ends(arith.relax(e, [(ii, C(4)), (io, C(5))])) == ("0", "19")


def test_relax_keeps_symbolic_extents_of_outer_loops() -> None:
    # the outer loop's extent is ceil(n / 16): the region ends in terms of n
    ext = (n + 15) // 16
    rng = arith.relax(io * 16 + ii, [(ii, C(16)), (io, ext)])
    assert _ends(rng) == ("0", "(n + 15) // 16 * 16 - 1")


def test_relax_runs_from_the_innermost_loop_out_through_extents_that_use_outer_vars() -> None:
    # a triangular nest: jj < io + 1
    rng = arith.relax(io + jj, [(jj, io + 1), (io, C(6))])
    assert _ends(rng) == ("0", "10")


def test_floor_division_bounds_are_in_tir_canonical_form() -> None:
    assert _ends(arith.relax((io * 4 + ii) // 2, [(ii, C(4))])) == ("io * 2", "io * 2 + 1")
    # tir takes `io * 4` out of the modulo first: `ii % 4`, with ii in [0, 2]
    assert _ends(arith.relax((io * 4 + ii) % 4, [(ii, C(3))])) == ("0", "2")
    assert _ends(arith.relax((ii + 2) % 4, [(ii, C(3))])) == ("0", "3")  # wraps: the whole range


def test_min_and_max_bounds() -> None:
    assert _ends(arith.relax(tir.min_(ii, C(5)), [(ii, C(8))])) == ("0", "5")
    assert _ends(arith.relax(tir.max_(io * 4 + ii, n), [(ii, C(4))])) == ("max(io * 4, n)", "max(io * 4 + 3, n)")


def test_what_cannot_be_bounded_gives_none() -> None:
    assert arith.relax(ii * ii, [(ii, C(4))]) is None
    assert arith.relax(ii * n, [(ii, C(4))]) is None
    assert arith.relax(tir.select(ii < 2, ii, C(0)), [(ii, C(4))]) is None
    assert arith.relax(tir.Var("x", "float32"), [(ii, C(4))]) is None


def test_bound_leaves_other_variables_symbolic_and_scales_by_constants() -> None:
    env = {ii: (Linear("int32"), linear_form(n - 1))}
    assert _ends(arith.bound(C(3) * (io - ii), env)) == ("io * 3 - n * 3 + 3", "io * 3")
    assert _ends(arith.bound(io, env)) == ("io", "io")


def test_hull_is_exact_where_the_ends_differ_by_a_constant() -> None:
    ana = Analyzer()
    a = (linear_form(io * 4), linear_form(io * 4 + 3))
    b = (linear_form(io * 4 + 1), linear_form(io * 4 + 5))
    assert _ends(arith.hull(ana, a, b)) == ("io * 4", "io * 4 + 5")
    c = (linear_form(n), linear_form(n))
    assert _ends(arith.hull(ana, a, c)) == ("min(io * 4, n)", "max(io * 4 + 3, n)")
    assert arith.hull(ana, None, a) is a and arith.hull(ana, None, None) is None


# ---------------------------------------------------------------------------
# soundness: every value over the loops lies between the ends
# ---------------------------------------------------------------------------

LOOP_VARS = [ii, jj, io]
_leaf = st.one_of(st.sampled_from([*LOOP_VARS, n]), st.integers(-6, 6).map(lambda v: C(v)))


def _extend(children: st.SearchStrategy[tir.PrimExpr]) -> st.SearchStrategy[tir.PrimExpr]:
    pair = st.tuples(children, children)
    scale = st.tuples(children, st.integers(-4, 4))
    divisor = st.tuples(children, st.integers(1, 7))
    return st.one_of(
        pair.map(lambda t: t[0] + t[1]),
        pair.map(lambda t: t[0] - t[1]),
        scale.map(lambda t: t[0] * t[1]),
        divisor.map(lambda t: t[0] // t[1]),
        divisor.map(lambda t: t[0] % t[1]),
        pair.map(lambda t: tir.min_(t[0], t[1])),
        pair.map(lambda t: tir.max_(t[0], t[1])),
    )


EXPRS = st.recursive(_leaf, _extend, max_leaves=8)


@settings(max_examples=200, deadline=None)
@given(EXPRS, st.integers(1, 4), st.integers(1, 3), st.integers(-5, 5))
def test_relaxed_ends_hold_every_value_over_the_loops(e: tir.PrimExpr, ext_i: int, ext_o: int, nv: int) -> None:
    # ii over [0, ext_i), jj over [0, io + 1) (an extent using an outer loop), io over [0, ext_o)
    loops = [(ii, C(ext_i)), (jj, io + 1), (io, C(ext_o))]
    rng = arith.relax(e, loops)
    if rng is None:
        return
    ana = Analyzer()
    lo, hi = ana.expr_of(rng[0]), ana.expr_of(rng[1])
    assert not ({v for v in arith.free_vars(lo) + arith.free_vars(hi)} & set(LOOP_VARS)), (str(lo), str(hi))
    low, high = eval_expr(lo, {n: nv}), eval_expr(hi, {n: nv})
    for o, i in itertools.product(range(ext_o), range(ext_i)):
        for j in range(o + 1):
            v = eval_expr(e, {ii: i, jj: j, io: o, n: nv})
            assert low <= v <= high, f"{e}: {v} outside [{lo}, {hi}] = [{low}, {high}]"


@pytest.mark.parametrize("bad", [0, -3])
def test_tir_floordiv_of_a_linear_form_needs_a_positive_divisor(bad: int) -> None:
    with pytest.raises(ValueError, match="divisor"):
        Analyzer().floordiv(linear_form(io), bad)
