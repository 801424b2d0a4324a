"""C types of kiln's dtypes for the CUDA back end: the table, literals, and bit reinterpretation.

Literals name every constant exactly: NaN and the infinities by their bits (C has
no literal for them), float16 rounded once from the exact value, and the most
negative int32/int64 and unsigned values spelled so that C gives them the right
type. `reinterpret` reads a value's bits as another dtype of the same width with
CUDA's bit-cast functions (`__float_as_int`, `__half_as_short`, ...); between
signed and unsigned integers a C conversion keeps the bits.
"""

from __future__ import annotations

import numpy as np

from kiln.codegen.jit import CodegenError
from kiln.ir.dtype import DataType

C_TYPES: dict[str, str] = {
    "bool": "bool",
    "int8": "signed char",
    "int16": "short",
    "int32": "int",
    "int64": "long long",
    "uint8": "unsigned char",
    "uint16": "unsigned short",
    "uint32": "unsigned int",
    "uint64": "unsigned long long",
    "float16": "__half",
    "bfloat16": "kiln_bf16",
    "float32": "float",
    "float64": "double",
}
NARROW_INTS = ("bool", "int8", "int16", "uint8", "uint16")  # C computes these in int: results are cast back
INT_RANGE = {"int8": (-128, 127), "int16": (-(2**15), 2**15 - 1), "uint8": (0, 255), "uint16": (0, 2**16 - 1)}
UNSIGNED = ("bool", "uint8", "uint16", "uint32", "uint64")


def ctype(dtype: str) -> str:
    """The C type of `dtype`.

    Raises:
        CodegenError: for a dtype the back end does not compile.
    """
    try:
        return C_TYPES[dtype]
    except KeyError:
        raise CodegenError(f"the cuda back end does not support dtype {dtype!r}; "
                           f"supported: {', '.join(C_TYPES)}") from None


# float16 and bfloat16 are storage types: their values are computed in float32 (float16 -> (to float32,
# from float32, from float64)). bfloat16 is kiln's own (BF16_PRELUDE), which needs no header.
NARROW: dict[str, tuple[str, str, str]] = {
    "float16": ("__half2float", "__float2half", "__double2half"),
    "bfloat16": ("kiln_bf16_to_float", "kiln_float_to_bf16", "kiln_double_to_bf16"),
}

# bfloat16 is float32's top half: widening is a shift, and narrowing rounds to nearest even in integer
# arithmetic (a NaN stays a quiet NaN), as the llvm back end and ml_dtypes round; float64 goes
# through float32, as ml_dtypes converts it.
BF16_PRELUDE = r"""struct __align__(2) kiln_bf16 { unsigned short x; };
__device__ __forceinline__ float kiln_bf16_to_float(kiln_bf16 h) { return __uint_as_float((unsigned)h.x << 16); }
__device__ __forceinline__ kiln_bf16 kiln_bits_bf16(unsigned short x) { kiln_bf16 h; h.x = x; return h; }
__device__ __forceinline__ kiln_bf16 kiln_float_to_bf16(float f) {
  unsigned u = __float_as_uint(f);
  return kiln_bits_bf16((unsigned short)(f != f ? (u >> 16) | 0x40u : (u + 0x7fffu + ((u >> 16) & 1u)) >> 16));
}
__device__ __forceinline__ kiln_bf16 kiln_double_to_bf16(double d) { return kiln_float_to_bf16((float)d); }
template <> __device__ __forceinline__ kiln_bf16 kiln_min<kiln_bf16>(kiln_bf16 a, kiln_bf16 b) {
  return kiln_float_to_bf16(kiln_min<float>(kiln_bf16_to_float(a), kiln_bf16_to_float(b)));
}
template <> __device__ __forceinline__ kiln_bf16 kiln_max<kiln_bf16>(kiln_bf16 a, kiln_bf16 b) {
  return kiln_float_to_bf16(kiln_max<float>(kiln_bf16_to_float(a), kiln_bf16_to_float(b)));
}
"""


