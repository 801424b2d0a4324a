"""ToGraphNormalForm: let bindings become ordinary shared graph values.

`let %v = add(%x, 1f); multiply(%v, %v)` becomes `multiply(%0, %0)` where
`%0 = add(%x, 1f)` is one node read twice: Relay expressions are graphs, so a
value used several times is still computed once. relay.build's fusion and
graph layout work on this form (a let-bound variable is otherwise a value they
cannot see into). As TVM's pass of that name, this is sound because kiln's
Relay has no references or other effects that a let would order.
"""

from __future__ import annotations

from kiln.ir.module import IRModule
from kiln.ir.transform import ModulePass, PassContext
from kiln.relay.expr import Expr, Let
from kiln.relay.transform._common import relay_pass, rewrite_module
from kiln.relay.visitor import ExprMutator, post_order


class _InlineLets(ExprMutator):
    """Rewrites every use of a let-bound variable to the (rewritten) value it is bound to."""

    def __init__(self) -> None:
        super().__init__()
        self.lets: dict[int, Let] = {}  # id of a let-bound var -> its Let (the root keeps both alive)

    def visit(self, root: Expr) -> Expr:
        memo = self.memo
        self.lets.update((id(n.var), n) for n in post_order(root) if isinstance(n, Let))
        for node in post_order(root):
            # A let's var comes before its value in post order; it is resolved on first use, once the
            # value (a child listed before the body) is rewritten.
            if id(node) in memo or id(node) in self.lets:
                continue
            memo[id(node)] = self._rewrite(node)
        return memo[id(root)]

    def _new(self, e: Expr) -> Expr:
        hit = self.memo.get(id(e))
        if hit is None:  # a let-bound var: its value is rewritten by now
            hit = self.memo[id(e)] = self.memo[id(self.lets[id(e)].value)]
        return hit

    def _rewrite(self, node: Expr) -> Expr:
        if isinstance(node, Let):  # the var is not a Var any more: skip the base class's check
            return self._new(node.body)
        return super()._rewrite(node)


def to_graph_normal_form(expr: Expr) -> Expr:
    """`expr` with every let binding inlined as a shared value (nothing is duplicated).

    Args:
        expr: a Relay expression (typically a function); types are not kept, infer them again.

    Returns:
        The same computation without `Let` nodes; `expr` itself when it has none.
    """
    if not any(isinstance(n, Let) for n in post_order(expr)):
        return expr
    return _InlineLets().visit(expr)


def _pass(mod: IRModule, ctx: PassContext | None = None) -> IRModule:
    return rewrite_module(mod, lambda f, _mod: to_graph_normal_form(f), ctx)


def ToGraphNormalForm() -> ModulePass:
    """The pass that inlines let bindings as shared graph values (opt level 0)."""
    return relay_pass(_pass, "ToGraphNormalForm", 0)
