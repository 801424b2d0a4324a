"""The loop-IR simplifier: constant folding, affine canonical forms, bounds.

Integer index arithmetic (`+`, `-`, `*`, `//`, `%`, min/max) is put in a
canonical *linear form*: a sum of coefficient * atom plus a constant, where an
atom is a variable or an expression the form cannot see into (`n // 16`,
`i * n`, a load). Equal linear forms rebuild to the same expression, so
`(i*4 + j) + 1 - i*4` becomes `j + 1`.

Bounds come from loop ranges (`min <= var <= min + extent - 1`, possibly
symbolic: `var <= n - 1`). To bound a linear form from below, a variable with
a symbolic bound in the needed direction is replaced by that bound (so `n - i`
with `i <= n - 1` is at least 1); what remains is bounded by interval
arithmetic on constant ranges. The bounds decide comparisons, min/max, and
floor division / modulo of affine forms by constants.

Integer overflow is not modelled (as in TVM): index arithmetic is assumed to
stay in range.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext

from kiln.tir import bitwise
from kiln.tir.expr import (
    BITWISE,
    EQ,
    GE,
    GT,
    LE,
    LT,
    NE,
    SHIFTS,
    Add,
    And,
    BinaryOp,
    BufferLoad,
    Call,
    Cast,
    Div,
    ExprLike,
    FloatImm,
    FloorDiv,
    FloorMod,
    IntImm,
    Max,
    Min,
    Mul,
    Not,
    Or,
    PrimExpr,
    Select,
    Sub,
    Var,
    as_expr,
    binary,
    cast,
    const,
    is_float,
    logical_not,
    reinterpret,
    select,
)
from kiln.tir.functor import StmtExprMutator, Substituter, let_chain, same_expr, structural_key, used_vars
from kiln.tir.linear import LINEAR_DTYPES as LINEAR_DTYPES  # re-exported: passes import it from here
from kiln.tir.linear import Linear as Linear
from kiln.tir.linear import term_order
from kiln.tir.stmt import Allocate, Evaluate, For, ForKind, IfThenElse, LetStmt, SeqStmt, Stmt, seq

_DTYPE_RANGE = {"bool": (0, 1), "uint8": (0, 255), "uint16": (0, 2**16 - 1), "uint32": (0, 2**32 - 1),
                "uint64": (0, 2**64 - 1), "int8": (-128, 127), "int16": (-(2**15), 2**15 - 1)}
_AFFINE = (Add, Sub, Mul, Div, FloorDiv, FloorMod, Min, Max)
_BIT_NODES = (*BITWISE, *SHIFTS)  # atoms of the linear form; their rules are in kiln.tir.bitwise
_NEGATE = {LT: GE, LE: GT, GT: LE, GE: LT, EQ: NE, NE: EQ}
_MAX_SUBSTITUTIONS = 32
_MAX_CASE_SPLITS = 2  # min/max atoms a bound looks through, one case pair each (3x the work per level)
_MAX_PRODUCT_TERMS = 16

Interval = tuple[int | None, int | None]


class Analyzer:
    """Simplifies expressions under known variable bounds (inclusive, possibly symbolic)."""

    def __init__(self) -> None:
        self._bounds: dict[Var, tuple[Linear | None, Linear | None]] = {}
        self._visiting: set[Var] = set()
        self._depth: dict[Var, int] = {}  # when each bound was recorded
        # Per node (by id, the node kept alive): its linear form and its interval under the bounds
        # known now, cleared when a bound changes. Nested divisions (a chain of fused reshapes)
        # bound each inner atom from both sides at every level: exponential without this.
        self._linear_memo: dict[int, tuple[PrimExpr, Linear]] = {}
        self._interval_memo: dict[int, tuple[PrimExpr, Interval]] = {}

    def _forget(self) -> None:
        self._linear_memo.clear()
        self._interval_memo.clear()

    # -- bounds -------------------------------------------------------------------------
    @contextmanager
    def bound(self, var: Var, lo: PrimExpr | None, hi: PrimExpr | None) -> Iterator[None]:
        """Within the block, `lo <= var <= hi` (None: unbounded on that side)."""
        old, old_depth = self._bounds.get(var), self._depth.get(var)
        self.set_bound(var, lo, hi)
        try:
            yield
        finally:
            self._forget()
            if old is None or old_depth is None:
                self._bounds.pop(var, None)
                self._depth.pop(var, None)
            else:
                self._bounds[var], self._depth[var] = old, old_depth

    def set_bound(self, var: Var, lo: PrimExpr | None, hi: PrimExpr | None) -> None:
        """Records `lo <= var <= hi` from now on (None: unbounded on that side)."""
        if var.dtype not in LINEAR_DTYPES:
            return
        self._forget()
        lin_lo = None if lo is None else self.linear(lo)
        lin_hi = None if hi is None else self.linear(hi)
        self._bounds[var] = (lin_lo, lin_hi)
        self._depth[var] = max(self._depth.values(), default=0) + 1

    def bound_let(self, var: Var, value: PrimExpr) -> AbstractContextManager[None]:
        """Within the block, `var` (bound by a let to `value`) lies in `value`'s constant interval.

        Constant, not `value` itself: a let's value may use the let before it, and bounding
        each through the next recursed once per let of a chain (a fused kernel has hundreds).
        """
        if var.dtype not in LINEAR_DTYPES or value.dtype != var.dtype:
            return nullcontext()
        lo, hi = self.interval(value)
        return self.bound(var, None if lo is None else const(lo, var.dtype),
                          None if hi is None else const(hi, var.dtype))

    def bound_range(self, var: Var, start: PrimExpr, extent: PrimExpr) -> AbstractContextManager[None]:
        """Within the block, `start <= var < start + extent` (a loop's range: the block is its body).

        The body runs only when the extent is at least 1, so there an extent `max(x, c)` with a
        constant `c <= 0` (a partitioned main part, `max(646 - o*16, 0)`) is `x`: dropping the
        clamp keeps the bound exact where it matters instead of widening it by the empty case.
        """
        return self.bound(var, start, binary(Sub, binary(Add, start, _positive_part(extent)), 1))

    def interval(self, e: PrimExpr) -> Interval:
        """Constant lower and upper bounds of integer `e` (None where unknown)."""
        if e.dtype not in LINEAR_DTYPES:
            return self._atom_interval(e)
        lin = self.linear(e)
        return self.lower(lin), self.upper(lin)

    def lower(self, lin: Linear, splits: int = _MAX_CASE_SPLITS) -> int | None:
        """A constant lower bound of `lin`, or None.

        Variables with symbolic bounds are replaced by them (innermost first), then what is left is
        bounded by intervals; a min/max atom left then (a loop extent `min(197 - o*64, 64)` brought
        in by its variable's bound) is also bounded by cases, up to `splits` atoms deep.
        """
        for _ in range(_MAX_SUBSTITUTIONS):
            lin = self._merge_mod(lin)
            # Innermost first: its bound may use outer variables, which are substituted next.
            best: tuple[int, Var, int, Linear] | None = None
            for atom, coef in lin.terms.values():
                if not isinstance(atom, Var) or atom not in self._bounds:
                    continue
                b = self._bounds[atom][0 if coef > 0 else 1]
                if b is not None and not b.is_const and (best is None or self._depth[atom] > best[0]):
                    best = (self._depth[atom], atom, coef, b)
            if best is None:
                break
            _, var, coef, b = best
            lin = lin.add(Linear.atom(var), -coef).add(b, coef)
        lo = self._interval(lin)[0]
        if splits > 0:
            by_cases = self._lower_by_cases(lin, splits - 1)
            if by_cases is not None and (lo is None or by_cases > lo):
                lo = by_cases
        return lo

    def _lower_by_cases(self, lin: Linear, splits: int) -> int | None:
        """A lower bound of `rest + c*M` for a min/max atom M = op(a, b), from the bounds of `rest + c*a`
        and `rest + c*b`; None when `lin` has no such atom.

        At every point M is a or b, so the form is the min or the max of the two cases: the max when
        c*M is a max (op max with c > 0, op min with c < 0), where either case's bound holds, else the
        min. Unlike the interval of M alone, each case keeps what M shares with the rest: for an index
        `o*64 + i` with `i <= min(197 - o*64, 64) - 1`, the case `197 - o*64` cancels `o`, so the index
        is at most 196, where intervals give 3*64 + 63.
        """
        found = next(((k, a, c) for k, (a, c) in lin.terms.items()
                      if isinstance(a, (Min, Max)) and a.dtype == lin.dtype), None)
        if found is None:
            return None
        key, atom, coef = found
        rest = Linear(lin.dtype, {k: v for k, v in lin.terms.items() if k != key}, lin.const)
        x = self.lower(rest.add(self.linear(atom.a), coef), splits)
        y = self.lower(rest.add(self.linear(atom.b), coef), splits)
        if isinstance(atom, Max) == (coef > 0):  # the form is max(case a, case b)
            return _opt(max, x, y, strict=False)
        return _opt(min, x, y, strict=True)

    def upper(self, lin: Linear) -> int | None:
        """A constant upper bound of `lin`, or None."""
        lo = self.lower(lin.scale(-1))
        return None if lo is None else -lo

    def _interval(self, lin: Linear) -> Interval:
        lo: int | None = lin.const
        hi: int | None = lin.const
        terms = list(lin.terms.values())
        # A//c - B//c where A - B is a constant d lies in [d//c, ceil(d/c)].
        paired: set[int] = set()
        for i, (a, ca) in enumerate(terms):
            if not (isinstance(a, FloorDiv) and isinstance(a.b, IntImm) and a.b.value > 0) or i in paired:
                continue
            for j, (b, cb) in enumerate(terms):
                if j in paired or j == i or cb != -ca or not isinstance(b, FloorDiv):
                    continue
                if not (isinstance(b.b, IntImm) and b.b.value == a.b.value):
                    continue
                d = self.linear(a.a).add(self.linear(b.a), -1)
                if d.is_const:
                    c = a.b.value
                    ends = (ca * (d.const // c), ca * -((-d.const) // c))
                    lo, hi = _add(lo, min(ends)), _add(hi, max(ends))
                    paired.update((i, j))
                    break
        for i, (atom, coef) in enumerate(terms):
            if i in paired:
                continue
            alo, ahi = self._atom_interval(atom)
            if coef < 0:
                alo, ahi = ahi, alo
            lo = None if lo is None or alo is None else lo + coef * alo
            hi = None if hi is None or ahi is None else hi + coef * ahi
        return lo, hi

    def _atom_interval(self, e: PrimExpr) -> Interval:
        if isinstance(e, (IntImm, Var)):
            return self._atom_interval_uncached(e)
        hit = self._interval_memo.get(id(e))
        if hit is None:
            hit = self._interval_memo[id(e)] = (e, self._atom_interval_uncached(e))
        return hit[1]

    def _atom_interval_uncached(self, e: PrimExpr) -> Interval:
        if isinstance(e, IntImm):
            return e.value, e.value
        if isinstance(e, Var):
            if e not in self._bounds or e in self._visiting:
                return _DTYPE_RANGE.get(e.dtype, (None, None))
            self._visiting.add(e)
            try:
                lin_lo, lin_hi = self._bounds[e]
                lo = None if lin_lo is None else self._interval(lin_lo)[0]
                hi = None if lin_hi is None else self._interval(lin_hi)[1]
            finally:
                self._visiting.discard(e)
            return lo, hi
        if isinstance(e, (FloorDiv, FloorMod, Div)) and isinstance(e.b, IntImm) and e.b.value > 0:
            c = e.b.value
            lo, hi = self.interval(e.a)
            if isinstance(e, FloorMod):
                return 0, c - 1
            if isinstance(e, Div) and (lo is None or lo < 0):
                return None, None
            return None if lo is None else lo // c, None if hi is None else hi // c
        if isinstance(e, (Min, Max)):
            (alo, ahi), (blo, bhi) = self.interval(e.a), self.interval(e.b)
            if isinstance(e, Min):
                return _opt(min, alo, blo, strict=True), _opt(min, ahi, bhi, strict=False)
            return _opt(max, alo, blo, strict=False), _opt(max, ahi, bhi, strict=True)
        if isinstance(e, Mul):
            (alo, ahi), (blo, bhi) = self.interval(e.a), self.interval(e.b)
            if alo is None or ahi is None or blo is None or bhi is None:
                return None, None
            corners = [x * y for x in (alo, ahi) for y in (blo, bhi)]
            return min(corners), max(corners)
        if isinstance(e, Select):
            (alo, ahi), (blo, bhi) = self.interval(e.true_value), self.interval(e.false_value)
            return _opt(min, alo, blo, strict=True), _opt(max, ahi, bhi, strict=True)
        if isinstance(e, Cast) and e.dtype in LINEAR_DTYPES and e.value.dtype in (*LINEAR_DTYPES, "bool", "uint8"):
            return self.interval(e.value)
        if isinstance(e, _BIT_NODES) and (known := bitwise.interval(type(e), self.interval(e.a), self.interval(e.b))):
            return known
        return _DTYPE_RANGE.get(e.dtype, (None, None))

    # -- linear forms -------------------------------------------------------------------
    def linear(self, e: PrimExpr) -> Linear:
        """The linear form of integer expression `e` (dtype in `LINEAR_DTYPES`), its atoms simplified."""
        if isinstance(e, (IntImm, Var)):
            return self._linear(e)
        hit = self._linear_memo.get(id(e))
        if hit is None:
            hit = self._linear_memo[id(e)] = (e, self._linear(e))
        return hit[1]

    def _linear(self, e: PrimExpr) -> Linear:
        dt = e.dtype
        if isinstance(e, IntImm):
            return Linear(dt, c=e.value)
        if isinstance(e, Var):
            return Linear.atom(e)
        if isinstance(e, Add):
            return self._merge_div_mod(self.linear(e.a).add(self.linear(e.b)))
        if isinstance(e, Sub):
            return self._merge_div_mod(self.linear(e.a).add(self.linear(e.b), -1))
        if isinstance(e, Mul):
            la, lb = self.linear(e.a), self.linear(e.b)
            if la.is_const:
                return lb.scale(la.const)
            if lb.is_const:
                return la.scale(lb.const)
            if len(la.terms) * len(lb.terms) <= _MAX_PRODUCT_TERMS:
                return self._product(la, lb)
            return Linear.atom(_mul_atom(self.expr_of(la), self.expr_of(lb)))
        if isinstance(e, (FloorDiv, FloorMod, Div)):
            return self._division(e)
        if isinstance(e, (Min, Max)):
            return self._min_max(e)
        s = self._simplify_other(e)
        if isinstance(s, (IntImm, Var, *_AFFINE)) and s is not e:
            return self.linear(s)
        return Linear.atom(s)

    def _product(self, la: Linear, lb: Linear) -> Linear:
        """`la * lb`, distributed: products of atoms become atoms."""
        out = lb.scale(la.const).add(Linear(la.dtype, la.terms), lb.const)
        for a, ca in la.terms.values():
            for b, cb in lb.terms.values():
                out = out.add(Linear.atom(_mul_atom(a, b)), ca * cb)
        return out

    def _division(self, e: FloorDiv | FloorMod | Div) -> Linear:
        dt = e.dtype
        la, lb = self.linear(e.a), self.linear(e.b)
        if la.is_const and lb.is_const and lb.const != 0:
            folded = binary(type(e), const(la.const, dt), const(lb.const, dt))
            assert isinstance(folded, IntImm)
            return Linear(dt, c=folded.value)
        if la.is_const and la.const == 0:
            return Linear(dt)  # 0 // x, 0 % x (x == 0 would be undefined anyway)
        if lb.is_const and lb.const == 1:
            return Linear(dt) if isinstance(e, FloorMod) else la
        if lb.is_const and lb.const > 1:
            c = lb.const
            if isinstance(e, Div):
                lo = self.lower(la)
                if lo is None or lo < 0:  # truncation differs from floor for negatives
                    return Linear.atom(Div(dt, self.expr_of(la), const(c, dt)))
            return self._floor_div_mod(la, c, isinstance(e, FloorMod))
        return Linear.atom(type(e)(dt, self.expr_of(la), self.expr_of(lb)))

    def floordiv(self, la: Linear, c: int) -> Linear:
        """`la // c` for a constant `c >= 1`, as the linear form of `FloorDiv(expr_of(la), c)` would be."""
        if c < 1:
            raise ValueError(f"floordiv by {c}: the divisor must be at least 1")
        return la if c == 1 else self._floor_div_mod(la, c, mod=False)

    def _floor_div_mod(self, la: Linear, c: int, mod: bool) -> Linear:
        """`la // c` or `la % c` for a constant c > 1: la = c*Q + R with R's bounds deciding the rest."""
        dt = la.dtype
        q0, r0 = divmod(la.const, c)
        q = Linear(dt, {k: (a, v // c) for k, (a, v) in la.terms.items() if v % c == 0}, q0)
        r = Linear(dt, {k: (a, v) for k, (a, v) in la.terms.items() if v % c != 0}, r0)
        lo, hi = self.lower(r), self.upper(r)
        if lo is not None and hi is not None and lo // c == hi // c:
            k = lo // c
            return r.plus(-k * c) if mod else q.plus(k)
        if mod:
            return Linear.atom(FloorMod(dt, self.expr_of(r), const(c, dt)))
        return q.add(Linear.atom(FloorDiv(dt, self.expr_of(r), const(c, dt))))

    def _merge_mod(self, lin: Linear) -> Linear:
        """Rewrites `k*X - k*c*(X // c)` into `k*(X % c)`."""
        for _key, (atom, m) in list(lin.terms.items()):
            if not (isinstance(atom, FloorDiv) and isinstance(atom.b, IntImm) and atom.b.value > 1):
                continue
            c = atom.b.value
            if m % c != 0:
                continue
            k = -m // c
            x = self.linear(atom.a)
            if x.is_const or any(lin.coef(key) != k * v for key, (_a, v) in x.terms.items()):
                continue
            rest = lin.add(x, -k).add(Linear.atom(atom), -m)
            mod = self._floor_div_mod(x, c, mod=True)
            return self._merge_mod(rest.add(mod, k))
        return lin

    def _merge_div_mod(self, lin: Linear) -> Linear:
        """Rewrites `k*c*(X // c) + k*(X % c)` into `k*X` (floor division: X == c*(X // c) + X % c).

        A flattened index of a fused axis (`(p // W) * W + p % W`) is then `p` again: affine, so a
        vectorized loop over `p` reads consecutive elements and bound inference gets exact regions.
        """
        for key, (atom, k) in list(lin.terms.items()):
            if not (isinstance(atom, FloorMod) and isinstance(atom.b, IntImm) and atom.b.value > 1):
                continue
            c = atom.b.value
            div_key = structural_key(FloorDiv(atom.dtype, atom.a, atom.b))
            if div_key not in lin.terms or lin.coef(div_key) != k * c:
                continue
            rest = Linear(lin.dtype, {x: v for x, v in lin.terms.items() if x not in (key, div_key)}, lin.const)
            return self._merge_div_mod(rest.add(self.linear(atom.a), k))
        return lin

    def _min_max(self, e: Min | Max) -> Linear:
        la, lb = self.linear(e.a), self.linear(e.b)
        return self.min_of(la, lb) if isinstance(e, Min) else self.max_of(la, lb)

    def min_of(self, la: Linear, lb: Linear) -> Linear:
        """`min(la, lb)`: one of them where the bounds of `la - lb` decide, else a `Min` atom."""
        return self._pick(la, lb, Min)

    def max_of(self, la: Linear, lb: Linear) -> Linear:
        """`max(la, lb)`: one of them where the bounds of `la - lb` decide, else a `Max` atom."""
        return self._pick(la, lb, Max)

    def _pick(self, la: Linear, lb: Linear, op: type[Min] | type[Max]) -> Linear:
        d = la.add(lb, -1)
        lo, hi = self.lower(d), self.upper(d)
        a_smaller = hi is not None and hi <= 0
        a_larger = lo is not None and lo >= 0
        if a_smaller or a_larger:
            return la if a_smaller == (op is Min) else lb
        return Linear.atom(op(la.dtype, self.expr_of(la), self.expr_of(lb)))

    def expr_of(self, lin: Linear) -> PrimExpr:
        """The expression of a linear form, in canonical order."""
        dt = lin.dtype
        items = sorted(lin.terms.values(), key=term_order)
        pos = [(a, c) for a, c in items if c > 0]
        neg = [(a, -c) for a, c in items if c < 0]

        def term(a: PrimExpr, c: int) -> PrimExpr:
            return a if c == 1 else Mul(dt, a, const(c, dt))

        out: PrimExpr | None = None
        for a, c in pos:
            out = term(a, c) if out is None else Add(dt, out, term(a, c))
        k = lin.const
        if out is None and neg and k >= 0:
            out, k = const(k, dt), 0  # `n - i`, `0 - i`
        for a, c in neg:
            out = Mul(dt, a, const(-c, dt)) if out is None else Sub(dt, out, term(a, c))
        if out is None:
            return const(k, dt)
        if k > 0:
            out = Add(dt, out, const(k, dt))
        elif k < 0:
            out = Sub(dt, out, const(-k, dt))
        return out

    # -- expressions --------------------------------------------------------------------
    def simplify(self, e: PrimExpr) -> PrimExpr:
        """`e` simplified under the bounds known now."""
        if e.dtype in LINEAR_DTYPES and isinstance(e, (Var, IntImm, *_AFFINE)):
            return self.expr_of(self._merge_mod(self.linear(e)))
        return self._simplify_other(e)

    def _simplify_other(self, e: PrimExpr) -> PrimExpr:
        if isinstance(e, (Var, IntImm, FloatImm)):
            return e
        if isinstance(e, (EQ, NE, LT, LE, GT, GE)):
            return self._compare(e)
        if isinstance(e, (And, Or)):
            return self._logical(e)
        if isinstance(e, Not):
            a = self.simplify(e.a)
            if isinstance(a, Not):
                return a.a
            if type(a) in _NEGATE and isinstance(a, BinaryOp) and not is_float(a.a.dtype):
                return self._compare(_NEGATE[type(a)]("bool", a.a, a.b))
            return logical_not(a)
        if isinstance(e, BinaryOp):
            return self._arith(e)
        if isinstance(e, Cast):
            return _fold_cast(e.dtype, self.simplify(e.value))
        if isinstance(e, Select):
            c = self.simplify(e.cond)
            t, f = self.simplify(e.true_value), self.simplify(e.false_value)
            if same_expr(t, f):
                return t
            return select(c, t, f)
        if isinstance(e, Call):
            args = tuple(self.simplify(a) for a in e.args)
            return reinterpret(args[0], e.dtype) if e.name == "reinterpret" else Call(e.dtype, e.name, args)
        if isinstance(e, BufferLoad):
            return BufferLoad(e.dtype, e.buffer, tuple(self.simplify(i) for i in e.indices))
        raise TypeError(f"unknown loop-IR expression {type(e).__name__}")

    def _arith(self, e: BinaryOp) -> PrimExpr:
        """Float (and non-linear integer) arithmetic: fold constants and identities."""
        a, b = self.simplify(e.a), self.simplify(e.b)
        one = _is_const(b, 1)
        if isinstance(e, Add) and _is_const(a, 0):
            return b
        if isinstance(e, (Add, Sub)) and _is_const(b, 0):
            return a
        if isinstance(e, Mul) and _is_const(a, 1):
            return b
        if isinstance(e, (Mul, Div)) and one:
            return a
        if isinstance(e, (Min, Max)) and same_expr(a, b):
            return a
        if isinstance(e, _BIT_NODES) and (known := bitwise.identity(type(e), a, b, same_expr(a, b))) is not None:
            return known
        return binary(type(e), a, b)

    def _compare(self, e: BinaryOp) -> PrimExpr:
        a, b = self.simplify(e.a), self.simplify(e.b)
        if a.dtype not in LINEAR_DTYPES:
            return binary(type(e), a, b)
        la, lb = self.linear(a), self.linear(b)
        # Decide `d >= 0` (ordering) or `d == 0` (equality) from bounds.
        if isinstance(e, (LT, LE)):
            d = lb.add(la, -1).plus(-1 if isinstance(e, LT) else 0)
        elif isinstance(e, (GT, GE)):
            d = la.add(lb, -1).plus(-1 if isinstance(e, GT) else 0)
        else:
            d = la.add(lb, -1)
        lo, hi = self.lower(d), self.upper(d)
        if isinstance(e, (EQ, NE)):
            if d.is_const or (lo is not None and lo > 0) or (hi is not None and hi < 0):
                return const(d.is_const and d.const == 0 if isinstance(e, EQ) else not (d.is_const and d.const == 0))
        elif lo is not None and lo >= 0:
            return const(True)
        elif hi is not None and hi < 0:
            return const(False)
        if isinstance(e, (LT, LE, GT, GE)):
            undivided = self._undivided(e, la.sub(lb))
            if undivided is not None:
                return self._compare(undivided)
        # Undecided: cancel the terms both sides share, keep the sides readable.
        la, lb = Linear(la.dtype, la.terms, la.const), Linear(lb.dtype, lb.terms, lb.const)
        for key, (_atom, c) in list(la.terms.items()):
            if lb.coef(key) == c:
                del la.terms[key], lb.terms[key]
        return type(e)("bool", self.expr_of(la), self.expr_of(lb))

    def _undivided(self, e: BinaryOp, d: Linear) -> BinaryOp | None:
        """Ordering `e`, `d op 0` with `d = s*(x // c) + r` (s = ±1, c > 0, r constant), as `x < c*k`
        or `x >= c*k` (floor division: `x // c < k` is `x < c*k`); None for another `d`.

        te writes the tail guard of a split of fused axes as `(o*16 + i) // 14 < 14`; as
        `o*16 + i < 196` it is affine in `o`, so loop partitioning can take it out of the main part.
        """
        if len(d.terms) != 1:
            return None
        ((atom, s),) = d.terms.values()
        if not (isinstance(atom, FloorDiv) and isinstance(atom.b, IntImm) and atom.b.value > 0 and s in (1, -1)):
            return None
        # with q = x // c: `d op 0` is `q < k` (below) or `q >= k`, k = -s*r, +1 where `op` is not strict
        # in that direction (q <= t is q < t + 1, q > t is q >= t + 1)
        below = isinstance(e, (LT, LE)) == (s == 1)
        k = -s * d.const + (1 if isinstance(e, (LE, GT)) == (s == 1) else 0)
        bound = const(atom.b.value * k, atom.dtype)
        return LT("bool", atom.a, bound) if below else GE("bool", atom.a, bound)

    def _logical(self, e: And | Or) -> PrimExpr:
        a, b = self.simplify(e.a), self.simplify(e.b)
        absorbing = isinstance(e, Or)  # `x or True` is True, `x and False` is False
        for x, y in ((a, b), (b, a)):
            if isinstance(x, IntImm):
                return const(absorbing) if bool(x.value) == absorbing else y
        if same_expr(a, b):
            return a
        return type(e)("bool", a, b)


def _mul_atom(a: PrimExpr, b: PrimExpr) -> PrimExpr:
    # Operands in a fixed order so that `i*j` and `j*i` are one atom.
    if str(structural_key(b)) < str(structural_key(a)):
        a, b = b, a
    return Mul(a.dtype, a, b)


def _positive_part(extent: PrimExpr) -> PrimExpr:
    """`extent` where it is at least 1: `max(x, c)` for a constant `c <= 0` is `x` there (inside a `min`, too)."""
    if isinstance(extent, Max):
        for x, c in ((extent.a, extent.b), (extent.b, extent.a)):
            if isinstance(c, IntImm) and c.value <= 0:
                return _positive_part(x)
    if isinstance(extent, Min):
        a, b = _positive_part(extent.a), _positive_part(extent.b)
        if a is not extent.a or b is not extent.b:
            return Min(extent.dtype, a, b)
    return extent


def _is_const(e: PrimExpr, v: int) -> bool:
    return isinstance(e, (IntImm, FloatImm)) and e.value == v


def _add(x: int | None, y: int) -> int | None:
    return None if x is None else x + y


def _opt(fn: Callable[[int, int], int], x: int | None, y: int | None, strict: bool) -> int | None:
    """min/max of optional bounds: `strict` -> None if either is None, else ignores a None."""
    if x is None or y is None:
        return None if strict else (y if x is None else x)
    return fn(x, y)


def _fold_cast(dtype: str, v: PrimExpr) -> PrimExpr:
    """A cast; `cast` folds constants as C converts them (truncation, wrap-around)."""
    return cast(dtype, v)


# ---------------------------------------------------------------------------
# Public entry points
# ---------------------------------------------------------------------------


def linear_form(e: PrimExpr) -> Linear:
    """The canonical linear form of integer `e` (dtype in `LINEAR_DTYPES`) under no variable bounds.

    Rebuild it with `Analyzer().expr_of`. For many forms, one `Analyzer` (which
    memoizes per node) is cheaper than this helper's fresh one per call.
    """
    return Analyzer().linear(e)


def simplify(expr: ExprLike, bounds: Mapping[Var, tuple[ExprLike | None, ExprLike | None]] | None = None) -> PrimExpr:
    """Simplifies an expression.

    Args:
        expr: the expression.
        bounds: per variable, a half-open range `(lo, hi)`: `lo <= var < hi`
            (either side may be None, or a symbolic expression).

    Returns:
        The simplified expression (the same value for every assignment within the bounds).
    """
    ana = Analyzer()
    for var, (lo, hi) in (bounds or {}).items():
        ana.set_bound(
            var,
            None if lo is None else as_expr(lo, var.dtype),
            None if hi is None else binary(Sub, as_expr(hi, var.dtype), 1),
        )
    return ana.simplify(as_expr(expr))


class StmtSimplifier(StmtExprMutator):
    """Simplifies every expression of a statement under the bounds of its enclosing loops."""

    def __init__(self, analyzer: Analyzer | None = None) -> None:
        self.analyzer = analyzer or Analyzer()

    def visit_expr(self, e: PrimExpr) -> PrimExpr:
        return self.analyzer.simplify(e)

    def visit_for(self, s: For) -> Stmt:
        lo, ext = self.analyzer.simplify(s.min), self.analyzer.simplify(s.extent)
        if isinstance(ext, IntImm) and ext.value <= 0:
            return _EMPTY
        if isinstance(ext, IntImm) and ext.value == 1 and s.kind is not ForKind.THREAD_BINDING:
            return self.visit_stmt(Substituter({s.loop_var: lo}).visit_stmt(s.body))
        with self.analyzer.bound_range(s.loop_var, lo, ext):
            body = self.visit_stmt(s.body)
        if _is_empty(body):
            return _EMPTY
        if lo is s.min and ext is s.extent and body is s.body:
            return s
        return For(s.loop_var, lo, ext, s.kind, body, s.thread_tag, s.annotations)

    def visit_if_then_else(self, s: IfThenElse) -> Stmt:
        cond = self.analyzer.simplify(s.cond)
        if isinstance(cond, IntImm):
            if cond.value:
                return self.visit_stmt(s.then_case)
            return _EMPTY if s.else_case is None else self.visit_stmt(s.else_case)
        then = self.visit_stmt(s.then_case)
        other = None if s.else_case is None else self.visit_stmt(s.else_case)
        if other is not None and _is_empty(other):
            other = None
        if _is_empty(then):
            return _EMPTY if other is None else IfThenElse(self.analyzer.simplify(logical_not(cond)), other)
        return IfThenElse(cond, then, other)

    def visit_let_stmt(self, s: LetStmt) -> Stmt:
        # A chain of lets is walked in a loop, and the unused ones are found in one pass backwards
        # (a fused kernel binds each shared value: hundreds of lets, each as deep as the chain).
        chain = let_chain(s)
        values: list[PrimExpr] = []
        with ExitStack() as scope:
            for let in chain:
                value = self.analyzer.simplify(let.value)
                values.append(value)
                scope.enter_context(self.analyzer.bound_let(let.var, value))
            body = self.visit_stmt(chain[-1].body)
        if _is_empty(body):
            return body
        used = used_vars(body)
        for let, value in zip(reversed(chain), reversed(values), strict=True):
            if let.var in used:
                used |= used_vars(value)
                body = LetStmt(let.var, value, body)
        return body

    def visit_allocate(self, s: Allocate) -> Stmt:
        body = self.visit_stmt(s.body)
        return _EMPTY if _is_empty(body) else Allocate(s.buffer, body)

    def visit_seq_stmt(self, s: SeqStmt) -> Stmt:
        return seq(*(self.visit_stmt(c) for c in s.stmts))

    def visit_evaluate(self, s: Evaluate) -> Stmt:
        value = self.analyzer.simplify(s.value)
        return _EMPTY if isinstance(value, (IntImm, FloatImm)) else Evaluate(value)


_EMPTY = SeqStmt(())


def _is_empty(s: Stmt) -> bool:
    return isinstance(s, SeqStmt) and not s.stmts


def simplify_stmt(stmt: Stmt, analyzer: Analyzer | None = None) -> Stmt:
    """Simplifies a statement: expressions, decided ifs, loops of extent 0 (dropped) and 1 (inlined).

    Args:
        stmt: the statement.
        analyzer: known bounds of the free variables (e.g. size vars >= 0), if any.

    Returns:
        An equivalent statement; an empty `SeqStmt` when nothing is left to do.
    """
    return StmtSimplifier(analyzer).visit_stmt(stmt)
