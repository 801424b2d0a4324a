"""`compare(mod, inputs)`: relay.build against the reference interpreter, and where they part.

When the compiled model's outputs differ from the reference's, `compare`
looks for the cause in two places. First the passes: it runs relay.build's
pipeline one pass at a time, interpreting the module after each, and names the
first pass after which the reference result changes. Then the kernels: it
evaluates the module op by op with the numpy references and runs each op's
compiled kernel on the very same inputs, and names the first call (op and
span) whose kernel disagrees with its reference.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
import numpy as np

from kiln.ir.module import IRModule
from kiln.registry import Op
from kiln.relay import expr as rx
from kiln.relay.backend import build_module
from kiln.relay.backend.te_compiler import compile_primitive
from kiln.relay.interpreter import create_executor, run_op
from kiln.relay.type_infer import infer_type
from kiln.relay.visitor import post_order


@attrs.frozen
class Mismatch:
    """Where compiled and reference results part: a pass, or one op's kernel."""

    where: str  # "outputs", "pass" or "kernel"
    detail: str
    max_abs_error: float

    def __str__(self) -> str:
        return f"{self.where}: {self.detail} (max abs error {self.max_abs_error:.3g})"


def _flat(value: Any) -> list[np.ndarray]:
    """The arrays of a (nested) tuple value, in order; iterative, as tuples may nest 10,000 deep."""
    out: list[np.ndarray] = []
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, (tuple, list)):
            stack.extend(reversed(v))
        else:
            out.append(np.asarray(v))
    return out


def _error(got: Any, want: Any, rtol: float, atol: float) -> float | None:
    """The max abs error when `got` and `want` differ beyond tolerance, else None."""
    worst = 0.0
    bad = False
    for g, w in zip(_flat(got), _flat(want), strict=True):
        if g.shape != w.shape:
            return float("inf")
        if not np.allclose(g, w, rtol=rtol, atol=atol, equal_nan=True):
            bad = True
        if g.size:
            worst = max(worst, float(np.max(np.abs(g.astype(np.float64) - w.astype(np.float64)))))
    return worst if bad else None


def compare(
    mod: IRModule | rx.Function,
    inputs: Mapping[str, np.ndarray],
    params: Mapping[str, np.ndarray] | None = None,
    target: str = "llvm",
    rtol: float = 1e-4,
    atol: float = 1e-5,
) -> Mismatch | None:
    """None when relay.build's result matches the reference interpreter's; else where they part."""
    if isinstance(mod, rx.Function):
        mod = IRModule.from_expr(mod)
    func = infer_type(mod["main"])
    assert isinstance(func, rx.Function)
    if params:
        func = infer_type(build_module.bind_params(func, params))
        assert isinstance(func, rx.Function)
    mod = IRModule.from_expr(func)
    want = create_executor("debug", mod)(**inputs)
    got = build_module.build(mod, target).create_executor()(**inputs)
    err = _error(got, want, rtol, atol)
    if err is None:
        return None
    step = mod
    with build_module.build_context():
        for p in build_module.build_passes():
            step = p(step)
            perr = _error(create_executor("debug", step)(**inputs), want, rtol, atol)
            if perr is not None:
                return Mismatch("pass", f"the reference result changes after pass {p.info.name}", perr)
    values: dict[int, Any] = {id(v): inputs[v.name_hint] for v in func.params}
    for node in post_order(func.body):
        if isinstance(node, rx.Constant):
            values[id(node)] = node.data
        elif isinstance(node, rx.Tuple):
            values[id(node)] = tuple(values[id(f)] for f in node.fields)
        elif isinstance(node, rx.TupleGetItem):
            values[id(node)] = values[id(node.tuple_value)][node.index]
        elif isinstance(node, rx.Call) and isinstance(node.op, Op):
            args = [values[id(a)] for a in node.args]
            values[id(node)] = ref = run_op(node.op, node.attrs, args, node)
            kernel = compile_primitive(build_module._wrap(node), target, name=node.op.name.replace(".", "_"))
            kerr = _error(kernel(*[np.array(a, copy=True) for a in _flat(args)]), ref, rtol, atol)
            if kerr is not None:
                span = f" at {node.span}" if node.span is not None else ""
                return Mismatch("kernel", f"the kernel of {node.op.name}{span} differs from its reference", kerr)
    return Mismatch("outputs", "the outputs differ, but every pass and every op's kernel agree alone", err)
