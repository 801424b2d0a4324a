"""A mutation fuzzer over ONNX models: every outcome is kiln's error naming what is wrong, or a correct run.

Each case (built by tests/onnx_mutants.py) takes one small valid model (the two
of `kiln.testing.onnx_models` and a few built there: conv/bn/relu/pool, gemm,
layernorm, reshape/slice/concat chains, split/concat, pad/pool,
matmul/softmax/gather) and applies one to three mutations drawn from a seeded
generator: dropped, extra, dangling or cyclic inputs, duplicate outputs, unknown
ops, attributes of the wrong kind or value (and attributes the op defines, with
values of their kind), initializers whose dims, dtype, values or raw bytes do
not fit (or that hold nan, inf, zeros), graph inputs of another rank, shape or
dtype, another opset, deleted nodes, new nodes inserted on existing values, byte
flips in the serialized model. A case is (seed model, seed): `python
tests/relay/frontend/test_onnx_fuzz.py conv_bn_relu 17` replays one and prints what happened.

An outcome is good when
- kiln raises a `KilnError` whose message names a node, an input, an output
  or an initializer of the model (or says the file is not a model at all), or
- kiln imports, builds and runs the model, and its outputs match onnxruntime's
  (run without its graph rewrites) or, when onnxruntime refuses the model,
  crashes on it or disagrees, onnx.reference's.

Reported, not failed: a model that both references refuse but kiln runs
("unverified"); a model onnxruntime refuses whose kiln outputs differ from
onnx.reference's ("reference-differs": the reference is wrong at times);
outputs that differ only between non-finite values ("nonfinite-differs": nan
for inf); outputs of empty inputs that onnxruntime computes otherwise and
onnx.reference cannot compute ("empty-differs": ONNX leaves a reduction over
no elements undefined); errors of relay.build that name no node (the
importer's must).

Anything else fails the test: an exception that is not kiln's, a message that
names nothing, wrong numbers, a crash or a hang. Cases run in child processes
(one child runs many cases and reports each as a JSON line), so a segfault or an
abort fails the test instead of killing the runner; the case that was running
when a child died is run again alone to confirm it. The default budget is about
30 s; `pytest --fuzz-long=SECONDS` runs longer.
"""

from __future__ import annotations

import json
import os
import re
import select
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/: the child runs this file as a script
from onnx_mutants import _onnx, case_at, gemm, mutated

ROOT = Path(__file__).resolve().parents[3]
DEFAULT_SECONDS = 30.0
CASE_TIMEOUT = 120.0  # seconds without a report from the child: the case hangs
KILN_OK = "kiln-ok"
FAILURES = ("foreign-error", "unnamed-error", "mismatch", "crash", "timeout")

# ---------------------------------------------------------------------------
# One case
# ---------------------------------------------------------------------------

_MODEL_LEVEL = ("not a readable ONNX model", "the model has no graph", "opset_import", "the graph has no outputs",
                "op(s) kiln cannot convert", "the default ONNX opset", "graph input #", "initializer #",
                "graph output #")


def names_something(message: str, data: bytes) -> bool:
    """Whether `message` names a node, input, output or initializer of the model, or the model as a whole."""
    if any(phrase in message for phrase in _MODEL_LEVEL):
        return True
    try:
        model = _onnx().load_from_string(data)
    except Exception:
        return False
    from kiln.relay.frontend.onnx import _quoted, _shown

    g = model.graph
    for node in g.node:
        if f"{_shown(node.op_type)} node" in message:
            return True
    # relay.build names the nodes a kernel came from by their spans: "nn.conv2d+nn.relu (at conv_1, relu_1)"
    at = {n for group in re.findall(r"\(at ([^)]*)\)", message) for n in group.split(", ")}
    if at & {_shown(node.name) for node in g.node if node.name}:
        return True
    names = [v.name for v in (*g.input, *g.output, *g.initializer)]
    return any(_quoted(n) in message or f"%{_shown(n)}" in message for n in names if n)


def _inputs(mod: Any, rng: np.random.Generator) -> dict[str, np.ndarray]:
    from kiln.ir.types import TensorType

    feeds = {}
    params = mod["main"].params
    for p in params:
        t = p.type_annotation
        assert isinstance(t, TensorType)
        shape = tuple(d if isinstance(d, int) else 2 for d in t.shape)
        dtype = t.dtype.numpy()
        if np.issubdtype(dtype, np.floating):
            feeds[p.name_hint] = rng.standard_normal(shape).astype(dtype)
        elif dtype == np.bool_:
            feeds[p.name_hint] = rng.random(shape) < 0.5
        else:
            feeds[p.name_hint] = rng.integers(-3, 4, shape).astype(dtype)
    return feeds


