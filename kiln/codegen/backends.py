"""The back ends: loop IR to a runtime module, one per target kind, set as the kind's `FBuild`.

`kiln.build` and `relay.build` look a target's back end up in its kind's
attributes (`target.backend()`, its `FBuild`), so neither compares kind names and
a new back end is one registration.

llvm: look the kernel up in the cache (memory, then disk); otherwise generate
LLVM IR (`codegen.llvm`), optimize it at O3 and emit object code for the
target's CPU in kiln's compiler child (`jit.compile_ir`), store it; the runtime
then checks and links it (`runtime.Module`, `runtime.linker`).

cuda: generate CUDA C (`codegen.cuda`), compile it to a CUBIN for the
target's arch with NVRTC (`codegen.nvrtc`, which caches CUBINs on disk), and
wrap it in a `runtime.cuda_module.CudaModule`, which loads it onto the GPU on
first call (so building needs no GPU).

Parallel loops run on kiln's own thread pool (`runtime.pool`): chunks that
any thread claims, the caller among them, so a descheduled worker costs little
(libgomp's per-kernel barrier made models 10-100x slower with a core busy).
"""

from __future__ import annotations

from kiln.codegen import cache, cuda, jit, nvrtc
from kiln.codegen.llvm import emit_llvm_ir
from kiln.runtime import linker
from kiln.runtime.cuda_module import CudaModule
from kiln.runtime.module import Module
from kiln.target import FBuild, Target, register_target_kind
from kiln.tir.stmt import PrimFunc


def compile_object(func: PrimFunc, target: Target, sources: bool = False) -> tuple[bytes, list[str], dict[str, str]]:
    """Compiles `func` to object code.

    Returns:
        (object code, external symbols it calls, {"ll": optimized IR, "asm": assembly} if `sources`,
        else {}: emitting the assembly costs about as much as the object code, so modules make it
        only when `get_source` asks).
    """
    # In kiln's compiler child: LLVM's pass builder leaks native memory in the process that runs it.
    return jit.compile_ir(emit_llvm_ir(func, target), target, func.name, sources)


def build_llvm(prim: PrimFunc, target: Target) -> Module:
    """Compiles optimized loop IR (`tir.pipeline.optimize_tir`) for llvm target `target`, through the cache.

    Raises:
        CodegenError: for loop IR the LLVM back end cannot compile.
        UnresolvedSymbolError: when the code calls a symbol no loaded library defines.
    """
    key = cache.cache_key(str(prim), target)

    def regenerate() -> dict[str, str]:  # the IR and assembly texts, made when get_source asks
        return compile_object(prim, target, sources=True)[2]

    store = cache.KERNEL_CACHE
    use_cache = cache.enabled()
    if use_cache:
        hit = store.get(key)
        if hit is not None:
            return hit
        loaded = store.load(key)
        if loaded is not None:
            obj, symbols = loaded
            module = Module(prim, target, obj, symbols, regenerate=regenerate)
            store.put(key, module)
            return module
    obj, symbols, _ = compile_object(prim, target)
    linker.check_symbols(symbols, prim.name)
    module = Module(prim, target, obj, symbols, regenerate=regenerate)
    if use_cache:
        store.store(key, obj, symbols)
        store.put(key, module)
    return module


def build_cuda(prim: PrimFunc, target: Target) -> CudaModule:
    """Compiles optimized loop IR into CUDA kernels for cuda target `target`.

    Raises:
        CodegenError: for loop IR the cuda back end cannot compile (e.g. a loop not bound to a GPU thread).
        CudaArchError: when the target names no arch and the machine has no GPU.
        NVRTCError: when NVRTC rejects the generated source (a bug of the code generator).
    """
    code = cuda.generate(prim, target)
    arch = nvrtc.resolve_arch(target)
    cubin = nvrtc.compile_cuda(code.source, arch, name=prim.name)
    return CudaModule(prim, target, code, cubin, arch,
                      ptx=lambda: nvrtc.compile_ptx(code.source, arch, name=prim.name))


register_target_kind("llvm").set_attr(FBuild, build_llvm)
register_target_kind("cuda").set_attr(FBuild, build_cuda)
