"""Loss ops (`relay.nn.softmax_cross_entropy`, `relay.nn.nll_loss`): ONNX's `SoftmaxCrossEntropyLoss` and
`NegativeLogLikelihoodLoss`.

Both take scores of shape (N, C) or (N, C, d1, ...), int labels of shape (N,) or (N, d1, ...) and class
weights: a (C,) tensor, or a scalar that every class weighs (the constructors' default when no weights are
given, 1). The loss of one element is `-weight[label] * log_prob[n, label, d...]`, 0 where the label is
`ignore_index`; `reduction` "none" keeps them, "sum" adds them, "mean" divides their sum by the sum of the
weights of the elements not ignored (ONNX's definition). A label out of [0, C) that is not ignored is
refused by the numpy reference; the compiled kernels clamp it into range, so that they never read outside
the scores. Gradients flow to the scores and the weights, not to the labels.

Each op is declared in one `register_op` chain (attrs, relation, pattern, numpy reference, compute,
gradient) after the functions it names; its constructor follows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import numpy as np

from kiln import te
from kiln.errors import KilnError
from kiln.ir.attrs import Attrs, int_range, one_of, optional
from kiln.ir.types import TensorType, Type
from kiln.registry import OpPattern, attr, register_op
from kiln.relay.expr import Call, Constant, Expr, Var, call, const
from kiln.relay.op._nn_util import Array, accumulator, insert, static_shape, te_dims, without
from kiln.relay.op._reg import constructor
from kiln.relay.op._rel import RelationError, tensor_args
from kiln.relay.op.indexing import take
from kiln.relay.op.reduce import sum as rsum
from kiln.relay.op.shape import expand_dims
from kiln.relay.op.tensor import cast, divide, equal, multiply, negative, not_equal, subtract
from kiln.tir import expr as tx
from kiln.tir.expr import PrimExpr

Grads = list[Expr | None]


class LossLabelError(KilnError, ValueError):
    """A label out of [0, C) that is not the ignore_index (raised by the numpy reference)."""


@attrs.frozen
class LossAttrs(Attrs):
    """Attributes of nn.softmax_cross_entropy and nn.nll_loss."""

    ignore_index: int | None = attrs.field(
        default=None, validator=optional(int_range()),
        metadata={"doc": "a label value whose elements add nothing to the loss (None: every label counts)"},
    )
    reduction: str = attrs.field(
        default="mean", validator=one_of("none", "sum", "mean"),
        metadata={"doc": "none: one loss per element; sum; mean: the sum over the sum of the counted weights"},
    )


# --- the relation ----------------------------------------------------------------------------------


def _loss_rel(arg_types: list[Type], attrs: LossAttrs) -> Type | None:
    tensors = tensor_args(arg_types)
    if tensors is None:
        return None
    scores, labels, weight = tensors
    if scores.ndim < 2:
        raise RelationError(f"expected scores of shape (N, C) or (N, C, d1, ...), found rank {scores.ndim}", arg=0)
    if not scores.dtype.is_float:
        raise RelationError(f"expected floating-point scores, found dtype {scores.dtype}", arg=0)
    if not labels.dtype.is_int:
        raise RelationError(f"expected integer labels, found dtype {labels.dtype}", arg=1)
    rows = (scores.shape[0], *scores.shape[2:])
    if tuple(labels.shape) != rows:
        raise RelationError(f"expected labels of shape {rows} (the scores' {tuple(scores.shape)} without the "
                            f"class axis 1), found {tuple(labels.shape)}", arg=1)
    if weight.dtype != scores.dtype or tuple(weight.shape) not in ((), (scores.shape[1],)):
        raise RelationError(f"expected class weights of shape ({scores.shape[1]},) or a scalar, of the scores' "
                            f"dtype {scores.dtype}, found {weight}", arg=2)
    return TensorType(rows if attrs.reduction == "none" else (), scores.dtype)


# --- the numpy reference ---------------------------------------------------------------------------


def _log_softmax(x: Array) -> Array:
    shifted = x - np.max(x, axis=1, keepdims=True)
    return np.asarray(shifted - np.log(np.sum(np.exp(shifted), axis=1, keepdims=True)))


def _loss_ref(name: str, softmax: bool) -> Callable[[LossAttrs, Array, Array, Array], Array]:
    def reference(attrs: LossAttrs, x: Array, labels: Array, weight: Array) -> Array:
        logp = _log_softmax(x) if softmax else x
        c = x.shape[1]
        counted = labels != attrs.ignore_index if attrs.ignore_index is not None else np.ones(labels.shape, bool)
        bad = counted & ((labels < 0) | (labels >= c))
        if bad.any():
            raise LossLabelError(f"{name}: label {labels[bad].flat[0]} is out of the {c} classes [0, {c})")
        safe = np.where(counted, labels, 0).astype(np.int64)
        picked = np.take_along_axis(logp, np.expand_dims(safe, 1), axis=1)[:, 0]
        w = np.where(counted, weight[safe] if weight.ndim else weight, 0).astype(x.dtype)
        loss = -w * picked
        if attrs.reduction == "none":
            return np.asarray(loss, dtype=x.dtype)
        if attrs.reduction == "sum":
            return np.asarray(loss.sum(), dtype=x.dtype)
        return np.asarray(loss.sum() / w.sum(), dtype=x.dtype)

    return reference


# --- the compute -----------------------------------------------------------------------------------


def _loss_compute(softmax: bool) -> Callable[[LossAttrs, list[te.Tensor], Type], list[te.Tensor]]:
    """Per element: the log-probability of the label (for softmax: the row's maximum and sum of exp first),
    the counted weight and the loss; then the reduction over all elements in the accumulator dtype."""

    def compute(attrs: LossAttrs, inputs: list[te.Tensor], out_type: Type) -> list[te.Tensor]:
        x, labels, weight = inputs
        shape = te_dims(x)  # a symbolic batch (or other dim) is its size variable
        c, rows = shape[1], without(shape, 1)
        acc = accumulator(x.dtype)

        def label(i: tuple[PrimExpr, ...]) -> PrimExpr:
            return tx.cast("int32", tx.max_(tx.min_(tx.cast("int64", labels[i]), c - 1), 0))

        if softmax:
            k, k2 = te.reduce_axis((0, c), name="k"), te.reduce_axis((0, c), name="k2")
            peak = te.compute(rows, lambda *i: te.max(te.cast(x[insert(i, 1, k)], acc), axis=k), name="loss_max")
            total = te.compute(rows, lambda *i: te.sum(te.exp(te.cast(x[insert(i, 1, k2)], acc) - peak[i]), axis=k2),
                               name="loss_sum")

            def log_prob(i: tuple[PrimExpr, ...]) -> PrimExpr:
                return te.cast(x[insert(i, 1, label(i))], acc) - peak[i] - te.log(total[i])
        else:
            def log_prob(i: tuple[PrimExpr, ...]) -> PrimExpr:
                return te.cast(x[insert(i, 1, label(i))], acc)

        def counted(i: tuple[PrimExpr, ...]) -> PrimExpr:
            if attrs.ignore_index is None:
                return tx.const(True)
            return tx.ne(tx.cast("int64", labels[i]), tx.const(attrs.ignore_index, "int64"))

        def class_weight(i: tuple[PrimExpr, ...]) -> PrimExpr:
            return te.cast(weight[(label(i),)] if weight.ndim else weight[()], acc)

        zero = tx.const(0, acc)
        wt = te.compute(rows, lambda *i: tx.select(counted(i), class_weight(i), zero), name="loss_weight")
        # a select, not wt * log_prob: an ignored label may pick a log-probability of -inf
        each = te.compute(rows, lambda *i: tx.select(counted(i), -wt[i] * log_prob(i), zero), name="loss_each")
        if attrs.reduction == "none":
            return [te.compute(rows, lambda *i: te.cast(each[i], x.dtype), name="loss")]
        ks = [te.reduce_axis((0, d), name=f"r{j}") for j, d in enumerate(rows)]
        ks2 = [te.reduce_axis((0, d), name=f"q{j}") for j, d in enumerate(rows)]
        loss_sum = te.compute((), lambda: te.sum(each[tuple(ks)], axis=ks), name="loss_total")
        if attrs.reduction == "sum":
            return [te.compute((), lambda: te.cast(loss_sum[()], x.dtype), name="loss")]
        weight_sum = te.compute((), lambda: te.sum(wt[tuple(ks2)], axis=ks2), name="loss_weights")
        return [te.compute((), lambda: te.cast(loss_sum[()] / weight_sum[()], x.dtype), name="loss")]

    return compute


# --- the gradient ----------------------------------------------------------------------------------


def _loss_grad(softmax: bool) -> Callable[[Call, Expr], Grads]:
    """d loss / d scores: coef * (softmax(x) - onehot(label)) for softmax_cross_entropy, -coef * onehot(label)
    for nll_loss, where coef is the output gradient times the counted weight (over the weights' sum for mean).
    d loss / d weight[c]: the output gradient times the counted elements' unweighted losses of class c (minus
    the mean, over the weights' sum, for mean). None for the labels."""

    def grad_fn(fwd: Call, grad: Expr) -> Grads:
        from kiln.relay.op.nn import log_softmax  # nn imports this module: its constructors, at call time
        from kiln.relay.op.nn import softmax as softmax_of

        attrs: LossAttrs = fwd.attrs  # type: ignore[assignment]
        x, labels, weight = fwd.args
        xt, lt = x.checked_type, labels.checked_type
        assert isinstance(xt, TensorType) and isinstance(lt, TensorType)
        shape = static_shape(xt)
        c, dtype, ldtype = shape[1], str(xt.dtype), str(lt.dtype)
        rows = without(shape, 1)
        classes = np.arange(c, dtype=ldtype).reshape((1, c) + (1,) * (len(shape) - 2))
        onehot = cast(equal(expand_dims(labels, 1), const(classes)), dtype)
        if attrs.ignore_index is None:
            mask: Expr = const(np.ones(rows, dtype))
        else:
            mask = cast(not_equal(labels, const(np.array(attrs.ignore_index, ldtype))), dtype)
        vector = isinstance(weight.checked_type, TensorType) and weight.checked_type.ndim == 1
        weighted = multiply(take(weight, labels, axis=0, mode="clip") if vector else weight, mask)
        coef: Expr = multiply(grad, weighted)
        if attrs.reduction == "mean":
            total = rsum(weighted)
            coef = divide(coef, total)
        logp = log_softmax(x, axis=1) if softmax else x
        if softmax:
            dx: Expr = multiply(subtract(softmax_of(x, axis=1), onehot), expand_dims(coef, 1))
        else:
            dx = negative(multiply(onehot, expand_dims(coef, 1)))
        # the unweighted loss of each element, and its share of d loss / d weight
        each = negative(rsum(multiply(logp, onehot), axis=1))
        if attrs.reduction == "mean":
            dw_each: Expr = divide(multiply(grad, multiply(subtract(each, fwd), mask)), total)
        else:
            dw_each = multiply(grad, multiply(each, mask))
        if vector:
            dw: Expr = rsum(multiply(onehot, expand_dims(dw_each, 1)), axis=1, exclude=True)
        else:
            dw = rsum(dw_each)
        return [dx, None, dw]

    return grad_fn


# --- the ops ---------------------------------------------------------------------------------------


_OPS = [
    ("nn.softmax_cross_entropy", True, "scores", "the scores (logits), (N, C) or (N, C, d1, ...)",
     "ONNX SoftmaxCrossEntropyLoss: -weight[label] * log_softmax(scores, axis=1)[label], reduced"),
    ("nn.nll_loss", False, "log_probs", "the log-probabilities, (N, C) or (N, C, d1, ...)",
     "ONNX NegativeLogLikelihoodLoss: -weight[label] * log_probs[label], reduced"),
]
for _name, _softmax, _arg, _arg_doc, _doc in _OPS:
    (register_op(_name).describe(_doc)
        .add_argument(_arg, "Tensor", _arg_doc)
        .add_argument("labels", "Tensor", "integer class labels, (N,) or (N, d1, ...)")
        .add_argument("weight", "Tensor", "the class weights (C,), or a scalar weight of every class")
        .set_attrs_type(LossAttrs)
        .add_type_rel("Loss", _loss_rel)
        .set_support_level(2)
        .set_attr(attr.TOpPattern, OpPattern.OPAQUE)
        .set_attr(attr.FReference, _loss_ref(_name, _softmax))
        .set_attr(attr.FCompute, _loss_compute(_softmax))
        .set_attr(attr.FPrimalGradient, _loss_grad(_softmax)))


def _weight_or_one(scores: Expr, weight: Expr | None) -> Expr:
    """`weight`, or the scalar 1 of the scores' dtype (known from a type annotation or by typing `scores`)."""
    if weight is not None:
        return weight
    known: Any = None
    if isinstance(scores, Var):
        known = scores.type_annotation
    elif isinstance(scores, Constant):
        known = scores.type
    elif scores.has_type:
        known = scores.checked_type
    else:
        try:
            from kiln.relay.type_infer import infer_type

            known = infer_type(scores, reuse=True).checked_type
        except KilnError:
            known = None
    return const(1.0, dtype=str(known.dtype) if isinstance(known, TensorType) else "float32")


@constructor("nn.softmax_cross_entropy")
def softmax_cross_entropy(scores: Expr, labels: Expr, weight: Expr | None = None, ignore_index: int | None = None,
                          reduction: str = "mean") -> Call:
    """Softmax cross-entropy (ONNX SoftmaxCrossEntropyLoss) of scores over the class axis 1.

    Args:
        scores: the logits, (N, C) or (N, C, d1, ...).
        labels: integer labels, (N,) or (N, d1, ...).
        weight: class weights (C,); None weighs every class 1.
        ignore_index: a label whose elements add nothing to the loss (nor to the mean's divisor).
        reduction: "none", "sum" or "mean".

    Returns:
        The call of nn.softmax_cross_entropy.
    """
    attrs_ = LossAttrs.make("nn.softmax_cross_entropy", ignore_index=ignore_index, reduction=reduction)
    return call("nn.softmax_cross_entropy", [scores, labels, _weight_or_one(scores, weight)], attrs_)


@constructor("nn.nll_loss")
def nll_loss(log_probs: Expr, labels: Expr, weight: Expr | None = None, ignore_index: int | None = None,
             reduction: str = "mean") -> Call:
    """Negative log-likelihood loss (ONNX NegativeLogLikelihoodLoss) over the class axis 1.

    Args:
        log_probs: log-probabilities, (N, C) or (N, C, d1, ...).
        labels: integer labels, (N,) or (N, d1, ...).
        weight: class weights (C,); None weighs every class 1.
        ignore_index: a label whose elements add nothing to the loss (nor to the mean's divisor).
        reduction: "none", "sum" or "mean".

    Returns:
        The call of nn.nll_loss.
    """
    attrs_ = LossAttrs.make("nn.nll_loss", ignore_index=ignore_index, reduction=reduction)
    return call("nn.nll_loss", [log_probs, labels, _weight_or_one(log_probs, weight)], attrs_)


__all__ = ["LossAttrs", "LossLabelError", "nll_loss", "softmax_cross_entropy"]
