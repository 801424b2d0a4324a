"""FuseOps: which calls end up in one primitive function, why the others do not, and the text of primitive functions."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from kiln import relay
from kiln.errors import KilnError
from kiln.ir.module import IRModule
from kiln.ir.transform import PassContext, PassError
from kiln.ir.types import TensorType
from kiln.registry import Op, OpPattern
from kiln.relay import ParseError, parse
from kiln.relay.analysis import structural_equal, structural_hash
from kiln.relay.expr import Call, Constant, Expr, ExprError, Function, Let, Tuple, TupleGetItem, Var
from kiln.relay.printer import astext
from kiln.relay.transform.fuse_ops import DEFAULT_MAX_DEPTH, FuseOps
from kiln.relay.transform.fusion_report import FusionReport, fusion_report
from kiln.relay.visitor import post_order


def module(params: list[Var], body: Expr) -> IRModule:
    return IRModule.from_expr(relay.Function(params, body))


def fuse(mod: IRModule, **config: Any) -> IRModule:
    with PassContext(opt_level=3, config=config, verify=True):
        return FuseOps()(mod)


def primitive_calls(mod: IRModule) -> list[Call]:
    """The calls of primitive functions in main, in post order."""
    return [
        n
        for n in post_order(mod["main"].body)
        if isinstance(n, Call) and isinstance(n.op, Function) and n.op.is_primitive
    ]


def group_ops(func: Function) -> list[str]:
    out = []
    for n in post_order(func.body):
        if isinstance(n, Call) and isinstance(n.op, Op):
            out.append(n.op.name)
        elif isinstance(n, Tuple):
            out.append("tuple")
        elif isinstance(n, TupleGetItem):
            out.append(f"tuple.{n.index}")
    return out


def groups(mod: IRModule) -> list[list[str]]:
    """The ops of each fused group of main, groups in post order."""
    return [group_ops(c.op) for c in primitive_calls(mod) if isinstance(c.op, Function)]


def assert_typed(mod: IRModule) -> None:
    """Every call (in main and in every primitive function) has a type, and primitive params are annotated."""
    for node in post_order(mod["main"]):
        if isinstance(node, Call):
            assert node.has_type
        if isinstance(node, Function) and node.is_primitive:
            assert all(isinstance(p.type_annotation, TensorType | relay.TupleType) for p in node.params)
            assert node.ret_type == node.body.checked_type


def x4x8(name: str = "x") -> Var:
    return relay.var(name, shape=(4, 8))


# ---------------------------------------------------------------------------
# The rules
# ---------------------------------------------------------------------------


def test_conv2d_bias_add_relu_is_one_group() -> None:
    x, w, b = relay.var("x", shape=(1, 3, 8, 8)), relay.var("w", shape=(4, 3, 3, 3)), relay.var("b", shape=(4,))
    mod = module([x, w, b], relay.nn.relu(relay.nn.bias_add(relay.nn.conv2d(x, w), b)))
    out = fuse(mod)
    assert groups(out) == [["nn.conv2d", "nn.bias_add", "nn.relu"]]
    (call,) = primitive_calls(out)
    assert list(call.args) == [x, w, b]  # the group's external inputs, in order of first use
    assert isinstance(call.op, Function) and call.op.attrs == {"Primitive": 1}
    assert call.checked_type == TensorType((1, 4, 6, 6))
    assert_typed(out)


def test_dense_bias_add_gelu_is_one_group() -> None:
    x, w, b = x4x8(), relay.var("w", shape=(16, 8)), relay.var("b", shape=(16,))
    mod = module([x, w, b], relay.nn.gelu(relay.nn.bias_add(relay.nn.dense(x, w), b)))
    assert groups(fuse(mod)) == [["nn.dense", "nn.bias_add", "nn.gelu"]]


def test_dense_with_gelu_written_as_elementwise_ops_is_one_group() -> None:
    x, w = x4x8(), relay.var("w", shape=(16, 8))
    h = relay.nn.dense(x, w)  # gelu(h) = 0.5 h (1 + erf(h / sqrt 2)): h feeds two branches (a diamond)
    erf = relay.erf(relay.multiply(h, relay.const(1 / math.sqrt(2))))
    out = fuse(module([x, w], relay.multiply(relay.multiply(h, relay.const(0.5)), relay.add(erf, relay.const(1.0)))))
    assert groups(out) == [["nn.dense", "multiply", "multiply", "erf", "add", "multiply"]]
    (call,) = primitive_calls(out)
    assert list(call.args) == [x, w] and isinstance(call.op, Function)
    consts = [n for n in post_order(call.op.body) if isinstance(n, Constant)]
    assert len(consts) == 3  # constants stay inside their group


def test_chain_of_injective_ops_is_one_group() -> None:
    x = x4x8()
    body = relay.add(relay.transpose(relay.reshape(x, (8, 4))), relay.const(1.0))
    out = fuse(module([x], body))
    assert groups(out) == [["reshape", "transpose", "add"]]
    assert_typed(out)


def test_reduction_takes_its_elementwise_inputs_but_not_its_consumers() -> None:
    x = x4x8()
    out = fuse(module([x], relay.nn.relu(relay.sum(relay.exp(relay.negative(x)), axis=1))))
    assert groups(out) == [["negative", "exp", "sum"], ["nn.relu"]]


def test_injective_op_does_not_fuse_into_a_reduction() -> None:
    x = x4x8()  # TVM's rule: only elementwise and broadcast producers join a reduction
    assert groups(fuse(module([x], relay.sum(relay.transpose(x), axis=1)))) == [["transpose"], ["sum"]]


def test_opaque_op_splits_groups() -> None:
    x = x4x8()
    body = relay.exp(relay.nn.softmax(relay.nn.relu(relay.negative(x))))
    out = fuse(module([x], body))
    assert groups(out) == [["negative", "nn.relu"], ["nn.softmax"], ["exp"]]
    assert_typed(out)


def test_conv2d_does_not_fuse_with_a_following_pool() -> None:
    x, w = relay.var("x", shape=(1, 3, 8, 8)), relay.var("w", shape=(4, 3, 3, 3))
    body = relay.nn.max_pool2d(relay.nn.relu(relay.nn.conv2d(x, w)), pool_size=(2, 2))
    assert groups(fuse(module([x, w], body))) == [["nn.conv2d", "nn.relu"], ["nn.max_pool2d"]]


def test_elementwise_op_does_not_fuse_into_a_following_conv2d() -> None:
    x, w = relay.var("x", shape=(1, 3, 8, 8)), relay.var("w", shape=(4, 3, 3, 3))
    assert groups(fuse(module([x, w], relay.nn.conv2d(relay.exp(x), w)))) == [["exp"], ["nn.conv2d"]]


def test_two_conv2d_never_share_a_group() -> None:
    x, w1, w2 = (
        relay.var("x", shape=(1, 3, 8, 8)),
        relay.var("w1", shape=(4, 3, 3, 3)),
        relay.var("w2", shape=(4, 3, 3, 3)),
    )
    body = relay.add(relay.nn.conv2d(x, w1), relay.nn.conv2d(x, w2))
    assert groups(fuse(module([x, w1, w2], body))) == [["nn.conv2d"], ["nn.conv2d", "add"]]


# ---------------------------------------------------------------------------
# Diamonds: the post-dominator decides
# ---------------------------------------------------------------------------


def test_elementwise_diamond_is_one_group() -> None:
    x = x4x8()
    e = relay.exp(x)
    out = fuse(module([x], relay.add(relay.nn.relu(e), relay.negative(e))))
    assert groups(out) == [["exp", "nn.relu", "negative", "add"]]
    (call,) = primitive_calls(out)
    assert list(call.args) == [x]


def test_diamond_through_an_opaque_op_keeps_the_split_node_apart() -> None:
    x = x4x8()
    e = relay.exp(x)
    out = fuse(module([x], relay.add(relay.nn.softmax(e), relay.negative(e))))
    assert groups(out) == [["exp"], ["nn.softmax"], ["negative", "add"]]
    first, _, last = primitive_calls(out)
    assert first in last.args  # the exp group's result feeds both later groups
    assert_typed(out)


def test_diamond_through_a_reduction_keeps_the_split_node_apart() -> None:
    x = x4x8()
    e = relay.exp(x)
    body = relay.add(relay.sum(e, axis=1, keepdims=True), relay.negative(e))
    assert groups(fuse(module([x], body))) == [["exp"], ["sum"], ["negative", "add"]]


def test_node_whose_consumers_have_no_common_post_dominator_stays_alone() -> None:
    x = x4x8()
    e = relay.exp(x)
    v = relay.var("v")
    body = Let(v, relay.nn.relu(e), relay.add(v, relay.negative(e)))  # fusion never crosses a let
    out = fuse(module([x], body))
    assert groups(out) == [["exp"], ["nn.relu"], ["negative", "add"]]
    report = fusion_report(module([x], body))
    assert (
        "exp (elemwise) → nn.relu (elemwise): the producer has several consumers not post-dominated by one group"
        in str(report)
    )


def test_value_that_is_also_the_result_does_not_fuse_forward() -> None:
    x = x4x8()
    e = relay.exp(x)
    out = fuse(module([x], relay.Tuple([e, relay.negative(e)])))
    assert groups(out) == [["exp"], ["negative"]]
    assert isinstance(out["main"].body, Tuple)  # a tuple with no injective consumer stays in main


# ---------------------------------------------------------------------------
# Tuples
# ---------------------------------------------------------------------------


def test_concatenate_takes_its_tuple_and_the_injective_ops_feeding_it() -> None:
    x = x4x8()
    body = relay.nn.relu(relay.concatenate([relay.exp(x), relay.negative(x)], axis=0))
    out = fuse(module([x], body))
    assert groups(out) == [["exp", "negative", "tuple", "concatenate", "nn.relu"]]
    assert_typed(out)


def test_split_and_its_field_accesses_fuse_with_their_consumer() -> None:
    x = x4x8()
    t = relay.split(relay.exp(x), 2, axis=1)
    out = fuse(module([x], relay.add(TupleGetItem(t, 0), TupleGetItem(t, 1))))
    assert groups(out) == [["exp", "split", "tuple.0", "tuple.1", "add"]]


def test_field_access_of_a_separate_group_stays_in_main() -> None:
    x = x4x8()
    t = relay.split(x, 2, axis=1)
    mod = module([x], relay.Tuple([TupleGetItem(t, 0), relay.nn.softmax(TupleGetItem(t, 1))]))
    out = fuse(mod)
    assert groups(out) == [["split"], ["nn.softmax"]]  # as in TVM: a lone field access is no primitive function
    split_call, softmax_call = primitive_calls(out)
    field = softmax_call.args[0]
    assert isinstance(field, TupleGetItem) and field.tuple_value is split_call
    assert_typed(out)
    report = fusion_report(mod)
    assert [g.ops for g in report.groups if g.primitive] == [("split",), ("nn.softmax",)]
    assert "group 1 [injective]: tuple.0 (no op: stays in the caller)" in str(report)


# ---------------------------------------------------------------------------
# Group size
# ---------------------------------------------------------------------------


def chain(n: int, op: Any = relay.negative) -> tuple[Var, Expr]:
    x = x4x8()
    y: Expr = x
    for _ in range(n):
        y = op(y)
    return x, y


def test_max_depth_splits_a_chain() -> None:
    x, y = chain(7, relay.exp)
    out = fuse(module([x], y), **{"relay.FuseOps.max_depth": 3})
    assert [len(g) for g in groups(out)] == [3, 3, 1]
    calls = primitive_calls(out)
    assert calls[1].args == (calls[0],) and calls[2].args == (calls[1],)


def test_max_depth_one_puts_every_op_alone() -> None:
    x = x4x8()
    body = relay.nn.relu(relay.add(relay.exp(x), relay.const(1.0)))
    assert groups(fuse(module([x], body), **{"relay.FuseOps.max_depth": 1})) == [["exp"], ["add"], ["nn.relu"]]


def test_max_depth_must_be_positive() -> None:
    x, y = chain(2)
    with pytest.raises(PassError, match="max_depth must be an int >= 1"):
        fuse(module([x], y), **{"relay.FuseOps.max_depth": 0})
    with pytest.raises(PassError, match="expects int"):
        PassContext(config={"relay.FuseOps.max_depth": "8"})


def test_chain_of_10000_ops_fuses_into_groups_of_the_default_size() -> None:
    x, y = chain(10_000)
    mod = module([x], y)
    out = fuse(mod)
    sizes = [len(g) for g in groups(out)]
    assert sizes == [DEFAULT_MAX_DEPTH] * 39 + [10_000 - 39 * DEFAULT_MAX_DEPTH]
    assert out["main"].body.checked_type == TensorType((4, 8))
    report = fusion_report(mod)
    assert len(report.groups) == 40 and len(report.boundaries) == 39
    assert all(b.reason == "max group size 256 reached" for b in report.boundaries)


# ---------------------------------------------------------------------------
# The pass
# ---------------------------------------------------------------------------


def test_fuse_opt_level_zero_puts_every_op_in_its_own_primitive_function() -> None:
    x, w, b = relay.var("x", shape=(1, 3, 8, 8)), relay.var("w", shape=(4, 3, 3, 3)), relay.var("b", shape=(4,))
    mod = module([x, w, b], relay.nn.relu(relay.nn.bias_add(relay.nn.conv2d(x, w), b)))
    with PassContext(opt_level=3):
        out = FuseOps(fuse_opt_level=0)(mod)
    assert groups(out) == [["nn.conv2d"], ["nn.bias_add"], ["nn.relu"]]


def test_pass_runs_from_opt_level_one() -> None:
    x, y = chain(3)
    mod = module([x], y)
    with PassContext(opt_level=0):
        assert FuseOps()(mod) is mod
    assert FuseOps().info.opt_level == 1 and FuseOps().info.name == "FuseOps"


def test_fusing_twice_changes_nothing() -> None:
    x = x4x8()
    e = relay.exp(x)
    mod = module([x], relay.add(relay.nn.softmax(e), relay.negative(e)))
    once = fuse(mod)
    twice = fuse(once)
    assert structural_equal(once, twice)
    assert groups(twice) == groups(once)


def test_fusion_does_not_cross_an_if_but_fuses_inside_its_branches() -> None:
    x, c = x4x8(), relay.var("c", shape=(), dtype="bool")
    e = relay.exp(x)
    body = relay.If(c, relay.nn.relu(relay.negative(e)), relay.sigmoid(e))
    out = fuse(module([x, c], body))
    assert sorted(groups(out)) == [["exp"], ["negative", "nn.relu"], ["sigmoid"]]
    assert_typed(out)


def test_other_functions_of_the_module_fuse_too_and_keep_their_calls() -> None:
    mod = parse(
        """
        def @helper(%a: Tensor[(4, 8), float32]) -> Tensor[(4, 8), float32] {
          negative(exp(%a))
        }
        def @main(%x: Tensor[(4, 8), float32]) -> Tensor[(4, 8), float32] {
          nn.relu(@helper(%x))
        }
        """
    )
    out = fuse(mod)
    helper_groups = [
        group_ops(c.op) for c in post_order(out["helper"]) if isinstance(c, Call) and isinstance(c.op, Function)
    ]
    assert helper_groups == [["exp", "negative"]]
    assert groups(out) == [["nn.relu"]]


# ---------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------


def test_fusion_report_lists_groups_and_why_each_boundary_is_there() -> None:
    x, w, b = relay.var("x", shape=(1, 3, 8, 8)), relay.var("w", shape=(4, 3, 3, 3)), relay.var("b", shape=(4,))
    conv = relay.nn.relu(relay.nn.bias_add(relay.nn.conv2d(x, w), b))
    body = relay.exp(relay.nn.softmax(relay.nn.max_pool2d(conv, pool_size=(2, 2))))
    report = fusion_report(module([x, w, b], body))
    assert isinstance(report, FusionReport)
    assert [g.ops for g in report.groups] == [
        ("nn.conv2d", "nn.bias_add", "nn.relu"),
        ("nn.max_pool2d",),
        ("nn.softmax",),
        ("exp",),
    ]
    assert report.groups[0].pattern == OpPattern.OUT_ELEMWISE_FUSABLE
    pool, softmax, exp = report.boundaries
    assert (pool.producer_group, pool.consumer_group) == (0, 1)
    assert pool.producer == "nn.relu (elemwise)" and pool.consumer == "nn.max_pool2d (out-elemwise-fusable)"
    assert "fuses only with elementwise/broadcast ops after it" in pool.reason
    assert str(softmax) == (
        "group 1 -> group 2: nn.max_pool2d (out-elemwise-fusable) → nn.softmax (opaque): an opaque op never fuses"
    )
    assert exp.reason == "an opaque op never fuses"
    text = str(report)
    assert text.splitlines()[:2] == [
        "fusion of @main: 4 groups (max group size 256)",
        "  group 0 [out-elemwise-fusable]: nn.conv2d, nn.bias_add, nn.relu",
    ]
    assert "boundaries:" in text and str(softmax) in text


def test_fusion_report_explains_size_and_path_limits() -> None:
    x, y = chain(5, relay.exp)
    with PassContext(config={"relay.FuseOps.max_depth": 2}):
        report = fusion_report(module([x], y))
    assert [len(g.ops) for g in report.groups] == [2, 2, 1]
    assert {b.reason for b in report.boundaries} == {"max group size 2 reached"}
    assert fusion_report(module([x], y), max_depth=4).boundaries[0].reason == "max group size 4 reached"
    x = x4x8()
    e = relay.exp(x)
    report = fusion_report(module([x], relay.add(relay.sum(e, axis=1, keepdims=True), relay.negative(e))))
    reasons = {(b.producer, b.consumer): b.reason for b in report.boundaries}
    assert reasons[("exp (elemwise)", "negative (elemwise)")].endswith(
        "the way to its post-dominator add passes through sum (comm-reduce)"
    )
    assert "never with its consumers" in reasons[("sum (comm-reduce)", "add (broadcast)")]


def test_fusion_report_agrees_with_the_pass() -> None:
    x = x4x8()
    e = relay.exp(x)
    mod = module([x], relay.add(relay.nn.softmax(e), relay.negative(e)))
    report = fusion_report(mod)
    assert [list(g.ops) for g in report.groups if g.primitive] == groups(fuse(mod))
    assert str(report).endswith("nn.softmax (opaque) → add (broadcast): an opaque op never fuses")


# ---------------------------------------------------------------------------
# Function attributes and the text format
# ---------------------------------------------------------------------------


def test_function_attrs_are_read_only_and_checked() -> None:
    x = x4x8()
    f = relay.Function([x], relay.exp(x))
    assert dict(f.attrs) == {} and not f.is_primitive
    g = f.with_attrs(Primitive=1)
    assert g.is_primitive and g.params == f.params and g.body is f.body
    with pytest.raises(TypeError):
        g.attrs["Primitive"] = 0  # type: ignore[index]
    with pytest.raises(ExprError, match="attribute names are identifiers"):
        relay.Function([x], x, None, {"not a name": 1})
    with pytest.raises(ExprError, match="function attribute Bad must be"):
        relay.Function([x], x, None, {"Bad": object()})


def test_function_attrs_take_part_in_structural_equality_and_hash() -> None:
    x = x4x8()
    plain = relay.Function([x], relay.exp(x))
    prim = plain.with_attrs(Primitive=1)
    assert not structural_equal(plain, prim)
    assert structural_equal(prim, plain.with_attrs(Primitive=1))
    assert not structural_equal(prim, plain.with_attrs(Primitive=True))  # 1 and True differ
    assert structural_hash(prim) == structural_hash(plain.with_attrs(Primitive=1))
    assert structural_hash(prim) != structural_hash(plain)


def test_primitive_function_text_round_trips() -> None:
    x = relay.var("p0", shape=(1, 16))
    f = relay.Function([x], relay.nn.relu(x), TensorType((1, 16)), {"Primitive": 1, "Name": "fused relu", "K": (1, 2)})
    text = astext(f)
    assert text.splitlines()[0] == (
        'fn (%p0: Tensor[(1, 16), float32], Primitive=1, Name="fused relu", K=[1, 2]) -> Tensor[(1, 16), float32] {'
    )
    back = parse(text)
    assert isinstance(back, Function) and dict(back.attrs) == {"Primitive": 1, "Name": "fused relu", "K": (1, 2)}
    assert astext(back) == text
    assert structural_equal(f, back, map_free_vars=True)
    assert astext(parse("fn (Primitive=1) { 1f }")).startswith("fn (Primitive=1) {")


def test_fused_module_text_round_trips() -> None:
    x, w, b = relay.var("x", shape=(1, 3, 8, 8)), relay.var("w", shape=(4, 3, 3, 3)), relay.var("b", shape=(4,))
    conv = relay.nn.relu(relay.nn.bias_add(relay.nn.conv2d(x, w), b))
    body = relay.add(relay.nn.softmax(conv), relay.const(np.ones((1, 4, 6, 6), "float32")))
    out = fuse(module([x, w, b], body))
    text = astext(out)
    assert "Primitive=1" in text
    back = parse(text)
    relay.transform.InferType()(back)
    assert astext(back) == text
    assert structural_equal(out, back)


def test_long_fused_chain_text_round_trips() -> None:
    x, y = chain(600)
    out = fuse(module([x], y))
    back = parse(astext(out))
    assert structural_equal(out, back)
    assert len(groups(back)) == 3


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("fn (%x: Tensor[(2,), float32], A=1, A=2) { %x }", "function attribute A is given twice"),
        ("fn (A=1, %x: Tensor[(2,), float32]) { %x }", "parameters come before the function attributes"),
        ("fn (%x: Tensor[(2,), float32], A=) { %x }", "expected an attribute value"),
    ],
)
def test_bad_function_attributes_are_parse_errors(text: str, message: str) -> None:
    with pytest.raises(ParseError, match=message):
        parse(text)


def test_unknown_config_key_is_still_refused() -> None:
    with pytest.raises(KilnError, match="unknown PassContext config key"):
        PassContext(config={"relay.FuseOps.max_dept": 3})


# ---------------------------------------------------------------------------
# Meaning: the reference interpreter gives the same values before and after
# ---------------------------------------------------------------------------


def _models() -> list[tuple[IRModule, list[tuple[int, ...]]]]:
    x, w, b = relay.var("x", shape=(1, 3, 8, 8)), relay.var("w", shape=(4, 3, 3, 3)), relay.var("b", shape=(4,))
    conv = relay.nn.relu(relay.nn.bias_add(relay.nn.conv2d(x, w), b))
    conv_model = module([x, w, b], relay.nn.softmax(relay.multiply(conv, relay.const(0.5))))
    y = x4x8()
    e = relay.exp(y)
    t = relay.split(e, 2, axis=1)
    mixed = relay.add(
        relay.nn.softmax(relay.add(TupleGetItem(t, 0), TupleGetItem(t, 1))),
        relay.sum(relay.negative(e), axis=1, keepdims=True),
    )
    cat = relay.concatenate([relay.transpose(relay.exp(y)), relay.transpose(relay.negative(y))], axis=0)
    return [
        (conv_model, [(1, 3, 8, 8), (4, 3, 3, 3), (4,)]),
        (module([y], mixed), [(4, 8)]),
        (module([y], relay.nn.relu(cat)), [(4, 8)]),
    ]


@pytest.mark.parametrize("case", range(3))
def test_fused_module_computes_what_the_original_computes(case: int) -> None:
    interpreter = pytest.importorskip("kiln.relay.interpreter")
    mod, shapes = _models()[case]
    rng = np.random.default_rng(case)
    inputs = [rng.standard_normal(s).astype("float32") for s in shapes]
    expected = interpreter.create_executor("debug", mod).evaluate()(*inputs)
    fused = fuse(mod)
    assert primitive_calls(fused)
    got = interpreter.create_executor("debug", fused).evaluate()(*inputs)
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)
