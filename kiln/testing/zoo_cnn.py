"""The zoo's convolutional networks, at torchvision's sizes by default, batch 1.

Each function returns an `onnx.ModelProto` (opset 17) with random weights,
written node by node as torch.onnx.export writes the torchvision model: Conv
without bias before a BatchNormalization (or, with `fold_bn=True`, the two
folded into one Conv with bias, as export does in eval mode), ReLU6 as Clip,
SiLU as x * Sigmoid(x), GlobalAveragePool → Flatten → Gemm for the classifier.
The batch norms are calibrated (`kiln.testing.zoo_graph.calibrated`), so the
logits are O(1). The keyword arguments shrink a model for tests.

- `resnet50`: bottleneck blocks [3, 4, 6, 3], widths 64..2048 (stride on the 3x3, torchvision's v1.5).
- `mobilenet_v2`: inverted residuals with depthwise 3x3 convs (group = channels), ReLU6.
- `efficientnet_b0`: MBConv blocks with depthwise 3x3/5x5 convs, squeeze-excite and SiLU.
- `squeezenet1_1`: fire modules (squeeze 1x1, expand 1x1 and 3x3, Concat), MaxPool with ceil_mode.
- `convnext_blocks`: ConvNeXt-tiny: 4x4 patchify stem, blocks of a 7x7 depthwise conv, LayerNorm over
  the channels (Transpose to NHWC), MatMul/Add linear layers with GELU (Erf), layer scale, residual Add.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kiln.testing.zoo_graph import ZooBuilder, calibrated


def _make_divisible(v: float, divisor: int = 8) -> int:
    """torchvision's channel rounding: to a multiple of `divisor`, never below 90% of `v`."""
    new_v = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new_v + divisor if new_v < 0.9 * v else new_v


def _classifier(b: ZooBuilder, x: str, channels: int, classes: int) -> str:
    """GlobalAveragePool → Flatten → (Dropout, an identity in eval) → Gemm."""
    x = b.node("Flatten", [b.node("GlobalAveragePool", [x])], axis=1)
    return b.gemm(x, channels, classes)


def resnet50(seed: int = 0, image: int = 224, width: int = 64, blocks: Sequence[int] = (3, 4, 6, 3),
             classes: int = 1000, fold_bn: bool = False) -> Any:
    """ResNet-50 on a (1, 3, image, image) input.

    Args:
        seed: the weights' seed.
        image: the input's height and width.
        width: the first stage's bottleneck width (64); stage i has width * 2**i, outputs 4x that.
        blocks: bottleneck blocks per stage.
        classes: the logits.
        fold_bn: fold each BatchNormalization into its Conv (as export writes in eval mode).
    """

    def body(b: ZooBuilder) -> Any:
        x = b.input("input", [1, 3, image, image])
        x = b.conv_bn(x, 3, width, 7, stride=2, act="relu")
        x = b.node("MaxPool", [x], ceil_mode=0, dilations=[1, 1], kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                   strides=[2, 2])
        cin = width
        for stage, count in enumerate(blocks):
            w = width * 2**stage
            for i in range(count):
                stride = 2 if i == 0 and stage > 0 else 1
                y = b.conv_bn(x, cin, w, 1, act="relu")
                y = b.conv_bn(y, w, w, 3, stride=stride, act="relu")
                y = b.conv_bn(y, w, 4 * w, 1)
                shortcut = b.conv_bn(x, cin, 4 * w, 1, stride=stride) if i == 0 else x
                x = b.node("Relu", [b.node("Add", [y, shortcut])])
                cin = 4 * w
        return b.model("resnet50", [], _classifier(b, x, cin, classes), [1, classes])

    return calibrated(body, seed, fold_bn)


_MOBILENET_V2 = [(1, 16, 1), (6, 24, 2), (6, 32, 2), (6, 64, 2), (6, 96, 1), (6, 160, 2), (6, 320, 1)]


