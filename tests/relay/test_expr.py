"""Relay expressions, visitors and mutators, analyses, structural equality and hashing."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from kiln import relay
from kiln.ir.types import TensorType
from kiln.registry import Op
from kiln.relay.analysis import (
    WellFormedError,
    bound_vars,
    check_well_formed,
    free_vars,
    structural_equal,
    structural_hash,
    well_formed,
)
from kiln.relay.expr import ExprError
from kiln.relay.visitor import ExprMutator, ExprVisitor, post_order


def _chain(n: int) -> tuple[relay.Var, relay.Expr]:
    x = relay.var("x", shape=(4,))
    y: relay.Expr = x
    for _ in range(n):
        y = relay.negative(y)
    return x, y


def test_builders() -> None:
    x = relay.var("x", shape=(1, 3, "n"), dtype="float16")
    assert x.type_annotation == TensorType((1, 3, "n"), "float16")
    assert relay.const(1.5).data.dtype == np.float32
    assert relay.const(3).data.dtype == np.int32
    assert relay.const(np.arange(4, dtype=np.int64)).data.dtype == np.int64
    assert relay.const([1, 2], dtype="uint8").data.dtype == np.uint8
    c = relay.const(np.ones(3))
    with pytest.raises(ValueError):
        c.data[0] = 2  # constants are read-only
    with pytest.raises(ExprError, match="expected a relay expression, got int 3"):
        relay.Call(Op.get("add"), [x, 3])  # type: ignore[list-item]  # the point: a bad argument


def test_expressions_compare_by_identity() -> None:
    a, b = relay.var("x"), relay.var("x")
    assert a != b and a == a
    assert len({a, b}) == 2


def test_post_order_visits_a_dag_once_children_first() -> None:
    x = relay.var("x", shape=(2,))
    shared = relay.exp(x)
    out = relay.add(shared, shared)
    order = post_order(out)
    assert order == [x, shared, out]


def test_visitor_and_mutator_on_a_10000_chain_do_not_recurse() -> None:
    limit = sys.getrecursionlimit()
    _, y = _chain(10_000)

    class Count(ExprVisitor):
        calls = 0

        def visit_call(self, node: relay.Call) -> None:
            self.calls += 1

    counter = Count()
    counter.visit(y)
    assert counter.calls == 10_000

    class NegToAbs(ExprMutator):
        def rewrite_call(self, node: relay.Call, op: object, args: tuple[relay.Expr, ...]) -> relay.Expr:
            if node.op is Op.get("negative"):
                return relay.abs(args[0])
            return super().rewrite_call(node, op, args)  # type: ignore[arg-type]  # op passes through

    out = NegToAbs().visit(y)
    assert isinstance(out, relay.Call) and out.op is Op.get("abs")
    assert sum(1 for n in post_order(out) if isinstance(n, relay.Call)) == 10_000
    assert sys.getrecursionlimit() == limit


def test_mutator_keeps_unchanged_graphs_and_sharing() -> None:
    x = relay.var("x", shape=(2,))
    shared = relay.exp(x)
    out = relay.add(shared, shared)
    assert ExprMutator().visit(out) is out

    class Rename(ExprMutator):
        def rewrite_var(self, node: relay.Var) -> relay.Expr:
            return relay.var("y", shape=(2,))

    new = Rename().visit(out)
    assert isinstance(new, relay.Call) and new.args[0] is new.args[1]


def test_free_and_bound_vars_and_well_formedness() -> None:
    x, y, z = relay.var("x", shape=(2,)), relay.var("y", shape=(2,)), relay.var("z", shape=(2,))
    let = relay.Let(y, relay.exp(x), relay.add(y, z))
    f = relay.Function([x], let)
    assert free_vars(f) == [z]
    assert set(bound_vars(f)) == {x, y}
    check_well_formed(f)
    with pytest.raises(WellFormedError, match="free variables: %z"):
        check_well_formed(f, is_global=True)
    twice = relay.Function([x], relay.Let(x, relay.exp(x), x))
    assert not well_formed(twice)
    with pytest.raises(WellFormedError, match="%x is bound twice"):
        check_well_formed(twice)


def _model() -> relay.Function:
    x = relay.var("x", shape=(2, 3))
    v = relay.var("v")
    body = relay.Let(v, relay.clip(x, 0.0, 6.0), relay.Tuple([v, relay.TupleGetItem(relay.Tuple([v, x]), 1)]))
    return relay.Function([x], relay.add(relay.TupleGetItem(body, 0), relay.const(np.arange(3, dtype=np.float32))))


def test_structural_equal_maps_bound_vars() -> None:
    a, b = _model(), _model()
    assert a is not b
    assert structural_equal(a, b)
    assert structural_hash(a) == structural_hash(b)


@pytest.mark.parametrize(
    "change",
    [
        lambda x: relay.clip(x, 0.0, 5.0),  # another attr value
        lambda x: relay.exp(x),  # another op
        lambda x: relay.add(x, relay.const(np.float32(1))),  # another constant
        lambda x: relay.add(x, relay.const(np.float32(2))),
    ],
)
def test_structural_equal_sees_each_difference(change: object) -> None:
    def build(variant: bool) -> relay.Function:
        x = relay.var("x", shape=(2, 3))
        body = change(x) if variant else relay.clip(x, 0.0, 6.0)  # type: ignore[operator]  # a lambda
        return relay.Function([x], body)

    base = build(False)
    if structural_equal(build(True), base):
        pytest.fail("a change went unnoticed")
    assert structural_hash(build(True)) != structural_hash(base)


def test_without_tensor_values_functions_differing_only_in_weights_are_equal() -> None:
    def build(weight: np.ndarray, scale: float) -> relay.Function:
        x = relay.var("x", shape=(2, 3))
        return relay.Function([x], relay.multiply(relay.add(x, relay.const(weight)), relay.const(np.float32(scale))))

    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    a, b = build(w, 2.0), build(w + 1, 2.0)
    assert not structural_equal(a, b) and structural_hash(a) != structural_hash(b)
    assert structural_equal(a, b, tensor_values=False)
    assert structural_hash(a, tensor_values=False) == structural_hash(b, tensor_values=False)
    other_scalar = build(w, 3.0)  # a one-element constant is compiled in: its value counts
    assert not structural_equal(a, other_scalar, tensor_values=False)
    assert structural_hash(a, tensor_values=False) != structural_hash(other_scalar, tensor_values=False)
    other_shape = build(np.zeros((1, 3), np.float32), 2.0)
    assert not structural_equal(a, other_shape, tensor_values=False)


def test_free_vars_compare_by_identity_unless_mapped() -> None:
    x, y = relay.var("x", shape=(2,)), relay.var("x", shape=(2,))
    assert not structural_equal(relay.exp(x), relay.exp(y))
    assert structural_equal(relay.exp(x), relay.exp(y), map_free_vars=True)
    assert structural_hash(relay.exp(x), map_free_vars=True) == structural_hash(relay.exp(y), map_free_vars=True)
    assert not structural_equal(relay.add(x, x), relay.add(x, y), map_free_vars=True)


def test_structural_equal_on_modules_and_long_chains() -> None:
    _, a = _chain(10_000)
    _, b = _chain(10_000)
    fa = relay.Function(relay.analysis.free_vars(a), a)
    fb = relay.Function(relay.analysis.free_vars(b), b)
    assert structural_equal(relay.IRModule.from_expr(fa), relay.IRModule.from_expr(fb))
    assert structural_hash(fa) == structural_hash(fb)
