"""The shape ops (kiln/relay/op/shape.py): relations, numpy references, errors, constructors,
and each op compiled through the real lowering path."""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from op_helpers import (
    assert_registered_complete,
    assert_relation_waits,
    check,
    check_build,
    rand,
    reference,
    rel_error,
    relation,
)

from kiln.ir.attrs import Attrs, AttrsError
from kiln.ir.types import ANY, SizeVar, TensorType, TupleType, dim_add, dim_floordiv, dim_mul
from kiln.registry import Op, OpPattern, attr
from kiln.relay.expr import Call, Tuple, var
from kiln.relay.op import shape as T

n, m = SizeVar("n"), SizeVar("m")
rng = np.random.default_rng(0)
Array = np.ndarray[Any, Any]


# --- registration ----------------------------------------------------------------------

REGISTRY = [
    # op, pattern, arguments, attrs class, support level
    ("reshape", OpPattern.INJECTIVE, ["data"], T.ReshapeAttrs, 3),
    ("transpose", OpPattern.INJECTIVE, ["data"], T.TransposeAttrs, 3),
    ("squeeze", OpPattern.INJECTIVE, ["data"], T.SqueezeAttrs, 3),
    ("expand_dims", OpPattern.INJECTIVE, ["data"], T.ExpandDimsAttrs, 1),
    ("concatenate", OpPattern.INJECTIVE, ["data"], T.AxisAttrs, 1),
    ("split", OpPattern.INJECTIVE, ["data"], T.SplitAttrs, 3),
    ("stack", OpPattern.INJECTIVE, ["data"], T.AxisAttrs, 3),
    ("strided_slice", OpPattern.INJECTIVE, ["data"], T.StridedSliceAttrs, 4),
    ("take", OpPattern.INJECTIVE, ["data", "indices"], T.TakeAttrs, 3),
    ("broadcast_to", OpPattern.BROADCAST, ["data"], T.ShapeAttrs, 4),
    ("nn.batch_flatten", OpPattern.INJECTIVE, ["data"], None, 1),
    ("tile", OpPattern.INJECTIVE, ["data"], T.TileAttrs, 3),
]


@pytest.mark.parametrize(("op", "pattern", "args", "attrs_type", "level"), REGISTRY)
def test_transform_ops_are_registered_complete(
    op: str, pattern: OpPattern, args: list[str], attrs_type: type | None, level: int
) -> None:
    assert_registered_complete(op, pattern, args, attrs_type, level)


@pytest.mark.parametrize("op", [r[0] for r in REGISTRY if r[2]])
def test_relations_wait_for_incomplete_inputs(op: str) -> None:
    assert_relation_waits(op)


# --- reshape -------------------------------------------------------------------------------


def reshape_attrs(newshape: Any) -> T.ReshapeAttrs:
    return T.ReshapeAttrs.make("reshape", newshape=newshape)


@pytest.mark.parametrize(
    ("shape", "newshape", "expected"),
    [
        ((n, 12), (-1, 4), (dim_mul(3, n), 4)),
        ((n, 12), (0, 3, 4), (n, 3, 4)),
        ((n, 12), (0, -1), (n, 12)),
        ((n, 12), (4, -1), (4, dim_mul(3, n))),
        ((2, n, 3), (-1,), (dim_mul(6, n),)),
        ((n, m), (-1,), (dim_mul(n, m),)),
        ((n, m, 4), (0, 0, 2, 2), (n, m, 2, 2)),
        ((n, 12), (-1, 5), (dim_floordiv(dim_mul(12, n), 5), 5)),  # exact only if 5 divides 12*n: checked
        ((ANY, 4), (-1, 2), (ANY, 2)),
        ((n, 12), (2, -1), (2, dim_mul(6, n))),
    ],
)
def test_reshape_type_with_symbolic_dims(shape: tuple[Any, ...], newshape: tuple[int, ...], expected: Any) -> None:
    assert relation("reshape", [TensorType(shape)], reshape_attrs(newshape)) == TensorType(expected)


@pytest.mark.parametrize(
    ("shape", "newshape"),
    [((2, 6), (3, 4)), ((2, 6), (-1,)), ((2, 6), (0, 3, 2)), ((2, 3, 4), (0, -1)), ((24,), (2, -1, 3)),
     ((), (1, 1)), ((1,), ()), ((0, 4), (-1, 2)), ((0, 4), (4, 0, -1)), ((5,), 5)],
)
def test_reshape_reference_matches_numpy(shape: tuple[int, ...], newshape: Any) -> None:
    x = rand(*shape)
    out = check("reshape", reshape_attrs(newshape), x)
    assert np.array_equal(out.reshape(-1), x.reshape(-1))


@st.composite
def reshape_cases(draw: st.DrawFn) -> tuple[tuple[int, ...], tuple[int, ...]]:
    shape = tuple(draw(st.lists(st.integers(1, 6), max_size=4)))
    factors = [p for d in shape for p in _primes(d)]
    factors = draw(st.permutations(factors))
    rank = draw(st.integers(0 if not factors else 1, len(factors) + 1))
    cuts = sorted(draw(st.lists(st.integers(0, len(factors)), min_size=rank - 1, max_size=rank - 1))) if rank else []
    bounds = [0, *cuts, len(factors)] if rank else []
    newshape = [math.prod(factors[a:b]) for a, b in itertools.pairwise(bounds)]
    if newshape and draw(st.booleans()):
        newshape[draw(st.integers(0, len(newshape) - 1))] = -1
    for i, d in enumerate(newshape):  # copy where the dim is unchanged
        if i < len(shape) and d == shape[i] and draw(st.booleans()):
            newshape[i] = 0
    return shape, tuple(newshape)


