"""A fuzzer of Relay graphs: random well-typed graphs, compiled and checked against two references.

`relay_graphs()` is a hypothesis strategy of `FuzzCase`s: a Relay function,
its inputs and the outputs that numpy computes for it, built side by side, one
op at a time. Each op is chosen for a value already in the graph and its other
operands are made to fit (broadcast-compatible shapes, matching reduction dims,
split points that divide the axis), so every graph type-checks by construction.
The graphs mix elementwise ops with broadcasting, reductions, layout ops, dense
and matmul, softmax, casts, fan-out, tuples, constants, several outputs and
dims of size 0.

`check_case(case)` builds the function with `relay.build`, runs it, and
compares its outputs with the reference interpreter's and with numpy's. Values
stay finite and bounded by construction: inputs lie on a grid of quarters in
[-2, 2], the operands of log/sqrt/division are made positive, and an op whose
result would overflow is not drawn. Ops whose result flips on the last bit of
their input (floor, round, comparisons, casts to int) are only applied to
values known to be exact, so compiled code and numpy must agree to the bit.

`run_fuzz(...)` drives the strategy with hypothesis; `python -m
kiln.testing.fuzz --seconds 300` runs it for a while (the test suite runs it in
a child process, so a case that crashes the process fails a test instead of
killing the runner).
"""


from __future__ import annotations

import argparse
import sys
import time
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from kiln import relay
from kiln.ir.module import IRModule
from kiln.ir.transform import PassContext
from kiln.relay.transform.fuse_ops import MAX_DEPTH_KEY
from kiln.testing.fuzz_graph import _EPS, Array, Draw, FuzzCase, GraphBuilder, Value
from kiln.testing.fuzz_ops import OPS

__all__ = ["OPS", "FuzzCase", "GraphBuilder", "Value", "check_case", "main", "relay_graphs", "run_fuzz"]


@st.composite
def relay_graphs(draw: Draw, max_ops: int = 12, zero_dims: bool = True, ops: Sequence[str] | None = None) -> FuzzCase:
    """A hypothesis strategy of random well-typed Relay graphs with their inputs and numpy's outputs.

    Args:
        draw: hypothesis's draw (given by `st.composite`).
        max_ops: the most op steps drawn (a step may add a few calls).
        zero_dims: whether shapes may have dims of size 0.
        ops: the names of the op families to draw from (default: all of `OPS`).

    Returns:
        A `FuzzCase`.
    """
    b = GraphBuilder(draw, zero_dims)
    names = list(ops or OPS)
    b.new_leaf()
    for _ in range(draw(st.integers(1, max_ops))):
        OPS[b.choose(names)](b)
    return b.build()


# --- checking ---------------------------------------------------------------------------------


def _flat(value: Any) -> list[Array]:
    if isinstance(value, (tuple, list)):
        return [a for v in value for a in _flat(v)]
    return [np.asarray(value)]


def _differ(name: str, got: Array, want: Array, exact: bool = True, err: float = 0.0) -> str | None:
    """Why `got` is not `want` (shape, dtype, bits where `exact`, else values beyond `err`), or None."""
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"{name}: {got.dtype}{list(got.shape)} where {want.dtype}{list(want.shape)} was expected"
    if got.size == 0:
        return None
    if exact or want.dtype.kind in "biu":
        if np.array_equal(got, want, equal_nan=want.dtype.kind == "f"):
            return None
        bad = int(np.sum(got != want))
        return f"{name}: {bad} of {want.size} elements differ\n  got  {got.ravel()[:8]}\n  want {want.ravel()[:8]}"
    if not np.array_equal(np.isnan(got), np.isnan(want)):
        return f"{name}: NaN in different places\n  got  {got.ravel()[:8]}\n  want {want.ravel()[:8]}"
    # four times the estimate: an estimate of rounding, not a proof
    if np.allclose(got, want, rtol=4 * _EPS[str(want.dtype)], atol=4 * err, equal_nan=True):
        return None
    worst = float(np.nanmax(np.abs(got.astype(np.float64) - want.astype(np.float64))))
    shown = f"\n  got  {got.ravel()[:8]}\n  want {want.ravel()[:8]}"
    return f"{name}: max abs error {worst:.3g} (allowed {4 * err:.3g}){shown}"


