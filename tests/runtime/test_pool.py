"""kiln's thread pool: parallel loops are correct for any extent, under concurrent callers, after a
fork, nested, and the process exits cleanly with workers alive."""

import multiprocessing
import subprocess
import sys
import threading

import numpy as np
import pytest

import kiln
from kiln import tir
from kiln.runtime import pool


def _parallel_kernel(threads: int) -> kiln.runtime.Module:
    """B[i, :] = exp(A[i, :]) * 2 + i over a parallel row loop of symbolic extent."""
    n = tir.Var("n")
    A, B = tir.buffer("A", (n, 8)), tir.buffer("B", (n, 8))
    i, j = tir.Var("i"), tir.Var("j")
    value = tir.call("exp", A.load(i, j)) * 2.0 + tir.Cast("float32", i)
    body = tir.for_range(i, n, tir.for_range(j, 8, tir.BufferStore(B, value, (i, j)), tir.ForKind.VECTORIZED),
                         tir.ForKind.PARALLEL)
    return kiln.build(tir.PrimFunc(f"pool_rows{threads}", [A, B], body), target=f"llvm -num-cores={threads}")


def _expected(a: np.ndarray) -> np.ndarray:
    return np.exp(a) * 2 + np.arange(a.shape[0], dtype=np.float32)[:, None]


def _run(m: kiln.runtime.Module, rows: int, seed: int = 0) -> None:
    a = np.random.default_rng(seed).standard_normal((rows, 8)).astype(np.float32)
    out = np.full_like(a, np.nan)
    m(a, out)
    np.testing.assert_allclose(out, _expected(a), rtol=1e-5)


@pytest.mark.parametrize("threads", [2, 3, 8])
def test_every_iteration_runs_once_for_any_extent(threads):
    m = _parallel_kernel(threads)
    for rows in (0, 1, 2, 3, 5, 7, 8, 9, 31, 32, 33, 1001, 4096):
        _run(m, rows, rows)
    assert pool.workers() >= threads - 1  # started on the first loop, kept for the next


def test_concurrent_callers_each_get_their_own_results():
    m = _parallel_kernel(2)
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        try:
            for k in range(50):
                _run(m, 37 + seed + k, seed * 100 + k)
        except BaseException as err:  # reported by the main thread
            errors.append(err)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a caller never returned"
    assert not errors, errors[0]


def _child(queue: "multiprocessing.Queue[str]") -> None:
    try:
        _run(_parallel_kernel(2), 1001)
        queue.put("ok")
    except BaseException as err:  # sent to the parent
        queue.put(repr(err))


def test_a_forked_child_runs_parallel_loops():
    _run(_parallel_kernel(2), 100)  # the parent's workers are running
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    proc = ctx.Process(target=_child, args=(queue,))
    proc.start()
    proc.join(timeout=120)
    assert proc.exitcode == 0, "the child hung or crashed"
    assert queue.get(timeout=5) == "ok"


def test_the_process_exits_cleanly_with_workers_running():
    code = (
        "import numpy as np, kiln\n"
        "from kiln import te\n"
        "A = te.placeholder((4096,), name='a')\n"
        "B = te.compute((4096,), lambda i: A[i] * 2.0, name='b')\n"
        "s = te.create_schedule(B)\n"
        "o, i = s[B].split(B.op.axis[0], factor=64)\n"
        "s[B].parallel(o)\n"
        "m = kiln.build(s, [A, B], target='llvm -num-cores=4')\n"
        "a = np.ones(4096, np.float32); b = np.zeros_like(a); m(a, b)\n"
        "assert (b == 2).all()\n"
        "print('done')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "done"
