"""Values computed from symbolic shapes at import: `Shape(x)` of an x of shape (n, s, 768) is the value
[n, s, 768], whose size variables stay symbolic.

Exporters compute shapes at run time: `x.view(x.size(0), x.size(1), 12, 64)` is Shape -> Gather -> Unsqueeze
-> Concat -> Reshape. With static shapes such a chain folds to a constant; with symbolic ones the importer keeps
its value as an object array of dims (ints and `SymDim`s) beside the Relay expression that computes it at run
time. The ops below evaluate on such values, as numpy does on object arrays (dims add, subtract, multiply and
floor-divide, `kiln.ir.types`: s // 2 is a dim); a value that comes out all ints becomes a constant again,
and a converter reads a symbolic one with `OnnxNode.symbolic_value`: Reshape, Slice, Expand and Range take
such dims as they are (`s`, `2*s`, `floordiv(s, 2)`), for attributes that name sizes. A value these ops cannot compute
is not recorded: a converter that needs it then says which graph inputs decide it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from kiln import relay
from kiln.ir.types import SymDim
from kiln.relay.expr import Constant, Expr

if TYPE_CHECKING:
    from kiln.relay.frontend.onnx import OnnxNode

Array = np.ndarray[Any, Any]


def _axes(node: OnnxNode, values: list[Array | None], i: int) -> list[int] | None:
    """The axes of Unsqueeze / Squeeze: an attribute before opset 13, input `i` from it on."""
    if node.opset < 13:
        return node.ints_attr("axes", None)
    given = values[i] if i < len(values) else None
    return None if given is None else [int(a) for a in given.reshape(-1)]


def _unsqueeze(node: OnnxNode, v: list[Array | None]) -> Array:
    out, axes = v[0], _axes(node, v, 1)
    assert out is not None and axes is not None
    rank = out.ndim + len(axes)
    for a in sorted(a % rank for a in axes):
        out = np.expand_dims(out, a)
    return out


def _squeeze(node: OnnxNode, v: list[Array | None]) -> Array:
    axes = _axes(node, v, 1)
    assert v[0] is not None
    return np.squeeze(v[0], axis=None if axes is None else tuple(axes))


def _slice(node: OnnxNode, v: list[Array | None]) -> Array:
    data = v[0]
    assert data is not None
    if node.opset < 10:
        starts, ends = node.ints_attr("starts") or [], node.ints_attr("ends") or []
        axes = node.ints_attr("axes", None) or list(range(len(starts)))
        steps = [1] * len(starts)
    else:
        starts, ends = ([int(x) for x in a.reshape(-1)] for a in (v[1], v[2]) if a is not None)
        axes = [int(x) for x in v[3].reshape(-1)] if len(v) > 3 and v[3] is not None else list(range(len(starts)))
        steps = [int(x) for x in v[4].reshape(-1)] if len(v) > 4 and v[4] is not None else [1] * len(starts)
    index = [slice(None)] * data.ndim
    for a, b, e, s in zip(axes, starts, ends, steps, strict=True):
        index[a % data.ndim] = slice(b, e, s)
    return data[tuple(index)]


def _concat(node: OnnxNode, v: list[Array | None]) -> Array:
    parts = [x for x in v if x is not None]
    assert len(parts) == len(v)  # Concat has no optional inputs
    return np.concatenate(parts, axis=node.int_attr("axis"))


def _binary(fn: Callable[[Any, Any], Any]) -> Callable[[OnnxNode, list[Array | None]], Array]:
    def evaluate(node: OnnxNode, v: list[Array | None]) -> Array:
        assert v[0] is not None and v[1] is not None
        return np.asarray(fn(v[0], v[1]), dtype=object)

    return evaluate


_OPS: dict[str, Callable[[OnnxNode, list[Array | None]], Array]] = {
    "Identity": lambda node, v: v[0],  # type: ignore[dict-item,return-value]
    "Gather": lambda node, v: np.take(v[0], v[1].astype(np.int64), axis=node.int_attr("axis", 0)),  # type: ignore
    "Unsqueeze": _unsqueeze,
    "Squeeze": _squeeze,
    "Concat": _concat,
    "Slice": _slice,
    "Mul": _binary(np.multiply),
    "Div": _binary(np.floor_divide),  # dims are >= 0: floor is ONNX's truncation (s // 2 is a `Quot` dim)
    "Add": _binary(np.add),
    "Sub": _binary(np.subtract),
}
_INT_DTYPES = ("int32", "int64")


def propagate(node: OnnxNode, symbolic: dict[int, Array], outputs: list[Expr]) -> list[Expr]:
    """`outputs` of a node whose inputs are constants or symbolic values: each a constant when its value came out
    static, else recorded in `symbolic` (keyed by the expression's id)."""
    if node.op_type not in _OPS and not (node.op_type == "Cast" and node.dtype(outputs[0]).name in _INT_DTYPES):
        return outputs
    values: list[Array | None] = []
    for e in node.inputs:
        if e is None:
            values.append(None)
        elif id(e) in symbolic:
            values.append(symbolic[id(e)])
        elif (const := node.const_value(e)) is not None and np.issubdtype(const.dtype, np.integer):
            values.append(const.astype(object))
        else:
            return outputs
    if not any(id(e) in symbolic for e in node.inputs if e is not None):
        return outputs
    try:
        value = values[0] if node.op_type == "Cast" else _OPS[node.op_type](node, values)
    except (ValueError, TypeError, IndexError, AssertionError, np.exceptions.AxisError):
        return outputs  # not a dim kiln can write (n + 1), or a malformed node the converter judged already
    out = outputs[0]
    if any(isinstance(d, SymDim) for d in np.asarray(value).reshape(-1)):
        symbolic[id(out)] = np.asarray(value, dtype=object)
        return outputs
    dtype = node.dtype(out).numpy()
    folded: Expr = relay.const(np.asarray(value).astype(dtype))
    assert isinstance(folded, Constant)
    return [folded, *outputs[1:]]
