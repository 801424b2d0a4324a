"""The graph executor: runs a `Library`'s kernel launches over its planned buffers.

Outputs get fresh arrays on every run, so a later run never overwrites what
an earlier one returned. The graph, the library and its file format live in
`kiln.runtime.library`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from kiln.runtime.library import ExecutorError, Library
from kiln.runtime.module import numpy_dtype

_ALIGN = 64


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
