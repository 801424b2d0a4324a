"""The gradients (`FPrimalGradient`) of nn.conv2d and nn.conv2d_transpose (`conv.py`) and of the pools
(`pool.py`). See `kiln.relay.op._grad` for the contract.

conv2d: the data's gradient is the transposed convolution of the output gradient with the same weight;
the weight's is a convolution of the data with the output gradient, batch and channels swapped (the
stride and the dilation trade places). conv2d_transpose is conv2d's data gradient, so the roles turn
around: its data's gradient is the conv2d of the output gradient with the same weight (IOHW read as
OIHW) and attrs, and its weight's is conv2d's weight gradient with the output gradient as the data and
the data as the output gradient (one helper, `_conv2d_weight_grad`, serves both).

The windowed pools go tap by tap: each of the window's kh x kw taps is a strided slice of the (padded)
input, and its share of the gradient goes back to the positions it read (`indexing_grad.unslice_axis`),
so the cost is the window's size times the input's. The convolution and pool constructors are imported
where they are used: `conv.py` and `pool.py` import this module before they define them.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from kiln.relay.expr import Call, Expr, const
from kiln.relay.op._grad import OpGradientError, dtype_of, shape_of
from kiln.relay.op.indexing import strided_slice
from kiln.relay.op.indexing_grad import unslice_axis
from kiln.relay.op.reduce import sum
from kiln.relay.op.shape import broadcast_to, concatenate, transpose
from kiln.relay.op.tensor import add, cast, divide, equal, multiply

Grads = list[Expr | None]




def attrs_of(call: Call) -> Any:
    """The call's attrs, of its op's attrs class."""
    return call.attrs



def _hw_axes(layout: str) -> tuple[int, int]:
    return (2, 3) if layout == "NCHW" else (1, 2)


# --- nn.conv2d -----------------------------------------------------------------------------------


def _conv2d_weight_grad(x: Expr, g: Expr, xs: tuple[int, ...], ws: tuple[int, ...], gs: tuple[int, ...],
                        a: Any) -> Expr:
    """The weight's gradient of an NCHW / OIHW convolution of data x (shape xs), weight of shape ws, and
    output gradient g (gs); `a` gives strides, padding, dilation and groups (conv2d's or
    conv2d_transpose's attrs: the transpose's weight gradient is this one, data and gradient swapped)."""
    from kiln.relay.op.conv import conv2d

    _, c, h, wd = xs
    o, _, kh, kw = ws
    _, _, oh, ow = gs
    pt, pl, pb, pr = a.padding
    (sh, sw), (dh, dw), groups = a.strides, a.dilation, a.groups
    pieces = []
    for k in range(groups):
        xk = x if groups == 1 else strided_slice(x, [k * c // groups], [(k + 1) * c // groups], axes=[1])
        gk = g if groups == 1 else strided_slice(g, [k * o // groups], [(k + 1) * o // groups], axes=[1])
        # out[c, o, i, j] = sum over n, y, x of xp[n, c, i dh + y sh, j dw + x sw] g[n, o, y, x]
        dwk: Expr = conv2d(transpose(xk, (1, 0, 2, 3)), transpose(gk, (1, 0, 2, 3)), (dh, dw), (pt, pl, pb, pr),
                           (sh, sw))
        full_h = (h + pt + pb - (oh - 1) * sh - 1) // dh + 1
        full_w = (wd + pl + pr - (ow - 1) * sw - 1) // dw + 1
        if (full_h, full_w) != (kh, kw):  # taps past the kernel's reach read only rows no window reaches
            dwk = strided_slice(dwk, [0, 0], [kh, kw], axes=[2, 3])
        pieces.append(transpose(dwk, (1, 0, 2, 3)))
    return pieces[0] if groups == 1 else concatenate(pieces, 0)


def _conv2d_nchw_grads(x: Expr, w: Expr, g: Expr, xs: tuple[int, ...], ws: tuple[int, ...],
                       gs: tuple[int, ...], a: Any) -> tuple[Expr, Expr]:
    """The gradients of an NCHW / OIHW convolution of data x (shape xs) and weight w (ws), given g (gs)."""
    from kiln.relay.op.conv import conv2d_transpose

    _, _, h, wd = xs
    _, _, kh, kw = ws
    _, _, oh, ow = gs
    pt, pl, pb, pr = a.padding
    (sh, sw), (dh, dw) = a.strides, a.dilation
    # the rows (columns) past the last window's reach get no gradient: output_padding adds them back
    extra = (h + pt + pb - ((oh - 1) * sh + dh * (kh - 1) + 1), wd + pl + pr - ((ow - 1) * sw + dw * (kw - 1) + 1))
    dx = conv2d_transpose(g, w, (sh, sw), (pt, pl, pb, pr), extra, (dh, dw), a.groups)
    return dx, _conv2d_weight_grad(x, g, xs, ws, gs, a)


def conv2d_grad(call: Call, grad: Expr) -> Grads:
    """data: conv2d_transpose of the gradient; weight: a convolution of data and gradient (per group).
    NHWC / HWIO go through NCHW / OIHW transposes."""
    x, w = call.args
    a = attrs_of(call)
    if a.kernel_block:
        raise OpGradientError(
            f"nn.conv2d: no gradient for a weight packed as {a.kernel_layout} (AlterOpLayout's form); "
            f"differentiate the model before AlterOpLayout (relay.build's passes) runs")
    g = grad if dtype_of(call) == dtype_of(x) else cast(grad, dtype_of(x))
    xs, ws, gs = shape_of(x), shape_of(w), shape_of(call)
    if a.data_layout == "NCHW" and a.kernel_layout == "OIHW":
        dx, dw = _conv2d_nchw_grads(x, w, g, xs, ws, gs, a)
        return [dx, dw]
    to_nchw, to_oihw = (0, 3, 1, 2), (3, 2, 0, 1)
    x_n = transpose(x, to_nchw) if a.data_layout == "NHWC" else x
    g_n = transpose(g, to_nchw) if a.data_layout == "NHWC" else g
    w_o = transpose(w, to_oihw) if a.kernel_layout == "HWIO" else w

    def pick(s: tuple[int, ...], p: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(s[i] for i in p)

    dx, dw = _conv2d_nchw_grads(x_n, w_o, g_n, pick(xs, to_nchw) if a.data_layout == "NHWC" else xs,
                                pick(ws, to_oihw) if a.kernel_layout == "HWIO" else ws,
                                pick(gs, to_nchw) if a.data_layout == "NHWC" else gs, a)
    if a.data_layout == "NHWC":
        dx = transpose(dx, (0, 2, 3, 1))
    if a.kernel_layout == "HWIO":
        dw = transpose(dw, (2, 3, 1, 0))
    return [dx, dw]


def conv2d_transpose_grad(call: Call, grad: Expr) -> Grads:
    """The transpose is conv2d's data gradient, so its adjoint is conv2d: data's gradient is the conv2d of the
    output gradient with the weight (IOHW read as OIHW), same strides, padding, dilation and groups; the
    weight's is conv2d's weight gradient with the output gradient as that conv2d's data and the data as its
    output gradient."""
    from kiln.relay.op.conv import conv2d

    x, w = call.args
    a = attrs_of(call)
    g = grad if dtype_of(call) == dtype_of(x) else cast(grad, dtype_of(x))
    xs, ws, gs = shape_of(x), shape_of(w), shape_of(call)
    dx: Expr = conv2d(g, w, a.strides, a.padding, a.dilation, a.groups)
    # an output_padding of a stride or more (allowed below the dilation) makes the conv2d's output longer than
    # the data: its windows past the data's last row read only output padding, so they are cut off
    out_hw = ((gs[2] + a.padding[0] + a.padding[2] - a.dilation[0] * (ws[2] - 1) - 1) // a.strides[0] + 1,
             (gs[3] + a.padding[1] + a.padding[3] - a.dilation[1] * (ws[3] - 1) - 1) // a.strides[1] + 1)
    if out_hw != xs[2:]:
        dx = strided_slice(dx, [0, 0], list(xs[2:]), axes=[2, 3])
    return [dx, _conv2d_weight_grad(g, x, gs, ws, xs, a)]


# --- the pools -----------------------------------------------------------------------------------


class _Taps:
    """The taps of a 2-D pool's windows over its input, padded with `fill` (the explicit padding, and the
    overhang that ceil_mode adds past it) when `fill` is not None."""

    def __init__(self, call: Call) -> None:
        self.a = attrs_of(call)
        self.x = call.args[0]
        self.shape = shape_of(self.x)
        self.dtype = dtype_of(self.x)
        self.hax, self.wax = _hw_axes(self.a.layout)
        self.out = shape_of(call)
        self.oh, self.ow = self.out[self.hax], self.out[self.wax]
        pt, pl, pb, pr = self.a.padding
        (sh, sw), (dh, dw), (kh, kw) = self.a.strides, self.a.dilation, self.a.pool_size
        h, w = self.shape[self.hax], self.shape[self.wax]
        self.before = (pt, pl)
        self.after = (max(pb, (self.oh - 1) * sh + dh * (kh - 1) + 1 - h - pt),
                      max(pr, (self.ow - 1) * sw + dw * (kw - 1) + 1 - w - pl))
        padded = list(self.shape)
        padded[self.hax] += pt + self.after[0]
        padded[self.wax] += pl + self.after[1]
        self.padded = tuple(padded)

    def rows(self, i: int, j: int) -> tuple[range, range]:
        """The padded input's rows and columns that tap (i, j) of each window reads."""
        (sh, sw), (dh, dw) = self.a.strides, self.a.dilation
        return range(i * dh, i * dh + (self.oh - 1) * sh + 1, sh), range(j * dw, j * dw + (self.ow - 1) * sw + 1, sw)

    def padded_input(self, fill: float) -> Expr:
        from kiln.relay.op.nn import pad

        widths = [(0, 0)] * 4
        widths[self.hax] = (self.before[0], self.after[0])
        widths[self.wax] = (self.before[1], self.after[1])
        if widths == [(0, 0)] * 4:
            return self.x
        return pad(self.x, widths, const(np.asarray(fill, self.dtype)))

    def read(self, xp: Expr, i: int, j: int) -> Expr:
        """Tap (i, j) of every window: a strided slice of the padded input, of the output's shape."""
        rows, cols = self.rows(i, j)
        return strided_slice(xp, [rows.start, cols.start], [rows.stop, cols.stop], [rows.step, cols.step],
                             axes=[self.hax, self.wax])

    def put_back(self, share: Expr, i: int, j: int) -> Expr:
        """`share`, of the output's shape, at the padded input's positions that tap (i, j) read; zeros elsewhere."""
        rows, cols = self.rows(i, j)
        e = unslice_axis(share, self.out, self.hax, self.padded[self.hax], rows, self.dtype)
        mid = list(self.out)
        mid[self.hax] = self.padded[self.hax]
        return unslice_axis(e, tuple(mid), self.wax, self.padded[self.wax], cols, self.dtype)

    def unpad(self, e: Expr) -> Expr:
        """The input's part of a tensor of the padded input's shape."""
        if self.padded == self.shape:
            return e
        (pt, pl), h, w = self.before, self.shape[self.hax], self.shape[self.wax]
        return strided_slice(e, [pt, pl], [pt + h, pl + w], axes=[self.hax, self.wax])

    def taps(self) -> list[tuple[int, int]]:
        kh, kw = self.a.pool_size
        return [(i, j) for i in range(kh) for j in range(kw)]


