"""The CUDA back end: generated CUDA C, NVRTC to CUBIN, and kernels run against numpy.

Without a GPU (CI), every kernel is compiled to CUBIN for sm_80 and sm_90, and
its numerics are checked by running `CudaModule.__call__` against a stand-in
for cupy whose launches run the generated CUDA C on the host (g++, one OS thread
per CUDA thread, `__syncthreads` a barrier, blocks in turn). Tests marked `gpu`
launch on a real GPU and run where `cupy.cuda.is_available()`.
"""

from __future__ import annotations

import re

import cuda_standin
import numpy as np
import pytest
from cuda_standin import HAS_GPU, HostArray, gpu, needs_gxx
from te_helpers import two_stages

import kiln
from kiln import te, tir
from kiln.codegen import cuda, nvrtc
from kiln.codegen.jit import CodegenError
from kiln.runtime.cuda_module import CudaModule, eval_int
from kiln.runtime.module import ArgumentError
from kiln.target import Target

SM90 = "cuda -arch=sm_90"


# -- schedules ---------------------------------------------------------------------------------


def vector_add(n=1000, factor=128, dtype="float32"):
    A = te.placeholder((n,), dtype, name="A")
    B = te.placeholder((n,), dtype, name="B")
    C = te.compute((n,), lambda i: A[i] + B[i], name="C")
    s = te.create_schedule([C])
    bx, tx = s[C].split(C.op.axis[0], factor=factor)
    s[C].bind(bx, te.thread_axis("blockIdx.x"))
    s[C].bind(tx, te.thread_axis("threadIdx.x"))
    return s, [A, B, C]


def row_sum(n=200, m=64, factor=64):
    X = te.placeholder((n, m), name="X")
    k = te.reduce_axis((0, m), name="k")
    S = te.compute((n,), lambda i: te.sum(X[i, k], axis=k), name="S")
    s = te.create_schedule([S])
    bx, tx = s[S].split(S.op.axis[0], factor=factor)
    s[S].bind(bx, te.thread_axis("blockIdx.x"))
    s[S].bind(tx, te.thread_axis("threadIdx.x"))
    return s, [X, S]


def shared_row_sum(n=40, m=64, rows=8):
    """Each block stages `rows` rows in shared memory (threadIdx.x per column), then one thread per row sums."""
    X = te.placeholder((n, m), name="X")
    k = te.reduce_axis((0, m), name="k")
    R = te.compute((n,), lambda i: te.sum(X[i, k], axis=k), name="R")
    s = te.create_schedule([R])
    XS = s.cache_read(X, "shared", [R])
    bx, ty = s[R].split(R.op.axis[0], factor=rows)
    s[R].bind(bx, te.thread_axis("blockIdx.x"))
    s[R].bind(ty, te.thread_axis("threadIdx.y"))
    s[XS].compute_at(s[R], bx)
    s[XS].bind(s[XS].op.axis[1], te.thread_axis("threadIdx.x"))
    return s, [X, R]


def elementwise(fn, dtype="float32", n=300, out_dtype=None, factor=64):
    A = te.placeholder((n,), dtype, name="A")
    C = te.compute((n,), lambda i: fn(A[i]), name="C")
    assert C.dtype == (out_dtype or dtype)
    s = te.create_schedule([C])
    bx, tx = s[C].split(C.op.axis[0], factor=factor)
    s[C].bind(bx, te.thread_axis("blockIdx.x"))
    s[C].bind(tx, te.thread_axis("threadIdx.x"))
    return s, [A, C]




def tiled_matmul(m=64, n=48, k=40, tile=16):
    """C = A @ B, a tile x tile block of C per block of tile x tile threads; the k loop refills shared tiles."""
    A = te.placeholder((m, k), name="A")
    B = te.placeholder((k, n), name="B")
    r = te.reduce_axis((0, k), name="r")
    C = te.compute((m, n), lambda i, j: te.sum(A[i, r] * B[r, j], axis=r), name="C")
    s = te.create_schedule([C])
    AS, BS = s.cache_read(A, "shared", [C]), s.cache_read(B, "shared", [C])
    bi, ti = s[C].split(C.op.axis[0], factor=tile)
    bj, tj = s[C].split(C.op.axis[1], factor=tile)
    ro, ri = s[C].split(r, factor=tile)
    s[C].reorder(bi, bj, ro, ti, tj, ri)
    for axis, tag in ((bi, "blockIdx.y"), (bj, "blockIdx.x"), (ti, "threadIdx.y"), (tj, "threadIdx.x")):
        s[C].bind(axis, te.thread_axis(tag))
    for X in (AS, BS):
        s[X].compute_at(s[C], ro)
        s[X].bind(s[X].op.axis[0], te.thread_axis("threadIdx.y"))
        s[X].bind(s[X].op.axis[1], te.thread_axis("threadIdx.x"))
    return s, [A, B, C]


