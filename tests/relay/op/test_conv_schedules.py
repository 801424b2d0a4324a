"""The register-tiled CPU forms of nn.conv2d (`kiln.relay.op.conv_schedules`), against numpy.

Shapes exercise the tile choices and their padding: output channels that are
not a multiple of the vector width (a zero weight block), widths that are not
a multiple of the tile, strides, dilations, asymmetric padding, kernels 1 to 7,
batch 2, depthwise channel multipliers, odd rows under a column stride, the
depthwise planes made in strips and for groups of channels; alone and with
fused epilogues (bias, relu, residual add, clip, SiLU), with the weight packed
on every run (a parameter) and packed at build time (a constant, through
AlterOpLayout).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest
from op_helpers import check_build, rand, ref

from kiln import relay, te
from kiln.ir.transform import PassContext, Sequential
from kiln.registry import Op
from kiln.relay import transform
from kiln.relay.backend.build_module import build
from kiln.relay.backend.te_compiler import _Lowerer
from kiln.relay.op.conv_schedules import depthwise_blocking, depthwise_tiles, ovec_tiles, pixel_tiles, stem_tiles
from kiln.relay.visitor import post_order
from kiln.target import Target
from kiln.tir.pipeline import optimize_tir


def _lowered(func: relay.Function) -> str:
    """The loop IR of `func` lowered as one primitive function."""
    sch, inputs, outs = _Lowerer(relay.infer_type(func), Target("llvm")).run()
    return str(te.lower(sch, [*inputs, *outs]))


def _conv_func(x_shape: tuple[int, ...], w_shape: tuple[int, ...], **kw: Any) -> relay.Function:
    x, w = relay.var("x", shape=x_shape), relay.var("w", shape=w_shape)
    return relay.Function([x, w], relay.nn.conv2d(x, w, **kw))


# --- "ovec": vectorized over output channels ------------------------------------------------------

OVEC_CASES = [
    ((1, 8, 14, 14), (32, 8, 3, 3), {"padding": 1}),
    ((2, 5, 13, 11), (20, 5, 3, 3), {"padding": (1, 0, 2, 1)}),  # 20 channels: a zero-padded block; odd widths
    ((1, 6, 17, 19), (48, 6, 3, 3), {"strides": 2, "padding": 1}),  # 3 blocks in one tile
    ((1, 3, 30, 30), (16, 3, 7, 7), {"strides": 2, "padding": 3}),  # the stem's shape, small
    ((1, 4, 12, 12), (16, 4, 5, 5), {"dilation": 2, "padding": (4, 3, 2, 1)}),
    ((2, 24, 9, 9), (64, 24, 1, 1), {}),  # 1x1, no pad stage
    ((1, 16, 10, 9), (80, 16, 1, 1), {"strides": 2}),  # 5 blocks: tiles of one block
    ((1, 7, 8, 10), (8, 7, 2, 3), {"strides": (2, 1), "padding": (0, 2)}),  # fewer channels than a vector
    ((2, 8, 7, 7), (256, 8, 3, 3), {"padding": 1}),  # 16 channel tiles x 2 images: tiles on the cores
]


@pytest.mark.parametrize(("x_shape", "w_shape", "kw"), OVEC_CASES)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_ovec_form_matches_numpy(x_shape, w_shape, kw, dtype) -> None:
    tol = 1e-4 if dtype == "float32" else 1e-11
    check_build("nn.conv2d", rand(*x_shape, dtype=dtype), rand(*w_shape, dtype=dtype), rtol=tol, atol=tol, **kw)


def test_ovec_is_the_form_of_a_convolution_without_groups() -> None:
    text = _lowered(_conv_func((1, 8, 14, 14), (32, 8, 3, 3), padding=1))
    assert "conv2d_blocked = allocate((1, " in text and "weight_packed = allocate((2, 8, 3, 3, 16)" in text
    # the micro-kernel: no guard and no select between the tile's allocation and its write-back
    kernel = text.split("conv2d_blocked = allocate")[1].split("conv2d[")[0]
    assert "if " not in kernel and "select" not in kernel


@pytest.mark.parametrize(("o", "ow", "expected"), [
    (64, 56, (4, 4)),  # no padded columns, 16 accumulators, fewest loads per FMA
    (512, 7, (2, 7)),  # a whole row of 7 (three blocks would not divide 32)
    (48, 17, (1, 17)),  # no padded column beats more channels per tile
    (20, 9, (2, 9)),  # a tail of channels: a tile of both blocks
    (72, 9, None),  # a tail of channels in 5 blocks: no tile covers it
])
def test_ovec_tiles_waste_little_and_use_many_accumulators(o, ow, expected) -> None:
    assert ovec_tiles(o, ow, 16) == expected


def test_channel_tails_beyond_one_tile_fall_back_to_the_row_form() -> None:
    text = _lowered(_conv_func((1, 4, 9, 9), (72, 4, 3, 3), padding=1))
    assert "conv2d_blocked" not in text
    check_build("nn.conv2d", rand(1, 4, 9, 9), rand(72, 4, 3, 3), padding=1, rtol=1e-4, atol=1e-4)


# --- "pixels": 1x1 with few input channels, vectorized along the row -------------------------------

PIXELS_CASES = [
    ((1, 16, 5, 32), (24, 16, 1, 1), {}),  # rows of whole vectors
    ((2, 12, 3, 24), (40, 12, 1, 1), {}),  # a half vector at the end of each row; 40 channels in tiles of 8
    ((1, 8, 2, 120), (7, 8, 1, 1), {}),  # a row in two tiles of 4 vectors, the last one half; 7 channels
]


@pytest.mark.parametrize(("x_shape", "w_shape", "kw"), PIXELS_CASES)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_pixels_form_matches_numpy(x_shape, w_shape, kw, dtype) -> None:
    tol = 1e-4 if dtype == "float32" else 1e-11
    check_build("nn.conv2d", rand(*x_shape, dtype=dtype), rand(*w_shape, dtype=dtype), rtol=tol, atol=tol, **kw)


@pytest.mark.parametrize(("x_shape", "w_shape", "form"), [
    ((1, 16, 5, 32), (24, 16, 1, 1), "conv2d_pixels"),
    ((1, 256, 5, 32), (24, 256, 1, 1), "conv2d_blocked"),  # many input channels: "ovec"
    ((1, 16, 5, 28), (24, 16, 1, 1), "conv2d_blocked"),  # rows ending in 12 lanes: "ovec"
])
def test_pixels_takes_1x1_convolutions_with_few_input_channels(x_shape, w_shape, form) -> None:
    assert f"{form} = allocate" in _lowered(_conv_func(x_shape, w_shape))


@pytest.mark.parametrize(("o", "ow", "expected"), [(96, 56, (6, 4)), (24, 112, (6, 4)), (7, 120, (1, 4))])
def test_pixel_tiles_take_whole_rows_of_up_to_six_vectors(o, ow, expected) -> None:
    assert pixel_tiles(o, ow, 16) == expected


# --- "stem": few input channels, any window, vectorized along the row -----------------------------

STEM_CASES = [
    ((1, 3, 31, 31), (16, 3, 3, 3), {"strides": 2}),  # SqueezeNet's stem, small: no padding, a row of 15
    ((1, 3, 32, 32), (32, 3, 3, 3), {"strides": 2, "padding": 1}),  # MobileNetV2's: tasks of 2 rows
    ((1, 3, 20, 20), (8, 3, 3, 3), {"strides": 2, "padding": 1}),  # tasks of 5 rows (up to 64 // 8, dividing 10)
    ((1, 3, 30, 30), (64, 3, 7, 7), {"strides": 2, "padding": 3}),  # ResNet's
    ((2, 3, 13, 37), (20, 3, 3, 3), {"padding": (1, 0, 2, 1)}),  # 2 images, 20 channels, rows of 3 vectors
    ((1, 2, 17, 19), (8, 2, 5, 5), {"dilation": 2, "padding": 3}),
    ((1, 4, 12, 41), (6, 4, 3, 2), {"strides": (2, 3), "padding": (0, 2)}),  # a column stride of 3
    ((1, 1, 9, 70), (24, 1, 1, 3), {"strides": (1, 2)}),  # one channel, 24 outputs
]


@pytest.mark.parametrize(("x_shape", "w_shape", "kw"), STEM_CASES)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_stem_form_matches_numpy(x_shape, w_shape, kw, dtype) -> None:
    tol = 1e-4 if dtype == "float32" else 1e-11
    check_build("nn.conv2d", rand(*x_shape, dtype=dtype), rand(*w_shape, dtype=dtype), rtol=tol, atol=tol, **kw)


def test_stem_with_a_constant_weight_and_an_epilogue_matches_numpy() -> None:
    """SqueezeNet's stem as it is built: the weight packed by AlterOpLayout, bias and relu fused."""
    x_np, w_np, b_np = rand(1, 3, 35, 35), rand(64, 3, 3, 3), rand(64)
    x = relay.var("x", shape=x_np.shape)
    y = relay.nn.relu(relay.nn.bias_add(relay.nn.conv2d(x, relay.const(w_np), strides=2), relay.const(b_np)))
    lib = build(relay.Function([x], y), target="llvm")
    assert len(lib.kernels) == 1
    got = lib.create_executor()(x=x_np)
    expected = np.maximum(ref("nn.conv2d", x_np, w_np, strides=2) + b_np[:, None, None], 0)
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("x_shape", "w_shape", "form"), [
    ((1, 3, 30, 30), (16, 3, 3, 3), "conv2d_stem"),
    ((1, 8, 30, 30), (16, 8, 3, 3), "conv2d_blocked"),  # more input channels: "ovec"
    ((1, 3, 30, 32), (16, 3, 1, 1), "conv2d_pixels"),  # 1x1: "pixels"
])
def test_stem_takes_windows_over_few_input_channels(x_shape, w_shape, form) -> None:
    assert f"{form} = allocate" in _lowered(_conv_func(x_shape, w_shape, strides=2 if w_shape[2] > 1 else 1))


