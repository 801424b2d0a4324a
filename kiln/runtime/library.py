"""A compiled model as data: its graph (slots, launches, storage plan), its kernels, and its file format.

A `Graph` is what `relay.build` produces: slots (one per tensor value: an
input, a constant, an intermediate or an output), kernel launches reading and
writing slots, and a storage plan for the intermediates. The plan reuses a
buffer as soon as the last launch reading its previous value has run (best
fit among free buffers of sufficient size), so the peak memory is the sum of
the buffers, not of the intermediates.

`Library.export(path)` writes one file: a header (magic with the format
version, length and sha256 of the payload, and an HMAC-SHA256 tag of it under
the user's secret key, `kiln.runtime.trust`), then the JSON graph, every
kernel's code (a CPU kernel's object code; a CUDA kernel's CUBIN, CUDA C and
launch table, `kiln.runtime.cuda_library`) and the constants. A library is
native code, so `load(path)` checks all of it before it links or loads any
code: a truncated or corrupt file raises `LibraryFormatError`; a file whose
tag does not verify (not written by this user's kiln, or edited since, even
with its sha256 recomputed) raises `LibraryTrustError`, unless the user opts
in with `load(path, trust=True)`. Trusted or not, every header field is then
validated: types, sizes and indices; each launch's slots against its
kernel's parameters; on a CPU library, those parameters against the signature
compiled into the kernel's object code (`kiln_sig_<name>`, read from its ELF
symbol table), the object code itself (an ELF object for this machine calling
only allow-listed symbols, `kiln.runtime.linker.check_object`) and the
target's CPU features against this CPU; on a cuda library, each kernel's
launch table and its CUBIN (`cuda_library`), and the current GPU's
architecture; the constants against their slots. See SECURITY.md.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import re
import struct
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np

from kiln.errors import KilnError
from kiln.ir.types import Dim, SumDim, SymDim, dim_names, dim_subst, dim_value, parse_dim
from kiln.runtime import linker
from kiln.runtime import trust as _trust
from kiln.runtime.module import Module, dim_text, numpy_dtype
from kiln.target import Target, TDeviceType
from kiln.tir import expr as tx
from kiln.tir.dims import dim_expr
from kiln.tir.stmt import Evaluate, PrimFunc
from kiln.tir.stmt import buffer as tir_buffer

if TYPE_CHECKING:
    from kiln.runtime.executor import GraphExecutor

_MAGIC = b"KILNLIB2"  # 2: authenticated (an HMAC tag after the sha256)
_OLD_MAGICS = (b"KILNLIB1",)
_FIXED = len(_MAGIC) + 8 + 32 + _trust.TAG_BYTES  # magic, payload length, sha256, HMAC tag


class ExecutorError(KilnError, ValueError):
    """Inputs that do not fit the compiled model (name, shape, dtype), or a misused executor."""


class LibraryFormatError(KilnError, ValueError):
    """A library file that is not one, is truncated, or was altered."""


class LibraryTrustError(LibraryFormatError):
    """A library file that this user's kiln did not write (or that was altered since): its HMAC tag
    does not verify under the user's secret key, so its code is not run."""