def _primes(d: int) -> list[int]:
    out, p = [], 2
    while d > 1:
        while d % p == 0:
            out.append(p)
            d //= p
        p += 1
    return out


@settings(max_examples=50, deadline=None)
@given(reshape_cases())
def test_reshape_relation_agrees_with_reference_on_random_shapes(case: tuple[tuple[int, ...], tuple[int, ...]]) -> None:
    shape, newshape = case
    check("reshape", reshape_attrs(newshape), rand(*shape))


def test_reshape_errors_show_both_shapes() -> None:
    with rel_error(r"cannot reshape shape \(2, 6\) \(12 elements\) to newshape \(5, 3\) \(15 elements\)"):
        relation("reshape", [TensorType((2, 6))], reshape_attrs((5, 3)))
    with rel_error(r"cannot reshape shape \(2, 6\) \(12 elements\) to newshape \(5, -1\) \(5 elements times"):
        relation("reshape", [TensorType((2, 6))], reshape_attrs((5, -1)))
    with rel_error(r"newshape \(0, 0, 0\) copies dim 2 .* input shape \(2, 6\) has rank 2"):
        relation("reshape", [TensorType((2, 6))], reshape_attrs((0, 0, 0)))
    with rel_error(r"cannot reshape shape \(0, 4\) .* to newshape \(0, -1\)"):
        relation("reshape", [TensorType((0, 4))], reshape_attrs((0, -1)))


def test_reshape_bad_newshape_is_an_attrs_error() -> None:
    with pytest.raises(AttrsError, match=r"op reshape: attribute newshape must be a shape with at most one -1"):
        reshape_attrs((-1, -1))
    with pytest.raises(AttrsError, match=r"attribute newshape must be a list of dims \(ints >= -1 .*got \(2, -2\)"):
        reshape_attrs((2, -2))


def test_reshape_allowzero_makes_a_zero_a_dim_of_size_zero() -> None:
    attrs = T.ReshapeAttrs.make("reshape", newshape=(3, 4, 0), allowzero=True)
    assert relation("reshape", [TensorType((0, 3, 4))], attrs) == TensorType((3, 4, 0))
    assert check("reshape", attrs, rand(0, 3, 4)).shape == (3, 4, 0)
    # without allowzero the same 0 copies input dim 2
    assert relation("reshape", [TensorType((1, 3, 4))], reshape_attrs((3, 1, 0))) == TensorType((3, 1, 4))
    with rel_error(r"cannot reshape shape \(2, 3\) \(6 elements\) to newshape \(6, 0\)"):
        relation("reshape", [TensorType((2, 3))], T.ReshapeAttrs.make("reshape", newshape=(6, 0), allowzero=True))
    with pytest.raises(AttrsError, match=r"op reshape: attribute newshape must be a shape without both 0 and -1"):
        T.ReshapeAttrs.make("reshape", newshape=(0, -1), allowzero=True)
    assert T.reshape(var("x", shape=(0, 2)), (2, 0), allowzero=True).attrs == T.ReshapeAttrs(
        newshape=(2, 0), allowzero=True
    )


# --- transpose -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("shape", "axes", "expected"),
    [((n, 3, m), None, (m, 3, n)), ((n, 3, m), (0, 2, 1), (n, m, 3)), ((n, 3, m), (-1, 0, -2), (m, n, 3)),
     ((), None, ()), ((), (), ())],
)
def test_transpose_type(shape: Any, axes: Any, expected: Any) -> None:
    assert relation("transpose", [TensorType(shape)], T.TransposeAttrs.make("transpose", axes=axes)) == TensorType(
        expected
    )


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(1, 4), max_size=4).flatmap(lambda s: st.tuples(st.just(s), st.permutations(range(len(s))))),
       st.booleans(), st.booleans())
def test_transpose_relation_agrees_with_numpy(case: Any, negative: bool, reverse: bool) -> None:
    shape, perm = case
    axes = None if reverse else [a - len(shape) if negative else a for a in perm]
    x = rand(*shape)
    out = check("transpose", T.TransposeAttrs.make("transpose", axes=axes), x)
    np.testing.assert_array_equal(out, np.transpose(x, axes))


def test_transpose_errors() -> None:
    with rel_error(r"axes \(1, 0\) has 2 entries for a tensor of rank 3"):
        relation("transpose", [TensorType((2, 3, 4))], T.TransposeAttrs.make("transpose", axes=(1, 0)))
    with rel_error(r"axis -2 is given twice in \(0, -2\) for a tensor of rank 2", arg=None):
        relation("transpose", [TensorType((2, 3))], T.TransposeAttrs.make("transpose", axes=(0, -2)))
    with rel_error(r"axis 2 is out of range for a tensor of rank 2", arg=None):
        relation("transpose", [TensorType((2, 3))], T.TransposeAttrs.make("transpose", axes=(0, 2)))