def register_tiled_matmul(m=40, n=36, k=20, tile=2, threads=4, step=4):
    """TVM's GPU matmul: each thread accumulates a tile x tile block of C in registers (a local stage at the
    thread loops); the shared panels are computed inside the threads' k loop and filled by the same threads."""
    A = te.placeholder((m, k), name="A")
    B = te.placeholder((k, n), name="B")
    r = te.reduce_axis((0, k), name="r")
    C = te.compute((m, n), lambda i, j: te.sum(A[i, r] * B[r, j], axis=r), name="C")
    s = te.create_schedule([C])
    CL = s.cache_write(C, "local")
    bi, ri = s[C].split(s[C].op.axis[0], factor=threads * tile)
    ti, ii = s[C].split(ri, factor=tile)
    bj, rj = s[C].split(s[C].op.axis[1], factor=threads * tile)
    tj, jj = s[C].split(rj, factor=tile)
    s[C].reorder(bi, bj, ti, tj, ii, jj)
    for axis, tag in ((bi, "blockIdx.y"), (bj, "blockIdx.x"), (ti, "threadIdx.y"), (tj, "threadIdx.x")):
        s[C].bind(axis, te.thread_axis(tag))
    s[CL].compute_at(s[C], tj)
    ko, ki = s[CL].split(s[CL].op.reduce_axis[0], factor=step)
    s[CL].reorder(ko, ki, *s[CL].op.axis)
    for X in (A, B):
        XS = s.cache_read(X, "shared", [CL], axes=(1, 0) if X is A else None)  # both panels k-major
        s[XS].compute_at(s[CL], ko)
        rest, tx = s[XS].split(s[XS].fuse(*s[XS].op.axis), factor=threads)
        _, ty = s[XS].split(rest, factor=threads)
        s[XS].bind(ty, te.thread_axis("threadIdx.y"))
        s[XS].bind(tx, te.thread_axis("threadIdx.x"))
    return s, [A, B, C]


def kernel_text(mod: CudaModule, k: int = 0) -> str:
    src = mod.get_source("cuda")
    starts = [m.start() for m in re.finditer(r'^extern "C" __global__', src, re.MULTILINE)]
    return src[starts[k]:(starts[k + 1] if k + 1 < len(starts) else len(src))]


def assert_cubins(source: str) -> None:
    for arch in ("sm_80", "sm_90"):
        cubin = nvrtc.compile_cuda(source, arch)
        assert cubin[:4] == b"\x7fELF", arch


# -- a stand-in for cupy that runs kernels on the host (tests/cuda_standin.py) ------------------


@pytest.fixture
def host_cupy(monkeypatch, tmp_path):
    """Makes CudaModule launch through the host emulator; yields the launches it made."""
    return cuda_standin.install(monkeypatch, tmp_path)


# -- generated source, compiled without a GPU ------------------------------------------------------


def test_elementwise_kernel_source_and_launch_shape():
    s, args = vector_add(1000, 128)
    mod = kiln.build(s, args, target=SM90)
    assert isinstance(mod, CudaModule)
    text = kernel_text(mod)
    assert text.startswith('extern "C" __global__ void __launch_bounds__(128) main_kernel0(const float* '
                           "__restrict__ A, const float* __restrict__ B, float* __restrict__ C) {")
    assert "const int i_outer = (int)blockIdx.x;" in text
    assert "const int i_inner = (int)threadIdx.x;" in text
    assert "if (((i_outer * 128) + i_inner) < 1000) {" in text  # the tail of the split
    (spec,) = mod.kernels
    assert [[str(e) for e in axis] for axis in spec.grid] == [["8"], [], []]
    assert spec.block == (128, 1, 1) and spec.shared_bytes == 0
    assert mod.code.written == {2} and mod.arch == "sm_90"
    assert_cubins(mod.get_source("cuda"))


def test_reduction_is_one_thread_per_row_with_a_serial_loop():
    s, args = row_sum()
    text = kernel_text(kiln.build(s, args, target=SM90))
    assert "S[(i_outer * 64) + i_inner] = 0.0f;" in text
    assert "for (int k = 0; k < 64; ++k) {" in text
    assert "S[(i_outer * 64) + i_inner] = S[(i_outer * 64) + i_inner] + X[(((i_outer * 64) + i_inner) * 64) + k];" \
        in text  # int32 indices: X has 12800 elements


def test_float16_kernels_use_half_and_compile_with_and_without_the_toolkit_header(monkeypatch):
    s, args = vector_add(256, 64, "float16")
    src = kiln.build(s, args, target=SM90).get_source("cuda")
    assert "#include <cuda_fp16.h>" in src
    assert "__half* __restrict__ C" in src
    assert "__float2half(__half2float(A[(i_outer * 64) + i_inner]) + __half2float(B[(i_outer * 64) + i_inner]))" \
        in src
    monkeypatch.setenv("KILN_CACHE", "0")
    assert_cubins(src)
    monkeypatch.setattr(nvrtc, "fp16_include_dir", lambda: None)  # kiln's own stand-in header
    assert nvrtc._headers(src)[2] == ["cuda_fp16.h"]
    assert_cubins(src)