@attrs.frozen
class Slot:
    """One tensor value of the graph."""

    shape: tuple[Dim, ...]  # ints, or symbolic dims (`n`, `2*n`) in a graph built for any size
    dtype: str
    kind: str  # "input", "const", "temp" or "output"
    name: str = ""
    storage: int = -1  # for "temp": the planned buffer

    @property
    def nbytes(self) -> int:
        """The bytes of the value (its shape must be static)."""
        return math.prod(self.dims) * numpy_dtype(self.dtype).itemsize

    @property
    def is_static(self) -> bool:
        return all(isinstance(d, int) for d in self.shape)

    @property
    def text(self) -> str:
        """Its dtype and shape as messages and pictures write them: `float32[n, 128]`."""
        return f"{self.dtype}[{', '.join(map(str, self.shape))}]"

    @property
    def dims(self) -> tuple[int, ...]:
        """The shape of a static slot (a graph specialized to sizes has only those)."""
        if not self.is_static:
            raise ExecutorError(f"slot {self.name!r} has the symbolic shape {self.shape}: specialize the graph first")
        return self.shape  # type: ignore[return-value]

    def concrete(self, env: Mapping[str, int]) -> Slot:
        """This slot with its symbolic dims at the values of `env`."""
        return self if self.is_static else attrs.evolve(self, shape=tuple(dim_value(d, env) for d in self.shape))


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
    # what the ops assumed of the sizes, each (small, large, what): small <= large once the sizes are known
    # (a slice to `s` of a 512-row table: s <= 512); `specialize` checks them
    checks: list[tuple[Dim, Dim, str]] = attrs.field(factory=list)
    _symbols: tuple[str, ...] | None = attrs.field(default=None, init=False, repr=False, eq=False)

    @property
    def symbols(self) -> tuple[str, ...]:
        """The size variables of the slots' shapes, sorted (none for a graph of static shapes)."""
        if self._symbols is None:  # (asked on every run; slots change only in their storage once built)
            self._symbols = tuple(sorted({name for slot in self.slots for d in slot.shape for name in dim_names(d)}))
        return self._symbols

    def specialize(self, env: Mapping[str, int], where: Mapping[str, str] | None = None) -> Graph:
        """This graph with every size variable at its value in `env`, its memory planned for those sizes.

        Raises:
            ExecutorError: sizes that break what an op assumed of them (`checks`), or make a dim negative;
                the message says where each size came from (`where`: the input dim, `x.shape[0]`).
        """
        came = " (" + ", ".join(f"{n} from input {w}" for n, w in where.items()) + ")" if where else ""
        for small, large, what in self.checks:
            if dim_value(small, env) > dim_value(large, env):
                names = sorted({*dim_names(small), *dim_names(large)})
                raise ExecutorError(f"{what} needs {small} <= {large}, which the sizes "
                                    + ", ".join(f"{n} = {env[n]}" for n in names) + f" break{came}")
        slots = [slot.concrete(env) for slot in self.slots]
        for slot, sized in zip(self.slots, slots, strict=True):
            if any(d < 0 for d in sized.dims):
                raise ExecutorError(f"the value {slot.name!r} of shape ({', '.join(map(str, slot.shape))}) has a "
                                    f"negative dim at the sizes {dict(env)}{came}")
        graph = Graph(slots, self.launches, self.inputs, self.outputs, self.constants)
        graph.plan_memory()
        return graph

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

    def __init__(self, graph: Graph, kernels: Sequence[Any], target: Target, cache_key: str | None = None,
                 variants: Sequence[tuple[dict[str, int], Graph]] = (), output_names: Sequence[str] = ()) -> None:
        self.graph = graph
        # the outputs' names: an ONNX model's, else output_0, output_1, ...
        self.output_names = list(output_names) or _default_output_names(len(graph.outputs))
        self.kernels = list(kernels)
        self.target = target
        self.cache_key = cache_key  # the build-cache key it was stored under (`library_cache`), if any
        # fast paths of a graph of symbolic shapes (relay.build's specialize=): sizes -> the graph built with
        # those sizes fixed (static, unless it fixes only some of them)
        self.variants = list(variants)

    def variant(self, sizes: Mapping[str, int]) -> Graph | None:
        """The graph built for these sizes (each size it fixes has its value here), if any."""
        for bound, graph in self.variants:
            if all(sizes.get(name) == value for name, value in bound.items()):
                return graph
        return None

    @property
    def planned_bytes(self) -> int:
        """The bytes of the intermediate buffers after memory planning."""
        return sum(self.graph.storage_sizes)

    def draw(self, path: str | Path | None = None, profile: Any = None, engine: str = "auto") -> str:
        """The fused graph as a self-contained SVG (`kiln.runtime.draw`): a box per launch with the ops it fuses,
        edges with dtypes and shapes, each box shaded by its share of the time when `profile` (what
        `executor.profile()` returns) is given; laid out by graphviz's dot where it is installed
        (`engine`: "auto", "graphviz" or "kiln"). Written to `path` when one is given; returned either way."""
        from kiln.runtime.draw import graph_svg

        svg = graph_svg(self, profile, engine)
        if path is not None:
            Path(path).write_text(svg)
        return svg

    def get_source(self, kind: str = "ll") -> str:
        """Every kernel's code of one kind, each after a comment line naming it: "tir" (loop IR), "ll"
        (LLVM IR) or "asm" for a CPU library, "cuda" (CUDA C) or "ptx" for a GPU one.

        Raises:
            ValueError: a kind the kernels do not have; KilnError: "ll" / "asm" of a library loaded from a
                file (it holds object code).
        """
        comment = {"ll": ";", "asm": "#", "tir": "#"}.get(kind, "//")
        return "\n".join(f"{comment} kernel {k.name}\n{k.get_source(kind)}" for k in self.kernels)

    def __repr__(self) -> str:
        g = self.graph

        def value(s: int, name: str) -> str:
            return f"{name}: {g.slots[s].text}"

        memory = "memory planned per size" if g.symbols else f"{format_bytes(self.planned_bytes)} of buffers planned"
        more = f", {len(self.variants)} specialized variant(s)" if self.variants else ""
        return (f"<kiln.Library for {self.target.summary()}: {len(self.kernels)} kernels, {len(g.launches)} "
                f"launches, {memory}{more}; inputs {', '.join(value(s, g.slots[s].name) for s in g.inputs)}; "
                f"outputs {', '.join(value(s, n) for n, s in zip(self.output_names, g.outputs, strict=True))}>")

    def create_executor(self, cuda_graph: bool = False) -> GraphExecutor:
        """A `GraphExecutor` of this library (`cuda_graph`: replay a cuda library's launches as one CUDA graph)."""
        from kiln.runtime.executor import GraphExecutor  # the executor imports this module

        return GraphExecutor(self, cuda_graph=cuda_graph)

    def export(self, path: str | Path, cache_key: str | None = None) -> None:
        """Writes the library (graph, kernels' code, constants) to one file that `load` reads back.

        A CPU kernel is stored as its object code; a CUDA kernel as its CUBIN, its CUDA C and its
        launch table (`kiln.runtime.cuda_library`). `cache_key` is stored inside the signed file (the
        build cache checks that a file it finds under a key was written for that key).

        Raises:
            ExecutorError: for a target whose device kiln cannot export for, or a CUDA kernel whose
                launch table uses expressions other than integer arithmetic of its sizes.
        """
        from kiln.runtime import cuda_library  # it imports this module

        device = self.target.kind.get_attr(TDeviceType)
        if device not in ("cpu", "cuda"):
            raise ExecutorError(f"export writes CPU and CUDA libraries; this one is for {self.target}")
        blobs: list[bytes] = []

        def blob(data: bytes) -> int:
            blobs.append(data)
            return len(blobs) - 1

        kernels = []
        for m in self.kernels:
            if device == "cuda":
                kernels.append(cuda_library.kernel_entry(m, param_entries(m.func), blob))
            else:
                kernels.append({"name": m.name, "params": param_entries(m.func), "object": blob(m.object_code)})
        stored: dict[bytes, int] = {}  # a constant that several graphs hold (specialize's variants) is stored once

        def array(arr: np.ndarray) -> int:
            buf = io.BytesIO()
            if arr.dtype == numpy_dtype("bfloat16"):
                arr = arr.view(np.uint16)  # .npy has no bfloat16: its bits, read back as the slot's dtype
            np.save(buf, arr, allow_pickle=False)
            data = buf.getvalue()
            key = hashlib.sha256(data).digest()
            if key not in stored:
                stored[key] = blob(data)
            return stored[key]

        header: dict[str, Any] = {"target": str(self.target), **_graph_entry(self.graph, array)}
        if self.variants:
            header["variants"] = [{"sizes": dict(sizes), **_graph_entry(g, array)} for sizes, g in self.variants]
        header.update(kernels=kernels, blobs=[len(b) for b in blobs])
        if cache_key is not None:
            header["cache_key"] = cache_key
        if self.output_names != _default_output_names(len(self.graph.outputs)):
            header["output_names"] = self.output_names  # (a model's own names)
        head = json.dumps(header).encode()
        payload = struct.pack("<Q", len(head)) + head + b"".join(blobs)
        digest = hashlib.sha256(payload).digest()
        tag = _trust.sign(_MAGIC + payload)
        Path(path).write_bytes(_MAGIC + struct.pack("<Q", len(payload)) + digest + tag + payload)


