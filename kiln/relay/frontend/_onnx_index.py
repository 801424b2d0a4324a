"""ONNX converters of the indexing and layout ops of the full node suite.

GatherElements, GatherND, ScatterElements (and the deprecated Scatter), ScatterND,
Trilu, OneHot, EyeLike, DepthToSpace, SpaceToDepth, TopK, ReverseSequence,
CenterCropPad, Size, MaxUnpool, Col2Im and TensorScatter.

The gathers and the scatters are Relay ops of their own (`indexing.py`), as is TopK (`algorithm.py`);
the rest compose existing ops: a mask for Trilu, a comparison with a range for
OneHot, reshape and transpose for the depth/space ops, slices and pads for
CenterCropPad, and gathers of constant positions for Col2Im, MaxUnpool,
ReverseSequence and TensorScatter. Every input whose
value decides a shape or an attribute (TopK's k, OneHot's depth, Trilu's k,
CenterCropPad's shape, MaxUnpool's output_shape) is read with `node.value`.
Negative indices count from the end of their axis, as ONNX says.
"""

from __future__ import annotations

import numpy as np

from kiln import relay
from kiln.relay.expr import Expr
from kiln.relay.frontend.onnx import OnnxNode, onnx_converter, onnx_dtype
from kiln.relay.op._rel import normalize_axis
from kiln.relay.op.algorithm import topk
from kiln.relay.op.indexing import check_axes, gather_elements, gather_nd, scatter_elements, scatter_nd


def _axis(node: OnnxNode, rank: int, default: int = 0, name: str = "axis") -> int:
    """The int attribute `name` as an axis of a rank-`rank` tensor; an error naming the node when out of range."""
    axis = node.int_attr(name, default)
    if not -rank <= axis < rank:
        raise node.error(f"attribute {name!r} is {axis}, out of range for a tensor of rank {rank} "
                         f"(allowed: {-rank} to {rank - 1})")
    return normalize_axis(axis, rank)


def _int_input(node: OnnxNode, i: int, what: str) -> None:
    if not node.dtype(i).is_int:
        raise node.error(f"input #{i} ({what}) must hold integers, found dtype {node.dtype(i)}")


# ---------------------------------------------------------------------------
# GatherElements, GatherND
# ---------------------------------------------------------------------------


@onnx_converter("GatherElements", since=11)
def _gather_elements(node: OnnxNode) -> Expr:
    _int_input(node, 1, "indices")
    axis = _axis(node, node.ndim(0))
    return gather_elements(node.input(0), node.input(1), axis)


@onnx_converter("GatherND", since=11)
def _gather_nd(node: OnnxNode) -> Expr:
    _int_input(node, 1, "indices")
    batch_dims = node.int_attr("batch_dims", 0)
    if batch_dims < 0:
        raise node.error(f"attribute 'batch_dims' is {batch_dims}; it must be 0 or more")
    return gather_nd(node.input(0), node.input(1), batch_dims)


# ---------------------------------------------------------------------------
# Trilu, EyeLike, OneHot
# ---------------------------------------------------------------------------


def _scalar_int(node: OnnxNode, i: int, what: str, default: int | None = None) -> int:
    """The value of input `i`, a scalar or a one-element tensor, as an int (`default` when it is absent)."""
    if node.optional_input(i) is None and default is not None:
        return default
    value = node.value(i, what)
    if value.size != 1 or value.ndim > 1:
        raise node.error(f"input #{i} ({what}) must be a scalar or hold one element, found shape {value.shape}")
    v = value.reshape(-1)[0]
    if not np.isfinite(v):
        raise node.error(f"input #{i} ({what}) is {v}, not a finite number")
    return int(v)


