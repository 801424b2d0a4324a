"""Type inference: relations, unification, symbolic dims, every error reported at once, long chains."""

from __future__ import annotations

import sys

import attrs
import numpy as np
import pytest

from kiln import registry, relay
from kiln.ir.attrs import Attrs
from kiln.ir.module import IRModule
from kiln.ir.types import ANY, FuncType, SizeVar, TensorType, TupleType, dim_mul
from kiln.registry import OpPattern, attr
from kiln.relay.op._rel import RelationError, identity_shape, shape_relation
from kiln.relay.type_infer import TypeInferenceError, infer_type


def test_every_node_gets_a_checked_type() -> None:
    x = relay.var("x", shape=(SizeVar("n"), 3))
    y = relay.add(x, relay.const(np.ones((1, 3), np.float32)))
    z = relay.exp(y)
    f = relay.Function([x], z)
    infer_type(f)
    n3 = TensorType((SizeVar("n"), 3))
    assert y.checked_type == n3 and z.checked_type == n3
    assert f.checked_type == FuncType([n3], n3)


def test_symbolic_dims_flow_through_broadcasting() -> None:
    x = relay.var("x", shape=("n", 3))
    assert infer_type(relay.add(x, relay.var("y", shape=(1, 3)))).checked_type == TensorType(("n", 3))
    assert infer_type(relay.add(x, relay.var("y", shape=("n", 1)))).checked_type == TensorType(("n", 3))
    assert infer_type(relay.add(x, relay.var("y", shape=(None, 3)))).checked_type == TensorType((ANY, 3))


def test_let_tuple_getitem_if_and_function_calls() -> None:
    x = relay.var("x", shape=(2, 2))
    v = relay.var("v")
    tup = relay.Tuple([x, relay.cast(x, "int32")])
    second = relay.TupleGetItem(tup, 1)
    let = relay.Let(v, relay.exp(x), relay.Tuple([v, second]))
    infer_type(relay.Function([x], let))
    assert v.checked_type == TensorType((2, 2))
    assert second.checked_type == TensorType((2, 2), "int32")
    cond = relay.var("c", shape=(), dtype="bool")
    branch = relay.If(cond, relay.exp(x), relay.negative(x))
    assert infer_type(relay.Function([cond, x], branch)).checked_type.ret_type == TensorType((2, 2))  # type: ignore[attr-defined]  # a FuncType
    f = relay.Function([relay.var("a", shape=(2, 2))], relay.var("a2", shape=(2, 2)))
    inner_x = relay.var("p", shape=(2, 2))
    g = relay.Function([inner_x], relay.exp(inner_x))
    assert infer_type(relay.Call(g, [x])).checked_type == TensorType((2, 2))
    del f


def test_calls_of_global_functions_in_a_module() -> None:
    mod = IRModule()
    p = relay.var("p", shape=(4,))
    mod["double"] = relay.Function([p], relay.add(p, p), ret_type=TensorType((4,)))
    x = relay.var("x", shape=(4,))
    mod["main"] = relay.Function([x], relay.Call(mod.get_global_var("double"), [x]))
    mod = relay.transform.InferType()(mod)
    assert mod["main"].checked_type == FuncType([TensorType((4,))], TensorType((4,)))


def test_every_independent_error_is_reported_at_once() -> None:
    a = relay.var("a", shape=(2, 3))
    b = relay.var("b", shape=(4, 3))
    c = relay.var("c", shape=(2, 3), dtype="int32")
    bad_add = relay.add(a, b)
    dependent = relay.exp(bad_add)  # fails only because bad_add did: not reported
    bad_exp = relay.exp(c)
    with pytest.raises(TypeInferenceError) as info:
        infer_type(relay.Function([a, b, c], relay.Tuple([dependent, bad_exp])))
    err = info.value
    assert len(err.diagnostics) == 2
    text = str(err)
    assert text.startswith("2 type errors:")
    assert "op add, argument rhs (Tensor[(4, 3), float32]): shapes (2, 3), (4, 3) do not broadcast" in text
    assert "op exp, argument data (Tensor[(2, 3), int32]): expected a floating-point tensor, found dtype int32" in text
    assert "test_type_infer.py:" in text  # the span of each failing call
    assert err.diagnostics[0].node is bad_add and err.diagnostics[1].node is bad_exp