def _default_output_names(count: int) -> list[str]:
    """The names of outputs a model does not name: output_0, output_1, ..."""
    return [f"output_{i}" for i in range(count)]


def format_bytes(n: int) -> str:
    """`n` bytes in the largest binary unit that keeps it at least 1 ("1.5 GiB", "12 bytes")."""
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n} bytes"


def is_library_file(path: str | Path) -> bool:
    """Whether the file starts as a library file does (of this format or an older one): what `load` reads,
    as opposed to a model. An unreadable file is not one."""
    try:
        with open(path, "rb") as f:
            head = f.read(len(_MAGIC))
    except OSError:
        return False
    return head == _MAGIC or head in _OLD_MAGICS


def _graph_entry(graph: Graph, array: Callable[[np.ndarray], int]) -> dict[str, Any]:
    """How a header stores a graph: slots (symbolic dims as `str(dim)`), launches, inputs, outputs, storage
    sizes, and each constant as the blob `array` stores it in."""
    entry = {
        "slots": [{**attrs.asdict(s), "shape": [d if isinstance(d, int) else str(d) for d in s.shape]}
                  for s in graph.slots],
        "launches": [attrs.asdict(launch) for launch in graph.launches],
        "inputs": graph.inputs, "outputs": graph.outputs, "storage_sizes": graph.storage_sizes,
        "constants": {str(s): array(arr) for s, arr in graph.constants.items()},
    }
    if graph.checks:  # (a graph of static shapes has none)
        entry["checks"] = [[str(small), str(large), what] for small, large, what in graph.checks]
    return entry


