"""Helpers shared by the op tests: run an op's relation and reference with attrs built from keywords."""

from __future__ import annotations

from typing import Any

import numpy as np

from kiln.ir.types import TensorType, TupleType, Type
from kiln.registry import Op, attr

RNG = np.random.default_rng(0)


def make_attrs(op: str, **kw: Any) -> Any:
    """The attrs of a call to `op` (None for an op without attributes)."""
    attrs_type: Any = Op.get(op).attrs_type
    return None if attrs_type is None else attrs_type.make(op, **kw)


def rel(op: str, types: list[Type], **kw: Any) -> Type | None:
    """Runs op's type relation on `types` with attrs made from `kw`."""
    return Op.get(op).get_attr(attr.FTypeRelation)(types, make_attrs(op, **kw))


def ref(op: str, *arrays: np.ndarray, **kw: Any) -> Any:
    """Runs op's numpy reference."""
    return Op.get(op).get_attr(attr.FReference)(make_attrs(op, **kw), *arrays)


def rand(*shape: int, dtype: str = "float32") -> np.ndarray:
    """Standard-normal values of `shape` and `dtype`."""
    return RNG.standard_normal(shape).astype(dtype)


def type_of(value: Any) -> Type:
    """The type of a reference's output: a tensor, or a tuple of them."""
    if isinstance(value, tuple):
        return TupleType(tuple(type_of(v) for v in value))
    return TensorType(value.shape, value.dtype)
