"""The graph executor: runs a `Library`'s kernel launches over its planned buffers.

Outputs get fresh arrays on every run, so a later run never overwrites what
an earlier one returned. The graph, the library and its file format live in
`kiln.runtime.library`; `profile()` times each kernel launch of a run
(`kiln.runtime.profile`).

What the executor guarantees before native code runs:
- every input a kernel sees is a C-contiguous, aligned, writeable array of the
  input's dtype and shape, on the current device for a cuda library (anything
  else is copied, or refused naming the input), whether it came as a numpy or
  cupy array or through DLPack;
- every tensor of the graph has at most `MAX_ELEMENTS` elements, the most the
  kernels' int32 loop variables index;
- the intermediates and outputs fit in the memory of the machine (or the GPU),
  checked with Python ints before anything is allocated.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import numpy as np

from kiln.ir.types import Dim, SymDim, dim_names, dim_value, size_name
from kiln.runtime.library import ExecutorError, Graph, Library, Slot, format_bytes
from kiln.runtime.module import KernelMemoryError, numpy_dtype
from kiln.runtime.profile import Profile, make_profile
from kiln.target import TDeviceType

_ALIGN = 64

MAX_ELEMENTS = 2**31 - 1
"""The most elements a tensor may have: kernels index with int32 loop variables (te.lower's IterVars)."""

_Entry = tuple[Callable[..., int], tuple[int, ...], list[int], tuple[int, ...] | None]
# One kernel of a graph launch on the CUDA fast path: the cupy Function, grid, block, shared bytes, its
# argument tuple, and (position in it, slot) for each argument that points at a run's input or output.
_CudaLaunch = tuple[Any, tuple[int, int, int], tuple[int, int, int], int, tuple[Any, ...], tuple[tuple[int, int], ...]]
# DLPack device types (dlpack.h): memory the host reads as numpy, and memory on a CUDA device
_DLPACK_HOST = (1, 3)  # kDLCPU, kDLCUDAHost
_DLPACK_CUDA = (2, 13)  # kDLCUDA, kDLCUDAManaged


# where Linux states a container's memory limit (cgroup v2, then v1); "max" or a huge number means none
_CGROUP_LIMIT_FILES = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")


def host_memory_bytes() -> int | None:
    """The memory this process can have in bytes: the machine's, or its cgroup's limit if lower; None if unknown."""
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        physical = pages * size if pages > 0 and size > 0 else None
    except (ValueError, OSError, AttributeError):
        physical = None
    limits = [physical] if physical is not None else []
    for path in _CGROUP_LIMIT_FILES:
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) > 0:
            limits.append(int(text))
    return min(limits) if limits else None


def slot_bytes(slot: Slot) -> int:
    """The bytes of `slot`, in Python ints (np.prod would wrap around in int64 for huge shapes)."""
    return math.prod(slot.dims) * numpy_dtype(slot.dtype).itemsize


class _Host:
    """The arrays of an llvm library: numpy, buffers aligned for vector loads."""

    ndarray = np.ndarray

    @staticmethod
    def adopt(name: str, value: Any, want: np.dtype[Any]) -> Any:
        """`value` as a numpy array: numpy arrays as they are, DLPack arrays (torch, jax) through
        `np.from_dlpack` (a view where the producer allows one), anything else through `_as_array`."""
        if isinstance(value, np.ndarray):
            return value
        device = _dlpack_device(value)
        if device is None:
            return _as_array(name, value, want)
        if device not in _DLPACK_HOST:
            raise ExecutorError(f"input {name!r}: a {type(value).__name__} on DLPack device type {device}, not in "
                                "host memory; this library runs on the CPU (copy it to the host first)")
        return _from_dlpack(name, value, np.from_dlpack, "numpy")

    @staticmethod
    def buffer(nbytes: int) -> Any:
        return _aligned(nbytes)

    @staticmethod
    def empty(shape: tuple[int, ...], dtype: np.dtype[Any]) -> Any:
        return np.empty(shape, dtype)

    @staticmethod
    def fits(arr: Any) -> bool:
        return bool(arr.flags.c_contiguous and arr.flags.aligned and arr.flags.writeable)

    @staticmethod
    def put(arr: Any) -> Any:
        # a fresh C-ordered copy: np.array's default order "K" would keep a Fortran array Fortran,
        # and kernels index row-major
        return np.array(arr, order="C", copy=True)

    @staticmethod
    def overlaps(a: Any, b: Any) -> bool:
        return bool(np.may_share_memory(a, b))

    @staticmethod
    def capacity() -> int | None:
        return host_memory_bytes()

    @staticmethod
    def synchronize() -> None:
        """A host kernel is done when its call returns."""


