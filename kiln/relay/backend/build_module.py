"""`relay.build`: a Relay module to a `runtime.Library` of fused kernels and a planned graph.

The steps: bind `params` as constants; run the optimization passes under the
current `PassContext` (each pass runs only if its opt level is at most the
context's; outside any `with PassContext(...)` relay.build uses opt level 3, as
TVM's `relay.build` is used, so FoldScaleAxis and AlterOpLayout run; the
target is current meanwhile, AlterOpLayout reads it); fuse; compile each
primitive function (structurally equal ones once); walk the main function to
lay out the graph's slots and launches; plan its memory.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import importlib.metadata
import itertools
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from kiln import log
from kiln.errors import KilnError
from kiln.ir.module import IRModule
from kiln.ir.transform import Pass, PassContext, Sequential
from kiln.ir.types import Dim, SumDim, SymDim, TensorType, Type, dim_add, dim_mul, dim_names, dim_subst
from kiln.registry import Op, attr, foreign_registration
from kiln.relay import expr as rx
from kiln.relay import transform as t
from kiln.relay.analysis import structural_hash
from kiln.relay.backend.te_compiler import CompiledKernel, compile_primitive, flat_values, tensor_types
from kiln.relay.printer import astext
from kiln.relay.type_infer import infer_type
from kiln.relay.visitor import ExprMutator, post_order
from kiln.runtime import library_cache
from kiln.runtime.executor import MAX_ELEMENTS
from kiln.runtime.library import Graph, Launch, Library, Slot
from kiln.runtime.module import numpy_dtype
from kiln.target import Target, TDeviceType, detect
from kiln.version import source_digest

_LOG = log.get("relay.build")


class BuildError(KilnError, ValueError):
    """A module relay.build cannot compile (free variables, unsupported constructs, bad params)."""


def build_passes() -> list[Pass]:
    """relay.build's optimization pipeline, in order (each pass is gated by its own opt level)."""
    # ToGraphNormalForm first: fusion and the graph layout see let-bound values as ordinary shared nodes
    return [t.InferType(), t.ToGraphNormalForm(), t.SimplifyInference(), t.FoldConstant(), t.FoldScaleAxis(),
            t.AlterOpLayout(), t.FoldConstant(), t.EliminateCommonSubexpr(), t.DeadCodeElimination(), t.FuseOps(),
            t.InferType()]


class _Bind(ExprMutator):
    """Replaces vars by id with `values`; with `sizes`, puts those sizes into the calls' attrs too (a
    reshape to (n, s, 768) with s = 128 is one to (n, 128, 768))."""

    def __init__(self, values: Mapping[int, rx.Expr], sizes: Mapping[str, int] | None = None) -> None:
        super().__init__()
        self.values = values
        self.sizes = sizes

    def rewrite_var(self, node: rx.Var) -> rx.Expr:
        return self.values.get(id(node), node)

    def rewrite_call(self, node: rx.Call, op: Op | rx.Expr, args: tuple[rx.Expr, ...]) -> rx.Expr:
        if self.sizes and node.attrs is not None:
            bound = node.attrs.with_sizes(self.sizes)
            if bound is not node.attrs:
                return rx.Call(op, args, bound, span=node.span)
        return super().rewrite_call(node, op, args)


def bind_params(func: rx.Function, params: Mapping[str, Any]) -> rx.Function:
    """`func` with the parameters named in `params` replaced by constants of those values."""
    by_name = {p.name_hint: p for p in func.params}
    unknown = sorted(set(params) - set(by_name))
    if unknown:
        raise BuildError(f"params {unknown} are not parameters of main; its parameters are {sorted(by_name)}")
    values: dict[int, rx.Expr] = {}
    for name, value in params.items():
        p = by_name[name]
        arr = np.asarray(value)
        ty = p.checked_type if p.has_type else p.type_annotation
        if isinstance(ty, TensorType) and (tuple(ty.shape) != arr.shape or str(ty.dtype) != str(arr.dtype)):
            raise BuildError(f"param {name!r}: expected {ty}, got an array of shape {arr.shape} and dtype {arr.dtype}")
        values[id(p)] = rx.const(arr)
    body = _Bind(values).visit(func.body)
    return rx.Function([p for p in func.params if id(p) not in values], body, func.ret_type)


