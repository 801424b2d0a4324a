"""The op families of the Relay fuzzer: each adds one op (or a few) to a `GraphBuilder`.

Each family picks a value of the graph, then the op and its other operands so
that the call type-checks (broadcast-compatible shapes, reduction axes, split
points that divide the axis), and computes numpy's result beside it. An op is
not drawn where its result would leave the safe range (overflow, NaN), and ops
that flip on the last bit of their input are drawn only for exact values.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
from hypothesis import strategies as st

from kiln import relay
from kiln.relay.expr import Expr, Tuple, TupleGetItem
from kiln.testing.fuzz_graph import (
    _EXACT_LIMIT,
    _FLOAT_LIMIT,
    _MAX_ELEMENTS,
    CASTS,
    FLOATS,
    NUMERIC,
    Array,
    GraphBuilder,
    Value,
    _broadcast,
    _size,
)

Op = Callable[[GraphBuilder], Value | None]


def _erf(x: Array) -> Array:
    return np.asarray(np.vectorize(math.erf, otypes=[np.float64])(x))


def _positive(b: GraphBuilder, v: Value) -> Value:
    """|v| + 1 (as a graph value): an operand that log, sqrt and division accept."""
    one = np.ones((), v.dtype)
    data = np.abs(v.data) + one
    value = Value(relay.add(relay.abs(v.expr), relay.const(one, v.dtype)), np.asarray(data), v.exact, v.err)
    b.consumed.add(id(v))
    return value


_FLOAT_UNARY: list[tuple[Callable[[Expr], Expr], Callable[[Array], Any], bool]] = [
    # constructor, numpy function, whether it needs a positive operand
    (relay.exp, np.exp, False),
    (relay.sigmoid, lambda x: 1 / (1 + np.exp(-x)), False),
    (relay.tanh, np.tanh, False),
    (relay.erf, _erf, False),
    (relay.sin, np.sin, False),
    (relay.cos, np.cos, False),
    (relay.log, np.log, True),
    (relay.sqrt, np.sqrt, True),
    (relay.rsqrt, lambda x: 1 / np.sqrt(x), True),
]


def float_unary(b: GraphBuilder) -> Value | None:
    """exp, sigmoid, tanh, erf, sin, cos; log, sqrt, rsqrt of |x| + 1."""
    v = b.pick(lambda u: u.is_float)
    if v is None:
        return None
    make, fn, positive = b.choose(_FLOAT_UNARY)
    arg = _positive(b, v) if positive else v
    if make is relay.exp and arg.data.size and float(np.max(arg.data)) > 12:
        return None
    with np.errstate(all="ignore"):
        data = fn(arg.data)
    gain = max(1.0, float(np.max(data))) if make is relay.exp and data.size else 2.0
    return b.result(make(arg.expr), data, [v], exact=False, gain=gain)


def exact_unary(b: GraphBuilder) -> Value | None:
    """negative, abs, relu, clip, and floor/ceil/round/sign of exact values."""
    v = b.pick(lambda u: u.dtype != "bool")
    if v is None:
        return None
    kinds = ["negative", "abs", "relu", "clip"]
    if v.exact:
        kinds += ["floor", "ceil", "round", "sign"] if v.is_float else ["sign"]
    kind = b.choose(kinds)
    if kind == "negative":
        return b.result(relay.negative(v.expr), np.negative(v.data), [v], exact=True)
    if kind == "abs":
        return b.result(relay.abs(v.expr), np.abs(v.data), [v], exact=True)
    if kind == "relu":
        return b.result(relay.nn.relu(v.expr), np.maximum(v.data, np.zeros((), v.dtype)), [v], exact=True)
    if kind == "clip":
        lo = b.choose([-1.5, -1.0, 0.0, 0.25])
        hi = lo + b.choose([0.0, 0.5, 1.0, 2.25])
        bounds = (lo, hi)
        if np.issubdtype(v.dtype, np.integer):  # bounds past the dtype's range saturate (uint8 and -1.5: 0)
            info = np.iinfo(v.dtype)
            bounds = (max(lo, info.min), min(max(hi, info.min), info.max))
        expected = np.clip(v.data, *bounds).astype(v.dtype)
        return b.result(relay.clip(v.expr, lo, hi), expected, [v], exact=True)
    fns: dict[str, Callable[[Array], Any]] = {"floor": np.floor, "ceil": np.ceil, "round": np.round, "sign": np.sign}
    fn = fns[kind]
    return b.result(getattr(relay, kind)(v.expr), fn(v.data), [v], exact=True)


def _int_wide(data: Array) -> Array:
    """Integers as int64, so that numpy shows an overflow of the narrower dtype rather than wrapping."""
    return data.astype(np.int64) if data.dtype.kind in "iu" else data


def binary(b: GraphBuilder) -> Value | None:
    """add ... floor_mod with broadcasting; divisors are made positive."""
    v = b.pick(lambda u: u.dtype != "bool")
    if v is None:
        return None
    kinds = ["add", "subtract", "multiply", "maximum", "minimum", "divide", "power"]
    if v.exact or not v.is_float:
        kinds += ["floor_divide", "floor_mod"]
    kind = b.choose(kinds)
    if kind == "power" and not v.is_float:
        kind = "multiply"
    w = b.partner(v)
    if w is None:
        return None
    lhs, rhs = v, w
    if b.flag() and kind not in ("divide", "floor_divide", "floor_mod", "power"):
        lhs, rhs = w, v
    if kind in ("divide", "floor_divide", "floor_mod") or kind == "power":
        rhs = _positive(b, w) if kind != "power" else w
        if kind == "power":
            # a positive base and a small exponent keep the result finite and real
            lhs = _positive(b, v)
            if w.data.size and float(np.max(np.abs(w.data))) > 3:
                return None
            if lhs.data.size and float(np.max(lhs.data)) > 16:
                return None
    x, y = _int_wide(lhs.data), _int_wide(rhs.data)
    with np.errstate(all="ignore"):
        if kind == "divide":
            data = np.trunc(x / y).astype(np.int64) if not v.is_float else x / y
        elif kind == "floor_divide":
            data = np.floor_divide(x, y) if not v.is_float else np.floor(x / y)
        elif kind == "floor_mod":
            data = np.mod(x, y)
        else:
            data = getattr(np, kind)(x, y)
    exact = kind in ("add", "subtract", "multiply", "maximum", "minimum", "floor_divide", "floor_mod")
    if kind == "multiply" and v.is_float:
        exact = bool(np.array_equal(np.multiply(lhs.data.astype(np.float64), rhs.data), data))
    expr = getattr(relay, kind)(lhs.expr, rhs.expr)
    gain = 1.0
    if kind in ("multiply", "divide", "power") and x.size and y.size:
        gain = max(1.0, float(np.max(np.abs(x))), float(np.max(np.abs(y))))
        gain *= 4.0 * max(1.0, float(np.max(np.abs(data)))) if kind == "power" else 1.0
    return b.result(expr, data, [v, w], exact=exact or not v.is_float, dtype=v.dtype, gain=gain)


def compare(b: GraphBuilder) -> Value | None:
    """equal ... greater_equal of exact values, then maybe where, logical_not/and/or."""
    v = b.pick(lambda u: u.exact and u.dtype != "bool")
    if v is None:
        return None
    w = b.partner(v)
    if w is None or not w.exact:
        return None
    kind = b.choose(["less", "greater", "equal", "not_equal", "less_equal", "greater_equal"])
    cond = b.result(getattr(relay, kind)(v.expr, w.expr), getattr(np, kind)(v.data, w.data), [v, w], True, "bool")
    if cond is None:
        return None
    then = b.choose(["done", "where", "not", "and", "or"])
    if then == "done":
        return cond
    if then == "not":
        return b.result(relay.logical_not(cond.expr), np.logical_not(cond.data), [cond], True)
    if then in ("and", "or"):
        other = b.pick(lambda u: u.dtype == "bool" and _broadcast(u.shape, cond.shape) is not None)
        assert other is not None  # cond itself
        fn = np.logical_and if then == "and" else np.logical_or
        make = relay.logical_and if then == "and" else relay.logical_or
        return b.result(make(cond.expr, other.expr), fn(cond.data, other.data), [cond, other], True)
    x = b.partner(cond, b.choose(NUMERIC))
    if x is None:
        return None
    y = b.partner(x)
    if y is None or _broadcast(_broadcast(x.shape, y.shape) or (), cond.shape) is None:
        return None
    data = np.where(cond.data, x.data, y.data)
    if data.size > _MAX_ELEMENTS:
        return None
    return b.result(relay.where(cond.expr, x.expr, y.expr), data, [cond, x, y], True, x.dtype)


def cast(b: GraphBuilder) -> Value | None:
    """A cast between the dtypes of `CASTS`, and from bool; floats to ints only when exact and in range."""
    v = b.pick(lambda u: True)
    if v is None:
        return None

    def fits(dtype: str) -> bool:
        if dtype in FLOATS or not v.is_float:
            return True  # integers wrap into narrower ones, in numpy and in compiled code alike
        info = np.iinfo(dtype)  # a float out of the integer's range converts to anything at all
        inside = not v.data.size or (float(np.min(v.data)) > info.min - 1 and float(np.max(v.data)) < info.max + 1)
        return v.exact and inside

    targets = [d for d in CASTS if d != v.dtype and fits(d)]
    if not targets:
        return None
    dtype = b.choose(targets)
    value = b.result(relay.cast(v.expr, dtype), v.data.astype(dtype), [v], True, dtype)
    if value is not None and dtype == "float16" and v.exact:
        # exact when nothing was rounded
        value.exact = bool(np.array_equal(value.data.astype(np.float64), v.data.astype(np.float64)))
        value.err = 0.0 if value.exact else value.err
    return value


def reduction(b: GraphBuilder) -> Value | None:
    """sum, mean, max, min, prod over some axes, with keepdims and exclude."""
    v = b.pick(lambda u: u.dtype != "bool")
    if v is None:
        return None
    kind = b.choose(["sum", "mean", "max", "min", "prod"])
    axis: list[int] | None = None
    exclude = False
    if v.data.ndim and b.flag():
        picked = sorted({b.integer(0, v.data.ndim - 1) for _ in range(b.integer(1, v.data.ndim))})
        axis = [a - v.data.ndim if b.flag() else a for a in picked]
        exclude = b.flag()
    keepdims = b.flag()
    ndim = v.data.ndim
    axes = list(range(ndim)) if axis is None else sorted(a % ndim for a in axis)
    if exclude and axis is not None:
        axes = [a for a in range(ndim) if a not in axes]
    count = _size([v.shape[a] for a in axes])
    if kind in ("max", "min") and count == 0:
        return None  # numpy and the type relation refuse the max of nothing
    if kind == "mean" and count == 0 and not v.is_float:
        return None  # the integer mean of nothing is undefined
    if kind == "prod" and v.data.size and count * math.log(max(1.0, float(np.max(np.abs(v.data))))) > math.log(
        _FLOAT_LIMIT
    ):
        return None
    wide = _int_wide(v.data)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the mean of an empty axis is NaN, as it should be
        data = getattr(np, kind)(wide, axis=tuple(axes), keepdims=keepdims)
        if kind == "mean" and not v.is_float:
            data = np.trunc(data)
    exact = kind in ("max", "min") or not v.is_float
    if kind == "sum" and v.is_float:
        bound = np.sum(np.abs(v.data.astype(np.float64)), axis=tuple(axes))
        exact = not np.asarray(bound).size or float(np.max(bound)) < _EXACT_LIMIT
    expr = getattr(relay, kind)(v.expr, axis=axis, keepdims=keepdims, exclude=exclude)
    gain = 1.0
    if kind == "sum":
        gain = float(count)
    elif kind == "prod" and v.data.size and not exact:
        gain = count * max(1.0, float(np.max(np.abs(v.data)))) ** max(count - 1, 0)  # finite: checked above
    value = b.result(expr, data, [v], exact=exact, dtype=v.dtype, gain=gain)
    if value is not None and kind == "mean" and count == 0:
        value.exact = False  # NaN: nothing may compare or cast it
    return value


def _factor(b: GraphBuilder, size: int) -> list[int]:
    """A random shape with `size` elements."""
    if size == 0:
        dims = [b.dim() or 1 for _ in range(b.integer(0, 3))]
        dims.insert(b.integer(0, len(dims)), 0)
        return dims
    dims = []
    rest = size
    for p in (2, 3, 5, 7, 11, 13):
        while rest % p == 0:
            rest //= p
            dims.append(p)
    if rest > 1:
        dims.append(rest)
    out: list[int] = []
    for p in dims:
        if out and (b.flag() or len(out) >= 8):
            out[-1] *= p
        else:
            out.append(p)
    # at most rank 10 (8 factors and two 1s): high-rank reshapes keep the simplifier's nested div/mod busy
    for _ in range(b.integer(0, 2)):
        out.insert(b.integer(0, len(out)), 1)
    return out


def layout(b: GraphBuilder) -> Value | None:
    """reshape, transpose, expand_dims, squeeze, strided_slice."""
    v = b.pick(lambda u: True)
    if v is None:
        return None
    kind = b.choose(["reshape", "transpose", "expand_dims", "squeeze", "strided_slice"])
    ndim = v.data.ndim
    if kind == "reshape":
        shape = _factor(b, v.data.size)
        newshape = list(shape)
        if v.data.size and newshape and b.flag():
            newshape[b.integer(0, len(newshape) - 1)] = -1
        # a 0 in newshape copies the input's dim unless allowzero says it means a dim of size 0
        expr = relay.reshape(v.expr, newshape, allowzero=0 in newshape)
        return b.result(expr, v.data.reshape(shape), [v], True)
    if kind == "transpose":
        axes = list(b.draw(st.permutations(list(range(ndim))))) if b.flag() else None
        return b.result(relay.transpose(v.expr, axes), np.transpose(v.data, axes), [v], True)
    if kind == "expand_dims":
        if ndim >= 5:
            return None
        axis = b.integer(-ndim - 1, ndim)
        count = b.integer(0, 2)
        data = v.data
        at = axis if axis >= 0 else ndim + 1 + axis
        for _ in range(count):
            data = np.expand_dims(data, at)
        return b.result(relay.expand_dims(v.expr, axis, count), data, [v], True)
    if kind == "squeeze":
        ones = [a for a in range(ndim) if v.shape[a] == 1]
        if not ones:
            return None
        if b.flag():
            return b.result(relay.squeeze(v.expr), np.squeeze(v.data), [v], True)
        picked = sorted({b.choose(ones) for _ in range(b.integer(1, len(ones)))})
        return b.result(relay.squeeze(v.expr, picked), np.squeeze(v.data, tuple(picked)), [v], True)
    if ndim == 0:
        return None
    axes = sorted({b.integer(0, ndim - 1) for _ in range(b.integer(1, ndim))})
    begin, end, strides = [], [], []
    for a in axes:
        d = v.shape[a]
        stride = b.choose([1, 2, -1, 3, -2])
        begin.append(b.integer(-d - 1, d + 1))
        end.append(b.choose([b.integer(-d - 1, d + 1), 2**31 - 1 if stride > 0 else -(2**31)]))
        strides.append(stride)
    index: list[slice] = [slice(None)] * ndim
    for a, lo, hi, st_ in zip(axes, begin, end, strides, strict=True):
        index[a] = slice(lo, hi, st_)
    data = np.array(v.data[tuple(index)])
    return b.result(relay.strided_slice(v.expr, begin, end, strides, axes), data, [v], True)


def _alike(b: GraphBuilder, v: Value, shape: tuple[int, ...]) -> Value:
    """A value of the pool with `shape` and v's dtype, or a new leaf."""
    found = b.pick(lambda u: u.shape == shape and u.dtype == v.dtype) if b.flag() else None
    return found or b.leaf(shape, v.dtype)


