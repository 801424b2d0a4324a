"""The graph executor: a list of kernel launches over planned buffers, and its file format.

A `Graph` is what `relay.build` produces: slots (one per tensor value: an
input, a constant, an intermediate or an output), kernel launches reading and
writing slots, and a storage plan for the intermediates. The plan reuses a
buffer as soon as the last launch reading its previous value has run (best
fit among free buffers of sufficient size), so the peak memory is the sum of
the buffers, not of the intermediates. Outputs get fresh arrays on every run,
so a later run never overwrites what an earlier one returned.

`Library.export(path)` writes one file: a header (magic, version, length and
sha256 of the payload), then the JSON graph, every kernel's object code and
the constants. `load(path)` checks all of it before it maps any code; a
truncated or corrupt file raises `LibraryFormatError`.
"""

from __future__ import annotations

import hashlib
import io
import json
import struct
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from kiln.errors import KilnError
from kiln.runtime.module import Module, numpy_dtype
from kiln.target import Target
from kiln.tir import expr as tx
from kiln.tir.stmt import Evaluate, PrimFunc
from kiln.tir.stmt import buffer as tir_buffer

_MAGIC = b"KILNLIB1"
_ALIGN = 64


class ExecutorError(KilnError, ValueError):
    """Inputs that do not fit the compiled model (name, shape, dtype), or a misused executor."""


class LibraryFormatError(KilnError, ValueError):
    """A library file that is not one, is truncated, or was altered."""


@attrs.frozen
class Slot:
    """One tensor value of the graph."""

    shape: tuple[int, ...]
    dtype: str
    kind: str  # "input", "const", "temp" or "output"
    name: str = ""
    storage: int = -1  # for "temp": the planned buffer

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * numpy_dtype(self.dtype).itemsize


@attrs.frozen
class Launch:
    """One kernel run: kernel index, the slots it reads, the slots it writes."""

    kernel: int
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]


@attrs.define
class Graph:
    """Slots, launches, the graph's inputs and outputs, constants and the storage plan."""

    slots: list[Slot]
    launches: list[Launch]
    inputs: list[int]
    outputs: list[int]
    constants: dict[int, np.ndarray]
    storage_sizes: list[int] = attrs.field(factory=list)

    def plan_memory(self) -> None:
        """Assigns each temp slot a buffer, reusing buffers whose last reader has run."""
        last_use: dict[int, int] = {}
        for n, launch in enumerate(self.launches):
            for s in launch.inputs:
                last_use[s] = n
        free: list[int] = []
        sizes: list[int] = []
        for n, launch in enumerate(self.launches):
            for s in launch.outputs:
                slot = self.slots[s]
                if slot.kind != "temp":
                    continue
                need = slot.nbytes
                fits = [b for b in free if sizes[b] >= need]
                if fits:
                    best = min(fits, key=lambda b: sizes[b])
                    free.remove(best)
                else:
                    # grow the largest free buffer rather than add one, when one is free
                    best = max(free, key=lambda b: sizes[b]) if free else len(sizes)
                    if free:
                        free.remove(best)
                        sizes[best] = need
                    else:
                        sizes.append(need)
                self.slots[s] = attrs.evolve(slot, storage=best)
            for s in set(launch.inputs):
                slot = self.slots[s]
                if slot.kind == "temp" and last_use.get(s) == n:
                    free.append(slot.storage)
        self.storage_sizes = sizes


