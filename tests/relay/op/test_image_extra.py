"""image.grid_sample, nn.max_pool2d_argmax and nn.roi_align against ONNX's reference implementations
(onnxruntime for MaxPool's Indices).

Each op's numpy reference (the reference interpreter) is checked against
`onnx.reference.ReferenceEvaluator` over a grid of attributes; the compiled op
(`relay.build` on llvm) against its numpy reference over a smaller grid, since
every case compiles a kernel. Grids reach outside the input (|g| up to ~3), so
every padding mode's out-of-range path is taken.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import onnxruntime
import pytest
from onnx import helper
from onnx.reference import ReferenceEvaluator
from op_helpers import rel, rel_error

from kiln import relay
from kiln.ir.attrs import AttrsError
from kiln.ir.types import TensorType

RNG = np.random.default_rng(11)


def onnx_run(op: str, inputs: dict[str, np.ndarray], n_out: int = 1, opset: int = 22, runtime: bool = False,
             **attributes: Any) -> list[Any]:
    """ONNX's reference result (with `runtime`, onnxruntime's) of a one-node model of `op`, every input a graph
    input."""
    outs = ["Y", "I"][:n_out]
    first = helper.np_dtype_to_tensor_dtype(next(iter(inputs.values())).dtype)  # Y's dtype; I is int64
    node = helper.make_node(op, list(inputs), outs, **attributes)
    graph = helper.make_graph(
        [node], op.lower(),
        [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
         for k, v in inputs.items()],
        [helper.make_tensor_value_info(o, t, None) for o, t in zip(outs, [first, 7], strict=False)])
    # ir_version 10: onnx's default is newer than onnxruntime 1.23 (the newest for Python 3.10) reads
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    if runtime:
        session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        return list(session.run(None, inputs))
    return list(ReferenceEvaluator(model).run(None, inputs))


def interpret(make: Any, *arrays: np.ndarray) -> np.ndarray:
    """`make(vars...)` over `arrays` by the reference interpreter (the op's numpy reference)."""
    vs = [relay.var(f"a{i}", shape=a.shape, dtype=str(a.dtype)) for i, a in enumerate(arrays)]
    mod = relay.IRModule.from_expr(relay.Function(vs, make(*vs)))
    out: np.ndarray = relay.create_executor("debug", mod).evaluate()(*arrays)
    return out


def build(make: Any, *arrays: np.ndarray) -> np.ndarray:
    """`make(vars...)` over `arrays`, compiled for llvm and run."""
    vs = [relay.var(f"a{i}", shape=a.shape, dtype=str(a.dtype)) for i, a in enumerate(arrays)]
    lib = relay.build(relay.IRModule.from_expr(relay.Function(vs, make(*vs))), target="llvm")
    out: np.ndarray = lib.create_executor()(**{f"a{i}": a for i, a in enumerate(arrays)})
    return out


def grid_for(n: int, out: tuple[int, ...], spread: float = 1.6) -> np.ndarray:
    """A random float32 grid (n, *out, rank), about a third of it outside [-1, 1]."""
    return (RNG.standard_normal((n, *out, len(out))) * spread).astype(np.float32)


# --- image.grid_sample ----------------------------------------------------------------------------

GS_GRID = list(itertools.product(["nearest", "linear", "cubic"], ["zeros", "border", "reflection"], [False, True]))


@pytest.mark.parametrize(("method", "padding", "align"), GS_GRID)
@pytest.mark.parametrize("rank", [1, 2, 3])
def test_grid_sample_reference_matches_onnx(method: str, padding: str, align: bool, rank: int) -> None:
    x = RNG.standard_normal((2, 3, *(5, 4, 3)[:rank])).astype(np.float32)
    g = grid_for(2, (3, 4, 2)[:rank])
    want = onnx_run("GridSample", {"X": x, "G": g}, mode=method, padding_mode=padding, align_corners=int(align))[0]
    got = interpret(lambda a, b: relay.image.grid_sample(a, b, method, padding, align), x, g)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("method", "padding", "align"), GS_GRID)
