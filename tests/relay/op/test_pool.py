"""The pools of kiln.relay.op.pool (nn.max_pool2d, nn.avg_pool2d, the global pools), compiled.

Their relations and references are tested in test_conv.py; here each op goes
through the lowering path and must agree with its numpy reference over a grid
of windows, strides, paddings, dilations, ceil_mode, divisor rules and layouts.
"""

from __future__ import annotations

import numpy as np
import pytest
from op_helpers import check_build, rand

from kiln.relay.op import nn, pool


def _ints(*shape: int) -> np.ndarray:
    return np.random.default_rng(3).integers(-50, 50, shape).astype("int32")


def test_the_constructors_are_those_of_relay_nn() -> None:
    for name in ["max_pool2d", "avg_pool2d", "global_avg_pool2d", "global_max_pool2d"]:
        assert getattr(nn, name) is getattr(pool, name)


WINDOWS = [
    {"pool_size": 1},
    {"pool_size": 2, "strides": 2},
    {"pool_size": 3, "strides": 2, "padding": 1},
    {"pool_size": 3, "strides": 2, "padding": 1, "ceil_mode": True},
    {"pool_size": (2, 3), "strides": (1, 2), "padding": (0, 1, 1, 2)},
    {"pool_size": 2, "strides": 3, "ceil_mode": True},
    {"pool_size": 2, "dilation": 2, "padding": 1},
    {"pool_size": 3, "strides": 2, "dilation": (2, 1), "padding": 1, "ceil_mode": True},
]


@pytest.mark.parametrize("kw", WINDOWS)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_max_pool2d_builds(kw, layout) -> None:
    shape = (2, 3, 7, 8) if layout == "NCHW" else (2, 7, 8, 3)
    check_build("nn.max_pool2d", rand(*shape), layout=layout, **kw)


@pytest.mark.parametrize("kw", WINDOWS)
@pytest.mark.parametrize("count_include_pad", [False, True])
def test_avg_pool2d_builds(kw, count_include_pad) -> None:
    check_build("nn.avg_pool2d", rand(2, 3, 7, 8), rtol=1e-5, atol=1e-6, count_include_pad=count_include_pad, **kw)


@pytest.mark.parametrize("count_include_pad", [False, True])
def test_avg_pool2d_builds_nhwc(count_include_pad) -> None:
    check_build("nn.avg_pool2d", rand(1, 7, 7, 4), rtol=1e-5, atol=1e-6, pool_size=3, strides=2, padding=1,
                ceil_mode=True, count_include_pad=count_include_pad, layout="NHWC")


@pytest.mark.parametrize("op", ["nn.max_pool2d", "nn.avg_pool2d"])
def test_pools_build_for_integers(op) -> None:
    check_build(op, _ints(1, 2, 7, 7), pool_size=3, strides=2, padding=1, ceil_mode=True)


def test_pools_build_for_a_larger_image() -> None:
    check_build("nn.max_pool2d", rand(1, 16, 32, 32), pool_size=3, strides=2, padding=1)
    check_build("nn.avg_pool2d", rand(1, 16, 32, 32), rtol=1e-5, atol=1e-6, pool_size=2, strides=2)


@pytest.mark.parametrize("op", ["nn.global_avg_pool2d", "nn.global_max_pool2d"])
@pytest.mark.parametrize(("shape", "layout"), [((2, 3, 5, 6), "NCHW"), ((2, 5, 6, 3), "NHWC"), ((1, 4, 1, 1), "NCHW")])
def test_global_pools_build(op, shape, layout) -> None:
    check_build(op, rand(*shape), rtol=1e-5, atol=1e-6, layout=layout)


@pytest.mark.parametrize("op", ["nn.global_avg_pool2d", "nn.global_max_pool2d"])
def test_global_pools_build_for_integers(op) -> None:
    check_build(op, _ints(2, 3, 5, 5))


@pytest.mark.parametrize(("pool_size", "unrolled"), [(3, True), (7, True), (8, False)])
def test_small_windows_are_unrolled_inside_the_row_loop(pool_size: int, unrolled: bool) -> None:
    from kiln import relay

    x = relay.var("x", shape=(1, 4, 19, 19))
    lib = relay.build(relay.Function([x], relay.nn.max_pool2d(x, pool_size=pool_size, strides=2)))
    loops = str(lib.kernels[0].func)
    assert ("for ry" not in loops and "for rx" not in loops) == unrolled, loops
    data = rand(1, 4, 19, 19)
    windows = np.lib.stride_tricks.sliding_window_view(data, (pool_size, pool_size), axis=(2, 3))[:, :, ::2, ::2]
    np.testing.assert_array_equal(lib.create_executor()(x=data), windows.max(axis=(-2, -1)))