def join(b: GraphBuilder) -> Value | None:
    """concatenate of values alike but on one axis; split into a tuple and some of its fields."""
    v = b.pick(lambda u: u.data.ndim > 0)
    if v is None:
        return None
    axis = b.integer(0, v.data.ndim - 1)
    if b.flag():
        parts = [v]
        for _ in range(b.integer(0, 2)):
            parts.append(_alike(b, v, (*v.shape[:axis], b.dim(), *v.shape[axis + 1 :])))
        data = np.concatenate([p.data for p in parts], axis=axis)
        signed = axis - v.data.ndim if b.flag() else axis
        return b.result(relay.concatenate([p.expr for p in parts], signed), data, parts, True)
    d = v.shape[axis]
    sections: int | list[int]
    if b.flag():
        sections = b.choose([n for n in range(1, 5) if d % n == 0])
        pieces = np.split(v.data, sections, axis=axis)
    else:
        if d == 0:
            return None
        sections = sorted({b.integer(1, d) for _ in range(b.integer(1, 3))})
        pieces = np.split(v.data, sections, axis=axis)
    whole = relay.split(v.expr, sections, axis)
    b.consumed.add(id(v))
    b.tuples.append((whole, [Value(TupleGetItem(whole, i), p, v.exact, v.err) for i, p in enumerate(pieces)]))
    picked = sorted({b.integer(0, len(pieces) - 1) for _ in range(b.integer(1, len(pieces)))})
    last = None
    for i in picked:
        last = b.result(TupleGetItem(whole, i), pieces[i], [v], True)
    return last


