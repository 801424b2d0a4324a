"""What the LLVM back end must know of a loop variable's divisions, to keep clear of LLVM 22.1's vectorizer bugs.

Two bugs of LLVM 22.1 miscompile index arithmetic that divides a loop variable (kiln's reshapes,
transposes and broadcasts of fused axes):

- The SLP vectorizer bundles an `add nuw x, 3` with `sub nuw` lanes as `sub nuw x, -3`, poison
  (llvm/llvm-project#209023): kernels that divide a loop variable are optimized without SLP
  (`divides`, `llvm_process.wants_slp`).
- The loop vectorizer takes `p[(i & (2^k - 1)) | base]` (InstCombine's form of kiln's
  `p[base + i % 2^k]` once it knows `base`'s low bits are 0) for a consecutive access over a whole
  vector: with more than 2^k lanes (or interleaved vectors) the lanes past the wrap read
  `p[base + 2^k ...]` instead of `p[base ...]`. Its runtime check only guards the 32-bit overflow
  of `base + VF - 1`, never the wrap of the masked variable. The same code with `add` in place of
  `or disjoint` is left scalar, and with at most 2^k lanes per iteration (the vector starts at a
  multiple of 2^k, where the mask is 0) it is right. So a loop whose variable is divided by a power of
  two gets at most that many lanes and no interleaving (`lane_period`).
"""

from __future__ import annotations

import math

from kiln.ir import graph
from kiln.tir.expr import Add, Cast, Div, FloorDiv, FloorMod, IntImm, Mul, PrimExpr, Sub, Var
from kiln.tir.functor import Node, children
from kiln.tir.stmt import Stmt


def _users(root: Node, variables: tuple[Var, ...]) -> tuple[list[Node], set[int]]:
    """The nodes under `root` (post-order) and the ids of those whose value depends on one of `variables`."""
    uses: set[int] = {id(v) for v in variables}
    nodes = list(graph.post_order([root], children))
    for n in nodes:
        if any(id(c) in uses for c in children(n)):
            uses.add(id(n))
    return nodes, uses


def divides(body: Stmt, *variables: Var) -> bool:
    """Whether `body` divides (or takes the remainder of) an expression of one of `variables`."""
    nodes, uses = _users(body, variables)
    return any(isinstance(n, (FloorDiv, FloorMod, Div)) and id(n.a) in uses for n in nodes)


def _coefficient(e: PrimExpr, uses: set[int]) -> int | None:
    """The integer k with `e == k * var + (terms free of var)`; None when `e` is no such affine form."""
    if id(e) not in uses:
        return 0
    if isinstance(e, Var):
        return 1
    if isinstance(e, Cast):
        return _coefficient(e.value, uses)
    if isinstance(e, (Add, Sub)):
        a, b = _coefficient(e.a, uses), _coefficient(e.b, uses)
        if a is None or b is None:
            return None
        return a + b if isinstance(e, Add) else a - b
    if isinstance(e, Mul):
        for x, k in ((e.a, e.b), (e.b, e.a)):
            if isinstance(k, IntImm):
                c = _coefficient(x, uses)
                return None if c is None else c * int(k.value)
    return None


def lane_period(body: Stmt, var: Var) -> int | None:
    """The fewest consecutive values of `var` over which an index in `body` wraps as `var % 2^k` does.

    For every division or remainder by a power of two m of an affine expression `k * var + ...` of
    `var` (k != 0), the masked value repeats every m / gcd(m, k) values of `var`; the result is the
    least of these, None when there is none (or it is 1: no lane ever wraps). At most that many lanes
    may be vectorized together (module docstring). Divisions of other forms (`(var // 8 + c) % 32`)
    give LLVM no affine masked induction: only their inner divisions count.
    """
    nodes, uses = _users(body, (var,))
    period: int | None = None
    for n in nodes:
        if not isinstance(n, (FloorDiv, FloorMod, Div)) or id(n.a) not in uses or not isinstance(n.b, IntImm):
            continue
        m = int(n.b.value)
        if m < 2 or m & (m - 1):
            continue  # LLVM divides by other constants (urem, udiv): no mask, no wrap to misjudge
        k = _coefficient(n.a, uses)
        if not k:
            continue
        p = m // math.gcd(m, abs(k))
        if p > 1 and (period is None or p < period):
            period = p
    return period
