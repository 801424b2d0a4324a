"""The matrix products of kiln.relay.op.matmul (nn.dense, nn.matmul, nn.batch_matmul), compiled.

Their relations and references are tested in test_nn.py; here each op goes
through the lowering path (its compute and generic schedule, LLVM) and must
agree with its numpy reference over a grid of shapes, transposes and dtypes.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from op_helpers import check_build, rand

from kiln.relay.op import matmul, nn


def _ints(*shape: int, dtype: str) -> np.ndarray:
    return np.random.default_rng(2).integers(-20, 20, shape).astype(dtype)


def test_the_constructors_are_those_of_relay_nn() -> None:
    assert nn.dense is matmul.dense and nn.matmul is matmul.matmul and nn.batch_matmul is matmul.batch_matmul
    assert nn.DenseAttrs is matmul.DenseAttrs


@pytest.mark.parametrize(("x_shape", "w_shape"), [
    ((4, 8), (5, 8)), ((1, 3), (1, 3)), ((8,), (3, 8)), ((2, 3, 8), (5, 8)), ((64, 64), (64, 64)),
])
def test_dense_builds(x_shape, w_shape) -> None:
    check_build("nn.dense", rand(*x_shape), rand(*w_shape), rtol=1e-5, atol=1e-5)


def test_dense_builds_with_units_and_out_dtype() -> None:
    check_build("nn.dense", rand(4, 8), rand(5, 8), units=5)
    check_build("nn.dense", _ints(4, 8, dtype="int8"), _ints(5, 8, dtype="int8"), out_dtype="int32")
    check_build("nn.dense", rand(4, 8), rand(5, 8), out_dtype="float64", rtol=1e-12)
    check_build("nn.dense", _ints(3, 7, dtype="int32"), _ints(2, 7, dtype="int32"))


@pytest.mark.parametrize("transpose_a", [False, True])
@pytest.mark.parametrize("transpose_b", [False, True])
@pytest.mark.parametrize(("batch_a", "batch_b"), [((), ()), ((3,), (3,)), ((2, 1), (3,)), ((1,), (2, 4))])
def test_matmul_builds(transpose_a, transpose_b, batch_a, batch_b) -> None:
    m, k, n = 4, 6, 5
    a = rand(*batch_a, *((k, m) if transpose_a else (m, k)))
    b = rand(*batch_b, *((n, k) if transpose_b else (k, n)))
    check_build("nn.matmul", a, b, rtol=1e-5, atol=1e-5, transpose_a=transpose_a, transpose_b=transpose_b)


def test_matmul_builds_with_out_dtype() -> None:
    check_build("nn.matmul", _ints(3, 4, dtype="int8"), _ints(4, 2, dtype="int8"), out_dtype="int32")
    check_build("nn.matmul", rand(3, 4), rand(4, 2), out_dtype="float64", rtol=1e-12)


@pytest.mark.parametrize("transpose_a", [False, True])
@pytest.mark.parametrize("transpose_b", [False, True])
@pytest.mark.parametrize(("batch_x", "batch_y"), [(2, 2), (1, 3), (3, 1)])
def test_batch_matmul_builds(transpose_a, transpose_b, batch_x, batch_y) -> None:
    m, k, n = 3, 5, 4
    x = rand(batch_x, *((k, m) if transpose_a else (m, k)))
    y = rand(batch_y, *((n, k) if transpose_b else (k, n)))
    check_build("nn.batch_matmul", x, y, rtol=1e-5, atol=1e-5, transpose_a=transpose_a, transpose_b=transpose_b)


# -- nn.dense with a weight packed at build time (weight_layout NK<b>n, made by AlterOpLayout on llvm) --------


def _pack(w: np.ndarray, block: int) -> np.ndarray:
    n, k = w.shape
    return np.ascontiguousarray(w.reshape(n // block, block, k).transpose(0, 2, 1))


@pytest.mark.parametrize(("x_shape", "n"), [((1, 16), 64), ((5, 24), 128), ((197, 40), 64), ((2, 3, 8), 64)])
def test_dense_with_a_packed_weight_builds(x_shape, n) -> None:
    x, w = rand(*x_shape), rand(n, x_shape[-1])
    assert np.allclose(matmul.unpack_weight(_pack(w, 64), 64), w)
    check_build("nn.dense", x, _pack(w, 64), weight_layout="NK64n", rtol=1e-5, atol=1e-5)
    check_build("nn.dense", x.astype("float64"), _pack(w, 32).astype("float64"), weight_layout="NK32n", rtol=1e-12)


def test_dense_weight_layout_is_checked() -> None:
    from kiln import relay
    from kiln.ir.attrs import AttrsError
    from kiln.relay.type_infer import TypeInferenceError

    with pytest.raises(AttrsError, match="weight_layout.*'NK<b>n'"):
        nn.dense(relay.var("x", shape=(2, 8)), relay.var("w", shape=(1, 8, 64)), weight_layout="KN")
    x, w = relay.var("x", shape=(2, 8)), relay.var("w", shape=(64, 8))
    with pytest.raises(TypeInferenceError, match="rank 3, \\(units/64, K, 64\\)"):
        relay.infer_type(relay.Function([x, w], nn.dense(x, w, weight_layout="NK64n")))
    w3 = relay.var("w", shape=(2, 8, 32))
    with pytest.raises(TypeInferenceError, match="needs a weight \\(units/64, K, 64\\)"):
        relay.infer_type(relay.Function([x, w3], nn.dense(x, w3, weight_layout="NK64n")))
    packed = relay.var("w", shape=(2, 8, 64))
    f = relay.infer_type(relay.Function([x, packed], nn.dense(x, packed, weight_layout="NK64n")))
    assert tuple(f.checked_type.ret_type.shape) == (2, 128)


# -- register tiles with tails: sizes without good divisors (ViT's 197 tokens) -----------------------------


def test_tile_sizes_take_a_tail_rather_than_a_degenerate_divisor() -> None:
    assert matmul._tile(197, 4) == 4 and matmul._tile(197, 64, 16) == 64  # 197 is prime: tiles of 1 otherwise
    assert matmul._tile(128, 64, 16) == 64 and matmul._tile(96, 64, 16) == 48 and matmul._tile(6, 4) == 3
    assert matmul._tile(200, 64, 16) == 64  # 50 divides 200 but is no whole number of vectors
    assert matmul._tile(40, 64, 16) == 32 and matmul._tile(13, 64, 16) == 13 and matmul._tile(1, 4) == 1


@pytest.mark.parametrize("tokens", [197, 13, 1, 65])
@pytest.mark.parametrize("batch", [1, 12])
@pytest.mark.parametrize(("transpose_a", "transpose_b"), [(False, False), (False, True), (True, False), (True, True)])
def test_batch_matmul_of_attention_sizes_matches_numpy(tokens: int, batch: int, transpose_a: bool,
                                                      transpose_b: bool) -> None:
    for m, k, n in ((tokens, 64, tokens), (tokens, tokens, 64)):  # Q·Kᵀ and attention·V of one head each
        x = rand(batch, *((k, m) if transpose_a else (m, k)))
        y = rand(batch, *((n, k) if transpose_b else (k, n)))
        check_build("nn.batch_matmul", x, y, rtol=1e-4, atol=1e-4, transpose_a=transpose_a, transpose_b=transpose_b)


@pytest.mark.parametrize(("m", "k", "n"), [(197, 768, 197), (197, 40, 65), (13, 8, 200), (65, 16, 40)])
def test_products_with_row_and_column_tails_match_numpy(m: int, k: int, n: int) -> None:
    check_build("nn.dense", rand(m, k), rand(n, k), rtol=1e-4, atol=1e-4)
    check_build("nn.dense", rand(m, k).astype("float64"), rand(n, k).astype("float64"), rtol=1e-11)
    check_build("nn.matmul", rand(2, m, k), rand(k, n), rtol=1e-4, atol=1e-4)
    check_build("nn.matmul", rand(m, k).astype("float64"), rand(k, n).astype("float64"), rtol=1e-11)


def _vit_scores(tokens: int) -> Any:
    """Q·Kᵀ / 8 of ViT's attention as its ONNX graph gives it: Kᵀ a tensor of its own, (1, 12, 64, tokens)."""
    from kiln import relay

    q, kt = relay.var("q", shape=(1, 12, tokens, 64)), relay.var("kt", shape=(1, 12, 64, tokens))
    return relay.Function([q, kt], relay.divide(nn.matmul(q, kt), relay.const(8.0)))


