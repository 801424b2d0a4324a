"""Elementwise and broadcasting ops: negative ... erf, clip, cast; add ... where; and ONNX's further math:
fmod, the bitwise ops and shifts, isnan/isinf, tan, the inverse trigonometric and the hyperbolic functions.

Each op is declared in one `register_op` chain (description, arguments, attrs,
relation, pattern, numpy reference, and te compute, scheduled by the generic
schedule of its pattern) after the functions it names; the unary and binary
math families through `register_unary` / `register_binary`, which build that
chain for each row of their table. Its Python constructor follows, checked
against it (`@constructor`). The bitwise ops and shifts are tir's own nodes;
tir has no atan, asinh and the like, so those computes are compositions of the
intrinsics it has (Cephes' atan; log1p by Goldberg's trick).
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
from kiln.relay.op import tensor_grad as G
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


def _quiet(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` without numpy's warnings: NaN out of a domain and x % 0 are the defined results here."""

    def quiet(*args: Any) -> Any:
        with np.errstate(all="ignore"):
            return fn(*args)

    quiet.__name__ = quiet.__qualname__ = getattr(fn, "__name__", "reference")
    return quiet


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
# An op's gradient: its FPrimalGradient (tensor_grad.py), or the reason it has none (TNonDifferentiable).
# No gradient flows into integer or bool values, so an op whose outputs are never float has none.
Grad = G.GradFn | str
_COMPARISON = "a comparison: its bool output is piecewise constant, with no gradient"
_BOOLEAN = "a logical op: its inputs and output are bool"
_BITWISE = "an op on the bits of integers: integer values carry no gradient"


def _set_gradient(name: str, grad: Grad) -> None:
    """Declares op `name`'s gradient, a row's last column (the rest of the row is its register_op chain)."""
    if isinstance(grad, str):
        Op.get(name).set_attr(attr.TNonDifferentiable, grad)
    else:
        Op.get(name).set_attr(attr.FPrimalGradient, grad)


_UNARY: list[tuple[str, str, Callable[..., Any], DTypeRule, TeExpr, Grad]] = [
    # name, description, numpy function, dtype rule, te expression of the element, gradient
    ("negative", "-x", np.negative, _numeric, lambda x: -x, G.UNARY["negative"]),
    ("abs", "|x|", np.abs, _numeric, te.abs, G.UNARY["abs"]),
    ("exp", "e^x", np.exp, float_dtype, te.exp, G.UNARY["exp"]),
    ("log", "natural logarithm", np.log, float_dtype, te.log, G.UNARY["log"]),
    ("sqrt", "square root", np.sqrt, float_dtype, te.sqrt, G.UNARY["sqrt"]),
    ("rsqrt", "1 / sqrt(x)", _rsqrt, float_dtype, te.rsqrt, G.UNARY["rsqrt"]),
    ("sigmoid", "1 / (1 + e^-x)", _sigmoid, float_dtype, te.sigmoid, G.UNARY["sigmoid"]),
    ("tanh", "hyperbolic tangent", np.tanh, float_dtype, te.tanh, G.UNARY["tanh"]),
    ("erf", "the error function", _erf, float_dtype, te.erf, G.UNARY["erf"]),
    ("floor", "round toward -inf", np.floor, float_dtype, te.floor, G.zero_grad),
    ("ceil", "round toward +inf", np.ceil, float_dtype, te.ceil, G.zero_grad),
    ("round", "round half to even", _round, float_dtype, te.round, G.zero_grad),
    ("sign", "-1, 0 or 1", np.sign, _numeric, _sign, G.zero_grad),
    ("sin", "sine", np.sin, float_dtype, te.sin, G.UNARY["sin"]),
    ("cos", "cosine", np.cos, float_dtype, te.cos, G.UNARY["cos"]),
    ("logical_not", "not x (bool)", np.logical_not, _bool_only, tx.logical_not, _BOOLEAN),
]

