"""ONNX converters of the tensor ops: shapes, layout, indexing, padding, casts and constants.

Reshape, Transpose, Concat, Split, Squeeze, Unsqueeze, Flatten, Slice, Gather,
Pad, Cast, Expand, Tile, Shape, Identity, Constant, ConstantOfShape and Range,
each registered for the opsets where its attributes or inputs changed meaning
(Squeeze's axes became an input at opset 13, Slice's starts/ends at 10, Pad's
pads at 11, Split's sizes at 13, ...).

kiln compiles static shapes, so every value that decides a shape (Reshape's
shape, Slice's starts, Pad's pads, Tile's repeats, ...) must be a constant: an
initializer, a Constant node, or shape arithmetic on static shapes, which the
importer folds as it goes. When one is not, the converter raises an error that
names the node and the input. Semantics follow the ONNX operator spec: negative
axes count from the end, Slice clamps its bounds as ONNX does (negative steps
included), Gather accepts negative indices, Expand broadcasts both ways.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np

from kiln import relay
from kiln.ir.dtype import DataType
from kiln.ir.types import ANY, Dim
from kiln.registry import Op
from kiln.relay.expr import Constant, Expr, TupleGetItem
from kiln.relay.frontend.onnx import OnnxNode, onnx_converter, onnx_dtype
from kiln.relay.op._rel import normalize_axis
from kiln.relay.op.indexing import check_axes

# An end this large means "to the end of the axis" in strided_slice (see indexing.py).
_TO_END = 2**63 - 1


# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------


def _int_values(node: OnnxNode, i: int, what: str, rank: int | None = 1) -> list[int] | None:
    """The integer values of optional input `i` (flattened), None when it is absent; it must be constant.

    The input must have rank `rank` (a 1-D list, unless None): onnxruntime refuses others, and
    flattening a (2, 1) 'axes' would silently read it as a list.
    """
    if node.optional_input(i) is None:
        return None
    value = node.value(i, what)
    if not np.issubdtype(value.dtype, np.integer):
        raise node.error(f"input #{i} ({what}) must hold integers, found dtype {value.dtype}")
    if rank is not None and value.ndim != rank:
        raise node.error(f"input #{i} ({what}) must be a {rank}-D tensor, found shape {value.shape}")
    return [int(v) for v in value.reshape(-1)]


def _required_ints(node: OnnxNode, i: int, what: str, rank: int | None = 1) -> list[int]:
    """The integer values of input `i`, which must be given and constant."""
    node.input(i, what)  # the error naming the input when the node leaves it out
    return _int_values(node, i, what, rank) or []


def _dim_values(node: OnnxNode, i: int, what: str) -> list[Any]:
    """The values of input `i` as dims: computed from symbolic shapes (`_onnx_symbolic`: ints and sizes such
    as `s`), else constant ints."""
    symbolic = node.symbolic_value(i)
    if symbolic is not None and symbolic.ndim == 1:
        return [int(d) if isinstance(d, (int, np.integer)) else d for d in symbolic]
    return _required_ints(node, i, what)


def _ints_attr(node: OnnxNode, name: str) -> list[int]:
    """The required list-of-ints attribute `name` (an error naming the node when it is missing)."""
    return node.ints_attr(name) or []


def _static(dims: Sequence[Dim]) -> list[int] | None:
    """The dims as ints, or None when one is symbolic."""
    ints = [d for d in dims if isinstance(d, int)]
    return ints if len(ints) == len(dims) else None


# ---------------------------------------------------------------------------
# Reshape, Transpose, Flatten, Squeeze, Unsqueeze
# ---------------------------------------------------------------------------


def _reshape(node: OnnxNode, shape: list[Any], allowzero: bool) -> Expr:
    if any(isinstance(v, int) and v < -1 for v in shape) or shape.count(-1) > 1:
        raise node.error(f"shape {shape} may hold at most one -1 and no other negative value")
    if allowzero and 0 in shape and -1 in shape:
        raise node.error(f"shape {shape} holds both 0 and -1, which allowzero=1 forbids")
    x = node.input(0)
    out = relay.reshape(x, shape, allowzero=allowzero)
    if ANY in node.shape(out):
        return out
    # a reshape of a reshape is one reshape of the first one's input, and a reshape to the shape it has is
    # nothing: exporters wrap 2-D Gemms in reshapes (x (1, S, K) -> (S, K) -> Gemm -> (1, S, N)), which
    # the Gemm converter then leaves around an N-D product whose epilogue (bias, GELU) can fuse
    if isinstance(x, relay.Call) and x.op is _RESHAPE and ANY not in node.shape(x.args[0]):
        x = x.args[0]
        out = relay.reshape(x, list(node.shape(out)), allowzero=True)
    return x if tuple(node.shape(x)) == tuple(node.shape(out)) else out


_RESHAPE = Op.get("reshape")


@onnx_converter("Reshape", since=1)
def _reshape_v1(node: OnnxNode) -> Expr:
    return _reshape(node, _ints_attr(node, "shape"), allowzero=False)


@onnx_converter("Reshape", since=5)
def _reshape_v5(node: OnnxNode) -> Expr:
    allowzero = node.bool_attr("allowzero", False)
    symbolic = node.symbolic_value(1)
    if symbolic is not None:
        return _reshape_symbolic(node, list(symbolic.reshape(-1)), allowzero)
    return _reshape(node, _required_ints(node, 1, "shape"), allowzero=allowzero)


def _reshape_symbolic(node: OnnxNode, dims: list[Any], allowzero: bool) -> Expr:
    """A reshape to a shape computed from symbolic dims (`x.view(x.size(0), x.size(1), 12, 64)`): each dim
    the input has at the same place is kept (0), the others are written as they are (`n`, `2*s`, 64)."""
    have = node.shape(0)
    shape: list[Any] = [0 if not allowzero and i < len(have) and have[i] == d and not isinstance(d, int) else d
                        for i, d in enumerate(int(d) if isinstance(d, np.integer) else d for d in dims)]
    out = _reshape(node, shape, allowzero=allowzero)
    got = node.shape(out)
    if any(not isinstance(d, (int, np.integer)) and g != d for d, g in zip(dims, got, strict=True)):
        raise node.error(f"reshape to {[str(d) for d in dims]} gives {[str(g) for g in got]}")
    return out


@onnx_converter("Transpose", since=1)
def _transpose(node: OnnxNode) -> Expr:
    perm = node.ints_attr("perm", None)
    rank = node.ndim(0)
    if perm is not None and sorted(check_axes(perm, rank, "perm entry")) != list(range(rank)):
        raise node.error(f"perm {perm} is not a permutation of the {rank} axes of the input")
    return relay.transpose(node.input(0), perm)


@onnx_converter("Flatten", since=1)
def _flatten(node: OnnxNode) -> Expr:
    x = node.input(0)
    dims = node.shape(0)
    rank = len(dims)
    axis = node.int_attr("axis", 1)
    if not -rank <= axis <= rank:
        raise node.error(f"axis {axis} is out of range for an input of rank {rank} (allowed: {-rank} to {rank})")
    axis = axis + rank if axis < 0 else axis
    outer, inner = _static(dims[:axis]), _static(dims[axis:])
    if outer is not None and inner is not None:  # static: a 0 is an empty dim (allowzero), not a copy
        return relay.reshape(x, [int(np.prod(outer)), int(np.prod(inner))], allowzero=True)
    if axis == 1:
        newshape = [0, -1]  # 0 copies the (symbolic) first dim
    elif inner is not None:
        newshape = [-1, int(np.prod(inner))]
    elif outer is not None:
        newshape = [int(np.prod(outer)), -1]
    else:
        raise node.error(f"cannot flatten the shape {tuple(str(d) for d in dims)} at axis {axis}: symbolic dims "
                         "on both sides; give static shapes")
    return relay.reshape(x, newshape)


def _squeeze(node: OnnxNode, axes: list[int] | None) -> Expr:
    x = node.input(0)
    dims = node.shape(0)
    if axes is None:
        if _static(dims) is None:
            raise node.error(f"Squeeze without axes needs static dims to find the dims of size 1, found shape "
                             f"{tuple(str(d) for d in dims)}; give the axes")
        return relay.squeeze(x) if 1 in dims else x
    normalized = check_axes(axes, len(dims))
    for a in normalized:
        if isinstance(dims[a], int) and dims[a] != 1:
            raise node.error(f"cannot squeeze axis {a} of shape {tuple(dims)}: its size is {dims[a]}, not 1")
    return relay.squeeze(x, normalized) if normalized else x


@onnx_converter("Squeeze", since=1)
def _squeeze_v1(node: OnnxNode) -> Expr:
    return _squeeze(node, node.ints_attr("axes", None))


@onnx_converter("Squeeze", since=13)
def _squeeze_v13(node: OnnxNode) -> Expr:
    return _squeeze(node, _int_values(node, 1, "axes"))


def _unsqueeze(node: OnnxNode, axes: list[int]) -> Expr:
    out: Expr = node.input(0)
    rank = node.ndim(0) + len(axes)
    for a in sorted(check_axes(axes, rank)):  # ascending: each lands at its final position
        out = relay.expand_dims(out, a)
    return out


@onnx_converter("Unsqueeze", since=1)
def _unsqueeze_v1(node: OnnxNode) -> Expr:
    return _unsqueeze(node, _ints_attr(node, "axes"))


@onnx_converter("Unsqueeze", since=13)
def _unsqueeze_v13(node: OnnxNode) -> Expr:
    # a 0-d axes is one axis, as ONNX's reference reads it
    return _unsqueeze(node, _required_ints(node, 1, "axes", rank=0 if node.ndim(node.input(1, "axes")) == 0 else 1))


# ---------------------------------------------------------------------------
# Concat, Split
# ---------------------------------------------------------------------------


@onnx_converter("Concat", since=1)
def _concat(node: OnnxNode) -> Expr:
    inputs = [node.input(i) for i in range(len(node.inputs))]
    if not inputs:
        raise node.error("Concat needs at least one input")
    axis = node.int_attr("axis", 1) if node.opset < 4 else node.int_attr("axis")
    axis = normalize_axis(axis, node.ndim(inputs[0]))
    if len(inputs) == 1:
        return inputs[0]
    return relay.concatenate(inputs, axis)


def _split(node: OnnxNode, sizes: list[int] | None, num_outputs: int | None) -> list[Expr]:
    x = node.input(0)
    dims = node.shape(0)
    axis = normalize_axis(node.int_attr("axis", 0), len(dims))
    count = len(node.outputs)
    if num_outputs is not None and num_outputs != count:
        raise node.error(f"num_outputs is {num_outputs} but the node has {count} outputs")
    dim = dims[axis]
    if sizes is None:
        if not isinstance(dim, int):
            split = relay.split(x, count, axis)  # equal sections of a symbolic dim
            return [TupleGetItem(split, i) for i in range(count)]
        chunk = -(-dim // count)  # the last chunk is smaller when the dim does not divide (opset 18)
        sizes = [chunk] * (count - 1) + [dim - chunk * (count - 1)]
        if sizes[-1] < 0:
            raise node.error(f"axis {axis} of size {dim} cannot be split into {count} chunks of {chunk}")
    if len(sizes) != count:
        raise node.error(f"split {sizes} has {len(sizes)} entries but the node has {count} outputs")
    if any(s < 0 for s in sizes):
        raise node.error(f"split {sizes} holds a negative size")
    if isinstance(dim, int) and sum(sizes) != dim:
        raise node.error(f"split {sizes} adds up to {sum(sizes)}, but axis {axis} has size {dim}")
    if count == 1:
        return [x]
    # One slice per piece rather than relay.split: empty pieces are allowed, and each slice fuses
    # into its consumer (a split's tuple cannot yet be read inside a fused group).
    starts = [int(v) for v in np.cumsum([0, *sizes])]
    return [relay.strided_slice(x, [a], [b], axes=[axis]) for a, b in itertools.pairwise(starts)]


@onnx_converter("Split", since=1)
def _split_v1(node: OnnxNode) -> list[Expr]:
    sizes = _int_values(node, 1, "split") if node.optional_input(1) is not None else node.ints_attr("split", None)
    return _split(node, sizes, None)


@onnx_converter("Split", since=2)
def _split_v2(node: OnnxNode) -> list[Expr]:
    return _split(node, node.ints_attr("split", None), None)


@onnx_converter("Split", since=13)
def _split_v13(node: OnnxNode) -> list[Expr]:
    return _split(node, _int_values(node, 1, "split"), None)


@onnx_converter("Split", since=18)
def _split_v18(node: OnnxNode) -> list[Expr]:
    sizes = _int_values(node, 1, "split")
    num_outputs = node.int_attr("num_outputs") if "num_outputs" in node.attrs else None
    if (sizes is None) == (num_outputs is None):
        raise node.error("give exactly one of the input 'split' and the attribute 'num_outputs'")
    return _split(node, sizes, num_outputs)


# ---------------------------------------------------------------------------
# Slice, Gather
# ---------------------------------------------------------------------------


def _slice_bounds(start: int, end: int, step: int, dim: int) -> tuple[int, int]:
    """ONNX's start and end on an axis of size `dim`, as numpy slice bounds that select the same elements."""
    start = start + dim if start < 0 else start
    end = end + dim if end < 0 else end
    if step > 0:
        return min(max(start, 0), dim), min(max(end, 0), dim)
    start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
    return start, (end if end >= 0 else -dim - 1)  # -1 is "before index 0", which numpy spells -dim - 1


