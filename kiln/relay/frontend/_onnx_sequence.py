"""ONNX converters of the attention and recurrent ops, composed from Relay's products and elementwise ops.

Attention (opsets 23-25) is scaled dot-product attention written with nn.matmul
and nn.softmax, so each product runs as kiln's tiled product and the scale,
softcap, bias and casts fuse around it. Grouped-query attention never repeats K
and V: Q is viewed as (B, Hkv, G, S, D), the G query heads that share a K/V
head, against K and V broadcast over G. The additive bias (mask, causal and
sliding-window frontiers, padding of nonpad_kv_seqlen) is a constant computed
here when nothing in it comes from a graph input, else it is composed at run
time; a query row whose bias is all -inf gives zeros, as ONNX's reference does,
rather than softmax's NaN. FlexAttention (ai.onnx.preview) is the same product
with its score_mod / prob_mod subgraphs imported inline.

RotaryEmbedding rotates the head dims (halves or interleaved pairs) with the
caches gathered by position_ids. Einsum parses the equation (ellipsis, implicit
output, repeated subscripts as diagonals), sums each subscript out as early as
it can, and contracts operands pairwise, each pair one batched nn.matmul.

RNN, GRU and LSTM are unrolled over their static sequence length: the input's
product for every step is one nn.dense, each step adds the state's nn.dense and
the activations (any of ONNX's list, with clip). Past a sequence_lens entry the
state holds and the output is 0 (a reverse direction runs from the last step
down, so it starts at its sequence's end). LinearAttention unrolls its
recurrence the same way, in float32 as its reference does. The window functions
are constants of their (constant) size; SwiGLU is a * sigmoid(alpha a) * b.
"""

from __future__ import annotations

import math

import numpy as np

from kiln import relay
from kiln.ir.dtype import DataType
from kiln.relay.expr import Expr
from kiln.relay.frontend.onnx import OnnxNode, onnx_converter, onnx_dtype


def _const(value: float | np.ndarray, dtype: DataType | str) -> Expr:
    return relay.const(value, dtype=str(dtype))


def _add(a: Expr | None, b: Expr) -> Expr:
    return b if a is None else relay.add(a, b)


# --- Attention ------------------------------------------------------------------------------------


