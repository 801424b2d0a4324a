"""ONNX converters: the composite reductions, scans, normalizations and losses.

ReduceL1/L2/LogSum/LogSumExp/SumSquare, CumSum/CumProd, Hardmax, the
normalizations (RMSNormalization, LpNormalization, GroupNormalization,
MeanVarianceNormalization, LRN) and the losses (NegativeLogLikelihoodLoss,
SoftmaxCrossEntropyLoss). Each is composed from Relay ops, except the scans,
which are the `cumsum` / `cumprod` ops of `kiln.relay.op.reduce`, and the losses,
which are `nn.nll_loss` / `nn.softmax_cross_entropy` (`kiln.relay.op.loss`). The attribute
defaults and the corner cases (reductions of no elements, `noop_with_empty_axes`,
`ignore_index`, weighted means) are ONNX's, as its reference implementation
computes them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from kiln import relay
from kiln.ir.dtype import DataType
from kiln.relay.expr import Expr
from kiln.relay.frontend._onnx_math import _axes
from kiln.relay.frontend.onnx import OnnxNode, onnx_converter, onnx_dtype
from kiln.relay.op._rel import RelationError, normalize_axis
from kiln.relay.op.reduce import cumprod, cumsum


def _const(node: OnnxNode, like: Expr, value: float) -> Expr:
    """A scalar constant of `like`'s dtype."""
    return relay.const(np.asarray(value, node.dtype(like).numpy()))


def _axis(node: OnnxNode, axis: int, ndim: int, what: str = "attribute 'axis'") -> int:
    try:
        return normalize_axis(axis, ndim)
    except RelationError:
        raise node.error(f"{what} is {axis}, out of range for an input of rank {ndim}") from None


def _float_input(node: OnnxNode, x: Expr, what: str = "input #0") -> None:
    if not node.dtype(x).is_float:
        raise node.error(f"{what} must be a floating-point tensor, found {node.dtype(x)}")


# --- the composite reductions ---------------------------------------------------------------------


def _reduce_axes(node: OnnxNode, from_input: bool, ndim: int) -> list[int] | None:
    """The reduced axes, ascending and non-negative; None for noop_with_empty_axes with no axes."""
    axes = _axes(node, from_input)
    if not axes:  # absent or empty: every axis, unless noop_with_empty_axes (opset 18 and up)
        return None if node.bool_attr("noop_with_empty_axes", False) else list(range(ndim))
    what = "input #1 (axes)" if from_input else "attribute 'axes'"
    out = sorted({_axis(node, a, ndim, f"{what} holds an axis that") for a in axes})
    if len(out) != len(axes):
        raise node.error(f"axes {axes} names an axis twice")
    return out


def _composite_reduce(
    op_type: str,
    pre: Callable[[OnnxNode, Expr], Expr],
    total: Callable[[OnnxNode, Expr, list[int], bool], Expr],
    post: Callable[[OnnxNode, Expr], Expr],
    identity: float,
    input_axes_since: int,
    floating: bool = False,
) -> None:
    """Converters of `op_type` = post(total(pre(x), axes)) for opsets 1.. and `input_axes_since`...

    With noop_with_empty_axes and no axes, ONNX's reference reduces over no axis, which leaves
    post(pre(x)) (|x| for ReduceL1), not x. A reduction over an empty axis is `identity`. With
    `floating` (a square root, a log), integers are reduced in float64 and the result truncated
    back to their type, as ONNX's reference computes them.
    """

    def body(node: OnnxNode, x: Expr, axes: list[int] | None, keepdims: bool) -> Expr:
        dtype = node.dtype(x)
        wide = floating and not dtype.is_float
        y = pre(node, relay.cast(x, "float64") if wide else x)
        y = post(node, y if axes is None else total(node, y, axes, keepdims))
        return relay.cast(y, dtype) if wide else y

    def make(from_input: bool) -> Callable[[OnnxNode], Expr]:
        def convert(node: OnnxNode) -> Expr:
            x = node.input(0)
            keepdims = node.bool_attr("keepdims", True)
            shape = node.shape(x)
            axes = _reduce_axes(node, from_input, len(shape))
            if axes is None:
                return body(node, x, None, keepdims)
            if any(shape[a] == 0 for a in axes):
                out = [1 if i in axes else d for i, d in enumerate(shape) if keepdims or i not in axes]
                if not all(isinstance(d, int) for d in out):
                    raise node.error(f"an empty reduction needs a static shape, found {shape}")
                dtype = node.dtype(x).numpy()
                return relay.const(np.full([int(d) for d in out], identity).astype(dtype))  # type: ignore[arg-type]
            return body(node, x, axes, keepdims)

        return convert

    onnx_converter(op_type, since=1)(make(False))
    onnx_converter(op_type, since=input_axes_since)(make(True))