def product(b: GraphBuilder) -> Value | None:
    """dense (..., K) x (N, K) or matmul (..., M, K) x (..., K, N) with broadcast batch dims."""
    v = b.pick(lambda u: u.dtype != "bool" and u.data.ndim >= 1)
    if v is None:
        return None
    k = v.shape[-1]
    n = b.dim()
    if b.flag() or v.data.ndim < 2:
        w = b.pick(lambda u: u.shape == (n, k) and u.dtype == v.dtype) or b.leaf((n, k), v.dtype)
        x, y = _int_wide(v.data), _int_wide(w.data)
        data = np.matmul(x, y.T)
        bound = np.matmul(np.abs(x.astype(np.float64)), np.abs(y.astype(np.float64)).T)
        expr: Expr = relay.nn.dense(v.expr, w.expr)
    else:
        transpose_a, transpose_b = b.flag(), b.flag()
        a_data = np.swapaxes(v.data, -1, -2) if transpose_a else v.data
        k = a_data.shape[-1]
        batch = [b.choose([d, 1]) for d in v.shape[:-2]][b.integer(0, v.data.ndim - 2) :]
        shape = (*batch, n, k) if transpose_b else (*batch, k, n)
        w = b.leaf(tuple(shape), v.dtype)
        b_data = np.swapaxes(w.data, -1, -2) if transpose_b else w.data
        data = np.matmul(_int_wide(a_data), _int_wide(b_data))
        bound = np.matmul(np.abs(a_data.astype(np.float64)), np.abs(b_data.astype(np.float64)))
        expr = relay.nn.matmul(v.expr, w.expr, transpose_a, transpose_b)
    # partial sums in any order stay on the grid below the limit, so float results are exact too
    exact = not bound.size or float(np.max(bound)) < _EXACT_LIMIT
    gain = max(1, k) * max([1.0] + [float(np.max(np.abs(u.data))) for u in (v, w) if u.data.size])
    return b.result(expr, data, [v, w], exact, v.dtype, gain=gain)


