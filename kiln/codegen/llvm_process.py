"""LLVM's optimizer and code emitter, run in a child process that kiln replaces now and then.

Why a child: llvmlite's `PassBuilder` allocates a `PassInstrumentationCallbacks`
that nothing frees, and every pipeline built or run adds to it
(llvmlite's ffi/newpassmanagers.cpp); no `close()` returns that memory. Measured
with llvmlite 0.50 / LLVM 22: about 80 KB of native memory per optimized kernel,
reusing one pass builder still 54 KB. So the process that compiles kernels grows
without bound, and only a process that ends gives the memory back. Kiln's own
process keeps the JIT engines (which free their code when closed); a child
parses, optimizes and emits object code, and is replaced after `RECYCLE_AFTER`
kernels. A side effect worth having: LLVM aborting during code generation ends
the child, which kiln reports as an error, not the user's process.

This file imports only the standard library and llvmlite: the child runs it with
`runpy` (kiln itself is never imported there), so it starts in about 0.1 s.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import queue
import struct
import subprocess
import sys
import tempfile
import threading
from typing import IO, Any

import llvmlite.binding as llvm

# Named metadata of a module to optimize without the SLP vectorizer (see `run_pipeline`).
NO_SLP = "kiln.no_slp"
RECYCLE_AFTER = 200  # kernels per child: at most about 16 MB of leaked pass-builder memory in it
_HEADER = struct.Struct("<Q")


class IRRejected(Exception):
    """LLVM's parser or verifier refused the IR text."""


def initialize() -> None:
    """Initializes LLVM's native target (idempotent)."""
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    llvm.initialize_native_asmparser()


def target_machine(triple: str, cpu: str, features: str, level: int) -> Any:
    """A new JIT-ready `llvm.TargetMachine` (the caller closes it)."""
    return llvm.Target.from_triple(triple).create_target_machine(
        cpu=cpu, features=features, opt=level, reloc="pic", codemodel="jitdefault", jit=True)


def wants_slp(text: str) -> bool:
    """Whether the module of IR `text` may be SLP-vectorized: not when it carries `!kiln.no_slp`.

    LLVM 22.1's SLP vectorizer miscompiles index arithmetic: bundling `add nuw x, 3` with `sub nuw y, z`
    lanes it emits `sub nuw <x, ...>, <-3, ...>`, poison in lane 0 (llvm/llvm-project#209023, fixed
    upstream by #209047). Index arithmetic that divides a loop variable gives LLVM such `sub nuw`
    (`i - i urem 60` from `i // 60 * 60`) next to additions of constants once its loops are unrolled;
    the code generator marks those kernels, whose gathers gain nothing measurable from SLP.
    """
    return f"!{NO_SLP} =" not in text


def run_pipeline(mod: Any, tm: Any, level: int, slp: bool = True) -> None:
    """Runs the new pass builder's O-`level` pipeline, with loop (and, if `slp`, SLP) vectorization from O2."""
    pto = llvm.create_pipeline_tuning_options(speed_level=level)  # size level 0 (no -Os)
    pto.loop_vectorization = level >= 2
    pto.slp_vectorization = level >= 2 and slp
    pto.loop_unrolling = level >= 2
    pb = llvm.create_pass_builder(tm, pto)
    mpm = pb.getModulePassManager()
    try:
        mpm.run(mod, pb)
    finally:
        mpm.close()
        pb.close()
        pto.close()


def compile_text(text: str, triple: str, cpu: str, features: str, level: int, sources: bool) -> dict[str, Any]:
    """Parses, verifies, optimizes and emits LLVM IR `text`.

    Returns:
        {"obj": object code, "declared": names of the functions the module declares,
        "ll": optimized IR, "asm": assembly}; the texts only when `sources`.

    Raises:
        IRRejected: when LLVM's parser or verifier refuses the text.
    """
    initialize()
    context = llvm.create_context()
    try:
        try:
            mod = llvm.parse_assembly(text, context=context)
            mod.verify()
        except RuntimeError as exc:
            raise IRRejected(str(exc)) from None
        tm = target_machine(triple, cpu, features, level)
        try:
            mod.triple = tm.triple
            mod.data_layout = str(tm.target_data)
            run_pipeline(mod, tm, level, wants_slp(text))
            out: dict[str, Any] = {"obj": bytes(tm.emit_object(mod)),
                                   "declared": [fn.name for fn in mod.functions if fn.is_declaration]}
            if sources:
                out["ll"] = str(mod)
                out["asm"] = str(tm.emit_assembly(mod))
        finally:
            mod.close()
            tm.close()
    finally:
        context.close()
    return out


# -- the child ----------------------------------------------------------------------------


def _send(stream: IO[bytes], value: object) -> None:
    data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def _receive(stream: IO[bytes]) -> Any:
    """The next message, or None at the end of the stream."""
    head = stream.read(_HEADER.size)
    if len(head) < _HEADER.size:
        return None
    (size,) = _HEADER.unpack(head)
    data = stream.read(size)
    if len(data) < size:
        return None
    return pickle.loads(data)  # from the parent that started this child, or the child it started


