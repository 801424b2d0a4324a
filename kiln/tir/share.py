"""Shared values computed once: a DAG in a statement's expressions becomes let-bound locals.

Lowering inlines each fused stage once per index tuple, so a value that several
readers use (`y` in `y*y + y`) is one node with several parents: a DAG. Every
walk of loop IR that treats expressions as trees (the printer, the simplifier,
the code generators) would visit such a node once per path to it, which is
exponential in the depth of a diamond. `bind_shared` makes the sharing explicit
instead: each shared value becomes a `LetStmt` around the statement that uses
it, computed once, and the expressions that are left are trees whose size is
the number of distinct nodes. It also cuts expressions taller than
`MAX_HEIGHT` into lets, so no walk that follows the nesting of an expression
recurses deeper than that (a fused chain of hundreds of elementwise ops).

Pure index arithmetic (integer nodes without a load) is left in place while it
is small: the simplifier and the bounds checks reason about it best inline.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs

from kiln.ir import graph
from kiln.tir.allreduce import ALLREDUCE
from kiln.tir.expr import (
    BinaryOp,
    BufferLoad,
    Call,
    Cast,
    FloatImm,
    IntImm,
    Not,
    PrimExpr,
    Select,
    Var,
    binary,
    logical_not,
    select,
)
from kiln.tir.expr import cast as tir_cast
from kiln.tir.stmt import Allocate, BufferStore, Evaluate, For, IfThenElse, LetStmt, PrimFunc, SeqStmt, Stmt

# The tallest expression kept whole; taller ones are cut into lets (walks recurse per level).
MAX_HEIGHT = 48
# A shared sub-expression of pure index arithmetic is bound once its unfolded tree is this big.
_INDEX_TREE_LIMIT = 64
_INDEX_DTYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "bool")
_LEAVES = (Var, IntImm, FloatImm)


def _kids(e: PrimExpr) -> tuple[PrimExpr, ...]:
    if isinstance(e, BinaryOp):
        return (e.a, e.b)
    if isinstance(e, Not):
        return (e.a,)
    if isinstance(e, Cast):
        return (e.value,)
    if isinstance(e, Select):
        return (e.cond, e.true_value, e.false_value)
    if isinstance(e, Call):
        return e.args
    if isinstance(e, BufferLoad):
        return e.indices
    return ()


def _rebuild(e: PrimExpr, new: tuple[PrimExpr, ...]) -> PrimExpr:
    """`e` over children `new` (the same object when nothing changed)."""
    if all(a is b for a, b in zip(_kids(e), new, strict=True)):
        return e
    if isinstance(e, BinaryOp):
        return binary(type(e), new[0], new[1])
    if isinstance(e, Not):
        return logical_not(new[0])
    if isinstance(e, Cast):
        return tir_cast(e.dtype, new[0])
    if isinstance(e, Select):
        return select(new[0], new[1], new[2])
    if isinstance(e, Call):
        return Call(e.dtype, e.name, new)
    assert isinstance(e, BufferLoad)
    return BufferLoad(e.dtype, e.buffer, new)


def _post_order(roots: Sequence[PrimExpr]) -> list[PrimExpr]:
    """The distinct nodes under `roots`, children before parents. Iterative."""
    return graph.post_order(roots, _kids)


def is_dag(roots: Sequence[PrimExpr]) -> bool:
    """Whether some node under `roots` is reached along two paths, or an expression is taller than `MAX_HEIGHT`."""
    order = _post_order(roots)
    height: dict[int, int] = {}
    refs = sum(not isinstance(r, _LEAVES) for r in roots)
    for e in order:
        kids = _kids(e)
        refs += sum(not isinstance(k, _LEAVES) for k in kids)
        height[id(e)] = 1 + max((height[id(k)] for k in kids), default=0)
        if height[id(e)] > MAX_HEIGHT:
            return True
    # a variable or constant read in several places is no DAG that matters
    return refs != sum(not isinstance(e, _LEAVES) for e in order)


def bind_expressions(
    roots: Sequence[PrimExpr], name: str = "v"
) -> tuple[list[tuple[Var, PrimExpr]], list[PrimExpr]]:
    """Splits expressions into let bindings and tree-shaped remainders.

    Args:
        roots: the expressions one statement evaluates (possibly sharing nodes).
        name: the base name of the let variables.

    Returns:
        `(lets, new_roots)`: each let `(var, value)` may use the vars of the lets
        before it; `new_roots` use them in place of the shared values. Every
        value and root is a tree of height at most `MAX_HEIGHT` + 1.
    """
    order = _post_order(roots)
    parents: dict[int, int] = {}
    for r in roots:
        parents[id(r)] = parents.get(id(r), 0) + 1
    for e in order:
        for k in _kids(e):
            parents[id(k)] = parents.get(id(k), 0) + 1
    has_load: dict[int, bool] = {}
    tree: dict[int, int] = {}  # size of the unfolded tree, up to the lets chosen below it
    height: dict[int, int] = {}
    new: dict[int, PrimExpr] = {}
    lets: list[tuple[Var, PrimExpr]] = []
    for e in order:
        kids = _kids(e)
        has_load[id(e)] = isinstance(e, BufferLoad) or any(has_load[id(k)] for k in kids)
        tree[id(e)] = 1 + sum(tree[id(k)] for k in kids)
        height[id(e)] = 1 + max((height[id(k)] for k in kids), default=0)
        out = _rebuild(e, tuple(new[id(k)] for k in kids))
        leaf = isinstance(e, _LEAVES)
        index_only = e.dtype in _INDEX_DTYPES and not has_load[id(e)]
        shared = parents[id(e)] > 1
        if not leaf and (
            (shared and (not index_only or tree[id(e)] >= _INDEX_TREE_LIMIT)) or height[id(e)] > MAX_HEIGHT
        ):
            var = Var(f"{name}{len(lets)}", e.dtype)
            lets.append((var, out))
            out = var
            tree[id(e)] = height[id(e)] = 1
        new[id(e)] = out
    return lets, [new[id(r)] for r in roots]


def wrap_lets(lets: Sequence[tuple[Var, PrimExpr]], body: Stmt) -> Stmt:
    """`body` inside the let bindings `lets` (the first outermost)."""
    for var, value in reversed(lets):
        body = LetStmt(var, value, body)
    return body


def _bind_stmt(s: Stmt, make: Callable[[list[PrimExpr]], Stmt], roots: Sequence[PrimExpr]) -> Stmt:
    if not is_dag(roots):
        return s
    lets, new = bind_expressions(roots)
    if not lets:
        return s
    return wrap_lets(lets, make(new))


def bind_shared(stmt: Stmt) -> Stmt:
    """`stmt` with the shared (and overly tall) sub-expressions of each store, condition and
    evaluation let-bound right around the statement that uses them.

    A statement without such expressions comes back as the same object. Walks the
    statement nesting with an explicit stack (no recursion per statement).
    """
    # Frames: (statement, rebuilt children so far); rebuilt bottom-up.
    done: dict[int, Stmt] = {}
    stack: list[tuple[Stmt, bool]] = [(stmt, False)]
    while stack:
        s, ready = stack.pop()
        subs = _sub_stmts(s)
        if not ready and subs:
            stack.append((s, True))
            stack.extend((c, False) for c in subs)
            continue
        new_subs = [done[id(c)] for c in subs]
        done[id(s)] = _bind_one(s, new_subs)
    return done[id(stmt)]


def _sub_stmts(s: Stmt) -> list[Stmt]:
    if isinstance(s, SeqStmt):
        return list(s.stmts)
    if isinstance(s, (For, Allocate, LetStmt)):
        return [s.body]
    if isinstance(s, IfThenElse):
        return [s.then_case] if s.else_case is None else [s.then_case, s.else_case]
    return []


def _bind_one(s: Stmt, subs: list[Stmt]) -> Stmt:
    if isinstance(s, SeqStmt):
        return s if all(a is b for a, b in zip(subs, s.stmts, strict=True)) else SeqStmt(tuple(subs))
    if isinstance(s, (For, Allocate)):
        return s if subs[0] is s.body else attrs.evolve(s, body=subs[0])
    if isinstance(s, LetStmt):
        body = subs[0]
        return _bind_stmt(s if body is s.body else LetStmt(s.var, s.value, body),
                          lambda v: LetStmt(s.var, v[0], body), [s.value])
    if isinstance(s, IfThenElse):
        then, other = subs[0], (subs[1] if len(subs) > 1 else None)
        same = then is s.then_case and other is s.else_case
        return _bind_stmt(s if same else IfThenElse(s.cond, then, other),
                          lambda v: IfThenElse(v[0], then, other), [s.cond])
    if isinstance(s, BufferStore):
        n = len(s.indices)
        return _bind_stmt(s, lambda v: BufferStore(s.buffer, v[n], v[:n]), [*s.indices, s.value])
    if isinstance(s, Evaluate) and not (isinstance(s.value, Call) and s.value.name in ("prefetch", ALLREDUCE)):
        # (a prefetch's load is an address, never performed: it must stay inside the call; an all-reduce's
        # combiner uses variables bound only inside it)
        return _bind_stmt(s, lambda v: Evaluate(v[0]), [s.value])
    return s


def bind_shared_func(func: PrimFunc) -> PrimFunc:
    """`func` with `bind_shared` applied to its body."""
    body = bind_shared(func.body)
    return func if body is func.body else attrs.evolve(func, body=body)