@onnx_converter("Trilu", since=14)
def _trilu(node: OnnxNode) -> Expr:
    x = node.input(0)
    if node.ndim(0) < 2:
        raise node.error(f"the input must have rank 2 or more, found shape {node.shape(0)}")
    if node.optional_input(1) is not None and not node.dtype(1).is_int:
        raise node.error(f"input #1 (k) must hold integers, found dtype {node.dtype(1)}")
    k = _scalar_int(node, 1, "k", default=0)
    rows, cols = node.shape(0)[-2:]
    if not isinstance(rows, int) or not isinstance(cols, int):
        raise node.error(f"the last two dims of the input, {node.shape(0)}, must be static")
    ones = np.ones((rows, cols), dtype=bool)
    # a constant mask over the last two dims, which `where` broadcasts over the batch dims
    mask = np.triu(ones, k) if node.bool_attr("upper", True) else np.tril(ones, k)
    return relay.where(relay.const(mask), x, relay.const(0, node.dtype(0)))


@onnx_converter("EyeLike", since=9)
def _eye_like(node: OnnxNode) -> Expr:
    shape = node.static_shape(0, "the input")
    if len(shape) != 2:
        raise node.error(f"the input must have rank 2, found shape {shape}")
    elem = node.attr("dtype", None)
    dtype = node.dtype(0) if elem is None else onnx_dtype(int(elem), f"attribute 'dtype' of {node}")
    return relay.const(np.eye(shape[0], shape[1], node.int_attr("k", 0), dtype=dtype.numpy()))


@onnx_converter("OneHot", since=9)
def _one_hot(node: OnnxNode) -> Expr:
    depth = _scalar_int(node, 1, "depth")
    if depth < 1:
        raise node.error(f"input #1 (depth) is {depth}; it must be 1 or more")
    if node.shape(2) != (2,):
        raise node.error(f"input #2 (values) must have shape (2,): [off_value, on_value], found {node.shape(2)}")
    rank = node.ndim(0) + 1
    axis = _axis(node, rank, default=-1)
    # ONNX casts non-integer indices to integers and counts negative ones from the end
    index = relay.cast(node.input(0), "int64")
    index = relay.where(relay.less(index, relay.const(0, "int64")), relay.add(index, relay.const(depth, "int64")),
                        index)
    positions = np.arange(depth, dtype=np.int64).reshape((depth,) + (1,) * (rank - 1 - axis))
    hot = relay.equal(relay.expand_dims(index, axis), relay.const(positions))
    values = node.input(2)
    return relay.where(hot, relay.take(values, relay.const(1)), relay.take(values, relay.const(0)))


@onnx_converter("Size", since=1)
def _size(node: OnnxNode) -> Expr:
    shape = node.static_shape(0, "the input")
    return relay.const(np.array(int(np.prod(shape, dtype=np.int64)), dtype=np.int64))


# ---------------------------------------------------------------------------
# DepthToSpace, SpaceToDepth, CenterCropPad
# ---------------------------------------------------------------------------


def _blocks(node: OnnxNode) -> tuple[int, int, int, int, int]:
    """(N, C, H, W, blocksize) of a depth/space node: a 4-D input of static shape and a blocksize >= 1."""
    shape = node.static_shape(0, "the input")
    if len(shape) != 4:
        raise node.error(f"the input must have rank 4 (N, C, H, W), found shape {shape}")
    b = node.int_attr("blocksize")
    if b < 1:
        raise node.error(f"attribute 'blocksize' is {b}; it must be 1 or more")
    return shape[0], shape[1], shape[2], shape[3], b


def _mode(node: OnnxNode) -> str:
    mode = str(node.attr("mode", "DCR"))
    if mode not in ("DCR", "CRD"):
        raise node.error(f"attribute 'mode' is {mode!r}; expected 'DCR' or 'CRD'")
    return mode


@onnx_converter("DepthToSpace", since=1)
def _depth_to_space(node: OnnxNode) -> Expr:
    n, c, h, w, b = _blocks(node)
    if c % (b * b):
        raise node.error(f"the input has {c} channels, which blocksize {b} does not divide into {b}x{b} blocks")
    d = c // (b * b)
    if _mode(node) == "DCR":
        split, perm = [n, b, b, d, h, w], [0, 3, 4, 1, 5, 2]
    else:
        split, perm = [n, d, b, b, h, w], [0, 1, 4, 2, 5, 3]
    blocks = relay.transpose(relay.reshape(node.input(0), split), perm)
    return relay.reshape(blocks, [n, d, h * b, w * b])