def _slice(
    node: OnnxNode, starts: list[Any], ends: list[Any], axes: list[int] | None, steps: list[int] | None
) -> Expr:
    x = node.input(0)
    dims = node.shape(0)
    k = len(starts)
    axes = list(range(k)) if axes is None else axes
    steps = [1] * k if steps is None else steps
    if not len(ends) == len(axes) == len(steps) == k:
        raise node.error(f"starts, ends, axes and steps must have one entry each per sliced axis, found "
                         f"{len(starts)}, {len(ends)}, {len(axes)} and {len(steps)}")
    begin, end, strides, sliced = [], [], [], []
    for axis, b, e, s in zip(check_axes(axes, len(dims)), starts, ends, steps, strict=True):
        if s == 0:
            raise node.error(f"the step of axis {axis} is 0")
        dim = dims[axis]
        if isinstance(dim, int) and isinstance(b, int) and isinstance(e, int):
            b, e = _slice_bounds(b, e, s, dim)
            if (b, e, s) == (0, dim, 1):
                continue  # the whole axis
        elif s < 0:
            raise node.error(f"axis {axis} is sliced [{b}:{e}] of a dim of {dim}; a negative step needs static "
                             "sizes and bounds")
        begin.append(b)
        end.append(min(e, _TO_END) if isinstance(e, int) else e)
        strides.append(s)
        sliced.append(axis)
    if not sliced:
        return x
    return relay.strided_slice(x, begin, end, strides, sliced)