@pytest.mark.parametrize(
    ("name", "dtype", "c_call"),
    [
        ("exp", "float32", "expf("),
        ("tanh", "float32", "tanhf("),
        ("erf", "float32", "erff("),
        ("sigmoid", "float32", "__fdividef(1.0f, 1.0f + expf(-("),
        ("round", "float32", "rintf("),
        ("exp", "float64", "exp("),
        ("sqrt", "float16", "__float2half(sqrtf(__half2float("),
    ],
)
def test_intrinsics_become_cuda_math_functions(name, dtype, c_call):
    s, args = elementwise(lambda x: tir.call(name, x), dtype)
    src = kiln.build(s, args, target=SM90).get_source("cuda")
    assert c_call in kernel_text(kiln.build(s, args, target=SM90))
    assert "__expf" not in src
    nvrtc.compile_cuda(src, "sm_80")


def test_each_top_level_nest_is_a_kernel_and_temporaries_are_workspaces():
    s, args = two_stages(100)
    mod = kiln.build(s, args, target=SM90)
    assert [k.name for k in mod.kernels] == ["main_kernel0", "main_kernel1"]
    assert [(w.name, eval_int(w.shape[0], {})) for w in mod.code.workspaces] == [("C", 100)]
    assert [(a.kind, a.index) for a in mod.kernels[0].args] == [("param", 0), ("param", 1), ("workspace", 0)]
    assert [(a.kind, a.index) for a in mod.kernels[1].args] == [("param", 2), ("workspace", 0)]
    assert "main_kernel1(float* __restrict__ D, const float* __restrict__ C)" in kernel_text(mod, 1)
    assert_cubins(mod.get_source("cuda"))


def test_shared_memory_gets_a_barrier_and_statements_outside_an_axis_run_on_index_0():
    s, args = shared_row_sum()
    mod = kiln.build(s, args, target=SM90)
    text = kernel_text(mod)
    assert "extern __shared__ __align__(16) unsigned char kiln_shared[];" in text
    assert "float* __restrict__ X_shared = (float*)(kiln_shared + 0);" in text
    fill, rest = text.split("__syncthreads();")
    assert "if (threadIdx.y == 0) {" in fill and "X_shared[" in fill  # the fill binds threadIdx.x only
    assert "if (threadIdx.x == 0) {" in rest and "R[" in rest  # the sum binds threadIdx.y only
    (spec,) = mod.kernels
    assert spec.block == (64, 8, 1) and spec.shared_bytes == 8 * 64 * 4
    assert_cubins(mod.get_source("cuda"))


def test_serial_loop_that_refills_shared_memory_syncs_at_its_end():
    i, ko = tir.Var("i"), tir.Var("ko")
    X = tir.buffer("X", (4, 32))
    Y = tir.buffer("Y", (32,))
    T = tir.buffer("T", (32,), scope="shared")
    tx = tir.Var("tx")
    fill = tir.For(tx, tir.const(0), tir.const(32), tir.ForKind.THREAD_BINDING,
                   tir.BufferStore(T, X.load(ko, tx), (tx,)), "threadIdx.x")
    tx2 = tir.Var("tx")
    use = tir.For(tx2, tir.const(0), tir.const(32), tir.ForKind.THREAD_BINDING,
                  tir.BufferStore(Y, Y.load(tx2) + T.load(31 - tx2), (tx2,)), "threadIdx.x")
    body = tir.Allocate(T, tir.for_range(ko, 4, tir.seq(fill, use)))
    func = tir.PrimFunc("refill", [X, Y], tir.For(i, tir.const(0), tir.const(1), tir.ForKind.THREAD_BINDING, body,
                                                  "blockIdx.x"))
    text = cuda.generate(func, Target(SM90)).source
    loop = text[text.index("for (int ko"):]
    # before the fill (the previous iteration may still read T) and after it
    assert re.search(r"\{\n +__syncthreads\(\);\n.*T\[tx\] = .*\n +__syncthreads\(\);\n.*Y\[tx_1\]", loop, re.DOTALL)
    assert loop.count("__syncthreads();") == 2
    assert_cubins(text)


