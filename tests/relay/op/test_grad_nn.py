"""The gradients of the nn ops, the matrix products, the reductions and the normalizations, each against
central finite differences of the op's numpy reference in float64, over at least two shapes, run by the
reference interpreter and compiled (llvm)."""

from __future__ import annotations

import numpy as np
import pytest
from op_grad_helpers import (
    MODES,
    Case,
    case_params,
    check_op_grad,
    finite_difference,
    gradient_exprs,
    ops_with_fewer_than_two_shapes,
    run_gradient,
)

from kiln.errors import KilnError
from kiln.registry import Op, attr

RNG = np.random.default_rng(7)


def rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape)


def away_from_zero(*shape: int) -> np.ndarray:
    """Values with |x| >= 0.1: a kink at 0 (relu) is not within a finite difference's step."""
    x = rand(*shape)
    return np.where(np.abs(x) < 0.1, 0.1 + np.abs(x), x)


def with_zeros(*shape: int) -> np.ndarray:
    """Values with exact zeros among them: cumprod's gradient must not divide by an element."""
    x = rand(*shape)
    x.flat[::3] = 0.0
    return x


def distinct(*shape: int) -> np.ndarray:
    """Values without ties, at least 0.05 apart: max and min have one winner each."""
    n = int(np.prod(shape))
    return (RNG.permutation(n) * 0.05 + 0.3 * RNG.random()).reshape(shape) * RNG.choice([-1, 1])