def test_stem_tile_reads_phase_planes_made_per_row_without_guards() -> None:
    text = _lowered(_conv_func((1, 3, 31, 31), (16, 3, 3, 3), strides=2))
    # the planes are made inside the parallel loop of rows, so the tile indexes them from constants
    assert text.index("# parallel") < text.index("pad_phases = allocate")
    # the tile up to the write-back (whose guard cuts the last vector of a row): no select, no guard
    tile = text.split("conv2d_stem = allocate")[1].split(" if ")[0]
    assert "for rc in range(3)" in tile and "select" not in tile and "conv2d[" not in tile


@pytest.mark.parametrize(("o", "ow", "expected"), [
    (64, 111, (16, 1)),  # SqueezeNet's stem: 7 vectors a row, none padded; 16 accumulators
    (32, 112, (16, 1)),
    (20, 37, (20, 1)),  # a tile of all 20 channels beats 5 x 3 vectors
    (6, 70, (3, 5)),  # few channels: rows of 5 vectors, no vector padded
])
def test_stem_tiles_pad_rows_little_and_use_many_accumulators(o, ow, expected) -> None:
    assert stem_tiles(o, ow, 16) == expected


# --- "depthwise" ----------------------------------------------------------------------------------

DEPTHWISE_CASES = [
    ((1, 24, 20, 20), (24, 1, 3, 3), {"padding": 1, "groups": 24}),  # rows of 20: two vectors, one padded
    ((2, 8, 17, 15), (8, 1, 3, 3), {"strides": 2, "padding": 1, "groups": 8}),  # two phase planes
    ((1, 6, 19, 23), (6, 1, 5, 5), {"strides": 2, "padding": 2, "groups": 6}),
    ((1, 4, 14, 14), (4, 1, 7, 7), {"padding": 3, "groups": 4}),  # ConvNeXt's 7x7: kernel rows stay a loop
    ((1, 4, 11, 12), (8, 1, 3, 3), {"padding": (1, 0, 2, 1), "groups": 4}),  # two outputs per channel
    ((1, 5, 13, 13), (5, 1, 3, 3), {"dilation": 2, "padding": 2, "groups": 5}),
    ((1, 3, 9, 10), (3, 1, 3, 2), {"strides": (1, 3), "groups": 3}),  # no padding, a column stride of 3
    ((1, 3, 7, 13), (3, 1, 3, 3), {"padding": 1, "groups": 3}),  # 7 rows in one tile, a row of 13
    ((1, 2, 57, 57), (2, 1, 3, 3), {"padding": 1, "groups": 2}),  # 57 = 3 tiles of 19 rows, a 4th vector of 9
    ((1, 4, 13, 13), (4, 1, 5, 5), {"padding": 2, "groups": 4}),
    ((1, 3, 57, 57), (3, 1, 5, 5), {"strides": 2, "padding": 2, "groups": 3}),  # an odd row: a partial last run
    ((1, 2, 113, 113), (2, 1, 3, 3), {"strides": 2, "padding": 1, "groups": 2}),  # phase planes in strips of rows
    ((1, 2, 112, 112), (2, 1, 3, 3), {"padding": 1, "groups": 2}),  # MobileNet's first: 2 rows x 7 vectors
    ((2, 32, 7, 7), (32, 1, 3, 3), {"padding": 1, "groups": 32}),  # single tiles: 4 channels a task, 2 images
    ((1, 16, 7, 7), (32, 1, 5, 5), {"padding": 2, "groups": 16}),  # two outputs per channel, in groups
    ((1, 3, 15, 15), (6, 1, 3, 3), {"strides": 2, "padding": 1, "groups": 3}),  # two per channel, phase planes
    ((1, 3, 17, 17), (3, 1, 3, 3), {"strides": 2, "dilation": 2, "padding": 2, "groups": 3}),  # one phase read
    ((1, 4, 9, 9), (4, 1, 1, 1), {"strides": 2, "groups": 4}),  # 1x1 with a stride
    ((1, 4, 10, 10), (4, 1, 3, 3), {"groups": 4}),  # no padding: the rows of 8 read the input as it is
]