def softmax(b: GraphBuilder) -> Value | None:
    """softmax and log_softmax over one axis of a float value."""
    v = b.pick(lambda u: u.is_float and u.data.ndim > 0)
    if v is None:
        return None
    axis = b.integer(-v.data.ndim, v.data.ndim - 1)
    log = b.flag()
    x = v.data
    with np.errstate(all="ignore"):
        if x.shape[axis] == 0:
            data = x.copy()
        else:
            shifted = x - np.max(x, axis=axis, keepdims=True)
            total = np.sum(np.exp(shifted), axis=axis, keepdims=True)
            data = shifted - np.log(total) if log else np.exp(shifted) / total
    make = relay.nn.log_softmax if log else relay.nn.softmax
    return b.result(make(v.expr, axis), data, [v], exact=False, gain=2.0)


def tuple_item(b: GraphBuilder) -> Value | None:
    """A tuple of two or three values and one of its fields (a value read through a tuple)."""
    fields = [b.choose(b.pool) for _ in range(b.integer(2, 3))]
    i = b.integer(0, len(fields) - 1)
    whole = Tuple([f.expr for f in fields])
    b.tuples.append((whole, fields))
    item = TupleGetItem(whole, i)
    return b.result(item, fields[i].data, [fields[i]], True, fields[i].dtype)


