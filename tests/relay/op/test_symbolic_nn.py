"""Reductions, softmax, layer_norm, the nn activations, batch_norm, pad and the losses with symbolic dims.

Each case builds one library for inputs such as ("n", 12, "s", 64) and runs it at several sizes against
numpy: the library is compiled once (its kernels do not change while it runs). The generic injective
schedule's loops for symbolic shapes are checked on the lowered loop IR.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest

from kiln import relay, te
from kiln.ir.types import SizeVar
from kiln.relay.op._schedule import schedule_injective_stage
from kiln.tir.functor import post_order_visit
from kiln.tir.pipeline import optimize_tir
from kiln.tir.stmt import For, ForKind

RNG = np.random.default_rng(7)
Feed = dict[str, np.ndarray]


def _rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def _check(params: Sequence[relay.Var], body: relay.Expr, feeds: Sequence[Feed],
           reference: Callable[..., Any], rtol: float = 1e-5, atol: float = 1e-6) -> None:
    """Builds `body` once and runs it on every feed: each result (each field of a tuple) as numpy's."""
    lib = relay.build(relay.Function(list(params), body))
    kernels = len(lib.kernels)
    ex = lib.create_executor()
    for feed in feeds:
        got = ex(**feed)
        want = reference(**feed)
        gots = got if isinstance(got, (list, tuple)) else [got]
        wants = want if isinstance(want, (list, tuple)) else [want]
        assert len(gots) == len(wants)
        for g, w in zip(gots, wants, strict=True):
            assert np.asarray(g).shape == np.shape(w)
            np.testing.assert_allclose(np.asarray(g), w, rtol=rtol, atol=atol)
    assert len(lib.kernels) == kernels  # one library for every size


def _softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return np.asarray(e / e.sum(axis=axis, keepdims=True))


# --- softmax, log_softmax --------------------------------------------------------------------------


def test_softmax_over_a_static_last_axis_of_a_symbolic_batch_and_sequence() -> None:
    # attention scores: the llvm rows implementation, 12 * n * s rows of 64
    x = relay.var("x", shape=("n", 12, "s", 64))
    feeds = [{"x": _rand(n, 12, s, 64)} for n, s in [(1, 1), (2, 5), (3, 17)]]
    _check([x], relay.nn.softmax(x), feeds, lambda x: _softmax(x))


def test_log_softmax_of_a_symbolic_batch_takes_rows_by_blocks_with_a_tail() -> None:
    # short rows go by blocks of 16: 1, 17 and 40 rows end in a partial block
    x = relay.var("x", shape=("n", 10))
    feeds = [{"x": _rand(n, 10) * 4} for n in (1, 17, 40)]
    _check([x], relay.nn.log_softmax(x), feeds, lambda x: np.log(_softmax(x)), atol=1e-5)


def test_softmax_over_a_symbolic_axis_and_over_a_middle_axis() -> None:
    # the generic compute: a reduction over the size variable s, and over axis 1 of a symbolic batch
    x = relay.var("x", shape=(4, "s"))
    y = relay.var("y", shape=("n", 5, 3))
    body = relay.Tuple([relay.nn.softmax(x), relay.nn.log_softmax(y, axis=1)])
    feeds = [{"x": _rand(4, k), "y": _rand(k, 5, 3)} for k in (1, 7, 33)]
    _check([x, y], body, feeds, lambda x, y: [_softmax(x), np.log(_softmax(y, axis=1))], atol=1e-5)


# --- layer_norm, batch_norm ------------------------------------------------------------------------


