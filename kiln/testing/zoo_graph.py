"""The graph builder behind the model zoo: layers written node by node as torch.onnx.export (opset 17) writes them.

`ZooBuilder` extends the builder of `kiln.testing.onnx_models` with the layers
the zoo's architectures share: Conv (He-initialized), BatchNormalization,
activations (ReLU, ReLU6 as Clip(0, 6), SiLU as x * Sigmoid(x), GELU written
with Erf or with Tanh), linear layers (MatMul + Add on 3-D activations, Gemm on
2-D ones), LayerNormalization, and LayerNorm over the channels of an NCHW map
(Transpose, LayerNormalization, Transpose back).

Random weights give random statistics, so a network of BatchNormalization
layers with made-up running means and variances blows up or dies out within a
few layers. `calibrated` builds such a model twice from the same seed: first
with every BatchNormalization written out in training form (normalized by the
batch statistics of its input, which the model also returns), then, after
onnxruntime has run that version on a batch of random images, in eval form
with those statistics as running mean and variance. The activations of the
final model on such images are then those of a freshly normalized network:
O(1) at every depth. With `fold_bn` the second build folds each BatchNormalization into the
Conv before it, which is what torch.onnx.export writes for a model in eval
mode (Conv with bias, no BatchNormalization node).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from kiln.testing.onnx_models import IR_VERSION, OPSET, _Builder

Stats = dict[str, tuple[np.ndarray, np.ndarray]]  # batch norm name -> (mean, variance) of its input
_CALIBRATION_SEED = 1234  # the images the batch norms are calibrated on (the bench feeds others)
_CALIBRATION_BATCH = 8  # images: a small model's last maps are 1x1, one image would give zero variances


class ZooBuilder(_Builder):
    """Builds one model's graph; writes BatchNormalization for calibration or eval (see the module doc).

    Args:
        seed: seeds the weights; two builders with one seed draw the same weights.
        stats: the running statistics of each batch norm (by name: bn1, bn2, ...).
        fold_bn: fold each batch norm into the Conv before it.
        calibrating: build the calibration graph instead (batch norms in training form, `stats` unused).
    """

    def __init__(self, seed: int, stats: Stats | None = None, fold_bn: bool = False,
                 calibrating: bool = False) -> None:
        super().__init__(seed)
        self.calibrating = calibrating
        self.stats: Stats = dict(stats or {})
        self.fold_bn = fold_bn and not calibrating
        self.inputs: list[Any] = []
        self.metadata: dict[str, str] = {}
        self._names: Counter[str] = Counter()
        self._stat_outputs: list[tuple[str, int]] = []
        self.float = self.onnx.TensorProto.FLOAT

    # -- names, inputs, parameters ----------------------------------------------------------------

    def fresh(self, prefix: str) -> str:
        """A new parameter name: `prefix` with a running number."""
        self._names[prefix] += 1
        return f"{prefix}{self._names[prefix]}"

    def input(self, name: str, shape: list[int | str], elem_type: int | None = None) -> str:
        """Declares a graph input; returns its name. When calibrating, a batch of images replaces batch 1."""
        dtype = self.float if elem_type is None else elem_type
        if self.calibrating and shape[:1] == [1]:
            shape = [_CALIBRATION_BATCH, *shape[1:]]
        self.inputs.append(self.onnx.helper.make_tensor_value_info(name, dtype, shape))
        return name

    def normal(self, prefix: str, shape: tuple[int, ...], std: float) -> str:
        """An initializer of normal values with standard deviation `std`."""
        return self.const(self.fresh(prefix), (self.rng.standard_normal(shape) * std).astype(np.float32))

    def uniform(self, prefix: str, shape: tuple[int, ...], low: float, high: float) -> str:
        """An initializer of uniform values in [low, high)."""
        return self.const(self.fresh(prefix), self.rng.uniform(low, high, shape).astype(np.float32))

    def scalar(self, value: float) -> str:
        """A float32 scalar constant (torch writes Python numbers as such initializers)."""
        return self.const(self.fresh("const"), np.array(value, np.float32))

    def ints(self, values: list[int]) -> str:
        """An int64 vector constant (shapes, axes, splits)."""
        return self.const(self.fresh("shape"), np.array(values, np.int64))

    def multi(self, op_type: str, inputs: list[str], outputs: int, **attrs: Any) -> list[str]:
        """A node with several outputs; returns their names."""
        self.count += 1
        name = f"/{op_type}_{self.count}"
        names = [f"{name}_output_{i}" for i in range(outputs)]
        self.nodes.append(self.onnx.helper.make_node(op_type, inputs, names, name=name, **attrs))
        return names

    # -- convolutions and batch norm --------------------------------------------------------------

    def conv(self, x: str, cin: int, cout: int, k: int, stride: int = 1, group: int = 1, bias: bool = True,
             pad: int | None = None, std: float | None = None) -> str:
        """Conv with a k x k kernel (He-initialized unless `std`), padded by k // 2 unless `pad`."""
        fan_in = cin // group * k * k
        w = self.normal("conv.weight", (cout, cin // group, k, k), std or float(np.sqrt(2.0 / fan_in)))
        ins = [x, w, self.normal("conv.bias", (cout,), 0.05)] if bias else [x, w]
        p = k // 2 if pad is None else pad
        return self.node("Conv", ins, dilations=[1, 1], group=group, kernel_shape=[k, k], pads=[p, p, p, p],
                         strides=[stride, stride])

    def conv_bn(self, x: str, cin: int, cout: int, k: int, stride: int = 1, group: int = 1,
                act: str | None = None, eps: float = 1e-5) -> str:
        """Conv (no bias) → BatchNormalization → activation, as torchvision's Conv2dNormActivation.

        With `fold_bn`, one Conv with bias instead of the first two (what export writes in eval mode).
        """
        fan_in = cin // group * k * k
        w = (self.rng.standard_normal((cout, cin // group, k, k)) * np.sqrt(2.0 / fan_in)).astype(np.float32)
        gamma = self.rng.uniform(0.5, 1.5, cout).astype(np.float32)
        beta = (self.rng.standard_normal(cout) * 0.1).astype(np.float32)
        attrs: dict[str, Any] = dict(dilations=[1, 1], group=group, kernel_shape=[k, k],
                                     pads=[k // 2] * 4, strides=[stride, stride])
        bn = self.fresh("bn")
        if self.fold_bn:
            mean, var = self.stats[bn]
            scale = gamma / np.sqrt(var + eps)
            folded = (w * scale[:, None, None, None]).astype(np.float32)
            bias = (beta - mean * scale).astype(np.float32)
            y = self.node("Conv", [x, self.const(f"{bn}.conv.weight", folded),
                                   self.const(f"{bn}.conv.bias", bias)], **attrs)
        else:
            y = self.node("Conv", [x, self.const(f"{bn}.conv.weight", w)], **attrs)
            y = self._batch_norm(y, bn, gamma, beta, eps)
        return self.activation(y, act)

    def _batch_norm(self, x: str, bn: str, gamma: np.ndarray, beta: np.ndarray, eps: float) -> str:
        c = gamma.shape[0]
        if not self.calibrating:
            running_mean, running_var = self.stats[bn]
            return self.node("BatchNormalization", [
                x, self.const(f"{bn}.weight", gamma), self.const(f"{bn}.bias", beta),
                self.const(f"{bn}.running_mean", running_mean.astype(np.float32)),
                self.const(f"{bn}.running_var", running_var.astype(np.float32)),
            ], epsilon=eps, momentum=0.9)
        # training form: normalized by the batch statistics, which are returned as outputs
        mean = self.node("ReduceMean", [x], axes=[0, 2, 3], keepdims=1)
        centered = self.node("Sub", [x, mean])
        var = self.node("ReduceMean", [self.node("Mul", [centered, centered])], axes=[0, 2, 3], keepdims=1)
        y = self.node("Div", [centered, self.node("Sqrt", [self.node("Add", [var, self.scalar(eps)])])])
        y = self.node("Mul", [y, self.const(f"{bn}.weight", gamma.reshape(c, 1, 1))])
        for stat, value in (("mean", mean), ("var", var)):
            flat = self.node("Reshape", [value, self.ints([-1])])
            self.nodes.append(self.onnx.helper.make_node("Identity", [flat], [f"{bn}.{stat}"]))
        self._stat_outputs.append((bn, c))
        return self.node("Add", [y, self.const(f"{bn}.bias", beta.reshape(c, 1, 1))])

    # -- activations --------------------------------------------------------------------------------

    def activation(self, x: str, act: str | None) -> str:
        """`x` through the activation named `act` (None: none); see `ACTIVATIONS`."""
        return x if act is None else ACTIVATIONS[act](self, x)

    def relu6(self, x: str) -> str:
        """ReLU6 as Clip(x, 0, 6), with min and max as inputs (opset 11 and later)."""
        return self.node("Clip", [x, self.scalar(0.0), self.scalar(6.0)])

    def silu(self, x: str) -> str:
        """SiLU as x * Sigmoid(x), as torch exports it before opset 20 has no Swish."""
        return self.node("Mul", [x, self.node("Sigmoid", [x])])

    def gelu(self, x: str) -> str:
        """GELU with Erf: x * 0.5 * (1 + erf(x / sqrt 2)) in torch's node order."""
        erf = self.node("Erf", [self.node("Div", [x, self.scalar(float(np.sqrt(2.0)))])])
        return self.node("Mul", [self.node("Mul", [x, self.node("Add", [erf, self.scalar(1.0)])]),
                                 self.scalar(0.5)])

    def gelu_tanh(self, x: str) -> str:
        """GPT-2's gelu_new: 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))."""
        cube = self.node("Mul", [self.scalar(0.044715), self.node("Pow", [x, self.scalar(3.0)])])
        inner = self.node("Mul", [self.scalar(float(np.sqrt(2.0 / np.pi))), self.node("Add", [x, cube])])
        half = self.node("Mul", [self.scalar(0.5), x])
        return self.node("Mul", [half, self.node("Add", [self.scalar(1.0), self.node("Tanh", [inner])])])

    # -- linear layers and layer norm ---------------------------------------------------------------

    def linear(self, x: str, n_in: int, n_out: int) -> str:
        """nn.Linear on a 3-D or 4-D activation: MatMul by the transposed weight, then Add of the bias."""
        y = self.node("MatMul", [x, self.normal("linear.weight", (n_in, n_out), float(1.0 / np.sqrt(n_in)))])
        return self.node("Add", [y, self.normal("linear.bias", (n_out,), 0.02)])

    def gemm(self, x: str, n_in: int, n_out: int) -> str:
        """nn.Linear on a 2-D activation: Gemm with transB=1 (the classifier heads)."""
        w = self.normal("fc.weight", (n_out, n_in), float(1.0 / np.sqrt(n_in)))
        return self.node("Gemm", [x, w, self.normal("fc.bias", (n_out,), 0.02)], alpha=1.0, beta=1.0, transB=1)

    def layer_norm(self, x: str, d: int, eps: float = 1e-5) -> str:
        """LayerNormalization over the last axis, with random scale near 1 and shift near 0."""
        return self.node("LayerNormalization", [x, self.uniform("ln.weight", (d,), 0.5, 1.5),
                                                self.normal("ln.bias", (d,), 0.1)], axis=-1, epsilon=eps)

    def layer_norm2d(self, x: str, c: int, eps: float = 1e-6) -> str:
        """torchvision's LayerNorm2d on NCHW: Transpose to NHWC, LayerNormalization, Transpose back."""
        y = self.layer_norm(self.node("Transpose", [x], perm=[0, 2, 3, 1]), c, eps)
        return self.node("Transpose", [y], perm=[0, 3, 1, 2])

    # -- the model ------------------------------------------------------------------------------------

    def model(self, name: str, inputs: list[Any], output: str, out_shape: list[Any]) -> Any:
        """The checked ModelProto with output "output" (plus, when calibrating, each batch norm's statistics).

        `inputs` are value infos declared beside those of `input()`.
        """
        helper = self.onnx.helper
        self.nodes.append(helper.make_node("Identity", [output], ["output"], name="/output"))
        if self.calibrating and out_shape[:1] == [1]:
            out_shape = [_CALIBRATION_BATCH, *out_shape[1:]]
        outs = [helper.make_tensor_value_info("output", self.float, out_shape)]
        for bn, c in self._stat_outputs:
            outs += [helper.make_tensor_value_info(f"{bn}.{s}", self.float, [c]) for s in ("mean", "var")]
        graph = helper.make_graph(self.nodes, name, [*self.inputs, *inputs], outs, self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                                  producer_name="kiln.testing.zoo")
        model.ir_version = IR_VERSION
        helper.set_model_props(model, self.metadata)
        self.onnx.checker.check_model(model)
        return model


ACTIVATIONS: dict[str, Callable[[ZooBuilder, str], str]] = {
    "relu": lambda b, x: b.node("Relu", [x]),
    "relu6": ZooBuilder.relu6,
    "silu": ZooBuilder.silu,
    "gelu": ZooBuilder.gelu,
    "gelu_tanh": ZooBuilder.gelu_tanh,
}


def random_feed(model: Any, seed: int = 0, sizes: Mapping[str, int] | None = None) -> dict[str, np.ndarray]:
    """Random inputs for a zoo model: name → array.

    A dynamic axis takes its size from `sizes` (by the axis's name). Float inputs are standard normal;
    `*_ids` inputs are token ids below the model's `kiln.zoo.vocab` metadata; `*mask` inputs are ones
    with the last quarter zero (padding).
    """
    from onnx import helper

    rng = np.random.default_rng(seed)
    meta = {p.key: p.value for p in model.metadata_props}
    inits = {i.name for i in model.graph.initializer}
    feed: dict[str, np.ndarray] = {}
    for value in model.graph.input:
        if value.name in inits:
            continue
        tensor = value.type.tensor_type
        shape = tuple(int(d.dim_value) if d.HasField("dim_value") else (sizes or {})[d.dim_param]
                      for d in tensor.shape.dim)
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.elem_type))
        if value.name.endswith("mask"):
            mask = np.ones(shape, dtype)
            mask[..., shape[-1] - shape[-1] // 4:] = 0
            feed[value.name] = mask
        elif dtype.kind in "iu":
            feed[value.name] = rng.integers(0, int(meta.get("kiln.zoo.vocab", "2")), shape).astype(dtype)
        else:
            feed[value.name] = rng.standard_normal(shape).astype(dtype)
    return feed


def calibrated(body: Callable[[ZooBuilder], Any], seed: int, fold_bn: bool = False) -> Any:
    """The model `body` builds, with each batch norm's running statistics measured (see the module doc).

    Args:
        body: writes the graph into the builder it is given and returns `builder.model(...)`.
        seed: the weights' seed.
        fold_bn: fold the batch norms into their Convs, as torch.onnx.export does in eval mode.

    Returns:
        The onnx.ModelProto. Models without batch norms are built once.
    """
    builder = ZooBuilder(seed, calibrating=True)
    first = body(builder)
    if not builder._stat_outputs:
        return first
    import onnxruntime as ort

    session = ort.InferenceSession(first.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    values: Mapping[str, np.ndarray] = dict(zip(names, session.run(None, random_feed(first, _CALIBRATION_SEED)),
                                                 strict=True))
    stats = {bn: (values[f"{bn}.mean"], values[f"{bn}.var"]) for bn, _ in builder._stat_outputs}
    return body(ZooBuilder(seed, stats, fold_bn))
