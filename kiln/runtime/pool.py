"""kiln's thread pool: the runtime of parallel loops, native code that stays fast when a core is busy.

A kernel's parallel loop calls `kiln_parallel_for(body, data, begin, end, threads)`
(`PARALLEL_FOR`), which runs `body(data, lo, hi)` over chunks of `[begin, end)`
on the calling thread and on the pool's persistent workers:

- The iterations are cut into a few chunks per thread; any thread claims the
  next chunk with one compare-and-swap on a (generation, next chunk) word, and
  the calling thread claims chunks too. So when the OS has descheduled a worker
  (another process holds its core), the caller simply does the work: nothing
  waits for a thread that is not running, unless it holds a claimed chunk.
  libgomp, which kiln used before, gave each thread a fixed block and waited at
  a barrier for every thread of the team, once per kernel: with one of two
  cores busy, models ran 10-100x slower.
- Workers spin for the next job for about 0.8 ms, then sleep on a futex; the
  caller wakes them only when one sleeps. Waking a sleeping thread takes long
  on these virtual machines: with 70 us of spinning, the gaps between a
  model's kernel calls (Python's) put the workers to sleep, and after a pause
  a 3x3 conv ran at one core's speed for tens of calls (110 vs 195 GFLOP/s). A caller that waits for a chunk still in a
  worker's hands also spins briefly and then sleeps, leaving its core idle, so
  the OS can move the worker onto it.
- One caller at a time: a second thread calling while the pool is taken, a
  parallel loop inside a parallel body, or a process forked from one with a
  pool (its workers did not survive the fork) runs the loop serially on the
  calling thread, never deadlocks. At exit, the workers are stopped and joined
  before the interpreter frees any code.

The pool is LLVM IR (below), compiled once per process by MCJIT from this
module's own text and registered as a process symbol, so kernels' object code
links against it like against libm. It is kiln's own code, not a library file
or cache entry. Measured on this 2-core host (a zoo model with hundreds of
kernels): see `bench/zoo.py --loaded`.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import threading
from typing import Any

import llvmlite.binding as llvm

# The symbol kernels call: void kiln_parallel_for(ptr body, ptr data, i64 begin, i64 end, i32 threads).
PARALLEL_FOR = "kiln_parallel_for"
MAX_WORKERS = 1023  # the workers' thread handles live in a fixed table
CHUNKS_PER_THREAD = 4  # enough chunks that a late or descheduled worker leaves little to wait for
_WORKER_SPIN_CYCLES = 2_000_000  # ~0.8 ms of time-stamp-counter cycles a worker spins for the next job
_CALLER_SPIN_CYCLES = 60_000  # ~20 us the caller spins for chunks still running elsewhere, then sleeps

_SYS_FUTEX = 202  # x86-64 Linux
_FUTEX_WAIT_PRIVATE, _FUTEX_WAKE_PRIVATE = 128, 129

_IR = r"""
@state = internal global i64 0, align 128        ; (generation << 32) | next chunk to claim
@done = internal global i32 0, align 128         ; chunks finished in this generation (the caller's futex)
@gen = internal global i32 0, align 128          ; the generation: the futex the workers sleep on
@sleepers = internal global i32 0, align 128     ; workers asleep, or about to be
@caller_waiting = internal global i32 0, align 64
@busy = internal global i32 0, align 64          ; a caller holds the pool
@workers = internal global i32 0, align 64       ; workers started
@stop = internal global i32 0, align 64          ; set at exit: workers end, later loops run serially
@job_body = internal global ptr null, align 64
@job_data = internal global ptr null
@job_begin = internal global i64 0
@job_end = internal global i64 0
@job_chunk = internal global i64 0
@job_chunks = internal global i32 0
@threads = internal global [MAX_WORKERS x i64] zeroinitializer

declare i64 @syscall(i64, ...)
declare i32 @pthread_create(ptr, ptr, ptr, ptr)
declare i32 @pthread_join(i64, ptr)
declare i64 @llvm.readcyclecounter()
SPIN_HINT_DECL

define internal void @spin_hint() {
  SPIN_HINT_CALL
  ret void
}

define internal void @futex_wait(ptr %addr, i32 %seen) {
  %v = zext i32 %seen to i64
  %r = call i64 (i64, ...) @syscall(i64 SYS_FUTEX, ptr %addr, i64 FUTEX_WAIT, i64 %v, ptr null)
  ret void
}

define internal void @futex_wake(ptr %addr) {
  %r = call i64 (i64, ...) @syscall(i64 SYS_FUTEX, ptr %addr, i64 FUTEX_WAKE, i64 2147483647)
  ret void
}

; Claims and runs chunks of generation %g until none is left (or a newer job replaced it).
define internal void @run_chunks(i32 %g) {
entry:
  br label %next
next:
  %s = load atomic i64, ptr @state seq_cst, align 8
  %sg = lshr i64 %s, 32
  %sg32 = trunc i64 %sg to i32
  %same = icmp eq i32 %sg32, %g
  br i1 %same, label %check, label %out
check:
  %idx = and i64 %s, 4294967295
  %n = load atomic i32, ptr @job_chunks monotonic, align 4
  %n64 = zext i32 %n to i64
  %left = icmp ult i64 %idx, %n64
  br i1 %left, label %claim, label %out
claim:
  ; Read before the claim: a successful claim proves generation %g was still running, so these were its.
  %body = load atomic ptr, ptr @job_body monotonic, align 8
  %data = load atomic ptr, ptr @job_data monotonic, align 8
  %begin = load atomic i64, ptr @job_begin monotonic, align 8
  %end = load atomic i64, ptr @job_end monotonic, align 8
  %chunk = load atomic i64, ptr @job_chunk monotonic, align 8
  %s1 = add i64 %s, 1
  %pair = cmpxchg ptr @state, i64 %s, i64 %s1 seq_cst seq_cst
  %ok = extractvalue { i64, i1 } %pair, 1
  br i1 %ok, label %run, label %next
run:
  %off = mul i64 %idx, %chunk
  %lo = add i64 %begin, %off
  %hi0 = add i64 %lo, %chunk
  %short = icmp slt i64 %hi0, %end
  %hi = select i1 %short, i64 %hi0, i64 %end
  call void %body(ptr %data, i64 %lo, i64 %hi)
  %d = atomicrmw add ptr @done, i32 1 seq_cst
  %d1 = add i32 %d, 1
  %last = icmp eq i32 %d1, %n
  br i1 %last, label %finished, label %next
finished:
  %w = load atomic i32, ptr @caller_waiting seq_cst, align 4
  %asleep = icmp ne i32 %w, 0
  br i1 %asleep, label %wake, label %out
wake:
  call void @futex_wake(ptr @done)
  br label %out
out:
  ret void
}

define internal ptr @worker(ptr %unused) {
entry:
  br label %wait
wait:
  %seen = phi i32 [ 0, %entry ], [ %g, %work ], [ %seen, %woken ]
  %t0 = call i64 @llvm.readcyclecounter()
  br label %spin
spin:
  %g = load atomic i32, ptr @gen seq_cst, align 4
  %new = icmp ne i32 %g, %seen
  br i1 %new, label %got, label %pause
pause:
  call void @spin_hint()
  %t = call i64 @llvm.readcyclecounter()
  %dt = sub i64 %t, %t0
  %long = icmp ugt i64 %dt, WORKER_SPIN
  br i1 %long, label %sleep, label %spin
sleep:
  %sl = atomicrmw add ptr @sleepers, i32 1 seq_cst
  %g2 = load atomic i32, ptr @gen seq_cst, align 4
  %still = icmp eq i32 %g2, %seen
  br i1 %still, label %dosleep, label %woken
dosleep:
  call void @futex_wait(ptr @gen, i32 %seen)
  br label %woken
woken:
  %sl2 = atomicrmw sub ptr @sleepers, i32 1 seq_cst
  br label %wait
got:
  %st = load atomic i32, ptr @stop seq_cst, align 4
  %stopping = icmp ne i32 %st, 0
  br i1 %stopping, label %exit, label %work
work:
  call void @run_chunks(i32 %g)
  br label %wait
exit:
  ret ptr null
}

; Starts workers until there are %want (under the busy flag); returns how many there are.
define internal i32 @ensure_workers(i32 %want) {
entry:
  %st = load atomic i32, ptr @stop seq_cst, align 4
  %stopping = icmp ne i32 %st, 0
  br i1 %stopping, label %none, label %start
none:
  ret i32 0
start:
  %cap = icmp ugt i32 %want, MAX_WORKERS
  %target = select i1 %cap, i32 MAX_WORKERS, i32 %want
  br label %loop
loop:
  %have = load atomic i32, ptr @workers seq_cst, align 4
  %enough = icmp sge i32 %have, %target
  br i1 %enough, label %out, label %create
create:
  %h64 = sext i32 %have to i64
  %slot = getelementptr inbounds [MAX_WORKERS x i64], ptr @threads, i64 0, i64 %h64
  %rc = call i32 @pthread_create(ptr %slot, ptr null, ptr @worker, ptr null)
  %failed = icmp ne i32 %rc, 0
  br i1 %failed, label %out, label %made
made:
  %have1 = add i32 %have, 1
  store atomic i32 %have1, ptr @workers seq_cst, align 4
  br label %loop
out:
  %n = load atomic i32, ptr @workers seq_cst, align 4
  ret i32 %n
}

define void @kiln_parallel_for(ptr %body, ptr %data, i64 %begin, i64 %end, i32 %threads) {
entry:
  %n = sub i64 %end, %begin
  %empty = icmp sle i64 %n, 0
  br i1 %empty, label %ret, label %nonempty
nonempty:
  %one = icmp sle i32 %threads, 1
  %single = icmp eq i64 %n, 1
  %alone = or i1 %one, %single
  br i1 %alone, label %serial, label %take
take:
  %pair = cmpxchg ptr @busy, i32 0, i32 1 seq_cst seq_cst
  %taken = extractvalue { i32, i1 } %pair, 1
  br i1 %taken, label %setup, label %serial
setup:
  %want = sub i32 %threads, 1
  %have = call i32 @ensure_workers(i32 %want)
  %noworkers = icmp eq i32 %have, 0
  br i1 %noworkers, label %release_serial, label %publish
release_serial:
  store atomic i32 0, ptr @busy seq_cst, align 4
  br label %serial
serial:
  call void %body(ptr %data, i64 %begin, i64 %end)
  br label %ret
publish:
  %t64 = sext i32 %threads to i64
  %most = mul i64 %t64, CHUNKS_PER_THREAD
  %fewer = icmp slt i64 %n, %most
  %parts = select i1 %fewer, i64 %n, i64 %most
  %nm1 = add i64 %n, -1
  %q = sdiv i64 %nm1, %parts
  %chunk = add i64 %q, 1
  %cm1 = add i64 %nm1, %chunk
  %chunks64 = sdiv i64 %cm1, %chunk
  %chunks = trunc i64 %chunks64 to i32
  store atomic ptr %body, ptr @job_body monotonic, align 8
  store atomic ptr %data, ptr @job_data monotonic, align 8
  store atomic i64 %begin, ptr @job_begin monotonic, align 8
  store atomic i64 %end, ptr @job_end monotonic, align 8
  store atomic i64 %chunk, ptr @job_chunk monotonic, align 8
  store atomic i32 %chunks, ptr @job_chunks monotonic, align 4
  store atomic i32 0, ptr @done seq_cst, align 4
  store atomic i32 0, ptr @caller_waiting seq_cst, align 4
  %g0 = load atomic i32, ptr @gen seq_cst, align 4
  %g = add i32 %g0, 1
  %g64 = zext i32 %g to i64
  %s = shl i64 %g64, 32
  store atomic i64 %s, ptr @state seq_cst, align 8
  store atomic i32 %g, ptr @gen seq_cst, align 4
  %sl = load atomic i32, ptr @sleepers seq_cst, align 4
  %anyasleep = icmp ne i32 %sl, 0
  br i1 %anyasleep, label %wakeworkers, label %work
wakeworkers:
  call void @futex_wake(ptr @gen)
  br label %work
work:
  call void @run_chunks(i32 %g)
  %t0 = call i64 @llvm.readcyclecounter()
  br label %wait
wait:
  %d = load atomic i32, ptr @done seq_cst, align 4
  %all = icmp eq i32 %d, %chunks
  br i1 %all, label %finish, label %pause
pause:
  call void @spin_hint()
  %t = call i64 @llvm.readcyclecounter()
  %dt = sub i64 %t, %t0
  %long = icmp ugt i64 %dt, CALLER_SPIN
  br i1 %long, label %sleep, label %wait
sleep:
  store atomic i32 1, ptr @caller_waiting seq_cst, align 4
  %d2 = load atomic i32, ptr @done seq_cst, align 4
  %all2 = icmp eq i32 %d2, %chunks
  br i1 %all2, label %finish, label %dosleep
dosleep:
  call void @futex_wait(ptr @done, i32 %d2)
  br label %sleep
finish:
  store atomic i32 0, ptr @busy seq_cst, align 4
  br label %ret
ret:
  ret void
}

; At exit: stops and joins the workers; parallel loops run serially from then on.
define void @kiln_pool_shutdown() {
entry:
  br label %take
take:
  %pair = cmpxchg ptr @busy, i32 0, i32 1 seq_cst seq_cst
  %taken = extractvalue { i32, i1 } %pair, 1
  br i1 %taken, label %stop, label %retry
retry:
  call void @spin_hint()
  br label %take
stop:
  store atomic i32 1, ptr @stop seq_cst, align 4
  %g0 = load atomic i32, ptr @gen seq_cst, align 4
  %g = add i32 %g0, 1
  store atomic i32 %g, ptr @gen seq_cst, align 4
  call void @futex_wake(ptr @gen)
  %n = load atomic i32, ptr @workers seq_cst, align 4
  br label %loop
loop:
  %i = phi i32 [ 0, %stop ], [ %i1, %join ]
  %more = icmp slt i32 %i, %n
  br i1 %more, label %join, label %done
join:
  %i64 = sext i32 %i to i64
  %slot = getelementptr inbounds [MAX_WORKERS x i64], ptr @threads, i64 0, i64 %i64
  %h = load i64, ptr %slot, align 8
  %rc = call i32 @pthread_join(i64 %h, ptr null)
  %i1 = add i32 %i, 1
  br label %loop
done:
  store atomic i32 0, ptr @workers seq_cst, align 4
  store atomic i32 0, ptr @busy seq_cst, align 4
  ret void
}

; In a child forked from this process: its workers did not survive the fork, nor any caller but the forking one.
define void @kiln_pool_after_fork() {
  store atomic i32 0, ptr @workers seq_cst, align 4
  store atomic i32 0, ptr @sleepers seq_cst, align 4
  store atomic i32 0, ptr @busy seq_cst, align 4
  ret void
}

; For tests: how many workers are running.
define i32 @kiln_pool_workers() {
  %n = load atomic i32, ptr @workers seq_cst, align 4
  ret i32 %n
}
"""

_LOCK = threading.Lock()
_ENGINE: Any = None
_WORKERS: Any = None


def _ir_text() -> str:
    x86 = llvm.get_process_triple().startswith(("x86_64", "i686", "i386"))
    values = {
        "SPIN_HINT_DECL": "declare void @llvm.x86.sse2.pause()" if x86 else "",
        "SPIN_HINT_CALL": "call void @llvm.x86.sse2.pause()" if x86 else "",
        "MAX_WORKERS": str(MAX_WORKERS),
        "CHUNKS_PER_THREAD": str(CHUNKS_PER_THREAD),
        "WORKER_SPIN": str(_WORKER_SPIN_CYCLES),
        "CALLER_SPIN": str(_CALLER_SPIN_CYCLES),
        "SYS_FUTEX": str(_SYS_FUTEX),
        "FUTEX_WAIT": str(_FUTEX_WAIT_PRIVATE),
        "FUTEX_WAKE": str(_FUTEX_WAKE_PRIVATE),
    }
    text = _IR
    for name in sorted(values, key=len, reverse=True):  # longest first: no name is a prefix of a longer one's value
        text = text.replace(name, values[name])
    return text


def start() -> None:
    """Compiles the pool once per process and registers `PARALLEL_FOR` for kernels to link against.

    Called by `linker.initialize()` after LLVM's native target is set up. The workers start on the
    first parallel loop; they are stopped and joined at exit.
    """
    global _ENGINE, _WORKERS
    with _LOCK:
        if _ENGINE is not None:
            return
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        mod = llvm.parse_assembly(_ir_text())
        mod.triple = llvm.get_process_triple()
        mod.verify()
        tm = llvm.Target.from_triple(mod.triple).create_target_machine(opt=2, jit=True)
        engine = llvm.create_mcjit_compiler(mod, tm)
        engine.finalize_object()
        llvm.add_symbol(PARALLEL_FOR, engine.get_function_address(PARALLEL_FOR))
        shutdown = ctypes.CFUNCTYPE(None)(engine.get_function_address("kiln_pool_shutdown"))
        after_fork = ctypes.CFUNCTYPE(None)(engine.get_function_address("kiln_pool_after_fork"))
        _WORKERS = ctypes.CFUNCTYPE(ctypes.c_int32)(engine.get_function_address("kiln_pool_workers"))
        _ENGINE = (engine, shutdown, after_fork)  # kept for the life of the process: kernels call into it
        atexit.register(shutdown)
        os.register_at_fork(after_in_child=after_fork)


def workers() -> int:
    """The number of worker threads running (0 before the first parallel loop and after exit)."""
    start()
    return int(_WORKERS())