def _same(node: OnnxNode, x: Expr) -> Expr:
    return x


def _square(node: OnnxNode, x: Expr) -> Expr:
    return relay.multiply(x, x)


def _sqrt(node: OnnxNode, x: Expr) -> Expr:
    return relay.sqrt(x)


def _log(node: OnnxNode, x: Expr) -> Expr:
    return relay.log(x)


def _sum(node: OnnxNode, x: Expr, axes: list[int], keepdims: bool) -> Expr:
    return relay.sum(x, axes, keepdims)


def _log_sum_exp(node: OnnxNode, x: Expr, axes: list[int], keepdims: bool) -> Expr:
    # the largest element taken out first, so exp cannot overflow; a row of -inf (or +inf) keeps its
    # maximum out of the subtraction, where inf - inf would be NaN
    top = relay.max(x, axes, keepdims=True)
    finite = relay.logical_and(relay.less(relay.abs(top), _const(node, x, np.inf)), relay.equal(top, top))
    shift = relay.where(finite, top, relay.zeros_like(top))
    out = relay.add(relay.log(relay.sum(relay.exp(relay.subtract(x, shift)), axes, keepdims=True)), shift)
    return out if keepdims else relay.squeeze(out, axes)


_composite_reduce("ReduceL1", lambda n, x: relay.abs(x), _sum, _same, 0.0, 18)
_composite_reduce("ReduceL2", _square, _sum, _sqrt, 0.0, 18, floating=True)
_composite_reduce("ReduceSumSquare", _square, _sum, _same, 0.0, 18)
_composite_reduce("ReduceLogSum", _same, _sum, _log, -np.inf, 18, floating=True)
_composite_reduce("ReduceLogSumExp", _same, _log_sum_exp, _same, -np.inf, 18, floating=True)


# --- scans ---------------------------------------------------------------------------------------


def _scan(op_type: str, fn: Callable[..., Expr], since: int) -> None:
    @onnx_converter(op_type, since=since)
    def convert(node: OnnxNode) -> Expr:
        x = node.input(0)
        if node.dtype(x).is_bool:
            raise node.error("input #0 must be numeric, found bool")
        axis = node.value(1, "axis")
        if axis.size != 1 or not np.issubdtype(axis.dtype, np.integer):
            raise node.error(f"input #1 (axis) must be one integer, found {axis.dtype} of shape {axis.shape}")
        ndim = node.ndim(x)
        if ndim == 0:
            raise node.error("input #0 must have rank 1 or more")
        return fn(x, axis=_axis(node, int(axis.reshape(())), ndim, "input #1 (axis)"),
                  exclusive=node.bool_attr("exclusive", False), reverse=node.bool_attr("reverse", False))


_scan("CumSum", cumsum, 11)
_scan("CumProd", cumprod, 26)


# --- losses ---------------------------------------------------------------------------------------


def _loss(node: OnnxNode, scores: Expr, target: Expr, weight: Expr | None, softmax: bool) -> Expr:
    """nn.softmax_cross_entropy (`softmax`) or nn.nll_loss of `scores` (N, C, d1..dk) and `target`, reduced as
    the node says; the node's inputs are checked here first, so a mistake is named in ONNX's terms."""
    reduction = node.attr("reduction", "mean")
    if reduction not in ("none", "sum", "mean"):
        raise node.error(f"attribute 'reduction' must be 'none', 'sum' or 'mean', found {reduction!r}")
    _float_input(node, scores)
    shape, tshape = node.shape(scores), node.shape(target)
    if len(shape) < 2:
        raise node.error(f"input #0 must have shape (N, C, d1, ..., dk), found rank {len(shape)}")
    if tuple(tshape) != (shape[0], *shape[2:]):
        raise node.error(f"input #1 (target) has shape {tuple(tshape)}; for input #0 of shape {tuple(shape)} "
                         f"it must be {(shape[0], *shape[2:])}")
    if node.dtype(target).is_float or node.dtype(target).is_bool:
        raise node.error(f"input #1 (target) must hold integers, found {node.dtype(target)}")
    c = shape[1]
    if not isinstance(c, int):
        raise node.error(f"the class dim C must be static, found {c}")
    if weight is not None and tuple(node.shape(weight)) != (c,):
        raise node.error(f"input #2 (weight) must have shape ({c},), found {tuple(node.shape(weight))}")
    ignore = node.int_attr("ignore_index") if "ignore_index" in node.attrs else None
    make = relay.nn.softmax_cross_entropy if softmax else relay.nn.nll_loss
    return make(scores, target, weight, ignore_index=ignore, reduction=reduction)


