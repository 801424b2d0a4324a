"""CUDA C to CUBIN (or PTX) with NVRTC, through `cupy.cuda.nvrtc`'s low-level calls.

No GPU is needed to compile: NVRTC is a library, and a CUBIN for `sm_90` is
produced on any machine that has it (the `cuda` extra: cupy-cuda13x and
nvidia-cuda-nvrtc). cupy's high-level `RawModule(...).compile()` would query
the device, so it is not used. cupy is imported on first use, never when kiln
is imported.

The arch comes from the target (`Target("cuda -arch=sm_90")`, a tag such as
`nvidia/h100`); without one, from the machine's GPU; with neither,
`CudaArchError`.

float16 kernels include `<cuda_fp16.h>`. It is looked for in a CUDA toolkit
(`CUDA_PATH`, `CUDA_HOME`, cuda-pathfinder, `/usr/local/cuda*`) and in the
`nvidia` pip packages; where none has it, kiln gives NVRTC a small header of
its own with the names the code generator uses (`__half`; the conversions
`__float2half`, `__double2half`, `__half2float`, each one PTX `cvt`
instruction, which rounds exactly as the toolkit's does; and the bit casts
`__half_as_short`, `__half_as_ushort`, `__short_as_half`, `__ushort_as_half`).

Compiled code is cached in memory and on disk, under the cache folder of the
llvm kernels (`$KILN_CACHE_DIR`, default `~/.cache/kiln`; `KILN_CACHE=0`
turns it off), keyed by the sha256 of the source, the options (include paths
and the fallback header included), the arch, the output kind, NVRTC's version
and kiln's. Files are the llvm cache's (`kiln.codegen.cache`): a checksum and
an HMAC-SHA256 tag under the user's secret key, so a corrupt file, or one this
user's kiln did not write (a planted CUBIN with a recomputed checksum), is
deleted and the code recompiled, never loaded; the folder must be the user's
own and not writable by others (`TrustSetupError` otherwise).
"""

from __future__ import annotations

import functools
import glob
import hashlib
import importlib
import os
import re
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kiln.codegen import cache
from kiln.errors import KilnError
from kiln.runtime.cuda_module import CudaUnavailableError
from kiln.target import Target
from kiln.version import __version__

DEFAULT_OPTIONS = ("--std=c++17",)
_MEMORY_LIMIT = 256
_QUOTED_ERRORS = 10  # at most this many offending lines are quoted in an error

_FALLBACK_FP16 = r"""// kiln's stand-in for cuda_fp16.h: the names kiln's generated code uses, and no more.
#pragma once
struct __align__(2) __half { unsigned short __x; };
__device__ __forceinline__ __half __float2half(const float f) {
  __half h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.__x) : "f"(f)); return h;
}
__device__ __forceinline__ __half __double2half(const double d) {
  __half h; asm("cvt.rn.f16.f64 %0, %1;" : "=h"(h.__x) : "d"(d)); return h;
}
__device__ __forceinline__ float __half2float(const __half h) {
  float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h.__x)); return f;
}
__device__ __forceinline__ short __half_as_short(const __half h) { return (short)h.__x; }
__device__ __forceinline__ unsigned short __half_as_ushort(const __half h) { return h.__x; }
__device__ __forceinline__ __half __short_as_half(const short i) { __half h; h.__x = (unsigned short)i; return h; }
__device__ __forceinline__ __half __ushort_as_half(const unsigned short i) { __half h; h.__x = i; return h; }
"""


class NVRTCError(KilnError, RuntimeError):
    """NVRTC refused CUDA C source; the message shows its log and the offending lines."""

    def __init__(self, message: str, log: str = "", source: str = "") -> None:
        super().__init__(message)
        self.log = log
        self.source = source


class CudaArchError(KilnError, ValueError):
    """No GPU architecture to compile for: the target names none and the machine has no GPU."""


def _nvrtc() -> Any:
    try:
        from cupy.cuda import nvrtc
    except ImportError as exc:
        raise CudaUnavailableError(
            f"compiling CUDA needs cupy and NVRTC, which are not importable ({exc}); "
            "install kiln's cuda extra: pip install 'kiln[cuda]'"
        ) from exc
    return nvrtc


@functools.cache
def nvrtc_version() -> tuple[int, int]:
    """NVRTC's (major, minor) version."""
    major, minor = _nvrtc().getVersion()
    return int(major), int(minor)