def param_entries(func: PrimFunc) -> list[dict[str, Any]]:
    """How a header stores a kernel's parameters: name, dtype, and shape (ints; names of size vars, or
    their products as `2*n*s`)."""
    return [{"name": b.name, "dtype": b.dtype, "shape": [dim_text(d) for d in b.shape]} for b in func.params]


# -- loading: authenticate, then validate every header field before any code is linked ---------------

DTYPES = frozenset(["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                    "float16", "bfloat16", "float32", "float64"])
_SLOT_KINDS = ("input", "const", "temp", "output")
_GRAPH_KEYS = ("slots", "launches", "inputs", "outputs", "storage_sizes", "constants")
_HEADER_KEYS = {"target", *_GRAPH_KEYS, "kernels", "blobs"}
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")

def check_host_target(target: Target) -> None:
    """Refuses an llvm target whose code this CPU cannot run: features its `-mattr` enables, or its
    `-mcpu` implies (for the CPU names kiln knows), that the host lacks.

    Raises:
        LibraryFormatError: naming the missing features.
    """
    from kiln.target import detect

    missing = detect.missing_features(target)
    if missing:
        raise LibraryFormatError(
            f"compiled for {target}, which needs CPU feature(s) {', '.join(missing)} that this CPU "
            f"({detect.host_cpu().name}) lacks; compile the model again on this machine (or for a target it supports)"
        )


class HeaderChecker:
    """Type and range checks of a decoded header; every failure is a LibraryFormatError naming the field."""

    def __init__(self, where: str) -> None:
        self.where = where

    def fail(self, field: str, message: str) -> LibraryFormatError:
        return LibraryFormatError(f"{self.where}: header field {field}: {message}")

    def of(self, value: Any, kind: type | tuple[type, ...], field: str) -> Any:
        # bool is an int in Python; a header never means True for a size or an index
        if not isinstance(value, kind) or (isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple)
                                                                                     else (kind,))):
            want = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
            raise self.fail(field, f"expected {want}, got {type(value).__name__} {value!r:.60}")
        return value

    def dict_(self, value: Any, keys: set[str], field: str) -> dict[str, Any]:
        self.of(value, dict, field)
        if set(value) != keys:
            raise self.fail(field, f"expected keys {sorted(keys)}, got {sorted(map(str, value))}")
        return value  # type: ignore[no-any-return]

    def list_(self, value: Any, field: str) -> list[Any]:
        return self.of(value, list, field)  # type: ignore[no-any-return]

    def size(self, value: Any, field: str) -> int:
        if self.of(value, int, field) < 0:
            raise self.fail(field, f"negative size {value}")
        return int(value)

    def index(self, value: Any, count: int, field: str, what: str) -> int:
        if not 0 <= self.of(value, int, field) < count:
            raise self.fail(field, f"{what} index {value} out of range (there are {count})")
        return int(value)

    def name(self, value: Any, field: str) -> str:
        if not _IDENT.fullmatch(self.of(value, str, field)):
            raise self.fail(field, f"{value!r:.60} is not a name")
        return str(value)

    def dtype(self, value: Any, field: str) -> str:
        if self.of(value, str, field) not in DTYPES:
            raise self.fail(field, f"unknown dtype {value!r:.60}")
        return str(value)


