"""AlterOpLayout: calls rewritten through their op's FAlterOpLayout[kind] for the current target, and
nn.dense's constant weights packed at build time on llvm."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from kiln import relay
from kiln.ir.transform import PassContext, Sequential
from kiln.ir.types import TensorType, Type
from kiln.registry import Op, OpPattern, attr, register_op
from kiln.relay import transform
from kiln.relay.visitor import post_order
from kiln.target import Target

RNG = np.random.default_rng(3)


def _dense_module(n: int, constant: bool = True) -> tuple[relay.IRModule, np.ndarray, np.ndarray]:
    x = relay.var("x", shape=(5, 24))
    w = RNG.standard_normal((n, 24)).astype(np.float32)
    weight: relay.Expr = relay.const(w) if constant else relay.var("w", shape=(n, 24))
    params = [x] if constant else [x, weight]
    body = relay.nn.relu(relay.nn.dense(x, weight))
    return relay.IRModule.from_expr(relay.Function(params, body)), RNG.standard_normal((5, 24)).astype(np.float32), w


def _altered(mod: relay.IRModule, target: str | None = "llvm") -> relay.IRModule:
    passes = Sequential([transform.AlterOpLayout(), transform.FoldConstant()])
    with PassContext(opt_level=3, verify=True):
        if target is None:
            return passes(mod)
        with Target(target):
            return passes(mod)


def _dense_calls(mod: relay.IRModule) -> list[relay.Call]:
    return [n for n in post_order(mod["main"]) if isinstance(n, relay.Call) and n.op is Op.get("nn.dense")]


def test_a_constant_dense_weight_is_packed_at_build_time() -> None:
    mod, x, w = _dense_module(128)
    (dense,) = _dense_calls(_altered(mod))
    assert dense.attrs.weight_layout == "NK64n"
    packed = dense.args[1]
    assert isinstance(packed, relay.Constant)  # FoldConstant did the transform: nothing left to run
    np.testing.assert_array_equal(packed.data, w.reshape(2, 64, 24).transpose(0, 2, 1))
    lib = relay.build(mod)
    got = lib.create_executor()(x=x)
    np.testing.assert_allclose(np.asarray(got), np.maximum(x @ w.T, 0), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("n", "constant", "target"), [(128, True, None), (128, False, "llvm"), (100, True, "llvm")])
def test_dense_is_kept_without_target_constant_weight_or_whole_panels(n: int, constant: bool, target: Any) -> None:
    mod, _, _ = _dense_module(n, constant)
    (dense,) = _dense_calls(_altered(mod, target))
    assert dense.attrs.weight_layout == "NK"


def _identity_rel(args: list[Type], attrs: Any) -> Type | None:
    return args[0] if isinstance(args[0], TensorType) else None


def test_a_user_op_is_rewritten_for_its_target_kind_only() -> None:
    seen: list[tuple[Any, ...]] = []

    def to_negative(attrs: Any, args: list[relay.Expr], types: list[Type], target: Target) -> relay.Expr:
        seen.append((attrs, len(args), types[0], target.kind.name))
        return relay.negative(args[0])

    (register_op("test.alter_me").describe("x").set_num_inputs(1).add_argument("data", "Tensor", "x")
        .add_type_rel("Identity", _identity_rel).set_attr(attr.TOpPattern, OpPattern.ELEMWISE)
        .set_attr(attr.FAlterOpLayout["llvm"], to_negative)
        .set_attr(attr.FAlterOpLayout["cuda"], lambda *a: pytest.fail("the cuda rewrite ran for llvm")))
    x = relay.var("x", shape=(3,))
    mod = relay.IRModule.from_expr(relay.Function([x], relay.expr.call("test.alter_me", [x])))
    out = _altered(mod)
    assert [n.op.name for n in post_order(out["main"]) if isinstance(n, relay.Call)] == ["negative"]
    assert seen == [(None, 1, TensorType((3,), "float32"), "llvm")]
