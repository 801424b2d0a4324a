"""Types of the IR: tensors with static, symbolic or unknown dims; tuples; functions.

A dim is an `int`, a `SymDim` (an integer times a product of size variables,
such as `n` or `3*n`; `SizeVar("n")` makes one), or `ANY` (unknown until run
time). Products and exact quotients of dims stay symbolic, so `reshape` of
`(n, 12)` to `(-1, 4)` has the type `(3*n, 4)`.
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
class SymDim:
    """`coeff * v1^p1 * v2^p2 ...`: a dim known up to the size variables in it."""

    coeff: int
    factors: tuple[tuple[str, int], ...]  # sorted (name, power), power >= 1

    def __str__(self) -> str:
        parts = [] if self.coeff == 1 and self.factors else [str(self.coeff)]
        for name, power in self.factors:
            parts.extend([name] * power)
        return "*".join(parts)

    def __repr__(self) -> str:
        return f"SymDim({self})"

    # Arithmetic where the result is a dim again (`2*n`, `n*s`, `2*n // 2`), for values computed from shapes
    # (ONNX's Shape -> Gather -> Mul chains); anything else raises ValueError.
    def __mul__(self, other: object) -> Dim:
        if not isinstance(other, (int, SymDim)) or isinstance(other, bool):
            return NotImplemented
        return dim_mul(self, other)

    __rmul__ = __mul__

    def __floordiv__(self, other: object) -> Dim:
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
Dim = int | SymDim | AnyDim

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def SizeVar(name: str) -> SymDim:
    """A symbolic dim named `name`, e.g. the batch size `n`."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(f"a size variable is named like an identifier, got {name!r}")
    return SymDim(1, ((name, 1),))


def _make(coeff: int, powers: dict[str, int]) -> Dim:
    factors = tuple(sorted((n, p) for n, p in powers.items() if p))
    return coeff if not factors or coeff == 0 else SymDim(coeff, factors)


def _split_dim(d: Dim) -> tuple[int, dict[str, int]]:
    if isinstance(d, int):
        return d, {}
    assert isinstance(d, SymDim)
    return d.coeff, dict(d.factors)


def dim_mul(a: Dim, b: Dim) -> Dim:
    """a * b, symbolic where it can be."""
    if isinstance(a, AnyDim) or isinstance(b, AnyDim):
        return 0 if a == 0 or b == 0 else ANY
    ca, pa = _split_dim(a)
    cb, pb = _split_dim(b)
    for name, p in pb.items():
        pa[name] = pa.get(name, 0) + p
    return _make(ca * cb, pa)


def dim_div(a: Dim, b: Dim) -> Dim | None:
    """a / b when it is exact (an int or a monomial), ANY when unknown, None when it cannot be."""
    if isinstance(a, AnyDim) or isinstance(b, AnyDim):
        return ANY
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


def dim_add(a: Dim, b: Dim) -> Dim:
    """a + b: exact for ints and like monomials (n + 2*n = 3*n), else ANY."""
    if isinstance(a, int) and isinstance(b, int):
        return a + b
    if isinstance(a, SymDim) and isinstance(b, SymDim) and a.factors == b.factors:
        return _make(a.coeff + b.coeff, dict(a.factors))
    if a == 0:
        return b
    if b == 0:
        return a
    return ANY


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
    """The size variables in `d` (none for an int or ANY)."""
    return tuple(name for name, _ in d.factors) if isinstance(d, SymDim) else ()


def dim_value(d: Dim, env: Mapping[str, int]) -> int:
    """The value of `d` once its size variables have the values of `env` (KeyError for one it lacks)."""
    if isinstance(d, int):
        return d
    if not isinstance(d, SymDim):
        raise ValueError(f"dim {d} has no value")
    out = d.coeff
    for name, power in d.factors:
        out *= env[name] ** power
    return out


def dim_subst(d: Dim, env: Mapping[str, int]) -> Dim:
    """`d` with the size variables of `env` at their values (the others stay symbolic)."""
    if not isinstance(d, SymDim):
        return d
    out: Dim = d.coeff
    for name, power in d.factors:
        for _ in range(power):
            out = dim_mul(out, env[name] if name in env else SizeVar(name))
    return out


def parse_dim(text: str) -> Dim:
    """Reads a dim as `str(dim)` writes it: `3`, `n`, `2*n*m`, `?`."""
    text = text.strip()
    if text == "?":
        return ANY
    out: Dim = 1
    for part in text.split("*"):
        part = part.strip()
        if part.isdigit():
            out = dim_mul(out, int(part))
        elif _NAME.fullmatch(part):
            out = dim_mul(out, SizeVar(part))
        else:
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
    if isinstance(value, (SymDim, AnyDim)):
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
