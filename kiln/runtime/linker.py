"""Linking compiled kernels into this process: checked object code in MCJIT engines.

Each compiled kernel lives in its own MCJIT `ExecutionEngine`, built from an
empty module plus the kernel's object code, and owning its own target machine.
The engine is disposed of when the `runtime.Module` that holds it is garbage
collected, so compiling and dropping many kernels does not grow memory without
bound (MCJIT never frees code on its own).

Before any object code is linked (fresh compiles, cache hits and loaded
libraries alike), `check_object` reads its ELF symbol table (`objfile`): every
undefined symbol must be in `ALLOWED_SYMBOLS` (what kiln's code generator
calls: libm, the heap, the memory intrinsics, kiln's thread pool) and must resolve in the
process. MCJIT would otherwise resolve any libc function (`system`) for code it
was handed, and bind a missing one to address 0. The runtime links code; it
compiles none (that is `kiln.codegen`'s).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
from collections.abc import Iterable
from typing import Any

import llvmlite.binding as llvm

from kiln.errors import KilnError
from kiln.runtime import objfile, pool
from kiln.target import Target, detect, llvm_check


class UnresolvedSymbolError(KilnError, LookupError):
    """A JIT-compiled kernel calls a symbol that no loaded library defines."""

    def __str__(self) -> str:  # LookupError would otherwise repr() the message
        return str(self.args[0]) if self.args else ""


class CPUFeatureError(KilnError, ValueError):
    """Code compiled for CPU features that this CPU lacks: never linked."""


_LOCK = threading.Lock()
_INITIALIZED = False


def initialize() -> None:
    """Initializes LLVM's native target once per process and loads the libraries kernels call."""
    global _INITIALIZED
    with _LOCK:
        if _INITIALIZED:
            return
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        llvm.initialize_native_asmparser()
        path = ctypes.util.find_library("m")
        if path is not None:
            llvm.load_library_permanently(path)
        pool.start()
        _INITIALIZED = True


def kernel_symbol(name: str) -> str:
    """The machine-code symbol of kernel `name`: prefixed, so a kernel named `sin` or `free` never
    takes the place of the libm / libc function its own code calls."""
    return f"kiln_{name}"


def signature_symbol(name: str) -> str:
    """The data symbol holding kernel `name`'s signature text in its object code (see `signature_text`)."""
    return f"kiln_sig_{name}"


def signature_text(params: Iterable[tuple[str, str, Iterable[int | str]]]) -> str:
    """The text of a kernel's buffer parameters, `name:dtype[d0,d1];...` (a symbolic dim by its name).

    The LLVM back end embeds it in each kernel's object code (`signature_symbol`), so that a loaded
    library's header can be checked against the signature the code was compiled for.

    Args:
        params: (name, dtype, dims) per buffer parameter, in order.
    """
    return ";".join(f"{name}:{dtype}[{','.join(str(d) for d in dims)}]" for name, dtype, dims in params)


def target_triple(target: Target) -> str:
    """The LLVM triple of an llvm target."""
    return str(target.get("mtriple") or llvm.get_process_triple())


def cpu_and_features(target: Target) -> tuple[str, str]:
    """The target's CPU name and its comma-separated feature string."""
    return str(target.get("mcpu") or ""), ",".join(target.get("mattr") or ())


def has_feature(target: Target, feature: str) -> bool:
    """Whether `feature` (without its sign, e.g. "avx512f") is enabled on `target`."""
    return f"+{feature}" in (target.get("mattr") or ())


def create_target_machine(target: Target) -> Any:
    """A new `llvm.TargetMachine` for `target`: its CPU, features and opt level (never a generic one).

    A fresh machine is needed per execution engine, which takes ownership of it.
    """
    initialize()
    cpu, features = cpu_and_features(target)
    # The last gate before LLVM, which aborts the process on a CPU or feature it does not know
    # (a user's own target parser may skip the llvm kind's check). Cached: one dict look-up.
    llvm_check.check_llvm_options(cpu, tuple(target.get("mattr") or ()), target_triple(target))
    llvm_target = llvm.Target.from_triple(target_triple(target))
    opt = int(target.get("opt-level", 3))
    return llvm_target.create_target_machine(cpu=cpu, features=features, opt=opt, reloc="pic",
                                             codemodel="jitdefault", jit=True)


def check_symbols(names: Iterable[str], kernel: str) -> None:
    """Raises `UnresolvedSymbolError` unless every symbol in `names` resolves in this process.

    Args:
        names: symbol names the kernel calls.
        kernel: the kernel's name, for the message.
    """
    initialize()
    missing = [n for n in names if not llvm.address_of_symbol(n)]
    if missing:
        raise UnresolvedSymbolError(
            f"kernel {kernel!r} calls symbol(s) that no loaded library defines: {', '.join(missing)} "
            "(MCJIT would call address 0); load the library that defines them first"
        )


