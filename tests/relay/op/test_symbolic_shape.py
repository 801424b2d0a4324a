"""Shape, indexing and creation ops with symbolic dims: each function is built once and run at several sizes.

The dims are those of a BERT/GPT-2 encoder with symbolic batch `n` and sequence `s`: the token embedding
lookup, the heads' reshape and transpose, the attention mask's expand_dims, concatenations, slices and
splits; each case is checked against numpy at every size, with the one library it was built into.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from kiln import relay
from kiln.ir.types import SizeVar, dim_mul
from kiln.relay.op.shape import _reshape_groups

Array = np.ndarray[Any, Any]
_END = 2**31 - 1
n, s = SizeVar("n"), SizeVar("s")


def _rand(*shape: int, seed: int = 0) -> Array:
    return np.random.default_rng(seed + sum(shape)).standard_normal(shape).astype("float32")


def _check(fn: relay.Function, inputs_at: Callable[[int], dict[str, Array]], ref: Callable[..., Any],
           sizes: tuple[int, ...] = (1, 3, 17)) -> None:
    """Builds `fn` once; runs its one executor at each size against numpy (`ref` of the same inputs)."""
    lib = relay.build(fn)
    kernels = len(lib.kernels)
    ex = lib.create_executor()
    for size in sizes:
        inputs = inputs_at(size)
        got, want = ex(**inputs), ref(**inputs)
        if isinstance(want, (list, tuple)):
            assert isinstance(got, (list, tuple)) and len(got) == len(want)
            for g, w in zip(got, want, strict=True):
                np.testing.assert_allclose(g, w, rtol=1e-6, err_msg=f"size {size}")
        else:
            assert got.shape == want.shape, f"size {size}"
            np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=f"size {size}")
    assert len(lib.kernels) == kernels  # the same library ran every size: nothing was rebuilt


def test_reshape_groups_cut_where_the_products_agree() -> None:
    assert _reshape_groups([n, s, 768], [n, s, 12, 64]) == [(0, 0), (1, 1), (2, 2), (3, 4)]
    assert _reshape_groups([n, 1, s], [n, s]) == [(0, 0), (1, 1), (3, 2)]
    assert _reshape_groups([n, 8], [dim_mul(2, n), 4]) == [(0, 0), (2, 2)]  # 2*n: no cut inside
    assert _reshape_groups([n, s], [n, 1, 1, s]) == [(0, 0), (1, 1), (2, 4)]


@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_token_embedding_lookup(dtype: str) -> None:
    table, ids = relay.var("table", shape=(50, 16)), relay.var("ids", shape=("n", "s"), dtype=dtype)
    fn = relay.Function([table, ids], relay.take(table, ids, axis=0))
    weights = _rand(50, 16)
    _check(fn, lambda k: {"table": weights, "ids": np.arange(k * (k + 2)).reshape(k, k + 2).astype(dtype) % 50},
           lambda table, ids: table[ids])


@pytest.mark.parametrize("mode", ["clip", "wrap", "fast"])
def test_take_along_a_symbolic_axis(mode: str) -> None:
    x, idx = relay.var("x", shape=("n", 8)), relay.var("i", shape=("s",), dtype="int64")
    fn = relay.Function([x, idx], relay.take(x, idx, axis=0, mode=mode))
    indices = {"clip": lambda k: np.arange(-3, k + 4),  # clamped into [0, k)
               "wrap": lambda k: np.arange(-20, 20, 3),
               "fast": lambda k: np.arange(-k, k)}[mode]  # in range, negative ones from the end
    _check(fn, lambda k: {"x": _rand(k, 8), "i": indices(k)},
           lambda x, i: np.take(x, i, axis=0, mode="raise" if mode == "fast" else mode))


def test_take_of_the_flattened_data() -> None:
    x, idx = relay.var("x", shape=("n", 8)), relay.var("i", shape=(5,), dtype="int32")
    fn = relay.Function([x, idx], relay.take(x, idx))
    _check(fn, lambda k: {"x": _rand(k, 8), "i": np.array([0, 3, 8 * k - 1, 8 * k + 5, 7], "int32")},
           lambda x, i: np.take(x, i, mode="clip"))


def test_heads_split_and_merged() -> None:
    """(n, s, 24) -> (n, s, 4, 6) -> (n, 4, s, 6) -> back, with an elementwise op between."""
    x = relay.var("x", shape=("n", "s", 24))
    heads = relay.transpose(relay.reshape(x, (0, 0, 4, 6)), (0, 2, 1, 3))
    merged = relay.reshape(relay.transpose(relay.exp(heads), (0, 2, 1, 3)), (0, 0, 24))
    fn = relay.Function([x], relay.Tuple([heads, merged]))
    _check(fn, lambda k: {"x": _rand(k, 2 * k + 1, 24)},
           lambda x: (x.reshape(*x.shape[:2], 4, 6).transpose(0, 2, 1, 3), np.exp(x)))


def test_attention_mask_expanded_and_broadcast() -> None:
    scores, mask = relay.var("scores", shape=("n", 4, "s", "s")), relay.var("mask", shape=("n", "s"))
    by_expand = relay.expand_dims(relay.expand_dims(mask, 1), 1)
    by_reshape = relay.reshape(mask, (0, 1, 1, -1))
    fn = relay.Function([scores, mask], relay.Tuple([relay.add(scores, by_expand), relay.multiply(scores, by_reshape)]))
    _check(fn, lambda k: {"scores": _rand(k, 4, k + 2, k + 2), "mask": _rand(k, k + 2, seed=1)},
           lambda scores, mask: (scores + mask[:, None, None, :], scores * mask[:, None, None, :]))


def test_squeeze_batch_flatten_and_a_transpose_of_rank_two() -> None:
    x, y = relay.var("x", shape=("n", 1, 8)), relay.var("y", shape=("n", 3, 4))
    fn = relay.Function([x, y], relay.Tuple([relay.squeeze(x, [1]), relay.nn.batch_flatten(y),
                                            relay.transpose(relay.squeeze(x))]))
    _check(fn, lambda k: {"x": _rand(k, 1, 8), "y": _rand(k, 3, 4)},
           lambda x, y: (x[:, 0], y.reshape(len(y), 12), x[:, 0].T))


@pytest.mark.parametrize("width", [5, 13, 64])
def test_concatenate_along_a_static_axis(width: int) -> None:
    """Rows wider and narrower than a vector; with an elementwise op after it (the partitioned schedule)."""
    x, y = relay.var("x", shape=("n", "s", 8)), relay.var("y", shape=("n", "s", width))
    fn = relay.Function([x, y], relay.exp(relay.concatenate([x, y], axis=2)))
    _check(fn, lambda k: {"x": _rand(k, k + 1, 8), "y": _rand(k, k + 1, width, seed=1)},
           lambda x, y: np.exp(np.concatenate([x, y], axis=2)))


def test_concatenate_along_a_middle_axis() -> None:
    """The joined axis between a symbolic one and static rows (vectorized), three pieces."""
    x, y = relay.var("x", shape=("n", 4, 24)), relay.var("y", shape=("n", 3, 24))
    fn = relay.Function([x, y], relay.concatenate([x, y, x], axis=1))
    _check(fn, lambda k: {"x": _rand(k, 4, 24), "y": _rand(k, 3, 24, seed=1)},
           lambda x, y: np.concatenate([x, y, x], axis=1))


def test_concatenate_along_the_symbolic_axis() -> None:
    """(n, 8) and (n, 8) joined into (2*n, 8), seen as (n, 2, 8) (a kernel's buffers stay plain size vars)."""
    x, y = relay.var("x", shape=("n", 8)), relay.var("y", shape=("n", 8))
    fn = relay.Function([x, y], relay.reshape(relay.concatenate([x, y], axis=0), (-1, 2, 8)))
    _check(fn, lambda k: {"x": _rand(k, 8), "y": _rand(k, 8, seed=1)},
           lambda x, y: np.concatenate([x, y]).reshape(-1, 2, 8))


def test_stack_and_tile() -> None:
    x, y = relay.var("x", shape=("n", 8)), relay.var("y", shape=("n", 8))
    fn = relay.Function([x, y], relay.Tuple([relay.stack([x, y], axis=1), relay.tile(x, (1, 3)),
                                            relay.tile(y, (2, 1, 1))]))
    _check(fn, lambda k: {"x": _rand(k, 8), "y": _rand(k, 8, seed=1)},
           lambda x, y: (np.stack([x, y], axis=1), np.tile(x, (1, 3)), np.tile(y, (2, 1, 1))))


def test_broadcast_to_a_static_shape() -> None:
    x = relay.var("x", shape=("n", 1))
    fn = relay.Function([x], relay.broadcast_to(x, (4, 6)))
    _check(fn, lambda k: {"x": _rand(4, 1)}, lambda x: np.broadcast_to(x, (4, 6)), sizes=(4,))


@pytest.mark.parametrize(("begin", "end", "strides", "axes"), [
    ([1], [7], [2], [2]),  # a static axis of a symbolic tensor
    ([0, -5], [_END, -1], None, [1, 2]),  # the symbolic axis taken whole, negative indices on the static one
    ([6], [0], [-2], [-1]),  # a negative stride
])
def test_strided_slice_of_a_static_axis(begin: list[int], end: list[int], strides: list[int] | None,
                                        axes: list[int]) -> None:
    x = relay.var("x", shape=("n", "s", 8))
    fn = relay.Function([x], relay.strided_slice(x, begin, end, strides, axes))
    steps = strides or [1] * len(begin)

    def ref(x: Array) -> Array:
        index: list[slice] = [slice(None)] * 3
        for a, b, e, st in zip(axes, begin, end, steps, strict=True):
            index[a] = slice(b, e, st)
        return x[tuple(index)]

    _check(fn, lambda k: {"x": _rand(k, k + 2, 8)}, ref)


def test_split_into_static_pieces() -> None:
    """At indices (the pieces of a static axis) and in sections (query, key, value of one projection)."""
    x = relay.var("x", shape=("n", "s", 24))
    at = relay.split(x, [3, 10], axis=2)
    qkv = relay.split(x, 3, axis=-1)
    fn = relay.Function([x], relay.Tuple([relay.TupleGetItem(at, i) for i in range(3)]
                                         + [relay.TupleGetItem(qkv, i) for i in range(3)]))
    _check(fn, lambda k: {"x": _rand(k, k + 1, 24)}, lambda x: (*np.split(x, [3, 10], axis=2), *np.split(x, 3, -1)))


def test_gather_elements_and_gather_nd() -> None:
    x, i = relay.var("x", shape=("n", 8)), relay.var("i", shape=("n", 3), dtype="int64")
    rows = relay.var("rows", shape=("s", 1), dtype="int32")
    fn = relay.Function([x, i, rows], relay.Tuple([relay.gather_elements(x, i, axis=1), relay.gather_nd(x, rows)]))

    def inputs(k: int) -> dict[str, Array]:
        rng = np.random.default_rng(k)
        return {"x": _rand(k, 8), "i": rng.integers(-8, 8, (k, 3)), "rows": rng.integers(-k, k, (k + 2, 1), "int32")}

    _check(fn, inputs, lambda x, i, rows: (np.take_along_axis(x, i % 8, axis=1), x[rows[:, 0] % len(x)]))


def test_cast_where_clip() -> None:
    x = relay.var("x", shape=("n", "s"))
    fn = relay.Function([x], relay.Tuple([relay.cast(relay.multiply(x, relay.const(4.0)), "int32"),
                                          relay.where(relay.greater(x, relay.const(0.0)), x, relay.const(-1.0)),
                                          relay.clip(x, -0.5, 0.5)]))
    _check(fn, lambda k: {"x": _rand(k, 2 * k + 3)},
           lambda x: ((x * 4).astype("int32"), np.where(x > 0, x, -1.0).astype("float32"), np.clip(x, -0.5, 0.5)))


def test_zeros_like_ones_like_and_shape_of() -> None:
    x = relay.var("x", shape=("n", "s", 8))
    fn = relay.Function([x], relay.Tuple([relay.zeros_like(x), relay.add(x, relay.ones_like(x)),
                                          relay.shape_of(x, "int64")]))
    _check(fn, lambda k: {"x": _rand(k, k + 5, 8)},
           lambda x: (np.zeros_like(x), x + 1, np.array(x.shape, "int64")))