for _name, _doc, _fn, _rule, _te, _grad in _UNARY:
    register_unary(_name, _doc, _unary(_fn), _rule, te_expr=_te)
    _set_gradient(_name, _grad)


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
    if np.issubdtype(a.dtype, np.integer):  # exact in integers (a float quotient loses 64-bit values)
        with np.errstate(divide="ignore"):
            quotient = np.abs(a) // np.where(b == 0, 1, np.abs(b))
        return np.where((a < 0) != (b < 0), -quotient, quotient).astype(a.dtype)
    return a / b


# tir's `/` truncates integers (as C), `//` and `%` floor them (as Python and numpy)
_BINARY: list[tuple[str, str, Callable[..., Any], DTypeRule, str | None, TeExpr, Grad]] = [
    # name, description, numpy function, dtype rule, reference's output dtype, te expression of the element,
    # gradient
    ("add", "a + b", np.add, _numeric, None, lambda a, b: a + b, G.add_grad),
    ("subtract", "a - b", np.subtract, _numeric, None, lambda a, b: a - b, G.subtract_grad),
    ("multiply", "a * b", np.multiply, _numeric, None, lambda a, b: a * b, G.multiply_grad),
    ("divide", "a / b (truncating for integers, as C)", lambda a, b: _c_divide(a, b), _numeric, None,
     lambda a, b: a / b, G.divide_grad),
    ("power", "a ** b", np.power, _numeric, None, _power, G.power_grad),
    ("maximum", "elementwise max", np.maximum, same_dtype, None, tx.max_, G.maximum_grad),
    ("minimum", "elementwise min", np.minimum, same_dtype, None, tx.min_, G.minimum_grad),
    ("floor_divide", "floor(a / b)", _floor_divide, _numeric, None, lambda a, b: a // b, G.zero_grad),
    ("floor_mod", "a - floor(a / b) * b", _quiet(np.mod), _numeric, None, lambda a, b: _floor_mod(a, b),
     G.floor_mod_grad),
    ("equal", "a == b", np.equal, bool_dtype, "bool", tx.eq, _COMPARISON),
    ("not_equal", "a != b", np.not_equal, bool_dtype, "bool", tx.ne, _COMPARISON),
    ("less", "a < b", np.less, bool_dtype, "bool", lambda a, b: a < b, _COMPARISON),
    ("less_equal", "a <= b", np.less_equal, bool_dtype, "bool", lambda a, b: a <= b, _COMPARISON),
    ("greater", "a > b", np.greater, bool_dtype, "bool", lambda a, b: a > b, _COMPARISON),
    ("greater_equal", "a >= b", np.greater_equal, bool_dtype, "bool", lambda a, b: a >= b, _COMPARISON),
    ("logical_and", "a and b (bool)", np.logical_and, _bool_only, None, tx.all_of, _BOOLEAN),
    ("logical_or", "a or b (bool)", np.logical_or, _bool_only, None, tx.any_of, _BOOLEAN),
]


for _name, _doc, _fn, _rule, _out, _te, _grad in _BINARY:
    register_binary(_name, _doc, _binary(_fn, _out), _rule, te_expr=_te)
    _set_gradient(_name, _grad)


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
_set_gradient("clip", G.clip_grad)


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
    .set_attr(attr.FPrimalGradient, G.cast_grad)  # raises for a cast to an integer or bool dtype
)


@constructor("cast")
def cast(data: Expr, dtype: Any) -> Call:
    """data converted to `dtype`."""
    return call("cast", [data], CastAttrs.make("cast", dtype=dtype))


# --- reinterpret -------------------------------------------------------------------


@attrs.frozen
class ReinterpretAttrs(Attrs):
    """Target dtype of reinterpret."""

    dtype: DataType = attrs.field(converter=to_dtype, metadata={"doc": "the dtype to read the bits as"})


