"""nn.conv2d, nn.conv2d_transpose and the pools: type relations, errors, and numpy references.

The references are checked against naive loop implementations written here
from the definitions (PyTorch's, for the pooling divisors), and the output-size
formulas against an enumeration of the windows that fit.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from op_helpers import RNG, check_build, make_attrs, rand, ref, rel

from kiln import relay
from kiln.ir.attrs import AttrsError
from kiln.ir.types import ANY, SizeVar, TensorType
from kiln.registry import Op, OpPattern, attr
from kiln.relay.op._rel import RelationError
from kiln.relay.op.conv import Conv2DAttrs

N = SizeVar("n")










def check_ref_agrees(op: str, arrays: list[np.ndarray], **kw: Any) -> np.ndarray:
    """The reference's output has the shape and dtype the relation gives for these arrays."""
    out_type = rel(op, [TensorType(a.shape, a.dtype) for a in arrays], **kw)
    out = ref(op, *arrays, **kw)
    assert out_type == TensorType(out.shape, out.dtype)
    return out


# --- naive implementations, from the definitions ------------------------------------------


def naive_conv2d(x: np.ndarray, w: np.ndarray, strides=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1), groups=1):
    """NCHW x OIHW, seven loops deep."""
    n_, _, h_, w_ = x.shape
    o_, ig, kh_, kw_ = w.shape
    pt, pl, pb, pr = padding
    oh = (h_ + pt + pb - dilation[0] * (kh_ - 1) - 1) // strides[0] + 1
    ow = (w_ + pl + pr - dilation[1] * (kw_ - 1) - 1) // strides[1] + 1
    out = np.zeros((n_, o_, oh, ow), dtype=np.float64)
    per_group = o_ // groups
    for n in range(n_):
        for o in range(o_):
            g = o // per_group
            for y in range(oh):
                for xx in range(ow):
                    acc = 0.0
                    for i in range(ig):
                        for ky in range(kh_):
                            for kx in range(kw_):
                                h = y * strides[0] - pt + ky * dilation[0]
                                ww = xx * strides[1] - pl + kx * dilation[1]
                                if 0 <= h < h_ and 0 <= ww < w_:
                                    acc += x[n, g * ig + i, h, ww] * w[o, i, ky, kx]
                    out[n, o, y, xx] = acc
    return out


def naive_conv2d_transpose(x, w, strides, padding, output_padding, dilation, groups):
    """NCHW x IOHW: every input pixel scatters its kernel into the output."""
    n_, c_, h_, w_ = x.shape
    _, og, kh_, kw_ = w.shape
    pt, pl, pb, pr = padding
    oh = (h_ - 1) * strides[0] - pt - pb + dilation[0] * (kh_ - 1) + output_padding[0] + 1
    ow = (w_ - 1) * strides[1] - pl - pr + dilation[1] * (kw_ - 1) + output_padding[1] + 1
    out = np.zeros((n_, og * groups, oh, ow))
    cg = c_ // groups
    for n in range(n_):
        for c in range(c_):
            g = c // cg
            for h in range(h_):
                for ww in range(w_):
                    for o in range(og):
                        for ky in range(kh_):
                            for kx in range(kw_):
                                y = h * strides[0] + ky * dilation[0] - pt
                                xx = ww * strides[1] + kx * dilation[1] - pl
                                if 0 <= y < oh and 0 <= xx < ow:
                                    out[n, g * og + o, y, xx] += x[n, c, h, ww] * w[c, o, ky, kx]
    return out


def torch_style_pool_size(size: int, k: int, s: int, pad: tuple[int, int], d: int, ceil_mode: bool) -> int:
    """Counts the windows: a window is kept while it fits (floor) or, in ceil mode, while the previous
    one leaves elements uncovered and it starts inside the input or the leading padding."""
    span = d * (k - 1) + 1
    padded = size + pad[0] + pad[1]
    count = 0
    while True:
        start = count * s
        fits_whole = start + span <= padded
        # ceil mode: the window before this one leaves elements uncovered, and this one starts before the input ends
        covers_rest = (start - s) + span < padded and start < size + pad[0]
        if not (covers_rest if ceil_mode else fits_whole):
            return count
        count += 1


def naive_max_pool(x, k, s, padding, d, ceil_mode):
    pt, pl, pb, pr = padding
    n_, c_, h_, w_ = x.shape
    oh = torch_style_pool_size(h_, k[0], s[0], (pt, pb), d[0], ceil_mode)
    ow = torch_style_pool_size(w_, k[1], s[1], (pl, pr), d[1], ceil_mode)
    out = np.full((n_, c_, oh, ow), -np.inf)
    for y in range(oh):
        for xx in range(ow):
            for ky in range(k[0]):
                for kx in range(k[1]):
                    h, w = y * s[0] - pt + ky * d[0], xx * s[1] - pl + kx * d[1]
                    if 0 <= h < h_ and 0 <= w < w_:
                        out[:, :, y, xx] = np.maximum(out[:, :, y, xx], x[:, :, h, w])
    return out