class Library:
    """A compiled model: its graph and kernels. `create_executor()` runs it; `export(path)` saves it."""

    def __init__(self, graph: Graph, kernels: Sequence[Any], target: Target) -> None:
        self.graph = graph
        self.kernels = list(kernels)
        self.target = target

    @property
    def planned_bytes(self) -> int:
        """The bytes of the intermediate buffers after memory planning."""
        return sum(self.graph.storage_sizes)

    def create_executor(self) -> GraphExecutor:
        """A `GraphExecutor` of this library."""
        return GraphExecutor(self)

    def export(self, path: str | Path) -> None:
        """Writes the library (graph, object code, constants) to one file that `load` reads back.

        Raises:
            ExecutorError: for a cuda library (its export is not written yet).
        """
        if self.target.kind.name != "llvm":
            raise ExecutorError(f"export writes llvm libraries only so far; this one is for {self.target}")
        blobs: list[bytes] = []

        def blob(data: bytes) -> int:
            blobs.append(data)
            return len(blobs) - 1

        kernels = []
        for m in self.kernels:
            params = [{"name": b.name, "dtype": b.dtype,
                       "shape": [int(d.value) if isinstance(d, tx.IntImm) else str(d) for d in b.shape]}
                      for b in m.func.params]
            kernels.append({"name": m.name, "params": params, "object": blob(m.object_code), "symbols": m.symbols})
        consts = {}
        for s, arr in self.graph.constants.items():
            buf = io.BytesIO()
            np.save(buf, arr, allow_pickle=False)
            consts[str(s)] = blob(buf.getvalue())
        header = {
            "target": str(self.target),
            "slots": [attrs.asdict(s) for s in self.graph.slots],
            "launches": [attrs.asdict(launch) for launch in self.graph.launches],
            "inputs": self.graph.inputs, "outputs": self.graph.outputs,
            "storage_sizes": self.graph.storage_sizes, "constants": consts, "kernels": kernels,
            "blobs": [len(b) for b in blobs],
        }
        head = json.dumps(header).encode()
        payload = struct.pack("<Q", len(head)) + head + b"".join(blobs)
        digest = hashlib.sha256(payload).digest()
        Path(path).write_bytes(_MAGIC + struct.pack("<Q", len(payload)) + digest + payload)


def _signature(name: str, params: list[dict[str, Any]]) -> PrimFunc:
    """A PrimFunc with the kernel's parameters and an empty body: the calling convention of loaded code."""
    size_vars: dict[str, tx.Var] = {}
    bufs = []
    for p in params:
        shape = [d if isinstance(d, int) else size_vars.setdefault(d, tx.Var(d)) for d in p["shape"]]
        bufs.append(tir_buffer(p["name"], shape, p["dtype"]))
    return PrimFunc(name, bufs, Evaluate(tx.const(0)))


def load(path: str | Path) -> Library:
    """Reads a file written by `Library.export`, without compiling anything.

    Raises:
        LibraryFormatError: for a file that is not a kiln library, is truncated or fails its checksum.
    """
    data = Path(path).read_bytes()
    where = f"kiln library {str(path)!r}"
    if len(data) < len(_MAGIC) + 40 or not data.startswith(_MAGIC):
        raise LibraryFormatError(f"{where}: not a kiln library (bad magic or too short)")
    (length,) = struct.unpack_from("<Q", data, len(_MAGIC))
    digest = data[len(_MAGIC) + 8: len(_MAGIC) + 40]
    payload = data[len(_MAGIC) + 40:]
    if len(payload) != length:
        raise LibraryFormatError(f"{where}: truncated ({len(payload)} of {length} payload bytes)")
    if hashlib.sha256(payload).digest() != digest:
        raise LibraryFormatError(f"{where}: checksum mismatch; the file was altered or corrupted")
    try:
        (head_len,) = struct.unpack_from("<Q", payload, 0)
        header = json.loads(payload[8: 8 + head_len])
        blobs, pos = [], 8 + head_len
        for size in header["blobs"]:
            blobs.append(payload[pos: pos + size])
            pos += size
        target = Target(header["target"])
        kernels = [Module(_signature(k["name"], k["params"]), target, blobs[k["object"]], k["symbols"])
                   for k in header["kernels"]]
        constants = {int(s): np.load(io.BytesIO(blobs[b]), allow_pickle=False) for s, b in header["constants"].items()}
        graph = Graph(
            [Slot(tuple(s["shape"]), s["dtype"], s["kind"], s["name"], s["storage"]) for s in header["slots"]],
            [Launch(x["kernel"], tuple(x["inputs"]), tuple(x["outputs"])) for x in header["launches"]],
            list(header["inputs"]), list(header["outputs"]), constants, list(header["storage_sizes"]),
        )
    except (KeyError, TypeError, ValueError, IndexError, struct.error) as e:
        raise LibraryFormatError(f"{where}: malformed contents ({type(e).__name__}: {e})") from e
    return Library(graph, kernels, target)


