"""The gradients (`FPrimalGradient`) of tensor.py's elementwise and broadcasting ops.

tensor.py names each op's gradient (or why it has none) in the op's own table row or chain; the
functions live here to keep that module under its size. Each is `(call, grad) -> [gradient per
argument]` as `_grad.py` describes; they build Relay calls by op name (`call`), since the op
constructors live in tensor.py, which imports this module.

Gradients flow into floating-point values only: an integer or bool argument gets None.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from kiln.ir.dtype import DataType
from kiln.ir.types import TensorType
from kiln.relay.expr import Call, Expr, call, const
from kiln.relay.op._grad import OpGradientError, collapse_sum_to, shape_of

Grads = list[Expr | None]
GradFn = Callable[[Call, Expr], Grads]




def _dtype(e: Expr) -> DataType:
    t = e.checked_type
    assert isinstance(t, TensorType)
    return DataType.of(t.dtype)


def _is_float(e: Expr) -> bool:
    t = e.checked_type
    return isinstance(t, TensorType) and DataType.of(t.dtype).is_float


def _c(value: float, like: Expr) -> Expr:
    return const(value, str(_dtype(like)))


def _op(name: str) -> Callable[..., Expr]:
    def build(*args: Expr) -> Expr:
        return call(name, list(args))

    return build


mul, div, add, sub, neg = _op("multiply"), _op("divide"), _op("add"), _op("subtract"), _op("negative")
sign, cos, sin, exp, rsqrt = _op("sign"), _op("cos"), _op("sin"), _op("exp"), _op("rsqrt")
cosh, sinh, log, where, power = _op("cosh"), _op("sinh"), _op("log"), _op("where"), _op("power")
zeros_like, ones_like, floor = _op("zeros_like"), _op("ones_like"), _op("floor")
greater, greater_equal, less_equal, logical_and = (
    _op("greater"), _op("greater_equal"), _op("less_equal"), _op("logical_and"))


def float_only(fn: GradFn) -> GradFn:
    """`fn` for float arguments; None (no gradient) for each integer or bool one."""

    def grad(c: Call, g: Expr) -> Grads:
        out = fn(c, g) if _is_float(c) else [None] * len(c.args)
        return [o if _is_float(a) else None for a, o in zip(c.args, out, strict=True)]

    grad.__name__ = grad.__qualname__ = f"{fn.__name__}_grad"
    return grad


def unary(dfdx: Callable[[Expr, Expr], Expr]) -> GradFn:
    """The gradient of y = f(x) from `dfdx(x, y)`, f'(x) as a Relay expression (y is the forward call)."""

    def grad(c: Call, g: Expr) -> Grads:
        return [mul(g, dfdx(c.args[0], c))]

    return float_only(grad)


def zero(c: Call, g: Expr) -> Grads:
    """Zero for every float argument: the op is piecewise constant (floor, ceil, round, sign, floor_divide),
    so its derivative is 0 wherever it exists (the jumps have none; 0 there too, as TF and JAX)."""
    return [zeros_like(a) for a in c.args]


def _binary(fn: Callable[[Call, Expr, Expr, Expr], tuple[Expr, Expr]]) -> GradFn:
    """A broadcasting binary op's gradient: `fn(call, g, a, b)` gives both in the output's shape, each then
    summed back to its argument's shape."""

    def grad(c: Call, g: Expr) -> Grads:
        a, b = c.args
        da, db = fn(c, g, a, b)
        out = shape_of(c)
        return [collapse_sum_to(da, out, shape_of(a)), collapse_sum_to(db, out, shape_of(b))]

    grad.__name__ = grad.__qualname__ = fn.__name__
    return float_only(grad)


@_binary
def add_grad(c: Call, g: Expr, a: Expr, b: Expr) -> tuple[Expr, Expr]:
    return g, g


@_binary
def subtract_grad(c: Call, g: Expr, a: Expr, b: Expr) -> tuple[Expr, Expr]:
    return g, neg(g)


@_binary
def multiply_grad(c: Call, g: Expr, a: Expr, b: Expr) -> tuple[Expr, Expr]:
    return mul(g, b), mul(g, a)


@_binary
def divide_grad(c: Call, g: Expr, a: Expr, b: Expr) -> tuple[Expr, Expr]:
    ga = div(g, b)
    return ga, neg(mul(ga, c))  # d(a/b)/db = -(a/b) / b


@_binary
def power_grad(c: Call, g: Expr, a: Expr, b: Expr) -> tuple[Expr, Expr]:
    # d/da = b a^(b-1); d/db = a^b log a, taken as 0 where a <= 0 (there a^b is real only for integer b,
    # where it is not differentiable in b), as TF does
    da = mul(g, mul(b, power(a, sub(b, _c(1.0, b)))))
    positive = greater(a, _c(0.0, a))
    safe_a = where(positive, a, ones_like(a))  # log of a where a > 0 only: no NaN in the unused branch
    db = mul(g, where(positive, mul(c, log(safe_a)), zeros_like(c)))
    return da, db