def naive_avg_pool(x, k, s, padding, ceil_mode, count_include_pad):
    """PyTorch's avg_pool2d loop (no dilation)."""
    pt, pl, pb, pr = padding
    n_, c_, h_, w_ = x.shape
    oh = torch_style_pool_size(h_, k[0], s[0], (pt, pb), 1, ceil_mode)
    ow = torch_style_pool_size(w_, k[1], s[1], (pl, pr), 1, ceil_mode)
    out = np.zeros((n_, c_, oh, ow))
    for y in range(oh):
        for xx in range(ow):
            h0, w0 = y * s[0] - pt, xx * s[1] - pl
            h1, w1 = min(h0 + k[0], h_ + pb), min(w0 + k[1], w_ + pr)
            pool = (h1 - h0) * (w1 - w0)
            h0, w0, h1, w1 = max(h0, 0), max(w0, 0), min(h1, h_), min(w1, w_)
            total = x[:, :, h0:h1, w0:w1].sum(axis=(2, 3))
            out[:, :, y, xx] = total / (pool if count_include_pad else (h1 - h0) * (w1 - w0))
    return out


# --- registration ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("op", "n_args", "level"),
    [
        ("nn.conv2d", 2, 2),
        ("nn.conv2d_transpose", 2, 2),
        ("nn.max_pool2d", 1, 2),
        ("nn.avg_pool2d", 1, 2),
        ("nn.global_avg_pool2d", 1, 2),
        ("nn.global_max_pool2d", 1, 2),
    ],
)
def test_conv_family_ops_are_registered_with_every_attribute(op: str, n_args: int, level: int) -> None:
    o = Op.get(op)
    assert o.description
    assert len(o.arguments) == o.num_inputs == n_args
    assert o.attrs_type is not None
    assert o.support_level == level
    assert o.get_attr(attr.TOpPattern) == OpPattern.OUT_ELEMWISE_FUSABLE
    assert o.get_attr(attr.FTypeRelation) is not None
    assert callable(o.get_attr(attr.FReference))


def test_relay_nn_namespace_holds_the_conv_constructors() -> None:
    for name in ["conv2d", "conv2d_transpose", "max_pool2d", "avg_pool2d", "global_avg_pool2d", "global_max_pool2d"]:
        assert callable(getattr(relay.nn, name))


# --- nn.conv2d: types ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "weight", "kw", "expected"),
    [
        ((N, 3, 224, 224), (64, 3, 7, 7), {"strides": (2, 2), "padding": (3, 3)}, (N, 64, 112, 112)),
        ((1, 3, 224, 224), (64, 3, 7, 7), {"strides": 2, "padding": 3}, (1, 64, 112, 112)),
        ((N, 224, 224, 3), (7, 7, 3, 64), {"strides": 2, "padding": 3, "data_layout": "NHWC"}, (N, 112, 112, 64)),
        ((2, 16, 8, 8), (16, 1, 3, 3), {"padding": 1, "groups": 16}, (2, 16, 8, 8)),  # depthwise
        ((2, 8, 8, 16), (3, 3, 1, 16), {"padding": 1, "groups": 16, "data_layout": "NHWC"}, (2, 8, 8, 16)),
        ((2, 8, 10, 10), (4, 2, 3, 3), {"groups": 4, "dilation": 2}, (2, 4, 6, 6)),
        ((1, 4, 9, 7), (6, 4, 3, 2), {"padding": (1, 0, 2, 1), "strides": (2, 3)}, (1, 6, 5, 3)),
        ((1, 3, 32, 32), (8, 3, 3, 3), {"channels": 8, "kernel_size": 3}, (1, 8, 30, 30)),
        ((N, 3, N, 32), (8, 3, 3, 3), {"padding": 1}, (N, 8, N, 32)),  # symbolic, computable
        ((N, 3, N, 32), (8, 3, 3, 3), {"strides": 2, "padding": 1}, (N, 8, ANY, 16)),  # symbolic, not computable
        ((N, 3, ANY, ANY), (8, 3, 1, 1), {}, (N, 8, ANY, ANY)),
        ((1, 3, 16, 16), (8, 3, 3, 3), {"data_layout": "NCHW", "kernel_layout": "HWIO"}, None),  # weight read HWIO
    ],
)
def test_conv2d_output_type_over_shapes_and_layouts(data, weight, kw, expected) -> None:
    if expected is None:  # (8, 3, 3, 3) read as HWIO is O=3, I=3, KH=8, KW=3
        expected = (1, 3, 9, 14)
    assert rel("nn.conv2d", [TensorType(data), TensorType(weight)], **kw) == TensorType(expected)


def test_conv2d_out_dtype_overrides_and_empty_means_input_dtype() -> None:
    args = [TensorType((1, 3, 8, 8), "int8"), TensorType((4, 3, 3, 3), "int8")]
    assert rel("nn.conv2d", args, out_dtype="int32") == TensorType((1, 4, 6, 6), "int32")
    assert rel("nn.conv2d", args, out_dtype="") == TensorType((1, 4, 6, 6), "int8")


