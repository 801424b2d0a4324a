"""Checks an op's gradient (`FPrimalGradient`) against central finite differences of its numpy reference.

`check_op_grad(op, arrays, **attrs)` types one call of `op` on parameters shaped like `arrays`, gives it
an output gradient `g` (random, of the output's type; a tuple of them for a tuple output), builds the
op's gradient expressions, runs them (the reference interpreter, or compiled with `compiled=True`), and
compares each input's gradient with the central difference of L(x) = sum(op(x) * g), computed with the
op's own numpy reference in float64. Integer inputs (indices) get no gradient and are not perturbed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from op_helpers import make_attrs, takes_tuple

from kiln import relay
from kiln.ir.module import IRModule
from kiln.ir.types import TupleType
from kiln.registry import Op, attr

EPS = 1e-6


def typed_call(op: str, arrays: Sequence[np.ndarray], **kw: Any) -> tuple[Any, list[Any]]:
    """The typed call of `op` on parameters shaped like `arrays`, and those parameters."""
    params = [relay.var(f"x{i}", shape=a.shape, dtype=str(a.dtype)) for i, a in enumerate(arrays)]
    args: list[Any] = [relay.Tuple(params)] if takes_tuple(op) else params
    func = relay.infer_type(relay.Function(params, relay.expr.call(op, args, make_attrs(op, **kw))))
    return func.body, list(func.params)


def gradient_exprs(op: str, arrays: Sequence[np.ndarray], **kw: Any) -> tuple[Any, list[Any], list[Any], Any]:
    """(typed call, params, output-gradient vars, the op's gradients of the call)."""
    call, params = typed_call(op, arrays, **kw)
    out = call.checked_type
    if isinstance(out, TupleType):
        gvars = [relay.var(f"g{j}", t) for j, t in enumerate(out.fields)]
        grad: Any = relay.Tuple(gvars)
    else:
        gvars = [relay.var("g", out)]
        grad = gvars[0]
    grads = Op.get(op).get_attr(attr.FPrimalGradient)(call, grad)
    assert len(grads) == len(call.args), f"{op}: {len(grads)} gradients for {len(call.args)} arguments"
    return call, params, gvars, grads


def _loss(op: str, arrays: list[np.ndarray], gvals: list[np.ndarray], kw: dict[str, Any]) -> float:
    f = Op.get(op).get_attr(attr.FReference)
    out = f(make_attrs(op, **kw), tuple(arrays)) if takes_tuple(op) else f(make_attrs(op, **kw), *arrays)
    outs = list(out) if isinstance(out, tuple) else [out]
    return float(sum(np.sum(np.asarray(o, dtype=np.float64) * g) for o, g in zip(outs, gvals, strict=True)))


def finite_difference(op: str, arrays: list[np.ndarray], i: int, gvals: list[np.ndarray],
                      kw: dict[str, Any]) -> np.ndarray:
    """d L / d arrays[i] by central differences, element by element."""
    x = arrays[i]
    out = np.zeros_like(x, dtype=np.float64)
    for index in np.ndindex(x.shape):
        up = [a.copy() for a in arrays]
        down = [a.copy() for a in arrays]
        up[i][index] += EPS
        down[i][index] -= EPS
        out[index] = (_loss(op, up, gvals, kw) - _loss(op, down, gvals, kw)) / (2 * EPS)
    return out


def run_gradient(op: str, arrays: Sequence[np.ndarray], gvals: Sequence[np.ndarray] | None = None,
                 compiled: bool = False, seed: int = 0, **kw: Any) -> tuple[list[np.ndarray | None], list[np.ndarray]]:
    """The op's gradients for `arrays` (None for an argument without one) and the output gradients used."""
    _, params, gvars, grads = gradient_exprs(op, arrays, **kw)
    if takes_tuple(op):  # one argument, a tuple: its gradient is a tuple, one field per tensor
        (tup,) = grads
        grads = [tup.fields[i] if isinstance(tup, relay.Tuple) else relay.TupleGetItem(tup, i)
                 for i in range(len(params))]
    rng = np.random.default_rng(seed)
    if gvals is None:
        gvals = [rng.standard_normal(tuple(int(d) for d in v.type_annotation.shape)).astype(
            str(v.type_annotation.dtype)) for v in gvars]
    flowing = [(i, g) for i, g in enumerate(grads) if g is not None]
    func = relay.infer_type(relay.Function([*params, *gvars], relay.Tuple([g for _, g in flowing])))
    for (i, _), t in zip(flowing, func.body.checked_type.fields, strict=True):
        assert t == params[i].checked_type, f"{op}: the gradient of argument {i} has type {t}, " \
                                            f"expected {params[i].checked_type}"
    values = [*arrays, *gvals]
    if compiled:
        named = {p.name_hint: v for p, v in zip([*params, *gvars], values, strict=True)}
        got = relay.build(func).create_executor()(**named)
    else:
        got = relay.create_executor("debug", mod=IRModule.from_expr(func)).evaluate()(*values)
    got = list(got) if isinstance(got, (tuple, list)) else [got]
    result: list[np.ndarray | None] = [None] * len(grads)
    for (i, _), v in zip(flowing, got, strict=True):
        result[i] = np.asarray(v)
    return result, list(gvals)


def check_op_grad(op: str, arrays: Sequence[np.ndarray], compiled: bool = False, rtol: float = 1e-5,
                  atol: float = 1e-6, seed: int = 0, **kw: Any) -> list[np.ndarray | None]:
    """The op's gradient agrees with central finite differences (float64) for every float input; integer
    inputs get None. Returns the gradients."""
    arrays = [np.asarray(a) for a in arrays]
    got, gvals = run_gradient(op, arrays, compiled=compiled, seed=seed, **kw)
    for i, a in enumerate(arrays):
        if a.dtype.kind != "f":
            assert got[i] is None, f"{op}: a gradient for integer argument {i}"
            continue
        g = got[i]
        assert g is not None, f"{op}: no gradient for argument {i}"
        want = finite_difference(op, list(arrays), i, gvals, kw)
        worst = np.unravel_index(np.argmax(np.abs(g - want)), g.shape) if g.size else ()
        np.testing.assert_allclose(g, want, rtol=rtol, atol=atol,
                                   err_msg=f"{op} argument {i} ({kw}); worst at {worst}")
    return got


Case = tuple[str, list[np.ndarray], dict[str, Any]]  # (op, input arrays, attrs)
MODES = [pytest.param(False, id="interpreted"), pytest.param(True, id="compiled")]


def case_params(cases: Sequence[Case]) -> list[Any]:
    """`cases` as pytest params, each named by its op, input shapes and attrs."""
    def name(case: Case) -> str:
        op, arrays, kw = case
        shapes = "-".join("x".join(map(str, a.shape)) for a in arrays)
        return f"{op}[{shapes}]" + "".join(f"-{k}={v}" for k, v in kw.items())

    return [pytest.param(c, id=name(c)) for c in cases]


def ops_with_fewer_than_two_shapes(cases: Sequence[Case]) -> dict[str, set[tuple[tuple[int, ...], ...]]]:
    """The ops of `cases` checked over fewer than two distinct input shapes (each op needs two)."""
    shapes: dict[str, set[tuple[tuple[int, ...], ...]]] = {}
    for op, arrays, _ in cases:
        shapes.setdefault(op, set()).add(tuple(a.shape for a in arrays))
    return {op: s for op, s in shapes.items() if len(s) < 2}
