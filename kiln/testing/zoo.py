"""The model zoo: real architectures at real sizes, as ONNX models with random weights, batch 1.

`ZOO` maps a name to (builder, description); `build(name)` calls the builder
at the model's real size, `build(name, small=True)` at the reduced size of
`SMALL` (low resolution, few channels and layers, hidden 64, seq 16) that the
tests compile in seconds. `inputs(model)` gives a random input feed. Every
model is written with onnx.helper node by node as torch.onnx.export (opset
17) writes it; see `kiln.testing.zoo_cnn` and `kiln.testing.zoo_transformer`
for each one's layout, and `kiln.testing.zoo_graph` for how the weights are
drawn so that the outputs are O(1) (batch norms calibrated on a random image
with onnxruntime, which the CNNs with batch norms therefore need to build).

`bench/zoo.py` compiles and times the zoo beside onnxruntime; the tests in
`tests/testing/test_zoo.py` check every small model against it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from kiln.testing.zoo_cnn import convnext_blocks, efficientnet_b0, mobilenet_v2, resnet50, squeezenet1_1
from kiln.testing.zoo_graph import random_feed
from kiln.testing.zoo_transformer import bert_base, gpt2_blocks, vit_b16

ZOO: dict[str, tuple[Callable[..., Any], str]] = {
    "resnet50": (resnet50, "ResNet-50, 224², bottlenecks [3,4,6,3], Conv+BatchNormalization, 1000 classes"),
    "mobilenet_v2": (mobilenet_v2, "MobileNetV2, 224², inverted residuals, depthwise convs, ReLU6 as Clip"),
    "efficientnet_b0": (efficientnet_b0, "EfficientNet-B0, 224², MBConv with squeeze-excite, SiLU"),
    "squeezenet1_1": (squeezenet1_1, "SqueezeNet 1.1, 224², fire modules with Concat, ceil-mode MaxPool"),
    "convnext_blocks": (convnext_blocks, "ConvNeXt-tiny, 224², 7x7 depthwise, LayerNorm over channels, GELU"),
    "vit_b16": (vit_b16, "ViT-B/16, 224², 4 pre-norm encoder layers, hidden 768, 12 heads, MLP 3072"),
    "bert_base": (bert_base, "BERT-base encoder, 2 post-norm layers, seq 128, token ids + attention mask"),
    "bert_exported": (functools.partial(bert_base, exported=True), "bert_base as torch.onnx.export's dynamo "
                      "exporter writes it: GatherND mask, GatherElements token types, Shape-driven Slices"),
    "gpt2_blocks": (gpt2_blocks, "GPT-2 small, 2 pre-norm blocks, seq 128, causal mask (Where), Tanh GELU"),
}

# Each model at a size that compiles in seconds: the same graph structure, small tensors.
SMALL: dict[str, dict[str, Any]] = {
    "resnet50": dict(image=32, width=8, blocks=(1, 2, 1, 1), classes=10),
    "mobilenet_v2": dict(image=32, width_mult=0.25, blocks=(1, 2, 1, 1, 1, 1, 1), classes=10),
    "efficientnet_b0": dict(image=32, width_mult=0.25, blocks=(1, 2, 1, 1, 1, 1, 1), classes=10),
    "squeezenet1_1": dict(image=64, width_mult=0.25, classes=10),
    "convnext_blocks": dict(image=32, depths=(2, 1), dims=(16, 32), classes=10),
    "vit_b16": dict(image=32, patch=8, hidden=64, heads=4, mlp=128, layers=2, classes=10),
    "bert_base": dict(seq=16, hidden=64, heads=4, ffn=128, layers=2, vocab=100),
    "bert_exported": dict(seq=16, hidden=64, heads=4, ffn=128, layers=2, vocab=100),
    "gpt2_blocks": dict(seq=16, hidden=64, heads=4, layers=2),
}


def build(name: str, small: bool = False, seed: int = 0, **sizes: Any) -> Any:
    """The zoo model `name` as an onnx.ModelProto.

    Args:
        name: a key of `ZOO`.
        small: use the reduced sizes of `SMALL`.
        seed: the weights' seed.
        **sizes: keyword sizes for the builder, over those of `small`.

    Raises:
        KeyError: for a name not in the zoo (the message lists them).
    """
    if name not in ZOO:
        raise KeyError(f"no model {name!r} in the zoo: {', '.join(ZOO)}")
    builder, _ = ZOO[name]
    return builder(seed=seed, **{**(SMALL[name] if small else {}), **sizes})


def inputs(model: Any, seed: int = 0, sizes: Mapping[str, int] | None = None) -> dict[str, np.ndarray]:
    """A random feed for a zoo model: input name → array, dynamic axes sized by `sizes` (see
    `kiln.testing.zoo_graph.random_feed`)."""
    return random_feed(model, seed, sizes)


__all__ = ["SMALL", "ZOO", "bert_base", "build", "convnext_blocks", "efficientnet_b0", "gpt2_blocks", "inputs",
           "mobilenet_v2", "resnet50", "squeezenet1_1", "vit_b16"]
