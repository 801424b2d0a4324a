"""Per-kernel timing of a compiled model, as TVM's debug executor: what `GraphExecutor.profile` returns.

Each kernel launch of a run is timed on its own (`time.perf_counter` around
the native call; on a GPU, until the device is done), over several runs, and
its median taken. A `Profile` holds one `LaunchTime` per launch and one
`KernelTime` per distinct kernel (a kernel that several launches share, such
as two identical layers, sums their medians and counts them as its calls).
Each row says which Relay ops the kernel fuses and where they came from (the
spans of the calls: ONNX node names, or file:line), read from the names that
`relay.build` gives the values it computes, and its output's dtype and shape.

`str(profile)` is a table of the kernels by time, the top ten and one line for
the rest; `profile.table(by="launch")` has a row per launch instead. The sum
of the rows is the time spent in kernels; the run's own median, measured on
the same runs, shows what the executor adds around them (binding inputs,
allocating outputs, the Python loop over the launches).
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Sequence

import attrs

from kiln.runtime.library import Graph, Launch

_MULTI = re.compile(r"\[\d+\]$")  # "op (at x)[1]": field 1 of a call with several results
_OPS_WIDTH = 72  # characters of the ops column before it is cut


@attrs.frozen
class LaunchTime:
    """One launch of a run: where it is, what it runs and how long it took (median over the runs)."""

    index: int  # its position among the run's launches
    kernel: str  # the compiled kernel's name
    ops: tuple[str, ...]  # the Relay ops the kernel fuses, in order
    sources: tuple[str, ...]  # where those calls came from (their spans); "..." when cut
    dtype: str  # of its (first) output
    shape: tuple[int, ...]
    seconds: float


@attrs.frozen
class KernelTime:
    """One distinct kernel: its launches per run (`calls`), their summed medians and share of the total."""

    kernel: str
    ops: tuple[str, ...]
    sources: tuple[str, ...]
    calls: int
    seconds: float
    share: float  # of the time of all kernels, 0 to 1
    outputs: tuple[str, ...]  # the distinct dtype[shape] of its launches' outputs

    @property
    def fuses(self) -> str:
        """The ops and their sources as one text: "nn.conv2d+nn.relu (at conv_1, relu_1)"."""
        ops = "+".join(self.ops) or "?"
        return f"{ops} (at {', '.join(self.sources)})" if self.sources else ops


class Profile:
    """The per-launch and per-kernel times of `repeat` runs; `str()` prints the kernels by time."""

    def __init__(self, launches: Sequence[LaunchTime], run_seconds: float, repeat: int) -> None:
        """Args:
        launches: every launch of a run, in order, with its median time.
        run_seconds: the median time of a whole run (inputs, outputs and launches).
        repeat: how many runs the medians are of.
        """
        self.launches = list(launches)
        self.run_seconds = run_seconds
        self.repeat = repeat
        self.total_seconds = sum(t.seconds for t in self.launches)
        self.kernels = _by_kernel(self.launches, self.total_seconds)

    def table(self, top: int = 10, by: str = "kernel") -> str:
        """The kernels (or, `by="launch"`, the launches) by time: the `top` slowest, one line for the rest,
        and the totals."""
        if by not in ("kernel", "launch"):
            raise ValueError(f"table(by={by!r}): by is 'kernel' or 'launch'")
        rows = self.kernels if by == "kernel" else [_launch_row(t, self.total_seconds) for t in self.launches]
        rows = sorted(rows, key=lambda k: -k.seconds)
        digits = 4 if self.total_seconds < 0.01 else 3  # a small model's kernels take microseconds
        head = (f"per-kernel profile: {_count(len(self.kernels), 'kernel')}, "
                f"{_count(len(self.launches), 'launch', 'launches')}, median of {_count(self.repeat, 'run')}")
        lines = [head, f"{by:<16} {'calls':>5} {'ms':>9} {'share':>6}  {'output':<24} ops (source)"]
        shown, rest = rows[:top], rows[top:]
        if len(rest) == 1:  # "other" for one row would hide its name for nothing
            shown, rest = rows, []
        for k in shown:
            output = k.outputs[0] + (f" +{len(k.outputs) - 1}" if len(k.outputs) > 1 else "") if k.outputs else ""
            lines.append(f"{k.kernel:<16} {k.calls:>5} {k.seconds * 1e3:>9.{digits}f} {_percent(k.share):>6}  "
                         f"{output:<24} {_cut(k.fuses)}")
        if rest:
            seconds = sum(k.seconds for k in rest)
            lines.append(f"{f'other ({len(rest)})':<16} {sum(k.calls for k in rest):>5} {seconds * 1e3:>9.{digits}f} "
                         f"{_percent(seconds / self.total_seconds if self.total_seconds else 0.0):>6}")
        lines.append(f"{'total':<16} {len(self.launches):>5} {self.total_seconds * 1e3:>9.{digits}f} {'100%':>6}")
        outside = self.run_seconds - self.total_seconds
        lines.append(f"a whole run: {self.run_seconds * 1e3:.3f} ms (median), "
                     f"{max(outside, 0.0) * 1e3:.3f} ms of it outside the kernels")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()

    def __repr__(self) -> str:
        return (f"<kiln.runtime.Profile {len(self.kernels)} kernels, {self.total_seconds * 1e3:.3f} ms in kernels, "
                f"median of {self.repeat}>")


def make_profile(graph: Graph, kernel_names: Sequence[str], launch_seconds: Sequence[Sequence[float]],
                 run_seconds: Sequence[float]) -> Profile:
    """The profile of timed runs of `graph`.

    Args:
        graph: the library's graph (its slots name the ops that compute them).
        kernel_names: the name of each kernel of the library, by index.
        launch_seconds: per launch, its time in each run.
        run_seconds: the time of each whole run.

    Returns:
        The `Profile`, with each launch's median.
    """
    launches = []
    for n, (launch, times) in enumerate(zip(graph.launches, launch_seconds, strict=True)):
        ops, sources = made_by(graph, launch)
        out = graph.slots[launch.outputs[0]] if launch.outputs else None
        launches.append(LaunchTime(n, kernel_names[launch.kernel], ops, sources, out.dtype if out else "",
                                   out.dims if out else (), statistics.median(times)))
    return Profile(launches, statistics.median(run_seconds), len(run_seconds))


def made_by(graph: Graph, launch: Launch) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The ops a launch runs and the sources of their calls, from the name of the value it computes.

    `relay.build` names each value for the call that makes it: "nn.dense", or
    "nn.conv2d+nn.bias_add+nn.relu (at conv_1, relu_1)" for a fused group whose
    calls carry spans (at most three, then "..."), and "...[i]" for field i of
    several results.
    """
    name = graph.slots[launch.outputs[0]].name if launch.outputs else ""
    name = _MULTI.sub("", name)
    ops, at, sources = name.partition(" (at ")
    spans = tuple(s for s in sources.removesuffix(")").split(", ") if s) if at else ()
    return tuple(o for o in ops.split("+") if o), spans


