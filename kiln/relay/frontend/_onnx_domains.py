"""ONNX converters of the ops of ONNX's other domains: the training optimizers and a few ML ops.

- ai.onnx.preview.training: Adagrad, Momentum (standard and Nesterov) and Adam,
  one update step of any number of tensors, as elementwise Relay expressions
  (they fuse into one kernel per tensor). The learning rate and the step count
  are tensors read at run time, so a training loop does not recompile.
- ai.onnx.ml: Binarizer and ArrayFeatureExtractor.
Formulas follow the reference implementations in `onnx.reference.ops`.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kiln import relay
from kiln.relay.expr import Expr
from kiln.relay.frontend.onnx import OnnxNode, onnx_converter

TRAINING = "ai.onnx.preview.training"
ML = "ai.onnx.ml"


def _f(x: float) -> Expr:
    return relay.const(np.array(x, np.float32))


def _groups(node: OnnxNode, per_tensor: int) -> list[list[Expr]]:
    """The inputs after R and T, as `per_tensor` lists (X..., G..., then the optimizer's states)."""
    rest = [node.input(i) for i in range(2, len(node.inputs))]
    if not rest or len(rest) % per_tensor:
        raise node.error(f"takes R, T and then {per_tensor} inputs per optimized tensor; found {len(rest)} after T")
    n = len(rest) // per_tensor
    return [rest[k * n:(k + 1) * n] for k in range(per_tensor)]


def _step(node: OnnxNode) -> Expr:
    """T, the update count, as a float32 scalar; its dtype is checked by the schema (int64)."""
    return relay.cast(relay.reshape(node.input(1), []), "float32")


def _rate(node: OnnxNode) -> Expr:
    return relay.reshape(node.input(0), [])


def _optimizer(per_tensor: int, update: Callable[[OnnxNode, Expr, Expr, list[Expr]], list[Expr]]) -> Callable[
        [OnnxNode], list[Expr]]:
    def convert(node: OnnxNode) -> list[Expr]:
        groups = _groups(node, per_tensor)
        results = [update(node, _rate(node), _step(node), list(tensors)) for tensors in zip(*groups, strict=True)]
        return [r[k] for k in range(per_tensor - 1) for r in results]

    return convert


def _adagrad(node: OnnxNode, r: Expr, t: Expr, xgh: list[Expr]) -> list[Expr]:
    x, g, h = xgh
    rate = relay.divide(r, relay.add(_f(1.0), relay.multiply(t, _f(node.float_attr("decay_factor", 0.0)))))
    g_reg = relay.add(relay.multiply(_f(node.float_attr("norm_coefficient", 0.0)), x), g)
    h_new = relay.add(h, relay.multiply(g_reg, g_reg))
    scale = relay.add(relay.sqrt(h_new), _f(node.float_attr("epsilon", 0.0)))
    return [relay.subtract(x, relay.divide(relay.multiply(rate, g_reg), scale)), h_new]


def _momentum(node: OnnxNode, r: Expr, t: Expr, xgv: list[Expr]) -> list[Expr]:
    x, g, v = xgv
    alpha, beta = node.float_attr("alpha"), node.float_attr("beta")
    mode = node.attr("mode")
    if mode not in ("standard", "nesterov"):
        raise node.error(f"attribute 'mode' is {mode!r}: expected 'standard' or 'nesterov'")
    g_reg = relay.add(relay.multiply(_f(node.float_attr("norm_coefficient")), x), g)
    beta_t = relay.where(relay.greater(t, _f(0.0)), _f(beta), _f(1.0))  # the first step takes the whole gradient
    v_new = relay.add(relay.multiply(_f(alpha), v), relay.multiply(beta_t, g_reg))
    direction = v_new if mode == "standard" else relay.add(g_reg, relay.multiply(_f(alpha), v_new))
    return [relay.subtract(x, relay.multiply(r, direction)), v_new]


def _adam(node: OnnxNode, r: Expr, t: Expr, xgvh: list[Expr]) -> list[Expr]:
    x, g, v, h = xgvh
    alpha, beta = node.float_attr("alpha", 0.9), node.float_attr("beta", 0.999)
    g_reg = relay.add(relay.multiply(_f(node.float_attr("norm_coefficient", 0.0)), x), g)
    v_new = relay.add(relay.multiply(_f(alpha), v), relay.multiply(_f(1 - alpha), g_reg))
    h_new = relay.add(relay.multiply(_f(beta), h), relay.multiply(_f(1 - beta), relay.multiply(g_reg, g_reg)))
    scale = relay.add(relay.sqrt(h_new), _f(node.float_attr("epsilon", 1e-6)))
    corrected = relay.divide(relay.multiply(r, relay.sqrt(relay.subtract(_f(1.0), relay.power(_f(beta), t)))),
                             relay.subtract(_f(1.0), relay.power(_f(alpha), t)))
    rate = relay.where(relay.greater(t, _f(0.0)), corrected, r)  # bias correction from the first step on
    x_new = relay.subtract(x, relay.multiply(rate, relay.divide(v_new, scale)))
    return [relay.multiply(_f(1 - node.float_attr("norm_coefficient_post", 0.0)), x_new), v_new, h_new]


onnx_converter("Adagrad", domain=TRAINING, since=1)(_optimizer(3, _adagrad))
onnx_converter("Momentum", domain=TRAINING, since=1)(_optimizer(3, _momentum))
onnx_converter("Adam", domain=TRAINING, since=1)(_optimizer(4, _adam))


@onnx_converter("Binarizer", domain=ML, since=1)
def _binarizer(node: OnnxNode) -> Expr:
    x = node.input(0)
    dtype = str(node.dtype(0))
    threshold = relay.const(np.array(node.float_attr("threshold", 0.0), dtype))
    return relay.cast(relay.greater(x, threshold), dtype)


@onnx_converter("ArrayFeatureExtractor", domain=ML, since=1)
def _array_feature_extractor(node: OnnxNode) -> Expr:
    data = node.input(0)
    indices = relay.reshape(node.input(1), [-1])  # read at run time: only their count decides the shape
    shape = node.static_shape(data)
    count = int(np.prod(node.static_shape(1)))
    picked = relay.take(data, indices, axis=len(shape) - 1)
    return relay.reshape(picked, [1, count] if len(shape) == 1 else [*shape[:-1], count])
