"""Convolutions and pools with a symbolic batch dim: compiled once, run at any batch size.

Each function is built once with an input of shape ("n", C, H, W) (C, H and W
static: the tiles are chosen for them) and run at several batch sizes against
the relay reference interpreter, which evaluates the same function on the
static inputs. Every CPU form of nn.conv2d ("stem", "ovec" with a weight packed
per run or at build time, "pixels", "depthwise", the row-vectorized fallback,
the direct compute of grouped and NHWC convolutions) and every pool is covered.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from kiln import relay, te
from kiln.relay.backend.te_compiler import LoweringError, _Lowerer
from kiln.target import Target

BATCHES = (1, 2, 7)
_rng = np.random.default_rng(18)


def _rand(*shape: int) -> np.ndarray:
    return _rng.standard_normal(shape).astype("float32")


def _const(*shape: int) -> relay.Constant:
    return relay.const(_rand(*shape) * 0.3)


def _check_any_batch(func: relay.Function, batches: tuple[int, ...] = BATCHES,
                     params: dict[str, np.ndarray] | None = None) -> Any:
    """Builds `func` once and checks every batch size against the reference interpreter; returns the library.

    Parameters whose first dim is "n" get random inputs of each batch size; the others take `params`.
    """
    lib = relay.build(func)
    kernels = len(lib.kernels)
    run = lib.create_executor()
    reference = relay.create_executor("debug", relay.IRModule.from_expr(func)).evaluate()
    for n in batches:
        values = {p.name_hint: _rand(n, *(int(d) for d in p.type_annotation.shape[1:]))
                  if str(p.type_annotation.shape[0]) == "n" else (params or {})[p.name_hint] for p in func.params}
        got = run(**values)
        want = reference(*values.values())
        pairs = list(zip(got, want, strict=True)) if isinstance(want, (list, tuple)) else [(got, want)]
        for g, w in pairs:
            assert np.asarray(g).shape[0] == n
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-4, atol=1e-4)
    assert len(lib.kernels) == kernels  # no kernel was compiled for a batch size
    return lib


def _lowered(func: relay.Function) -> str:
    """The loop IR of `func` lowered as one primitive function (as lowering does, in a size_vars scope)."""
    with te.size_vars():
        sch, inputs, outs = _Lowerer(relay.infer_type(func), Target("llvm")).run()
        return str(te.lower(sch, [*inputs, *outs]))


def _conv(c: int, hw: tuple[int, int], w_shape: tuple[int, ...], constant: bool = True, epilogue: bool = False,
          batch: int | str = "n", **kw: Any) -> tuple[relay.Function, dict[str, np.ndarray]]:
    layout = kw.get("data_layout", "NCHW")
    x = relay.var("x", shape=(batch, c, *hw) if layout == "NCHW" else (batch, *hw, c))
    params: dict[str, np.ndarray] = {}
    if constant:
        w: relay.Expr = _const(*w_shape)
        args = [x]
    else:
        w = relay.var("w", shape=w_shape)
        params["w"] = _rand(*w_shape) * 0.3
        args = [x, w]
    y = relay.nn.conv2d(x, w, **kw)
    if epilogue:
        o = int(relay.infer_type(relay.Function(args, y)).body.checked_type.shape[1])
        y = relay.nn.relu(relay.nn.bias_add(y, _const(o)))
    return relay.Function(args, y), params


# (name, data channels, data (H, W), weight shape, weight constant, bias+relu epilogue, conv2d attrs, the
# allocation that marks the form in the loop IR, or None)
CONV_CASES = [
    ("stem", 3, (16, 16), (16, 3, 3, 3), True, True, {"padding": 1}, "conv2d_stem"),
    ("ovec_packed_per_run", 8, (14, 14), (32, 8, 3, 3), False, True, {"padding": 1}, "weight_packed"),
    ("ovec_packed_at_build", 6, (17, 19), (48, 6, 3, 3), True, False, {"strides": 2, "padding": 1},
     "conv2d_blocked"),
    ("ovec_channel_tail", 5, (13, 11), (20, 5, 3, 3), False, False, {"padding": (1, 0, 2, 1)}, "conv2d_blocked"),
    ("ovec_panels", 8, (4, 4), (512, 8, 3, 3), False, False, {"padding": 1}, "weight_packed"),  # tiles on the cores
    ("ovec_zero_padded_channels", 4, (9, 9), (72, 4, 3, 3), True, True, {"padding": 1}, None),  # sliced off
    ("pixels", 16, (5, 32), (24, 16, 1, 1), True, True, {}, "conv2d_pixels"),
    ("depthwise", 8, (16, 16), (8, 1, 3, 3), True, True, {"padding": 1, "groups": 8}, "conv2d_depthwise"),
    ("depthwise_phase_strips", 2, (33, 33), (2, 1, 3, 3), True, False, {"strides": 2, "padding": 1, "groups": 2},
     "pad_phases"),
    ("depthwise_channel_groups", 32, (7, 7), (32, 1, 3, 3), True, False, {"padding": 1, "groups": 32},
     "conv2d_depthwise"),
    ("rows_fallback", 4, (9, 9), (72, 4, 3, 3), False, True, {"padding": 1}, None),
    ("direct_grouped", 8, (8, 8), (8, 2, 3, 3), True, False, {"padding": 1, "groups": 4}, None),
    ("direct_nhwc", 4, (8, 8), (3, 3, 4, 20), True, False, {"padding": 1, "data_layout": "NHWC"}, None),
]


@pytest.mark.parametrize(("name", "c", "hw", "w_shape", "constant", "epilogue", "kw", "form"), CONV_CASES,
                         ids=[case[0] for case in CONV_CASES])
def test_conv2d_with_a_symbolic_batch_runs_every_batch(name, c, hw, w_shape, constant, epilogue, kw, form) -> None:
    func, params = _conv(c, hw, w_shape, constant, epilogue, **kw)
    if form is not None:  # the form the static shape gets is the one the symbolic batch gets
        assert f"{form} = allocate" in _lowered(func)
    _check_any_batch(func, params=params)


def test_conv2d_transpose_with_a_symbolic_batch_runs_every_batch() -> None:
    x = relay.var("x", shape=("n", 4, 6, 5))
    y = relay.nn.conv2d_transpose(x, _const(4, 3, 3, 3), strides=2, padding=1, output_padding=1)
    _check_any_batch(relay.Function([x], y))


POOL_CASES = [
    ("max_taps", lambda x: relay.nn.max_pool2d(x, pool_size=3, strides=2, padding=1), (8, 33, 33)),
    ("max_flat", lambda x: relay.nn.max_pool2d(x, pool_size=2, strides=2), (8, 12, 12)),
    ("max_reduce", lambda x: relay.nn.max_pool2d(x, pool_size=8, strides=1), (3, 10, 10)),
    ("avg", lambda x: relay.nn.avg_pool2d(x, pool_size=3, strides=2, padding=1), (4, 11, 11)),
    ("avg_count_pad_ceil", lambda x: relay.nn.avg_pool2d(x, pool_size=3, strides=2, padding=1, ceil_mode=True,
                                                           count_include_pad=True), (4, 10, 10)),
    ("global_avg", relay.nn.global_avg_pool2d, (16, 7, 7)),
    ("global_max", relay.nn.global_max_pool2d, (16, 5, 6)),
    ("argmax", lambda x: relay.nn.max_pool2d_argmax(x, pool_size=2, strides=2), (3, 8, 8)),
]


@pytest.mark.parametrize(("name", "pool", "chw"), POOL_CASES, ids=[case[0] for case in POOL_CASES])
def test_pools_with_a_symbolic_batch_run_every_batch(name, pool, chw) -> None:
    x = relay.var("x", shape=("n", *chw))
    _check_any_batch(relay.Function([x], pool(x)))


def test_nhwc_pools_with_a_symbolic_batch_run_every_batch() -> None:
    x = relay.var("x", shape=("n", 9, 9, 5))
    y = relay.Tuple([relay.nn.max_pool2d(x, pool_size=3, strides=2, padding=1, layout="NHWC"),
                     relay.nn.global_avg_pool2d(x, layout="NHWC")])
    _check_any_batch(relay.Function([x], y))


def test_resize_and_grid_sample_with_a_symbolic_batch_run_every_batch() -> None:
    x = relay.var("x", shape=("n", 3, 5, 6))
    grid = relay.var("grid", shape=("n", 4, 3, 2))
    y = relay.Tuple([relay.image.resize(x, (10, 9), (2, 3), method="linear"),
                     relay.image.grid_sample(x, relay.tanh(grid))])
    _check_any_batch(relay.Function([x, grid], y))


@pytest.mark.parametrize("op", [
    lambda x: relay.nn.conv2d(x, _const(8, 3, 3, 3), padding=1),
    lambda x: relay.nn.max_pool2d(x, pool_size=3, padding=1),
])
def test_a_symbolic_spatial_dim_is_refused_naming_the_op(op) -> None:
    x = relay.var("x", shape=("n", 3, "h", 8))
    with pytest.raises(LoweringError, match=r"op nn\.(conv2d|max_pool2d).*needs static shapes"):
        relay.build(relay.Function([x], op(x)))


def _small_cnn(x: relay.Var) -> relay.Expr:
    """conv3x3 + bias + relu, max pool, conv3x3 + relu, global average pool."""
    y = relay.nn.relu(relay.nn.bias_add(relay.nn.conv2d(x, _const(16, 3, 3, 3), padding=1), _const(16)))
    y = relay.nn.max_pool2d(y, pool_size=2, strides=2)
    y = relay.nn.relu(relay.nn.conv2d(y, _const(32, 16, 3, 3), padding=1))
    return relay.nn.global_avg_pool2d(y)


def test_a_cnn_compiled_once_with_a_symbolic_batch_runs_batch_1_2_7_64() -> None:
    x = relay.var("x", shape=("n", 3, 16, 16))
    lib = _check_any_batch(relay.Function([x], _small_cnn(x)), batches=(1, 2, 7, 64, 2))
    assert lib.graph.symbols


def test_a_cnn_with_a_classifier_compiled_once_runs_batch_1_2_7_64() -> None:
    x = relay.var("x", shape=("n", 3, 16, 16))
    y = relay.nn.bias_add(relay.nn.dense(relay.nn.batch_flatten(_small_cnn(x)), _const(10, 32)), _const(10))
    z = relay.nn.dense(relay.reshape(_small_cnn(x), (-1, 32)), _const(5, 32))
    _check_any_batch(relay.Function([x], relay.Tuple([y, z])), batches=(1, 2, 7, 64))