def build_context() -> PassContext:
    """The context relay.build's passes run under: the current one, or opt level 3 outside any."""
    return PassContext.current() if PassContext.entered() else PassContext(opt_level=3)


def _main(mod: IRModule | rx.Function, params: Mapping[str, Any] | None) -> IRModule:
    """A module of `mod`'s main alone, typed, with `params` bound as constants."""
    if isinstance(mod, rx.Function):
        mod = IRModule.from_expr(mod)
    func = infer_type(mod["main"])
    if not isinstance(func, rx.Function):
        raise BuildError(f"relay.build: main must be a Function, got {type(func).__name__}")
    if params:
        func = infer_type(bind_params(func, params))
    return IRModule.from_expr(func)


def optimize(mod: IRModule | rx.Function, params: Mapping[str, Any] | None = None,
             target: str | Target | None = None) -> IRModule:
    """`mod` as relay.build compiles it: `params` bound as constants, then `build_passes()` (fused).

    Args:
        mod: an IRModule (its "main") or a Function.
        params: values of main's parameters to bind as constants.
        target: the target the calls are rewritten for (AlterOpLayout); None: the current one, if any.

    Raises:
        BuildError: if main is not a function, or `params` do not match its parameters.
    """
    tgt = Target(target) if isinstance(target, str) else target
    with build_context(), (tgt if tgt is not None else contextlib.nullcontext()):
        return Sequential(build_passes(), name="relay.build")(_main(mod, params))


def optimize_explained(mod: IRModule | rx.Function, params: Mapping[str, Any] | None = None,
                       ) -> tuple[IRModule, t.FusionReport]:
    """`optimize`, and `fusion_report` of the module just before FuseOps: why the groups are what they are."""
    passes = build_passes()
    cut = next(i for i, p in enumerate(passes) if p.info.name == "FuseOps")
    with build_context():
        before = Sequential(passes[:cut], name="relay.build")(_main(mod, params))
        return Sequential(passes[cut:], name="relay.build")(before), t.fusion_report(before)


