"""Loop-IR expressions: scalars only (vectorization is a loop kind, done by LLVM).

Every node has a `dtype` string ("int32", "float32", "bool", ...). Nodes compare
by identity (a `Var` is itself); `kiln.tir.printer` gives the canonical text
used for structural comparison and cache keys. Arithmetic operators build
nodes (`i * 4 + j`), constant-folding what is constant; comparisons `<`, `<=`,
`>`, `>=` build nodes too, but `==` stays identity: use `tir.eq(a, b)`.
The bitwise operators `&`, `|`, `^`, `~`, `<<`, `>>` build the integer nodes
`BitAnd` ... `ShiftRight` (`~x` is `x ^ all_ones`); a shift is defined for
every amount, as numpy defines it (see `ShiftLeft`).
"""

from __future__ import annotations

import itertools
from typing import Any, Union

import attrs

from kiln.errors import KilnError

ExprLike = Union["PrimExpr", int, float, bool]

_INT_TYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "bool")
_FLOAT_TYPES = ("float16", "bfloat16", "float32", "float64")


class TIRError(KilnError, TypeError):
    """Loop IR built from parts that do not fit (mismatched dtypes, a non-expression)."""


def is_float(dtype: str) -> bool:
    """Whether `dtype` is a floating-point type."""
    return dtype in _FLOAT_TYPES


def is_int(dtype: str) -> bool:
    """Whether `dtype` is an integer (or bool) type."""
    return dtype in _INT_TYPES


@attrs.frozen(eq=False, repr=False)
class PrimExpr:
    """Base of scalar expressions."""

    dtype: str

    # -- operators build nodes ---------------------------------------------------------
    def __add__(self, other: ExprLike) -> PrimExpr:
        return binary(Add, self, other)

    def __radd__(self, other: ExprLike) -> PrimExpr:
        return binary(Add, other, self)

    def __sub__(self, other: ExprLike) -> PrimExpr:
        return binary(Sub, self, other)

    def __rsub__(self, other: ExprLike) -> PrimExpr:
        return binary(Sub, other, self)

    def __mul__(self, other: ExprLike) -> PrimExpr:
        return binary(Mul, self, other)

    def __rmul__(self, other: ExprLike) -> PrimExpr:
        return binary(Mul, other, self)

    def __truediv__(self, other: ExprLike) -> PrimExpr:
        return binary(Div, self, other)

    def __rtruediv__(self, other: ExprLike) -> PrimExpr:
        return binary(Div, other, self)

    def __floordiv__(self, other: ExprLike) -> PrimExpr:
        return binary(FloorDiv, self, other)

    def __rfloordiv__(self, other: ExprLike) -> PrimExpr:
        return binary(FloorDiv, other, self)

    def __mod__(self, other: ExprLike) -> PrimExpr:
        return binary(FloorMod, self, other)

    def __rmod__(self, other: ExprLike) -> PrimExpr:
        return binary(FloorMod, other, self)

    def __neg__(self) -> PrimExpr:
        return binary(Sub, const(0, self.dtype), self)

    def __and__(self, other: ExprLike) -> PrimExpr:
        return binary(BitAnd, self, other)

    def __rand__(self, other: ExprLike) -> PrimExpr:
        return binary(BitAnd, other, self)

    def __or__(self, other: ExprLike) -> PrimExpr:
        return binary(BitOr, self, other)

    def __ror__(self, other: ExprLike) -> PrimExpr:
        return binary(BitOr, other, self)

    def __xor__(self, other: ExprLike) -> PrimExpr:
        return binary(BitXor, self, other)

    def __rxor__(self, other: ExprLike) -> PrimExpr:
        return binary(BitXor, other, self)

    def __lshift__(self, other: ExprLike) -> PrimExpr:
        return binary(ShiftLeft, self, other)

    def __rlshift__(self, other: ExprLike) -> PrimExpr:
        return binary(ShiftLeft, other, self)

    def __rshift__(self, other: ExprLike) -> PrimExpr:
        return binary(ShiftRight, self, other)

    def __rrshift__(self, other: ExprLike) -> PrimExpr:
        return binary(ShiftRight, other, self)

    def __invert__(self) -> PrimExpr:
        return bitwise_not(self)

    def __lt__(self, other: ExprLike) -> PrimExpr:
        return binary(LT, self, other)

    def __le__(self, other: ExprLike) -> PrimExpr:
        return binary(LE, self, other)

    def __gt__(self, other: ExprLike) -> PrimExpr:
        return binary(GT, self, other)

    def __ge__(self, other: ExprLike) -> PrimExpr:
        return binary(GE, self, other)

    def astype(self, dtype: str) -> PrimExpr:
        """This expression converted to `dtype` (no node when it already is)."""
        return cast(dtype, self)

    def __bool__(self) -> bool:
        raise TIRError("a loop-IR expression has no truth value; use tir.all_of/any_of or compare with tir.eq")

    def __str__(self) -> str:
        from kiln.tir.printer import expr_text

        return expr_text(self)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self}>"