@onnx_converter("Slice", since=1)
def _slice_v1(node: OnnxNode) -> Expr:
    axes = node.ints_attr("axes", None)
    return _slice(node, _ints_attr(node, "starts"), _ints_attr(node, "ends"), axes or None, None)


@onnx_converter("Slice", since=10)
def _slice_v10(node: OnnxNode) -> Expr:
    return _slice(
        node,
        _dim_values(node, 1, "starts"),
        _dim_values(node, 2, "ends"),
        _int_values(node, 3, "axes"),
        _int_values(node, 4, "steps"),
    )


@onnx_converter("Gather", since=1)
def _gather(node: OnnxNode) -> Expr:
    x, indices = node.input(0), node.input(1)
    dims = node.shape(0)
    axis = normalize_axis(node.int_attr("axis", 0), len(dims))
    if not node.dtype(indices).is_int:
        raise node.error(f"indices must be integers, found dtype {node.dtype(indices)}")
    known = node.const_value(indices)
    dim = dims[axis]
    if known is not None and isinstance(dim, int):
        if known.size and (known.min() < -dim or known.max() >= dim):
            raise node.error(f"indices {known.tolist()} are out of range for axis {axis} of size {dim}")
        if isinstance(indices, Constant):  # (an initializer that stays a parameter is left as it is)
            indices = relay.const(np.where(known < 0, known + dim, known).astype(known.dtype))
    # mode "fast" counts negative indices from the end, as ONNX does
    return relay.take(x, indices, axis=axis, mode="fast")