@pytest.mark.parametrize(("x_shape", "w_shape", "kw"), DEPTHWISE_CASES)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_depthwise_form_matches_numpy(x_shape, w_shape, kw, dtype) -> None:
    tol = 1e-4 if dtype == "float32" else 1e-11
    check_build("nn.conv2d", rand(*x_shape, dtype=dtype), rand(*w_shape, dtype=dtype), rtol=tol, atol=tol, **kw)


def _depthwise_tir(x_shape: tuple[int, ...], w_shape: tuple[int, ...], **kw: Any) -> str:
    """The optimized loop IR of a depthwise convolution (as codegen sees it)."""
    sch, inputs, outs = _Lowerer(relay.infer_type(_conv_func(x_shape, w_shape, groups=x_shape[1], **kw)),
                                 Target("llvm")).run()
    return str(optimize_tir(te.lower(sch, [*inputs, *outs])))


def test_depthwise_pads_each_channel_with_a_plain_copy_between_loops_of_zeros() -> None:
    text = _depthwise_tir((1, 24, 20, 20), (24, 1, 3, 3), padding=1)
    # per channel (inside the parallel loop), rows of zeros, then rows of: a zero, a vectorized copy, zeros
    assert text.index("# parallel") < text.index("pad = allocate((1, 1, 22, 1, 34)") < text.index("conv2d_depthwise")
    copy = re.search(r"for (q_\d+) in range\(1, 21\):  # vectorized\n\s+pad\[0, 0, y, 0, \1\] = "
                     r"x\[0, b_oc_outer_fused, y - 1, \1 - 1\]", text)
    assert copy is not None, text
    assert "select(" not in text.split("conv2d_depthwise")[0]