def test_conv2d_kernel_layout_defaults_to_match_the_data_layout() -> None:
    x = relay.var("x", shape=(1, 8, 8, 3))
    w = relay.var("w", shape=(3, 3, 3, 4))
    call = relay.nn.conv2d(x, w, data_layout="NHWC")
    assert call.attrs.kernel_layout == "HWIO"
    assert call.attrs.padding == (0, 0, 0, 0)
    assert relay.infer_type(call).checked_type == TensorType((1, 6, 6, 4))
    assert relay.nn.conv2d(x, w).attrs.kernel_layout == "OIHW"


@pytest.mark.parametrize(
    ("padding", "expected"), [(2, (2, 2, 2, 2)), ((1, 2), (1, 2, 1, 2)), ((1, 2, 3, 4), (1, 2, 3, 4)), ([3], (3,) * 4)]
)
def test_conv2d_padding_is_normalized_to_top_left_bottom_right(padding, expected) -> None:
    x, w = relay.var("x", shape=(1, 1, 4, 4)), relay.var("w", shape=(1, 1, 1, 1))
    assert relay.nn.conv2d(x, w, padding=padding).attrs.padding == expected


# --- nn.conv2d: errors --------------------------------------------------------------------------


def test_conv2d_channel_mismatch_names_both_numbers() -> None:
    with pytest.raises(RelationError, match=r"data has 4 channels.*expects 3 per group \* groups=1 = 3") as info:
        rel("nn.conv2d", [TensorType((1, 4, 8, 8)), TensorType((8, 3, 3, 3))])
    assert info.value.arg == 1


def test_conv2d_groups_that_do_not_divide_the_channels_are_refused() -> None:
    with pytest.raises(RelationError, match=r"data has 6 channels, which groups=4 does not divide") as info:
        rel("nn.conv2d", [TensorType((1, 6, 8, 8)), TensorType((8, 1, 3, 3))], groups=4)
    assert info.value.arg == 0
    with pytest.raises(RelationError, match=r"weight has 6 output channels, which groups=4"):
        rel("nn.conv2d", [TensorType((1, 8, 8, 8)), TensorType((6, 2, 3, 3))], groups=4)


def test_conv2d_empty_output_names_size_kernel_stride_padding() -> None:
    with pytest.raises(RelationError, match=r"output height would be .*input height 3, kernel 5, stride 1, "
                                            r"padding \(0, 0\), dilation 1"):
        rel("nn.conv2d", [TensorType((1, 3, 3, 8)), TensorType((4, 3, 5, 3))])
    with pytest.raises(RelationError, match=r"output width would be .*input width 4, kernel 3, stride 2, "
                                            r"padding \(0, 0\), dilation 2"):
        rel("nn.conv2d", [TensorType((1, 3, 8, 4)), TensorType((4, 3, 1, 3))], strides=2, dilation=2)


def test_conv2d_channels_and_kernel_size_attrs_are_checked_against_the_weight() -> None:
    args = [TensorType((1, 3, 8, 8)), TensorType((8, 3, 3, 3))]
    with pytest.raises(RelationError, match=r"attribute channels is 16 but weight .* has 8 outputs"):
        rel("nn.conv2d", args, channels=16)
    with pytest.raises(RelationError, match=r"attribute kernel_size is \(5, 5\) but weight .* has kernel \(3, 3\)"):
        rel("nn.conv2d", args, kernel_size=5)


def test_conv2d_rank_and_dtype_errors_name_the_argument() -> None:
    with pytest.raises(RelationError, match=r"expected data of rank 4 \(NHWC\), found rank 3") as info:
        rel("nn.conv2d", [TensorType((3, 8, 8)), TensorType((3, 3, 3, 8))], data_layout="NHWC")
    assert info.value.arg == 0
    with pytest.raises(RelationError, match=r"expected dtype float32 .*found float16") as info:
        rel("nn.conv2d", [TensorType((1, 3, 8, 8)), TensorType((8, 3, 3, 3), "float16")])
    assert info.value.arg == 1


@pytest.mark.parametrize(
    ("kw", "pattern"),
    [
        ({"padding": (1, 2, 3)}, r"op nn.conv2d: attribute padding must be a list of 4 ints >= 0, got \(1, 2, 3\)"),
        ({"strides": (0, 1)}, r"op nn.conv2d: attribute strides must be a list of 2 ints >= 1, got \(0, 1\)"),
        ({"data_layout": "NCWH"}, r"attribute data_layout must be one of 'NCHW', 'NHWC', got 'NCWH'"),
        ({"kernel_layout": "IOHW"}, r"attribute kernel_layout must be 'OIHW', 'HWIO' or 'OIHW<b>o'.*got 'IOHW'"),
        ({"groups": 0}, r"attribute groups must be an int >= 1, got 0"),
        ({"out_dtype": "float8"}, r"attribute out_dtype must be a dtype name"),
    ],
)
def test_conv2d_bad_attrs_name_the_op_field_and_allowed_values(kw, pattern) -> None:
    x, w = relay.var("x", shape=(1, 3, 8, 8)), relay.var("w", shape=(4, 3, 3, 3))
    with pytest.raises(AttrsError, match=pattern):
        relay.nn.conv2d(x, w, **kw)


