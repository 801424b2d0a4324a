"""Walking and rewriting expressions without recursing once per node.

`post_order(expr)` lists every node of the DAG once, children first, with an
explicit stack. `ExprVisitor` and `ExprMutator` are built on it, so a chain of
10,000 calls never touches Python's recursion limit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from kiln.ir import graph
from kiln.ir.span import span_scope
from kiln.registry import Op
from kiln.relay.expr import (
    Call,
    Constant,
    Expr,
    Function,
    GlobalVar,
    If,
    Let,
    Tuple,
    TupleGetItem,
    Var,
)


def post_order(root: Expr, leaf: Callable[[Expr], bool] | None = None) -> list[Expr]:
    """Every node reachable from `root`, each once, children before parents.

    A node for which `leaf(node)` is true is listed but its children are not
    walked (unless another path reaches them).
    """
    if leaf is None:
        return graph.post_order([root], lambda n: n.children())
    stop = leaf
    return graph.post_order([root], lambda n: () if n is not root and stop(n) else n.children())


def walk(root: Expr) -> Iterator[Expr]:
    """Iterates `post_order(root)`."""
    return iter(post_order(root))


_VISIT = {
    Var: "visit_var",
    GlobalVar: "visit_global_var",
    Constant: "visit_constant",
    Call: "visit_call",
    Tuple: "visit_tuple",
    TupleGetItem: "visit_tuple_getitem",
    Let: "visit_let",
    If: "visit_if",
    Function: "visit_function",
}


class ExprVisitor:
    """Calls `visit_<kind>(node)` on every node once, children first. Override what you need."""

    def visit(self, root: Expr) -> None:
        """Visits every node reachable from `root`."""
        for node in post_order(root):
            getattr(self, _VISIT[type(node)])(node)

    def visit_var(self, node: Var) -> None:
        """A Var."""

    def visit_global_var(self, node: GlobalVar) -> None:
        """A GlobalVar."""

    def visit_constant(self, node: Constant) -> None:
        """A Constant."""

    def visit_call(self, node: Call) -> None:
        """A Call."""

    def visit_tuple(self, node: Tuple) -> None:
        """A Tuple."""

    def visit_tuple_getitem(self, node: TupleGetItem) -> None:
        """A TupleGetItem."""

    def visit_let(self, node: Let) -> None:
        """A Let."""

    def visit_if(self, node: If) -> None:
        """An If."""

    def visit_function(self, node: Function) -> None:
        """A Function."""


class ExprMutator:
    """Rebuilds an expression bottom-up, memoized over the DAG.

    `rewrite_<kind>(old, *new_children)` receives the node and its children as
    already rewritten, and returns the replacement; the defaults rebuild the
    node only when a child changed (keeping spans), so shared sub-graphs stay
    shared and unchanged graphs are returned as they are. Expressions built
    while a call is rewritten take the call's span.
    """

    def __init__(self) -> None:
        self.memo: dict[int, Expr] = {}

    def visit(self, root: Expr) -> Expr:
        """Returns the rewritten `root`."""
        memo = self.memo
        for node in post_order(root):
            if id(node) in memo:
                continue
            memo[id(node)] = self._rewrite(node)
        return memo[id(root)]

    def _new(self, e: Expr) -> Expr:
        return self.memo[id(e)]

    def _rewrite(self, node: Expr) -> Expr:
        n = self._new
        if isinstance(node, Var):
            return self.rewrite_var(node)
        if isinstance(node, GlobalVar):
            return self.rewrite_global_var(node)
        if isinstance(node, Constant):
            return self.rewrite_constant(node)
        if isinstance(node, Call):
            op = node.op if isinstance(node.op, Op) else n(node.op)
            if node.span is None:
                return self.rewrite_call(node, op, tuple(n(a) for a in node.args))
            with span_scope(node.span):  # what replaces a call comes from where the call came from
                return self.rewrite_call(node, op, tuple(n(a) for a in node.args))
        if isinstance(node, Tuple):
            return self.rewrite_tuple(node, tuple(n(f) for f in node.fields))
        if isinstance(node, TupleGetItem):
            return self.rewrite_tuple_getitem(node, n(node.tuple_value))
        if isinstance(node, Let):
            new_var = n(node.var)
            assert isinstance(new_var, Var)
            return self.rewrite_let(node, new_var, n(node.value), n(node.body))
        if isinstance(node, If):
            return self.rewrite_if(node, n(node.cond), n(node.true_branch), n(node.false_branch))
        if isinstance(node, Function):
            params = tuple(p for p in map(n, node.params) if isinstance(p, Var))
            if len(params) != len(node.params):
                raise TypeError("a rewritten function parameter must stay a Var")
            return self.rewrite_function(node, params, n(node.body))
        raise TypeError(f"unknown expression kind {type(node).__name__}")

    def rewrite_var(self, node: Var) -> Expr:
        """A Var; kept by default."""
        return node

    def rewrite_global_var(self, node: GlobalVar) -> Expr:
        """A GlobalVar; kept by default."""
        return node

    def rewrite_constant(self, node: Constant) -> Expr:
        """A Constant; kept by default."""
        return node

    def rewrite_call(self, node: Call, op: Op | Expr, args: tuple[Expr, ...]) -> Expr:
        """A Call with its rewritten op and args."""
        if op is node.op and all(a is b for a, b in zip(args, node.args, strict=True)):
            return node
        return Call(op, args, node.attrs, span=node.span)

    def rewrite_tuple(self, node: Tuple, fields: tuple[Expr, ...]) -> Expr:
        """A Tuple with its rewritten fields."""
        if all(a is b for a, b in zip(fields, node.fields, strict=True)):
            return node
        return Tuple(fields, span=node.span)

    def rewrite_tuple_getitem(self, node: TupleGetItem, value: Expr) -> Expr:
        """A TupleGetItem with its rewritten tuple."""
        return node if value is node.tuple_value else TupleGetItem(value, node.index, span=node.span)

    def rewrite_let(self, node: Let, var: Var, value: Expr, body: Expr) -> Expr:
        """A Let with its rewritten parts."""
        if var is node.var and value is node.value and body is node.body:
            return node
        return Let(var, value, body, span=node.span)

    def rewrite_if(self, node: If, cond: Expr, true_branch: Expr, false_branch: Expr) -> Expr:
        """An If with its rewritten parts."""
        if cond is node.cond and true_branch is node.true_branch and false_branch is node.false_branch:
            return node
        return If(cond, true_branch, false_branch, span=node.span)

    def rewrite_function(self, node: Function, params: tuple[Var, ...], body: Expr) -> Expr:
        """A Function with its rewritten parameters and body."""
        if body is node.body and all(a is b for a, b in zip(params, node.params, strict=True)):
            return node
        return Function(params, body, node.ret_type, node.attrs, span=node.span)
