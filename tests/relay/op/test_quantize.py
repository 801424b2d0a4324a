"""The ops of kiln/relay/op/quantize.py: qnn.quantize, qnn.dequantize, qnn.matmul_integer, qnn.conv_integer.

Their declarations, their relations (types, the granularity rules of scales and zero points, and the
errors naming the argument), printing and parsing, their numpy references against onnx's reference
implementations, and their te computes compiled for the host CPU (through the tiled schedule of the
integer products) against those references; and as CUDA C, run through tests/cuda_standin.py.
"""

from __future__ import annotations

import shutil
from typing import Any

import cuda_standin
import numpy as np
import pytest
from op_helpers import (
    assert_outputs_match,
    assert_registered_complete,
    assert_relation_waits,
    build_op,
    check_build,
    compile_op,
    ref,
    reference_outputs,
    rel,
    rel_error,
    run_on_device,
)

from kiln import relay
from kiln.ir.types import SizeVar, TensorType
from kiln.registry import OpPattern
from kiln.relay import parse
from kiln.relay.analysis import structural_equal
from kiln.relay.op import quantize as qnn
from kiln.relay.printer import astext

rng = np.random.default_rng(1)
OPS = ["qnn.quantize", "qnn.dequantize", "qnn.matmul_integer", "qnn.conv_integer"]


def tt(shape: tuple[Any, ...], dtype: str) -> TensorType:
    return TensorType(shape, dtype)


def ints(dtype: str, *shape: int) -> np.ndarray:
    info = np.iinfo(dtype)
    return np.asarray(rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True))


# --- declarations and relations ---------------------------------------------------------------------


def test_ops_are_declared_completely() -> None:
    assert_registered_complete("qnn.quantize", OpPattern.BROADCAST, ["data", "scale", "zero_point"],
                               qnn.QuantizeAttrs, 10)
    assert_registered_complete("qnn.dequantize", OpPattern.BROADCAST, ["data", "scale", "zero_point"],
                               qnn.QuantizeAttrs, 10)
    assert_registered_complete("qnn.matmul_integer", OpPattern.OUT_ELEMWISE_FUSABLE,
                               ["a", "b", "a_zero_point", "b_zero_point"], None, 10)
    assert_registered_complete("qnn.conv_integer", OpPattern.OUT_ELEMWISE_FUSABLE,
                               ["data", "weight", "data_zero_point", "weight_zero_point"], qnn.ConvIntegerAttrs, 10)
    for op in OPS:
        assert_relation_waits(op)


def test_quantize_types_follow_the_zero_point() -> None:
    n = SizeVar("n")
    out = rel("qnn.quantize", [tt((n, 3, 4), "float32"), tt((3,), "float32"), tt((3,), "int16")], axis=1)
    assert out == tt((n, 3, 4), "int16")
    out = rel("qnn.quantize", [tt((6, 7), "float16"), tt((6, 3), "float32"), tt((6, 3), "uint8")], axis=1,
              block_size=3)
    assert out == tt((6, 7), "uint8")
    out = rel("qnn.dequantize", [tt((6,), "int32"), tt((1,), "float16"), tt((1,), "int32")])
    assert out == tt((6,), "float16")
    out = rel("qnn.dequantize", [tt((6,), "int8"), tt((), "float32"), tt((), "int8")], out_dtype="float16")
    assert out == tt((6,), "float16")


def test_quantize_relation_errors_blame_the_argument() -> None:
    x = tt((2, 6), "float32")
    with rel_error("expected data of dtype", arg=0):
        rel("qnn.quantize", [tt((2,), "int8"), tt((), "float32"), tt((), "int8")])
    with rel_error("floating-point scale", arg=1):
        rel("qnn.quantize", [x, tt((), "int32"), tt((), "int8")])
    with rel_error("the shape of the scale", arg=2):
        rel("qnn.quantize", [x, tt((6,), "float32"), tt((), "int8")])
    with rel_error("output dtype, one of", arg=2):
        rel("qnn.quantize", [x, tt((), "float32"), tt((), "int32")])
    with rel_error(r"1-D of length 6 \(dim 1", arg=1):
        rel("qnn.quantize", [x, tt((5,), "float32"), tt((5,), "int8")])
    with rel_error(r"needs a scale of shape \(2, 2\)", arg=1):
        rel("qnn.quantize", [x, tt((2, 3), "float32"), tt((2, 3), "int8")], block_size=4)
    with rel_error("out of range", arg=None):
        rel("qnn.quantize", [x, tt((6,), "float32"), tt((6,), "int8")], axis=2)
    with rel_error("data's", arg=2):
        rel("qnn.dequantize", [tt((6,), "int8"), tt((), "float32"), tt((), "uint8")])


