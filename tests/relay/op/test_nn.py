"""The nn ops of kiln.relay.op.nn: registration, type relations, errors, and numpy references.

Each reference is checked to produce the shape and dtype that its relation
gives, and its values against an independent computation written here.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from op_helpers import check_build, make_attrs, rand, ref, rel, type_of

from kiln import relay
from kiln.ir.attrs import AttrsError
from kiln.ir.types import ANY, SizeVar, TensorType, TupleType, dim_add
from kiln.registry import Op, OpPattern, attr
from kiln.relay.op._rel import RelationError

N = SizeVar("n")












def check_ref_agrees(op: str, arrays: list[np.ndarray], **kw: Any) -> Any:
    """The reference's output has the type (shapes, dtypes, tuple structure) the relation gives."""
    out = ref(op, *arrays, **kw)
    assert rel(op, [type_of(a) for a in arrays], **kw) == type_of(out)
    return out


# --- registration ----------------------------------------------------------------------------------

PATTERNS = {
    "nn.relu": OpPattern.ELEMWISE,
    "nn.leaky_relu": OpPattern.ELEMWISE,
    "nn.gelu": OpPattern.ELEMWISE,
    "nn.prelu": OpPattern.BROADCAST,
    "nn.bias_add": OpPattern.BROADCAST,
    "nn.dense": OpPattern.OUT_ELEMWISE_FUSABLE,
    "nn.matmul": OpPattern.OUT_ELEMWISE_FUSABLE,
    "nn.batch_matmul": OpPattern.OUT_ELEMWISE_FUSABLE,
    "nn.softmax": OpPattern.OPAQUE,
    "nn.log_softmax": OpPattern.OPAQUE,
    "nn.batch_norm": OpPattern.OPAQUE,
    "nn.layer_norm": OpPattern.COMM_REDUCE,  # elementwise producers (a residual add) fuse into it
    "nn.dropout": OpPattern.OPAQUE,
    "nn.pad": OpPattern.INJECTIVE,
}


@pytest.mark.parametrize(("op", "pattern"), sorted(PATTERNS.items()))
def test_nn_op_is_registered_with_every_attribute(op: str, pattern: OpPattern) -> None:
    o = Op.get(op)
    assert o.description
    assert o.num_inputs == len(o.arguments) >= 1
    assert o.get_attr(attr.TOpPattern) == pattern
    assert o.get_attr(attr.FTypeRelation) is not None
    assert callable(o.get_attr(attr.FReference))
    assert 1 <= o.support_level <= 10
    assert (o.attrs_type is None) == (op == "nn.relu")


def test_relay_nn_namespace_holds_every_constructor() -> None:
    names = ["relu", "leaky_relu", "gelu", "prelu", "bias_add", "dense", "matmul", "batch_matmul", "softmax",
             "log_softmax", "batch_norm", "layer_norm", "dropout", "pad", "conv2d", "conv2d_transpose",
             "max_pool2d", "avg_pool2d", "global_avg_pool2d", "global_max_pool2d", "batch_flatten"]
    for name in names:
        assert callable(getattr(relay.nn, name)), name


# --- activations ------------------------------------------------------------------------------------

SHAPES = [(), (5,), (N, 3), (2, N, 4, 4), (ANY, 7)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize(("op", "kw"), [("nn.relu", {}), ("nn.leaky_relu", {"alpha": 0.2}),
                                         ("nn.gelu", {}), ("nn.gelu", {"approximate": "tanh"})])
def test_activation_keeps_the_input_type(op, kw, shape) -> None:
    for dtype in ["float32", "float16"]:
        assert rel(op, [TensorType(shape, dtype)], **kw) == TensorType(shape, dtype)


def test_relu_keeps_integer_types_but_refuses_bool() -> None:
    assert rel("nn.relu", [TensorType((3,), "int8")]) == TensorType((3,), "int8")
    with pytest.raises(RelationError, match="expected a numeric tensor, found dtype bool"):
        rel("nn.relu", [TensorType((3,), "bool")])


@pytest.mark.parametrize("op", ["nn.leaky_relu", "nn.gelu"])
def test_float_activations_refuse_integers(op) -> None:
    with pytest.raises(RelationError, match="expected a floating-point tensor, found dtype int32"):
        rel(op, [TensorType((3,), "int32")])


def test_activation_attrs_are_validated() -> None:
    x = relay.var("x", shape=(3,))
    with pytest.raises(AttrsError, match=r"op nn.gelu: attribute approximate must be one of 'none', 'tanh', got 'fa"):
        relay.nn.gelu(x, approximate="fast")
    with pytest.raises(AttrsError, match=r"op nn.leaky_relu: attribute alpha must be a number, got 'big'"):
        relay.nn.leaky_relu(x, alpha="big")


def test_activation_references_match_their_formulas() -> None:
    x = rand(4, 5)
    np.testing.assert_array_equal(check_ref_agrees("nn.relu", [x]), np.where(x > 0, x, 0))
    np.testing.assert_allclose(check_ref_agrees("nn.leaky_relu", [x], alpha=0.1), np.where(x > 0, x, x / 10),
                               rtol=1e-6)
    exact = np.array([[v * 0.5 * (1 + math.erf(v / math.sqrt(2))) for v in row] for row in x.astype(float)])
    np.testing.assert_allclose(check_ref_agrees("nn.gelu", [x]), exact, rtol=1e-5, atol=1e-6)
    tanh = check_ref_agrees("nn.gelu", [x], approximate="tanh")
    np.testing.assert_allclose(tanh, exact, atol=1e-3)  # the approximation is close ...
    assert not np.array_equal(tanh, exact.astype(np.float32))  # ... but not the same function
    assert check_ref_agrees("nn.relu", [np.array([-2, 3], dtype=np.int8)]).tolist() == [0, 3]


def test_prelu_type_error_and_values() -> None:
    assert rel("nn.prelu", [TensorType((N, 3, 8, 8)), TensorType((3,))]) == TensorType((N, 3, 8, 8))
    assert rel("nn.prelu", [TensorType((N, 8, 8, 3)), TensorType((3,))], axis=-1) == TensorType((N, 8, 8, 3))
    with pytest.raises(RelationError, match=r"expected alpha of shape \(3,\) \(dim 1 of data .*\), found .*\(4,\)") \
            as info:
        rel("nn.prelu", [TensorType((1, 3, 2, 2)), TensorType((4,))])
    assert info.value.arg == 1
    x, alpha = rand(2, 3, 4), np.array([0.1, 0.2, 0.3], dtype=np.float32)
    out = check_ref_agrees("nn.prelu", [x, alpha])
    expected = np.where(x > 0, x, x * alpha[None, :, None])
    np.testing.assert_allclose(out, expected, rtol=1e-6)


# --- bias_add -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "bias", "axis"),
    [((N, 16, 8, 8), (16,), 1), ((N, 8, 8, 16), (16,), -1), ((N, 10), (10,), 1), ((N, 4, 5), (N,), 0)],
)
def test_bias_add_keeps_the_data_type(data, bias, axis) -> None:
    assert rel("nn.bias_add", [TensorType(data), TensorType(bias)], axis=axis) == TensorType(data)