class _Host:
    """The arrays of an llvm library: numpy, buffers aligned for vector loads."""

    ndarray = np.ndarray

    @staticmethod
    def buffer(nbytes: int) -> Any:
        return _aligned(nbytes)

    @staticmethod
    def empty(shape: tuple[int, ...], dtype: np.dtype[Any]) -> Any:
        return np.empty(shape, dtype)

    @staticmethod
    def put(arr: np.ndarray) -> Any:
        return np.array(arr, copy=True)  # writeable, as kernel arguments must be

    @staticmethod
    def overlaps(a: Any, b: Any) -> bool:
        return bool(np.may_share_memory(a, b))


class _Device:
    """The arrays of a cuda library: cupy arrays on the current device."""

    def __init__(self) -> None:
        from kiln.runtime.cuda_module import _cupy

        self.cupy = _cupy()
        self.ndarray = self.cupy.ndarray

    def buffer(self, nbytes: int) -> Any:
        return self.cupy.empty(nbytes, dtype=np.uint8)

    def empty(self, shape: tuple[int, ...], dtype: np.dtype[Any]) -> Any:
        return self.cupy.empty(shape, dtype=dtype)

    def put(self, arr: np.ndarray) -> Any:
        return self.cupy.asarray(arr)

    def overlaps(self, a: Any, b: Any) -> bool:
        return bool(self.cupy.may_share_memory(a, b))


