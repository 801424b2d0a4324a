"""The gradients (`FPrimalGradient`) of the indexing ops of `indexing.py`: split, strided_slice, take,
gather_elements and gather_nd. See `kiln.relay.op._grad` for the contract; integer indices get None.

The constructors of the modules that import `indexing.py` (shape, creation, nn) are imported where they
are used: `indexing.py` imports this module before they exist.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from kiln.ir.types import TensorType, TupleType
from kiln.relay.expr import Call, Expr, TupleGetItem, const
from kiln.relay.op._grad import dtype_of, field, shape_of

Grads = list[Expr | None]


def attrs_of(call: Call) -> Any:
    """The call's attrs, of its op's attrs class (the op's relation checked them)."""
    return call.attrs





def _zeros(shape: Sequence[int], dtype: str) -> Expr:
    from kiln.relay.op.creation import zeros

    return zeros(tuple(shape), dtype)


def split_grad(call: Call, grad: Expr) -> Grads:
    """The fields of the gradient (a tuple) joined again; a field given as None (no gradient reached that
    piece) is zeros of its shape."""
    from kiln.relay.op.shape import concatenate

    out = call.checked_type
    assert isinstance(out, TupleType)
    fields: list[Expr] = []
    for i, t in enumerate(out.fields):
        assert isinstance(t, TensorType)
        g = field(grad, i)
        fields.append(g if g is not None else _zeros([int(d) for d in t.shape], str(t.dtype)))
    return [concatenate(fields, attrs_of(call).axis)]


def unslice_axis(g: Expr, shape: tuple[int, ...], axis: int, size: int, picked: range, dtype: str) -> Expr:
    """`g`, of `shape`, put back along `axis` where `picked` (a range over 0..size) took its elements;
    zeros elsewhere. A negative step is the positive one reversed; a step s > 1 puts s - 1 zeros after
    each element (a new axis padded, then merged); then zeros before and after (nn.pad)."""
    from kiln.relay.op.indexing import strided_slice
    from kiln.relay.op.nn import pad
    from kiln.relay.op.shape import reshape

    n = len(picked)
    if n == 0:
        return _zeros((*shape[:axis], size, *shape[axis + 1:]), dtype)
    if picked.step < 0:
        g = strided_slice(g, [n - 1], [-(n + 1)], [-1], axes=[axis])
        picked = picked[::-1]
    zero = const(np.zeros((), dtype))
    length = n
    if picked.step > 1:
        s = picked.step
        g = reshape(g, (*shape[:axis + 1], 1, *shape[axis + 1:]))
        widths = [(0, 0)] * (len(shape) + 1)
        widths[axis + 1] = (0, s - 1)
        g = reshape(pad(g, widths, zero), (*shape[:axis], n * s, *shape[axis + 1:]))
        length = n * s
    after = size - picked.start - length
    if after < 0:  # the zeros after the last element run past the end
        g = strided_slice(g, [0], [length + after], axes=[axis])
        after = 0
    widths = [(0, 0)] * len(shape)
    widths[axis] = (picked.start, after)
    return pad(g, widths, zero)


def strided_slice_grad(call: Call, grad: Expr) -> Grads:
    """The gradient put back where the slice took it, zeros elsewhere, one sliced axis at a time."""
    (x,) = call.args
    dims = shape_of(x)
    dtype = dtype_of(x)
    shape = shape_of(call)
    g = grad
    for axis, begin, end, stride in attrs_of(call).slices(len(dims)):
        picked = range(dims[axis])[begin:end:stride]
        g = unslice_axis(g, shape, axis, dims[axis], picked, dtype)
        shape = (*shape[:axis], dims[axis], *shape[axis + 1:])
    return [g]


def _index_in_range(indices: Expr, size: int, mode: str) -> Expr:
    """take's indices as the forward read them: clipped to [0, size) or wrapped (fast: as given, negative
    ones counting from the end, which scatter_elements does as well)."""
    from kiln.relay.op.tensor import floor_mod, maximum, minimum

    dtype = dtype_of(indices)
    if mode == "clip":
        return maximum(minimum(indices, const(np.asarray(size - 1, dtype))), const(np.zeros((), dtype)))
    if mode == "wrap":
        return floor_mod(indices, const(np.asarray(size, dtype)))
    return indices


def take_grad(call: Call, grad: Expr) -> Grads:
    """data: the gradient added into zeros at the positions taken (scatter_elements with reduction add,
    so an index taken twice gets both), the taken axis and the dims around it each flattened to one;
    indices: none. The scatter costs data's size times the number of indices."""
    from kiln.relay.op.indexing import scatter_elements
    from kiln.relay.op.shape import broadcast_to, reshape

    x, indices = call.args
    dims, dtype = shape_of(x), dtype_of(x)
    count = int(np.prod(shape_of(indices), dtype=np.int64))
    if attrs_of(call).axis is None:
        size = int(np.prod(dims, dtype=np.int64))
        where = reshape(_index_in_range(indices, size, attrs_of(call).mode), (count,))
        flat = scatter_elements(_zeros((size,), dtype), where, reshape(grad, (count,)), 0, "add")
        return [reshape(flat, dims), None]
    axis = attrs_of(call).axis % len(dims)
    before, after = int(np.prod(dims[:axis], dtype=np.int64)), int(np.prod(dims[axis + 1:], dtype=np.int64))
    where = reshape(_index_in_range(indices, dims[axis], attrs_of(call).mode), (1, count, 1))
    where = broadcast_to(where, (before, count, after))
    g = reshape(grad, (before, count, after))
    out = scatter_elements(_zeros((before, dims[axis], after), dtype), where, g, 1, "add")
    return [reshape(out, dims), None]


def gather_elements_grad(call: Call, grad: Expr) -> Grads:
    """data: the gradient added into zeros at the indices (scatter_elements with reduction add); indices: none."""
    from kiln.relay.op.indexing import scatter_elements

    x, indices = call.args
    return [scatter_elements(_zeros(shape_of(x), dtype_of(x)), indices, grad, attrs_of(call).axis, "add"), None]


def topk_grad(call: Call, grad: Expr) -> Grads:
    """data: the values' gradient put back at the positions the picks came from (scatter_elements along the
    axis; the picks of a row are distinct); the indices output carries none."""
    from kiln.relay.op.indexing import scatter_elements

    (x,) = call.args
    g = field(grad, 0)
    if g is None:
        return [_zeros(shape_of(x), dtype_of(x))]
    indices = TupleGetItem(call, 1)
    return [scatter_elements(_zeros(shape_of(x), dtype_of(x)), indices, g, attrs_of(call).axis, "add")]


def gather_nd_grad(call: Call, grad: Expr) -> Grads:
    """data: the gradient's slices added into zeros at the index tuples (scatter_nd with reduction add);
    indices: none. With batch_dims b, the batch dims are flattened into one and each index tuple gets its
    batch's position in front, which makes it a gather of batch_dims 0."""
    from kiln.relay.op.indexing import scatter_nd
    from kiln.relay.op.shape import broadcast_to, concatenate, reshape

    x, indices = call.args
    b = attrs_of(call).batch_dims
    if not b:
        return [scatter_nd(_zeros(shape_of(x), dtype_of(x)), indices, grad, "add"), None]
    xs, ids, gs = shape_of(x), shape_of(indices), shape_of(call)
    batch = math.prod(xs[:b])
    flat_ids = reshape(indices, (batch, *ids[b:]))
    # each index tuple's batch position, (batch, ...indices' middle dims, 1), in the indices' dtype
    where_ = np.arange(batch, dtype=dtype_of(indices)).reshape((batch,) + (1,) * (len(ids) - b))
    lead = broadcast_to(const(where_), (batch, *ids[b:-1], 1))
    flat = scatter_nd(_zeros((batch, *xs[b:]), dtype_of(x)), concatenate([lead, flat_ids], -1),
                      reshape(grad, (batch, *gs[b:])), "add")
    return [reshape(flat, xs), None]


def _extreme_scatter_grads(call: Call, grad: Expr, gather: Any, scatter_add: Any) -> Grads:
    """max and min: the gradient of each element to the values equal to the result there (the data's and
    the updates that landed on it), split evenly among ties, as the max reduction's."""
    from kiln.relay.op.tensor import cast, divide, equal, multiply

    x, _, updates = call.args
    dtype = dtype_of(x)
    data_won = cast(equal(x, call), dtype)
    update_won = cast(equal(updates, gather(call)), dtype)
    share = divide(grad, scatter_add(data_won, update_won))
    return [multiply(share, data_won), None, multiply(gather(share), update_won)]


def _product_scatter_grads(call: Call, grad: Expr, gather: Any, scatter: Any, scatter_add: Any) -> Grads:
    """mul: each factor's gradient is the gradient times the product of the other factors at its position
    (the data and the updates that landed there), exact where some of them are 0: the product of the
    nonzero updates and the count of zeros are scattered apart, and an update's others are that product
    over its own value (if nonzero), times 0 unless no other factor there is 0."""
    from kiln.relay.op.creation import ones_like
    from kiln.relay.op.tensor import cast, divide, equal, multiply, where

    x, _, updates = call.args
    dtype = dtype_of(x)
    zero, one = const(np.zeros((), dtype)), const(np.ones((), dtype))
    is_zero = equal(updates, zero)
    nonzero = where(is_zero, one, updates)
    prod_nz = scatter(ones_like(x), nonzero)  # the product of the nonzero updates at each position
    zeros = scatter_add(_zeros(shape_of(x), dtype), cast(is_zero, dtype))  # how many of them are 0
    no_zero_update = cast(equal(zeros, zero), dtype)
    d_data = multiply(grad, multiply(prod_nz, no_zero_update))
    # an update's other factors: the data, the other nonzero updates; 0 if another update there is 0
    alone = cast(equal(gather(zeros), cast(is_zero, dtype)), dtype)
    d_updates = multiply(multiply(gather(multiply(grad, multiply(x, prod_nz))), alone), divide(one, nonzero))
    return [d_data, None, d_updates]


def _scatter_grads(call: Call, grad: Expr, nd: bool) -> Grads:
    """scatter_elements (`nd` False) and scatter_nd: with reduction add, data gets the gradient and each
    update the gradient where it landed; with none, data gets the gradient where no update landed, and
    an update the gradient where it landed if it won there (of duplicates the last wins, as in the
    forward: each update writes its position into a tensor of -1 by the same scatter, and reads back
    whether its own position stayed); max, min and mul: see `_extreme_scatter_grads` and
    `_product_scatter_grads`."""
    from kiln.relay.op.creation import full, zeros_like
    from kiln.relay.op.indexing import gather_elements, gather_nd, scatter_elements, scatter_nd
    from kiln.relay.op.tensor import equal, where

    x, indices, updates = call.args
    attrs = attrs_of(call)

    def gather(e: Expr) -> Expr:
        return gather_nd(e, indices) if nd else gather_elements(e, indices, attrs.axis)

    def scatter(data: Expr, values: Expr, reduction: str = "none") -> Expr:
        if nd:
            return scatter_nd(data, indices, values, reduction)
        return scatter_elements(data, indices, values, attrs.axis, reduction)

    if attrs.reduction == "add":
        return [grad, None, gather(grad)]
    if attrs.reduction in ("max", "min"):
        return _extreme_scatter_grads(call, grad, gather, lambda d, v: scatter(d, v, "add"))
    if attrs.reduction == "mul":
        return _product_scatter_grads(call, grad, gather, lambda d, v: scatter(d, v, "mul"),
                                      lambda d, v: scatter(d, v, "add"))
    shape = shape_of(updates)
    position = const(np.arange(int(np.prod(shape, dtype=np.int64)), dtype=np.int32).reshape(shape))
    won = equal(gather(scatter(full(-1, shape_of(x), "int32"), position)), position)
    return [scatter(grad, zeros_like(updates)), None, where(won, gather(grad), const(np.zeros((), dtype_of(x))))]


def scatter_elements_grad(call: Call, grad: Expr) -> Grads:
    """See `_scatter_grads`."""
    return _scatter_grads(call, grad, nd=False)


def scatter_nd_grad(call: Call, grad: Expr) -> Grads:
    """See `_scatter_grads`."""
    return _scatter_grads(call, grad, nd=True)


__all__ = [
    "gather_elements_grad", "gather_nd_grad", "split_grad",
    "scatter_elements_grad", "scatter_nd_grad", "strided_slice_grad", "take_grad", "unslice_axis",
]