def test_conv2d_type_error_through_infer_type_names_op_and_argument() -> None:
    x, w = relay.var("x", shape=(1, 4, 8, 8)), relay.var("w", shape=(8, 3, 3, 3))
    with pytest.raises(relay.TypeInferenceError, match=r"nn.conv2d.*weight.*data has 4 channels"):
        relay.infer_type(relay.nn.conv2d(x, w))


# --- nn.conv2d: values ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("x_shape", "w_shape", "kw"),
    [
        ((1, 3, 6, 6), (4, 3, 3, 3), {}),
        ((2, 4, 7, 6), (4, 2, 3, 2), {"groups": 2, "strides": (2, 1), "padding": (1, 0, 2, 1)}),
        ((1, 3, 7, 7), (3, 1, 3, 3), {"groups": 3, "padding": 2, "dilation": 2}),
        ((1, 2, 5, 5), (3, 2, 2, 2), {"strides": 2, "padding": (1, 1)}),
    ],
)
def test_conv2d_reference_matches_a_naive_loop(x_shape, w_shape, kw) -> None:
    x, w = rand(*x_shape), rand(*w_shape)
    out = check_ref_agrees("nn.conv2d", [x, w], **kw)
    attrs = make_attrs("nn.conv2d", **kw)
    expected = naive_conv2d(x, w, attrs.strides, attrs.padding, attrs.dilation, attrs.groups)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)


def test_conv2d_reference_nhwc_hwio_equals_nchw_oihw() -> None:
    x, w = rand(2, 4, 9, 8), rand(6, 2, 3, 3)
    nchw = ref("nn.conv2d", x, w, groups=2, padding=1, strides=2)
    nhwc = check_ref_agrees("nn.conv2d", [x.transpose(0, 2, 3, 1), w.transpose(2, 3, 1, 0)], groups=2, padding=1,
                            strides=2, data_layout="NHWC")
    np.testing.assert_allclose(nhwc.transpose(0, 3, 1, 2), nchw, rtol=1e-5, atol=1e-5)


def test_conv2d_packed_kernel_layout_is_oihw_in_blocks_of_output_channels() -> None:
    x, w = rand(1, 3, 9, 8), rand(32, 3, 3, 3)
    packed = w.reshape(2, 16, 3, 3, 3).transpose(0, 2, 3, 4, 1).copy()  # (O/16, I, KH, KW, 16)
    out = check_ref_agrees("nn.conv2d", [x, packed], padding=1, strides=(2, 1), kernel_layout="OIHW16o")
    np.testing.assert_allclose(out, ref("nn.conv2d", x, w, padding=1, strides=(2, 1)), rtol=1e-5, atol=1e-5)
    assert Conv2DAttrs.make("nn.conv2d", kernel_layout="OIHW8o").kernel_block == 8
    assert Conv2DAttrs.make("nn.conv2d").kernel_block == 0
    check_build("nn.conv2d", x, packed, padding=1, kernel_layout="OIHW16o", rtol=1e-4, atol=1e-5)
    check_build("nn.conv2d", x, w.reshape(4, 8, 3, 3, 3).transpose(0, 2, 3, 4, 1).copy(), kernel_layout="OIHW8o",
                rtol=1e-4, atol=1e-5)  # blocks of 8: packed again for the 16-lane tiles


def test_conv2d_packed_kernel_layout_errors_name_the_block() -> None:
    with pytest.raises(RelationError, match=r"kernel_layout OIHW16o needs a weight \(O/16, I, KH, KW, 16\)") as info:
        rel("nn.conv2d", [TensorType((1, 3, 8, 8)), TensorType((32, 3, 3, 3))], kernel_layout="OIHW16o")
    assert info.value.arg == 1
    with pytest.raises(RelationError, match=r"needs a weight \(O/16"):
        rel("nn.conv2d", [TensorType((1, 3, 8, 8)), TensorType((2, 3, 3, 3, 8))], kernel_layout="OIHW16o")
    with pytest.raises(AttrsError, match=r"kernel_layout must be 'OIHW', 'HWIO' or 'OIHW<b>o'"):
        Conv2DAttrs.make("nn.conv2d", kernel_layout="OIHW0o")


def test_conv2d_reference_int8_accumulates_in_out_dtype() -> None:
    x = np.full((1, 16, 3, 3), 100, dtype=np.int8)
    w = np.full((1, 16, 3, 3), 100, dtype=np.int8)
    out = check_ref_agrees("nn.conv2d", [x, w], out_dtype="int32")
    assert out.item() == 16 * 9 * 100 * 100


def test_conv2d_reference_is_fast_on_a_small_image() -> None:
    import time

    x, w = rand(1, 8, 16, 16), rand(8, 8, 3, 3)
    start = time.perf_counter()
    ref("nn.conv2d", x, w, padding=1)
    assert time.perf_counter() - start < 0.5


