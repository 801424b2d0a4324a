"""Types of the IR: tensors with static, symbolic or unknown dims; tuples; functions.

A dim is an `int`, a `SymDim` (an integer times a product of size variables,
such as `n` or `3*n`; `SizeVar("n")` makes one), a `SumDim` (a sum of those and
an int: `n + 3`, `p + s`), or `ANY` (unknown until run time). Sums, products and
quotients of dims stay symbolic, so `reshape` of `(n, 12)` to `(-1, 4)` has the
type `(3*n, 4)`, a concatenation of `(p, 8)` and `(s, 8)` is `(p + s, 8)`, and
every second row of `(s, 8)` is `(floordiv(s + 1, 2), 8)`: a floor quotient that no
term divides exactly is a `Quot`, which a monomial holds as a factor as it
holds a size variable.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any as _Any

import attrs

from kiln.ir.dtype import DataType

# ---------------------------------------------------------------------------
# Dims
# ---------------------------------------------------------------------------


@attrs.frozen(repr=False)
class Quot:
    """`num // den` (floor): a factor of a dim such as `floordiv(n + 1, 2)`, for a `num` that `den` does not divide
    term by term (`dim_floordiv` keeps it canonical: each coefficient of `num` is in [0, den))."""

    num: SymDim | SumDim
    den: int  # >= 2

    def __str__(self) -> str:
        return f"floordiv({self.num}, {self.den})"  # as TVM writes it (relay text reads // as a comment)


Factor = str | Quot  # a size variable's name, or a quotient


def _factor_key(f: tuple[Factor, int]) -> tuple[bool, str, int]:
    return isinstance(f[0], Quot), str(f[0]), f[1]


def _sorted_factors(powers: dict[Factor, int]) -> tuple[tuple[Factor, int], ...]:
    return tuple(sorted(((n, p) for n, p in powers.items() if p), key=_factor_key))


@attrs.frozen(repr=False)
class SymDim:
    """`coeff * v1^p1 * v2^p2 ...`: a dim known up to the size variables (and quotients) in it."""

    coeff: int
    factors: tuple[tuple[Factor, int], ...]  # sorted (name or quotient, power), power >= 1

    def __str__(self) -> str:
        parts = [] if self.coeff == 1 and self.factors else [str(self.coeff)]
        for name, power in self.factors:
            parts.extend([str(name)] * power)
        return "*".join(parts)

    def __repr__(self) -> str:
        return f"SymDim({self})"

    # Arithmetic where the result is a dim again (`2*n`, `n*s`, `2*n // 2`, `n + 1`), for values computed
    # from shapes (ONNX's Shape -> Gather -> Mul chains); an inexact quotient raises ValueError.
    def __mul__(self, other: object) -> Dim:
        if not isinstance(other, (int, SymDim)) or isinstance(other, bool):
            return NotImplemented
        return dim_mul(self, other)

    __rmul__ = __mul__

    def __floordiv__(self, other: object) -> Dim:
        if isinstance(other, int) and not isinstance(other, bool) and other > 0:
            return dim_floordiv(self, other)
        if not isinstance(other, (int, SymDim)) or isinstance(other, bool):
            return NotImplemented
        return _exact(dim_div(self, other), self, "//", other)

    def __rfloordiv__(self, other: object) -> Dim:
        if not isinstance(other, int) or isinstance(other, bool):
            return NotImplemented
        return _exact(dim_div(other, self), other, "//", self)

    def __add__(self, other: object) -> Dim:
        if not isinstance(other, (int, SymDim)) or isinstance(other, bool):
            return NotImplemented
        return _exact(dim_add(self, other), self, "+", other)

    __radd__ = __add__

    def __sub__(self, other: object) -> Dim:
        if not isinstance(other, (int, SymDim)) or isinstance(other, bool):
            return NotImplemented
        return _exact(dim_add(self, dim_mul(other, -1)) if other != self else 0, self, "-", other)


@attrs.frozen(repr=False)
class AnyDim:
    """A dim unknown until run time, printed `?`."""

    def __str__(self) -> str:
        return "?"

    def __repr__(self) -> str:
        return "ANY"


ANY = AnyDim()


@attrs.frozen(repr=False)
class SumDim:
    """`m1 + m2 + ... + c`: a sum of monomials of distinct factors and an int, such as `n + 1` (a padded
    axis), `p + s` (a concatenation) or `s - 1`; canonical, so equal sums compare equal."""

    terms: tuple[SymDim, ...]  # at least one; sorted by factors, no zero coefficient
    const: int = 0

    def __str__(self) -> str:
        out = str(self.terms[0])
        for t in self.terms[1:]:
            out += f" - {SymDim(-t.coeff, t.factors)}" if t.coeff < 0 else f" + {t}"
        return out + (f" + {self.const}" if self.const > 0 else f" - {-self.const}" if self.const else "")

    def __repr__(self) -> str:
        return f"SumDim({self})"

    def __add__(self, other: object) -> Dim:
        if not isinstance(other, (int, SymDim, SumDim)) or isinstance(other, bool):
            return NotImplemented
        return dim_add(self, other)

    __radd__ = __add__

    def __sub__(self, other: object) -> Dim:
        if not isinstance(other, (int, SymDim, SumDim)) or isinstance(other, bool):
            return NotImplemented
        return dim_add(self, dim_mul(other, -1))

    def __mul__(self, other: object) -> Dim:
        if not isinstance(other, (int, SymDim, SumDim)) or isinstance(other, bool):
            return NotImplemented
        return dim_mul(self, other)

    __rmul__ = __mul__

    def __floordiv__(self, other: object) -> Dim:
        if not isinstance(other, int) or isinstance(other, bool) or other <= 0:
            return NotImplemented
        return dim_floordiv(self, other)


Dim = int | SymDim | SumDim | AnyDim

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def SizeVar(name: str) -> SymDim:
    """A symbolic dim named `name`, e.g. the batch size `n`."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(f"a size variable is named like an identifier, got {name!r}")
    return SymDim(1, ((name, 1),))