_VAR_IDS = itertools.count()


@attrs.frozen(eq=False, repr=False)
class Var(PrimExpr):
    """A scalar variable: a loop index, a symbolic size, a let binding."""

    name: str
    dtype: str = "int32"
    uid: int = attrs.field(factory=lambda: next(_VAR_IDS))


@attrs.frozen(eq=False, repr=False)
class IntImm(PrimExpr):
    """An integer (or bool) constant."""

    value: int


@attrs.frozen(eq=False, repr=False)
class FloatImm(PrimExpr):
    """A floating-point constant."""

    value: float


@attrs.frozen(eq=False, repr=False)
class BinaryOp(PrimExpr):
    """Base of two-operand nodes; `symbol` is how the printer writes them."""

    a: PrimExpr
    b: PrimExpr
    symbol = "?"


class Add(BinaryOp):
    symbol = "+"


class Sub(BinaryOp):
    symbol = "-"


class Mul(BinaryOp):
    symbol = "*"


class Div(BinaryOp):
    """a / b: true division for floats, truncating division for integers (as C)."""

    symbol = "/"


class FloorDiv(BinaryOp):
    symbol = "//"


class FloorMod(BinaryOp):
    symbol = "%"


class Min(BinaryOp):
    symbol = "min"


class Max(BinaryOp):
    symbol = "max"


class EQ(BinaryOp):
    symbol = "=="


class NE(BinaryOp):
    symbol = "!="


class LT(BinaryOp):
    symbol = "<"


class LE(BinaryOp):
    symbol = "<="


class GT(BinaryOp):
    symbol = ">"


class GE(BinaryOp):
    symbol = ">="


class And(BinaryOp):
    symbol = "and"


class Or(BinaryOp):
    symbol = "or"


class BitAnd(BinaryOp):
    """Bitwise and of two integers (or bools) of one dtype."""

    symbol = "&"


class BitOr(BinaryOp):
    """Bitwise or."""

    symbol = "|"


class BitXor(BinaryOp):
    """Bitwise exclusive or; `bitwise_not(x)` is `x ^ all_ones` (LLVM's canonical `not`)."""

    symbol = "^"


class ShiftLeft(BinaryOp):
    """a << b, the amount b of a's dtype read as unsigned: an amount of at least the bit width (or a negative
    one) gives 0, as numpy (C and LLVM leave it undefined: the back ends guard it unless b is a constant)."""

    symbol = "<<"


class ShiftRight(BinaryOp):
    """a >> b: arithmetic for signed a, logical for unsigned; an amount out of range as for `ShiftLeft`
    gives 0, or -1 for a negative a (every bit shifted out, the sign shifted in)."""

    symbol = ">>"