@settings(max_examples=40, deadline=None)
@given(
    size=st.tuples(st.integers(1, 12), st.integers(1, 12)),
    kernel=st.tuples(st.integers(1, 4), st.integers(1, 4)),
    strides=st.tuples(st.integers(1, 3), st.integers(1, 3)),
    padding=st.tuples(*[st.integers(0, 3)] * 4),
    dilation=st.tuples(st.integers(1, 3), st.integers(1, 3)),
    layout=st.sampled_from(["NCHW", "NHWC"]),
)
def test_conv2d_output_size_counts_the_windows_that_fit(size, kernel, strides, padding, dilation, layout) -> None:
    pt, pl, pb, pr = padding
    oh = torch_style_pool_size(size[0], kernel[0], strides[0], (pt, pb), dilation[0], False)
    ow = torch_style_pool_size(size[1], kernel[1], strides[1], (pl, pr), dilation[1], False)
    nchw = layout == "NCHW"
    data = TensorType((N, 2, *size) if nchw else (N, *size, 2))
    weight = TensorType((3, 2, *kernel) if nchw else (*kernel, 2, 3))
    kw = {"strides": strides, "padding": padding, "dilation": dilation, "data_layout": layout}
    if oh == 0 or ow == 0:
        with pytest.raises(RelationError, match=r"output (height|width) would be .* kernel .* stride .* padding"):
            rel("nn.conv2d", [data, weight], **kw)
        return
    assert rel("nn.conv2d", [data, weight], **kw) == TensorType((N, 3, oh, ow) if nchw else (N, oh, ow, 3))
    x = rand(1, 2, *size) if nchw else rand(1, *size, 2)
    check_ref_agrees("nn.conv2d", [x, rand(*weight.concrete_shape)], **kw)


# --- nn.conv2d_transpose ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "weight", "kw", "expected"),
    [
        ((N, 8, 16, 16), (8, 4, 4, 4), {"strides": 2, "padding": 1}, (N, 4, 32, 32)),
        ((1, 3, 5, 5), (3, 2, 3, 3), {}, (1, 2, 7, 7)),
        ((1, 4, 5, 5), (4, 3, 3, 3), {"groups": 2}, (1, 6, 7, 7)),
        ((1, 2, 4, 4), (2, 1, 3, 3), {"strides": 2, "padding": 1, "output_padding": 1}, (1, 1, 8, 8)),
        ((1, 2, 4, 6), (2, 1, 2, 3), {"dilation": (2, 1), "padding": (0, 1, 1, 0)}, (1, 1, 5, 7)),
        ((N, 2, N, 6), (2, 1, 3, 3), {}, (N, 1, ANY, 8)),
    ],
)
def test_conv2d_transpose_output_type(data, weight, kw, expected) -> None:
    assert rel("nn.conv2d_transpose", [TensorType(data), TensorType(weight)], **kw) == TensorType(expected)


def test_conv2d_transpose_errors() -> None:
    with pytest.raises(RelationError, match=r"data has 4 channels but weight .* has 3 input channels"):
        rel("nn.conv2d_transpose", [TensorType((1, 4, 5, 5)), TensorType((3, 2, 3, 3))])
    with pytest.raises(RelationError, match=r"output height would be -1: input height 1, kernel 1, stride 1, "
                                            r"padding \(1, 1\)"):
        rel("nn.conv2d_transpose", [TensorType((1, 2, 1, 4)), TensorType((2, 2, 1, 1))], padding=1)
    with pytest.raises(AttrsError, match=r"op nn.conv2d_transpose: attribute output_padding must be smaller than"):
        relay.nn.conv2d_transpose(relay.var("x", shape=(1, 1, 2, 2)), relay.var("w", shape=(1, 1, 2, 2)),
                                  strides=2, output_padding=2)


@pytest.mark.parametrize(
    ("x_shape", "w_shape", "kw"),
    [
        ((1, 2, 3, 3), (2, 3, 3, 3), {}),
        ((2, 4, 3, 4), (4, 1, 3, 2), {"groups": 2, "strides": (2, 3), "padding": (1, 0, 0, 1), "output_padding": 1}),
        ((1, 2, 4, 4), (2, 2, 2, 3), {"strides": 2, "dilation": 2, "padding": 1, "output_padding": (1, 0)}),
    ],
)
def test_conv2d_transpose_reference_matches_a_naive_scatter(x_shape, w_shape, kw) -> None:
    x, w = rand(*x_shape), rand(*w_shape)
    out = check_ref_agrees("nn.conv2d_transpose", [x, w], **kw)
    attrs = make_attrs("nn.conv2d_transpose", **kw)
    expected = naive_conv2d_transpose(x, w, attrs.strides, attrs.padding, attrs.output_padding, attrs.dilation,
                                      attrs.groups)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)


def test_conv2d_transpose_is_the_adjoint_of_conv2d() -> None:
    x, w, y = rand(1, 3, 7, 7), rand(4, 3, 3, 3), rand(1, 4, 4, 4)
    conv = ref("nn.conv2d", x, w, strides=2, padding=1)
    back = ref("nn.conv2d_transpose", y, w, strides=2, padding=1)  # w read as IOHW: I=4, O=3
    assert back.shape == x.shape
    np.testing.assert_allclose(np.sum(conv * y), np.sum(x * back), rtol=1e-4)