def _layer_norm(x: np.ndarray, g: np.ndarray, b: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    x64 = x.astype(np.float64)
    mean = x64.mean(-1, keepdims=True)
    var = ((x64 - mean) ** 2).mean(-1, keepdims=True)
    return np.asarray((x64 - mean) / np.sqrt(var + eps) * g + b)


def test_layer_norm_over_768_of_a_symbolic_batch_and_sequence() -> None:
    x = relay.var("x", shape=("n", "s", 768))
    g, b = relay.var("g", shape=(768,)), relay.var("b", shape=(768,))
    gv, bv = _rand(768), _rand(768)
    feeds = [{"x": _rand(n, s, 768) * 3 + 1, "g": gv, "b": bv} for n, s in [(1, 1), (2, 3), (3, 7)]]
    _check([x, g, b], relay.nn.layer_norm(x, g, b), feeds, _layer_norm, rtol=1e-4, atol=1e-4)


def test_layer_norm_over_a_symbolic_axis() -> None:
    # the generic compute: the mean's divisor is the size variable
    x = relay.var("x", shape=(3, "s"))
    g, b = relay.var("g", shape=("s",)), relay.var("b", shape=("s",))
    feeds = [{"x": _rand(3, s), "g": _rand(s), "b": _rand(s)} for s in (2, 9, 40)]
    _check([x, g, b], relay.nn.layer_norm(x, g, b), feeds, _layer_norm, rtol=1e-4, atol=1e-4)


def test_batch_norm_per_channel_of_a_symbolic_batch() -> None:
    x = relay.var("x", shape=("n", 3, 5, 5))
    ps = [relay.var(name, shape=(3,)) for name in ("gamma", "beta", "mean", "var")]
    pv = {"gamma": _rand(3), "beta": _rand(3), "mean": _rand(3), "var": np.abs(_rand(3)) + 0.5}

    def reference(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, mean: np.ndarray,
                  var: np.ndarray) -> np.ndarray:
        c = (slice(None), None, None)
        return np.asarray((x - mean[c]) / np.sqrt(var[c] + 1e-5) * gamma[c] + beta[c])

    feeds = [{"x": _rand(n, 3, 5, 5), **pv} for n in (1, 2, 9)]
    _check([x, *ps], relay.TupleGetItem(relay.nn.batch_norm(x, *ps), 0), feeds, reference, rtol=1e-5, atol=1e-5)


# --- bias_add, activations, dropout, pad -----------------------------------------------------------


def test_bias_add_gelu_relu_and_dropout_of_a_symbolic_batch_and_sequence() -> None:
    x = relay.var("x", shape=("n", "s", 64))
    b = relay.var("b", shape=(64,))
    y = relay.nn.bias_add(x, b, axis=-1)
    body = relay.Tuple([relay.nn.gelu(y), relay.nn.relu(relay.TupleGetItem(relay.nn.dropout(y), 0)),
                        relay.nn.leaky_relu(y, alpha=0.1)])
    erf = np.vectorize(math.erf, otypes=[np.float64])

    def reference(x: np.ndarray, b: np.ndarray) -> list[np.ndarray]:
        y = x + b
        return [0.5 * y * (1 + erf(y / math.sqrt(2))), np.maximum(y, 0), np.where(y > 0, y, 0.1 * y)]

    bv = _rand(64)
    feeds = [{"x": _rand(n, s, 64), "b": bv} for n, s in [(1, 1), (2, 3), (4, 9)]]
    _check([x, b], body, feeds, reference, atol=1e-5)


def test_pad_of_a_symbolic_batch_in_constant_and_reflect_modes() -> None:
    x = relay.var("x", shape=("n", 5))
    body = relay.Tuple([relay.nn.pad(x, ((0, 0), (2, 1)), pad_value=1.5),
                        relay.nn.pad(x, ((0, 0), (2, 3)), pad_mode="reflect")])
    feeds = [{"x": _rand(n, 5)} for n in (1, 4, 21)]
    _check([x], body, feeds, lambda x: [np.pad(x, ((0, 0), (2, 1)), constant_values=1.5),
                                        np.pad(x, ((0, 0), (2, 3)), mode="reflect")])


# --- reductions ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("op", "fn"), [("sum", np.sum), ("mean", np.mean), ("max", np.max), ("min", np.min),
                                        ("prod", np.prod)])
