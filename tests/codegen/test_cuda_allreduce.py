"""Reductions across GPU threads in CUDA C: warp shuffles, shared memory across warps, and what is refused.

Without a GPU the emitted code is compiled to PTX and CUBIN (sm_80, sm_90) and run
through the stand-in of tests/cuda_standin.py, whose `__shfl_xor_sync` exchanges
values between the OS threads of a block through memory and two barriers; tests
marked `gpu` run the same kernels on a GPU.
"""

from __future__ import annotations

import ctypes
import re
from typing import Any

import cuda_standin
import numpy as np
import pytest
from cuda_standin import gpu, needs_gxx

import kiln
from kiln import te, tir
from kiln.codegen import cuda, nvrtc
from kiln.codegen.jit import CodegenError
from kiln.runtime.cuda_module import CudaModule
from kiln.target import Target
from kiln.tir.allreduce import allreduce

SM90 = "cuda -arch=sm_90"
REDUCERS = {"sum": (te.sum, np.sum), "max": (te.max, np.max), "min": (te.min, np.min), "prod": (te.prod, np.prod)}


def row_reduce(rows: int, n: int, threads: int, per_block: int = 1, kind: str = "sum", dtype: str = "float32",
               local: bool = False) -> tuple[te.Schedule, list[te.Tensor]]:
    """R[i] = reduce over k of X[i, k]: `per_block` rows a block (threadIdx.y), each over `threads` threads of
    threadIdx.x; with `local`, R is a per-thread stage read by an output O = R + R at each row."""
    X = te.placeholder((rows, n), dtype, name="X")
    k = te.reduce_axis((0, n), name="k")
    R = te.compute((rows,), lambda i: REDUCERS[kind][0](X[i, k], axis=k), name="R")
    out = te.compute((rows,), lambda i: R[i] + R[i], name="O") if local else R
    s = te.create_schedule([out])
    row = out.op.axis[0]
    if per_block > 1:
        block, row = s[out].split(row, factor=per_block)
        s[out].bind(block, te.thread_axis("blockIdx.x"))
        s[out].bind(row, te.thread_axis("threadIdx.y"))
    else:
        s[out].bind(row, te.thread_axis("blockIdx.x"))
    if local:
        s[R].compute_at(s[out], row)
        s[R].set_scope("local")
    s[R].bind(s[R].split(k, factor=threads)[1], te.thread_axis("threadIdx.x"))
    return s, [X, out]


def source(mod: CudaModule) -> str:
    return mod.get_source("cuda")


def ptx_of(src: str) -> str:
    ptx = nvrtc.compile_ptx(src, "sm_90")
    return ptx if isinstance(ptx, str) else ptx.decode()


def assert_cubins(src: str) -> None:
    for arch in ("sm_80", "sm_90"):
        assert nvrtc.compile_cuda(src, arch)[:4] == b"\x7fELF", arch