def _reference(data: bytes, feeds: dict[str, np.ndarray], use_ort: bool) -> tuple[str, list[np.ndarray] | str]:
    """(which reference, its outputs), or (which, why it refused) when none accepts the model."""
    why = []
    if use_ort:
        import onnxruntime as ort

        try:
            options = ort.SessionOptions()
            options.intra_op_num_threads = 1
            # no graph rewrites: onnxruntime folds a Conv's BatchNormalization into its weights, which turns
            # an infinite scale into nan, as kiln's FoldScaleAxis did
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
            sess = ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])
            return "onnxruntime", list(sess.run(None, feeds))
        except Exception as err:
            why.append(f"onnxruntime: {str(err)[:300]}")
    try:
        from onnx.reference import ReferenceEvaluator

        return "onnx.reference", [np.asarray(v) for v in ReferenceEvaluator(_onnx().load_from_string(data)).run(
            None, feeds)]
    except Exception as err:
        why.append(f"onnx.reference: {type(err).__name__}: {str(err)[:300]}")
    return "none", "; ".join(why)


NONFINITE = "nonfinite-differs"
REFERENCE_DIFFERS = "reference-differs"
EMPTY_DIFFERS = "empty-differs"


def _has_nonfinite(data: bytes) -> bool:
    """Whether an initializer, Constant or float attribute of the model holds nan or inf."""
    onnx = _onnx()
    try:
        model = onnx.load_from_string(data)
        tensors = [*model.graph.initializer, *(a.t for n in model.graph.node for a in n.attribute if a.HasField("t"))]
        floats = [a.f for n in model.graph.node for a in n.attribute if a.type == onnx.AttributeProto.FLOAT]
        arrays = [onnx.numpy_helper.to_array(t) for t in tensors]
    except Exception:
        return False
    return not np.isfinite(floats).all() or any(
        a.dtype.kind == "f" and not np.isfinite(a).all() for a in arrays)


def _compare(got: list[np.ndarray], want: list[np.ndarray], nonfinite_params: bool = False,
             ) -> tuple[str, str] | None:
    """None when kiln's outputs match the reference's, else (outcome, what differs).

    The outcome is "mismatch", or NONFINITE when the only differences are between non-finite values
    (nan against inf): rewrites every compiler does (batch_norm as x * scale + shift) turn an infinite
    parameter's inf into nan, as onnxruntime's own graph optimizations do. With `nonfinite_params` (the
    model holds nan or inf) a nan against a finite value is NONFINITE too: 0 * inf in a convolution's
    padding is nan in kiln and onnx.reference, and skipped by onnxruntime. So is an inf against a finite
    value beyond half the dtype's largest: another order of the same sums overflows. Those are reported,
    not failed.
    """
    if len(got) != len(want):
        return "mismatch", f"{len(got)} outputs, the reference gives {len(want)}"
    nonfinite = None
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        g, w = np.asarray(g), np.asarray(w)
        if g.shape != w.shape:
            return "mismatch", f"output {i} has shape {g.shape}, the reference's {w.shape}"
        if g.dtype != w.dtype:
            return "mismatch", f"output {i} has dtype {g.dtype}, the reference's {w.dtype}"
        if g.dtype.kind in "fc":
            g64, w64 = g.astype(np.float64), w.astype(np.float64)
            scale = float(np.max(np.abs(w64[np.isfinite(w64)]), initial=1.0))
            tol = 1e-2 if g.dtype == np.float16 else 1e-4
            close = np.isclose(g64, w64, rtol=tol, atol=tol * scale, equal_nan=True)
            both = ~np.isfinite(g64) & (~np.isfinite(w64) | nonfinite_params)
            # within a factor of 2 of the largest float one order of rounding overflows where another does not
            edge = np.finfo(g.dtype).max / 2
            both |= (np.isinf(g64) & (np.abs(w64) > edge)) | (np.isinf(w64) & (np.abs(g64) > edge))
            if not (close | both).all():
                bad = ~(close | both)
                return "mismatch", (f"output {i} differs at {int(bad.sum())} of {g.size} elements, e.g. "
                                    f"{g64[bad][:4]} where the reference has {w64[bad][:4]} (scale {scale:.3g})")
            if not close.all():
                nonfinite = f"output {i}: {g64[~close][:4]} where the reference has {w64[~close][:4]}"
        elif not np.array_equal(g, w):
            return "mismatch", f"output {i} differs: {g.ravel()[:8]} vs {w.ravel()[:8]}"
    return None if nonfinite is None else (NONFINITE, nonfinite)


