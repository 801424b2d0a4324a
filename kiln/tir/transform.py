"""Passes over `PrimFunc`s: simplification, loop partitioning, unrolling; and `substitute`.

Each pass is a function `f(func) -> func` that returns a new `PrimFunc` (the
input is never changed; IR nodes are immutable).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import overload

import attrs

from kiln.tir.expr import (
    GE,
    GT,
    LE,
    LT,
    And,
    Buffer,
    FloorDiv,
    IntImm,
    Max,
    Min,
    PrimExpr,
    Select,
    Sub,
    Var,
    binary,
    const,
)
from kiln.tir.functor import (
    Node,
    StmtExprMutator,
    Substituter,
    let_chain,
    post_order_visit,
    structural_key,
    used_vars,
)
from kiln.tir.simplify import LINEAR_DTYPES, Analyzer, Linear, simplify_stmt
from kiln.tir.stmt import Allocate, For, ForKind, IfThenElse, LetStmt, PrimFunc, SeqStmt, Stmt, seq

# ---------------------------------------------------------------------------
# substitute
# ---------------------------------------------------------------------------


@overload
def substitute(node: PrimExpr, vmap: Mapping[Var, PrimExpr]) -> PrimExpr: ...


@overload
def substitute(node: Stmt, vmap: Mapping[Var, PrimExpr]) -> Stmt: ...


def substitute(node: PrimExpr | Stmt, vmap: Mapping[Var, PrimExpr]) -> PrimExpr | Stmt:
    """Replaces variables by expressions in an expression or a statement.

    Constants that appear fold (`i * 4` with `i := 2` is `8`); buffer shapes
    that use a replaced variable are rewritten, and every load and store of
    such a buffer names the rewritten one.

    Args:
        node: the expression or statement.
        vmap: each variable and its replacement.

    Returns:
        The rewritten node (the same object when no variable of `vmap` occurs).
    """
    return Substituter(dict(vmap))(node)


def _size_analyzer(func: PrimFunc) -> Analyzer:
    """An analyzer that knows the symbolic sizes of `func`'s buffers are non-negative."""
    ana = Analyzer()
    for v in func.size_vars:
        ana.set_bound(v, const(0, v.dtype), None)
    return ana


# ---------------------------------------------------------------------------
# simplify_func
# ---------------------------------------------------------------------------


def simplify_func(func: PrimFunc) -> PrimFunc:
    """Simplifies the body of `func` (see `simplify_stmt`); sizes are assumed non-negative.

    Args:
        func: the function.

    Returns:
        The function with a simplified body.
    """
    return attrs.evolve(func, body=simplify_stmt(func.body, _size_analyzer(func)))


# ---------------------------------------------------------------------------
# loop_partition
# ---------------------------------------------------------------------------


PARTITION_SELECTS = "partition_selects"  # loop annotation (te: `stage.pragma(axis, PARTITION_SELECTS)`)


def loop_partition(func: PrimFunc) -> PrimFunc:
    """Splits loops whose body is guarded by a bound on the loop variable into a guard-free main part and a tail.

    The guard `if outer * f + inner < extent` that a split by a non-dividing
    factor produces (for `outer` in `[0, ceil(extent / f))`, `inner` in
    `[0, f)`) holds for every `inner` while `outer < extent // f`. The
    `outer` loop becomes two: the main part over `[0, extent // f)` without
    the guard (so an inner vectorized loop has no condition) and the tail
    over the rest, guard kept. Works for symbolic extents; conjunctions of
    guards are split one loop at a time; GPU-bound loops are left alone. The
    result is simplified, so the tail of a split inner loop loses its dead
    part and the inner loop of the tail runs over the reduced extent.

    A loop of constant bounds annotated `PARTITION_SELECTS` (TVM's `likely`
    conditions) is also cut where a select's condition changes with its
    variable: zero padding's `select(x >= 1 and x < 57, a[min(max(x - 1, 0),
    55)], 0)` becomes a loop of zeros, a loop of plain (vectorizable) copies
    `a[x - 1]` and a loop of zeros. Opt-in: a select over a loop is usually
    cheaper than the copies of its body.

    Args:
        func: the function.

    Returns:
        The partitioned function.
    """
    body = _Partitioner(_size_analyzer(func)).visit_stmt(func.body)
    # Simplification then drops what the split made dead (a tail's always-false guard) or constant.
    return simplify_func(attrs.evolve(func, body=body))


