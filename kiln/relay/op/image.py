"""Image ops (the `relay.image` namespace): image.resize, which ONNX's Resize (opsets 10-19) and Upsample lower to.

image.resize is declared in one `register_op` chain (description, argument,
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
"""

from __future__ import annotations

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
from kiln.relay.op._nn_util import Array, clamp, static_shape, tensor_shape
from kiln.relay.op._reg import constructor
from kiln.relay.op._rel import RelationError, normalize_axis, tensor_args
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
    plan = _plan(attrs, tensor_shape(data))
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

    return [te.compute(static_shape(out_type), element, name="resize")]


(register_op("image.resize")
    .describe("resizes the given axes by nearest, multi-linear or cubic interpolation, as ONNX Resize")
    .add_argument("data", "Tensor", "the input, of any rank")
    .set_attrs_type(ResizeAttrs)
    .add_type_rel("Resize", _resize_rel)
    .set_support_level(5)
    .set_attr(attr.TOpPattern, OpPattern.INJECTIVE)
    .set_attr(attr.FReference, _resize_ref)
    .set_attr(attr.FCompute, _resize_compute))


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


__all__ = ["ResizeAttrs", "resize"]