# --- pools: types -------------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["nn.max_pool2d", "nn.avg_pool2d"])
@pytest.mark.parametrize(
    ("data", "kw", "expected"),
    [
        ((N, 64, 112, 112), {"pool_size": 3, "strides": 2, "padding": 1}, (N, 64, 56, 56)),
        ((N, 112, 112, 64), {"pool_size": 3, "strides": 2, "padding": 1, "layout": "NHWC"}, (N, 56, 56, 64)),
        ((1, 3, 7, 7), {"pool_size": 2, "strides": 2}, (1, 3, 3, 3)),
        ((1, 3, 7, 7), {"pool_size": 2, "strides": 2, "ceil_mode": True}, (1, 3, 4, 4)),
        ((1, 3, 5, 5), {"pool_size": 2, "strides": 2, "padding": 1, "ceil_mode": True}, (1, 3, 3, 3)),  # 4th dropped
        ((1, 3, 8, 8), {"pool_size": 2, "dilation": 2}, (1, 3, 6, 6)),
        ((1, 3, N, N), {"pool_size": 3, "padding": 1}, (1, 3, N, N)),
        ((1, 3, N, 8), {"pool_size": 2, "strides": 2}, (1, 3, ANY, 4)),
        ((2, 5, 4, 4), {}, (2, 5, 4, 4)),
    ],
)
def test_pool2d_output_type(op, data, kw, expected) -> None:
    assert rel(op, [TensorType(data, "float16")], **kw) == TensorType(expected, "float16")


@pytest.mark.parametrize("op", ["nn.max_pool2d", "nn.avg_pool2d"])
def test_pool2d_errors(op) -> None:
    with pytest.raises(RelationError, match=r"output height would be 0: input height 2, kernel 3, stride 1, "
                                            r"padding \(0, 0\)"):
        rel(op, [TensorType((1, 1, 2, 5))], pool_size=3)
    with pytest.raises(RelationError, match=r"expected data of rank 4 \(NCHW\), found rank 2"):
        rel(op, [TensorType((4, 4))])
    with pytest.raises(AttrsError, match=rf"op {op}: attribute layout must be one of 'NCHW', 'NHWC', got 'NCDHW'"):
        make_attrs(op, layout="NCDHW")
    with pytest.raises(AttrsError, match=rf"op {op}: attribute ceil_mode must be true or false, got 1"):
        make_attrs(op, ceil_mode=1)


@settings(max_examples=40, deadline=None)
@given(
    size=st.integers(1, 12),
    kernel=st.integers(1, 4),
    stride=st.integers(1, 4),
    pad=st.tuples(st.integers(0, 2), st.integers(0, 2)),
    dilation=st.integers(1, 2),
    ceil_mode=st.booleans(),
    op=st.sampled_from(["nn.max_pool2d", "nn.avg_pool2d"]),
)
def test_pool2d_output_size_counts_the_windows(size, kernel, stride, pad, dilation, ceil_mode, op) -> None:
    # PyTorch allows ceil_mode only with padding <= kernel / 2; beyond it, its formula and the window count part
    assume(not ceil_mode or max(pad) <= kernel // 2)
    expected = torch_style_pool_size(size, kernel, stride, pad, dilation, ceil_mode)
    kw = {"pool_size": (kernel, 1), "strides": (stride, 1), "padding": (pad[0], 0, pad[1], 0),
          "dilation": (dilation, 1), "ceil_mode": ceil_mode}
    data = TensorType((N, 2, size, 3))
    if expected == 0:
        with pytest.raises(RelationError, match=rf"input height {size}, kernel {kernel}, stride {stride}"):
            rel(op, [data], **kw)
        return
    assert rel(op, [data], **kw) == TensorType((N, 2, expected, 3))
    check_ref_agrees(op, [rand(1, 2, size, 3)], **kw)


# --- pools: values ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw",
    [
        {"pool_size": 2, "strides": 2},
        {"pool_size": 3, "strides": 2, "padding": 1},
        {"pool_size": 3, "strides": 2, "padding": 1, "ceil_mode": True},
        {"pool_size": (2, 3), "strides": (2, 1), "padding": (1, 0, 0, 1), "ceil_mode": True},
        {"pool_size": 2, "dilation": 2, "padding": 1},
    ],
)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_max_pool2d_reference_matches_a_naive_loop(kw, layout) -> None:
    x = rand(2, 3, 7, 6)
    data = x if layout == "NCHW" else x.transpose(0, 2, 3, 1)
    out = check_ref_agrees("nn.max_pool2d", [data], layout=layout, **kw)
    out = out if layout == "NCHW" else out.transpose(0, 3, 1, 2)
    attrs = make_attrs("nn.max_pool2d", **kw)
    expected = naive_max_pool(x, attrs.pool_size, attrs.strides, attrs.padding, attrs.dilation, attrs.ceil_mode)
    np.testing.assert_allclose(out, expected)


@pytest.mark.parametrize("count_include_pad", [False, True])
@pytest.mark.parametrize(
    "kw",
    [
        {"pool_size": 2, "strides": 2},
        {"pool_size": 3, "strides": 2, "padding": 1},
        {"pool_size": 3, "strides": 2, "padding": 1, "ceil_mode": True},
        {"pool_size": (2, 3), "strides": (2, 2), "padding": (1, 0, 0, 1), "ceil_mode": True},
        {"pool_size": 3, "strides": 1, "padding": 1},
    ],
)
def test_avg_pool2d_reference_matches_pytorch_divisor_rules(kw, count_include_pad) -> None:
    x = rand(2, 3, 7, 6)
    out = check_ref_agrees("nn.avg_pool2d", [x], count_include_pad=count_include_pad, **kw)
    attrs = make_attrs("nn.avg_pool2d", **kw)
    expected = naive_avg_pool(x, attrs.pool_size, attrs.strides, attrs.padding, attrs.ceil_mode, count_include_pad)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)