def _reinterpret_rel(arg_types: list[Any], attrs: ReinterpretAttrs) -> Any:
    tensors = tensor_args(arg_types)
    if tensors is None:
        return None
    from kiln.ir.types import TensorType

    src, dst = DataType.of(tensors[0].dtype), attrs.dtype
    for dt, where in ((src, "the input's dtype"), (dst, "attribute dtype")):
        if dt.name in ("bool", "bfloat16"):
            raise RelationError(f"{where} is {dt.name}, whose bits cannot be reinterpreted", arg=0)
    if src.bits != dst.bits:
        raise RelationError(f"attribute dtype {dst.name} has {dst.bits} bits, the input's {src.name} {src.bits}: "
                            "reinterpret needs one width", arg=0)
    return TensorType(tensors[0].shape, dst)


(
    register_op("reinterpret")
    .describe("reads the bits of each element as another dtype of the same width (numpy's view)")
    .add_argument("data", "Tensor", "the input")
    .set_attrs_type(ReinterpretAttrs)
    .add_type_rel("Reinterpret", _reinterpret_rel)
    .set_support_level(3)
    .set_attr(attr.TOpPattern, OpPattern.ELEMWISE)
    .set_attr(attr.FReference, lambda attrs, x: np.ascontiguousarray(x).view(attrs.dtype.numpy()))
    .set_attr(attr.FCompute, elementwise_compute(lambda attrs, x: te.reinterpret(x, str(attrs.dtype)), "reinterpret"))
    .set_attr(attr.TNonDifferentiable, "reads bits as another dtype: no derivative relates input and output")
)


@constructor("reinterpret")
def reinterpret(data: Expr, dtype: Any) -> Call:
    """The bits of data read as `dtype`, which has the width of data's dtype."""
    return call("reinterpret", [data], ReinterpretAttrs.make("reinterpret", dtype=dtype))


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
    .set_attr(attr.FPrimalGradient, G.where_grad)  # none to the condition
)


@constructor("where")
def where(condition: Expr, x: Expr, y: Expr) -> Call:
    """x where condition is true, else y."""
    return call("where", [condition, x, y])


# --- more math: ONNX's remainder, bitwise, float-class, trigonometric and hyperbolic ops -----------
#
# Separate tables from _UNARY/_BINARY: those rows are tested as one family (float32 in, the same dtype out),
# which bitwise ops (integers only) and isnan/isinf (bool out) are not.


def _integer(dtypes: list[DataType], attrs: Any) -> DataType:
    out = same_dtype(dtypes, attrs)
    if out.is_float or out.is_bool:
        raise RelationError(f"expected an integer tensor, found dtype {out}", arg=0)
    return out


def _float_class(dtypes: list[DataType], attrs: Any) -> DataType:
    float_dtype(dtypes, attrs)
    return DataType.of("bool")


def _fmod(a: PrimExpr, b: PrimExpr) -> PrimExpr:
    """C's fmod: a - trunc(a / b) * b, with the sign of a; 0 for an integer b of 0, as numpy."""
    dt = a.dtype
    zero = tx.const(0, dt)
    if not tx.is_float(dt):
        # tir's integer `/` truncates; x / -1 is left out, its product with -1 could overflow
        bad = tx.eq(b, zero) if dt.startswith("u") else tx.any_of(tx.eq(b, zero), tx.eq(b, tx.const(-1, dt)))
        return tx.select(bad, zero, a - (a / b) * b)
    # in float64 with one fma: exact while |a / b| < 2**53 (float32 operands: products of 24-bit numbers);
    # a quotient rounded up across an integer leaves a remainder of the wrong sign, fixed by one step
    x, y = te.cast(a, "float64"), te.cast(b, "float64")
    q = x / y
    t = tx.select(q < 0.0, te.ceil(q), te.floor(q))
    r = tx.call("fma", -t, y, x)
    m = te.abs(y)
    r = tx.select(tx.all_of(x > 0.0, r < 0.0), r + m, tx.select(tx.all_of(x < 0.0, r > 0.0), r - m, r))
    inf = tx.const(math.inf, "float64")
    r = tx.select(tx.all_of(tx.eq(m, inf), te.abs(x) < inf), x, r)  # a finite x modulo +-inf is x
    return te.cast(r, dt)


