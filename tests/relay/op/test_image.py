"""image.resize (kiln.relay.op.image) against ONNX's own reference implementation of Resize.

Each case builds a one-node ONNX Resize model (opset 19) and runs it through
`onnx.reference.ReferenceEvaluator`; kiln's side runs the same call through the
reference interpreter (`relay.create_executor`, the op's numpy reference) over
the whole grid of method x coordinate_transformation_mode x nearest_mode, and
through `relay.build` on llvm over a smaller grid (each case compiles a kernel).

ONNX's reference computes the cubic weights in float32 (its attribute
`cubic_coeff_a` arrives as a numpy float32, which makes the coefficient
arithmetic float32): about 1e-6 off for values of order 1. The `onnx_float64_cubic`
fixture makes it compute them in float64, as the rest of it, so that float32
outputs are compared at float32 tolerances; one test checks the unpatched
reference agrees to its own precision.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import onnx.reference.ops.op_resize as onnx_resize_ops
import pytest
from onnx import helper
from onnx.reference import ReferenceEvaluator
from op_helpers import rel

from kiln import relay
from kiln.ir.attrs import AttrsError
from kiln.ir.types import SizeVar, TensorType
from kiln.relay.op import image
from kiln.relay.op._rel import RelationError

RNG = np.random.default_rng(7)
MODES = ["half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric",
         "tf_crop_and_resize"]
NEAREST_MODES = ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]
# normalized crops whose ends are exact in float32 (ONNX's roi is a float32 tensor) and reach outside the input
ROI_STARTS, ROI_ENDS = [0.125, -0.25, 0.25], [0.875, 1.25, 0.75]


@pytest.fixture(autouse=True)
def onnx_float64_cubic(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """ONNX's reference with its cubic weights in float64 (see the module docstring)."""
    cubic = onnx_resize_ops._cubic_coeffs
    monkeypatch.setattr(onnx_resize_ops, "_cubic_coeffs", lambda r, scale=None, A=-0.75: cubic(r, scale, float(A)))
    yield


