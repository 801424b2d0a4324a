"""SimplifyInference: rewrites the ops that only matter in training into plain arithmetic.

- `nn.batch_norm(x, gamma, beta, mean, var)` becomes `x * scale + shift` with
  `scale = gamma / sqrt(var + eps)` (or `1 / sqrt(var + eps)` without `scale`)
  and `shift = beta - mean * scale` (or `-mean * scale` without `center`), both
  expanded to broadcast along the channel axis. This is `(x - mean) * scale +
  beta` rearranged as TVM does, so that FoldConstant turns scale and shift into
  two constants and FoldScaleAxis can move the scale into a convolution. Where
  the parameters are constants whose scale or shift is not finite, the
  rearranged form would turn the formula's ±inf into nan (inf - inf), so the
  formula is kept as written.
- `nn.dropout(x)` becomes the identity (its tuple output becomes `(x, ones_like(x))`).

`nn.layer_norm` is kept: it has its own kernel (one pass per row on llvm,
`kiln.relay.op.norm`), where mean / variance ops would be four kernels and four
passes over the activations.

Opt level 0, as TVM: relay.build always runs it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kiln.ir.module import IRModule
from kiln.ir.transform import ModulePass, PassContext
from kiln.ir.types import TensorType
from kiln.registry import Op
from kiln.relay.expr import Call, Constant, Expr, Function, Tuple, TupleGetItem, const
from kiln.relay.op import creation as _creation
from kiln.relay.op import shape as _shape
from kiln.relay.op import tensor as _tensor
from kiln.relay.transform._common import relay_pass, rewrite_module, tensor_type_of
from kiln.relay.visitor import ExprMutator


def _along(vec: Expr, axis: int, ndim: int) -> Expr:
    """A (C,) vector reshaped to broadcast along dim `axis` of a rank-`ndim` tensor."""
    trailing = ndim - 1 - axis
    return _shape.expand_dims(vec, axis=1, num_newaxis=trailing) if trailing > 0 else vec


def _eps(value: float, data: TensorType) -> Expr:
    return const(value, dtype=data.dtype)


def _finite_when_folded(a: Any, gamma: Expr, beta: Expr, mean: Expr, var: Expr) -> bool:
    """False where the parameters are constants whose folded scale or shift is not finite."""
    params = [e.data for e in (gamma, beta, mean, var) if isinstance(e, Constant)]
    if len(params) < 4:
        return True  # unknown until run time: TVM's rearranged form
    g, b, m, v = params  # in their own dtype, as FoldConstant will compute them
    with np.errstate(all="ignore"):
        scale = (g if a.scale else 1.0) / np.sqrt(v + a.epsilon)
        shift = (b if a.center else 0.0) - m * scale
    return bool(np.isfinite(scale).all() and np.isfinite(shift).all())


def _batch_norm(call: Call, data_type: TensorType, args: tuple[Expr, ...]) -> Expr:
    x, gamma, beta, mean, var = args
    a: Any = call.attrs
    ndim = data_type.ndim
    axis = a.axis % ndim
    inv_std = _tensor.rsqrt(_tensor.add(var, _eps(a.epsilon, data_type)))
    scale = _tensor.multiply(gamma, inv_std) if a.scale else inv_std
    if _finite_when_folded(a, gamma, beta, mean, var):
        shift: Expr = _tensor.negative(_tensor.multiply(mean, scale))
        if a.center:
            shift = _tensor.add(shift, beta)
        out = _tensor.add(_tensor.multiply(x, _along(scale, axis, ndim)), _along(shift, axis, ndim))
    else:
        out = _tensor.multiply(_tensor.subtract(x, _along(mean, axis, ndim)), _along(scale, axis, ndim))
        if a.center:
            out = _tensor.add(out, _along(beta, axis, ndim))
    return Tuple((out, mean, var), span=call.span)


class _Simplifier(ExprMutator):
    def __init__(self) -> None:
        super().__init__()
        self.batch_norm = Op.get("nn.batch_norm")
        self.dropout = Op.get("nn.dropout")
        self.created: set[int] = set()  # the Tuples this pass made, which TupleGetItem may look into

    def rewrite_call(self, node: Call, op: Op | Expr, args: tuple[Expr, ...]) -> Expr:
        if op is self.dropout:
            out: Expr = Tuple((args[0], _creation.ones_like(args[0])), span=node.span)
            self.created.add(id(out))
            return out
        if op is self.batch_norm:
            data_type = tensor_type_of(node.args[0])
            if data_type is not None:
                out = _batch_norm(node, data_type, args)
                self.created.add(id(out))
                return out
        return super().rewrite_call(node, op, args)

    def rewrite_tuple_getitem(self, node: TupleGetItem, value: Expr) -> Expr:
        if isinstance(value, Tuple) and id(value) in self.created:
            return value.fields[node.index]
        return super().rewrite_tuple_getitem(node, value)


def _simplify(func: Function, mod: IRModule) -> Expr:
    return _Simplifier().visit(func)


def simplify_inference(mod: IRModule, ctx: PassContext | None = None) -> IRModule:
    """`mod` with batch_norm and dropout rewritten into arithmetic (typed again); layer_norm is kept."""
    return rewrite_module(mod, _simplify, ctx)


def SimplifyInference() -> ModulePass:
    """The pass that rewrites nn.batch_norm and nn.dropout for inference (opt level 0)."""
    return relay_pass(simplify_inference, "SimplifyInference", 0)
