"""A compiled model as data: its graph (slots, launches, storage plan), its kernels, and its file format.

A `Graph` is what `relay.build` produces: slots (one per tensor value: an
input, a constant, an intermediate or an output), kernel launches reading and
writing slots, and a storage plan for the intermediates. The plan reuses a
buffer as soon as the last launch reading its previous value has run (best
fit among free buffers of sufficient size), so the peak memory is the sum of
the buffers, not of the intermediates.

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
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np

from kiln.errors import KilnError
from kiln.runtime.module import Module, numpy_dtype
from kiln.target import Target
from kiln.tir import expr as tx
from kiln.tir.stmt import Evaluate, PrimFunc
from kiln.tir.stmt import buffer as tir_buffer

if TYPE_CHECKING:
    from kiln.runtime.executor import GraphExecutor

_MAGIC = b"KILNLIB1"


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
        from kiln.runtime.executor import GraphExecutor  # the executor imports this module

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
