"""Elementwise and broadcasting ops: negative ... erf, clip, cast; add ... where.

Each op is declared in one `register_op` chain (description, arguments, attrs,
relation, pattern, numpy reference, and te compute, scheduled by the generic
schedule of its pattern) after the functions it names; the unary and binary
math families through `register_unary` / `register_binary`, which build that
chain for each row of their table. Its Python constructor follows, checked
against it (`@constructor`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import attrs
import numpy as np

from kiln import te
from kiln.ir.attrs import Attrs, float_value, to_dtype
from kiln.ir.dtype import DataType
from kiln.registry import Op, OpPattern, attr, register_op
from kiln.relay.expr import Call, Expr, call
from kiln.relay.op._reg import constructor, elementwise_compute, register_binary, register_unary
from kiln.relay.op._rel import (
    DTypeRule,
    RelationError,
    bool_dtype,
    broadcast_shapes,
    float_dtype,
    same_dtype,
    tensor_args,
)
from kiln.tir import expr as tx
from kiln.tir.expr import PrimExpr

Ref = Callable[..., Any]


def _unary(fn: Callable[[np.ndarray[Any, Any]], Any]) -> Ref:
    def reference(attrs: Any, x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        out: np.ndarray[Any, Any] = np.asarray(fn(x)).astype(x.dtype, copy=False)
        return out

    reference.__name__ = reference.__qualname__ = getattr(fn, "__name__", "reference")
    return reference


def _binary(fn: Callable[[Any, Any], Any], out_dtype: str | None = None) -> Ref:
    def reference(attrs: Any, a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        out: np.ndarray[Any, Any] = np.asarray(fn(a, b)).astype(out_dtype or a.dtype, copy=False)
        return out

    reference.__name__ = reference.__qualname__ = getattr(fn, "__name__", "reference")
    return reference


def _erf(x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    out: np.ndarray[Any, Any] = np.vectorize(math.erf, otypes=[np.float64])(x)
    return out


def _round(x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    return np.round(x)  # half to even, like ONNX Round


def _rsqrt(x: np.ndarray[Any, Any]) -> Any:
    return 1.0 / np.sqrt(x)


def _sigmoid(x: np.ndarray[Any, Any]) -> Any:
    return 1.0 / (1.0 + np.exp(-x))


def _bool_only(dtypes: list[DataType], attrs: Any) -> DataType:
    out = same_dtype(dtypes, attrs)
    if not out.is_bool:
        raise RelationError(f"expected a bool tensor, found dtype {out}", arg=0)
    return out


def _numeric(dtypes: list[DataType], attrs: Any) -> DataType:
    out = same_dtype(dtypes, attrs)
    if out.is_bool:
        raise RelationError("expected a numeric tensor, found dtype bool", arg=0)
    return out


def _sign(x: PrimExpr) -> PrimExpr:
    # x itself where it is 0 (or NaN, which numpy's sign keeps)
    return tx.select(x > 0, 1, tx.select(x < 0, -1, x))


TeExpr = Callable[..., PrimExpr]

_UNARY: list[tuple[str, str, Callable[..., Any], DTypeRule, TeExpr]] = [
    # name, description, numpy function, dtype rule, te expression of the element
    ("negative", "-x", np.negative, _numeric, lambda x: -x),
    ("abs", "|x|", np.abs, _numeric, te.abs),
    ("exp", "e^x", np.exp, float_dtype, te.exp),
    ("log", "natural logarithm", np.log, float_dtype, te.log),
    ("sqrt", "square root", np.sqrt, float_dtype, te.sqrt),
    ("rsqrt", "1 / sqrt(x)", _rsqrt, float_dtype, te.rsqrt),
    ("sigmoid", "1 / (1 + e^-x)", _sigmoid, float_dtype, te.sigmoid),
    ("tanh", "hyperbolic tangent", np.tanh, float_dtype, te.tanh),
    ("erf", "the error function", _erf, float_dtype, te.erf),
    ("floor", "round toward -inf", np.floor, float_dtype, te.floor),
    ("ceil", "round toward +inf", np.ceil, float_dtype, te.ceil),
    ("round", "round half to even", _round, float_dtype, te.round),
    ("sign", "-1, 0 or 1", np.sign, _numeric, _sign),
    ("sin", "sine", np.sin, float_dtype, te.sin),
    ("cos", "cosine", np.cos, float_dtype, te.cos),
    ("logical_not", "not x (bool)", np.logical_not, _bool_only, tx.logical_not),
]

for _name, _doc, _fn, _rule, _te in _UNARY:
    register_unary(_name, _doc, _unary(_fn), _rule, te_expr=_te)


def _make_unary(name: str) -> Callable[[Expr], Call]:
    def fn(data: Expr) -> Call:
        return call(name, [data])

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"{name}(data): {Op.get(name).description}."
    return constructor(name)(fn)


negative = _make_unary("negative")
abs = _make_unary("abs")  # relay.abs, as in TVM
exp = _make_unary("exp")
log = _make_unary("log")
sqrt = _make_unary("sqrt")
rsqrt = _make_unary("rsqrt")
sigmoid = _make_unary("sigmoid")
tanh = _make_unary("tanh")
erf = _make_unary("erf")
floor = _make_unary("floor")
ceil = _make_unary("ceil")
round = _make_unary("round")  # relay.round, as in TVM
sign = _make_unary("sign")
sin = _make_unary("sin")
cos = _make_unary("cos")
logical_not = _make_unary("logical_not")


def _floor_divide(a: Any, b: Any) -> Any:
    return np.floor_divide(a, b) if np.issubdtype(np.asarray(a).dtype, np.integer) else np.floor(a / b)


def _power(a: PrimExpr, b: PrimExpr) -> PrimExpr:
    if tx.is_float(a.dtype):
        return te.pow(a, b)
    # integers through float64 and int64, exact while |a ** b| < 2 ** 53, wrapping into narrower dtypes
    # as numpy's integer power does (numpy refuses negative exponents)
    exact = te.pow(te.cast(a, "float64"), te.cast(b, "float64"))
    return te.cast(te.cast(exact, "int64"), a.dtype)


def _c_divide(a: Any, b: Any) -> Any:
    a, b = np.asarray(a), np.asarray(b)
    if np.issubdtype(a.dtype, np.integer):
        return np.trunc(a / b).astype(a.dtype)
    return a / b


# tir's `/` truncates integers (as C), `//` and `%` floor them (as Python and numpy)
_BINARY: list[tuple[str, str, Callable[..., Any], DTypeRule, str | None, TeExpr]] = [
    # name, description, numpy function, dtype rule, reference's output dtype, te expression of the element
    ("add", "a + b", np.add, _numeric, None, lambda a, b: a + b),
    ("subtract", "a - b", np.subtract, _numeric, None, lambda a, b: a - b),
    ("multiply", "a * b", np.multiply, _numeric, None, lambda a, b: a * b),
    ("divide", "a / b (truncating for integers, as C)", lambda a, b: _c_divide(a, b), _numeric, None,
     lambda a, b: a / b),
    ("power", "a ** b", np.power, _numeric, None, _power),
    ("maximum", "elementwise max", np.maximum, same_dtype, None, tx.max_),
    ("minimum", "elementwise min", np.minimum, same_dtype, None, tx.min_),
    ("floor_divide", "floor(a / b)", _floor_divide, _numeric, None, lambda a, b: a // b),
    ("floor_mod", "a - floor(a / b) * b", np.mod, _numeric, None, lambda a, b: a % b),
    ("equal", "a == b", np.equal, bool_dtype, "bool", tx.eq),
    ("not_equal", "a != b", np.not_equal, bool_dtype, "bool", tx.ne),
    ("less", "a < b", np.less, bool_dtype, "bool", lambda a, b: a < b),
    ("less_equal", "a <= b", np.less_equal, bool_dtype, "bool", lambda a, b: a <= b),
    ("greater", "a > b", np.greater, bool_dtype, "bool", lambda a, b: a > b),
    ("greater_equal", "a >= b", np.greater_equal, bool_dtype, "bool", lambda a, b: a >= b),
    ("logical_and", "a and b (bool)", np.logical_and, _bool_only, None, tx.all_of),
    ("logical_or", "a or b (bool)", np.logical_or, _bool_only, None, tx.any_of),
]


for _name, _doc, _fn, _rule, _out, _te in _BINARY:
    register_binary(_name, _doc, _binary(_fn, _out), _rule, te_expr=_te)


def _make_binary(name: str) -> Callable[[Expr, Expr], Call]:
    def fn(lhs: Expr, rhs: Expr) -> Call:
        return call(name, [lhs, rhs])

    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"{name}(lhs, rhs): {Op.get(name).description}."
    return constructor(name)(fn)


add = _make_binary("add")
subtract = _make_binary("subtract")
multiply = _make_binary("multiply")
divide = _make_binary("divide")
power = _make_binary("power")
maximum = _make_binary("maximum")
minimum = _make_binary("minimum")
floor_divide = _make_binary("floor_divide")
floor_mod = _make_binary("floor_mod")
equal = _make_binary("equal")
not_equal = _make_binary("not_equal")
less = _make_binary("less")
less_equal = _make_binary("less_equal")
greater = _make_binary("greater")
greater_equal = _make_binary("greater_equal")
logical_and = _make_binary("logical_and")
logical_or = _make_binary("logical_or")


# --- clip ------------------------------------------------------------------------


@attrs.frozen
class ClipAttrs(Attrs):
    """Bounds of clip."""

    a_min: float = attrs.field(validator=float_value, metadata={"doc": "lower bound"})
    a_max: float = attrs.field(validator=float_value, metadata={"doc": "upper bound"})

    def __attrs_post_init__(self) -> None:
        from kiln.ir.attrs import FieldError

        if self.a_min > self.a_max:
            raise FieldError("a_max", f"a number >= a_min ({self.a_min})", self.a_max)


def _clip_expr(attrs: ClipAttrs, x: PrimExpr) -> PrimExpr:
    if tx.is_float(x.dtype):
        return tx.min_(tx.max_(x, tx.const(attrs.a_min, x.dtype)), tx.const(attrs.a_max, x.dtype))
    # numpy clips an integer tensor to float bounds, then truncates: an integer x below a_min is below
    # ceil(a_min) and becomes trunc(a_min). Bounds past the dtype's range are first clamped into it.
    info = np.iinfo(x.dtype)
    lo, hi = (float(np.clip(v, info.min, info.max)) for v in (attrs.a_min, attrs.a_max))
    low = tx.select(x < tx.const(math.ceil(lo), x.dtype), tx.const(int(lo), x.dtype), x)
    return tx.select(x > tx.const(math.floor(hi), x.dtype), tx.const(int(hi), x.dtype), low)


def _clip_ref(attrs: ClipAttrs, x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    lo, hi = attrs.a_min, attrs.a_max
    if np.issubdtype(x.dtype, np.integer):  # bounds past the dtype's range saturate, as the compute
        info = np.iinfo(x.dtype)
        lo, hi = (float(np.clip(v, info.min, info.max)) for v in (lo, hi))
    out: np.ndarray[Any, Any] = np.clip(x, lo, hi).astype(x.dtype)
    return out


register_unary("clip", "x limited to [a_min, a_max]", _clip_ref, _numeric, ClipAttrs,
               compute=elementwise_compute(_clip_expr, "clip"))


@constructor("clip")
def clip(data: Expr, a_min: float, a_max: float) -> Call:
    """x limited to [a_min, a_max]."""
    return call("clip", [data], ClipAttrs.make("clip", a_min=a_min, a_max=a_max))


# --- cast ------------------------------------------------------------------------


@attrs.frozen
class CastAttrs(Attrs):
    """Target dtype of cast."""

    dtype: DataType = attrs.field(converter=to_dtype, metadata={"doc": "the dtype to convert to"})


def _cast_rel(arg_types: list[Any], attrs: CastAttrs) -> Any:
    tensors = tensor_args(arg_types)
    if tensors is None:
        return None
    from kiln.ir.types import TensorType

    return TensorType(tensors[0].shape, attrs.dtype)


(
    register_op("cast")
    .describe("converts the elements to another dtype")
    .add_argument("data", "Tensor", "the input")
    .set_attrs_type(CastAttrs)
    .add_type_rel("Cast", _cast_rel)
    .set_support_level(1)
    .set_attr(attr.TOpPattern, OpPattern.ELEMWISE)
    .set_attr(attr.FReference, lambda attrs, x: x.astype(attrs.dtype.numpy()))
    .set_attr(attr.FCompute, elementwise_compute(lambda attrs, x: te.cast(x, str(attrs.dtype)), "cast"))
)


@constructor("cast")
def cast(data: Expr, dtype: Any) -> Call:
    """data converted to `dtype`."""
    return call("cast", [data], CastAttrs.make("cast", dtype=dtype))


# --- where -------------------------------------------------------------------------


def _where_rel(arg_types: list[Any], attrs: Any) -> Any:
    tensors = tensor_args(arg_types)
    if tensors is None:
        return None
    cond, x, y = tensors
    if not cond.dtype.is_bool:
        raise RelationError(f"expected a bool condition, found dtype {cond.dtype}", arg=0)
    if x.dtype != y.dtype:
        raise RelationError(f"expected dtype {x.dtype} (the dtype of x), found {y.dtype}", arg=2)
    from kiln.ir.types import TensorType

    return TensorType(broadcast_shapes([cond.shape, x.shape, y.shape]), x.dtype)


(
    register_op("where")
    .describe("x where cond is true, else y, with broadcasting")
    .add_argument("condition", "Tensor", "bool selector")
    .add_argument("x", "Tensor", "values where true")
    .add_argument("y", "Tensor", "values where false")
    .add_type_rel("Where", _where_rel)
    .set_support_level(1)
    .set_attr(attr.TOpPattern, OpPattern.BROADCAST)
    .set_attr(attr.FReference, lambda attrs, c, x, y: np.where(c, x, y))
    .set_attr(attr.FCompute, elementwise_compute(lambda attrs, c, x, y: te.select(c, x, y), "where"))
)


@constructor("where")
def where(condition: Expr, x: Expr, y: Expr) -> Call:
    """x where condition is true, else y."""
    return call("where", [condition, x, y])
