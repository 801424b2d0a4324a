"""FoldConstant: evaluates, at compile time, every op call whose arguments are all constants.

Each such call is run with the reference interpreter's `run_op` (the op's
`FReference`) and replaced by a Constant (a Tuple of Constants for a tuple
result). Also:

- a field of a literal Tuple (`(a, b).0`) becomes the field itself (when
  the function runs no stateful op);
- a Let that binds a constant is inlined, so its uses fold too.

Calls of ops marked `TOpIsStateful`, ops without a reference and calls inside
primitive (fused) functions are kept. The folded value takes the dtype and
shape the call was typed with; a reference that disagrees leaves the call as
it is. Opt level 2, as TVM.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kiln.ir.module import IRModule
from kiln.ir.transform import ModulePass, PassContext
from kiln.ir.types import TensorType, TupleType, Type
from kiln.registry import Op, attr
from kiln.relay.expr import Call, Constant, Expr, Function, Let, Tuple, TupleGetItem
from kiln.relay.interpreter import run_op
from kiln.relay.transform._common import impure_nodes, inside_primitive, is_stateful, relay_pass, rewrite_module
from kiln.relay.visitor import ExprMutator, post_order


def is_constant(e: Expr) -> bool:
    """Whether `e` is a Constant or a Tuple of Constants (an argument FoldConstant can evaluate)."""
    return isinstance(e, Constant) or (isinstance(e, Tuple) and all(isinstance(f, Constant) for f in e.fields))


def _value_of(e: Expr) -> Any:
    """The array (or tuple of arrays) of an `is_constant` expression."""
    if isinstance(e, Constant):
        return e.data
    assert isinstance(e, Tuple)
    return tuple(f.data for f in e.fields if isinstance(f, Constant))


def _as_expr(value: Any, t: Type, span: Any) -> Expr | None:
    """`value` (a reference's result) as a Constant or Tuple of Constants of type `t`, or None if it is not one."""
    if isinstance(t, TensorType):
        if not isinstance(value, np.ndarray):
            return None
        if t.is_static and tuple(value.shape) != t.concrete_shape:
            return None
        return Constant(value.astype(t.dtype.numpy(), copy=False), span=span)
    if isinstance(t, TupleType):
        if not isinstance(value, tuple) or len(value) != len(t.fields):
            return None
        fields = [_as_expr(v, f, span) for v, f in zip(value, t.fields, strict=True)]
        if any(f is None or not isinstance(f, Constant) for f in fields):
            return None
        return Tuple(tuple(f for f in fields if f is not None), span=span)
    return None


def _is_static(t: Type) -> bool:
    if isinstance(t, TupleType):
        return all(_is_static(f) for f in t.fields)
    return not isinstance(t, TensorType) or t.is_static


def fold_call(call: Call, args: tuple[Expr, ...]) -> Expr | None:
    """`call` (typed) evaluated on `args`: a Constant (or Tuple of them) of its type, or None.

    None when an argument is not constant, the op is stateful or has no
    reference, the call's type has symbolic dims, or the reference's result
    does not fit the call's type.
    """
    op = call.op
    if (
        not isinstance(op, Op)
        or not all(is_constant(a) for a in args)
        or is_stateful(op)
        or op.get_attr(attr.FReference) is None
        or not call.has_type
        or not _is_static(call.checked_type)  # constants in, a shape of sizes out: a slice to `s`
    ):
        return None
    value = run_op(op, call.attrs, [_value_of(a) for a in args], call)
    return _as_expr(value, call.checked_type, call.span)


class _Folder(ExprMutator):
    def __init__(self, root: Expr) -> None:
        super().__init__()
        self.skip = inside_primitive(root)
        self.pure = not impure_nodes(root)  # dropping a tuple's other fields is safe

    def visit(self, root: Expr) -> Expr:
        """As ExprMutator.visit, but a Let whose value folds to a constant is inlined into its body.

        post_order lists a Let's var, then its value's sub-graph, then its
        body's, so once the value is rewritten the var's entry is replaced by
        the constant before any use of the var is rewritten.
        """
        memo = self.memo
        nodes = post_order(root)
        lets_of_value: dict[int, list[Let]] = {}
        for node in nodes:
            if isinstance(node, Let) and id(node) not in self.skip:
                lets_of_value.setdefault(id(node.value), []).append(node)
        inlined: set[int] = set()
        for node in nodes:
            if id(node) in memo:
                continue
            if isinstance(node, Let) and id(node.var) in inlined:
                memo[id(node)] = memo[id(node.body)]
            else:
                memo[id(node)] = self._rewrite(node)
            for let in lets_of_value.get(id(node), ()):
                if isinstance(memo[id(node)], Constant):
                    memo[id(let.var)] = memo[id(node)]
                    inlined.add(id(let.var))
        return memo[id(root)]

    def rewrite_call(self, node: Call, op: Op | Expr, args: tuple[Expr, ...]) -> Expr:
        new = super().rewrite_call(node, op, args)
        folded = fold_call(node, args) if id(node) not in self.skip else None
        return folded if folded is not None else new

    def rewrite_tuple_getitem(self, node: TupleGetItem, value: Expr) -> Expr:
        if isinstance(value, Tuple) and self.pure and id(node) not in self.skip:
            return value.fields[node.index]
        return super().rewrite_tuple_getitem(node, value)


def _fold(func: Function, mod: IRModule) -> Expr:
    return _Folder(func).visit(func)


def fold_constant(mod: IRModule, ctx: PassContext | None = None) -> IRModule:
    """`mod` with every constant sub-expression evaluated (typed again)."""
    return rewrite_module(mod, _fold, ctx)


def FoldConstant() -> ModulePass:
    """The pass that evaluates calls whose arguments are all constants (opt level 2)."""
    return relay_pass(fold_constant, "FoldConstant", 2)
