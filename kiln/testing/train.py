"""A training step compiled as one kiln library: forward, loss, backward (`relay.transform.gradient`) and the
SGD update `p - lr * g`, all in one Relay function built by `relay.build`; and a learnable synthetic data set.

```python
func, params = models.mlp(batch=16, sizes=(20, 32, 32, 10))
step = train.sgd_step(func, lr=0.1)
x, labels = train.blobs(16, (20,))
for _ in range(10):
    loss, params = step(x, labels, params)
```
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import numpy as np

from kiln import relay
from kiln.ir.types import TensorType
from kiln.relay.expr import Expr, Function, Tuple, TupleGetItem, Var
from kiln.relay.transform.gradient import gradient
from kiln.relay.type_infer import infer_type

Array = np.ndarray[Any, Any]
Params = dict[str, Array]
Loss = Callable[[Expr, Expr], Expr]

LOSSES: dict[str, Loss] = {
    "softmax_cross_entropy": lambda out, labels: relay.nn.softmax_cross_entropy(out, labels),
    "nll_loss": lambda out, labels: relay.nn.nll_loss(relay.nn.log_softmax(out, axis=1), labels),
}


def blobs(n: int, shape: Sequence[int], classes: int = 2, spread: float = 1.0, seed: int = 0) -> tuple[Array, Array]:
    """`n` samples of `classes` Gaussian blobs: each class a fixed random center (distance ~ 2 sqrt(dims)), its
    samples that center plus standard-normal noise times `spread`. Seeded, so the same call gives the same set.

    Returns:
        (x float32 of shape (n, *shape), labels int64 of shape (n,), the classes taking turns).
    """
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((classes, *shape))
    labels = np.arange(n, dtype=np.int64) % classes
    x = centers[labels] + spread * rng.standard_normal((n, *shape))
    return x.astype("float32"), labels


@attrs.frozen
class TrainStep:
    """One compiled SGD step: `step(x, labels, params) -> (loss, updated params)`.

    `trained` names the parameters the step updates (its outputs after the loss, in this order); the others
    (e.g. batch_norm's running statistics) are inputs only and come back unchanged.
    """

    func: Function
    trained: tuple[str, ...]
    params: tuple[str, ...]
    run: Callable[..., Any]

    def __call__(self, x: Array, labels: Array, params: Mapping[str, Array]) -> tuple[float, Params]:
        outs = self.run(x, labels, *(params[name] for name in self.params))
        loss, *updated = (np.asarray(o) for o in outs)
        new = dict(params)
        new.update(zip(self.trained, updated, strict=True))
        return float(loss), new

    def fit(self, x: Array, labels: Array, params: Mapping[str, Array], steps: int) -> tuple[list[float], Params]:
        """`steps` steps on the same batch; the loss before each step, and the parameters after the last."""
        losses, current = [], dict(params)
        for _ in range(steps):
            loss, current = self(x, labels, current)
            losses.append(loss)
        return losses, current


def step_function(model: Function, loss: str | Loss = "softmax_cross_entropy", lr: float = 0.1,
                  trained: Sequence[str] | None = None, labels_dtype: str = "int64") -> Function:
    """The Relay function of one SGD step of `model`.

    Args:
        model: a Function of (x, params...) returning the scores (batch, classes, ...).
        loss: a name in `LOSSES`, or `(scores, labels) -> scalar loss expression`.
        lr: the learning rate.
        trained: the names of the parameters to update; None for every floating-point parameter but the first.
        labels_dtype: the labels' dtype.

    Returns:
        A typed Function of (x, labels, params...) returning (loss, updated trained params...).
    """
    model = infer_type(model)  # type: ignore[assignment]
    assert isinstance(model, Function)
    x, *params = model.params
    out_t = model.body.checked_type
    assert isinstance(out_t, TensorType)
    labels = relay.var("labels", shape=(out_t.shape[0], *out_t.shape[2:]), dtype=labels_dtype)
    make_loss = LOSSES[loss] if isinstance(loss, str) else loss
    names = [p.name_hint for p in params]
    chosen = names if trained is None else list(trained)
    unknown = [n for n in chosen if n not in names]
    if unknown:
        raise ValueError(f"step_function: no parameters {unknown}; the model's are {names}")
    wrt: list[Var] = [p for p in params if p.name_hint in chosen]
    grads = gradient(Function([x, labels, *params], make_loss(model.body, labels)), wrt=wrt)
    both = grads.body
    outs: list[Expr] = [TupleGetItem(both, 0)]
    for i, p in enumerate(wrt):
        t = p.checked_type
        assert isinstance(t, TensorType)
        g = TupleGetItem(TupleGetItem(both, 1), i)
        outs.append(relay.subtract(p, relay.multiply(relay.const(np.array(lr, dtype=str(t.dtype))), g)))
    func = infer_type(Function(list(grads.params), Tuple(outs)))
    assert isinstance(func, Function)
    return func


def sgd_step(model: Function, loss: str | Loss = "softmax_cross_entropy", lr: float = 0.1,
             trained: Sequence[str] | None = None, target: str = "llvm") -> TrainStep:
    """Compiles one SGD step of `model` (see `step_function`) as one library for `target`.

    Returns:
        The `TrainStep`; `step(x, labels, params)` runs it.
    """
    func = step_function(model, loss, lr, trained)
    lib = relay.build(func, target=target)
    names = tuple(p.name_hint for p in func.params[2:])
    chosen = names if trained is None else tuple(n for n in names if n in trained)
    return TrainStep(func, chosen, names, lib.create_executor())


def numpy_softmax_ce(logits: Array, labels: Array) -> tuple[float, Array]:
    """The mean softmax cross-entropy of `logits` (batch, classes) against int `labels`, and its gradient with
    respect to the logits, in numpy in the logits' dtype."""
    shifted = logits - logits.max(axis=1, keepdims=True)
    e = np.exp(shifted)
    total = e.sum(axis=1, keepdims=True)
    rows = np.arange(len(labels))
    loss = float(np.mean(np.log(total[:, 0]) - shifted[rows, labels]))
    d = e / total
    d[rows, labels] -= 1
    return loss, d / len(labels)


def numpy_mlp_step(x: Array, labels: Array, params: Mapping[str, Array], lr: float) -> tuple[float, Params]:
    """One SGD step of `models.mlp` (dense + bias, relu between) with softmax cross-entropy, by hand in numpy
    in the arrays' dtype: the loss before the step and the updated parameters."""
    layers = len(params) // 2
    acts, h = [x], x
    for i in range(layers):
        h = h @ params[f"w{i}"].T + params[f"b{i}"]
        if i < layers - 1:
            h = np.maximum(h, 0)
        acts.append(h)
    loss, d = numpy_softmax_ce(h, labels)
    new = {}
    for i in reversed(range(layers)):
        if i < layers - 1:
            d = d * (acts[i + 1] > 0)
        new[f"w{i}"] = params[f"w{i}"] - lr * (d.T @ acts[i])
        new[f"b{i}"] = params[f"b{i}"] - lr * d.sum(axis=0)
        if i:
            d = d @ params[f"w{i}"]
    return loss, new


__all__ = ["LOSSES", "TrainStep", "blobs", "numpy_mlp_step", "numpy_softmax_ce", "sgd_step", "step_function"]
