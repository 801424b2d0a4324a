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


# CPU names whose code needs these features (a target's -mcpu implies them without any -mattr):
# a library for `-mcpu=skylake-avx512` is refused on a host without AVX-512 before it runs.
_AVX512 = ("skylake-avx512", "cascadelake", "cooperlake", "cannonlake", "icelake-client", "icelake-server",
           "tigerlake", "rocketlake", "sapphirerapids", "emeraldrapids", "graniterapids", "graniterapids-d",
           "diamondrapids", "knl", "knm", "znver4", "znver5", "x86-64-v4")
_AVX2 = ("haswell", "broadwell", "skylake", "alderlake", "raptorlake", "meteorlake", "arrowlake", "arrowlake-s",
         "lunarlake", "pantherlake", "gracemont", "sierraforest", "grandridge", "clearwaterforest", "znver1",
         "znver2", "znver3", "bdver4", "x86-64-v3")
_CPU_FEATURES: dict[str, tuple[str, ...]] = {
    **{c: ("avx", "avx2", "fma") for c in _AVX2},
    **{c: ("avx", "avx2", "fma", "avx512f") for c in _AVX512},
    **{c: ("avx",) for c in ("sandybridge", "ivybridge", "btver2", "bdver1", "bdver2", "bdver3")},
}


def missing_features(target: Any) -> list[str]:
    """The CPU features that code for llvm `target` may use and this host lacks, sorted.

    Those its `-mattr` enables, and those its `-mcpu` implies for the CPU names above.
    """
    have = {f[1:] for f in host_cpu().features if f.startswith("+")}
    attrs_ = [str(f) for f in target.get("mattr") or ()]
    need = set(_CPU_FEATURES.get(str(target.get("mcpu") or ""), ()))
    need -= {f[1:] for f in attrs_ if f.startswith("-")}
    need |= {f[1:] for f in attrs_ if f.startswith("+")}
    return sorted(need - have)


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


@functools.cache
def nvrtc_version() -> tuple[int, int] | None:
    """NVRTC's (major, minor) version, or None without cupy's NVRTC (it compiles kiln's CUDA kernels)."""
    try:
        from cupy.cuda import nvrtc

        major, minor = nvrtc.getVersion()
    except Exception:  # ImportError, or cupy's error when the NVRTC library cannot be loaded
        return None
    return int(major), int(minor)