def _decode_file(data: bytes, where: str, trusted: bool) -> tuple[dict[str, Any], list[bytes]]:
    """The header and blobs of a library file after its checksum and (unless `trusted`) its HMAC."""
    if any(data.startswith(m) for m in _OLD_MAGICS):
        raise LibraryFormatError(f"{where}: written by an older kiln (format {data[7:8].decode()}, without "
                                 "authentication); compile the model again with this kiln")
    if len(data) < _FIXED or not data.startswith(_MAGIC):
        raise LibraryFormatError(f"{where}: not a kiln library (bad magic or too short)")
    (length,) = struct.unpack_from("<Q", data, len(_MAGIC))
    digest = data[len(_MAGIC) + 8: len(_MAGIC) + 40]
    tag = data[len(_MAGIC) + 40: _FIXED]
    payload = data[_FIXED:]
    if len(payload) != length:
        raise LibraryFormatError(f"{where}: truncated ({len(payload)} of {length} payload bytes)")
    if hashlib.sha256(payload).digest() != digest:
        raise LibraryFormatError(f"{where}: checksum mismatch; the file was altered or corrupted")
    if not trusted and not _trust.verify(_MAGIC + payload, tag):
        raise LibraryTrustError(
            f"{where}: not written by your kiln, or altered since: its authentication tag does not verify "
            f"under your secret key ({_trust.secret_path()}). A library is native code, so kiln runs only "
            "the ones it wrote. If you trust this file, load it with runtime.load(path, trust=True) "
            "(kiln run --trust); runtime.load(path, trust=True).export(path) re-signs it as yours"
        )
    if len(payload) < 8:
        raise LibraryFormatError(f"{where}: payload of {len(payload)} bytes has no header")
    (head_len,) = struct.unpack_from("<Q", payload, 0)
    if head_len > len(payload) - 8:
        raise LibraryFormatError(f"{where}: header of {head_len} bytes in a {len(payload)}-byte payload")
    try:
        header = json.loads(payload[8: 8 + head_len])
    except (ValueError, RecursionError) as e:  # also UnicodeDecodeError; RecursionError: nested too deep
        raise LibraryFormatError(f"{where}: header is not JSON ({type(e).__name__}: {e})") from e
    c = HeaderChecker(where)
    optional = {k for k in ("cache_key", "variants", "checks", "output_names")
                if isinstance(header, dict) and k in header}
    c.dict_(header, _HEADER_KEYS | optional, "header")
    sizes = [c.size(n, f"blobs[{i}]") for i, n in enumerate(c.list_(header["blobs"], "blobs"))]
    if sum(sizes) != len(payload) - 8 - head_len:
        raise c.fail("blobs", f"sizes add up to {sum(sizes)} bytes, but {len(payload) - 8 - head_len} follow "
                              "the header")
    blobs, pos = [], 8 + head_len
    for n in sizes:
        blobs.append(payload[pos: pos + n])
        pos += n
    return header, blobs


def check_params(c: HeaderChecker, value: Any, field: str) -> list[dict[str, Any]]:
    """The parameters of a header kernel (as `param_entries` writes them), each field checked."""
    params = []
    for j, p in enumerate(c.list_(value, field)):
        pf = f"{field}[{j}]"
        c.dict_(p, {"name", "dtype", "shape"}, pf)
        c.name(p["name"], f"{pf}.name")
        c.dtype(p["dtype"], f"{pf}.dtype")
        for a, d in enumerate(c.list_(p["shape"], f"{pf}.shape")):
            if isinstance(d, str) and not _IDENT.fullmatch(d):
                _dim(c, d, f"{pf}.shape[{a}]")  # a product of sizes
            elif isinstance(d, str):
                c.name(d, f"{pf}.shape[{a}]")
            else:
                c.size(d, f"{pf}.shape[{a}]")
        params.append(p)
    return params