def test_product_relations() -> None:
    out = rel("qnn.matmul_integer", [tt((2, 1, 3, 5), "uint8"), tt((4, 5, 7), "int8"), tt((3,), "uint8"),
                                     tt((), "int8")])
    assert out == tt((2, 4, 3, 7), "int32")
    with rel_error("reduction dims differ", arg=1):
        rel("qnn.matmul_integer", [tt((3, 5), "int8"), tt((4, 7), "int8"), tt((), "int8"), tt((), "int8")])
    with rel_error("one per column of b", arg=3):
        rel("qnn.matmul_integer", [tt((3, 5), "int8"), tt((5, 7), "int8"), tt((), "int8"), tt((3,), "int8")])
    with rel_error("int8 or uint8", arg=0):
        rel("qnn.matmul_integer", [tt((3, 5), "int32"), tt((5, 7), "int8"), tt((), "int32"), tt((), "int8")])
    kw = {"strides": (2, 1), "padding": (1, 0, 1, 0), "dilation": (1, 2), "groups": 2}
    out = rel("qnn.conv_integer", [tt((1, 4, 7, 9), "uint8"), tt((6, 2, 3, 3), "int8"), tt((), "uint8"),
                                   tt((6,), "int8")], **kw)
    assert out == tt((1, 6, 4, 5), "int32")
    with rel_error("do not split into 4 groups", arg=1):
        rel("qnn.conv_integer", [tt((1, 4, 7, 9), "uint8"), tt((6, 1, 3, 3), "int8"), tt((), "uint8"),
                                 tt((), "int8")], **{**kw, "groups": 4})
    with rel_error("would be 0", arg=0):
        rel("qnn.conv_integer", [tt((1, 4, 2, 9), "uint8"), tt((6, 2, 3, 3), "int8"), tt((), "uint8"),
                                 tt((), "int8")], strides=(1, 1), padding=(0, 0, 0, 0), dilation=(1, 1), groups=2)


@pytest.mark.parametrize("op", OPS)
def test_calls_print_and_parse_back(op: str) -> None:
    if op in ("qnn.quantize", "qnn.dequantize"):
        dt = "float32" if op == "qnn.quantize" else "int8"
        args = [relay.var("x", shape=(2, 6), dtype=dt), relay.var("s", shape=(2, 2), dtype="float32"),
                relay.var("z", shape=(2, 2), dtype="int8")]
        call = getattr(qnn, op[4:])(*args, axis=-1, block_size=3, out_dtype="float64")
    elif op == "qnn.matmul_integer":
        args = [relay.var("a", shape=(3, 5), dtype="int8"), relay.var("b", shape=(5, 2), dtype="uint8"),
                relay.var("za", shape=(), dtype="int8"), relay.var("zb", shape=(2,), dtype="uint8")]
        call = qnn.matmul_integer(*args)
    else:
        args = [relay.var("x", shape=(1, 2, 5, 5), dtype="uint8"), relay.var("w", shape=(4, 2, 3, 3), dtype="int8"),
                relay.var("zx", shape=(), dtype="uint8"), relay.var("zw", shape=(4,), dtype="int8")]
        call = qnn.conv_integer(*args, strides=(1, 2), padding=(1, 1, 0, 0), dilation=(1, 1))
    f = relay.Function(args, call)
    back = parse(astext(f))
    assert astext(back, show_types=False) == astext(f, show_types=False)
    assert structural_equal(back, f, map_free_vars=True)


# --- references against onnx's ---------------------------------------------------------------------


