"""Image ops (the `relay.image` namespace): image.resize, which ONNX's Resize (opsets 10-19) and Upsample lower
to, and image.grid_sample, ONNX's GridSample.

Each op is declared in one `register_op` chain (description, arguments,
attrs, relation, pattern, numpy reference, compute) after the functions it
names; its Python constructor follows, checked against it (`@constructor`).

What it computes follows `onnx.reference.ops.op_resize`: each resized axis maps
output position y to a source coordinate x (the coordinate transformation
mode), then reads the input around x: the nearest element (nearest), the two
neighbours (linear) or four (cubic), clamped to the input, with weights from
the fraction of x. Over several axes the weights multiply (the interpolation is
separable), so linear reads 2^k and cubic 4^k elements for k resized axes.

Choices, and why:
- The transform uses the scale ``out / in`` of each axis, or the `scales` given
  (ONNX derives the output size from its scales as ``floor(in * scale)`` and
  maps coordinates with the scale itself), and the "output width"
  ``scale * in`` as the reference does: so a model's scales reproduce its
  coordinates exactly.
- Source coordinates are computed in float64, in the reference's order of
  operations: nearest picks and the extrapolation test compare them exactly, and
  a float32 coordinate would flip ties that the reference resolves.
- Weights and sums are float32 for float16, bfloat16 and float32 data (the
  result cast back), float64 for float64 and integer data; integer results are
  rounded half to even and saturated, as the reference's `saturate_cast`.
  Nearest without `exclude_outside` is a pure gather in the data's dtype.
- An axis that keeps its size with scale 1 (and, for tf_crop_and_resize, the
  whole-axis roi) is left alone, as the reference skips it.
- No antialias (ONNX opset 18's `antialias=1`): the attrs have no such field.
  ONNX's `keep_aspect_ratio_policy` is the frontend's: it gives both `size` and
  `scales`.

image.grid_sample follows `onnx.reference.ops.op_grid_sample` step by step:
each output element reads its position from the grid (entry 0 for the last
spatial axis), denormalizes it in float32, rounds it (nearest, half to even),
moves a position outside the borders in (border: clamp, reflection: mirror),
and then reads its taps, each tap index mapped again by the padding mode (zeros
reads 0 off the input). Weights are separable, as resize's; cubic uses Keys'
kernel with a = -0.75. The taps of all axes nest in one expression per output
element, so the gather needs no intermediate buffer; indices are clamped before
every load, so NaN or huge positions read in bounds.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any, TypeVar

import attrs
import numpy as np

from kiln import te
from kiln.ir.attrs import Attrs, FieldError, bool_value, float_value, int_tuple, one_of, optional, to_int_tuple
from kiln.ir.dtype import DataType
from kiln.ir.types import Dim, TensorType, Type
from kiln.registry import OpPattern, attr, register_op
from kiln.relay.expr import Call, Expr, call
from kiln.relay.op._nn_util import Array, clamp, differ, tensor_shape
from kiln.relay.op._reg import constructor
from kiln.relay.op._rel import RelationError, normalize_axis, tensor_args
from kiln.relay.op.conv_schedules import batch_shape, batch_type_shape
from kiln.relay.op.image_grad import grid_sample_grad, resize_grad
from kiln.tir import expr as tx
from kiln.tir.expr import PrimExpr

METHODS = ("nearest", "linear", "cubic")
COORDINATE_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric",
                    "tf_crop_and_resize")
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
TAPS = {"nearest": 1, "linear": 2, "cubic": 4}  # input elements read per resized axis
FIRST_TAP = {"linear": 0, "cubic": -1}  # the offset of the first tap from floor(x)
MAX_TAPS = 64  # input elements per output element: cubic over 3 axes, linear over 6

C = TypeVar("C", Array, PrimExpr)  # a coordinate: numpy (the reference) or loop IR (the compute)


# --- image.resize ---------------------------------------------------------------------------------


def _to_float(value: Any) -> Any:
    """Converter: an int or numpy number becomes a float (other values pass to the validator)."""
    if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_)):
        return float(value)
    return value


def _to_opt_floats(value: Any) -> Any:
    """Converter: None stays None; a sequence (or 1-D array) of numbers becomes a tuple of floats."""
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        return tuple(_to_float(v) for v in value)
    return value


def _floats(positive: bool) -> Any:
    """Validator: a tuple of finite floats (each > 0 when `positive`)."""

    def check(_: Any, field: attrs.Attribute[Any], value: Any) -> None:
        ok = isinstance(value, tuple) and all(isinstance(v, float) and math.isfinite(v) for v in value)
        if not ok or (positive and not all(v > 0 for v in value)):
            raise FieldError(field.name, "a list of " + ("numbers > 0" if positive else "finite numbers"), value)

    return check


@attrs.frozen
class ResizeAttrs(Attrs):
    """Attributes of image.resize (ONNX Resize's, with size and scales given per resized axis)."""

    size: tuple[int, ...] = attrs.field(
        converter=to_int_tuple, validator=int_tuple(lo=1), metadata={"doc": "output extent of each resized axis"}
    )
    axes: tuple[int, ...] = attrs.field(
        converter=to_int_tuple, validator=int_tuple(), metadata={"doc": "the resized axes, in the order of size"}
    )
    method: str = attrs.field(default="nearest", validator=one_of(*METHODS), metadata={"doc": "interpolation"})
    coordinate_transformation_mode: str = attrs.field(
        default="half_pixel", validator=one_of(*COORDINATE_MODES),
        metadata={"doc": "how an output position maps to an input coordinate"},
    )
    nearest_mode: str = attrs.field(
        default="round_prefer_floor", validator=one_of(*NEAREST_MODES),
        metadata={"doc": "how method nearest rounds a coordinate"},
    )
    cubic_coeff_a: float = attrs.field(
        default=-0.75, converter=_to_float, validator=float_value, metadata={"doc": "the a of the cubic kernel"}
    )
    exclude_outside: bool = attrs.field(
        default=False, validator=bool_value, metadata={"doc": "zero the weights of taps outside the input, renormalize"}
    )
    extrapolation_value: float = attrs.field(
        default=0.0, converter=_to_float, validator=float_value,
        metadata={"doc": "tf_crop_and_resize: the value of samples outside the input"},
    )
    roi: tuple[float, ...] | None = attrs.field(
        default=None, converter=_to_opt_floats, validator=optional(_floats(positive=False)),
        metadata={"doc": "tf_crop_and_resize: the starts, then the ends, of the resized axes (normalized)"},
    )
    scales: tuple[float, ...] | None = attrs.field(
        default=None, converter=_to_opt_floats, validator=optional(_floats(positive=True)),
        metadata={"doc": "the scale of each resized axis (default: size / input extent)"},
    )


@attrs.frozen
class ResizeAxis:
    """One resized axis: how output positions map to input coordinates along it."""

    axis: int
    size_in: int
    size_out: int
    scale: float
    roi: tuple[float, float]  # (start, end), normalized; used by tf_crop_and_resize only

    @property
    def width(self) -> float:
        """The output extent as the transform sees it: `scale * size_in` (not rounded, as ONNX)."""
        return self.scale * self.size_in

    def is_identity(self, mode: str) -> bool:
        """Whether the axis keeps its size and coordinates (the reference skips such an axis)."""
        same = self.size_out == self.size_in and math.isclose(self.scale, 1.0)
        whole = math.isclose(self.roi[0], 0.0) and math.isclose(self.roi[1], 1.0)
        return same and (mode != "tf_crop_and_resize" or whole)


def _count(n: int, noun: str) -> str:
    """`n noun`, the noun in the plural unless n is 1 ("axis": "axes")."""
    plural = noun[:-2] + "es" if noun.endswith("is") else noun + "s"
    return f"{n} {noun if n == 1 else plural}"


def _checked_axes(attrs: ResizeAttrs, ndim: int) -> list[int]:
    """The resized axes, non-negative; RelationError for a bad axis or an attribute of the wrong length."""
    axes = []
    for a in attrs.axes:
        try:
            axes.append(normalize_axis(a, ndim, "resized axis"))
        except RelationError as err:
            err.arg = 0
            raise
    repeated = sorted({a for a in axes if axes.count(a) > 1})
    if repeated:
        raise RelationError(f"attribute axes {list(attrs.axes)} names axis {repeated[0]} twice", arg=0)
    k = len(axes)
    if len(attrs.size) != k:
        raise RelationError(f"attribute size {list(attrs.size)} has {_count(len(attrs.size), 'extent')} but axes "
                            f"{list(attrs.axes)} names {_count(k, 'axis')}: give one extent per resized axis", arg=0)
    if attrs.scales is not None and len(attrs.scales) != k:
        raise RelationError(f"attribute scales has {_count(len(attrs.scales), 'value')} but axes {list(attrs.axes)} "
                            f"names {_count(k, 'axis')}: give one scale per resized axis", arg=0)
    if attrs.roi is not None and len(attrs.roi) != 2 * k:
        raise RelationError(f"attribute roi has {_count(len(attrs.roi), 'value')} but needs {2 * k}: the starts, "
                            f"then the ends, of the {_count(k, 'resized axis')}", arg=0)
    return axes


def _axis(attrs: ResizeAttrs, k: int, axis: int, size_in: int) -> ResizeAxis:
    """The k-th resized axis, `axis` of the data, of extent `size_in`."""
    out = attrs.size[k]
    scale = attrs.scales[k] if attrs.scales is not None else out / size_in
    n = len(attrs.axes)
    roi = (attrs.roi[k], attrs.roi[n + k]) if attrs.roi is not None else (0.0, 1.0)
    return ResizeAxis(axis, size_in, out, scale, roi)


def _plan(attrs: ResizeAttrs, shape: Sequence[int]) -> list[ResizeAxis]:
    """The axes a resize of a static `shape` changes (identity axes left out)."""
    axes = _checked_axes(attrs, len(shape))
    plan = [_axis(attrs, k, a, shape[a]) for k, a in enumerate(axes)]
    return [ax for ax in plan if not ax.is_identity(attrs.coordinate_transformation_mode)]


def _resize_rel(arg_types: list[Type], attrs: ResizeAttrs) -> Type | None:
    tensors = tensor_args(arg_types)
    if tensors is None:
        return None
    (data,) = tensors
    if attrs.method != "nearest" and data.dtype.is_bool:
        raise RelationError(f"method {attrs.method!r} needs a numeric tensor, found dtype bool "
                            "(method 'nearest' takes any dtype)", arg=0)
    axes = _checked_axes(attrs, data.ndim)
    mode = attrs.coordinate_transformation_mode
    dims: list[Dim] = list(data.shape)
    active = 0
    for k, a in enumerate(axes):
        d = dims[a]
        if not isinstance(d, int) or not _axis(attrs, k, a, d).is_identity(mode):
            active += 1
        dims[a] = attrs.size[k]
    taps = TAPS[attrs.method] ** active
    if taps > MAX_TAPS:
        raise RelationError(
            f"method {attrs.method!r} over {active} resized axes reads {taps} input elements per output element; "
            f"at most {MAX_TAPS} are supported (cubic: up to 3 resized axes, linear: up to 6)", arg=0)
    return TensorType(tuple(dims), data.dtype)


def source_coordinate(ax: ResizeAxis, mode: str, y: C) -> C | float:
    """The input coordinate of output position `y` along `ax` (float64), in the reference's order of operations.

    A float where every position maps to one coordinate (an output extent of 1 in some modes).
    """
    in_w, width = ax.size_in, ax.width
    if mode == "align_corners":
        return 0.0 if width == 1 else y * (in_w - 1) / (width - 1)
    if mode == "asymmetric":
        return y / ax.scale
    if mode == "tf_crop_and_resize":
        start, end = ax.roi
        if width == 1:
            return (end - start) * (in_w - 1) / 2 + start * (in_w - 1)
        return y * (end - start) * (in_w - 1) / (width - 1) + start * (in_w - 1)
    if mode == "pytorch_half_pixel":
        return -0.5 if width == 1 else (y + 0.5) / ax.scale - 0.5
    if mode == "half_pixel":
        return (y + 0.5) / ax.scale - 0.5
    # half_pixel_symmetric: the centre of the input maps to the centre of the output
    offset = in_w / 2 * (1 - ax.size_out / width)
    return offset + (y + 0.5) / ax.scale - 0.5


def _linear_weights(r: C) -> list[C]:
    """The weights of the taps floor(x), floor(x) + 1 at fraction `r` of x."""
    return [1.0 - r, r]


def _cubic_weights(r: C, a: float) -> list[C]:
    """The weights of the taps floor(x) - 1 ... floor(x) + 2 at fraction `r` of x (Keys' kernel with `a`, as ONNX)."""
    s = 1.0 - r
    return [
        ((a * (r + 1.0) - 5 * a) * (r + 1.0) + 8 * a) * (r + 1.0) - 4 * a,
        ((a + 2) * r - (a + 3)) * r * r + 1.0,
        ((a + 2) * s - (a + 3)) * s * s + 1.0,
        ((a * (s + 1.0) - 5 * a) * (s + 1.0) + 8 * a) * (s + 1.0) - 4 * a,
    ]


def _nearest_up(mode: str, r: C) -> C | None:
    """Whether nearest takes floor(x) + 1 rather than floor(x), at fraction `r` of x (None: never, mode floor)."""
    if mode == "round_prefer_floor":
        return r > 0.5
    if mode == "round_prefer_ceil":
        return r >= 0.5
    if mode == "ceil":
        return r > 0.0
    return None


def _acc_dtype(dtype: str) -> str:
    """The dtype weights and sums are computed in: float64 for float64 and integers, float32 for other floats."""
    return "float64" if dtype == "float64" or not DataType.of(dtype).is_float else "float32"


def _fill_value(value: float, dtype: str) -> float | int | bool:
    """`value` (extrapolation_value) in `dtype` as the reference stores it: rounded and saturated for integers."""
    kind = DataType.of(dtype)
    if kind.is_bool:
        return bool(value)
    if kind.is_int:
        info = np.iinfo(np.dtype(dtype))
        return int(np.clip(np.round(value), info.min, info.max))
    return value


# -- the numpy reference: one axis at a time, in float64 --


def _taps_np(ax: ResizeAxis, attrs: ResizeAttrs) -> tuple[Array, Array, Array | None]:
    """The taps of every output position along `ax`: input indices (clamped) and weights, both (out, taps),
    and which positions lie outside the input (tf_crop_and_resize; None otherwise)."""
    mode = attrs.coordinate_transformation_mode
    y = np.arange(ax.size_out, dtype=np.float64)
    x = np.broadcast_to(np.asarray(source_coordinate(ax, mode, y), np.float64), y.shape)
    f = np.floor(x)
    r, base = x - f, f.astype(np.int64)
    if attrs.method == "nearest":
        up = _nearest_up(attrs.nearest_mode, r)
        idx = (base if up is None else base + up)[:, None]
        w = np.ones(idx.shape)
    else:
        ws = _linear_weights(r) if attrs.method == "linear" else _cubic_weights(r, attrs.cubic_coeff_a)
        idx = base[:, None] + FIRST_TAP[attrs.method] + np.arange(len(ws))
        w = np.stack(ws, axis=-1)
    if attrs.exclude_outside:
        w = np.where((idx >= 0) & (idx < ax.size_in), w, 0.0)
        total = w.sum(axis=-1, keepdims=True)
        w = w / np.where(total == 0, 1.0, total)
    outside = (x < 0) | (x > ax.size_in - 1) if mode == "tf_crop_and_resize" else None
    return np.clip(idx, 0, ax.size_in - 1), w, outside


def _resize_ref(attrs: ResizeAttrs, data: Array) -> Array:
    gather = attrs.method == "nearest" and not attrs.exclude_outside
    dtype = str(data.dtype)
    out = data if gather else data.astype(np.float64)
    fill = _fill_value(attrs.extrapolation_value, dtype) if gather else attrs.extrapolation_value
    for ax in _plan(attrs, data.shape):
        idx, w, outside = _taps_np(ax, attrs)
        picked = np.take(out, idx, axis=ax.axis)  # the axis becomes (out, taps)
        if gather:
            out = np.squeeze(picked, axis=ax.axis + 1)
        else:
            shape = [1] * out.ndim + [1]
            shape[ax.axis: ax.axis + 2] = w.shape
            out = (picked * w.reshape(shape)).sum(axis=ax.axis + 1)
        if outside is not None:
            mask = outside.reshape([-1 if a == ax.axis else 1 for a in range(out.ndim)])
            out = np.where(mask, np.asarray(fill, out.dtype), out)
    if gather or DataType.of(dtype).is_float:
        return np.asarray(out).astype(dtype)
    info = np.iinfo(data.dtype)
    rounded: Array = np.clip(np.round(out), info.min, info.max).astype(dtype)
    return rounded


# -- the compute: one expression per output element, the axes' taps nested (axis by axis, as the reference) --


@attrs.frozen
class _Taps:
    """The taps of one output position along one axis.

    `taps`: (input index, weight or None); `total`: the sum of the weights when exclude_outside drops
    some (the caller divides by it once, rather than every weight by it); `outside`: whether the
    position lies outside the input (tf_crop_and_resize).
    """

    taps: list[tuple[PrimExpr, PrimExpr | None]]
    total: PrimExpr | None
    outside: PrimExpr | None


def _taps_te(ax: ResizeAxis, attrs: ResizeAttrs, y: PrimExpr, acc: str | None) -> _Taps:
    """As `_taps_np`, for output position `y`; weights in `acc` (None: nearest as a pure gather, no weights)."""
    mode = attrs.coordinate_transformation_mode
    src = source_coordinate(ax, mode, te.cast(y, "float64"))
    x = src if isinstance(src, PrimExpr) else te.const(src, "float64")
    f = te.floor(x)
    r, base = x - f, te.cast(f, "int32")
    weights: list[PrimExpr] = []
    if attrs.method == "nearest":
        up = _nearest_up(attrs.nearest_mode, r)
        indices = [base if up is None else base + te.if_then_else(up, 1, 0)]
        if acc is not None:
            weights = [te.const(1.0, acc)]
    else:
        assert acc is not None
        ratio = te.cast(r, acc)
        weights = _linear_weights(ratio) if attrs.method == "linear" else _cubic_weights(ratio, attrs.cubic_coeff_a)
        indices = [base + (FIRST_TAP[attrs.method] + t) for t in range(len(weights))]
    total: PrimExpr | None = None
    if attrs.exclude_outside and weights:
        weights = [te.if_then_else(tx.all_of(i >= 0, i < ax.size_in), w, 0.0)
                   for i, w in zip(indices, weights, strict=True)]
        total = weights[0]
        for w in weights[1:]:
            total = total + w
        total = te.if_then_else(tx.eq(total, 0.0), 1.0, total)
    outside = tx.any_of(x < 0.0, x > float(ax.size_in - 1)) if mode == "tf_crop_and_resize" else None
    taps = [(clamp(i, ax.size_in), weights[t] if weights else None) for t, i in enumerate(indices)]
    return _Taps(taps, total, outside)


def _to_dtype(value: PrimExpr, dtype: str) -> PrimExpr:
    """A sum in its accumulation dtype as `dtype`: integers rounded half to even and saturated."""
    if value.dtype == dtype or DataType.of(dtype).is_float:
        return te.cast(value, dtype)
    info = np.iinfo(np.dtype(dtype))
    rounded = tx.max_(tx.min_(te.round(value), float(info.max)), float(info.min))
    return te.cast(rounded, dtype)


def _resize_compute(attrs: ResizeAttrs, inputs: list[te.Tensor], out_type: Type) -> list[te.Tensor]:
    """Each output element: the weighted sum over its taps, the first resized axis innermost.

    Nesting the sums (rather than summing over the product of the taps) keeps each axis's weights
    out of the other axes' loops: the expression, which lowering walks as a tree, stays small.
    """
    (data,) = inputs
    shape = batch_shape(data)
    if any(not isinstance(shape[a], int) for a in _checked_axes(attrs, len(shape))):
        shape = tensor_shape(data)  # a resized axis must be static (raises)
    plan = _plan(attrs, shape)
    dtype = data.dtype
    acc = None if attrs.method == "nearest" and not attrs.exclude_outside else _acc_dtype(dtype)
    fill = te.const(_fill_value(attrs.extrapolation_value, acc or dtype), acc or dtype)

    def element(*i: PrimExpr) -> PrimExpr:
        per_axis = [_taps_te(ax, attrs, i[ax.axis], acc) for ax in plan]
        index = list(i)

        def interpolate(k: int) -> PrimExpr:
            """The sum over the taps of axes k-1, ..., 0, with the later axes' indices set in `index`."""
            if k == 0:
                value = data[tuple(index)]
                return value if acc is None else te.cast(value, acc)
            total: PrimExpr | None = None
            for src, w in per_axis[k - 1].taps:
                index[plan[k - 1].axis] = src
                inner = interpolate(k - 1)
                term = inner if w is None else w * inner
                total = term if total is None else total + term
            assert total is not None  # every axis has at least one tap
            return total

        value = interpolate(len(plan))
        norms = [t.total for t in per_axis if t.total is not None]
        if norms:
            norm = norms[0]
            for n in norms[1:]:
                norm = norm * n
            value = value / norm
        outside = [t.outside for t in per_axis if t.outside is not None]
        if outside:
            value = te.if_then_else(tx.any_of(*outside), fill, value)
        return _to_dtype(value, dtype)

    return [te.compute(batch_type_shape(out_type), element, name="resize")]


(register_op("image.resize")
    .describe("resizes the given axes by nearest, multi-linear or cubic interpolation, as ONNX Resize")
    .add_argument("data", "Tensor", "the input, of any rank")
    .set_attrs_type(ResizeAttrs)
    .add_type_rel("Resize", _resize_rel)
    .set_support_level(5)
    .set_attr(attr.TOpPattern, OpPattern.INJECTIVE)
    .set_attr(attr.FReference, _resize_ref)
    .set_attr(attr.FCompute, _resize_compute)
    .set_attr(attr.FPrimalGradient, resize_grad))


@constructor("image.resize")
def resize(
    data: Expr,
    size: int | Sequence[int],
    axes: int | Sequence[int],
    method: str = "nearest",
    coordinate_transformation_mode: str = "half_pixel",
    nearest_mode: str = "round_prefer_floor",
    cubic_coeff_a: float = -0.75,
    exclude_outside: bool = False,
    extrapolation_value: float = 0.0,
    roi: Sequence[float] | None = None,
    scales: Sequence[float] | None = None,
) -> Call:
    """Resizes `axes` of `data` to `size`, as ONNX Resize.

    Args:
        data: the input, of any rank; any dtype for nearest, a numeric one for linear and cubic.
        size: the output extent of each resized axis.
        axes: the resized axes, e.g. (2, 3) for the image of NCHW data.
        method: "nearest", "linear" (multi-linear over the resized axes) or "cubic".
        coordinate_transformation_mode: "half_pixel", "half_pixel_symmetric", "pytorch_half_pixel",
            "align_corners", "asymmetric" or "tf_crop_and_resize".
        nearest_mode: how nearest rounds: "round_prefer_floor", "round_prefer_ceil", "floor" or "ceil".
        cubic_coeff_a: the a of the cubic kernel (-0.75 as PyTorch, -0.5 as TensorFlow).
        exclude_outside: give the taps outside the input weight 0 and renormalize the others.
        extrapolation_value: tf_crop_and_resize: the value of samples outside the input.
        roi: tf_crop_and_resize: the starts, then the ends, of the resized axes, normalized (default: 0s, 1s).
        scales: the scale of each resized axis, used by the coordinate transform instead of size / extent
            (ONNX's scales, from which the size is floor(extent * scale)).

    Returns:
        The call of image.resize.
    """
    return call("image.resize", [data], ResizeAttrs.make(
        "image.resize", size=size, axes=axes, method=method,
        coordinate_transformation_mode=coordinate_transformation_mode, nearest_mode=nearest_mode,
        cubic_coeff_a=cubic_coeff_a, exclude_outside=exclude_outside, extrapolation_value=extrapolation_value,
        roi=roi, scales=scales,
    ))



# --- image.grid_sample ----------------------------------------------------------------------------

PADDING_MODES = ("zeros", "border", "reflection")


@attrs.frozen
class GridSampleAttrs(Attrs):
    """Attributes of image.grid_sample (ONNX GridSample's, opset 20 names)."""

    method: str = attrs.field(default="linear", validator=one_of(*METHODS), metadata={"doc": "interpolation"})
    padding_mode: str = attrs.field(
        default="zeros", validator=one_of(*PADDING_MODES), metadata={"doc": "what samples outside the input read"}
    )
    align_corners: bool = attrs.field(
        default=False, validator=bool_value,
        metadata={"doc": "-1 and 1 are the centres of the corner pixels (else their outer edges)"},
    )


def _grid_sample_rel(arg_types: list[Type], attrs: GridSampleAttrs) -> Type | None:
    tensors = tensor_args(arg_types)
    if tensors is None:
        return None
    data, grid = tensors
    if data.ndim < 3:
        raise RelationError(f"expected data of rank 3 or more (N, C, spatial...), found {data}", arg=0)
    nd = data.ndim - 2
    if not grid.dtype.is_float:
        raise RelationError(f"expected a float grid, found dtype {grid.dtype}", arg=1)
    if grid.ndim != data.ndim or differ(grid.shape[-1], nd) or differ(grid.shape[0], data.shape[0]):
        raise RelationError(f"expected a grid (N, out spatial..., {nd}) of rank {data.ndim} for data {data} "
                            f"(N = {data.shape[0]}, {_count(nd, 'spatial axis')}), found {grid}", arg=1)
    if attrs.method != "nearest" and not data.dtype.is_float:
        raise RelationError(f"method {attrs.method!r} needs float data, found dtype {data.dtype} "
                            "(method 'nearest' takes any dtype)", arg=0)
    taps = TAPS[attrs.method] ** nd
    if taps > MAX_TAPS:
        raise RelationError(f"method {attrs.method!r} over {_count(nd, 'spatial axis')} reads {taps} input elements "
                            f"per output element; at most {MAX_TAPS} are supported", arg=0)
    return TensorType((data.shape[0], data.shape[1], *grid.shape[1:-1]), data.dtype)


def _borders(size: int, align_corners: bool) -> tuple[float, float]:
    """The range of coordinates inside the input along an axis of `size` (what reflection mirrors at)."""
    return (0.0, size - 1.0) if align_corners else (-0.5, size - 0.5)


def _denormalize(g: C, size: int, align_corners: bool) -> C:
    """A normalized grid coordinate in [-1, 1] as an input coordinate, in the reference's order of operations."""
    return (g + 1) / 2.0 * (size - 1) if align_corners else ((g + 1) * size - 1) / 2.0


# -- the numpy reference: vectorized over the grid, in float64 but for the coordinates (float32, as ONNX) --


def _reflect_np(x: Array, lo: float, hi: float) -> Array:
    """`x` mirrored at `lo` and `hi` until it lies between them (ONNX's `_gs_reflect`)."""
    span = hi - lo
    if span == 0:
        return np.where((x < lo) | (x > hi), lo, x)
    dx = np.where(x < lo, lo - x, x - hi)
    flips = np.floor(dx / span)
    r = dx - flips * span
    even = flips % 2 == 0
    mirrored = np.where(x < lo, np.where(even, lo + r, hi - r), np.where(even, hi - r, lo + r))
    return np.where((x < lo) | (x > hi), mirrored, x)


def _gs_taps_np(g: Array, size: int, attrs: GridSampleAttrs) -> list[tuple[Array, Array, Array]]:
    """The taps along one axis for normalized coordinates `g`: (index, weight, inside) arrays shaped like g."""
    lo, hi = _borders(size, attrs.align_corners)
    x = _denormalize(g, size, attrs.align_corners).astype(np.float32)
    if attrs.method == "nearest":
        x = np.rint(x)
    out = (x < lo) | (x > hi)
    if attrs.padding_mode == "border":
        x = np.where(out, np.clip(x, 0, size - 1), x)
    elif attrs.padding_mode == "reflection":
        x = _reflect_np(x.astype(np.float64), lo, hi).astype(np.float32)
    if attrs.method == "nearest":
        pixels, weights = [np.trunc(x)], [np.ones(x.shape)]
    else:
        base = np.floor(x)
        r = (x - base).astype(np.float64)
        weights = _linear_weights(r) if attrs.method == "linear" else _cubic_weights(r, -0.75)
        pixels = [base + FIRST_TAP[attrs.method] + t for t in range(len(weights))]
    taps = []
    for i, w in zip(pixels, weights, strict=True):
        inside = (i >= 0) & (i <= size - 1)
        if attrs.padding_mode == "reflection":
            i = _reflect_np(i.astype(np.float64), lo, hi)
        index = np.clip(np.nan_to_num(i), 0, size - 1).astype(np.int64)
        taps.append((index, w, inside if attrs.padding_mode == "zeros" else np.ones(x.shape, bool)))
    return taps


def _grid_sample_ref(attrs: GridSampleAttrs, data: Array, grid: Array) -> Array:
    nd = data.ndim - 2
    per_axis = [_gs_taps_np(grid[..., nd - 1 - a], data.shape[2 + a], attrs) for a in range(nd)]
    batch = np.arange(data.shape[0]).reshape((-1,) + (1,) * nd)
    gather = attrs.method == "nearest"
    out: Array | None = None
    for combo in itertools.product(*per_axis):
        index: tuple[Any, ...] = (batch, slice(None), *(i for i, _, _ in combo))
        picked = data[index]  # (N, out spatial..., C)
        inside = np.all(np.stack([m for _, _, m in combo]), axis=0)[..., None]
        if gather:
            term = np.where(inside, picked, np.zeros((), data.dtype))
        else:
            weight = np.prod([w for _, w, _ in combo], axis=0)[..., None]
            term = np.where(inside, picked.astype(np.float64) * weight, 0.0)
        out = term if out is None else out + term
    assert out is not None  # every axis has a tap
    return np.moveaxis(out, -1, 1).astype(data.dtype)


# -- the compute: one expression per output element, its grid coordinates read and mapped per axis --


def _reflect_te(x: PrimExpr, lo: float, hi: float) -> PrimExpr:
    """`_reflect_np` of a float64 expression."""
    span = hi - lo
    below, above = x < lo, x > hi
    if span == 0:
        return te.if_then_else(tx.any_of(below, above), te.const(lo, "float64"), x)
    dx = te.if_then_else(below, lo - x, x - hi)
    flips = te.floor(dx / span)
    r = dx - flips * span
    even = tx.eq(flips - te.floor(flips * 0.5) * 2.0, 0.0)
    mirrored = te.if_then_else(below, te.if_then_else(even, lo + r, hi - r), te.if_then_else(even, hi - r, lo + r))
    return te.if_then_else(tx.any_of(below, above), mirrored, x)


def _pixel_index(i: PrimExpr, size: int) -> PrimExpr:
    """An integral float pixel position as an int32 index, clamped into [0, size) (NaN reads pixel 0)."""
    inside = te.if_then_else(i <= float(size - 1), i, te.const(float(size - 1), i.dtype))
    return te.cast(te.if_then_else(i >= 0.0, inside, te.const(0.0, i.dtype)), "int32")


def _gs_taps_te(g: PrimExpr, size: int, attrs: GridSampleAttrs,
                acc: str | None) -> list[tuple[PrimExpr, PrimExpr | None, PrimExpr | None]]:
    """As `_gs_taps_np`, for one output element's normalized coordinate `g`: (index, weight, inside) per tap;
    no weight for nearest, no inside test but for zeros padding."""
    lo, hi = _borders(size, attrs.align_corners)
    wide = "float64" if g.dtype == "float64" else "float32"
    x = te.cast(_denormalize(te.cast(g, wide), size, attrs.align_corners), "float32")
    if attrs.method == "nearest":
        x = te.round(x)
    out = tx.any_of(x < lo, x > hi)
    if attrs.padding_mode == "border":
        x = te.if_then_else(out, tx.max_(tx.min_(x, float(size - 1)), 0.0), x)
    elif attrs.padding_mode == "reflection":
        x = te.cast(_reflect_te(te.cast(x, "float64"), lo, hi), "float32")
    weights: list[PrimExpr | None]
    if attrs.method == "nearest":
        pixels: list[PrimExpr] = [te.if_then_else(x >= 0.0, te.floor(x), te.ceil(x))]
        weights = [None]
    else:
        assert acc is not None
        base = te.floor(x)
        r = te.cast(x - base, acc)
        weights = list(_linear_weights(r) if attrs.method == "linear" else _cubic_weights(r, -0.75))
        pixels = [base + float(FIRST_TAP[attrs.method] + t) for t in range(len(weights))]
    taps: list[tuple[PrimExpr, PrimExpr | None, PrimExpr | None]] = []
    for i, w in zip(pixels, weights, strict=True):
        inside = tx.all_of(i >= 0.0, i <= float(size - 1)) if attrs.padding_mode == "zeros" else None
        if attrs.padding_mode == "reflection":
            i = _reflect_te(te.cast(i, "float64"), lo, hi)
        taps.append((_pixel_index(i, size), w, inside))
    return taps


def _grid_sample_compute(attrs: GridSampleAttrs, inputs: list[te.Tensor], out_type: Type) -> list[te.Tensor]:
    """Each output element: the weighted sum over its taps, nested axis by axis (as `_resize_compute`)."""
    data, grid = inputs
    sizes = batch_shape(data)[2:]
    nd, dtype = len(sizes), data.dtype
    acc = None if attrs.method == "nearest" else _acc_dtype(dtype)
    kind = DataType.of(acc or dtype)
    zero = te.const(False if kind.is_bool else 0.0 if kind.is_float else 0, acc or dtype)

    def element(n: PrimExpr, c: PrimExpr, *o: PrimExpr) -> PrimExpr:
        per_axis = [_gs_taps_te(grid[tuple([n, *o, tx.const(nd - 1 - a)])], sizes[a], attrs, acc) for a in range(nd)]
        index: list[PrimExpr] = [n, c, *([te.const(0)] * nd)]  # the spatial entries set per tap
        inside: list[PrimExpr] = []

        def interpolate(k: int) -> PrimExpr:
            """The sum over the taps of axes k-1, ..., 0, the later axes' indices set in `index`."""
            if k == 0:
                value: PrimExpr = data[tuple(index)]
                if acc is not None:
                    value = te.cast(value, acc)
                return te.if_then_else(tx.all_of(*inside), value, zero) if inside else value
            total: PrimExpr | None = None
            for src, w, ok in per_axis[k - 1]:
                index[2 + k - 1] = src
                if ok is not None:
                    inside.append(ok)
                inner = interpolate(k - 1)
                if ok is not None:
                    inside.pop()
                term = inner if w is None else w * inner
                total = term if total is None else total + term
            assert total is not None  # every axis has a tap
            return total

        value = interpolate(nd)
        return value if acc is None else te.cast(value, dtype)

    return [te.compute(batch_type_shape(out_type), element, name="grid_sample")]


(register_op("image.grid_sample")
    .describe("samples the input at the normalized positions of a grid, as ONNX GridSample")
    .add_argument("data", "Tensor", "the input, (N, C, spatial...)")
    .add_argument("grid", "Tensor", "the positions, (N, out spatial..., rank of spatial), x (the last axis) first")
    .set_attrs_type(GridSampleAttrs)
    .add_type_rel("GridSample", _grid_sample_rel)
    .set_support_level(5)
    .set_attr(attr.TOpPattern, OpPattern.INJECTIVE)
    .set_attr(attr.FReference, _grid_sample_ref)
    .set_attr(attr.FCompute, _grid_sample_compute)
    .set_attr(attr.FPrimalGradient, grid_sample_grad))


@constructor("image.grid_sample")
def grid_sample(
    data: Expr, grid: Expr, method: str = "linear", padding_mode: str = "zeros", align_corners: bool = False,
) -> Call:
    """Samples `data` at the positions of `grid`, as ONNX GridSample (opset 20).

    Args:
        data: the input, (N, C, d1, ..., dr); any dtype for nearest, a float one for linear and cubic.
        grid: float positions, (N, D1, ..., Dr, r), normalized to [-1, 1]; entry 0 indexes dr (x), entry
            r - 1 indexes d1.
        method: "nearest" (ties to even), "linear" or "cubic" (Keys' kernel with a = -0.75).
        padding_mode: "zeros", "border" (clamp to the edge) or "reflection" (mirror at the borders).
        align_corners: -1 and 1 are the centres of the corner pixels, not their outer edges.

    Returns:
        The call of image.grid_sample: (N, C, D1, ..., Dr).
    """
    return call("image.grid_sample", [data, grid], GridSampleAttrs.make(
        "image.grid_sample", method=method, padding_mode=padding_mode, align_corners=align_corners))


__all__ = ["GridSampleAttrs", "ResizeAttrs", "grid_sample", "resize"]