def mobilenet_v2(seed: int = 0, image: int = 224, width_mult: float = 1.0,
                 blocks: Sequence[int] = (1, 2, 3, 4, 3, 3, 1), classes: int = 1000, fold_bn: bool = False) -> Any:
    """MobileNetV2 on a (1, 3, image, image) input.

    Args:
        seed: the weights' seed.
        image: the input's height and width.
        width_mult: scales every stage's channels (rounded to multiples of 8).
        blocks: inverted residual blocks per stage (7 stages).
        classes: the logits.
        fold_bn: fold each BatchNormalization into its Conv.
    """

    def body(b: ZooBuilder) -> Any:
        x = b.input("input", [1, 3, image, image])
        cin = _make_divisible(32 * width_mult)
        x = b.conv_bn(x, 3, cin, 3, stride=2, act="relu6")
        for (t, c, s), n in zip(_MOBILENET_V2, blocks, strict=True):
            cout = _make_divisible(c * width_mult)
            for i in range(n):
                stride = s if i == 0 else 1
                hidden = round(cin * t)
                y = b.conv_bn(x, cin, hidden, 1, act="relu6") if t != 1 else x
                y = b.conv_bn(y, hidden, hidden, 3, stride=stride, group=hidden, act="relu6")
                y = b.conv_bn(y, hidden, cout, 1)
                x = b.node("Add", [x, y]) if stride == 1 and cin == cout else y
                cin = cout
        last = _make_divisible(1280 * max(1.0, width_mult))
        x = b.conv_bn(x, cin, last, 1, act="relu6")
        return b.model("mobilenet_v2", [], _classifier(b, x, last, classes), [1, classes])

    return calibrated(body, seed, fold_bn)


# (expand ratio, kernel, stride, output channels) per stage; the layer counts are efficientnet_b0's `blocks`
_EFFICIENTNET_B0 = [(1, 3, 1, 16), (6, 3, 2, 24), (6, 5, 2, 40), (6, 3, 2, 80), (6, 5, 1, 112), (6, 5, 2, 192),
                    (6, 3, 1, 320)]