def more_layout(b: GraphBuilder) -> Value | None:
    """stack, tile, broadcast_to, take (clip and wrap) and pad (constant, edge, reflect, wrap)."""
    v = b.pick(lambda u: True)
    if v is None:
        return None
    kind = b.choose(["stack", "tile", "broadcast_to", "take", "pad"])
    ndim = v.data.ndim
    if kind == "stack":
        parts = [v] + [_alike(b, v, v.shape) for _ in range(b.integer(0, 2))]
        axis = b.integer(-ndim - 1, ndim)
        data = np.stack([p.data for p in parts], axis=axis)
        return b.result(relay.stack([p.expr for p in parts], axis), data, parts, True)
    if kind == "tile":
        reps = [b.choose([1, 2, 3]) for _ in range(b.integer(max(ndim - 1, 0), ndim + 1))] or [2]
        return b.result(relay.tile(v.expr, reps), np.tile(v.data, reps), [v], True)
    if kind == "broadcast_to":
        shape = [b.dim() if d == 1 and b.flag() else d for d in v.shape]
        shape = [b.dim() for _ in range(b.integer(0, 4 - len(shape)) if len(shape) < 4 else 0)] + shape
        data = np.broadcast_to(v.data, shape).copy()
        return b.result(relay.broadcast_to(v.expr, shape), data, [v], True)
    if kind == "take":
        mode = b.choose(["clip", "wrap"])
        taken = b.integer(0, ndim - 1) if ndim and b.flag() else None
        size = v.data.size if taken is None else v.shape[taken]
        if size == 0:
            return None  # no index is valid, clipped or wrapped
        indices = b.leaf(b.shape(0, 2), "int32")
        data = np.take(v.data, indices.data, axis=taken, mode=mode)
        return b.result(relay.take(v.expr, indices.expr, taken, mode), data, [v, indices], True, v.dtype)
    if ndim == 0:
        return None
    pad_mode = b.choose(["constant", "edge", "reflect", "wrap"])
    width = [(b.integer(0, 2), b.integer(0, 2)) for _ in range(ndim)]
    if pad_mode != "constant" and any(d == 0 and w != (0, 0) for d, w in zip(v.shape, width, strict=True)):
        return None  # nothing to repeat
    pairs = zip(v.shape, width, strict=True)
    if pad_mode == "reflect" and any(max(w) >= d for d, w in pairs if w != (0, 0)):
        return None  # a reflection reaches no further than the axis
    value = b.choose([0.0, 1.5, -2.0]) if v.dtype in FLOATS else b.choose([0, 3])
    if pad_mode == "constant":
        data = np.pad(v.data, width, mode="constant", constant_values=value)
    else:
        data = np.pad(v.data, width, mode=pad_mode)
    expr = relay.nn.pad(v.expr, width, relay.const(value, v.dtype), pad_mode)
    return b.result(expr, data, [v], True)