# ---------------------------------------------------------------------------
# Pad
# ---------------------------------------------------------------------------

_PAD_MODES = ("constant", "reflect", "edge", "wrap")


def _pad(node: OnnxNode, pads: list[int], value: Expr | float, axes: list[int] | None) -> Expr:
    x = node.input(0)
    dims = node.shape(0)
    rank = len(dims)
    mode = node.attr("mode", "constant")
    if mode not in _PAD_MODES:
        raise node.error(f"mode {mode!r} is not one of {', '.join(_PAD_MODES)}")
    axes = list(range(rank)) if axes is None else check_axes(axes, rank)
    if len(pads) != 2 * len(axes):
        raise node.error(f"pads {pads} must hold 2 entries per padded axis ({2 * len(axes)} for {len(axes)} axes)")
    widths = [[0, 0] for _ in range(rank)]
    for i, axis in enumerate(axes):
        widths[axis] = [pads[i], pads[len(axes) + i]]
    for axis, (before, after) in enumerate(widths):
        removed, dim = -min(before, 0) - min(after, 0), dims[axis]
        if isinstance(dim, int) and removed > dim:  # (a slice would clamp and hide it)
            raise node.error(f"pads {pads} remove {removed} elements from axis {axis}, which has {dim}")
    # negative pads remove elements: slice them off first, then pad what is positive
    crop = [(a, -w[0] if w[0] < 0 else 0, -w[1] if w[1] < 0 else 0) for a, w in enumerate(widths) if min(w) < 0]
    out: Expr = x
    if crop:
        out = relay.strided_slice(
            x, [c[1] for c in crop], [-c[2] if c[2] else _TO_END for c in crop], axes=[c[0] for c in crop]
        )
    pad_width = [(max(b, 0), max(a, 0)) for b, a in widths]
    if not any(b or a for b, a in pad_width):
        return out
    dtype = node.dtype(0)
    if isinstance(value, Expr):
        if isinstance(value, Constant):
            value = value.data.reshape(-1)[0].item() if value.data.size else 0
        else:
            if node.ndim(value) != 0:
                value = relay.reshape(value, [])
            if node.dtype(value) != dtype:
                value = relay.cast(value, dtype)
    if not isinstance(value, Expr):
        value = relay.const(np.asarray(value).astype(dtype.numpy()))
    return relay.nn.pad(out, pad_width, value, pad_mode=mode)