class _GraphBuilder:
    def __init__(self, target: Target, progress: Callable[[int, int], None] | None) -> None:
        self.target = target
        self.slots: list[Slot] = []
        self.launches: list[Launch] = []
        self.constants: dict[int, np.ndarray] = {}
        self.kernels: list[CompiledKernel] = []
        self.kernel_index: dict[int, int] = {}
        self.named = 0  # launches of every graph built so far: kernel names stay distinct across variants
        self.progress = progress

    def _slot(self, ty: TensorType, kind: str, name: str = "") -> int:
        for d in ty.shape:
            if not isinstance(d, (int, SymDim, SumDim)):
                hint = (f": give its dims (relay.frontend.from_onnx(..., shape={{{name!r}: ...}}), or "
                        f"--shape {name}=D0,D1,... on the command line)") if kind == "input" else ""
                raise BuildError(f"relay.build needs static or symbolic dims; {name or 'a value'} has type {ty}{hint}")
        if any(isinstance(d, (SymDim, SumDim)) for d in ty.shape) and self.target.kind.get_attr(TDeviceType) != "cpu":
            raise BuildError(f"symbolic dims compile for the CPU only so far; {name or 'a value'} has type {ty}")
        static = [d for d in ty.shape if isinstance(d, int)]
        if len(static) == len(ty.shape) and math.prod(static) > MAX_ELEMENTS:  # int32 loop variables: refuse
            what = f"input {name!r}" if kind == "input" else f"the result of {name}" if name else f"a {kind} value"
            raise BuildError(f"{what} has type {ty}: "
                             f"{math.prod(static)} elements, more than the {MAX_ELEMENTS} that kiln's kernels index")
        self.slots.append(Slot(tuple(ty.shape), str(ty.dtype), kind, name))
        return len(self.slots) - 1

    def _temps(self, ty: Type, made_by: str) -> list[int]:
        tys = tensor_types(ty, "relay.build")
        # named for the ops that make them, so that run-time errors (memory) can say which value they mean
        names = [made_by] if len(tys) == 1 else [f"{made_by}[{i}]" for i in range(len(tys))]
        return [self._slot(t, "temp", n) for t, n in zip(tys, names, strict=True)]

    def _kernel(self, fn: rx.Function, n: int) -> tuple[int, list[np.ndarray]]:
        """The index of `fn`'s compiled module among the graph's kernels, and the constants it takes."""
        kernel = compile_primitive(fn, self.target, name=f"fused_{n}")
        idx = self.kernel_index.get(id(kernel.module))
        if idx is None:
            idx = self.kernel_index[id(kernel.module)] = len(self.kernels)
            self.kernels.append(kernel)
        return idx, kernel.constants

    def _input(self, p: rx.Var) -> list[int]:
        if not isinstance(p.checked_type, TensorType):
            raise BuildError(f"input {p.name_hint!r} has type {p.checked_type}; inputs must be tensors")
        return [self._slot(p.checked_type, "input", p.name_hint)]

    def _constant(self, node: rx.Constant) -> list[int]:
        s = self._slot(node.type, "const")
        self.constants[s] = np.array(node.data, copy=True)
        return [s]

    def _launch(self, node: rx.Call, ins: list[int]) -> list[int]:
        """The slots of a call's results, and the launch of its kernel (none for empty results)."""
        outs = self._temps(node.checked_type, _made_by(node))
        if all(self.slots[s].is_static and self.slots[s].nbytes == 0 for s in outs):  # empty: nothing to compute
            for s in outs:  # an empty value holds no data: a constant, so that it needs no buffer
                slot = self.slots[s]
                self.slots[s] = Slot(slot.shape, slot.dtype, "const", slot.name)
                self.constants[s] = np.empty(slot.dims, numpy_dtype(slot.dtype))
            return outs
        fn = node.op if isinstance(node.op, rx.Function) else _wrap(node)
        k, constants = self._kernel(fn, self.named)
        self.named += 1
        const_slots = []
        for c in constants:
            s = self._slot(TensorType(c.shape, str(c.dtype)), "const")
            self.constants[s] = c
            const_slots.append(s)
        self.launches.append(Launch(k, tuple(ins + const_slots), tuple(outs)))
        return outs

    def build(self, func: rx.Function) -> Graph:
        self.slots, self.launches, self.constants = [], [], {}  # a graph of its own; the kernels are shared
        checks = size_checks(func)  # first: a slice that no size fits is named before its kernel compiles
        calls = sum(isinstance(n, rx.Call) for n in post_order(func.body, leaf=lambda n: isinstance(n, rx.Function)))
        done = 0

        def call(node: rx.Call, ins: list[int]) -> list[int]:
            nonlocal done
            outs = self._launch(node, ins)
            done += 1
            if self.progress is not None:
                self.progress(done, calls)
            return outs

        inputs = [s for p in func.params for s in self._input(p)]
        by_param = dict(zip((id(p) for p in func.params), inputs, strict=True))
        outputs = flat_values(func, lambda p: [by_param[id(p)]], self._constant, call, BuildError, "main")
        for s in outputs:
            if self.slots[s].kind == "temp":
                self.slots[s] = Slot(self.slots[s].shape, self.slots[s].dtype, "output", self.slots[s].name)
        graph = Graph(self.slots, self.launches, inputs, list(outputs), self.constants, checks=checks)
        if not graph.symbols:  # a graph of symbolic shapes is planned per size, when it runs
            graph.plan_memory()
        return graph


