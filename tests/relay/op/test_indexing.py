"""The indexing ops (kiln/relay/op/indexing.py: split, strided_slice, take) compiled through
the real lowering path and compared with their numpy references."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from op_helpers import build_op, check_build, ref

from kiln.registry import Op, attr
from kiln.relay.op import indexing as I
from kiln.relay.op import shape as T

Array = np.ndarray[Any, Any]
DTYPES = ["float32", "int32"]


def data(shape: tuple[int, ...], dtype: str) -> Array:
    """Distinct values of `shape` and `dtype` (so a misplaced element always shows)."""
    values = np.arange(math.prod(shape)).reshape(shape) * (1.5 if dtype == "float32" else 3) - 7
    return np.asarray(values, dtype=dtype)


@pytest.mark.parametrize("op", ["split", "strided_slice", "take"])
def test_indexing_ops_have_a_compute_and_keep_their_transform_names(op: str) -> None:
    assert Op.get(op).get_attr(attr.FCompute) is not None
    assert getattr(T, op) is getattr(I, op)


def test_transform_reexports_the_indexing_attrs() -> None:
    assert (T.SplitAttrs, T.StridedSliceAttrs, T.TakeAttrs) == (I.SplitAttrs, I.StridedSliceAttrs, I.TakeAttrs)


# --- split ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("shape", "cut", "axis"),
    [
        ((6, 17), 3, 0),
        ((6, 17), (2, 9), -1),
        ((6, 17), (2, 9, 17), 1),
        ((4, 5, 21), 7, -1),
        ((4, 5, 21), (1, 3), -2),
        ((19,), 1, 0),
        ((40, 1000), 2, 1),
    ],
)
def test_split_compiles(shape: tuple[int, ...], cut: Any, axis: int, dtype: str) -> None:
    check_build("split", data(shape, dtype), indices_or_sections=cut, axis=axis)


# --- strided_slice ----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("shape", "begin", "end", "strides", "axes"),
    [
        ((6, 17), (5, 1), (0, 100), (-2, 3), None),
        ((6, 17), (1,), (4,), None, None),
        ((6, 17), (-3,), (2**31 - 1,), None, (-1,)),
        ((6, 17), (-1, -1), (-100, -18), (-1, -4), None),
        ((6, 17), (2,), (2**31 - 1,), (5,), (1,)),
        ((3, 5, 7), (0, 4, 1), (3, 0, 6), (1, -1, 2), (2, 1, 0)),
        ((3, 5, 7), (-10,), (10,), (2,), (-2,)),
        ((33, 40), (1, 3), (32, 39), (3, 1), None),
    ],
)
def test_strided_slice_compiles(shape: tuple[int, ...], begin: Any, end: Any, strides: Any, axes: Any,
                                dtype: str) -> None:
    check_build("strided_slice", data(shape, dtype), begin=begin, end=end, strides=strides, axes=axes)


# --- take ----------------------------------------------------------------------------------


def indices_for(mode: str, size: int, shape: tuple[int, ...], dtype: str) -> Array:
    """Indices for an axis of `size`: far out of range both ways for clip and wrap, numpy's range for fast."""
    rng = np.random.default_rng(size)
    lo, hi = (-size, size) if mode == "fast" else (-3 * size - 2, 3 * size + 2)
    return rng.integers(lo, hi, size=shape).astype(dtype)


@pytest.mark.parametrize("mode", ["clip", "wrap", "fast"])
@pytest.mark.parametrize(
    ("shape", "axis", "ind_shape", "dtype", "ind_dtype"),
    [
        ((6, 17), None, (4, 5), "float32", "int32"),
        ((6, 17), 0, (3,), "int32", "int64"),
        ((6, 17), -1, (2, 3), "float32", "int64"),
        ((3, 5, 7), 1, (), "int32", "int32"),
        ((3, 5, 7), -2, (19,), "float32", "int32"),
        ((3, 5, 7), None, (), "float32", "int64"),
        ((50, 700), 1, (400,), "float32", "int32"),
        ((3, 300), 1, (5,), "int32", "int8"),
    ],
)
def test_take_compiles(shape: tuple[int, ...], axis: int | None, ind_shape: tuple[int, ...], dtype: str,
                       ind_dtype: str, mode: str) -> None:
    size = math.prod(shape) if axis is None else shape[axis]
    check_build("take", data(shape, dtype), indices_for(mode, size, ind_shape, ind_dtype), axis=axis, mode=mode)


@pytest.mark.parametrize("index", [-(2**40), -1000, 1000, 2**40])
def test_take_fast_with_a_broken_promise_stays_inside_the_data(index: int) -> None:
    x, indices = data((4, 9), "float32"), np.array([index, 0, 8], dtype="int64")
    (got,) = build_op("take", x, indices, axis=1, mode="fast")
    assert set(got[:, 0]) <= set(x[:, 0]) | set(x[:, 8])
    np.testing.assert_array_equal(got[:, 1:], x[:, [0, 8]])


def test_take_of_int64_indices_past_the_int32_range_clips_and_wraps_in_int64() -> None:
    x, indices = data((4, 9), "int32"), np.array([-(2**40), 2**40, 2**33 + 3, -(2**35) - 1, 5], dtype="int64")
    (got,) = build_op("take", x, indices, axis=None, mode="clip")
    np.testing.assert_array_equal(got, ref("take", x, indices, axis=None, mode="clip"))
    (got,) = build_op("take", x, indices, axis=None, mode="wrap")
    # numpy's wrap mode steps huge indices into range one size at a time (minutes); % is the same map
    np.testing.assert_array_equal(got, x.reshape(-1)[indices % x.size])


# --- edges and fused groups -------------------------------------------------------------------


def test_empty_results_compile() -> None:
    check_build("strided_slice", data((4, 5), "float32"), begin=(3,), end=(1,))
    check_build("take", data((4, 5), "float32"), np.zeros((0,), "int32"), axis=0)
    check_build("shape_of", data((), "float32"))


def test_indexing_and_transform_ops_fuse_into_one_kernel() -> None:
    from kiln import relay
    from kiln.relay.backend.te_compiler import compile_primitive

    x, i, b = relay.var("x", shape=(6, 10)), relay.var("i", shape=(7,), dtype="int32"), relay.var("b", shape=(1, 10))
    y = relay.transpose(relay.reshape(x, (3, 20)))
    z = relay.concatenate([y, relay.take(y, i, axis=1, mode="wrap")], axis=1)
    first, second = relay.TupleGetItem(relay.split(z, (4,), axis=-1), 0), relay.TupleGetItem(relay.split(z, (4,)), 1)
    out = relay.Tuple([relay.strided_slice(relay.add(z, b), (1,), (20,), (2,)), first, second])
    func = relay.infer_type(relay.Function([x, i, b], out))
    xa, ia, ba = data((6, 10), "float32"), np.array([0, 5, -1, 2, 9, -7, 3], "int32"), data((1, 10), "float32")
    got = compile_primitive(func, "llvm", name="fused")(xa, ia, ba)
    ya = xa.reshape(3, 20).T
    za = np.concatenate([ya, np.take(ya, ia, axis=1, mode="wrap")], axis=1)
    for g, w in zip(got, [(za + ba)[1:20:2], za[:, :4], za[4:]], strict=True):
        np.testing.assert_array_equal(g, w)
