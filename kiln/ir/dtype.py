"""Data types: the element types kiln tensors may have, and their numpy counterparts."""

from __future__ import annotations

from typing import Any

import attrs
import numpy as np

from kiln.errors import KilnError

# name -> (kind, bits); kind is "float", "int", "uint" or "bool"
_TYPES: dict[str, tuple[str, int]] = {
    "float16": ("float", 16),
    "bfloat16": ("float", 16),
    "float32": ("float", 32),
    "float64": ("float", 64),
    "int8": ("int", 8),
    "int16": ("int", 16),
    "int32": ("int", 32),
    "int64": ("int", 64),
    "uint8": ("uint", 8),
    "uint16": ("uint", 16),
    "uint32": ("uint", 32),
    "uint64": ("uint", 64),
    "bool": ("bool", 1),
}


class DTypeError(KilnError, TypeError):
    """An unknown data type, or one numpy cannot hold."""


@attrs.frozen(repr=False)
class DataType:
    """An element type such as float32; `DataType.of` accepts names, numpy dtypes and types."""

    name: str = attrs.field()

    @name.validator
    def _known(self, _: object, value: str) -> None:
        if value not in _TYPES:
            raise DTypeError(f"unknown dtype {value!r}; kiln knows {', '.join(_TYPES)}")

    @staticmethod
    def of(value: Any) -> DataType:
        """Returns the DataType for a name ("float32"), a numpy dtype or scalar type, or a DataType."""
        if isinstance(value, DataType):
            return value
        if isinstance(value, str) and value in _TYPES:
            return _CACHE[value]
        try:
            name = np.dtype(value).name
        except TypeError:
            raise DTypeError(f"unknown dtype {value!r}; kiln knows {', '.join(_TYPES)}") from None
        if name not in _TYPES:
            raise DTypeError(f"numpy dtype {name} has no kiln dtype; kiln knows {', '.join(_TYPES)}")
        return _CACHE[name]

    @property
    def kind(self) -> str:
        """"float", "int", "uint" or "bool"."""
        return _TYPES[self.name][0]

    @property
    def bits(self) -> int:
        """Width in bits (1 for bool)."""
        return _TYPES[self.name][1]

    @property
    def bytes(self) -> int:
        """Bytes one element takes in memory (bool: 1)."""
        return max(self.bits, 8) // 8

    @property
    def is_float(self) -> bool:
        """Whether this is a floating-point type."""
        return self.kind == "float"

    @property
    def is_int(self) -> bool:
        """Whether this is a signed or unsigned integer type."""
        return self.kind in ("int", "uint")

    @property
    def is_bool(self) -> bool:
        """Whether this is bool."""
        return self.kind == "bool"

    def numpy(self) -> np.dtype[Any]:
        """The numpy dtype; bfloat16's is ml_dtypes' (numpy has none of its own)."""
        return np.dtype(_bfloat16() if self.name == "bfloat16" else self.name)

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"DataType({self.name!r})"


# The storage-only floats: computed in float32, rounded to their precision when stored or converted.
NARROW_FLOATS = ("float16", "bfloat16")


def _bfloat16() -> Any:
    """ml_dtypes' bfloat16 scalar type (a kiln dependency; jax's and onnx's bfloat16 too)."""
    import ml_dtypes

    return ml_dtypes.bfloat16


_CACHE = {name: DataType(name) for name in _TYPES}
DTYPES = tuple(_CACHE.values())