def resolve_arch(target: Target) -> str:
    """The `sm_XY` to compile for: the target's `-arch`, else the machine's GPU's.

    Raises:
        CudaArchError: when the target has no arch and this machine has no GPU.
    """
    arch = target.get("arch")
    if arch is not None:
        return str(arch)
    from kiln.target import detect

    gpu = detect.cuda_device()
    if gpu is not None:
        return str(gpu["arch"])
    raise CudaArchError(
        f"target {target} names no GPU architecture and this machine has no CUDA GPU to take it from; "
        "give one: Target('cuda -arch=sm_90'), or a tag such as 'nvidia/h100' or 'nvidia/a100'"
    )


# -- headers ------------------------------------------------------------------------------


def _candidate_include_dirs() -> list[Path]:
    dirs: list[Path] = []
    for env in ("CUDA_PATH", "CUDA_HOME"):
        if os.environ.get(env):
            dirs.append(Path(os.environ[env]) / "include")
    try:
        pathfinder = importlib.import_module("cuda.pathfinder")  # comes with cupy; untyped
        found = pathfinder.locate_nvidia_header_directory("cudart")
        if found is not None:
            dirs.append(Path(found.abs_path))
    except Exception:  # an optional helper; any failure only skips it
        pass
    dirs.append(Path("/usr/local/cuda/include"))
    dirs.extend(Path(p) for p in sorted(glob.glob("/usr/local/cuda-*/include"), reverse=True))
    try:
        nvidia = importlib.import_module("nvidia")  # the namespace of NVIDIA's pip packages
        for root in nvidia.__path__:
            dirs.extend(Path(p).parent for p in sorted(glob.glob(os.path.join(root, "*", "include", "cuda_fp16.h"))))
    except ImportError:
        pass
    return dirs


@functools.cache
def fp16_include_dir() -> str | None:
    """A folder holding the toolkit's `cuda_fp16.h`, or None (kiln's own stand-in is used then)."""
    for d in _candidate_include_dirs():
        if (d / "cuda_fp16.h").is_file():
            return str(d)
    return None


def _headers(source: str) -> tuple[list[str], list[str], list[str]]:
    """(include options, in-memory header texts, their names) that `source` needs."""
    if not re.search(r"#include\s*<cuda_fp16\.h>", source):
        return [], [], []
    found = fp16_include_dir()
    if found is not None:
        return [f"--include-path={found}"], [], []
    return [], [_FALLBACK_FP16], ["cuda_fp16.h"]


# -- the cache ----------------------------------------------------------------------------


class _CompiledCache(cache.KernelCache):
    """CUBINs and PTX on disk (the llvm cache's file format, its own suffix) and in a bounded dict."""

    def __init__(self) -> None:
        super().__init__()
        self._code: OrderedDict[str, bytes] = OrderedDict()
        self._code_lock = threading.Lock()

    def path(self, key: str) -> Path:
        """Where the compiled code of `key` is stored."""
        return cache.directory() / key[:2] / f"{key}.kcuda"

    def recall(self, key: str) -> bytes | None:
        """The code of `key` from memory, else from disk, or None."""
        with self._code_lock:
            code = self._code.get(key)
            if code is not None:
                self._code.move_to_end(key)
                self.hits += 1
                return code
        loaded = self.load(key)
        if loaded is None:
            return None
        self.keep(key, loaded[0])
        return loaded[0]

    def keep(self, key: str, code: bytes) -> None:
        """Keeps `code` in memory under `key`."""
        with self._code_lock:
            self._code[key] = code
            self._code.move_to_end(key)
            while len(self._code) > _MEMORY_LIMIT:
                self._code.popitem(last=False)

    def clear(self) -> None:
        """Forgets the code held in memory (the disk cache stays)."""
        with self._code_lock:
            self._code.clear()


CUDA_CACHE = _CompiledCache()


def cache_key(source: str, arch: str, options: Sequence[str], kind: str) -> str:
    """The sha256 key of compiled code: kind, source, options, arch, NVRTC and kiln versions."""
    major, minor = nvrtc_version()
    h = hashlib.sha256()
    for part in (kind, source, "\x1f".join(options), arch, f"nvrtc {major}.{minor}", __version__):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


# -- compiling ------------------------------------------------------------------------------