COMPARISONS = (EQ, NE, LT, LE, GT, GE)
LOGICAL = (And, Or)
BITWISE = (BitAnd, BitOr, BitXor)
SHIFTS = (ShiftLeft, ShiftRight)


@attrs.frozen(eq=False, repr=False)
class Not(PrimExpr):
    """Logical not of a bool."""

    a: PrimExpr


@attrs.frozen(eq=False, repr=False)
class Cast(PrimExpr):
    """`value` converted to `dtype`."""

    value: PrimExpr


@attrs.frozen(eq=False, repr=False)
class Select(PrimExpr):
    """`true_value if cond else false_value`; both sides may be evaluated."""

    cond: PrimExpr
    true_value: PrimExpr
    false_value: PrimExpr


def _exprs(values: Any) -> tuple[PrimExpr, ...]:
    return tuple(as_expr(v) for v in values)


def _shape(values: Any) -> tuple[PrimExpr, ...]:
    return tuple(as_expr(d) for d in values)


# Intrinsics a Call may name; the back ends know each of them.
INTRINSICS = frozenset(
    {
        "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "erf", "pow", "floor", "ceil", "round",
        "abs", "sin", "cos", "fma", "isnan", "prefetch", "reinterpret", "dot4_u8i8",
    }
)
# `reinterpret(x, dtype=d)` is x's bits read as dtype d (C++'s bit_cast, numpy's `.view`): d and x's dtype
# have one width. bool and bfloat16 have no bits of their own here, so it takes neither.
# `prefetch(buf[i])` (int32, for an Evaluate) hints that the cache line holding buf[i] will be read
# soon; the load is never performed, so the index may lie past the buffer.
# `dot4_u8i8(a, b)` (int32 of two int32) sums the products of a's four bytes, read unsigned, with b's, read
# signed, byte j with byte j (little-endian): AVX-512 VNNI's vpdpbusd does 16 of them per instruction.


@attrs.frozen(eq=False, repr=False)
class Call(PrimExpr):
    """A call of an intrinsic (`INTRINSICS`) on scalars."""

    name: str
    args: tuple[PrimExpr, ...] = attrs.field(converter=_exprs)


@attrs.frozen(eq=False, repr=False)
class Buffer:
    """A multi-dimensional array in memory: name, shape (PrimExprs), dtype, and its scope."""

    name: str
    shape: tuple[PrimExpr, ...] = attrs.field(converter=_shape)
    dtype: str = "float32"
    scope: str = "global"  # "global", "local" (registers/stack), "shared" (CUDA)

    @property
    def ndim(self) -> int:
        """The number of dimensions."""
        return len(self.shape)

    def __repr__(self) -> str:
        return f"Buffer({self.name}, [{', '.join(map(str, self.shape))}], {self.dtype})"

    def load(self, *indices: ExprLike) -> BufferLoad:
        """`self[indices]` as an expression."""
        return BufferLoad(self.dtype, self, tuple(as_expr(i) for i in indices))


@attrs.frozen(eq=False, repr=False)
class BufferLoad(PrimExpr):
    """Reads `buffer[indices]`."""

    buffer: Buffer
    indices: tuple[PrimExpr, ...] = attrs.field(converter=_exprs)


# ---------------------------------------------------------------------------
# Construction helpers
# ---------------------------------------------------------------------------


def const(value: Any, dtype: str | None = None) -> PrimExpr:
    """An immediate: ints are int32 and floats float32 unless `dtype` says otherwise."""
    if dtype is None:
        dtype = "bool" if isinstance(value, bool) else "int32" if isinstance(value, int) else "float32"
    if is_float(dtype):
        return FloatImm(dtype, float(value))
    return IntImm(dtype, int(value))


def as_expr(value: ExprLike, dtype: str | None = None) -> PrimExpr:
    """`value` as a PrimExpr (Python numbers become immediates of `dtype` or the default)."""
    if isinstance(value, PrimExpr):
        return value
    if isinstance(value, (int, float, bool)):
        return const(value, dtype)
    import numpy as np

    if isinstance(value, np.generic):
        return const(value.item(), str(value.dtype))
    raise TIRError(f"expected a loop-IR expression or a number, got {type(value).__name__} {value!r:.60}")