def test_avg_pool2d_reference_nhwc_and_integers() -> None:
    x = RNG.integers(-50, 50, (1, 6, 6, 2)).astype(np.int32)
    out = check_ref_agrees("nn.avg_pool2d", [x], pool_size=2, strides=2, layout="NHWC")
    expected = x.reshape(1, 3, 2, 3, 2, 2).sum(axis=(2, 4)) / 4
    np.testing.assert_array_equal(out, np.trunc(expected).astype(np.int32))


# --- global pools ---------------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["nn.global_avg_pool2d", "nn.global_max_pool2d"])
@pytest.mark.parametrize(
    ("data", "layout", "expected"),
    [
        ((N, 512, 7, 7), "NCHW", (N, 512, 1, 1)),
        ((N, 7, 7, 512), "NHWC", (N, 1, 1, 512)),
        ((2, 3, ANY, ANY), "NCHW", (2, 3, 1, 1)),
    ],
)
def test_global_pool2d_output_type(op, data, layout, expected) -> None:
    assert rel(op, [TensorType(data)], layout=layout) == TensorType(expected)


@pytest.mark.parametrize("op", ["nn.global_avg_pool2d", "nn.global_max_pool2d"])
def test_global_pool2d_refuses_a_rank_3_input(op) -> None:
    with pytest.raises(RelationError, match=r"expected data of rank 4 \(NHWC\), found rank 3"):
        rel(op, [TensorType((1, 7, 7))], layout="NHWC")


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_global_pool2d_reference_values(layout) -> None:
    x = rand(2, 3, 5, 4)
    data = x if layout == "NCHW" else x.transpose(0, 2, 3, 1)
    avg = check_ref_agrees("nn.global_avg_pool2d", [data], layout=layout)
    mx = check_ref_agrees("nn.global_max_pool2d", [data], layout=layout)
    for out, expected in [(avg, x.mean(axis=(2, 3))), (mx, x.max(axis=(2, 3)))]:
        np.testing.assert_allclose(out.reshape(2, 3), expected, rtol=1e-6)


def test_pool_constructors_build_calls_that_type_check() -> None:
    x = relay.var("x", shape=(N, 3, 32, 32))
    assert relay.infer_type(relay.nn.max_pool2d(x, 2, 2)).checked_type == TensorType((N, 3, 16, 16))
    assert relay.infer_type(relay.nn.avg_pool2d(x, 3, 1, padding=1)).checked_type == TensorType((N, 3, 32, 32))
    assert relay.infer_type(relay.nn.global_avg_pool2d(x)).checked_type == TensorType((N, 3, 1, 1))
    assert relay.infer_type(relay.nn.global_max_pool2d(x)).checked_type == TensorType((N, 3, 1, 1))


# --- text round trip --------------------------------------------------------------------------------------


def _conv_calls() -> list[relay.Call]:
    x, w = relay.var("x", shape=(N, 4, 8, 8)), relay.var("w", shape=(4, 2, 3, 3))
    xi, wi = relay.var("xi", shape=(1, 4, 8, 8), dtype="int8"), relay.var("wi", shape=(4, 4, 3, 3), dtype="int8")
    h, hw = relay.var("h", shape=(1, 8, 8, 4)), relay.var("hw", shape=(3, 3, 4, 5))
    return [
        relay.nn.conv2d(x, w, strides=2, padding=(1, 0, 2, 1), groups=2, channels=4, kernel_size=3),
        relay.nn.conv2d(xi, wi, out_dtype="int32"),
        relay.nn.conv2d(h, hw, data_layout="NHWC", dilation=2),
        relay.nn.conv2d_transpose(x, relay.var("wt", shape=(4, 3, 3, 3)), strides=2, padding=1, output_padding=1),
        relay.nn.max_pool2d(x, 3, 2, padding=1, ceil_mode=True),
        relay.nn.avg_pool2d(h, 2, 2, count_include_pad=True, layout="NHWC"),
        relay.nn.global_avg_pool2d(x),
        relay.nn.global_max_pool2d(h, layout="NHWC"),
        relay.nn.conv2d(x, relay.var("wp", shape=(1, 4, 3, 3, 16)), padding=1, kernel_layout="OIHW16o"),
    ]


@pytest.mark.parametrize("index", range(9))
def test_conv_call_round_trips_through_the_text_format(index) -> None:
    from kiln.relay.parser import parse
    from kiln.relay.printer import astext

    call = _conv_calls()[index]
    func = relay.Function(list(dict.fromkeys(a for a in call.args if isinstance(a, relay.Var))), call)
    text = astext(func)
    again = parse(text)
    assert astext(again) == text
    assert again.body.attrs == call.attrs
    assert relay.infer_type(again).checked_type.ret_type == relay.infer_type(func).checked_type.ret_type


