"""The gradients of the shape and indexing ops, each against central finite differences of the op's numpy
reference in float64, over at least two shapes, run by the reference interpreter and compiled (llvm)."""

from __future__ import annotations

import numpy as np
import pytest
from op_grad_helpers import (
    MODES,
    Case,
    case_params,
    check_op_grad,
    gradient_exprs,
    ops_with_fewer_than_two_shapes,
    run_gradient,
)
from op_helpers import make_attrs

from kiln import relay
from kiln.registry import Op, attr

RNG = np.random.default_rng(11)


def rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape)


def ints(high: int, *shape: int, low: int = 0) -> np.ndarray:
    return RNG.integers(low, high, shape).astype(np.int32)


def with_zeros(*shape: int) -> np.ndarray:
    """Values with exact zeros among them (every other one): a product's gradient must not divide by them."""
    x = rand(*shape)
    x.flat[::2] = 0.0
    return x


def distinct(*shape: int) -> np.ndarray:
    """Values without ties, at least 0.1 apart, of both signs: topk's picks do not move under a small step."""
    n = int(np.prod(shape))
    return ((RNG.permutation(n) - n / 2) * 0.1 + 0.05).reshape(shape)


CASES: list[Case] = [
    ("reshape", [rand(2, 3, 4)], {"newshape": (6, -1)}),
    ("reshape", [rand(6)], {"newshape": (3, 1, 2)}),
    ("transpose", [rand(2, 3, 4)], {"axes": (2, 0, 1)}),
    ("transpose", [rand(3, 5)], {}),
    ("transpose", [rand(2, 3, 4, 1)], {"axes": (-1, 1, -2, 0)}),
    ("squeeze", [rand(2, 1, 3, 1)], {}),
    ("squeeze", [rand(1, 4)], {"axis": (0,)}),
    ("expand_dims", [rand(2, 3)], {"axis": 1}),
    ("expand_dims", [rand(4)], {"axis": -1, "num_newaxis": 2}),
    ("nn.batch_flatten", [rand(2, 3, 4)], {}),
    ("nn.batch_flatten", [rand(3, 2, 1, 2)], {}),
    ("concatenate", [rand(2, 3), rand(4, 3), rand(1, 3)], {}),
    ("concatenate", [rand(2, 3, 2), rand(2, 1, 2)], {"axis": -2}),
    ("concatenate", [rand(2, 2)], {"axis": 1}),
    ("stack", [rand(2, 3), rand(2, 3), rand(2, 3)], {"axis": 1}),
    ("stack", [rand(4), rand(4)], {}),
    ("broadcast_to", [rand(3, 1)], {"shape": (2, 3, 4)}),
    ("broadcast_to", [rand(4)], {"shape": (3, 4)}),
    ("broadcast_to", [rand(2, 3)], {"shape": (2, 3)}),
    ("tile", [rand(2, 3)], {"reps": (2, 3)}),
    ("tile", [rand(3)], {"reps": (2, 1, 2)}),
    ("tile", [rand(2, 1, 3)], {"reps": (2,)}),
    ("split", [rand(6, 2)], {"indices_or_sections": 3}),
    ("split", [rand(2, 7)], {"indices_or_sections": (2, 3), "axis": 1}),
    ("strided_slice", [rand(5, 4)], {"begin": (1,), "end": (4,)}),
    ("strided_slice", [rand(7, 6)], {"begin": (1, 5), "end": (7, 0), "strides": (2, -2)}),
    ("strided_slice", [rand(3, 8, 2)], {"begin": (-2,), "end": (2**31 - 1,), "axes": (1,)}),
    ("strided_slice", [rand(9)], {"begin": (0,), "end": (9,), "strides": (3,)}),
    ("strided_slice", [rand(6, 5)], {"begin": (-1, 4), "end": (-7, 1), "strides": (-1, -3)}),
    ("take", [rand(5, 3), np.array([4, 0, 4, 2], np.int32)], {"axis": 0}),
    ("take", [rand(2, 4, 3), np.array([[1, 3], [3, 3]], np.int32)], {"axis": 1}),
    ("take", [rand(3, 4), np.array([0, 11, 5, 5, 7], np.int32)], {}),
    ("take", [rand(4, 3), np.array([-1, 5, 2], np.int32)], {"axis": 0}),
    ("take", [rand(4, 3), np.array([-1, 5, 9], np.int32)], {"axis": 0, "mode": "wrap"}),
    ("take", [rand(3, 4), np.array([-1, 1, 1], np.int32)], {"axis": 1, "mode": "fast"}),
    ("gather_elements", [rand(3, 4), ints(3, 2, 4)], {"axis": 0}),
    ("gather_elements", [rand(2, 3, 4), ints(4, 2, 3, 6, low=-4)], {"axis": -1}),
    ("gather_nd", [rand(3, 4), np.array([[0, 1], [2, 3], [0, 1]], np.int32)], {}),
    ("gather_nd", [rand(4, 2, 3), np.array([[3], [0], [3]], np.int32)], {}),
    ("scatter_elements", [rand(3, 4), ints(3, 2, 4), rand(2, 4)], {"reduction": "add"}),
    ("scatter_elements", [rand(3, 4), np.array([[0, 2, 3], [1, 2, 0]], np.int32), rand(2, 3)], {"axis": 1}),
    ("scatter_elements", [rand(4, 2), np.array([[1, 0], [1, 3], [-3, 3]], np.int32), rand(3, 2)], {}),
    ("scatter_nd", [rand(3, 4), np.array([[0, 1], [2, 3], [0, 1]], np.int32), rand(3)], {"reduction": "add"}),
    ("scatter_nd", [rand(4, 2), np.array([[3], [0], [3]], np.int32), rand(3, 2)], {}),
    ("scatter_nd", [rand(3, 4), np.array([[0, 1], [2, 3], [1, 1]], np.int32), rand(3)], {}),
    ("gather_nd", [rand(2, 3), np.array([[1], [2]], np.int32)], {"batch_dims": 1}),
    ("gather_nd", [rand(2, 3, 4, 2), np.array([[[0, 1], [2, 3], [2, 3]], [[1, 0], [0, 0], [2, -1]]], np.int32)],
     {"batch_dims": 1}),
    ("gather_nd", [rand(2, 2, 3), np.array([[[2], [0]], [[1], [1]]], np.int32)], {"batch_dims": 2}),
    # max / min / mul: repeated positions, ties between the data and an update, zeros among the factors
    ("scatter_elements", [distinct(3, 4), ints(3, 2, 4), distinct(2, 4)], {"reduction": "max"}),
    ("scatter_elements", [distinct(3, 4), np.array([[0, 2, 3], [0, 2, 1]], np.int32), distinct(2, 3)],
     {"axis": 1, "reduction": "min"}),
    ("scatter_elements", [rand(3, 4), np.array([[0, 1, 0, 2], [0, 1, 2, 2]], np.int32), with_zeros(2, 4)],
     {"reduction": "mul"}),
    ("scatter_elements", [rand(2, 3), np.array([[1, 1], [0, 2]], np.int32), with_zeros(2, 2)],
     {"axis": 1, "reduction": "mul"}),
    ("scatter_nd", [distinct(4, 2), np.array([[3], [0], [3]], np.int32), distinct(3, 2)], {"reduction": "max"}),
    ("scatter_nd", [rand(3, 4), np.array([[0, 1], [2, 3], [0, 1]], np.int32), with_zeros(3)], {"reduction": "mul"}),
    ("topk", [distinct(2, 3, 4)], {"k": 2, "axis": 1}),
    ("topk", [distinct(6, 4)], {"k": 3, "largest": False}),
]


