"""`kiln.build`: loop IR (or a te schedule) to a callable runtime module.

The steps, in order: lower a schedule to a PrimFunc (`te.lower`); run the
loop-IR pipeline (`tir.pipeline.optimize_tir`: shared values bound once,
simplification, loop partitioning, unrolling, the bounds check); hand the
result to the target kind's back end, its `FBuild` attribute
(`kiln.codegen.backends`: LLVM machine code for llvm targets, CUDA kernels
for cuda targets).
"""

from __future__ import annotations

from typing import Any

import attrs

from kiln.codegen.jit import CodegenError
from kiln.target import Target
from kiln.te import Schedule, lower
from kiln.tir.pipeline import optimize_tir
from kiln.tir.stmt import PrimFunc


def build(
    func: Any,
    args: Any = None,
    target: str | Target = "llvm",
    name: str | None = None,
) -> Any:  # Module | CudaModule: whatever the target's back end makes
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
        CodegenError: for loop IR the back end cannot compile.
        TargetError: for a target kind without a back end.
        UnresolvedSymbolError: when the code calls a symbol no loaded library defines.
        CudaArchError, NVRTCError: on cuda targets (see `kiln.codegen.backends.build_cuda`).
    """
    if isinstance(func, Schedule):
        func = lower(func, args)
    if not isinstance(func, PrimFunc):
        raise CodegenError(f"build: expected a tir.PrimFunc or a te schedule, got {type(func).__name__}")
    prim = optimize_tir(func)
    if name is not None and name != prim.name:
        prim = attrs.evolve(prim, name=name)
    tgt = target if isinstance(target, Target) else Target(target)
    return tgt.backend()(prim, tgt)
