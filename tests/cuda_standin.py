"""A stand-in for cupy that runs kiln's generated CUDA C on the host, for tests on machines without a GPU.

`install(monkeypatch, folder)` makes `kiln.runtime.cuda_module._cupy()` return
`FAKE_CUPY` and `CudaModule` launch its kernels on the CPU: the module's CUDA C
source is compiled with g++ (the CUDA built-ins it uses come from
`_HOST_PRELUDE`), and each launch runs one OS thread per CUDA thread of a block,
the blocks one after another, `__syncthreads` a barrier across the block, and
each warp shuffle an exchange through memory between two such barriers. So
keep the sizes tiny.

Device memory is held by `HostArray`, which offers what kiln uses of a
`cupy.ndarray` and no more, so that device-ness stays honest:
- `FAKE_CUPY.empty` returns memory filled with 0xFF bytes (NaN for floats, -1 for
  integers), as uninitialized device memory can hold anything;
- a `HostArray` is not a numpy array: numpy refuses to convert one implicitly
  (as it refuses a cupy array), and `.get()` is the way back to numpy;
- its `flags` are cupy's (`c_contiguous`, `f_contiguous`, `owndata`; no `writeable`);
- slicing, `view` and `reshape` are views of the same memory, `copy` is new memory;
- it is a DLPack array on device type 2 (a CUDA GPU), as a cupy array is, and
  `FAKE_CUPY.from_dlpack` takes such arrays (`DLPackOnDevice` wraps one as torch or
  jax would hand it over) without a copy.

Streams run everything at once, except that a stream capture (`begin_capture` to
`end_capture`) records its launches into a graph, which `launch` runs again.

Kernels take arrays or, as cupy allows, device pointers (numpy integers) for their
pointer parameters; `install` records every launch's argument values.
"""

from __future__ import annotations

import atexit
import ctypes
import hashlib
import re
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from kiln.runtime import cuda_module
from kiln.runtime.cuda_module import CudaModule


def _has_gpu() -> bool:
    try:
        import cupy
    except ImportError:
        return False
    return bool(cupy.cuda.is_available())


HAS_GPU = _has_gpu()
gpu = pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU (cupy.cuda.is_available())")
needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="host emulation of CUDA kernels needs g++")

