"""Relay analyses: free and bound vars, well-formedness, structural equality and hash, the fusion report.

All of them walk with explicit stacks, so they work on chains of any length.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from kiln.errors import KilnError
from kiln.ir.module import IRModule
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
from kiln.relay.visitor import post_order


class WellFormedError(KilnError, ValueError):
    """An expression breaks a rule of the IR (a var bound twice, a free var in a global function)."""


def bound_vars(expr: Expr) -> list[Var]:
    """Vars bound in `expr` (function parameters and let vars), in post order."""
    out: list[Var] = []
    for node in post_order(expr):
        if isinstance(node, Function):
            out.extend(node.params)
        elif isinstance(node, Let):
            out.append(node.var)
    return out


def all_vars(expr: Expr) -> list[Var]:
    """Every Var in `expr`, in post order."""
    return [n for n in post_order(expr) if isinstance(n, Var)]


def free_vars(expr: Expr) -> list[Var]:
    """Vars used in `expr` but bound nowhere in it, in post order."""
    bound = {id(v) for v in bound_vars(expr)}
    return [v for v in all_vars(expr) if id(v) not in bound]


def check_well_formed(expr: Expr, is_global: bool = False) -> None:
    """Raises WellFormedError if a var is bound twice, or (for a global function) a var is free."""
    seen: dict[int, Var] = {}
    for var in bound_vars(expr):
        if id(var) in seen:
            raise WellFormedError(f"%{var.name_hint} is bound twice" + (f" (at {var.span})" if var.span else ""))
        seen[id(var)] = var
    if is_global:
        free = free_vars(expr)
        if free:
            names = ", ".join(f"%{v.name_hint}" for v in free)
            raise WellFormedError(f"a global function uses free variables: {names}")


def well_formed(expr: Expr, is_global: bool = False) -> bool:
    """Whether `expr` is well formed (see check_well_formed)."""
    try:
        check_well_formed(expr, is_global)
    except WellFormedError:
        return False
    return True


# ---------------------------------------------------------------------------
# Structural equality
# ---------------------------------------------------------------------------


def _same_constant(a: Constant, b: Constant, tensor_values: bool) -> bool:
    if a.data.dtype != b.data.dtype or a.data.shape != b.data.shape:
        return False
    return (not tensor_values and a.data.size > 1) or a.data.tobytes() == b.data.tobytes()


def _attrs_key(values: Mapping[str, Any]) -> tuple[tuple[str, str, str], ...]:
    """Function attributes as a sorted, type-exact key (so 1, 1.0 and True differ)."""
    return tuple(sorted((k, type(v).__name__, repr(v)) for k, v in values.items()))


def structural_equal(a: Any, b: Any, map_free_vars: bool = False, tensor_values: bool = True) -> bool:
    """Whether two expressions, functions or modules have the same structure.

    Bound vars are mapped to each other at their definition sites (function
    parameters, let vars); free vars must be the same object unless
    `map_free_vars`. Types and attrs compare by value; constants bit for bit,
    except that without `tensor_values` constants of more than one element
    compare by dtype and shape only (a kernel takes those as arguments, so
    two fused groups that differ only in their weights share one kernel).
    """
    if isinstance(a, IRModule) or isinstance(b, IRModule):
        if not (isinstance(a, IRModule) and isinstance(b, IRModule)) or list(a) != list(b):
            return False
        return all(structural_equal(a[name], b[name], map_free_vars, tensor_values) for name in a)
    if not isinstance(a, Expr) or not isinstance(b, Expr):
        return bool(a == b)
    var_map: dict[int, Var] = {}
    checked: set[tuple[int, int]] = set()
    stack: list[tuple[Expr, Expr]] = [(a, b)]

    def bind(x: Var, y: Var) -> bool:
        if id(x) in var_map:
            return var_map[id(x)] is y
        if x.type_annotation != y.type_annotation:
            return False
        var_map[id(x)] = y
        return True

    while stack:
        x, y = stack.pop()
        if (id(x), id(y)) in checked:
            continue
        checked.add((id(x), id(y)))
        if type(x) is not type(y):
            return False
        if isinstance(x, Var):
            assert isinstance(y, Var)
            if id(x) in var_map:
                if var_map[id(x)] is not y:
                    return False
            elif map_free_vars:
                if not bind(x, y):
                    return False
            elif x is not y:
                return False
        elif isinstance(x, GlobalVar):
            assert isinstance(y, GlobalVar)
            if x.name_hint != y.name_hint:
                return False
        elif isinstance(x, Constant):
            assert isinstance(y, Constant)
            if not _same_constant(x, y, tensor_values):
                return False
        elif isinstance(x, Call):
            assert isinstance(y, Call)
            if isinstance(x.op, Op) or isinstance(y.op, Op):
                if x.op is not y.op:
                    return False
            else:
                stack.append((x.op, y.op))
            if x.attrs != y.attrs or len(x.args) != len(y.args):
                return False
            stack.extend(zip(x.args, y.args, strict=True))
        elif isinstance(x, Tuple):
            assert isinstance(y, Tuple)
            if len(x.fields) != len(y.fields):
                return False
            stack.extend(zip(x.fields, y.fields, strict=True))
        elif isinstance(x, TupleGetItem):
            assert isinstance(y, TupleGetItem)
            if x.index != y.index:
                return False
            stack.append((x.tuple_value, y.tuple_value))
        elif isinstance(x, Let):
            assert isinstance(y, Let)
            if not bind(x.var, y.var):
                return False
            stack.extend([(x.body, y.body), (x.value, y.value)])
        elif isinstance(x, If):
            assert isinstance(y, If)
            stack.extend([(x.false_branch, y.false_branch), (x.true_branch, y.true_branch), (x.cond, y.cond)])
        elif isinstance(x, Function):
            assert isinstance(y, Function)
            if len(x.params) != len(y.params) or x.ret_type != y.ret_type:
                return False
            if _attrs_key(x.attrs) != _attrs_key(y.attrs):
                return False
            if not all(bind(p, q) for p, q in zip(x.params, y.params, strict=True)):
                return False
            stack.append((x.body, y.body))
    return True


def structural_hash(expr: Any, map_free_vars: bool = False, tensor_values: bool = True) -> int:
    """A hash that agrees with `structural_equal` (given the same flags): equal structures hash equal.

    Bound vars hash by the order in which they are bound; free vars by identity
    (or, with `map_free_vars`, by the order in which they first appear).
    """
    if isinstance(expr, IRModule):
        return hash(tuple((name, structural_hash(expr[name], map_free_vars, tensor_values)) for name in expr))
    if not isinstance(expr, Expr):
        return hash(expr)
    nodes = post_order(expr)
    bound = {id(v) for v in bound_vars(expr)}
    numbers: dict[int, int] = {}
    hashes: dict[int, bytes] = {}

    def h(*parts: Any) -> bytes:
        return hashlib.blake2b(repr(parts).encode(), digest_size=16).digest()

    for node in nodes:
        kids = [hashes[id(c)] for c in node.children()]
        if isinstance(node, Var):
            if id(node) in bound or map_free_vars:
                numbers.setdefault(id(node), len(numbers))
                hashes[id(node)] = h("var", numbers[id(node)], str(node.type_annotation))
            else:
                hashes[id(node)] = h("free", id(node))
        elif isinstance(node, GlobalVar):
            hashes[id(node)] = h("gvar", node.name_hint)
        elif isinstance(node, Constant):
            data = node.data
            by_value = tensor_values or data.size <= 1
            digest = hashlib.blake2b(data.tobytes(), digest_size=16).digest() if by_value else b""
            hashes[id(node)] = h("const", str(data.dtype), data.shape, digest)
        elif isinstance(node, Call):
            op = node.op.name if isinstance(node.op, Op) else None
            hashes[id(node)] = h("call", op, repr(node.attrs), kids)
        elif isinstance(node, TupleGetItem):
            hashes[id(node)] = h("getitem", node.index, kids)
        elif isinstance(node, Function):
            hashes[id(node)] = h("fn", str(node.ret_type), _attrs_key(node.attrs), kids)
        else:
            hashes[id(node)] = h(type(node).__name__, kids)
    return int.from_bytes(hashes[id(expr)][:8], "little", signed=True)

