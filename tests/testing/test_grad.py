"""kiln.testing.check_grad: passes correct gradients, and catches wrong ones naming the parameter and element."""

from __future__ import annotations

import numpy as np
import pytest

from kiln import relay
from kiln.registry import Op, attr
from kiln.relay.op._reg import register_unary
from kiln.testing import check_grad

RNG = np.random.default_rng(3)


def _square_op(name: str, factor: float) -> None:
    """A test op x * x whose registered gradient is factor * g * x (correct for factor 2)."""
    register_unary(name, "test op: x * x", lambda attrs, x: x * x, te_expr=lambda x: x * x)
    Op.get(name).set_attr(attr.FPrimalGradient, lambda call, g: [
        relay.multiply(g, relay.multiply(call.args[0], relay.const(factor, "float64")))])


def test_a_correct_gradient_passes() -> None:
    _square_op("test.square_right", 2.0)
    x, y = relay.var("x", shape=(2, 3), dtype="float64"), relay.var("y", shape=(3,), dtype="float64")
    func = relay.Function([x, y], relay.multiply(relay.expr.call("test.square_right", [x]), y))
    check_grad(func, {"x": RNG.standard_normal((2, 3)), "y": RNG.standard_normal(3)})


def test_a_wrong_registered_gradient_is_caught_naming_parameter_and_element() -> None:
    _square_op("test.square_wrong", 1.0)
    x = relay.var("x", shape=(2, 3), dtype="float64")
    func = relay.Function([x], relay.expr.call("test.square_wrong", [x]))
    with pytest.raises(AssertionError, match=r"gradient of parameter x differs from finite differences at 6 of 6 "
                                             r"elements; worst at index \(\d, \d\): analytic .*, numeric "):
        check_grad(func, [RNG.uniform(1.0, 2.0, (2, 3))])


def test_a_symmetric_mistake_is_caught_by_the_random_weights() -> None:
    # The gradient transposed: under a plain sum of the output every element's is 1 either way.
    name = "test.swap_grad"
    register_unary(name, "test op: identity", lambda attrs, x: x, te_expr=lambda x: x)
    Op.get(name).set_attr(attr.FPrimalGradient, lambda call, g: [relay.transpose(g)])
    x = relay.var("x", shape=(2, 2), dtype="float64")
    with pytest.raises(AssertionError, match="parameter x"):
        check_grad(relay.Function([x], relay.expr.call(name, [x])), [RNG.standard_normal((2, 2))])


def test_wrt_checks_only_the_named_parameters() -> None:
    _square_op("test.square_half", 1.0)
    x, y = relay.var("x", shape=(3,), dtype="float64"), relay.var("y", shape=(3,), dtype="float64")
    func = relay.Function([x, y], relay.add(relay.expr.call("test.square_half", [x]), relay.sin(y)))
    inputs = [RNG.uniform(1.0, 2.0, 3), RNG.standard_normal(3)]
    check_grad(func, inputs, wrt=["y"])
    with pytest.raises(AssertionError, match="parameter x"):
        check_grad(func, inputs, wrt=["x"])


def test_float32_functions_are_checked_with_a_wider_step() -> None:
    x = relay.var("x", shape=(4,), dtype="float32")
    check_grad(relay.Function([x], relay.tanh(x)), [RNG.standard_normal(4).astype(np.float32)], rtol=1e-2, atol=1e-3)