def _heads(node: OnnxNode, x: Expr, heads: int, what: str) -> Expr:
    """A 3-D (B, S, H·D) input as 4-D (B, H, S, D)."""
    b, s, hidden = node.static_shape(x, what)
    if heads < 1 or hidden % heads:
        raise node.error(f"{what} has hidden size {hidden}, which {heads} heads do not divide")
    return relay.transpose(relay.reshape(x, (b, s, heads, hidden // heads), allowzero=True), (0, 2, 1, 3))


def _mask_bias(node: OnnxNode, dtype: DataType, kv: int) -> Expr | None:
    """attn_mask as an additive bias of `dtype`, its last dim padded to `kv` (masked where padded)."""
    mask = node.optional_input(3)
    if mask is None:
        return None
    shape = node.static_shape(mask, "attn_mask")
    if not shape or shape[-1] > kv:
        raise node.error(f"attn_mask has shape {shape}; its last dim must be at most the {kv} keys")
    is_bool = node.dtype(mask) == DataType.of("bool")
    if not is_bool and node.dtype(mask) != dtype:
        raise node.error(f"attn_mask is {node.dtype(mask)}; expected bool or {dtype}, the dtype of Q")
    if shape[-1] < kv:
        pad = np.full((*shape[:-1], kv - shape[-1]), False if is_bool else -np.inf, dtype=np.bool_ if is_bool
                      else dtype.numpy())
        mask = relay.concatenate([mask, relay.const(pad)], axis=len(shape) - 1)
    if is_bool:
        return relay.where(mask, _const(0.0, dtype), _const(-np.inf, dtype))
    return mask


def _frontier_bias(dtype: DataType, sq: int, kv: int, offset: int | Expr | None,
                   causal: bool, left: int, right: int) -> Expr | None:
    """The causal and sliding-window bias (0 where a query may attend a key, -inf elsewhere).

    Query i sits at position ``offset + i``; `offset` is an int (past keys, or 0) or, with
    nonpad_kv_seqlen, a (B, 1, 1, 1) int64 expression, which makes the bias (B, 1, sq, kv).
    """
    if not causal and left < 0 and right < 0:
        return None
    rel = np.arange(sq).reshape(sq, 1) - np.arange(kv).reshape(1, kv)  # query position - key position
    if isinstance(offset, Expr):
        diff: Expr = relay.add(relay.const(rel.astype(np.int64)), offset)
        allowed: Expr | None = None
        for on, bound in ((causal, relay.greater_equal(diff, relay.const(0, "int64"))),
                          (left >= 0, relay.less_equal(diff, relay.const(left, "int64"))),
                          (right >= 0, relay.greater_equal(diff, relay.const(-right, "int64")))):
            if on:
                allowed = bound if allowed is None else relay.logical_and(allowed, bound)
        assert allowed is not None
        return relay.where(allowed, _const(0.0, dtype), _const(-np.inf, dtype))
    d = rel + int(offset or 0)
    ok = np.ones((sq, kv), dtype=np.bool_)
    if causal:
        ok &= d >= 0
    if left >= 0:
        ok &= d <= left
    if right >= 0:
        ok &= -d <= right
    return relay.const(np.where(ok, 0.0, -np.inf).astype(dtype.numpy()))


@onnx_converter("Attention", since=23)
def _attention(node: OnnxNode) -> list[Expr]:
    q, k, v = node.input(0), node.input(1), node.input(2)
    rank = node.ndim(q)
    if rank not in (3, 4) or node.ndim(k) != rank or node.ndim(v) != rank:
        raise node.error(f"Q, K and V must all be 3-D or all 4-D, found ranks {node.ndim(q)}, {node.ndim(k)}, "
                         f"{node.ndim(v)}")
    dtype = node.dtype(q)
    if rank == 3:
        q_heads, kv_heads = node.int_attr("q_num_heads", 0), node.int_attr("kv_num_heads", 0)
        if q_heads < 1 or kv_heads < 1:
            raise node.error("3-D Q, K and V need the attributes q_num_heads and kv_num_heads (at least 1)")
        k, v = _heads(node, k, kv_heads, "K"), _heads(node, v, kv_heads, "V")
        b, sq, hidden = node.static_shape(q, "Q")
        if hidden % q_heads:
            raise node.error(f"Q has hidden size {hidden}, which {q_heads} heads do not divide")
        hq, dq = q_heads, hidden // q_heads
    elif node.opset >= 25 and ("q_num_heads" in node.attrs or "kv_num_heads" in node.attrs):
        raise node.error("q_num_heads and kv_num_heads must not be given with 4-D inputs")
    else:
        b, hq, sq, dq = node.static_shape(q, "Q")
    _, hk, _, dk = node.static_shape(k, "K")
    _, hv, _, _ = node.static_shape(v, "V")
    if dk != dq or hk != hv or hk < 1 or hq % hk:
        raise node.error(f"Q {(b, hq, sq, dq)}, K {node.shape(k)} and V {node.shape(v)} (as (B, heads, S, D)) do "
                         "not fit: K's head size must be Q's, K and V need the same heads, and they must divide Q's")
    # Grouped-query attention without repeating K and V: Q as (B, Hkv, G, S, D), the G query heads
    # that share a K/V head against that head broadcast over G. (No reshape after a transpose: the
    # 3-D input goes to this layout with one transpose.)
    group = hq // hk
    if rank == 3:
        q = relay.transpose(relay.reshape(q, (b, sq, hk, group, dq), allowzero=True), (0, 2, 3, 1, 4))
    else:
        q = relay.reshape(q, (b, hk, group, sq, dq), allowzero=True)
    past_k, past_v, nonpad = node.optional_input(4), node.optional_input(5), node.optional_input(6)
    past = 0
    if (past_k is None) != (past_v is None):
        raise node.error("past_key and past_value must be given together")
    if past_k is not None and past_v is not None:
        if nonpad is not None:
            raise node.error("nonpad_kv_seqlen cannot be combined with past_key / past_value")
        past = node.static_shape(past_k, "past_key")[2]
        k, v = relay.concatenate([past_k, k], axis=2), relay.concatenate([past_v, v], axis=2)
    kv = node.static_shape(k, "K with past_key")[2]
    present_k, present_v = k, v

    scale = node.float_attr("scale", 1.0 / math.sqrt(dq))
    # ONNX scales Q and K each by sqrt(scale), in Q's dtype (so float16 products do not overflow)
    root = _const(math.sqrt(scale), dtype)
    q, k = relay.multiply(q, root), relay.multiply(k, root)
    qk = relay.nn.matmul(q, relay.expand_dims(k, 2), transpose_b=True)
    softcap = node.float_attr("softcap", 0.0)
    if softcap > 0:
        cap = _const(softcap, dtype)
        qk = relay.multiply(relay.tanh(relay.divide(qk, cap)), cap)

    bias = _bias(node, dtype, b, sq, kv, past)
    if bias is not None:
        bias = _grouped(node, bias, hq, hk)
    scores = qk if bias is None else relay.add(qk, bias)
    mode = node.int_attr("qk_matmul_output_mode", 0)
    if mode not in (0, 1, 2, 3):
        raise node.error(f"attribute qk_matmul_output_mode is {mode}: expected 0, 1, 2 or 3")
    precision = node.attr("softmax_precision", None)
    soft_dtype = dtype if precision is None else onnx_dtype(int(precision), "softmax_precision")
    probs: Expr = relay.nn.softmax(relay.cast(scores, soft_dtype) if soft_dtype != dtype else scores, axis=-1)
    if bias is not None:
        # a row with every key masked: zeros, not softmax's NaN (decided on the bias, as ONNX does)
        masked = relay.equal(relay.max(bias, axis=-1, keepdims=True), _const(-np.inf, dtype))
        probs = relay.where(masked, _const(0.0, soft_dtype), probs)
    if soft_dtype != dtype:
        probs = relay.cast(probs, dtype)
    qk_out = relay.reshape({0: qk, 1: qk, 2: scores, 3: probs}[mode], (b, hq, sq, kv), allowzero=True)

    dv = node.static_shape(v)[3]
    y = relay.nn.matmul(probs, relay.expand_dims(v, 2))  # (B, Hkv, G, S, Dv)
    if rank == 3:
        y = relay.reshape(relay.transpose(y, (0, 3, 1, 2, 4)), (b, sq, hq * dv), allowzero=True)
    else:
        y = relay.reshape(y, (b, hq, sq, dv), allowzero=True)
    return [y, present_k, present_v, qk_out]


def _grouped(node: OnnxNode, bias: Expr, hq: int, hk: int) -> Expr:
    """A bias that broadcasts to (B, Hq, Sq, Skv) as one that broadcasts to the grouped (B, Hkv, G, Sq, Skv)."""
    shape = node.static_shape(bias, "the attention bias")
    if len(shape) > 4:
        raise node.error(f"attn_mask has rank {len(shape)}; it must broadcast to (B, heads, Sq, Skv)")
    batch, heads, sq, kv = (1,) * (4 - len(shape)) + shape
    if heads not in (1, hq):
        raise node.error(f"attn_mask gives {heads} heads where Q has {hq}")
    split = (1, 1) if heads == 1 else (hk, hq // hk)
    return relay.reshape(bias, (batch, *split, sq, kv), allowzero=True)


def _bias(node: OnnxNode, dtype: DataType, batch: int, sq: int, kv: int, past: int) -> Expr | None:
    """The additive bias of the scores: attn_mask, the causal and window frontiers, and nonpad_kv_seqlen."""
    causal = node.bool_attr("is_causal", False)
    left, right = node.int_attr("left_window_size", -1), node.int_attr("right_window_size", -1)
    if left < -1 or right < -1:
        raise node.error(f"left_window_size {left} and right_window_size {right} must be -1 or at least 0")
    nonpad = node.optional_input(6)
    offset: int | Expr = past
    pad_bias = None
    if nonpad is not None:
        if node.static_shape(nonpad, "nonpad_kv_seqlen") != (batch,):
            raise node.error(f"nonpad_kv_seqlen has shape {node.shape(nonpad)}; expected ({batch},), one per batch")
        lengths = relay.reshape(relay.cast(nonpad, "int64"), (batch, 1, 1, 1))
        offset = relay.subtract(lengths, relay.const(sq, "int64"))
        valid = relay.less(relay.const(np.arange(kv, dtype=np.int64)), lengths)
        pad_bias = relay.where(valid, _const(0.0, dtype), _const(-np.inf, dtype))
    bias = _mask_bias(node, dtype, kv)
    frontier = _frontier_bias(dtype, sq, kv, offset, causal, left, right)
    if frontier is not None:
        bias = _add(bias, frontier)
    if pad_bias is not None:
        bias = _add(bias, pad_bias)
    return bias


def _modified(node: OnnxNode, name: str, x: Expr, hq: int) -> Expr:
    """Grouped scores or probabilities (B, Hkv, G, Sq, Skv) through the subgraph `name`, which sees them
    as (B, Hq, Sq, Skv) and must keep that shape and dtype."""
    if name not in node.attrs:
        return x
    shape = node.static_shape(x)
    flat = (shape[0], hq, *shape[3:])
    outs = node.subgraph(name, [relay.reshape(x, flat, allowzero=True)])
    if len(outs) != 1 or node.static_shape(outs[0], name) != flat or node.dtype(outs[0]) != node.dtype(x):
        raise node.error(f"the subgraph {name!r} must give one {node.dtype(x)} tensor of shape {flat}")
    return relay.reshape(outs[0], shape, allowzero=True)


@onnx_converter("FlexAttention", domain="ai.onnx.preview", since=1)
def _flex_attention(node: OnnxNode) -> Expr:
    """Attention of 4-D inputs, with the score_mod and prob_mod subgraphs imported inline."""
    q, k, v = node.input(0), node.input(1), node.input(2)
    shapes = [node.static_shape(e, what) for e, what in ((q, "Q"), (k, "K"), (v, "V"))]
    if any(len(s) != 4 for s in shapes):
        raise node.error(f"Q, K and V must be 4-D (B, heads, S, D), found {shapes}")
    (b, hq, sq, dq), (_, hk, skv, dk), (_, hv, sv, dv) = shapes
    if dk != dq or hk != hv or sv != skv or hk < 1 or hq % hk:
        raise node.error(f"Q {shapes[0]}, K {shapes[1]} and V {shapes[2]} do not fit: K's head size must be Q's, "
                         "K and V need the same heads and length, and their heads must divide Q's")
    dtype = node.dtype(q)
    precision = node.attr("softmax_precision", None)
    soft = (onnx_dtype(int(precision), "softmax_precision") if precision is not None
            else dtype if dtype.bits >= 32 else DataType.of("float32"))
    scale = node.float_attr("scale", 1.0 / math.sqrt(dq))
    root = _const(math.sqrt(np.float32(scale)), dtype)
    group = hq // hk
    scores: Expr = relay.nn.matmul(relay.reshape(relay.multiply(q, root), (b, hk, group, sq, dq), allowzero=True),
                             relay.expand_dims(relay.multiply(k, root), 2), transpose_b=True)
    scores = _modified(node, "score_mod", scores if soft == dtype else relay.cast(scores, str(soft)), hq)
    probs = _modified(node, "prob_mod", relay.nn.softmax(scores, axis=-1), hq)
    values = relay.expand_dims(v if soft == node.dtype(v) else relay.cast(v, str(soft)), 2)
    y = relay.reshape(relay.nn.matmul(probs, values), (b, hq, sq, dv), allowzero=True)
    return y if soft == node.dtype(v) else relay.cast(y, str(node.dtype(v)))

# --- RotaryEmbedding ------------------------------------------------------------------------------


@onnx_converter("RotaryEmbedding", since=23)
def _rotary_embedding(node: OnnxNode) -> Expr:
    x, cos, sin = node.input(0), node.input(1, "cos_cache"), node.input(2, "sin_cache")
    shape = node.static_shape(x, "the input")
    if len(shape) == 4:  # (B, H, S, D): rotated as it is, the caches broadcast over the heads
        b, _, s, head = shape
        work, head_axis = x, 1
    elif len(shape) == 3:  # (B, S, H·D) → (B, S, H, D)
        heads = node.int_attr("num_heads", 0)
        b, s, hidden = shape
        if heads < 1 or hidden % heads:
            raise node.error(f"a 3-D input needs num_heads that divides its hidden size {hidden}, found {heads}")
        head = hidden // heads
        work, head_axis = relay.reshape(x, (b, s, heads, head), allowzero=True), 2
    else:
        raise node.error(f"the input must be 3-D (B, S, H·D) or 4-D (B, H, S, D), found shape {shape}")
    dim = node.int_attr("rotary_embedding_dim", 0) or head
    if dim % 2 or dim > head:
        raise node.error(f"rotary_embedding_dim {dim} must be even and at most the head size {head}")
    positions = node.optional_input(3)
    if positions is not None:
        cos, sin = relay.take(cos, positions, axis=0), relay.take(sin, positions, axis=0)
    for name, cache in (("cos_cache", cos), ("sin_cache", sin)):
        if node.static_shape(cache, name) != (b, s, dim // 2):
            raise node.error(f"{name} gives {node.shape(cache)} (after position_ids); expected ({b}, {s}, {dim // 2})")
    cos, sin = relay.expand_dims(cos, head_axis), relay.expand_dims(sin, head_axis)
    last = 3  # the head's axis: the work is 4-D either way
    rot = relay.strided_slice(work, [0], [dim], axes=[last]) if dim < head else work
    if node.bool_attr("interleaved", False):
        x1 = relay.strided_slice(rot, [0], [dim], [2], axes=[last])
        x2 = relay.strided_slice(rot, [1], [dim], [2], axes=[last])
    else:
        x1 = relay.strided_slice(rot, [0], [dim // 2], axes=[last])
        x2 = relay.strided_slice(rot, [dim // 2], [dim], axes=[last])
    real = relay.subtract(relay.multiply(cos, x1), relay.multiply(sin, x2))
    imag = relay.add(relay.multiply(sin, x1), relay.multiply(cos, x2))
    if node.bool_attr("interleaved", False):
        out_shape = [int(d) for d in node.static_shape(rot)]
        rotated: Expr = relay.reshape(relay.stack([real, imag], axis=last + 1), out_shape, allowzero=True)
    else:
        rotated = relay.concatenate([real, imag], axis=last)
    if dim < head:
        rotated = relay.concatenate([rotated, relay.strided_slice(work, [dim], [head], axes=[last])], axis=last)
    return rotated if len(shape) == 4 else relay.reshape(rotated, shape, allowzero=True)


# --- Einsum ---------------------------------------------------------------------------------------


def _einsum_terms(node: OnnxNode, ranks: list[int]) -> tuple[list[list[str]], list[str]]:
    """The equation as label lists per operand and for the output; '...' becomes labels '.0', '.1', ..."""
    equation = "".join(str(node.attr("equation")).split())
    lhs, arrow, rhs = equation.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise node.error(f"equation {equation!r} has {len(terms)} operand(s) but the node has {len(ranks)} input(s)")

    def labels(term: str, rank: int | None, where: str) -> list[str]:
        if term.count("...") > 1 or (term.replace("...", "").replace(".", "") != term.replace("...", "")):
            raise node.error(f"equation {equation!r}: {where} has a misplaced '.' (only one '...' is allowed)")
        head, dots, tail = term.partition("...")
        for c in head + tail:
            if not c.isalpha():
                raise node.error(f"equation {equation!r}: {where} has {c!r}; subscripts are letters")
        if rank is None:  # the output: its ellipsis spans the widest operand ellipsis
            rank = len(head) + len(tail) + (width if dots else 0)
        extra = rank - len(head) - len(tail)
        if (not dots and extra != 0) or extra < 0:
            raise node.error(f"equation {equation!r}: {where} has {len(head) + len(tail)} subscripts for a "
                             f"rank-{rank} tensor")
        return [*head, *(f".{width - extra + i}" for i in range(extra)), *tail]

    width = max((r - len(t.replace("...", "")) for t, r in zip(terms, ranks, strict=True) if "..." in t), default=0)
    ins = [labels(t, r, f"operand {i}") for i, (t, r) in enumerate(zip(terms, ranks, strict=True))]
    if arrow:
        out = labels(rhs, None, "the output")
        if len(set(out)) != len(out):
            raise node.error(f"equation {equation!r}: the output repeats a subscript")
        seen = {label for term in ins for label in term}
        missing = [label for label in out if label not in seen]
        if missing:
            raise node.error(f"equation {equation!r}: output subscripts {missing} are in no operand")
    else:  # implicit: the ellipsis, then the letters seen once, in alphabetical order
        counts: dict[str, int] = {}
        for term in ins:
            for label in term:
                counts[label] = counts.get(label, 0) + 1
        out = [f".{i}" for i in range(width)] + sorted(c for c, n in counts.items() if n == 1 and c[0] != ".")
    return ins, out


def _diagonal(x: Expr, labels: list[str], shape: list[int]) -> tuple[Expr, list[str], list[int]]:
    """`x` with each repeated label taken once, along the diagonal."""
    while len(set(labels)) != len(labels):
        label = next(lb for lb in labels if labels.count(lb) > 1)
        first = labels.index(label)
        second = labels.index(label, first + 1)
        rest = [i for i in range(len(labels)) if i not in (first, second)]
        n = shape[first]
        x = relay.transpose(x, [*rest, first, second])
        # the diagonal of an (n, n) block is every (n + 1)-th element of its row-major flattening
        x = relay.reshape(x, [shape[i] for i in rest] + [n * n], allowzero=True)
        x = relay.strided_slice(x, [0], [n * n], [n + 1], axes=[len(rest)])
        labels, shape = [labels[i] for i in rest] + [label], [shape[i] for i in rest] + [n]
    return x, labels, shape


def _sum_out(x: Expr, labels: list[str], shape: list[int], keep: set[str]) -> tuple[Expr, list[str], list[int]]:
    """`x` summed over its labels not in `keep`."""
    gone = [i for i, label in enumerate(labels) if label not in keep]
    if not gone:
        return x, labels, shape
    x = relay.sum(x, axis=gone)
    return x, [lb for i, lb in enumerate(labels) if i not in gone], [d for i, d in enumerate(shape) if i not in gone]


@onnx_converter("Einsum", since=12)
def _einsum(node: OnnxNode) -> Expr:
    exprs = [node.input(i) for i in range(len(node.inputs))]
    if not exprs:
        raise node.error("Einsum needs at least one input")
    shapes = [list(node.static_shape(e, f"input #{i}")) for i, e in enumerate(exprs)]
    ins, out = _einsum_terms(node, [len(s) for s in shapes])
    sizes: dict[str, int] = {}
    for i, (labels, shape) in enumerate(zip(ins, shapes, strict=True)):
        for label, d in zip(labels, shape, strict=True):
            if sizes.get(label, 1) not in (1, d) and d != 1:
                shown = "..." if label[0] == "." else label
                raise node.error(f"subscript {shown!r} has size {d} in input #{i} but {sizes[label]} elsewhere")
            sizes[label] = max(sizes.get(label, 1), d)
    operands = []
    for i, (x, labels, shape) in enumerate(zip(exprs, ins, shapes, strict=True)):
        x, labels, shape = _diagonal(x, labels, shape)
        later = set(out).union(*(ins[j] for j in range(len(ins)) if j != i))
        # a broadcast dim (1 against a larger size) is dropped: the other operand's dim is the result's
        later -= {lb for lb, d in zip(labels, shape, strict=True) if d == 1 and sizes[lb] != 1}
        operands.append(_sum_out(x, labels, shape, later))
    acc = operands[0]
    for i in range(1, len(operands)):
        later = set(out).union(*(ins[j] for j in range(i + 1, len(ins))))
        acc = _contract(acc, operands[i], later)
    x, labels, shape = _sum_out(*acc, set(out))
    if labels != out:
        x = relay.transpose(x, [labels.index(lb) for lb in out])
    return x


def _contract(a: tuple[Expr, list[str], list[int]], b: tuple[Expr, list[str], list[int]], keep: set[str],
              ) -> tuple[Expr, list[str], list[int]]:
    """The product of two operands summed over their shared labels not in `keep`, as one batched matmul."""
    (xa, la, sa), (xb, lb, sb) = a, b
    size = dict(zip(la, sa, strict=True)) | dict(zip(lb, sb, strict=True))
    batch = [x for x in la if x in lb and x in keep]
    inner = [x for x in la if x in lb and x not in keep]
    only_a = [x for x in la if x not in lb]
    only_b = [x for x in lb if x not in la]

    def grouped(x: Expr, labels: list[str], groups: list[list[str]]) -> Expr:
        order = [labels.index(lab) for g in groups for lab in g]
        if order != list(range(len(labels))):
            x = relay.transpose(x, order)
        return relay.reshape(x, [math.prod(size[lab] for lab in g) for g in groups], allowzero=True)

    product = relay.nn.matmul(grouped(xa, la, [batch, only_a, inner]), grouped(xb, lb, [batch, inner, only_b]))
    labels = batch + only_a + only_b
    shape = [size[lab] for lab in labels]
    return relay.reshape(product, shape, allowzero=True), labels, shape


# --- RNN, GRU, LSTM -------------------------------------------------------------------------------

# name → (default alpha, default beta) of the activations ONNX's recurrent ops accept
_ACTIVATIONS: dict[str, tuple[float, float]] = {
    "relu": (0.0, 0.0), "tanh": (0.0, 0.0), "sigmoid": (0.0, 0.0), "affine": (1.0, 0.0),
    "leakyrelu": (0.01, 0.0), "thresholdedrelu": (1.0, 0.0), "scaledtanh": (1.0, 1.0),
    "hardsigmoid": (0.2, 0.5), "elu": (1.0, 0.0), "softsign": (0.0, 0.0), "softplus": (0.0, 0.0),
}
_NO_PARAMS = ("relu", "tanh", "sigmoid", "softsign", "softplus")


class _Activation:
    """One activation of a recurrent op with its alpha and beta."""

    def __init__(self, name: str, alpha: float, beta: float, dtype: DataType) -> None:
        self.name, self.alpha, self.beta, self.dtype = name, alpha, beta, dtype

    def __call__(self, x: Expr) -> Expr:
        a, b, dt = _const(self.alpha, self.dtype), _const(self.beta, self.dtype), self.dtype
        one = _const(1.0, dt)
        match self.name:
            case "relu":
                return relay.nn.relu(x)
            case "tanh":
                return relay.tanh(x)
            case "sigmoid":
                return relay.sigmoid(x)
            case "affine":
                return relay.add(relay.multiply(x, a), b)
            case "leakyrelu":
                return relay.where(relay.less(x, _const(0.0, dt)), relay.multiply(x, a), x)
            case "thresholdedrelu":
                return relay.where(relay.greater(x, a), x, _const(0.0, dt))
            case "scaledtanh":
                return relay.multiply(a, relay.tanh(relay.multiply(x, b)))
            case "hardsigmoid":
                return relay.clip(relay.add(relay.multiply(x, a), b), 0.0, 1.0)
            case "elu":
                return relay.where(relay.less(x, _const(0.0, dt)), relay.multiply(a, relay.subtract(relay.exp(x), one)),
                                   x)
            case "softsign":
                return relay.divide(x, relay.add(relay.abs(x), one))
            case _:  # softplus
                return relay.log(relay.add(relay.exp(x), one))


def _activations(node: OnnxNode, defaults: list[str], directions: int, dtype: DataType) -> list[list[_Activation]]:
    """The activations per direction (f, g, h as the op uses them), from the node's attributes."""
    names = node.attr("activations", None)
    names = list(defaults) * directions if names is None else [str(n) for n in names]
    if len(names) != len(defaults) * directions:
        raise node.error(f"attribute 'activations' lists {len(names)} functions; {node.op_type} with "
                         f"{directions} direction(s) needs {len(defaults) * directions}")
    alphas = [float(a) for a in node.attr("activation_alpha", None) or []]
    betas = [float(b) for b in node.attr("activation_beta", None) or []]
    acts = []
    for name in names:
        key = name.lower()
        if key not in _ACTIVATIONS:
            raise node.error(f"activation {name!r} is not one kiln supports: {sorted(_ACTIVATIONS)}")
        alpha, beta = _ACTIVATIONS[key]
        if key not in _NO_PARAMS:  # alpha and beta are consumed in order by the activations that read them
            alpha = alphas.pop(0) if alphas else alpha
            if key in ("affine", "scaledtanh", "hardsigmoid"):
                beta = betas.pop(0) if betas else beta
        acts.append(_Activation(key, alpha, beta, dtype))
    n = len(defaults)
    return [acts[d * n:(d + 1) * n] for d in range(directions)]


def _pick(e: Expr, index: int, rows: tuple[int, ...]) -> Expr:
    """`e[index]` along axis 0, reshaped to `rows`."""
    return relay.reshape(relay.strided_slice(e, [index], [index + 1], axes=[0]), rows, allowzero=True)


def _part(e: Expr, i: int, size: int, axis: int = -1) -> Expr:
    """The i-th block of `size` along `axis` (a gate's slice)."""
    return relay.strided_slice(e, [i * size], [(i + 1) * size], axes=[axis])


def _recurrent(node: OnnxNode, gates: int, defaults: list[str]) -> list[Expr]:
    """RNN, GRU and LSTM unrolled over their static sequence length, one direction at a time."""
    x, w, r = node.input(0), node.input(1, "W"), node.input(2, "R")
    dtype = node.dtype(x)
    layout = node.int_attr("layout", 0) if node.opset >= 14 else 0
    if layout not in (0, 1):
        raise node.error(f"attribute 'layout' is {layout}: expected 0 or 1")
    if node.ndim(x) != 3:
        raise node.error(f"X must be 3-D, found shape {node.shape(x)}")
    if layout:
        x = relay.transpose(x, (1, 0, 2))
    steps, batch, width = node.static_shape(x, "X")
    direction = str(node.attr("direction", "forward"))
    if direction not in ("forward", "reverse", "bidirectional"):
        raise node.error(f"attribute 'direction' is {direction!r}: expected forward, reverse or bidirectional")
    dirs = 2 if direction == "bidirectional" else 1
    nd, rows, k = node.static_shape(w, "W")
    hidden = node.int_attr("hidden_size", rows // gates)
    if (nd, rows, k) != (dirs, gates * hidden, width):
        raise node.error(f"W has shape {(nd, rows, k)}; expected ({dirs}, {gates * hidden}, {width})")
    if node.static_shape(r, "R") != (dirs, gates * hidden, hidden):
        raise node.error(f"R has shape {node.shape(r)}; expected ({dirs}, {gates * hidden}, {hidden})")
    acts = _activations(node, defaults, dirs, dtype)
    clip = node.float_attr("clip", 0.0) if "clip" in node.attrs else None
    if clip is not None and clip <= 0:
        raise node.error(f"attribute 'clip' is {clip}: expected a positive threshold")
    bias = node.optional_input(3)
    if bias is not None and node.static_shape(bias, "B") != (dirs, 2 * gates * hidden):
        raise node.error(f"B has shape {node.shape(bias)}; expected ({dirs}, {2 * gates * hidden})")
    lens = node.optional_input(4)
    if lens is not None and node.static_shape(lens, "sequence_lens") != (batch,):
        raise node.error(f"sequence_lens has shape {node.shape(lens)}; expected ({batch},)")

    def initial(index: int, what: str) -> Expr | None:
        e = node.optional_input(index)
        if e is None:
            return None
        want = (batch, dirs, hidden) if layout else (dirs, batch, hidden)
        if node.static_shape(e, what) != want:
            raise node.error(f"{what} has shape {node.shape(e)}; expected {want}")
        return relay.transpose(e, (1, 0, 2)) if layout else e

    h0, c0 = initial(5, "initial_h"), initial(6, "initial_c") if gates == 4 else None
    peep = node.optional_input(7) if gates == 4 else None
    if peep is not None and node.static_shape(peep, "P") != (dirs, 3 * hidden):
        raise node.error(f"P has shape {node.shape(peep)}; expected ({dirs}, {3 * hidden})")
    flat_x = relay.reshape(x, (steps * batch, width), allowzero=True)
    zero = relay.zeros((batch, hidden), str(dtype))
    ys, hs, cs = [], [], []
    for d in range(dirs):
        wd, rd = _pick(w, d, (gates * hidden, width)), _pick(r, d, (gates * hidden, hidden))
        bd = None if bias is None else _pick(bias, d, (2 * gates * hidden,))
        # the input's part of every step in one product
        xw = relay.reshape(relay.nn.dense(flat_x, wd), (steps, batch, gates * hidden), allowzero=True)
        state = _Cell(node, gates, hidden, acts[d], clip, rd, bd,
                      None if peep is None else _pick(peep, d, (3 * hidden,)))
        h = zero if h0 is None else _pick(h0, d, (batch, hidden))
        c = zero if c0 is None else _pick(c0, d, (batch, hidden))
        outs: list[Expr] = [zero] * steps
        order = range(steps - 1, -1, -1) if direction == "reverse" or d == 1 else range(steps)
        for t in order:
            new_h, new_c = state.step(_pick(xw, t, (batch, gates * hidden)), h, c)
            if lens is None:
                h, c, outs[t] = new_h, new_c, new_h
            else:
                # past a sequence's length its state holds and its output is 0: running a reversed
                # direction from the last step down holds the initial state until its first real step
                live = relay.reshape(relay.less(relay.const(t, "int32"), relay.cast(lens, "int32")), (batch, 1))
                h, c = relay.where(live, new_h, h), relay.where(live, new_c, c)
                outs[t] = relay.where(live, new_h, zero)
        ys.append(relay.stack(outs, axis=0))
        hs.append(h)
        cs.append(c)
    y, y_h, y_c = relay.stack(ys, axis=1), relay.stack(hs, axis=0), relay.stack(cs, axis=0)
    if layout:
        y, y_h, y_c = relay.transpose(y, (2, 0, 1, 3)), relay.transpose(y_h, (1, 0, 2)), relay.transpose(y_c, (1, 0, 2))
    return [y, y_h, y_c] if gates == 4 else [y, y_h]


class _Cell:
    """One direction's step function of an RNN (1 gate), GRU (3) or LSTM (4)."""

    def __init__(self, node: OnnxNode, gates: int, hidden: int, acts: list[_Activation], clip: float | None,
                 r: Expr, bias: Expr | None, peep: Expr | None) -> None:
        self.gates, self.hidden, self.acts, self.clip, self.r, self.peep = gates, hidden, acts, clip, r, peep
        self.dtype = node.dtype(0)
        self.linear_before_reset = gates == 3 and node.bool_attr("linear_before_reset", False)
        self.input_forget = gates == 4 and node.bool_attr("input_forget", False)
        size = gates * hidden
        self.bias: Expr | None = None
        self.r_bh: Expr | None = None
        if bias is not None:
            wb, rb = _part(bias, 0, size), _part(bias, 1, size)
            if self.linear_before_reset:  # R's bias of the candidate is applied inside the reset gate
                self.r_bh = _part(rb, 2, hidden)
                rb = relay.concatenate([_part(rb, 0, 2 * hidden), relay.zeros((hidden,), str(self.dtype))], 0)
            self.bias = relay.add(wb, rb)

    def act(self, i: int, x: Expr, clip: bool = True) -> Expr:
        if clip and self.clip is not None:
            x = relay.clip(x, -self.clip, self.clip)
        return self.acts[i](x)

    def step(self, xw: Expr, h: Expr, c: Expr) -> tuple[Expr, Expr]:
        """(H, C) after one step from the input's part `xw` (B, gates·hidden) and the state (h, c)."""
        hid = self.hidden
        xw = xw if self.bias is None else relay.add(xw, self.bias)
        if self.gates == 1:
            return self.act(0, relay.add(xw, relay.nn.dense(h, self.r))), c
        if self.gates == 3:
            rz = relay.add(_part(xw, 0, 2 * hid), relay.nn.dense(h, _part(self.r, 0, 2 * hid, axis=0)))
            z, reset = self.act(0, _part(rz, 0, hid)), self.act(0, _part(rz, 1, hid))
            r_h = _part(self.r, 2, hid, axis=0)
            if self.linear_before_reset:
                hr = relay.nn.dense(h, r_h)
                hr = hr if self.r_bh is None else relay.add(hr, self.r_bh)
                cand = self.act(1, relay.add(_part(xw, 2, hid), relay.multiply(reset, hr)))
            else:
                cand = self.act(1, relay.add(_part(xw, 2, hid), relay.nn.dense(relay.multiply(reset, h), r_h)))
            # H = (1 - z) * cand + z * h
            return relay.add(cand, relay.multiply(z, relay.subtract(h, cand))), c
        g = relay.add(xw, relay.nn.dense(h, self.r))
        p_i, p_o, p_f = (None, None, None) if self.peep is None else (_part(self.peep, j, hid) for j in range(3))
        gi, go, gf, gc = (_part(g, j, hid) for j in range(4))
        i = self.act(0, gi if p_i is None else relay.add(gi, relay.multiply(p_i, c)))
        f: Expr
        if self.input_forget:
            f = relay.subtract(_const(1.0, self.dtype), i)
        else:
            f = self.act(0, gf if p_f is None else relay.add(gf, relay.multiply(p_f, c)))
        new_c = relay.add(relay.multiply(f, c), relay.multiply(i, self.act(1, gc)))
        o = self.act(0, go if p_o is None else relay.add(go, relay.multiply(p_o, new_c)))
        # the cell state is not clipped before h(), as onnxruntime computes it: clip bounds the gates' inputs
        return relay.multiply(o, self.act(2, new_c, clip=False)), new_c


@onnx_converter("RNN", since=7)
def _rnn(node: OnnxNode) -> list[Expr]:
    return _recurrent(node, 1, ["Tanh"])


@onnx_converter("GRU", since=7)
def _gru(node: OnnxNode) -> list[Expr]:
    return _recurrent(node, 3, ["Sigmoid", "Tanh"])


@onnx_converter("LSTM", since=7)
def _lstm(node: OnnxNode) -> list[Expr]:
    return _recurrent(node, 4, ["Sigmoid", "Tanh", "Tanh"])


# --- window functions, SwiGLU ---------------------------------------------------------------------


def _window(node: OnnxNode, terms: tuple[float, ...]) -> Expr:
    """A cosine-sum window ``sum_k terms[k] * cos(2πkn / N)`` (sign included), N = size or size - 1."""
    size = node.value(0, "size")
    if size.ndim != 0 or int(size) < 0:
        raise node.error(f"input #0 (size) must be a scalar >= 0, found {size.tolist()!r}")
    dtype = onnx_dtype(node.int_attr("output_datatype", 1), "output_datatype")
    if not dtype.is_float:
        raise node.error(f"attribute output_datatype gives {dtype}; a window is floating point")
    n = int(size)
    span = n if node.bool_attr("periodic", True) else n - 1
    with np.errstate(divide="ignore", invalid="ignore"):  # a symmetric window of 1 divides by 0, as ONNX's does
        ni = np.arange(n, dtype=np.float64)
        window = sum(c * np.cos(2 * np.pi * k * ni / span) for k, c in enumerate(terms))
    return relay.const(np.asarray(window, dtype=np.float64).astype(dtype.numpy()))


@onnx_converter("HannWindow", since=17)
def _hann_window(node: OnnxNode) -> Expr:
    return _window(node, (0.5, -0.5))  # sin²(πn/N)


@onnx_converter("HammingWindow", since=17)
def _hamming_window(node: OnnxNode) -> Expr:
    return _window(node, (25 / 46, -21 / 46))


@onnx_converter("BlackmanWindow", since=17)
def _blackman_window(node: OnnxNode) -> Expr:
    return _window(node, (0.42, -0.5, 0.08))


@onnx_converter("SwiGLU", since=28)
def _swiglu(node: OnnxNode) -> Expr:
    a, b = node.input(0), node.input(1)
    if node.shape(a) != node.shape(b):
        raise node.error(f"A {node.shape(a)} and B {node.shape(b)} must have the same shape (no broadcasting)")
    alpha = node.float_attr("alpha", 1.0)
    gate = relay.sigmoid(a if alpha == 1.0 else relay.multiply(a, _const(alpha, node.dtype(a))))
    return relay.multiply(relay.multiply(a, gate), b)


# --- LinearAttention ------------------------------------------------------------------------------


def _step_of(x: Expr, t: int, shape: tuple[int, ...]) -> Expr:
    """Token `t` of a packed (B, T, ·) input, reshaped to `shape` (its heads unpacked)."""
    return relay.reshape(relay.strided_slice(x, [t], [t + 1], axes=[1]), shape, allowzero=True)


@onnx_converter("LinearAttention", since=27)
def _linear_attention(node: OnnxNode) -> list[Expr]:
    """The recurrence unrolled over the static T, in float32 as ONNX's reference computes it."""
    rule = str(node.attr("update_rule", "gated_delta"))
    if rule not in ("linear", "gated", "delta", "gated_delta"):
        raise node.error(f"attribute update_rule is {rule!r}: expected linear, gated, delta or gated_delta")
    hq, hk = node.int_attr("q_num_heads"), node.int_attr("kv_num_heads")
    if hq < 1 or hk < 1 or hq % hk:
        raise node.error(f"q_num_heads ({hq}) must be a positive multiple of kv_num_heads ({hk})")
    gating, delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")
    q, k, v = node.input(0), node.input(1), node.input(2)
    past, decay, beta = node.optional_input(3), node.optional_input(4), node.optional_input(5)
    for on, e, what in ((gating, decay, "decay"), (delta, beta, "beta")):
        if on != (e is not None):
            raise node.error(f"update_rule {rule!r} {'requires' if on else 'forbids'} the input {what}")
    shapes = [node.static_shape(e, what) for e, what in ((q, "query"), (k, "key"), (v, "value"))]
    if any(len(s) != 3 for s in shapes):
        raise node.error(f"query, key and value must be 3-D (B, T, H·D), found {shapes}")
    (b, steps, q_hidden), (_, _, k_hidden), (_, _, v_hidden) = shapes
    if q_hidden % hq or k_hidden % hk or v_hidden % hk or q_hidden // hq != k_hidden // hk:
        raise node.error(f"query {shapes[0]}, key {shapes[1]} and value {shapes[2]} do not split into {hq} query "
                         f"and {hk} key/value heads of one key size")
    if shapes[1][:2] != (b, steps) or shapes[2][:2] != (b, steps):
        raise node.error(f"query, key and value must share (B, T), found {shapes}")
    dk, dv, group = q_hidden // hq, v_hidden // hk, hq // hk
    dtype, f32 = node.dtype(q), DataType.of("float32")

    def wide(e: Expr) -> Expr:
        return e if node.dtype(e) == f32 else relay.cast(e, "float32")

    q, k, v = wide(q), wide(k), wide(v)
    if decay is not None:
        last = node.static_shape(decay, "decay")[-1]
        if node.static_shape(decay)[:2] != (b, steps) or last not in (hk, hk * dk):
            raise node.error(f"decay has shape {node.shape(decay)}; expected ({b}, {steps}, {hk}) or "
                             f"({b}, {steps}, {hk * dk})")
        decay, decay_shape = relay.exp(wide(decay)), (b, hk, last // hk, 1)
    if beta is not None:
        last = node.static_shape(beta, "beta")[-1]
        if node.static_shape(beta)[:2] != (b, steps) or last not in (hk, 1):
            raise node.error(f"beta has shape {node.shape(beta)}; expected ({b}, {steps}, {hk}) or ({b}, {steps}, 1)")
        beta, beta_shape = wide(beta), (b, last, 1, 1)
    state: Expr
    if past is not None:
        if node.static_shape(past, "past_state") != (b, hk, dk, dv):
            raise node.error(f"past_state has shape {node.shape(past)}; expected ({b}, {hk}, {dk}, {dv})")
        state, state_dtype = wide(past), node.dtype(past)
    else:
        state, state_dtype = relay.zeros((b, hk, dk, dv), "float32"), dtype
    scale = node.float_attr("scale", 0.0) or 1.0 / math.sqrt(dk)
    outs = []
    for t in range(steps):
        k_t = _step_of(k, t, (b, hk, dk, 1))
        v_t = _step_of(v, t, (b, hk, 1, dv))
        if decay is not None:
            state = relay.multiply(state, _step_of(decay, t, decay_shape))
        if beta is not None:  # v_t ← β_t (v_t - Sᵀ k_t)
            retrieved = relay.nn.matmul(k_t, state, transpose_a=True)  # (B, Hkv, 1, dv)
            v_t = relay.multiply(_step_of(beta, t, beta_shape), relay.subtract(v_t, retrieved))
        state = relay.add(state, relay.multiply(k_t, v_t))
        read = relay.nn.matmul(_step_of(q, t, (b, hk, group, dk)), state)  # (B, Hkv, G, dv)
        outs.append(relay.multiply(read, _const(scale, "float32")))
    y = relay.reshape(relay.stack(outs, axis=1), (b, steps, hq * dv), allowzero=True)
    present = state if state_dtype == f32 else relay.cast(state, str(state_dtype))
    return [y if dtype == f32 else relay.cast(y, str(dtype)), present]
