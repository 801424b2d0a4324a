"""The tiled CPU implementations of dense/matmul/batch_matmul and conv2d.

Each is checked against numpy over shapes that exercise its tile choices (tails
that force smaller tiles, a reduction length that is not a multiple of the
vector width, strides and dilations), alone and with a fused epilogue built
through relay.build, and against the generic implementation forced by label.
"""

from __future__ import annotations

import numpy as np
import pytest
from op_helpers import build_op, check_build, rand

from kiln import registry, relay, te
from kiln.ir.transform import PassContext
from kiln.registry import register_implementation
from kiln.relay.backend.build_module import build
from kiln.relay.backend.strategy import select_implementation
from kiln.relay.backend.te_compiler import _Lowerer
from kiln.relay.op._schedule import schedule_generic
from kiln.relay.op.conv import _conv2d_compute
from kiln.target import Target
from kiln.testing import models

RNG = np.random.default_rng(5)


@pytest.mark.parametrize("op", ["nn.dense", "nn.matmul", "nn.batch_matmul", "nn.conv2d"])
def test_the_tiled_implementation_is_chosen_for_float_on_llvm(op) -> None:
    assert select_implementation(op, "llvm", ["float32", "float32"]).name == "tiled"
    assert select_implementation(op, "llvm", ["float64", "float64"]).name == "tiled"
    assert select_implementation(op, "llvm", ["int8", "int8"]).name == "generic"


# --- products -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("m", "k", "n"), [
    (64, 784, 512),  # the MLP's first layer: 4x4 tiles, K in 16-lane steps
    (7, 40, 13),  # prime M and N: 1-wide row tiles; K in 8-lane steps
    (6, 7, 10),  # K not a multiple of 4: the padded, clamped last step
    (1, 32, 10),  # one row
    (12, 36, 9),  # K a multiple of 4 only
])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_dense_tiled_matches_numpy(m, k, n, dtype) -> None:
    tol = 1e-4 if dtype == "float32" else 1e-11
    check_build("nn.dense", rand(m, k, dtype=dtype), rand(n, k, dtype=dtype), rtol=tol, atol=tol)


@pytest.mark.parametrize(("transpose_a", "transpose_b"), [(False, False), (False, True), (True, False), (True, True)])
@pytest.mark.parametrize(("m", "k", "n"), [(20, 33, 70), (5, 64, 128), (9, 3, 17)])
def test_matmul_tiled_matches_numpy(transpose_a, transpose_b, m, k, n) -> None:
    a = rand(*((k, m) if transpose_a else (m, k)))
    b = rand(*((n, k) if transpose_b else (k, n)))
    check_build("nn.matmul", a, b, rtol=1e-4, atol=1e-4, transpose_a=transpose_a, transpose_b=transpose_b)


@pytest.mark.parametrize("transpose_b", [False, True])
def test_batch_matmul_tiled_broadcasts_the_batch(transpose_b) -> None:
    x = rand(1, 12, 24)
    y = rand(3, *((20, 24) if transpose_b else (24, 20)))
    check_build("nn.batch_matmul", x, y, rtol=1e-4, atol=1e-4, transpose_b=transpose_b)


def _lowered(func: relay.Function) -> str:
    """The loop IR of `func` lowered as one primitive function."""
    sch, inputs, outs = _Lowerer(relay.infer_type(func), Target("llvm")).run()
    return str(te.lower(sch, [*inputs, *outs]))


def test_dense_epilogue_is_computed_on_the_tile_in_registers() -> None:
    x, w, b = relay.var("x", shape=(8, 256)), relay.var("w", shape=(16, 256)), relay.var("b", shape=(16,))
    text = _lowered(relay.Function([x, w, b], relay.nn.relu(relay.nn.bias_add(relay.nn.dense(x, w), b))))
    # the product's 4x4 tile is allocated per tile, inside the parallel loop over column tiles
    assert "dense_partial = allocate((4, 4, 16)" in text and "dense = allocate((4, 4)" in text
    assert text.index("# parallel") < text.index("dense_partial = allocate")


def test_small_products_and_reductions_run_on_one_core() -> None:
    x, w = relay.var("x", shape=(8, 32)), relay.var("w", shape=(16, 32))  # 4096 multiply-adds
    assert "# parallel" not in _lowered(relay.Function([x, w], relay.nn.dense(x, w)))
    y = relay.var("y", shape=(16, 64))  # 1024 elements summed
    assert "# parallel" not in _lowered(relay.Function([y], relay.sum(y, axis=1)))
    z = relay.var("z", shape=(64, 1024))
    assert "# parallel" in _lowered(relay.Function([z], relay.sum(z, axis=1)))


