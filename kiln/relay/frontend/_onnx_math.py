"""ONNX converters: elementwise math, comparisons and logic, activations, products, reductions.

Each converter maps one ONNX op (for the opsets in its `since`) onto Relay
calls; the attribute defaults are ONNX's. Binary ops broadcast as numpy does
(ONNX's multidirectional broadcasting, opset 7 and up).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kiln import relay
from kiln.registry import Op
from kiln.relay.expr import Expr
from kiln.relay.frontend.onnx import OnnxNode, onnx_converter
from kiln.relay.op._rel import normalize_axis

# --- elementwise ----------------------------------------------------------------------------------


def _unary(op_type: str, fn: Callable[[Expr], Expr], since: int = 6) -> None:
    onnx_converter(op_type, since=since)(lambda node: fn(node.input(0)))


def _binary(op_type: str, fn: Callable[[Expr, Expr], Expr], since: int = 7) -> None:
    onnx_converter(op_type, since=since)(lambda node: fn(node.input(0), node.input(1)))


for _name, _fn in {
    "Neg": relay.negative, "Abs": relay.abs, "Sqrt": relay.sqrt, "Exp": relay.exp, "Log": relay.log,
    "Relu": relay.nn.relu, "Sigmoid": relay.sigmoid, "Tanh": relay.tanh, "Erf": relay.erf,
    "Not": relay.logical_not, "Floor": relay.floor, "Ceil": relay.ceil, "Sign": relay.sign,
    "Sin": relay.sin, "Cos": relay.cos, "Round": relay.round,
}.items():
    _unary(_name, _fn, since=1)

for _name, _fn2 in {
    "Add": relay.add, "Sub": relay.subtract, "Mul": relay.multiply,
    "Equal": relay.equal, "Less": relay.less, "Greater": relay.greater,
    "LessOrEqual": relay.less_equal, "GreaterOrEqual": relay.greater_equal,
    "And": relay.logical_and, "Or": relay.logical_or,
}.items():
    _binary(_name, _fn2)


@onnx_converter("Div", since=7)
def _div(node: OnnxNode) -> Expr:
    a, b = node.input(0), node.input(1)
    if node.dtype(a).is_float:
        return relay.divide(a, b)
    # ONNX integer division truncates toward zero; floor_divide rounds down.
    q = relay.floor_divide(a, b)
    r = relay.subtract(a, relay.multiply(q, b))
    zero = relay.const(np.zeros((), node.dtype(a).numpy()))
    one = relay.const(np.ones((), node.dtype(a).numpy()))
    signs_differ = relay.not_equal(relay.less(a, zero), relay.less(b, zero))
    adjust = relay.logical_and(relay.not_equal(r, zero), signs_differ)
    return relay.where(adjust, relay.add(q, one), q)


@onnx_converter("Pow", since=7)
def _pow(node: OnnxNode) -> Expr:
    base, exponent = node.input(0), node.input(1)
    dtype = node.dtype(base)
    if not dtype.is_float and node.dtype(exponent).is_float:
        # an integer to a fractional power: computed in float64 and truncated, as onnxruntime does (casting the
        # exponent to the base's integer type would truncate it first: 6 ** 0.9 would be 1, not 5)
        wide = relay.power(relay.cast(base, "float64"), relay.cast(exponent, "float64"))
        return relay.cast(wide, dtype)
    if node.dtype(exponent) != dtype:
        exponent = relay.cast(exponent, dtype)
    return relay.power(base, exponent)


@onnx_converter("Xor", since=7)
def _xor(node: OnnxNode) -> Expr:
    return relay.not_equal(node.input(0), node.input(1))


def _variadic(op_type: str, fn: Callable[[Expr, Expr], Expr], mean: bool = False) -> None:
    def convert(node: OnnxNode) -> Expr:
        args = [a for a in node.inputs if a is not None]
        if not args:
            raise node.error("needs at least one input")
        out = args[0]
        for a in args[1:]:
            out = fn(out, a)
        if mean:
            out = relay.divide(out, relay.const(np.asarray(len(args), node.dtype(out).numpy())))
        return out

    onnx_converter(op_type, since=6)(convert)


_variadic("Max", relay.maximum)
_variadic("Min", relay.minimum)
_variadic("Sum", relay.add)
_variadic("Mean", relay.add, mean=True)


@onnx_converter("Where", since=9)
def _where(node: OnnxNode) -> Expr:
    return relay.where(node.input(0), node.input(1), node.input(2))


def _scalar(node: OnnxNode, i: int, what: str) -> float | None:
    if node.optional_input(i) is None:
        return None
    value = node.const_value(node.input(i))
    if value is None:
        return None
    if value.size != 1:
        raise node.error(f"{what} must be a scalar, found shape {value.shape}")
    return float(value.reshape(()))


@onnx_converter("Clip", since=6)
def _clip_attrs(node: OnnxNode) -> Expr:
    big = float(np.finfo(np.float32).max)
    return relay.clip(node.input(0), node.float_attr("min", -big), node.float_attr("max", big))


@onnx_converter("Clip", since=11)
def _clip(node: OnnxNode) -> Expr:
    x = node.input(0)
    dtype = node.dtype(x)
    out = x
    for i, fn in ((1, relay.maximum), (2, relay.minimum)):
        bound = node.optional_input(i)
        if bound is None:
            continue
        value = _scalar(node, i, ("min", "max")[i - 1])
        if value is not None and dtype.is_float and np.isinf(value) and (value < 0) == (i == 1):
            continue  # min -inf or max +inf bounds nothing (max -inf makes everything -inf)
        shape = node.shape(bound)
        if any(d != 1 for d in shape):
            raise node.error(f"input #{i} ({('min', 'max')[i - 1]}) must be a scalar, found shape {shape}")
        if shape:  # a (1,) bound must not add an axis to a scalar input
            bound = relay.reshape(bound, [])
        out = fn(out, bound if node.dtype(bound) == dtype else relay.cast(bound, dtype))
    return out


# --- activations ----------------------------------------------------------------------------------


def _fconst(node: OnnxNode, x: Expr, value: float) -> Expr:
    return relay.const(np.asarray(value, node.dtype(x).numpy()))


@onnx_converter("LeakyRelu", since=6)
def _leaky_relu(node: OnnxNode) -> Expr:
    return relay.nn.leaky_relu(node.input(0), node.float_attr("alpha", 0.01))


@onnx_converter("PRelu", since=7)
def _prelu(node: OnnxNode) -> Expr:
    x, slope = node.input(0), node.input(1)
    node.check_broadcasts_to(slope, node.shape(x), "the slope")
    zero = _fconst(node, x, 0.0)
    return relay.where(relay.less(x, zero), relay.multiply(x, slope), x)


@onnx_converter("Gelu", since=20)
def _gelu(node: OnnxNode) -> Expr:
    approximate = node.attr("approximate", "none")
    if approximate not in ("none", "tanh"):
        raise node.error(f"approximate must be 'none' or 'tanh', found {approximate!r}")
    return relay.nn.gelu(node.input(0), approximate)


@onnx_converter("HardSigmoid", since=6)
def _hard_sigmoid(node: OnnxNode) -> Expr:
    x = node.input(0)
    alpha, beta = node.float_attr("alpha", 0.2), node.float_attr("beta", 0.5)
    return relay.clip(relay.add(relay.multiply(x, _fconst(node, x, alpha)), _fconst(node, x, beta)), 0.0, 1.0)


@onnx_converter("HardSwish", since=14)
def _hard_swish(node: OnnxNode) -> Expr:
    x = node.input(0)
    gate = relay.clip(relay.add(relay.multiply(x, _fconst(node, x, 1 / 6)), _fconst(node, x, 0.5)), 0.0, 1.0)
    return relay.multiply(x, gate)


@onnx_converter("Softplus", since=1)
def _softplus(node: OnnxNode) -> Expr:
    x = node.input(0)
    return relay.log(relay.add(relay.exp(x), _fconst(node, x, 1.0)))


def _softmax(op_type: str, fn: Callable[..., Expr]) -> None:
    @onnx_converter(op_type, since=1)
    def before_13(node: OnnxNode) -> Expr:
        # Before opset 13 the input is coerced to 2-D at `axis`: softmax over all the trailing dims.
        x = node.input(0)
        shape = node.static_shape(x)
        axis = normalize_axis(node.int_attr("axis", 1), len(shape))
        inner = int(np.prod(shape[axis:]))
        # static sizes, so a 0 is an empty dim (allowzero), not "copy the input's dim"
        flat = relay.reshape(x, (int(np.prod(shape[:axis])), inner), allowzero=True)
        return relay.reshape(fn(flat, axis=1), shape, allowzero=True)

    @onnx_converter(op_type, since=13)
    def since_13(node: OnnxNode) -> Expr:
        return fn(node.input(0), axis=node.int_attr("axis", -1))


_softmax("Softmax", relay.nn.softmax)
_softmax("LogSoftmax", relay.nn.log_softmax)


# --- dropout -----------------------------------------------------------------------------------


@onnx_converter("Dropout", since=1)
def _dropout(node: OnnxNode) -> list[Expr]:
    """Inference: the input passes through; the optional mask is all true."""
    x = node.input(0)
    for i, what in ((1, "ratio"), (2, "training_mode")):
        if node.optional_input(i) is not None and node.ndim(i) != 0:
            raise node.error(f"input #{i} ({what}) must be a scalar, found shape {node.shape(i)}")
    training = node.optional_input(2)
    if training is not None and node.value(2, "training_mode").any():
        ratio = float(node.value(1, "ratio").reshape(-1)[0]) if node.optional_input(1) is not None else 0.5
        if ratio != 0.0:  # with ratio 0, training drops nothing
            raise node.error("training mode with a ratio above 0 is not supported: kiln compiles inference "
                             "graphs, and a random mask would differ from run to run")
    outs = [x]
    if len(node.outputs) > 1 and node.outputs[1]:
        outs.append(relay.ones_like(relay.cast(x, "bool")))
    return outs


# --- products -------------------------------------------------------------------------------------


@onnx_converter("MatMul", since=1)
def _matmul(node: OnnxNode) -> Expr:
    a, b = node.input(0), node.input(1)
    ra, rb = node.ndim(a), node.ndim(b)
    if ra == 0 or rb == 0:
        raise node.error("MatMul needs operands of rank 1 or more")
    if rb == 2 and ra >= 2:
        # A weight matrix: nn.dense of (..., K) against Bᵀ (folded when B is constant). Without a reshape
        # to 2-D around it, a following bias add or activation fuses into the product's epilogue.
        return relay.nn.dense(a, relay.transpose(b, (1, 0)))
    squeeze: list[int] = []
    if ra == 1:
        a = relay.expand_dims(a, 0)
        squeeze.append(-2)
    if rb == 1:
        b = relay.expand_dims(b, 1)
        squeeze.append(-1)
    out = relay.nn.matmul(a, b)
    if squeeze:
        out = relay.squeeze(out, [len(node.shape(out)) + s for s in squeeze])
    return out


@onnx_converter("Gemm", since=7)
def _gemm(node: OnnxNode) -> Expr:
    a, b = node.input(0), node.input(1)
    alpha, beta = node.float_attr("alpha", 1.0), node.float_attr("beta", 1.0)
    if node.ndim(a) != 2 or node.ndim(b) != 2:
        raise node.error(f"A and B must be matrices, found ranks {node.ndim(a)} and {node.ndim(b)}")
    if node.bool_attr("transA", False):
        a = relay.transpose(a, (1, 0))
    if not node.bool_attr("transB", False):
        b = relay.transpose(b, (1, 0))
    c = node.optional_input(2)
    if c is not None:
        node.check_broadcasts_to(c, (node.shape(a)[0], node.shape(b)[0]), "the bias C")
    matrix = a
    flat = _flattened(node, a)
    if flat is not None and (c is None or all(d == 1 for d in node.shape(c)[:-1])):
        a = flat  # A is x (..., K) reshaped to (M, K): the product on x itself, reshaped after its epilogue
    out = relay.nn.dense(a, b)
    if alpha != 1.0:
        out = relay.multiply(out, _fconst(node, out, alpha))
    if c is not None and beta != 0.0:
        if beta != 1.0:
            c = relay.multiply(c, _fconst(node, c, beta))
        out = relay.add(out, c if a is matrix else relay.reshape(c, [-1]) if node.ndim(c) == 2 else c)
    if a is not matrix:
        out = relay.reshape(out, [node.shape(matrix)[0], node.shape(b)[0]], allowzero=True)
    return out


def _flattened(node: OnnxNode, a: Expr) -> Expr | None:
    """x when `a` is reshape(x, (M, K)) of an x (..., K) of rank 3 or more (static K), else None."""
    if not (isinstance(a, relay.Call) and a.op is Op.get("reshape")):
        return None
    x = a.args[0]
    shape = node.shape(x)
    if len(shape) < 3 or not isinstance(shape[-1], int) or shape[-1] != node.shape(a)[-1]:
        return None
    return x


# --- reductions -----------------------------------------------------------------------------------


def _axes(node: OnnxNode, from_input: bool) -> list[int] | None:
    if from_input:
        given = node.optional_input(1)
        if given is None:
            return None
        axes = node.value(given, "axes")
        if axes.ndim != 1 or not np.issubdtype(axes.dtype, np.integer):
            raise node.error(f"input #1 (axes) must be a 1-D tensor of integers, found {axes.dtype} of shape "
                             f"{axes.shape}")
        return [int(a) for a in axes]
    return node.ints_attr("axes", None)


def _reduce(op_type: str, fn: Callable[..., Expr], input_axes_since: int, identity: float) -> None:
    def make(from_input: bool) -> Callable[[OnnxNode], Expr]:
        def convert(node: OnnxNode) -> Expr:
            x = node.input(0)
            keepdims = node.bool_attr("keepdims", True)
            axes = _axes(node, from_input)
            if not axes:  # absent or empty: every axis, unless noop_with_empty_axes (opset 13/18 and up)
                if node.bool_attr("noop_with_empty_axes", False):
                    return x
                axes = list(range(node.ndim(x)))
            shape = node.shape(x)
            if any(shape[a] == 0 for a in axes):  # a reduction of no elements is the identity
                out = [1 if i in axes or i - len(shape) in axes else d for i, d in enumerate(shape)]
                if not keepdims:
                    out = [d for i, d in enumerate(out) if i not in axes and i - len(shape) not in axes]
                dtype = node.dtype(x).numpy()
                value = np.asarray(identity).astype(dtype) if dtype != np.bool_ else np.asarray(identity > 0)
                return relay.const(np.full(out, value, dtype))
            return fn(x, axes, keepdims)

        return convert

    onnx_converter(op_type, since=1)(make(False))
    onnx_converter(op_type, since=input_axes_since)(make(True))


_reduce("ReduceSum", relay.sum, 13, 0.0)
_reduce("ReduceMean", relay.mean, 18, np.nan)
_reduce("ReduceMax", relay.max, 18, -np.inf)
_reduce("ReduceMin", relay.min, 18, np.inf)
_reduce("ReduceProd", relay.prod, 18, 1.0)


def _arg(op_type: str, fn: Callable[..., Expr]) -> None:
    @onnx_converter(op_type, since=1)
    def convert(node: OnnxNode) -> Expr:
        out = fn(
            node.input(0),
            axis=node.int_attr("axis", 0),
            keepdims=node.bool_attr("keepdims", True),
            select_last_index=node.bool_attr("select_last_index", False),
        )
        return relay.cast(out, "int64")


_arg("ArgMax", relay.argmax)
_arg("ArgMin", relay.argmin)