def test_built_grid_sample_matches_reference(method: str, padding: str, align: bool) -> None:
    x = RNG.standard_normal((2, 3, 5, 4)).astype(np.float32)
    g = grid_for(2, (3, 7), spread=2.0)

    def make(a: Any, b: Any) -> Any:
        return relay.image.grid_sample(a, b, method, padding, align)

    np.testing.assert_allclose(build(make, x, g), interpret(make, x, g), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("method", ["linear", "cubic"])
def test_built_volumetric_grid_sample_of_float64_matches_reference(method: str) -> None:
    x = RNG.standard_normal((1, 2, 3, 4, 5))
    g = grid_for(1, (2, 3, 2)).astype(np.float64)

    def make(a: Any, b: Any) -> Any:
        return relay.image.grid_sample(a, b, method, "reflection", False)

    got = build(make, x, g)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, interpret(make, x, g), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", ["int32", "uint8", "bool"])
def test_built_nearest_grid_sample_gathers_any_dtype(dtype: str) -> None:
    x = (RNG.standard_normal((1, 2, 4, 3)) * 50).astype(dtype)
    g = grid_for(1, (5, 4), spread=0.8)

    def make(a: Any, b: Any) -> Any:
        return relay.image.grid_sample(a, b, "nearest", "zeros", False)

    got, want = build(make, x, g), interpret(make, x, g)
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got, want)
    assert (want == 0).any() and (want != 0).any()  # some samples fell outside, some inside


def test_grid_sample_of_nan_and_huge_positions_stays_in_bounds() -> None:
    x = RNG.standard_normal((1, 1, 3, 3)).astype(np.float32)
    g = np.array([[[[np.nan, 0.0], [1e30, -1e30], [np.inf, 0.5]]]], np.float32)
    for padding in ("zeros", "border", "reflection"):
        got = build(lambda a, b, p=padding: relay.image.grid_sample(a, b, "linear", p, False), x, g)
        assert got.shape == (1, 1, 1, 3)


def test_grid_sample_relation() -> None:
    assert rel("image.grid_sample", [TensorType((2, 3, 5, 4)), TensorType((2, 6, 7, 2))]) == TensorType((2, 3, 6, 7))
    assert rel("image.grid_sample", [TensorType((2, 3, 5, 4, 4), "float64"), TensorType((2, 1, 6, 7, 3), "float16")],
               method="nearest") == TensorType((2, 3, 1, 6, 7), "float64")


@pytest.mark.parametrize(("types", "kw", "message", "arg"), [
    ([(2, 3), (2, 3)], {}, r"expected data of rank 3 or more \(N, C, spatial...\), found", 0),
    ([(2, 3, 5, 4), (2, 6, 7, 3)], {}, r"expected a grid \(N, out spatial..., 2\) of rank 4 for data", 1),
    ([(2, 3, 5, 4), (1, 6, 7, 2)], {}, r"\(N = 2, 2 spatial axes\), found", 1),
    ([(2, 3, 5, 4), (2, 6, 2)], {}, r"of rank 4", 1),
    ([(1, 1, 2, 2, 2, 2), (1, 1, 1, 1, 1, 4)], {"method": "cubic"},
     r"method 'cubic' over 4 spatial axes reads 256 input elements per output element; at most 64", 0),
])
def test_grid_sample_relation_errors(types: list[tuple[int, ...]], kw: dict[str, Any], message: str,
                                     arg: int) -> None:
    with rel_error(message, arg):
        rel("image.grid_sample", [TensorType(t) for t in types], **kw)


def test_grid_sample_dtype_errors() -> None:
    with rel_error(r"method 'linear' needs float data, found dtype int32 \(method 'nearest' takes any dtype\)", 0):
        rel("image.grid_sample", [TensorType((1, 1, 2, 2), "int32"), TensorType((1, 1, 1, 2))])
    with rel_error(r"expected a float grid, found dtype int64", 1):
        rel("image.grid_sample", [TensorType((1, 1, 2, 2)), TensorType((1, 1, 1, 2), "int64")])