def _load_kernel(c: HeaderChecker, k: Any, i: int, blobs: list[bytes]) -> tuple[str, list[dict[str, Any]], bytes]:
    """(name, params, object code) of header kernel `i`, checked against the signature in its object code."""

    f = f"kernels[{i}]"
    c.dict_(k, {"name", "params", "object"}, f)
    name = c.name(k["name"], f"{f}.name")
    params = check_params(c, k["params"], f"{f}.params")
    obj = blobs[c.index(k["object"], len(blobs), f"{f}.object", "blob")]
    try:
        parsed = linker.check_object(obj, name)
        embedded = parsed.data_of(linker.signature_symbol(name))
    except KilnError as e:  # ObjectFileError, DisallowedSymbolError, UnresolvedSymbolError
        raise LibraryFormatError(f"{c.where}: {e}") from e
    if parsed.defined(linker.kernel_symbol(name)) is None or embedded is None:
        raise LibraryFormatError(f"{c.where}: the object code of kernel {name!r} defines no kernel "
                                 f"{linker.kernel_symbol(name)!r} with its signature; it was not made by kiln")
    declared = linker.signature_text((p["name"], p["dtype"], p["shape"]) for p in params)
    if embedded != declared.encode():
        raise LibraryFormatError(
            f"{c.where}: kernel {name!r}: the header gives its parameters as {declared!r}, but its object code "
            f"was compiled for {embedded.decode(errors='replace')!r}")
    return name, params, obj


def _check_launch(c: HeaderChecker, n: int, launch: Launch, params: list[dict[str, Any]], slots: list[Slot]) -> None:
    """The slots of launch `n` agree in count, dtype and shape with its kernel's parameters."""
    f = f"launches[{n}]"
    args = (*launch.inputs, *launch.outputs)
    if len(args) != len(params):
        raise c.fail(f, f"{len(args)} slots for a kernel of {len(params)} parameters")
    bound: dict[str, Dim] = {}
    for s, p in zip(args, params, strict=True):
        slot = slots[s]
        what = f"slot {s} for parameter {p['name']!r}"
        if slot.dtype != p["dtype"]:
            raise c.fail(f, f"{what}: dtype {slot.dtype}, the kernel takes {p['dtype']}")
        if len(slot.shape) != len(p["shape"]) or any(
                isinstance(d, int) and d != g for d, g in zip(p["shape"], slot.shape, strict=False)):
            raise c.fail(f, f"{what}: shape {list(slot.shape)}, the kernel takes {p['shape']}")
        for d, g in zip(p["shape"], slot.shape, strict=True):
            if isinstance(d, str) and bound.setdefault(d, g) != g:
                raise c.fail(f, f"{what}: size {d} is {bound[d]} elsewhere but {g} here")
    for s in launch.outputs:
        if slots[s].kind not in ("temp", "output"):
            raise c.fail(f, f"writes slot {s}, which is an {slots[s].kind}")