def _floor_mod(a: PrimExpr, b: PrimExpr) -> PrimExpr:
    """a - floor(a / b) * b, with the sign of b; floats from the exact fmod, as numpy's mod."""
    if not tx.is_float(a.dtype):
        return a % b
    r = _fmod(a, b)
    zero = tx.const(0.0, a.dtype)
    fix = tx.all_of(tx.ne(r, zero), tx.ne(r < zero, b < zero))  # ne on floats is true for NaN; r + b keeps it
    return tx.select(fix, r + b, r)


def _bitwise_not(x: PrimExpr) -> PrimExpr:
    return tx.bitwise_not(x)


def _left_shift(a: PrimExpr, s: PrimExpr) -> PrimExpr:
    # the loop IR's shifts are numpy's: an amount < 0 or >= the bit width shifts every bit out
    return tx.shift_left(a, s)


def _right_shift(a: PrimExpr, s: PrimExpr) -> PrimExpr:
    return tx.shift_right(a, s)  # arithmetic for signed a, logical for unsigned


def _isinf(x: PrimExpr) -> PrimExpr:
    return tx.eq(te.abs(x), tx.const(math.inf, x.dtype))


def _isnan(x: PrimExpr) -> PrimExpr:
    return tx.call("isnan", x, dtype="bool")


def _half_in_float32(fn: Callable[[PrimExpr], PrimExpr]) -> TeExpr:
    """`fn` computed in float32 for a float16 x (float16 rounding at each step would add up)."""

    def expr(x: PrimExpr) -> PrimExpr:
        if x.dtype == "float16":
            return te.cast(fn(te.cast(x, "float32")), "float16")
        return fn(x)

    expr.__name__ = fn.__name__
    return expr


def _poly(z: PrimExpr, coeffs: tuple[float, ...]) -> PrimExpr:
    out: PrimExpr = tx.const(coeffs[0], z.dtype)
    for c in coeffs[1:]:
        out = out * z + c
    return out


# Cephes' atanf (float32) and atan (float64, a rational function with its pi/2 tail "MOREBITS")
_ATAN_F32 = (8.05374449538e-2, -1.38776856032e-1, 1.99777106478e-1, -3.33329491539e-1)
_ATAN_P = (-8.750608600031904122785e-1, -1.615753718733365076637e1, -7.500855792314704667340e1,
           -1.228866684490136173410e2, -6.485021904942025371773e1)
_ATAN_Q = (1.0, 2.485846490142306297962e1, 1.650270098316988542046e2, 4.328810604912902668951e2,
           4.853903996359136964868e2, 1.945506571482613964425e2)
_MOREBITS = 6.123233995736765886130e-17


def _atan(x: PrimExpr) -> PrimExpr:
    """atan by Cephes: |x| reduced to [0, tan(pi/8)] against pi/2 or pi/4, then a polynomial (a select reads
    every branch: -1/0 and the rest are harmless)."""
    dt = x.dtype
    f64 = dt == "float64"
    t = te.abs(x)
    big = t > 2.414213562373095
    mid = t > (0.66 if f64 else 0.4142135623730950)
    z = tx.select(big, tx.const(-1.0, dt) / t, tx.select(mid, (t - 1.0) / (t + 1.0), t))
    base = tx.select(big, tx.const(math.pi / 2, dt), tx.select(mid, tx.const(math.pi / 4, dt), tx.const(0.0, dt)))
    zz = z * z
    if f64:
        tail = tx.select(big, tx.const(_MOREBITS, dt), tx.select(mid, tx.const(_MOREBITS / 2, dt), tx.const(0.0, dt)))
        y = base + (z * (zz * _poly(zz, _ATAN_P) / _poly(zz, _ATAN_Q)) + z + tail)
    else:
        y = base + (_poly(zz, _ATAN_F32) * zz * z + z)
    return tx.select(x < 0.0, -y, y)


def _asin(x: PrimExpr) -> PrimExpr:
    # (1 - x)(1 + x) keeps the digits near |x| = 1; x / 0 there is +-inf, whose atan is +-pi/2
    return _atan(x / te.sqrt((1.0 - x) * (1.0 + x)))