def test_grid_sample_attrs_errors() -> None:
    x, g = relay.var("x", shape=(1, 1, 2, 2)), relay.var("g", shape=(1, 1, 1, 2))
    with pytest.raises(AttrsError, match=r"attribute method must be one of 'nearest', 'linear', 'cubic', "
                                         r"got 'bilinear'"):
        relay.image.grid_sample(x, g, method="bilinear")
    with pytest.raises(AttrsError, match=r"attribute padding_mode must be one of 'zeros', 'border', 'reflection', "
                                         r"got 'wrap'"):
        relay.image.grid_sample(x, g, padding_mode="wrap")


# --- nn.max_pool2d_argmax -------------------------------------------------------------------------

ARGMAX_CASES = [  # kernel, strides, pads (ONNX order), dilations, ceil_mode, storage_order
    ((3, 3), (1, 1), (0, 0, 0, 0), (1, 1), 0, 0),
    ((3, 2), (2, 1), (1, 0, 1, 1), (1, 1), 0, 1),
    ((2, 2), (2, 2), (0, 0, 0, 0), (1, 1), 1, 0),
    ((2, 3), (1, 2), (1, 1, 0, 1), (2, 1), 1, 1),
]


@pytest.mark.parametrize(("kernel", "strides", "pads", "dilations", "ceil", "order"), ARGMAX_CASES)
def test_max_pool2d_argmax_matches_onnx(kernel: tuple[int, int], strides: tuple[int, int],
                                        pads: tuple[int, ...], dilations: tuple[int, int], ceil: int,
                                        order: int) -> None:
    x = RNG.standard_normal((2, 3, 7, 6)).astype(np.float32)
    x[0, 0, :3, :3] = 1.0  # ties: the first in scan order wins
    # onnxruntime: ONNX's reference gives wrong Indices for unit strides and dilations (its generic pool path)
    want_y, want_i = onnx_run("MaxPool", {"X": x}, n_out=2, runtime=True, kernel_shape=list(kernel),
                              strides=list(strides), pads=list(pads), dilations=list(dilations), ceil_mode=ceil,
                              storage_order=order)
    padding = (pads[0], pads[1], pads[2], pads[3])

    def make(a: Any) -> Any:
        return relay.Tuple([
            relay.nn.max_pool2d(a, kernel, strides, dilations, padding, ceil_mode=bool(ceil)),
            relay.nn.max_pool2d_argmax(a, kernel, strides, dilations, padding, bool(ceil), bool(order))])

    for run in (interpret, build):
        y, i = run(make, x)
        np.testing.assert_array_equal(np.asarray(y), want_y)
        assert np.asarray(i).dtype == np.int64
        np.testing.assert_array_equal(np.asarray(i), want_i)


def test_max_pool2d_argmax_picks_the_first_nan() -> None:
    x = np.zeros((1, 1, 2, 2), np.float32)
    x[0, 0, 1, 0], x[0, 0, 1, 1] = np.nan, np.nan
    for run in (interpret, build):
        assert np.asarray(run(lambda a: relay.nn.max_pool2d_argmax(a, (2, 2)), x)).ravel().tolist() == [2]


def test_max_pool2d_argmax_relation_errors() -> None:
    assert rel("nn.max_pool2d_argmax", [TensorType((1, 2, 5, 5))], pool_size=(2, 2)) == TensorType((1, 2, 4, 4),
                                                                                                   "int64")
    with rel_error(r"layout 'NHWC' is not supported: the indices count NCHW positions", 0):
        rel("nn.max_pool2d_argmax", [TensorType((1, 5, 5, 2))], layout="NHWC")


# --- nn.roi_align ---------------------------------------------------------------------------------

ROIS = np.array([[0.0, 0.0, 9.0, 9.0], [0.5, 2.0, 4.3, 7.1], [-3.0, 6.0, 12.0, 14.0], [5.0, 5.0, 5.5, 5.2]],
                np.float32)
BATCH = np.array([0, 1, 1, 0], np.int64)


