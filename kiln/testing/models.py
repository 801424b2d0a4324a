"""The two models of the main job, built with the Python API, with numpy versions of them.

`mlp()`: batch 64, 784 -> 512 -> 512 -> 10 with relu. `cnn()`: batch 1,
3x224x224, conv3x3-batch_norm-relu-maxpool twice (16 then 32 channels), global
average pool, dense 10. Each returns the Relay function and its weights; the
`*_numpy` functions run the same model in numpy (dense through BLAS, the
convolutions as an im2col matmul).
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import pairwise
from typing import Any

import numpy as np

from kiln import relay

Params = dict[str, np.ndarray]


def _weights(rng: np.random.Generator, shapes: Mapping[str, tuple[int, ...]]) -> Params:
    out = {}
    for name, shape in shapes.items():
        fan_in = int(np.prod(shape[1:])) if len(shape) > 1 else 1
        scale = 1 / np.sqrt(fan_in) if len(shape) > 1 else 0.1
        out[name] = (rng.standard_normal(shape) * scale).astype("float32")
    return out


def mlp(batch: int | str = 64, sizes: tuple[int, ...] = (784, 512, 512, 10), seed: int = 0,
        ) -> tuple[relay.Function, Params]:
    """The MLP: dense + bias + relu between every pair of sizes (no relu after the last). `batch` may be a
    size variable's name ("n"): the function then takes any batch."""
    rng = np.random.default_rng(seed)
    x = relay.var("x", shape=(batch, sizes[0]))
    params_vars = []
    shapes: dict[str, tuple[int, ...]] = {}
    h: Any = x
    for n, (a, b) in enumerate(pairwise(sizes)):
        w, bias = relay.var(f"w{n}", shape=(b, a)), relay.var(f"b{n}", shape=(b,))
        params_vars += [w, bias]
        shapes[f"w{n}"], shapes[f"b{n}"] = (b, a), (b,)
        h = relay.nn.bias_add(relay.nn.dense(h, w), bias)
        if n < len(sizes) - 2:
            h = relay.nn.relu(h)
    return relay.Function([x, *params_vars], h), _weights(rng, shapes)


def mlp_numpy(x: np.ndarray, p: Params) -> np.ndarray:
    """The MLP in numpy."""
    n = len(p) // 2
    for i in range(n):
        x = x @ p[f"w{i}"].T + p[f"b{i}"]
        if i < n - 1:
            x = np.maximum(x, 0)
    return x


def cnn(batch: int | str = 1, size: int = 224, channels: tuple[int, int] = (16, 32), seed: int = 0) -> tuple[
    relay.Function, Params
]:
    """The CNN: (conv3x3 pad 1, batch_norm, relu, maxpool 2x2) twice, global average pool, dense 10. `batch` may
    be a size variable's name."""
    rng = np.random.default_rng(seed)
    x = relay.var("x", shape=(batch, 3, size, size))
    h: Any = x
    pvars = []
    shapes: dict[str, tuple[int, ...]] = {}
    cin = 3
    for n, cout in enumerate(channels):
        names = [f"conv{n}_w", f"bn{n}_gamma", f"bn{n}_beta", f"bn{n}_mean", f"bn{n}_var"]
        shp: list[tuple[int, ...]] = [(cout, cin, 3, 3), (cout,), (cout,), (cout,), (cout,)]
        vs = [relay.var(nm, shape=s) for nm, s in zip(names, shp, strict=True)]
        pvars += vs
        shapes.update(zip(names, shp, strict=True))
        h = relay.nn.conv2d(h, vs[0], padding=(1, 1), channels=cout, kernel_size=(3, 3))
        h = relay.TupleGetItem(relay.nn.batch_norm(h, vs[1], vs[2], vs[3], vs[4]), 0)
        h = relay.nn.max_pool2d(relay.nn.relu(h), pool_size=(2, 2), strides=(2, 2))
        cin = cout
    h = relay.reshape(relay.nn.global_avg_pool2d(h), (-1, cin))
    w, b = relay.var("fc_w", shape=(10, cin)), relay.var("fc_b", shape=(10,))
    shapes["fc_w"], shapes["fc_b"] = (10, cin), (10,)
    out = relay.nn.bias_add(relay.nn.dense(h, w), b)
    params = _weights(rng, shapes)
    for n in range(len(channels)):  # variances must be positive
        params[f"bn{n}_var"] = np.abs(params[f"bn{n}_var"]) + 0.5
    return relay.Function([x, *pvars, w, b], out), params