@pytest.mark.parametrize("tokens", [197, 65, 13])
def test_a_product_with_a_column_tail_and_an_epilogue_matches_numpy(tokens: int) -> None:
    from kiln.relay.backend.build_module import build

    q, kt = rand(1, 12, tokens, 64), rand(1, 12, 64, tokens)
    got = build(_vit_scores(tokens)).create_executor()(q=q, kt=kt)
    np.testing.assert_allclose(np.asarray(got.numpy() if hasattr(got, "numpy") else got), q @ kt / 8.0,
                               rtol=1e-4, atol=1e-5)


def _optimized_tir(func: Any) -> str:
    """The loop IR of `func` lowered as one primitive function, through the whole TIR pipeline (whose last
    step is the bounds check)."""
    from kiln import relay, te
    from kiln.relay.backend.te_compiler import _Lowerer
    from kiln.target import Target
    from kiln.tir.pipeline import optimize_tir

    func = relay.infer_type(func)
    assert isinstance(func, relay.Function)
    sch, inputs, outs = _Lowerer(func, Target("llvm")).run()
    return str(optimize_tir(te.lower(sch, [*inputs, *outs])))


def test_the_main_tiles_of_a_column_tail_carry_no_guard() -> None:
    text = _optimized_tir(_vit_scores(197))
    # 4x64 tiles of sums over b padded to 256 columns; loop partitioning took every guard out: the
    # main tiles are whole 64-lane rows, the tail (5 columns) one 16-lane vector per row
    assert "matmul_padded_b = allocate((1, 12, 64, 256)" in text and "matmul_wide = allocate((1, 1, 4, 64)" in text
    assert "if " not in text and "min(" not in text
    assert "for i3_outer in range(3):" in text and "in range(16):  # vectorized" in text
    assert text.index("# parallel", text.index("matmul_padded_b[")) < text.index("matmul_wide = allocate")