def test_references_agree_with_onnx() -> None:
    pytest.importorskip("onnx")
    from onnx.reference.ops.op_conv import _conv_implementation
    from onnx.reference.ops.op_dequantize_linear import _CommonDequantizeLinear
    from onnx.reference.ops.op_quantize_linear import _CommonQuantizeLinear

    x = (rng.standard_normal((3, 7)) * 50).astype(np.float32)
    s, z = rng.uniform(0.1, 2, (3, 3)).astype(np.float32), ints("int8", 3, 3)
    (want,) = _CommonQuantizeLinear._run(None, x, s, z, axis=1, block_size=3)  # type: ignore[arg-type]
    np.testing.assert_array_equal(ref("qnn.quantize", x, s, z, axis=1, block_size=3), want)
    q = ints("uint8", 3, 7)
    zq = ints("uint8", 3, 3)
    (want,) = _CommonDequantizeLinear._run(None, q, s, zq, axis=1, block_size=3)  # type: ignore[arg-type]
    np.testing.assert_array_equal(ref("qnn.dequantize", q, s, zq, axis=1, block_size=3), want)
    xi, w = ints("int8", 2, 4, 6, 5), ints("int8", 6, 2, 3, 2)
    zx, zw = np.array(3, np.int8), ints("int8", 6)
    want = _conv_implementation(xi.astype(np.int32) - 3, w.astype(np.int32) - zw.astype(np.int32)[:, None, None, None],
                                None, "NOTSET", [2, 1], 2, [3, 2], [1, 0, 2, 1], [1, 2])
    got = ref("qnn.conv_integer", xi, w, zx, zw, strides=(1, 2), padding=(1, 0, 2, 1), dilation=(2, 1), groups=2)
    np.testing.assert_array_equal(got, want.astype(np.int32))


# --- computes against the references ----------------------------------------------------------------


@pytest.mark.parametrize(("scale_shape", "axis", "block"), [((), 1, 0), ((1,), 0, 0), ((4,), -1, 0),
                                                            ((3,), 1, 0), ((2, 3, 2), 2, 3)])