@onnx_converter("Pad", since=1)
def _pad_v1(node: OnnxNode) -> Expr:
    return _pad(node, _ints_attr(node, "paddings"), node.attr("value", 0.0), None)


@onnx_converter("Pad", since=2)
def _pad_v2(node: OnnxNode) -> Expr:
    return _pad(node, _ints_attr(node, "pads"), node.attr("value", 0.0), None)


@onnx_converter("Pad", since=11)
def _pad_v11(node: OnnxNode) -> Expr:
    value = node.optional_input(2)
    return _pad(node, _required_ints(node, 1, "pads"), 0.0 if value is None else value, _int_values(node, 3, "axes"))


# ---------------------------------------------------------------------------
# Cast, Expand, Tile
# ---------------------------------------------------------------------------


def _cast_to(node: OnnxNode, x: Expr, dtype: DataType) -> Expr:
    return x if node.dtype(x) == dtype else relay.cast(x, dtype)


@onnx_converter("Cast", since=1)
def _cast(node: OnnxNode) -> Expr:
    to = node.attr("to")
    if isinstance(to, str):  # opset 1 names the type: "FLOAT"
        import onnx

        try:
            to = onnx.TensorProto.DataType.Value(to.upper())
        except ValueError:
            raise node.error(f"attribute 'to' names the unknown type {to!r}") from None
    return _cast_to(node, node.input(0), onnx_dtype(int(to), f"attribute 'to' of {node}"))