@onnx_converter("NegativeLogLikelihoodLoss", since=12)
def _negative_log_likelihood_loss(node: OnnxNode) -> Expr:
    return _loss(node, node.input(0), node.input(1, "target"), node.optional_input(2), softmax=False)


@onnx_converter("SoftmaxCrossEntropyLoss", since=12)
def _softmax_cross_entropy_loss(node: OnnxNode) -> list[Expr]:
    scores = node.input(0)
    loss = _loss(node, scores, node.input(1, "labels"), node.optional_input(2), softmax=True)
    if len(node.outputs) > 1 and node.outputs[1]:
        return [loss, relay.nn.log_softmax(scores, axis=1)]
    return [loss]


# --- normalizations -------------------------------------------------------------------------------


def _stash(node: OnnxNode, x: Expr) -> DataType:
    """The dtype of the statistics: `stash_type` (ONNX's TensorProto type, float32 by default), or `x`'s
    when that is wider (float64 is not narrowed to float32, as onnxruntime keeps it)."""
    stash = onnx_dtype(node.int_attr("stash_type", 1), f"attribute 'stash_type' of {node}")
    if not stash.is_float:
        raise node.error(f"attribute 'stash_type' must name a floating-point type, found {stash}")
    return node.dtype(x) if node.dtype(x).bits > stash.bits else stash


@onnx_converter("RMSNormalization", since=23)
def _rms_normalization(node: OnnxNode) -> Expr:
    x, scale = node.input(0), node.input(1, "scale")
    _float_input(node, x)
    ndim = node.ndim(x)
    axis = _axis(node, node.int_attr("axis", -1), ndim)
    node.check_broadcasts_to(scale, node.shape(x), "the scale")
    # Y has the scale's type (ONNX's V), which may differ from X's (T): the normalized X is cast to it
    dtype, stash = node.dtype(scale), _stash(node, x)
    y = x if stash == node.dtype(x) else relay.cast(x, stash)
    square_mean = relay.mean(relay.multiply(y, y), list(range(axis, ndim)), keepdims=True)
    eps = relay.const(np.asarray(node.float_attr("epsilon", 1e-5), stash.numpy()))
    y = relay.divide(y, relay.sqrt(relay.add(square_mean, eps)))
    if stash != dtype:
        y = relay.cast(y, dtype)
    return relay.multiply(y, scale)


def _check_rank(node: OnnxNode, x: Expr, least: int) -> Sequence[int]:
    shape = node.static_shape(x)
    if len(shape) < least:
        raise node.error(f"input #0 must have rank {least} or more, found shape {shape}")
    return shape


@onnx_converter("LpNormalization", since=1)
def _lp_normalization(node: OnnxNode) -> Expr:
    x = node.input(0)
    _float_input(node, x)
    axis = _axis(node, node.int_attr("axis", -1), node.ndim(x))
    p = node.int_attr("p", 2)
    if p not in (1, 2):
        raise node.error(f"attribute 'p' must be 1 or 2, found {p}")
    if p == 1:
        norm = relay.sum(relay.abs(x), axis, keepdims=True)
    else:
        norm = relay.sqrt(relay.sum(relay.multiply(x, x), axis, keepdims=True))
    zero = _const(node, x, 0.0)
    # a zero norm gives 0 (ONNX's 0 / 0 = 0), and the division must not see it
    is_zero = relay.equal(norm, zero)
    safe = relay.where(is_zero, _const(node, x, 1.0), norm)
    return relay.where(is_zero, zero, relay.divide(x, safe))


@onnx_converter("MeanVarianceNormalization", since=9)
def _mean_variance_normalization(node: OnnxNode) -> Expr:
    x = node.input(0)
    _float_input(node, x)
    ndim = node.ndim(x)
    axes = node.ints_attr("axes", [0, 2, 3])
    assert axes is not None
    norm_axes = sorted({_axis(node, a, ndim, "attribute 'axes' holds an axis that") for a in axes})
    # ONNX's function body: (x - E[x]) / (sqrt(E[x^2] - E[x]^2) + 1e-9)
    mean = relay.mean(x, norm_axes, keepdims=True)
    variance = relay.subtract(relay.mean(relay.multiply(x, x), norm_axes, keepdims=True), relay.multiply(mean, mean))
    std = relay.add(relay.sqrt(variance), _const(node, x, 1e-9))
    return relay.divide(relay.subtract(x, mean), std)


