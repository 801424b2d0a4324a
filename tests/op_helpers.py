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


def build_op(op: str, *arrays: np.ndarray, target: str = "llvm", **kw: Any) -> list[np.ndarray]:
    """Compiles one call of `op` on inputs shaped like `arrays` (through the op's selected
    implementation and schedule, as relay.build does) and runs it on them."""
    from kiln import relay
    from kiln.relay.backend.te_compiler import compile_primitive

    params = [relay.var(f"x{i}", shape=a.shape, dtype=str(a.dtype)) for i, a in enumerate(arrays)]
    func = relay.infer_type(relay.Function(params, relay.expr.call(op, params, make_attrs(op, **kw))))
    return compile_primitive(func, target, name=op.replace(".", "_"))(*arrays)


def check_build(op: str, *arrays: np.ndarray, rtol: float = 1e-5, atol: float = 1e-6, **kw: Any) -> None:
    """`build_op` agrees with the op's numpy reference (every output, dtype included)."""
    got = build_op(op, *arrays, **kw)
    want = ref(op, *arrays, **kw)
    wants = list(want) if isinstance(want, tuple) else [want]
    assert len(got) == len(wants), f"{op}: {len(got)} outputs, reference has {len(wants)}"
    for g, w in zip(got, wants, strict=True):
        w = np.asarray(w)
        assert g.dtype == w.dtype, f"{op}: dtype {g.dtype}, reference {w.dtype}"
        assert g.shape == w.shape, f"{op}: shape {g.shape}, reference {w.shape}"
        if g.dtype.kind in "fc":
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=op)
        else:
            np.testing.assert_array_equal(g, w, err_msg=op)