def _is_name(d: Dim) -> bool:
    return isinstance(d, SymDim) and d.coeff == 1 and len(d.factors) == 1 and d.factors[0][1] == 1 and \
        isinstance(d.factors[0][0], str)


def size_name(d: Dim) -> str | None:
    """The name of `d` when it is one size variable itself (`n`; not `2*n`, `n*s` or `floordiv(n, 2)`), else None."""
    return d.factors[0][0] if _is_name(d) else None  # type: ignore[union-attr,return-value]


def _make(coeff: int, powers: dict[Factor, int]) -> Dim:
    factors = _sorted_factors(powers)
    return coeff if not factors or coeff == 0 else SymDim(coeff, factors)


def _split_dim(d: Dim) -> tuple[int, dict[Factor, int]]:
    if isinstance(d, int):
        return d, {}
    assert isinstance(d, SymDim)
    return d.coeff, dict(d.factors)


Poly = dict[tuple[tuple[Factor, int], ...], int]  # factors -> coefficient; () holds the constant


def _poly(d: Dim) -> Poly:
    if isinstance(d, int):
        return {(): d}
    if isinstance(d, SymDim):
        return {d.factors: d.coeff}
    assert isinstance(d, SumDim)
    out: Poly = {t.factors: t.coeff for t in d.terms}
    out[()] = d.const
    return out


def _from_poly(poly: Poly) -> Dim:
    terms = tuple(SymDim(c, f) for f, c in sorted(poly.items(), key=lambda fc: [_factor_key(x) for x in fc[0]])
                  if f and c)
    const = poly.get((), 0)
    if not terms:
        return const
    return terms[0] if len(terms) == 1 and not const else SumDim(terms, const)