@onnx_converter("SpaceToDepth", since=1)
def _space_to_depth(node: OnnxNode) -> Expr:
    n, c, h, w, b = _blocks(node)
    if h % b or w % b:
        raise node.error(f"the input's height {h} and width {w} must be multiples of blocksize {b}")
    perm = [0, 3, 5, 1, 2, 4] if _mode(node) == "DCR" else [0, 1, 3, 5, 2, 4]
    blocks = relay.transpose(relay.reshape(node.input(0), [n, c, h // b, b, w // b, b]), perm)
    return relay.reshape(blocks, [n, c * b * b, h // b, w // b])


@onnx_converter("CenterCropPad", since=18)
def _center_crop_pad(node: OnnxNode) -> Expr:
    dims = node.static_shape(0, "the input")
    rank = len(dims)
    value = node.value(1, "shape")
    if value.ndim != 1 or not np.issubdtype(value.dtype, np.integer):
        raise node.error(f"input #1 (shape) must be a 1-D integer tensor, found {value.dtype} of shape {value.shape}")
    axes_attr = node.ints_attr("axes", None)
    axes = check_axes(axes_attr, rank) if axes_attr is not None else list(range(rank))
    if len(axes) != value.size:
        raise node.error(f"input #1 (shape) holds {value.size} sizes for {len(axes)} axes")
    begin, end, pads = [0] * rank, list(dims), [(0, 0)] * rank
    for a, size in zip(axes, (int(v) for v in value), strict=True):
        if size < 0:
            raise node.error(f"input #1 (shape) asks for size {size} on axis {a}; sizes must be 0 or more")
        if size < dims[a]:  # crop: the odd element goes off the end
            begin[a] = (dims[a] - size) // 2
            end[a] = begin[a] + size
        elif size > dims[a]:
            before = (size - dims[a]) // 2
            pads[a] = (before, size - dims[a] - before)
    out: Expr = node.input(0)
    if begin != [0] * rank or end != list(dims):
        out = relay.strided_slice(out, begin, end)
    if any(p != (0, 0) for p in pads):
        out = relay.nn.pad(out, pads, relay.const(0, node.dtype(0)))
    return out


# ---------------------------------------------------------------------------
# Scatter, ScatterElements, ScatterND
# ---------------------------------------------------------------------------


def _reduction(node: OnnxNode) -> str:
    reduction = str(node.attr("reduction", "none"))
    if reduction not in ("none", "add", "mul", "max", "min"):
        raise node.error(f"attribute 'reduction' is {reduction!r}; expected none, add, mul, max or min")
    return reduction


@onnx_converter("Scatter", since=9)
@onnx_converter("ScatterElements", since=11)
def _scatter_elements(node: OnnxNode) -> Expr:
    _int_input(node, 1, "indices")
    axis = _axis(node, node.ndim(0))
    return scatter_elements(node.input(0), node.input(1), node.input(2), axis, _reduction(node))


@onnx_converter("ScatterND", since=11)
def _scatter_nd(node: OnnxNode) -> Expr:
    _int_input(node, 1, "indices")
    return scatter_nd(node.input(0), node.input(1), node.input(2), _reduction(node))


# ---------------------------------------------------------------------------
# TopK
# ---------------------------------------------------------------------------


def _topk(node: OnnxNode, k: int) -> list[Expr]:
    rank = node.ndim(0)
    if rank == 0:
        raise node.error("the input must have rank 1 or more, found a scalar")
    axis = _axis(node, rank, default=-1)
    dim = node.shape(0)[axis]
    if k < 0 or (isinstance(dim, int) and k > dim):
        raise node.error(f"k is {k}; it must be 0 to {dim}, the size of axis {axis} of shape {node.shape(0)}")
    # sorted=0 leaves the order to the runtime: the sorted order is one such order
    both = topk(node.input(0), k, axis, node.bool_attr("largest", True))
    return [relay.TupleGetItem(both, 0), relay.TupleGetItem(both, 1)]


@onnx_converter("TopK", since=1)
def _topk_v1(node: OnnxNode) -> list[Expr]:
    return _topk(node, node.int_attr("k"))


@onnx_converter("TopK", since=10)
def _topk_v10(node: OnnxNode) -> list[Expr]:
    if not node.dtype(1).is_int:
        raise node.error(f"input #1 (K) must hold integers, found dtype {node.dtype(1)}")
    return _topk(node, _scalar_int(node, 1, "K"))


# ---------------------------------------------------------------------------
# ReverseSequence, MaxUnpool, Col2Im
# ---------------------------------------------------------------------------


def _along(values: np.ndarray | Expr, axis: int, rank: int) -> Expr:
    """A 1-D constant or expression shaped to broadcast along `axis` of a rank-`rank` tensor."""
    shape = [1] * rank
    shape[axis] = -1
    if isinstance(values, np.ndarray):
        return relay.const(values.reshape(shape))
    return relay.reshape(values, shape)


@onnx_converter("ReverseSequence", since=10)
def _reverse_sequence(node: OnnxNode) -> Expr:
    dims = node.static_shape(0, "the input")
    if len(dims) < 2:
        raise node.error(f"the input must have rank 2 or more, found shape {dims}")
    batch, time = node.int_attr("batch_axis", 1), node.int_attr("time_axis", 0)
    if sorted((batch, time)) != [0, 1]:
        raise node.error(f"attributes batch_axis {batch} and time_axis {time} must be 0 and 1, one each")
    _int_input(node, 1, "sequence_lens")
    if tuple(node.shape(1)) != (dims[batch],):
        raise node.error(f"input #1 (sequence_lens) has shape {node.shape(1)}; expected ({dims[batch]},), "
                         f"one length per batch entry")
    rank = len(dims)
    # element t of a sequence of length L reads element L - 1 - t, for t < L; the others stay
    t = _along(np.arange(dims[time], dtype=np.int64), time, rank)
    length = _along(relay.cast(node.input(1), "int64"), batch, rank)
    source = relay.where(relay.less(t, length), relay.subtract(relay.subtract(length, relay.const(1, "int64")), t), t)
    return gather_elements(node.input(0), relay.broadcast_to(source, list(dims)), time)


def _pool_attrs(node: OnnxNode, spatial: int) -> tuple[list[int], list[int], list[int]]:
    """kernel_shape, strides and pads (begins then ends) of a pooling-like node with `spatial` dims."""
    kernel = node.ints_attr("kernel_shape") or []
    strides = node.ints_attr("strides", None) or [1] * spatial
    pads = node.ints_attr("pads", None) or [0] * (2 * spatial)
    if len(kernel) != spatial or len(strides) != spatial or len(pads) != 2 * spatial:
        raise node.error(f"kernel_shape {kernel}, strides {strides} and pads {pads} must have {spatial}, {spatial} "
                         f"and {2 * spatial} entries for an input with {spatial} spatial dims")
    if min(kernel + strides) < 1 or min(pads) < 0:
        raise node.error(f"kernel_shape {kernel} and strides {strides} must be 1 or more and pads {pads} 0 or more")
    return kernel, strides, pads


@onnx_converter("MaxUnpool", since=9)
def _max_unpool(node: OnnxNode) -> Expr:
    dims = node.static_shape(0, "input X")
    if len(dims) < 3:
        raise node.error(f"input X must have rank 3 or more (N, C, spatial...), found shape {dims}")
    if node.shape(1) != node.shape(0) or not node.dtype(1).is_int:
        raise node.error(f"input I (indices) must be integers of X's shape {dims}, found {node.type(1)}")
    n, c, spatial = dims[0], dims[1], dims[2:]
    kernel, strides, pads = _pool_attrs(node, len(spatial))
    inferred = [(d - 1) * s - pads[i] - pads[i + len(spatial)] + k
                for i, (d, s, k) in enumerate(zip(spatial, strides, kernel, strict=True))]
    out_shape = [n, c, *inferred]
    if node.optional_input(2) is not None:
        out_shape = [int(v) for v in node.value(2, "output_shape").reshape(-1)]
        if len(out_shape) != len(dims) or out_shape[:2] != [n, c] or any(
                o < i for o, i in zip(out_shape[2:], inferred, strict=True)):
            raise node.error(f"input #2 (output_shape) is {out_shape}; expected {len(dims)} dims, starting with "
                             f"{[n, c]}, each spatial one at least the inferred {inferred}")
    # MaxPool's indices count over the whole (N, C, spatial) tensor: within plane (n, c) they start at
    # (n * C + c) * size_out. Output element o can only hold the maximum of a pooling window that covers it:
    # each kernel offset names at most one such window (a constant table), whose index either points at o
    # or not; so o gathers K candidates where a scatter would search every element of the plane.
    d, planes = len(spatial), n * c
    size_in, size_out, k = int(np.prod(spatial)), int(np.prod(inferred)), int(np.prod(kernel))
    t = (np.indices(inferred).reshape(d, 1, -1) + np.array(pads[:d]).reshape(d, 1, 1)
         - np.indices(kernel).reshape(d, -1, 1))
    stride = np.array(strides).reshape(d, 1, 1)
    window = t // stride
    valid = np.all((t >= 0) & (t % stride == 0) & (window < np.array(spatial).reshape(d, 1, 1)), axis=0)
    where = relay.const(np.ravel_multi_index(tuple(np.where(valid, window, 0)), spatial).reshape(1, k, size_out))

    def candidates(e: Expr) -> Expr:  # (planes, K, size_out): e's element of the window at each kernel offset
        spread = relay.broadcast_to(relay.reshape(e, [planes, 1, size_in]), [planes, k, size_in])
        return gather_elements(spread, relay.broadcast_to(where, [planes, k, size_out]), 2)

    offsets = (np.arange(planes, dtype=np.int64) * size_out).reshape(n, c, *([1] * d))
    local = relay.subtract(relay.cast(node.input(1), "int64"), relay.const(offsets))
    targets = relay.const(np.arange(size_out, dtype=np.int64).reshape(1, 1, size_out))
    hit = relay.logical_and(relay.const(valid.reshape(1, k, size_out)), relay.equal(candidates(local), targets))
    dtype = node.dtype(0)
    best = relay.max(relay.where(hit, candidates(node.input(0)), relay.const(-np.inf, dtype)), axis=1)
    held = relay.greater(relay.sum(relay.cast(hit, "int32"), axis=1), relay.const(0, "int32"))
    out = relay.where(held, best, relay.const(0, dtype))
    result: Expr = relay.reshape(out, [n, c, *inferred])
    if out_shape[2:] != inferred:  # the reference puts the unpooled tensor at the start of a larger output
        result = relay.nn.pad(result, [(0, o - i) for o, i in zip(out_shape, [n, c, *inferred], strict=True)],
                              relay.const(0, node.dtype(0)))
    return result


@onnx_converter("Col2Im", since=18)
def _col2im(node: OnnxNode) -> Expr:
    dims = node.static_shape(0, "the input")
    image = [int(v) for v in node.value(1, "image_shape").reshape(-1)]
    block = [int(v) for v in node.value(2, "block_shape").reshape(-1)]
    d = len(image)
    if len(dims) != 3 or len(block) != d or d == 0:
        raise node.error(f"expected an input (N, C * prod(block_shape), L) and image_shape and block_shape of one "
                         f"length; found shapes {dims}, {image} and {block}")
    dilations = node.ints_attr("dilations", None) or [1] * d
    strides = node.ints_attr("strides", None) or [1] * d
    pads = node.ints_attr("pads", None) or [0] * (2 * d)
    if len(dilations) != d or len(strides) != d or len(pads) != 2 * d:
        raise node.error(f"dilations {dilations}, strides {strides} and pads {pads} must have {d}, {d} and {2 * d} "
                         "entries")
    k = int(np.prod(block))
    counts = [(image[i] + pads[i] + pads[i + d] - dilations[i] * (block[i] - 1) - 1) // strides[i] + 1
              for i in range(d)]
    n, ck, length = dims
    if min(block + counts) < 1 or ck % k or length != int(np.prod(counts)):
        raise node.error(f"the input of shape {dims} does not hold the {counts} blocks of {block} that image_shape "
                         f"{image} gives with strides {strides}, dilations {dilations} and pads {pads}")
    # each output pixel sums, over the kernel offsets, the block element that lands on it, if any: a gather
    # of constant positions (and a constant mask), where a scatter-add would search every block per pixel
    y = np.indices(image).reshape(d, 1, -1)
    kk = np.indices(block).reshape(d, -1, 1)
    t = y + np.array(pads[:d]).reshape(d, 1, 1) - kk * np.array(dilations).reshape(d, 1, 1)
    stride = np.array(strides).reshape(d, 1, 1)
    b = t // stride
    valid = np.all((t >= 0) & (t % stride == 0) & (b < np.array(counts).reshape(d, 1, 1)), axis=0)
    flat = np.ravel_multi_index(tuple(np.where(valid, b, 0)), counts)  # (K, P)
    c, pixels = ck // k, int(np.prod(image))
    cols = relay.reshape(node.input(0), [n, c, k, length])
    taken = gather_elements(cols, relay.broadcast_to(relay.const(flat.reshape(1, 1, k, pixels)), [n, c, k, pixels]), 3)
    summed = relay.sum(relay.where(relay.const(valid), taken, relay.const(0, node.dtype(0))), axis=2)
    return relay.reshape(summed, [n, c, *image])


@onnx_converter("TensorScatter", since=24)
def _tensor_scatter(node: OnnxNode) -> Expr:
    dims, upd = node.static_shape(0, "past_cache"), node.static_shape(1, "update")
    rank = len(dims)
    axis = _axis(node, rank, default=-2)
    mode = str(node.attr("mode", "linear"))
    if mode not in ("linear", "circular"):
        raise node.error(f"attribute 'mode' is {mode!r}; expected 'linear' or 'circular'")
    if axis == 0 or len(upd) != rank or any(u != d for k, (u, d) in enumerate(zip(upd, dims, strict=False))
                                            if k != axis) or upd[axis] > dims[axis]:
        raise node.error(f"update of shape {upd} must match past_cache of shape {dims} but on axis {axis} (not 0), "
                         "where it may be shorter")
    size, length = dims[axis], upd[axis]
    if length == 0:
        return node.input(0)
    # cache position s of batch entry b takes update element s - write_indices[b] (mod size when circular)
    s = _along(np.arange(size, dtype=np.int64), axis, rank)
    start: Expr = relay.const(np.zeros((dims[0],) + (1,) * (rank - 1), np.int64))
    if node.optional_input(2) is not None:
        if node.shape(2) != (dims[0],):
            raise node.error(f"input #2 (write_indices) has shape {node.shape(2)}; expected ({dims[0]},)")
        start = _along(node.input(2), 0, rank)
    j = relay.subtract(s, start)
    if mode == "circular":
        j = relay.floor_mod(j, relay.const(size, "int64"))
    valid = relay.logical_and(relay.greater_equal(j, relay.const(0, "int64")), relay.less(j, relay.const(length,
                                                                                                          "int64")))
    source = relay.broadcast_to(relay.clip(j, 0, max(length - 1, 0)), list(dims))
    return relay.where(valid, gather_elements(node.input(1), source, axis), node.input(0))