def _select(mask_of: Callable[[Expr, Expr], Expr]) -> GradFn:
    """maximum/minimum: the whole gradient to a where `mask_of(a, b)` holds (ties included), else to b."""

    def fn(c: Call, g: Expr, a: Expr, b: Expr) -> tuple[Expr, Expr]:
        mask = mask_of(a, b)
        zero_g = zeros_like(g)
        return where(mask, g, zero_g), where(mask, zero_g, g)

    fn.__name__ = fn.__qualname__ = "select_grad"
    return _binary(fn)


maximum_grad = _select(greater_equal)
minimum_grad = _select(less_equal)


@_binary
def floor_mod_grad(c: Call, g: Expr, a: Expr, b: Expr) -> tuple[Expr, Expr]:
    # a - floor(a / b) b: floor(a / b) is piecewise constant
    return g, neg(mul(g, floor(div(a, b))))


@_binary
def fmod_grad(c: Call, g: Expr, a: Expr, b: Expr) -> tuple[Expr, Expr]:
    # a - trunc(a / b) b, and trunc(a / b) = (a - fmod(a, b)) / b exactly where it is differentiable
    return g, neg(mul(g, div(sub(a, c), b)))


zero_grad = float_only(zero)


def clip_grad(c: Call, g: Expr) -> Grads:
    """g where a_min <= x <= a_max (the bounds included, as TF), else 0."""
    x = c.args[0]
    attrs: Any = c.attrs  # ClipAttrs, of tensor.py (which imports this module)
    lo, hi = float(attrs.a_min), float(attrs.a_max)
    inside = logical_and(greater_equal(x, _c(lo, x)), less_equal(x, _c(hi, x)))
    return [where(inside, g, zeros_like(g))]


def where_grad(c: Call, g: Expr) -> Grads:
    """None for the condition; g where it holds to x, elsewhere to y, each summed to its shape."""
    cond, x, y = c.args
    zero_g = zeros_like(g)
    out = shape_of(c)
    return [None, collapse_sum_to(where(cond, g, zero_g), out, shape_of(x)),
            collapse_sum_to(where(cond, zero_g, g), out, shape_of(y))]


def cast_grad(c: Call, g: Expr) -> Grads:
    """g cast back to the input's dtype; None for an integer or bool input.

    A cast to an integer or bool dtype has no gradient. This is the one place that says so: the op
    carries FPrimalGradient for its float targets, and this function raises for the others (the
    gradient pass never asks, since no gradient flows into integer values).
    """
    src, dst = c.args[0], _dtype(c)
    if not dst.is_float:
        raise OpGradientError(f"op cast: a cast to {dst} has no gradient (integer and bool values carry none)")
    if not _is_float(src):
        return [None]
    attrs: Any = c.attrs  # CastAttrs, of tensor.py (which imports this module)
    return [call("cast", [g], type(attrs).make("cast", dtype=_dtype(src)))]


_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)

# f'(x) of each unary op from x and y = f(x)
UNARY: dict[str, GradFn] = {
    "negative": float_only(lambda c, g: [neg(g)]),
    "abs": unary(lambda x, y: sign(x)),
    "exp": unary(lambda x, y: y),
    "log": unary(lambda x, y: div(_c(1.0, x), x)),
    "sqrt": unary(lambda x, y: div(_c(0.5, y), y)),
    "rsqrt": unary(lambda x, y: mul(_c(-0.5, y), mul(y, mul(y, y)))),
    "sigmoid": unary(lambda x, y: mul(y, sub(_c(1.0, y), y))),
    "tanh": unary(lambda x, y: sub(_c(1.0, y), mul(y, y))),
    "erf": unary(lambda x, y: mul(_c(_TWO_OVER_SQRT_PI, x), exp(neg(mul(x, x))))),
    "sin": unary(lambda x, y: cos(x)),
    "cos": unary(lambda x, y: neg(sin(x))),
    "tan": unary(lambda x, y: add(_c(1.0, y), mul(y, y))),
    "atan": unary(lambda x, y: div(_c(1.0, x), add(_c(1.0, x), mul(x, x)))),
    "asin": unary(lambda x, y: rsqrt(sub(_c(1.0, x), mul(x, x)))),
    "acos": unary(lambda x, y: neg(rsqrt(sub(_c(1.0, x), mul(x, x))))),
    "sinh": unary(lambda x, y: cosh(x)),
    "cosh": unary(lambda x, y: sinh(x)),
    "asinh": unary(lambda x, y: rsqrt(add(mul(x, x), _c(1.0, x)))),
    "acosh": unary(lambda x, y: rsqrt(mul(sub(x, _c(1.0, x)), add(x, _c(1.0, x))))),
    "atanh": unary(lambda x, y: div(_c(1.0, x), sub(_c(1.0, x), mul(x, x)))),
}