def size_checks(func: rx.Function) -> list[tuple[Dim, Dim, str]]:
    """What the calls of `func` (in fused functions too) assume of its sizes (each op's `FSizeCheck`), as
    `small <= large` pairs the executor checks once it knows the sizes; those that hold at any size are
    left out.

    Raises:
        BuildError: an assumption that holds at no size (a slice past a static end).
    """
    out: dict[tuple[Dim, Dim], str] = {}
    for node in post_order(func.body):
        if not isinstance(node, rx.Call) or not isinstance(node.op, Op):
            continue
        check = node.op.get_attr(attr.FSizeCheck)
        if check is None:
            continue
        for small, large, what in check(node.attrs, [a.checked_type for a in node.args]):
            gap = dim_add(large, dim_mul(small, -1))
            if isinstance(gap, int) and gap < 0:
                raise BuildError(f"{_made_by(node)}: {what} needs {small} <= {large}, which no size makes true")
            terms = gap.terms if isinstance(gap, SumDim) else (gap,) if isinstance(gap, SymDim) else ()
            if isinstance(gap, int) or (all(t.coeff > 0 for t in terms) and (
                    not isinstance(gap, SumDim) or gap.const >= 0)):
                continue  # holds for every size >= 0
            out.setdefault((small, large), f"{_made_by(node)}: {what}")
    return [(small, large, what) for (small, large), what in out.items()]


_COMPILE_THREADS = min(4, detect.host_cpu().num_cores)  # as many as the code generator has compiler children
_NVRTC_THREADS = min(16, detect.host_cpu().num_cores)  # NVRTC compiles in this process, off its lock: a core each


def _compile_ahead(func: rx.Function, target: Target, progress: Callable[[int, int], None] | None,
                   first: int = 0) -> None:
    """Compiles main's fused kernels on `_COMPILE_THREADS` threads before the graph walk, which then finds
    each in `compile_primitive`'s cache: while one thread waits for LLVM (in a compiler child, off this
    process's lock) another lowers the next kernel, and the children compile side by side. A kernel that
    fails here is left to the walk, which compiles it again and raises the error with its context."""
    prims: list[rx.Function] = []
    seen: set[int] = set()
    for node in post_order(func.body, leaf=lambda n: isinstance(n, rx.Function)):
        if isinstance(node, rx.Call) and isinstance(node.op, rx.Function):
            key = structural_hash(node.op, tensor_values=False)  # groups that differ in weights share a kernel
            if key in seen:
                continue
            seen.add(key)
            if any(not t.is_static or math.prod(t.concrete_shape)
                   for t in tensor_types(node.checked_type, "relay.build")):
                prims.append(node.op)
    if not prims:
        return
    ctx = PassContext.current()
    done = 0
    lock = threading.Lock()

    def compile_one(n: int) -> None:
        nonlocal done
        try:
            with PassContext(opt_level=ctx.opt_level, config=ctx.config):  # what lowering reads of it
                compile_primitive(prims[n], target, name=f"fused_{first + n}")
        except Exception:  # the walk compiles it again and reports it
            pass
        with lock:
            done += 1
            if progress is not None:
                progress(done, len(prims))

    threads = _NVRTC_THREADS if target.kind.get_attr(TDeviceType) == "cuda" else _COMPILE_THREADS
    with concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="kiln-compile") as pool:
        list(pool.map(compile_one, range(len(prims))))


def _made_by(call: rx.Call) -> str:
    """The ops a call runs and where they came from, for messages: "nn.dense (at model.py:12)", or
    "nn.conv2d+nn.bias_add+nn.relu (at conv_1, relu_1)" for a fused one (ONNX nodes are their spans)."""
    if isinstance(call.op, Op):
        calls = [call]
    elif isinstance(call.op, rx.Function):
        calls = [n for n in post_order(call.op.body) if isinstance(n, rx.Call) and isinstance(n.op, Op)]
    else:
        return ""
    names = "+".join(dict.fromkeys(n.op.name for n in calls if isinstance(n.op, Op)))
    spans = list(dict.fromkeys(str(n.span) for n in calls if n.span is not None))
    if not spans:
        return names
    return f"{names} (at {', '.join(spans[:3])}{', ...' if len(spans) > 3 else ''})"


def _wrap(call: rx.Call) -> rx.Function:
    """A call of an op, as a primitive function of its own (when FuseOps did not run)."""
    if not isinstance(call.op, Op):
        raise BuildError(f"relay.build cannot call {type(call.op).__name__} values")
    params = [rx.var(f"p{i}", a.checked_type) for i, a in enumerate(call.args)]
    fn = infer_type(rx.Function(params, rx.Call(call.op, tuple(params), call.attrs)))
    assert isinstance(fn, rx.Function)
    return fn