_HOST_PRELUDE = r"""
#include <math.h>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>
#include <pthread.h>
struct kiln_dim3 { unsigned x, y, z; };
static thread_local kiln_dim3 threadIdx, blockIdx;
static pthread_barrier_t kiln_barrier;
alignas(16) unsigned char kiln_shared_storage[1 << 18];
#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __launch_bounds__(n)
#define __align__(n)
#define __shared__
#define kiln_shared kiln_shared_storage
using std::isnan;
static inline void __syncthreads() { pthread_barrier_wait(&kiln_barrier); }
static inline float __fdividef(float a, float b) { return a / b; }
static inline float __int_as_float(int v) { float f; memcpy(&f, &v, 4); return f; }
static inline float __uint_as_float(unsigned v) { float f; memcpy(&f, &v, 4); return f; }
static inline unsigned __float_as_uint(float f) { unsigned v; memcpy(&v, &f, 4); return v; }
static inline double __longlong_as_double(long long v) { double f; memcpy(&f, &v, 8); return f; }
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline double rsqrt(double x) { return 1.0 / sqrt(x); }
struct __half { _Float16 v; };
struct alignas(8) uint2 { unsigned x, y; };  // CUDA's vector types, as kiln.codegen.cuda_vector moves them
struct alignas(16) uint4 { unsigned x, y, z, w; };
static inline __half __float2half(float f) { return __half{(_Float16)f}; }
static inline __half __double2half(double d) { return __half{(_Float16)d}; }
static inline float __half2float(__half h) { return (float)h.v; }
// Warp shuffles: every thread of the block puts its value in an exchange slot, a barrier, then it reads its
// partner's slot (a lane of its own warp), and a barrier again before the slots are reused. So every thread of
// the block must take part, as every lane of the warp (the mask) must on a GPU; a partner past the end of the
// block reads all-ones bytes (NaN, -1), as the undefined value it is there.
static kiln_dim3 blockDim;
static unsigned long long kiln_exchange[1024];
template <typename T> static inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask) {
  (void)mask;
  static_assert(sizeof(T) <= sizeof(unsigned long long), "a shuffled value is at most 8 bytes");
  int tid = (int)(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z));
  int threads = (int)(blockDim.x * blockDim.y * blockDim.z);
  int src = (tid & ~31) | ((tid & 31) ^ (lane_mask & 31));
  memcpy(&kiln_exchange[tid], &v, sizeof(T));
  pthread_barrier_wait(&kiln_barrier);
  T out;
  if (src < threads) memcpy(&out, &kiln_exchange[src], sizeof(T)); else memset(&out, 0xFF, sizeof(T));
  pthread_barrier_wait(&kiln_barrier);
  return out;
}
// Tensor cores (kiln.codegen.cuda_mma): kiln's fragment loads run as written; the mma.sync itself exchanges
// the warp's fragments through memory and multiplies them as PTX lays them out (m16n8k16, row.col):
// a_i of lane (g, t) is A[g + 8 * (i / 2 % 2)][2t + i % 2 + 8 * (i / 4)], b_i is B[2t + i % 2 + 8 * (i / 2)][g],
// and c_i is C[g + 8 * (i / 2)][2t + i % 2]; the low half of a register is the first element.
#define KILN_HOST_EMULATION 1
static inline unsigned short __half_as_ushort(__half h) { unsigned short u; memcpy(&u, &h, 2); return u; }
static unsigned kiln_mma_regs[1024][6];
template <bool BF16> static inline float kiln_mma_half(int warp, int lane, int reg, int high) {
  unsigned r = kiln_mma_regs[warp + lane][reg];
  unsigned short u = (unsigned short)(high ? r >> 16 : r & 0xFFFFu);
  if (BF16) return __uint_as_float((unsigned)u << 16);
  _Float16 h;
  memcpy(&h, &u, 2);
  return (float)h;
}
template <bool BF16> static inline void kiln_mma_sync_16816(float* d, const unsigned* a, const unsigned* b) {
  int tid = (int)(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z));
  memcpy(kiln_mma_regs[tid], a, 4 * sizeof(unsigned));
  memcpy(kiln_mma_regs[tid] + 4, b, 2 * sizeof(unsigned));
  pthread_barrier_wait(&kiln_barrier);
  int warp = tid & ~31, g = (tid & 31) >> 2, t = tid & 3;
  for (int q = 0; q < 4; ++q) {
    int row = g + 8 * (q >> 1), col = 2 * t + (q & 1);
    float s = d[q];
    for (int k = 0; k < 16; ++k)
      s += kiln_mma_half<BF16>(warp, (row % 8) * 4 + (k % 8) / 2, (row >= 8) + 2 * (k >= 8), k % 2)
           * kiln_mma_half<BF16>(warp, col * 4 + (k % 8) / 2, 4 + (k >= 8), k % 2);
    d[q] = s;
  }
  pthread_barrier_wait(&kiln_barrier);
}
"""
_SIGNATURE = re.compile(r'^extern "C" __global__ void __launch_bounds__\(\d+\) (\w+)\((.*)\) \{$', re.MULTILINE)
_HOST_LIBS: dict[str, ctypes.CDLL] = {}
_HOST_LIBS_LOCK = threading.Lock()
_UNINITIALIZED = 0xFF