@onnx_converter("CastLike", since=15)
def _cast_like(node: OnnxNode) -> Expr:
    return _cast_to(node, node.input(0), node.dtype(1))


@onnx_converter("Expand", since=8)
def _expand(node: OnnxNode) -> Expr:
    x = node.input(0)
    dims = list(node.shape(0))
    shape = _dim_values(node, 1, "shape")
    if any(isinstance(s, int) and s < 0 for s in shape):
        raise node.error(f"shape {shape} holds a negative dim")
    rank = max(len(dims), len(shape))
    full: list[Dim] = [1] * (rank - len(dims)) + dims
    given = [1] * (rank - len(shape)) + shape
    out: list[Dim] = []
    for k, (d, s) in enumerate(zip(full, given, strict=True)):
        if s == 1 or d == s:
            out.append(d)
        elif d == 1 or not isinstance(d, int):
            out.append(s)
        else:
            raise node.error(f"the input shape {tuple(dims)} does not broadcast with shape {shape}: "
                             f"dim {k} is {d} against {s}")
    return x if out == dims else relay.broadcast_to(x, out)


@onnx_converter("Tile", since=1)
def _tile_v1(node: OnnxNode) -> Expr:
    tiles = _required_ints(node, 1, "tiles", rank=None)
    axis = _required_ints(node, 2, "axis", rank=None)
    if len(tiles) != 1 or len(axis) != 1:
        raise node.error("tiles and axis must be scalars")
    reps = [1] * node.ndim(0)
    reps[normalize_axis(axis[0], len(reps))] = tiles[0]
    return _tile(node, reps)


@onnx_converter("Tile", since=6)
def _tile_v6(node: OnnxNode) -> Expr:
    return _tile(node, _required_ints(node, 1, "repeats"))


def _tile(node: OnnxNode, reps: list[int]) -> Expr:
    rank = node.ndim(0)
    if len(reps) != rank:
        raise node.error(f"repeats {reps} must have one entry per input dim ({rank})")
    if any(r < 0 for r in reps):
        raise node.error(f"repeats {reps} holds a negative count")
    x = node.input(0)
    return x if all(r == 1 for r in reps) else relay.tile(x, reps)


# ---------------------------------------------------------------------------
# Shape, Identity
# ---------------------------------------------------------------------------


def _shape(node: OnnxNode, start: int, end: int | None) -> Expr:
    x = node.input(0)
    dims = node.shape(0)
    picked = range(len(dims))[start:end]  # ONNX clamps start and end as Python's slices do
    static = _static(dims)
    if static is not None:
        return relay.const(np.array([static[i] for i in picked], dtype=np.int64))
    shape: Expr = relay.shape_of(x, dtype="int64")
    if len(picked) != len(dims):
        shape = relay.strided_slice(shape, [picked.start], [picked.stop], axes=[0])
    node.set_symbolic(shape, np.array([dims[i] for i in picked], dtype=object))
    return shape


@onnx_converter("Shape", since=1)
def _shape_v1(node: OnnxNode) -> Expr:
    return _shape(node, 0, None)


@onnx_converter("Shape", since=15)
def _shape_v15(node: OnnxNode) -> Expr:
    end = node.int_attr("end") if "end" in node.attrs else None
    return _shape(node, node.int_attr("start", 0), end)


@onnx_converter("Identity", since=1)
def _identity(node: OnnxNode) -> Expr:
    return node.input(0)


# ---------------------------------------------------------------------------
# Constant, ConstantOfShape, Range
# ---------------------------------------------------------------------------

_CONSTANT_ATTRS = ("value", "value_float", "value_floats", "value_int", "value_ints", "value_string",
                   "value_strings", "sparse_value")