def conv3x3_numpy(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """3x3 convolution, padding 1, stride 1, NCHW/OIHW, as one im2col matmul per image."""
    n, c, hh, ww = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    cols = np.empty((n, c, 3, 3, hh, ww), x.dtype)
    for i in range(3):
        for j in range(3):
            cols[:, :, i, j] = xp[:, :, i:i + hh, j:j + ww]
    out = w.reshape(w.shape[0], -1) @ cols.reshape(n, c * 9, hh * ww)
    return out.reshape(n, w.shape[0], hh, ww)


def cnn_numpy(x: np.ndarray, p: Params, layers: int = 2) -> np.ndarray:
    """The CNN in numpy."""
    for n in range(layers):
        x = conv3x3_numpy(x, p[f"conv{n}_w"])
        scale = p[f"bn{n}_gamma"] / np.sqrt(p[f"bn{n}_var"] + 1e-5)
        shift = p[f"bn{n}_beta"] - p[f"bn{n}_mean"] * scale
        x = np.maximum(x * scale[:, None, None] + shift[:, None, None], 0)
        b, c, h, w = x.shape
        x = x.reshape(b, c, h // 2, 2, w // 2, 2).max(axis=(3, 5))
    x = x.mean(axis=(2, 3))
    out: np.ndarray = x @ p["fc_w"].T + p["fc_b"]
    return out


def encoder(batch: int | str = 1, seq: int | str = 128, hidden: int = 768, heads: int = 12, ffn: int = 3072,
            seed: int = 0) -> tuple[relay.Function, Params]:
    """One BERT encoder layer (post-norm): self-attention over `heads` heads, add & layer_norm, a gelu FFN,
    add & layer_norm, on x (batch, seq, hidden). `batch` and `seq` may be size variables' names."""
    rng = np.random.default_rng(seed)
    d = hidden // heads
    x = relay.var("x", shape=(batch, seq, hidden))
    shapes = {"wq": (hidden, hidden), "wk": (hidden, hidden), "wv": (hidden, hidden), "wo": (hidden, hidden),
              "w1": (ffn, hidden), "w2": (hidden, ffn)}
    bias = {"bq": hidden, "bk": hidden, "bv": hidden, "bo": hidden, "b1": ffn, "b2": hidden,
            "g1": hidden, "e1": hidden, "g2": hidden, "e2": hidden}
    v = {n: relay.var(n, shape=s) for n, s in shapes.items()} | {n: relay.var(n, shape=(k,)) for n, k in bias.items()}

    def dense(h: Any, w: str, b: str) -> Any:
        return relay.nn.bias_add(relay.nn.dense(h, v[w]), v[b], axis=-1)

    def split(h: Any) -> Any:  # (batch, seq, hidden) -> (batch, heads, seq, d)
        return relay.transpose(relay.reshape(h, (0, 0, heads, d)), (0, 2, 1, 3))

    q, k, val = split(dense(x, "wq", "bq")), split(dense(x, "wk", "bk")), split(dense(x, "wv", "bv"))
    scores = relay.multiply(relay.nn.matmul(q, k, transpose_b=True), relay.const(np.float32(1 / np.sqrt(d))))
    ctx = relay.nn.matmul(relay.nn.softmax(scores, axis=-1), val)
    ctx = relay.reshape(relay.transpose(ctx, (0, 2, 1, 3)), (0, 0, hidden))
    h = relay.nn.layer_norm(relay.add(x, dense(ctx, "wo", "bo")), v["g1"], v["e1"], axis=-1)
    f = dense(relay.nn.gelu(dense(h, "w1", "b1")), "w2", "b2")
    out = relay.nn.layer_norm(relay.add(h, f), v["g2"], v["e2"], axis=-1)
    params = _weights(rng, {**shapes, **{n: (k,) for n, k in bias.items()}})
    for n in ("g1", "g2"):
        params[n] = 1 + params[n]
    return relay.Function([x, *v.values()], out), params


def encoder_numpy(x: np.ndarray, p: Params, heads: int = 12) -> np.ndarray:
    """The encoder layer in numpy (float64 inside)."""
    from math import erf, sqrt

    b, s, hidden = x.shape
    d = hidden // heads

    def split(h: np.ndarray) -> np.ndarray:
        return np.asarray(h.reshape(b, s, heads, d).transpose(0, 2, 1, 3))

    def norm(h: np.ndarray, g: np.ndarray, e: np.ndarray) -> np.ndarray:
        mu, var = h.mean(-1, keepdims=True), h.var(-1, keepdims=True)
        return np.asarray((h - mu) / np.sqrt(var + 1e-5) * g + e)

    x = x.astype(np.float64)
    q, k, v = (split(x @ p[f"w{t}"].T + p[f"b{t}"]) for t in "qkv")
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(d)
    scores = np.exp(scores - scores.max(-1, keepdims=True))
    ctx = (scores / scores.sum(-1, keepdims=True)) @ v
    h = norm(x + ctx.transpose(0, 2, 1, 3).reshape(b, s, hidden) @ p["wo"].T + p["bo"], p["g1"], p["e1"])
    a = h @ p["w1"].T + p["b1"]
    a = 0.5 * a * (1 + np.vectorize(erf)(a / sqrt(2)))
    return norm(h + a @ p["w2"].T + p["b2"], p["g2"], p["e2"])