def _acos(x: PrimExpr) -> PrimExpr:
    # acos(x) = 2 atan(sqrt((1 - x) / (1 + x))): accurate near x = 1 (pi/2 - asin(x) is not); pi at x = -1
    return _atan(te.sqrt((1.0 - x) / (1.0 + x))) * 2.0


def _log1p(u: PrimExpr) -> PrimExpr:
    """log(1 + u), accurate for small u (Goldberg: the rounding of 1 + u cancels in u / (w - 1))."""
    w = u + 1.0
    return tx.select(tx.eq(w, tx.const(1.0, u.dtype)), u,
                     tx.select(tx.eq(w, tx.const(math.inf, u.dtype)), w, te.log(w) * u / (w - 1.0)))


def _series(x: PrimExpr, coeffs: tuple[float, ...]) -> PrimExpr:
    """x * (c0 + c1 x^2 + c2 x^4 + ...): the odd Taylor series near 0, where a formula cancels."""
    xx = x * x
    return x * _poly(xx, tuple(reversed(coeffs)))


_SINH_SERIES = (1.0, 1 / 6, 1 / 120, 1 / 5040, 1 / 362880)
_LN2 = math.log(2.0)
_HUGE = 2.0**28  # past it x + sqrt(x^2 +- 1) is 2x to float64's precision: log(x) + ln 2 avoids x^2's overflow


def _half_square_of_exp_half(t: PrimExpr) -> PrimExpr:
    """e^t / 2 as (h / 2) h for h = e^(t / 2): finite up to sinh's and cosh's own overflow, where e^t is
    already inf. The product is an fma with -0 (a plain product, rounded once): the float multiplies carry
    `reassoc`, which would let LLVM form h * h first, and that overflows."""
    h = te.exp(t * 0.5)
    return tx.call("fma", h * 0.5, h, tx.const(-0.0, t.dtype))


def _sinh(x: PrimExpr) -> PrimExpr:
    t = te.abs(x)
    e = te.exp(t)
    y = tx.select(t > 20.0, _half_square_of_exp_half(t), (e - 1.0 / e) * 0.5)
    y = tx.select(t < (0.05 if x.dtype == "float64" else 0.5), _series(t, _SINH_SERIES), y)
    return tx.select(x < 0.0, -y, y)


def _cosh(x: PrimExpr) -> PrimExpr:
    t = te.abs(x)
    e = te.exp(t)
    return tx.select(t > 20.0, _half_square_of_exp_half(t), (e + 1.0 / e) * 0.5)


def _asinh(x: PrimExpr) -> PrimExpr:
    t = te.abs(x)
    # t + sqrt(1 + t^2) - 1 = t + t^2 / (1 + sqrt(1 + t^2)), without cancellation
    y = tx.select(t > _HUGE, te.log(t) + _LN2, _log1p(t + t * t / (te.sqrt(t * t + 1.0) + 1.0)))
    return tx.select(x < 0.0, -y, y)


def _acosh(x: PrimExpr) -> PrimExpr:
    # x - 1 + sqrt((x - 1)(x + 1)) is exact near 1
    y = tx.select(x > _HUGE, te.log(x) + _LN2, _log1p((x - 1.0) + te.sqrt((x - 1.0) * (x + 1.0))))
    return tx.select(x < 1.0, tx.const(math.nan, x.dtype), y)  # (x - 1)(x + 1) may overflow for a very negative x


def _atanh(x: PrimExpr) -> PrimExpr:
    t = te.abs(x)
    y = _log1p(t * 2.0 / (1.0 - t)) * 0.5  # +-1 gives +-inf; |x| > 1 a log of a negative, NaN
    return tx.select(x < 0.0, -y, y)


def _tan(x: PrimExpr) -> PrimExpr:
    return te.sin(x) / te.cos(x)


