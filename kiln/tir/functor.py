"""Generic traversal of loop IR: a rebuilding mutator, a post-order visitor, structural keys.

`StmtExprMutator` dispatches on the node's class to one `visit_*` method per
kind of node; each default visits the children and rebuilds the node only if
a child changed (so an untouched tree comes back as the same objects).
Expressions are rebuilt through the folding constructors (`binary`, `select`,
`cast`, ...), so substituting constants folds what becomes constant.

Recursion follows the nesting of the IR (expressions and loop nests are
shallow); the statements of a `SeqStmt` are walked iteratively, and
`post_order_visit` is the one graph walk (`kiln.ir.graph`), so neither depends
on the length of a statement list.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator
from typing import Any, ClassVar, overload

import attrs

from kiln.ir import graph
from kiln.tir.expr import (
    BinaryOp,
    Buffer,
    BufferLoad,
    Call,
    Cast,
    FloatImm,
    IntImm,
    Not,
    PrimExpr,
    Select,
    TIRError,
    Var,
    binary,
    logical_not,
    select,
)
from kiln.tir.expr import (
    cast as tir_cast,
)
from kiln.tir.stmt import Allocate, BufferStore, Evaluate, For, IfThenElse, LetStmt, SeqStmt, Stmt, seq

Node = PrimExpr | Stmt


class StmtExprMutator:
    """Rewrites loop IR; override the `visit_*` methods of the nodes you care about.

    `visit_expr` / `visit_stmt` dispatch on the class (walking the MRO, so
    `visit_binary` sees every `BinaryOp`). `visit_buffer` is the hook for the
    buffers that loads, stores and allocations name; by default it keeps them.
    """

    _EXPR_METHODS: ClassVar[dict[type, str]] = {
        Var: "visit_var",
        IntImm: "visit_imm",
        FloatImm: "visit_imm",
        BinaryOp: "visit_binary",
        Not: "visit_not",
        Cast: "visit_cast",
        Select: "visit_select",
        Call: "visit_call",
        BufferLoad: "visit_buffer_load",
    }
    _STMT_METHODS: ClassVar[dict[type, str]] = {
        BufferStore: "visit_buffer_store",
        For: "visit_for",
        Allocate: "visit_allocate",
        IfThenElse: "visit_if_then_else",
        LetStmt: "visit_let_stmt",
        SeqStmt: "visit_seq_stmt",
        Evaluate: "visit_evaluate",
    }

    # -- dispatch -----------------------------------------------------------------------
    def visit_expr(self, e: PrimExpr) -> PrimExpr:
        """Rewrites one expression (dispatching on its class)."""
        method: Callable[[Any], PrimExpr] = getattr(self, _lookup(self._EXPR_METHODS, type(e)))
        return method(e)

    def visit_stmt(self, s: Stmt) -> Stmt:
        """Rewrites one statement (dispatching on its class)."""
        method: Callable[[Any], Stmt] = getattr(self, _lookup(self._STMT_METHODS, type(s)))
        return method(s)

    def visit_buffer(self, buf: Buffer) -> Buffer:
        """The buffer to use in place of `buf` (the default keeps it)."""
        return buf

    # -- expressions --------------------------------------------------------------------
    def visit_var(self, e: Var) -> PrimExpr:
        return e

    def visit_imm(self, e: PrimExpr) -> PrimExpr:
        return e

    def visit_binary(self, e: BinaryOp) -> PrimExpr:
        a, b = self.visit_expr(e.a), self.visit_expr(e.b)
        return e if a is e.a and b is e.b else binary(type(e), a, b)

    def visit_not(self, e: Not) -> PrimExpr:
        a = self.visit_expr(e.a)
        return e if a is e.a else logical_not(a)

    def visit_cast(self, e: Cast) -> PrimExpr:
        v = self.visit_expr(e.value)
        return e if v is e.value else tir_cast(e.dtype, v)

    def visit_select(self, e: Select) -> PrimExpr:
        c, t, f = self.visit_expr(e.cond), self.visit_expr(e.true_value), self.visit_expr(e.false_value)
        if c is e.cond and t is e.true_value and f is e.false_value:
            return e
        return select(c, t, f)

    def visit_call(self, e: Call) -> PrimExpr:
        args = tuple(self.visit_expr(a) for a in e.args)
        if all(x is y for x, y in zip(args, e.args, strict=True)):
            return e
        return Call(e.dtype, e.name, args)

    def visit_buffer_load(self, e: BufferLoad) -> PrimExpr:
        buf = self.visit_buffer(e.buffer)
        idx = tuple(self.visit_expr(i) for i in e.indices)
        if buf is e.buffer and all(x is y for x, y in zip(idx, e.indices, strict=True)):
            return e
        return BufferLoad(e.dtype, buf, idx)

    # -- statements ---------------------------------------------------------------------
    def visit_buffer_store(self, s: BufferStore) -> Stmt:
        buf = self.visit_buffer(s.buffer)
        value = self.visit_expr(s.value)
        idx = tuple(self.visit_expr(i) for i in s.indices)
        if buf is s.buffer and value is s.value and all(x is y for x, y in zip(idx, s.indices, strict=True)):
            return s
        return BufferStore(buf, value, idx)

    def visit_for(self, s: For) -> Stmt:
        lo, ext = self.visit_expr(s.min), self.visit_expr(s.extent)
        var = self.visit_expr(s.loop_var)
        if not isinstance(var, Var):
            raise TIRError(f"a loop variable can only be replaced by a variable, not {var}")
        body = self.visit_stmt(s.body)
        if lo is s.min and ext is s.extent and var is s.loop_var and body is s.body:
            return s
        return attrs.evolve(s, loop_var=var, min=lo, extent=ext, body=body)

    def visit_allocate(self, s: Allocate) -> Stmt:
        buf = self.visit_buffer(s.buffer)
        body = self.visit_stmt(s.body)
        return s if buf is s.buffer and body is s.body else Allocate(buf, body)

    def visit_if_then_else(self, s: IfThenElse) -> Stmt:
        cond = self.visit_expr(s.cond)
        then = self.visit_stmt(s.then_case)
        other = None if s.else_case is None else self.visit_stmt(s.else_case)
        if cond is s.cond and then is s.then_case and other is s.else_case:
            return s
        return IfThenElse(cond, then, other)

    def visit_let_stmt(self, s: LetStmt) -> Stmt:
        # A chain of lets (the shared values of a fused kernel) is walked in a loop, not recursively.
        chain = let_chain(s)
        bound: list[tuple[Var, PrimExpr]] = []
        for let in chain:
            value = self.visit_expr(let.value)
            var = self.visit_expr(let.var)
            if not isinstance(var, Var):
                raise TIRError(f"a let variable can only be replaced by a variable, not {var}")
            bound.append((var, value))
        body = self.visit_stmt(chain[-1].body)
        for let, (var, value) in zip(reversed(chain), reversed(bound), strict=True):
            if not (value is let.value and var is let.var and body is let.body):
                body = LetStmt(var, value, body)
            else:
                body = let
        return body

    def visit_seq_stmt(self, s: SeqStmt) -> Stmt:
        stmts = [self.visit_stmt(c) for c in s.stmts]
        if all(x is y for x, y in zip(stmts, s.stmts, strict=True)):
            return s
        return seq(*stmts) if stmts else s

    def visit_evaluate(self, s: Evaluate) -> Stmt:
        value = self.visit_expr(s.value)
        return s if value is s.value else Evaluate(value)

    # -- entry --------------------------------------------------------------------------
    @overload
    def __call__(self, node: PrimExpr) -> PrimExpr: ...

    @overload
    def __call__(self, node: Stmt) -> Stmt: ...

    def __call__(self, node: PrimExpr | Stmt) -> PrimExpr | Stmt:
        """Rewrites `node`, an expression or a statement."""
        if isinstance(node, PrimExpr):
            return self.visit_expr(node)
        return self.visit_stmt(node)


def let_chain(s: LetStmt) -> list[LetStmt]:
    """`s` and the lets directly nested in its body, outermost first."""
    chain = [s]
    while isinstance(chain[-1].body, LetStmt):
        chain.append(chain[-1].body)
    return chain


def _lookup(table: dict[type, str], cls: type) -> str:
    for base in cls.__mro__:
        if base in table:
            return table[base]
    raise TIRError(f"unknown loop-IR node {cls.__name__}")


def children(node: Node) -> Iterator[Node]:
    """The direct sub-expressions and sub-statements of `node`, in printing order.

    The shape of an `Allocate`'s buffer counts as part of it (a size may use a
    variable); the shapes of the buffers that loads and stores name do not.
    """
    if isinstance(node, BinaryOp):
        yield from (node.a, node.b)
    elif isinstance(node, Not):
        yield node.a
    elif isinstance(node, Cast):
        yield node.value
    elif isinstance(node, Select):
        yield from (node.cond, node.true_value, node.false_value)
    elif isinstance(node, Call):
        yield from node.args
    elif isinstance(node, BufferLoad):
        yield from node.indices
    elif isinstance(node, BufferStore):
        yield from node.indices
        yield node.value
    elif isinstance(node, For):
        yield from (node.loop_var, node.min, node.extent, node.body)
    elif isinstance(node, Allocate):
        yield from node.buffer.shape
        yield node.body
    elif isinstance(node, IfThenElse):
        yield from (node.cond, node.then_case)
        if node.else_case is not None:
            yield node.else_case
    elif isinstance(node, LetStmt):
        yield from (node.var, node.value, node.body)
    elif isinstance(node, SeqStmt):
        yield from node.stmts
    elif isinstance(node, Evaluate):
        yield node.value


def post_order_visit(node: Node, fn: Callable[[Node], None]) -> None:
    """Calls `fn` on every node under `node` (itself included), children before parents.

    A node shared by several parents is visited once. Iterative: no recursion limit.
    """
    for n in graph.post_order([node], children):
        fn(n)


def used_vars(node: Node) -> set[Var]:
    """The variables that occur in `node` (bound ones included: loop and let variables)."""
    out: set[Var] = set()

    def add(n: Node) -> None:
        if isinstance(n, Var):
            out.add(n)

    post_order_visit(node, add)
    return out


def buffer_loads(node: Node) -> list[BufferLoad]:
    """The buffer loads in `node`, in post order (loads inside indices before the loads that read at them)."""
    out: list[BufferLoad] = []
    post_order_visit(node, lambda n: out.append(n) if isinstance(n, BufferLoad) else None)
    return out


def structural_key(e: PrimExpr) -> Hashable:
    """A hashable key equal for structurally equal expressions (vars and buffers by identity)."""
    if isinstance(e, Var):
        return ("var", e.uid)
    if isinstance(e, (IntImm, FloatImm)):
        return (type(e).__name__, e.dtype, e.value)
    if isinstance(e, Call):
        return ("call", e.dtype, e.name, *map(structural_key, e.args))
    if isinstance(e, BufferLoad):
        return ("load", id(e.buffer), *map(structural_key, e.indices))
    return (type(e).__name__, e.dtype, *(structural_key(c) for c in children(e) if isinstance(c, PrimExpr)))


def same_expr(a: PrimExpr, b: PrimExpr) -> bool:
    """Whether `a` and `b` are structurally equal (vars and buffers by identity).

    The same answer as comparing `structural_key`s, but it stops at the first difference
    (and at shared nodes), so asking about two unrelated deep expressions costs O(1).
    """
    stack: list[tuple[Node, Node]] = [(a, b)]
    while stack:
        x, y = stack.pop()
        if x is y:
            continue
        if type(x) is not type(y) or not isinstance(x, PrimExpr) or not isinstance(y, PrimExpr):
            return False
        if x.dtype != y.dtype or isinstance(x, Var):
            return False
        if isinstance(x, (IntImm, FloatImm)) and isinstance(y, (IntImm, FloatImm)):
            if x.value != y.value:
                return False
            continue
        if isinstance(x, Call) and isinstance(y, Call) and x.name != y.name:
            return False
        if isinstance(x, BufferLoad) and isinstance(y, BufferLoad) and x.buffer is not y.buffer:
            return False
        kx, ky = list(children(x)), list(children(y))
        if len(kx) != len(ky):
            return False
        stack.extend(zip(kx, ky, strict=True))
    return True


class Substituter(StmtExprMutator):
    """Replaces variables by expressions; buffer shapes that use them are rewritten too."""

    def __init__(self, vmap: dict[Var, PrimExpr]) -> None:
        self.vmap = vmap
        self._buffers: dict[int, Buffer] = {}

    def visit_var(self, e: Var) -> PrimExpr:
        return self.vmap.get(e, e)

    def visit_buffer(self, buf: Buffer) -> Buffer:
        if id(buf) not in self._buffers:
            shape = tuple(self.visit_expr(d) for d in buf.shape)
            same = all(x is y for x, y in zip(shape, buf.shape, strict=True))
            self._buffers[id(buf)] = buf if same else attrs.evolve(buf, shape=shape)
        return self._buffers[id(buf)]
