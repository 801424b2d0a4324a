"""`CudaModule`: compiled CUDA kernels of one PrimFunc, launched through cupy.

`module(*arrays)` takes one array per buffer parameter, in order, like the CPU
`kiln.runtime.Module`, and checks each the same way before any kernel runs
(dtype, ndim, static dims, consistent symbolic dims, C-contiguous, aligned, no
overlap with another argument), raising `ArgumentError` that names the
kernel and the parameter.

Arrays: cupy arrays are used in place, on the current device and stream.
numpy arrays are accepted too, with the CPU module's semantics: each is
copied to the device, and after the kernels ran, the parameters that some
kernel writes are copied back into their numpy arrays (which must then be
writeable). So `mod(a, b, out)` works on numpy arrays as on the CPU, at the
cost of the copies; pass cupy arrays to keep data on the GPU. Returns None.

The kernels run in order on the current cupy stream, with the device
workspaces the PrimFunc's top-level global temporaries need (from cupy's
memory pool, per call). The CUBIN is loaded onto a device on first call, so
building needs no GPU; cupy is imported on first call, never when kiln is
imported.

`module.bind(*arrays)` checks device arrays as a call does and returns each
kernel's launch computed once (`BoundKernel`: grid, block, an argument tuple
of device pointers and sizes, its workspaces): the graph executor's fast path
replays those with other arrays' pointers put in (`kiln.runtime.executor`).
A module's `CudaCode` and CUBIN are what an exported library stores
(`kiln.runtime.cuda_library`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import numpy as np

from kiln.errors import KilnError
from kiln.runtime.module import Param, check_count, numpy_dtype
from kiln.target import Target
from kiln.tir.expr import (
    Add,
    BinaryOp,
    Buffer,
    Cast,
    Div,
    FloorDiv,
    FloorMod,
    IntImm,
    Max,
    Min,
    Mul,
    PrimExpr,
    Sub,
    Var,
    is_float,
)
from kiln.tir.stmt import PrimFunc

_DEFAULT_SHARED = 48 * 1024  # kernels needing more must raise their dynamic shared memory limit


class CudaLaunchError(KilnError, RuntimeError):
    """A kernel that cannot run on this device (wrong architecture, grid too large)."""


class CudaUnavailableError(KilnError, RuntimeError):
    """cupy / NVRTC is not installed, or (to run kernels) there is no GPU."""


# -- how the code generator describes the kernels of one PrimFunc (`kiln.codegen.cuda.generate`) --------

BLOCK_LIMITS = (1024, 1024, 64)
# Every array a kernel is launched on starts at a multiple of this many bytes: generated code reads and
# writes 16-byte vectors where it proves the offsets aligned (kiln.codegen.cuda_vector). cupy allocates at
# 256-byte boundaries; a view at another offset is refused here, and the executor copies such an input.
ARRAY_ALIGNMENT = 16
GRID_LIMITS = (2**31 - 1, 65535, 65535)
Grid = tuple[tuple[PrimExpr, ...], tuple[PrimExpr, ...], tuple[PrimExpr, ...]]  # extents per blockIdx axis


@attrs.frozen
class KernelArg:
    """One kernel argument: parameter `index`, workspace `index`, or symbolic size `index`."""

    kind: str  # "param", "workspace" or "size"
    index: int


@attrs.frozen
class KernelSpec:
    """How to launch one kernel.

    `grid` holds, per axis (x, y, z), the extents of the loops bound to that
    blockIdx axis: the launch takes their largest value (1 for none). They are
    expressions of the PrimFunc's size vars (constants where shapes are static).
    """

    name: str
    grid: Grid
    block: tuple[int, int, int]
    shared_bytes: int
    args: tuple[KernelArg, ...]

    @property
    def threads_per_block(self) -> int:
        """Threads in one block."""
        return self.block[0] * self.block[1] * self.block[2]


@attrs.frozen
class CudaCode:
    """The CUDA C of one PrimFunc and how to launch it.

    `workspaces` are flattened global buffers (`shape[0]` elements, an int64
    expression of `size_vars`); `written` the indices of the parameters that
    some kernel stores to.
    """

    name: str
    source: str
    kernels: tuple[KernelSpec, ...]
    workspaces: tuple[Buffer, ...]
    size_vars: tuple[Var, ...]
    written: frozenset[int]
    uses_float16: bool


_INT_EVAL: dict[type, Callable[[int, int], int]] = {
    Add: lambda a, b: a + b, Sub: lambda a, b: a - b, Mul: lambda a, b: a * b,
    Div: lambda a, b: abs(a) // abs(b) * (1 if (a >= 0) == (b >= 0) else -1),
    FloorDiv: lambda a, b: a // b, FloorMod: lambda a, b: a % b, Min: min, Max: max,
}


def eval_int(e: PrimExpr, env: Mapping[int, int]) -> int:
    """The value of integer expression `e` (a launch extent, a workspace size) with size vars bound
    by id in `env`.

    Raises:
        CudaLaunchError: for an expression that is not integer arithmetic of size vars.
    """
    if isinstance(e, IntImm):
        return int(e.value)
    if isinstance(e, Var):
        if id(e) not in env:
            raise CudaLaunchError(f"size {e.name} is not bound")
        return env[id(e)]
    if isinstance(e, Cast) and not is_float(e.dtype) and not is_float(e.value.dtype):
        return eval_int(e.value, env)
    if isinstance(e, BinaryOp) and type(e) in _INT_EVAL:
        a, b = eval_int(e.a, env), eval_int(e.b, env)
        if isinstance(e, (Div, FloorDiv, FloorMod)) and b == 0:
            return 0
        return int(_INT_EVAL[type(e)](a, b))
    raise CudaLaunchError(f"cannot evaluate {e} at launch: only integer arithmetic of sizes is allowed")


def _cupy() -> Any:
    try:
        import cupy
    except ImportError as exc:
        raise CudaUnavailableError(
            f"running CUDA kernels needs cupy ({exc}); install kiln's cuda extra: pip install 'kiln[cuda]'"
        ) from exc
    if not cupy.cuda.is_available():
        raise CudaUnavailableError(
            "running CUDA kernels needs a GPU, and cupy finds none on this machine (cupy.cuda.is_available() "
            "is False); the module's CUDA source and CUBIN are available without one"
        )
    return cupy


def arch_runs_on(arch: str, cc: str) -> bool:
    """Whether a CUBIN for `arch` ("sm_90", "sm_90a") runs on a device of compute capability `cc` ("90").

    A CUBIN runs on its own major version at its minor version or later; an "a" or "f" CUBIN (which may
    use features of its exact architecture) only on its own.
    """
    want = arch[3:].rstrip("af")
    return cc[:-1] == want[:-1] and cc[-1] >= want[-1] and (arch[-1] not in "af" or cc == want)


def current_device() -> tuple[int, str] | None:
    """(id, compute capability such as "90") of cupy's current GPU, or None without cupy or a GPU."""
    try:
        cupy = _cupy()
    except CudaUnavailableError:
        return None
    dev = cupy.cuda.Device()
    return int(dev.id), str(dev.compute_capability)


