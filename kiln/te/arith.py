"""Expression rewriting and the small integer arithmetic that lowering needs.

`transform` / `substitute` rebuild expressions; `Lin` is an integer linear
form (`sum(coeff * atom) + const`, where an atom is a variable or any
non-linear sub-expression) used to cancel `io*4 + ii - io*4` into `ii`;
`bound` gives symbolic lower and upper bounds of an expression when some
variables range over intervals, for bound inference and for proving guards
unnecessary. Everything is conservative: `None` means "cannot tell".
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping

import attrs

from kiln.ir import graph
from kiln.te.tensor import Reduce, children
from kiln.tir import expr as tx
from kiln.tir.expr import BufferLoad, PrimExpr, Var

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
# Linear forms
# ---------------------------------------------------------------------------


def _key(e: PrimExpr) -> Hashable:
    """A structural key: equal for expressions that print the same with the same variables."""
    if isinstance(e, Var):
        return ("var", e.uid)
    if isinstance(e, (tx.IntImm, tx.FloatImm)):
        return ("imm", e.dtype, e.value)
    extra: Hashable = None
    if isinstance(e, tx.Call):
        extra = e.name
    elif isinstance(e, BufferLoad):
        extra = id(e.buffer)
    return (type(e).__name__, e.dtype, extra, tuple(_key(c) for c in children(e)))


@attrs.frozen
class Lin:
    """`sum(coeff * atom for atom, coeff in terms) + const` over int32."""

    terms: tuple[tuple[Hashable, PrimExpr, int], ...] = ()
    const: int = 0

    @property
    def is_const(self) -> bool:
        """Whether there are no terms."""
        return not self.terms

    def scale(self, c: int) -> Lin:
        """c * self."""
        if c == 0:
            return Lin()
        return Lin(tuple((k, a, n * c) for k, a, n in self.terms), self.const * c)

    def __add__(self, other: Lin | int) -> Lin:
        if isinstance(other, int):
            return Lin(self.terms, self.const + other)
        acc: dict[Hashable, tuple[PrimExpr, int]] = {k: (a, n) for k, a, n in self.terms}
        for k, a, n in other.terms:
            old = acc.get(k)
            acc[k] = (a, n + (old[1] if old else 0))
        return Lin(tuple((k, a, n) for k, (a, n) in acc.items() if n != 0), self.const + other.const)

    def __sub__(self, other: Lin | int) -> Lin:
        if isinstance(other, int):
            return self + (-other)
        return self + other.scale(-1)

    def to_expr(self) -> PrimExpr:
        """The form as an expression: positive terms, then negative ones, then the constant."""
        out: PrimExpr | None = None
        for _, atom, n in sorted(self.terms, key=lambda t: t[2] < 0):
            term = atom if abs(n) == 1 else atom * abs(n)
            if out is None:
                out = term if n > 0 else -term
                continue
            out = out + term if n > 0 else out - term
        if out is None:
            return tx.const(self.const)
        if self.const > 0:
            return out + self.const
        if self.const < 0:
            return out - (-self.const)
        return out


def atom(e: PrimExpr) -> Lin:
    """`e` as a single term."""
    return Lin(((_key(e), e, 1),))


def linearize(e: PrimExpr) -> Lin | None:
    """`e` as a linear form; None for non-integer expressions."""
    if not tx.is_int(e.dtype) or e.dtype == "bool":
        return None
    if e.dtype != "int32":
        return None
    if isinstance(e, tx.IntImm):
        return Lin((), e.value)
    if isinstance(e, (tx.Add, tx.Sub)):
        a, b = linearize(e.a), linearize(e.b)
        if a is None or b is None:
            return atom(e)
        return a + b if isinstance(e, tx.Add) else a - b
    if isinstance(e, tx.Mul):
        a, b = linearize(e.a), linearize(e.b)
        if a is not None and b is not None:
            if b.is_const:
                return a.scale(b.const)
            if a.is_const:
                return b.scale(a.const)
        return atom(e)
    return atom(e)


def simplify(e: PrimExpr) -> PrimExpr:
    """`e` with its linear part collected (`io*4 + ii - io*4` becomes `ii`); other expressions as they are."""
    lin = linearize(e)
    return e if lin is None else lin.to_expr()


def lin_of(e: PrimExpr | int) -> Lin:
    """The linear form of an int32 expression (an atom if it is not linear)."""
    if isinstance(e, int):
        return Lin((), e)
    lin = linearize(e)
    return lin if lin is not None else atom(e)


def lin_min(a: Lin, b: Lin) -> Lin:
    """min(a, b), exact when they differ by a constant."""
    d = a - b
    if d.is_const:
        return a if d.const <= 0 else b
    return atom(tx.min_(a.to_expr(), b.to_expr()))


def lin_max(a: Lin, b: Lin) -> Lin:
    """max(a, b), exact when they differ by a constant."""
    d = a - b
    if d.is_const:
        return a if d.const >= 0 else b
    return atom(tx.max_(a.to_expr(), b.to_expr()))


# ---------------------------------------------------------------------------
# Bounds
# ---------------------------------------------------------------------------

Interval = tuple[Lin, Lin]  # inclusive [lo, hi]


def _uses(e: PrimExpr, env: Mapping[Var, Interval]) -> bool:
    return any(v in env for v in free_vars(e))


def bound(e: PrimExpr, env: Mapping[Var, Interval]) -> Interval | None:
    """Inclusive bounds of the int32 expression `e` while each var of `env` ranges over its interval.

    Variables not in `env` stay symbolic. Affine expressions, floor division and
    modulo by positive constants, min and max are handled; anything else that
    depends on a ranging variable gives None.
    """
    if not _uses(e, env):
        lin = linearize(e)
        return None if lin is None else (lin, lin)
    if isinstance(e, Var):
        return env[e]
    if isinstance(e, (tx.Add, tx.Sub)):
        a, b = bound(e.a, env), bound(e.b, env)
        if a is None or b is None:
            return None
        if isinstance(e, tx.Add):
            return a[0] + b[0], a[1] + b[1]
        return a[0] - b[1], a[1] - b[0]
    if isinstance(e, tx.Mul):
        a, b = bound(e.a, env), bound(e.b, env)
        if a is None or b is None:
            return None
        if b[0] == b[1] and b[0].is_const:
            a, b = b, a
        if a[0] == a[1] and a[0].is_const:
            c = a[0].const
            lo, hi = b[0].scale(c), b[1].scale(c)
            return (lo, hi) if c >= 0 else (hi, lo)
        return None
    if isinstance(e, (tx.FloorDiv, tx.FloorMod)) and isinstance(e.b, tx.IntImm) and e.b.value > 0:
        a = bound(e.a, env)
        if a is None:
            return None
        c = e.b.value
        lo, hi = a
        if isinstance(e, tx.FloorDiv):
            if lo.is_const and hi.is_const:
                return Lin((), lo.const // c), Lin((), hi.const // c)
            return atom(lo.to_expr() // c), atom(hi.to_expr() // c)
        if lo.is_const and hi.is_const and lo.const // c == hi.const // c:
            return Lin((), lo.const % c), Lin((), hi.const % c)
        return Lin((), 0), Lin((), c - 1)
    if isinstance(e, (tx.Min, tx.Max)):
        a, b = bound(e.a, env), bound(e.b, env)
        if a is None or b is None:
            return None
        if isinstance(e, tx.Min):
            return lin_min(a[0], b[0]), lin_min(a[1], b[1])
        return lin_max(a[0], b[0]), lin_max(a[1], b[1])
    return None


def relax(e: PrimExpr, loops: list[tuple[Var, PrimExpr]]) -> Interval | None:
    """Bounds of `e` over the loops `[(var, extent), ...]`, innermost first, each from 0.

    A loop's extent may depend on the variables of loops further out, so the
    loops are relaxed one at a time from the inside out.
    """
    lin = linearize(e)
    if lin is None:
        return None
    lo, hi = lin, lin
    for v, ext in loops:
        env = {v: (Lin(), lin_of(ext) - 1)}
        blo, bhi = bound(lo.to_expr(), env), bound(hi.to_expr(), env)
        if blo is None or bhi is None:
            return None
        lo, hi = blo[0], bhi[1]
    return lo, hi