def efficientnet_b0(seed: int = 0, image: int = 224, width_mult: float = 1.0,
                    blocks: Sequence[int] = (1, 2, 2, 3, 3, 4, 1), classes: int = 1000, fold_bn: bool = False) -> Any:
    """EfficientNet-B0 on a (1, 3, image, image) input.

    Args:
        seed: the weights' seed.
        image: the input's height and width.
        width_mult: scales every stage's channels (rounded to multiples of 8).
        blocks: MBConv blocks per stage (7 stages).
        classes: the logits.
        fold_bn: fold each BatchNormalization into its Conv.
    """

    def body(b: ZooBuilder) -> Any:
        x = b.input("input", [1, 3, image, image])
        cin = _make_divisible(32 * width_mult)
        x = b.conv_bn(x, 3, cin, 3, stride=2, act="silu")
        for (t, k, s, c), n in zip(_EFFICIENTNET_B0, blocks, strict=True):
            cout = _make_divisible(c * width_mult)
            for i in range(n):
                stride = s if i == 0 else 1
                hidden = _make_divisible(cin * t)
                y = b.conv_bn(x, cin, hidden, 1, act="silu") if t != 1 else x
                y = b.conv_bn(y, hidden, hidden, k, stride=stride, group=hidden, act="silu")
                # squeeze-excite: GlobalAveragePool → 1x1 conv → SiLU → 1x1 conv → Sigmoid → Mul
                squeeze = max(1, cin // 4)
                scale = b.silu(b.conv(b.node("GlobalAveragePool", [y]), hidden, squeeze, 1))
                scale = b.node("Sigmoid", [b.conv(scale, squeeze, hidden, 1)])
                y = b.conv_bn(b.node("Mul", [scale, y]), hidden, cout, 1)
                x = b.node("Add", [y, x]) if stride == 1 and cin == cout else y
                cin = cout
        last = 4 * cin
        x = b.conv_bn(x, cin, last, 1, act="silu")
        return b.model("efficientnet_b0", [], _classifier(b, x, last, classes), [1, classes])

    return calibrated(body, seed, fold_bn)


# (squeeze, expand) channels of each fire module; None: a MaxPool(3, 2, ceil_mode) here
_SQUEEZENET1_1 = [None, (16, 64), (16, 64), None, (32, 128), (32, 128), None, (48, 192), (48, 192), (64, 256),
                  (64, 256)]


def squeezenet1_1(seed: int = 0, image: int = 224, width_mult: float = 1.0, classes: int = 1000) -> Any:
    """SqueezeNet 1.1 on a (1, 3, image, image) input (no batch norm: Conv with bias and ReLU).

    Args:
        seed: the weights' seed.
        image: the input's height and width.
        width_mult: scales every conv's channels.
        classes: the logits (the final 1x1 conv's channels).
    """
    b = ZooBuilder(seed)

    def pool(x: str) -> str:
        return b.node("MaxPool", [x], ceil_mode=1, dilations=[1, 1], kernel_shape=[3, 3], pads=[0, 0, 0, 0],
                      strides=[2, 2])

    x = b.input("input", [1, 3, image, image])
    cin = max(1, int(64 * width_mult))
    x = b.node("Relu", [b.conv(x, 3, cin, 3, stride=2, pad=0)])
    for fire in _SQUEEZENET1_1:
        if fire is None:
            x = pool(x)
            continue
        squeeze, expand = (max(1, int(c * width_mult)) for c in fire)
        s = b.node("Relu", [b.conv(x, cin, squeeze, 1)])
        e1 = b.node("Relu", [b.conv(s, squeeze, expand, 1)])
        e3 = b.node("Relu", [b.conv(s, squeeze, expand, 3)])
        x = b.node("Concat", [e1, e3], axis=1)
        cin = 2 * expand
    x = b.node("Relu", [b.conv(x, cin, classes, 1)])
    x = b.node("Flatten", [b.node("GlobalAveragePool", [x])], axis=1)
    return b.model("squeezenet1_1", [], x, [1, classes])


def convnext_blocks(seed: int = 0, image: int = 224, depths: Sequence[int] = (3, 3, 9, 3),
                    dims: Sequence[int] = (96, 192, 384, 768), classes: int = 1000) -> Any:
    """ConvNeXt (tiny by default) on a (1, 3, image, image) input; stage 1 runs at (image/4)² x dims[0].

    Args:
        seed: the weights' seed.
        image: the input's height and width.
        depths: ConvNeXt blocks per stage.
        dims: channels per stage (as many as `depths`).
        classes: the logits.
    """
    b = ZooBuilder(seed)
    x = b.input("input", [1, 3, image, image])
    x = b.layer_norm2d(b.conv(x, 3, dims[0], 4, stride=4, pad=0), dims[0])
    for stage, (depth, dim) in enumerate(zip(depths, dims, strict=True)):
        if stage > 0:
            x = b.conv(b.layer_norm2d(x, dims[stage - 1]), dims[stage - 1], dim, 2, stride=2, pad=0)
        for _ in range(depth):
            y = b.conv(x, dim, dim, 7, group=dim, std=1.0 / 7)
            y = b.layer_norm(b.node("Transpose", [y], perm=[0, 2, 3, 1]), dim, eps=1e-6)
            y = b.linear(b.gelu(b.linear(y, dim, 4 * dim)), 4 * dim, dim)
            y = b.node("Transpose", [y], perm=[0, 3, 1, 2])
            # layer scale: trained values vary by channel; torchvision's 1e-6 init would hide the block
            y = b.node("Mul", [b.uniform("layer_scale", (dim, 1, 1), 0.1, 1.0), y])
            x = b.node("Add", [y, x])
    x = b.layer_norm2d(b.node("GlobalAveragePool", [x]), dims[-1])
    x = b.gemm(b.node("Flatten", [x], axis=1), dims[-1], classes)
    return b.model("convnext_blocks", [], x, [1, classes])