@attrs.frozen
class BoundKernel:
    """One kernel launch of `CudaModule.bind`, computed once: what the executor's fast path replays.

    `args` are the kernel's arguments as device pointers (np.uint64) and sizes (np.int64); `params`
    says which of them point at the bound arrays, as (position in `args`, parameter index), so that a
    launch on other arrays of the same shapes, dtypes and device replaces those and nothing else.
    """

    function: Any  # the cupy Function
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int
    args: tuple[Any, ...]
    params: tuple[tuple[int, int], ...]
    workspaces: tuple[Any, ...]  # device buffers that `args` point into, kept alive here


class CudaModule:
    """The CUDA kernels of one PrimFunc: call it with cupy (or numpy) arrays; read its code with `get_source`."""

    def __init__(self, func: PrimFunc, target: Target, code: CudaCode, cubin: bytes, arch: str,
                 ptx: Callable[[], str] | None = None) -> None:
        """Holds the compiled kernels; nothing touches a GPU until the first call.

        Args:
            func: the loop IR (its params define the calling convention).
            target: the cuda target it was compiled for.
            code: the generated CUDA C and its launch table (`kiln.codegen.cuda.generate`).
            cubin: the CUBIN NVRTC made of `code.source`.
            arch: the `sm_XY` the CUBIN is for.
            ptx: makes the PTX of `code.source` when `get_source("ptx")` asks (the code generator's).
        """
        self.func = func
        self.name = func.name
        self.target = target
        self.code = code
        self.cubin = cubin
        self.arch = arch
        self._ptx = ptx
        self.kernels: tuple[KernelSpec, ...] = code.kernels
        self._params = [Param(func, i) for i in range(len(func.params))]
        self._lock = threading.Lock()
        self._loaded: dict[int, list[Any]] = {}  # device id -> the kernels' cupy Functions (keeping the Module)

    @property
    def device_type(self) -> str:
        """Where the kernels run: "cuda"."""
        return "cuda"

    def __repr__(self) -> str:
        params = ", ".join(f"{p.name}: {p.dtype}{p.shape_text}" for p in self._params)
        kernels = ", ".join(k.name for k in self.kernels)
        return f"<kiln.runtime.CudaModule {self.name}({params}) for {self.arch}: {kernels}>"

    def get_source(self, fmt: str = "cuda") -> str:
        """The code: "cuda" (CUDA C), "ptx" (compiled by NVRTC on demand, for a module just built) or
        "tir" (loop IR).

        Raises:
            ValueError: for another format.
        """
        if fmt == "cuda":
            return self.code.source
        if fmt == "tir":
            return str(self.func)
        if fmt == "ptx":
            if self._ptx is None:
                raise ValueError(f"get_source('ptx'): module {self.name!r} was loaded from a library, which holds "
                                 "its CUBIN and CUDA C, not PTX (compile the CUDA C with NVRTC for it)")
            return self._ptx()
        raise ValueError(f"get_source: format is 'cuda', 'ptx' or 'tir', got {fmt!r}")

    # -- running ----------------------------------------------------------------------------
    def __call__(self, *arrays: Any) -> None:
        """Runs the kernels on `arrays` (one per buffer parameter, in order), in place.

        Raises:
            ArgumentError: when an array does not fit its parameter.
            CudaUnavailableError: without cupy or a GPU.
            CudaLaunchError: when the CUBIN cannot run on the current device.
        """
        cupy = _cupy()
        sizes = self._check(cupy, arrays)
        functions = self._functions(cupy)
        device = [a if isinstance(a, cupy.ndarray) else cupy.asarray(a) for a in arrays]
        env = {id(v): n for v, n in zip(self.code.size_vars, sizes, strict=True)}
        workspaces = [cupy.empty(max(eval_int(b.shape[0], env), 0), dtype=numpy_dtype(b.dtype))
                      for b in self.code.workspaces]
        for spec, fn in zip(self.kernels, functions, strict=True):
            grid = self._grid(spec, env)
            if 0 in grid:
                continue
            args: list[Any] = []
            for arg in spec.args:
                if arg.kind == "param":
                    args.append(device[arg.index])
                elif arg.kind == "workspace":
                    args.append(workspaces[arg.index])
                else:
                    args.append(np.int64(sizes[arg.index]))
            fn(grid, spec.block, tuple(args), shared_mem=spec.shared_bytes)
        for i in sorted(self.code.written):
            if not isinstance(arrays[i], cupy.ndarray):
                np.copyto(arrays[i], device[i].get())

    def bind(self, *arrays: Any) -> list[BoundKernel]:
        """Checks device `arrays` as a call does and computes every launch on them, without running any.

        The executor's fast path (`kiln.runtime.executor`) binds each launch of a graph once, then
        replays the result on the pointers of later runs' arrays: grids, blocks, sizes and workspaces
        depend only on the shapes checked here. Kernels with an empty grid are left out.

        Raises:
            ArgumentError: when an array does not fit its parameter, or is not a device array.
            CudaUnavailableError: without cupy or a GPU.
            CudaLaunchError: when the CUBIN cannot run on the current device, or a grid is too large.
        """
        cupy = _cupy()
        for p, a in zip(self._params, arrays, strict=False):
            if not isinstance(a, cupy.ndarray):
                raise p.error(f"bind takes device arrays (cupy.ndarray), got {type(a).__name__}")
        sizes = self._check(cupy, arrays)
        functions = self._functions(cupy)
        env = {id(v): n for v, n in zip(self.code.size_vars, sizes, strict=True)}
        workspaces = tuple(cupy.empty(max(eval_int(b.shape[0], env), 0), dtype=numpy_dtype(b.dtype))
                           for b in self.code.workspaces)
        bound = []
        for spec, fn in zip(self.kernels, functions, strict=True):
            grid = self._grid(spec, env)
            if 0 in grid:
                continue
            args: list[Any] = []
            params: list[tuple[int, int]] = []
            for arg in spec.args:
                if arg.kind == "param":
                    params.append((len(args), arg.index))
                    args.append(np.uint64(arrays[arg.index].data.ptr))
                elif arg.kind == "workspace":
                    args.append(np.uint64(workspaces[arg.index].data.ptr))
                else:
                    args.append(np.int64(sizes[arg.index]))
            bound.append(BoundKernel(fn, grid, spec.block, spec.shared_bytes, tuple(args), tuple(params), workspaces))
        return bound

    def _grid(self, spec: KernelSpec, env: dict[int, int]) -> tuple[int, int, int]:
        dims: list[int] = []
        for axis, (extents, limit) in enumerate(zip(spec.grid, GRID_LIMITS, strict=True)):
            n = max((eval_int(e, env) for e in extents), default=1)
            if n > limit:
                raise CudaLaunchError(f"kernel {spec.name}: blockIdx.{'xyz'[axis]} extent {n} exceeds the CUDA "
                                      f"limit of {limit} for these sizes")
            dims.append(max(n, 0))
        return dims[0], dims[1], dims[2]

    def _functions(self, cupy: Any) -> list[Any]:
        """The kernels as cupy Functions on the current device, loading the CUBIN there once."""
        dev = cupy.cuda.Device()
        with self._lock:
            loaded = self._loaded.get(dev.id)
            if loaded is not None:
                return loaded
            cc = str(dev.compute_capability)
            if not arch_runs_on(self.arch, cc):
                raise CudaLaunchError(f"kernel {self.name!r} was compiled for {self.arch}, but device {dev.id} "
                                      f"is sm_{cc}; build it for Target('cuda -arch=sm_{cc}')")
            from cupy.cuda import driver, function

            module = function.Module()
            module.load(self.cubin)
            fns = []
            for spec in self.kernels:
                fn = module.get_function(spec.name)
                if spec.shared_bytes > _DEFAULT_SHARED:
                    driver.funcSetAttribute(fn.ptr, driver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                            spec.shared_bytes)
                fns.append(fn)
            self._loaded[dev.id] = fns
            return fns

    # -- argument checks -----------------------------------------------------------------
    def _check(self, cupy: Any, arrays: tuple[Any, ...]) -> list[int]:
        params = self._params
        check_count(self.func, params, arrays)
        bound: dict[int, tuple[int, str]] = {}
        current = cupy.cuda.Device().id
        for i, (p, a) in enumerate(zip(params, arrays, strict=True)):
            on_gpu = isinstance(a, cupy.ndarray)
            if not on_gpu and not isinstance(a, np.ndarray):
                raise p.error(f"expected a cupy.ndarray (or numpy.ndarray) of {p.dtype}{p.shape_text}, "
                              f"got {type(a).__name__}")
            p.check_shape(a, bound)
            if not a.flags.c_contiguous:
                raise p.error(f"expected a C-contiguous array, got strides {a.strides} "
                              f"(use {'cupy' if on_gpu else 'np'}.ascontiguousarray)")
            if on_gpu:
                if a.device.id != current:
                    raise p.error(f"the array is on device {a.device.id}, the kernels run on the current "
                                  f"device {current} (use `with cupy.cuda.Device({a.device.id}):`)")
                if a.data.ptr % ARRAY_ALIGNMENT:
                    raise p.error(f"expected an array aligned to {ARRAY_ALIGNMENT} bytes (the kernels may read it "
                                  f"in 16-byte vectors), got one at address {a.data.ptr:#x}: pass a copy")
            else:
                if not a.flags.aligned:
                    raise p.error("expected an aligned array")
                if i in self.code.written and not a.flags.writeable:
                    raise p.error("expected a writeable array (a kernel writes this parameter)")
        self._check_overlap(cupy, arrays)
        return [bound[id(v)][0] for v in self.code.size_vars]

    def _check_overlap(self, cupy: Any, arrays: tuple[Any, ...]) -> None:
        """Refuses arguments that share memory: the kernels' pointers are `__restrict__`."""
        for i in range(len(arrays)):
            for j in range(i):
                a, b = arrays[i], arrays[j]
                if not a.size or not b.size or isinstance(a, cupy.ndarray) != isinstance(b, cupy.ndarray):
                    continue
                if isinstance(a, cupy.ndarray):
                    lo_a, lo_b = a.data.ptr, b.data.ptr
                    shared = a.device.id == b.device.id and lo_a < lo_b + b.nbytes and lo_b < lo_a + a.nbytes
                else:
                    shared = bool(np.may_share_memory(a, b))
                if shared:
                    raise self._params[i].error(f"shares memory with parameter {self._params[j].name!r}; "
                                                "kernels need distinct arrays")
