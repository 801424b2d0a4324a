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