def test_bias_add_errors_name_the_bias_and_the_axis() -> None:
    with pytest.raises(RelationError, match=r"expected bias of shape \(16,\) \(dim 1 of data") as info:
        rel("nn.bias_add", [TensorType((1, 16, 4, 4)), TensorType((8,))])
    assert info.value.arg == 1
    with pytest.raises(RelationError, match=r"axis 4 is out of range for a tensor of rank 4") as info:
        rel("nn.bias_add", [TensorType((1, 16, 4, 4)), TensorType((16,))], axis=4)
    assert info.value.arg == 0
    with pytest.raises(RelationError, match=r"expected dtype float32 .*found float16"):
        rel("nn.bias_add", [TensorType((1, 16)), TensorType((16,), "float16")])


def test_bias_add_reference_adds_along_the_axis() -> None:
    x, b = rand(2, 3, 4), rand(3)
    np.testing.assert_allclose(check_ref_agrees("nn.bias_add", [x, b]), x + b.reshape(1, 3, 1), rtol=1e-6)
    np.testing.assert_allclose(check_ref_agrees("nn.bias_add", [x, rand(4)], axis=-1).shape, (2, 3, 4))


# --- dense, matmul, batch_matmul -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "weight", "kw", "expected"),
    [
        ((N, 784), (128, 784), {}, (N, 128)),
        ((2, N, 64), (32, 64), {"units": 32}, (2, N, 32)),
        ((7,), (3, 7), {}, (3,)),
        ((N, ANY), (10, 20), {}, (N, 10)),
        ((4, 8), (ANY, 8), {"units": 6}, (4, 6)),
    ],
)
def test_dense_output_type(data, weight, kw, expected) -> None:
    assert rel("nn.dense", [TensorType(data), TensorType(weight)], **kw) == TensorType(expected)


def test_dense_out_dtype() -> None:
    args = [TensorType((2, 4), "int8"), TensorType((3, 4), "int8")]
    assert rel("nn.dense", args, out_dtype="int32") == TensorType((2, 3), "int32")
    x = np.full((1, 64), 100, dtype=np.int8)
    assert check_ref_agrees("nn.dense", [x, x], out_dtype="int32").item() == 64 * 100 * 100


def test_dense_errors() -> None:
    with pytest.raises(RelationError, match=r"has K=64 \(its last dim\) but weight .* has K=32 \(its dim 1\)") as info:
        rel("nn.dense", [TensorType((N, 64)), TensorType((10, 32))])
    assert info.value.arg == 1
    with pytest.raises(RelationError, match=r"attribute units is 5 but weight .* has 10 rows"):
        rel("nn.dense", [TensorType((N, 32)), TensorType((10, 32))], units=5)
    with pytest.raises(RelationError,
                       match=r"expected a weight of rank 2, \(units, K\) \(weight_layout NK\), found Tensor\[\(32,\)"):
        rel("nn.dense", [TensorType((N, 32)), TensorType((32,))])
    with pytest.raises(AttrsError, match=r"op nn.dense: attribute units must be an int >= 1, got 0"):
        relay.nn.dense(relay.var("x", shape=(2, 2)), relay.var("w", shape=(2, 2)), units=0)


def test_dense_reference_is_a_sum_over_k() -> None:
    x, w = rand(2, 3, 5), rand(4, 5)
    out = check_ref_agrees("nn.dense", [x, w])
    expected = np.zeros((2, 3, 4))
    for k in range(5):
        expected += x[..., k : k + 1] * w[:, k]
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("a", "b", "kw", "expected"),
    [
        ((3, 4), (4, 5), {}, (3, 5)),
        ((4, 3), (4, 5), {"transpose_a": True}, (3, 5)),
        ((3, 4), (5, 4), {"transpose_b": True}, (3, 5)),
        ((4, 3), (5, 4), {"transpose_a": True, "transpose_b": True}, (3, 5)),
        ((N, 3, 4), (4, 5), {}, (N, 3, 5)),
        ((2, 1, 3, 4), (6, 4, 5), {}, (2, 6, 3, 5)),
        ((N, 8, 16), (N, 16, 8), {}, (N, 8, 8)),
    ],
)
def test_matmul_output_type(a, b, kw, expected) -> None:
    assert rel("nn.matmul", [TensorType(a), TensorType(b)], **kw) == TensorType(expected)