class _Partitioner(StmtExprMutator):
    def __init__(self, analyzer: Analyzer) -> None:
        self.ana = analyzer
        self.thread_vars: set[int] = set()  # ids of the loop vars of the enclosing GPU thread loops

    def visit_expr(self, e: PrimExpr) -> PrimExpr:
        return e

    def visit_for(self, s: For) -> Stmt:
        if PARTITION_SELECTS in s.annotations:  # the request is this pass's: it leaves the loop either way
            pieces = self._select_pieces(s)
            if pieces is None:
                s = attrs.evolve(s, annotations={k: v for k, v in s.annotations.items() if k != PARTITION_SELECTS})
        else:
            pieces = None
        if pieces is not None:
            out = []
            for piece in pieces:
                with self.ana.bound_range(piece.loop_var, piece.min, piece.extent):
                    # decided selects fold now, so loops inside are not cut for them
                    body = simplify_stmt(piece.body, self.ana)
                out.append(self.visit_for(attrs.evolve(piece, body=body)))
            return seq(*out)
        split = None if s.kind is ForKind.THREAD_BINDING else self._split_point(s)
        if split is not None and s.kind is ForKind.UNROLLED and any(
            id(v) in self.thread_vars for v in used_vars(split[0])
        ):
            # A GPU thread's tile past the edge: cut where the thread index says, the unrolled loop would
            # get a per-thread extent and stay a loop, and a register tile indexed by it goes to memory.
            split = None
        if split is None:
            if s.kind is ForKind.THREAD_BINDING:
                self.thread_vars.add(id(s.loop_var))
            with self.ana.bound_range(s.loop_var, s.min, s.extent):
                body = self.visit_stmt(s.body)
            return s if body is s.body else attrs.evolve(s, body=body)
        main_ext, guard_key = split
        main_body = _drop_guards(s.body, guard_key)
        tail_var = Var(s.loop_var.name, s.loop_var.dtype)
        tail_min = self.ana.simplify(s.min + main_ext)
        tail_ext = self.ana.simplify(s.extent - main_ext)
        tail_body = substitute(s.body, {s.loop_var: tail_var})
        with self.ana.bound_range(s.loop_var, s.min, main_ext):
            main_body = self.visit_stmt(main_body)
        with self.ana.bound_range(tail_var, tail_min, tail_ext):
            tail_body = self.visit_stmt(tail_body)
        main = attrs.evolve(s, extent=main_ext, body=main_body)
        tail = attrs.evolve(s, loop_var=tail_var, min=tail_min, extent=tail_ext, body=tail_body)
        if (isinstance(tail_ext, IntImm) and tail_ext.value <= 0) or structural_key(main_ext) == structural_key(
            self.ana.simplify(s.extent)
        ):
            return main  # the guard holds everywhere
        if isinstance(main_ext, IntImm) and main_ext.value <= 0:
            return tail
        return seq(main, tail)

    def _select_pieces(self, s: For) -> list[For] | None:
        """`s` cut at every point where the truth of a select's condition changes with its variable
        (conditions affine in it, with constant coefficients); None when there is no such point.
        The pieces lose the annotation, so each is partitioned once."""
        if s.kind not in (ForKind.SERIAL, ForKind.VECTORIZED, ForKind.UNROLLED, ForKind.PARALLEL):
            return None  # a parallel loop cut in pieces is pieces run on the cores one after another
        if not (isinstance(s.min, IntImm) and isinstance(s.extent, IntImm)):
            return None
        lo, hi = s.min.value, s.min.value + s.extent.value
        points: set[int] = set()

        def visit(n: Node) -> None:
            if isinstance(n, Select):
                for cond in _conjuncts(n.cond):
                    points.update(p for p in self._flips(cond, s.loop_var) if lo < p < hi)

        post_order_visit(s.body, visit)
        if not points:
            return None
        bounds = [lo, *sorted(points), hi]
        notes = {k: v for k, v in s.annotations.items() if k != PARTITION_SELECTS}
        pieces = []
        for start, stop in itertools.pairwise(bounds):
            var = Var(s.loop_var.name, s.loop_var.dtype)
            body = substitute(s.body, {s.loop_var: var})
            pieces.append(For(var, const(start, var.dtype), const(stop - start, var.dtype), s.kind, body,
                              s.thread_tag, notes))
        return pieces

    def _flips(self, cond: PrimExpr, var: Var) -> list[int]:
        """The values v of `var` where comparison `cond` (c * var + r against 0, c and r constants)
        differs from its value at v - 1."""
        if not isinstance(cond, (LT, LE, GT, GE)) or cond.a.dtype != var.dtype or var.dtype not in LINEAR_DTYPES:
            return []
        lin = self.ana.linear(cond.a).add(self.ana.linear(cond.b), -1)
        key = next((k for k, (atom, _) in lin.terms.items() if atom is var), None)
        if key is None or len(lin.terms) != 1:
            return []
        c, r = lin.coef(key), lin.const

        def holds(v: int) -> bool:
            d = c * v + r
            return d < 0 if isinstance(cond, LT) else d <= 0 if isinstance(cond, LE) else \
                d > 0 if isinstance(cond, GT) else d >= 0

        edge = -r // c
        return [v for v in range(edge - 1, edge + 3) if holds(v) != holds(v - 1)]

    def _split_point(self, s: For) -> tuple[PrimExpr, object] | None:
        """The main part's extent and the guard it makes true, for the first guard on `s.loop_var`."""
        for cond, inner in _guards(s.body):
            found = self._guard_bound(s, cond, inner)
            if found is not None:
                return found
        return None

    def _guard_bound(self, s: For, cond: PrimExpr, inner: list[For]) -> tuple[PrimExpr, object] | None:
        """For a guard `d >= 1` with d = R - c*var (c > 0): var < (min(R) - 1) // c + 1 makes it true."""
        var = s.loop_var
        if var.dtype not in LINEAR_DTYPES or cond.dtype != "bool":
            return None
        if not isinstance(cond, (LT, LE, GT, GE)) or cond.a.dtype != var.dtype:
            return None
        a, b = (cond.a, cond.b) if isinstance(cond, (LT, LE)) else (cond.b, cond.a)
        lin = self.ana.linear(b).add(self.ana.linear(a), -1).plus(0 if isinstance(cond, (LT, GT)) else 1)
        key = next((k for k, (atom, _) in lin.terms.items() if atom is var), None)
        if key is None or lin.coef(key) >= 0:
            return None
        c = -lin.coef(key)
        rest = lin.add(Linear.atom(var), c)
        # The smallest value of the rest over the loops between `s` and the guard.
        for loop in reversed(inner):
            lkey = next((k for k, (atom, _) in rest.terms.items() if atom is loop.loop_var), None)
            if lkey is None:
                continue
            coef = rest.coef(lkey)
            end = loop.min if coef > 0 else binary(Sub, loop.min + loop.extent, 1)
            rest = rest.add(Linear.atom(loop.loop_var), -coef).add(self.ana.linear(end), coef)
        bound_vars = {var, *(loop.loop_var for loop in inner)}
        if any(used_vars(atom) & bound_vars for atom, _ in rest.terms.values()):
            return None
        limit = self.ana.expr_of(rest.plus(c - 1))
        end = self.ana.simplify(binary(FloorDiv, limit, const(c, var.dtype)))
        main_ext = self.ana.simplify(binary(Min, binary(Max, end - s.min, const(0, var.dtype)), s.extent))
        if isinstance(main_ext, IntImm) and main_ext.value <= 0:
            return None  # the guard never holds for the first iteration: nothing to split off
        return main_ext, _cond_key(cond)