def float_literal(value: float, dtype: str) -> str:
    """The C text of float constant `value` of `dtype` (float16: a `__half`; bfloat16: its bits)."""
    if dtype == "bfloat16":
        word = int(np.asarray(DataType.of(dtype).numpy().type(value)).view(np.uint16))
        return f"kiln_bits_bf16(0x{word:04x})"
    if dtype == "float16" and value == value:  # rounded once, here: via float32 it would round twice
        with np.errstate(over="ignore"):  # (1 + 2**-11 + 2**-40 would be 1.0, not 1 + 2**-10)
            value = float(np.float16(value))
    if value != value:
        bits = "__int_as_float(0x7fc00000)" if dtype != "float64" else "__longlong_as_double(0x7ff8000000000000LL)"
    elif value in (float("inf"), float("-inf")):
        sign = "" if value > 0 else "-"
        bits = f"{sign}__int_as_float(0x7f800000)" if dtype != "float64" \
            else f"{sign}__longlong_as_double(0x7ff0000000000000LL)"
    else:
        bits = ""
    if bits:
        return f"__float2half({bits})" if dtype == "float16" else bits
    if dtype == "float64":
        text = repr(float(value))
        return text if any(c in text for c in ".en") else text + ".0"
    text = f"{float(np.float32(value)):.9g}"
    if not any(c in text for c in ".en"):
        text += ".0"
    lit = f"{text}f"
    return f"__float2half({lit})" if dtype == "float16" else lit


def int_literal(value: int, dtype: str) -> str:
    """The C text of integer (or bool) constant `value` of `dtype`, of that C type."""
    if dtype == "bool":
        return "true" if value else "false"
    if dtype == "int64":
        return "(-9223372036854775807LL - 1)" if value == -(2**63) else f"{value}LL"
    if dtype == "int32":
        return "(-2147483647 - 1)" if value == -(2**31) else str(value)
    if dtype in ("uint32", "uint64"):  # suffixed: 2**63 + 5 unsuffixed is too large for any signed type
        bits = 32 if dtype == "uint32" else 64
        return f"{value & ((1 << bits) - 1)}{'u' if bits == 32 else 'ull'}"
    return f"(({C_TYPES[dtype]}){value})"


def bare(text: str) -> str:
    """`text` without the parentheses around all of it, if it has them."""
    if not (text.startswith("(") and text.endswith(")")):
        return text
    depth = 0
    for i, c in enumerate(text):
        depth += (c == "(") - (c == ")")
        if depth == 0 and i < len(text) - 1:
            return text
    return text[1:-1]


# (src, dst) -> CUDA's bit-cast function; unsigned 64-bit goes through long long.
_BITCASTS: dict[tuple[str, str], str] = {
    ("float32", "int32"): "__float_as_int", ("float32", "uint32"): "__float_as_uint",
    ("int32", "float32"): "__int_as_float", ("uint32", "float32"): "__uint_as_float",
    ("float64", "int64"): "__double_as_longlong", ("int64", "float64"): "__longlong_as_double",
    ("float16", "int16"): "__half_as_short", ("float16", "uint16"): "__half_as_ushort",
    ("int16", "float16"): "__short_as_half", ("uint16", "float16"): "__ushort_as_half",
}


def reinterpret(x: str, src: str, dst: str) -> str:
    """The C expression reading the bits of `x` (C text of dtype `src`) as `dst`, of the same width."""
    fn = _BITCASTS.get((src, dst))
    if fn is not None:
        return f"{fn}({bare(x)})"
    if (src, dst) == ("float64", "uint64"):
        return f"((unsigned long long)__double_as_longlong({bare(x)}))"
    if (src, dst) == ("uint64", "float64"):
        return f"__longlong_as_double((long long)({x}))"
    if src in C_TYPES and not src.startswith("float") and not dst.startswith("float") and dst != "bool":
        return f"(({C_TYPES[dst]})({x}))"  # signed <-> unsigned of one width: C's conversion keeps the bits
    raise CodegenError(f"reinterpret of {src} as {dst}: the cuda back end has no such bit cast")
