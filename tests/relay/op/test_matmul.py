"""The matrix products of kiln.relay.op.matmul (nn.dense, nn.matmul, nn.batch_matmul), compiled.

Their relations and references are tested in test_nn.py; here each op goes
through the lowering path (its compute and generic schedule, LLVM) and must
agree with its numpy reference over a grid of shapes, transposes and dtypes.
"""

from __future__ import annotations

import numpy as np
import pytest
from op_helpers import check_build, rand

from kiln.relay.op import matmul, nn


def _ints(*shape: int, dtype: str) -> np.ndarray:
    return np.random.default_rng(2).integers(-20, 20, shape).astype(dtype)


def test_the_constructors_are_those_of_relay_nn() -> None:
    assert nn.dense is matmul.dense and nn.matmul is matmul.matmul and nn.batch_matmul is matmul.batch_matmul
    assert nn.DenseAttrs is matmul.DenseAttrs


@pytest.mark.parametrize(("x_shape", "w_shape"), [
    ((4, 8), (5, 8)), ((1, 3), (1, 3)), ((8,), (3, 8)), ((2, 3, 8), (5, 8)), ((64, 64), (64, 64)),
])
def test_dense_builds(x_shape, w_shape) -> None:
    check_build("nn.dense", rand(*x_shape), rand(*w_shape), rtol=1e-5, atol=1e-5)


def test_dense_builds_with_units_and_out_dtype() -> None:
    check_build("nn.dense", rand(4, 8), rand(5, 8), units=5)
    check_build("nn.dense", _ints(4, 8, dtype="int8"), _ints(5, 8, dtype="int8"), out_dtype="int32")
    check_build("nn.dense", rand(4, 8), rand(5, 8), out_dtype="float64", rtol=1e-12)
    check_build("nn.dense", _ints(3, 7, dtype="int32"), _ints(2, 7, dtype="int32"))


@pytest.mark.parametrize("transpose_a", [False, True])
@pytest.mark.parametrize("transpose_b", [False, True])
@pytest.mark.parametrize(("batch_a", "batch_b"), [((), ()), ((3,), (3,)), ((2, 1), (3,)), ((1,), (2, 4))])
def test_matmul_builds(transpose_a, transpose_b, batch_a, batch_b) -> None:
    m, k, n = 4, 6, 5
    a = rand(*batch_a, *((k, m) if transpose_a else (m, k)))
    b = rand(*batch_b, *((n, k) if transpose_b else (k, n)))
    check_build("nn.matmul", a, b, rtol=1e-5, atol=1e-5, transpose_a=transpose_a, transpose_b=transpose_b)


def test_matmul_builds_with_out_dtype() -> None:
    check_build("nn.matmul", _ints(3, 4, dtype="int8"), _ints(4, 2, dtype="int8"), out_dtype="int32")
    check_build("nn.matmul", rand(3, 4), rand(4, 2), out_dtype="float64", rtol=1e-12)


@pytest.mark.parametrize("transpose_a", [False, True])
@pytest.mark.parametrize("transpose_b", [False, True])
@pytest.mark.parametrize(("batch_x", "batch_y"), [(2, 2), (1, 3), (3, 1)])
def test_batch_matmul_builds(transpose_a, transpose_b, batch_x, batch_y) -> None:
    m, k, n = 3, 5, 4
    x = rand(batch_x, *((k, m) if transpose_a else (m, k)))
    y = rand(batch_y, *((n, k) if transpose_b else (k, n)))
    check_build("nn.batch_matmul", x, y, rtol=1e-5, atol=1e-5, transpose_a=transpose_a, transpose_b=transpose_b)


# -- nn.dense with a weight packed at build time (weight_layout NK<b>n, made by AlterOpLayout on llvm) --------


def _pack(w: np.ndarray, block: int) -> np.ndarray:
    n, k = w.shape
    return np.ascontiguousarray(w.reshape(n // block, block, k).transpose(0, 2, 1))


@pytest.mark.parametrize(("x_shape", "n"), [((1, 16), 64), ((5, 24), 128), ((197, 40), 64), ((2, 3, 8), 64)])
def test_dense_with_a_packed_weight_builds(x_shape, n) -> None:
    x, w = rand(*x_shape), rand(n, x_shape[-1])
    assert np.allclose(matmul.unpack_weight(_pack(w, 64), 64), w)
    check_build("nn.dense", x, _pack(w, 64), weight_layout="NK64n", rtol=1e-5, atol=1e-5)
    check_build("nn.dense", x.astype("float64"), _pack(w, 32).astype("float64"), weight_layout="NK32n", rtol=1e-12)


def test_dense_weight_layout_is_checked() -> None:
    from kiln import relay
    from kiln.ir.attrs import AttrsError
    from kiln.relay.type_infer import TypeInferenceError

    with pytest.raises(AttrsError, match="weight_layout.*'NK<b>n'"):
        nn.dense(relay.var("x", shape=(2, 8)), relay.var("w", shape=(1, 8, 64)), weight_layout="KN")
    x, w = relay.var("x", shape=(2, 8)), relay.var("w", shape=(64, 8))
    with pytest.raises(TypeInferenceError, match="rank 3, \\(units/64, K, 64\\)"):
        relay.infer_type(relay.Function([x, w], nn.dense(x, w, weight_layout="NK64n")))
    w3 = relay.var("w", shape=(2, 8, 32))
    with pytest.raises(TypeInferenceError, match="needs a weight \\(units/64, K, 64\\)"):
        relay.infer_type(relay.Function([x, w3], nn.dense(x, w3, weight_layout="NK64n")))
    packed = relay.var("w", shape=(2, 8, 64))
    f = relay.infer_type(relay.Function([x, packed], nn.dense(x, packed, weight_layout="NK64n")))
    assert tuple(f.checked_type.ret_type.shape) == (2, 128)