# --- squeeze, expand_dims -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("shape", "axis", "expected"),
    [((1, n, 1, 3), None, (n, 3)), ((1, n, 1, 3), (0,), (n, 1, 3)), ((1, n, 1, 3), (-2, 0), (n, 3)),
     ((1, n), 1, (1,)), ((1, 1), None, ()), ((), None, ())],
)
def test_squeeze_type(shape: Any, axis: Any, expected: Any) -> None:
    assert relation("squeeze", [TensorType(shape)], T.SqueezeAttrs.make("squeeze", axis=axis)) == TensorType(expected)


@pytest.mark.parametrize(("shape", "axis"), [((1, 3, 1), None), ((1, 3, 1), (0,)), ((1, 3, 1), (-1, 0)), ((1,), 0)])
def test_squeeze_reference_matches_numpy(shape: tuple[int, ...], axis: Any) -> None:
    x = rand(*shape)
    out = check("squeeze", T.SqueezeAttrs.make("squeeze", axis=axis), x)
    np.testing.assert_array_equal(out, np.squeeze(x, axis=axis))


def test_squeezing_a_dim_that_is_not_one_is_an_error() -> None:
    with rel_error(r"cannot squeeze axis 1 of shape \(1, 3\): its size is 3, not 1"):
        relation("squeeze", [TensorType((1, 3))], T.SqueezeAttrs.make("squeeze", axis=(0, 1)))


@pytest.mark.parametrize(("shape", "num"), [((), 1), ((n,), 2), ((2, n, 3), 1), ((2, 3), 0)])
def test_expand_dims_type_over_all_axes(shape: tuple[Any, ...], num: int) -> None:
    ndim = len(shape)
    for axis in range(-ndim - 1, ndim + 1):
        at = axis % (ndim + 1)
        expected = (*shape[:at], *(1,) * num, *shape[at:])
        attrs = T.ExpandDimsAttrs.make("expand_dims", axis=axis, num_newaxis=num)
        assert relation("expand_dims", [TensorType(shape)], attrs) == TensorType(expected)
        if all(isinstance(d, int) for d in shape):
            x = rand(*shape)
            np.testing.assert_array_equal(check("expand_dims", attrs, x).reshape(-1), x.reshape(-1))
            if num == 1:
                assert check("expand_dims", attrs, x).shape == np.expand_dims(x, axis).shape


def test_expand_dims_errors() -> None:
    with rel_error(r"axis 3 is out of range for expand_dims of a tensor of rank 2 \(allowed: -3 to 2\)", arg=None):
        relation("expand_dims", [TensorType((2, 3))], T.ExpandDimsAttrs.make("expand_dims", axis=3))
    with pytest.raises(AttrsError, match=r"op expand_dims: attribute num_newaxis must be an int >= 0, got -1"):
        T.ExpandDimsAttrs.make("expand_dims", axis=0, num_newaxis=-1)


# --- concatenate, stack, split --------------------------------------------------------------


def tup(*shapes: Any, dtype: str = "float32") -> TupleType:
    return TupleType([TensorType(s, dtype) for s in shapes])


@pytest.mark.parametrize(
    ("shapes", "axis", "expected"),
    [
        ([(n, 3), (dim_mul(2, n), 3)], 0, (dim_mul(3, n), 3)),
        ([(n, 3), (4, 3)], 0, (dim_add(n, 4), 3)),
        ([(2, n), (2, 5)], 1, (2, dim_add(n, 5))),
        ([(n, 3), (4, 3)], 1, (4, 6)),  # off the axis, a static dim pins the symbolic one
        ([(2, 3)], -1, (2, 3)),
        ([(2, 3), (2, 1), (2, 0)], -1, (2, 4)),
    ],
)
def test_concatenate_type(shapes: list[Any], axis: int, expected: Any) -> None:
    attrs = T.AxisAttrs.make("concatenate", axis=axis)
    assert relation("concatenate", [tup(*shapes)], attrs) == TensorType(expected)


@pytest.mark.parametrize(("shapes", "axis"), [([(2, 3), (4, 3)], 0), ([(2, 3), (2, 1), (2, 5)], 1), ([(1, 2, 3)], 2)])
def test_concatenate_reference_matches_numpy(shapes: list[tuple[int, ...]], axis: int) -> None:
    xs = tuple(rand(*s) for s in shapes)
    np.testing.assert_array_equal(check("concatenate", T.AxisAttrs.make("concatenate", axis=axis), xs),
                                  np.concatenate(xs, axis=axis))


def test_concatenate_errors() -> None:
    attrs = T.AxisAttrs.make("concatenate", axis=0)
    with rel_error(r"field 1 has shape \(4, 5\) but field 0 has \(2, 3\): dim 1 differs"):
        relation("concatenate", [tup((2, 3), (4, 5))], attrs)
    with rel_error(r"field 1 has rank 1 but field 0 has rank 2"):
        relation("concatenate", [tup((2, 3), (4,))], attrs)
    with rel_error(r"field 1 has dtype int32 but field 0 has dtype float32"):
        relation("concatenate", [TupleType([TensorType((2,)), TensorType((2,), "int32")])], attrs)
    with rel_error(r"concatenate expects a tuple of at least one tensor, found an empty tuple"):
        relation("concatenate", [TupleType([])], attrs)
    with rel_error(r"expected a tuple of tensors, found Tensor"):
        relation("concatenate", [TensorType((2, 3))], attrs)
    with rel_error(r"cannot join rank-0 tensors"):
        relation("concatenate", [tup((), ())], attrs)
    with rel_error(r"axis 2 is out of range for a tensor of rank 2", arg=None):
        relation("concatenate", [tup((2, 3))], T.AxisAttrs.make("concatenate", axis=2))