def test_depthwise_copies_the_phases_of_a_column_stride_in_one_pass() -> None:
    text = _depthwise_tir((1, 8, 17, 17), (8, 1, 3, 3), strides=2, padding=1)
    pads = text.split("conv2d_depthwise")[0]
    # a strip of 3 output rows (one tile) reads 7 input rows: both phases of them, made per strip
    assert re.search(r"for y_outer in range\(3\):\n\s+pad_phases = allocate\(\(1, 1, 7, 2, 17\)", pads), pads
    # one vectorized loop stores both phases of a run of the row (an interleaved read, no remainder); the
    # padding columns are cut off it (a select stays only for the rows, whose bounds depend on the strip)
    copy = re.search(r"for (q\w*) in range\(1, 9\):  # vectorized\n(?:.*\n){1,2}\s+pad_phases\[0, 0, y, 0, \1\] = "
                     r"(?:.*\n){1,2}\s+pad_phases\[0, 0, y, 1, \1\] = ", pads)
    assert copy is not None, pads
    # the odd row's last run: column 16 in phase 1, a zero in phase 0
    assert "pad_phases[0, 0, y, 0, 9] = 0.0" in pads and re.search(r"x\[0, b_oc_outer_fused, .*, 16\]", pads)


def test_depthwise_makes_phase_planes_a_strip_of_rows_at_a_time() -> None:
    text = _depthwise_tir((1, 2, 112, 112), (2, 1, 3, 3), strides=2, padding=1)
    # 8 output rows (4 tiles of 2) read 17 input rows: their planes are made inside the strip loop
    strip = re.search(r"for (y_outer) in range\(7\):\n\s+pad_phases = allocate\(\(1, 1, 17, 2, 65\)", text)
    assert strip is not None, text
    # stride 1 keeps a channel's whole plane
    assert "pad = allocate((1, 1, 114, 1, 114)" in _depthwise_tir((1, 2, 112, 112), (2, 1, 3, 3), padding=1)