def run_case(name: str, seed: int, use_ort: bool = True, report: Callable[[dict[str, Any]], None] | None = None,
             ) -> dict[str, Any]:
    """Runs case (name, seed) in this process and returns its outcome; `report` hears "kiln-ok" first."""
    if name in _HARNESS_CHECKS:
        return _HARNESS_CHECKS[name](seed)
    from kiln import relay
    from kiln.errors import KilnError
    from kiln.relay.frontend import from_onnx

    data, notes = mutated(name, seed)
    out: dict[str, Any] = {"case": [name, seed], "mutations": notes}
    for stage in ("import", "build"):
        try:
            if stage == "import":
                mod, params = from_onnx(data)
            else:
                feeds = _inputs(mod, np.random.default_rng(seed))
                result = relay.build(mod, params=params).create_executor()(**feeds)
        except KilnError as err:
            text = str(err)
            # the importer must name what is wrong; a later stage's error is reported when it names nothing
            unnamed = "unnamed-error" if stage == "import" else "unnamed-build-error"
            return {**out, "outcome": "error" if names_something(text, data) else unnamed, "detail": text[:2000]}
        except Exception as err:
            return {**out, "outcome": "foreign-error", "detail": "".join(traceback.format_exception(err))[-4000:]}
    got = [np.asarray(r) for r in (result if isinstance(result, tuple | list) else [result])]
    if report is not None:
        report({**out, "stage": KILN_OK})
    which, want = _reference(data, feeds, use_ort)
    if isinstance(want, str):
        return {**out, "outcome": "unverified", "detail": want}
    nonfinite = _has_nonfinite(data)
    diff = _compare(got, want, nonfinite)
    if diff is not None and which == "onnxruntime":
        # onnxruntime departs from the spec here and there (its MaxPool skips nan): the reference decides
        ref, ref_want = _reference(data, feeds, use_ort=False)
        ref_diff = None if isinstance(ref_want, str) else _compare(got, ref_want, nonfinite)
        if not isinstance(ref_want, str) and (ref_diff is None or ref_diff[0] == NONFINITE):
            which, diff = f"{ref} (onnxruntime differs: {diff[1]})", ref_diff
        elif isinstance(ref_want, str) and any(f.size == 0 for f in feeds.values()):
            # a reduction over no elements is undefined in ONNX (ReduceMean: kiln's nan, as numpy; 0 in
            # onnxruntime), and onnx.reference cannot run empty tensors to break the tie
            return {**out, "outcome": EMPTY_DIFFERS, "reference": which, "detail": diff[1]}
    if diff is None:
        return {**out, "outcome": "match", "reference": which}
    if which == "onnx.reference" and diff[0] == "mismatch":
        # onnxruntime refused the model (or died on it), and onnx.reference alone is not trusted to fail a
        # case: it is wrong itself at times (its BatchNormalization before opset 14, ...)
        return {**out, "outcome": REFERENCE_DIFFERS, "reference": which, "detail": diff[1]}
    return {**out, "outcome": diff[0], "reference": which, "detail": diff[1]}


def _segfault(seed: int) -> dict[str, Any]:
    import ctypes

    ctypes.string_at(0)  # reads address 0: SIGSEGV
    raise AssertionError("unreachable")


# cases that check the harness itself: a case that passes, and one that kills its process
_HARNESS_CHECKS: dict[str, Callable[[int], dict[str, Any]]] = {
    "__match__": lambda seed: {"case": ["__match__", seed], "outcome": "match", "mutations": []},
    "__segfault__": _segfault,
}


def _child(deadline: float) -> None:
    """Runs the cases given as JSON lines on stdin ([name, seed, use_ort]); one JSON line out per event."""
    import faulthandler

    import onnxruntime

    faulthandler.enable()
    onnxruntime.set_default_logger_severity(3)  # its warnings about the mutants would fill the log
    # events go to the original stdout; whatever else prints there (Python or native code) goes to stderr
    events = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)

    def emit(event: dict[str, Any]) -> None:
        events.write(json.dumps(event) + "\n")
        events.flush()

    for line in sys.stdin:
        name, seed, use_ort = json.loads(line)
        if time.time() > deadline:
            break
        emit({"case": [name, seed], "stage": "start"})
        emit({**run_case(name, seed, use_ort, emit), "stage": "done"})