@pytest.mark.parametrize("axis", [0, 1, 2, -1, -3])
def test_stack_type_and_reference(axis: int) -> None:
    attrs = T.AxisAttrs.make("stack", axis=axis)
    xs = (rand(2, 3), rand(2, 3), rand(2, 3))
    np.testing.assert_array_equal(check("stack", attrs, xs), np.stack(xs, axis=axis))
    at = axis % 3
    assert relation("stack", [tup((n, 3), (n, 3))], attrs) == TensorType((*(n, 3)[:at], 2, *(n, 3)[at:]))
    assert relation("stack", [tup((n, 3), (4, 3))], attrs) == TensorType((*(4, 3)[:at], 2, *(4, 3)[at:]))


def test_stack_errors() -> None:
    with rel_error(r"field 1 has shape \(2, 4\) but field 0 has \(2, 3\): dim 1 differs$"):
        relation("stack", [tup((2, 3), (2, 4))], T.AxisAttrs.make("stack"))
    with rel_error(r"axis 3 is out of range for stack of a tensor of rank 2 \(allowed: -3 to 2\)", arg=None):
        relation("stack", [tup((2, 3), (2, 3))], T.AxisAttrs.make("stack", axis=3))


def split_attrs(cut: Any, axis: int = 0) -> T.SplitAttrs:
    return T.SplitAttrs.make("split", indices_or_sections=cut, axis=axis)


@pytest.mark.parametrize(
    ("shape", "cut", "axis"),
    [((6, 4), 3, 0), ((6, 4), 2, -1), ((6, 4), (1, 4), 0), ((6, 4), [2], 1), ((6, 4), (1, 6), 0), ((5,), (), 0),
     ((2, 9, 1), 1, 1)],
)
def test_split_reference_is_a_tuple_of_the_relation_types(shape: tuple[int, ...], cut: Any, axis: int) -> None:
    x = rand(*shape)
    out = check("split", split_attrs(cut, axis), x)
    expected = np.split(x, cut, axis=axis)
    assert isinstance(out, tuple) and len(out) == len(expected)
    for a, b in zip(out, expected, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    ("shape", "cut", "axis", "pieces"),
    [
        ((n, dim_mul(4, m)), 2, 1, [(n, dim_mul(2, m))] * 2),
        ((n, 4), 2, 0, [(ANY, 4)] * 2),
        ((n, 4), (1, 3), 0, [(1, 4), (2, 4), (dim_add(n, -3), 4)]),
        ((4, n), (1, 3), 0, [(1, n), (2, n), (1, n)]),
    ],
)
def test_split_type_with_symbolic_dims(shape: Any, cut: Any, axis: int, pieces: list[Any]) -> None:
    assert relation("split", [TensorType(shape)], split_attrs(cut, axis)) == TupleType([TensorType(p) for p in pieces])


def test_split_errors() -> None:
    with rel_error(r"axis 1 of shape \(2, 7\) has size 7, which does not split into 3 equal sections"):
        relation("split", [TensorType((2, 7))], split_attrs(3, 1))
    with rel_error(r"split index 8 is past the end of axis 0 of shape \(7,\)"):
        relation("split", [TensorType((7,))], split_attrs((2, 8)))
    for bad in [(3, 1), (0, 2), (2, 2), 0, 1.5]:
        with pytest.raises(AttrsError, match=r"op split: attribute indices_or_sections must be a number of sections"):
            split_attrs(bad)


# --- strided_slice, take -------------------------------------------------------------------


def slice_attrs(begin: Any, end: Any, strides: Any = None, axes: Any = None) -> T.StridedSliceAttrs:
    return T.StridedSliceAttrs.make("strided_slice", begin=begin, end=end, strides=strides, axes=axes)


@pytest.mark.parametrize(
    ("begin", "end", "strides", "axes", "index"),
    [
        ((1,), (3,), None, None, np.s_[1:3]),
        ((0, 1), (4, 100), (2,), None, np.s_[0:4:2, 1:]),
        ((-1, 0), (-5, 3), (-1, 1), None, np.s_[-1:-5:-1, 0:3]),
        ((1,), (2**31 - 1,), None, (2,), np.s_[:, :, 1:]),
        ((5, -100), (6, 100), None, (0, 1), np.s_[5:6, -100:100]),
        ((3,), (0,), (-2,), (-1,), np.s_[..., 3:0:-2]),
    ],
)
def test_strided_slice_matches_numpy_slicing(begin: Any, end: Any, strides: Any, axes: Any, index: Any) -> None:
    x = rand(4, 5, 6)
    np.testing.assert_array_equal(check("strided_slice", slice_attrs(begin, end, strides, axes), x), x[index])