def _graph(c: HeaderChecker, header: dict[str, Any], blobs: list[bytes], params: list[list[dict[str, Any]]]) -> Graph:
    """The checked graph of a header: slots, storage, launches against kernels, inputs, outputs, constants."""
    storage = [c.size(n, f"storage_sizes[{i}]") for i, n in enumerate(c.list_(header["storage_sizes"],
                                                                                 "storage_sizes"))]
    slots = []
    for i, s in enumerate(c.list_(header["slots"], "slots")):
        f = f"slots[{i}]"
        c.dict_(s, {"shape", "dtype", "kind", "name", "storage"}, f)
        shape = tuple(_dim(c, d, f"{f}.shape[{a}]") for a, d in enumerate(c.list_(s["shape"], f"{f}.shape")))
        kind = c.of(s["kind"], str, f"{f}.kind")
        if kind not in _SLOT_KINDS:
            raise c.fail(f"{f}.kind", f"expected one of {list(_SLOT_KINDS)}, got {kind!r:.40}")
        slot = Slot(shape, c.dtype(s["dtype"], f"{f}.dtype"), kind, c.of(s["name"], str, f"{f}.name"),
                    c.of(s["storage"], int, f"{f}.storage"))
        if kind == "temp" and slot.is_static:  # a symbolic one is planned at run time, per size
            b = c.index(slot.storage, len(storage), f"{f}.storage", "storage buffer")
            nbytes = slot.nbytes
            if storage[b] < nbytes:
                raise c.fail(f, f"needs {nbytes} bytes, but its storage buffer {b} has {storage[b]}")
        slots.append(slot)
    launches = []
    for n, x in enumerate(c.list_(header["launches"], "launches")):
        f = f"launches[{n}]"
        c.dict_(x, {"kernel", "inputs", "outputs"}, f)
        k = c.index(x["kernel"], len(params), f"{f}.kernel", "kernel")
        ins, outs = (tuple(c.index(s, len(slots), f"{f}.{key}[{j}]", "slot")
                           for j, s in enumerate(c.list_(x[key], f"{f}.{key}"))) for key in ("inputs", "outputs"))
        launch = Launch(k, ins, outs)
        _check_launch(c, n, launch, params[k], slots)
        launches.append(launch)
    inputs = [c.index(s, len(slots), f"inputs[{j}]", "slot") for j, s in enumerate(c.list_(header["inputs"], "inputs"))]
    outputs = [c.index(s, len(slots), f"outputs[{j}]", "slot")
               for j, s in enumerate(c.list_(header["outputs"], "outputs"))]
    if sorted(inputs) != [s for s, slot in enumerate(slots) if slot.kind == "input"] or \
            len({slots[s].name for s in inputs}) != len(inputs):
        raise c.fail("inputs", "must list every input slot once, with distinct names")
    constants = {}
    for key, b in c.of(header["constants"], dict, "constants").items():
        f = f"constants[{key!r:.20}]"
        if not re.fullmatch(r"\d{1,9}", key) or int(key) >= len(slots) or slots[int(key)].kind != "const":
            raise c.fail(f, "not the index of a const slot")
        slot = slots[int(key)]
        try:
            arr = np.load(io.BytesIO(blobs[c.index(b, len(blobs), f, "blob")]), allow_pickle=False)
        except Exception as e:  # numpy's .npy parser raises many kinds (ValueError, SyntaxError, TokenError...)
            raise c.fail(f, f"not a numpy array ({type(e).__name__}: {e})") from e
        if slot.dtype == "bfloat16" and isinstance(arr, np.ndarray) and arr.dtype == np.uint16:
            arr = arr.view(numpy_dtype("bfloat16"))
        if not isinstance(arr, np.ndarray) or arr.shape != slot.shape or arr.dtype != numpy_dtype(slot.dtype):
            raise c.fail(f, f"array {getattr(arr, 'dtype', '?')}{getattr(arr, 'shape', '')}, its slot is "
                            f"{slot.dtype}{slot.shape}")
        constants[int(key)] = arr
    if set(constants) != {s for s, slot in enumerate(slots) if slot.kind == "const"}:
        raise c.fail("constants", "every const slot needs its array")
    checks = []
    for j, check in enumerate(c.list_(header.get("checks", []), "checks")):  # (none before kiln wrote them)
        f = f"checks[{j}]"
        if not isinstance(check, list) or len(check) != 3 or not isinstance(check[2], str) or len(check[2]) > 1000:
            raise c.fail(f, "expected [small, large, what]: two dims and a text")
        checks.append((_dim(c, check[0], f"{f}[0]"), _dim(c, check[1], f"{f}[1]"), check[2]))
    return Graph(slots, launches, inputs, outputs, constants, storage, checks)


def _dim(c: HeaderChecker, d: Any, field: str) -> Dim:
    """A slot's dim: a size, or a symbolic dim as `str(dim)` writes it (`n`, `2*n*s`)."""
    if not isinstance(d, str):
        return c.size(d, field)
    try:
        dim = parse_dim(d[:200])
    except ValueError:
        raise c.fail(field, f"expected a size or a symbolic dim, got {d!r:.40}") from None
    if not isinstance(dim, (int, SymDim, SumDim)):
        raise c.fail(field, f"expected a size or a symbolic dim, got {d!r:.40}")
    return dim


def signature(name: str, params: list[dict[str, Any]], size_dtypes: dict[str, str] | None = None) -> PrimFunc:
    """A PrimFunc with the kernel's parameters and an empty body: the calling convention of loaded code.

    Size vars are int32 unless `size_dtypes` gives their dtype by name.
    """
    size_vars: dict[str, tx.Var] = {}
    dtypes = size_dtypes or {}
    bufs = []
    def size(name: str) -> tx.Var:
        return size_vars.setdefault(name, tx.Var(name, dtypes.get(name, "int32")))

    def dim(d: int | str) -> tx.ExprLike:
        if isinstance(d, int) or _IDENT.fullmatch(d):
            return d if isinstance(d, int) else size(d)
        return dim_expr(parse_dim(d), size)  # a sum or product of sizes, checked by check_params

    for p in params:
        bufs.append(tir_buffer(p["name"], [dim(d) for d in p["shape"]], p["dtype"]))
    return PrimFunc(name, bufs, Evaluate(tx.const(0)))