def _host_launcher(name: str, params: str) -> str:
    args = [f"({p.split('*')[0].strip()}*)a[{i}]" if "*" in p else f"*(long long*)a[{i}]"
            for i, p in enumerate(params.split(", "))]
    return f"""
extern "C" void run_{name}(int gx, int gy, int gz, int bx, int by, int bz, void** a) {{
  for (int z = 0; z < gz; ++z) for (int y = 0; y < gy; ++y) for (int x = 0; x < gx; ++x) {{
    pthread_barrier_init(&kiln_barrier, nullptr, bx * by * bz);
    blockDim = kiln_dim3{{(unsigned)bx, (unsigned)by, (unsigned)bz}};
    std::vector<std::thread> ts;
    for (int tz = 0; tz < bz; ++tz) for (int ty = 0; ty < by; ++ty) for (int tx = 0; tx < bx; ++tx)
      ts.emplace_back([=] {{
        blockIdx = kiln_dim3{{(unsigned)x, (unsigned)y, (unsigned)z}};
        threadIdx = kiln_dim3{{(unsigned)tx, (unsigned)ty, (unsigned)tz}};
        {name}({", ".join(args)});
      }});
    for (auto& t : ts) t.join();
    pthread_barrier_destroy(&kiln_barrier);
  }}
}}
"""


_GXX = ["g++", "-std=c++17", "-O0", "-fPIC", "-pthread", "-w"]
_PRELUDE_DIR: list[Path] = []  # the folder of the prelude header and its precompiled form, once per process


def _prelude() -> Path:
    """A folder holding `kiln_host_prelude.h`, precompiled: g++ then parses <cmath> and <thread> once per
    process, not once per kernel (0.15 s a kernel instead of 0.26). Removed when the process exits."""
    if not _PRELUDE_DIR:
        where = Path(tempfile.mkdtemp(prefix="kiln-host-prelude-"))
        atexit.register(shutil.rmtree, where, ignore_errors=True)
        header = where / "kiln_host_prelude.h"
        header.write_text(_HOST_PRELUDE)
        # without the .gch (a g++ that cannot precompile it), g++ reads the header itself
        subprocess.run([*_GXX, "-x", "c++-header", str(header), "-o", f"{header}.gch"], capture_output=True)
        _PRELUDE_DIR.append(where)
    return _PRELUDE_DIR[0]


def host_library(source: str, folder: Path) -> ctypes.CDLL:
    """The CUDA C `source` compiled for the host by g++ (once per process), with a `run_<kernel>` per kernel."""
    key = hashlib.sha256(source.encode()).hexdigest()[:16]
    with _HOST_LIBS_LOCK:
        if key not in _HOST_LIBS:
            text = '#include "kiln_host_prelude.h"\n' + source.replace("#include <cuda_fp16.h>", "")
            text += "".join(_host_launcher(m.group(1), m.group(2)) for m in _SIGNATURE.finditer(source))
            src, lib = folder / f"{key}.cc", folder / f"{key}.so"
            src.write_text(text)
            done = subprocess.run([*_GXX, "-shared", f"-I{_prelude()}", str(src), "-o", str(lib)],
                                  capture_output=True, text=True)
            assert done.returncode == 0, done.stderr[:4000]
            _HOST_LIBS[key] = ctypes.CDLL(str(lib))
        return _HOST_LIBS[key]


