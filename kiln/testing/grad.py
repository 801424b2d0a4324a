"""`check_grad`: a function's compiled gradient against central finite differences."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from kiln.ir.types import TensorType
from kiln.relay.backend.build_module import build
from kiln.relay.expr import Function, Var, call, const
from kiln.relay.transform.gradient import gradient, params_wrt
from kiln.relay.type_infer import infer_type

Array = np.ndarray[Any, Any]


def _inputs(func: Function, inputs: Sequence[Any] | Mapping[str, Any]) -> list[Array]:
    values = [inputs[p.name_hint] for p in func.params] if isinstance(inputs, Mapping) else list(inputs)
    if len(values) != len(func.params):
        raise ValueError(f"check_grad: the function has {len(func.params)} parameters, got {len(values)} inputs")
    out = []
    for p, v in zip(func.params, values, strict=True):
        t = p.checked_type
        assert isinstance(t, TensorType)
        out.append(np.array(v, dtype=t.dtype.numpy()))
    return out


def check_grad(
    func: Function,
    inputs: Sequence[Any] | Mapping[str, Any],
    wrt: Sequence[Var | str] | None = None,
    eps: float = 1e-6,
    rtol: float = 1e-4,
    atol: float = 1e-5,
    seed: int = 0,
) -> None:
    """Compiles `gradient(func)` and compares each gradient with central finite differences.

    The scalar differentiated is `sum(func(...) * w)` for fixed random weights `w` (a plain sum would let
    mistakes that are symmetric across the output's elements pass). The differences are taken in float64
    on the compiled forward function: exact to about eps^2 for a float64 function; for a narrower float
    dtype eps is raised to 1e-3, where its rounding stays below the tolerance.

    Args:
        func: a Function whose body is a tensor.
        inputs: one array per parameter, in order or by name.
        wrt: the parameters to check (Vars or names); None for every float one.
        eps: the step of the differences.
        rtol, atol: an element fails where |analytic - numeric| > atol + rtol * |numeric|.
        seed: of the weights `w`.

    Raises:
        AssertionError: naming the parameter and its worst element (index, analytic, numeric).
    """
    func = infer_type(func)  # type: ignore[assignment]
    assert isinstance(func, Function)
    out_t = func.body.checked_type
    assert isinstance(out_t, TensorType)
    weights = np.random.default_rng(seed).uniform(0.5, 1.5, [int(d) for d in out_t.shape])  # type: ignore[arg-type]
    weights = weights.astype(out_t.dtype.numpy())
    weighted = Function(func.params, call("multiply", [func.body, const(weights)]))
    grad_func = gradient(weighted, wrt)
    names = [p.name_hint for p in func.params]
    grad_names = [v.name_hint for v in grad_func.params]
    assert grad_names == names
    values = _inputs(func, inputs)
    analytic = list(build(grad_func).create_executor()(*values))[1:]
    forward = build(func).create_executor()
    wrt_params = params_wrt(func, wrt)
    w64 = weights.astype(np.float64)

    def loss(args: list[Array]) -> float:
        return float(np.sum(np.asarray(forward(*args), dtype=np.float64) * w64))

    for p, got in zip(wrt_params, analytic, strict=True):
        k = next(i for i, q in enumerate(func.params) if q is p)
        x = values[k]
        step = eps if x.dtype == np.float64 else max(eps, 1e-3)
        numeric = np.zeros(x.shape, np.float64)
        for index in np.ndindex(*x.shape):
            args = list(values)
            hi, lo = x.copy(), x.copy()
            hi[index] += step
            lo[index] -= step
            args[k] = hi
            f_hi = loss(args)
            args[k] = lo
            f_lo = loss(args)
            numeric[index] = (f_hi - f_lo) / (float(hi[index]) - float(lo[index]))
        _compare(p.name_hint, np.asarray(got, dtype=np.float64), numeric, rtol, atol)


def _compare(name: str, got: Array, want: Array, rtol: float, atol: float) -> None:
    if got.shape != want.shape:
        raise AssertionError(f"check_grad: the gradient of {name} has shape {got.shape}, expected {want.shape}")
    excess = np.abs(got - want) - (atol + rtol * np.abs(want))
    excess = np.where(np.isnan(got) != np.isnan(want), np.inf, np.nan_to_num(excess, nan=-1.0))
    if excess.size and float(np.max(excess)) > 0:
        worst = np.unravel_index(int(np.argmax(excess)), excess.shape)
        bad = int(np.sum(excess > 0))
        raise AssertionError(
            f"check_grad: the gradient of parameter {name} differs from finite differences at {bad} of "
            f"{excess.size} elements; worst at index {tuple(int(i) for i in worst)}: analytic {got[worst]!r}, "
            f"numeric {want[worst]!r} (rtol {rtol}, atol {atol})")


__all__ = ["check_grad"]