def load(path: str | Path, trust: bool = False) -> Library:
    """Reads a file written by `Library.export`, without compiling anything (a cuda library needs neither
    NVRTC nor, to load, a GPU).

    In order, before any code is linked: the magic and length, the sha256 (accidents), the HMAC tag
    under this user's secret (a file not written by this user's kiln), then every header field: types,
    sizes, indices, launches against their kernels' parameters; for CPU kernels, those parameters
    against the signature compiled into each kernel's object code, the object code itself (ELF for this
    machine, allow-listed symbols) and the target's CPU features against this CPU; for CUDA kernels,
    their launch tables and CUBINs (`cuda_library.load_kernel`) and, when there is a GPU, its
    architecture against theirs; constants against their slots.

    Args:
        path: the file.
        trust: skip the HMAC check only (for a file from elsewhere that you trust: its code runs with
            your rights); the structural checks still apply.

    Raises:
        LibraryTrustError: for a file whose tag does not verify (not written by this user's kiln, or altered).
        LibraryFormatError: for a file that is not a kiln library, is truncated, fails its checksum, or
            whose header is inconsistent with itself or its kernels; for CUDA kernels the current GPU
            cannot run (naming the library, the kernel and both architectures).
        TrustSetupError: when the secret key file is unsafe or cannot be created.
    """
    data = Path(path).read_bytes()
    where = f"kiln library {str(path)!r}"
    header, blobs = _decode_file(data, where, trust)
    c = HeaderChecker(where)
    try:
        target = Target(c.of(header["target"], str, "target"))
    except KilnError as e:
        raise c.fail("target", str(e)) from e
    device = target.kind.get_attr(TDeviceType)
    entries = c.list_(header["kernels"], "kernels")
    modules: list[Any]
    if device == "cuda":
        from kiln.runtime import cuda_library  # it imports this module

        loaded = [cuda_library.load_kernel(c, k, i, blobs, target) for i, k in enumerate(entries)]
        graph = _graph(c, header, blobs, [params for _, params in loaded])
        cuda_library.check_device(c, [m for m, _ in loaded])
        modules = [m for m, _ in loaded]
    elif device == "cpu":
        try:
            check_host_target(target)
        except LibraryFormatError as e:
            raise LibraryFormatError(f"{where}: {e}") from e
        kernels = [_load_kernel(c, k, i, blobs) for i, k in enumerate(entries)]
        graph = _graph(c, header, blobs, [params for _, params, _ in kernels])
        modules = [Module(signature(name, params), target, obj, []) for name, params, obj in kernels]
    else:
        raise c.fail("target", f"{target} runs on device type {device!r}; kiln loads CPU and CUDA libraries")
    key = header.get("cache_key")
    variants = _variants(c, header, blobs, graph, [param_entries(m.func) for m in modules])
    names = c.list_(header.get("output_names", []), "output_names")
    if names and (len(names) != len(graph.outputs) or len(set(map(str, names))) != len(names) or not all(
            isinstance(n, str) and 0 < len(n) <= 200 for n in names)):
        raise c.fail("output_names", f"expected {len(graph.outputs)} distinct names (texts of 1 to 200 characters)")
    return Library(graph, modules, target, c.of(key, str, "cache_key") if key is not None else None, variants,
                   names)


def _variants(c: HeaderChecker, header: dict[str, Any], blobs: list[bytes], graph: Graph,
              params: list[list[dict[str, Any]]]) -> list[tuple[dict[str, int], Graph]]:
    """The checked variants of a header's graph: each a graph whose inputs are the symbolic graph's with
    the variant's sizes put in (static, unless the variant fixes only some of the sizes)."""
    out = []
    for i, v in enumerate(c.list_(header.get("variants", []), "variants")):
        f = f"variants[{i}]"
        c.dict_(v, {"sizes", *_GRAPH_KEYS} | ({"checks"} & set(c.of(v, dict, f))), f)
        sizes = {c.name(k, f"{f}.sizes"): c.size(n, f"{f}.sizes[{k!r:.20}]")
                 for k, n in c.of(v["sizes"], dict, f"{f}.sizes").items()}
        static = _graph(c, v, blobs, params)
        want = [(graph.slots[s].name, graph.slots[s].dtype, tuple(dim_subst(d, sizes) for d in graph.slots[s].shape))
                for s in graph.inputs]
        got = [(static.slots[s].name, static.slots[s].dtype, static.slots[s].shape) for s in static.inputs]
        if got != want:
            raise c.fail(f, f"its inputs {got} are not the library's inputs {want} at the sizes {sizes}")
        out.append((sizes, static))
    return out