# op, arrays, attrs: each op over at least two shapes
CASES: list[Case] = [
    ("nn.dense", [rand(3, 4), rand(5, 4)], {}),
    ("nn.dense", [rand(2, 3, 4), rand(2, 4)], {"units": 2}),
    ("nn.dense", [rand(4), rand(3, 4)], {}),
    ("nn.matmul", [rand(3, 4), rand(4, 5)], {}),
    ("nn.matmul", [rand(2, 3, 4), rand(4, 5)], {}),
    ("nn.matmul", [rand(2, 4, 3), rand(1, 5, 4)], {"transpose_a": True, "transpose_b": True}),
    ("nn.matmul", [rand(3, 4), rand(2, 5, 4)], {"transpose_b": True}),
    ("nn.matmul", [rand(2, 1, 4, 3), rand(3, 4, 5)], {"transpose_a": True}),
    ("nn.batch_matmul", [rand(2, 3, 4), rand(2, 5, 4)], {}),
    ("nn.batch_matmul", [rand(1, 4, 3), rand(3, 4, 5)], {"transpose_a": True, "transpose_b": False}),
    ("nn.batch_matmul", [rand(3, 2, 4), rand(1, 4, 2)], {"transpose_b": False}),
    ("nn.relu", [away_from_zero(3, 4)], {}),
    ("nn.relu", [away_from_zero(2, 3, 2)], {}),
    ("nn.leaky_relu", [away_from_zero(3, 4)], {"alpha": 0.2}),
    ("nn.leaky_relu", [away_from_zero(5)], {}),
    ("nn.prelu", [away_from_zero(2, 3, 4), rand(3)], {}),
    ("nn.prelu", [away_from_zero(4, 5), rand(5)], {"axis": -1}),
    ("nn.gelu", [rand(3, 4) * 2], {}),
    ("nn.gelu", [rand(2, 3, 2) * 2], {"approximate": "tanh"}),
    ("nn.gelu", [rand(7) * 2], {"approximate": "tanh"}),
    ("nn.gelu", [rand(7) * 2], {}),
    ("nn.softmax", [rand(3, 5)], {}),
    ("nn.softmax", [rand(2, 4, 3)], {"axis": 1}),
    ("nn.log_softmax", [rand(3, 5)], {}),
    ("nn.log_softmax", [rand(2, 4, 3)], {"axis": 0}),
    ("nn.bias_add", [rand(2, 3, 4), rand(3)], {}),
    ("nn.bias_add", [rand(4, 5), rand(5)], {"axis": -1}),
    ("nn.dropout", [rand(3, 4)], {"rate": 0.3}),
    ("nn.dropout", [rand(2, 2, 3)], {}),
    ("nn.layer_norm", [rand(3, 5), rand(5), rand(5)], {}),
    ("nn.layer_norm", [rand(2, 4, 3), rand(4), rand(4)], {"axis": 1, "epsilon": 1e-3}),
    ("nn.layer_norm", [rand(2, 4), rand(4), rand(4)], {"scale": False, "center": False}),
    ("nn.batch_norm", [rand(2, 3, 4), rand(3), rand(3), rand(3), np.abs(rand(3)) + 0.5], {}),
    ("nn.batch_norm", [rand(4, 3), rand(3), rand(3), rand(3), np.abs(rand(3)) + 0.5], {"axis": -1, "scale": False}),
    ("nn.batch_norm", [rand(2, 3), rand(3), rand(3), rand(3), np.abs(rand(3)) + 0.5], {"center": False}),
    ("sum", [rand(3, 4)], {}),
    ("sum", [rand(2, 3, 4)], {"axis": (0, 2), "keepdims": True}),
    ("sum", [rand(2, 3, 4)], {"axis": 1, "exclude": True}),
    ("mean", [rand(3, 4)], {"axis": -1}),
    ("mean", [rand(2, 3, 4)], {"axis": (1,), "keepdims": True}),
    ("mean", [rand(2, 3, 4)], {"axis": 0, "exclude": True, "keepdims": True}),
    ("max", [distinct(3, 4)], {"axis": 1}),
    ("max", [distinct(2, 3, 4)], {}),
    ("max", [distinct(2, 3, 4)], {"axis": (0, 2), "keepdims": True}),
    ("min", [distinct(3, 4)], {"axis": 0}),
    ("min", [distinct(2, 3, 4)], {"axis": 1, "exclude": True}),
    ("prod", [rand(3, 4)], {"axis": 1}),
    ("prod", [rand(2, 3, 4)], {"axis": (0, 2), "keepdims": True}),
    ("prod", [rand(2, 3)], {}),
    ("nn.conv2d", [rand(2, 3, 5, 5), rand(4, 3, 3, 3)], {}),
    ("nn.conv2d", [rand(1, 2, 7, 6), rand(3, 2, 3, 2)], {"strides": 2, "padding": (1, 0, 2, 1)}),
    ("nn.conv2d", [rand(1, 4, 6, 6), rand(4, 2, 2, 3)], {"groups": 2, "dilation": (2, 1), "padding": 1}),
    ("nn.conv2d", [rand(1, 5, 6, 3), rand(3, 3, 3, 2)], {"data_layout": "NHWC", "strides": (1, 2), "padding": 1}),
    ("nn.conv2d_transpose", [rand(1, 2, 3, 3), rand(2, 3, 3, 3)], {"strides": 2, "padding": 1,
                                                                   "output_padding": 1}),
    ("nn.conv2d_transpose", [rand(2, 4, 3, 2), rand(4, 1, 2, 2)], {"groups": 2}),
    ("nn.conv2d_transpose", [rand(1, 2, 3, 4), rand(2, 2, 3, 2)], {"dilation": (2, 1), "padding": (1, 0, 2, 1)}),
    ("nn.conv2d_transpose", [rand(1, 4, 2, 3), rand(4, 1, 2, 3)], {"strides": (1, 2), "dilation": 2, "groups": 4,
                                                                   "output_padding": (1, 1), "padding": (0, 2, 1, 0)}),
    ("nn.max_pool2d", [distinct(1, 2, 4, 4)], {"pool_size": 2, "strides": 2}),
    ("nn.max_pool2d", [distinct(2, 1, 5, 6)], {"pool_size": (3, 2), "strides": (2, 1), "padding": 1}),
    ("nn.max_pool2d", [distinct(1, 5, 5, 2)], {"pool_size": 2, "strides": 2, "ceil_mode": True, "layout": "NHWC"}),
    ("nn.avg_pool2d", [rand(1, 2, 4, 4)], {"pool_size": 2, "strides": 2}),
    ("nn.avg_pool2d", [rand(2, 1, 5, 6)], {"pool_size": 3, "strides": 2, "padding": 1}),
    ("nn.avg_pool2d", [rand(1, 2, 5, 5)], {"pool_size": 2, "strides": 2, "padding": 1, "count_include_pad": True,
                                           "ceil_mode": True, "dilation": (1, 2)}),
    ("nn.global_avg_pool2d", [rand(2, 3, 2, 4)], {}),
    ("nn.global_avg_pool2d", [rand(1, 3, 2, 2)], {"layout": "NHWC"}),
    ("nn.global_max_pool2d", [distinct(2, 3, 2, 4)], {}),
    ("nn.global_max_pool2d", [distinct(1, 3, 2, 2)], {"layout": "NHWC"}),
    ("nn.pad", [rand(2, 3), rand()], {"pad_width": ((1, 2), (0, 1))}),
    ("nn.pad", [rand(2, 2, 3), rand()], {"pad_width": ((0, 0), (2, 0), (0, 0))}),
    ("nn.pad", [rand(3), rand()], {"pad_width": ((0, 0),)}),
    ("nn.pad", [rand(3, 4), rand()], {"pad_width": ((1, 2), (2, 1)), "pad_mode": "reflect"}),
    ("nn.pad", [rand(2, 3), rand()], {"pad_width": ((0, 0), (2, 3)), "pad_mode": "edge"}),
    ("nn.pad", [rand(3, 2), rand()], {"pad_width": ((4, 5), (0, 1)), "pad_mode": "wrap"}),
    ("nn.pad", [rand(1, 2, 3), rand()], {"pad_width": ((0, 0), (1, 1), (0, 2)), "pad_mode": "edge"}),
    ("cumsum", [rand(3, 4)], {"axis": 1}),
    ("cumsum", [rand(2, 3, 4)], {"axis": 0, "exclusive": True}),
    ("cumsum", [rand(5)], {"reverse": True}),
    ("cumsum", [rand(2, 5)], {"axis": -1, "reverse": True, "exclusive": True}),
    ("cumprod", [with_zeros(3, 4)], {"axis": 1}),
    ("cumprod", [with_zeros(3, 4)], {"axis": 0, "exclusive": True}),
    ("cumprod", [rand(2, 3, 4)], {"axis": 1, "reverse": True}),
    ("cumprod", [with_zeros(2, 5)], {"axis": -1, "reverse": True, "exclusive": True}),
]


