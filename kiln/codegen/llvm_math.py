"""Math intrinsics as LLVM IR: inline float32 polynomials that LLVM can vectorize.

`exp`, `log`, `tanh`, `sigmoid` and `erf` on float32 are emitted as straight-line
code (range reduction, a Cephes-style polynomial, special cases by `select`),
never as calls to libm's scalar `expf`, so a vectorized loop stays vectorized.
`sqrt`, `floor`, `ceil`, `round` (half to even, like numpy), `abs` and `fma` are
LLVM intrinsics, which vectorize. `sin`, `cos` and `pow` are LLVM intrinsics that
lower to libm calls (scalar; correct, not fast). On float64 every
transcendental is a libm call.

Accuracy of the float32 polynomials against numpy's float64 results over the
whole float32 range, special values included (measured by tests/codegen/test_llvm_math.py; exp, tanh
and sigmoid also over every float32 in [-110, 90] and [-30, 30]; relative error where the result is a
normal float, absolute below that):

| fn      | max error (normal results)  | special values                                     |
| ------- | --------------------------- | -------------------------------------------------- |
| exp     | 0.9 ulp (rel 7.7e-8)        | inf above 88.72, denormals to 1 denormal ulp, 0 below -103.9 |
| log     | 0.8 ulp (rel 8.0e-8)        | log(0) = -inf, log(x < 0) = NaN, log(inf) = inf; denormal inputs too |
| tanh    | 1.4 ulp (rel 1.5e-7)        | saturates to +-1                                   |
| sigmoid | 2.5 ulp (rel 1.6e-7)        | abs 3e-39 below 1.2e-38 (0 once exp(-x) overflows, x < -88.7); 1 above |
| erf     | 5.5 ulp (rel 3.3e-7), near +-1 | saturates to +-1                                   |

NaN in gives NaN out for all of them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import llvmlite.ir as ir

F32 = ir.FloatType()
F64 = ir.DoubleType()
I32 = ir.IntType(32)
_FAST = ("contract",)  # lets LLVM fuse a*b+c into fma; never changes special-value behaviour


def intrinsic(builder: ir.IRBuilder, name: str, ret: ir.Type, args: Sequence[ir.Value]) -> ir.Value:
    """Calls LLVM intrinsic or external function `name` (declared on first use)."""
    module: ir.Module = builder.module
    fn = module.globals.get(name)
    if fn is None:
        fn = ir.Function(module, ir.FunctionType(ret, [a.type for a in args]), name)
    return builder.call(fn, list(args))


def _suffix(ty: ir.Type) -> str:
    return "f32" if ty == F32 else "f64"


def _c(value: float) -> ir.Constant:
    return ir.Constant(F32, value)


def _mul(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    return b.fmul(x, y, flags=_FAST)


def _add(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    return b.fadd(x, y, flags=_FAST)


def _poly(b: ir.IRBuilder, x: ir.Value, coeffs: Sequence[float]) -> ir.Value:
    """Horner: coeffs[0] * x^(n-1) + ... + coeffs[-1]."""
    acc: ir.Value = _c(coeffs[0])
    for c in coeffs[1:]:
        acc = _add(b, _mul(b, acc, x), _c(c))
    return acc


def _min(b: ir.IRBuilder, x: ir.Value, hi: float) -> ir.Value:
    """min(x, hi) that keeps a NaN x (one vminps on x86, unlike llvm.minnum)."""
    return b.select(b.fcmp_ordered(">", x, _c(hi)), _c(hi), x)


def _max(b: ir.IRBuilder, x: ir.Value, lo: float) -> ir.Value:
    """max(x, lo) that keeps a NaN x."""
    return b.select(b.fcmp_ordered("<", x, _c(lo)), _c(lo), x)


def _clamp(b: ir.IRBuilder, x: ir.Value, lo: float, hi: float) -> ir.Value:
    return _min(b, _max(b, x, lo), hi)


def _pow2i(b: ir.IRBuilder, n: ir.Value) -> ir.Value:
    """2.0**n for an i32 n in [-126, 127] (128 gives inf), built from exponent bits."""
    bits = b.shl(b.add(n, ir.Constant(I32, 127)), ir.Constant(I32, 23))
    return b.bitcast(bits, F32)


_ROUNDER = 12582912.0  # 1.5 * 2**23: x + this rounds x (|x| < 2**22) to an integer held in the low mantissa bits
_ROUNDER_BITS = 0x4B400000
# e**r on |r| <= ln2/2 as 1 + r + c2 r**2 + ... + c6 r**6, minimax in relative error (3e-9, 0.05 ulp), highest
# first: six fmas, the last two with the 1s, so that the result is rounded once (Cephes' 1 + r + r*r*p(r) took
# eight instructions and rounded twice)
_EXP_POLY = (1.381459879e-3, 8.368716575e-3, 4.166838899e-2, 1.666652113e-1, 4.999999404e-1, 1.0, 1.0)


def _exp_parts(b: ir.IRBuilder, x: ir.Value) -> tuple[ir.Value, ir.Value]:
    """(y, n) with e**x = y * 2**n, y in [0.7, 1.42] and n an i32, for |x| < 2**21.

    n = round(x / ln2) through the 1.5 * 2**23 rounder (one fma; n's bits are the sum's low bits), r =
    x - n ln2 with ln2 in two parts (two fmas), then a degree-6 polynomial (six fmas). n as a float is
    converted from the i32 n rather than taken as (sum - rounder): `llvm.ldexp` converts the i32 n too,
    and LLVM then shares that one conversion (a vcvtdq2ps) between the two.
    """
    t = _add(b, _mul(b, x, _c(1.44269504088896341)), _c(_ROUNDER))
    n = b.sub(b.bitcast(t, I32), ir.Constant(I32, _ROUNDER_BITS))
    n_f = b.sitofp(n, F32)
    r = b.fsub(x, _mul(b, n_f, _c(0.693359375)), flags=_FAST)
    r = b.fsub(r, _mul(b, n_f, _c(-2.12194440e-4)), flags=_FAST)
    return _poly(b, r, _EXP_POLY), n


def exp_f32(b: ir.IRBuilder, x: ir.Value, scalef: bool = False) -> ir.Value:
    """e**x on x clamped to [-104, 89]. A NaN goes through the arithmetic as NaN.

    With `scalef` (AVX-512), y * 2**n is `llvm.ldexp`, one vscalefps per vector, which rounds
    denormal results once; otherwise 2**n is applied as 2**(n//2) * 2**(n - n//2) from exponent
    bits (five more instructions), so results reach inf and the denormals too.
    """
    y, n = _exp_parts(b, _clamp(b, x, -104.0, 89.0))
    if scalef:
        return intrinsic(b, "llvm.ldexp.f32.i32", F32, [y, n])
    half = b.ashr(n, ir.Constant(I32, 1))
    return b.fmul(b.fmul(y, _pow2i(b, half)), _pow2i(b, b.sub(n, half)))


def log_f32(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """ln(x): x = m * 2**e with m in [sqrt(.5), sqrt(2)), Cephes degree-8 polynomial in m - 1."""

    def i32c(v: int) -> ir.Constant:
        return ir.Constant(I32, v)

    tiny = b.fcmp_ordered("<", x, _c(1.17549435e-38))  # denormal (or <= 0): scale up by 2**23 first
    xs = b.select(tiny, b.fmul(x, _c(8388608.0)), x)
    bits = b.bitcast(xs, I32)
    e = b.sub(b.and_(b.lshr(bits, i32c(23)), i32c(0xFF)), i32c(126))
    e = b.select(tiny, b.sub(e, i32c(23)), e)
    m = b.bitcast(b.or_(b.and_(bits, i32c(0x7FFFFF)), i32c(0x3F000000)), F32)  # in [0.5, 1)
    small = b.fcmp_ordered("<", m, _c(0.707106781186547524))
    e = b.select(small, b.sub(e, i32c(1)), e)
    m = b.fsub(b.select(small, b.fadd(m, m), m), _c(1.0))
    ef = b.sitofp(e, F32)
    z = b.fmul(m, m)
    p = _poly(b, m, [7.0376836292e-2, -1.1514610310e-1, 1.1676998740e-1, -1.2420140846e-1, 1.4249322787e-1,
                     -1.6668057665e-1, 2.0000714765e-1, -2.4999993993e-1, 3.3333331174e-1])
    y = _mul(b, _mul(b, p, m), z)
    y = _add(b, y, _mul(b, ef, _c(-2.12194440e-4)))
    y = b.fsub(y, b.fmul(z, _c(0.5)))
    y = _add(b, _add(b, m, y), _mul(b, ef, _c(0.693359375)))
    inf = _c(float("inf"))
    y = b.select(b.fcmp_ordered("==", x, inf), inf, y)
    y = b.select(b.fcmp_ordered("==", x, _c(0.0)), _c(float("-inf")), y)
    return b.select(b.fcmp_unordered("<", x, _c(0.0)), _c(float("nan")), y)  # x < 0 or NaN


def tanh_f32(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """tanh: an odd Cephes polynomial for |x| < 0.625, 1 - 2 / (exp(2|x|) + 1) above, with x's sign.

    |x| is clamped to 10 (tanh rounds to 1 in float32 from 9.02 on), so exp(2|x|) needs one scaling step.
    """
    ax = _min(b, intrinsic(b, "llvm.fabs.f32", F32, [x]), 10.0)
    z = b.fmul(x, x)
    p = _poly(b, z, [-5.70498872745e-3, 2.06390887954e-2, -5.37397155531e-2, 1.33314422036e-1,
                     -3.33332819422e-1])
    small = _add(b, _mul(b, _mul(b, p, z), x), x)
    y, n = _exp_parts(b, b.fmul(ax, _c(2.0)))
    e = b.fmul(y, _pow2i(b, n))
    big = b.fsub(_c(1.0), _mul(b, _c(2.0), b.fdiv(_c(1.0), b.fadd(e, _c(1.0)))), flags=_FAST)
    big = intrinsic(b, "llvm.copysign.f32", F32, [big, x])
    return b.select(b.fcmp_ordered("<", ax, _c(0.625)), small, big)


def sigmoid_f32(b: ir.IRBuilder, x: ir.Value, scalef: bool = False) -> ir.Value:
    """1 / (1 + exp(-x)): saturates to 0 and 1 through exp's overflow and underflow."""
    return b.fdiv(_c(1.0), b.fadd(_c(1.0), exp_f32(b, b.fneg(x), scalef)))


def erf_f32(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """erf: the odd/even rational approximation of Eigen and XLA on x clamped to [-4, 4]."""
    xc = _clamp(b, x, -4.0, 4.0)
    x2 = b.fmul(xc, xc)
    p = _poly(b, x2, [-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06, -5.69250639462346e-05,
                      -7.34990630326855e-04, -2.95459980854025e-03, -1.60960333262415e-02])
    q = _poly(b, x2, [-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03, -7.37332916720468e-03,
                      -1.42647390514189e-02])
    y = b.fmul(xc, b.fdiv(p, q))  # not (x * p) / q: x * p underflows for tiny x
    return _clamp(b, y, -1.0, 1.0)  # a NaN x stays NaN through the clamps


_F32_POLY: dict[str, Callable[[ir.IRBuilder, ir.Value], ir.Value]] = {
    "exp": exp_f32, "log": log_f32, "tanh": tanh_f32, "sigmoid": sigmoid_f32, "erf": erf_f32,
}
_LLVM_UNARY = {"sqrt": "sqrt", "floor": "floor", "ceil": "ceil", "round": "roundeven", "abs": "fabs",
               "sin": "sin", "cos": "cos"}
_LIBM_F64 = {"exp": "exp", "log": "log", "tanh": "tanh", "erf": "erf"}


def emit_float_call(b: ir.IRBuilder, name: str, args: Sequence[ir.Value], scalef: bool = False) -> ir.Value:
    """The value of intrinsic `name` on float32 or float64 operands; `scalef`: the target has AVX-512
    (exp and sigmoid scale by vscalefps).

    Raises:
        KeyError: for a name this module does not know (callers check INTRINSICS first).
    """
    ty = args[0].type
    sfx = _suffix(ty)
    if name in _LLVM_UNARY:
        return intrinsic(b, f"llvm.{_LLVM_UNARY[name]}.{sfx}", ty, args[:1])
    if name == "rsqrt":
        return b.fdiv(ir.Constant(ty, 1.0), intrinsic(b, f"llvm.sqrt.{sfx}", ty, args[:1]))
    if name == "fma":
        return intrinsic(b, f"llvm.fma.{sfx}", ty, args[:3])
    if name == "pow":
        return intrinsic(b, f"llvm.pow.{sfx}", ty, args[:2])
    if name == "isnan":
        return b.fcmp_unordered("uno", args[0], args[0])
    if ty == F32:
        if name in ("exp", "sigmoid"):
            return (exp_f32 if name == "exp" else sigmoid_f32)(b, args[0], scalef)
        return _F32_POLY[name](b, args[0])
    if name == "sigmoid":
        e = intrinsic(b, "exp", F64, [b.fneg(args[0])])
        return b.fdiv(ir.Constant(F64, 1.0), b.fadd(ir.Constant(F64, 1.0), e))
    return intrinsic(b, _LIBM_F64[name], F64, args[:1])


# -- float16 conversions -------------------------------------------------------------------
#
# LLVM lowers `fptrunc double to half` to a call of `__truncdfhf2` on every x86 CPU without
# AVX512-FP16, and float <-> half to `__truncsfhf2` / `__extendhfsf2` without F16C: compiler-rt
# functions that no library in the process defines, so MCJIT would call address 0. Kiln emits
# these conversions itself as integer code (which vectorizes) and never calls a runtime
# function. double -> half rounds once, from the double: going through float first would round
# twice and differ from numpy on ties (e.g. 1 + 2**-11 + 2**-40).

I16 = ir.IntType(16)
I64 = ir.IntType(64)


def _ic(ty: ir.Type, value: int) -> ir.Constant:
    return ir.Constant(ty, value)


def float_to_half_bits(b: ir.IRBuilder, v: ir.Value) -> ir.Value:
    """The IEEE half-precision bits (i16) of float32 or float64 `v`, rounded to nearest even.

    Overflow gives +-inf (from 65520 up, as in IEEE and numpy), tiny values give half denormals
    or a signed zero, and a NaN gives a quiet NaN of the same sign that keeps the top payload
    bits (what F16C's vcvtps2ph does).
    """
    mant, ity, f = (23, I32, F32) if v.type == F32 else (52, I64, F64)
    width, shift = ity.width, mant - 10
    bias = (1 << (width - mant - 2)) - 1
    bits = b.bitcast(v, ity)
    sign = b.and_(b.trunc(b.lshr(bits, _ic(ity, width - 16)), I16), _ic(I16, 0x8000))
    mag = b.and_(bits, _ic(ity, (1 << (width - 1)) - 1))
    exp_all = ((1 << (width - mant - 1)) - 1) << mant
    top = b.trunc(b.lshr(mag, _ic(ity, shift)), I16)  # exponent and the 10 top mantissa bits
    nan = b.or_(b.and_(top, _ic(I16, 0x3FF)), _ic(I16, 0x7E00))
    # Normal halves: add just under half an ulp plus the kept lowest bit, then truncate (ties to even).
    lsb = b.and_(b.lshr(mag, _ic(ity, shift)), _ic(ity, 1))
    rounded = b.add(b.add(mag, _ic(ity, (1 << (shift - 1)) - 1)), lsb)
    normal = b.sub(b.trunc(b.lshr(rounded, _ic(ity, shift)), I16), _ic(I16, (bias - 15) << 10))
    # Denormal halves: adding 2**(mant-24), whose ulp is the half denormal's 2**-24, rounds the
    # magnitude to nearest even in the FPU; the mantissa bits of the sum are the half's bits.
    # (A plain fadd: no fast-math flag may reassociate it away.)
    magic = float(2.0 ** (mant - 24))
    magic_bits = (bias + mant - 24) << mant
    denormal = b.trunc(b.sub(b.bitcast(b.fadd(b.bitcast(mag, f), ir.Constant(f, magic)), ity),
                             _ic(ity, magic_bits)), I16)
    overflow_bits = (bias + 15) << mant | (0x7FF << (mant - 11))  # 65520.0: the first value that rounds to inf
    min_normal_bits = (bias - 14) << mant
    out = b.select(b.icmp_unsigned(">=", mag, _ic(ity, min_normal_bits)), normal, denormal)
    out = b.select(b.icmp_unsigned(">=", mag, _ic(ity, overflow_bits)), _ic(I16, 0x7C00), out)
    out = b.select(b.icmp_unsigned(">", mag, _ic(ity, exp_all)), nan, out)
    return b.or_(out, sign)


def half_bits_to_float(b: ir.IRBuilder, h: ir.Value) -> ir.Value:
    """The float32 value of IEEE half-precision bits `h` (i16): exact, denormals, inf and NaN included."""
    wide = b.zext(h, I32)
    sign = b.shl(b.and_(wide, _ic(I32, 0x8000)), _ic(I32, 16))
    shifted = b.shl(b.and_(wide, _ic(I32, 0x7FFF)), _ic(I32, 13))
    exp = b.and_(shifted, _ic(I32, 0x0F800000))
    normal = b.add(shifted, _ic(I32, (127 - 15) << 23))  # rebias the exponent
    special = b.add(normal, _ic(I32, (128 - 16) << 23))  # inf / NaN: exponent all ones
    # Denormal halves: read the mantissa as 2**-14 * (1 + m/1024) and subtract 2**-14 (exact).
    denormal = b.bitcast(b.fsub(b.bitcast(b.add(normal, _ic(I32, 1 << 23)), F32), ir.Constant(F32, 2.0**-14)), I32)
    out = b.select(b.icmp_unsigned("==", exp, _ic(I32, 0)), denormal, normal)
    out = b.select(b.icmp_unsigned("==", exp, _ic(I32, 0x0F800000)), special, out)
    return b.bitcast(b.or_(out, sign), F32)


def float_to_bfloat16_bits(b: ir.IRBuilder, v: ir.Value) -> ir.Value:
    """The bfloat16 bits (i16) of float32 or float64 `v`, rounded to nearest even (float64 through
    float32, as ml_dtypes rounds it); a NaN gives a quiet NaN of the same sign and top payload bits.

    bfloat16 is float32's top half, so rounding is integer arithmetic: add just under half an ulp
    plus the kept lowest bit, then drop the low 16 bits (overflow carries into the exponent: inf).
    """
    if v.type != F32:
        v = b.fptrunc(v, F32)
    bits = b.bitcast(v, I32)
    lsb = b.and_(b.lshr(bits, _ic(I32, 16)), _ic(I32, 1))
    rounded = b.lshr(b.add(b.add(bits, _ic(I32, 0x7FFF)), lsb), _ic(I32, 16))
    quiet = b.or_(b.lshr(bits, _ic(I32, 16)), _ic(I32, 0x0040))
    nan = b.fcmp_unordered("uno", v, v)
    return b.trunc(b.select(nan, quiet, rounded), I16)


def bfloat16_bits_to_float(b: ir.IRBuilder, h: ir.Value) -> ir.Value:
    """The float32 value of bfloat16 bits `h` (i16): exact (its bits are float32's top half)."""
    return b.bitcast(b.shl(b.zext(h, I32), _ic(I32, 16)), F32)