_MAX_VARIANTS = 64  # static variants relay.build(specialize=...) makes at most


def build(
    mod: IRModule | rx.Function,
    target: str | Target = "llvm",
    params: Mapping[str, Any] | None = None,
    progress: Callable[[int, int], None] | None = None,
    specialize: Mapping[str, Sequence[int]] | None = None,
) -> Library:
    """Compiles `mod`'s main function for `target`.

    Args:
        mod: an IRModule (its "main") or a Function.
        target: an llvm target (default: the host CPU) or a cuda one (`"cuda -arch=sm_90"`, `"nvidia/h100"`;
            compiling needs no GPU, running does).
        params: values of main's parameters to bind as constants (weights).
        progress: called as `progress(done, total)` after each kernel compiles.
        specialize: for a main with symbolic dims, size variable -> the values to compile static fast paths
            for (`{"n": [1, 8, 32]}`: one static graph per value, or per combination of several variables'
            values); a run whose sizes are one of them takes it, any other runs the symbolic graph.

    Returns:
        The `runtime.Library`; `lib.create_executor()` runs it.
    """
    tgt = target if isinstance(target, Target) else Target(target)
    tgt.backend()  # a kind without a back end fails here, before any pass runs
    start = time.perf_counter()
    key = library_key(mod, params, tgt, specialize)
    if key is not None:
        cached = library_cache.find(key)
        if cached is not None:
            _LOG.info("%d kernels for %s from the library cache (%.2f s)", len(cached.kernels),
                      tgt.summary(), time.perf_counter() - start)
            return cached
    base = _main(mod, params)
    combos = _specializations(base["main"], specialize)
    builder = _GraphBuilder(tgt, None)  # progress is reported as the kernels compile
    graphs: list[Graph] = []
    for sizes in [None, *combos]:
        func = base["main"] if sizes is None else specialize_sizes(base["main"], sizes)
        opt = optimize(func, None, tgt)
        _compile_ahead(opt["main"], tgt, progress, first=builder.named)
        graphs.append(builder.build(opt["main"]))
    lib = Library(graphs[0], [k.module for k in builder.kernels], tgt,
                  variants=list(zip(combos, graphs[1:], strict=True)),
                  output_names=_output_names(base["main"], len(graphs[0].outputs)))
    if key is not None:
        library_cache.store(key, lib)
    _LOG.info("compiled %d kernels, %d launches for %s in %.2f s%s", len(lib.kernels),
              len(lib.graph.launches), tgt.summary(), time.perf_counter() - start,
              "" if key is None else " (stored in the library cache)" if library_cache.enabled() else "")
    return lib


def _output_names(func: rx.Function, count: int) -> list[str]:
    """Main's `output_names` attribute (an ONNX model's output names), when it names each output once."""
    names = func.attrs.get("output_names")
    if isinstance(names, tuple) and len(names) == count and len(set(names)) == count and all(
            isinstance(n, str) and n for n in names):
        return list(names)
    return []


def _specializations(func: rx.Function, specialize: Mapping[str, Sequence[int]] | None) -> list[dict[str, int]]:
    """The size combinations `specialize` asks for, checked against main's size variables."""
    if not specialize:
        return []
    names = {n for p in func.params for t in tensor_types(p.checked_type, "an input") for d in t.shape
             for n in dim_names(d)}
    for name, values in specialize.items():
        if name not in names:
            raise BuildError(f"specialize: {name!r} is not a size variable of main's inputs; they are {sorted(names)}")
        if isinstance(values, (str, bytes)) or not all(
                isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= 0 for v in values):
            raise BuildError(f"specialize: the values of {name!r} must be sizes (ints >= 0), got {values!r}")
    keys = sorted(specialize)
    combos = [dict(zip(keys, map(int, vs), strict=True)) for vs in itertools.product(*(specialize[k] for k in keys))]
    if len(combos) > _MAX_VARIANTS:
        raise BuildError(f"specialize asks for {len(combos)} static variants; at most {_MAX_VARIANTS}")
    return list({tuple(c.items()): c for c in combos}.values())