def test_shared_panels_cover_the_whole_block_and_are_filled_by_the_same_threads():
    mod = kiln.build(*register_tiled_matmul(), target=SM90)
    text = kernel_text(mod)
    # block tile 8 x 8 (4 x 4 threads of 2 x 2), k step 4: each panel is 4 x 8 floats, k-major
    assert mod.kernels[0].shared_bytes == 2 * 4 * 8 * 4 and mod.kernels[0].block == (4, 4, 1)
    assert "float C_local[4];" in text  # the register tile: one thread's 2 x 2, not the block's
    assert text.count("(int)threadIdx.x;") == 3  # the thread loop of C and the fills of both panels
    loop = text[text.index("for (int r_outer"):]
    assert loop.count("__syncthreads();") == 2  # before the refill and before the tile is read
    assert_cubins(mod.get_source("cuda"))


def test_tiled_matmul_has_two_barriers_per_tile_even_when_partitioned():
    for k, barriers in ((40, 4), (24, 3)):  # 24: both parts of the partitioned k loop are inlined into one scope
        mod = kiln.build(*tiled_matmul(k=k), target=SM90)
        text = kernel_text(mod)
        assert text.count("__syncthreads();") == barriers
        assert "float* __restrict__ A_shared = (float*)(kiln_shared + 0);" in text
        assert "float* __restrict__ B_shared = (float*)(kiln_shared + 1024);" in text
        assert mod.kernels[0].shared_bytes == 2048 and mod.kernels[0].block == (16, 16, 1)
        assert_cubins(mod.get_source("cuda"))


@pytest.mark.parametrize(
    ("build_body", "message"),
    [
        ("unbound", "loop i is not bound to a GPU thread on a cuda target; bind it"),
        ("symbolic_threads", "thread extents must be constants"),
        ("block_in_serial", "loop b is bound to blockIdx.x inside loop i: blocks cannot run in sequence"),
        ("nested_axis", "loop u is bound to blockIdx.x, inside another loop bound to blockIdx.x"),
        ("too_many_threads", "2048 threads per block"),
        ("bad_tag", "loop t is bound to 'vthread'"),
        ("divergent_sync", "__syncthreads() under a condition or loop that differs between the threads"),
        ("shared_outside", "in 'shared' scope is allocated outside every kernel"),
    ],
)
def test_loop_ir_the_cuda_back_end_refuses(build_body, message):
    n = tir.Var("n")
    A = tir.buffer("A", (n,))
    H = tir.buffer("H", (4,), "float16")
    i, b, t, u = tir.Var("i"), tir.Var("b"), tir.Var("t"), tir.Var("u")
    store = tir.BufferStore(A, tir.const(1.0), (i,))

    def bound(var, ext, body, tag):
        return tir.For(var, tir.const(0), tir.as_expr(ext), tir.ForKind.THREAD_BINDING, body, tag)

    bodies = {
        "unbound": lambda: tir.for_range(i, n, store),
        "symbolic_threads": lambda: bound(i, n, store, "threadIdx.x"),
        "block_in_serial": lambda: tir.for_range(i, 4, bound(b, 4, tir.BufferStore(A, tir.const(1.0), (b,)),
                                                           "blockIdx.x")),
        "nested_axis": lambda: bound(t, 4, bound(u, 4, tir.BufferStore(A, tir.const(1.0), (u,)), "blockIdx.x"),
                                     "blockIdx.x"),
        "too_many_threads": lambda: bound(t, 64, bound(u, 32, tir.BufferStore(A, tir.const(1.0), (u,)),
                                                      "threadIdx.y"), "threadIdx.x"),
        "bad_tag": lambda: bound(t, 4, tir.BufferStore(A, tir.const(1.0), (t,)), "vthread"),
        "divergent_sync": lambda: bound(t, 64, tir.IfThenElse(t < 5, cuda.syncthreads()), "threadIdx.x"),
        "shared_outside": lambda: tir.Allocate(tir.buffer("S", (4,), scope="shared"),
                                               bound(t, 4, tir.BufferStore(A, tir.const(1.0), (t,)), "threadIdx.x")),
    }
    with pytest.raises(CodegenError, match=re.escape(message)):
        cuda.generate(tir.PrimFunc("f", [A, H], bodies[build_body]()), Target(SM90))


def test_symbolic_sizes_become_kernel_arguments_and_launch_expressions():
    n = te.var("n")
    A = te.placeholder((n,), name="A")
    C = te.compute((n,), lambda i: A[i] * 3.0, name="C")
    s = te.create_schedule([C])
    bx, tx = s[C].split(C.op.axis[0], factor=64)
    s[C].bind(bx, te.thread_axis("blockIdx.x"))
    s[C].bind(tx, te.thread_axis("threadIdx.x"))
    mod = kiln.build(s, [A, C], target=SM90)
    text = kernel_text(mod)
    assert "long long n_arg) {" in text and "const int n = (int)n_arg;" in text
    (spec,) = mod.kernels
    assert eval_int(spec.grid[0][0], {id(mod.code.size_vars[0]): 1000}) == 16
    assert [(a.kind, a.index) for a in spec.args][-1] == ("size", 0)
    assert "long long* __restrict__" not in text and "A[" in text