@settings(max_examples=50, deadline=None)
@given(st.data())
def test_strided_slice_relation_agrees_with_numpy_on_random_slices(data: st.DataObject) -> None:
    shape = data.draw(st.lists(st.integers(0, 5), min_size=1, max_size=4))
    ndim = len(shape)
    if data.draw(st.booleans()):
        axes = data.draw(st.lists(st.integers(-ndim, ndim - 1), unique_by=lambda a: a % ndim, max_size=ndim))
        k, sliced = len(axes), [a % ndim for a in axes]
    else:
        k = data.draw(st.integers(0, ndim))
        axes, sliced = None, list(range(k))
    bound = st.integers(-8, 8)
    begin, end = data.draw(st.lists(bound, min_size=k, max_size=k)), data.draw(st.lists(bound, min_size=k, max_size=k))
    strides = data.draw(st.lists(st.integers(-3, 3).filter(bool), max_size=k))
    x = rand(*shape)
    out = check("strided_slice", slice_attrs(begin, end, strides or None, axes), x)
    index: list[Any] = [slice(None)] * ndim
    for i, a in enumerate(sliced):
        index[a] = slice(begin[i], end[i], strides[i] if i < len(strides) else 1)
    np.testing.assert_array_equal(out, x[tuple(index)])


def test_strided_slice_type_with_symbolic_dims() -> None:
    t = TensorType((n, 8, m))
    assert relation("strided_slice", [t], slice_attrs((0, 2), (2**31 - 1, 6))) == TensorType((n, 4, m))
    # bounds on a symbolic axis are not clamped: 3 <= n and 1 <= m are checked at run time instead
    assert relation("strided_slice", [t], slice_attrs((1,), (3,))) == TensorType((2, 8, m))
    assert relation("strided_slice", [t], slice_attrs((0,), (-1,), axes=(2,))) == TensorType((n, 8, dim_add(m, -1)))
    assert relation("strided_slice", [t], slice_attrs((0,), (3,), (2,))) == TensorType((2, 8, m))
    assert relation("strided_slice", [t], slice_attrs((1,), (2**31 - 1,), (2,))) == TensorType((n // 2, 8, m))
    assert relation("strided_slice", [t], slice_attrs((3,), (0,), (-1,))) == TensorType((ANY, 8, m))


def test_strided_slice_errors() -> None:
    with pytest.raises(AttrsError, match=r"op strided_slice: attribute strides must be a list of non-zero ints"):
        slice_attrs((0,), (1,), (0,))
    with pytest.raises(AttrsError, match=r"attribute end must be a list of 2 ints \(as many as begin\), got \(1,\)"):
        slice_attrs((0, 0), (1,))
    with pytest.raises(AttrsError, match=r"attribute axes must be a list of 1 ints"):
        slice_attrs((0,), (1,), axes=(0, 1))
    with rel_error(r"begin has 3 entries for a tensor of rank 2"):
        relation("strided_slice", [TensorType((2, 3))], slice_attrs((0, 0, 0), (1, 1, 1)))
    with rel_error(r"axis -2 is given twice in \(0, -2\) for a tensor of rank 2", arg=None):
        relation("strided_slice", [TensorType((2, 3))], slice_attrs((0, 0), (1, 1), axes=(0, -2)))


def take_attrs(axis: Any = None, mode: str = "clip") -> T.TakeAttrs:
    return T.TakeAttrs.make("take", axis=axis, mode=mode)


@pytest.mark.parametrize("mode", ["clip", "wrap", "fast"])
@pytest.mark.parametrize("axis", [None, 0, 1, -1])
def test_take_matches_numpy(mode: str, axis: Any) -> None:
    x = rand(3, 4, 5)
    size = x.size if axis is None else x.shape[axis]
    low, high = (0, size) if mode == "fast" else (-2 * size, 2 * size)
    indices = rng.integers(low, high, size=(2, 3)).astype(np.int32)
    out = check("take", take_attrs(axis, mode), x, indices)
    np.testing.assert_array_equal(out, np.take(x, indices, axis=axis, mode="raise" if mode == "fast" else mode))


def test_take_clip_sends_negative_indices_to_zero_and_wrap_wraps() -> None:
    x = np.arange(5, dtype=np.float32)
    idx = np.array([-1, 7, 2], dtype=np.int64)
    assert reference("take", take_attrs(0, "clip"), x, idx).tolist() == [0, 4, 2]
    assert reference("take", take_attrs(0, "wrap"), x, idx).tolist() == [4, 2, 2]


@pytest.mark.parametrize(
    ("data", "indices", "axis", "expected"),
    [
        ((n, 4, 5), (m,), 1, (n, m, 5)),
        ((n, 4), (2, 3), None, (2, 3)),
        ((n, 4), (), 0, (4,)),
        ((4, n), (m, 2), -1, (4, m, 2)),
    ],
)
def test_take_type_with_symbolic_dims(data: Any, indices: Any, axis: Any, expected: Any) -> None:
    out = relation("take", [TensorType(data, "float16"), TensorType(indices, "int64")], take_attrs(axis))
    assert out == TensorType(expected, "float16")


def test_take_errors() -> None:
    with rel_error(r"expected integer indices, found dtype float32", arg=1):
        relation("take", [TensorType((4,)), TensorType((2,))], take_attrs(0))
    with rel_error(r"axis 2 is out of range for a tensor of rank 2", arg=None):
        relation("take", [TensorType((4, 3)), TensorType((2,), "int32")], take_attrs(2))
    with pytest.raises(AttrsError, match=r"op take: attribute mode must be one of 'clip', 'wrap', 'fast', got 'nan'"):
        take_attrs(0, "nan")


# --- broadcast_to, batch_flatten, tile -----------------------------------------------------


@pytest.mark.parametrize(("shape", "target"), [((3,), (2, 3)), ((1, 3), (4, 3)), ((), (2, 2)), ((2, 1, 1), (2, 3, 4)),
                                                ((1,), (0,)), ((2, 3), (2, 3))])
def test_broadcast_to_matches_numpy(shape: tuple[int, ...], target: tuple[int, ...]) -> None:
    x = rand(*shape)
    out = check("broadcast_to", T.ShapeAttrs.make("broadcast_to", shape=target), x)
    np.testing.assert_array_equal(out, np.broadcast_to(x, target))
    out[...] = 0  # the reference returns an array of its own, not a read-only view


def test_broadcast_to_type_and_errors() -> None:
    attrs = T.ShapeAttrs.make("broadcast_to", shape=(2, 3, 4))
    assert relation("broadcast_to", [TensorType((n, 1), "int8")], attrs) == TensorType((2, 3, 4), "int8")
    with rel_error(r"shape \(2, 4\) does not broadcast to \(2, 3, 4\): dim 0 is 2 against 3"):
        relation("broadcast_to", [TensorType((2, 4))], attrs)
    with rel_error(r"shape \(1, 2, 3, 4\) does not broadcast to \(2, 3, 4\): rank 4 is above 3"):
        relation("broadcast_to", [TensorType((1, 2, 3, 4))], attrs)
    with pytest.raises(AttrsError, match=r"op broadcast_to: attribute shape must be a list of dims \(ints >= 0"):
        T.ShapeAttrs.make("broadcast_to", shape=(2, -1))


@pytest.mark.parametrize(
    ("shape", "expected"),
    [((n, 3, 4), (n, 12)), ((2, n, m), (2, dim_mul(n, m))), ((n,), (n, 1)), ((ANY, 2), (ANY, 2)), ((4, 0, 3), (4, 0))],
)
def test_batch_flatten_type(shape: Any, expected: Any) -> None:
    assert relation("nn.batch_flatten", [TensorType(shape)]) == TensorType(expected)


@pytest.mark.parametrize("shape", [(2, 3, 4), (5,), (0, 3), (3, 1, 2, 2)])
def test_batch_flatten_reference_matches_numpy(shape: tuple[int, ...]) -> None:
    x = rand(*shape)
    np.testing.assert_array_equal(check("nn.batch_flatten", None, x), x.reshape(shape[0], math.prod(shape[1:])))


def test_batch_flatten_of_a_scalar_is_an_error() -> None:
    with rel_error(r"expected a tensor of rank >= 1 \(its first dim is the batch\), found rank 0"):
        relation("nn.batch_flatten", [TensorType(())])


@pytest.mark.parametrize(("shape", "reps"), [((2, 3), (2, 1)), ((2, 3), (3,)), ((3,), (2, 2)), ((), (2,)), ((2,), ()),
                                             ((2, 3), (0, 2))])
def test_tile_matches_numpy(shape: tuple[int, ...], reps: tuple[int, ...]) -> None:
    x = rand(*shape)
    np.testing.assert_array_equal(check("tile", T.TileAttrs.make("tile", reps=reps), x), np.tile(x, reps))


def test_tile_type_and_errors() -> None:
    assert relation("tile", [TensorType((n, 2))], T.TileAttrs.make("tile", reps=(3, 1))) == TensorType(
        (dim_mul(3, n), 2)
    )
    assert relation("tile", [TensorType((n,))], T.TileAttrs.make("tile", reps=(2, 2))) == TensorType(
        (2, dim_mul(2, n))
    )
    with pytest.raises(AttrsError, match=r"op tile: attribute reps must be a list of ints >= 0, got \(2, -1\)"):
        T.TileAttrs.make("tile", reps=(2, -1))


# --- constructors ------------------------------------------------------------------------


def test_constructors_build_calls_with_their_attrs() -> None:
    x = var("x", shape=(n, 12))
    calls: list[tuple[Call, str, Attrs | None]] = [
        (T.reshape(x, (-1, 4)), "reshape", T.ReshapeAttrs(newshape=(-1, 4))),
        (T.reshape(x, 12), "reshape", T.ReshapeAttrs(newshape=(12,))),
        (T.transpose(x), "transpose", T.TransposeAttrs(axes=None)),
        (T.squeeze(x, 0), "squeeze", T.SqueezeAttrs(axis=(0,))),
        (T.expand_dims(x, -1, 2), "expand_dims", T.ExpandDimsAttrs(axis=-1, num_newaxis=2)),
        (T.split(x, [1, 3], axis=1), "split", T.SplitAttrs(indices_or_sections=(1, 3), axis=1)),
        (T.strided_slice(x, [0], [2]), "strided_slice", T.StridedSliceAttrs(begin=(0,), end=(2,))),
        (T.broadcast_to(x, [2, 3]), "broadcast_to", T.ShapeAttrs(shape=(2, 3))),
        (T.batch_flatten(x), "nn.batch_flatten", None),
        (T.tile(x, 2), "tile", T.TileAttrs(reps=(2,))),
    ]
    for c, op, attrs in calls:
        assert isinstance(c, Call) and c.op is Op.get(op) and c.args == (x,) and c.attrs == attrs, op
    idx = var("i", shape=(3,), dtype="int32")
    assert T.take(x, idx, axis=0).args == (x, idx)


def test_joining_constructors_take_a_list_or_a_tuple_expression() -> None:
    a, b = var("a", shape=(2,)), var("b", shape=(3,))
    c = T.concatenate([a, b], axis=0)
    assert isinstance(c.args[0], Tuple) and c.args[0].fields == (a, b)
    t = Tuple([a, b])
    assert T.stack(t, axis=-1).args == (t,) and T.stack(t, axis=-1).attrs == T.AxisAttrs(axis=-1)


# --- through type inference ---------------------------------------------------------------


def test_transforms_type_check_inside_a_function() -> None:
    from kiln import relay

    x, i = relay.var("x", shape=(n, 12)), relay.var("i", shape=(3,), dtype="int32")
    pieces = relay.split(x, (1, 3), axis=1)
    outs = [
        relay.reshape(x, (-1, 4)),
        relay.concatenate([x, relay.TupleGetItem(pieces, 2)], axis=1),
        relay.take(relay.transpose(x), i, axis=0),
        relay.nn.batch_flatten(relay.expand_dims(x, 1, 2)),
        relay.tile(x, (2, 1)),
    ]
    f = relay.Function([x, i], relay.Tuple(outs))
    relay.infer_type(f)
    assert [o.checked_type for o in outs] == [
        TensorType((dim_mul(3, n), 4)),
        TensorType((n, 21)),
        TensorType((3, n)),
        TensorType((n, 12)),
        TensorType((dim_mul(2, n), 12)),
    ]


def test_a_bad_concatenate_is_reported_with_the_op_and_argument() -> None:
    from kiln import relay

    a, b = relay.var("a", shape=(2, 3)), relay.var("b", shape=(2, 4))
    with pytest.raises(relay.TypeInferenceError, match=r"op concatenate, argument data .*field 1 has shape \(2, 4\)"):
        relay.infer_type(relay.Function([a, b], relay.concatenate([a, b], axis=0)))


# --- compiled: each op's te compute through the real lowering path ----------------------------

DTYPES = ["float32", "int32"]


def data(shape: tuple[int, ...], dtype: str) -> Array:
    """Distinct values of `shape` and `dtype` (so a misplaced element always shows)."""
    values = np.arange(math.prod(shape)).reshape(shape) * (1.5 if dtype == "float32" else 3) - 7
    return np.asarray(values, dtype=dtype)


def check_joined_build(op: str, arrays: list[Array], axis: int) -> None:
    """Compiles concatenate or stack of `arrays` (its one argument, a tuple) and compares with the reference."""
    from kiln import relay
    from kiln.relay.backend.te_compiler import compile_primitive

    params = [relay.var(f"x{i}", shape=a.shape, dtype=str(a.dtype)) for i, a in enumerate(arrays)]
    body = T.concatenate(params, axis) if op == "concatenate" else T.stack(params, axis)
    func = relay.infer_type(relay.Function(params, body))
    (got,) = compile_primitive(func, "llvm", name=op)(*arrays)
    want = reference(op, T.AxisAttrs(axis=axis), tuple(arrays))
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("op", [r[0] for r in REGISTRY])
def test_transform_ops_have_a_compute(op: str) -> None:
    assert Op.get(op).get_attr(attr.FCompute) is not None


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("shape", "newshape"),
    [
        ((3, 5, 7), (7, -1)),
        ((3, 5, 7), (0, 35)),
        ((2, 17), (34,)),
        ((34,), (2, 1, 17)),
        ((4, 6, 5), (8, 15)),
        ((1, 19, 1), (19,)),
        ((130, 131), (131, -1)),
    ],
)
def test_reshape_compiles(shape: tuple[int, ...], newshape: tuple[int, ...], dtype: str) -> None:
    check_build("reshape", data(shape, dtype), newshape=newshape)


def test_reshape_with_allowzero_compiles_empty_tensors() -> None:
    check_build("reshape", data((0, 3, 4), "float32"), newshape=(3, 4, 0), allowzero=True)
    check_build("reshape", data((2, 0), "int32"), newshape=(0, 5), allowzero=True)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("shape", "axes"),
    [((3, 5, 7), (2, 0, 1)), ((3, 5, 7), (-1, -3, -2)), ((3, 5, 7), None), ((17, 19), None),
     ((2, 3, 4, 5), (0, 2, 3, 1)), ((129, 130), (1, 0)), ((6,), None)],
)
def test_transpose_compiles(shape: tuple[int, ...], axes: Any, dtype: str) -> None:
    check_build("transpose", data(shape, dtype), axes=axes)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("shape", "axis"), [((3, 1, 7), (-2,)), ((1, 3, 1, 17, 1), None), ((1, 5), (0,)), ((1, 1), (0, -1))]
)
def test_squeeze_compiles(shape: tuple[int, ...], axis: Any, dtype: str) -> None:
    check_build("squeeze", data(shape, dtype), axis=axis)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("shape", "axis", "num"), [((3, 17), -1, 2), ((3, 17), 0, 1), ((3, 17), 1, 0), ((), 0, 3), ((5, 3), -2, 1)]
)
def test_expand_dims_compiles(shape: tuple[int, ...], axis: int, num: int, dtype: str) -> None:
    check_build("expand_dims", data(shape, dtype), axis=axis, num_newaxis=num)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(3, 5, 7), (2, 1, 17), (4,), (5, 1)])
