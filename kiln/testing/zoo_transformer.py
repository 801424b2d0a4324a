"""The zoo's transformers, at their real widths by default, batch 1.

Each function returns an `onnx.ModelProto` (opset 17) with random weights,
written as torch.onnx.export writes the reference implementation: linear
layers as MatMul + Add (GPT-2's Conv1D as Reshape → Gemm → Reshape, its
addmm), LayerNormalization, GELU written with Erf (GPT-2's with Tanh), heads
split by Reshape + Transpose, scores scaled by a constant, Softmax over the
last axis. Weights are Xavier-like (1/sqrt(fan in)), so activations stay O(1).

- `vit_b16`: ViT-B/16: a 16x16 patchify Conv, class token Concat, position embedding Add, pre-norm
  encoder layers (hidden 768, 12 heads, MLP 3072; 4 layers by default), the class token's logits.
- `bert_base`: BERT-base's encoder from token ids (Gather of the word embeddings, the position and
  token-type embeddings folded into constants), post-norm layers, an optional attention mask input
  turned into an additive -10000 mask; the head split goes through the Shape → Gather → Concat chains
  export writes for `x.size()[:-1] + (heads, head_dim)`.
- `gpt2_blocks`: GPT-2 blocks on hidden states: pre-norm, fused QKV projection Split in three, a causal
  mask applied with Where (torch.finfo(float32).min where masked), gelu_new (Tanh), final LayerNorm.

A batch or sequence length given as a name (`batch="batch", seq="sequence"`) is a dynamic axis, written
as torch.onnx.export writes a model exported with `dynamic_axes`: the inputs and the output carry the
name, and every shape the graph needs is computed from `Shape` at run time (position ids and the causal
mask sliced from their 512 / 1024-row buffers, head splits and GPT-2's `view`s from `x.size()`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from kiln.testing.zoo_graph import ZooBuilder

_I64 = np.int64
Size = int | str  # a static dim, or the name of a dynamic axis


def _attention(b: ZooBuilder, q: str, k: str, v: str, split: Callable[[str, bool], str],
               merge: Callable[[str], str], scale: float | str, mask: Callable[[str], str] | None = None) -> str:
    """softmax(q kᵀ / sqrt(d) + mask) v for projected (1, seq, hidden) q, k, v; returns (1, seq, hidden).

    `split(t, key)` gives the (1, heads, seq, d) heads, or (1, heads, d, seq) for the key;
    `merge` undoes it on the context.
    """
    divisor = scale if isinstance(scale, str) else b.scalar(scale)
    scores = b.node("Div", [b.node("MatMul", [split(q, False), split(k, True)]), divisor])
    if mask is not None:
        scores = mask(scores)
    probs = b.node("Softmax", [scores], axis=-1)
    return merge(b.node("MatMul", [probs, split(v, False)]))


def _static_heads(b: ZooBuilder, batch: int, seq: int, hidden: int, heads: int) -> tuple[Callable[[str, bool], str],
                                                                              Callable[[str], str]]:
    """Head split and merge with constant shapes; the key's two Transposes fused into one, as export does."""

    def split(t: str, key: bool) -> str:
        t = b.node("Reshape", [t, b.ints([batch, seq, heads, hidden // heads])], allowzero=0)
        return b.node("Transpose", [t], perm=[0, 2, 3, 1] if key else [0, 2, 1, 3])

    def merge(t: str) -> str:
        t = b.node("Transpose", [t], perm=[0, 2, 1, 3])
        return b.node("Reshape", [t, b.ints([batch, seq, hidden])], allowzero=0)

    return split, merge


def _dynamic_heads(b: ZooBuilder, hidden: int, heads: int) -> tuple[Callable[[str, bool], str],
                                                                     Callable[[str], str]]:
    """Head split and merge with the shapes computed at run time, as export writes `x.size()` arithmetic."""

    def split(t: str, key: bool) -> str:
        shape = b.node("Shape", [t])
        dims = [b.node("Unsqueeze", [b.node("Gather", [shape, b.const(b.fresh("idx"), np.array(i, _I64))], axis=0),
                                     b.ints([0])]) for i in (0, 1)]
        new_shape = b.node("Concat", [*dims, b.ints([heads, hidden // heads])], axis=0)
        t = b.node("Reshape", [t, new_shape], allowzero=0)
        return b.node("Transpose", [t], perm=[0, 2, 3, 1] if key else [0, 2, 1, 3])

    def merge(t: str) -> str:
        t = b.node("Transpose", [t], perm=[0, 2, 1, 3])
        lead = b.node("Slice", [b.node("Shape", [t]), b.ints([0]), b.ints([-2]), b.ints([0])])
        return b.node("Reshape", [t, b.node("Concat", [lead, b.ints([hidden])], axis=0)], allowzero=0)

    return split, merge


def vit_b16(seed: int = 0, image: int = 224, patch: int = 16, hidden: int = 768, heads: int = 12,
            mlp: int = 3072, layers: int = 4, classes: int = 1000) -> Any:
    """ViT-B/16 (torchvision's vit_b_16 layout, `layers` encoder layers) on a (1, 3, image, image) input.

    Args:
        seed: the weights' seed.
        image: the input's height and width (a multiple of `patch`).
        patch: the patch size (the patchify Conv's kernel and stride).
        hidden: the model width.
        heads: attention heads (dividing `hidden`).
        mlp: the MLP's hidden width.
        layers: encoder layers.
        classes: the logits.
    """
    b = ZooBuilder(seed)
    tokens = (image // patch) ** 2
    seq = tokens + 1
    x = b.input("input", [1, 3, image, image])
    x = b.conv(x, 3, hidden, patch, stride=patch, pad=0)
    x = b.node("Transpose", [b.node("Reshape", [x, b.ints([1, hidden, tokens])], allowzero=0)], perm=[0, 2, 1])
    x = b.node("Concat", [b.normal("class_token", (1, 1, hidden), 1.0), x], axis=1)
    x = b.node("Add", [x, b.normal("pos_embedding", (1, seq, hidden), 0.5)])
    split, merge = _static_heads(b, 1, seq, hidden, heads)
    for _ in range(layers):
        y = b.layer_norm(x, hidden, eps=1e-6)
        ctx = _attention(b, b.linear(y, hidden, hidden), b.linear(y, hidden, hidden), b.linear(y, hidden, hidden),
                         split, merge, float(np.sqrt(hidden // heads)))
        x = b.node("Add", [x, b.linear(ctx, hidden, hidden)])
        y = b.layer_norm(x, hidden, eps=1e-6)
        x = b.node("Add", [x, b.linear(b.gelu(b.linear(y, hidden, mlp)), mlp, hidden)])
    x = b.layer_norm(x, hidden, eps=1e-6)
    x = b.node("Gather", [x, b.const("class_index", np.array(0, _I64))], axis=1)
    return b.model("vit_b16", [], b.gemm(x, hidden, classes), [1, classes])


def bert_base(seed: int = 0, seq: Size = 128, hidden: int = 768, heads: int = 12, ffn: int = 3072, layers: int = 2,
              vocab: int = 30522, attention_mask: bool = True, exported: bool = False, batch: Size = 1) -> Any:
    """BERT-base's encoder (HF BertModel without the pooler) from (batch, seq) int64 `input_ids`.

    Args:
        seed: the weights' seed.
        seq: the sequence length, or a dynamic axis's name (which implies `exported`).
        hidden: the model width.
        heads: attention heads (dividing `hidden`).
        ffn: the feed-forward width.
        layers: encoder layers.
        vocab: the word embedding's rows (the token ids are below it).
        attention_mask: take an int64 (batch, seq) `attention_mask` input (1: attend, 0: padding).
        exported: write the embeddings, the mask and the attention scale the way torch.onnx.export's
            dynamo exporter writes HF transformers' (see `_exported_embeddings`), instead of folded.
        batch: the batch size, or a dynamic axis's name (which implies `exported`).

    Returns:
        The model; its output is the last hidden state, (batch, seq, hidden).
    """
    b = ZooBuilder(seed)
    b.metadata["kiln.zoo.vocab"] = str(vocab)
    ids = b.input("input_ids", [batch, seq], b.onnx.TensorProto.INT64)
    mask = b.input("attention_mask", [batch, seq], b.onnx.TensorProto.INT64) if attention_mask else None
    exported = exported or isinstance(seq, str) or isinstance(batch, str)
    if exported:
        x, add_mask, scale = _exported_embeddings(b, ids, mask, hidden, heads)
    else:
        assert isinstance(seq, int)
        x = b.node("Gather", [b.normal("word_embeddings", (vocab, hidden), 1.0), ids], axis=0)
        x = b.node("Add", [x, b.normal("token_type_embeddings", (1, seq, hidden), 0.5)])
        x = b.node("Add", [x, b.normal("position_embeddings", (1, seq, hidden), 0.5)])
        add_mask, scale = None, b.scalar(float(np.sqrt(hidden // heads)))
        if mask is not None:
            m = b.node("Cast", [b.node("Unsqueeze", [mask, b.ints([1, 2])])], to=b.float)
            m = b.node("Mul", [b.node("Sub", [b.scalar(1.0), m]), b.scalar(-10000.0)])

            def add_mask(scores: str) -> str:
                return b.node("Add", [scores, m])

    x = b.layer_norm(x, hidden, eps=1e-12)
    split, merge = _dynamic_heads(b, hidden, heads)
    for _ in range(layers):
        ctx = _attention(b, b.linear(x, hidden, hidden), b.linear(x, hidden, hidden), b.linear(x, hidden, hidden),
                         split, merge, scale, add_mask)
        x = b.layer_norm(b.node("Add", [b.linear(ctx, hidden, hidden), x]), hidden, eps=1e-12)
        h = b.linear(b.gelu(b.linear(x, hidden, ffn)), ffn, hidden)
        x = b.layer_norm(b.node("Add", [h, x]), hidden, eps=1e-12)
    return b.model("bert_exported" if exported else "bert_base", [], x, [batch, seq, hidden])


def _exported_embeddings(b: ZooBuilder, ids: str, mask: str | None, hidden: int,
                         heads: int) -> tuple[str, Callable[[str], str] | None, str]:
    """BERT's embeddings, padding mask and attention scale as the dynamo exporter writes them.

    - position ids: the registered `position_ids` buffer sliced to the sequence length read
      from Shape; token type ids: the zero buffer gathered at them (`buffer.gather(1, pos)`,
      GatherElements); each looked up in its embedding table (Gather).
    - the padding mask: transformers' mask function indexes the mask at (batch, kv) index grids
      built from Range and Expand (`padding_mask[batch_idx, kv_idx]`: GatherND), then Where
      puts float32's minimum on padding.
    - the scale 1/sqrt(head dim) computed from the query's Shape (Sqrt, Reciprocal).
    Returns the summed embeddings, the mask function and the divisor of the scores.
    """
    max_positions = 512
    i64 = b.onnx.TensorProto.INT64
    vocab = int(b.metadata["kiln.zoo.vocab"])
    shape = b.node("Shape", [ids])
    batch = b.node("Gather", [shape, b.const(b.fresh("idx"), np.array(0, _I64))], axis=0)
    length = b.node("Gather", [shape, b.const(b.fresh("idx"), np.array(1, _I64))], axis=0)
    positions = b.const("position_ids", np.arange(max_positions, dtype=_I64)[None])
    pos = b.node("Slice", [positions, b.ints([0]), b.node("Unsqueeze", [length, b.ints([0])]), b.ints([1])])
    types = b.node("GatherElements", [b.const("token_type_ids", np.zeros((1, max_positions), _I64)), pos], axis=1)
    x = b.node("Gather", [b.normal("word_embeddings", (vocab, hidden), 1.0), ids], axis=0)
    x = b.node("Add", [x, b.node("Gather", [b.normal("token_type_embeddings", (2, hidden), 0.5), types], axis=0)])
    x = b.node("Add", [x, b.node("Gather", [b.normal("position_embeddings", (max_positions, hidden), 0.5), pos],
                                axis=0)])
    head_dim = b.node("Cast", [b.node("Div", [b.node("Constant", [], value=b.onnx.helper.make_tensor(
        b.fresh("hidden"), i64, [], [hidden])), b.const(b.fresh("heads"), np.array(heads, _I64))])], to=b.float)
    scale = b.node("Reciprocal", [b.node("Reciprocal", [b.node("Sqrt", [head_dim])])])  # sqrt(d), as 1 / (1 / ...)
    if mask is None:
        return x, None, scale
    one, zero = b.const(b.fresh("one"), np.array(1, _I64)), b.const(b.fresh("zero"), np.array(0, _I64))
    grid = b.node("Concat", [b.node("Unsqueeze", [batch, b.ints([0])]), b.ints([1, 1]),
                             b.node("Unsqueeze", [length, b.ints([0])])], axis=0)
    batch_idx = b.node("Expand", [b.node("Reshape", [b.node("Range", [zero, batch, one]), b.ints([-1, 1, 1, 1])]),
                                  grid])
    kv_idx = b.node("Expand", [b.node("Reshape", [b.node("Range", [zero, length, one]), b.ints([1, 1, 1, -1])]),
                               grid])
    index = b.node("Concat", [b.node("Unsqueeze", [batch_idx, b.ints([-1])]),
                              b.node("Unsqueeze", [kv_idx, b.ints([-1])])], axis=-1)
    keep = b.node("GatherND", [b.node("Cast", [mask], to=b.onnx.TensorProto.BOOL), index])
    bias = b.node("Where", [keep, b.scalar(0.0), b.scalar(float(np.finfo(np.float32).min))])

    def add_mask(scores: str) -> str:
        return b.node("Add", [scores, bias])

    return x, add_mask, scale


def gpt2_blocks(seed: int = 0, seq: Size = 128, hidden: int = 768, heads: int = 12, layers: int = 2,
                batch: Size = 1) -> Any:
    """GPT-2 (small) blocks and the final LayerNorm on (batch, seq, hidden) `hidden_states`.

    Args:
        seed: the weights' seed.
        seq: the sequence length, or a dynamic axis's name (up to GPT-2's 1024 positions at run time).
        hidden: the model width (the MLP's is 4x).
        heads: attention heads (dividing `hidden`).
        layers: transformer blocks.
        batch: the batch size, or a dynamic axis's name.
    """
    b = ZooBuilder(seed)
    x = b.input("hidden_states", [batch, seq, hidden])
    masked = b.const("mask_value", np.array(np.finfo(np.float32).min, np.float32))
    static = (batch, seq) if isinstance(batch, int) and isinstance(seq, int) else None  # or dynamic axes

    def conv1d(t: str, n_in: int, n_out: int) -> str:
        # addmm(bias, x.view(-1, n_in), weight).view(size_out), size_out = x.size()[:-1] + (n_out,)
        flat = b.node("Reshape", [t, b.ints([-1, n_in])], allowzero=0)
        w = b.normal("conv1d.weight", (n_in, n_out), float(1.0 / np.sqrt(n_in)))
        y = b.node("Gemm", [flat, w, b.normal("conv1d.bias", (n_out,), 0.02)], alpha=1.0, beta=1.0)
        if static:
            return b.node("Reshape", [y, b.ints([*static, n_out])], allowzero=0)
        lead = b.node("Slice", [b.node("Shape", [t]), b.ints([0]), b.ints([-1]), b.ints([0])])
        return b.node("Reshape", [y, b.node("Concat", [lead, b.ints([n_out])], axis=0)], allowzero=0)

    if static:
        causal = b.const("causal_mask", np.tril(np.ones((static[1], static[1]), np.bool_))[None, None])

        def causal_mask(scores: str) -> str:
            return b.node("Where", [causal, scores, masked])
    else:
        bias = b.const("bias", np.tril(np.ones((1024, 1024), np.bool_))[None, None])

        def causal_mask(scores: str) -> str:
            # self.bias[:, :, key_length - query_length : key_length, :key_length]
            shape = b.node("Shape", [scores])
            q, k = (b.node("Unsqueeze", [b.node("Gather", [shape, b.const(b.fresh("idx"), np.array(i, _I64))],
                                                       axis=0), b.ints([0])]) for i in (2, 3))
            rows = b.node("Slice", [bias, b.node("Sub", [k, q]), k, b.ints([2]), b.ints([1])])
            return b.node("Where", [b.node("Slice", [rows, b.ints([0]), k, b.ints([3]), b.ints([1])]), scores,
                                    masked])

    split, merge = _static_heads(b, *static, hidden, heads) if static else _dynamic_heads(b, hidden, heads)
    for _ in range(layers):
        q, k, v = b.multi("Split", [conv1d(b.layer_norm(x, hidden), hidden, 3 * hidden), b.ints([hidden] * 3)], 3,
                          axis=2)
        ctx = _attention(b, q, k, v, split, merge, float(np.sqrt(hidden // heads)), causal_mask)
        x = b.node("Add", [conv1d(ctx, hidden, hidden), x])
        h = conv1d(b.gelu_tanh(conv1d(b.layer_norm(x, hidden), hidden, 4 * hidden)), 4 * hidden, hidden)
        x = b.node("Add", [x, h])
    return b.model("gpt2_blocks", [], b.layer_norm(x, hidden), [batch, seq, hidden])