@pytest.mark.parametrize("compiled", MODES)
@pytest.mark.parametrize("case", case_params(CASES))
def test_gradient_matches_finite_differences(case: Case, compiled: bool) -> None:
    op, arrays, kw = case
    check_op_grad(op, arrays, compiled=compiled, **kw)


def test_every_case_op_has_two_shapes() -> None:
    assert not ops_with_fewer_than_two_shapes(CASES)


def test_take_adds_the_gradients_of_an_index_taken_twice() -> None:
    x = np.zeros((3, 2))
    g = np.array([[1.0, 2.0], [10.0, 20.0], [100.0, 200.0]])
    (dx, didx), _ = run_gradient("take", [x, np.array([2, 0, 2], np.int32)], gvals=[g], axis=0)
    assert didx is None
    np.testing.assert_array_equal(dx, [[10, 20], [0, 0], [101, 202]])


def test_split_gradient_takes_zeros_for_a_piece_without_one() -> None:
    from kiln.registry import Op, attr

    call, params, _, _ = gradient_exprs("split", [rand(4, 2)], indices_or_sections=2)
    g0 = relay.var("g0", shape=(2, 2), dtype="float64")
    (dx,) = Op.get("split").get_attr(attr.FPrimalGradient)(call, [g0, None])
    func = relay.infer_type(relay.Function([*params, g0], dx))
    value = np.arange(4.0).reshape(2, 2)
    got = relay.create_executor("debug", mod=relay.IRModule.from_expr(func)).evaluate()(rand(4, 2), value)
    np.testing.assert_array_equal(got, np.concatenate([value, np.zeros((2, 2))]))


def test_scatter_gives_an_overwritten_update_no_gradient() -> None:
    indices = np.array([[1], [0], [1]], np.int32)  # row 1 written twice: the last write wins
    g = np.arange(6.0).reshape(3, 2)
    (dx, _, dupd), _ = run_gradient("scatter_nd", [rand(3, 2), indices, rand(3, 2)], gvals=[g])
    np.testing.assert_array_equal(dx, [[0, 0], [0, 0], [4, 5]])
    np.testing.assert_array_equal(dupd, [[0, 0], [0, 1], [2, 3]])


@pytest.mark.parametrize("shape", [(3,), (2, 4)])
def test_creation_gradients(shape: tuple[int, ...]) -> None:
    check_op_grad("full", [np.array(1.5)], shape=shape)  # the fill value's gradient: the sum of the output's
    check_op_grad("zeros_like", [np.ones(shape)])  # zeros: the output does not depend on the input's values
    check_op_grad("ones_like", [np.ones(shape)])
    for op, kw in [("zeros", {"shape": shape}), ("ones", {"shape": shape}), ("arange", {"start": 0.0, "stop": 3.0})]:
        call = relay.infer_type(relay.Function([], relay.expr.call(op, [], make_attrs(op, **kw)))).body
        assert Op.get(op).get_attr(attr.FPrimalGradient)(call, call) == []  # no arguments
    assert "integer shape" in Op.get("shape_of").get_attr(attr.TNonDifferentiable)
