"""The creation ops (kiln/relay/op/creation.py): relations, numpy references, errors, constructors,
and each op compiled through the real lowering path."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from op_helpers import assert_registered_complete, assert_relation_waits, check, check_build, rand, rel_error, relation

from kiln.ir.attrs import Attrs, AttrsError
from kiln.ir.types import SizeVar, TensorType, TupleType
from kiln.registry import Op, OpPattern, attr
from kiln.relay.expr import Call, Constant, var
from kiln.relay.op import creation as C

n = SizeVar("n")
Array = np.ndarray[Any, Any]


def tup(*shapes: Any, dtype: str = "float32") -> TupleType:
    return TupleType([TensorType(s, dtype) for s in shapes])


# --- registration ----------------------------------------------------------------------

REGISTRY = [
    # op, pattern, arguments, attrs class, support level
    ("full", OpPattern.ELEMWISE, ["fill_value"], C.FullAttrs, 3),
    ("zeros", OpPattern.ELEMWISE, [], C.InitAttrs, 3),
    ("ones", OpPattern.ELEMWISE, [], C.InitAttrs, 3),
    ("zeros_like", OpPattern.ELEMWISE, ["data"], None, 3),
    ("ones_like", OpPattern.ELEMWISE, ["data"], None, 3),
    ("shape_of", OpPattern.OPAQUE, ["data"], C.ShapeOfAttrs, 10),
    ("arange", OpPattern.OPAQUE, [], C.ArangeAttrs, 3),
]


@pytest.mark.parametrize(("op", "pattern", "args", "attrs_type", "level"), REGISTRY)
def test_creation_ops_are_registered_complete(
    op: str, pattern: OpPattern, args: list[str], attrs_type: type | None, level: int
) -> None:
    assert_registered_complete(op, pattern, args, attrs_type, level)


@pytest.mark.parametrize("op", [r[0] for r in REGISTRY if r[2]])
def test_relations_wait_for_incomplete_inputs(op: str) -> None:
    assert_relation_waits(op)


# --- full, zeros, ones, zeros_like, ones_like, shape_of, arange -------------------------------


def test_full_type_and_reference() -> None:
    attrs = C.FullAttrs.make("full", shape=(2, 3))
    value = np.array(1.5, dtype=np.float16)
    assert check("full", attrs, value).tolist() == [[1.5] * 3] * 2
    cast = C.FullAttrs.make("full", shape=(4,), dtype="int32")
    out = check("full", cast, np.array(7.0, dtype=np.float32))
    assert out.dtype == np.int32 and out.tolist() == [7] * 4


def test_full_errors() -> None:
    with rel_error(r"expected a scalar \(rank-0\) fill_value, found Tensor\[\(1,\), float32\]"):
        relation("full", [TensorType((1,))], C.FullAttrs.make("full", shape=(2,)))
    with pytest.raises(AttrsError, match=r"op full: attribute dtype: .*complex.*; kiln knows float16"):
        C.FullAttrs.make("full", shape=(2,), dtype="complex")


@pytest.mark.parametrize("op", ["zeros", "ones"])
@pytest.mark.parametrize(("shape", "dtype"), [((2, 3), "float32"), ((), "int8"), ((0, 4), "bool"), ((5,), "float64")])
def test_zeros_and_ones(op: str, shape: tuple[int, ...], dtype: str) -> None:
    attrs = C.InitAttrs.make(op, shape=shape, dtype=dtype)
    out = check(op, attrs)
    np.testing.assert_array_equal(out, (np.zeros if op == "zeros" else np.ones)(shape, dtype))
    assert relation(op, [], attrs) == TensorType(shape, dtype)


def test_zeros_attrs_errors() -> None:
    with pytest.raises(AttrsError, match=r"op zeros: attribute dtype: unknown dtype 'float8'"):
        C.InitAttrs.make("zeros", shape=(2,), dtype="float8")
    with pytest.raises(AttrsError, match=r"op ones: attribute shape must be a list of dims .*got \(-1,\)"):
        C.InitAttrs.make("ones", shape=-1)


@pytest.mark.parametrize("op", ["zeros_like", "ones_like"])
def test_zeros_like_and_ones_like(op: str) -> None:
    assert relation(op, [TensorType((n, 3), "int16")]) == TensorType((n, 3), "int16")
    out = check(op, None, rand(2, 3, dtype="float64"))
    assert out.tolist() == [[0.0 if op == "zeros_like" else 1.0] * 3] * 2
    with rel_error(r"expected a tensor, found \(Tensor"):
        relation(op, [tup((2,))])


def test_shape_of() -> None:
    attrs = C.ShapeOfAttrs.make("shape_of")
    assert relation("shape_of", [TensorType((n, 3, 4))], attrs) == TensorType((3,), "int32")
    assert relation("shape_of", [TensorType(())], attrs) == TensorType((0,), "int32")
    assert check("shape_of", attrs, rand(2, 0, 5)).tolist() == [2, 0, 5]
    wide = C.ShapeOfAttrs.make("shape_of", dtype="int64")
    assert check("shape_of", wide, rand(3)).dtype == np.int64
    with pytest.raises(AttrsError, match=r"op shape_of: attribute dtype must be a signed integer dtype"):
        C.ShapeOfAttrs.make("shape_of", dtype="float32")


@pytest.mark.parametrize(
    ("start", "stop", "step", "dtype"),
    [(0, 5, 1, "float32"), (0, 0.3, 0.1, "float64"), (5, 0, -1, "int32"), (1, 1, 1, "float32"), (3, 1, 1, "int64"),
     (-2.5, 4, 0.5, "float32"), (0, 10, 3, "int8")],
)
def test_arange_matches_numpy(start: float, stop: float, step: float, dtype: str) -> None:
    attrs = C.ArangeAttrs.make("arange", start=start, stop=stop, step=step, dtype=dtype)
    out = check("arange", attrs)
    np.testing.assert_allclose(out, np.arange(start, stop, step).astype(dtype), rtol=1e-6)


def test_arange_casts_each_value_as_tvm() -> None:
    attrs = C.ArangeAttrs.make("arange", start=0.5, stop=4, step=1.5, dtype="int32")
    assert check("arange", attrs).tolist() == [0, 2, 3]  # int(0.5), int(2.0), int(3.5)


def test_arange_errors() -> None:
    with pytest.raises(AttrsError, match=r"op arange: attribute step must be a non-zero number, got 0"):
        C.ArangeAttrs.make("arange", start=0, stop=3, step=0)
    with pytest.raises(AttrsError, match=r"op arange: attribute stop must be a number, got \[3\]"):
        C.ArangeAttrs.make("arange", start=0, stop=[3])
    with pytest.raises(AttrsError, match=r"op arange: attribute stop: not a dim: 'n m'"):
        C.ArangeAttrs.make("arange", start=0, stop="n m")
    assert C.ArangeAttrs.make("arange", start=0, stop="n").stop == SizeVar("n")


# --- constructors ------------------------------------------------------------------------


def test_like_and_shape_of_constructors_build_calls_with_their_attrs() -> None:
    x = var("x", shape=(n, 12))
    calls: list[tuple[Call, str, Attrs | None]] = [
        (C.zeros_like(x), "zeros_like", None),
        (C.ones_like(x), "ones_like", None),
        (C.shape_of(x), "shape_of", C.ShapeOfAttrs()),
    ]
    for c, op, attrs in calls:
        assert isinstance(c, Call) and c.op is Op.get(op) and c.args == (x,) and c.attrs == attrs, op


def test_creation_constructors() -> None:
    f = C.full(2.0, (2, 3), "float16")
    assert isinstance(f.args[0], Constant) and f.args[0].data.dtype == np.float16 and f.args[0].data.shape == ()
    assert C.zeros((2,)).args == () and C.zeros((2,)).attrs == C.InitAttrs(shape=(2,), dtype="float32")
    assert C.ones((2,), "int32").attrs == C.InitAttrs(shape=(2,), dtype="int32")
    assert C.arange(5).attrs == C.ArangeAttrs(start=0, stop=5, step=1, dtype="float32")
    assert C.arange(1, 5, 2, "int32").attrs == C.ArangeAttrs(start=1, stop=5, step=2, dtype="int32")
    with pytest.raises(AttrsError, match="op arange: attribute step must be a non-zero number"):
        C.arange(0, 4, 0)


# --- through type inference ---------------------------------------------------------------


def test_creation_ops_type_check_inside_a_function() -> None:
    from kiln import relay

    x = relay.var("x", shape=(n, 12), dtype="float16")
    outs = [
        relay.shape_of(relay.tile(x, (2, 1))),
        relay.shape_of(x, "int64"),
        relay.zeros_like(x),
        relay.ones_like(x),
        relay.full(relay.const(1.0), (3, 4), "int8"),
        relay.zeros((2, 3)),
        relay.ones((5,), "int32"),
        relay.arange(1, 7, 2),
    ]
    f = relay.Function([x], relay.Tuple(outs))
    relay.infer_type(f)
    assert [o.checked_type for o in outs] == [
        TensorType((2,), "int32"),
        TensorType((2,), "int64"),
        TensorType((n, 12), "float16"),
        TensorType((n, 12), "float16"),
        TensorType((3, 4), "int8"),
        TensorType((2, 3), "float32"),
        TensorType((5,), "int32"),
        TensorType((3,), "float32"),
    ]


# --- compiled: each op's te compute through the real lowering path ----------------------------

DTYPES = ["float32", "int32"]


def data(shape: tuple[int, ...], dtype: str) -> Array:
    """Distinct values of `shape` and `dtype` (so a misplaced element always shows)."""
    values = np.arange(math.prod(shape)).reshape(shape) * (1.5 if dtype == "float32" else 3) - 7
    return np.asarray(values, dtype=dtype)


@pytest.mark.parametrize("op", [r[0] for r in REGISTRY])
def test_creation_ops_have_a_compute(op: str) -> None:
    assert Op.get(op).get_attr(attr.FCompute) is not None


@pytest.mark.parametrize(
    ("value", "shape", "dtype"),
    [(2.5, (3, 17), None), (2.5, (3, 17), "int32"), (-7, (19,), None), (-7, (2, 3), "float32"), (1.25, (), None)],
)
def test_full_compiles(value: float, shape: tuple[int, ...], dtype: str | None) -> None:
    fill = np.array(value, dtype="float32" if isinstance(value, float) else "int32")
    check_build("full", fill, shape=shape, dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(3, 17), (), (20, 33)])
@pytest.mark.parametrize("op", ["zeros", "ones"])
def test_zeros_and_ones_compile(op: str, shape: tuple[int, ...], dtype: str) -> None:
    check_build(op, shape=shape, dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ["zeros_like", "ones_like"])
def test_zeros_like_and_ones_like_compile(op: str, dtype: str) -> None:
    check_build(op, data((3, 17), dtype))


@pytest.mark.parametrize("dtype", ["int32", "int64"])
@pytest.mark.parametrize("shape", [(3, 17, 2), (5,), (1, 2, 3, 4, 5)])
def test_shape_of_compiles(shape: tuple[int, ...], dtype: str) -> None:
    check_build("shape_of", data(shape, "float32"), dtype=dtype)


@pytest.mark.parametrize(
    ("start", "stop", "step", "dtype"),
    [(0, 17, 1, "float32"), (1.5, 20, 0.7, "float32"), (-3, 20, 2, "int32"), (10, -7, -3, "int32"),
     (0.5, 9, 1.25, "int32"), (5, 5, 1, "float32")],
)
def test_arange_compiles(start: float, stop: float, step: float, dtype: str) -> None:
    check_build("arange", start=start, stop=stop, step=step, dtype=dtype)
