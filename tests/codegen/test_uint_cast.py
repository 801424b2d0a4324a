"""Conversions to and from float16 rounded as numpy rounds them, and the unsigned types in the CUDA back end.

float64 -> float16 must round once, from the double, to nearest even: NaN stays NaN, +-inf stays +-inf,
65520 and above overflow to inf, and the half subnormals come out right. Checked on the llvm path with
F16C (the host) and without it (kiln's own integer code), in constant folding, and in the CUDA C source.
"""

from __future__ import annotations

import cuda_standin
import numpy as np
import onnx
import pytest
from cuda_standin import HostArray, needs_gxx
from onnx import TensorProto, helper

import kiln
from kiln import relay, te, tir
from kiln.codegen import cuda, nvrtc
from kiln.runtime.cuda_module import CudaModule

SUB = 2.0**-24  # the smallest half subnormal
HARD = np.array([
    np.nan, -np.nan, np.inf, -np.inf, 65504.0, -65504.0, 65519.99, 65520.0, -65520.0, 1e5, 1e300, -1e300,
    1e-8, -1e-8, SUB, SUB / 2, -SUB / 2, SUB / 2 + 2**-60, SUB * 1.5, SUB * 2.5, 2**-25 + 2**-50, 5e-324,
    2**-14, 2**-14 - SUB, 2**-14 - SUB / 2, 2**-15 + SUB / 2, 0.0, -0.0,
    1 + 2**-11, 1 + 3 * 2**-11, 1 + 2**-11 + 2**-40, 2049.0, 2051.0, 2**15 + 16, 0.1, 1 / 3, -2.5,
], "float64")  # halfway cases (ties to even, and just above a tie, which a double rounding gets wrong)
LLVM_TARGETS = ["llvm", "llvm -mcpu=x86-64"]  # the host (F16C where it has it) and kiln's integer code
SM90 = "cuda -arch=sm_90"


def _same_half(got: np.ndarray, want: np.ndarray) -> None:
    """Bit-identical float16 arrays, except that any NaN matches any NaN."""
    assert got.dtype == want.dtype == np.float16
    both_nan = np.isnan(got) & np.isnan(want)
    same = (got.view(np.uint16) == want.view(np.uint16)) | both_nan
    assert same.all(), f"got {got[~same]} ({got[~same].view(np.uint16)}), numpy {want[~same]}"


def _hard(dtype: str) -> np.ndarray:
    with np.errstate(over="ignore"):
        return HARD.astype(dtype)


def _cast_function(src: str, dst: str, n: int) -> relay.Function:
    x = relay.var("x", shape=(n,), dtype=src)
    return relay.Function([x], relay.cast(x, dst))


@pytest.mark.parametrize("target", LLVM_TARGETS)
@pytest.mark.parametrize("src", ["float64", "float32"])
def test_llvm_casts_to_float16_round_like_numpy(target: str, src: str) -> None:
    a = _hard(src)
    got = relay.build(_cast_function(src, "float16", a.size), target=target).create_executor()(x=a)
    with np.errstate(over="ignore"):
        _same_half(np.asarray(got), a.astype(np.float16))


@pytest.mark.parametrize("target", LLVM_TARGETS)
@pytest.mark.parametrize("dst", ["float64", "float32"])
def test_llvm_casts_from_float16_are_exact(target: str, dst: str) -> None:
    every = np.arange(2**16, dtype=np.uint32).astype(np.uint16).view(np.float16)  # every half, NaNs included
    got = np.asarray(relay.build(_cast_function("float16", dst, every.size), target=target).create_executor()(x=every))
    want = every.astype(dst)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    np.testing.assert_array_equal(got[ok], want[ok])
    np.testing.assert_array_equal(np.signbit(got[ok]), np.signbit(want[ok]))  # -0.0 stays -0.0