def test_matmul_errors() -> None:
    with pytest.raises(RelationError, match=r"reduction dims differ: .* has K=4 \(dim -1, transpose_a=False\) "
                                            r"but .* has K=5 \(dim -2, transpose_b=False\)"):
        rel("nn.matmul", [TensorType((3, 4)), TensorType((5, 6))])
    with pytest.raises(RelationError, match=r"batch dims .* do not broadcast: .*dim 0 is 2 against 3"):
        rel("nn.matmul", [TensorType((2, 3, 4)), TensorType((3, 4, 5))])
    with pytest.raises(RelationError, match=r"expected a tensor of rank >= 2") as info:
        rel("nn.matmul", [TensorType((3, 4)), TensorType((4,))])
    assert info.value.arg == 1


@pytest.mark.parametrize(("ta", "tb"), [(False, False), (True, False), (False, True), (True, True)])
def test_matmul_reference_matches_einsum(ta, tb) -> None:
    a, b = rand(2, 1, 3, 4), rand(5, 4, 6)
    a_in = np.swapaxes(a, -1, -2) if ta else a
    b_in = np.swapaxes(b, -1, -2) if tb else b
    out = check_ref_agrees("nn.matmul", [a_in.copy(), b_in.copy()], transpose_a=ta, transpose_b=tb)
    expected = np.einsum("xymk,ykn->xymn", np.broadcast_to(a, (2, 5, 3, 4)), b)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("x", "y", "kw", "expected"),
    [
        ((N, 3, 4), (N, 5, 4), {}, (N, 3, 5)),
        ((2, 3, 4), (1, 5, 4), {}, (2, 3, 5)),
        ((1, 3, 4), (7, 5, 4), {}, (7, 3, 5)),
        ((2, 3, 4), (2, 4, 5), {"transpose_b": False}, (2, 3, 5)),
        ((2, 4, 3), (2, 5, 4), {"transpose_a": True}, (2, 3, 5)),
    ],
)
def test_batch_matmul_output_type(x, y, kw, expected) -> None:
    assert rel("nn.batch_matmul", [TensorType(x), TensorType(y)], **kw) == TensorType(expected)


def test_batch_matmul_errors() -> None:
    with pytest.raises(RelationError, match=r"batch dims differ: x .* has 2, y .* has 3 \(one may be 1\)"):
        rel("nn.batch_matmul", [TensorType((2, 3, 4)), TensorType((3, 5, 4))])
    with pytest.raises(RelationError, match=r"has K=4 .* but .* has K=5"):
        rel("nn.batch_matmul", [TensorType((2, 3, 4)), TensorType((2, 4, 5))])  # y must be (B, N, K)
    with pytest.raises(RelationError, match=r"expected a tensor of rank 3 \(batch, rows, cols\)") as info:
        rel("nn.batch_matmul", [TensorType((3, 4)), TensorType((2, 5, 4))])
    assert info.value.arg == 0


def test_batch_matmul_reference_loops_over_the_batch() -> None:
    x, y = rand(3, 2, 4), rand(1, 5, 4)
    out = check_ref_agrees("nn.batch_matmul", [x, y])
    for b in range(3):
        np.testing.assert_allclose(out[b], x[b] @ y[0].T, rtol=1e-5, atol=1e-5)
    out = check_ref_agrees("nn.batch_matmul", [x, rand(3, 4, 6)], transpose_b=False)
    assert out.shape == (3, 2, 6)


def test_matmul_constructors_type_check() -> None:
    x, w = relay.var("x", shape=(N, 16)), relay.var("w", shape=(8, 16))
    assert relay.infer_type(relay.nn.dense(x, w)).checked_type == TensorType((N, 8))
    assert relay.infer_type(relay.nn.matmul(x, w, transpose_b=True)).checked_type == TensorType((N, 8))
    a, b = relay.var("a", shape=(4, 2, 3)), relay.var("b", shape=(4, 5, 3))
    assert relay.infer_type(relay.nn.batch_matmul(a, b)).checked_type == TensorType((4, 2, 5))
    with pytest.raises(relay.TypeInferenceError, match=r"nn.dense.*weight.*K=16"):
        relay.infer_type(relay.nn.dense(x, relay.var("w2", shape=(8, 15))))


# --- softmax, log_softmax ------------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["nn.softmax", "nn.log_softmax"])
@pytest.mark.parametrize(("shape", "axis"), [((N, 10), -1), ((N, 10), 0), ((2, 3, N), 1), ((5,), 0)])
def test_softmax_keeps_the_type(op, shape, axis) -> None:
    assert rel(op, [TensorType(shape, "float16")], axis=axis) == TensorType(shape, "float16")