# ---------------------------------------------------------------------------
# The parent: children, crashes, the budget
# ---------------------------------------------------------------------------


class _Child:
    """A child process running cases; `events()` yields its JSON lines, or one "crash"/"timeout" event."""

    def __init__(self, cases: list[tuple[str, int, bool]], deadline: float) -> None:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
        # stderr to a file, not a pipe: a child that logs more than a pipe holds would block on it
        self.stderr = tempfile.TemporaryFile("w+")  # noqa: SIM115  (closed when the child is done)
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--child", str(deadline)], cwd=ROOT, env=env, text=True,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr)
        assert self.proc.stdin is not None
        self.proc.stdin.write("".join(json.dumps(list(c)) + "\n" for c in cases))
        self.proc.stdin.close()

    def events(self) -> Iterator[dict[str, Any]]:
        stdout = self.proc.stdout
        assert stdout is not None
        while True:
            ready, _, _ = select.select([stdout], [], [], CASE_TIMEOUT)
            if not ready:
                self.proc.kill()
                self.proc.wait()
                self.stderr.close()
                yield {"stage": "timeout"}
                return
            line = stdout.readline()
            if not line:
                break
            if line.startswith("{"):
                yield json.loads(line)
        rc = self.proc.wait()
        if rc != 0:
            self.stderr.seek(0)
            yield {"stage": "crash", "detail": f"exit status {rc}: {self.stderr.read()[-3000:]}"}
        self.stderr.close()


def _run_alone(name: str, seed: int, use_ort: bool) -> dict[str, Any]:
    """Case (name, seed) alone in a fresh child: its outcome, crash or timeout included."""
    started = kiln_ok = False
    for event in _Child([(name, seed, use_ort)], time.time() + 3600).events():
        if event["stage"] == "done":
            return event
        started |= event["stage"] == "start"
        kiln_ok |= event["stage"] == KILN_OK
        if event["stage"] in ("crash", "timeout"):
            return {"case": [name, seed], "outcome": event["stage"], "kiln_ok": kiln_ok,
                    "detail": event.get("detail", "")}
    return {"case": [name, seed], "outcome": "crash", "detail": "the child exited without a report"}


def fuzz(seconds: float, start: int = 0, cases: Callable[[int], tuple[str, int]] = case_at,
         limit: int | None = None) -> tuple[int, list[dict[str, Any]], dict[str, int]]:
    """Runs cases start, start+1, ... for about `seconds`: (cases run, bad or reported outcomes, counts).

    `cases(i)` is the i-th case (seed model, seed), and its seed must be i; `limit` caps the count.
    """
    deadline = time.time() + seconds
    index, ran = start, 0
    findings: list[dict[str, Any]] = []
    counts: dict[str, int] = {}

    def record(outcome: dict[str, Any]) -> None:
        nonlocal ran
        ran += 1
        counts[outcome["outcome"]] = counts.get(outcome["outcome"], 0) + 1
        if outcome["outcome"] not in ("error", "match"):
            findings.append(outcome)

    while time.time() < deadline:
        size = 500 if limit is None else min(500, start + limit - index)
        if size <= 0:
            break
        batch = [(*cases(i), True) for i in range(index, index + size)]
        current: dict[str, Any] | None = None
        kiln_ok = False
        for event in _Child(batch, deadline).events():
            stage = event["stage"]
            if stage == "start":
                current, kiln_ok = event, False
            elif stage == KILN_OK:
                kiln_ok = True
            elif stage == "done":
                record(event)
                index = event["case"][1] + 1
                current = None
            elif current is None:  # died outside any case (at start-up): nothing to replay
                findings.append({"case": None, "outcome": stage, "detail": event.get("detail", "")})
                counts[stage] = counts.get(stage, 0) + 1
                return ran, findings, counts
            else:
                name, seed = current["case"]
                if kiln_ok:  # kiln ran; the reference died: onnx.reference alone judges the case
                    outcome = _run_alone(name, seed, use_ort=False)
                    outcome["note"] = f"onnxruntime died ({stage}) on this model"
                else:  # confirm alone, so the report names the culprit, not a neighbour
                    outcome = _run_alone(name, seed, use_ort=True)
                    if outcome["outcome"] not in ("crash", "timeout"):
                        outcome["detail"] = (f"{stage} in a batch, not alone ({outcome['outcome']} then): "
                                             f"{event.get('detail', '')[-2000:]}")
                        outcome["outcome"] = stage
                record(outcome)
                index = seed + 1
    return ran, findings, counts