@pytest.mark.parametrize("op", ["Cast", "CastLike"])
def test_onnx_cast_double_to_half_with_nan_and_inf_runs(op: str) -> None:
    """The issue's crash: Cast/CastLike float64 -> float16 fed NaN and inf at run time."""
    x = helper.make_tensor_value_info("x", TensorProto.DOUBLE, [HARD.size])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT16, [HARD.size])
    if op == "Cast":
        node, inits = helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT16), []
    else:
        like = helper.make_tensor("like", TensorProto.FLOAT16, [1], [0.0])
        node, inits = helper.make_node("CastLike", ["x", "like"], ["y"]), [like]
    model = helper.make_model(helper.make_graph([node], "cast", [x], [y], inits),
                              opset_imports=[helper.make_opsetid("", 19)])
    onnx.checker.check_model(model)
    mod, params = relay.frontend.from_onnx(model)
    got = relay.build(mod, target="llvm", params=params).create_executor()(x=HARD)
    with np.errstate(over="ignore"):
        _same_half(np.asarray(got), HARD.astype(np.float16))


def test_constant_folding_rounds_like_numpy() -> None:
    """A cast of a constant is folded by numpy; one through float16 and back rounds to half precision."""
    c = relay.const(HARD)
    y = relay.var("y", shape=(HARD.size,), dtype="float16")
    folded = relay.cast(c, "float16")
    round_trip = relay.cast(relay.cast(relay.const(HARD), "float16"), "float64")
    func = relay.Function([y], relay.Tuple([relay.multiply(folded, y), round_trip]))
    with np.errstate(over="ignore"):  # numpy's own warning, as FoldConstant runs the cast's reference
        half, wide = relay.build(func, target="llvm").create_executor()(y=np.ones(HARD.size, np.float16))
        want = HARD.astype(np.float16)
    _same_half(np.asarray(half), want)
    np.testing.assert_array_equal(np.asarray(wide), want.astype(np.float64))


def test_tir_constant_casts_round_once_to_nearest_even() -> None:
    for v in HARD[~np.isnan(HARD)]:
        with np.errstate(over="ignore"):
            want16, want32 = float(np.float16(v)), float(np.float32(v))
        folded = tir.cast("float16", tir.const(float(v), "float64"))
        assert isinstance(folded, tir.FloatImm) and folded.value == want16, v
        assert tir.cast("float32", tir.const(float(v), "float64")).value == want32, v
    assert tir.cast("float64", tir.cast("float16", tir.const(1 + 2**-11 + 2**-40, "float64"))).value == 1 + 2**-10


# -- CUDA C --------------------------------------------------------------------------------------------


def _elementwise(fn, dtype: str, n: int, out_dtype: str) -> tuple[te.Schedule, list[te.Tensor]]:
    A = te.placeholder((n,), dtype, name="A")
    C = te.compute((n,), lambda i: fn(A[i]), name="C")
    assert C.dtype == out_dtype
    s = te.create_schedule([C])
    bx, tx = s[C].split(C.op.axis[0], factor=32)
    s[C].bind(bx, te.thread_axis("blockIdx.x"))
    s[C].bind(tx, te.thread_axis("threadIdx.x"))
    return s, [A, C]


def _assert_cubins(source: str) -> None:
    for arch in ("sm_80", "sm_90"):
        assert nvrtc.compile_cuda(source, arch)[:4] == b"\x7fELF", arch


def test_cuda_double_to_half_is_one_conversion_and_compiles() -> None:
    mod = kiln.build(*_elementwise(lambda x: x.astype("float16"), "float64", HARD.size, "float16"), target=SM90)
    src = mod.get_source("cuda")
    assert "__double2half(A[" in src and "(float)" not in src  # never through float (two roundings)
    _assert_cubins(src)
    back = kiln.build(*_elementwise(lambda x: x.astype("float64"), "float16", 64, "float64"), target=SM90)
    _assert_cubins(back.get_source("cuda"))
    # the stand-in header (no toolkit installed) converts with PTX's round-to-nearest-even instruction
    assert "cvt.rn.f16.f64" in nvrtc._FALLBACK_FP16