def test_a_product_with_b_given_as_nk_and_a_short_k_reads_b_transposed() -> None:
    from kiln import relay

    def scores(rows: int, k: int) -> Any:
        q, key = relay.var("q", shape=(12, rows, k)), relay.var("k", shape=(12, 197, k))
        return relay.Function([q, key], nn.batch_matmul(q, key))  # transpose_b: K is (12, 197, k)

    # K = 64 <= 4 M: the outer form over b transposed (and padded to 4 x 64 columns), no horizontal sums
    text = _optimized_tir(scores(197, 64))
    assert "matmul_padded_b = allocate((12, 64, 256)" in text and "matmul_partial" not in text
    # K = 64 > 4 M (one row per head): the copy would cost more than the sums, the inner form stays
    text = _optimized_tir(scores(1, 64))
    assert "matmul_partial" in text and "padded_b" not in text


@pytest.mark.parametrize(("dtype", "stall"), [("float16", 2048), ("bfloat16", 256)])
@pytest.mark.parametrize("op", ["nn.dense", "nn.matmul", "nn.conv2d"])
def test_narrow_float_products_sum_in_float32(op: str, dtype: str, stall: int) -> None:
    """4608 ones sum to 4608 on llvm: summed in float16 (bfloat16) they would stop at 2048 (256), where
    adding 1 no longer changes the sum; torch and cuBLAS sum narrow products in float32 too."""
    from op_helpers import compile_op

    from kiln.runtime.module import numpy_dtype

    one = np.ones(1, numpy_dtype(dtype))
    a, b = {"nn.dense": ((2, 4608), (3, 4608)), "nn.matmul": ((2, 4608), (4608, 3)),
            "nn.conv2d": ((1, 512, 3, 3), (2, 512, 3, 3))}[op]
    x, w = np.broadcast_to(one, a).copy(), np.broadcast_to(one, b).copy()
    (got,) = compile_op(op, x, w, target="llvm")(x, w)
    assert got.dtype == one.dtype and stall < 4608
    np.testing.assert_array_equal(got.astype(np.float32), np.full(got.shape, 4608, np.float32))
