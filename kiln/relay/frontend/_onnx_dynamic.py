"""ONNX converters of control flow (If, Loop, Scan) and of the ops whose output size depends on values.

kiln compiles static graphs, so each of these becomes one at import:
- If imports the branch its condition picks; Loop and Scan import their body
  once per iteration (unrolled), the trip count and each iteration's condition
  read as values. The branches and bodies are compiled like the rest of the
  graph.
- NonZero, Unique, Compress's condition and NonMaxSuppression read their inputs
  as values and compute the result with numpy at import.
When such a value comes from a graph input, `OnnxRunner` compiles once per
distinct value of that input (see onnx_runner.py); `from_onnx` alone reports
which inputs it needs (`OnnxValueNeededError`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kiln import relay
from kiln.relay.expr import Expr
from kiln.relay.frontend.onnx import OnnxNode, onnx_converter
from kiln.relay.op._rel import normalize_axis

# More iterations than this would make a graph no one wants compiled (and hides a loop that never ends).
MAX_UNROLL = 4096


# ---------------------------------------------------------------------------
# Control flow
# ---------------------------------------------------------------------------


@onnx_converter("If", since=1)
def _if(node: OnnxNode) -> list[Expr]:
    branch = "then_branch" if bool(node.scalar(0, "cond")) else "else_branch"
    outs = node.subgraph(branch, [])
    if len(outs) != len(node.outputs):
        raise node.error(f"{branch} has {len(outs)} outputs; the node has {len(node.outputs)}")
    return outs


def _stacked(node: OnnxNode, pieces: list[Expr], axis: int, what: str) -> Expr:
    if not pieces:
        raise node.error(f"{what} is empty (no iterations ran); kiln cannot type an empty scan output")
    ndim = node.ndim(pieces[0]) + 1
    return relay.stack(pieces, axis=normalize_axis(axis, ndim))


@onnx_converter("Loop", since=1)
def _loop(node: OnnxNode) -> list[Expr]:
    trip = None if node.optional_input(0) is None else int(node.scalar(0, "M"))
    keep_going = True if node.optional_input(1) is None else bool(node.scalar(1, "cond"))
    carried = [node.input(i) for i in range(2, len(node.inputs))]
    scans: list[list[Expr]] = []
    i = 0
    while keep_going and (trip is None or i < trip):
        if i >= MAX_UNROLL:
            raise node.error(f"runs more than {MAX_UNROLL} iterations; kiln unrolls loops and stops there")
        index = relay.const(np.array(i, np.int64))
        outs = node.subgraph("body", [index, relay.const(np.array(keep_going)), *carried])
        if len(outs) < 1 + len(carried):
            raise node.error(f"the body returns {len(outs)} outputs; it must return cond and the "
                             f"{len(carried)} loop-carried values")
        cond_value = node.const_value(outs[0])
        if cond_value is None:
            raise node.error(f"the condition of iteration {i} is computed at run time; kiln unrolls loops whose "
                             "condition it can compute at import")
        keep_going = bool(np.asarray(cond_value).reshape(-1)[0])
        carried = outs[1:1 + len(carried)]
        scans.append(outs[1 + len(carried):])
        i += 1
    n_scan = len(node.outputs) - len(carried)
    stacked = [_stacked(node, [s[k] for s in scans], 0, f"scan output #{k}") for k in range(n_scan)]
    return [*carried, *stacked]


def _scan_body(node: OnnxNode, states: list[Expr], inputs: list[Expr], directions: str) -> list[Expr]:
    """Scan (opset 9 form) over `inputs`, unrolled: the final states, then the stacked scan outputs."""
    n = len(inputs)
    in_axes = node.ints_attr("scan_input_axes", [0] * n) or [0] * n
    in_dirs = node.ints_attr(directions, [0] * n) or [0] * n
    axes = [normalize_axis(a, node.ndim(x)) for a, x in zip(in_axes, inputs, strict=True)]
    lengths = {node.static_shape(x, "a scan input")[a] for x, a in zip(inputs, axes, strict=True)}
    if len(lengths) != 1:
        raise node.error(f"the scan inputs have different lengths along their scan axes: {sorted(lengths)}")
    length = lengths.pop()
    if length > MAX_UNROLL:
        raise node.error(f"scans {length} steps; kiln unrolls scans up to {MAX_UNROLL}")
    steps: list[list[Expr]] = []
    for t in range(length):
        slices = [relay.take(x, relay.const(np.array(length - 1 - t if d else t, np.int64)), axis=a)
                  for x, a, d in zip(inputs, axes, in_dirs, strict=True)]
        outs = node.subgraph("body", [*states, *slices])
        states = outs[:len(states)]
        steps.append(outs[len(states):])
    m = len(steps[0]) if steps else 0
    out_axes = node.ints_attr("scan_output_axes", [0] * m) or [0] * m
    out_dirs = node.ints_attr("scan_output_directions", [0] * m) or [0] * m
    stacked = []
    for k in range(m):
        pieces = [s[k] for s in steps]
        stacked.append(_stacked(node, pieces[::-1] if out_dirs[k] else pieces, out_axes[k], f"scan output #{k}"))
    return [*states, *stacked]


@onnx_converter("Scan", since=9)
def _scan(node: OnnxNode) -> list[Expr]:
    values = _scan_inputs(node, first=0)
    n_states = len(values) - node.int_attr("num_scan_inputs")
    return _scan_body(node, values[:n_states], values[n_states:], "scan_input_directions")


def _scan_inputs(node: OnnxNode, first: int) -> list[Expr]:
    values = [node.input(i) for i in range(first, len(node.inputs))]
    if not 1 <= node.int_attr("num_scan_inputs") <= len(values):
        raise node.error(f"num_scan_inputs is {node.int_attr('num_scan_inputs')}, but the node has "
                         f"{len(values)} state and scan inputs")
    return values


@onnx_converter("Scan", since=8)
def _scan_batched(node: OnnxNode) -> list[Expr]:
    """Scan-8: a batch axis 0 before the scan axis; each batch row is scanned alone."""
    if node.optional_input(0) is not None:
        raise node.error("sequence_lens is not supported: kiln scans every row to its full length")
    values = _scan_inputs(node, first=1)
    n_states = len(values) - node.int_attr("num_scan_inputs")
    batch = node.static_shape(values[0], "a scan input")[0]
    rows: list[list[Expr]] = []
    for b in range(batch):
        picked: list[Expr] = [relay.take(v, relay.const(np.array(b, np.int64)), axis=0) for v in values]
        rows.append(_scan_body(node, picked[:n_states], picked[n_states:], "directions"))
    return [relay.stack([r[k] for r in rows], axis=0) for k in range(len(rows[0]))]


# ---------------------------------------------------------------------------
# Outputs whose size depends on values
# ---------------------------------------------------------------------------


@onnx_converter("NonZero", since=9)
def _nonzero(node: OnnxNode) -> Expr:
    value = node.value(0, "X")
    return relay.const(np.array(np.nonzero(value), dtype=np.int64).reshape(value.ndim, -1))


@onnx_converter("Compress", since=9)
def _compress(node: OnnxNode) -> Expr:
    data = node.input(0)
    picked = np.nonzero(node.value(1, "condition").reshape(-1))[0]
    axis = node.attr("axis", None)
    if axis is None:
        data = relay.reshape(data, [-1])
        axis = 0
    axis = normalize_axis(int(axis), node.ndim(data))
    length = node.static_shape(data)[axis]
    picked = picked[picked < length]  # ONNX: a condition longer than the axis is cut to it
    return relay.take(data, relay.const(picked.astype(np.int64)), axis=axis)


@onnx_converter("Unique", since=11)
def _unique(node: OnnxNode) -> list[Expr]:
    x = node.value(0, "X")
    axis = node.attr("axis", None)
    if axis is not None:
        axis = normalize_axis(int(axis), x.ndim)
    flat = x.reshape(-1) if axis is None else np.moveaxis(x, axis, 0).reshape(x.shape[axis], -1)
    _, first, inverse, counts = np.unique(flat, return_index=True, return_inverse=True, return_counts=True,
                                          axis=None if axis is None else 0)
    inverse = inverse.reshape(-1)
    if not node.bool_attr("sorted", True):  # in order of first occurrence
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order))
        first, counts, inverse = first[order], counts[order], rank[inverse]
    picked = flat[first]
    y = picked if axis is None else np.moveaxis(picked.reshape(len(first), *np.delete(x.shape, axis)), 0, axis)
    return [relay.const(np.ascontiguousarray(y).astype(x.dtype)), *(relay.const(a.astype(np.int64)) for a in (
        first, inverse, counts))]


def _iou(box: np.ndarray, others: np.ndarray, center: bool) -> np.ndarray:
    if center:  # [x_center, y_center, width, height]
        box = np.concatenate([box[:2] - box[2:] / 2, box[:2] + box[2:] / 2])
        others = np.concatenate([others[:, :2] - others[:, 2:] / 2, others[:, :2] + others[:, 2:] / 2], axis=1)
    else:  # [y1, x1, y2, x2], corners in either order
        box = np.concatenate([np.minimum(box[:2], box[2:]), np.maximum(box[:2], box[2:])])
        others = np.concatenate([np.minimum(others[:, :2], others[:, 2:]), np.maximum(others[:, :2], others[:, 2:])],
                                axis=1)
    lo = np.maximum(box[:2], others[:, :2])
    hi = np.minimum(box[2:], others[:, 2:])
    inter = np.prod(np.clip(hi - lo, 0, None), axis=1)
    union = np.prod(box[2:] - box[:2]) + np.prod(others[:, 2:] - others[:, :2], axis=1) - inter
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(union > 0, inter / union, 0.0)


def _optional_scalar(node: OnnxNode, i: int, what: str, default: float) -> float:
    return default if node.optional_input(i) is None else float(node.scalar(i, what))


@onnx_converter("NonMaxSuppression", since=10)
def _non_max_suppression(node: OnnxNode) -> Expr:
    boxes = node.value(0, "boxes").astype(np.float64)
    scores = node.value(1, "scores").astype(np.float64)
    limit = int(_optional_scalar(node, 2, "max_output_boxes_per_class", 0))
    iou_threshold = _optional_scalar(node, 3, "iou_threshold", 0.0)
    score_threshold = _optional_scalar(node, 4, "score_threshold", -np.inf)
    center = node.bool_attr("center_point_box", False)
    if boxes.ndim != 3 or boxes.shape[2] != 4 or scores.ndim != 3 or scores.shape[::2] != boxes.shape[:2]:
        raise node.error(f"boxes {boxes.shape} must be (batches, boxes, 4) and scores {scores.shape} "
                         "(batches, classes, boxes)")
    selected: list[Sequence[int]] = []
    for b in range(boxes.shape[0]):
        for c in range(scores.shape[1]):
            order = [i for i in np.argsort(-scores[b, c], kind="stable") if scores[b, c, i] > score_threshold]
            kept: list[int] = []
            for i in order:
                if len(kept) >= limit:
                    break
                if not kept or not np.any(_iou(boxes[b, i], boxes[b, kept], center) > iou_threshold):
                    kept.append(int(i))
            selected += [(b, c, i) for i in kept]
    return relay.const(np.array(selected, dtype=np.int64).reshape(-1, 3))