@pytest.mark.parametrize("epilogue", ["bias_relu", "none", "two_outputs"])
@pytest.mark.parametrize("transpose_b", [True, False])
def test_product_with_fused_epilogue_through_relay_build(epilogue, transpose_b) -> None:
    m, k, n = 24, 48, 40
    x = relay.var("x", shape=(m, k))
    w = relay.var("w", shape=(n, k) if transpose_b else (k, n))
    b = relay.var("b", shape=(n,))
    y = relay.nn.matmul(x, w, transpose_b=transpose_b)
    xv, wv, bv = rand(m, k), rand(*((n, k) if transpose_b else (k, n))), rand(n)
    yv = xv @ (wv.T if transpose_b else wv)
    if epilogue == "bias_relu":
        out, want = relay.nn.relu(relay.nn.bias_add(y, b)), [np.maximum(yv + bv, 0)]
    elif epilogue == "none":
        out, want = y, [yv]
    else:
        out, want = relay.Tuple([y, relay.exp(relay.nn.bias_add(y, b))]), [yv, np.exp(yv + bv)]
    ex = build(relay.Function([x, w, b], out)).create_executor()
    got = ex(x=xv, w=wv, b=bv)
    for g, e in zip(got if isinstance(got, (list, tuple)) else [got], want, strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-4)


# --- conv2d ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("x_shape", "w_shape", "kw"), [
    ((1, 3, 34, 32), (16, 3, 3, 3), {"padding": 1}),  # 8x32 tiles
    ((2, 5, 9, 20), (6, 5, 3, 3), {"padding": (1, 0, 2, 1)}),  # tails: 6 channels, 20 columns
    ((1, 4, 17, 17), (12, 4, 3, 3), {"strides": 2, "padding": 1}),
    ((1, 2, 16, 16), (4, 2, 3, 3), {"dilation": 2, "padding": 2}),
    ((1, 3, 10, 12), (7, 3, 1, 1), {}),  # no padding: no pad stage
    ((1, 8, 7, 7), (5, 8, 5, 3), {"padding": (2, 1, 2, 1), "strides": (1, 2)}),
])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_conv2d_tiled_matches_numpy(x_shape, w_shape, kw, dtype) -> None:
    tol = 1e-4 if dtype == "float32" else 1e-11
    check_build("nn.conv2d", rand(*x_shape, dtype=dtype), rand(*w_shape, dtype=dtype), rtol=tol, atol=tol, **kw)


def test_conv2d_grouped_and_nhwc_fall_back_to_the_direct_compute() -> None:
    check_build("nn.conv2d", rand(1, 4, 8, 8), rand(4, 2, 3, 3), groups=2, padding=1, rtol=1e-4, atol=1e-4)
    check_build("nn.conv2d", rand(1, 8, 8, 4), rand(3, 3, 4, 6), data_layout="NHWC", padding=1,
                rtol=1e-4, atol=1e-4)


def test_conv2d_tiled_agrees_with_the_generic_implementation() -> None:
    x, w = rand(1, 6, 20, 24), rand(10, 6, 3, 3)
    tiled = build_op("nn.conv2d", x, w, padding=1)[0]
    with registry.scope():
        register_implementation("nn.conv2d", _conv2d_compute, schedule_generic, name="direct", label="direct",
                                priority=-1)
        with PassContext(config={"relay.backend.use_label": {"nn.conv2d": "direct"}}):
            direct = build_op("nn.conv2d", x, w, padding=1)[0]
    np.testing.assert_allclose(tiled, direct, rtol=1e-5, atol=1e-5)


def test_conv_bias_relu_runs_as_one_kernel_with_the_input_padded_once() -> None:
    # 8 input channels: "ovec" (3 would take the "stem" form, which pads the input per row of outputs)
    x, w, b = relay.var("x", shape=(1, 8, 32, 32)), relay.var("w", shape=(8, 8, 3, 3)), relay.var("b", shape=(8,))
    func = relay.Function([x, w, b], relay.nn.relu(relay.nn.bias_add(relay.nn.conv2d(x, w, padding=1), b)))
    text = _lowered(func)
    assert "pad = allocate((1, 8, 34, 34)" in text and "select" not in text.split("conv2d_blocked = allocate")[1]
    lib = build(func)
    assert len(lib.kernels) == 1
    xv, wv, bv = rand(1, 8, 32, 32), rand(8, 8, 3, 3), rand(8)
    got = lib.create_executor()(x=xv, w=wv, b=bv)
    want = np.maximum(models.conv3x3_numpy(xv, wv) + bv[:, None, None], 0)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)



@pytest.mark.parametrize("transpose_b", [False, True])
def test_large_products_pack_their_operands_and_match_numpy(transpose_b) -> None:
    m, k, n = 256, 1024, 256  # 2^26 multiply-adds: the packed form
    x, w = relay.var("x", shape=(m, k)), relay.var("w", shape=(n, k) if transpose_b else (k, n))
    func = relay.Function([x, w], relay.nn.relu(relay.nn.matmul(x, w, transpose_b=transpose_b)))
    text = _lowered(func)
    assert "matmul_packed_a = allocate((64, 1024, 4)" in text and "matmul_packed_b = allocate((4, 1024, 64)" in text
    xv, wv = rand(m, k), rand(*((n, k) if transpose_b else (k, n)))
    got = build(func).create_executor()(x=xv, w=wv)
    np.testing.assert_allclose(got, np.maximum(xv @ (wv.T if transpose_b else wv), 0), rtol=1e-4, atol=1e-3)
