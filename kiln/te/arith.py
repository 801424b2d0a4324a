"""Expression rewriting, and the symbolic intervals that te's bound inference needs.

`transform` / `substitute` rebuild expressions (te's `Reduce` included);
`free_vars` and `loads` list what an expression uses.

Integer arithmetic is tir's (`kiln.tir.simplify`): linear forms are its
`Linear`, canonical expressions come from `Analyzer.expr_of`, and index
expressions are simplified by `Analyzer.simplify`. What te adds on top is
*symbolic* interval propagation: `bound` gives lower and upper bounds of an
expression, as a pair of `Linear` forms, while some variables range over
intervals whose ends may themselves be symbolic (`0 <= io <= (n + 15) // 16 - 1`),
and `relax` applies it over a loop nest from the innermost loop out. tir's
`Analyzer` only gives constant intervals, which is not enough to size a
`compute_at` region in terms of the loops around it. Everything is
conservative: `None` means "cannot tell".
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping

from kiln.ir import graph
from kiln.te.tensor import Reduce, children
from kiln.tir import expr as tx
from kiln.tir.expr import BufferLoad, PrimExpr, Var
from kiln.tir.simplify import LINEAR_DTYPES, Analyzer, Linear

# ---------------------------------------------------------------------------
# Rewriting
# ---------------------------------------------------------------------------


def rebuild(e: PrimExpr, new: tuple[PrimExpr, ...]) -> PrimExpr:
    """`e` with its children (`children(e)`, in order) replaced by `new`, folding constants.

    Returns `e` itself when every new child is the old one.
    """
    kids = children(e)
    if all(a is b for a, b in zip(kids, new, strict=True)):
        return e
    if isinstance(e, tx.BinaryOp):
        return tx.binary(type(e), new[0], new[1])
    if isinstance(e, tx.Not):
        return tx.logical_not(new[0])
    if isinstance(e, tx.Cast):
        return tx.cast(e.dtype, new[0])
    if isinstance(e, tx.Select):
        return tx.select(new[0], new[1], new[2])
    if isinstance(e, tx.Call):
        return tx.Call(e.dtype, e.name, new)
    if isinstance(e, BufferLoad):
        return BufferLoad(e.dtype, e.buffer, new)
    if isinstance(e, Reduce):
        return Reduce(e.dtype, e.combiner, new[0], e.axis, new[1])
    raise TypeError(f"cannot rebuild {type(e).__name__}")


def transform(e: PrimExpr, pre: Callable[[PrimExpr], PrimExpr | None]) -> PrimExpr:
    """Rebuilds `e` bottom-up; where `pre(node)` returns an expression, it replaces the node whole.

    Unchanged sub-trees keep their identity; constants fold as nodes are rebuilt.
    A sub-expression shared by several parents is rewritten once (`pre` must not
    depend on where a node occurs), so a DAG costs its number of distinct nodes,
    not the size of its unfolded tree; an explicit stack keeps deep expressions
    clear of the recursion limit.
    """
    done: dict[int, PrimExpr] = {}  # id of a node of `e` -> its rewrite; `e` keeps every key alive
    stack: list[tuple[PrimExpr, bool]] = [(e, False)]
    while stack:
        x, ready = stack.pop()
        if id(x) in done:
            continue
        if ready:
            done[id(x)] = rebuild(x, tuple(done[id(k)] for k in children(x)))
            continue
        out = pre(x)
        if out is not None:
            done[id(x)] = out
            continue
        kids = children(x)
        if not kids:
            done[id(x)] = x
            continue
        stack.append((x, True))
        stack.extend((k, False) for k in reversed(kids) if id(k) not in done)
    return done[id(e)]


def substitute(e: PrimExpr, vmap: Mapping[Var, PrimExpr]) -> PrimExpr:
    """`e` with each variable in `vmap` replaced by its expression."""
    if not vmap:
        return e
    return transform(e, lambda x: vmap.get(x) if isinstance(x, Var) else None)


def _distinct_nodes(e: PrimExpr) -> list[PrimExpr]:
    """The nodes of `e` in post order, each shared sub-expression once."""
    return graph.post_order([e], children)


def free_vars(e: PrimExpr) -> list[Var]:
    """The variables in `e`, in first-seen order."""
    return [x for x in _distinct_nodes(e) if isinstance(x, Var)]


def loads(e: PrimExpr) -> list[BufferLoad]:
    """Every buffer load in `e` (loads inside indices too, before the loads that read at them).

    A load node shared by several parents is listed once.
    """
    return [x for x in _distinct_nodes(e) if isinstance(x, BufferLoad)]


# ---------------------------------------------------------------------------
# Symbolic intervals
# ---------------------------------------------------------------------------

SymInterval = tuple[Linear, Linear]  # inclusive [lo, hi], each end a tir linear form


class _Ctx:
    """One bounding question: the ranging variables, tir's analyzer, and the free variables of atoms met."""

    __slots__ = ("ana", "env", "fv")

    def __init__(self, env: Mapping[Var, SymInterval], ana: Analyzer | None) -> None:
        self.env = env
        self.ana = ana if ana is not None else Analyzer()
        self.fv: dict[int, tuple[PrimExpr, frozenset[Var]]] = {}  # id of an atom -> (atom, its vars)

    def uses_env(self, atom: PrimExpr) -> bool:
        if isinstance(atom, Var):
            return atom in self.env
        hit = self.fv.get(id(atom))
        if hit is None:
            hit = self.fv[id(atom)] = (atom, frozenset(free_vars(atom)))
        return any(v in self.env for v in hit[1])