def _float_class_ref(fn: Callable[[Any], Any]) -> Ref:
    def reference(attrs: Any, x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        out: np.ndarray[Any, Any] = np.asarray(fn(x))
        return out

    reference.__name__ = reference.__qualname__ = fn.__name__
    return reference


_MATH_UNARY: list[tuple[str, str, Callable[..., Any], DTypeRule, TeExpr, Grad]] = [
    # name, description, numpy function, dtype rule, te expression of the element, gradient
    ("bitwise_not", "~x (every bit flipped)", np.bitwise_not, _integer, _bitwise_not, _BITWISE),
    ("tan", "tangent", np.tan, float_dtype, _tan, G.UNARY["tan"]),
    ("atan", "arc tangent", np.arctan, float_dtype, _half_in_float32(_atan), G.UNARY["atan"]),
    ("asin", "arc sine", np.arcsin, float_dtype, _half_in_float32(_asin), G.UNARY["asin"]),
    ("acos", "arc cosine", np.arccos, float_dtype, _half_in_float32(_acos), G.UNARY["acos"]),
    ("sinh", "hyperbolic sine", np.sinh, float_dtype, _half_in_float32(_sinh), G.UNARY["sinh"]),
    ("cosh", "hyperbolic cosine", np.cosh, float_dtype, _half_in_float32(_cosh), G.UNARY["cosh"]),
    ("asinh", "inverse hyperbolic sine", np.arcsinh, float_dtype, _half_in_float32(_asinh), G.UNARY["asinh"]),
    ("acosh", "inverse hyperbolic cosine", np.arccosh, float_dtype, _half_in_float32(_acosh), G.UNARY["acosh"]),
    ("atanh", "inverse hyperbolic tangent", np.arctanh, float_dtype, _half_in_float32(_atanh), G.UNARY["atanh"]),
]

for _name, _doc, _fn, _rule, _te, _grad in _MATH_UNARY:
    register_unary(_name, _doc, _unary(_quiet(_fn)), _rule, te_expr=_te)
    _set_gradient(_name, _grad)

for _name, _doc, _fn, _te in [("isnan", "x is NaN (bool)", np.isnan, _isnan),
                              ("isinf", "x is +inf or -inf (bool)", np.isinf, _isinf)]:
    register_unary(_name, _doc, _float_class_ref(_fn), _float_class, te_expr=_te)
    _set_gradient(_name, "a test of the float class: its bool output has no gradient")

bitwise_not = _make_unary("bitwise_not")
tan = _make_unary("tan")
atan = _make_unary("atan")
asin = _make_unary("asin")
acos = _make_unary("acos")
sinh = _make_unary("sinh")
cosh = _make_unary("cosh")
asinh = _make_unary("asinh")
acosh = _make_unary("acosh")
atanh = _make_unary("atanh")
isnan = _make_unary("isnan")
isinf = _make_unary("isinf")


_MATH_BINARY: list[tuple[str, str, Callable[..., Any], DTypeRule, TeExpr, Grad]] = [
    # name, description, numpy function, dtype rule, te expression of the element, gradient
    ("fmod", "a - trunc(a / b) * b (C's fmod: the sign of a)", np.fmod, _numeric, _fmod, G.fmod_grad),
    ("bitwise_and", "a & b", np.bitwise_and, _integer, tx.bitwise_and, _BITWISE),
    ("bitwise_or", "a | b", np.bitwise_or, _integer, tx.bitwise_or, _BITWISE),
    ("bitwise_xor", "a ^ b", np.bitwise_xor, _integer, tx.bitwise_xor, _BITWISE),
    ("left_shift", "a << b (0 where b < 0 or b >= the bit width)", np.left_shift, _integer, _left_shift, _BITWISE),
    ("right_shift", "a >> b, arithmetic for signed a (0 or -1 where b < 0 or b >= the bit width)",
     np.right_shift, _integer, _right_shift, _BITWISE),
]

for _name, _doc, _fn, _rule, _te, _grad in _MATH_BINARY:
    register_binary(_name, _doc, _binary(_quiet(_fn)), _rule, te_expr=_te)
    _set_gradient(_name, _grad)

fmod = _make_binary("fmod")
bitwise_and = _make_binary("bitwise_and")
bitwise_or = _make_binary("bitwise_or")
bitwise_xor = _make_binary("bitwise_xor")
left_shift = _make_binary("left_shift")
right_shift = _make_binary("right_shift")