def _sparse_to_dense(node: OnnxNode, sparse: Any) -> np.ndarray:
    from onnx import numpy_helper

    onnx_dtype(sparse.values.data_type, f"attribute 'sparse_value' of {node}")
    values = numpy_helper.to_array(sparse.values).reshape(-1)
    indices = numpy_helper.to_array(sparse.indices).astype(np.int64)
    dims = tuple(int(d) for d in sparse.dims)
    dense = np.zeros(int(np.prod(dims)), dtype=values.dtype)
    if indices.ndim == 2:  # (NNZ, rank) coordinates
        indices = np.ravel_multi_index(tuple(indices.T), dims) if indices.size else indices.reshape(-1)
    dense[indices.reshape(-1)] = values
    return dense.reshape(dims)


@onnx_converter("Constant", since=1)
def _constant(node: OnnxNode) -> Expr:
    given = [k for k in _CONSTANT_ATTRS if k in node.attrs]
    if len(given) != 1:
        raise node.error(f"a Constant needs exactly one of the attributes {', '.join(_CONSTANT_ATTRS)}, found "
                         f"{given or 'none'}")
    key, raw = given[0], node.attrs[given[0]]
    if key in ("value_string", "value_strings"):
        raise node.error(f"attribute {key!r} holds strings; kiln has no string tensors")
    if key == "sparse_value":
        value = _sparse_to_dense(node, raw)
    elif key.startswith("value_float"):
        value = np.asarray(raw, dtype=np.float32)
    elif key.startswith("value_int"):
        value = np.asarray(raw, dtype=np.int64)
    else:
        value = np.asarray(raw)
    return relay.const(value)


@onnx_converter("ConstantOfShape", since=9)
def _constant_of_shape(node: OnnxNode) -> Expr:
    shape = _required_ints(node, 0, "shape")
    if any(d < 0 for d in shape):
        raise node.error(f"shape {shape} holds a negative dim")
    fill = np.asarray(node.attr("value", np.zeros(1, np.float32)))
    if fill.size != 1:
        raise node.error(f"attribute 'value' must hold one element, found {fill.size}")
    return relay.full(relay.const(fill.reshape(())), shape, fill.dtype)


@onnx_converter("Range", since=11)
def _range(node: OnnxNode) -> Expr:
    symbolic = node.symbolic_value(1)
    if symbolic is not None and symbolic.size == 1:  # torch.arange(x.size(1)): a range to a size
        start, delta = node.scalar(0, "start"), node.scalar(2, "delta")
        if not np.issubdtype(np.asarray(start).dtype, np.integer) or int(delta) != 1:
            raise node.error(f"a range to the size {symbolic.item()} needs an integer start and delta 1, found "
                             f"start {start} and delta {delta}")
        return relay.arange(int(start), symbolic.item(), 1, dtype=node.dtype(node.input(0)))
    start, limit, delta = (node.value(i, what) for i, what in enumerate(("start", "limit", "delta")))
    for i, v in enumerate((start, limit, delta)):
        if v.size != 1:
            raise node.error(f"input #{i} must be a scalar, found shape {v.shape}")
    dtype = start.dtype
    if np.issubdtype(dtype, np.integer):
        first, stop, step = int(start.item()), int(limit.item()), int(delta.item())
        if step == 0:
            raise node.error("delta is 0")
        count = max(-((first - stop) // step), 0)  # ceil((stop - first) / step) in exact integer arithmetic
        return relay.const((first + np.arange(count, dtype=np.int64) * step).astype(dtype))
    low, high, by = float(start.item()), float(limit.item()), float(delta.item())
    if by == 0 or not np.isfinite([low, high, by]).all():
        raise node.error(f"start, limit and delta must be finite and delta non-zero, found {low}, {high}, {by}")
    count = max(int(np.ceil((high - low) / by)), 0)
    # computed in float64 and rounded once: at least the precision stash_type asks for float16
    return relay.const((low + np.arange(count, dtype=np.float64) * by).astype(dtype))
