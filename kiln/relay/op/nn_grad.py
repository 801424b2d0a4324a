"""The gradients (`FPrimalGradient`) of the `relay.nn` ops: activations, softmax, bias_add, dropout,
the matrix products (nn.dense, nn.matmul, nn.batch_matmul) and the normalizations.

Each function here is named in its op's own chain (`nn.py`, `matmul.py`, `norm.py`), which would pass
the size of a module with them; see `kiln.relay.op._grad` for the contract: `fn(call, grad)` gets the
typed forward call and the gradient of its output, and returns one gradient per argument. Gradients are
Relay expressions built from the op constructors, so they compile, fuse and schedule as the forward
graph does. Where a gradient needs the forward output it names the call itself (`call`): the pass
computes it once.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from kiln.relay.expr import Call, Expr, const
from kiln.relay.op._grad import OpGradientError, collapse_sum_to, dtype_of, field, shape_of
from kiln.relay.op.creation import zeros_like
from kiln.relay.op.reduce import mean, sum
from kiln.relay.op.shape import reshape
from kiln.relay.op.tensor import (
    add,
    cast,
    erf,
    exp,
    greater,
    multiply,
    rsqrt,
    subtract,
    tanh,
    where,
)

Grads = list[Expr | None]


def attrs_of(call: Call) -> Any:
    """The call's attrs, of its op's attrs class (the op's relation checked them)."""
    return call.attrs





def scalar(value: float, like: Expr) -> Expr:
    """A scalar constant of `like`'s dtype."""
    return const(np.asarray(value, dtype=dtype_of(like)))


def along(vec: Expr, axis: int, shape: tuple[int, ...]) -> Expr:
    """A 1-D expression of `shape[axis]` elements reshaped to broadcast along `axis` of a tensor of `shape`."""
    out = [1] * len(shape)
    out[axis] = shape[axis]
    return reshape(vec, out)


def sum_but(e: Expr, axis: int) -> Expr:
    """`e` summed over every axis but `axis`: the gradient of a vector broadcast along it."""
    return sum(e, axis=axis, exclude=True)


def _positive(x: Expr) -> Expr:
    return greater(x, scalar(0.0, x))


# --- activations ---------------------------------------------------------------------------------


def relu_grad(call: Call, grad: Expr) -> Grads:
    """g where x > 0, else 0 (0 at x = 0, as TVM and PyTorch)."""
    (x,) = call.args
    return [where(_positive(x), grad, scalar(0.0, x))]


def leaky_relu_grad(call: Call, grad: Expr) -> Grads:
    """g where x > 0, else alpha g."""
    (x,) = call.args
    return [where(_positive(x), grad, multiply(grad, scalar(attrs_of(call).alpha, x)))]


def prelu_grad(call: Call, grad: Expr) -> Grads:
    """data: g where x > 0, else alpha[c] g; alpha: the sum over all but the channel axis of g x where x <= 0."""
    x, alpha = call.args
    shape = shape_of(x)
    axis = attrs_of(call).axis % len(shape)
    zero = scalar(0.0, x)
    positive = _positive(x)
    dx = where(positive, grad, multiply(grad, along(alpha, axis, shape)))
    dalpha = sum_but(where(positive, zero, multiply(grad, x)), axis)
    return [dx, dalpha]


def gelu_grad(call: Call, grad: Expr) -> Grads:
    """The derivative of the exact form, 0.5 (1 + erf(x / sqrt 2)) + x phi(x), or of the tanh form."""
    (x,) = call.args

    def c(v: float) -> Expr:
        return scalar(v, x)

    if attrs_of(call).approximate == "tanh":
        k, a = math.sqrt(2.0 / math.pi), 0.044715
        x2 = multiply(x, x)
        t = tanh(multiply(c(k), multiply(x, add(c(1.0), multiply(c(a), x2)))))
        du = multiply(c(k), add(c(1.0), multiply(c(3 * a), x2)))  # d/dx of the tanh's argument
        dt = multiply(subtract(c(1.0), multiply(t, t)), du)
        d = add(multiply(c(0.5), add(c(1.0), t)), multiply(multiply(c(0.5), x), dt))
    else:
        cdf = multiply(c(0.5), add(c(1.0), erf(multiply(x, c(1.0 / math.sqrt(2.0))))))
        pdf = multiply(c(1.0 / math.sqrt(2.0 * math.pi)), exp(multiply(c(-0.5), multiply(x, x))))
        d = add(cdf, multiply(x, pdf))
    return [multiply(grad, d)]


def softmax_grad(call: Call, grad: Expr) -> Grads:
    """y (g - sum(g y)) along the axis, y the softmax (the forward call)."""
    gy = multiply(grad, call)
    return [subtract(gy, multiply(call, sum(gy, axis=attrs_of(call).axis, keepdims=True)))]


def log_softmax_grad(call: Call, grad: Expr) -> Grads:
    """g - exp(y) sum(g) along the axis, y the log-softmax (the forward call)."""
    return [subtract(grad, multiply(exp(call), sum(grad, axis=attrs_of(call).axis, keepdims=True)))]


def bias_add_grad(call: Call, grad: Expr) -> Grads:
    """data: g; bias: g summed over all but the channel axis."""
    x = call.args[0]
    return [grad, sum_but(grad, attrs_of(call).axis % len(shape_of(x)))]


def dropout_grad(call: Call, grad: Expr) -> Grads:
    """The identity at inference (the form kiln computes): the gradient of the output, field 0."""
    return [field(grad, 0)]


def pad_grad(call: Call, grad: Expr) -> Grads:
    """Constant mode: data gets the gradient's middle (the input's place); pad_value the sum of the rest.
    Edge, reflect and wrap: each padded axis in turn folds the gradient back onto the input positions that
    its elements were read from (`_fold_axis`); pad_value is not read."""
    from kiln.relay.op.indexing import strided_slice

    x = call.args[0]
    attrs = attrs_of(call)
    shape = shape_of(x)
    axes = [i for i, (b, a) in enumerate(attrs.pad_width) if b or a]
    if attrs.pad_mode != "constant":
        g, gshape = grad, list(shape_of(call))
        for axis in axes:
            src = np.pad(np.arange(shape[axis]), attrs.pad_width[axis], mode=attrs.pad_mode)
            g = _fold_axis(g, tuple(gshape), axis, src, shape[axis], dtype_of(x))
            gshape[axis] = shape[axis]
        return [g, zeros_like(call.args[1])]
    if not axes:
        return [grad, zeros_like(call.args[1])]
    begin = [attrs.pad_width[i][0] for i in axes]
    inner = strided_slice(grad, begin, [b + shape[i] for b, i in zip(begin, axes, strict=True)], axes=axes)
    return [inner, subtract(sum(grad), sum(inner))]


def _fold_axis(g: Expr, gshape: tuple[int, ...], axis: int, src: Any, size: int, dtype: str) -> Expr:
    """The gradient of reading `g`'s positions along `axis` from input positions `src` (one per position,
    numpy ints): each input position gets the sum of the positions that read it. The positions split into
    runs whose sources step by +1 or -1 (a slice put back with `unslice_axis`) or repeat one (summed first,
    as edge mode's pads)."""
    from kiln.relay.op.indexing import strided_slice
    from kiln.relay.op.indexing_grad import unslice_axis
    from kiln.relay.op.tensor import add

    terms: list[Expr] = []
    start = 0
    while start < len(src):
        step = int(src[start + 1] - src[start]) if start + 1 < len(src) else 1
        stop = start + 1
        if step in (-1, 0, 1):
            while stop < len(src) and src[stop] - src[stop - 1] == step:
                stop += 1
        else:
            step = 1
        piece: Expr = strided_slice(g, [start], [stop], axes=[axis])
        shape = list(gshape)
        shape[axis] = stop - start
        first = int(src[start])
        if step == 0:
            piece, shape[axis], picked = sum(piece, axis=axis, keepdims=True), 1, range(first, first + 1)
        else:
            picked = range(first, first + step * (stop - start), step)
        terms.append(unslice_axis(piece, tuple(shape), axis, size, picked, dtype))
        start = stop
    return functools.reduce(add, terms)


# --- matrix products -----------------------------------------------------------------------------


def _in_dtype(call: Call, grad: Expr) -> Expr:
    """The output gradient in the operands' dtype (a product with out_dtype has another)."""
    dtype = dtype_of(call.args[0])
    return grad if dtype_of(call) == dtype else cast(grad, dtype)


def dense_grad(call: Call, grad: Expr) -> Grads:
    """data: g @ W; weight: g^T @ data, the leading dims of data and g flattened into one."""
    from kiln.relay.op.matmul import matmul

    x, w = call.args
    if attrs_of(call).weight_layout != "NK":
        raise OpGradientError(
            f"nn.dense: no gradient for a weight packed as {attrs_of(call).weight_layout} (AlterOpLayout's form); "
            f"differentiate the model before AlterOpLayout (relay.build's passes) runs"
        )
    g = _in_dtype(call, grad)
    k, n = shape_of(x)[-1], shape_of(w)[0]
    xs = shape_of(x)
    if len(xs) != 2:
        g, x = reshape(g, (-1, n)), reshape(x, (-1, k))
    dx: Expr = matmul(g, w)  # not dense(g, w^T): a weight given at run time would be transposed on every call
    if len(xs) != 2:
        dx = reshape(dx, xs)
    return [dx, matmul(g, x, transpose_a=True)]


def _product_grads(call: Call, grad: Expr, product: Any) -> Grads:
    """The gradients of a = A' B' with A' = A or A^T (transpose_a), B' likewise, the batch dims broadcast:
    dA' = G B'^T and dB' = A'^T G, each transposed back where its operand was given transposed, then
    summed over the batch dims that broadcasting added or stretched."""
    a, b = call.args
    ta, tb = attrs_of(call).transpose_a, attrs_of(call).transpose_b
    g = _in_dtype(call, grad)
    da = product(b, g, transpose_a=tb, transpose_b=True) if ta else product(g, b, transpose_a=False,
                                                                            transpose_b=not tb)
    db = product(g, a, transpose_a=True, transpose_b=ta) if tb else product(a, g, transpose_a=not ta,
                                                                            transpose_b=False)
    batch = shape_of(call)[:-2]
    out = []
    for d, arg in ((da, a), (db, b)):
        shape = shape_of(arg)
        out.append(collapse_sum_to(d, (*batch, *shape[-2:]), shape))
    return list(out)


def matmul_grad(call: Call, grad: Expr) -> Grads:
    """nn.matmul: see `_product_grads`."""
    from kiln.relay.op.matmul import matmul

    return _product_grads(call, grad, matmul)


def batch_matmul_grad(call: Call, grad: Expr) -> Grads:
    """nn.batch_matmul: see `_product_grads` (a batch of 1 broadcasts and is summed back)."""
    from kiln.relay.op.matmul import batch_matmul

    return _product_grads(call, grad, batch_matmul)


# --- normalization -------------------------------------------------------------------------------


def layer_norm_grad(call: Call, grad: Expr) -> Grads:
    """With xh = (x - mean) r, r = 1 / sqrt(var + eps) and dxh = g gamma:
    dx = r (dxh - mean(dxh) - xh mean(dxh xh)) along the axis; dgamma = sum(g xh), dbeta = sum(g)
    over the other axes (zeros where scale or center is off)."""
    x, gamma, beta = call.args
    attrs = attrs_of(call)
    shape = shape_of(x)
    axis = attrs.axis % len(shape)
    centered = subtract(x, mean(x, axis=axis, keepdims=True))
    r = rsqrt(add(mean(multiply(centered, centered), axis=axis, keepdims=True), scalar(attrs.epsilon, x)))
    xh = multiply(centered, r)
    dxh = multiply(grad, along(gamma, axis, shape)) if attrs.scale else grad
    inner = subtract(dxh, mean(dxh, axis=axis, keepdims=True))
    dx = multiply(r, subtract(inner, multiply(xh, mean(multiply(dxh, xh), axis=axis, keepdims=True))))
    dgamma = sum_but(multiply(grad, xh), axis) if attrs.scale else zeros_like(gamma)
    dbeta = sum_but(grad, axis) if attrs.center else zeros_like(beta)
    return [dx, dgamma, dbeta]


def batch_norm_grad(call: Call, grad: Expr) -> Grads:
    """Inference form, y = (x - m) s gamma + beta with s = 1 / sqrt(v + eps), and its outputs 1 and 2 the
    moving mean and variance themselves (their gradients flow to moving_mean and moving_var as they are)."""
    x, gamma, beta, m, v = call.args
    attrs = attrs_of(call)
    shape = shape_of(x)
    axis = attrs.axis % len(shape)
    g = field(grad, 0)
    s = rsqrt(add(v, scalar(attrs.epsilon, v)))
    scale = multiply(s, gamma) if attrs.scale else s  # d y / d x, per channel
    centered = subtract(x, along(m, axis, shape))
    dx = multiply(g, along(scale, axis, shape))
    dgamma = sum_but(multiply(g, multiply(centered, along(s, axis, shape))), axis) if attrs.scale \
        else zeros_like(gamma)
    dbeta = sum_but(g, axis) if attrs.center else zeros_like(beta)
    dm = subtract(field(grad, 1), multiply(sum_but(g, axis), scale))
    # d s / d v = -s^3 / 2
    ds_dv = multiply(scalar(-0.5, v), multiply(s, multiply(s, s)))
    dscale_dv = multiply(ds_dv, gamma) if attrs.scale else ds_dv
    dv = add(field(grad, 2), multiply(sum_but(multiply(g, centered), axis), dscale_dv))
    return [dx, dgamma, dbeta, dm, dv]


__all__ = [
    "along", "batch_matmul_grad", "batch_norm_grad", "bias_add_grad", "dense_grad",
    "dropout_grad", "dtype_of", "field", "gelu_grad", "layer_norm_grad", "leaky_relu_grad", "log_softmax_grad",
    "matmul_grad", "pad_grad", "prelu_grad", "relu_grad", "scalar", "softmax_grad", "sum_but",
]
