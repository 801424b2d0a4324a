"""LLVM machinery of the code generator: the O3 pipeline and object code, made in a child process.

The optimizer and code emitter run in a child process (`compile_ir`,
`llvm_process`): llvmlite's pass builder leaks about 80 KB per kernel wherever
it runs, and only a process that ends returns it. Linking the object code into
this process is the runtime's (`kiln.runtime.linker`), which checks it first.
"""

from __future__ import annotations

import atexit
import os
import re
from collections.abc import Iterable
from typing import Any

import llvmlite.binding as llvm

from kiln.codegen import llvm_process
from kiln.errors import KilnError
from kiln.runtime.linker import cpu_and_features, create_target_machine, initialize, target_triple
from kiln.target import Target, detect, llvm_check


class CodegenError(KilnError, ValueError):
    """Loop IR that the LLVM back end cannot compile, or LLVM rejecting what it produced."""


def optimize(text: str, target: Target, context: Any = None) -> tuple[Any, Any]:
    """Parses, verifies, and optimizes LLVM IR text; returns (module, target machine).

    Give a fresh `llvm.create_context()` (closed after the module) so that the
    constants and types of many kernels do not pile up in LLVM's global context.

    The module is verified before optimization, then run through the new pass
    builder's O-level pipeline with loop and SLP vectorization on.

    Raises:
        CodegenError: when LLVM rejects the IR (a bug of the code generator).
    """
    initialize()
    try:
        mod = llvm.parse_assembly(text, context=context)
        mod.verify()
    except RuntimeError as exc:
        raise CodegenError(f"LLVM rejected the generated IR: {exc}\n{_numbered(text)}") from exc
    tm = create_target_machine(target)
    mod.triple = tm.triple
    mod.data_layout = str(tm.target_data)
    # In this process: llvmlite's pass builder leaks about 80 KB each time (see llvm_process),
    # so kernels are compiled by `compile_ir` in a child; this is for tools and tests.
    llvm_process.run_pipeline(mod, tm, int(target.get("opt-level", 3)), llvm_process.wants_slp(text))
    return mod, tm


# A child per core this process may use, up to 4: relay.build compiles that many kernels at once.
_COMPILER: llvm_process.Compiler | llvm_process.CompilerPool = llvm_process.CompilerPool(
    min(4, detect.host_cpu().num_cores))
atexit.register(_COMPILER.close)


def compile_ir(
    text: str, target: Target, kernel: str, sources: bool = False
) -> tuple[bytes, list[str], dict[str, str]]:
    """Optimizes LLVM IR text and emits its object code, in kiln's compiler child process.

    The child keeps LLVM's pass-builder memory out of this process (see `llvm_process`);
    with `KILN_LLVM_CHILD=0`, or where no child can start, the work is done here.

    Args:
        text: the module's LLVM IR.
        target: the llvm target.
        kernel: the kernel's name, for the messages.
        sources: also return {"ll": optimized IR, "asm": assembly}.

    Returns:
        (object code, external symbols it calls, the texts or {}).

    Raises:
        CodegenError: when LLVM rejects the IR or ends the child while compiling it.
        TargetError: for a CPU, feature or triple that LLVM does not know.
    """
    initialize()
    cpu, features = cpu_and_features(target)
    triple = target_triple(target)
    llvm_check.check_llvm_options(cpu, tuple(target.get("mattr") or ()), triple)
    request: dict[str, Any] = {"text": text, "triple": triple, "cpu": cpu, "features": features,
                               "level": int(target.get("opt-level", 3)), "sources": sources}
    kind: str
    payload: Any
    kind, payload = ("unavailable", "") if os.environ.get("KILN_LLVM_CHILD") == "0" \
        else _COMPILER.compile(request)
    if kind == "unavailable":
        try:
            kind, payload = "ok", llvm_process.compile_text(**request)
        except llvm_process.IRRejected as exc:
            kind, payload = "rejected", str(exc)
    if kind == "rejected":
        raise CodegenError(f"LLVM rejected the generated IR of kernel {kernel!r}: {payload}\n{_numbered(text)}")
    if kind != "ok":
        raise CodegenError(f"LLVM failed while compiling kernel {kernel!r} for {target}: {payload}")
    texts = {"ll": payload["ll"], "asm": payload["asm"]} if sources else {}
    return payload["obj"], external_symbol_names(payload["declared"]), texts


def _numbered(text: str, limit: int = 200) -> str:
    lines = text.splitlines()[:limit]
    return "\n".join(f"{i + 1:4d}  {line}" for i, line in enumerate(lines))


# Intrinsics that become calls into libm / libc when LLVM cannot expand them.
_LIBCALLS = {
    "sin": "sin", "cos": "cos", "pow": "pow", "exp": "exp", "log": "log", "exp2": "exp2", "log2": "log2",
    "log10": "log10", "exp10": "exp10",
}


def external_symbols(mod: Any) -> list[str]:
    """Names the optimized module needs from outside: declared functions and the libm calls of intrinsics."""
    return external_symbol_names(fn.name for fn in mod.functions if fn.is_declaration)


def external_symbol_names(declared: Iterable[str]) -> list[str]:
    """The symbols behind the functions a module declares: libm for intrinsics LLVM cannot expand."""
    names: set[str] = set()
    for name in declared:
        m = re.fullmatch(r"llvm\.(\w+)\.(f32|f64|v\d+f32|v\d+f64)", name)
        if m and m.group(1) in _LIBCALLS:
            base = _LIBCALLS[m.group(1)]
            names.add(base + "f" if m.group(2).endswith("f32") else base)
        elif name.startswith("llvm.memset"):
            names.add("memset")
        elif name.startswith(("llvm.memcpy", "llvm.memmove")):
            names.add("memcpy" if "memcpy" in name else "memmove")
        elif not name.startswith("llvm."):
            names.add(name)
    return sorted(names)


def emit_object(mod: Any, tm: Any) -> bytes:
    """Machine code of an optimized module, as a relocatable object file."""
    return bytes(tm.emit_object(mod))


def emit_assembly(mod: Any, tm: Any) -> str:
    """Assembly text of an optimized module."""
    return str(tm.emit_assembly(mod))


def new_context() -> Any:
    """A fresh LLVM context, to be closed once the modules parsed in it are closed."""
    initialize()
    return llvm.create_context()