def compile_cuda(source: str, arch: str, options: Sequence[str] = (), name: str = "kiln") -> bytes:
    """Compiles CUDA C to a CUBIN for `arch` (e.g. "sm_90"), from the cache when it holds it.

    Args:
        source: the CUDA C text.
        arch: a real architecture, `sm_XY` (or `sm_XYa`).
        options: further NVRTC options (after `DEFAULT_OPTIONS`).
        name: names the program in NVRTC's messages (`name.cu(LINE): error ...`).

    Raises:
        NVRTCError: when NVRTC rejects the source.
        CudaUnavailableError: without cupy / NVRTC.
    """
    if not re.fullmatch(r"sm_\d+[af]?", arch):
        raise CudaArchError(f"compile_cuda: a CUBIN needs a real architecture such as 'sm_90', got {arch!r}")
    return _compile(source, arch, options, name, "cubin")


def compile_ptx(source: str, arch: str, options: Sequence[str] = (), name: str = "kiln") -> str:
    """Compiles CUDA C to PTX for the virtual architecture of `arch` ("sm_90" -> "compute_90").

    Raises:
        NVRTCError: when NVRTC rejects the source.
    """
    virtual = re.sub(r"^sm_", "compute_", arch)
    if not re.fullmatch(r"compute_\d+[af]?", virtual):
        raise CudaArchError(f"compile_ptx: expected an architecture such as 'sm_90', got {arch!r}")
    return _compile(source, virtual, options, name, "ptx").decode().rstrip("\0")


def _compile(source: str, arch: str, options: Sequence[str], name: str, kind: str) -> bytes:
    includes, headers, header_names = _headers(source)
    opts = [f"--gpu-architecture={arch}", *DEFAULT_OPTIONS, *includes, *options]
    key_opts = [*opts, *headers]
    use_cache = cache.enabled()
    key = cache_key(source, arch, key_opts, kind)
    if use_cache:
        hit = CUDA_CACHE.recall(key)
        if hit is not None:
            return hit
    code = _nvrtc_compile(source, arch, opts, headers, header_names, name, kind)
    if use_cache:
        CUDA_CACHE.store(key, code, [kind])
        CUDA_CACHE.keep(key, code)
    return code


def _nvrtc_compile(
    source: str, arch: str, opts: list[str], headers: list[str], header_names: list[str], name: str, kind: str
) -> bytes:
    nvrtc = _nvrtc()
    filename = f"{re.sub(r'[^A-Za-z0-9_.-]', '_', name) or 'kiln'}.cu"
    prog = nvrtc.createProgram(source, filename, [h.encode() for h in headers], [n.encode() for n in header_names])
    try:
        try:
            nvrtc.compileProgram(prog, opts)
        except nvrtc.NVRTCError as exc:
            log = _log(nvrtc, prog)
            raise NVRTCError(_error_message(source, log, filename, arch, str(exc)), log, source) from None
        code = nvrtc.getCUBIN(prog) if kind == "cubin" else nvrtc.getPTX(prog)
    finally:
        nvrtc.destroyProgram(prog)
    return bytes(code)


def _log(nvrtc: Any, prog: Any) -> str:
    try:
        log = nvrtc.getProgramLog(prog)
    except Exception:  # the log is a courtesy: never hide the compile error behind another
        return ""
    return log.decode(errors="replace") if isinstance(log, bytes) else str(log)


def _error_message(source: str, log: str, filename: str, arch: str, status: str) -> str:
    """NVRTC's log, then each offending source line (with one line of context) numbered."""
    major, minor = nvrtc_version()
    lines = source.splitlines()
    wanted: list[int] = []
    for m in re.finditer(rf"^{re.escape(filename)}\((\d+)\): (?:error|catastrophic error)", log, re.MULTILINE):
        n = int(m.group(1))
        if n not in wanted:
            wanted.append(n)
    out = [f"NVRTC {major}.{minor} could not compile {filename} for {arch} ({status}):", log.rstrip()]
    if wanted:
        out.append("offending source lines:")
        shown: set[int] = set()
        for n in wanted[:_QUOTED_ERRORS]:
            for k in range(max(1, n - 1), min(len(lines), n + 1) + 1):
                if k in shown:
                    continue
                shown.add(k)
                out.append(f"{'>' if k == n else ' '} {k:5d} | {lines[k - 1]}")
        if len(wanted) > _QUOTED_ERRORS:
            out.append(f"  ... and {len(wanted) - _QUOTED_ERRORS} more")
    return "\n".join(out)
