"""The gradients of image.resize and image.grid_sample, each against central finite differences of the op's
numpy reference in float64, over at least two shapes, run by the reference interpreter and compiled (llvm)."""

from __future__ import annotations

from typing import Any

import numpy as np
import op_grad_helpers
import pytest
from op_grad_helpers import MODES, Case, case_params, check_op_grad, ops_with_fewer_than_two_shapes, run_gradient

RNG = np.random.default_rng(11)


def rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape)


def grid(n: int, out: tuple[int, ...], sizes: tuple[int, ...], align_corners: bool = False,
         outside: int = 0) -> np.ndarray:
    """A normalized grid (n, *out, r) whose input coordinates have fractions in [0.15, 0.35] or [0.65, 0.85]:
    away from the pixels (linear's kinks), from the half-way points (nearest's jumps) and from the borders
    (-0.5 and size - 0.5, or 0 and size - 1), so finite differences stay within one piece. `outside`: how
    many pixels past each edge pixel a coordinate may land (zeros, border and reflection padding); with
    `outside` 1 every point still reads the input along each axis."""
    r = len(sizes)
    coords = []
    for k in range(r):
        size = sizes[r - 1 - k]  # entry 0 is x, the last spatial axis
        whole = RNG.integers(-outside, size - 1 + outside, (n, *out))
        frac = RNG.uniform(0.15, 0.35, (n, *out)) + RNG.choice([0.0, 0.5], (n, *out))
        x = whole + frac
        coords.append(2 * x / (size - 1) - 1 if align_corners else (2 * x + 1) / size - 1)
    return np.stack(coords, axis=-1)


GS = "image.grid_sample"

# op, arrays, attrs: each op over at least two shapes
CASES: list[Case] = [
    ("image.resize", [rand(1, 1, 2, 3)], {"size": (3, 5), "axes": (2, 3)}),
    ("image.resize", [rand(2, 5)], {"size": (3,), "axes": (1,), "coordinate_transformation_mode": "asymmetric",
                                    "nearest_mode": "ceil"}),
    ("image.resize", [rand(4, 3)], {"size": (3, 5), "axes": (0, 1), "nearest_mode": "round_prefer_ceil",
                                    "exclude_outside": True}),
    ("image.resize", [rand(1, 2, 3, 3)], {"size": (5, 4), "axes": (2, 3), "method": "linear",
                                          "coordinate_transformation_mode": "align_corners"}),
    ("image.resize", [rand(2, 6, 5)], {"size": (4, 3), "axes": (1, 2), "method": "linear"}),
    ("image.resize", [rand(3, 4)], {"size": (3, 6), "axes": (0, 1), "method": "linear",
                                    "coordinate_transformation_mode": "half_pixel_symmetric", "scales": (1.0, 1.6)}),
    ("image.resize", [rand(1, 1, 3, 4)], {"size": (5, 6), "axes": (2, 3), "method": "cubic",
                                          "coordinate_transformation_mode": "pytorch_half_pixel"}),
    ("image.resize", [rand(6, 5)], {"size": (4, 3), "axes": (0, 1), "method": "cubic", "exclude_outside": True,
                                    "cubic_coeff_a": -0.5}),
    ("image.resize", [rand(1, 1, 4, 4)], {"size": (3, 5), "axes": (2, 3), "method": "linear",
                                          "coordinate_transformation_mode": "tf_crop_and_resize",
                                          "roi": (0.1, -0.2, 0.9, 1.3), "extrapolation_value": 2.0}),
    ("image.resize", [rand(5, 2)], {"size": (3,), "axes": (-2,), "method": "cubic",
                                    "coordinate_transformation_mode": "tf_crop_and_resize", "roi": (-0.3, 0.8)}),
    (GS, [rand(1, 2, 3, 4), grid(1, (2, 3), (3, 4), outside=1)], {}),
    (GS, [rand(2, 1, 4, 3), grid(2, (3, 2), (4, 3), align_corners=True, outside=1)],
     {"padding_mode": "border", "align_corners": True}),
    (GS, [rand(1, 2, 3, 4), grid(1, (3, 3), (3, 4), outside=1)], {"padding_mode": "border"}),
    (GS, [rand(1, 1, 2, 3, 3), grid(1, (2, 2, 1), (2, 3, 3), outside=1)], {}),
    (GS, [rand(1, 2, 3, 4), grid(1, (2, 3), (3, 4), outside=1)], {"method": "nearest"}),
    (GS, [rand(2, 1, 4, 3), grid(2, (3, 2), (4, 3), align_corners=True, outside=1)],
     {"method": "nearest", "padding_mode": "border", "align_corners": True}),
    (GS, [rand(1, 1, 4, 5), grid(1, (2, 3), (4, 5), outside=1)], {"method": "cubic"}),
    (GS, [rand(1, 2, 3, 4), grid(1, (2, 2), (3, 4), outside=5)], {"padding_mode": "reflection"}),
    (GS, [rand(1, 1, 4, 3), grid(1, (3, 2), (4, 3), align_corners=True, outside=4)],
     {"method": "cubic", "padding_mode": "reflection", "align_corners": True}),
]


