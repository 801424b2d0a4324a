"""ONNX converters of the signal-processing ops: DFT, STFT and MelWeightMatrix.

A discrete Fourier transform of length n along an axis is a product with a
constant n x k matrix of cosines and sines, so DFT becomes dense products
(real and imaginary parts, as ONNX lays them out in a last axis of 1 or 2) that
use kiln's tiled GEMM, in float64: O(n²) work rather than an FFT's
O(n log n), which suits short signals and frames. The inverse and the one-sided forms
(numpy's rfft and irfft) are other constant matrices. STFT gathers its frames
with a constant index, applies the window and transforms each frame.
MelWeightMatrix is a constant of its (value) inputs.
"""

from __future__ import annotations

import numpy as np

from kiln import relay
from kiln.relay.expr import Expr
from kiln.relay.frontend.onnx import OnnxNode, onnx_converter
from kiln.relay.op._rel import normalize_axis


def _parts(node: OnnxNode, x: Expr) -> tuple[Expr, Expr | None]:
    """The real and imaginary parts of `x` (its last axis, of 1 or 2), without that axis."""
    shape = node.static_shape(x)
    if shape[-1] not in (1, 2):
        raise node.error(f"the input's last axis holds {shape[-1]} values: expected 1 (real) or 2 (complex)")
    end = len(shape) - 1

    def part(i: int) -> Expr:
        return relay.squeeze(relay.strided_slice(x, [i], [i + 1], axes=[end]), axis=[end])

    return part(0), part(1) if shape[-1] == 2 else None