@pytest.mark.parametrize("op", ["nn.softmax", "nn.log_softmax"])
def test_softmax_errors(op) -> None:
    with pytest.raises(RelationError, match=r"axis 2 is out of range for a tensor of rank 2 \(allowed: -2 to 1\)"):
        rel(op, [TensorType((3, 4))], axis=2)
    with pytest.raises(RelationError, match=r"expected a floating-point tensor, found dtype int32"):
        rel(op, [TensorType((3, 4), "int32")])


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_softmax_references_normalize_along_the_axis(axis) -> None:
    x = rand(3, 4, 5) * 10
    x64 = x.astype(np.float64)
    expected = np.exp(x64) / np.exp(x64).sum(axis=axis, keepdims=True)
    out = check_ref_agrees("nn.softmax", [x], axis=axis)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(out.sum(axis=axis), 1.0, rtol=1e-5)
    log_out = check_ref_agrees("nn.log_softmax", [x], axis=axis)
    np.testing.assert_allclose(log_out, np.log(expected), rtol=1e-5, atol=1e-5)


def test_softmax_reference_is_stable_for_large_inputs() -> None:
    x = np.array([[1000.0, 1000.0, -1000.0]], dtype=np.float32)
    np.testing.assert_allclose(ref("nn.softmax", x), [[0.5, 0.5, 0.0]])
    assert np.isfinite(ref("nn.log_softmax", x)[0, :2]).all()


@pytest.mark.parametrize("op", ["nn.softmax", "nn.log_softmax"])
@pytest.mark.parametrize(("shape", "axis"), [((0, 3), 0), ((0, 1, 1), -1), ((2, 0), 1)])
def test_softmax_of_an_empty_tensor_is_empty(op, shape, axis) -> None:
    # the references took numpy's max over the axis, which raises for an empty axis
    out = check_ref_agrees(op, [np.zeros(shape, "float32")], axis=axis)
    assert out.shape == shape
    check_build(op, np.zeros(shape, "float32"), axis=axis)


# --- batch_norm, layer_norm ----------------------------------------------------------------------------


def test_batch_norm_returns_the_normalized_data_mean_and_var() -> None:
    vec = TensorType((16,))
    for data, axis in [((N, 16, 8, 8), 1), ((N, 8, 8, 16), -1), ((N, 16), 1)]:
        out = rel("nn.batch_norm", [TensorType(data), vec, vec, vec, vec], axis=axis)
        assert out == TupleType((TensorType(data), vec, vec))


def test_batch_norm_errors_name_the_parameter() -> None:
    vec = TensorType((16,))
    with pytest.raises(RelationError, match=r"expected moving_var of shape \(16,\) \(dim 1 of data .*\(8,\)") as info:
        rel("nn.batch_norm", [TensorType((1, 16, 4, 4)), vec, vec, vec, TensorType((8,))])
    assert info.value.arg == 4
    with pytest.raises(RelationError, match=r"expected a floating-point tensor, found dtype int32"):
        rel("nn.batch_norm", [TensorType((1, 16), "int32"), vec, vec, vec, vec])
    with pytest.raises(AttrsError, match=r"op nn.batch_norm: attribute epsilon must be a number > 0, got -1"):
        make_attrs("nn.batch_norm", epsilon=-1)


@pytest.mark.parametrize(("center", "scale"), [(True, True), (False, True), (True, False), (False, False)])
def test_batch_norm_reference_per_channel(center, scale) -> None:
    x, gamma, beta, mean = rand(2, 3, 4, 4), rand(3), rand(3), rand(3)
    var = np.abs(rand(3)) + 0.5
    out, m, v = check_ref_agrees("nn.batch_norm", [x, gamma, beta, mean, var], center=center, scale=scale)
    for c in range(3):
        expected = (x[:, c] - mean[c]) / math.sqrt(var[c] + 1e-5)
        expected = expected * (gamma[c] if scale else 1) + (beta[c] if center else 0)
        np.testing.assert_allclose(out[:, c], expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(m, mean)
    np.testing.assert_array_equal(v, var)


def test_batch_norm_reference_nhwc_axis() -> None:
    x, gamma, beta, mean, var = rand(2, 4, 4, 3), rand(3), rand(3), rand(3), np.ones(3, np.float32)
    out, _, _ = check_ref_agrees("nn.batch_norm", [x, gamma, beta, mean, var], axis=3, epsilon=0.5)
    expected = (x - mean) / math.sqrt(1.5) * gamma + beta
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("data", "axis", "size"), [((N, 10, 64), -1, 64), ((N, 10, 64), 1, 10), ((4,), 0, 4)])
def test_layer_norm_keeps_the_data_type(data, axis, size) -> None:
    vec = TensorType((size,))
    assert rel("nn.layer_norm", [TensorType(data), vec, vec], axis=axis) == TensorType(data)


def test_layer_norm_errors() -> None:
    with pytest.raises(RelationError, match=r"expected gamma of shape \(64,\) \(dim 2 of data") as info:
        rel("nn.layer_norm", [TensorType((2, 3, 64)), TensorType((3,)), TensorType((64,))])
    assert info.value.arg == 1
    with pytest.raises(RelationError, match=r"expected beta of shape \(64,\).*found Tensor\[\(1, 64\)"):
        rel("nn.layer_norm", [TensorType((2, 3, 64)), TensorType((64,)), TensorType((1, 64))])


@pytest.mark.parametrize("axis", [-1, 1])
def test_layer_norm_reference_normalizes_each_row(axis) -> None:
    x = rand(2, 5, 6)
    size = x.shape[axis]
    gamma, beta = rand(size), rand(size)
    out = check_ref_agrees("nn.layer_norm", [x, gamma, beta], axis=axis, epsilon=1e-6)
    moved = np.moveaxis(x.astype(np.float64), axis, -1)
    expected = np.empty_like(moved)
    for idx in np.ndindex(moved.shape[:-1]):
        row = moved[idx]
        expected[idx] = (row - row.mean()) / math.sqrt(row.var() + 1e-6) * gamma + beta
    np.testing.assert_allclose(out, np.moveaxis(expected, -1, axis), rtol=1e-4, atol=1e-5)