def more_nn(b: GraphBuilder) -> Value | None:
    """argmax/argmin of exact values, leaky_relu, gelu, bias_add."""
    v = b.pick(lambda u: u.dtype != "bool")
    if v is None:
        return None
    kind = b.choose(["argmax", "argmin", "leaky_relu", "gelu", "bias_add"])
    ndim = v.data.ndim
    if kind in ("argmax", "argmin"):
        if not v.exact or v.data.size == 0:
            return None  # ties must be ties in compiled code too
        axis = b.integer(0, ndim - 1) if ndim and b.flag() else None
        keepdims = b.flag()
        picked = np.argmax(v.data, axis=axis) if kind == "argmax" else np.argmin(v.data, axis=axis)
        data = np.asarray(picked).astype(np.int32)
        if keepdims:
            data = data.reshape((1,) * ndim) if axis is None else np.expand_dims(data, axis)
        return b.result(getattr(relay, kind)(v.expr, axis, keepdims), data, [v], True, "int32")
    if not v.is_float:
        return None
    if kind == "leaky_relu":
        alpha = b.choose([0.25, 0.1, 2.0])
        data = np.where(v.data > 0, v.data, v.data * np.asarray(alpha, v.dtype))
        return b.result(relay.nn.leaky_relu(v.expr, alpha), data, [v], alpha == 0.25, gain=2.0)
    if kind == "gelu":
        approximate = b.choose(["none", "tanh"])
        x = v.data.astype(np.float64)
        if approximate == "tanh":
            data = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
        else:
            data = 0.5 * x * (1 + _erf(x / math.sqrt(2)))
        gain = 2.0 + 0.2 * float(np.max(np.abs(x))) ** 2 if x.size else 2.0
        return b.result(relay.nn.gelu(v.expr, approximate), data, [v], False, gain=gain)
    if ndim == 0:
        return None
    axis = b.integer(-ndim, ndim - 1)
    bias = _alike(b, v, (v.shape[axis],))
    shape = [1] * ndim
    shape[axis] = v.shape[axis]
    data = v.data + bias.data.reshape(shape)
    return b.result(relay.nn.bias_add(v.expr, bias.expr, axis), data, [v, bias], True)


OPS: dict[str, Op] = {
    "more_layout": more_layout,
    "more_nn": more_nn,
    "binary": binary,
    "exact_unary": exact_unary,
    "float_unary": float_unary,
    "reduction": reduction,
    "layout": layout,
    "join": join,
    "compare": compare,
    "cast": cast,
    "product": product,
    "softmax": softmax,
    "tuple_item": tuple_item,
    "leaf": lambda b: b.new_leaf(),
}