def _transform(node: OnnxNode, x: Expr, axis: int, n: int, inverse: bool, onesided: bool) -> Expr:
    """DFT of `x` (real/imaginary in its last axis) along `axis`: the (..., k, 2) or irfft's (..., n, 1)."""
    real, imag = _parts(node, x)
    rank = node.ndim(real)
    axis = normalize_axis(axis, rank + 1)
    if axis >= rank:
        raise node.error(f"axis {axis} is the real/imaginary axis; the transform runs along one of the others")
    perm = [a for a in range(rank) if a != axis] + [axis]
    back = list(np.argsort(perm))
    size = node.static_shape(real)[axis]
    irfft = inverse and onesided
    taken = n // 2 + 1 if irfft else n  # the input length the transform reads
    out_len = n if irfft or not onesided else n // 2 + 1
    j = np.arange(taken)[:, None]
    k = np.arange(out_len)[None, :]
    if irfft:  # y[t] = (1/n) sum_k w_k (R_k cos - I_k sin)(2 pi k t / n): k runs over the input here
        angle = 2 * np.pi * j * np.arange(n)[None, :] / n
        weight = np.where((j == 0) | ((n % 2 == 0) & (j == n // 2)), 1.0, 2.0) / n
        cos, sin = weight * np.cos(angle), weight * np.sin(angle)
    else:
        angle = 2 * np.pi * j * k / n
        cos, sin = np.cos(angle), np.sin(angle) * (1.0 if inverse else -1.0)
        if inverse:
            cos, sin = cos / n, sin / n
    dtype = str(node.dtype(real))

    def product(part: Expr, matrix: np.ndarray) -> Expr:
        # in float64: an O(n^2) sum of float32 products is off by ~1e-7 of the largest term, where an
        # FFT (and ONNX's expected output) gives exact zeros
        moved = relay.transpose(relay.cast(part, "float64"), perm)
        width = min(size, taken)
        moved = relay.strided_slice(moved, [0], [width], axes=[rank - 1]) if width < size else moved
        lead = [node.static_shape(real)[a] for a in perm[:-1]]
        flat = relay.reshape(moved, [-1, width])
        out = relay.nn.dense(flat, relay.const(np.ascontiguousarray(matrix[:width].T)))
        return relay.cast(relay.transpose(relay.reshape(out, [*lead, matrix.shape[1]]), back), dtype)

    # (R + iI)(cos + i sin) = R cos - I sin + i (I cos + R sin)
    out_real = product(real, cos)
    out_imag = product(real, sin)
    if imag is not None:
        out_real = relay.subtract(out_real, product(imag, sin))
        out_imag = relay.add(out_imag, product(imag, cos))
    if irfft:
        return relay.expand_dims(out_real, rank)
    return relay.stack([out_real, out_imag], axis=rank)


def _dft(node: OnnxNode, axis: int) -> Expr:
    x = node.input(0)
    inverse, onesided = node.bool_attr("inverse", False), node.bool_attr("onesided", False)
    if onesided and not inverse and node.static_shape(x)[-1] == 2:
        raise node.error("onesided applies to real input (a last axis of 1)")
    size = node.static_shape(x)[normalize_axis(axis, node.ndim(x))]
    if node.optional_input(1) is not None:
        n = int(node.scalar(1, "dft_length"))
    else:
        n = 2 * (size - 1) if inverse and onesided else size
    if n < 1:
        raise node.error(f"dft_length is {n}: it must be positive")
    return _transform(node, x, axis, n, inverse, onesided)


@onnx_converter("DFT", since=17)
def _dft_17(node: OnnxNode) -> Expr:
    return _dft(node, node.int_attr("axis", 1))


@onnx_converter("DFT", since=20)
def _dft_20(node: OnnxNode) -> Expr:
    axis = -2 if node.optional_input(2) is None else int(node.scalar(2, "axis"))
    return _dft(node, axis)


@onnx_converter("STFT", since=17)
def _stft(node: OnnxNode) -> Expr:
    signal = node.input(0)
    batch, length, parts = node.static_shape(signal)
    step = int(node.scalar(1, "frame_step"))
    window = node.optional_input(2)
    if node.optional_input(3) is not None:
        frame = int(node.scalar(3, "frame_length"))
    elif window is not None:
        frame = node.static_shape(window)[0]
    else:
        raise node.error("needs a window or a frame_length")
    if step < 1 or not 1 <= frame <= length:
        raise node.error(f"frame_step {step} and frame_length {frame} do not fit a signal of {length}")
    frames = 1 + (length - frame) // step
    index = np.arange(frames)[:, None] * step + np.arange(frame)[None, :]
    framed = relay.take(signal, relay.const(index.astype(np.int64)), axis=1)  # (batch, frames, frame, parts)
    if window is not None:
        framed = relay.multiply(framed, relay.reshape(window, [1, 1, frame, 1]))
    del batch, parts
    return _transform(node, framed, 2, frame, False, node.bool_attr("onesided", True))


@onnx_converter("MelWeightMatrix", since=17)
def _mel_weight_matrix(node: OnnxNode) -> Expr:
    bins = int(node.scalar(0, "num_mel_bins"))
    dft = int(node.scalar(1, "dft_length"))
    rate = float(node.scalar(2, "sample_rate"))
    low = float(node.scalar(3, "lower_edge_hertz"))
    high = float(node.scalar(4, "upper_edge_hertz"))
    from onnx.helper import tensor_dtype_to_np_dtype

    dtype = tensor_dtype_to_np_dtype(node.int_attr("output_datatype", 1))
    # ONNX's reference: triangles between mel-spaced points, mapped to DFT bins
    mel = 2595 * np.log1p(np.array([low, high]) / 700) / np.log(10)
    points = np.arange(bins + 2) * ((mel[1] - mel[0]) / (bins + 2)) + mel[0]
    points = (((dft + 1) * (700 * np.expm1(points / 2595 * np.log(10)))) // rate).astype(int)
    weights = np.zeros((dft // 2 + 1, bins), np.float64)
    for i in range(bins):
        lower, center, upper = points[i], points[i + 1], points[i + 2]
        if center == lower:
            weights[center, i] = 1.0
        else:
            weights[lower:center + 1, i] = (np.arange(lower, center + 1) - lower) / (center - lower)
        if upper > center:
            weights[center:upper, i] = (upper - np.arange(center, upper)) / (upper - center)
    return relay.const(weights.astype(dtype))