def test_batch_flatten_compiles(shape: tuple[int, ...], dtype: str) -> None:
    check_build("nn.batch_flatten", data(shape, dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("shapes", "axis"),
    [
        ([(2, 3), (4, 3), (1, 3)], 0),
        ([(2, 3), (2, 17)], -1),
        ([(2, 3), (2, 0), (2, 5)], 1),
        ([(2, 0), (2, 0)], -1),
        ([(3, 4)], 0),
        ([(2, 3, 5), (2, 4, 5), (2, 1, 5), (2, 9, 5)], -2),
        ([(40, 300), (40, 200)], 1),
    ],
)
def test_concatenate_compiles(shapes: list[tuple[int, ...]], axis: int, dtype: str) -> None:
    check_joined_build("concatenate", [np.asarray(data(s, dtype) + k) for k, s in enumerate(shapes)], axis)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("shape", "count", "axis"), [((3, 5), 3, 0), ((3, 5), 2, -1), ((3, 5), 4, 1), ((17,), 1, 0),
                                                      ((), 3, 0)])
def test_stack_compiles(shape: tuple[int, ...], count: int, axis: int, dtype: str) -> None:
    check_joined_build("stack", [np.asarray(data(shape, dtype) + k) for k in range(count)], axis)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("shape", "target"), [((3, 1), (2, 3, 19)), ((1,), (17,)), ((5,), (3, 5)), ((2, 1, 3), (2, 4, 3)), ((), (3, 4))]
)
def test_broadcast_to_compiles(shape: tuple[int, ...], target: tuple[int, ...], dtype: str) -> None:
    check_build("broadcast_to", data(shape, dtype), shape=target)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("shape", "reps"), [((3, 5), (2, 1, 3)), ((17,), (2,)), ((2, 3), (1,)), ((2, 3), (2, 2)), ((1, 3), (4, 1))]
)
def test_tile_compiles(shape: tuple[int, ...], reps: tuple[int, ...], dtype: str) -> None:
    check_build("tile", data(shape, dtype), reps=reps)


