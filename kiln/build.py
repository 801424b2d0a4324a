"""`kiln.build`: loop IR (or a te schedule) to a callable `runtime.Module` (or `CudaModule`).

The steps, in order: lower a schedule to a PrimFunc; look the kernel up in
the cache (memory, then disk); otherwise generate LLVM IR
(`codegen.llvm`), verify it, optimize it at O3 with the new pass builder,
emit object code for the host CPU's own target machine, store it; finally
check that every external symbol resolves and load the code into its own JIT
engine.

On a cuda target, after the same loop-IR steps: generate CUDA C
(`codegen.cuda`), compile it to a CUBIN for the target's arch with NVRTC
(`codegen.nvrtc`, which caches CUBINs on disk), and wrap it in a
`runtime.cuda_module.CudaModule`, which loads it onto the GPU on first call
(so building needs no GPU).

Parallel loops: libgomp's `GOMP_parallel` with an outlined body was chosen
over a Python thread pool calling per-chunk functions through ctypes. On this
2-core host, a float32 `exp(x) * 2 + 1` kernel, best of 10: at 2**24 elements,
serial 8.7 ms, GOMP on 2 threads 4.4 ms (2.0x), thread pool 4.2-4.6 ms (a tie;
numpy 21-24 ms); at 2**16 elements, serial 25 us, GOMP 18 us, thread pool 96 us
(Python dispatch costs ~80 us per call). GOMP also parallelizes loops nested
inside serial loops, which a Python pool cannot reach.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from kiln.codegen import cache, cuda, jit, nvrtc
from kiln.codegen.llvm import emit_llvm_ir
from kiln.runtime import linker
from kiln.runtime.cuda_module import CudaModule
from kiln.runtime.module import Module
from kiln.target import Target
from kiln.tir.bounds_check import check_accesses
from kiln.tir.share import bind_shared_func
from kiln.tir.stmt import PrimFunc
from kiln.tir.transform import loop_partition, simplify_func, unroll_loops


def _checked(func: PrimFunc) -> PrimFunc:
    check_accesses(func)
    return func


# The loop-IR steps between te.lower and code generation, in order.
TIR_PIPELINE: tuple[tuple[str, Callable[[PrimFunc], PrimFunc]], ...] = (
    ("bind_shared", bind_shared_func),  # a value used twice is a let, computed once (te.lower does it too)
    ("simplify", simplify_func),  # fold index arithmetic with loop bounds: (jo*32 + j) // 32 -> jo
    ("loop_partition", loop_partition),  # take tail guards out of the main loops
    ("unroll", unroll_loops),  # small unrolled loops become straight-line code
    ("simplify_again", simplify_func),
    ("check_bounds", _checked),  # refuse accesses the loops provably take out of their buffers
)


def optimize_tir(func: PrimFunc) -> PrimFunc:
    """Runs `TIR_PIPELINE` over `func`."""
    for _, step in TIR_PIPELINE:
        func = step(func)
    return func


def _as_prim_func(obj: Any, args: Any) -> PrimFunc:
    if isinstance(obj, PrimFunc):
        return obj
    from kiln import te  # a te Schedule: lowered by the te package (imported late: it imports tir)

    lower = getattr(te, "lower", None)
    if lower is None:
        raise jit.CodegenError(f"build: expected a tir.PrimFunc or a te schedule, got {type(obj).__name__}")
    func = lower(obj, args)
    if not isinstance(func, PrimFunc):
        raise jit.CodegenError(f"build: te.lower returned {type(func).__name__}, not a PrimFunc")
    return func


def compile_object(func: PrimFunc, target: Target, sources: bool = False) -> tuple[bytes, list[str], dict[str, str]]:
    """Compiles `func` to object code.

    Returns:
        (object code, external symbols it calls, {"ll": optimized IR, "asm": assembly} if `sources`,
        else {}: emitting the assembly costs about as much as the object code, so modules make it
        only when `get_source` asks).
    """
    # In kiln's compiler child: LLVM's pass builder leaks native memory in the process that runs it.
    return jit.compile_ir(emit_llvm_ir(func, target), target, func.name, sources)


def build_cuda(prim: PrimFunc, target: Target) -> CudaModule:
    """Compiles optimized loop IR (`optimize_tir`) into CUDA kernels for cuda target `target`.

    Raises:
        CodegenError: for loop IR the cuda back end cannot compile (e.g. a loop not bound to a GPU thread).
        CudaArchError: when the target names no arch and the machine has no GPU.
        NVRTCError: when NVRTC rejects the generated source (a bug of the code generator).
    """
    code = cuda.generate(prim, target)
    arch = nvrtc.resolve_arch(target)
    cubin = nvrtc.compile_cuda(code.source, arch, name=prim.name)
    return CudaModule(prim, target, code, cubin, arch, ptx=lambda: nvrtc.compile_ptx(code.source, arch, name=prim.name))


def build(
    func: Any,
    args: Any = None,
    target: str | Target = "llvm",
    name: str | None = None,
) -> Any:  # Module | CudaModule; Any until relay's CompiledKernel (typed `Module`) accepts both
    """Compiles a PrimFunc (or a te schedule with its `args`) into a callable Module.

    Args:
        func: a `tir.PrimFunc`, or a te schedule that `kiln.te.lower(func, args)` lowers.
        args: the schedule's argument tensors (ignored for a PrimFunc).
        target: an llvm target (default: the host CPU), or a cuda target ("cuda -arch=sm_90", "nvidia/h100").
        name: the kernel's name (default: the PrimFunc's).

    Returns:
        The compiled kernel: a `Module` on llvm targets, a `CudaModule` on cuda targets;
        `module(*arrays)` runs it.

    Raises:
        CodegenError: for loop IR the back end cannot compile, or a target kind without a back end.
        UnresolvedSymbolError: when the code calls a symbol no loaded library defines.
        CudaArchError, NVRTCError: on cuda targets (see `build_cuda`).
    """
    prim = optimize_tir(_as_prim_func(func, args))
    if name is not None and name != prim.name:
        prim = attrs.evolve(prim, name=name)
    tgt = target if isinstance(target, Target) else Target(target)
    if tgt.kind.name == "cuda":
        return build_cuda(prim, tgt)
    if tgt.kind.name != "llvm":
        raise jit.CodegenError(f"build: kiln.build compiles for llvm and cuda targets, got {tgt}")
    use_cache = cache.enabled()
    key = cache.cache_key(str(prim), tgt)

    def regenerate() -> dict[str, str]:  # the IR and assembly texts, made when get_source asks
        return compile_object(prim, tgt, sources=True)[2]

    store = cache.KERNEL_CACHE
    if use_cache:
        hit = store.get(key)
        if hit is not None:
            return hit
        loaded = store.load(key)
        if loaded is not None:
            obj, symbols = loaded
            module = Module(prim, tgt, obj, symbols, regenerate=regenerate)
            store.put(key, module)
            return module
    obj, symbols, _ = compile_object(prim, tgt)
    linker.check_symbols(symbols, prim.name)
    module = Module(prim, tgt, obj, symbols, regenerate=regenerate)
    if use_cache:
        store.store(key, obj, symbols)
        store.put(key, module)
    return module