def test_norm_constructors_type_check() -> None:
    x = relay.var("x", shape=(N, 4, 6, 6))
    params = [relay.var(name, shape=(4,)) for name in ["g", "b", "m", "v"]]
    t = relay.infer_type(relay.nn.batch_norm(x, *params)).checked_type
    assert t == TupleType((TensorType((N, 4, 6, 6)), TensorType((4,)), TensorType((4,))))
    y = relay.var("y", shape=(N, 7))
    g, b = relay.var("g", shape=(7,)), relay.var("b", shape=(7,))
    assert relay.infer_type(relay.nn.layer_norm(y, g, b)).checked_type == TensorType((N, 7))


# --- dropout -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(N, 128), (3,), (2, ANY, 4)])
def test_dropout_returns_output_and_mask(shape) -> None:
    t = TensorType(shape)
    assert rel("nn.dropout", [t], rate=0.1) == TupleType((t, t))


def test_dropout_errors() -> None:
    with pytest.raises(AttrsError, match=r"op nn.dropout: attribute rate must be a number in \[0, 1\), got 1.5"):
        relay.nn.dropout(relay.var("x", shape=(3,)), rate=1.5)
    with pytest.raises(RelationError, match=r"expected a floating-point tensor, found dtype int32"):
        rel("nn.dropout", [TensorType((3,), "int32")])


def test_dropout_reference_is_the_identity_with_a_ones_mask() -> None:
    x = rand(3, 4)
    out, mask = check_ref_agrees("nn.dropout", [x], rate=0.5)
    np.testing.assert_array_equal(out, x)
    np.testing.assert_array_equal(mask, np.ones_like(x))


# --- pad ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("shape", "pad_width", "expected"),
    [
        ((1, 3, 4, 4), ((0, 0), (0, 0), (1, 1), (2, 0)), (1, 3, 6, 6)),
        ((N, 3), ((0, 0), (2, 3)), (N, 8)),
        ((N, 3), ((1, 0), (0, 0)), (dim_add(N, 1), 3)),
        ((), (), ()),
    ],
)
def test_pad_output_type(shape, pad_width, expected) -> None:
    types = [TensorType(shape, "int32"), TensorType((), "int32")]
    assert rel("nn.pad", types, pad_width=pad_width) == TensorType(expected, "int32")


def test_pad_errors() -> None:
    scalar = TensorType(())
    with pytest.raises(RelationError, match=r"attribute pad_width has 1 pairs but data .* has rank 2") as info:
        rel("nn.pad", [TensorType((3, 4)), scalar], pad_width=[(1, 1)])
    assert info.value.arg == 0
    with pytest.raises(RelationError, match=r"expected a scalar \(rank 0\) pad_value, found") as info:
        rel("nn.pad", [TensorType((3, 4)), TensorType((1,))], pad_width=[(1, 1), (0, 0)])
    assert info.value.arg == 1
    with pytest.raises(RelationError, match=r"reflect padding of axis 1 by \(0, 4\) needs each to be less than .* 4"):
        rel("nn.pad", [TensorType((3, 4)), scalar], pad_width=[(1, 1), (0, 4)], pad_mode="reflect")
    with pytest.raises(AttrsError, match=r"op nn.pad: attribute pad_width must be a list of \(before, after\) pairs"):
        make_attrs("nn.pad", pad_width=[(1, -1)])
    with pytest.raises(AttrsError, match=r"op nn.pad: attribute pad_mode must be one of 'constant', 'edge', 'reflect'"):
        make_attrs("nn.pad", pad_width=[(1, 1)], pad_mode="symmetric")
    for mode in ("edge", "wrap"):
        with pytest.raises(RelationError, match=rf"{mode} padding of axis 0 needs a non-empty axis, found size 0"):
            rel("nn.pad", [TensorType((0, 4)), scalar], pad_width=[(1, 0), (0, 0)], pad_mode=mode)


def test_pad_reference_modes() -> None:
    x = np.array([[1, 2, 3], [4, 5, 6]], dtype=np.float32)
    value = np.array(9, dtype=np.float32)
    width = [(1, 0), (2, 1)]
    constant = check_ref_agrees("nn.pad", [x, value], pad_width=width)
    assert constant.tolist() == [[9, 9, 9, 9, 9, 9], [9, 9, 1, 2, 3, 9], [9, 9, 4, 5, 6, 9]]
    edge = check_ref_agrees("nn.pad", [x, value], pad_width=width, pad_mode="edge")
    assert edge.tolist() == [[1, 1, 1, 2, 3, 3], [1, 1, 1, 2, 3, 3], [4, 4, 4, 5, 6, 6]]
    reflect = check_ref_agrees("nn.pad", [x, value], pad_width=width, pad_mode="reflect")
    assert reflect.tolist() == [[6, 5, 4, 5, 6, 5], [3, 2, 1, 2, 3, 2], [6, 5, 4, 5, 6, 5]]
    wrap = check_ref_agrees("nn.pad", [x, value], pad_width=width, pad_mode="wrap")
    assert wrap.tolist() == [[5, 6, 4, 5, 6, 4], [2, 3, 1, 2, 3, 1], [5, 6, 4, 5, 6, 4]]