@pytest.mark.parametrize("compiled", MODES)
@pytest.mark.parametrize("case", case_params(CASES))
def test_gradient_matches_finite_differences(case: Case, compiled: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    op, arrays, kw = case
    tolerances: dict[str, Any] = {}
    if op == GS:
        # the reference rounds coordinates through float32: a step of 1e-6 would measure that rounding, so the
        # grid steps by 1e-3 (within one piece: the grid keeps 0.15 pixels from every kink)
        monkeypatch.setattr(op_grad_helpers, "EPS", 1e-3)
        tolerances = {"rtol": 1e-3, "atol": 1e-4}
    got = check_op_grad(op, arrays, compiled=compiled, **tolerances, **kw)
    if op == GS and kw.get("method") != "nearest":  # the grid's gradient is checked where it is not all 0
        assert got[1] is not None and np.abs(got[1]).max() > 1e-2


def test_every_case_op_has_two_shapes() -> None:
    assert not ops_with_fewer_than_two_shapes(CASES)


def test_resize_gradient_of_a_filled_position_is_zero() -> None:
    # tf_crop_and_resize past the input: the positions read extrapolation_value, whatever the input
    x = rand(1, 4)
    kw = {"size": (3,), "axes": (1,), "method": "linear", "coordinate_transformation_mode": "tf_crop_and_resize",
          "roi": (1.5, 2.5), "extrapolation_value": 3.0}
    (got,), _ = run_gradient("image.resize", [x], compiled=True, **kw)
    assert got is not None
    np.testing.assert_array_equal(got, np.zeros_like(x))


def test_resize_linear_upsample_by_two_spreads_each_gradient_to_its_two_neighbours() -> None:
    x = np.zeros((1, 2))
    g = np.array([[1.0, 0.0, 0.0, 0.0]])  # the first output of half_pixel 2x sits at -0.25: clamped to 0
    (got,), _ = run_gradient("image.resize", [x], gvals=[g], size=(4,), axes=(1,), method="linear")
    np.testing.assert_allclose(got, [[1.0, 0.0]])
    g = np.array([[0.0, 1.0, 0.0, 0.0]])  # at 0.25: 0.75 of pixel 0, 0.25 of pixel 1
    (got,), _ = run_gradient("image.resize", [x], gvals=[g], size=(4,), axes=(1,), method="linear", compiled=True)
    np.testing.assert_allclose(got, [[0.75, 0.25]])


def test_grid_sample_nearest_gives_the_grid_no_gradient_and_sums_repeated_reads() -> None:
    data = rand(1, 1, 2, 2)
    g = np.full((1, 1, 1, 3), 2.0)
    points = np.array([[[[-0.6, -0.6], [-0.4, -0.7], [0.6, 0.6]]]])  # the first two read pixel (0, 0)
    (gd, gg), _ = run_gradient(GS, [data, points], gvals=[g], compiled=True, method="nearest")
    np.testing.assert_array_equal(gd, [[[[4.0, 0.0], [0.0, 2.0]]]])
    np.testing.assert_array_equal(gg, np.zeros_like(points))


def test_grid_sample_of_integer_data_gives_the_data_no_gradient() -> None:
    data = np.arange(8, dtype=np.int32).reshape(1, 2, 2, 2)
    (gd, gg), _ = run_gradient(GS, [data, grid(1, (2, 2), (2, 2))], method="nearest")
    assert gd is None
    assert gg is not None and not gg.any()


def test_float32_gradients_keep_the_inputs_dtypes() -> None:
    data, points = rand(1, 2, 3, 4), grid(1, (2, 3), (3, 4), outside=1)
    want, g = run_gradient(GS, [data, points])
    got, _ = run_gradient(GS, [data.astype("float32"), points.astype("float32")],
                          gvals=[g[0].astype("float32")], compiled=True)
    for w, v in zip(want, got, strict=True):
        assert v is not None and w is not None and v.dtype == np.float32
        np.testing.assert_allclose(v, w, rtol=1e-4, atol=1e-4)
    (gx,), _ = run_gradient("image.resize", [rand(2, 3).astype("float32")], size=(5,), axes=(1,), method="cubic")
    assert gx is not None and gx.dtype == np.float32


def test_resize_of_integer_data_gives_no_gradient() -> None:
    (got,), _ = run_gradient("image.resize", [np.arange(6, dtype=np.int32).reshape(2, 3)], size=(4,), axes=(1,))
    assert got is None
