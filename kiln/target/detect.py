"""What this machine has: the host CPU (through llvmlite) and an NVIDIA GPU (through cupy)."""

from __future__ import annotations

import functools
import os
from typing import Any

import attrs


@attrs.frozen
class HostCPU:
    """The host CPU as LLVM names it."""

    name: str  # e.g. "znver4"
    features: tuple[str, ...]  # e.g. ("+avx512f", "-amx-tile", ...)
    triple: str
    num_cores: int


@functools.cache
def host_cpu() -> HostCPU:
    """Returns the host CPU's LLVM name, its feature flags, triple and usable cores.

    The features list every feature LLVM knows, enabled (+) or disabled (-): the
    disabled ones matter on virtual machines whose CPU model claims more than
    the hypervisor lets through.
    """
    import llvmlite.binding as llvm

    features = llvm.get_host_cpu_features().flatten()
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return HostCPU(
        llvm.get_host_cpu_name(),
        tuple(f for f in features.split(",") if f),
        llvm.get_process_triple(),
        cores,
    )


def cuda_device(ordinal: int = 0) -> dict[str, Any] | None:
    """Returns the cuda target options of GPU `ordinal`, or None without cupy or a GPU."""
    try:
        from cupy.cuda import runtime
    except ImportError:
        return None
    try:
        if runtime.getDeviceCount() <= ordinal:
            return None
        props = runtime.getDeviceProperties(ordinal)
    except Exception:  # cupy raises its CUDA errors when there is no driver or device
        return None
    return {
        "arch": f"sm_{props['major']}{props['minor']}",
        "max-threads-per-block": int(props["maxThreadsPerBlock"]),
        "max-shared-memory-per-block": int(props.get("sharedMemPerBlockOptin") or props["sharedMemPerBlock"]),
        "thread-warp-size": int(props["warpSize"]),
        "registers-per-block": int(props["regsPerBlock"]),
        "multiprocessor-count": int(props["multiProcessorCount"]),
    }