def _nan_input(*shape: int) -> np.ndarray:
    data = rand(*shape)
    flat = data.reshape(-1)
    flat[np.random.default_rng(4).choice(flat.size, max(1, flat.size // 40), replace=False)] = np.nan
    return data


# Rows of 16 outputs or more (the taps along the row, vectorized, with a tail), short rows without padding
# (the flat form along each channel plane), and short rows with padding or overhang (the taps again).
FORMS = [
    ((1, 3, 41, 39), {"pool_size": 3, "strides": 2, "ceil_mode": True}),
    ((1, 2, 40, 38), {"pool_size": 3, "strides": 2, "ceil_mode": True}),
    ((1, 3, 37, 37), {"pool_size": 3, "strides": 2, "padding": 1}),
    ((1, 5, 27, 27), {"pool_size": 3, "strides": 2, "ceil_mode": True}),
    ((2, 3, 13, 11), {"pool_size": 3, "strides": 2}),
    ((1, 3, 12, 14), {"pool_size": (2, 3), "strides": (1, 2), "dilation": (2, 1)}),
    ((1, 2, 9, 9), {"pool_size": 3, "strides": 2, "ceil_mode": True, "padding": 1}),
    ((1, 2, 10, 10), {"pool_size": 3, "strides": 2, "ceil_mode": True}),
    ((1, 4, 7, 7), {"pool_size": 7}),
]


@pytest.mark.parametrize(("shape", "kw"), FORMS)
def test_max_pool2d_forms_agree_with_the_reference(shape, kw) -> None:
    check_build("nn.max_pool2d", rand(*shape), **kw)


@pytest.mark.parametrize(("shape", "kw"), FORMS)
def test_max_pool2d_propagates_nan_in_every_form(shape, kw) -> None:
    from kiln import relay

    data = _nan_input(*shape)
    x = relay.var("x", shape=shape)
    got = relay.build(relay.Function([x], relay.nn.max_pool2d(x, **kw))).create_executor()(x=data)
    want = pool._max_pool2d_ref(pool.MaxPool2DAttrs.make("nn.max_pool2d", **kw), data)
    assert np.isnan(want).any()
    np.testing.assert_array_equal(got, want)  # NaN where the reference has NaN, equal elsewhere


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_max_pool2d_of_infinities_and_nan(layout) -> None:
    data = np.full((1, 2, 9, 9), -np.inf, "float32")
    data[0, 0, 4, 4], data[0, 1, 0, 0], data[0, 1, 8, 8] = np.inf, np.nan, 1.0
    if layout == "NHWC":
        data = data.transpose(0, 2, 3, 1).copy()
    check_build("nn.max_pool2d", data, pool_size=3, strides=2, padding=1, ceil_mode=True, layout=layout)


@pytest.mark.parametrize("shape", [(1, 3, 27, 27), (1, 3, 41, 41)])
def test_max_pool2d_fused_with_elementwise_ops(shape) -> None:
    """The pool's stages stay placed when relu reads the pool, when the pool reads relu, and when the
    pool is an output beside a relu of it."""
    from kiln import relay

    kw = {"pool_size": 3, "strides": 2, "ceil_mode": True}
    data = _nan_input(*shape)
    x = relay.var("x", shape=shape)
    p = relay.nn.max_pool2d(x, **kw)

    def ref(d: np.ndarray) -> np.ndarray:
        return pool._max_pool2d_ref(pool.MaxPool2DAttrs.make("nn.max_pool2d", **kw), d)

    def relu(d: np.ndarray) -> np.ndarray:
        return np.where(np.isnan(d), d, np.maximum(d, 0))

    def run(f):
        return relay.build(f).create_executor()(x=data)

    np.testing.assert_array_equal(run(relay.Function([x], relay.nn.relu(p))), relu(ref(data)))
    np.testing.assert_array_equal(run(relay.Function([x], relay.nn.max_pool2d(relay.nn.relu(x), **kw))),
                                  ref(relu(data)))
    both = run(relay.Function([x], relay.Tuple([p, relay.nn.relu(p)])))
    np.testing.assert_array_equal(both[0], ref(data))
    np.testing.assert_array_equal(both[1], relu(ref(data)))
