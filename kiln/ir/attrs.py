"""`Attrs`: the base of every op's attribute class, with validators that say what is allowed.

An op's attrs class is a frozen `attrs` class deriving from `Attrs`; its fields
carry converters and validators from this module. `Attrs.make(op_name, **kw)`
builds one and turns any refusal into an `AttrsError` naming the op, the
field, what is allowed and what was given.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar, cast

import attrs

from kiln.errors import KilnError

A = TypeVar("A", bound="Attrs")


class AttrsError(KilnError, ValueError):
    """An op attribute has a value the op does not accept."""


class FieldError(ValueError):
    """What a validator raises: the field, what it allows, what it got. `Attrs.make` adds the op name."""

    def __init__(self, field: str, allowed: str, given: object) -> None:
        super().__init__(f"attribute {field} must be {allowed}, got {given!r}")
        self.field = field


def _fields(cls: type) -> tuple[attrs.Attribute[Any], ...]:
    return tuple(attrs.fields(cast(Any, cls)))


class Attrs:
    """Base of op attribute classes (frozen attrs classes)."""

    __slots__ = ()

    @classmethod
    def make(cls: type[A], op_name: str, **values: Any) -> A:
        """Builds the attrs of a call to `op_name`; bad values raise AttrsError naming the op."""
        names = {f.name for f in _fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            from kiln.errors import did_you_mean

            raise AttrsError(
                f"op {op_name} has no attribute {unknown[0]}{did_you_mean(unknown[0], names)}; "
                f"its attributes: {', '.join(sorted(names)) or '(none)'}"
            )
        converted = dict(values)
        for field in _fields(cls):
            convert = field.converter
            if callable(convert) and field.name in values:
                try:
                    converted[field.name] = convert(values[field.name])
                except (TypeError, ValueError) as err:
                    raise AttrsError(f"op {op_name}: attribute {field.name}: {err}") from None
        try:
            return cls(**converted)
        except FieldError as err:
            raise AttrsError(f"op {op_name}: {err}") from None
        except TypeError as err:  # a required attribute is missing
            raise AttrsError(f"op {op_name}: {err}") from None

    def fields(self) -> dict[str, Any]:
        """The attribute values by name, in declaration order."""
        return {f.name: getattr(self, f.name) for f in _fields(type(self))}

    def with_sizes(self: A, sizes: Mapping[str, int]) -> A:
        """These attrs with the size variables of `sizes` at their values in each symbolic dim (a `dims`
        field's `n`, `2*n`; those of other sizes stay symbolic). An attrs class with symbolic dims outside
        `dims` fields overrides this."""
        from kiln.ir.types import SumDim, SymDim, dim_subst

        bound = {name: tuple(dim_subst(d, sizes) if isinstance(d, SymDim | SumDim) else d for d in value)
                 for name, value in self.fields().items()
                 if isinstance(value, tuple) and any(isinstance(d, SymDim | SumDim) for d in value)}
        return attrs.evolve(cast(Any, self), **bound) if bound else self


# ---------------------------------------------------------------------------
# Validators and converters. Each validator raises FieldError(field, allowed, given).
# ---------------------------------------------------------------------------

Validator = Callable[[Any, "attrs.Attribute[Any]", Any], None]


def one_of(*allowed: object) -> Validator:
    """The value must be one of `allowed`."""

    def check(_: Any, field: attrs.Attribute[Any], value: Any) -> None:
        if value not in allowed:
            raise FieldError(field.name, "one of " + ", ".join(repr(a) for a in allowed), value)

    return check


def int_range(lo: int | None = None, hi: int | None = None) -> Validator:
    """The value must be an int in [lo, hi] (either bound may be open)."""

    def check(_: Any, field: attrs.Attribute[Any], value: Any) -> None:
        ok = isinstance(value, int) and not isinstance(value, bool)
        ok = ok and (lo is None or value >= lo) and (hi is None or value <= hi)
        if not ok:
            raise FieldError(field.name, _range_words(lo, hi, "an int"), value)

    return check


def float_value(_: Any, field: attrs.Attribute[Any], value: Any) -> None:
    """The value must be a real number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise FieldError(field.name, "a number", value)


def bool_value(_: Any, field: attrs.Attribute[Any], value: Any) -> None:
    """The value must be a bool."""
    if not isinstance(value, bool):
        raise FieldError(field.name, "true or false", value)


def int_tuple(length: int | Sequence[int] | None = None, lo: int | None = None) -> Validator:
    """The value must be a tuple of ints (of `length`, or one of the lengths; each >= lo)."""
    lengths = (length,) if isinstance(length, int) else tuple(length) if length is not None else None

    def check(_: Any, field: attrs.Attribute[Any], value: Any) -> None:
        ok = isinstance(value, tuple) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        ok = ok and (lengths is None or len(value) in lengths) and (lo is None or all(v >= lo for v in value))
        if not ok:
            what = "a list of ints"
            if lengths is not None:
                what = f"a list of {' or '.join(str(n) for n in lengths)} ints"
            if lo is not None:
                what += f" >= {lo}"
            raise FieldError(field.name, what, value)

    return check


def dims(lo: int | None = None) -> Validator:
    """The value must be a tuple of dims: ints (each >= lo) or symbolic dims (`n`, `2*n`, `p + s`)."""
    from kiln.ir.types import SumDim, SymDim

    def check(_: Any, field: attrs.Attribute[Any], value: Any) -> None:
        ok = isinstance(value, tuple) and all(
            isinstance(v, SymDim | SumDim) or (isinstance(v, int) and not isinstance(v, bool)
                                               and (lo is None or v >= lo)) for v in value)
        if not ok:
            raise FieldError(field.name, "a list of dims (ints" + (f" >= {lo}" if lo is not None else "")
                             + " or sizes such as \"n\")", value)

    return check


def to_dims(value: Any) -> Any:
    """Converter: as `to_int_tuple`, where a string (a size as the text format writes it: "n", "2*n") or
    a symbolic dim stays a symbolic dim."""
    from kiln.ir.types import parse_dim

    value = to_int_tuple(value)
    if isinstance(value, tuple):
        return tuple(parse_dim(v) if isinstance(v, str) else v for v in value)
    return value


def optional(validator: Validator) -> Validator:
    """None, or a value `validator` accepts."""

    def check(obj: Any, field: attrs.Attribute[Any], value: Any) -> None:
        if value is not None:
            validator(obj, field, value)

    return check


def to_int_tuple(value: Any) -> Any:
    """Converter: an int or a sequence of ints becomes a tuple (other values pass to the validator)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return (value,)
    if isinstance(value, (list, tuple)):
        return tuple(int(v) if _is_intlike(v) else v for v in value)
    return value


def to_dtype(value: Any) -> Any:
    """Converter: a dtype name, numpy dtype or DataType becomes a DataType."""
    from kiln.ir.dtype import DataType

    return DataType.of(value)


def to_opt_int_tuple(value: Any) -> Any:
    """Converter: None stays None; otherwise as `to_int_tuple`."""
    return None if value is None else to_int_tuple(value)


def _is_intlike(v: Any) -> bool:
    import numpy as np

    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def _range_words(lo: int | None, hi: int | None, what: str) -> str:
    if lo is not None and hi is not None:
        return f"{what} in [{lo}, {hi}]"
    if lo is not None:
        return f"{what} >= {lo}"
    if hi is not None:
        return f"{what} <= {hi}"
    return what
