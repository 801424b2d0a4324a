"""Two ONNX models with random weights, built with `onnx.helper` as torch.onnx.export would write them.

- `cnn()`: Conv → BatchNormalization → Relu → MaxPool → Conv → Relu → MaxPool →
  Flatten → Gemm → Relu → Gemm, on a (1, 3, 32, 32) image.
- `transformer_encoder()`: one post-norm encoder block (BERT's): multi-head
  self-attention with its Q/K/V projections, the Shape → Gather → Concat →
  Reshape chains torch writes for the head split, Softmax, the output
  projection, residual Adds and LayerNormalization, then a feed-forward block
  with GELU written out with Erf, as torch exports it.

The tests check kiln against onnxruntime on both; `kiln bench` times them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

OPSET = 17
IR_VERSION = 8  # what onnxruntime accepts for opset 17


def _helpers() -> Any:
    try:
        import onnx
    except ImportError as err:  # pragma: no cover - onnx is a declared extra
        raise ImportError("building ONNX models needs the onnx package: pip install 'kiln[onnx]'") from err
    return onnx


class _Builder:
    def __init__(self, seed: int) -> None:
        self.onnx = _helpers()
        self.rng = np.random.default_rng(seed)
        self.nodes: list[Any] = []
        self.inits: list[Any] = []
        self.count = 0

    def weight(self, name: str, shape: tuple[int, ...], scale: float | None = None) -> str:
        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else shape[0]
        std = scale if scale is not None else 1.0 / np.sqrt(max(fan_in, 1))
        return self.const(name, (self.rng.standard_normal(shape) * std).astype(np.float32))

    def const(self, name: str, value: np.ndarray) -> str:
        self.inits.append(self.onnx.numpy_helper.from_array(np.asarray(value), name))
        return str(name)

    def node(self, op_type: str, inputs: list[str], **attrs: Any) -> str:
        self.count += 1
        name = f"/{op_type}_{self.count}"
        self.nodes.append(self.onnx.helper.make_node(op_type, inputs, [f"{name}_output_0"], name=name, **attrs))
        return f"{name}_output_0"

    def model(self, name: str, inputs: list[Any], output: str, out_shape: list[Any]) -> Any:
        helper = self.onnx.helper
        self.nodes.append(helper.make_node("Identity", [output], ["output"], name="/output"))
        graph = helper.make_graph(
            self.nodes, name, inputs,
            [helper.make_tensor_value_info("output", self.onnx.TensorProto.FLOAT, out_shape)], self.inits,
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                                  producer_name="kiln.testing.onnx_models")
        model.ir_version = IR_VERSION
        self.onnx.checker.check_model(model)
        return model


def cnn(seed: int = 0, batch: int = 1) -> Any:
    """A small image classifier (3x32x32 -> 10 logits)."""
    b = _Builder(seed)
    f = b.onnx.TensorProto.FLOAT
    x = b.node("Conv", ["input", b.weight("conv1.weight", (16, 3, 3, 3)), b.weight("conv1.bias", (16,), 0.1)],
               kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    x = b.node("BatchNormalization", [
        x, b.const("bn1.weight", b.rng.uniform(0.5, 1.5, 16).astype(np.float32)),
        b.weight("bn1.bias", (16,), 0.1), b.weight("bn1.running_mean", (16,), 0.1),
        b.const("bn1.running_var", b.rng.uniform(0.5, 1.5, 16).astype(np.float32)),
    ], epsilon=1e-5)
    x = b.node("Relu", [x])
    x = b.node("MaxPool", [x], kernel_shape=[2, 2], strides=[2, 2])
    x = b.node("Conv", [x, b.weight("conv2.weight", (32, 16, 3, 3)), b.weight("conv2.bias", (32,), 0.1)],
               kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    x = b.node("Relu", [x])
    x = b.node("MaxPool", [x], kernel_shape=[2, 2], strides=[2, 2])
    x = b.node("Flatten", [x], axis=1)
    x = b.node("Gemm", [x, b.weight("fc1.weight", (64, 32 * 8 * 8)), b.weight("fc1.bias", (64,), 0.1)], transB=1)
    x = b.node("Relu", [x])
    x = b.node("Gemm", [x, b.weight("fc2.weight", (10, 64)), b.weight("fc2.bias", (10,), 0.1)], transB=1)
    image = b.onnx.helper.make_tensor_value_info("input", f, [batch, 3, 32, 32])
    return b.model("cnn", [image], x, [batch, 10])


def transformer_encoder(seed: int = 0, seq: int = 16, d_model: int = 64, heads: int = 4, ffn: int = 256) -> Any:
    """One post-norm transformer encoder block on (1, seq, d_model)."""
    b = _Builder(seed)
    f = b.onnx.TensorProto.FLOAT
    head_dim = d_model // heads
    i64 = np.int64

    def linear(x: str, name: str, n_in: int, n_out: int) -> str:
        y = b.node("MatMul", [x, b.weight(f"{name}.weight", (n_in, n_out))])
        return b.node("Add", [y, b.weight(f"{name}.bias", (n_out,), 0.1)])

    def split_heads(x: str, name: str, perm: list[int]) -> str:
        # torch's export: the new shape is gathered from Shape(x) at run time.
        shape = b.node("Shape", [x])
        batch = b.node("Gather", [shape, b.const(f"{name}.i0", np.array(0, i64))], axis=0)
        length = b.node("Gather", [shape, b.const(f"{name}.i1", np.array(1, i64))], axis=0)
        dims = [b.node("Unsqueeze", [d, b.const(f"{name}.ax{j}", np.array([0], i64))]) for j, d in
                enumerate((batch, length))]
        new_shape = b.node("Concat", [*dims, b.const(f"{name}.hd", np.array([heads, head_dim], i64))], axis=0)
        return b.node("Transpose", [b.node("Reshape", [x, new_shape])], perm=perm)

    def layer_norm(x: str, name: str) -> str:
        gamma = b.const(f"{name}.weight", b.rng.uniform(0.5, 1.5, d_model).astype(np.float32))
        return b.node("LayerNormalization", [x, gamma, b.weight(f"{name}.bias", (d_model,), 0.1)],
                      axis=-1, epsilon=1e-5)

    x = "input"
    q = split_heads(linear(x, "q", d_model, d_model), "q", [0, 2, 1, 3])
    k = split_heads(linear(x, "k", d_model, d_model), "k", [0, 2, 3, 1])
    v = split_heads(linear(x, "v", d_model, d_model), "v", [0, 2, 1, 3])
    scores = b.node("Div", [b.node("MatMul", [q, k]), b.const("scale", np.array(np.sqrt(head_dim), np.float32))])
    attn = b.node("MatMul", [b.node("Softmax", [scores], axis=-1), v])
    merged = b.node("Reshape", [b.node("Transpose", [attn], perm=[0, 2, 1, 3]),
                                b.const("merge_shape", np.array([1, seq, d_model], i64))])
    x = layer_norm(b.node("Add", [x, linear(merged, "out", d_model, d_model)]), "norm1")
    h = linear(x, "ffn1", d_model, ffn)
    erf = b.node("Erf", [b.node("Div", [h, b.const("sqrt2", np.array(np.sqrt(2.0), np.float32))])])
    gelu = b.node("Mul", [b.node("Mul", [h, b.node("Add", [erf, b.const("one", np.array(1.0, np.float32))])]),
                          b.const("half", np.array(0.5, np.float32))])
    x = layer_norm(b.node("Add", [x, linear(gelu, "ffn2", ffn, d_model)]), "norm2")
    tokens = b.onnx.helper.make_tensor_value_info("input", f, [1, seq, d_model])
    return b.model("transformer_encoder", [tokens], x, [1, seq, d_model])