def _cond_key(cond: PrimExpr) -> object:
    return structural_key(cond)


def _conjuncts(cond: PrimExpr) -> list[PrimExpr]:
    out: list[PrimExpr] = []
    stack = [cond]
    while stack:
        c = stack.pop()
        if isinstance(c, And):
            stack.extend((c.b, c.a))
        else:
            out.append(c)
    return out


def _guards(body: Stmt) -> list[tuple[PrimExpr, list[For]]]:
    """The conjuncts of the ifs without else reachable through loops, lets, allocations, sequences and
    the bodies of such ifs (a tile's column guard sits inside its row guard when both have a tail).

    Each comes with the loops between `body`'s owner and the if, outermost first.
    """
    out: list[tuple[PrimExpr, list[For]]] = []
    stack: list[tuple[Stmt, list[For]]] = [(body, [])]
    while stack:
        s, loops = stack.pop()
        if isinstance(s, For):
            stack.append((s.body, [*loops, s]))
        elif isinstance(s, (LetStmt, Allocate)):
            stack.append((s.body, loops))
        elif isinstance(s, SeqStmt):
            stack.extend((c, loops) for c in reversed(s.stmts))
        elif isinstance(s, IfThenElse) and s.else_case is None:
            out.extend((c, loops) for c in _conjuncts(s.cond))
            stack.append((s.then_case, loops))
    return out