@onnx_converter("GroupNormalization", since=18)
def _group_normalization(node: OnnxNode) -> Expr:
    """Opset 18: scale and bias per group; opset 21: per channel, and the statistics in `stash_type`."""
    x, scale, bias = node.input(0), node.input(1, "scale"), node.input(2, "bias")
    _float_input(node, x)
    shape = _check_rank(node, x, 2)
    n, c = shape[0], shape[1]
    groups = node.int_attr("num_groups")
    if groups < 1 or c % groups:
        raise node.error(f"attribute 'num_groups' is {groups}; it must divide the {c} channels")
    per_channel = node.opset >= 21
    want = c if per_channel else groups
    for i, (e, what) in enumerate(((scale, "scale"), (bias, "bias")), start=1):
        if tuple(node.shape(e)) != (want,):
            per = "channel" if per_channel else "group"
            raise node.error(f"input #{i} ({what}) must have shape ({want},), one per {per}, found "
                             f"{tuple(node.shape(e))}")
    dtype = node.dtype(x)
    stash = _stash(node, x) if per_channel else dtype
    y = relay.reshape(x if stash == dtype else relay.cast(x, stash), (n, groups, -1), allowzero=False)
    mean = relay.mean(y, 2, keepdims=True)
    centered = relay.subtract(y, mean)
    var = relay.mean(relay.multiply(centered, centered), 2, keepdims=True)
    eps = relay.const(np.asarray(node.float_attr("epsilon", 1e-5), stash.numpy()))
    y = relay.divide(centered, relay.sqrt(relay.add(var, eps)))
    if stash != dtype:
        y = relay.cast(y, dtype)
    if not per_channel:
        y = relay.add(relay.multiply(y, relay.reshape(scale, (groups, 1))), relay.reshape(bias, (groups, 1)))
        return relay.reshape(y, shape)
    y = relay.reshape(y, shape)
    along = (c,) + (1,) * (len(shape) - 2)
    return relay.add(relay.multiply(y, relay.reshape(scale, along)), relay.reshape(bias, along))


@onnx_converter("LRN", since=1)
def _lrn(node: OnnxNode) -> Expr:
    x = node.input(0)
    _float_input(node, x)
    shape = _check_rank(node, x, 3)
    size = node.int_attr("size")
    if size < 1:
        raise node.error(f"attribute 'size' must be 1 or more, found {size}")
    alpha, beta = node.float_attr("alpha", 1e-4), node.float_attr("beta", 0.75)
    bias = node.float_attr("bias", 1.0)
    # the window of channel c: c - floor((size-1)/2) .. c + ceil((size-1)/2), zeros past the ends;
    # `size` shifted slices of the padded squares (size is small: 3 or 5 in practice)
    before, after = (size - 1) // 2, size // 2
    c = shape[1]
    squares = relay.multiply(x, x)
    pad = [(0, 0), (before, after)] + [(0, 0)] * (len(shape) - 2)
    padded = relay.nn.pad(squares, pad)
    total: Expr | None = None
    for j in range(size):
        part = relay.strided_slice(padded, [j], [j + c], axes=[1])
        total = part if total is None else relay.add(total, part)
    assert total is not None
    base = relay.add(_const(node, x, bias), relay.multiply(_const(node, x, alpha / size), total))
    return relay.divide(x, relay.power(base, _const(node, x, beta)))


# --- hardmax --------------------------------------------------------------------------------------


def _hardmax_along(node: OnnxNode, x: Expr, shape: Sequence[int], axis: int) -> Expr:
    """1 at the first largest element along `axis`, 0 elsewhere."""
    if 0 in shape:
        return x
    n = shape[axis]
    best = relay.argmax(x, axis=axis, keepdims=True)
    index = relay.const(np.arange(n, dtype=np.int32).reshape((n,) + (1,) * (len(shape) - axis - 1)))
    return relay.cast(relay.equal(index, best), node.dtype(x))


@onnx_converter("Hardmax", since=1)
def _hardmax_2d(node: OnnxNode) -> Expr:
    # before opset 13 the input is coerced to 2-D at `axis`: the hardmax over all the trailing dims
    x = node.input(0)
    shape = node.static_shape(x)
    if not shape:
        raise node.error("input #0 must have rank 1 or more")
    axis = _axis(node, node.int_attr("axis", 1), len(shape))
    flat = (int(np.prod(shape[:axis])), int(np.prod(shape[axis:])))
    out = _hardmax_along(node, relay.reshape(x, flat, allowzero=True), flat, 1)
    return relay.reshape(out, shape, allowzero=True)


@onnx_converter("Hardmax", since=13)
def _hardmax(node: OnnxNode) -> Expr:
    x = node.input(0)
    shape = node.static_shape(x)
    if not shape:
        raise node.error("input #0 must have rank 1 or more")
    return _hardmax_along(node, x, shape, _axis(node, node.int_attr("axis", -1), len(shape)))