def test_depthwise_groups_the_channels_of_single_tiles() -> None:
    text = _depthwise_tir((1, 32, 7, 7), (32, 1, 3, 3), padding=1)
    # 4 channels a task (8 tasks), their planes made together, then each channel's one tile
    assert "for b_oc_outer_fused in range(8):  # parallel" in text
    assert "pad = allocate((1, 4, 9, 1, 18)" in text
    assert re.search(r"for oc_inner in range\(4\):\n\s+conv2d_depthwise = allocate\(\(1, 1, 7, 16\)", text)


@pytest.mark.parametrize(("oh", "ow", "stride", "expected"), [
    (112, 112, 1, (2, 7)),  # 14 accumulators
    (56, 56, 1, (2, 4)),  # 4 rows of 4 vectors would be 16
    (28, 28, 1, (7, 2)),
    (14, 14, 1, (7, 1)),  # at most 8 rows
    (7, 7, 1, (7, 1)),
    (56, 56, 2, (1, 4)),  # a row stride: rows of several vectors alone
    (14, 14, 2, (7, 1)),
])
def test_depthwise_tiles_cover_whole_rows(oh, ow, stride, expected) -> None:
    assert depthwise_tiles(oh, ow, 16, stride) == expected


@pytest.mark.parametrize(("args", "expected"), [
    ((114, 456, False, 112, 1, 3, (2, 7), False, 32), (0, 1)),  # a stride-1 plane is made whole
    ((113, 520, True, 56, 2, 3, (1, 4), False, 96), (8, 1)),  # 17 input rows of 520 bytes fit 10 KiB
    ((61, 272, True, 29, 2, 5, (1, 2), False, 3), (15, 1)),  # 29 rows: a short last strip, not strips of one
    ((57, 264, True, 28, 2, 3, (7, 2), False, 144), (14, 1)),  # phase planes that fit L1 too: 29 rows
    ((15, 136, True, 7, 2, 3, (7, 1), False, 576), (0, 1)),  # a single tile of rows: no strip
    ((9, 72, False, 7, 1, 3, (7, 1), True, 960), (0, 16)),  # single tiles: up to 16 channels
    ((9, 72, False, 7, 1, 3, (7, 1), True, 32), (0, 4)),  # ... and at least 8 tasks
    ((9, 72, False, 7, 1, 3, (7, 1), True, 6), (0, 1)),
    ((15, 136, True, 7, 2, 3, (7, 1), True, 576), (0, 1)),  # phase planes of single tiles: no groups
])
def test_depthwise_blocking(args, expected) -> None:
    assert depthwise_blocking(*args) == expected