def test_cuda_half_literals_are_rounded_once_from_the_constant() -> None:
    assert cuda._float_literal(1 + 2**-11 + 2**-40, "float16") == "__float2half(1.00097656f)"  # 1 + 2**-10
    assert cuda._float_literal(65520.0, "float16") == "__float2half(__int_as_float(0x7f800000))"
    assert cuda._float_literal(-1e300, "float16") == "__float2half(-__int_as_float(0x7f800000))"
    assert cuda._float_literal(SUB * 2.5, "float16") == f"__float2half({SUB * 2:.9g}f)"
    assert cuda._float_literal(float("nan"), "float16") == "__float2half(__int_as_float(0x7fc00000))"


@needs_gxx
@pytest.mark.parametrize("src", ["float64", "float32"])
def test_cuda_casts_to_float16_match_numpy_on_the_host_stand_in(monkeypatch, tmp_path, src: str) -> None:
    cuda_standin.install(monkeypatch, tmp_path)
    a = _hard(src)
    out = np.zeros(a.size, np.float16)
    kiln.build(*_elementwise(lambda x: x.astype("float16"), src, a.size, "float16"), target=SM90)(a, out)
    with np.errstate(over="ignore"):
        _same_half(out, a.astype(np.float16))


UINT_VALUES = {
    "uint16": ([40000, 65535, 3, 0, 32768, 65534, 7, 300], [3, 2, 40000, 1, 32767, 65535, 60000, 0]),
    "uint32": ([2**31 + 7, 2**32 - 1, 3, 0, 2**31, 2**32 - 2, 7, 300], [3, 2, 2**31 + 1, 1, 7, 2**32 - 1, 9, 0]),
    "uint64": ([2**63 + 5, 2**64 - 1, 3, 0, 2**63, 2**64 - 2, 7, 300], [3, 2, 2**63 + 1, 1, 7, 2**64 - 1, 9, 0]),
}
UINT_OPS = [("add", np.add), ("subtract", np.subtract), ("multiply", np.multiply), ("floor_divide", None),
            ("floor_mod", None), ("minimum", np.minimum), ("maximum", np.maximum), ("less", np.less),
            ("greater_equal", np.greater_equal)]


def _uint_graph(dtype: str, n: int) -> relay.Function:
    a, b = relay.var("a", shape=(n,), dtype=dtype), relay.var("b", shape=(n,), dtype=dtype)
    outs = [getattr(relay, name)(a, b) for name, _ in UINT_OPS]
    outs += [relay.cast(a, "float16"), relay.cast(a, "float64"), relay.cast(a, "int64"), relay.cast(a, "uint8"),
             relay.cast(relay.cast(a, "float32"), dtype), relay.abs(a), relay.add(a, relay.const(np.array(7, dtype)))]
    return relay.Function([a, b], relay.Tuple(outs))