# --- computes: each op compiled through the lowering path agrees with its reference -----------------


def _int8(*shape: int) -> np.ndarray:
    return RNG.integers(-20, 20, shape).astype("int8")


CONV2D_CASES = [
    ((1, 3, 6, 6), (4, 3, 3, 3), {}),
    ((2, 3, 7, 7), (4, 3, 3, 3), {"strides": 2}),
    ((1, 3, 7, 6), (4, 3, 3, 3), {"padding": 1}),
    ((1, 3, 7, 6), (4, 3, 3, 2), {"strides": (2, 1), "padding": (1, 0, 2, 1)}),
    ((1, 2, 9, 9), (3, 2, 3, 3), {"dilation": 2, "padding": 2}),
    ((1, 2, 9, 8), (3, 2, 2, 3), {"dilation": (2, 1), "strides": (1, 3), "padding": (0, 2)}),
    ((2, 4, 7, 6), (4, 2, 3, 2), {"groups": 2, "strides": (2, 1), "padding": (1, 0, 2, 1)}),
    ((1, 3, 7, 7), (3, 1, 3, 3), {"groups": 3, "padding": 2, "dilation": 2}),
    ((1, 4, 6, 6), (8, 1, 3, 3), {"groups": 4, "padding": 1}),
    ((1, 6, 5, 5), (4, 3, 1, 1), {"groups": 2}),
    ((1, 8, 16, 16), (8, 8, 3, 3), {"padding": 1}),
]


@pytest.mark.parametrize(("x_shape", "w_shape", "kw"), CONV2D_CASES)
def test_conv2d_builds(x_shape, w_shape, kw) -> None:
    check_build("nn.conv2d", rand(*x_shape), rand(*w_shape), rtol=1e-4, atol=1e-5, **kw)


@pytest.mark.parametrize(("x_shape", "w_shape", "kw"), [CONV2D_CASES[i] for i in (0, 3, 5, 6, 8)])
def test_conv2d_builds_nhwc_hwio(x_shape, w_shape, kw) -> None:
    x = rand(*x_shape).transpose(0, 2, 3, 1).copy()
    w = rand(*w_shape).transpose(2, 3, 1, 0).copy()
    check_build("nn.conv2d", x, w, rtol=1e-4, atol=1e-5, data_layout="NHWC", **kw)


def test_conv2d_builds_nhwc_with_an_oihw_kernel() -> None:
    check_build("nn.conv2d", rand(1, 6, 6, 4), rand(2, 4, 3, 3), rtol=1e-4, atol=1e-5, padding=1,
                data_layout="NHWC", kernel_layout="OIHW")


def test_conv2d_builds_int8_accumulating_in_out_dtype() -> None:
    check_build("nn.conv2d", _int8(1, 4, 6, 6), _int8(4, 2, 3, 3), groups=2, padding=1, out_dtype="int32")
    check_build("nn.conv2d", rand(1, 2, 5, 5), rand(3, 2, 3, 3), out_dtype="float64", rtol=1e-6)


@pytest.mark.parametrize(("x_shape", "w_shape", "kw"), [
    ((1, 3, 4, 4), (3, 2, 3, 3), {}),
    ((1, 2, 4, 5), (2, 3, 3, 3), {"strides": 2}),
    ((1, 2, 4, 4), (2, 3, 3, 2), {"strides": (2, 3), "padding": (1, 0, 0, 1), "output_padding": (1, 2)}),
    ((2, 4, 3, 3), (4, 2, 3, 3), {"groups": 2, "strides": 2, "padding": 1, "output_padding": 1}),
    ((1, 2, 4, 4), (2, 2, 2, 3), {"dilation": 2, "padding": 1}),
    ((1, 2, 3, 4), (2, 1, 3, 3), {"dilation": (2, 1), "strides": (1, 2), "output_padding": (1, 1)}),
])
def test_conv2d_transpose_builds(x_shape, w_shape, kw) -> None:
    check_build("nn.conv2d_transpose", rand(*x_shape), rand(*w_shape), rtol=1e-4, atol=1e-5, **kw)


def test_conv2d_transpose_builds_with_out_dtype() -> None:
    check_build("nn.conv2d_transpose", _int8(1, 2, 3, 3), _int8(2, 2, 2, 2), strides=2, out_dtype="int32")


def test_conv2d_fuses_with_its_bias_and_relu_epilogue() -> None:
    from kiln.relay.backend.te_compiler import compile_primitive

    x, w, b = rand(1, 4, 8, 8), rand(6, 4, 3, 3), rand(6)
    params = [relay.var("x", shape=x.shape), relay.var("w", shape=w.shape), relay.var("b", shape=b.shape)]
    body = relay.nn.relu(relay.nn.bias_add(relay.nn.conv2d(params[0], params[1], padding=1), params[2]))
    func = relay.infer_type(relay.Function(params, body))
    (got,) = compile_primitive(func, "llvm", name="conv_bias_relu")(x, w, b)
    conv = ref("nn.conv2d", x, w, padding=1)
    np.testing.assert_allclose(got, np.maximum(conv + b[None, :, None, None], 0), rtol=1e-4, atol=1e-5)
