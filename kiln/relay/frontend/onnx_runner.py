"""`OnnxRunner`: an ONNX model compiled and run, with every graph input given at run time.

kiln compiles static shapes. When a value that decides a shape (a Reshape's
shape, Slice's starts, TopK's k, the axes of a reduction, ...) is a graph input
rather than an initializer, the runner specializes on it: the import reports
which inputs it needs as values (`OnnxValueNeededError`), and each call looks
up the kernel set compiled for the values it is given, compiling one on the
first call with new values. Looking up by the values' bytes is the guard: a
call never runs kernels compiled for other values. The first specialization is
said once in a log line (logger "kiln"); the runner keeps the most recent
`max_specializations` kernel sets.

```python
runner = relay.frontend.OnnxRunner("model.onnx")
out = runner(x=x, shape=np.array([2, -1]))   # the shape input decides the output's shape
```
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import numpy as np

from kiln.relay.frontend.onnx import OnnxImportError, OnnxValueNeededError, _shown, from_onnx, load_model

_LOG = logging.getLogger("kiln")

Key = tuple[tuple[str, str, tuple[int, ...], bytes], ...]


class OnnxRunner:
    """Imports, compiles and runs an ONNX model; inputs whose values decide shapes are specialized on.

    Args:
        model: an `onnx.ModelProto`, the path of a .onnx file, or its bytes.
        target: where to compile (default: the host CPU).
        shape, dtype: as for `from_onnx`.
        max_specializations: how many kernel sets (one per distinct value of the inputs that
            decide shapes) are kept; the least recently used goes first.

    Raises:
        OnnxImportError: when the model cannot be imported (with no input values involved).
    """

    def __init__(
        self,
        model: Any,
        target: Any = "llvm",
        shape: Mapping[str, Any] | None = None,
        dtype: Any = None,
        max_specializations: int = 64,
    ) -> None:
        self.model = load_model(model)
        self.target = target
        self._shape = shape
        self._dtype = dtype
        self._max = max(1, max_specializations)
        initializers = {init.name for init in self.model.graph.initializer}
        self.input_names = [_shown(i.name) for i in self.model.graph.input if i.name not in initializers]
        self.value_inputs: tuple[str, ...] = ()  # the inputs whose values decide shapes
        self._executors: OrderedDict[Key, Any] = OrderedDict()
        self._lock = threading.Lock()
        self._executor(None)

    @property
    def specializations(self) -> int:
        """How many kernel sets are compiled and kept."""
        return len(self._executors)

    def __call__(self, *args: Any, **inputs: Any) -> Any:
        """Runs on inputs given by position (in the model's input order) or by name.

        Returns:
            The output, or a tuple of them when the model has several.
        """
        if len(args) > len(self.input_names):
            raise OnnxImportError(f"the model takes {len(self.input_names)} inputs ({self.input_names}), got "
                                  f"{len(args)} positional")
        named = {**dict(zip(self.input_names, args, strict=False)), **inputs}
        executor = self._executor(named)
        return executor(**{n: v for n, v in named.items() if n not in self.value_inputs})

    def _executor(self, named: Mapping[str, Any] | None) -> Any:
        """The executor for the values that `named` gives the inputs deciding shapes, compiled on first use.

        With `named` None (at construction) it compiles only when no input decides a shape, and
        otherwise learns which ones do.
        """
        from kiln.relay.backend.build_module import build

        with self._lock:
            while True:
                if named is None and self.value_inputs:
                    return None
                missing = [n for n in self.value_inputs if named is not None and n not in named]
                if missing:
                    raise OnnxImportError(f"input(s) {missing} are missing; their values decide shapes (the "
                                          f"model's inputs are {self.input_names})")
                values = {n: np.asarray(named[n]) for n in self.value_inputs} if named is not None else {}
                key = _key(values)
                if key in self._executors:
                    self._executors.move_to_end(key)
                    return self._executors[key]
                try:
                    mod, params = from_onnx(self.model, shape=self._shape, dtype=self._dtype, values=values)
                except OnnxValueNeededError as err:
                    if set(err.names) <= set(self.value_inputs):
                        raise
                    if not self.value_inputs:
                        _LOG.info("the values of ONNX input(s) %s decide shapes: kiln compiles one kernel set per "
                                  "distinct value of them", ", ".join(map(repr, err.names)))
                    self.value_inputs = tuple(dict.fromkeys((*self.value_inputs, *err.names)))
                    continue
                executor = build(mod, target=self.target, params=params).create_executor()
                self._executors[key] = executor
                while len(self._executors) > self._max:
                    self._executors.popitem(last=False)
                return executor


def _key(values: Mapping[str, np.ndarray]) -> Key:
    return tuple((n, a.dtype.str, a.shape, a.tobytes()) for n, a in sorted(values.items()))


__all__ = ["OnnxRunner"]
