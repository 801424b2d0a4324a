"""Fusion end to end: the groups relay.build fuses, compiled and run against numpy.

Each test checks two things about one model: which ops share a primitive
function after relay.build's own passes (the groups it compiles), and what the
compiled kernels compute, through `relay.build(func, params=...)` →
`lib.create_executor()` → `ex(**inputs)`, against a numpy reference. A group is
one kernel launch, so the launches of the built graph are counted too.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pytest

from kiln import relay
from kiln.ir.module import IRModule
from kiln.ir.transform import PassContext
from kiln.registry import Op
from kiln.relay.backend.build_module import optimize
from kiln.relay.expr import Call, Expr, Function, Var
from kiln.relay.transform import fusion_report
from kiln.relay.visitor import post_order
from kiln.runtime import Library

RNG = np.random.default_rng(5)
SQRT2 = math.sqrt(2.0)
_erf = np.vectorize(math.erf, otypes=[np.float64])


def rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype("float32")


def compiled_groups(
    func: Function, params: Mapping[str, np.ndarray] | None = None, config: Mapping[str, Any] | None = None
) -> list[list[str]]:
    """The ops of each primitive function relay.build compiles for `func`, groups in post order.

    Runs what relay.build runs before lowering: params bound, then its pass pipeline.
    """
    with PassContext(opt_level=3, verify=True, config=dict(config or {})):
        main = optimize(func, params)["main"]
    assert isinstance(main, Function)
    groups = []
    for node in post_order(main.body):
        if isinstance(node, Call) and isinstance(node.op, Function) and node.op.is_primitive:
            groups.append([n.op.name for n in post_order(node.op.body) if isinstance(n, Call) and isinstance(n.op, Op)])
    return groups


def build(
    func: Function, params: Mapping[str, np.ndarray] | None = None, config: Mapping[str, Any] | None = None
) -> Library:
    with PassContext(verify=True, config=dict(config or {})):
        return relay.build(func, params=params)


def reported_groups(func: Function) -> list[list[str]]:
    """The groups fusion_report announces for `func` (no params, so no pass changes it before fusion)."""
    return [list(g.ops) for g in fusion_report(IRModule.from_expr(func)).groups if g.primitive]


def temps(lib: Library) -> int:
    """How many intermediate values pass between kernels."""
    return sum(s.kind == "temp" for s in lib.graph.slots)


def conv2d_nchw(x: np.ndarray, w: np.ndarray, pad: int) -> np.ndarray:
    xp = np.pad(x.astype(np.float64), [(0, 0), (0, 0), (pad, pad), (pad, pad)])
    kh, kw = w.shape[2:]
    windows = np.lib.stride_tricks.sliding_window_view(xp, (kh, kw), axis=(2, 3))  # n c oh ow kh kw
    return np.asarray(np.einsum("ncyxij,ocij->noyx", windows, w.astype(np.float64)))


def gelu(h: np.ndarray) -> np.ndarray:
    return np.asarray(0.5 * h * (1.0 + _erf(h / SQRT2)))


# ---------------------------------------------------------------------------
# One kernel per fusable pattern
# ---------------------------------------------------------------------------


def test_conv2d_bias_add_relu_runs_as_one_kernel() -> None:
    x, w, b = relay.var("x", shape=(1, 3, 8, 8)), relay.var("w", shape=(4, 3, 3, 3)), relay.var("b", shape=(4,))
    func = relay.Function([x, w, b], relay.nn.relu(relay.nn.bias_add(relay.nn.conv2d(x, w, padding=(1, 1)), b)))
    params = {"w": rand(4, 3, 3, 3), "b": rand(4)}
    assert compiled_groups(func, params) == [["nn.conv2d", "nn.bias_add", "nn.relu"]]
    lib = build(func, params)
    assert len(lib.kernels) == 1 and temps(lib) == 0
    (launch,) = lib.graph.launches  # reads the input, the weights and the bias; writes the relu
    slots = [lib.graph.slots[s] for s in (*launch.inputs, *launch.outputs)]
    assert [(s.kind, s.shape) for s in slots] == [
        ("input", (1, 3, 8, 8)), ("const", (4, 3, 3, 3)), ("const", (4,)), ("output", (1, 4, 8, 8))
    ]
    data = rand(1, 3, 8, 8)
    want = np.maximum(conv2d_nchw(data, params["w"], pad=1) + params["b"].reshape(1, 4, 1, 1), 0)
    assert (want == 0).any() and (want > 0).any()  # relu clips some values and keeps others
    np.testing.assert_allclose(lib.create_executor()(x=data), want, rtol=1e-5, atol=1e-5)


def _dense_bias(x: Var, w: Var, b: Var) -> Expr:
    return relay.nn.bias_add(relay.nn.dense(x, w), b)


def _gelu_op(h: Expr) -> Expr:
    return relay.nn.gelu(h)


def _gelu_written_out(h: Expr) -> Expr:
    """gelu(h) = 0.5 h (1 + erf(h / sqrt 2)), as a user without the op writes it: h feeds two branches."""
    erf = relay.erf(relay.multiply(h, relay.const(np.float32(1 / SQRT2))))
    return relay.multiply(relay.multiply(h, relay.const(np.float32(0.5))), relay.add(erf, relay.const(np.float32(1))))


@pytest.mark.parametrize(
    ("epilogue", "ops"),
    [
        (_gelu_op, ["nn.dense", "nn.bias_add", "nn.gelu"]),
        (_gelu_written_out, ["nn.dense", "nn.bias_add", "multiply", "multiply", "erf", "add", "multiply"]),
    ],
    ids=["gelu_op", "gelu_from_erf"],
)
def test_dense_bias_add_gelu_runs_as_one_kernel(epilogue: Callable[[Expr], Expr], ops: list[str]) -> None:
    x, w, b = relay.var("x", shape=(4, 16)), relay.var("w", shape=(8, 16)), relay.var("b", shape=(8,))
    func = relay.Function([x, w, b], epilogue(_dense_bias(x, w, b)))
    params = {"w": rand(8, 16) * 0.5, "b": rand(8)}
    assert compiled_groups(func, params) == [ops]  # the whole epilogue, erf branch included
    lib = build(func, params)
    assert len(lib.kernels) == 1 and len(lib.graph.launches) == 1 and temps(lib) == 0
    data = rand(4, 16)
    want = gelu(data.astype(np.float64) @ params["w"].T + params["b"])
    np.testing.assert_allclose(lib.create_executor()(x=data), want, rtol=1e-5, atol=1e-5)


def test_chain_of_injective_ops_runs_as_one_kernel() -> None:
    x, y = relay.var("x", shape=(4, 8)), relay.var("y", shape=(4, 8))
    c = rand(8)
    t = relay.transpose(relay.reshape(x, (8, 4)))  # (4, 8), a real permutation of x's elements
    body = relay.reshape(relay.exp(relay.multiply(relay.add(t, relay.const(c)), y)), (2, 16))
    func = relay.Function([x, y], body)
    ops = ["reshape", "transpose", "add", "multiply", "exp", "reshape"]
    assert compiled_groups(func) == [ops] == reported_groups(func)
    lib = build(func)
    assert len(lib.kernels) == 1 and len(lib.graph.launches) == 1 and temps(lib) == 0
    a, b = rand(4, 8), rand(4, 8) * 0.5
    want = np.exp((a.reshape(8, 4).T + c) * b).reshape(2, 16)
    np.testing.assert_allclose(lib.create_executor()(x=a, y=b), want, rtol=1e-5, atol=1e-6)


def _sum_exp(x: Var) -> tuple[Expr, list[str], Callable[[np.ndarray], np.ndarray]]:
    body = relay.sum(relay.exp(relay.multiply(x, relay.const(np.float32(2)))), axis=1)
    return body, ["multiply", "exp", "sum"], lambda a: np.exp(a * 2.0).sum(axis=1)


def _mean_of_broadcast(x: Var) -> tuple[Expr, list[str], Callable[[np.ndarray], np.ndarray]]:
    c = rand(8)
    body = relay.mean(relay.nn.relu(relay.add(x, relay.const(c))), axis=0, keepdims=True)
    return body, ["add", "nn.relu", "mean"], lambda a: np.maximum(a + c, 0).mean(axis=0, keepdims=True)


@pytest.mark.parametrize("model", [_sum_exp, _mean_of_broadcast], ids=["sum_exp", "mean_relu_broadcast"])
def test_reduction_runs_in_one_kernel_with_its_elementwise_inputs(
    model: Callable[[Var], tuple[Expr, list[str], Callable[[np.ndarray], np.ndarray]]],
) -> None:
    x = relay.var("x", shape=(4, 8))
    body, ops, ref = model(x)
    func = relay.Function([x], body)
    assert compiled_groups(func) == [ops] == reported_groups(func)
    lib = build(func)
    assert len(lib.kernels) == 1 and len(lib.graph.launches) == 1 and temps(lib) == 0
    a = rand(4, 8)
    np.testing.assert_allclose(lib.create_executor()(x=a), ref(a.astype(np.float64)), rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------
# Where fusion stops, and that the pieces still compute the model
# ---------------------------------------------------------------------------


def _add_relu(s: Expr) -> tuple[Expr, list[str], Callable[[np.ndarray], np.ndarray]]:
    body = relay.nn.relu(relay.add(s, relay.const(np.float32(-20))))
    return body, ["add", "nn.relu"], lambda v: np.maximum(v - 20, 0)


def _reshape_negative(s: Expr) -> tuple[Expr, list[str], Callable[[np.ndarray], np.ndarray]]:
    return relay.negative(relay.reshape(s, (2, 2))), ["reshape", "negative"], lambda v: -v.reshape(2, 2)


@pytest.mark.parametrize("consumer", [_add_relu, _reshape_negative], ids=["elementwise", "injective"])
def test_ops_after_a_reduction_get_their_own_kernel(
    consumer: Callable[[Expr], tuple[Expr, list[str], Callable[[np.ndarray], np.ndarray]]],
) -> None:
    x = relay.var("x", shape=(4, 8))
    body, ops, ref = consumer(relay.sum(relay.exp(relay.multiply(x, relay.const(np.float32(2)))), axis=1))
    func = relay.Function([x], body)
    assert compiled_groups(func) == [["multiply", "exp", "sum"], ops] == reported_groups(func)
    (boundary,) = fusion_report(IRModule.from_expr(func)).boundaries
    assert boundary.reason == "a reduction fuses with its elementwise inputs, never with its consumers"
    lib = build(func)
    assert len(lib.graph.launches) == 2 and temps(lib) == 1  # the sums go from one kernel to the next
    a = np.linspace(-1, 1.5, 32, dtype="float32").reshape(4, 8)  # not the shared RNG: some draws relu to all 0
    want = ref(np.exp(a.astype(np.float64) * 2).sum(axis=1))
    assert (want != 0).any()
    np.testing.assert_allclose(lib.create_executor()(x=a), want, rtol=1e-5, atol=1e-5)


def test_value_read_by_a_reduction_and_an_elementwise_op_is_computed_once_in_its_own_kernel() -> None:
    x = relay.var("x", shape=(4, 8))
    e = relay.exp(x)  # two consumers, whose paths meet at add only through the reduction
    func = relay.Function([x], relay.add(relay.sum(e, axis=1, keepdims=True), relay.negative(e)))
    assert compiled_groups(func) == [["exp"], ["sum"], ["negative", "add"]] == reported_groups(func)
    reasons = {(b.producer, b.consumer): b.reason for b in fusion_report(IRModule.from_expr(func)).boundaries}
    assert reasons[("exp (elemwise)", "negative (elemwise)")].endswith(
        "the way to its post-dominator add passes through sum (comm-reduce)"
    )
    lib = build(func)
    assert len(lib.graph.launches) == 3
    a = rand(4, 8).astype(np.float64)
    want = np.exp(a).sum(axis=1, keepdims=True) - np.exp(a)
    np.testing.assert_allclose(lib.create_executor()(x=a.astype("float32")), want, rtol=1e-5, atol=1e-5)


def test_elementwise_branches_that_meet_again_run_as_one_kernel() -> None:
    x = relay.var("x", shape=(4, 8))
    e = relay.exp(x)
    func = relay.Function([x], relay.add(relay.tanh(e), relay.negative(e)))
    assert compiled_groups(func) == [["exp", "tanh", "negative", "add"]] == reported_groups(func)
    lib = build(func)
    assert len(lib.graph.launches) == 1 and temps(lib) == 0
    a = rand(4, 8).astype(np.float64)
    np.testing.assert_allclose(lib.create_executor()(x=a.astype("float32")), np.tanh(np.exp(a)) - np.exp(a),
                               rtol=1e-5, atol=1e-5)


def test_value_that_is_also_a_model_output_ends_its_group() -> None:
    x = relay.var("x", shape=(4, 8))
    r = relay.nn.relu(relay.add(x, relay.const(np.float32(0.5))))
    func = relay.Function([x], relay.Tuple([r, relay.exp(r)]))
    assert compiled_groups(func) == [["add", "nn.relu"], ["exp"]] == reported_groups(func)
    lib = build(func)
    assert len(lib.graph.launches) == 2
    a = rand(4, 8)
    got_r, got_e = lib.create_executor()(x=a)
    want_r = np.maximum(a.astype(np.float64) + 0.5, 0)
    np.testing.assert_allclose(got_r, want_r, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got_e, np.exp(want_r), rtol=1e-5, atol=1e-6)


def test_a_fused_op_reading_one_field_of_a_split_gets_the_tuple_as_placeholders() -> None:
    x = relay.var("x", shape=(2, 5))
    s = relay.split(x, [1, 3], axis=1)
    func = relay.Function([x], relay.Tuple([relay.nn.relu(relay.TupleGetItem(s, 1)), relay.TupleGetItem(s, 2)]))
    lib = build(func)
    a = rand(2, 5)
    got_r, got_tail = lib.create_executor()(x=a)
    np.testing.assert_array_equal(got_r, np.maximum(a[:, 1:3], 0))
    np.testing.assert_array_equal(got_tail, a[:, 3:])


def test_injective_producer_of_a_reduction_gets_its_own_kernel() -> None:
    x = relay.var("x", shape=(4, 8))
    func = relay.Function([x], relay.sum(relay.transpose(x), axis=1))
    assert compiled_groups(func) == [["transpose"], ["sum"]] == reported_groups(func)
    lib = build(func)
    assert len(lib.graph.launches) == 2 and temps(lib) == 1
    a = rand(4, 8)
    np.testing.assert_allclose(lib.create_executor()(x=a), a.astype(np.float64).T.sum(axis=1), rtol=1e-5, atol=1e-6)


def test_opaque_op_runs_alone_between_its_neighbours() -> None:
    x = relay.var("x", shape=(4, 8))
    func = relay.Function([x], relay.negative(relay.nn.softmax(relay.exp(relay.multiply(x, relay.const(0.5))))))
    assert compiled_groups(func) == [["multiply", "exp"], ["nn.softmax"], ["negative"]] == reported_groups(func)
    lib = build(func)
    assert len(lib.graph.launches) == 3 and temps(lib) == 2
    a = rand(4, 8)
    s = np.exp(np.exp(a.astype(np.float64) * 0.5))
    np.testing.assert_allclose(lib.create_executor()(x=a), -(s / s.sum(axis=1, keepdims=True)), rtol=1e-5, atol=1e-6)


def test_group_size_limit_splits_a_chain_into_kernels_of_that_size() -> None:
    x = relay.var("x", shape=(4, 8))
    y: Expr = x
    for i in range(10):
        y = relay.tanh(y) if i % 2 else relay.add(y, relay.const(np.float32(0.1 * i)))
    func = relay.Function([x], y)
    limit = {"relay.FuseOps.max_depth": 4}
    assert [len(g) for g in compiled_groups(func, config=limit)] == [4, 4, 2]
    lib = build(func, config=limit)
    assert len(lib.graph.launches) == 3 and temps(lib) == 2
    a = rand(4, 8)
    want = a.astype(np.float64)
    for i in range(10):
        want = np.tanh(want) if i % 2 else want + np.float32(0.1 * i)
    np.testing.assert_allclose(lib.create_executor()(x=a), want, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------
# A 10,000-op elementwise chain
# ---------------------------------------------------------------------------

Step = tuple[str, float]  # (op, constant operand; 0 where the op takes none)

# The chain's ops, as relay calls and as numpy (float64) functions of (value, constant, model input).
_CHAIN_OPS: dict[str, tuple[Callable[[Expr, Expr, Var], Expr], Callable[[Any, float, Any], Any]]] = {
    "add": (lambda y, c, x: relay.add(y, c), lambda y, c, x: y + c),
    "multiply": (lambda y, c, x: relay.multiply(y, c), lambda y, c, x: y * c),
    "subtract_from": (lambda y, c, x: relay.subtract(c, y), lambda y, c, x: c - y),
    "maximum": (lambda y, c, x: relay.maximum(y, c), lambda y, c, x: np.maximum(y, c)),
    "add_input": (lambda y, c, x: relay.add(y, x), lambda y, c, x: y + x),
    "negative": (lambda y, c, x: relay.negative(y), lambda y, c, x: -y),
    "abs": (lambda y, c, x: relay.abs(y), lambda y, c, x: np.abs(y)),
    "exp": (lambda y, c, x: relay.exp(y), lambda y, c, x: np.exp(y)),
    "log": (lambda y, c, x: relay.log(y), lambda y, c, x: np.log(y)),
    "tanh": (lambda y, c, x: relay.tanh(y), lambda y, c, x: np.tanh(y)),
    "sigmoid": (lambda y, c, x: relay.sigmoid(y), lambda y, c, x: 1 / (1 + np.exp(-y))),
    "nn.relu": (lambda y, c, x: relay.nn.relu(y), lambda y, c, x: np.maximum(y, 0)),
}
_TAKES_CONST = {"add", "multiply", "subtract_from", "maximum"}


def elementwise_chain(n: int, seed: int) -> list[Step]:
    """`n` elementwise ops in random short patterns, with random constants.

    Each pattern changes the value by about as much as its input changes: shifts,
    reflections and rescalings; exp undone by log; tanh in its linear range; sigmoid
    far into its exponential tail, undone by log; relu, abs and maximum on the side
    of their threshold where they pass the value on. So the value wanders (within
    about ±30) but never forgets: the output moves with every op of the chain, and an
    error in any kernel shows at the end.
    """
    rng = np.random.default_rng(seed)

    def f32(v: float) -> float:
        return float(np.float32(v))

    def rescale() -> list[Step]:
        s = f32(rng.choice([-1, 1]) * rng.uniform(0.5, 2))
        return [("multiply", s), ("add", f32(rng.uniform(-0.25, 0.25))), ("multiply", f32(1 / s))]

    patterns: dict[str, Callable[[], list[Step]]] = {
        "shift": lambda: [("add", f32(rng.uniform(-0.25, 0.25)))],
        "negate": lambda: [("negative", 0.0)],
        "reflect": lambda: [("subtract_from", f32(rng.uniform(-0.25, 0.25)))],
        "rescale": rescale,
        "exp_log": lambda: [("exp", 0.0), ("multiply", f32(rng.uniform(0.5, 2))), ("log", 0.0)],
        "tanh": lambda: [("multiply", 0.001), ("tanh", 0.0), ("multiply", 1000.0)],
        "sigmoid_log": lambda: [("add", -30.0), ("sigmoid", 0.0), ("log", 0.0), ("add", 30.0)],
        "relu": lambda: [("add", 64.0), ("nn.relu", 0.0), ("add", -64.0)],
        "abs": lambda: [("add", 64.0), ("abs", 0.0), ("add", -64.0)],
        "maximum": lambda: [("maximum", -64.0)],
        "residual": lambda: [("add_input", 0.0)],
    }
    names = list(patterns)
    weights = [0.2, 0.1, 0.15, 0.13, 0.1, 0.07, 0.05, 0.07, 0.04, 0.06, 0.03]
    steps: list[Step] = []
    while len(steps) < n:
        steps += patterns[names[rng.choice(len(names), p=weights)]]()
    return steps[:n]


def chain_expr(steps: list[Step], x: Var) -> Expr:
    y: Expr = x
    for op, c in steps:
        y = _CHAIN_OPS[op][0](y, relay.const(np.float32(c)) if op in _TAKES_CONST else y, x)
    return y


def chain_numpy(steps: list[Step], x: np.ndarray, start: np.ndarray | None = None) -> np.ndarray:
    """The chain in float64, from `start` (default: x), with x as the residual input."""
    x64 = x.astype(np.float64)
    y = x64 if start is None else start.astype(np.float64)
    for op, c in steps:
        y = _CHAIN_OPS[op][1](y, c, x64)
    return y


def test_a_10000_op_elementwise_chain_builds_runs_and_matches_numpy() -> None:
    steps = elementwise_chain(10_000, seed=1)
    assert {op for op, _ in steps} == set(_CHAIN_OPS)
    x = relay.var("x", shape=(4, 16))
    lib = build(relay.Function([x], chain_expr(steps, x)))
    # FuseOps cuts the chain every 256 ops (its default limit): 39 full groups and one of 16;
    # their constants differ, so no two are alike and each compiles to its own kernel
    assert len(lib.graph.launches) == 40 and len(lib.kernels) == 40
    assert len(lib.graph.storage_sizes) == 2  # a chain needs two intermediate buffers, used in turn
    a = np.random.default_rng(0).uniform(-1, 1, (4, 16)).astype("float32")
    ex = lib.create_executor()
    want = chain_numpy(steps, a)
    np.testing.assert_allclose(ex(x=a), want, rtol=0, atol=1e-3)  # float32 rounding over 10,000 ops: ~1.5e-4
    # the comparison covers the whole chain: a change of 1e-2 at its start moves every
    # output by more than five times the tolerance, so an error in any kernel would show
    moved = np.abs(chain_numpy(steps, a, start=a.astype(np.float64) + 1e-2) - want)
    assert moved.min() > 5e-3
    np.testing.assert_array_equal(ex(x=a), ex(x=a))  # a second run (reused buffers) gives the same


def test_a_10000_op_chain_of_one_repeated_cell_compiles_each_distinct_group_once() -> None:
    # an unrolled recurrent cell with shared weights, 8 ops a step:
    # y <- 0.25 - max(2 tanh(0.5 (0.9 (y + x) - 0.1)), -0.75);
    # 8 divides the group size, so the 38 groups between the first and the last are alike
    cell: list[Step] = [("add_input", 0.0), ("multiply", 0.9), ("add", -0.1), ("multiply", 0.5), ("tanh", 0.0),
                        ("multiply", 2.0), ("maximum", -0.75), ("subtract_from", 0.25)]
    steps = cell * 1250
    x = relay.var("x", shape=(4, 16))
    lib = build(relay.Function([x], chain_expr(steps, x)))
    assert len(lib.graph.launches) == 40
    assert len(lib.kernels) == 3  # the first group (reads only x), the 38 alike, the last 16 ops
    assert sorted(np.bincount([launch.kernel for launch in lib.graph.launches])) == [1, 1, 38]
    a = np.random.default_rng(0).uniform(-1, 1, (4, 16)).astype("float32")
    np.testing.assert_allclose(lib.create_executor()(x=a), chain_numpy(steps, a), rtol=1e-5, atol=1e-5)