def dim_mul(a: Dim, b: Dim) -> Dim:
    """a * b, symbolic where it can be."""
    if isinstance(a, AnyDim) or isinstance(b, AnyDim):
        return 0 if a == 0 or b == 0 else ANY
    if isinstance(a, SumDim) or isinstance(b, SumDim):
        out: Poly = {}
        for fa, ca in _poly(a).items():
            for fb, cb in _poly(b).items():
                powers = dict(fa)
                for name, p in fb:
                    powers[name] = powers.get(name, 0) + p
                key = _sorted_factors(powers)
                out[key] = out.get(key, 0) + ca * cb
        return _from_poly(out)
    ca, pa = _split_dim(a)
    cb, pb = _split_dim(b)
    for name, p in pb.items():
        pa[name] = pa.get(name, 0) + p
    return _make(ca * cb, pa)


def dim_div(a: Dim, b: Dim) -> Dim | None:
    """a / b when it is exact (an int or a monomial), ANY when unknown, None when it cannot be."""
    if isinstance(a, AnyDim) or isinstance(b, AnyDim):
        return ANY
    if isinstance(b, SumDim):
        return 1 if a == b else ANY
    if isinstance(a, SumDim):  # each term divided exactly, or unknown
        pieces: list[Dim] = [*a.terms, a.const]
        parts = [dim_div(t, b) for t in pieces]
        if any(p is None or isinstance(p, AnyDim) for p in parts):
            return ANY
        out: Dim = 0
        for p in parts:
            assert p is not None
            out = dim_add(out, p)
        return out
    ca, pa = _split_dim(a)
    cb, pb = _split_dim(b)
    if cb == 0:
        return None
    for name, p in pb.items():
        if pa.get(name, 0) < p:
            return ANY  # n / m: not a monomial
        pa[name] -= p
    if ca % cb:
        return None if not pa and not pb else ANY
    return _make(ca // cb, pa)


def dim_floordiv(a: Dim, k: int) -> Dim:
    """floor(a / k) for a dim `a` >= 0 and an int k >= 1: exact where k divides every term
    (floor((2*n + 4) / 2) is `n + 2`), else the whole part and a `Quot` of the rest (floor((2*n + 3) / 2) is
    `n + 1`, `floordiv(n + 1, 2)` stays itself)."""
    if k < 1:
        raise ValueError(f"a dim divides by an int >= 1, got {k}")
    if isinstance(a, int):
        return a // k
    if isinstance(a, AnyDim) or k == 1:
        return a
    whole: Poly = {}
    rest: Poly = {}
    for f, c in _poly(a).items():
        whole[f], rest[f] = divmod(c, k)
    part, left = _from_poly(whole), _from_poly(rest)
    if isinstance(left, int):
        return dim_add(part, left // k)
    assert isinstance(left, SymDim | SumDim)
    return dim_add(part, SymDim(1, ((Quot(left, k), 1),)))


def dim_add(a: Dim, b: Dim) -> Dim:
    """a + b: ints add, like monomials combine (n + 2*n = 3*n), others make a sum (`n + 1`, `p + s`)."""
    if isinstance(a, int) and isinstance(b, int):
        return a + b
    if isinstance(a, AnyDim) or isinstance(b, AnyDim):
        return ANY
    out = _poly(a)
    for f, c in _poly(b).items():
        out[f] = out.get(f, 0) + c
    return _from_poly(out)


def _exact(d: Dim | None, a: Dim, op: str, b: Dim) -> Dim:
    if d is None or isinstance(d, AnyDim):
        raise ValueError(f"{a} {op} {b} is not a dim kiln can write (a product of sizes)")
    return d


def dim_prod(dims: Iterable[Dim]) -> Dim:
    """The product of `dims` (1 for none)."""
    out: Dim = 1
    for d in dims:
        out = dim_mul(out, d)
    return out


def dim_names(d: Dim) -> tuple[str, ...]:
    """The size variables in `d` (none for an int or ANY), sorted."""
    terms = d.terms if isinstance(d, SumDim) else (d,) if isinstance(d, SymDim) else ()
    return tuple(sorted({name for t in terms for f, _ in t.factors
                         for name in ((f,) if isinstance(f, str) else dim_names(f.num))}))


def dim_value(d: Dim, env: Mapping[str, int]) -> int:
    """The value of `d` once its size variables have the values of `env` (KeyError for one it lacks)."""
    if isinstance(d, int):
        return d
    if isinstance(d, SumDim):
        return d.const + sum(dim_value(t, env) for t in d.terms)
    if not isinstance(d, SymDim):
        raise ValueError(f"dim {d} has no value")
    out = d.coeff
    for name, power in d.factors:
        out *= (env[name] if isinstance(name, str) else dim_value(name.num, env) // name.den) ** power
    return out


def dim_subst(d: Dim, env: Mapping[str, int]) -> Dim:
    """`d` with the size variables of `env` at their values (the others stay symbolic)."""
    if isinstance(d, SumDim):
        out_sum: Dim = d.const
        for t in d.terms:
            out_sum = dim_add(out_sum, dim_subst(t, env))
        return out_sum
    if not isinstance(d, SymDim):
        return d
    out: Dim = d.coeff
    for name, power in d.factors:
        value = (env.get(name, SizeVar(name)) if isinstance(name, str)
                 else dim_floordiv(dim_subst(name.num, env), name.den))
        for _ in range(power):
            out = dim_mul(out, value)
    return out


def parse_dim(text: str) -> Dim:
    """Reads a dim as `str(dim)` writes it: `3`, `n`, `2*n*m`, `p + s - 1`, `floordiv(n + 1, 2)`, `?`."""
    text = text.strip()
    if text == "?":
        return ANY
    tokens: list[str] = re.findall(r"\d+|[A-Za-z_][A-Za-z0-9_]*|\S", text)
    if "".join(tokens) != re.sub(r"\s+", "", text):
        raise ValueError(f"not a dim: {text!r}")
    pos = 0

    def take(expect: str | None = None) -> str:
        nonlocal pos
        if pos >= len(tokens) or (expect is not None and tokens[pos] != expect):
            raise ValueError(f"not a dim: {text!r}")
        pos += 1
        return tokens[pos - 1]

    def atom() -> Dim:
        tok = take()
        if tok == "floordiv":
            take("(")
            num = total()
            take(",")
            den = take()
            take(")")
            if not den.isdigit() or int(den) < 1:
                raise ValueError(f"not a dim: {text!r}")
            return dim_floordiv(num, int(den))
        if tok == "(":
            out = total()
            take(")")
            return out
        if tok.isdigit():
            return int(tok)
        if _NAME.fullmatch(tok):
            return SizeVar(tok)
        raise ValueError(f"not a dim: {text!r}")

    def term() -> Dim:
        out = atom()
        while pos < len(tokens) and tokens[pos] == "*":
            take()
            out = dim_mul(out, atom())
        return out

    def total() -> Dim:
        sign = -1 if pos < len(tokens) and tokens[pos] == "-" and take() else 1
        out = dim_mul(term(), sign)
        while pos < len(tokens) and tokens[pos] in "+-":
            sign = 1 if take() == "+" else -1
            out = dim_add(out, dim_mul(term(), sign))
        return out

    try:
        out = total()
    except ValueError:
        raise ValueError(f"not a dim: {text!r}") from None
    if pos != len(tokens):
        raise ValueError(f"not a dim: {text!r}")
    return out


def as_dim(value: object) -> Dim:
    """Converts a user's dim (int, SymDim, ANY, a name, None for unknown) to a Dim."""
    if isinstance(value, bool):
        raise TypeError(f"a dim is an int >= 0, a SizeVar or ANY, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"a dim is an int >= 0, a SizeVar or ANY, got {value}")
        return value
    if isinstance(value, (SymDim, SumDim, AnyDim)):
        return value
    if value is None:
        return ANY
    if isinstance(value, str):
        return parse_dim(value)
    import numpy as np

    if isinstance(value, np.integer):
        return as_dim(int(value))
    raise TypeError(f"a dim is an int >= 0, a SizeVar or ANY, got {type(value).__name__} {value!r}")


# ---------------------------------------------------------------------------
# Types
# ---------------------------------------------------------------------------


class Type:
    """Base of every type."""

    __slots__ = ()


def _dims(shape: Iterable[object]) -> tuple[Dim, ...]:
    return tuple(as_dim(d) for d in shape)


def _dtype(value: object) -> DataType:
    return DataType.of(value)


def _types(values: Iterable[Type]) -> tuple[Type, ...]:
    return tuple(values)


def _type_vars(values: Iterable[TypeVar]) -> tuple[TypeVar, ...]:
    return tuple(values)


@attrs.frozen(repr=False)
class TensorType(Type):
    """A tensor: its shape (dims) and element type."""

    shape: tuple[Dim, ...] = attrs.field(converter=_dims)
    dtype: DataType = attrs.field(converter=_dtype, default=DataType("float32"))

    @property
    def ndim(self) -> int:
        """The rank."""
        return len(self.shape)

    @property
    def is_static(self) -> bool:
        """Whether every dim is an int."""
        return all(isinstance(d, int) for d in self.shape)

    @property
    def concrete_shape(self) -> tuple[int, ...]:
        """The shape as ints; raises if a dim is symbolic."""
        dims = tuple(d for d in self.shape if isinstance(d, int))
        if len(dims) != len(self.shape):
            raise ValueError(f"{self} has symbolic dims")
        return dims

    def __str__(self) -> str:
        dims = ", ".join(str(d) for d in self.shape)
        if len(self.shape) == 1:
            dims += ","
        return f"Tensor[({dims}), {self.dtype}]"

    __repr__ = __str__


@attrs.frozen(repr=False)
class TupleType(Type):
    """A tuple of values of the given types."""

    fields: tuple[Type, ...] = attrs.field(converter=_types)

    def __str__(self) -> str:
        inner = ", ".join(str(f) for f in self.fields)
        return f"({inner},)" if len(self.fields) == 1 else f"({inner})"

    __repr__ = __str__


@attrs.frozen(repr=False)
class TypeVar(Type):
    """A type parameter of a polymorphic function type."""

    name: str

    def __str__(self) -> str:
        return self.name

    __repr__ = __str__


@attrs.frozen(repr=False)
class FuncType(Type):
    """The type of a function: argument types and result type."""

    arg_types: tuple[Type, ...] = attrs.field(converter=_types)
    ret_type: Type
    type_params: tuple[TypeVar, ...] = attrs.field(converter=_type_vars, default=())

    def __str__(self) -> str:
        return f"fn ({', '.join(str(a) for a in self.arg_types)}) -> {self.ret_type}"

    __repr__ = __str__


_INCOMPLETE_IDS = itertools.count()


@attrs.define(eq=False, repr=False)
class IncompleteType(Type):
    """A type still to be inferred; each one is distinct."""

    id: int = attrs.field(factory=lambda: next(_INCOMPLETE_IDS))

    def __str__(self) -> str:
        return f"?{self.id}"

    __repr__ = __str__


def is_complete(t: Type) -> bool:
    """Whether `t` contains no IncompleteType."""
    stack: list[Type] = [t]
    while stack:
        cur = stack.pop()
        if isinstance(cur, IncompleteType):
            return False
        if isinstance(cur, TupleType):
            stack.extend(cur.fields)
        elif isinstance(cur, FuncType):
            stack.extend(cur.arg_types)
            stack.append(cur.ret_type)
    return True


def tensor_type(shape: Sequence[_Any], dtype: _Any = "float32") -> TensorType:
    """Builds a TensorType from a shape of ints, SizeVars, names or None (unknown)."""
    return TensorType(tuple(shape), DataType.of(dtype))