def test_arity_missing_relation_and_wrong_attrs_are_errors() -> None:
    x = relay.var("x", shape=(2,))
    with pytest.raises(TypeInferenceError, match=r"op add takes 2 argument\(s\) \(lhs, rhs\), found 1"):
        infer_type(relay.Call(registry.Op.get("add"), [x]))
    registry.register_op("test.norel").set_num_inputs(1).add_argument("x", "Tensor")
    with pytest.raises(TypeInferenceError, match="op test.norel has no type relation"):
        infer_type(relay.Call(registry.Op.get("test.norel"), [x]))
    with pytest.raises(TypeInferenceError, match="op clip expects attrs ClipAttrs, found no attrs"):
        infer_type(relay.Call(registry.Op.get("clip"), [x]))


def test_annotations_that_conflict_are_reported() -> None:
    x = relay.var("x", shape=(2,))
    v = relay.var("v", shape=(3,))
    with pytest.raises(TypeInferenceError, match=r"let %v: expected Tensor\[\(3,\), float32\], found Tensor\[\(2,\)"):
        infer_type(relay.Function([x], relay.Let(v, relay.exp(x), v)))
    with pytest.raises(TypeInferenceError, match="cannot infer the type of %free: annotate it"):
        infer_type(relay.Function([relay.var("free")], relay.const(1.0)))


@attrs.frozen
class RepeatAttrs(Attrs):
    times: int = 2


def test_a_user_op_with_a_plain_shape_rule() -> None:
    def repeat_shape(shapes: list[tuple[object, ...]], attrs: RepeatAttrs) -> tuple[object, ...]:
        first, *rest = shapes[0]
        return (dim_mul(first, attrs.times), *rest)  # type: ignore[arg-type]  # dims

    (
        registry.register_op("test.repeat")
        .set_num_inputs(1)
        .add_argument("data", "Tensor")
        .set_attrs_type(RepeatAttrs)
        .add_type_rel("Repeat", shape_relation(repeat_shape))
        .set_attr(attr.TOpPattern, OpPattern.INJECTIVE)
    )
    x = relay.var("x", shape=("n", 5))
    call = relay.Call(registry.Op.get("test.repeat"), [x], RepeatAttrs(times=3))
    assert infer_type(call).checked_type == TensorType((dim_mul(SizeVar("n"), 3), 5))


def test_a_user_relation_error_names_the_argument() -> None:
    def needs_rank_2(arg_types: list[object], attrs: object) -> object:
        t = arg_types[0]
        assert isinstance(t, TensorType)
        if len(t.shape) != 2:
            raise RelationError(f"expected a matrix, found rank {len(t.shape)}", arg=0)
        return t

    registry.register_op("test.matrix").add_argument("m", "Tensor").add_type_rel("M", needs_rank_2)
    expected = r"op test.matrix, argument m \(Tensor\[\(2,\), float32\]\): expected a matrix"
    with pytest.raises(TypeInferenceError, match=expected):
        infer_type(relay.Call(registry.Op.get("test.matrix"), [relay.var("x", shape=(2,))]))
    registry.register_op("test.same").add_argument("m", "Tensor").add_type_rel("S", shape_relation(identity_shape))


def test_tuple_getitem_out_of_range() -> None:
    t = relay.Tuple([relay.var("x", shape=(2,))])
    with pytest.raises(TypeInferenceError, match="index 3 is out of range for a tuple of 1"):
        infer_type(relay.TupleGetItem(t, 3))
    assert infer_type(relay.TupleGetItem(t, 0)).checked_type == TensorType((2,))
    assert isinstance(infer_type(t).checked_type, TupleType)


def test_a_10000_call_chain_type_checks_without_recursion() -> None:
    limit = sys.getrecursionlimit()
    x = relay.var("x", shape=("n", 8))
    y: relay.Expr = x
    for i in range(10_000):
        y = relay.tanh(y) if i % 2 else relay.add(y, x)
    f = relay.Function([x], y)
    infer_type(f)
    assert f.checked_type == FuncType([TensorType(("n", 8))], TensorType(("n", 8)))
    assert sys.getrecursionlimit() == limit