@pytest.fixture
def host_cupy(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> Any:
    """CudaModule launches through the host emulator; yields the launches it made."""
    return cuda_standin.install(monkeypatch, tmp_path)


# -- the code ---------------------------------------------------------------------------------------


def test_a_warp_combines_its_lanes_with_a_butterfly_of_shuffles() -> None:
    mod = kiln.build(*row_reduce(6, 70, 32), target=SM90)
    src = source(mod)
    assert "for (int kiln_lane_mask = 16; kiln_lane_mask > 0; kiln_lane_mask >>= 1) {" in src
    assert "const float red_b = __shfl_xor_sync(0xffffffffu, red_a, kiln_lane_mask);" in src
    assert "red_a = (red_a + red_b);" in src and "R_acc[0] = red_a;" in src
    assert "__syncthreads" not in src and "kiln_shared" not in src
    (spec,) = mod.kernels
    assert spec.block == (32, 1, 1) and spec.shared_bytes == 0
    assert len(re.findall(r"shfl\.sync\.bfly\.b32", ptx_of(src))) == 5  # the loop unrolled: 16, 8, 4, 2, 1
    assert_cubins(src)


def test_the_warps_of_a_block_combine_through_shared_memory() -> None:
    mod = kiln.build(*row_reduce(4, 300, 128), target=SM90)
    src = source(mod)
    (spec,) = mod.kernels
    assert spec.block == (128, 1, 1) and spec.shared_bytes == 32  # a slot of 8 bytes per warp
    assert "float* kiln_scratch = (float*)(kiln_shared + 0);" in src
    assert "if (((int)threadIdx.x & 31) == 0) kiln_scratch[kiln_warp] = red_a;" in src
    assert "red_a = kiln_scratch[(kiln_warp & ~3) + ((int)threadIdx.x & 3)];" in src  # a lane per warp of the row
    assert "for (int kiln_lane_mask = 2; kiln_lane_mask > 0" in src  # then 4 partial results: 2 steps
    assert src.count("__syncthreads();") == 2
    assert len(re.findall(r"shfl\.sync\.bfly\.b32", ptx_of(src))) == 5 + 2
    assert_cubins(src)


def shared_tile_row_sum() -> tuple[te.Schedule, list[te.Tensor]]:
    """R = X.sum(1), two rows a block staged in shared memory, each row's sum over 64 threads (two warps)."""
    X = te.placeholder((8, 256), name="X")
    k = te.reduce_axis((0, 256), name="k")
    R = te.compute((8,), lambda i: te.sum(X[i, k], axis=k), name="R")
    s = te.create_schedule([R])
    XS = s.cache_read(X, "shared", [R])
    block, row = s[R].split(R.op.axis[0], factor=2)
    s[R].bind(block, te.thread_axis("blockIdx.x"))
    s[R].bind(row, te.thread_axis("threadIdx.y"))
    s[XS].compute_at(s[R], block)
    s[XS].bind(s[XS].split(s[XS].op.axis[1], factor=64)[1], te.thread_axis("threadIdx.x"))
    s[R].bind(s[R].split(k, factor=64)[1], te.thread_axis("threadIdx.x"))
    return s, [X, R]


def test_the_scratch_follows_the_shared_buffers_and_the_warps_of_every_row() -> None:
    mod = kiln.build(*shared_tile_row_sum(), target=SM90)
    src = source(mod)
    (spec,) = mod.kernels
    assert spec.block == (64, 2, 1) and spec.shared_bytes == 2 * 256 * 4 + 4 * 8  # the tile, then 4 warps' slots
    assert "float* kiln_scratch = (float*)(kiln_shared + 2048);" in src
    assert "const int kiln_warp = ((int)threadIdx.x + 64 * ((int)threadIdx.y + 2 * (int)threadIdx.z)) >> 5;" in src
    assert_cubins(src)


def test_a_block_that_is_not_whole_warps_names_only_its_lanes() -> None:
    src = source(kiln.build(*row_reduce(6, 7, 8, per_block=3), target=SM90))  # 24 threads: one warp, in part
    assert "__shfl_xor_sync(0xffffffu, red_a, kiln_lane_mask)" in src
    src = source(kiln.build(*row_reduce(6, 7, 8, per_block=6), target=SM90))  # 48: the second warp has 16 lanes
    assert "__shfl_xor_sync(((((int)threadIdx.x + 8 * ((int)threadIdx.y + 6 * (int)threadIdx.z)) >> 5) == 1 ? " \
           "0xffffu : 0xffffffffu), red_a, kiln_lane_mask)" in src
    assert_cubins(src)


@pytest.mark.parametrize(("dtype", "shuffled"), [
    ("float16", "__float2half(__shfl_xor_sync(0xffffffffu, __half2float(red_a), kiln_lane_mask))"),
    ("int8", "(signed char)(__shfl_xor_sync(0xffffffffu, (int)(red_a), kiln_lane_mask))"),
    ("float64", "const double red_b = __shfl_xor_sync(0xffffffffu, red_a, kiln_lane_mask);"),
    ("int64", "const long long red_b = __shfl_xor_sync(0xffffffffu, red_a, kiln_lane_mask);"),
])
def test_narrow_values_are_shuffled_as_int_or_float(dtype: str, shuffled: str) -> None:
    src = source(kiln.build(*row_reduce(2, 64, 32, kind="max", dtype=dtype), target=SM90))
    assert shuffled in src
    assert_cubins(src)


def bound(var: tir.Var, ext: int, body: tir.Stmt, tag: str) -> tir.For:
    return tir.For(var, tir.const(0), tir.const(ext), tir.ForKind.THREAD_BINDING, body, tag)


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("wider_block", "the all-reduce of acc over 32 threads: it must span the block's threadIdx.x extent, 64"),
        ("not_pow2", "the all-reduce of acc over 48 threads: the thread count must be a power of two"),
        ("divergent", "is under a condition or loop that differs between the threads of a block"),
        ("outside_y", "is under a condition or loop that differs between the threads of a block"),
    ],
)
def test_all_reduces_the_cuda_back_end_refuses(case: str, message: str) -> None:
    A = tir.buffer("A", (64,))
    acc = tir.buffer("acc", (1,), scope="local")
    t, u, y, b = tir.Var("t"), tir.Var("u"), tir.Var("y"), tir.Var("b")

    def reduce_over(var: tir.Var, threads: int, guard: bool = False) -> tir.Stmt:
        red: tir.Stmt = allreduce(acc.load(0), lambda a, b: a + b, threads)
        if guard:
            red = tir.IfThenElse(var < 5, red)
        return tir.Allocate(acc, tir.seq(tir.BufferStore(acc, A.load(var), (0,)), red,
                                         tir.BufferStore(A, acc.load(0), (var,))))

    bodies = {
        "wider_block": lambda: tir.seq(bound(t, 32, reduce_over(t, 32), "threadIdx.x"),
                                       bound(u, 64, tir.BufferStore(A, tir.const(0.0), (u,)), "threadIdx.x")),
        "not_pow2": lambda: bound(t, 48, reduce_over(t, 48), "threadIdx.x"),
        "divergent": lambda: bound(t, 32, reduce_over(t, 32, guard=True), "threadIdx.x"),
        # a statement outside every threadIdx.y loop runs on threadIdx.y == 0 only
        "outside_y": lambda: tir.seq(bound(t, 32, reduce_over(t, 32), "threadIdx.x"),
                                     bound(y, 2, tir.BufferStore(A, tir.const(0.0), (y,)), "threadIdx.y")),
    }
    with pytest.raises(CodegenError, match=re.escape(message)):  # one kernel: all in one block loop
        cuda.generate(tir.PrimFunc("f", [A], bound(b, 1, bodies[case](), "blockIdx.x")), Target(SM90))


