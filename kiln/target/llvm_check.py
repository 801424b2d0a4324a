"""Checks an llvm target's CPU, features and triple against what LLVM knows, outside this process.

LLVM does not return an error for a CPU it does not know: it prints a warning,
then aborts the whole process when it generates code ("64-bit code requested on
a subtarget that doesn't support it"). So do a 32-bit CPU on a 64-bit triple,
`-mattr=-64bit`, and `-mattr=-sse` (which ends the process through LLVM's
diagnostic handler). llvmlite cannot catch either. Kiln therefore asks a child
process:

1. once per process, for LLVM's own tables of CPU names and features (what
   `llc -mcpu=help` prints), so that an unknown name is refused with close matches;
2. once per (triple, CPU, features) that is not the host's own, to build a target
   machine and emit a small function: if the child dies, the combination is refused
   with LLVM's last words, and this process never hands it to LLVM.

The child is one long-lived worker (started on first use, restarted after it
dies), so a check costs milliseconds, not an interpreter start. The host's own CPU
and features, as LLVM detected them, are never probed.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import subprocess
import sys
import tempfile
import threading
from typing import IO

from kiln.errors import TargetError, did_you_mean
from kiln.target import detect

_TIMEOUT_S = 60.0

# The child: reads one JSON query a line, answers one JSON line. LLVM writes its tables
# and its errors to the child's stderr, which the parent reads from a file.
_WORKER = r"""
import json, sys
import llvmlite.binding as llvm
llvm.initialize_native_target()
llvm.initialize_native_asmprinter()
IR = '''
define float @f(float %x, double %y, <8 x float> %v, i64 %n) {
  %a = fadd float %x, 1.0
  %b = fpext float %a to double
  %c = fmul double %b, %y
  %d = fptrunc double %c to float
  %e = extractelement <8 x float> %v, i32 3
  %m = sitofp i64 %n to float
  %r = fadd float %d, %e
  %s = fadd float %r, %m
  ret float %s
}
'''
for line in sys.stdin:
    q = json.loads(line)
    try:
        target = llvm.Target.from_triple(q["triple"])
        if q["op"] == "help":
            target.create_target_machine(cpu="help", features="")
        else:
            tm = target.create_target_machine(cpu=q["cpu"], features=q["features"], opt=2, reloc="pic",
                                              codemodel="jitdefault", jit=True)
            mod = llvm.parse_assembly(IR)
            mod.triple = tm.triple
            mod.data_layout = str(tm.target_data)
            tm.emit_object(mod)
        reply = {"ok": True}
    except Exception as exc:
        reply = {"ok": False, "error": str(exc)}
    sys.stderr.flush()
    sys.stdout.write(json.dumps(reply) + "\n")
    sys.stdout.flush()
"""


class _Worker:
    """The child process that runs LLVM on the combinations this process must not try."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._err: IO[bytes] | None = None
        self._pid = 0

    def ask(self, query: dict[str, str]) -> tuple[bool, str]:
        """(whether LLVM handled `query`, what it said on stderr or why it failed)."""
        with self._lock:
            proc, err = self._start()
            start = err.seek(0, os.SEEK_END)
            assert proc.stdin is not None and proc.stdout is not None
            try:
                proc.stdin.write((json.dumps(query) + "\n").encode())
                proc.stdin.flush()
                ready, _, _ = select.select([proc.stdout], [], [], _TIMEOUT_S)
                line = proc.stdout.readline() if ready else b""
            except OSError:
                line = b""
            if not line:  # LLVM ended the child (abort, exit) or it hung
                self._stop()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=5)
            err.seek(start)
            said = err.read().decode(errors="replace")
            if not line:
                return False, _last_words(said) or f"the LLVM check process ended with status {proc.returncode}"
            reply = json.loads(line)
            return bool(reply["ok"]), said if reply["ok"] else str(reply.get("error", ""))

    def _start(self) -> tuple[subprocess.Popen[bytes], IO[bytes]]:
        if self._proc is not None and self._err is not None and self._pid == os.getpid() \
                and self._proc.poll() is None:
            return self._proc, self._err
        if self._err is not None:  # the stderr of a worker that died
            self._err.close()
        err = tempfile.TemporaryFile()  # noqa: SIM115  # lives as long as the worker, closed by _start or close
        try:
            proc = subprocess.Popen([sys.executable, "-c", _WORKER], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=err, close_fds=True)
        except OSError as exc:
            err.close()
            raise TargetError(f"cannot check the llvm target: the LLVM check process did not start ({exc})") from exc
        self._proc, self._err, self._pid = proc, err, os.getpid()
        return proc, err

    def _stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and self._pid == os.getpid():
            with contextlib.suppress(OSError):
                if proc.stdin is not None:
                    proc.stdin.close()
            if proc.poll() is None:
                try:
                    proc.wait(timeout=2)
                except subprocess.TimeoutExpired:
                    proc.kill()

    def close(self) -> None:
        """Ends the child (at exit)."""
        with self._lock:
            self._stop()
            if self._err is not None:
                self._err.close()
                self._err = None