@pytest.mark.parametrize("compiled", MODES)
@pytest.mark.parametrize("case", case_params(CASES))
def test_gradient_matches_finite_differences(case: Case, compiled: bool) -> None:
    op, arrays, kw = case
    check_op_grad(op, arrays, compiled=compiled, **kw)


def test_every_case_op_has_two_shapes() -> None:
    assert not ops_with_fewer_than_two_shapes(CASES)


def test_matmul_gradient_of_float16_inputs_with_float32_out_dtype_is_float16() -> None:
    a, b = rand(3, 4).astype("float16"), rand(4, 2).astype("float16")
    got, (g,) = run_gradient("nn.matmul", [a, b], out_dtype="float32")
    assert got[0] is not None and got[0].dtype == np.float16
    want = g.astype(np.float16).astype(np.float32) @ b.astype(np.float32).T
    np.testing.assert_allclose(got[0].astype(np.float32), want, rtol=1e-2, atol=1e-2)


def test_dense_of_a_packed_weight_asks_to_differentiate_before_alter_op_layout() -> None:
    x, w = rand(2, 4), rand(2, 4, 8)  # NK8n: 16 units
    with pytest.raises(KilnError, match=r"nn\.dense.*NK8n.*before AlterOpLayout"):
        gradient_exprs("nn.dense", [x, w], weight_layout="NK8n")


def test_max_splits_its_gradient_evenly_among_ties() -> None:
    x = np.array([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0], [5.0, -1.0, 4.0, 5.0]])
    g = np.array([6.0, 8.0, 1.0])
    (got,), _ = run_gradient("max", [x], gvals=[g], axis=1)
    want = np.array([[0, 3, 3, 0], [2, 2, 2, 2], [0.5, 0, 0, 0.5]])
    np.testing.assert_array_equal(got, want)
    (got,), _ = run_gradient("min", [x], gvals=[g], axis=1, compiled=True)
    np.testing.assert_array_equal(got, [[0, 0, 0, 6], [2, 2, 2, 2], [0, 1, 0, 0]])


def test_prod_gradient_with_zeros_is_the_product_of_the_others() -> None:
    x = np.array([[2.0, 0.0, 3.0], [0.0, 0.0, 5.0], [1.0, 4.0, 2.0]])
    g = np.array([1.0, 1.0, 2.0])
    for compiled in (False, True):
        (got,), _ = run_gradient("prod", [x], gvals=[g], axis=1, compiled=compiled)
        np.testing.assert_array_equal(got, [[0, 6, 0], [0, 0, 0], [16, 4, 8]])


def test_max_pool_splits_its_gradient_evenly_among_ties_in_a_window() -> None:
    x = np.array([[[[1.0, 1.0, 0.0, 2.0], [0.0, 1.0, 2.0, -1.0]]]])
    g = np.array([[[[6.0, 4.0]]]])
    (got,), _ = run_gradient("nn.max_pool2d", [x], gvals=[g], pool_size=2, strides=2, compiled=True)
    np.testing.assert_array_equal(got, [[[[2, 2, 0, 2], [0, 2, 2, 0]]]])


def test_conv2d_of_a_packed_weight_asks_to_differentiate_before_alter_op_layout() -> None:
    with pytest.raises(KilnError, match=r"nn\.conv2d.*OIHW4o.*before AlterOpLayout"):
        gradient_exprs("nn.conv2d", [rand(1, 2, 4, 4), rand(1, 2, 3, 3, 4)], kernel_layout="OIHW4o")


@pytest.mark.parametrize("op", ["argmax", "argmin", "nn.max_pool2d_argmax"])
def test_arg_reductions_say_why_they_have_no_gradient(op: str) -> None:
    entry = Op.get(op)
    assert entry.get_attr(attr.FPrimalGradient) is None
    assert "integer" in entry.get_attr(attr.TNonDifferentiable)