def _depthwise_silu(x_shape: tuple[int, ...], w_shape: tuple[int, ...], **kw: Any) -> tuple[relay.Function, Any]:
    """EfficientNet's block: a depthwise convolution, its BatchNorm folded into a bias, then SiLU."""
    wv, bv = rand(*w_shape), rand(w_shape[0])
    x = relay.var("x", shape=x_shape)
    y = relay.nn.bias_add(relay.nn.conv2d(x, relay.const(wv), groups=x_shape[1], **kw), relay.const(bv))
    body = relay.multiply(y, relay.sigmoid(y))

    def want(xv: np.ndarray) -> np.ndarray:
        z = ref("nn.conv2d", xv, wv, groups=x_shape[1], **kw) + bv[:, None, None]
        return z / (1 + np.exp(-z))

    return relay.Function([x], body), want


@pytest.mark.parametrize(("x_shape", "w_shape", "kw"), [
    ((1, 16, 15, 15), (16, 1, 5, 5), {"strides": 2, "padding": 2}),
    ((1, 32, 7, 7), (32, 1, 3, 3), {"padding": 1}),  # single tiles in groups
    ((1, 2, 113, 113), (2, 1, 3, 3), {"strides": 2, "padding": 1}),  # strips
])
def test_depthwise_silu_epilogue_runs_on_the_tile(x_shape, w_shape, kw) -> None:
    func, want = _depthwise_silu(x_shape, w_shape, **kw)
    lib = build(func)
    assert len(lib.kernels) == 1  # bias and SiLU are fused into the convolution
    xv = rand(*x_shape)
    np.testing.assert_allclose(np.asarray(lib.create_executor()(x=xv)), want(xv), rtol=1e-4, atol=1e-4)


def test_grouped_and_nhwc_convolutions_keep_the_direct_compute() -> None:
    check_build("nn.conv2d", rand(1, 8, 8, 8), rand(8, 2, 3, 3), groups=4, padding=1, rtol=1e-4, atol=1e-4)
    check_build("nn.conv2d", rand(1, 8, 8, 4), rand(3, 3, 4, 20), data_layout="NHWC", padding=1,
                rtol=1e-4, atol=1e-4)


# --- fused epilogues, weights packed at build time ------------------------------------------------


def _epilogue(kind: str, y: relay.Expr, o: int, params: list[relay.Var]) -> relay.Expr:
    if kind == "bias_relu":
        b = relay.var("b", shape=(o,))
        params.append(b)
        return relay.nn.relu(relay.nn.bias_add(y, b))
    if kind == "residual":
        r = relay.var("r", shape=tuple(int(d) for d in relay.infer_type(y).checked_type.shape))
        params.append(r)
        return relay.add(y, r)
    return relay.clip(y, 0.0, 6.0)


def _numpy_epilogue(kind: str, y: np.ndarray, values: dict[str, np.ndarray]) -> np.ndarray:
    if kind == "bias_relu":
        return np.maximum(y + values["b"][None, :, None, None], 0)
    if kind == "residual":
        return y + values["r"]
    return np.clip(y, 0, 6)


@pytest.mark.parametrize("kind", ["bias_relu", "residual", "clip"])
@pytest.mark.parametrize("constant", [False, True])
@pytest.mark.parametrize(("x_shape", "w_shape", "kw"), [OVEC_CASES[1], OVEC_CASES[2], PIXELS_CASES[1],
                                                       DEPTHWISE_CASES[1], DEPTHWISE_CASES[11], DEPTHWISE_CASES[14]])
def test_fused_epilogues_run_on_the_tile(kind, constant, x_shape, w_shape, kw) -> None:
    xv, wv = rand(*x_shape), rand(*w_shape)
    x = relay.var("x", shape=x_shape)
    params = [x]
    if constant:
        weight: relay.Expr = relay.const(wv)
    else:
        weight = relay.var("w", shape=w_shape)
        params.append(weight)
    y = relay.nn.conv2d(x, weight, **kw)
    body = _epilogue(kind, y, w_shape[0], params)
    conv = ref("nn.conv2d", xv, wv, **kw)
    values = {"x": xv, "w": wv, "b": rand(w_shape[0]), "r": rand(*conv.shape)}
    lib = build(relay.Function(params, body))
    assert len(lib.kernels) == 1  # the epilogue is fused into the convolution
    got = lib.create_executor()(**{p.name_hint: values[p.name_hint] for p in params})
    np.testing.assert_allclose(np.asarray(got), _numpy_epilogue(kind, conv, values), rtol=1e-4, atol=1e-4)