def test_reductions_over_a_static_and_over_a_symbolic_axis(op: str, fn: Callable[..., Any]) -> None:
    x = relay.var("x", shape=("n", 6, "s"))
    reduce = getattr(relay, op)
    body = relay.Tuple([reduce(x, axis=1), reduce(x, axis=2, keepdims=True), reduce(x, axis=(0, 2))])
    feeds = [{"x": _rand(n, 6, s)} for n, s in [(1, 1), (2, 5), (3, 17)]]
    _check([x], body, feeds, lambda x: [fn(x, axis=1), fn(x, axis=2, keepdims=True), fn(x, axis=(0, 2))],
           rtol=1e-4, atol=1e-5)


def test_integer_mean_over_a_symbolic_axis_truncates() -> None:
    x = relay.var("x", shape=(2, "s"), dtype="int32")
    feeds = [{"x": RNG.integers(-50, 50, (2, s)).astype(np.int32)} for s in (1, 3, 7)]
    _check([x], relay.mean(x, axis=1), feeds,
           lambda x: np.trunc(x.astype(np.float64).sum(1) / x.shape[1]).astype(np.int32))


def test_argmax_and_argmin_over_static_symbolic_and_all_axes() -> None:
    x = relay.var("x", shape=("n", 6))
    body = relay.Tuple([relay.argmax(x, axis=1), relay.argmin(x, axis=0), relay.argmax(x),
                        relay.argmin(x, axis=1, select_last_index=True)])

    def reference(x: np.ndarray) -> list[np.ndarray]:
        last = x.shape[1] - 1 - np.argmin(x[:, ::-1], axis=1)
        return [np.argmax(x, 1), np.argmin(x, 0), np.asarray(np.argmax(x)), last]

    feeds = [{"x": np.round(_rand(n, 6) * 2)} for n in (1, 3, 17)]  # rounded: ties
    _check([x], body, feeds, lambda x: [v.astype(np.int32) for v in reference(x)])


def test_cumsum_and_cumprod_along_a_static_axis_of_a_symbolic_batch() -> None:
    x = relay.var("x", shape=("n", 6))
    y = relay.var("y", shape=("n", 300))  # a long axis: scanned in blocks
    body = relay.Tuple([relay.cumsum(x, axis=1, exclusive=True), relay.cumprod(x, axis=1, reverse=True),
                        relay.cumsum(y, axis=1)])

    def reference(x: np.ndarray, y: np.ndarray) -> list[np.ndarray]:
        exclusive = np.concatenate([np.zeros((x.shape[0], 1), x.dtype), np.cumsum(x, 1)[:, :-1]], axis=1)
        return [exclusive, np.cumprod(x[:, ::-1], 1)[:, ::-1], np.cumsum(y, 1)]

    feeds = [{"x": _rand(n, 6), "y": _rand(n, 300)} for n in (1, 3, 17)]
    _check([x, y], body, feeds, reference, rtol=1e-4, atol=1e-4)


# --- losses ----------------------------------------------------------------------------------------


def test_softmax_cross_entropy_and_nll_loss_of_a_symbolic_batch() -> None:
    x = relay.var("x", shape=("n", 10))
    labels = relay.var("labels", shape=("n",), dtype="int64")
    w = relay.var("w", shape=(10,))
    body = relay.Tuple([relay.nn.softmax_cross_entropy(x, labels, w, ignore_index=3),
                        relay.nn.nll_loss(x, labels, reduction="none"),
                        relay.nn.softmax_cross_entropy(x, labels, reduction="sum")])
    wv = np.abs(_rand(10)) + 0.1

    def reference(x: np.ndarray, labels: np.ndarray, w: np.ndarray) -> list[np.ndarray]:
        rows = np.arange(len(labels))
        logp = np.log(_softmax(x.astype(np.float64)))
        counted = labels != 3
        weights = np.where(counted, w[labels], 0)
        mean = -(weights * logp[rows, labels]).sum() / weights.sum()
        return [np.asarray(mean), -x[rows, labels], np.asarray(-logp[rows, labels].sum())]

    feeds = [{"x": _rand(n, 10), "labels": np.array(labels, np.int64), "w": wv}
             for n, labels in [(1, [0]), (3, [1, 9, 3]), (17, [(5 * i) % 10 for i in range(17)])]]
    _check([x, labels, w], body, feeds, reference, rtol=1e-4, atol=1e-5)