def _summary(ran: int, findings: list[dict[str, Any]], counts: dict[str, int]) -> str:
    lines = [f"{ran} cases: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))]
    for f in findings:
        case = f.get("case")
        replay = f"python tests/relay/frontend/test_onnx_fuzz.py {case[0]} {case[1]}" if case else "(no case)"
        lines.append(f"- {f['outcome']}: {replay}\n  mutations: {f.get('mutations')}\n  {f.get('detail', '')}")
    return "\n".join(lines)


def test_mutated_onnx_models_fail_with_kiln_errors_or_run_correctly(request: pytest.FixtureRequest) -> None:
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    seconds = request.config.getoption("--fuzz-long") or DEFAULT_SECONDS
    ran, findings, counts = fuzz(float(seconds))
    summary = _summary(ran, findings, counts)
    print(summary)
    assert ran >= 10, f"the fuzzer ran only {ran} cases in {seconds} s:\n{summary}"
    bad = [f for f in findings if f["outcome"] in FAILURES]
    assert not bad, summary
    if findings:  # reported, not failed: the warning shows them in pytest's summary
        warnings.warn(f"the ONNX fuzzer reports {len(findings)} case(s):\n{summary}", stacklevel=1)


def test_a_case_that_kills_its_child_is_named_and_the_rest_still_run() -> None:
    ran, findings, counts = fuzz(60.0, 0, lambda i: ("__segfault__" if i == 2 else "__match__", i), limit=6)
    assert ran == 6 and counts == {"crash": 1, "match": 5}, counts
    (crash,) = findings
    assert crash["case"] == ["__segfault__", 2] and crash["outcome"] == "crash"
    assert "Segmentation fault" in crash["detail"]  # faulthandler's report, from the child's stderr


def test_the_checks_see_what_they_must() -> None:
    """The fuzzer's own judges: a mutation changes the model, names are recognized, numbers compared."""
    pytest.importorskip("onnx")
    data, notes = mutated("gemm", 3)
    assert notes and data != gemm().SerializeToString()
    assert mutated("gemm", 3) == (data, notes)  # deterministic
    clean = gemm().SerializeToString()
    assert names_something("Gemm node 'gemm_h': the bias C has shape (64, 1)", clean)
    assert names_something("initializer 'w1': its data holds 3 elements", clean)
    assert not names_something("something went wrong", clean)
    one = np.ones(3, np.float32)
    assert _compare([one], [one]) is None
    assert _compare([one], [one + 1e-3])[0] == "mismatch"  # type: ignore[index]
    assert _compare([one], [np.ones(4, np.float32)]) == ("mismatch", "output 0 has shape (3,), the reference's (4,)")
    assert _compare([one], [one.astype(np.float64)]) == ("mismatch",
                                                         "output 0 has dtype float32, the reference's float64")
    nan, inf = np.array([np.nan, 1], np.float32), np.array([np.inf, 1], np.float32)
    assert _compare([nan], [nan]) is None
    assert _compare([nan], [inf])[0] == NONFINITE  # type: ignore[index]
    assert _compare([np.array([5, 1], np.float32)], [inf])[0] == "mismatch"  # type: ignore[index]
    assert _compare([np.array([2.1e38, 1], np.float32)], [inf])[0] == NONFINITE  # type: ignore[index]
    assert _compare([np.array([1e38, 1], np.float32)], [inf])[0] == "mismatch"  # type: ignore[index]
    assert names_something("the result of nn.dense (at gemm_h) has type ...", clean)
    assert _compare([nan], [np.array([0, 1], np.float32)])[0] == "mismatch"  # type: ignore[index]
    assert _compare([nan], [np.array([0, 1], np.float32)], nonfinite_params=True)[0] == NONFINITE  # type: ignore
    assert not _has_nonfinite(clean)
    model = gemm()
    model.graph.node[0].attribute[0].f = float("inf")  # alpha
    assert _has_nonfinite(model.SerializeToString())


def _main(argv: list[str]) -> None:
    if argv[:1] == ["--child"]:
        _child(float(argv[1]))
        return
    os.environ.setdefault("KILN_CACHE_DIR", os.path.join(os.environ.get("TMPDIR", "/tmp"), "kiln-fuzz-cache"))
    if argv[:1] == ["--seconds"]:
        ran, findings, counts = fuzz(float(argv[1]), int(argv[2]) if len(argv) > 2 else 0)
        print(_summary(ran, findings, counts))
        return
    name, seed = argv[0], int(argv[1])
    print(json.dumps(run_case(name, seed, use_ort="--no-ort" not in argv), indent=1))


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    _main(sys.argv[1:])