def test_pad_constructor_makes_a_scalar_pad_value_of_the_data_dtype() -> None:
    x = relay.var("x", shape=(N, 3), dtype="int32")
    call = relay.nn.pad(x, [(0, 0), (1, 1)], 0)
    assert isinstance(call.args[1], relay.Constant)
    assert call.args[1].data.dtype == np.int32
    assert relay.infer_type(call).checked_type == TensorType((N, 5), "int32")
    assert call.attrs.pad_width == ((0, 0), (1, 1))


# --- text round trip ----------------------------------------------------------------------------------------


def _nn_calls() -> list[relay.Call]:
    x, v = relay.var("x", shape=(N, 4, 8, 8)), relay.var("v", shape=(4,))
    m, k = relay.var("m", shape=(N, 16)), relay.var("k", shape=(8, 16))
    b3, g16 = relay.var("b3", shape=(2, 3, 4)), relay.var("g", shape=(16,))
    return [
        relay.nn.relu(x), relay.nn.leaky_relu(x, 0.2), relay.nn.gelu(x, "tanh"), relay.nn.prelu(x, v),
        relay.nn.bias_add(x, v, axis=1), relay.nn.dense(m, k, units=8, out_dtype="float32"),
        relay.nn.matmul(m, k, transpose_b=True), relay.nn.batch_matmul(b3, b3, transpose_b=False),
        relay.nn.softmax(m, axis=0), relay.nn.log_softmax(m),
        relay.nn.batch_norm(x, v, v, v, v, epsilon=1e-3, center=False), relay.nn.layer_norm(m, g16, g16, scale=False),
        relay.nn.dropout(m, 0.2), relay.nn.pad(x, [(0, 0), (0, 0), (1, 1), (2, 0)], 0.0, "reflect"),
    ]


@pytest.mark.parametrize("index", range(14))
def test_nn_call_round_trips_through_the_text_format(index) -> None:
    from kiln.relay.parser import parse
    from kiln.relay.printer import astext

    call = _nn_calls()[index]
    func = relay.Function(list(dict.fromkeys(a for a in call.args if isinstance(a, relay.Var))), call)
    text = astext(func)
    again = parse(text)
    assert astext(again) == text
    assert again.body.op is call.op
    assert again.body.attrs == call.attrs


# --- computes: each op compiled through the lowering path agrees with its reference -----------------

NN_FAMILY = [
    "nn.relu", "nn.leaky_relu", "nn.gelu", "nn.prelu", "nn.bias_add", "nn.dense", "nn.matmul", "nn.batch_matmul",
    "nn.softmax", "nn.log_softmax", "nn.batch_norm", "nn.layer_norm", "nn.dropout", "nn.pad", "nn.conv2d",
    "nn.conv2d_transpose", "nn.max_pool2d", "nn.avg_pool2d", "nn.global_avg_pool2d", "nn.global_max_pool2d",
]


@pytest.mark.parametrize("op", NN_FAMILY)
def test_every_nn_op_has_a_compute(op: str) -> None:
    assert callable(Op.get(op).get_attr(attr.FCompute))


def _ints(*shape: int, dtype: str = "int32") -> np.ndarray:
    return np.random.default_rng(1).integers(-50, 50, shape).astype(dtype)


@pytest.mark.parametrize("shape", [(7,), (3, 40), (2, 3, 4, 5), (64, 300)])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_relu_builds(shape, dtype) -> None:
    check_build("nn.relu", rand(*shape, dtype=dtype))


@pytest.mark.parametrize("dtype", ["int32", "int8"])
def test_relu_builds_for_integers(dtype) -> None:
    check_build("nn.relu", _ints(5, 9, dtype=dtype))


@pytest.mark.parametrize("alpha", [0.01, 0.2, -0.5])
def test_leaky_relu_builds(alpha) -> None:
    check_build("nn.leaky_relu", rand(4, 33), alpha=alpha)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_gelu_builds(approximate, dtype) -> None:
    check_build("nn.gelu", rand(3, 50, dtype=dtype) * 3, rtol=1e-5, atol=1e-5, approximate=approximate)


@pytest.mark.parametrize(("op", "shape", "axis"), [
    ("nn.prelu", (2, 3, 4, 5), 1), ("nn.prelu", (2, 4, 5, 3), -1), ("nn.prelu", (6, 7), 0),
    ("nn.bias_add", (2, 3, 4, 5), 1), ("nn.bias_add", (4, 9), -1), ("nn.bias_add", (5,), 0),
    ("nn.bias_add", (2, 3, 4, 5), 2),
])
def test_channel_vector_ops_build(op, shape, axis) -> None:
    check_build(op, rand(*shape), rand(shape[axis]), axis=axis)


@pytest.mark.parametrize("op", ["nn.softmax", "nn.log_softmax"])
@pytest.mark.parametrize(("shape", "axis"), [((7,), 0), ((4, 9), -1), ((4, 9), 0), ((2, 3, 5), 1), ((64, 100), -1)])
def test_softmax_builds(op, shape, axis) -> None:
    check_build(op, rand(*shape), rtol=1e-5, atol=1e-6, axis=axis)


