"""EliminateCommonSubexpr: merges structurally equal expressions into one node.

Bottom-up, each Call is keyed by its op (or its callee node), its attrs and
the identities of its already merged arguments; two calls with one key become
one node, so equal sub-graphs collapse from the leaves up. Constants with the
same dtype, shape and bytes, and Tuples / TupleGetItems over the same nodes,
merge the same way. Calls of stateful ops (TOpIsStateful) and the insides of
primitive functions are never merged. Opt level 3, as TVM.
"""

from __future__ import annotations

import hashlib
from collections.abc import Hashable

from kiln.ir.module import IRModule
from kiln.ir.transform import ModulePass, PassContext
from kiln.registry import Op
from kiln.relay.expr import Call, Constant, Expr, Function, Tuple, TupleGetItem
from kiln.relay.transform._common import inside_primitive, is_stateful, relay_pass, rewrite_module
from kiln.relay.visitor import ExprMutator


def _attrs_key(value: object) -> Hashable | None:
    """A hashable stand-in for a call's attrs (None when they cannot be compared by hash)."""
    try:
        hash(value)
    except TypeError:
        return None
    return (type(value), value)


class _Merger(ExprMutator):
    def __init__(self, root: Expr) -> None:
        super().__init__()
        self.skip = inside_primitive(root)
        self.table: dict[Hashable, Expr] = {}

    def _merge(self, node: Expr, new: Expr, key: Hashable) -> Expr:
        if id(node) in self.skip:
            return new
        return self.table.setdefault(key, new)

    def rewrite_constant(self, node: Constant) -> Expr:
        data = node.data
        digest = hashlib.blake2b(data.tobytes(), digest_size=16).digest()
        return self._merge(node, node, ("const", data.dtype.str, data.shape, digest))

    def rewrite_call(self, node: Call, op: Op | Expr, args: tuple[Expr, ...]) -> Expr:
        new = super().rewrite_call(node, op, args)
        if isinstance(op, Op) and is_stateful(op):
            return new
        attrs_key = _attrs_key(node.attrs)
        if attrs_key is None:
            return new
        callee = op.name if isinstance(op, Op) else id(op)
        return self._merge(node, new, ("call", callee, attrs_key, tuple(id(a) for a in args)))

    def rewrite_tuple(self, node: Tuple, fields: tuple[Expr, ...]) -> Expr:
        new = super().rewrite_tuple(node, fields)
        return self._merge(node, new, ("tuple", tuple(id(f) for f in fields)))

    def rewrite_tuple_getitem(self, node: TupleGetItem, value: Expr) -> Expr:
        new = super().rewrite_tuple_getitem(node, value)
        return self._merge(node, new, ("getitem", node.index, id(value)))


def _eliminate(func: Function, mod: IRModule) -> Expr:
    return _Merger(func).visit(func)


def eliminate_common_subexpr(mod: IRModule, ctx: PassContext | None = None) -> IRModule:
    """`mod` with structurally equal calls, constants and tuples merged (typed again)."""
    return rewrite_module(mod, _eliminate, ctx)


def EliminateCommonSubexpr() -> ModulePass:
    """The pass that merges structurally equal calls (opt level 3)."""
    return relay_pass(eliminate_common_subexpr, "EliminateCommonSubexpr", 3)