def _serve() -> None:
    """The child's loop: one request in, one reply out, until the parent closes the pipe."""
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything LLVM prints goes to stderr, never into the replies
    requests = sys.stdin.buffer
    initialize()
    while (request := _receive(requests)) is not None:
        if request == "ping":
            _send(replies, ("pong", None))
            continue
        try:
            reply: tuple[str, Any] = ("ok", compile_text(**request))
        except IRRejected as exc:
            reply = ("rejected", str(exc))
        except Exception as exc:  # reported to the parent, which raises kiln's error
            reply = ("error", f"{type(exc).__name__}: {exc}")
        sys.stderr.flush()
        _send(replies, reply)


# -- the parent ---------------------------------------------------------------------------


class Compiler:
    """The child process that compiles for this one; replaced after `recycle_after` kernels."""

    def __init__(self, recycle_after: int = RECYCLE_AFTER) -> None:
        self.recycle_after = recycle_after
        self.started = 0  # children started so far (tests read it)
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._err: IO[bytes] | None = None
        self._pid = 0
        self._count = 0
        self._broken = ""  # why no child can run here (then every compile is "unavailable")

    def compile(self, request: dict[str, Any]) -> tuple[str, Any]:
        """Compiles in the child: ("ok", `compile_text`'s result), ("rejected", LLVM's message),
        ("error", what went wrong), ("died", LLVM's last words), or ("unavailable", why no child runs)."""
        with self._lock:
            try:
                proc, err = self._start()
            except OSError as exc:
                return "unavailable", str(exc)
            assert proc.stdin is not None and proc.stdout is not None
            start = err.seek(0, os.SEEK_END)
            try:
                _send(proc.stdin, request)
                reply = _receive(proc.stdout)
            except (OSError, EOFError, pickle.UnpicklingError):
                reply = None
            if reply is None:
                self._stop()
                err.seek(start)
                said = err.read().decode(errors="replace")
                return "died", _last_words(said) or f"status {proc.returncode}"
            self._count += 1
            if self._count >= self.recycle_after:
                self._stop()
            kind, payload = reply  # ("kind", payload) from _serve
            return str(kind), payload

    def _start(self) -> tuple[subprocess.Popen[bytes], IO[bytes]]:
        if self._proc is not None and self._err is not None and self._pid == os.getpid():
            return self._proc, self._err
        if self._broken:
            raise OSError(self._broken)
        if self._err is not None:
            self._err.close()
            self._err = None
        err = tempfile.TemporaryFile()  # noqa: SIM115  # the child's stderr, closed with the next child
        code = f"import runpy; runpy.run_path({__file__!r}, run_name='__kiln_llvm_child__')"
        try:
            proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=err, close_fds=True)
        except OSError:
            err.close()
            raise
        self._proc, self._err, self._pid, self._count = proc, err, os.getpid(), 0
        self.started += 1
        # A child that cannot answer (sys.executable is not a Python with llvmlite, e.g. in an
        # embedded interpreter) is not tried again: compiling falls back to this process.
        try:
            assert proc.stdin is not None and proc.stdout is not None
            _send(proc.stdin, "ping")
            pong = _receive(proc.stdout)
        except (OSError, EOFError, pickle.UnpicklingError):
            pong = None
        if pong != ("pong", None):
            self._stop()
            err.seek(0)
            self._broken = f"the compiler child did not start: {_last_words(err.read().decode(errors='replace'))}"
            raise OSError(self._broken)
        return proc, err

    def _stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or self._pid != os.getpid():
            return
        with contextlib.suppress(OSError):
            if proc.stdin is not None:
                proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()

    def close(self) -> None:
        """Ends the child (at exit, and in tests)."""
        with self._lock:
            self._stop()
            if self._err is not None:
                self._err.close()
                self._err = None


class CompilerPool:
    """Compiler children that kernels compile in concurrently: `compile` takes a free one.

    The most recently freed child is taken first (a stack), so kernels compiled one after another keep
    using one child and a second starts only when two threads compile at once (`relay.build` does).
    """

    def __init__(self, size: int) -> None:
        self._all = [Compiler() for _ in range(max(1, size))]
        self._free: queue.LifoQueue[Compiler] = queue.LifoQueue()
        for c in reversed(self._all):
            self._free.put(c)

    @property
    def size(self) -> int:
        """How many kernels can compile at once."""
        return len(self._all)

    @property
    def started(self) -> int:
        """Children started so far, all compilers together (tests read it)."""
        return sum(c.started for c in self._all)

    def compile(self, request: dict[str, Any]) -> tuple[str, Any]:
        """`Compiler.compile` in a free child (waiting for one when all are busy)."""
        compiler = self._free.get()
        try:
            return compiler.compile(request)
        finally:
            self._free.put(compiler)

    def close(self) -> None:
        """Ends every child."""
        for c in self._all:
            c.close()


def _last_words(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if "error" in ln.lower() or "assert" in ln.lower():
            return ln
    return lines[-1] if lines else ""


if __name__ == "__kiln_llvm_child__":
    _serve()
