"""The pragma of a copy into shared memory that may run asynchronously.

A schedule marks a vectorized copy from global into shared memory with
`Stage.pragma(axis, ASYNC_COPY)`; the CUDA back end then issues it as
`cp.async` (16 bytes, sm_80 and newer; `kiln.codegen.cuda_vector`) and makes
every barrier of the kernel wait for the copies first, so the copy is complete
wherever the loop IR's barriers say it is. Other back ends copy as usual.
"""

from __future__ import annotations

ASYNC_COPY = "kiln.async_copy"

__all__ = ["ASYNC_COPY"]