def _by_kernel(launches: Sequence[LaunchTime], total: float) -> list[KernelTime]:
    """One row per distinct kernel (in the order of their first launch), slowest first."""
    groups: dict[str, list[LaunchTime]] = {}
    for t in launches:
        groups.setdefault(t.kernel, []).append(t)
    rows = []
    for kernel, ts in groups.items():
        seconds = sum(t.seconds for t in ts)
        rows.append(KernelTime(
            kernel,
            tuple(dict.fromkeys(op for t in ts for op in t.ops)),
            tuple(dict.fromkeys(s for t in ts for s in t.sources)),
            len(ts),
            seconds,
            seconds / total if total > 0 else 0.0,
            tuple(dict.fromkeys(f"{t.dtype}{list(t.shape)}" for t in ts if t.dtype)),
        ))
    return sorted(rows, key=lambda k: -k.seconds)  # sorted() is stable: ties keep the launch order


def _launch_row(t: LaunchTime, total: float) -> KernelTime:
    """A launch as a row of the table: "#3 fused_2", one call."""
    return KernelTime(f"#{t.index} {t.kernel}", t.ops, t.sources, 1, t.seconds, t.seconds / total if total > 0 else 0.0,
                      (f"{t.dtype}{list(t.shape)}",) if t.dtype else ())


def _count(n: int, one: str, many: str = "") -> str:
    return f"{n} {one if n == 1 else many or one + 's'}"


def _percent(share: float) -> str:
    return f"{share * 100:.1f}%"


def _cut(text: str) -> str:
    return text if len(text) <= _OPS_WIDTH else text[: _OPS_WIDTH - 3] + "..."