def _drop_guards(body: Stmt, key: object) -> Stmt:
    """`body` with the guard conjunct of structural key `key` removed from the ifs `_guards` finds."""
    if isinstance(body, For):
        inner = _drop_guards(body.body, key)
        return body if inner is body.body else attrs.evolve(body, body=inner)
    if isinstance(body, LetStmt):
        inner = _drop_guards(body.body, key)
        return body if inner is body.body else LetStmt(body.var, body.value, inner)
    if isinstance(body, Allocate):
        inner = _drop_guards(body.body, key)
        return body if inner is body.body else Allocate(body.buffer, inner)
    if isinstance(body, SeqStmt):
        stmts = [_drop_guards(c, key) for c in body.stmts]
        return body if all(x is y for x, y in zip(stmts, body.stmts, strict=True)) else SeqStmt(tuple(stmts))
    if isinstance(body, IfThenElse) and body.else_case is None:
        then = _drop_guards(body.then_case, key)
        conds = _conjuncts(body.cond)
        kept = [c for c in conds if _cond_key(c) != key]
        if len(kept) == len(conds):
            return body if then is body.then_case else IfThenElse(body.cond, then)
        if not kept:
            return then
        cond = kept[0]
        for c in kept[1:]:
            cond = binary(And, cond, c)
        return IfThenElse(cond, then)
    return body


# ---------------------------------------------------------------------------
# unroll_loops
# ---------------------------------------------------------------------------


def unroll_loops(func: PrimFunc, max_extent: int = 16) -> PrimFunc:
    """Replaces each UNROLLED loop of constant extent <= `max_extent` by copies of its body.

    In copy k the loop variable is `min + k`; the loops, lets and allocations
    inside each copy get fresh variables and buffers, so no variable is bound
    twice. Larger or symbolic unrolled loops stay loops (LLVM's unroller sees
    their kind).

    Args:
        func: the function.
        max_extent: the largest extent unrolled here.

    Returns:
        The function with small unrolled loops expanded.
    """
    return attrs.evolve(func, body=_Unroller(max_extent).visit_stmt(func.body))


class _Unroller(StmtExprMutator):
    def __init__(self, max_extent: int) -> None:
        self.max_extent = max_extent

    def visit_for(self, s: For) -> Stmt:
        body = self.visit_stmt(s.body)  # inner loops first
        ext = s.extent
        if s.kind is not ForKind.UNROLLED or not isinstance(ext, IntImm) or ext.value > self.max_extent:
            return s if body is s.body else attrs.evolve(s, body=body)
        copies = [_Renamer({s.loop_var: s.min + k}).visit_stmt(body) for k in range(ext.value)]
        return seq(*copies)


class _Renamer(Substituter):
    """Substitutes, and gives the loops, lets and allocations met fresh variables and buffers."""

    def visit_for(self, s: For) -> Stmt:
        self.vmap[s.loop_var] = Var(s.loop_var.name, s.loop_var.dtype)
        return super().visit_for(s)

    def visit_let_stmt(self, s: LetStmt) -> Stmt:
        chain = let_chain(s)  # walked in a loop: a fused kernel's shared values are long let chains
        bound: list[tuple[Var, PrimExpr]] = []
        for let in chain:
            value = self.visit_expr(let.value)  # the value sees the outer binding
            var = Var(let.var.name, let.var.dtype)
            self.vmap[let.var] = var
            bound.append((var, value))
        body = self.visit_stmt(chain[-1].body)
        for var, value in reversed(bound):
            body = LetStmt(var, value, body)
        return body

    def visit_allocate(self, s: Allocate) -> Stmt:
        shape = tuple(self.visit_expr(d) for d in s.buffer.shape)
        fresh: Buffer = attrs.evolve(s.buffer, shape=shape)
        self._buffers[id(s.buffer)] = fresh
        return Allocate(fresh, self.visit_stmt(s.body))