class GraphExecutor:
    """Runs a `Library`: `set_input`, `run`, `get_output`, or `ex(**inputs)` for the outputs.

    On an llvm library the arrays are numpy arrays. On a cuda library inputs may
    be numpy or cupy arrays (numpy ones are copied to the device), the
    intermediates live in device buffers, and outputs are cupy arrays
    (`.get()` copies one to numpy).
    """

    def __init__(self, lib: Library) -> None:
        self.lib = lib
        g = lib.graph
        self._xp: Any = _Device() if lib.target.kind.name == "cuda" else _Host()
        self._buffers = [self._xp.buffer(n) for n in g.storage_sizes]
        self._values: list[Any] = [None] * len(g.slots)
        for s, arr in g.constants.items():
            self._values[s] = self._xp.put(arr)
        for s, slot in enumerate(g.slots):
            if slot.kind == "temp":
                buf = self._buffers[slot.storage]
                self._values[s] = buf[: slot.nbytes].view(numpy_dtype(slot.dtype)).reshape(slot.shape)
        self._names = {g.slots[s].name: s for s in g.inputs}
        self._outputs: list[np.ndarray] = []
        # The llvm fast path: after one checked run, launches call the native entry on data pointers.
        # Inputs are checked by set_input, outputs are allocated here and intermediates are planned,
        # so the per-call checks (about 6 us a launch) would only repeat what is known.
        self._entries: list[tuple[Callable[..., int], tuple[int, ...], list[int], tuple[int, ...] | None]] | None = None
        self._pointers: list[int] = []

    @property
    def input_names(self) -> list[str]:
        """The model's inputs, in order."""
        return [self.lib.graph.slots[s].name for s in self.lib.graph.inputs]

    @property
    def num_outputs(self) -> int:
        """How many outputs `run` produces."""
        return len(self.lib.graph.outputs)

    @property
    def planned_bytes(self) -> int:
        """The bytes of this executor's intermediate buffers (the planned peak, outputs aside)."""
        return self.lib.planned_bytes

    def set_input(self, name: str, value: Any) -> None:
        """Binds input `name`; checked against its dtype and shape.

        Raises:
            ExecutorError: for an unknown name, or an array of another dtype or shape.
        """
        s = self._names.get(name)
        if s is None:
            raise ExecutorError(f"model has no input {name!r}; its inputs are {self.input_names}")
        slot = self.lib.graph.slots[s]
        arr = value if isinstance(value, self._xp.ndarray) else np.asarray(value)
        if arr.dtype != numpy_dtype(slot.dtype):
            raise ExecutorError(f"input {name!r}: expected dtype {slot.dtype}, got {arr.dtype}")
        if arr.shape != slot.shape:
            raise ExecutorError(f"input {name!r}: expected shape {slot.shape}, got {arr.shape}")
        # cupy arrays have no writeable or aligned flags
        unfit = isinstance(arr, np.ndarray) and not (arr.flags.writeable and arr.flags.aligned)
        if not isinstance(arr, self._xp.ndarray) or not arr.flags.c_contiguous or unfit:
            arr = self._xp.put(arr)
        self._values[s] = arr

    def run(self, **inputs: Any) -> None:
        """Runs every launch in order (after binding `inputs`, if given)."""
        for name, value in inputs.items():
            self.set_input(name, value)
        g = self.lib.graph
        missing = [g.slots[s].name for s in g.inputs if self._values[s] is None]
        if missing:
            raise ExecutorError(f"inputs not set: {missing}; set them with set_input(name, array)")
        values = list(self._values)
        # inputs that overlap (the same array given for two inputs) go as copies: kernel pointers are noalias
        for n, s in enumerate(g.inputs):
            if any(self._xp.overlaps(values[s], values[t]) for t in g.inputs[:n]):
                values[s] = values[s].copy()
        fresh: dict[int, np.ndarray] = {}
        for s, slot in enumerate(g.slots):
            if slot.kind == "output":
                fresh[s] = values[s] = self._xp.empty(slot.shape, numpy_dtype(slot.dtype))
        if self._entries is not None:
            self._run_entries(values)
        else:
            self._run_checked(values)
        # an output that is an input, a constant or another output's value is returned as a copy
        seen: set[int] = set()
        outs = []
        for s in g.outputs:
            v = values[s]
            assert v is not None
            outs.append(v if s in fresh and s not in seen else v.copy())
            seen.add(s)
        self._outputs = outs

    def _run_checked(self, values: list[Any]) -> None:
        g = self.lib.graph
        entries = []
        for launch in g.launches:
            slots = (*launch.inputs, *launch.outputs)
            # a value passed twice (add(x, x)) goes the second time as a copy: kernel pointers are noalias
            args = [values[s] if s not in slots[:n] else values[s].copy() for n, s in enumerate(slots)]
            kernel = self.lib.kernels[launch.kernel]
            kernel(*args)
            if isinstance(self._xp, _Host) and len(set(slots)) == len(slots):
                entries.append((kernel.entry(), slots, kernel.check(*args)))
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

    def _run_entries(self, values: list[Any]) -> None:
        g = self.lib.graph
        pointers = list(self._pointers)
        for s in (*g.inputs, *g.outputs):
            if g.slots[s].kind in ("input", "output"):
                pointers[s] = values[s].ctypes.data
        for (entry, slots, sizes, args), launch in zip(self._entries or (), g.launches, strict=True):
            if entry(*(args if args is not None else (*[pointers[s] for s in slots], *sizes))):
                self.lib.kernels[launch.kernel].out_of_memory(sizes)

    def get_output(self, index: int) -> np.ndarray:
        """Output `index` of the last run."""
        if not self._outputs:
            raise ExecutorError("get_output before run()")
        if not 0 <= index < len(self._outputs):
            raise ExecutorError(f"output index {index} out of range: the model has {len(self._outputs)}")
        return self._outputs[index]

    def __call__(self, *args: Any, **inputs: Any) -> np.ndarray | tuple[np.ndarray, ...]:
        """Runs on inputs given by position or name; returns the output (a tuple for several)."""
        if len(args) > len(self.input_names):
            raise ExecutorError(f"model takes {len(self.input_names)} inputs, got {len(args)} positional")
        named: Mapping[str, Any] = {**dict(zip(self.input_names, args, strict=False)), **inputs}
        self.run(**named)
        return self._outputs[0] if len(self._outputs) == 1 else tuple(self._outputs)


def _aligned(nbytes: int) -> np.ndarray:
    raw = np.empty(nbytes + _ALIGN, np.uint8)
    offset = (-raw.ctypes.data) % _ALIGN
    return raw[offset: offset + nbytes]