class HostArray:
    """What kiln uses of a cupy.ndarray, held in host memory (see the module's docstring)."""

    __array_priority__ = 100  # numpy defers binary operators to us, which then refuse them

    def __init__(self, a: Any, dtype: Any = None) -> None:
        """A device copy of `a` (a numpy array or anything `np.array` takes)."""
        if isinstance(a, HostArray):
            raise TypeError("HostArray(HostArray): use .copy()")
        self.a = np.array(a, dtype=dtype, order="C", copy=True)
        self.device = SimpleNamespace(id=0)

    @classmethod
    def _of(cls, view: np.ndarray) -> HostArray:
        """A HostArray over `view`'s memory (no copy)."""
        out = cls.__new__(cls)
        out.a = view
        out.device = SimpleNamespace(id=0)
        return out

    # -- what kiln reads of an array
    shape = property(lambda self: self.a.shape)
    dtype = property(lambda self: self.a.dtype)
    ndim = property(lambda self: self.a.ndim)
    size = property(lambda self: self.a.size)
    nbytes = property(lambda self: self.a.nbytes)
    itemsize = property(lambda self: self.a.itemsize)
    strides = property(lambda self: self.a.strides)

    @property
    def flags(self) -> SimpleNamespace:
        """cupy's flags: no `writeable` (device memory is always writeable)."""
        return SimpleNamespace(c_contiguous=self.a.flags.c_contiguous, f_contiguous=self.a.flags.f_contiguous,
                               owndata=self.a.base is None)

    @property
    def data(self) -> SimpleNamespace:
        """The device pointer, as `cupy.ndarray.data.ptr`."""
        return SimpleNamespace(ptr=self.a.ctypes.data)

    # -- what kiln does with one
    def __getitem__(self, key: Any) -> HostArray:
        return HostArray._of(self.a[key])

    def view(self, dtype: Any) -> HostArray:
        return HostArray._of(self.a.view(dtype))

    def reshape(self, *shape: Any) -> HostArray:
        return HostArray._of(self.a.reshape(*shape))

    def copy(self) -> HostArray:
        return HostArray._of(self.a.copy())

    def get(self) -> np.ndarray:
        """A numpy copy, as `cupy.ndarray.get()`."""
        return self.a.copy()

    def __array__(self, *args: Any, **kwargs: Any) -> np.ndarray:
        raise TypeError("Implicit conversion to a NumPy array is not allowed. "
                        "Please use `.get()` to construct a NumPy array explicitly.")  # cupy's words

    def __len__(self) -> int:
        return len(self.a)

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self.a.__dlpack__()

    def __dlpack_device__(self) -> tuple[int, int]:
        return (2, 0)  # kDLCUDA, device 0

    def __repr__(self) -> str:
        return f"HostArray({self.a!r})"


def _asarray(a: Any, dtype: Any = None) -> HostArray:
    if isinstance(a, HostArray):
        return a if dtype is None or np.dtype(dtype) == a.dtype else HostArray(a.get(), dtype)
    return HostArray(a, dtype)


def _empty(shape: Any, dtype: Any = float) -> HostArray:
    out = HostArray._of(np.empty(shape, dtype))
    out.a.reshape(-1).view(np.uint8).fill(_UNINITIALIZED)
    return out


class DLPackOnDevice:
    """Only the DLPack protocol of an array on the GPU, as a torch tensor or jax array offers it."""

    def __init__(self, array: HostArray, device_type: int = 2) -> None:
        self.array = array
        self.device_type = device_type

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self.array.__dlpack__()

    def __dlpack_device__(self) -> tuple[int, int]:
        return (self.device_type, 0)


class _HostView:
    """A device DLPack array presented as host memory, for np.from_dlpack (which would refuse device type 2)."""

    def __init__(self, x: Any) -> None:
        self.x = x

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self.x.__dlpack__()

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)


def _from_dlpack(x: Any) -> HostArray:
    """cupy.from_dlpack: a device array sharing `x`'s memory; only device arrays are taken."""
    kind, _ = x.__dlpack_device__()
    if kind != 2:
        raise RuntimeError(f"the stand-in's from_dlpack takes CUDA arrays (device type 2), got device type {kind}")
    return HostArray._of(np.from_dlpack(_HostView(x)))


_CAPTURING: list[list[tuple[Any, tuple[Any, ...]]]] = []  # the launches of the stream capture under way


class _Graph:
    """cupy.cuda.Graph: the launches a stream captured, run again by `launch`."""

    def __init__(self, calls: list[tuple[Any, tuple[Any, ...]]]) -> None:
        self.calls = calls
        self.launched = 0

    def launch(self, stream: Any = None) -> None:
        self.launched += 1
        for launch, args in self.calls:
            launch(*args)


