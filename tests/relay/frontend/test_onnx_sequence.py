"""The ONNX converters of the attention and recurrent ops (kiln/relay/frontend/_onnx_sequence.py).

One-node models are built with onnx.helper, imported with every input fed at run
time, compiled for the host CPU and compared with ONNX's reference evaluator
(Attention, RotaryEmbedding), numpy.einsum (Einsum) or onnxruntime (RNN, GRU,
LSTM: the reference ignores sequence_lens, activations and clip). The cases
cover what the backend cases leave out: odd sizes, grouped-query attention with
padded masks and every qk_matmul_output_mode, run-time nonpad_kv_seqlen with
sliding windows, partial interleaved rotation, Einsum with three operands,
broadcast ellipses and diagonals, and recurrent ops with sequence_lens,
non-default activations, clip, peepholes and input_forget; then the errors.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from onnx import TensorProto, helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

from kiln import relay  # noqa: E402
from kiln.relay.expr import Call  # noqa: E402
from kiln.relay.frontend import OnnxImportError  # noqa: E402
from kiln.relay.visitor import post_order  # noqa: E402

Array = np.ndarray[Any, Any]
rng = np.random.default_rng(0)
_ELEM = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float16): TensorProto.FLOAT16,
         np.dtype(np.bool_): TensorProto.BOOL, np.dtype(np.int64): TensorProto.INT64,
         np.dtype(np.int32): TensorProto.INT32, np.dtype(np.float64): TensorProto.DOUBLE}


def rand(*shape: int, dtype: Any = np.float32) -> Array:
    return rng.standard_normal(shape).astype(dtype)


def one_node(op_type: str, inputs: dict[str, Array | None], outputs: Sequence[str], opset: int, **attrs: Any) -> Any:
    """A model of one `op_type` node named "n"; a None input is left out (named ""); outputs typed as input 0."""
    node = helper.make_node(op_type, [k if v is not None else "" for k, v in inputs.items()], list(outputs),
                            name="n", **attrs)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(k, _ELEM[v.dtype], v.shape) for k, v in inputs.items() if v is not None],
        [helper.make_tensor_value_info(o, _ELEM[next(iter(inputs.values())).dtype], None)  # type: ignore[union-attr]
         for o in outputs if o],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def run(m: Any, inputs: dict[str, Array | None]) -> list[Array]:
    mod, params = relay.frontend.from_onnx(m)
    got = relay.build(mod, target="llvm", params=params).create_executor()(
        **{k: v for k, v in inputs.items() if v is not None})
    return [np.asarray(g) for g in (got if isinstance(got, tuple) else (got,))]


def compare(got: Sequence[Array], want: Sequence[Array], tol: float = 1e-4) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, g.shape, w.dtype, w.shape)
        np.testing.assert_allclose(g, w, rtol=tol, atol=tol)


def check_reference(m: Any, inputs: dict[str, Array | None], tol: float = 1e-4) -> None:
    """kiln's outputs match ONNX's reference evaluator."""
    feeds = {k: v for k, v in inputs.items() if v is not None}
    compare(run(m, inputs), [np.asarray(w) for w in ReferenceEvaluator(m).run(None, feeds)], tol)


def ops_of(m: Any) -> list[str]:
    mod, _ = relay.frontend.from_onnx(m)
    return [n.op.name for n in post_order(mod["main"].body) if isinstance(n, Call)]


# --- Attention --------------------------------------------------------------------------------------

_OUTS = ["y", "present_key", "present_value", "qk"]


@pytest.mark.parametrize(("q", "k", "v", "extra", "attrs"), [
    # GQA (6 query heads over 2 K/V heads), a float mask shorter than the keys, past keys
    ((2, 6, 3, 5), (2, 2, 4, 5), (2, 2, 4, 7), {"attn_mask": rand(3, 6), "past_key": rand(2, 2, 3, 5),
                                                "past_value": rand(2, 2, 3, 7)}, {"qk_matmul_output_mode": 2}),
    # causal with a cache: query i sees the 3 past keys and the new ones up to i
    ((1, 2, 4, 3), (1, 2, 4, 3), (1, 2, 4, 3), {"past_key": rand(1, 2, 3, 3), "past_value": rand(1, 2, 3, 3)},
     {"is_causal": 1, "qk_matmul_output_mode": 3, "scale": 0.3}),
    # a boolean mask with a fully masked row (zeros, not NaN), softcap, and softmax in float32
    ((1, 2, 3, 4), (1, 2, 5, 4), (1, 2, 5, 2), {"attn_mask": np.array([[1, 0, 1, 1, 0], [0, 0, 0, 0, 0],
                                                                        [1, 1, 1, 1, 1]], dtype=np.bool_)},
     {"softcap": 2.0, "qk_matmul_output_mode": 1, "softmax_precision": 1}),
])
def test_attention_4d_matches_reference(q: tuple[int, ...], k: tuple[int, ...], v: tuple[int, ...],
                                        extra: dict[str, Array], attrs: dict[str, Any]) -> None:
    inputs: dict[str, Array | None] = {"Q": rand(*q), "K": rand(*k), "V": rand(*v),
                                       "attn_mask": extra.get("attn_mask"), "past_key": extra.get("past_key"),
                                       "past_value": extra.get("past_value")}
    check_reference(one_node("Attention", inputs, _OUTS, 23, **attrs), inputs)


def test_attention_3d_gqa_causal_matches_reference() -> None:
    inputs: dict[str, Array | None] = {"Q": rand(2, 5, 4 * 3), "K": rand(2, 7, 2 * 3), "V": rand(2, 7, 2 * 5)}
    m = one_node("Attention", inputs, ["y", "pk", "pv"], 23, q_num_heads=4, kv_num_heads=2, is_causal=1)
    check_reference(m, inputs)


def test_attention_nonpad_kv_seqlen_and_window_match_reference() -> None:
    # opset 25: per-batch valid lengths (a run-time input) move the causal frontier and the window
    inputs: dict[str, Array | None] = {
        "Q": rand(3, 2, 2, 4), "K": rand(3, 2, 6, 4), "V": rand(3, 2, 6, 4), "attn_mask": rand(2, 6),
        "past_key": None, "past_value": None, "nonpad_kv_seqlen": np.array([6, 3, 1], dtype=np.int64)}
    m = one_node("Attention", inputs, ["y"], 25, is_causal=1, left_window_size=2, right_window_size=0)
    check_reference(m, inputs)


def test_attention_float16_matches_reference() -> None:
    inputs: dict[str, Array | None] = {"Q": rand(1, 2, 3, 8, dtype=np.float16),
                                       "K": rand(1, 2, 5, 8, dtype=np.float16),
                                       "V": rand(1, 2, 5, 8, dtype=np.float16)}
    check_reference(one_node("Attention", inputs, ["y"], 23, is_causal=1), inputs, tol=2e-3)


def test_attention_gqa_is_two_products_without_repeating_keys() -> None:
    inputs: dict[str, Array | None] = {"Q": rand(1, 8, 3, 4), "K": rand(1, 2, 3, 4), "V": rand(1, 2, 3, 4)}
    ops = ops_of(one_node("Attention", inputs, ["y"], 23))
    assert ops.count("nn.matmul") == 2 and "nn.softmax" in ops
    assert not {"repeat", "tile", "broadcast_to"} & set(ops)


@pytest.mark.parametrize(("shapes", "attrs", "message"), [
    (((1, 3, 8), (1, 3, 8), (1, 3, 8)), {}, "need the attributes q_num_heads and kv_num_heads"),
    (((1, 3, 8), (1, 3, 8), (1, 3, 8)), {"q_num_heads": 3, "kv_num_heads": 2}, "which 3 heads do not divide"),
    (((1, 3, 2, 4), (1, 2, 2, 4), (1, 2, 2, 4)), {}, "do not fit"),
    (((1, 2, 2, 4), (1, 2, 2, 4), (1, 2, 2, 4)), {"qk_matmul_output_mode": 5}, "qk_matmul_output_mode is 5"),
])
def test_attention_errors_name_the_node(shapes: tuple[tuple[int, ...], ...], attrs: dict[str, Any],
                                        message: str) -> None:
    inputs: dict[str, Array | None] = {n: rand(*s) for n, s in zip("QKV", shapes, strict=True)}
    with pytest.raises(OnnxImportError, match=message) as err:
        relay.frontend.from_onnx(one_node("Attention", inputs, ["y"], 23, **attrs))
    assert "Attention node 'n'" in str(err.value)


# --- RotaryEmbedding --------------------------------------------------------------------------------


@pytest.mark.parametrize(("x", "positions", "attrs"), [
    ((2, 3, 5, 10), True, {"interleaved": 1, "rotary_embedding_dim": 6}),
    ((2, 5, 3 * 6), False, {"num_heads": 3}),
    ((1, 2, 4, 8), True, {"rotary_embedding_dim": 4}),
])
def test_rotary_embedding_matches_reference(x: tuple[int, ...], positions: bool, attrs: dict[str, Any]) -> None:
    b, s = x[0], (x[2] if len(x) == 4 else x[1])
    head = x[3] if len(x) == 4 else x[2] // attrs["num_heads"]
    half = attrs.get("rotary_embedding_dim", head) // 2
    cache = (9, half) if positions else (b, s, half)
    inputs: dict[str, Array | None] = {"x": rand(*x), "cos": rand(*cache), "sin": rand(*cache)}
    if positions:
        inputs["pos"] = rng.integers(0, 9, (b, s)).astype(np.int64)
    check_reference(one_node("RotaryEmbedding", inputs, ["y"], 23, **attrs), inputs)


def test_rotary_embedding_rejects_an_odd_rotary_dim() -> None:
    inputs: dict[str, Array | None] = {"x": rand(1, 1, 2, 6), "cos": rand(1, 2, 1), "sin": rand(1, 2, 1)}
    with pytest.raises(OnnxImportError, match="rotary_embedding_dim 3 must be even"):
        relay.frontend.from_onnx(one_node("RotaryEmbedding", inputs, ["y"], 23, rotary_embedding_dim=3))


# --- Einsum -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("equation", "shapes"), [
    ("ij,jk->ik", [(3, 5), (5, 2)]),
    ("bij, bjk", [(4, 2, 3), (4, 3, 5)]),
    ("abc,cd,bd->ad", [(2, 3, 4), (4, 5), (3, 5)]),
    ("...ij,...jk->...ik", [(2, 1, 3, 4), (5, 4, 2)]),
    ("...ii->...i", [(3, 4, 4)]),
    ("ii", [(5, 5)]),
    ("iji->j", [(3, 2, 3)]),
    ("i,j->ij", [(3,), (4,)]),
    ("ij->", [(3, 7)]),
    ("bhqd,bhkd->bhqk", [(1, 2, 3, 4), (1, 2, 5, 4)]),
])
def test_einsum_matches_numpy(equation: str, shapes: list[tuple[int, ...]]) -> None:
    inputs: dict[str, Array | None] = {f"x{i}": rand(*s) for i, s in enumerate(shapes)}
    got = run(one_node("Einsum", inputs, ["y"], 12, equation=equation), inputs)
    want = np.einsum(equation.replace(" ", ""), *[v for v in inputs.values() if v is not None])
    compare(got, [np.asarray(want, dtype=np.float32)], 1e-4)


@pytest.mark.parametrize(("equation", "shapes", "message"), [
    ("ij,jk->ik", [(3, 5)], "has 2 operand"),
    ("ij,jk->ik", [(3, 5), (4, 2)], "subscript 'j' has size 4"),
    ("i1->i", [(3, 5)], "subscripts are letters"),
    ("ij->k", [(3, 5)], r"output subscripts \['k'\] are in no operand"),
    ("ijk->i", [(3, 5)], "3 subscripts for a rank-2 tensor"),
])
def test_einsum_errors_name_the_node(equation: str, shapes: list[tuple[int, ...]], message: str) -> None:
    inputs: dict[str, Array | None] = {f"x{i}": rand(*s) for i, s in enumerate(shapes)}
    with pytest.raises(OnnxImportError, match=message) as err:
        relay.frontend.from_onnx(one_node("Einsum", inputs, ["y"], 12, equation=equation))
    assert "Einsum node 'n'" in str(err.value)


# --- RNN, GRU, LSTM ---------------------------------------------------------------------------------


def onnxruntime_outputs(m: Any, inputs: dict[str, Array | None]) -> list[Array]:
    ort = pytest.importorskip("onnxruntime")
    session = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return [np.asarray(w) for w in session.run(None, {k: v for k, v in inputs.items() if v is not None})]


def recurrent_inputs(gates: int, steps: int, batch: int, width: int, hidden: int, dirs: int, layout: int = 0,
                     lens: list[int] | None = None, state: bool = True, peepholes: bool = False,
                     ) -> dict[str, Array | None]:
    rows = gates * hidden
    x = rand(batch, steps, width) if layout else rand(steps, batch, width)
    state_shape = (batch, dirs, hidden) if layout else (dirs, batch, hidden)
    inputs: dict[str, Array | None] = {
        "X": x, "W": rand(dirs, rows, width) * 0.5, "R": rand(dirs, rows, hidden) * 0.5, "B": rand(dirs, 2 * rows),
        "sequence_lens": None if lens is None else np.array(lens, dtype=np.int32),
        "initial_h": rand(*state_shape) if state else None,
    }
    if gates == 4:
        inputs["initial_c"] = rand(*state_shape) if state else None
        inputs["P"] = rand(dirs, 3 * hidden) if peepholes else None
    return inputs


@pytest.mark.parametrize(("op_type", "gates", "kw", "attrs"), [
    ("RNN", 1, {"dirs": 2, "lens": [3, 1]}, {"direction": "bidirectional"}),
    ("RNN", 1, {"dirs": 1, "layout": 1}, {"activations": ["Relu"], "direction": "reverse", "layout": 1}),
    ("GRU", 3, {"dirs": 2, "lens": [2, 3]}, {"direction": "bidirectional", "linear_before_reset": 1}),
    ("GRU", 3, {"dirs": 1, "state": False}, {"clip": 0.8, "activations": ["HardSigmoid", "Softsign"],
                                              "activation_alpha": [0.3], "activation_beta": [0.4]}),
    ("LSTM", 4, {"dirs": 2, "lens": [1, 3], "peepholes": True}, {"direction": "bidirectional"}),
    ("LSTM", 4, {"dirs": 1, "layout": 1}, {"input_forget": 1, "clip": 1.5, "layout": 1}),
])
def test_recurrent_matches_onnxruntime(op_type: str, gates: int, kw: dict[str, Any], attrs: dict[str, Any]) -> None:
    hidden = 5
    inputs = recurrent_inputs(gates, 3, 2, 4, hidden, **kw)
    if gates == 4 and "clip" in attrs:  # a cell state past the clip: h() takes it unclipped, as onnxruntime does
        inputs["initial_c"] = np.full_like(inputs["initial_c"], 4 * attrs["clip"])
    outputs = ["Y", "Y_h", "Y_c"] if gates == 4 else ["Y", "Y_h"]
    got = run(one_node(op_type, inputs, outputs, 14, hidden_size=hidden, **attrs), inputs)
    if not attrs.get("layout"):
        want = onnxruntime_outputs(one_node(op_type, inputs, outputs, 14, hidden_size=hidden, **attrs), inputs)
    else:  # onnxruntime runs only layout 0: it gets the inputs swapped to time-major, its outputs swapped back
        swapped = {k: v if v is None or k not in ("X", "initial_h", "initial_c") else v.swapaxes(0, 1)
                   for k, v in inputs.items()}
        seq = {k: v for k, v in attrs.items() if k != "layout"}
        want = onnxruntime_outputs(one_node(op_type, swapped, outputs, 14, hidden_size=hidden, **seq), swapped)
        want = [want[0].transpose(2, 0, 1, 3), *(w.swapaxes(0, 1) for w in want[1:])]
    compare(got, want)


@pytest.mark.parametrize(("attrs", "message"), [
    ({"hidden_size": 4}, r"W has shape \(1, 15, 4\); expected \(1, 12, 4\)"),
    ({"hidden_size": 5, "direction": "sideways"}, "attribute 'direction' is 'sideways'"),
    ({"hidden_size": 5, "activations": ["Sigmoid"]}, "lists 1 functions; GRU with 1 direction"),
    ({"hidden_size": 5, "activations": ["Sigmoid", "Swish"]}, "activation 'Swish' is not one kiln supports"),
])
def test_recurrent_errors_name_the_node(attrs: dict[str, Any], message: str) -> None:
    inputs = recurrent_inputs(3, 2, 1, 4, 5, 1)
    with pytest.raises(OnnxImportError, match=message) as err:
        relay.frontend.from_onnx(one_node("GRU", inputs, ["Y"], 14, **attrs))
    assert "GRU node 'n'" in str(err.value)


# --- LinearAttention --------------------------------------------------------------------------------


@pytest.mark.parametrize(("rule", "hq", "hk", "beta_last", "past"), [
    ("linear", 2, 2, None, True),
    ("delta", 4, 2, 2, False),
    ("delta", 3, 1, 1, True),
])
def test_linear_attention_matches_reference(rule: str, hq: int, hk: int, beta_last: int | None, past: bool) -> None:
    b, t, dk, dv = 2, 3, 4, 5
    inputs: dict[str, Array | None] = {
        "q": rand(b, t, hq * dk), "k": rand(b, t, hk * dk) * 0.5, "v": rand(b, t, hk * dv),
        "past": rand(b, hk, dk, dv) if past else None, "decay": None,
        "beta": None if beta_last is None else rng.uniform(0, 1, (b, t, beta_last)).astype(np.float32)}
    m = one_node("LinearAttention", inputs, ["y", "state"], 27, q_num_heads=hq, kv_num_heads=hk, update_rule=rule)
    check_reference(m, inputs)


def test_linear_attention_gated_matches_reference() -> None:
    inputs: dict[str, Array | None] = {"q": rand(2, 4, 32), "k": rand(2, 4, 32), "v": rand(2, 4, 32), "past": None,
                                       "decay": -np.abs(rand(2, 4, 32))}
    m = one_node("LinearAttention", inputs, ["y", "state"], 27, q_num_heads=4, kv_num_heads=4, update_rule="gated")
    check_reference(m, inputs)


def test_linear_attention_rule_needs_its_inputs() -> None:
    inputs: dict[str, Array | None] = {"q": rand(1, 2, 8), "k": rand(1, 2, 8), "v": rand(1, 2, 8)}
    with pytest.raises(OnnxImportError, match="update_rule 'gated_delta' requires the input decay"):
        relay.frontend.from_onnx(one_node("LinearAttention", inputs, ["y", "s"], 27, q_num_heads=2, kv_num_heads=2))


# --- window functions, SwiGLU -----------------------------------------------------------------------


@pytest.mark.parametrize("op_type", ["HannWindow", "HammingWindow", "BlackmanWindow"])
@pytest.mark.parametrize(("size", "periodic", "out_type"), [(10, 1, 1), (7, 0, 11), (2, 0, 1)])
def test_windows_match_reference(op_type: str, size: int, periodic: int, out_type: int) -> None:
    inputs: dict[str, Array | None] = {"size": np.array(size, dtype=np.int64)}
    m = one_node(op_type, inputs, ["y"], 17, periodic=periodic, output_datatype=out_type)
    m.graph.output[0].type.tensor_type.elem_type = out_type
    got = relay.frontend.OnnxRunner(m)(size=inputs["size"])  # the size decides the shape: one compile per size
    compare([np.asarray(got)], ReferenceEvaluator(m).run(None, {"size": inputs["size"]}), 1e-6)


def test_swiglu_matches_reference() -> None:
    inputs: dict[str, Array | None] = {"a": rand(3, 5), "b": rand(3, 5)}
    check_reference(one_node("SwiGLU", inputs, ["y"], 28, alpha=0.7), inputs)


def test_swiglu_refuses_broadcasting() -> None:
    inputs: dict[str, Array | None] = {"a": rand(3, 5), "b": rand(1, 5)}
    with pytest.raises(OnnxImportError, match="must have the same shape"):
        relay.frontend.from_onnx(one_node("SwiGLU", inputs, ["y"], 28))


# --- FlexAttention (ai.onnx.preview) ----------------------------------------------------------------


def flex_model(inputs: dict[str, Array | None], **attrs: Any) -> Any:
    m = one_node("FlexAttention", inputs, ["y"], 26, **attrs)
    m.graph.node[0].domain = "ai.onnx.preview"
    m.opset_import.append(helper.make_opsetid("ai.onnx.preview", 1))
    return m


def test_flex_attention_gqa_with_score_and_prob_mods_matches_reference() -> None:
    # score_mod: a softcap, tanh(s / 2) * 2; prob_mod: probabilities squared
    two = helper.make_tensor("two", TensorProto.FLOAT, [], [2.0])
    score_mod = helper.make_graph(
        [helper.make_node("Div", ["s", "two"], ["d"]), helper.make_node("Tanh", ["d"], ["t"]),
         helper.make_node("Mul", ["t", "two"], ["out"])], "score_mod",
        [helper.make_tensor_value_info("s", TensorProto.FLOAT, [2, 6, 3, 5])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [2, 6, 3, 5])], [two])
    prob_mod = helper.make_graph(
        [helper.make_node("Mul", ["p", "p"], ["out"])], "prob_mod",
        [helper.make_tensor_value_info("p", TensorProto.FLOAT, [2, 6, 3, 5])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [2, 6, 3, 5])])
    inputs: dict[str, Array | None] = {"Q": rand(2, 6, 3, 4), "K": rand(2, 2, 5, 4), "V": rand(2, 2, 5, 7)}
    check_reference(flex_model(inputs, score_mod=score_mod, prob_mod=prob_mod, scale=0.4), inputs)


def test_flex_attention_float16_softmax_in_float32_matches_reference() -> None:
    inputs: dict[str, Array | None] = {"Q": rand(1, 2, 3, 8, dtype=np.float16),
                                       "K": rand(1, 2, 4, 8, dtype=np.float16),
                                       "V": rand(1, 2, 4, 8, dtype=np.float16)}
    check_reference(flex_model(inputs), inputs, tol=2e-3)


def test_flex_attention_rejects_a_score_mod_that_changes_the_shape() -> None:
    score_mod = helper.make_graph(
        [helper.make_node("ReduceSum", ["s"], ["out"], keepdims=1)], "score_mod",
        [helper.make_tensor_value_info("s", TensorProto.FLOAT, [1, 2, 3, 4])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)])
    inputs: dict[str, Array | None] = {"Q": rand(1, 2, 3, 8), "K": rand(1, 2, 4, 8), "V": rand(1, 2, 4, 8)}
    with pytest.raises(OnnxImportError, match="the subgraph 'score_mod' must give one float32 tensor"):
        relay.frontend.from_onnx(flex_model(inputs, score_mod=score_mod))