@pytest.mark.parametrize("mode", ["avg", "max"])
@pytest.mark.parametrize("transform", ["half_pixel", "output_half_pixel"])
@pytest.mark.parametrize(("size", "ratio", "scale"), [((3, 4), 2, 1.0), ((2, 2), 3, 0.5)])
def test_roi_align_matches_onnx(mode: str, transform: str, size: tuple[int, int], ratio: int, scale: float) -> None:
    x = RNG.standard_normal((2, 3, 10, 8)).astype(np.float32)
    want = onnx_run("RoiAlign", {"X": x, "rois": ROIS, "batch_indices": BATCH}, mode=mode, output_height=size[0],
                    output_width=size[1], sampling_ratio=ratio, spatial_scale=scale,
                    coordinate_transformation_mode=transform)[0]

    def make(a: Any, r: Any, b: Any) -> Any:
        return relay.nn.roi_align(a, r, b, size, ratio, scale, mode, transform == "half_pixel")

    for run in (interpret, build):
        got = run(make, x, ROIS, BATCH)
        assert got.dtype == np.float32 and got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_roi_align_clamps_batch_indices_out_of_range() -> None:
    x = RNG.standard_normal((2, 1, 4, 4)).astype(np.float32)
    rois, batch = ROIS[:2] * 0.4, np.array([-5, 7], np.int64)

    def make(a: Any, r: Any, b: Any) -> Any:
        return relay.nn.roi_align(a, r, b, (2, 2))

    want = interpret(make, x, rois, np.array([0, 1], np.int64))
    np.testing.assert_allclose(build(make, x, rois, batch), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("types", "message", "arg"), [
    ([((1, 3, 8), "float32"), ((2, 4), "float32"), ((2,), "int64")], r"expected float data \(N, C, H, W\)", 0),
    ([((1, 3, 8, 8), "int32"), ((2, 4), "int32"), ((2,), "int64")], r"expected float data", 0),
    ([((1, 3, 8, 8), "float32"), ((2, 5), "float32"), ((2,), "int64")], r"expected rois \(num_rois, 4\)", 1),
    ([((1, 3, 8, 8), "float32"), ((2, 4), "float16"), ((2,), "int64")], r"of dtype float32, found", 1),
    ([((1, 3, 8, 8), "float32"), ((2, 4), "float32"), ((3,), "int64")],
     r"expected integer batch indices \(2,\), one per roi", 2),
])
def test_roi_align_relation_errors(types: list[tuple[tuple[int, ...], str]], message: str, arg: int) -> None:
    with rel_error(message, arg):
        rel("nn.roi_align", [TensorType(s, d) for s, d in types], output_size=(2, 2))


def test_roi_align_attrs_errors() -> None:
    x, r, b = relay.var("x", shape=(1, 1, 4, 4)), relay.var("r", shape=(1, 4)), relay.var("b", shape=(1,),
                                                                                        dtype="int64")
    with pytest.raises(AttrsError, match=r"sampling_ratio"):
        relay.nn.roi_align(x, r, b, sampling_ratio=0)
    with pytest.raises(AttrsError, match=r"attribute mode must be one of 'avg', 'max', got 'sum'"):
        relay.nn.roi_align(x, r, b, mode="sum")


# --- the text format ------------------------------------------------------------------------------


def test_new_ops_round_trip_through_the_text_format() -> None:
    from kiln.relay.parser import parse
    from kiln.relay.printer import astext

    x, g = relay.var("x", shape=(1, 3, 8, 8)), relay.var("g", shape=(1, 4, 4, 2))
    r, b = relay.var("r", shape=(2, 4)), relay.var("b", shape=(2,), dtype="int64")
    calls = [relay.image.grid_sample(x, g, "cubic", "reflection", True),
             relay.nn.max_pool2d_argmax(x, (3, 2), (2, 1), (1, 2), (1, 0, 1, 1), True, True),
             relay.nn.roi_align(x, r, b, (3, 5), 3, 0.25, "max", False)]
    for call in calls:
        text = astext(relay.Function([x, g, r, b], call))
        again = parse(text)
        assert astext(again) == text
        assert again.body.op is call.op and again.body.attrs == call.attrs