def hull(ana: Analyzer, a: SymInterval | None, b: SymInterval | None) -> SymInterval | None:
    """The smallest interval holding `a` and `b` (ends exact where tir can order them); None only if both are."""
    if a is None or b is None:
        return a or b
    return ana.min_of(a[0], b[0]), ana.max_of(a[1], b[1])


def bound(e: PrimExpr, env: Mapping[Var, SymInterval], ana: Analyzer | None = None) -> SymInterval | None:
    """Inclusive bounds of the integer expression `e` while each var of `env` ranges over its interval.

    Variables not in `env` stay symbolic. `e` is taken as tir's linear form;
    its atoms that use a ranging variable may be that variable, floor division
    or modulo by a positive constant, min or max (or a product with a constant
    range): anything else gives None. `ana` (with no variable bounds of its own)
    builds the linear forms; a fresh one when not given.
    """
    return _bound_expr(e, _Ctx(env, ana))


def _bound_expr(e: PrimExpr, ctx: _Ctx) -> SymInterval | None:
    if e.dtype not in LINEAR_DTYPES:
        return None
    return _bound_linear(ctx.ana.linear(e), ctx)


def _bound_linear(lin: Linear, ctx: _Ctx) -> SymInterval | None:
    """Bounds of a linear form: its atoms that use no ranging variable stay as they are."""
    fixed: dict[Hashable, tuple[PrimExpr, int]] = {}
    ranging: list[tuple[PrimExpr, int]] = []
    for key, (atom, c) in lin.terms.items():
        if ctx.uses_env(atom):
            ranging.append((atom, c))
        else:
            fixed[key] = (atom, c)
    if not ranging:
        return lin, lin
    lo = hi = Linear(lin.dtype, fixed, lin.const)
    for atom, c in ranging:
        b = _bound_atom(atom, ctx)
        if b is None:
            return None
        lo, hi = (lo.add(b[0], c), hi.add(b[1], c)) if c > 0 else (lo.add(b[1], c), hi.add(b[0], c))
    return lo, hi


def _const_of(rng: SymInterval) -> int | None:
    """The value of an interval that is a single constant, else None."""
    lo, hi = rng
    return lo.const if lo.is_const and hi.is_const and lo.const == hi.const else None


def _bound_atom(e: PrimExpr, ctx: _Ctx) -> SymInterval | None:
    """Bounds of an atom of a linear form that uses a ranging variable."""
    ana = ctx.ana
    if isinstance(e, Var):
        return ctx.env[e]
    if isinstance(e, tx.Mul):
        a, b = _bound_expr(e.a, ctx), _bound_expr(e.b, ctx)
        if a is None or b is None:
            return None
        c = _const_of(a)
        if c is None:
            c, a, b = _const_of(b), b, a
        if c is None:
            return None
        lo, hi = b[0].scale(c), b[1].scale(c)
        return (lo, hi) if c >= 0 else (hi, lo)
    if isinstance(e, (tx.FloorDiv, tx.FloorMod)) and isinstance(e.b, tx.IntImm) and e.b.value > 0:
        a = _bound_expr(e.a, ctx)
        if a is None:
            return None
        c, (lo, hi) = e.b.value, a
        if isinstance(e, tx.FloorDiv):  # monotonic: the quotients of the ends, in tir's canonical form
            qlo = ana.floordiv(lo, c)
            return qlo, qlo if hi is lo else ana.floordiv(hi, c)
        if lo.is_const and hi.is_const and lo.const // c == hi.const // c:
            return Linear(e.dtype, c=lo.const % c), Linear(e.dtype, c=hi.const % c)
        return Linear(e.dtype), Linear(e.dtype, c=c - 1)
    if isinstance(e, (tx.Min, tx.Max)):
        a, b = _bound_expr(e.a, ctx), _bound_expr(e.b, ctx)
        if a is None or b is None:
            return None
        pick = ana.min_of if isinstance(e, tx.Min) else ana.max_of
        return pick(a[0], b[0]), pick(a[1], b[1])
    return None


def relax(e: PrimExpr, loops: list[tuple[Var, PrimExpr]], ana: Analyzer | None = None) -> SymInterval | None:
    """Bounds of `e` over the loops `[(var, extent), ...]`, innermost first, each from 0.

    A loop's extent may depend on the variables of loops further out, so the
    loops are relaxed one at a time from the inside out, each over the ends
    found so far. `ana` (with no variable bounds of its own) builds the linear
    forms; a fresh one when not given.
    """
    if e.dtype not in LINEAR_DTYPES:
        return None
    ctx = _Ctx({}, ana)
    lo = hi = ctx.ana.linear(e)
    for v, ext in loops:
        ctx.env = {v: (Linear(v.dtype), ctx.ana.linear(ext).plus(-1))}
        rlo = _bound_linear(lo, ctx)
        rhi = rlo if hi is lo else _bound_linear(hi, ctx)
        if rlo is None or rhi is None:
            return None
        lo, hi = rlo[0], rhi[1]
    return lo, hi
