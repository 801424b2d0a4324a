"""Reverse-mode differentiation (TVM's first-order `gradient`): a function's forward result and the
gradients of its parameters, built from each op's `FPrimalGradient`.

The graph is walked once in reverse topological order (`post_order`, no recursion per node). Each node's
gradient is the sum (`add`) of what its users send it; a tuple-valued node collects one sum per field
(what TupleGetItem sends to one field, what a whole-tuple user sends to every field), and a field nobody
uses is zeros. Gradients flow into floating-point values only: integer and bool values (indices,
comparisons) carry none, so an op is asked for its gradient only where a float gradient reaches its output.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kiln.ir.diagnostics import Diagnostic, DiagnosticError, render_all
from kiln.ir.dtype import DataType
from kiln.ir.span import span_scope
from kiln.ir.types import TensorType, TupleType, Type
from kiln.registry import Op, attr
from kiln.relay.expr import Call, Constant, Expr, Function, Tuple, TupleGetItem, Var, call
from kiln.relay.type_infer import infer_type
from kiln.relay.visitor import post_order


class GradientError(DiagnosticError, TypeError):
    """A gradient cannot be formed: an op without one, or a graph the pass does not handle."""

    def __init__(self, message: str, node: Any, root: Expr | None) -> None:
        def excerpt(n: Any) -> str | None:
            if root is None:
                return None
            try:
                from kiln.relay.printer import excerpt as print_excerpt

                return str(print_excerpt(root, n))
            except Exception:  # the excerpt is a courtesy; the message names the op and span already
                return None

        diag = Diagnostic(message, node, getattr(node, "span", None))
        super().__init__([diag], render_all([diag], excerpt).replace("error", "gradient error", 1))


def _is_float(t: Type) -> bool:
    if isinstance(t, TensorType):
        return DataType.of(t.dtype).is_float
    if isinstance(t, TupleType):
        return any(_is_float(f) for f in t.fields)
    return False


def _zeros_like(e: Expr, t: Type) -> Expr:
    """Zeros of type `t`, the type of `e` (a Tuple of zeros for a tuple)."""
    if isinstance(t, TupleType):
        return Tuple(tuple(_zeros_like(TupleGetItem(e, i), f) for i, f in enumerate(t.fields)))
    return call("zeros_like", [e])


def _field(e: Expr, i: int) -> Expr:
    return e.fields[i] if isinstance(e, Tuple) else TupleGetItem(e, i)


class _Adjoints:
    """The gradient sent to each node so far: whole-value parts, and per-field parts for tuples."""

    def __init__(self) -> None:
        self.whole: dict[int, list[Expr]] = {}
        self.fields: dict[int, dict[int, list[Expr]]] = {}

    def send(self, node: Expr, grad: Expr) -> None:
        self.whole.setdefault(id(node), []).append(grad)

    def send_field(self, node: Expr, index: int, grad: Expr) -> None:
        self.fields.setdefault(id(node), {}).setdefault(index, []).append(grad)

    def has(self, node: Expr) -> bool:
        return id(node) in self.whole or id(node) in self.fields

    def total(self, node: Expr) -> Expr:
        """The sum of what `node` received, of node's type (zeros in a tuple's unused fields)."""
        t = node.checked_type
        whole = self.whole.get(id(node), [])
        if not isinstance(t, TupleType):
            return _sum(whole, node, t)
        per_field = self.fields.get(id(node), {})
        return Tuple(tuple(
            _sum(per_field.get(i, []) + [_field(w, i) for w in whole], TupleGetItem(node, i), f)
            for i, f in enumerate(t.fields)))


def _sum(parts: list[Expr], like: Expr, t: Type) -> Expr:
    if not parts:
        return _zeros_like(like, t)
    if isinstance(t, TupleType):
        return Tuple(tuple(_sum([_field(p, i) for p in parts], TupleGetItem(like, i), f)
                           for i, f in enumerate(t.fields)))
    out = parts[0]
    for p in parts[1:]:
        out = call("add", [out, p])
    return out


def _op_gradient(node: Call, grad: Expr, root: Expr) -> list[Expr | None]:
    op = node.op
    assert isinstance(op, Op)
    fn = op.get_attr(attr.FPrimalGradient)
    if fn is None:
        why = op.get_attr(attr.TNonDifferentiable) or "it registers no FPrimalGradient"
        raise GradientError(f"op {op.name} has no gradient: {why}", node, root)
    with span_scope(node.span):  # the gradient's expressions point at the forward call
        out = list(fn(node, grad))
    if len(out) != len(node.args):
        raise GradientError(f"FPrimalGradient of op {op.name} returned {len(out)} gradients for "
                            f"{len(node.args)} arguments", node, root)
    for i, (arg, g) in enumerate(zip(node.args, out, strict=True)):
        if g is None:
            continue
        want = arg.checked_type
        try:
            got = infer_type(g, reuse=True).checked_type
        except DiagnosticError as err:
            raise GradientError(f"FPrimalGradient of op {op.name}: the gradient of argument {i} does not "
                                f"type-check:\n{err}", node, root) from None
        if got != want:
            raise GradientError(f"FPrimalGradient of op {op.name}: the gradient of argument {i} has type {got}, "
                                f"expected {want} (the argument's type)", node, root)
    return out


def params_wrt(func: Function, wrt: Sequence[Var | str] | None) -> list[Var]:
    """The parameters of the typed `func` that `wrt` names (Vars or names), or its float ones for None."""
    if wrt is None:
        return [p for p in func.params if _is_float(p.checked_type)]
    by_name = {p.name_hint: p for p in func.params}
    out: list[Var] = []
    for w in wrt:
        p = by_name.get(w) if isinstance(w, str) else (w if any(w is q for q in func.params) else None)
        if p is None:
            raise GradientError(f"gradient: {w if isinstance(w, str) else w.name_hint!r} is not a parameter of "
                                f"the function; its parameters are {sorted(by_name)}", func, None)
        if not _is_float(p.checked_type):
            raise GradientError(f"gradient: parameter {p.name_hint} has type {p.checked_type}: only "
                                "floating-point parameters have a gradient", p, None)
        out.append(p)
    return out


def gradient(func: Function, wrt: Sequence[Var | str] | None = None, mode: str = "first_order") -> Function:
    """The function computing `func`'s result and the gradients of its parameters (reverse mode).

    Args:
        func: a Function whose body is a tensor (a loss, or any output: its gradient is seeded with ones).
            Typed here if it is not yet.
        wrt: the parameters (Vars or names) to differentiate by; None for every floating-point one.
        mode: "first_order" (the only mode).

    Returns:
        A typed Function of the same parameters returning `(result, (gradient of each of wrt, ...))`.

    Raises:
        GradientError: for an op on the way that has no gradient (naming it, why and its span), a
            parameter not in `func` or not floating-point, or a node other than calls of ops, tuples,
            constants and vars.
    """
    if mode != "first_order":
        raise GradientError(f"gradient: unknown mode {mode!r}; known: first_order", func, None)
    if not isinstance(func, Function):
        raise GradientError(f"gradient: expected a relay Function, got {type(func).__name__}", func, None)
    func = infer_type(func)  # type: ignore[assignment]
    assert isinstance(func, Function)
    body = func.body
    if not isinstance(body.checked_type, TensorType):
        raise GradientError(f"gradient: the function's result must be a tensor, found {body.checked_type}", body,
                            func)
    params = params_wrt(func, wrt)
    nodes = post_order(body)
    adj = _Adjoints()
    adj.send(body, call("ones_like", [body]))
    for node in reversed(nodes):
        if not adj.has(node) or not _is_float(node.checked_type):
            continue
        if isinstance(node, Var | Constant):
            continue
        grad = adj.total(node)
        if isinstance(node, Call):
            if not isinstance(node.op, Op):
                raise GradientError("gradient: a call of a function value is not differentiated (first_order "
                                    "handles calls of ops)", node, func)
            for arg, g in zip(node.args, _op_gradient(node, grad, func), strict=True):
                if g is not None and _is_float(arg.checked_type):
                    adj.send(arg, g)
        elif isinstance(node, Tuple):
            for i, f in enumerate(node.fields):
                if _is_float(f.checked_type):
                    adj.send(f, _field(grad, i))
        elif isinstance(node, TupleGetItem):
            adj.send_field(node.tuple_value, node.index, grad)
        else:
            raise GradientError(f"gradient: {type(node).__name__} is not differentiated by first_order (calls "
                                "of ops, tuples, constants and vars are; run ToGraphNormalForm for lets)", node,
                                func)
    grads = [adj.total(p) if adj.has(p) else call("zeros_like", [p]) for p in params]
    out = Function(func.params, Tuple((body, Tuple(tuple(grads)))), span=func.span)
    result = infer_type(out)
    assert isinstance(result, Function)
    return result


__all__ = ["GradientError", "gradient", "params_wrt"]