# -- numerics through the stand-in -----------------------------------------------------------------

RUNS = [  # rows, n, threads, rows a block, reducer, dtype, local
    pytest.param(6, 70, 32, 1, "sum", "float32", False, id="warp"),
    pytest.param(6, 7, 8, 3, "max", "float32", False, id="part-of-a-warp"),
    pytest.param(6, 7, 8, 6, "sum", "float32", True, id="partial-second-warp"),
    pytest.param(4, 40, 16, 2, "min", "float32", True, id="two-rows-a-warp"),
    pytest.param(3, 300, 128, 1, "sum", "float32", False, id="block"),
    pytest.param(4, 200, 64, 2, "max", "float32", True, id="two-rows-of-two-warps"),
    pytest.param(2, 64, 32, 1, "max", "float16", False, id="float16"),
    pytest.param(2, 90, 64, 1, "sum", "float64", False, id="float64"),
    pytest.param(3, 50, 32, 1, "sum", "int64", True, id="int64"),
    pytest.param(3, 40, 32, 1, "min", "int8", False, id="int8"),
    pytest.param(2, 20, 32, 1, "prod", "float32", False, id="fewer-elements-than-threads"),
]


def check_run(rows: int, n: int, threads: int, per_block: int, kind: str, dtype: str, local: bool) -> None:
    rng = np.random.default_rng(rows * n + threads)
    if dtype.startswith("int"):
        x = rng.integers(-100, 100, (rows, n)).astype(dtype)
    else:
        x = (rng.uniform(0.8, 1.25, (rows, n)) if kind == "prod" else rng.standard_normal((rows, n))).astype(dtype)
    out = np.zeros(rows, dtype)
    kiln.build(*row_reduce(rows, n, threads, per_block, kind, dtype, local), target=SM90)(x, out)
    want = REDUCERS[kind][1](x.astype("float64" if dtype == "float16" else dtype), axis=1) * (2 if local else 1)
    if dtype.startswith("int"):
        np.testing.assert_array_equal(out, want.astype(dtype))
    else:
        tol = 2e-3 if dtype == "float16" else 1e-5
        np.testing.assert_allclose(out, want, rtol=tol, atol=tol)


@needs_gxx
@pytest.mark.parametrize(("rows", "n", "threads", "per_block", "kind", "dtype", "local"), RUNS)
def test_all_reduce_matches_numpy_through_the_host_stand_in(host_cupy: Any, rows: int, n: int, threads: int,
                                                             per_block: int, kind: str, dtype: str,
                                                             local: bool) -> None:
    check_run(rows, n, threads, per_block, kind, dtype, local)
    assert [launch[2] for launch in host_cupy] == [(threads, per_block, 1)]


def check_shared_tile_row_sum() -> None:
    x = np.random.default_rng(3).standard_normal((8, 256)).astype("float32")
    out = np.zeros(8, "float32")
    kiln.build(*shared_tile_row_sum(), target=SM90)(x, out)
    np.testing.assert_allclose(out, x.sum(1), rtol=1e-5, atol=1e-5)


@needs_gxx
def test_an_all_reduce_after_a_shared_tile_matches_numpy(host_cupy: Any) -> None:
    check_shared_tile_row_sum()


@needs_gxx
def test_the_stand_in_gives_a_lane_past_the_block_all_ones(tmp_path: Any) -> None:
    """As on a GPU, where reading a lane that does not exist is undefined: a kernel that did would fail."""
    src = ('extern "C" __global__ void __launch_bounds__(24) k(float* __restrict__ out) {\n'
           "  out[threadIdx.x] = __shfl_xor_sync(0xffffffu, (float)threadIdx.x, 16);\n}\n")
    lib = cuda_standin.host_library(src, tmp_path)
    out = np.zeros(24, "float32")
    lib.run_k(1, 1, 1, 24, 1, 1, (ctypes.c_void_p * 1)(out.ctypes.data))
    np.testing.assert_array_equal(out[:8], np.arange(16, 24))
    np.testing.assert_array_equal(out[16:], np.arange(0, 8))
    assert np.isnan(out[8:16]).all()  # their partners, lanes 24..31, are not in the block


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize(("rows", "n", "threads", "per_block", "kind", "dtype", "local"), RUNS)
def test_gpu_all_reduce_matches_numpy(rows: int, n: int, threads: int, per_block: int, kind: str, dtype: str,
                                      local: bool) -> None:
    check_run(rows, n, threads, per_block, kind, dtype, local)


@pytest.mark.gpu
@gpu
def test_gpu_all_reduce_after_a_shared_tile_matches_numpy() -> None:
    check_shared_tile_row_sum()