def _altered_convs(func: relay.Function) -> list[relay.Call]:
    """The conv2d calls of `func` after AlterOpLayout and FoldConstant for llvm."""
    with PassContext(opt_level=3, verify=True), Target("llvm"):
        mod = Sequential([transform.InferType(), transform.AlterOpLayout(), transform.FoldConstant()])(
            relay.IRModule.from_expr(func))
    return [n for n in post_order(mod["main"]) if isinstance(n, relay.Call) and n.op is Op.get("nn.conv2d")]


def test_a_constant_weight_is_packed_at_build_time_and_read_as_it_is() -> None:
    xv, wv = rand(1, 8, 10, 10), rand(32, 8, 3, 3)
    x = relay.var("x", shape=xv.shape)
    func = relay.Function([x], relay.nn.relu(relay.nn.conv2d(x, relay.const(wv), padding=1)))
    (conv,) = _altered_convs(func)
    assert conv.attrs.kernel_layout == "OIHW16o"
    packed = conv.args[1]
    assert isinstance(packed, relay.Constant)  # FoldConstant ran the transform: nothing is left to run
    np.testing.assert_array_equal(packed.data, wv.reshape(2, 16, 8, 3, 3).transpose(0, 2, 3, 4, 1))
    got = build(func).create_executor()(x=xv)
    np.testing.assert_allclose(np.asarray(got), np.maximum(ref("nn.conv2d", xv, wv, padding=1), 0),
                               rtol=1e-4, atol=1e-4)
    # the kernel reads the packed constant: no packing stage
    xp = relay.var("x", shape=xv.shape)
    wp = relay.var("w", shape=packed.data.shape)
    text = _lowered(relay.Function([xp, wp], relay.nn.conv2d(xp, wp, padding=1, kernel_layout="OIHW16o")))
    assert "weight_packed" not in text and "conv2d_blocked = allocate" in text


def test_a_channel_tail_no_tile_covers_is_padded_with_zero_weights_and_sliced_off() -> None:
    """A 1000-class 1x1 convolution (here 100 channels: 7 blocks, the last one a quarter full)."""
    xv, wv, bv = rand(1, 8, 6, 6), rand(100, 8, 1, 1), rand(100)
    x = relay.var("x", shape=xv.shape)
    body = relay.nn.relu(relay.nn.bias_add(relay.nn.conv2d(x, relay.const(wv)), relay.const(bv)))
    func = relay.Function([x], body)
    (conv,) = _altered_convs(func)
    assert conv.attrs.kernel_layout == "OIHW16o" and conv.args[1].data.shape == (7, 8, 1, 1, 16)
    np.testing.assert_array_equal(conv.args[1].data[6, :, 0, 0, 4:], 0)  # the padding: zero weights
    got = build(func).create_executor()(x=xv)
    want = np.maximum(ref("nn.conv2d", xv, wv) + bv[:, None, None], 0)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("w_shape", "kw"), [
    ((20, 8, 3, 3), {}),  # channels not a multiple of the block, in one tile of all blocks
    ((8, 1, 3, 3), {"groups": 8}),  # depthwise: no packing
    ((32, 8, 3, 3), {"out_dtype": "float64"}),  # float64 tiles: blocks of 8, not 16
])
def test_weights_that_the_tiles_read_as_they_are_keep_their_layout(w_shape, kw) -> None:
    x = relay.var("x", shape=(1, 8, 6, 6))
    func = relay.Function([x], relay.nn.conv2d(x, relay.const(rand(*w_shape)), **kw))
    (conv,) = _altered_convs(func)
    assert conv.attrs.kernel_layout == "OIHW"