def _fold(cls: type[BinaryOp], a: PrimExpr, b: PrimExpr) -> PrimExpr | None:
    """Folds two immediates; None when either side is not constant (or division by zero)."""
    if not isinstance(a, (IntImm, FloatImm)) or not isinstance(b, (IntImm, FloatImm)):
        return None
    x, y = a.value, b.value
    out_dtype = "bool" if cls in COMPARISONS or cls in LOGICAL else a.dtype
    if cls in (Div, FloorDiv, FloorMod) and y == 0:
        return None
    table: dict[type[BinaryOp], Any] = {
        Add: lambda: x + y, Sub: lambda: x - y, Mul: lambda: x * y,
        # integers: exact truncating division (x / y in floats loses the low bits of 64-bit values)
        Div: lambda: (x / y) if is_float(a.dtype) else (abs(int(x)) // abs(int(y))) * (1 if (x < 0) == (y < 0) else -1),
        FloorDiv: lambda: (x // y), FloorMod: lambda: (x % y),
        Min: lambda: min(x, y), Max: lambda: max(x, y),
        EQ: lambda: x == y, NE: lambda: x != y, LT: lambda: x < y, LE: lambda: x <= y,
        GT: lambda: x > y, GE: lambda: x >= y, And: lambda: bool(x) and bool(y), Or: lambda: bool(x) or bool(y),
        BitAnd: lambda: int(x) & int(y), BitOr: lambda: int(x) | int(y), BitXor: lambda: int(x) ^ int(y),
        ShiftLeft: lambda: _shift(a.dtype, int(x), int(y), left=True),
        ShiftRight: lambda: _shift(a.dtype, int(x), int(y), left=False),
    }
    value = table[cls]()
    if cls in BITWISE or cls in SHIFTS:  # bit patterns: a signed x << s wraps too (LLVM's shl has no nsw here)
        value = _convert(value, out_dtype)
    elif out_dtype.startswith("uint"):  # unsigned arithmetic wraps (uint64 0 - 1 is 2**64 - 1); signed is left
        value = _convert(value, out_dtype)  # as it was: its overflow is undefined, and the simplifier assumes none
    return const(value, out_dtype)


def binary(cls: type[BinaryOp], a: ExprLike, b: ExprLike) -> PrimExpr:
    """Builds `cls(a, b)`, matching a Python number to the other side's dtype and folding constants.

    Raises:
        TIRError: when both sides are expressions of different dtypes.
    """
    if isinstance(a, PrimExpr) and not isinstance(b, PrimExpr):
        b = as_expr(b, a.dtype if not isinstance(b, float) or is_float(a.dtype) else "float32")
    elif isinstance(b, PrimExpr) and not isinstance(a, PrimExpr):
        a = as_expr(a, b.dtype if not isinstance(a, float) or is_float(b.dtype) else "float32")
    a, b = as_expr(a), as_expr(b)
    if a.dtype != b.dtype:
        raise TIRError(f"{cls.__name__} of {a.dtype} and {b.dtype}: cast one side first ({a} {cls.symbol} {b})")
    if (cls in BITWISE and not is_int(a.dtype)) or (cls in SHIFTS and (not is_int(a.dtype) or a.dtype == "bool")):
        kinds = "integers or bools" if cls in BITWISE else "integers"
        raise TIRError(f"{cls.__name__} of {a.dtype}: bitwise operations take {kinds} ({a} {cls.symbol} {b})")
    folded = _fold(cls, a, b)
    if folded is not None:
        return folded
    out_dtype = "bool" if cls in COMPARISONS or cls in LOGICAL else a.dtype
    return cls(out_dtype, a, b)


def eq(a: ExprLike, b: ExprLike) -> PrimExpr:
    """a == b as an expression."""
    return binary(EQ, a, b)


def ne(a: ExprLike, b: ExprLike) -> PrimExpr:
    """a != b as an expression."""
    return binary(NE, a, b)


def min_(a: ExprLike, b: ExprLike) -> PrimExpr:
    """min(a, b)."""
    return binary(Min, a, b)


def max_(a: ExprLike, b: ExprLike) -> PrimExpr:
    """max(a, b)."""
    return binary(Max, a, b)


def bitwise_and(a: ExprLike, b: ExprLike) -> PrimExpr:
    """a & b."""
    return binary(BitAnd, a, b)


def bitwise_or(a: ExprLike, b: ExprLike) -> PrimExpr:
    """a | b."""
    return binary(BitOr, a, b)


def bitwise_xor(a: ExprLike, b: ExprLike) -> PrimExpr:
    """a ^ b."""
    return binary(BitXor, a, b)


def bitwise_not(a: PrimExpr) -> PrimExpr:
    """~a: every bit flipped, as `a ^ all_ones` (no node of its own: LLVM writes `not` as that `xor`,
    and every pass that knows `BitXor` knows it). On a bool, the logical not."""
    if not is_int(a.dtype):
        raise TIRError(f"bitwise_not of {a.dtype}: bitwise operations take integers or bools ({a})")
    ones = True if a.dtype == "bool" else -1 if not a.dtype.startswith("u") else (1 << _INT_BITS[a.dtype]) - 1
    return binary(BitXor, a, const(ones, a.dtype))


def shift_left(a: ExprLike, b: ExprLike) -> PrimExpr:
    """a << b (0 for an amount out of [0, bits), see `ShiftLeft`)."""
    return binary(ShiftLeft, a, b)


def shift_right(a: ExprLike, b: ExprLike) -> PrimExpr:
    """a >> b, arithmetic for signed a, logical for unsigned (see `ShiftRight`)."""
    return binary(ShiftRight, a, b)


def _shift(dtype: str, x: int, s: int, left: bool) -> int:
    """`x << s` or `x >> s` as the loop IR defines them: `s` read as unsigned, out of range shifts everything out."""
    bits = _INT_BITS[dtype]
    if not 0 <= s < bits:  # a negative s, read as unsigned, is at least 2**(bits - 1) >= bits
        return -1 if not left and x < 0 else 0
    return x << s if left else x >> s  # Python's >> is arithmetic (floor) on negatives, logical on the rest


def all_of(*conds: ExprLike) -> PrimExpr:
    """The conjunction of bool expressions (true for none)."""
    if not conds:
        return const(True)
    out = as_expr(conds[0])
    for c in conds[1:]:
        out = binary(And, out, c)
    return out


def any_of(*conds: ExprLike) -> PrimExpr:
    """The disjunction of bool expressions (false for none)."""
    if not conds:
        return const(False)
    out = as_expr(conds[0])
    for c in conds[1:]:
        out = binary(Or, out, c)
    return out


def logical_not(a: PrimExpr) -> PrimExpr:
    """not a."""
    if isinstance(a, IntImm):
        return const(not a.value)
    return Not("bool", a)


def cast(dtype: str, value: ExprLike) -> PrimExpr:
    """`value` as `dtype` (folded for immediates; no node when it already is)."""
    value = as_expr(value)
    if value.dtype == dtype:
        return value
    if isinstance(value, (IntImm, FloatImm)):
        return const(_convert(value.value, dtype), dtype)
    return Cast(dtype, value)


_INT_BITS = {"int8": 8, "int16": 16, "int32": 32, "int64": 64, "uint8": 8, "uint16": 16, "uint32": 32,
             "uint64": 64}


def _convert(value: float, dtype: str) -> float:
    """A constant converted as C converts it: truncation toward zero, wrap-around, bool of nonzero."""
    if dtype in ("float16", "float32"):
        import numpy as np

        # rounded once, to nearest even, from the value itself (numpy's conversions are correctly rounded)
        with np.errstate(over="ignore"):
            return float(np.float16(value) if dtype == "float16" else np.float32(value))
    if is_float(dtype):
        return float(value)
    if dtype == "bool":
        return int(bool(value))
    bits = _INT_BITS[dtype]
    x = int(value) & ((1 << bits) - 1)
    if not dtype.startswith("u") and x >= 1 << (bits - 1):
        x -= 1 << bits
    return x


def select(cond: PrimExpr, true_value: ExprLike, false_value: ExprLike) -> PrimExpr:
    """`true_value if cond else false_value`, matching number literals to the other side."""
    if isinstance(true_value, PrimExpr):
        false_value = as_expr(false_value, true_value.dtype)
    elif isinstance(false_value, PrimExpr):
        true_value = as_expr(true_value, false_value.dtype)
    t, f = as_expr(true_value), as_expr(false_value)
    if t.dtype != f.dtype:
        raise TIRError(f"select of {t.dtype} and {f.dtype}: both sides need one dtype")
    if isinstance(cond, IntImm):
        return t if cond.value else f
    return Select(t.dtype, cond, t, f)


def call(name: str, *args: ExprLike, dtype: str | None = None) -> PrimExpr:
    """A call of intrinsic `name`; its dtype is the first argument's unless given."""
    if name not in INTRINSICS:
        raise TIRError(f"unknown intrinsic {name!r}; known: {', '.join(sorted(INTRINSICS))}")
    exprs = tuple(as_expr(a) for a in args)
    if name == "prefetch":
        if len(exprs) != 1 or not isinstance(exprs[0], BufferLoad):
            raise TIRError(f"prefetch takes one buffer element (buf[i]), got {exprs!r}")
        return Call("int32", name, exprs)
    if name == "reinterpret":
        if len(exprs) != 1:
            raise TIRError(f"reinterpret takes one value, got {len(exprs)}")
        return reinterpret(exprs[0], dtype)
    if name == "dot4_u8i8" and (len(exprs) != 2 or any(x.dtype != "int32" for x in exprs)):
        raise TIRError(f"dot4_u8i8 takes two int32 values (four bytes each), got {exprs!r}")
    return Call(dtype or exprs[0].dtype, name, exprs)


_BITS = {"int8": 8, "uint8": 8, "int16": 16, "uint16": 16, "float16": 16, "int32": 32, "uint32": 32,
         "float32": 32, "int64": 64, "uint64": 64, "float64": 64}


def reinterpret(value: ExprLike, dtype: str | None = None) -> PrimExpr:
    """The bits of `value` read as `dtype` (of the same width); constants fold as numpy's `.view`.

    Raises:
        TIRError: for a dtype missing, of another width, or without bits (bool, bfloat16).
    """
    x = as_expr(value)
    if dtype is None:
        raise TIRError("reinterpret needs the dtype to read the bits as (dtype=...)")
    src_bits, dst_bits = _BITS.get(x.dtype), _BITS.get(dtype)
    if src_bits is None or dst_bits is None:
        raise TIRError(f"reinterpret of {x.dtype} as {dtype}: it takes the dtypes {', '.join(_BITS)}")
    if src_bits != dst_bits:
        raise TIRError(f"reinterpret of {x.dtype} ({src_bits} bits) as {dtype} ({dst_bits} bits): "
                       "the widths differ")
    if x.dtype == dtype:
        return x
    if isinstance(x, (IntImm, FloatImm)):
        import numpy as np

        out = np.array(x.value).astype(x.dtype).view(dtype).item()
        # a NaN stays a Call: a Python float would lose its payload, or quiet a signalling one
        if not (isinstance(out, float) and out != out):
            return const(out, dtype)
    return Call(dtype, "reinterpret", (x,))