class _Device:
    """The arrays of a cuda library: cupy arrays on the current device."""

    def __init__(self) -> None:
        from kiln.runtime.cuda_module import ARRAY_ALIGNMENT, _cupy

        self.cupy = _cupy()
        self.alignment = ARRAY_ALIGNMENT
        self.ndarray = self.cupy.ndarray

    def adopt(self, name: str, value: Any, want: np.dtype[Any]) -> Any:
        """`value` as a cupy or numpy array: those as they are; DLPack arrays on a CUDA device (torch, jax)
        through `cupy.from_dlpack`, which shares their memory; host DLPack arrays through `np.from_dlpack`
        (copied to the device later, as numpy arrays are); anything else through `_as_array`.

        Raises:
            ExecutorError: for a DLPack array on another kind of device, or one cupy or numpy cannot take.
        """
        if isinstance(value, (self.ndarray, np.ndarray)):
            return value
        device = _dlpack_device(value)
        if device is None:
            return _as_array(name, value, want)
        if device in _DLPACK_CUDA:
            return _from_dlpack(name, value, self.cupy.from_dlpack, "cupy")
        if device in _DLPACK_HOST:
            return _from_dlpack(name, value, np.from_dlpack, "numpy")
        raise ExecutorError(f"input {name!r}: a {type(value).__name__} on DLPack device type {device}, which is "
                            "neither the host nor a CUDA GPU")

    def device_id(self) -> int:
        """The current device: kernels, and the fast path bound to them, run there."""
        return int(self.cupy.cuda.Device().id)

    def buffer(self, nbytes: int) -> Any:
        return self.cupy.empty(nbytes, dtype=np.uint8)

    def empty(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> Any:
        return self.cupy.empty(shape, dtype=dtype)

    def fits(self, arr: Any) -> bool:
        # device memory is always writeable; host arrays, and device arrays on another device or (from
        # DLPack) at an offset the kernels' vector accesses cannot take, go through put
        return (isinstance(arr, self.ndarray) and bool(arr.flags.c_contiguous) and arr.device.id == self.device_id()
                and arr.data.ptr % self.alignment == 0)

    def put(self, arr: Any) -> Any:
        if isinstance(arr, self.ndarray):
            return arr.copy()  # cupy's copy is C-ordered by default, and made on the current device
        # cupy.asarray keeps a Fortran array's order: make the host copy row-major first
        return self.cupy.asarray(np.ascontiguousarray(arr))

    def overlaps(self, a: Any, b: Any) -> bool:
        return bool(self.cupy.may_share_memory(a, b))

    def capacity(self) -> int | None:
        try:
            return int(self.cupy.cuda.Device().mem_info[1])
        except (AttributeError, RuntimeError):  # no mem_info (a stand-in) or no device to ask
            return None

    def synchronize(self) -> None:
        """Waits for the kernels queued on the current stream (a launch returns before its kernel ends)."""
        stream = getattr(self.cupy.cuda, "get_current_stream", None)
        if stream is not None:  # a stand-in runs its kernels synchronously
            stream().synchronize()


# The arrays of each device type (a target kind's TDeviceType).
_DEVICES: dict[str, Callable[[], Any]] = {"cpu": _Host, "cuda": _Device}


class _ThreadState(threading.local):
    """What one thread bound and got: its inputs (slot -> array) and the outputs of its last run."""

    def __init__(self) -> None:
        self.bound: dict[int, Any] = {}
        self.outputs: list[Any] = []


class GraphExecutor:
    """Runs a `Library`: `set_input`, `run`, `get_output`, or `ex(**inputs)` for the outputs.

    On an llvm library the arrays are numpy arrays. On a cuda library inputs may
    be numpy or cupy arrays (numpy ones are copied to the device), the
    intermediates live in device buffers, and outputs are cupy arrays
    (`.get()` copies one to numpy). Either takes any DLPack array (an object
    with `__dlpack__`: torch tensors, jax arrays): on a cuda library, one on
    the GPU is used in place through `cupy.from_dlpack`, one on the host is
    read by `np.from_dlpack` and copied over; on an llvm library, host ones go
    through `np.from_dlpack`, a view where possible. Every input is checked
    for its dtype and shape like a numpy array, and copied where its memory
    order (or device, or alignment) does not suit the kernels.

    Fast paths: the first run checks every launch's arrays in its module; it
    then binds each launch once (an llvm kernel's native entry, a CUDA
    kernel's cupy Function with its grid, block and argument tuple made of
    device pointers), and later runs only put this run's input and output
    pointers into those argument tuples. That is safe because inputs are
    checked as they are bound (`set_input`), outputs are allocated by the run
    at their shapes, intermediates and constants stay where they are, and a
    CUDA run on another device than the one bound goes the checked way. With
    `cuda_graph=True` (cuda libraries), the fast path's launches are captured
    once as a CUDA graph and replayed per run.

    Threads: one executor may be shared. Inputs bound by `set_input` and the
    outputs of `run` are per thread, and runs take turns on the executor's
    intermediate buffers (a lock), so shared use is correct but serial. To run
    in parallel, create one executor per thread (`lib.create_executor()`): they
    share the compiled kernels, not the buffers.
    """

    def __init__(self, lib: Library, cuda_graph: bool = False) -> None:
        """Checks the graph's sizes against the kernels and the machine, then allocates its buffers.

        Args:
            lib: the library to run.
            cuda_graph: on a cuda library, capture every launch of a run once as a CUDA graph (on the
                second run: the first checks them) and replay it per run, the inputs copied into the
                buffers it was captured with and the outputs out of them: one launch per run instead
                of one per kernel, for two device copies per input and output.

        Raises:
            ExecutorError: for a tensor with more elements than the kernels index, a bad storage plan,
                or `cuda_graph` on a library that is not for cuda.
            KernelMemoryError: when the intermediates and outputs cannot fit in memory.
        """
        self.lib = lib
        g = lib.graph
        device = lib.target.kind.get_attr(TDeviceType)
        if device not in _DEVICES:
            raise ExecutorError(f"no executor runs code for device type {device!r} (target {lib.target})")
        if cuda_graph and device != "cuda":
            raise ExecutorError(f"cuda_graph=True replays CUDA launches; this library is for {lib.target}")
        self._xp: Any = _DEVICES[device]()
        self._names = {g.slots[s].name: s for s in g.inputs}
        self._state = _ThreadState()
        # Runs share the intermediate buffers and build the fast path below: one run at a time.
        self._lock = threading.Lock()
        # A graph of symbolic shapes runs as its specialization to the sizes of the run's inputs: planned and
        # allocated when those sizes change, kept while they repeat.
        self._graph: Graph = g
        self._sizes: dict[str, int] | None = None
        self._buffers: list[Any] = []
        self._values: list[Any] = []
        # constants as kernels read them (on a GPU, copies) by library array id: a change of sizes copies none
        self._constants: dict[int, tuple[Any, Any]] = {}
        # The llvm fast path: after one checked run, launches call the native entry on data pointers.
        # Inputs are checked by set_input, outputs are allocated here and intermediates are planned,
        # so the per-call checks (about 6 us a launch) would only repeat what is known.
        self._entries: list[_Entry] | None = None
        self._pointers: list[int] = []
        # The CUDA fast path, the same idea: per graph launch its kernels' bound launches, on one device.
        self._cuda: list[list[_CudaLaunch]] | None = None
        self._cuda_device = -1
        self._cuda_keep: list[Any] = []  # the workspaces the bound argument tuples point into
        self._cuda_io: list[int] = []  # the slots whose pointers change per run: inputs and outputs
        # The CUDA graph of a run (cuda_graph=True), and the device buffers of those slots it was captured on.
        self._use_graph = cuda_graph
        self._graph_launch: Any = None
        self._graph_buffers: dict[int, Any] = {}
        if not g.symbols:
            self._use(g)

    @property
    def input_names(self) -> list[str]:
        """The model's inputs, in order."""
        return [self._graph.slots[s].name for s in self.lib.graph.inputs]

    @property
    def num_outputs(self) -> int:
        """How many outputs `run` produces."""
        return len(self.lib.graph.outputs)

    @property
    def planned_bytes(self) -> int:
        """The bytes of this executor's intermediate buffers (the planned peak, outputs aside; of a graph of
        symbolic shapes, for the sizes of the last run)."""
        return sum(self._graph.storage_sizes)

    def set_input(self, name: str, value: Any) -> None:
        """Binds input `name` for this thread's runs; checked against its dtype and shape.

        Arrays must have the input's dtype. Lists and Python numbers are converted to
        it when every value survives the conversion (integers in range, floats finite).

        Raises:
            ExecutorError: for an unknown name, or a value of another dtype or shape.
        """
        s, arr = self._prepare(name, value)
        self._state.bound[s] = arr

    def _prepare(self, name: str, value: Any) -> tuple[int, Any]:
        """The slot of input `name` and `value` as an array a kernel can take (a copy where needed)."""
        s = self._names.get(name)
        if s is None:
            raise ExecutorError(f"model has no input {name!r}; its inputs are {self.input_names}")
        slot = self.lib.graph.slots[s]
        want = numpy_dtype(slot.dtype)
        arr = self._xp.adopt(name, value, want)
        if arr.dtype != want:
            raise ExecutorError(f"input {name!r}: expected dtype {slot.dtype}, got {arr.dtype}")
        if len(arr.shape) != len(slot.shape) or any(
                isinstance(d, int) and d != got for d, got in zip(slot.shape, arr.shape, strict=False)):
            shape = tuple(d if isinstance(d, int) else str(d) for d in slot.shape)
            raise ExecutorError(f"input {name!r}: expected shape {shape}, got {arr.shape}")
        if not self._xp.fits(arr):
            arr = self._allocate(lambda: self._xp.put(arr), arr.nbytes, lambda: f"input {name!r} (a copy)")
        return s, arr

    def _use(self, graph: Graph) -> None:
        """Makes `graph` (of static shapes) the one runs use: checks its sizes against the kernels and the
        machine, allocates its buffers, and drops the fast path bound to the previous one."""
        self._graph = graph
        self._check_sizes()
        self._buffers = [self._allocate(partial(self._xp.buffer, n), n, partial(self._describe_buffer, b))
                         for b, n in enumerate(graph.storage_sizes)]
        self._values = [None] * len(graph.slots)
        for s, arr in graph.constants.items():
            if id(arr) not in self._constants:
                self._constants[id(arr)] = (arr, self._xp.put(arr))  # (the array kept: its id stays its own)
            self._values[s] = self._constants[id(arr)][1]
        for s, slot in enumerate(graph.slots):
            if slot.kind == "temp":
                dtype = numpy_dtype(slot.dtype)
                if slot.storage < 0:  # a value no launch writes (it is empty): a zero-size array of its own
                    self._values[s] = self._xp.empty(slot.shape, dtype)
                else:
                    buf = self._buffers[slot.storage]
                    self._values[s] = buf[: slot_bytes(slot)].view(dtype).reshape(slot.shape)
        self._entries, self._pointers = None, []
        self._cuda, self._cuda_keep, self._cuda_io = None, [], []
        self._graph_launch, self._graph_buffers = None, {}

    def _size_values(self) -> tuple[dict[str, int], dict[str, str]]:
        """The size variables' values from this thread's bound inputs (a graph of symbolic shapes), and the
        input dim each came from (`x.shape[0]`).

        Raises:
            ExecutorError: when two inputs give one size variable two values, or a dim that is a product
                of sizes (`2*n`) does not match the values the others give.
        """
        g = self.lib.graph
        bound = self._state.bound
        env: dict[str, int] = {}
        where: dict[str, str] = {}
        later: list[tuple[Dim, int, str]] = []
        for s in g.inputs:
            slot = g.slots[s]
            for axis, (d, got) in enumerate(zip(slot.shape, bound[s].shape, strict=True)):
                if isinstance(d, int):
                    continue
                here = f"{slot.name}.shape[{axis}]"
                name = size_name(d)
                if name is None:
                    later.append((d, got, here))  # a product or sum of sizes: checked once they are known
                    continue
                if name not in env:
                    env[name], where[name] = got, here
                elif env[name] != got:
                    raise ExecutorError(f"size {name} is {env[name]} from input {where[name]} but {got} from input "
                                        f"{here}: the inputs must agree")
        for d, got, here in later:
            names = list(dim_names(d))
            free = [n for n in names if n not in env]
            if isinstance(d, SymDim) and len(free) == 1 and size_name(SymDim(1, d.factors)) is not None:
                if got % d.coeff:
                    raise ExecutorError(f"input {here} is {got}, but its dim {d} is a multiple of {d.coeff}")
                env[free[0]], where[free[0]] = got // d.coeff, here
            elif free:
                raise ExecutorError(f"input {here} has the dim {d} = {got}, which does not tell {', '.join(free)}: "
                                    "give an input whose dim is the size itself")
            if dim_value(d, env) != got:
                raise ExecutorError(f"input {here} is {got}, but its dim {d} is {dim_value(d, env)} with "
                                    + ", ".join(f"{n} = {env[n]} (from {where[n]})" for n in names))
        return env, where

    def run(self, **inputs: Any) -> None:
        """Runs every launch in order (after binding `inputs`, if given), in this thread.

        Raises:
            ExecutorError: for missing inputs or inputs that do not fit (see `set_input`).
            KernelMemoryError: when an output or a kernel's temporary cannot be allocated.
        """
        self._bind(inputs)
        with self._lock:
            values, fresh = self._start()
            if self._entries is not None:
                self._run_entries(values)
            elif self._cuda_ready():
                if self._use_graph and self._cuda:
                    self._run_graph(values)
                else:
                    self._run_cuda(values)
            else:
                self._run_checked(values)
        self._state.outputs = self._finish(values, fresh)

    def profile(self, repeat: int = 10, warmup: int = 1, **inputs: Any) -> Profile:
        """Runs the model `warmup + repeat` times, timing each kernel launch on its own.

        A launch is timed from its call until it returns (on a GPU, until the device
        is done with it); the report holds each launch's median over the `repeat`
        timed runs, the same grouped by kernel, and the median of the whole runs.
        The outputs of the last run are this thread's outputs, as after `run`.

        Args:
            repeat: timed runs (at least 1).
            warmup: untimed runs first (the first run checks every launch's arrays).
            inputs: inputs to bind first, as for `run`.

        Returns:
            The `Profile`; `print(profile)` shows the kernels by time.

        Raises:
            ExecutorError: for a bad `repeat`, and as `run`.
        """
        if isinstance(repeat, bool) or not isinstance(repeat, int) or repeat < 1:
            raise ExecutorError(f"profile: repeat must be an int of at least 1, got {repeat!r}")
        self._bind(inputs)
        launch_seconds: list[list[float]] = []
        run_seconds: list[float] = []
        for n in range(max(warmup, 0) + repeat):
            timed = n >= warmup
            start = time.perf_counter()
            with self._lock:
                values, fresh = self._start()
                g = self._graph  # (of a symbolic library: the graph of these inputs' sizes)
                launch_seconds = launch_seconds or [[] for _ in g.launches]
                times = launch_seconds if timed else None
                if self._entries is not None and times is not None:
                    self._run_entries_timed(values, times)
                elif self._cuda_ready() and times is not None:
                    self._run_cuda(values, times)
                else:  # the first run checks every launch (and builds the fast path)
                    self._run_checked(values, times)
            self._state.outputs = self._finish(values, fresh)
            if timed:
                run_seconds.append(time.perf_counter() - start)
        return make_profile(g, [k.name for k in self.lib.kernels], launch_seconds, run_seconds)

    def _bind(self, inputs: Mapping[str, Any]) -> None:
        """Binds `inputs` for this thread, only once every one of them is accepted."""
        prepared = dict(self._prepare(name, value) for name, value in inputs.items())
        self._state.bound.update(prepared)

    def _start(self) -> tuple[list[Any], dict[int, Any]]:
        """The values of a run (bound inputs, constants, planned buffers) and its fresh output arrays."""
        state = self._state
        g = self.lib.graph
        missing = [g.slots[s].name for s in g.inputs if s not in state.bound]
        if missing:
            raise ExecutorError(f"inputs not set: {missing}; set them with set_input(name, array) in this thread")
        if g.symbols:
            sizes, where = self._size_values()
            if sizes != self._sizes:
                graph = self.lib.variant(sizes) or g  # a variant built for these sizes first
                self._use(graph.specialize(sizes, where) if graph.symbols else graph)
                self._sizes = sizes
            g = self._graph
        values = list(self._values)
        for s in g.inputs:
            values[s] = state.bound[s]
        # inputs that overlap (the same array given for two inputs) go as copies: kernel pointers are noalias
        for n, s in enumerate(g.inputs):
            if any(self._xp.overlaps(values[s], values[t]) for t in g.inputs[:n]):
                values[s] = values[s].copy()
        fresh: dict[int, np.ndarray] = {}
        for k, s in enumerate(g.outputs):
            slot = g.slots[s]
            if slot.kind == "output" and s not in fresh:
                fresh[s] = values[s] = self._allocate(partial(self._xp.empty, slot.shape, numpy_dtype(slot.dtype)),
                                                      slot_bytes(slot), partial(self._describe_slot, s, k))
        return values, fresh

    def _finish(self, values: list[Any], fresh: dict[int, Any]) -> list[Any]:
        """The outputs of a run: its fresh arrays, and copies of the outputs that are not fresh."""
        g = self._graph
        # an output that is an input, a constant or another output's value is returned as a copy
        seen: set[int] = set()
        outs = []
        for k, s in enumerate(g.outputs):
            v = values[s]
            assert v is not None
            if s in fresh and s not in seen:
                outs.append(v)
            else:
                outs.append(self._allocate(v.copy, slot_bytes(g.slots[s]), partial(self._describe_slot, s, k)))
            seen.add(s)
        return outs

    def _run_checked(self, values: list[Any], times: list[list[float]] | None = None) -> None:
        """Runs every launch through its module's checks; with `times`, appends each launch's time."""
        g = self._graph
        entries = []
        bound = []
        for k, launch in enumerate(g.launches):
            slots = (*launch.inputs, *launch.outputs)
            # a value passed twice (add(x, x)) goes the second time as a copy: kernel pointers are noalias
            args = [values[s] if s not in slots[:n] else values[s].copy() for n, s in enumerate(slots)]
            kernel = self.lib.kernels[launch.kernel]
            sized = {} if self._sizes is None else {"sizes": self._sizes}  # sizes only products of them give
            start = time.perf_counter()
            kernel(*args, **sized)
            if times is not None:
                self._xp.synchronize()
                times[k].append(time.perf_counter() - start)
            if len(set(slots)) < len(slots):
                continue
            if isinstance(self._xp, _Host):
                entries.append((kernel.entry(), slots, kernel.check(*args, **sized)))
            else:
                bound.append((slots, kernel.bind(*args)))
        if isinstance(self._xp, _Device):
            if len(bound) == len(g.launches):
                self._bind_cuda(bound)
            return
        if len(entries) < len(g.launches):
            return
        # intermediates and constants stay where they are: their addresses are taken once, and a
        # launch that touches only them gets its whole argument tuple now
        fixed = {s for s, slot in enumerate(g.slots) if slot.kind in ("temp", "const")}
        self._pointers = [v.ctypes.data if s in fixed else 0 for s, v in enumerate(values)]
        self._entries = [
            (entry, slots, sizes, (*(self._pointers[s] for s in slots), *sizes) if fixed.issuperset(slots) else None)
            for entry, slots, sizes in entries
        ]

    def _bind_cuda(self, bound: list[tuple[tuple[int, ...], list[Any]]]) -> None:
        """The CUDA fast path from each graph launch's slots and its `CudaModule.bind` kernels."""
        fixed = {s for s, slot in enumerate(self._graph.slots) if slot.kind in ("temp", "const")}
        self._cuda = [[(b.function, b.grid, b.block, b.shared_bytes, b.args,
                        tuple((pos, slots[i]) for pos, i in b.params if slots[i] not in fixed)) for b in kernels]
                      for slots, kernels in bound]
        self._cuda_keep = [b.workspaces for _, kernels in bound for b in kernels]
        self._cuda_device = self._xp.device_id()
        self._cuda_io = [s for s, slot in enumerate(self._graph.slots) if slot.kind in ("input", "output")]

    def _cuda_ready(self) -> bool:
        """Whether the CUDA fast path is bound, to the current device."""
        return self._cuda is not None and self._xp.device_id() == self._cuda_device

    def _run_cuda(self, values: list[Any], times: list[list[float]] | None = None) -> None:
        """Launches every kernel with its bound arguments and this run's input and output pointers; with
        `times`, appends each graph launch's time (until the device is done with it)."""
        self._launch_cuda({s: np.uint64(values[s].data.ptr) for s in self._cuda_io}, times)

    def _run_graph(self, values: list[Any]) -> None:
        """Replays the run's CUDA graph (capturing it first, once) on the current stream, between copies of
        this run's inputs into the buffers it reads and of the buffers it writes into this run's outputs."""
        cupy = self._xp.cupy
        g = self._graph
        if self._graph_launch is None:
            self._graph_buffers = {
                s: self._allocate(partial(self._xp.empty, g.slots[s].shape, numpy_dtype(g.slots[s].dtype)),
                                  slot_bytes(g.slots[s]), partial(self._describe_slot, s))
                for s in self._cuda_io}
            stream = cupy.cuda.Stream(non_blocking=True)  # the legacy default stream cannot be captured
            with stream:
                stream.begin_capture()
                try:
                    self._launch_cuda({s: np.uint64(b.data.ptr) for s, b in self._graph_buffers.items()})
                finally:
                    graph = stream.end_capture()
            self._graph_launch = graph
        for s, buffer in self._graph_buffers.items():
            if g.slots[s].kind == "input":
                cupy.copyto(buffer, values[s])
        self._graph_launch.launch(cupy.cuda.get_current_stream())
        for s, buffer in self._graph_buffers.items():
            if g.slots[s].kind == "output":
                cupy.copyto(values[s], buffer)

    def _launch_cuda(self, pointers: dict[int, Any], times: list[list[float]] | None = None) -> None:
        """`_run_cuda` on the pointers of the run's inputs and outputs, by slot."""
        clock = time.perf_counter
        for k, kernels in enumerate(self._cuda or ()):
            start = clock()
            for function, grid, block, shared, args, patch in kernels:
                if patch:
                    call = list(args)
                    for pos, s in patch:
                        call[pos] = pointers[s]
                    args = tuple(call)
                function(grid, block, args, shared_mem=shared)
            if times is not None:
                self._xp.synchronize()
                times[k].append(clock() - start)

    def _run_entries(self, values: list[Any]) -> None:
        g = self._graph
        pointers = self._run_pointers(values)
        for (entry, slots, sizes, args), launch in zip(self._entries or (), g.launches, strict=True):
            if entry(*(args if args is not None else (*[pointers[s] for s in slots], *sizes))):
                self.lib.kernels[launch.kernel].out_of_memory(sizes)

    def _run_entries_timed(self, values: list[Any], times: list[list[float]]) -> None:
        """`_run_entries`, appending each launch's time to `times` (a loop of its own: the untimed one
        stays as lean as it is)."""
        g = self._graph
        pointers = self._run_pointers(values)
        clock = time.perf_counter
        for k, ((entry, slots, sizes, args), launch) in enumerate(zip(self._entries or (), g.launches, strict=True)):
            call = args if args is not None else (*[pointers[s] for s in slots], *sizes)
            start = clock()
            status = entry(*call)
            times[k].append(clock() - start)
            if status:
                self.lib.kernels[launch.kernel].out_of_memory(sizes)

    def _run_pointers(self, values: list[Any]) -> list[int]:
        """The data pointers of a run's slots: the fixed ones, and this run's inputs and outputs."""
        g = self._graph
        pointers = list(self._pointers)
        for s in (*g.inputs, *g.outputs):
            if g.slots[s].kind in ("input", "output"):
                pointers[s] = values[s].ctypes.data
        return pointers

    def get_output(self, index: int) -> Any:
        """Output `index` of this thread's last run."""
        outputs = self._state.outputs
        if not outputs:
            raise ExecutorError("get_output before run() (outputs are per thread: run in this thread first)")
        if not 0 <= index < len(outputs):
            raise ExecutorError(f"output index {index} out of range: the model has {len(outputs)}")
        return outputs[index]

    def __call__(self, *args: Any, **inputs: Any) -> Any:
        """Runs on inputs given by position or name; returns the output (a tuple for several)."""
        if len(args) > len(self.input_names):
            raise ExecutorError(f"model takes {len(self.input_names)} inputs, got {len(args)} positional")
        named: Mapping[str, Any] = {**dict(zip(self.input_names, args, strict=False)), **inputs}
        self.run(**named)
        outputs = self._state.outputs
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    # -- sizes and memory -------------------------------------------------------------------------
    def _check_sizes(self) -> None:
        """Refuses tensors the kernels cannot index and buffers the machine cannot hold, before allocating."""
        g = self._graph
        for b, n in enumerate(g.storage_sizes):
            if n < 0:
                raise ExecutorError(f"intermediate buffer {b} has a negative size ({n} bytes)")
        for s, slot in enumerate(g.slots):
            if any(d < 0 for d in slot.dims):
                raise ExecutorError(f"{self._describe_slot(s)} has a negative dim: shape {slot.shape}")
            elements = math.prod(slot.dims)
            if elements > MAX_ELEMENTS:
                raise ExecutorError(f"{self._describe_slot(s)} has shape {slot.shape}: {elements} elements, more "
                                    f"than the {MAX_ELEMENTS} that kiln's kernels index (int32)")
            if slot.kind == "temp" and slot.storage < 0 and elements:
                raise ExecutorError(f"{self._describe_slot(s)} has no planned buffer")
            if slot.kind == "temp" and slot.storage >= 0 and (
                    slot.storage >= len(g.storage_sizes) or g.storage_sizes[slot.storage] < slot_bytes(slot)):
                raise ExecutorError(f"{self._describe_slot(s)} ({slot_bytes(slot)} bytes) is planned in buffer "
                                    f"{slot.storage}, which the plan does not make that large")
        capacity = self._xp.capacity()
        if capacity is None:
            return
        needs: list[tuple[int, Callable[[], str]]] = [
            (n, partial(self._describe_buffer, b)) for b, n in enumerate(g.storage_sizes)]
        # every output of a run is a new array (or a copy)
        needs += [(slot_bytes(g.slots[s]), partial(self._describe_slot, s, k)) for k, s in enumerate(g.outputs)]
        total = sum(n for n, _ in needs)
        if needs and total > capacity:
            n, describe = max(needs, key=lambda x: x[0])
            raise KernelMemoryError(
                f"{describe()} needs {format_bytes(n)} ({n} bytes); this model's intermediates and outputs need "
                f"{format_bytes(total)} in all, more than the {format_bytes(capacity)} of memory of this "
                f"{'GPU' if isinstance(self._xp, _Device) else 'machine'}")

    @staticmethod
    def _allocate(make: Callable[[], Any], nbytes: int, describe: Callable[[], str]) -> Any:
        """`make()`, with a MemoryError (numpy's, or cupy's OutOfMemoryError) as kiln's naming `describe()`."""
        try:
            return make()
        except MemoryError as e:
            raise KernelMemoryError(f"{describe()}: cannot allocate {format_bytes(nbytes)} ({nbytes} bytes)") from e
        except Exception as e:  # cupy's OutOfMemoryError does not derive from MemoryError
            if type(e).__name__ != "OutOfMemoryError":
                raise
            raise KernelMemoryError(f"{describe()}: cannot allocate {format_bytes(nbytes)} ({nbytes} bytes) "
                                    "on the GPU") from e

    def _describe_slot(self, s: int, output: int | None = None) -> str:
        """How a message names slot `s`: the input's name, the output's index, the op that makes it."""
        g = self._graph
        slot = g.slots[s]
        if output is None and s in g.outputs:
            output = g.outputs.index(s)
        made_by = f", made by {slot.name}" if slot.name and slot.kind in ("temp", "output") else ""
        if output is not None:
            return f"output {output} ({slot.dtype}{list(slot.shape)}{made_by})"
        if slot.kind == "input":
            return f"input {slot.name!r}"
        if slot.kind == "const":
            return f"constant {slot.dtype}{list(slot.shape)}"
        return f"intermediate value {slot.dtype}{list(slot.shape)}{made_by}"

    def _describe_buffer(self, b: int) -> str:
        """How a message names intermediate buffer `b`: by its largest value."""
        g = self._graph
        held = [s for s, slot in enumerate(g.slots) if slot.kind == "temp" and slot.storage == b]
        if not held:
            return f"intermediate buffer {b}"
        largest = max(held, key=lambda s: slot_bytes(g.slots[s]))
        return f"intermediate buffer {b} (for the {self._describe_slot(largest)})"


def _as_array(name: str, value: Any, want: np.dtype[Any]) -> Any:
    """`value` as a numpy array: arrays (and array-likes) as they are, lists and numbers in dtype `want`.

    A list or Python number has no dtype of its own, so it takes the input's, but
    only when that loses nothing beyond float rounding: 1.5 is no int32, 300 no
    uint8, 1e300 no float32.
    """
    # np.float64 is a Python float, but as a numpy scalar its dtype is the caller's choice
    literal = isinstance(value, (list, tuple, bool, int, float)) and not isinstance(value, np.generic)
    try:
        raw = np.asarray(value)
    except (TypeError, ValueError) as e:
        raise ExecutorError(f"input {name!r}: expected an array of {want}, got {type(value).__name__} "
                            f"that numpy cannot read as one ({e})") from e
    if not literal or raw.dtype == want:
        return raw
    kind = type(value).__name__
    if raw.dtype.kind not in "biuf":
        raise ExecutorError(f"input {name!r}: expected {want} values, got a {kind} of {raw.dtype} "
                            "(not all numbers, or of different lengths?)")
    with np.errstate(all="ignore"):
        conv = raw.astype(want)
        if want.kind == "f" and raw.dtype.kind in "biuf":
            lossless = bool(np.array_equal(np.isfinite(conv), np.isfinite(raw)))  # rounding, but no overflow
        else:
            lossless = bool(np.all(conv.astype(raw.dtype) == raw))
    if not lossless:
        raise ExecutorError(f"input {name!r}: the {kind} holds values that dtype {want} cannot represent")
    return conv


def _dlpack_device(value: Any) -> int | None:
    """The DLPack device type of `value` (1 the host, 2 a CUDA GPU, ...), or None for a non-DLPack value."""
    if isinstance(value, np.generic) or not hasattr(value, "__dlpack__"):
        return None
    try:
        return int(value.__dlpack_device__()[0])
    except Exception:  # no __dlpack_device__ (an old producer): let the host reader try it
        return _DLPACK_HOST[0]


def _from_dlpack(name: str, value: Any, reader: Callable[[Any], Any], library: str) -> Any:
    """`reader(value)` (np.from_dlpack or cupy.from_dlpack), its failures as kiln's error naming the input."""
    try:
        return reader(value)
    except Exception as e:  # BufferError, TypeError, RuntimeError (e.g. a torch tensor that requires grad)
        raise ExecutorError(f"input {name!r}: {library} cannot read this {type(value).__name__} through DLPack "
                            f"({type(e).__name__}: {e})") from e


def _aligned(nbytes: int) -> np.ndarray:
    raw = np.empty(nbytes + _ALIGN, np.uint8)
    offset = (-raw.ctypes.data) % _ALIGN
    return raw[offset: offset + nbytes]
