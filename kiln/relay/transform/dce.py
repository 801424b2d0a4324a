"""DeadCodeElimination: drops what the result of a function can never depend on.

- A Let whose variable is never used (after the other dead bindings are gone)
  is replaced by its body; chains of dead bindings go at once.
- An If whose condition is a constant becomes the branch it takes.
- A field of a literal Tuple (`(a, b).0`) becomes that field, dropping the others.

Bindings whose value may run a stateful op (TOpIsStateful) are kept. Everything
else that is unreachable is already gone: expressions are graphs, and a
rewritten function holds only what its body reaches. Opt level 1, as TVM.
"""

from __future__ import annotations

from kiln.ir.module import IRModule
from kiln.ir.transform import ModulePass, PassContext
from kiln.relay.expr import Constant, Expr, Function, If, Let, Tuple, TupleGetItem, Var
from kiln.relay.transform._common import impure_nodes, relay_pass, rewrite_module
from kiln.relay.visitor import ExprMutator


def _taken_branch(node: If) -> Expr | None:
    cond = node.cond
    if isinstance(cond, Constant) and cond.data.size == 1:
        return node.true_branch if bool(cond.data.reshape(())) else node.false_branch
    return None


class _Eliminator(ExprMutator):
    def __init__(self, root: Expr, mod: IRModule) -> None:
        super().__init__()
        self.impure = impure_nodes(root, mod)
        self.live = self._mark(root)

    def _droppable_fields(self, node: TupleGetItem) -> bool:
        tup = node.tuple_value
        return isinstance(tup, Tuple) and not any(
            id(f) in self.impure for i, f in enumerate(tup.fields) if i != node.index % len(tup.fields)
        )

    def _mark(self, root: Expr) -> set[int]:
        """The ids of the let vars that are used, seen from `root` as the rewrite will see it."""
        live: set[int] = set()
        pending: dict[int, Let] = {}  # let var id -> its Let, while the var is unused
        seen: set[int] = set()
        stack = [root]
        while stack:
            node = stack.pop()
            if id(node) in seen:
                continue
            seen.add(id(node))
            if isinstance(node, Let):
                stack.append(node.body)
                if id(node.value) in self.impure or id(node.var) in live:
                    live.add(id(node.var))
                    stack.append(node.value)
                else:
                    pending[id(node.var)] = node
            elif isinstance(node, Var):
                live.add(id(node))
                let = pending.pop(id(node), None)
                if let is not None:
                    stack.append(let.value)
            elif isinstance(node, If) and _taken_branch(node) is not None:
                branch = _taken_branch(node)
                assert branch is not None
                stack.append(branch)
            elif isinstance(node, TupleGetItem) and self._droppable_fields(node):
                assert isinstance(node.tuple_value, Tuple)
                stack.append(node.tuple_value.fields[node.index])
            else:
                stack.extend(node.children())
        return live

    def rewrite_let(self, node: Let, var: Var, value: Expr, body: Expr) -> Expr:
        if id(node.var) not in self.live:
            return body
        return super().rewrite_let(node, var, value, body)

    def rewrite_if(self, node: If, cond: Expr, true_branch: Expr, false_branch: Expr) -> Expr:
        branch = _taken_branch(node)
        if branch is not None:
            return true_branch if branch is node.true_branch else false_branch
        return super().rewrite_if(node, cond, true_branch, false_branch)

    def rewrite_tuple_getitem(self, node: TupleGetItem, value: Expr) -> Expr:
        if self._droppable_fields(node) and isinstance(value, Tuple):
            return value.fields[node.index]
        return super().rewrite_tuple_getitem(node, value)


def _eliminate(func: Function, mod: IRModule) -> Expr:
    return _Eliminator(func, mod).visit(func)


def dead_code_elimination(mod: IRModule, ctx: PassContext | None = None) -> IRModule:
    """`mod` without unused let bindings, untaken constant branches and unused tuple fields (typed again)."""
    return rewrite_module(mod, _eliminate, ctx)


def DeadCodeElimination() -> ModulePass:
    """The pass that removes unused bindings and unreachable code (opt level 1)."""
    return relay_pass(dead_code_elimination, "DeadCodeElimination", 1)