def check_case(case: FuzzCase, target: str = "llvm") -> None:
    """Builds `case.func`, runs it, and asserts its outputs equal the interpreter's and numpy's.

    Raises:
        AssertionError: naming the output and how it differs, with the graph printed.
    """
    mod = IRModule.from_expr(case.func)
    inputs = {k: v.copy() for k, v in case.inputs.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        reference = relay.create_executor("debug", mod)(**inputs)
    config = {} if case.max_depth is None else {MAX_DEPTH_KEY: case.max_depth}
    with PassContext(opt_level=case.opt_level, verify=True, config=config), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # FoldConstant's numpy: the mean of an empty axis
        lib = relay.build(case.func, target=target)
    ex = lib.create_executor()
    got = ex(**inputs)
    got_flat, ref_flat = _flat(got), _flat(reference)
    problems = []
    # the second run takes the executor's fast path; the third gives it inputs in Fortran order
    fortran = {k: np.array(v, order="F") for k, v in inputs.items()}  # (asfortranarray makes 0-d 1-d)
    for again, how in ((inputs, "a second run"), (fortran, "Fortran inputs")):
        for i, (first, later) in enumerate(zip(got_flat, _flat(ex(**again)), strict=True)):
            if not np.array_equal(first, later, equal_nan=first.dtype.kind == "f"):
                problems.append(f"output {i} of {how} differs from the first run's")
    if len(got_flat) != len(case.expected) or len(ref_flat) != len(case.expected):
        problems.append(
            f"{len(got_flat)} compiled and {len(ref_flat)} reference outputs where {len(case.expected)} were expected"
        )
    else:
        exact = case.exact or (True,) * len(case.expected)
        errors = case.errors or (0.0,) * len(case.expected)
        for i, want in enumerate(case.expected):
            for who, value in (("compiled", got_flat[i]), ("interpreter", ref_flat[i])):
                why = _differ(f"output {i} ({who} vs numpy)", np.asarray(value), want, exact[i], errors[i])
                if why:
                    problems.append(why)
    if problems:
        raise AssertionError("\n".join(problems) + f"\n\n{case}")


def run_fuzz(
    max_examples: int = 100,
    seconds: float = 0.0,
    zero_dims: bool = True,
    derandomize: bool = True,
    max_ops: int = 12,
    random_seed: int | None = None,
    progress: str | None = None,
) -> int:
    """Checks `max_examples` random graphs (or keeps going for `seconds`); returns how many ran.

    Args:
        max_examples: the examples per hypothesis run.
        seconds: when > 0, hypothesis runs with fresh seeds are repeated until this many seconds pass.
        zero_dims: whether shapes may have dims of size 0.
        derandomize: a fixed sequence of examples (the first run only, when `seconds` repeats runs).
        max_ops: the most op steps per graph.
        random_seed: the seed of the first run when not derandomized.
        progress: a file that holds the graph being checked, so a case that kills the process is known.

    Raises:
        AssertionError: for the first failing graph hypothesis finds (shrunk), printed.
    """
    count = 0

    def once(derandom: bool, run_seed: int | None) -> None:
        nonlocal count

        @settings(
            max_examples=max_examples, deadline=None, derandomize=derandom, database=None,
            suppress_health_check=list(HealthCheck), print_blob=False,
        )
        @given(relay_graphs(max_ops=max_ops, zero_dims=zero_dims))
        def fuzz(case: FuzzCase) -> None:
            nonlocal count
            count += 1
            if progress is not None:
                with open(progress, "w", encoding="utf-8") as f:
                    f.write(f"graph {count}:\n{case}\n")
            check_case(case)

        if run_seed is not None:
            seed(run_seed)(fuzz)
        fuzz()

    start = time.monotonic()
    once(derandomize, random_seed)
    rng = np.random.default_rng(random_seed)
    while seconds > 0 and time.monotonic() - start < seconds:
        run_seed = int(rng.integers(0, 2**31))
        print(f"fuzz: {count} graphs so far; next run seed {run_seed}", file=sys.stderr, flush=True)
        once(False, run_seed)
    return count


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m kiln.testing.fuzz`: fuzz relay.build for a number of examples or seconds."""
    parser = argparse.ArgumentParser(prog="python -m kiln.testing.fuzz", description=main.__doc__)
    parser.add_argument("--examples", type=int, default=100, help="examples per hypothesis run")
    parser.add_argument("--seconds", type=float, default=0.0, help="repeat runs with new seeds this long")
    parser.add_argument("--no-zero-dims", action="store_true", help="no dims of size 0")
    parser.add_argument("--random", action="store_true", help="a random first run rather than the fixed one")
    parser.add_argument("--seed", type=int, default=None, help="the seed of the first random run")
    parser.add_argument("--max-ops", type=int, default=12, help="the most op steps per graph")
    parser.add_argument("--progress", default=None, help="a file to hold the graph being checked")
    args = parser.parse_args(argv)
    count = run_fuzz(
        args.examples, args.seconds, not args.no_zero_dims, not args.random, args.max_ops, args.seed, args.progress
    )
    print(f"fuzz: {count} graphs compiled and checked, no difference found")
    return 0


if __name__ == "__main__":
    sys.exit(main())