# --- concatenate's llvm schedule: the joined axis partitioned, each piece a plain vectorized copy ---------


def build_concatenate_relu(shapes: list[tuple[int, ...]], axis: int) -> tuple[Any, list[Array]]:
    """relay.build of relu(concatenate(x0, x1, ...)) (one fused kernel) and its inputs."""
    from kiln import relay

    params = [relay.var(f"x{i}", shape=s) for i, s in enumerate(shapes)]
    func = relay.Function(params, relay.nn.relu(relay.concatenate(params, axis)))
    return relay.build(func, target="llvm"), [rand(*s) for s in shapes]


@pytest.mark.parametrize(
    ("shapes", "axis"),
    [
        ([(1, 5, 13, 7), (1, 3, 13, 7), (1, 17, 13, 7)], 1),
        ([(1, 5, 13, 7), (2, 5, 13, 7), (3, 5, 13, 7)], 0),
        ([(1, 5, 13, 7), (1, 5, 1, 7), (1, 5, 9, 7)], 2),
        ([(1, 5, 13, 7), (1, 5, 13, 3), (1, 5, 13, 17)], 3),
        ([(1, 5, 13, 7), (1, 5, 13, 3), (1, 5, 13, 17)], -1),
        ([(3, 5), (3, 11), (3, 1)], 1),
        ([(3, 5), (7, 5), (1, 5)], 0),
        ([(40, 300), (40, 200)], 1),
    ],
)
def test_concatenate_then_relu_builds_with_the_partitioned_schedule(shapes: list[tuple[int, ...]], axis: int) -> None:
    lib, xs = build_concatenate_relu(shapes, axis)
    assert len(lib.kernels) == 1  # relu fused into the concatenation: the group the schedule sees
    got = lib.create_executor()(**{f"x{i}": x for i, x in enumerate(xs)})
    np.testing.assert_array_equal(got, np.maximum(np.concatenate(xs, axis=axis), 0))


def test_concatenate_kernel_copies_without_gathers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KILN_CACHE", "0")  # compile the kernel: one loaded from the library cache has no asm
    lib, xs = build_concatenate_relu([(1, 64, 55, 55), (1, 64, 55, 55)], 1)
    (kernel,) = lib.kernels
    asm = kernel.get_source("asm")
    assert asm and "vgather" not in asm
    got = lib.create_executor()(x0=xs[0], x1=xs[1])
    np.testing.assert_array_equal(got, np.maximum(np.concatenate(xs, axis=1), 0))


def test_concatenate_along_the_last_axis_copies_each_piece_in_its_own_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KILN_CACHE", "0")  # compile the kernel: the loop IR of a cached one is not kept
    lib, xs = build_concatenate_relu([(4, 6, 40), (4, 6, 24)], -1)
    (kernel,) = lib.kernels
    tir = kernel.get_source("tir")
    assert "select" not in tir and tir.count("for ") == 3  # rows, then one plain copy loop per piece
    np.testing.assert_array_equal(lib.create_executor()(x0=xs[0], x1=xs[1]), np.maximum(np.concatenate(xs, -1), 0))
