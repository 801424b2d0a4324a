"""The reference interpreter and the Relay passes relay.build runs.

Every pass is checked twice: on the IR it leaves (what is gone, how many calls
remain) and on numbers (the interpreter gives the same outputs before and
after the pass). All passes run under PassContext(verify=True).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pytest

from kiln import relay
from kiln.errors import KilnError
from kiln.ir.transform import Pass, PassContext, Sequential
from kiln.ir.types import TensorType, Type
from kiln.registry import Op, OpPattern, attr, register_op
from kiln.relay import transform
from kiln.relay.interpreter import InterpreterError
from kiln.relay.visitor import post_order

RNG = np.random.default_rng(7)


def _rand(*shape: int, positive: bool = False) -> np.ndarray[Any, Any]:
    data = RNG.random(shape) + 0.5 if positive else RNG.standard_normal(shape)
    return np.asarray(data, dtype="float32")


def _mod(params: list[relay.Var], body: relay.Expr) -> relay.IRModule:
    return relay.IRModule.from_expr(relay.Function(params, body))


def _ops(mod: relay.IRModule) -> Counter[str]:
    """How many calls of each op "main" holds."""
    return Counter(
        n.op.name for n in post_order(mod["main"]) if isinstance(n, relay.Call) and isinstance(n.op, Op)
    )


def _run(mod: relay.IRModule, *args: Any) -> Any:
    return relay.create_executor("debug", mod).evaluate()(*args)


def _apply(mod: relay.IRModule, *passes: Pass, opt_level: int = 3) -> relay.IRModule:
    with PassContext(opt_level=opt_level, verify=True):
        return Sequential(list(passes))(mod)


def _same_outputs(before: relay.IRModule, after: relay.IRModule, *args: Any, rtol: float = 1e-5) -> None:
    expected, got = _run(before, *args), _run(after, *args)
    if isinstance(expected, tuple):
        assert isinstance(got, tuple) and len(got) == len(expected)
        for e, g in zip(expected, got, strict=True):
            np.testing.assert_allclose(g, e, rtol=rtol, atol=rtol)
    else:
        np.testing.assert_allclose(got, expected, rtol=rtol, atol=rtol)


def _identity_rel(args: list[Type], attrs: Any) -> Type | None:
    return args[0] if isinstance(args[0], TensorType) else None


def _register_test_op(name: str, reference: Any, stateful: bool = False) -> None:
    entry = (
        register_op(name)
        .describe("a test op")
        .set_num_inputs(1)
        .add_argument("data", "Tensor", "the input")
        .add_type_rel("Identity", _identity_rel)
        .set_attr(attr.TOpPattern, OpPattern.OPAQUE)
    )
    if reference is not None:
        entry.set_attr(attr.FReference, reference)
    if stateful:
        entry.set_attr(attr.TOpIsStateful, True)


# ---------------------------------------------------------------------------
# The reference interpreter
# ---------------------------------------------------------------------------


def test_interpreter_matches_numpy_by_position_and_by_name() -> None:
    x, y = relay.var("x", shape=(2, 3)), relay.var("y", shape=(3,))
    mod = _mod([x, y], relay.nn.relu(relay.subtract(relay.multiply(x, y), relay.const(0.5))))
    a, b = _rand(2, 3), _rand(3)
    expected = np.maximum(a * b - 0.5, 0)
    ex = relay.create_executor("debug", mod)
    np.testing.assert_allclose(ex.evaluate()(a, b), expected, rtol=1e-6)
    np.testing.assert_allclose(ex(x=a, y=b), expected, rtol=1e-6)
    np.testing.assert_allclose(ex(a, y=b), expected, rtol=1e-6)
    assert relay.create_executor("debug", mod, params={"y": b})(a).dtype == np.float32


def test_interpreter_let_if_tuple_and_getitem() -> None:
    x = relay.var("x", shape=(3,))
    c = relay.var("c", shape=(), dtype="bool")
    t = relay.var("t")
    pair = relay.Tuple([relay.add(x, x), relay.multiply(x, x)])
    body = relay.Let(t, pair, relay.If(c, relay.TupleGetItem(t, 0), relay.TupleGetItem(t, 1)))
    mod = _mod([x, c], relay.Tuple([body, t]))
    a = _rand(3)
    out_true = _run(mod, a, np.array(True))
    out_false = _run(mod, a, np.array(False))
    np.testing.assert_allclose(out_true[0], a + a)
    np.testing.assert_allclose(out_false[0], a * a)
    assert isinstance(out_true[1], tuple) and len(out_true[1]) == 2


def test_interpreter_only_evaluates_the_taken_branch() -> None:
    def boom(attrs: Any, x: Any) -> Any:
        raise RuntimeError("the untaken branch ran")

    _register_test_op("test.boom", boom)
    x = relay.var("x", shape=(2,))
    c = relay.var("c", shape=(), dtype="bool")
    mod = _mod([x, c], relay.If(c, relay.negative(x), relay.Call(Op.get("test.boom"), [x])))
    np.testing.assert_allclose(_run(mod, np.ones(2, "float32"), np.array(True)), -np.ones(2))
    with pytest.raises(InterpreterError, match=r"op test\.boom failed .*untaken branch"):
        _run(mod, np.ones(2, "float32"), np.array(False))


def test_interpreter_calls_functions_closures_and_globals() -> None:
    x = relay.var("x", shape=(2,))
    p = relay.var("p", shape=(2,))
    closure = relay.Function([p], relay.multiply(p, x))  # captures %x
    f = relay.var("f")
    body = relay.Let(f, closure, relay.add(relay.Call(f, [x]), relay.Call(f, [relay.const(np.ones(2, "float32"))])))
    mod = _mod([x], body)
    q = relay.var("q", shape=(2,))
    mod["double"] = relay.Function([q], relay.add(q, q), ret_type=TensorType((2,), "float32"))
    y = relay.var("y", shape=(2,))
    mod["twice"] = relay.Function([y], relay.Call(mod.get_global_var("double"), [y]))
    a = _rand(2)
    np.testing.assert_allclose(_run(mod, a), a * a + a, rtol=1e-6)
    ex = relay.create_executor("debug", mod)
    np.testing.assert_allclose(ex.evaluate(mod.get_global_var("twice"))(a), 2 * a, rtol=1e-6)


def test_interpreter_evaluates_a_closed_expression_at_once() -> None:
    value = relay.create_executor("debug").evaluate(relay.add(relay.const(1.0), relay.const(2.0)))
    assert float(value) == 3.0


def test_interpreter_runs_a_10000_call_chain_and_let_chain() -> None:
    x = relay.var("x", shape=(2,))
    y: relay.Expr = x
    for _ in range(10_000):
        y = relay.add(y, relay.const(1.0))
    np.testing.assert_allclose(_run(_mod([x], y), np.zeros(2, "float32")), np.full(2, 10_000.0))
    body: relay.Expr = x
    lets = []
    for i in range(10_000):
        v = relay.var(f"v{i}")
        lets.append((v, relay.multiply(body, relay.const(1.0))))
        body = v
    for v, value in reversed(lets):
        body = relay.Let(v, value, body)
    np.testing.assert_allclose(_run(_mod([x], body), np.ones(2, "float32")), np.ones(2))


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda ex, a: ex.evaluate()(), r"needs input\(s\) %x \(Tensor\[\(2, 3\), float32\]\)"),
        (lambda ex, a: ex(a[:1]), r"input %x expects shape \(2, 3\), got an array of shape \(1, 3\)"),
        (lambda ex, a: ex(a.astype("float64")), r"input %x expects dtype float32, got an array of dtype float64"),
        (lambda ex, a: ex(a, a), r"takes 1 input\(s\) \(x\), got 2"),
        (lambda ex, a: ex(xx=a), r"has no input 'xx'.*did you mean"),
        (lambda ex, a: ex(a, x=a), r"given twice"),
    ],
)
def test_interpreter_refuses_bad_inputs(call: Any, match: str) -> None:
    x = relay.var("x", shape=(2, 3))
    ex = relay.create_executor("debug", _mod([x], relay.negative(x)))
    with pytest.raises(InterpreterError, match=match) as info:
        call(ex, _rand(2, 3))
    assert isinstance(info.value, KilnError)


def test_interpreter_refuses_unknown_kinds_and_ops_without_reference() -> None:
    with pytest.raises(InterpreterError, match="unknown executor kind 'vm'"):
        relay.create_executor("vm")
    _register_test_op("test.noref", None)
    x = relay.var("x", shape=(2,))
    mod = _mod([x], relay.Call(Op.get("test.noref"), [x]))
    with pytest.raises(InterpreterError, match=r"op test\.noref has no numpy reference"):
        _run(mod, np.ones(2, "float32"))


# ---------------------------------------------------------------------------
# SimplifyInference
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(("shape", "axis"), [((2, 4, 5, 5), 1), ((2, 5, 5, 4), 3), ((2, 5, 5, 4), -1), ((3, 4), 1)])
@pytest.mark.parametrize(("center", "scale"), [(True, True), (False, True), (True, False), (False, False)])
def test_simplify_inference_rewrites_batch_norm(shape: tuple[int, ...], axis: int, center: bool, scale: bool) -> None:
    c = shape[axis]
    x = relay.var("x", shape=shape)
    params = [relay.var(n, shape=(c,)) for n in ("gamma", "beta", "mean", "var")]
    bn = relay.nn.batch_norm(x, *params, axis=axis, epsilon=1e-3, center=center, scale=scale)
    before = _mod([x, *params], relay.TupleGetItem(bn, 0))
    after = _apply(before, transform.SimplifyInference(), opt_level=0)
    ops = _ops(after)
    assert "nn.batch_norm" not in ops
    assert ops["multiply"] >= 1 and ops["add"] >= 1
    assert ops["expand_dims"] == (0 if axis % len(shape) == len(shape) - 1 else 2)
    args = [_rand(*shape), _rand(c), _rand(c), _rand(c), _rand(c, positive=True)]
    _same_outputs(before, after, *args, rtol=1e-4)


def test_simplify_inference_keeps_batch_norm_tuple_outputs() -> None:
    x = relay.var("x", shape=(2, 3, 4))
    params = [relay.var(n, shape=(3,)) for n in ("gamma", "beta", "mean", "var")]
    before = _mod([x, *params], relay.nn.batch_norm(x, *params))
    after = _apply(before, transform.SimplifyInference())
    assert "nn.batch_norm" not in _ops(after)
    assert isinstance(after["main"].body, relay.Tuple)
    _same_outputs(before, after, _rand(2, 3, 4), _rand(3), _rand(3), _rand(3), _rand(3, positive=True), rtol=1e-4)


def test_simplify_inference_makes_dropout_the_identity() -> None:
    x = relay.var("x", shape=(4, 5))
    d = relay.nn.dropout(relay.exp(x), rate=0.3)
    before = _mod([x], relay.Tuple([relay.TupleGetItem(d, 0), relay.TupleGetItem(d, 1)]))
    after = _apply(before, transform.SimplifyInference())
    ops = _ops(after)
    assert "nn.dropout" not in ops and ops == Counter({"exp": 1, "ones_like": 1})
    _same_outputs(before, after, _rand(4, 5))
    whole = _mod([x], relay.nn.dropout(x))  # the tuple itself as the result
    _same_outputs(whole, _apply(whole, transform.SimplifyInference()), _rand(4, 5))


@pytest.mark.parametrize("axis", [-1, 1, 0])
@pytest.mark.parametrize(("center", "scale"), [(True, True), (False, False), (True, False)])
def test_simplify_inference_keeps_layer_norm(axis: int, center: bool, scale: bool) -> None:
    # layer_norm has its own kernel (one per call), where mean / variance ops would be four
    shape = (3, 4, 6)
    c = shape[axis]
    x, g, b = relay.var("x", shape=shape), relay.var("g", shape=(c,)), relay.var("b", shape=(c,))
    before = _mod([x, g, b], relay.nn.layer_norm(x, g, b, axis=axis, epsilon=1e-4, center=center, scale=scale))
    after = _apply(before, transform.SimplifyInference())
    assert _ops(after) == Counter({"nn.layer_norm": 1})
    args = [_rand(*shape), _rand(c), _rand(c)]
    _same_outputs(before, after, *args, rtol=1e-4)
    lib = relay.build(before)
    assert len(lib.graph.launches) == 1
    got = lib.create_executor()(x=args[0], g=args[1], b=args[2])
    np.testing.assert_allclose(got, _run(before, *args), rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------
# FoldConstant
# ---------------------------------------------------------------------------


def test_fold_constant_evaluates_constant_subgraphs() -> None:
    x = relay.var("x", shape=(2, 3))
    c = relay.multiply(relay.const(_rand(2, 3)), relay.exp(relay.const(_rand(3))))
    before = _mod([x], relay.add(x, relay.reshape(relay.transpose(c), (2, 3))))
    after = _apply(before, transform.FoldConstant())
    assert _ops(after) == Counter({"add": 1})
    assert isinstance(after["main"].body.args[1], relay.Constant)
    _same_outputs(before, after, _rand(2, 3))


def test_fold_constant_keeps_dtypes_and_folds_tuples() -> None:
    x = relay.var("x", shape=(4,), dtype="int32")
    parts = relay.split(relay.const(np.arange(8, dtype="int32")), 2)
    before = _mod([x], relay.add(x, relay.TupleGetItem(parts, 1)))
    after = _apply(before, transform.FoldConstant())
    assert _ops(after) == Counter({"add": 1})
    folded = after["main"].body.args[1]
    assert isinstance(folded, relay.Constant) and folded.data.dtype == np.int32
    np.testing.assert_array_equal(_run(after, np.zeros(4, "int32")), [4, 5, 6, 7])
    _same_outputs(before, after, np.arange(4, dtype="int32"))


def test_fold_constant_inlines_constant_let_bindings() -> None:
    x = relay.var("x", shape=(3,))
    k = relay.var("k")
    body = relay.Let(k, relay.add(relay.const(np.ones(3, "float32")), relay.const(1.0)),
                     relay.multiply(x, relay.sqrt(k)))
    before = _mod([x], body)
    after = _apply(before, transform.FoldConstant())
    assert not any(isinstance(n, relay.Let) for n in post_order(after["main"]))
    assert _ops(after) == Counter({"multiply": 1})
    _same_outputs(before, after, _rand(3))


def test_fold_constant_never_folds_stateful_ops() -> None:
    _register_test_op("test.random", lambda attrs, x: x + 1, stateful=True)
    x = relay.var("x", shape=(2,))
    before = _mod([x], relay.add(x, relay.Call(Op.get("test.random"), [relay.const(np.zeros(2, "float32"))])))
    after = _apply(before, transform.FoldConstant())
    assert _ops(after) == Counter({"add": 1, "test.random": 1})


def test_fold_constant_runs_from_opt_level_2() -> None:
    x = relay.var("x", shape=(2,))
    before = _mod([x], relay.add(x, relay.add(relay.const(1.0), relay.const(2.0))))
    assert _ops(_apply(before, transform.FoldConstant(), opt_level=1))["add"] == 2
    assert _ops(_apply(before, transform.FoldConstant(), opt_level=2))["add"] == 1
    with PassContext(opt_level=3, disabled_pass=["FoldConstant"]):
        assert _ops(transform.FoldConstant()(before))["add"] == 2


# ---------------------------------------------------------------------------
# EliminateCommonSubexpr
# ---------------------------------------------------------------------------


def test_cse_merges_equal_calls_bottom_up() -> None:
    x = relay.var("x", shape=(2, 3))

    def branch() -> relay.Expr:
        return relay.nn.relu(relay.add(relay.exp(x), relay.const(1.0)))

    before = _mod([x], relay.Tuple([relay.add(branch(), branch()), relay.sum(branch(), axis=1)]))
    assert _ops(before) == Counter({"add": 4, "exp": 3, "nn.relu": 3, "sum": 1})
    after = _apply(before, transform.EliminateCommonSubexpr())
    assert _ops(after) == Counter({"add": 2, "exp": 1, "nn.relu": 1, "sum": 1})
    _same_outputs(before, after, _rand(2, 3))


def test_cse_keeps_calls_with_other_attrs_and_stateful_calls() -> None:
    _register_test_op("test.rand", lambda attrs, x: x, stateful=True)
    x = relay.var("x", shape=(2, 3))
    rand = Op.get("test.rand")
    before = _mod([x], relay.Tuple([
        relay.sum(x, axis=0), relay.sum(x, axis=1), relay.sum(x, axis=0),
        relay.Call(rand, [x]), relay.Call(rand, [x]),
    ]))
    after = _apply(before, transform.EliminateCommonSubexpr())
    assert _ops(after) == Counter({"sum": 2, "test.rand": 2})
    assert _ops(_apply(before, transform.EliminateCommonSubexpr(), opt_level=2))["sum"] == 3


# ---------------------------------------------------------------------------
# DeadCodeElimination
# ---------------------------------------------------------------------------


def _lets(mod: relay.IRModule) -> list[str]:
    return [n.var.name_hint for n in post_order(mod["main"]) if isinstance(n, relay.Let)]


def test_dce_removes_unused_bindings_in_chains() -> None:
    x = relay.var("x", shape=(3,))
    a, b, c = relay.var("a"), relay.var("b"), relay.var("c")
    # c is used; b is used only by a's value; a is unused, so a and then b are dead
    body = relay.Let(c, relay.exp(x),
                     relay.Let(b, relay.negative(x),
                               relay.Let(a, relay.add(b, c), relay.multiply(c, x))))
    before = _mod([x], body)
    after = _apply(before, transform.DeadCodeElimination())
    assert _lets(after) == ["c"]
    assert _ops(after) == Counter({"exp": 1, "multiply": 1})
    _same_outputs(before, after, _rand(3))


def test_dce_drops_untaken_constant_branches_and_tuple_fields() -> None:
    x = relay.var("x", shape=(3,))
    pick = relay.If(relay.const(False), relay.exp(x), relay.negative(x))
    before = _mod([x], relay.add(pick, relay.TupleGetItem(relay.Tuple([relay.sqrt(x), relay.abs(x)]), 1)))
    after = _apply(before, transform.DeadCodeElimination())
    assert _ops(after) == Counter({"add": 1, "negative": 1, "abs": 1})
    assert not any(isinstance(n, relay.If | relay.Tuple) for n in post_order(after["main"]))
    _same_outputs(before, after, _rand(3, positive=True))


def test_dce_keeps_bindings_of_stateful_calls() -> None:
    _register_test_op("test.effect", lambda attrs, x: x, stateful=True)
    x = relay.var("x", shape=(3,))
    e, u = relay.var("e"), relay.var("u")
    body = relay.Let(e, relay.Call(Op.get("test.effect"), [x]), relay.Let(u, relay.exp(x), x))
    after = _apply(_mod([x], body), transform.DeadCodeElimination())
    assert _lets(after) == ["e"]


# ---------------------------------------------------------------------------
# FoldScaleAxis
# ---------------------------------------------------------------------------


def _bn_params(c: int) -> list[relay.Constant]:
    return [relay.const(_rand(c, positive=True)), relay.const(_rand(c)), relay.const(_rand(c)),
            relay.const(_rand(c, positive=True))]


_INFERENCE = (transform.SimplifyInference, transform.FoldConstant, transform.FoldScaleAxis, transform.FoldConstant)


def test_conv2d_batch_norm_becomes_conv2d_plus_constant_bias() -> None:
    x = relay.var("x", shape=(2, 3, 8, 8))
    conv = relay.nn.conv2d(x, relay.const(_rand(4, 3, 3, 3)), padding=(1, 1))
    bn = relay.TupleGetItem(relay.nn.batch_norm(conv, *_bn_params(4)), 0)
    before = _mod([x], relay.nn.relu(bn))
    after = _apply(before, *(p() for p in _INFERENCE))
    assert _ops(after) == Counter({"nn.conv2d": 1, "add": 1, "nn.relu": 1})
    add = after["main"].body.args[0]
    assert add.op.name == "add" and isinstance(add.args[1], relay.Constant) and add.args[1].data.shape == (4, 1, 1)
    assert isinstance(add.args[0].args[1], relay.Constant)
    _same_outputs(before, after, _rand(2, 3, 8, 8), rtol=1e-4)


def test_batch_norm_with_infinite_constant_scale_keeps_the_formulas_infinities() -> None:
    # x*scale + (beta - mean*scale) is inf - inf = nan where (x - mean)*scale + beta is +-inf: with
    # constants whose folded scale is not finite, SimplifyInference keeps the formula as written.
    x = relay.var("x", shape=(1, 2, 4, 4))
    gamma = np.array([-np.inf, 1.0], "float32")
    mean = np.array([0.25, 0.0], "float32")
    params = [relay.const(gamma), relay.const(_rand(2)), relay.const(mean), relay.const(np.ones(2, "float32"))]
    bn = relay.TupleGetItem(relay.nn.batch_norm(x, *params, epsilon=1e-5), 0)
    before = _mod([x], bn)
    after = _apply(before, *(p() for p in _INFERENCE))
    data = _rand(1, 2, 4, 4)
    data[0, 0, 0, :2] = 0.25  # x == mean: 0 * -inf is nan in the formula too
    scale = gamma / np.sqrt(np.float32(1 + 1e-5))
    with np.errstate(invalid="ignore"):
        expected = (data - mean[:, None, None]) * scale[:, None, None] + params[1].data[:, None, None]
        got = np.asarray(relay.build(after["main"]).create_executor()(x=data))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
    finite = ~np.isnan(expected)
    np.testing.assert_allclose(got[finite], expected[finite], rtol=1e-5)
    assert np.isinf(got[0, 0]).sum() == 14


@pytest.mark.parametrize("scale_shape", [(4, 1, 1), (1, 4, 1, 1), (), (1,)])
def test_fold_scale_axis_folds_conv2d_scales_and_biases(scale_shape: tuple[int, ...]) -> None:
    x = relay.var("x", shape=(1, 2, 5, 5))
    conv = relay.nn.conv2d(x, relay.const(_rand(4, 2, 3, 3)), groups=1)
    biased = relay.add(conv, relay.const(_rand(4, 1, 1)))
    scaled = relay.multiply(relay.const(_rand(*scale_shape)), biased)
    before = _mod([x], relay.multiply(scaled, relay.const(_rand(1, 4, 1, 1))))  # two scales fold in turn
    after = _apply(before, transform.FoldScaleAxis())
    assert _ops(after) == Counter({"nn.conv2d": 1, "add": 1})
    _same_outputs(before, after, _rand(1, 2, 5, 5), rtol=1e-4)


def test_fold_scale_axis_folds_dense_with_bias_add() -> None:
    x = relay.var("x", shape=(3, 5))
    dense = relay.nn.bias_add(relay.nn.dense(x, relay.const(_rand(6, 5))), relay.const(_rand(6)), axis=1)
    before = _mod([x], relay.multiply(dense, relay.const(_rand(6))))
    after = _apply(before, transform.FoldScaleAxis())
    assert _ops(after) == Counter({"nn.dense": 1, "nn.bias_add": 1})
    _same_outputs(before, after, _rand(3, 5), rtol=1e-4)


def test_fold_scale_axis_leaves_what_it_cannot_fold() -> None:
    x, s, w = relay.var("x", shape=(1, 2, 5, 5)), relay.var("s", shape=(4, 1, 1)), relay.var("w", shape=(4, 2, 3, 3))
    const_w = relay.const(_rand(4, 2, 3, 3))
    shared = relay.nn.conv2d(x, const_w)
    cases = [
        relay.multiply(relay.nn.conv2d(x, const_w), s),  # the scale is not a constant
        relay.multiply(relay.nn.conv2d(x, w), relay.const(_rand(4, 1, 1))),  # the weight is not a constant
        relay.multiply(relay.nn.conv2d(x, const_w), relay.const(_rand(1, 1, 3, 3))),  # not per channel
        relay.add(relay.multiply(shared, relay.const(_rand(4, 1, 1))), shared),  # the conv has another use
    ]
    for body in cases:
        before = _mod([x, s, w], body)
        after = _apply(before, transform.FoldScaleAxis())
        assert _ops(after) == _ops(before)
        args = [_rand(1, 2, 5, 5), _rand(4, 1, 1), _rand(4, 2, 3, 3)]
        _same_outputs(before, after, *args)
    assert _ops(_apply(_mod([x, s, w], cases[0]), transform.FoldScaleAxis(), opt_level=2))["multiply"] == 1


# ---------------------------------------------------------------------------
# All the passes together
# ---------------------------------------------------------------------------


_ALL = (
    transform.SimplifyInference, transform.FoldConstant, transform.FoldScaleAxis, transform.FoldConstant,
    transform.EliminateCommonSubexpr, transform.DeadCodeElimination,
)


def test_every_pass_handles_a_10000_op_chain() -> None:
    x = relay.var("x", shape=(2,))
    y: relay.Expr = x
    for i in range(5_000):
        y = relay.add(y, relay.multiply(relay.const(0.5), relay.const(1.0 if i % 2 else 2.0)))  # folds
    before = _mod([x], y)
    assert sum(_ops(before).values()) == 10_000
    with PassContext(opt_level=3):  # verified once at the end: verifying is a full type inference
        after = Sequential([p() for p in _ALL])(before)
    transform.verify(after)
    assert _ops(after) == Counter({"add": 5_000})
    _same_outputs(before, after, np.zeros(2, "float32"))


def test_dce_and_fold_constant_handle_a_10000_let_chain() -> None:
    x = relay.var("x", shape=(2,))
    body: relay.Expr = x
    for i in reversed(range(10_000)):
        body = relay.Let(relay.var(f"v{i}"), relay.exp(x), body)  # none is used
    before = _mod([x], body)
    after = _apply(before, transform.FoldConstant(), transform.DeadCodeElimination())
    assert after["main"].body is x
    _same_outputs(before, after, _rand(2))


def test_passes_are_named_with_tvm_opt_levels() -> None:
    levels = {p().info.name: p().info.opt_level for p in _ALL}
    assert levels == {"SimplifyInference": 0, "FoldConstant": 2, "FoldScaleAxis": 3,
                      "EliminateCommonSubexpr": 3, "DeadCodeElimination": 1}


def test_a_pass_on_an_ill_typed_module_reports_the_type_error() -> None:
    x = relay.var("x", shape=(2, 3))
    bad = _mod([x], relay.add(x, relay.const(_rand(4))))
    with pytest.raises(KilnError, match="add"), PassContext(opt_level=3, verify=True):
        transform.FoldConstant()(bad)


def test_the_build_pipeline_keeps_outputs_through_fused_primitive_functions() -> None:
    x = relay.var("x", shape=(1, 3, 6, 6))
    conv = relay.nn.conv2d(x, relay.const(_rand(4, 3, 3, 3)), padding=(1, 1))
    y = relay.nn.relu(relay.TupleGetItem(relay.nn.batch_norm(conv, *_bn_params(4)), 0))
    before = _mod([x], relay.add(relay.sum(y, axis=1), relay.sum(y, axis=1)))
    after = _apply(before, *(p() for p in _ALL), transform.FuseOps())
    primitive = [n for n in post_order(after["main"]) if isinstance(n, relay.Function) and n.attrs.get("Primitive")]
    assert primitive  # the interpreter calls the fused functions like any function value
    _same_outputs(before, after, _rand(1, 3, 6, 6), rtol=1e-4)