ALL_DTYPES = ["float32", "float64", "float16", "int8", "int16", "int32", "int64", "uint8"]


def mixed(x):
    """Arithmetic, min/max, floor division and modulo, select and abs, in x's dtype."""
    three = tir.const(3, x.dtype)
    y = tir.max_(x, x // three) - tir.min_(x, x % three) * x
    return tir.select(x > tir.const(1, x.dtype), y, tir.call("abs", x) + three)


def numpy_mixed(x):
    with np.errstate(over="ignore", invalid="ignore"):
        t = x.dtype.type(3)
        y = np.maximum(x, x // t) - np.minimum(x, x % t) * x
        return np.where(x > x.dtype.type(1), y, np.abs(x) + t).astype(x.dtype)


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_every_dtype_compiles(dtype):
    src = kiln.build(*elementwise(mixed, dtype), target=SM90).get_source("cuda")
    casts = kiln.build(*elementwise(lambda x: (x.astype("float32") * 0.5).astype(dtype), dtype), target=SM90)
    assert_cubins(src)
    assert_cubins(casts.get_source("cuda"))


def test_bool_kernels_compile():
    A = te.placeholder((100,), "bool", name="A")
    C = te.compute((100,), lambda i: tir.logical_not(tir.binary(tir.And, A[i], A[99 - i])), name="C")
    s = te.create_schedule([C])
    s[C].bind(C.op.axis[0], te.thread_axis("threadIdx.x"))
    text = kernel_text(kiln.build(s, [A, C], target=SM90))
    assert "const bool* __restrict__ A, bool* __restrict__ C" in text
    assert_cubins(text)


# -- NVRTC ---------------------------------------------------------------------------------------


def test_nvrtc_errors_show_the_log_and_the_offending_lines(monkeypatch):
    monkeypatch.setenv("KILN_CACHE", "0")
    source = 'extern "C" __global__ void k(float* x) {\n  x[0] = 1.0f;\n  x[1] = undefined_thing;\n}\n'
    with pytest.raises(nvrtc.NVRTCError) as info:
        nvrtc.compile_cuda(source, "sm_90", name="broken")
    err = info.value
    assert isinstance(err, kiln.KilnError)
    text = str(err)
    assert "could not compile broken.cu for sm_90" in text
    assert 'broken.cu(3): error: identifier "undefined_thing" is undefined' in text
    assert ">     3 |   x[1] = undefined_thing;" in text
    assert "      2 |   x[0] = 1.0f;" in text  # context
    assert err.log and err.source == source


def test_cubins_are_cached_on_disk_and_corrupt_files_recompiled(monkeypatch, tmp_path):
    source = kiln.build(*vector_add(64, 32), target=SM90).get_source("cuda") + "// cache test\n"
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("KILN_CACHE", raising=False)
    calls = []
    real = nvrtc._nvrtc_compile
    monkeypatch.setattr(nvrtc, "_nvrtc_compile", lambda *a: calls.append(a) or real(*a))
    first = nvrtc.compile_cuda(source, "sm_80")
    (path,) = tmp_path.glob("*/*.kcuda")
    nvrtc.CUDA_CACHE.clear()
    assert nvrtc.compile_cuda(source, "sm_80") == first and len(calls) == 1  # from disk
    data = bytearray(path.read_bytes())
    data[-10] ^= 0xFF  # a flipped bit in the CUBIN: its checksum no longer matches
    path.write_bytes(bytes(data))
    nvrtc.CUDA_CACHE.clear()
    corrupt = nvrtc.CUDA_CACHE.corrupt
    assert nvrtc.compile_cuda(source, "sm_80") == first and len(calls) == 2  # recompiled, never loaded
    assert nvrtc.CUDA_CACHE.corrupt == corrupt + 1
    assert path.read_bytes() != bytes(data)  # and stored again
    assert nvrtc.compile_cuda(source, "sm_90") != first  # the arch is part of the key


def test_no_arch_and_no_gpu_is_a_clear_error(monkeypatch):
    from kiln.target import detect

    monkeypatch.setattr(detect, "cuda_device", lambda ordinal=0: None)
    target = Target("cuda")
    assert target.get("arch") is None
    with pytest.raises(nvrtc.CudaArchError, match=r"names no GPU architecture .* Target\('cuda -arch=sm_90'\)"):
        kiln.build(*vector_add(64, 32), target=target)


def test_the_arch_comes_from_the_target_or_its_tag():
    assert nvrtc.resolve_arch(Target("nvidia/h100")) == "sm_90"
    assert nvrtc.resolve_arch(Target("nvidia/a100")) == "sm_80"
    mod = kiln.build(*vector_add(64, 32), target="nvidia/a100")
    assert mod.arch == "sm_80"
    assert ".target sm_80" in mod.get_source("ptx")


# -- the module, without a GPU -----------------------------------------------------------------


@pytest.mark.skipif(HAS_GPU, reason="checks the error raised without a GPU")
def test_calling_without_a_gpu_says_so():
    mod = kiln.build(*vector_add(64, 32), target=SM90)
    a = np.zeros(64, "float32")
    with pytest.raises(nvrtc.CudaUnavailableError, match="needs a GPU"):
        mod(a, a.copy(), a.copy())
    assert "main_kernel0" in repr(mod) and mod.get_source("tir").startswith("def main(")


@needs_gxx
def test_module_checks_arguments_before_launching(host_cupy):
    mod = kiln.build(*vector_add(64, 32), target=SM90)
    a = np.zeros(64, "float32")
    with pytest.raises(ArgumentError, match="kernel 'main', parameter 'B': expected dtype float32, got float64"):
        mod(a, np.zeros(64), a.copy())
    with pytest.raises(ArgumentError, match=r"parameter 'C': expected shape \(64\), got \(65,\)"):
        mod(a, a.copy(), np.zeros(65, "float32"))
    with pytest.raises(ArgumentError, match="parameter 'C': shares memory with parameter 'A'"):
        mod(a, a.copy(), a)
    with pytest.raises(ArgumentError, match="expected 3 arrays"):
        mod(a)
    readonly = np.zeros(64, "float32")
    readonly.flags.writeable = False
    with pytest.raises(ArgumentError, match="parameter 'C': expected a writeable array"):
        mod(a, a.copy(), readonly)
    assert host_cupy == []


@needs_gxx
def test_elementwise_tail_and_numpy_copy_back(host_cupy):
    s, args = vector_add(1000, 128)
    mod = kiln.build(s, args, target=SM90)
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(1000).astype("float32"), rng.standard_normal(1000).astype("float32")
    c = np.zeros(1000, "float32")
    mod(a, b, c)
    np.testing.assert_array_equal(c, a + b)
    assert host_cupy == [("main_kernel0", (8, 1, 1), (128, 1, 1), 0)]
    dev = HostArray(np.zeros(1000, "float32"))  # a device array is written in place
    mod(a, b, dev)
    np.testing.assert_array_equal(dev.get(), a + b)


@needs_gxx
def test_reductions_match_numpy(host_cupy):
    s, args = row_sum(200, 64)
    x = np.random.default_rng(1).standard_normal((200, 64)).astype("float32")
    out = np.zeros(200, "float32")
    kiln.build(s, args, target=SM90)(x, out)
    np.testing.assert_allclose(out, x.sum(1), rtol=1e-5, atol=1e-5)
    s, args = shared_row_sum(40, 64, 8)  # shared memory, a barrier, index-0 guards
    out = np.zeros(40, "float32")
    kiln.build(s, args, target=SM90)(x[:40], out)
    np.testing.assert_allclose(out, x[:40].sum(1), rtol=1e-5, atol=1e-5)


def sibling_thread_loops():
    """Per block, threads 0..31 write A and threads 0..7 write B: the block has 32 threads, B's loop a guard."""
    A, B = tir.buffer("A", (4, 32)), tir.buffer("B", (4, 8))
    b, t, u = tir.Var("b"), tir.Var("t"), tir.Var("u")

    def bound(var, ext, body, tag):
        return tir.For(var, tir.const(0), tir.const(ext), tir.ForKind.THREAD_BINDING, body, tag)

    body = bound(b, 4, tir.seq(bound(t, 32, tir.BufferStore(A, (b * 32 + t).astype("float32"), (b, t)), "threadIdx.x"),
                               bound(u, 8, tir.BufferStore(B, (b * 8 + u).astype("float32"), (b, u)), "threadIdx.x")),
                 "blockIdx.x")
    return tir.PrimFunc("siblings", [A, B], body)


def test_sibling_thread_loops_share_the_block_and_the_shorter_is_guarded():
    mod = kiln.build(sibling_thread_loops(), target=SM90)
    text = kernel_text(mod)
    assert "if ((int)threadIdx.x < 8) {" in text and "threadIdx.x < 32" not in text
    assert mod.kernels[0].block == (32, 1, 1)


def _vectorized_copy(shift: int):
    """C[i] = A[i + shift] * 2 built for cuda, 4 elements a thread in a vectorized loop."""
    A = te.placeholder((4096 + shift,), name="A")
    C = te.compute((4096,), lambda i: A[i + shift] * 2.0, name="C")
    s = te.create_schedule([C])
    bx, rest = s[C].split(C.op.axis[0], factor=128)
    tx, vec = s[C].split(rest, factor=4)
    s[C].bind(bx, te.thread_axis("blockIdx.x"))
    s[C].bind(tx, te.thread_axis("threadIdx.x"))
    s[C].vectorize(vec)
    return kiln.build(s, [A, C], target=SM90)


def test_a_vectorized_loop_over_aligned_elements_is_one_vector_load_and_store():
    text = kernel_text(_vectorized_copy(0))
    assert "*(uint4*)kiln_vec0 = *(const uint4*)&A[" in text and "*(uint4*)&C[" in text
    assert "for (int i_inner_inner" not in text


def test_a_vectorized_loop_it_cannot_prove_aligned_is_unrolled_by_the_compiler():
    text = kernel_text(_vectorized_copy(1))  # A[i + 1]: the load is off by one element; the store alone is a vector
    assert "*(uint4*)&C[" in text and "*(const uint4*)&A[" not in text


@needs_gxx
@pytest.mark.parametrize("shift", [0, 1])
def test_vectorized_loops_match_numpy(host_cupy, shift):
    a = np.random.default_rng(5).standard_normal(4096 + shift).astype("float32")
    c = np.zeros(4096, "float32")
    _vectorized_copy(shift)(a, c)
    np.testing.assert_array_equal(c, a[shift:] * 2)


@needs_gxx
def test_sibling_thread_loops_match_numpy(host_cupy):
    a, b = np.zeros((4, 32), "float32"), np.zeros((4, 8), "float32")
    kiln.build(sibling_thread_loops(), target=SM90)(a, b)
    np.testing.assert_array_equal(a.ravel(), np.arange(128))
    np.testing.assert_array_equal(b.ravel(), np.arange(32))


@needs_gxx
def test_tiled_matmul_matches_numpy(host_cupy):
    rng = np.random.default_rng(4)
    a, b = rng.standard_normal((64, 40)).astype("float32"), rng.standard_normal((40, 48)).astype("float32")
    c = np.zeros((64, 48), "float32")
    kiln.build(*tiled_matmul(), target=SM90)(a, b, c)
    np.testing.assert_allclose(c, a @ b, rtol=1e-5, atol=1e-5)
    assert host_cupy[-1][1:] == ((3, 4, 1), (16, 16, 1), 2048)


@needs_gxx
def test_register_tiled_matmul_with_tails_matches_numpy(host_cupy):
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((40, 20), dtype=np.float32), rng.standard_normal((20, 36), dtype=np.float32)
    c = np.zeros((40, 36), np.float32)
    kiln.build(*register_tiled_matmul(), target=SM90)(a, b, c)  # 40, 36: partial blocks; 20: whole k steps
    np.testing.assert_allclose(c, a @ b, rtol=1e-5, atol=1e-5)
    a2, b2, c2 = a[:, :18].copy(), b[:18].copy(), np.zeros((40, 36), np.float32)
    kiln.build(*register_tiled_matmul(k=18), target=SM90)(a2, b2, c2)  # 18: a partial last k step
    np.testing.assert_allclose(c2, a2 @ b2, rtol=1e-5, atol=1e-5)


def test_two_kernels_with_a_workspace_and_symbolic_sizes(host_cupy):
    n = te.var("n")
    s, args = two_stages(n)
    mod = kiln.build(s, args, target=SM90)
    a, b = np.arange(100, dtype="float32"), np.ones(100, "float32")
    d = np.zeros(100, "float32")
    mod(a, b, d)
    np.testing.assert_array_equal(d, (a + b) * 2)
    assert [(name, grid) for name, grid, _, _ in host_cupy] == [("main_kernel0", (4, 1, 1)),
                                                                 ("main_kernel1", (4, 1, 1))]
    empty = np.zeros(0, "float32")
    mod(empty, empty.copy(), empty.copy())  # an empty grid launches nothing
    assert len(host_cupy) == 2


@needs_gxx
@pytest.mark.parametrize(
    ("dtype", "fn", "ref", "rtol"),
    [
        ("float32", lambda x: tir.call("exp", x), np.exp, 1e-6),
        ("float32", lambda x: tir.call("sigmoid", x), lambda x: 1 / (1 + np.exp(-x)), 1e-6),
        ("float32", lambda x: tir.max_(x, 0.0) + tir.min_(x, 1.0), lambda x: np.maximum(x, 0) + np.minimum(x, 1), 0),
        ("float16", lambda x: x * x + 1.0, lambda x: x * x + np.float16(1), 1e-3),
        ("float64", lambda x: tir.call("tanh", x) * 2.0, lambda x: np.tanh(x) * 2, 1e-12),
        ("float32", lambda x: x % 1.5 + x // 0.75, lambda x: np.mod(x, 1.5) + np.floor_divide(x, 0.75), 1e-6),
    ],
)
def test_float_numerics_match_numpy(host_cupy, dtype, fn, ref, rtol):
    s, args = elementwise(fn, dtype)
    x = (np.random.default_rng(2).standard_normal(300) * 3).astype(dtype)
    x[:3] = [0.0, -0.0, np.nan]
    out = np.zeros(300, dtype)
    kiln.build(s, args, target=SM90)(x, out)
    np.testing.assert_allclose(out, ref(x), rtol=rtol, atol=1e-6 if dtype != "float16" else 1e-3)


@needs_gxx
@pytest.mark.parametrize("dtype", ["int8", "int16", "int32", "int64", "uint8", "float64"])
def test_dtype_grid_matches_numpy(host_cupy, dtype):
    x = np.arange(-150, 150).astype(dtype)  # wraps for the narrow types, as numpy does
    out = np.zeros(300, dtype)
    kiln.build(*elementwise(mixed, dtype), target=SM90)(x, out)
    np.testing.assert_array_equal(out, numpy_mixed(x))


@needs_gxx
def test_integer_division_floors_and_casts_saturate(host_cupy):
    s, args = elementwise(lambda x: (x // 7) * 1000 + x % 7 * 10 + x // (x % 5 - 2), "int32")
    x = np.arange(-50, 250, dtype="int32")
    out = np.zeros(300, "int32")
    kiln.build(s, args, target=SM90)(x, out)
    d = x % 5 - 2
    by_d = np.where(d == 0, 0, x // np.where(d == 0, 1, d))  # dividing by 0 gives 0
    np.testing.assert_array_equal(out, (x // 7) * 1000 + x % 7 * 10 + by_d)
    s, args = elementwise(lambda x: x.astype("int8"), "float32", out_dtype="int8")
    f = np.linspace(-300, 300, 300).astype("float32")
    f[0] = np.nan
    i8 = np.zeros(300, "int8")
    kiln.build(s, args, target=SM90)(f, i8)
    want = np.clip(np.trunc(np.nan_to_num(f)), -128, 127).astype("int8")
    np.testing.assert_array_equal(i8, want)


# -- on a GPU --------------------------------------------------------------------------------


@pytest.mark.gpu
@gpu
def test_gpu_elementwise_on_cupy_and_numpy_arrays():
    import cupy

    s, args = vector_add(100_003, 256)
    mod = kiln.build(s, args, target="cuda")
    a = cupy.random.standard_normal(100_003, dtype=cupy.float32)
    b = cupy.random.standard_normal(100_003, dtype=cupy.float32)
    c = cupy.zeros_like(a)
    mod(a, b, c)
    cupy.testing.assert_array_equal(c, a + b)
    an, bn, cn = a.get(), b.get(), np.zeros(100_003, "float32")
    mod(an, bn, cn)
    np.testing.assert_array_equal(cn, an + bn)


@pytest.mark.gpu
@gpu
def test_gpu_reductions_shared_memory_and_workspaces():
    import cupy

    x = cupy.random.standard_normal((200, 64), dtype=cupy.float32)
    out = cupy.zeros(200, cupy.float32)
    kiln.build(*row_sum(200, 64), target="cuda")(x, out)
    np.testing.assert_allclose(out.get(), x.get().sum(1), rtol=1e-5, atol=1e-5)
    out = cupy.zeros(40, cupy.float32)
    kiln.build(*shared_row_sum(40, 64, 8), target="cuda")(x[:40], out)
    np.testing.assert_allclose(out.get(), x[:40].get().sum(1), rtol=1e-5, atol=1e-5)
    n = te.var("n")
    mod = kiln.build(*two_stages(n), target="cuda")
    a, b, d = cupy.arange(1000, dtype=cupy.float32), cupy.ones(1000, cupy.float32), cupy.zeros(1000, cupy.float32)
    mod(a, b, d)
    cupy.testing.assert_array_equal(d, (a + b) * 2)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("name", ["exp", "sigmoid", "tanh", "erf", "log"])
def test_gpu_intrinsics_match_numpy(name):
    import math

    import cupy

    s, args = elementwise(lambda x: tir.call(name, x), "float32", n=4096)
    x = np.random.default_rng(3).uniform(0.01, 8, 4096).astype("float32")
    out = cupy.zeros(4096, cupy.float32)
    kiln.build(s, args, target="cuda")(cupy.asarray(x), out)
    ref = {"exp": np.exp, "sigmoid": lambda v: 1 / (1 + np.exp(-v)), "tanh": np.tanh,
           "erf": np.vectorize(math.erf), "log": np.log}[name](x.astype("float64"))
    np.testing.assert_allclose(out.get(), ref, rtol=2e-6, atol=1e-7)


@pytest.mark.gpu
@gpu
def test_gpu_float16_and_argument_errors():
    import cupy

    mod = kiln.build(*vector_add(1000, 128, "float16"), target="cuda")
    a = cupy.random.standard_normal(1000).astype(cupy.float16)
    c = cupy.zeros_like(a)
    mod(a, a.copy(), c)
    cupy.testing.assert_array_equal(c, a + a)
    with pytest.raises(ArgumentError, match="expected dtype float16, got float32"):
        mod(a, a.copy(), cupy.zeros(1000, cupy.float32))