def max_pool2d_grad(call: Call, grad: Expr) -> Grads:
    """The gradient of each window to the taps equal to its maximum, split evenly among ties (as the max
    reduction's)."""
    t = _Taps(call)
    xp = t.padded_input(-np.inf)
    hits = [cast(equal(t.read(xp, i, j), call), t.dtype) for i, j in t.taps()]
    share = divide(grad, functools.reduce(add, hits))
    return [t.unpad(functools.reduce(add, [t.put_back(multiply(hit, share), i, j) for hit, (i, j) in zip(hits, t.taps(),
                                                                                           strict=True)]))]


def avg_pool2d_grad(call: Call, grad: Expr) -> Grads:
    """The gradient of each window divided by its divisor (the reference's count of taps), to each tap."""
    from kiln.relay.op.pool import _pool_windows

    t = _Taps(call)
    ones = np.ones((1, 1, t.shape[t.hax], t.shape[t.wax]))
    counts, _ = _pool_windows(ones, t.a, 1 if t.a.count_include_pad else 0, 0)
    count = np.maximum(np.sum([window for _, _, window in counts], axis=0), 1)[0, 0]
    shape = [1, 1, 1, 1]
    shape[t.hax], shape[t.wax] = t.oh, t.ow
    share = multiply(grad, const((1.0 / count).reshape(shape).astype(t.dtype)))
    return [t.unpad(functools.reduce(add, [t.put_back(share, i, j) for i, j in t.taps()]))]


def global_avg_pool2d_grad(call: Call, grad: Expr) -> Grads:
    """The gradient / (H W), to every element of its plane."""
    x = call.args[0]
    shape = shape_of(x)
    hax, wax = _hw_axes(attrs_of(call).layout)
    scale = const(np.asarray(1.0 / (shape[hax] * shape[wax]), dtype_of(x)))
    return [broadcast_to(multiply(grad, scale), shape)]


def global_max_pool2d_grad(call: Call, grad: Expr) -> Grads:
    """The gradient to the elements of each plane equal to its maximum, split evenly among ties."""
    x = call.args[0]
    shape = shape_of(x)
    hit = cast(equal(x, broadcast_to(call, shape)), dtype_of(x))
    ties = sum(hit, axis=_hw_axes(attrs_of(call).layout), keepdims=True)
    return [multiply(hit, broadcast_to(divide(grad, ties), shape))]