def test_conv2d_transpose_gradient_of_float16_inputs_with_float32_out_dtype_is_float16() -> None:
    x, w = rand(1, 2, 3, 3), rand(2, 2, 2, 2)
    kw = {"strides": 2, "output_padding": 1}
    g = rand(1, 2, 7, 7)
    want, _ = run_gradient("nn.conv2d_transpose", [x, w], gvals=[g], **kw)
    got, _ = run_gradient("nn.conv2d_transpose", [x.astype("float16"), w.astype("float16")],
                          gvals=[g.astype("float32")], compiled=True, out_dtype="float32", **kw)
    for a, b in zip(got, want, strict=True):
        assert a is not None and b is not None and a.dtype == np.float16
        np.testing.assert_allclose(a.astype(np.float64), b, rtol=2e-2, atol=2e-2)


def _rois(*boxes: tuple[float, float, float, float]) -> np.ndarray:
    return np.array(boxes, dtype=np.float64)


# nn.roi_align: (data, rois, batch indices), attrs. The boxes get no gradient (see vision_grad), so these
# check the data's only; the gradient is linear in the data (avg) or piecewise so (max), and the boxes stay
# fixed, so central differences are exact up to rounding. A box past the image's edge has out-of-range
# samples; a batch index past N is clamped.
ROI_CASES: list[Case] = [
    ("nn.roi_align", [rand(2, 2, 5, 6), _rois((0.3, 0.6, 4.1, 3.7), (-2.6, 1.2, 2.3, 5.9), (1.1, 0.2, 1.9, 1.3)),
                      np.array([0, 1, 3], dtype=np.int32)],
     {"output_size": (2, 3), "sampling_ratio": 2, "spatial_scale": 1.0}),
    ("nn.roi_align", [rand(1, 3, 4, 4), _rois((1.3, 0.7, 6.2, 5.1), (0.2, 0.4, 1.1, 0.9)),
                      np.array([0, 0], dtype=np.int64)],
     {"output_size": 2, "sampling_ratio": 1, "spatial_scale": 0.6, "half_pixel": False}),
    ("nn.roi_align", [distinct(2, 2, 5, 6), _rois((0.3, 0.6, 4.1, 3.7), (-2.6, 1.2, 2.3, 5.9), (7.6, 0.5, 9.4, 2.1)),
                      np.array([1, 0, 0], dtype=np.int32)],
     {"output_size": (2, 3), "sampling_ratio": 2, "mode": "max"}),
    ("nn.roi_align", [np.abs(distinct(1, 2, 4, 5)) + 0.1, _rois((0.4, 0.3, 3.3, 3.6), (2.2, 1.7, 7.9, 6.1)),
                      np.array([0, 2], dtype=np.int64)],
     {"output_size": 2, "sampling_ratio": 3, "spatial_scale": 0.7, "mode": "max", "half_pixel": False}),
]


@pytest.mark.parametrize("compiled", MODES)
@pytest.mark.parametrize("case", case_params(ROI_CASES))
def test_roi_align_data_gradient_matches_finite_differences(case: Case, compiled: bool) -> None:
    op, arrays, kw = case
    got, gvals = run_gradient(op, arrays, compiled=compiled, **kw)
    assert got[1] is None and got[2] is None  # the boxes and the indices take no gradient
    want = finite_difference(op, list(arrays), 0, gvals, kw)
    assert got[0] is not None and np.abs(want).max() > 0.1  # some gradient reaches the data
    np.testing.assert_allclose(got[0], want, rtol=1e-5, atol=1e-6)


def test_roi_align_cases_cover_two_shapes_of_each_mode() -> None:
    for mode in ("avg", "max"):
        cases = [c for c in ROI_CASES if c[2].get("mode", "avg") == mode]
        assert not ops_with_fewer_than_two_shapes(cases) and cases


def test_roi_align_max_splits_its_gradient_evenly_among_tied_candidates() -> None:
    # one sample at (1.5, 1.5) of a constant image: its 4 weighted pixels (0.25 each) tie for the maximum
    data = np.full((1, 1, 4, 4), 2.0)
    rois, batch = _rois((0.5, 0.5, 2.5, 2.5)), np.array([0], dtype=np.int32)
    for compiled in (False, True):
        got, _ = run_gradient("nn.roi_align", [data, rois, batch], gvals=[np.array([[[[8.0]]]])], compiled=compiled,
                              sampling_ratio=1, mode="max", half_pixel=False)
        want = np.zeros((1, 1, 4, 4))
        want[0, 0, 1:3, 1:3] = 8.0 / 4 * 0.25
        np.testing.assert_array_equal(got[0], want)