# What kiln's code generator makes object code call, and nothing else: the libm functions of its
# float64 math and of the intrinsics LLVM lowers to calls (sin, cos, pow, exp2, ... and sincos, which
# LLVM forms from a sin and a cos of one value; floor/ceil/roundeven/... on CPUs without SSE4.1), the
# heap temporaries, the memory intrinsics, kiln's thread pool (parallel loops), and the float16
# conversions of compiler-rt/libgcc (listed so that they are checked to resolve, not bound to 0).
_LIBM_BASE = ("sin", "cos", "tan", "sincos", "pow", "exp", "exp2", "exp10", "log", "log2", "log10", "tanh",
              "erf", "fmod", "floor", "ceil", "round", "roundeven", "trunc", "rint", "nearbyint", "sqrt",
              "fma", "fabs", "copysign", "fmin", "fmax")
ALLOWED_SYMBOLS: frozenset[str] = frozenset(
    [*_LIBM_BASE, *(n + "f" for n in _LIBM_BASE),
     "memset", "memcpy", "memmove", "aligned_alloc", "malloc", "free", "posix_memalign",
     pool.PARALLEL_FOR,
     "__extendhfsf2", "__truncsfhf2", "__truncdfhf2", "__gnu_h2f_ieee", "__gnu_f2h_ieee"]
)
# Names the JIT's own linker defines (the GOT of position-independent code), never looked up in the process.
_LINKER_SYMBOLS = frozenset(["_GLOBAL_OFFSET_TABLE_"])


class DisallowedSymbolError(UnresolvedSymbolError):
    """Object code that calls a function kiln's code generator never calls (e.g. `system`): a symbol
    that kiln refuses to resolve for it."""


def check_object(obj: bytes, kernel: str) -> objfile.ObjectFile:
    """Checks object code before it is linked: a well-formed ELF64 object for this machine whose every
    undefined symbol is allow-listed (`ALLOWED_SYMBOLS`) and resolves in this process.

    The symbols are read from the object itself, not from any list stored beside it: a cache entry or
    library file is not trusted to describe its own code, and LLVM may add calls during codegen.

    Args:
        obj: relocatable object code.
        kernel: the kernel's name, for the messages.

    Returns:
        The parsed object.

    Raises:
        ObjectFileError: for bytes that are not an ELF64 object for this machine.
        DisallowedSymbolError: for a symbol outside the allow-list.
        UnresolvedSymbolError: for an allowed symbol no loaded library defines.
    """
    initialize()
    parsed = objfile.ObjectFile(obj, f"object code of kernel {kernel!r}")
    needed = [n for n in parsed.undefined_symbols() if n not in _LINKER_SYMBOLS]
    bad = [n for n in needed if n not in ALLOWED_SYMBOLS]
    if bad:
        raise DisallowedSymbolError(
            f"kernel {kernel!r}: its object code calls {', '.join(map(repr, bad))}, which kiln's code generator "
            "never calls; the code was not made by kiln and is not linked"
        )
    check_symbols(needed, kernel)
    return parsed


class Engine:
    """One MCJIT engine holding one kernel's object code; `close()` frees the code."""

    def __init__(self, obj: bytes, target: Target, symbols: Iterable[str], kernel: str) -> None:
        """Links `obj` after `check_object`; `symbols` (the list stored with the code) is not trusted,
        the object's own symbol table is read instead."""
        initialize()
        check_object(obj, kernel)
        missing = detect.missing_features(target)
        if missing:
            raise CPUFeatureError(
                f"kernel {kernel!r} was compiled for {target}, which needs CPU feature(s) {', '.join(missing)} "
                f"that this CPU ({detect.host_cpu().name}) lacks; it is not run here (build for this CPU: 'llvm')"
            )
        tm = create_target_machine(target)
        empty = llvm.parse_assembly("")
        empty.triple = tm.triple
        self._ee = llvm.create_mcjit_compiler(empty, tm)  # owns tm and the empty module
        self._ee.add_object_file(llvm.ObjectFileRef.from_data(obj))
        self._ee.finalize_object()
        self._lock = threading.Lock()

    def address(self, name: str) -> int:
        """The address of function `name` in the engine's code.

        Raises:
            UnresolvedSymbolError: when the object code has no such function.
        """
        addr = int(self._ee.get_function_address(name))
        if not addr:
            raise UnresolvedSymbolError(f"the compiled code defines no function {name!r}")
        return addr

    def close(self) -> None:
        """Frees the engine and its code; functions taken from it must not be called afterwards."""
        with self._lock:
            if not self._ee.closed:
                self._ee.close()