# --- the injective schedule with symbolic dims -----------------------------------------------------


def _loops(shape: Sequence[int | str]) -> tuple[list[For], str]:
    """The loops of `exp` of a tensor of `shape` scheduled by `schedule_injective_stage`, optimized as
    compiled kernels are, and its loop IR."""
    dims = [d if isinstance(d, int) else SizeVar(d) for d in shape]
    with te.size_vars():
        x = te.placeholder(dims, name="x")
        y = te.compute(x.shape, lambda *i: te.exp(x[i]), name="y")
        sch = te.create_schedule([y])
        schedule_injective_stage(sch, y)
        func = optimize_tir(te.lower(sch, [x, y], name="k"))  # as lowering does: the tail partitioned
    loops: list[For] = []
    post_order_visit(func.body, lambda node: loops.append(node) if isinstance(node, For) else None)
    return loops, str(func)


def _static(extent: Any) -> int | None:
    value = getattr(extent, "value", None)
    return value if isinstance(value, int) else None


@pytest.mark.parametrize("shape", [("n", 768), ("n", "s", 768), ("n", 4, 5)])
def test_the_injective_schedule_takes_symbolic_leading_dims_as_rows_on_the_cores(shape) -> None:
    loops, text = _loops(shape)
    parallel = [f for f in loops if f.kind is ForKind.PARALLEL]
    vectorized = [f for f in loops if f.kind is ForKind.VECTORIZED]
    assert len(parallel) == 1 and _static(parallel[0].extent) is None  # the rows, a symbolic count
    assert vectorized and all(_static(f.extent) in (16, 20) for f in vectorized)  # along a static row
    assert "// n" not in text and "% n" not in text  # no division by the batch per element


@pytest.mark.parametrize("shape", [(3, "n"), ("n", "s"), (1, "n")])
def test_the_injective_schedule_splits_a_symbolic_last_dim_into_vectors_and_a_tail(shape) -> None:
    loops, text = _loops(shape)
    vectorized = [f for f in loops if f.kind is ForKind.VECTORIZED]
    assert any(_static(f.extent) == 16 for f in vectorized)  # whole vectors
    assert any(_static(f.extent) is None for f in vectorized)  # the tail, a loop of its own
    assert any(f.kind is ForKind.PARALLEL for f in loops)
    last = shape[-1]
    assert f"// {last}" not in text and f"% {last}" not in text  # the index is not a quotient by the size


@pytest.mark.parametrize(("shape", "sizes"), [
    (("n", 768), [(1,), (3,), (17,)]),
    (("n", "s", 768), [(1, 1), (2, 3), (3, 5)]),
    ((3, "n"), [(1,), (16,), (37,)]),
])
def test_injective_groups_with_symbolic_dims_match_numpy(shape, sizes) -> None:
    x = relay.var("x", shape=shape)
    b = relay.var("b", shape=(shape[-1],) if isinstance(shape[-1], int) else (3, 1))
    body = relay.exp(relay.add(relay.multiply(x, relay.const(0.5)), b))

    def concrete(values: tuple[int, ...]) -> tuple[int, ...]:
        it = iter(values)
        return tuple(d if isinstance(d, int) else next(it) for d in shape)

    bv = _rand(*(shape[-1],)) if isinstance(shape[-1], int) else _rand(3, 1)
    feeds = [{"x": _rand(*concrete(v)), "b": bv} for v in sizes]
    _check([x, b], body, feeds, lambda x, b: np.exp(x * 0.5 + b))