class _Stream:
    """cupy.cuda.Stream, enough for stream capture: launches made while it captures are recorded, not run."""

    def __init__(self, non_blocking: bool = False) -> None:
        self.capturing = False

    def __enter__(self) -> _Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def begin_capture(self) -> None:
        assert not _CAPTURING, "one capture at a time"
        _CAPTURING.append([])
        self.capturing = True

    def end_capture(self) -> _Graph:
        assert self.capturing
        self.capturing = False
        return _Graph(_CAPTURING.pop())

    def synchronize(self) -> None:
        """The stand-in's kernels are done when their launch returns."""


def _copyto(dst: HostArray, src: HostArray) -> None:
    assert isinstance(dst, HostArray) and isinstance(src, HostArray), "copyto between device arrays"
    assert not _CAPTURING, "a copy inside a graph capture"
    np.copyto(dst.a, src.a)


FAKE_CUPY = SimpleNamespace(
    ndarray=HostArray, asarray=_asarray, empty=_empty, from_dlpack=_from_dlpack, copyto=_copyto,
    may_share_memory=lambda a, b: bool(np.may_share_memory(a.a, b.a)),
    cuda=SimpleNamespace(Device=lambda: SimpleNamespace(id=0, compute_capability="90"), Stream=_Stream,
                         Graph=_Graph, get_current_stream=_Stream),
)


class Launches(list[tuple[str, tuple[int, ...], tuple[int, ...], int]]):
    """The launches made, as (kernel name, grid, block, shared bytes); `arguments` holds each one's argument
    values, in the same order: device pointers for arrays, values for sizes."""

    def __init__(self) -> None:
        super().__init__()
        self.arguments: list[tuple[int, ...]] = []


def _pointer_params(source: str) -> dict[str, list[bool]]:
    """Per kernel of `source`, which of its parameters are pointers."""
    return {m.group(1): ["*" in p for p in m.group(2).split(", ")] for m in _SIGNATURE.finditer(source)}


def install(monkeypatch: pytest.MonkeyPatch, folder: Path) -> Launches:
    """Makes CudaModule launch through the host emulator (g++ output under `folder`).

    Returns:
        The launches made from then on, as (kernel name, grid, block, shared bytes), with their
        argument values in `.arguments`.
    """
    launches = Launches()

    def functions(self: CudaModule, cupy: Any) -> list[Any]:
        assert cupy is FAKE_CUPY
        lib = host_library(self.code.source, folder)
        pointers = _pointer_params(self.code.source)

        def launcher(name: str) -> Any:
            def launch(grid: tuple[int, ...], block: tuple[int, ...], args: tuple[Any, ...],
                       shared_mem: int = 0) -> None:
                if _CAPTURING:  # recorded by the stream capture under way, launched with its graph
                    _CAPTURING[-1].append((launch, (grid, block, args, shared_mem)))
                    return
                launches.append((name, grid, block, shared_mem))
                assert len(args) == len(pointers[name]), f"{name}: {len(args)} arguments"
                values = []
                for a, pointer in zip(args, pointers[name], strict=True):
                    assert isinstance(a, (HostArray, np.integer)), f"{name}: a kernel got a {type(a).__name__}"
                    assert pointer or not isinstance(a, HostArray), f"{name}: an array for a size"
                    values.append(a.a.ctypes.data if isinstance(a, HostArray) else int(a))
                launches.arguments.append(tuple(values))
                keep = [ctypes.c_longlong(v) for v, pointer in zip(values, pointers[name], strict=True) if not pointer]
                it = iter(keep)
                ptrs = [v if pointer else ctypes.addressof(next(it))
                        for v, pointer in zip(values, pointers[name], strict=True)]
                getattr(lib, f"run_{name}")(*grid, *block, (ctypes.c_void_p * len(ptrs))(*ptrs))
            return launch

        return [launcher(spec.name) for spec in self.kernels]

    monkeypatch.setattr(cuda_module, "_cupy", lambda: FAKE_CUPY)
    monkeypatch.setattr(CudaModule, "_functions", functions)
    return launches