_WORKER_PROCESS = _Worker()
atexit.register(_WORKER_PROCESS.close)


def _last_words(text: str) -> str:
    """LLVM's error line from a child's stderr."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if "error" in ln.lower() or "assertion" in ln.lower():
            return ln.removeprefix("LLVM ERROR: ")
    return lines[-1] if lines else ""


_NAMES: dict[str, tuple[frozenset[str], frozenset[str]]] = {}
_CHECKED: dict[tuple[str, str, str], str] = {}  # (triple, cpu, features) -> "" when good, else why not
_STATE_LOCK = threading.Lock()


def llvm_names(triple: str) -> tuple[frozenset[str], frozenset[str]]:
    """(CPU names, feature names) that LLVM knows for `triple`'s architecture, from `-mcpu=help`."""
    arch = triple.split("-")[0]
    with _STATE_LOCK:
        if arch in _NAMES:
            return _NAMES[arch]
    ok, text = _WORKER_PROCESS.ask({"op": "help", "triple": triple})
    if not ok:
        # The triple's arch and OS are this process's, so this is the check process failing
        # (e.g. sys.executable is no Python with llvmlite): refuse rather than risk LLVM here.
        raise TargetError(f"cannot check an llvm target other than this machine's: listing the CPUs and features "
                          f"LLVM knows for {triple!r} failed ({text})")
    cpus: set[str] = set()
    features: set[str] = set()
    table: set[str] | None = None
    for line in text.splitlines():
        if line.startswith("Available CPUs"):
            table = cpus
        elif line.startswith("Available features"):
            table = features
        elif table is not None and line.startswith("  ") and " - " in line:
            table.add(line.split()[0])
    if not cpus or not features:
        raise TargetError(f"cannot check the llvm target: LLVM listed no CPUs or features for {triple!r}")
    names = frozenset(cpus), frozenset(features)
    with _STATE_LOCK:
        _NAMES[arch] = names
    return names


def _llvm_version() -> str:
    import llvmlite.binding as llvm

    return ".".join(str(v) for v in llvm.llvm_version_info)


def _check_triple(triple: str) -> None:
    host = detect.host_cpu().triple
    arch, host_arch = triple.split("-")[0], host.split("-")[0]
    host_os = host.split("-")[2] if host.count("-") >= 2 else ""
    where = f"option -mtriple of target kind llvm: {triple!r}"
    if arch != host_arch:
        raise TargetError(f"{where} is for {arch!r}, but kiln runs the code it compiles in this process, on "
                          f"{host_arch!r} (triple {host!r})")
    if host_os and not any(part.startswith(host_os) for part in triple.split("-")[1:]):
        raise TargetError(f"{where} is for another operating system than this process's {host_os!r} "
                          f"(triple {host!r})")


def check_llvm_options(cpu: str, features: tuple[str, ...], triple: str) -> None:
    """Raises `TargetError` unless LLVM can generate code for `cpu`, `features` and `triple`.

    Args:
        cpu: the `-mcpu` value.
        features: the `-mattr` items, each "+name" or "-name".
        triple: the `-mtriple` value.

    Raises:
        TargetError: naming the option, the value and the closest names LLVM knows.
    """
    for f in features:
        if len(f) < 2 or f[0] not in "+-":
            raise TargetError(f"option -mattr of target kind llvm: feature {f!r} has no sign: write "
                              f"+{f.lstrip('+-')} to enable it or -{f.lstrip('+-')} to disable it")
    key = (triple, cpu, ",".join(features))
    with _STATE_LOCK:
        why = _CHECKED.get(key)
    if why is None:
        why = _check_uncached(cpu, features, triple)
        with _STATE_LOCK:
            _CHECKED[key] = why
    if why:
        raise TargetError(why)


def _check_uncached(cpu: str, features: tuple[str, ...], triple: str) -> str:
    """"" when LLVM handles the combination, else the error message."""
    host = detect.host_cpu()
    if cpu == host.name and triple == host.triple and set(features) <= set(host.features):
        return ""  # what LLVM itself detected on this machine
    try:
        _check_triple(triple)
        cpus, known = llvm_names(triple)
    except TargetError as exc:
        return str(exc)
    if cpu not in cpus:
        return (f"option -mcpu of target kind llvm: {cpu!r} is not a CPU that LLVM {_llvm_version()} knows for "
                f"{triple}{did_you_mean(cpu, cpus)}; this machine's is {host.name!r}")
    for f in features:
        if f[1:] not in known:
            return (f"option -mattr of target kind llvm: {f[1:]!r} (in {f!r}) is not a feature that LLVM "
                    f"{_llvm_version()} knows for {triple}{did_you_mean(f[1:], known)}")
    ok, said = _WORKER_PROCESS.ask({"op": "probe", "triple": triple, "cpu": cpu, "features": ",".join(features)})
    if not ok:
        attrs_text = f" -mattr={','.join(features)}" if features else ""
        return (f"target llvm -mcpu={cpu}{attrs_text} -mtriple={triple}: LLVM cannot generate code for it "
                f"(LLVM {_llvm_version()} said: {said.strip()})")
    return ""