@pytest.mark.parametrize("op", ["nn.softmax", "nn.log_softmax"])
def test_softmax_build_is_stable_for_large_inputs(op) -> None:
    x = rand(3, 10) * 1000
    check_build(op, x, rtol=1e-5, atol=1e-5)
    check_build(op, x.astype("float64"), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("shape", [(3, 8), (2, 3, 4)])
def test_dropout_builds_the_identity_and_a_ones_mask(shape) -> None:
    check_build("nn.dropout", rand(*shape), rate=0.3)


@pytest.mark.parametrize("pad_mode", ["constant", "edge", "reflect", "wrap"])
@pytest.mark.parametrize(("shape", "pad_width"), [
    ((3, 4), ((1, 2), (0, 3))),
    ((5,), ((2, 4),)),
    ((2, 3, 4, 5), ((0, 0), (0, 0), (1, 1), (2, 3))),
    ((6, 7), ((0, 0), (0, 0))),
])
def test_pad_builds(pad_mode, shape, pad_width) -> None:
    check_build("nn.pad", rand(*shape), np.array(1.5, np.float32), pad_width=pad_width, pad_mode=pad_mode)


def test_pad_builds_for_integers_and_large_inputs() -> None:
    check_build("nn.pad", _ints(3, 4), np.array(-7, np.int32), pad_width=((2, 1), (1, 2)))
    check_build("nn.pad", rand(64, 300), np.array(0.0, np.float32), pad_width=((1, 2), (3, 4)), pad_mode="reflect")


@pytest.mark.parametrize("pad_mode", ["constant", "edge", "reflect", "wrap"])
def test_pad_leaves_an_empty_axis_it_does_not_pad(pad_mode) -> None:
    # found by the Relay fuzzer: reflect refused a pad of (0, 0) on an axis of size 0, which numpy allows
    x = np.zeros((3, 0), np.float32)
    check_build("nn.pad", x, np.array(1.5, np.float32), pad_width=((1, 2), (0, 0)), pad_mode=pad_mode)
    assert ref("nn.pad", x, np.array(1.5, np.float32), pad_width=((1, 2), (0, 0)), pad_mode=pad_mode).shape == (6, 0)


def test_constant_pad_of_an_empty_axis_is_all_pad_value() -> None:
    # found by the Relay fuzzer: the compute read the empty input at index 0 (the bounds check refused it)
    x = np.zeros((1, 0, 2), np.float32)
    check_build("nn.pad", x, np.array(1.5, np.float32), pad_width=((0, 1), (1, 1), (0, 0)))
    assert ref("nn.pad", x, np.array(1.5, np.float32), pad_width=((0, 1), (1, 1), (0, 0))).shape == (2, 2, 2)


def test_pad_wrap_builds_with_pads_wider_than_the_axis() -> None:
    # numpy's wrap repeats the axis as often as needed; the floor modulo does the same
    check_build("nn.pad", _ints(2, 3), np.array(0, np.int32), pad_width=((5, 3), (7, 4)), pad_mode="wrap")


def test_float16_softmax_sums_in_float32() -> None:
    from kiln import relay

    x = relay.var("x", shape=(2, 4096), dtype="float16")
    data = np.random.default_rng(7).uniform(-1, 1, (2, 4096)).astype(np.float16)
    for op in (relay.nn.softmax, relay.nn.log_softmax):
        got = relay.build(relay.Function([x], op(x))).create_executor()(x=data).astype(np.float64)
        x64 = data.astype(np.float64)
        log_total = np.log(np.exp(x64).sum(axis=1, keepdims=True))
        want = np.exp(x64 - log_total) if op is relay.nn.softmax else x64 - log_total
        np.testing.assert_allclose(got, want, rtol=2e-3, atol=1e-6)


# --- softmax along the last axis: the llvm "rows" implementation --------------------------------------


def _softmax64(x: np.ndarray, log: bool) -> np.ndarray:
    """softmax (or log_softmax) along the last axis in float64, as the references compute it."""
    x64 = x.astype(np.float64)
    with np.errstate(invalid="ignore"):  # a row of -inf: -inf - -inf is nan, as in the references
        shifted = x64 - x64.max(axis=-1, keepdims=True)
        log_total = np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    return shifted - log_total if log else np.exp(shifted - log_total)


@pytest.mark.parametrize("op", ["nn.softmax", "nn.log_softmax"])
@pytest.mark.parametrize("n", [1, 3, 16, 17, 63, 64, 65, 1000, 4097])
def test_softmax_rows_match_numpy_over_odd_row_lengths(op, n) -> None:
    # rows of n = groups of 4 vectors of 16 lanes, the vectors past them, and the last n % 16 values
    check_build(op, rand(3, n) * 4, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op", ["nn.softmax", "nn.log_softmax"])
@pytest.mark.parametrize("shape", [(1000,), (12, 8, 128), (20, 33), (5, 7, 64), (2, 20000)])
def test_softmax_rows_of_one_row_many_rows_and_rows_too_long_for_a_row_buffer(op, shape) -> None:
    # log_softmax takes short rows by blocks of 16 (20 and 35 rows: a last block of 4 and of 3)
    check_build(op, rand(*shape) * 4, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op", ["nn.softmax", "nn.log_softmax"])
@pytest.mark.parametrize("n", [5, 17, 1000])
def test_softmax_rows_of_large_small_and_infinite_values(op, n) -> None:
    from op_helpers import build_op

    x = rand(6, n) * 30
    x[0] = 80.0  # all equal and large: 1/n each
    x[1, ::2] = -80.0
    x[2, 1::3] = -np.inf  # zero probability
    x[3] = -np.inf  # all -inf: -inf - -inf is nan, as in numpy
    x[4, -1] = 80.0  # one large value past the last whole vector
    x[5] = np.linspace(-80, 80, n)
    (got,) = build_op(op, x)
    log = op == "nn.log_softmax"
    want = _softmax64(x, log)
    np.testing.assert_allclose(got, want.astype(np.float32), rtol=1e-5, atol=1e-6)
    with np.errstate(invalid="ignore"):
        np.testing.assert_allclose(got, ref(op, x), rtol=1e-5, atol=1e-6)  # nan where the reference has nan
    assert np.isnan(got[3]).all() and not np.isnan(np.delete(got, 3, axis=0)).any()
    assert (got[2, 1::3] == (-np.inf if log else 0.0)).all()
    np.testing.assert_allclose(got[0], np.log(1 / n) if log else 1 / n, rtol=1e-6)


@pytest.mark.parametrize("op", ["nn.softmax", "nn.log_softmax"])
@pytest.mark.parametrize("n", [17, 1000, 4097])
def test_float16_softmax_rows_accumulate_in_float32(op, n) -> None:
    from op_helpers import build_op

    x = np.random.default_rng(n).uniform(-8, 8, (20, n)).astype(np.float16)
    (got,) = build_op(op, x)
    assert got.dtype == np.float16
    # float16 sums over thousands of values would be off by far more (steps of 0.5 near 1000)
    np.testing.assert_allclose(got.astype(np.float64), _softmax64(x, op == "nn.log_softmax"), rtol=2e-3, atol=1e-6)


# 8 MiB and more of input and output come from L3 or memory (`_rows.streams`): the pass that computes exp
# (softmax's into its row buffer, log_softmax's sum, and softmax's sum of rows too long for a row buffer)
# prefetches the next row
_STREAMING = [(1025, 1025), (3, 350, 1001), (105, 20001)]


@pytest.mark.parametrize("op", ["nn.softmax", "nn.log_softmax"])
@pytest.mark.parametrize("shape", _STREAMING)
def test_softmax_rows_of_a_tensor_that_streams_from_memory(op: str, shape: tuple[int, ...]) -> None:
    from kiln.relay.op._rows import streams

    assert streams(shape, "float32")
    check_build(op, rand(*shape) * 4, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op", ["nn.softmax", "nn.log_softmax"])
def test_streaming_softmax_rows_of_large_small_and_infinite_values(op: str) -> None:
    from op_helpers import build_op

    x = rand(1025, 1025) * 30
    x[0] = 80.0  # all equal and large: 1/n each
    x[1, 1::3] = -np.inf  # zero probability
    x[2] = -np.inf  # all -inf: nan, as in numpy
    x[-1, -1] = 80.0  # the last row (whose prefetches point past the tensor) with a large last value
    (got,) = build_op(op, x)
    log = op == "nn.log_softmax"
    with np.errstate(invalid="ignore"):
        np.testing.assert_allclose(got, _softmax64(x, log).astype(np.float32), rtol=1e-5, atol=1e-6)
    assert np.isnan(got[2]).all() and not np.isnan(np.delete(got, 2, axis=0)).any()
    assert (got[1, 1::3] == (-np.inf if log else 0.0)).all()
    np.testing.assert_allclose(got[0], np.log(1 / 1025) if log else 1 / 1025, rtol=1e-6)


@pytest.mark.parametrize("op", ["nn.softmax", "nn.log_softmax"])
def test_streaming_float16_softmax_rows_accumulate_in_float32(op: str) -> None:
    from op_helpers import build_op

    from kiln.relay.op._rows import streams

    x = np.random.default_rng(3).uniform(-8, 8, (513, 4097)).astype(np.float16)
    assert streams(x.shape, "float16")
    (got,) = build_op(op, x)
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float64), _softmax64(x, op == "nn.log_softmax"), rtol=2e-3, atol=1e-6)


@pytest.mark.parametrize("op", ["nn.softmax", "nn.log_softmax"])
@pytest.mark.parametrize(("shape", "streaming"), [(_STREAMING[0], True), ((512, 1024), False)])
def test_only_softmax_rows_that_stream_prefetch_the_next_row(op: str, shape: tuple[int, ...],
                                                             streaming: bool) -> None:
    from kiln.relay.backend.te_compiler import compile_primitive

    x = relay.var("x", shape=shape)
    call = relay.nn.softmax(x) if op == "nn.softmax" else relay.nn.log_softmax(x)
    func = relay.infer_type(relay.Function([x], call))
    assert isinstance(func, relay.Function)
    tir = compile_primitive(func, "llvm", name="rows").module.get_source("tir")
    assert ("prefetch" in tir) == streaming
    assert ("softmax_exp" in tir) == (op == "nn.softmax")  # softmax's row buffer of exp values, streaming or not


def test_softmax_rows_run_in_vectors_without_libm_calls() -> None:
    from kiln.relay.backend.te_compiler import compile_primitive
    from kiln.target import Target

    if "+avx512f" not in Target("llvm").export().get("mattr", []):
        pytest.skip("the host has no AVX-512 (zmm) registers")
    x = relay.var("x", shape=(64, 4096))
    for op in (relay.nn.softmax, relay.nn.log_softmax):
        kernel = compile_primitive(relay.infer_type(relay.Function([x], op(x))), "llvm", name="rows")
        assert "zmm" in kernel.module.get_source("asm")
        # exp is an inline polynomial (log runs once a row, on a scalar): no libm function is linked,
        # only the runtime that starts the threads
        assert not [s for s in kernel.module.symbols if s.rstrip("f") in ("exp", "exp2", "log", "pow", "ldexp")]
