"""nn.dense, nn.matmul and nn.batch_matmul with symbolic dims: compiled once, run at any size.

Each function is built once, its inputs' rows, batch dims (and in attention's
products N or K) symbolic, and run at several sizes against numpy; the library
never compiles another kernel. The symbolic dims are tiled as large extents
with a guarded tail, so the forms of the register-tiled llvm product (panels
packed at build time, the outer form with a padded b and a column tail, the
inner form) all meet a tail at some size.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pytest

from kiln import relay, te
from kiln.relay.backend.te_compiler import _Lowerer
from kiln.target import Target

SIZES = (1, 3, 17, 64)
_rng = np.random.default_rng(18)

Arrays = dict[str, np.ndarray]


def _rand(*shape: int) -> np.ndarray:
    return _rng.standard_normal(shape).astype("float32")


def _dims(n: int) -> dict[str, int]:
    """The value of each symbolic dim at size `n`: unequal sizes, not multiples of the tiles."""
    return {"n": n, "s": 2 * n + 1, "m": n + 2, "b": n % 4 + 1}


def _concrete(shape: Sequence[object], n: int) -> tuple[int, ...]:
    return tuple(d if isinstance(d, int) else _dims(n)[str(d)] for d in shape)


def _check_sizes(func: relay.Function, reference: Callable[..., np.ndarray], sizes: Sequence[int] = SIZES,
                 params: Arrays | None = None) -> None:
    """Builds `func` once and runs it at every size (the parameters' symbolic dims as `_dims` gives
    them, `params` as given) against `reference(**inputs)`."""
    lib = relay.build(func)
    kernels = len(lib.kernels)
    run = lib.create_executor()
    for n in sizes:
        inputs = {p.name_hint: _rand(*_concrete(p.type_annotation.shape, n))
                  for p in func.params if p.name_hint not in (params or {})}
        inputs.update(params or {})
        got = np.asarray(run(**inputs))
        want = reference(**inputs)
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert len(lib.kernels) == kernels  # no kernel was compiled for a size


def _lowered(func: relay.Function) -> str:
    """The loop IR of `func` lowered as one primitive function (as lowering does, in a size_vars scope)."""
    with te.size_vars():
        sch, inputs, outs = _Lowerer(relay.infer_type(func), Target("llvm")).run()
        return str(te.lower(sch, [*inputs, *outs]))


# (name, data shape, units N, weight a constant (packed into panels at build time for N % 64 == 0))
DENSE_CASES = [
    ("panels_packed_at_build", ("n", 64), 128, True),
    ("weight_input_column_tail", ("n", 64), 100, False),
    ("batched_rows", ("n", "s", 48), 64, True),
]


@pytest.mark.parametrize(("name", "x_shape", "units", "constant"), DENSE_CASES, ids=[c[0] for c in DENSE_CASES])
def test_dense_with_symbolic_rows_and_a_bias_relu_epilogue_runs_every_size(name, x_shape, units, constant) -> None:
    k = x_shape[-1]
    x = relay.var("x", shape=x_shape)
    weight, bias = _rand(units, k), _rand(units)
    w: relay.Expr = relay.const(weight) if constant else relay.var("w", shape=(units, k))
    y = relay.nn.relu(relay.nn.bias_add(relay.nn.dense(x, w), relay.const(bias), axis=-1))
    func = relay.Function([x] if constant else [x, w], y)
    params = None if constant else {"w": weight}
    _check_sizes(func, lambda x, **_: np.maximum(x @ weight.T + bias, 0), params=params)


def test_dense_with_symbolic_rows_keeps_the_static_tiles() -> None:
    def lowered(rows: int | str) -> str:
        x, w = relay.var("x", shape=(rows, 64)), relay.var("w", shape=(256, 64))
        return _lowered(relay.Function([x, w], relay.nn.relu(relay.nn.dense(x, w))))

    static, symbolic = lowered(128), lowered("n")
    for ir in (static, symbolic):  # 4 x 64 register tiles, the relu stored from them, column tiles on the cores
        assert "for i1_outer in range(4):  # parallel" in ir
        assert "dense = allocate((4, 64), float32" in ir
        assert "relu[i0_outer * 4 + i0_inner, i1_outer * 64 + i1_inner] = max(dense[i0_inner, i1_inner]" in ir
    assert "for i0_outer in range(32):" in static
    assert "for i0_outer in range((n + 3) // 4):" in symbolic  # the row tiles and their tail, guarded


MATMUL_CASES = [
    ("batch_dims", ("n", "s", 64), (64, 40), {}),
    ("broadcast_batch_transposed", ("n", 64, "m"), (1, 24, 64), {"transpose_a": True, "transpose_b": True}),
]


@pytest.mark.parametrize(("name", "a_shape", "b_shape", "kw"), MATMUL_CASES, ids=[c[0] for c in MATMUL_CASES])
def test_matmul_with_symbolic_batch_dims_runs_every_size(name, a_shape, b_shape, kw) -> None:
    a, b = relay.var("a", shape=a_shape), relay.var("b", shape=b_shape)

    def reference(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        a = np.swapaxes(a, -1, -2) if kw.get("transpose_a") else a
        return np.matmul(a, np.swapaxes(b, -1, -2) if kw.get("transpose_b") else b)

    _check_sizes(relay.Function([a, b], relay.nn.matmul(a, b, **kw)), reference)


# attention: (batch, M, K) x (batch, N, K)^T with M and the batch symbolic; its scores, (b, s, 64) x (b, s, 64)^T,
# with N = s symbolic too; its probabilities @ V, (b, s, s) x (b, s, 64), with K = s symbolic
BATCH_MATMUL_CASES = [
    ("batch_and_rows", ("b", "m", 64), ("b", 32, 64), True),
    ("scores_symbolic_columns", ("b", "s", 64), ("b", "s", 64), True),
    ("values_symbolic_reduction", ("b", "s", "s"), ("b", "s", 64), False),
]


@pytest.mark.parametrize(("name", "x_shape", "y_shape", "transpose_b"), BATCH_MATMUL_CASES,
                         ids=[c[0] for c in BATCH_MATMUL_CASES])
def test_batch_matmul_with_symbolic_batch_and_rows_runs_every_size(name, x_shape, y_shape, transpose_b) -> None:
    x, y = relay.var("x", shape=x_shape), relay.var("y", shape=y_shape)
    func = relay.Function([x, y], relay.nn.batch_matmul(x, y, transpose_b=transpose_b))
    _check_sizes(func, lambda x, y: x @ (y.transpose(0, 2, 1) if transpose_b else y))


def test_batch_matmul_with_few_static_rows_and_symbolic_columns_takes_the_inner_form() -> None:
    x, y = relay.var("x", shape=("b", 2, 64)), relay.var("y", shape=("b", "s", 64))
    func = relay.Function([x, y], relay.nn.batch_matmul(x, y))
    assert "matmul_partial = allocate" in _lowered(func)  # sums along K, 16 lanes at a time
    _check_sizes(func, lambda x, y: x @ y.transpose(0, 2, 1), sizes=(1, 5, 40))