@pytest.mark.parametrize("dtype", ["int8", "uint16"])
def test_quantize_and_dequantize_compute(scale_shape: tuple[int, ...], axis: int, block: int, dtype: str) -> None:
    x = (rng.standard_normal((2, 3, 4)) * 1e6).astype(np.float32)
    x[0, 0, :3] = [0.5, 1.5, -2.5]  # ties, with a scale of 1 below
    s = rng.uniform(0.05, 3, scale_shape).astype(np.float32)
    if not scale_shape:
        s = np.array(1.0, np.float32)
    z = np.asarray(ints(dtype, *scale_shape) // 4)
    check_build("qnn.quantize", x, s, z, axis=axis, block_size=block)
    q = build_op("qnn.quantize", x, s, z, axis=axis, block_size=block)[0]
    info = np.iinfo(dtype)
    assert q.min() == info.min and q.max() == info.max  # saturated both ways
    check_build("qnn.dequantize", q, s, z, axis=axis, block_size=block, rtol=1e-6)


def test_quantize_float16_and_float64_divisions() -> None:
    x = (rng.standard_normal(50) * 100).astype(np.float16)
    check_build("qnn.quantize", x, np.array(0.7, np.float16), np.array(3, np.int8))
    check_build("qnn.quantize", x, np.array(0.7, np.float16), np.array(3, np.int8), out_dtype="float64")
    check_build("qnn.dequantize", ints("int16", 9), np.array(0.01, np.float64), np.array(-5, np.int16))


@pytest.mark.parametrize(("a_shape", "b_shape", "za_shape", "zb_shape"), [
    ((3, 5), (5, 4), (), ()),
    ((2, 1, 3, 7), (4, 7, 2), (3,), (2,)),
    ((1, 17), (17, 1), (1,), (1,)),
    ((5, 48), (48, 37), (5,), (37,)),  # tiles of 1 row x 1 column (37 is prime): scalar code
    ((3, 2, 8, 10), (10, 64), (), (64,)),  # tiles of 4 rows x 32 columns, batch dims on the cores
])
def test_matmul_integer_compute(a_shape: tuple[int, ...], b_shape: tuple[int, ...], za_shape: tuple[int, ...],
                                zb_shape: tuple[int, ...]) -> None:
    check_build("qnn.matmul_integer", ints("uint8", *a_shape), ints("int8", *b_shape), ints("uint8", *za_shape),
                ints("int8", *zb_shape))


def test_matmul_integer_accumulates_in_int32() -> None:
    a, b = np.full((2, 1000), -128, np.int8), np.full((1000, 2), -128, np.int8)
    (got,) = build_op("qnn.matmul_integer", a, b, np.array(127, np.int8), np.array(127, np.int8))
    assert (got == 1000 * 255 * 255).all()


@pytest.mark.parametrize(("x_shape", "w_shape", "kw"), [
    ((2, 3, 9), (4, 3, 2), {"strides": (2,), "padding": (1, 2), "dilation": (3,)}),
    ((1, 4, 6, 5), (6, 2, 3, 3), {"strides": (1, 2), "padding": (1, 1, 1, 0), "dilation": (1, 1), "groups": 2}),
    ((1, 2, 4, 4, 3), (2, 2, 2, 3, 1), {"strides": (1, 1, 2), "padding": (0, 1, 0, 1, 0, 1), "dilation": (2, 1, 1)}),
    ((2, 8, 9, 20), (12, 2, 3, 3), {"strides": (1, 1), "padding": (0, 0, 0, 0), "dilation": (1, 1), "groups": 4}),
    ((1, 3, 16, 35), (8, 3, 3, 5), {"strides": (2, 1), "padding": (2, 2, 1, 3), "dilation": (1, 2)}),
])
def test_conv_integer_compute(x_shape: tuple[int, ...], w_shape: tuple[int, ...], kw: dict[str, Any]) -> None:
    check_build("qnn.conv_integer", ints("uint8", *x_shape), ints("uint8", *w_shape), np.array(100, np.uint8),
                ints("uint8", w_shape[0]), **kw)


# --- CUDA: the generic GPU schedule of each op, run through the host stand-in (and a real GPU if there is one) ---

CUDA_CASES: dict[str, tuple[tuple[np.ndarray, ...], dict[str, Any]]] = {
    "qnn.quantize": ((rng.standard_normal((2, 3, 5)).astype(np.float32) * 300, np.array([0.5, 1.5, 2.5], np.float32),
                      np.array([3, -2, 0], np.int8)), {"axis": 1}),
    "qnn.dequantize": ((ints("uint8", 4, 6), rng.uniform(0.1, 1, (2, 6)).astype(np.float32), ints("uint8", 2, 6)),
                       {"axis": 0, "block_size": 3}),
    "qnn.matmul_integer": ((ints("int8", 2, 3, 7), ints("uint8", 7, 5), ints("int8", 3), ints("uint8", 5)), {}),
    "qnn.conv_integer": ((ints("uint8", 1, 4, 6, 7), ints("int8", 6, 2, 3, 3), np.asarray(ints("uint8")),
                          ints("int8", 6)), {"strides": (2, 1), "padding": (1, 1, 0, 2), "dilation": (1, 1),
                                             "groups": 2}),
}


@pytest.mark.parametrize("name", sorted(CUDA_CASES))
def test_ops_compile_to_cuda_and_match_numpy_through_the_host_stand_in(name: str, monkeypatch: pytest.MonkeyPatch,
                                                                         tmp_path: Any) -> None:
    arrays, kw = CUDA_CASES[name]
    want = reference_outputs(name, *arrays, **kw)
    targets = ["cuda -arch=sm_90"] + (["cuda"] if cuda_standin.HAS_GPU else [])
    for target in targets:
        if target == "cuda":  # a real GPU: its own arch, its own cupy
            import cupy

            got = [o.get() for o in run_on_device(compile_op(name, *arrays, target=target, **kw), *arrays, xp=cupy)]
            assert_outputs_match(name, got, want, 1e-6, 0.0)
            continue
        kernel = compile_op(name, *arrays, target=target, **kw)
        if shutil.which("g++") is None:
            continue
        cuda_standin.install(monkeypatch, tmp_path)
        outs = run_on_device(kernel, *arrays, xp=cuda_standin.FAKE_CUPY)
        assert_outputs_match(name, [o.get() for o in outs], want, 1e-6, 0.0)
