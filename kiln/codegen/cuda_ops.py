"""The CUDA C of the loop IR's bitwise nodes: `&`, `|`, `^` as C operators, shifts as guarded templates.

C leaves a shift by a negative amount or by the bit width or more undefined,
and a left shift of a negative value too (before C++20); the loop IR defines
them (`kiln.tir.expr.ShiftLeft`: numpy's rule, the amount read as unsigned,
everything shifted out past the width). So shifts call small templates that
shift the unsigned bit pattern and compare the amount as unsigned; NVCC folds
the compare away for a constant amount. `~x` needs nothing: the loop IR writes
it `x ^ all_ones`.
"""

from __future__ import annotations

from kiln.tir.expr import BinaryOp, BitAnd, BitOr, BitXor, ShiftLeft

# node -> C operator; on narrow types C computes in int, and the result stays in the type's range.
BIT_OPS: dict[type, str] = {BitAnd: "&", BitOr: "|", BitXor: "^"}

SHIFT_PRELUDE = r"""// Shifts as the loop IR defines them (numpy's rule): the amount read as unsigned, and from the bit
// width on every bit shifted out: 0, or -1 for a negative value shifted right arithmetically.
// U is the unsigned type the bits are shifted in (unsigned int for 8..32-bit T, so never a signed int).
template <typename T, typename U> __device__ __forceinline__ T kiln_shl(T a, T s) {
  return (U)s < (U)(sizeof(T) * 8) ? T((U)a << (U)s) : T(0);
}
template <typename T, typename U> __device__ __forceinline__ T kiln_shr(T a, T s) {
  return (U)s < (U)(sizeof(T) * 8) ? T((U)a >> (U)s) : T(0);
}
template <typename T, typename U> __device__ __forceinline__ T kiln_sar(T a, T s) {
  const U top = (U)(sizeof(T) * 8 - 1);  // by width - 1 every bit is the sign bit
  return T(a >> ((U)s < top ? (U)s : top));
}
"""


def shift(e: BinaryOp, x: str, y: str, ctype: str) -> str:
    """The C expression of shift node `e` of operands `x`, `y` (C text) of C type `ctype`."""
    unsigned = "unsigned long long" if e.dtype in ("int64", "uint64") else "unsigned int"
    fn = "kiln_shl" if isinstance(e, ShiftLeft) else "kiln_shr" if e.dtype.startswith("u") else "kiln_sar"
    return f"{fn}<{ctype}, {unsigned}>({x}, {y})"
