"""FoldScaleAxis: folds a per-output-channel scale that follows a conv2d or dense into its weight.

```
multiply(nn.conv2d(x, W), S)            ->  nn.conv2d(x, W * S[:, None, None, None])
multiply(add(nn.conv2d(x, W), B), S)    ->  add(nn.conv2d(x, W * S'), B * S)
multiply(nn.bias_add(nn.dense(x, W), b), S)  ->  nn.bias_add(nn.dense(x, W * S[:, None]), b * S)
```

The weight W, the bias and the scale S must be constants; S must be constant
along every axis but the output-channel one (shaped (C, 1, 1), (1, C, 1, 1),
(C,) for dense, or a scalar); conv2d must be NCHW / OIHW. Each intermediate
result must have no other use, so no work is duplicated. The new weights are
computed here, in numpy. After SimplifyInference and FoldConstant a
conv2d → batch_norm becomes conv2d → add of a constant bias.

This is TVM's BackwardFoldScaleAxis (a scale after the producer, folded back
into its output channels), in one rewrite; the forward direction (a scale on
the input channels) is not done. Opt level 3, as TVM; relay.build runs at opt
level 3 unless a PassContext says otherwise.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kiln.ir.module import IRModule
from kiln.ir.transform import ModulePass, PassContext
from kiln.registry import Op
from kiln.relay.expr import Call, Constant, Expr, Function
from kiln.relay.transform._common import relay_pass, rewrite_module, tensor_type_of, use_counts
from kiln.relay.visitor import ExprMutator

Array = np.ndarray[Any, Any]


def _channel_vector(scale: Array, ndim: int, axis: int, channels: int) -> Array | None:
    """`scale` as a (channels,) vector if it varies only along `axis` of a rank-`ndim` result."""
    if scale.ndim > ndim or not np.isfinite(scale).all():  # inf * W summed is nan where inf * (x @ W) is not
        return None
    padded = (1,) * (ndim - scale.ndim) + tuple(scale.shape)
    if any(d != 1 for i, d in enumerate(padded) if i != axis) or padded[axis] not in (1, channels):
        return None
    return np.broadcast_to(scale.reshape(-1), (channels,))


class _ScaleFolder(ExprMutator):
    def __init__(self, root: Expr) -> None:
        super().__init__()
        self.uses = use_counts(root)
        self.multiply = Op.get("multiply")
        self.add = Op.get("add")
        self.bias_add = Op.get("nn.bias_add")
        self.conv2d = Op.get("nn.conv2d")
        self.dense = Op.get("nn.dense")

    def _single_use(self, e: Expr) -> bool:
        return self.uses.get(id(e), 0) == 1

    def _producer(self, e: Expr, dtype: np.dtype[Any]) -> tuple[Call, Array, int] | None:
        """(call, weight, output-channel axis counted from the end) if `e` is a foldable conv2d / dense."""
        if not isinstance(e, Call) or not self._single_use(e) or len(e.args) != 2:
            return None
        weight = e.args[1]
        if not isinstance(weight, Constant) or weight.data.dtype != dtype:
            return None
        a: Any = e.attrs
        if getattr(a, "out_dtype", None) not in (None, weight.type.dtype):
            return None
        if e.op is self.conv2d and a.data_layout == "NCHW" and a.kernel_layout == "OIHW":
            return e, weight.data, -3
        if e.op is self.dense:
            return e, weight.data, -1
        return None

    def _fold(self, node: Call, inner: Expr, scale: Constant) -> Expr | None:
        out_type = tensor_type_of(node)
        if out_type is None or not out_type.is_static or not self._single_use(inner):
            return None
        dtype = scale.data.dtype
        bias: Constant | None = None
        producer = self._producer(inner, dtype)
        wrapper: Call | None = None
        if producer is None and isinstance(inner, Call) and inner.op in (self.add, self.bias_add):
            wrapper = inner
            for i in (0, 1) if inner.op is self.add else (0,):
                candidate, other = inner.args[i], inner.args[1 - i]
                producer = self._producer(candidate, dtype)
                if producer is not None and isinstance(other, Constant) and other.data.dtype == dtype:
                    bias = other
                    break
                producer = None
        if producer is None:
            return None
        call, weight, axis_from_end = producer
        ndim = out_type.ndim
        axis = ndim + axis_from_end
        channels = weight.shape[0]
        if axis < 0 or out_type.shape[axis] != channels:
            return None
        vec = _channel_vector(scale.data, ndim, axis, channels)
        if vec is None:
            return None
        new_weight = (weight * vec.reshape((channels,) + (1,) * (weight.ndim - 1))).astype(weight.dtype)
        new_call = Call(call.op, (call.args[0], Constant(new_weight)), call.attrs, span=call.span)
        self.uses[id(new_call)] = 1  # its one user is the node that replaces `node`
        if wrapper is None:
            return new_call
        assert bias is not None
        if wrapper.op is self.bias_add:
            b_axis: int = getattr(wrapper.attrs, "axis", 1)
            if b_axis % ndim != axis or bias.data.shape != (channels,):
                return None
            new_bias = (bias.data * vec).astype(dtype)
        else:
            new_bias = (bias.data * scale.data).astype(dtype)
            if np.broadcast_shapes(new_bias.shape, out_type.concrete_shape) != out_type.concrete_shape:
                return None
        args = (new_call, Constant(new_bias)) if wrapper.args[0] is not bias else (Constant(new_bias), new_call)
        return Call(wrapper.op, args, wrapper.attrs, span=wrapper.span)

    def rewrite_call(self, node: Call, op: Op | Expr, args: tuple[Expr, ...]) -> Expr:
        new = super().rewrite_call(node, op, args)
        if op is self.multiply:
            for i in (0, 1):
                inner, scale = args[i], args[1 - i]
                old_inner = node.args[i]
                same_shape = tensor_type_of(old_inner) is not None and tensor_type_of(old_inner) == tensor_type_of(node)
                if isinstance(scale, Constant) and same_shape:
                    folded = self._fold(node, inner, scale)
                    if folded is not None:
                        new = folded
                        break
        if new is not node:
            self.uses[id(new)] = self.uses.get(id(node), 0)  # the new node has the users of the old one
        return new


def _fold_scale(func: Function, mod: IRModule) -> Expr:
    return _ScaleFolder(func).visit(func)


def fold_scale_axis(mod: IRModule, ctx: PassContext | None = None) -> IRModule:
    """`mod` with per-channel scales after conv2d / dense folded into their weights (typed again)."""
    return rewrite_module(mod, _fold_scale, ctx)


def FoldScaleAxis() -> ModulePass:
    """The pass that folds per-output-channel scales into conv2d / dense weights (opt level 3)."""
    return relay_pass(fold_scale_axis, "FoldScaleAxis", 3)