def _uint_want(a: np.ndarray, b: np.ndarray) -> list[np.ndarray]:
    safe = np.where(b == 0, 1, b).astype(a.dtype)
    div = {"floor_divide": np.where(b == 0, 0, a // safe).astype(a.dtype),  # dividing by 0 gives 0
           "floor_mod": np.where(b == 0, 0, a % safe).astype(a.dtype)}
    with np.errstate(over="ignore", invalid="ignore"):
        f32 = a.astype(np.float32)
        back = np.where(f32 >= 2.0 ** (8 * a.itemsize), np.iinfo(a.dtype).max, f32).astype(a.dtype)  # saturates
        return [fn(a, b) if fn is not None else div[name] for name, fn in UINT_OPS] + [
            a.astype(np.float16), a.astype(np.float64), a.astype(np.int64), a.astype(np.uint8), back, a,
            a + a.dtype.type(7)]


@pytest.mark.parametrize("dtype", list(UINT_VALUES))
def test_cuda_unsigned_kernels_compile_for_sm80_and_sm90(dtype: str) -> None:
    for arch in ("sm_80", "sm_90"):
        lib = relay.build(_uint_graph(dtype, 8), target=f"cuda -arch={arch}")
        assert lib.kernels
        for module in lib.kernels:
            assert isinstance(module, CudaModule) and module.cubin[:4] == b"\x7fELF"
        src = "".join(m.get_source("cuda") for m in lib.kernels)
        assert cuda.C_TYPES[dtype] in src


def test_cuda_unsigned_literals_and_types() -> None:
    assert cuda._int_literal(2**63 + 5, "uint64") == "9223372036854775813ull"
    assert cuda._int_literal(2**32 - 1, "uint32") == "4294967295u"
    assert cuda._int_literal(40000, "uint16") == "((unsigned short)40000)"
    assert [cuda.C_TYPES[t] for t in ("uint16", "uint32", "uint64")] == [
        "unsigned short", "unsigned int", "unsigned long long"]
    s, args = _elementwise(lambda x: x * x + tir.const(2**63 + 5, "uint64"), "uint64", 32, "uint64")
    src = kiln.build(s, args, target=SM90).get_source("cuda")
    assert "9223372036854775813ull" in src
    _assert_cubins(src)
    # uint16 * uint16 is computed in unsigned int: in C's int, 65535 * 65535 would overflow
    s, args = _elementwise(lambda x: x * x, "uint16", 32, "uint16")
    src = kiln.build(s, args, target=SM90).get_source("cuda")
    assert "((unsigned int)" in src and " * " in src
    _assert_cubins(src)


@needs_gxx
@pytest.mark.parametrize("dtype", list(UINT_VALUES))
def test_cuda_unsigned_ops_match_numpy_on_the_host_stand_in(monkeypatch, tmp_path, dtype: str) -> None:
    cuda_standin.install(monkeypatch, tmp_path)
    a, b = (np.array(v, dtype) for v in UINT_VALUES[dtype])
    got = relay.build(_uint_graph(dtype, a.size), target=SM90).create_executor()(a=HostArray(a), b=HostArray(b))
    for i, (g, w) in enumerate(zip(got, _uint_want(a, b), strict=True)):
        g = g.get()
        assert g.dtype == w.dtype, i
        np.testing.assert_array_equal(g, w, err_msg=f"output {i} on {dtype}")


def _row_reductions(dtype: str, shape: tuple[int, int]) -> relay.Function:
    x = relay.var("x", shape=shape, dtype=dtype)
    return relay.Function([x], relay.Tuple([relay.sum(x, axis=[1]), relay.max(x, axis=[1]), relay.argmin(x, axis=1)]))


@pytest.mark.parametrize("dtype", list(UINT_VALUES))
def test_cuda_unsigned_row_reductions_shuffle_and_compile(dtype: str) -> None:
    lib = relay.build(_row_reductions(dtype, (4, 300)), target=SM90)  # NVRTC compiles every kernel to a CUBIN
    src = "".join(m.get_source("cuda") for m in lib.kernels)
    assert "__shfl_xor_sync" in src and cuda.C_TYPES[dtype] in src


@needs_gxx
@pytest.mark.parametrize("dtype", ["uint16", "uint64"])
def test_cuda_unsigned_row_reductions_match_numpy_on_the_host_stand_in(monkeypatch, tmp_path, dtype: str) -> None:
    cuda_standin.install(monkeypatch, tmp_path)
    top = np.iinfo(dtype).max
    x = np.array([[top, 2, 9, top - 1, 40], [3, 2**(np.iinfo(dtype).bits - 1) + 5, 0, 7, 1]], dtype)
    got = relay.build(_row_reductions(dtype, x.shape), target=SM90).create_executor()(x=HostArray(x))
    with np.errstate(over="ignore"):
        want = [x.sum(axis=1, dtype=dtype), x.max(axis=1), x.argmin(axis=1).astype("int32")]
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g.get(), w)
        assert g.get().dtype == w.dtype
