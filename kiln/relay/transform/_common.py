"""Helpers the Relay passes share: the pass constructor and its verifier, running a rewrite over every
function, use counts, purity."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kiln.ir.module import IRModule
from kiln.ir.transform import ModulePass, PassContext, PassInfo
from kiln.ir.types import TensorType, Type
from kiln.registry import Op, attr
from kiln.relay.analysis import check_well_formed
from kiln.relay.expr import Call, Expr, Function, GlobalVar
from kiln.relay.type_infer import TypeInferenceError, infer_type
from kiln.relay.visitor import post_order


def infer_module(mod: IRModule, ctx: PassContext | None = None) -> IRModule:
    """`mod` with `checked_type` set on every expression of every function."""
    for name in mod:
        func = mod[name]
        try:
            infer_type(func, mod)
        except TypeInferenceError as err:
            raise TypeInferenceError(err.diagnostics, func, f" in @{name}") from None
    return mod


def verify(mod: IRModule) -> None:
    """Checks every function is well formed (no var bound twice, no free vars) and well typed."""
    for name in mod:
        func = mod[name]
        if isinstance(func, Expr):
            check_well_formed(func, is_global=True)
    infer_module(mod)


def relay_pass(fn: Callable[[IRModule, PassContext], IRModule], name: str, opt_level: int) -> ModulePass:
    """A Relay module pass: `fn` named `name`, run from `opt_level`, checked by `verify` under
    `PassContext(verify=True)`."""
    return ModulePass(fn, PassInfo(name, opt_level), verifier=verify)


def is_primitive(func: Function) -> bool:
    """Whether `func` is marked primitive (a fused group), read from its attrs if Function has them."""
    fattrs: Any = getattr(func, "attrs", None)
    if fattrs is None:
        return False
    value = fattrs.get("Primitive") if hasattr(fattrs, "get") else getattr(fattrs, "Primitive", None)
    try:
        return bool(int(value)) if value is not None else False
    except (TypeError, ValueError):
        return bool(value)


def inside_primitive(root: Expr) -> set[int]:
    """The ids of the nodes of `root` that lie in the body of a primitive function (not the function itself)."""
    out: set[int] = set()
    for node in post_order(root):
        if isinstance(node, Function) and is_primitive(node):
            out.update(id(n) for n in post_order(node.body))
            out.update(id(p) for p in node.params)
    return out


def use_counts(root: Expr) -> dict[int, int]:
    """How many parent slots refer to each node of `root` (the root itself counts one use)."""
    uses: dict[int, int] = {id(root): 1}
    for node in post_order(root):
        for child in node.children():
            uses[id(child)] = uses.get(id(child), 0) + 1
    return uses


def is_stateful(op: Op) -> bool:
    """Whether `op` carries TOpIsStateful = True (passes must keep its calls)."""
    return bool(op.get_attr(attr.TOpIsStateful, False))


def _has_stateful_call(nodes: list[Expr]) -> bool:
    return any(isinstance(n, Call) and isinstance(n.op, Op) and is_stateful(n.op) for n in nodes)


def impure_nodes(root: Expr, mod: IRModule | None = None) -> set[int]:
    """The ids of the nodes whose evaluation may run a stateful op.

    A call of a function value (not of an op) counts as impure whenever the
    module or expression holds any stateful op call at all: it is rare, and
    being conservative there keeps side effects.
    """
    nodes = post_order(root)
    found = _has_stateful_call(nodes)
    if not found and mod is not None:
        found = any(isinstance(f, Expr) and f is not root and _has_stateful_call(post_order(f)) for _, f in mod.items())
    if not found:
        return set()
    impure: set[int] = set()
    for node in nodes:
        if isinstance(node, Function):
            continue  # defining a function runs nothing
        runs_effect = isinstance(node, Call) and (not isinstance(node.op, Op) or is_stateful(node.op))
        if runs_effect or any(id(c) in impure for c in node.children()):
            impure.add(id(node))
    return impure


def tensor_type_of(e: Expr) -> TensorType | None:
    """`e`'s inferred tensor type, or None when it is untyped or not a tensor."""
    if not e.has_type:
        return None
    t: Type = e.checked_type
    return t if isinstance(t, TensorType) else None


def rewrite_module(
    mod: IRModule, rewrite: Callable[[Function, IRModule], Expr], ctx: PassContext | None = None
) -> IRModule:
    """A copy of `mod` with `rewrite(func, mod)` applied to every Relay function, then typed again.

    A function not typed yet is typed first (the rewrites read the types of
    the nodes they replace). Functions the rewrite returns unchanged keep
    their types; the others are typed again, so every pass leaves a
    well-typed module behind it.
    """
    out = mod.copy()
    changed: list[str] = []
    for gvar, func in mod.items():
        if not isinstance(func, Function):
            continue
        if not (func.has_type and func.body.has_type):  # the rewrites read the types of the old nodes
            _infer(func, mod, gvar.name_hint if isinstance(gvar, GlobalVar) else str(gvar))
        new = rewrite(func, mod)
        if new is not func:
            out[gvar] = new
            changed.append(gvar.name_hint if isinstance(gvar, GlobalVar) else str(gvar))
    for name in changed:
        _infer(out[name], out, name)
    return out


def _infer(func: Function, mod: IRModule, name: str) -> None:
    try:
        infer_type(func, mod)
    except TypeInferenceError as err:
        raise TypeInferenceError(err.diagnostics, func, f" in @{name}") from None