def specialize_sizes(func: rx.Function, sizes: Mapping[str, int]) -> rx.Function:
    """`func` (typed) with the size variables of `sizes` at those values in its parameters' types, re-typed."""
    values: dict[int, rx.Expr] = {}
    params = []
    for p in func.params:
        t = p.checked_type
        if isinstance(t, TensorType) and any(dim_names(d) for d in t.shape):
            new = rx.var(p.name_hint, TensorType(tuple(dim_subst(d, sizes) for d in t.shape), t.dtype))
            values[id(p)] = new
            params.append(new)
        else:
            params.append(p)
    out = infer_type(rx.Function(params, _Bind(values, sizes).visit(func.body)))
    assert isinstance(out, rx.Function)
    return out


def library_key(mod: IRModule | rx.Function, params: Mapping[str, Any] | None, target: Target,
                specialize: Mapping[str, Sequence[int]] | None = None) -> str | None:
    """The key `relay.build` stores its library under (`runtime.library_cache`), or None where it does
    not cache: the caches are off, the target is neither a CPU nor a CUDA GPU, code outside kiln has
    registered something (then what a build makes depends on code no key covers), or the PassContext has
    instruments (they watch the passes, which a library from the cache never runs).

    The sha256 of everything the build reads: kiln's own source and its compiler's version (llvmlite's;
    for cuda NVRTC's too), the target (for cuda, its arch: the machine's GPU's where the target names
    none), the PassContext, main's text (its params' types and every attr; not the types inferred, so a
    typed and an untyped copy of one model share the key) and the bytes of its constants and params.
    """
    if not library_cache.enabled() or foreign_registration() is not None:
        return None
    device = target.kind.get_attr(TDeviceType)
    if device not in ("cpu", "cuda"):
        return None
    compiler = importlib.metadata.version("llvmlite")
    if device == "cuda":
        compiler += f" nvrtc {detect.nvrtc_version()} arch {target.get('arch')}"
    func = mod if isinstance(mod, rx.Function) else mod["main"]
    if not isinstance(func, rx.Function):
        return None
    ctx = build_context()
    if ctx.instruments:
        return None
    h = hashlib.sha256()
    for part in (source_digest(), compiler, str(target), str(ctx.opt_level),
                 repr(sorted(ctx.config.items())), repr(sorted(ctx.required_pass)), repr(sorted(ctx.disabled_pass)),
                 repr(sorted((k, list(map(int, v))) for k, v in (specialize or {}).items())),
                 astext(func, show_types=False, show_meta_data=False)):
        h.update(part.encode())
        h.update(b"\0")
    given = dict(params or {})
    arrays: list[tuple[str, np.ndarray]] = [("", n.data) for n in post_order(func.body) if isinstance(n, rx.Constant)]
    arrays += [(name, np.asarray(given[name])) for name in sorted(given)]
    for name, arr in arrays:
        h.update(f"{name} {arr.dtype.str} {arr.shape}".encode())
        h.update(np.ascontiguousarray(arr).reshape(-1).view(np.uint8).data)
    return h.hexdigest()


def draw(mod: IRModule | rx.Function, path: str | None = None, params: Mapping[str, Any] | None = None,
         target: str = "llvm", profile: Any = None, engine: str = "auto") -> str:
    """The fused graph of `mod` as SVG (`relay.draw`), as `build(mod, target, params).draw(path, profile, engine)`
    draws it (`kiln.runtime.draw`): the groups FuseOps makes for `target`, each a box with its ops, edges with
    dtypes and shapes. It compiles the model (the library cache makes a second call cheap): a box is a kernel.

    Args:
        mod: the model (an IRModule with "main", or a Function).
        path: where to write the SVG, if anywhere.
        params: values bound to main's parameters before the build, as for `relay.build`.
        target: the target whose fusion to draw.
        profile: a `Profile` of the same library (`executor.profile()`) to shade the boxes by.
        engine: "auto" (graphviz's dot where installed), "graphviz" or "kiln".

    Returns:
        The SVG document.
    """
    return build(mod, target=target, params=params).draw(path, profile, engine)
