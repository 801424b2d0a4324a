"""relay.transform.gradient: reverse mode on small graphs, deep chains, tuples, errors; and the gradients of
tensor.py's ops against central finite differences in float64 (through kiln.testing.check_grad)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from kiln import relay
from kiln.registry import Op, attr
from kiln.relay.op import tensor
from kiln.relay.op._grad import OpGradientError
from kiln.relay.op._reg import register_unary
from kiln.relay.transform import GradientError, gradient
from kiln.testing import check_grad

RNG = np.random.default_rng(7)
F64 = "float64"


def _run(func: relay.Function, *inputs: np.ndarray) -> list[np.ndarray]:
    out = relay.build(func).create_executor()(*inputs)
    return list(out) if isinstance(out, tuple) else [out]


def _var(name: str, shape: tuple[int, ...], dtype: str = F64) -> relay.Var:
    return relay.var(name, shape=shape, dtype=dtype)


# -- the pass -------------------------------------------------------------------------------------------


def test_fan_out_accumulates_and_broadcasting_sums_back() -> None:
    x, b = _var("x", (2, 3)), _var("b", (3,))
    xb = relay.multiply(x, b)  # used twice: its gradient is the sum of both uses'
    func = relay.Function([x, b], relay.add(xb, relay.exp(xb)))
    gf = gradient(func)
    assert [p.name_hint for p in gf.params] == ["x", "b"]
    xv, bv = RNG.standard_normal((2, 3)), RNG.standard_normal(3)
    out, gx, gb = _run(gf, xv, bv)
    d = 1 + np.exp(xv * bv)
    np.testing.assert_allclose(out, xv * bv + np.exp(xv * bv))
    np.testing.assert_allclose(gx, d * bv)
    np.testing.assert_allclose(gb, (d * xv).sum(0))
    check_grad(func, [xv, bv])


def test_wrt_picks_parameters_and_unused_ones_get_zeros() -> None:
    x, y, z = _var("x", (3,)), _var("y", (3,)), _var("z", (3,))
    func = relay.Function([x, y, z], relay.multiply(x, y))
    gf = gradient(func, wrt=["y", z])
    xv, yv, zv = (RNG.standard_normal(3) for _ in range(3))
    _, gy, gz = _run(gf, xv, yv, zv)
    np.testing.assert_allclose(gy, xv)
    np.testing.assert_array_equal(gz, np.zeros(3))


def test_int_params_get_no_gradient_and_cannot_be_asked_for() -> None:
    x, n = _var("x", (3,)), _var("n", (3,), "int32")
    func = relay.Function([x, n], relay.multiply(x, relay.cast(n, F64)))
    gf = gradient(func)
    assert len(gf.body.fields[1].fields) == 1
    _, gx = _run(gf, RNG.standard_normal(3), np.array([1, 2, 3], np.int32))
    np.testing.assert_allclose(gx, [1.0, 2.0, 3.0])
    with pytest.raises(GradientError, match="parameter n has type .*int32.*only floating-point"):
        gradient(func, wrt=["n"])
    with pytest.raises(GradientError, match="'q' is not a parameter"):
        gradient(func, wrt=["q"])


def test_tuples_built_directly_and_unused_fields() -> None:
    x, y = _var("x", (2,)), _var("y", (2,))
    t = relay.Tuple([relay.multiply(x, y), relay.sin(y), x])
    func = relay.Function([x, y], relay.add(relay.TupleGetItem(t, 0), relay.TupleGetItem(t, 0)))
    xv, yv = RNG.standard_normal(2), RNG.standard_normal(2)
    _, gx, gy = _run(gradient(func), xv, yv)
    np.testing.assert_allclose(gx, 2 * yv)
    np.testing.assert_allclose(gy, 2 * xv)
    check_grad(func, [xv, yv])


def test_constants_and_conditions_get_no_gradient() -> None:
    x, y = _var("x", (4,)), _var("y", (4,))
    cond = relay.greater(x, relay.const(0.0, F64))  # a comparison: never asked for a gradient
    func = relay.Function([x, y], relay.where(cond, relay.multiply(x, relay.const(3.0, F64)), y))
    xv, yv = np.array([-1.0, 2.0, -3.0, 4.0]), RNG.standard_normal(4)
    _, gx, gy = _run(gradient(func), xv, yv)
    np.testing.assert_array_equal(gx, [0, 3, 0, 3])
    np.testing.assert_array_equal(gy, [1, 0, 1, 0])


def test_gradient_through_a_cast_to_int_is_zero() -> None:
    x = _var("x", (3,))
    rounded = relay.cast(relay.cast(x, "int32"), F64)
    func = relay.Function([x], relay.multiply(x, rounded))
    xv = np.array([1.5, -2.25, 3.75])
    _, gx = _run(gradient(func), xv)
    np.testing.assert_allclose(gx, xv.astype(np.int32))


def test_a_chain_of_5000_ops_differentiates_without_recursion() -> None:
    x = _var("x", (4,))
    y: relay.Expr = x
    for i in range(5000):
        y = relay.tanh(y) if i % 2 else relay.multiply(y, relay.const(1.001, F64))
    gf = gradient(relay.Function([x], y))
    xv = np.linspace(-1, 1, 4)
    _, gx = _run(gf, xv)
    v, d = xv.copy(), np.ones(4)
    for i in range(5000):
        if i % 2:
            v = np.tanh(v)
            d *= 1 - v * v
        else:
            v, d = v * 1.001, d * 1.001
    np.testing.assert_allclose(gx, d, rtol=1e-9)


def _float_op(name: str, grad: Any = None, why: str | None = None) -> Callable[[relay.Expr], relay.Expr]:
    register_unary(name, "test op", lambda attrs, x: x * x, te_expr=lambda x: x * x)
    if grad is not None:
        Op.get(name).set_attr(attr.FPrimalGradient, grad)
    if why is not None:
        Op.get(name).set_attr(attr.TNonDifferentiable, why)
    return lambda e: relay.expr.call(name, [e])


def test_an_op_without_gradient_is_named_with_its_span() -> None:
    square = _float_op("test.square_nograd")
    x = _var("x", (2,))
    func = relay.Function([x], relay.exp(square(x)))  # the line of this call is the span
    with pytest.raises(GradientError, match=r"op test.square_nograd has no gradient: it registers no "
                                            r"FPrimalGradient\n  --> .*test_gradient.py:\d+") as info:
        gradient(func)
    assert "test.square_nograd(%x)" in str(info.value)


def test_an_op_marked_non_differentiable_says_why() -> None:
    square = _float_op("test.square_why", why="a test op that refuses")
    func = relay.Function([x := _var("x", (2,))], square(x))
    with pytest.raises(GradientError, match="op test.square_why has no gradient: a test op that refuses"):
        gradient(func)


def test_a_gradient_of_the_wrong_type_is_refused_naming_the_op() -> None:
    square = _float_op("test.square_badtype", grad=lambda call, g: [relay.sum(g)])
    func = relay.Function([x := _var("x", (2,))], square(x))
    with pytest.raises(GradientError, match=r"FPrimalGradient of op test.square_badtype: the gradient of "
                                            r"argument 0 has type .*\(\), float64.*expected .*\(2,\), float64"):
        gradient(func)


def test_a_user_op_with_a_gradient_differentiates_like_a_builtin() -> None:
    square = _float_op("test.square_ok", grad=lambda call, g: [relay.multiply(g, relay.add(call.args[0],
                                                                                          call.args[0]))])
    x = _var("x", (3,))
    check_grad(relay.Function([x], relay.sin(square(x))), [RNG.standard_normal(3)])


def test_bad_input_functions_are_refused() -> None:
    x = _var("x", (2,))
    with pytest.raises(GradientError, match="result must be a tensor"):
        gradient(relay.Function([x], relay.Tuple([x, x])))
    with pytest.raises(GradientError, match="unknown mode 'higher_order'"):
        gradient(relay.Function([x], x), mode="higher_order")


# -- tensor.py's ops against finite differences ------------------------------------------------------------

Gen = Callable[[tuple[int, ...]], np.ndarray]


def _normal(shape: tuple[int, ...]) -> np.ndarray:
    return RNG.standard_normal(shape)


def _uniform(lo: float, hi: float) -> Gen:
    return lambda shape: RNG.uniform(lo, hi, shape)


def _off_integers(shape: tuple[int, ...]) -> np.ndarray:
    """Away from the jumps of floor/ceil/round/sign (integers and halves)."""
    return RNG.integers(-3, 3, shape) + RNG.uniform(0.1, 0.4, shape)


UNARY_DOMAINS: dict[str, Gen] = {
    "log": _uniform(0.5, 2.0), "sqrt": _uniform(0.5, 2.0), "rsqrt": _uniform(0.5, 2.0),
    "asin": _uniform(-0.8, 0.8), "acos": _uniform(-0.8, 0.8), "atanh": _uniform(-0.8, 0.8),
    "acosh": _uniform(1.2, 3.0), "tan": _uniform(-1.0, 1.0),
    "abs": lambda shape: _off_integers(shape) * np.where(RNG.random(shape) < 0.5, -1, 1),
    "floor": _off_integers, "ceil": _off_integers, "round": _off_integers, "sign": _off_integers,
}
UNARY_OPS = sorted(name for name, *_, grad in tensor._UNARY + tensor._MATH_UNARY if not isinstance(grad, str))
SHAPES = [(5,), (2, 3)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name", UNARY_OPS)
def test_unary_gradient_matches_finite_differences(name: str, shape: tuple[int, ...]) -> None:
    x = _var("x", shape)
    check_grad(relay.Function([x], getattr(tensor, name)(x)), [UNARY_DOMAINS.get(name, _normal)(shape)])


def _positive(shape: tuple[int, ...]) -> np.ndarray:
    return RNG.uniform(0.5, 2.0, shape)


def _mod_pair(shapes: tuple[tuple[int, ...], tuple[int, ...]]) -> tuple[np.ndarray, np.ndarray]:
    """a, b with every a / b at least 0.19 from an integer, where fmod, floor_mod and floor_divide jump."""
    a = RNG.integers(-3, 3, shapes[0]) + RNG.uniform(0.3, 0.7, shapes[0])
    b = RNG.uniform(0.97, 1.03, shapes[1]) * np.where(RNG.random(shapes[1]) < 0.5, -1, 1)
    return a, b


BINARY_INPUTS: dict[str, Callable[[tuple[tuple[int, ...], tuple[int, ...]]], tuple[np.ndarray, np.ndarray]]] = {
    "divide": lambda s: (_normal(s[0]), _positive(s[1])),
    "power": lambda s: (_positive(s[0]), _normal(s[1])),
    "floor_divide": lambda s: _mod_pair(s),
    "floor_mod": lambda s: _mod_pair(s),
    "fmod": lambda s: _mod_pair(s),
}
BINARY_OPS = sorted(name for name, *_, grad in tensor._BINARY + tensor._MATH_BINARY if not isinstance(grad, str))
BINARY_SHAPES = [((2, 3), (2, 3)), ((2, 1, 3), (4, 1))]


@pytest.mark.parametrize("shapes", BINARY_SHAPES)
@pytest.mark.parametrize("name", BINARY_OPS)
def test_binary_gradient_matches_finite_differences(name: str, shapes: Any) -> None:
    a, b = _var("a", shapes[0]), _var("b", shapes[1])
    inputs = BINARY_INPUTS.get(name, lambda s: (_normal(s[0]), _normal(s[1])))(shapes)
    check_grad(relay.Function([a, b], getattr(tensor, name)(a, b)), list(inputs))


@pytest.mark.parametrize("shape", SHAPES)
def test_clip_gradient_passes_inside_the_bounds_only(shape: tuple[int, ...]) -> None:
    x = _var("x", shape)
    values = RNG.choice([-1.7, -0.6, -0.1, 0.3, 0.8, 1.9], shape) + RNG.uniform(-0.05, 0.05, shape)
    check_grad(relay.Function([x], relay.clip(x, -1.0, 1.0)), [values])
    _, gx = _run(gradient(relay.Function([x], relay.clip(x, -1.0, 1.0))), values)
    np.testing.assert_array_equal(gx, (np.abs(values) <= 1.0).astype(float))


@pytest.mark.parametrize("shapes", [((2, 3), (2, 3), (2, 3)), ((2, 1), (3,), (2, 3))])
def test_where_gradient_goes_to_the_chosen_side(shapes: Any) -> None:
    c = _var("c", shapes[0], "bool")
    x, y = _var("x", shapes[1]), _var("y", shapes[2])
    cond = RNG.random(shapes[0]) < 0.5
    check_grad(relay.Function([c, x, y], relay.where(c, x, y)), [cond, _normal(shapes[1]), _normal(shapes[2])])


@pytest.mark.parametrize("shape", SHAPES)
def test_cast_between_floats_casts_the_gradient_back(shape: tuple[int, ...]) -> None:
    x = _var("x", shape, "float32")
    func = relay.Function([x], relay.multiply(relay.cast(x, F64), relay.cast(x, F64)))
    check_grad(func, [_normal(shape).astype(np.float32)], rtol=1e-3, atol=1e-4)
    gf = gradient(func)
    assert str(gf.body.fields[1].fields[0].checked_type.dtype) == "float32"


def test_cast_to_int_gradient_raises_when_asked_directly() -> None:
    x = _var("x", (2,))
    typed = relay.infer_type(relay.Function([x], relay.cast(x, "int32")))
    with pytest.raises(OpGradientError, match="op cast: a cast to int32 has no gradient"):
        Op.get("cast").get_attr(attr.FPrimalGradient)(typed.body, relay.var("g", shape=(2,), dtype="int32"))


def test_every_op_of_tensor_py_has_a_gradient_or_a_reason() -> None:
    names = [row[0] for row in tensor._UNARY + tensor._BINARY + tensor._MATH_UNARY + tensor._MATH_BINARY]
    names += ["clip", "cast", "reinterpret", "where", "isnan", "isinf"]
    for name in names:
        op = Op.get(name)
        assert op.has_attr(attr.FPrimalGradient) != op.has_attr(attr.TNonDifferentiable), name
    assert Op.get("less").get_attr(attr.TNonDifferentiable).startswith("a comparison")


# the modules whose tests check named ops' gradients against finite differences (check_op_grad cases)
_OP_GRAD_TESTS = ["relay/op/test_grad_nn.py", "relay/op/test_grad_shape.py", "relay/op/test_grad_image.py",
                  "relay/op/test_loss.py"]


def test_every_op_with_a_gradient_is_checked_against_finite_differences() -> None:
    import pathlib

    import kiln.relay.op  # noqa: F401  (every family module registered)

    tests = pathlib.Path(__file__).parents[2]
    text = "".join((tests / f).read_text() for f in _OP_GRAD_TESTS)
    checked = {*UNARY_OPS, *BINARY_OPS, "clip", "where", "cast"}
    checked |= {name for name in Op.list_names() if f'"{name}"' in text}
    with_gradient = {name for name in Op.list_names() if Op.get(name).has_attr(attr.FPrimalGradient)}
    assert not with_gradient - checked, "gradients no finite-difference test checks"