def onnx_model(x: np.ndarray, op: str, inputs: dict[str, np.ndarray], opset: int = 19, **attributes: Any) -> Any:
    """A one-node model of `op` on X (shaped and typed like `x`), its other inputs constant initializers."""
    dt = helper.np_dtype_to_tensor_dtype(x.dtype)
    inits = [helper.make_tensor(name, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape, v.ravel().tolist())
             for name, v in inputs.items()]
    node = helper.make_node(op, ["X", *inputs], ["Y"], **attributes)
    graph = helper.make_graph([node], op.lower(), [helper.make_tensor_value_info("X", dt, x.shape)],
                              [helper.make_tensor_value_info("Y", dt, None)], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def onnx_resize(x: np.ndarray, axes: tuple[int, ...] | None, sizes: list[int] | None = None,
                scales: list[float] | None = None, roi: list[float] | None = None, **attributes: Any) -> np.ndarray:
    """ONNX Resize (opset 19) of `x` by its reference implementation."""
    f32 = np.float32
    inputs = {"roi": np.asarray(roi or [], f32), "scales": np.asarray(scales or [], f32)}
    if sizes is not None:
        inputs["sizes"] = np.asarray(sizes, np.int64)
    if axes is not None:
        attributes["axes"] = list(axes)
    out: np.ndarray = ReferenceEvaluator(onnx_model(x, "Resize", inputs, **attributes)).run(None, {"X": x})[0]
    return out


class Case:
    """One resize: the input shape, the axes, and either the output sizes or ONNX's scales."""

    def __init__(self, label: str, shape: tuple[int, ...], axes: tuple[int, ...], sizes: list[int] | None = None,
                 scales: list[float] | None = None) -> None:
        self.label, self.shape, self.axes = label, shape, axes
        self.onnx_scales = scales
        if scales is not None:  # as ONNX: the scales arrive as float32, the size is floor(extent * scale)
            self.scales: list[float] | None = [float(np.float32(s)) for s in scales]
            self.size = [math.floor(s * shape[a]) for s, a in zip(self.scales, axes, strict=True)]
        else:
            assert sizes is not None
            self.scales, self.size = None, sizes
        self.onnx_sizes = sizes

    def kiln_attrs(self, mode: str, **kw: Any) -> dict[str, Any]:
        """The keywords of relay.image.resize for this case (roi for tf_crop_and_resize)."""
        k = len(self.axes)
        roi = ROI_STARTS[:k] + ROI_ENDS[:k] if mode == "tf_crop_and_resize" else None
        return {"size": self.size, "axes": self.axes, "coordinate_transformation_mode": mode, "roi": roi,
                "scales": self.scales, **kw}

    def onnx(self, x: np.ndarray, mode: str, method: str, nearest_mode: str = "round_prefer_floor",
             exclude_outside: bool = False, extrapolation_value: float = 0.0, all_axes: bool = False) -> np.ndarray:
        """ONNX's result; with `all_axes`, the model names no axes and gives every axis a size or scale."""
        kw = self.kiln_attrs(mode)
        axes: tuple[int, ...] | None = tuple(a % x.ndim for a in self.axes)  # the reference takes no negative axes
        sizes, scales, roi = self.onnx_sizes, self.onnx_scales, kw["roi"]
        if all_axes:
            assert axes is not None and sorted(axes) == list(range(x.ndim))
            order = np.argsort(axes)
            axes = None
            sizes = None if sizes is None else [sizes[i] for i in order]
            scales = None if scales is None else [scales[i] for i in order]
            roi = None if roi is None else [roi[i] for i in order] + [roi[len(order) + i] for i in order]
        return onnx_resize(x, axes, sizes=sizes, scales=scales, roi=roi, mode=method,
                           coordinate_transformation_mode=mode, nearest_mode=nearest_mode,
                           exclude_outside=int(exclude_outside), extrapolation_value=extrapolation_value)


CASES = [
    Case("up", (1, 2, 4, 5), (2, 3), sizes=[8, 7]),
    Case("down", (1, 2, 6, 7), (2, 3), sizes=[3, 4]),
    Case("to-1x1", (1, 1, 3, 4), (2, 3), sizes=[1, 1]),
    Case("scales", (1, 2, 4, 5), (2, 3), scales=[2.5, 0.6]),
    Case("3d-all-axes", (2, 3, 5), (0, 1, 2), sizes=[3, 3, 9]),
    Case("3d-scales-neg-axes", (2, 5, 5), (-1, -2), scales=[0.5, 1.7]),
]


def interpret(x: np.ndarray, **kw: Any) -> np.ndarray:
    """relay.image.resize of `x` through the reference interpreter."""
    v = relay.var("x", shape=x.shape, dtype=str(x.dtype))
    mod = relay.IRModule.from_expr(relay.Function([v], relay.image.resize(v, **kw)))
    out: np.ndarray = relay.create_executor("debug", mod).evaluate()(x)
    return out


def build_and_run(x: np.ndarray, **kw: Any) -> np.ndarray:
    """relay.image.resize of `x` compiled by relay.build for llvm, and run."""
    v = relay.var("x", shape=x.shape, dtype=str(x.dtype))
    lib = relay.build(relay.IRModule.from_expr(relay.Function([v], relay.image.resize(v, **kw))), target="llvm")
    out: np.ndarray = lib.create_executor()(x=x)
    return out


def check(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.dtype, want.shape)
    if got.dtype.kind == "f":
        # cubic sums 16 float32 products of values near 3: an output near 0 carries ~1e-6 of rounding
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    else:
        np.testing.assert_array_equal(got, want)


def data(shape: tuple[int, ...], dtype: str = "float32") -> np.ndarray:
    return RNG.standard_normal(shape).astype(dtype)


# --- the reference interpreter: the whole grid ----------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=[c.label for c in CASES])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("nearest_mode", NEAREST_MODES)
def test_nearest_matches_onnx(case: Case, mode: str, nearest_mode: str) -> None:
    x = data(case.shape)
    got = interpret(x, method="nearest", nearest_mode=nearest_mode, extrapolation_value=-3.0,
                    **case.kiln_attrs(mode))
    check(got, case.onnx(x, mode, "nearest", nearest_mode, extrapolation_value=-3.0))


@pytest.mark.parametrize("case", CASES, ids=[c.label for c in CASES])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("method", ["linear", "cubic"])
@pytest.mark.parametrize("exclude_outside", [False, True])
def test_linear_and_cubic_match_onnx(case: Case, mode: str, method: str, exclude_outside: bool) -> None:
    x = data(case.shape)
    got = interpret(x, method=method, exclude_outside=exclude_outside, extrapolation_value=0.5,
                    **case.kiln_attrs(mode))
    check(got, case.onnx(x, mode, method, exclude_outside=exclude_outside, extrapolation_value=0.5))


@pytest.mark.parametrize("mode", ["pytorch_half_pixel", "half_pixel"])
@pytest.mark.parametrize("nearest_mode", ["round_prefer_floor", "floor"])
def test_nearest_with_exclude_outside_zeroes_samples_outside_as_onnx(mode: str, nearest_mode: str) -> None:
    """ONNX's reference gives weight 0 to a nearest sample outside the input, leaving 0."""
    case = Case("up-and-to-1", (1, 1, 3, 4), (2, 3), sizes=[1, 9])
    x = data(case.shape)
    got = interpret(x, method="nearest", nearest_mode=nearest_mode, exclude_outside=True, **case.kiln_attrs(mode))
    check(got, case.onnx(x, mode, "nearest", nearest_mode, exclude_outside=True))


@pytest.mark.parametrize("method", ["nearest", "linear", "cubic"])
def test_resizing_every_axis_matches_onnx_without_axes(method: str) -> None:
    """A model that names no axes resizes all of them; the unchanged ones (N, C) are left alone."""
    case = Case("all", (1, 2, 4, 5), (0, 1, 2, 3), sizes=[1, 2, 7, 3])
    x = data(case.shape)
    check(interpret(x, method=method, **case.kiln_attrs("half_pixel")), case.onnx(x, "half_pixel", method,
                                                                                  all_axes=True))


@pytest.mark.parametrize("method", ["nearest", "linear", "cubic"])
def test_other_dtypes_match_onnx(method: str) -> None:
    """Integers round half to even and saturate (cubic overshoots), as ONNX's saturate_cast; float64 stays float64."""
    case = Case("up", (1, 1, 4, 5), (2, 3), sizes=[9, 7])
    for x in [RNG.integers(0, 256, case.shape).astype("uint8"), RNG.integers(-500, 500, case.shape).astype("int32"),
              data(case.shape, "float64")]:
        check(interpret(x, method=method, **case.kiln_attrs("asymmetric")), case.onnx(x, "asymmetric", method))


def test_unpatched_onnx_cubic_agrees_to_its_float32_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.undo()  # the reference as shipped: cubic weights in float32
    case = CASES[0]
    x = data(case.shape)
    got = interpret(x, method="cubic", **case.kiln_attrs("half_pixel"))
    np.testing.assert_allclose(got, case.onnx(x, "half_pixel", "cubic"), rtol=1e-5, atol=1e-5)


def test_upsample_nearest_is_asymmetric_floor_as_onnx_upsample() -> None:
    """ONNX's Upsample (opset 9) lowers to image.resize with asymmetric coordinates and floor rounding."""
    x = data((1, 2, 3, 4))
    model = onnx_model(x, "Upsample", {"scales": np.asarray([1, 1, 2, 3], np.float32)}, opset=9, mode="nearest")
    want = ReferenceEvaluator(model).run(None, {"X": x})[0]
    kw = {"size": (6, 12), "axes": (2, 3), "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor",
          "scales": (2.0, 3.0)}
    check(interpret(x, **kw), want)
    check(build_and_run(x, **kw), want)


# --- relay.build on llvm: a cross-section of the grid ------------------------------------------------

BUILT = [
    *(("nearest", mode, nm, 0, False) for nm in NEAREST_MODES for mode in ["half_pixel"]),
    ("nearest", "asymmetric", "floor", 3, False),
    ("nearest", "tf_crop_and_resize", "round_prefer_ceil", 1, False),
    ("nearest", "pytorch_half_pixel", "round_prefer_floor", 2, True),
    *(("linear", mode, "round_prefer_floor", i % 2, False) for i, mode in enumerate(MODES)),
    ("linear", "half_pixel", "round_prefer_floor", 4, False),
    ("linear", "align_corners", "round_prefer_floor", 5, True),
    ("cubic", "half_pixel", "round_prefer_floor", 0, False),
    ("cubic", "tf_crop_and_resize", "round_prefer_floor", 3, True),
]


@pytest.mark.parametrize(("method", "mode", "nearest_mode", "case", "exclude_outside"), BUILT,
                         ids=[f"{m}-{c}-{n}-{CASES[k].label}{'-excl' if e else ''}" for m, c, n, k, e in BUILT])
def test_built_resize_matches_onnx(method: str, mode: str, nearest_mode: str, case: int,
                                   exclude_outside: bool) -> None:
    c = CASES[case]
    x = data(c.shape)
    got = build_and_run(x, method=method, nearest_mode=nearest_mode, exclude_outside=exclude_outside,
                        extrapolation_value=0.25, **c.kiln_attrs(mode))
    check(got, c.onnx(x, mode, method, nearest_mode, exclude_outside=exclude_outside, extrapolation_value=0.25))


@pytest.mark.parametrize(("dtype", "method"), [("int32", "nearest"), ("uint8", "linear")])
def test_built_resize_of_integers_matches_onnx(dtype: str, method: str) -> None:
    case = Case("up", (1, 2, 3, 4), (2, 3), sizes=[7, 5])
    x = RNG.integers(0, 256, case.shape).astype(dtype)
    kw = case.kiln_attrs("tf_crop_and_resize", method=method, extrapolation_value=300.0)  # saturates to 255
    check(build_and_run(x, **kw), case.onnx(x, "tf_crop_and_resize", method, extrapolation_value=300.0))


def test_resize_fuses_with_its_neighbours() -> None:
    """An injective op: relu before and after fuse into one kernel with it."""
    v = relay.var("x", shape=(1, 2, 4, 4))
    body = relay.nn.relu(relay.image.resize(relay.nn.relu(v), (8, 6), (2, 3), method="linear"))
    func = relay.Function([v], body)
    mod = relay.optimize(func)
    assert str(mod).count("image.resize") == 1 and str(mod).count("Primitive=1") == 1
    x = data((1, 2, 4, 4))
    want = np.maximum(interpret(np.maximum(x, 0), size=(8, 6), axes=(2, 3), method="linear"), 0)
    np.testing.assert_allclose(relay.build(func, target="llvm").create_executor()(x=x), want, rtol=1e-5, atol=1e-6)


# --- types, attributes, text -----------------------------------------------------------------------


def test_relation_replaces_the_resized_dims() -> None:
    n = SizeVar("n")
    out = rel("image.resize", [TensorType((n, 3, 10, 12), "float16")], size=(5, 24), axes=(2, -1), method="cubic")
    assert out == TensorType((n, 3, 5, 24), "float16")
    out = rel("image.resize", [TensorType((4, 6), "int8")], size=(2,), axes=(0,))
    assert out == TensorType((2, 6), "int8")
    assert rel("image.resize", [TensorType((4, 6))], size=(), axes=()) == TensorType((4, 6))


def test_constructor_types_and_is_relay_image() -> None:
    assert relay.image.resize is image.resize
    x = relay.var("x", shape=(1, 3, 8, 8))
    call = relay.image.resize(x, [16, 4], [2, 3], method="linear", scales=np.asarray([2, 0.5], np.float32))
    assert relay.infer_type(call).checked_type == TensorType((1, 3, 16, 4))
    assert call.attrs.scales == (2.0, 0.5) and call.attrs.size == (16, 4)


def test_cubic_over_unchanged_axes_counts_only_the_resized_ones() -> None:
    out = rel("image.resize", [TensorType((1, 3, 8, 8))], size=(1, 3, 4, 4), axes=(0, 1, 2, 3), method="cubic")
    assert out == TensorType((1, 3, 4, 4))


@pytest.mark.parametrize(("kw", "message"), [
    ({"size": (4, 4), "axes": (2, 4)}, r"resized axis 4 is out of range for a tensor of rank 4 \(allowed: -4 to 3\)"),
    ({"size": (4, 4), "axes": (2, -2)}, r"attribute axes \[2, -2\] names axis 2 twice"),
    ({"size": (4,), "axes": (2, 3)},
     r"attribute size \[4\] has 1 extent but axes \[2, 3\] names 2 axes: give one extent per resized axis"),
    ({"size": (4, 4), "axes": (2, 3), "scales": (2.0,)},
     r"attribute scales has 1 value but axes \[2, 3\] names 2 axes: give one scale per resized axis"),
    ({"size": (4, 4), "axes": (2, 3), "roi": (0.0, 1.0)},
     r"attribute roi has 2 values but needs 4: the starts, then the ends, of the 2 resized axes"),
    ({"size": (2, 2, 4, 4), "axes": (0, 1, 2, 3), "method": "cubic"},
     r"method 'cubic' over 4 resized axes reads 256 input elements per output element; at most 64"),
])
def test_relation_errors(kw: dict[str, Any], message: str) -> None:
    with pytest.raises(RelationError, match=message) as info:
        rel("image.resize", [TensorType((1, 3, 8, 8))], **kw)
    assert info.value.arg == 0


def test_linear_of_bool_is_refused() -> None:
    with pytest.raises(RelationError, match=r"method 'linear' needs a numeric tensor, found dtype bool"):
        rel("image.resize", [TensorType((2, 4), "bool")], size=(8,), axes=(1,), method="linear")
    assert rel("image.resize", [TensorType((2, 4), "bool")], size=(8,), axes=(1,)) == TensorType((2, 8), "bool")


def test_bad_axes_fail_type_inference_naming_the_op() -> None:
    x = relay.var("x", shape=(1, 3, 8, 8))
    with pytest.raises(relay.TypeInferenceError, match=r"image.resize.*resized axis 5 is out of range"):
        relay.infer_type(relay.image.resize(x, (4, 4), (2, 5)))


@pytest.mark.parametrize(("kw", "message"), [
    ({"method": "bilinear"}, r"op image.resize: attribute method must be one of 'nearest', 'linear', 'cubic', "
                             r"got 'bilinear'"),
    ({"coordinate_transformation_mode": "tf_half_pixel_for_nn"},
     r"attribute coordinate_transformation_mode must be one of 'half_pixel', 'half_pixel_symmetric', "
     r"'pytorch_half_pixel', 'align_corners', 'asymmetric', 'tf_crop_and_resize', got 'tf_half_pixel_for_nn'"),
    ({"nearest_mode": "round"},
     r"attribute nearest_mode must be one of 'round_prefer_floor', 'round_prefer_ceil', 'floor', 'ceil', got 'round'"),
    ({"scales": (2.0, 0.0)}, r"attribute scales must be a list of numbers > 0, got \(2.0, 0.0\)"),
    ({"size": (4, 0)}, r"attribute size must be a list of ints >= 1, got \(4, 0\)"),
    ({"exclude_outside": 1}, r"attribute exclude_outside must be true or false, got 1"),
])
def test_attrs_errors(kw: dict[str, Any], message: str) -> None:
    x = relay.var("x", shape=(1, 3, 8, 8))
    args: dict[str, Any] = {"size": (4, 4), "axes": (2, 3), **kw}
    with pytest.raises(AttrsError, match=message):
        relay.image.resize(x, **args)


def test_antialias_is_not_an_attribute() -> None:
    with pytest.raises(AttrsError, match=r"op image.resize has no attribute antialias"):
        image.ResizeAttrs.make("image.resize", size=(4,), axes=(0,), antialias=True)


def test_resize_round_trips_through_the_text_format() -> None:
    from kiln.relay.parser import parse
    from kiln.relay.printer import astext

    x = relay.var("x", shape=(1, 3, 8, 8))
    call = relay.image.resize(x, (5, 12), (2, 3), method="cubic", coordinate_transformation_mode="tf_crop_and_resize",
                              cubic_coeff_a=-0.5, exclude_outside=True, extrapolation_value=-1,
                              roi=(0.1, 0.0, 0.9, 1), scales=(0.625, 1.5))
    text = astext(relay.Function([x], call))
    again = parse(text)
    assert astext(again) == text
    assert again.body.op is call.op and again.body.attrs == call.attrs
