"""The linear form of integer loop-IR expressions: `sum(coef * atom) + const`, atoms keyed structurally.

`kiln.tir.simplify.Analyzer` builds these forms (`Analyzer.linear`) to cancel
terms, bound expressions and fold divisions; this module is only the form itself.
"""

from __future__ import annotations

from collections.abc import Hashable

from kiln.tir.expr import Mul, PrimExpr, Var
from kiln.tir.functor import structural_key
from kiln.tir.printer import expr_text

# Integer dtypes whose arithmetic the linear form models (no wrap-around assumed).
LINEAR_DTYPES = ("int8", "int16", "int32", "int64")


class Linear:
    """`sum(coef * atom) + const` over integers of one dtype; atoms keyed structurally."""

    __slots__ = ("const", "dtype", "terms")

    def __init__(self, dtype: str, terms: dict[Hashable, tuple[PrimExpr, int]] | None = None, c: int = 0) -> None:
        self.dtype = dtype
        self.terms: dict[Hashable, tuple[PrimExpr, int]] = {k: v for k, v in (terms or {}).items() if v[1] != 0}
        self.const = c

    @classmethod
    def atom(cls, e: PrimExpr) -> Linear:
        """The form `1 * e`."""
        return cls(e.dtype, {structural_key(e): (e, 1)})

    @property
    def is_const(self) -> bool:
        """Whether the form has no atoms."""
        return not self.terms

    def coef(self, key: Hashable) -> int:
        """The coefficient of the atom with structural key `key` (0 when absent)."""
        return self.terms[key][1] if key in self.terms else 0

    def divisible(self, n: int) -> bool:
        """Whether every value of the form is a multiple of `n`: the constant and every coefficient are."""
        return self.const % n == 0 and all(c % n == 0 for _a, c in self.terms.values())

    def add(self, other: Linear, scale: int = 1) -> Linear:
        """`self + scale * other`."""
        terms = dict(self.terms)
        for k, (a, c) in other.terms.items():
            terms[k] = (a, terms[k][1] + scale * c) if k in terms else (a, scale * c)
        return Linear(self.dtype, terms, self.const + scale * other.const)

    def scale(self, k: int) -> Linear:
        """`k * self`."""
        return Linear(self.dtype, {key: (a, c * k) for key, (a, c) in self.terms.items()}, self.const * k)

    def plus(self, c: int) -> Linear:
        """`self + c`."""
        return Linear(self.dtype, self.terms, self.const + c)

    def sub(self, other: Linear) -> Linear:
        """`self - other`."""
        return self.add(other, -1)

    def __eq__(self, other: object) -> bool:
        """The same form: dtype, constant, and atoms (by structural key) with their coefficients."""
        if not isinstance(other, Linear):
            return NotImplemented
        if self.dtype != other.dtype or self.const != other.const or self.terms.keys() != other.terms.keys():
            return False
        return all(c == other.terms[k][1] for k, (_a, c) in self.terms.items())

    __hash__ = None  # type: ignore[assignment]  # mutable terms: compared, never hashed

    def __repr__(self) -> str:
        terms = " + ".join(f"{c}*{expr_text(a)}" for a, c in sorted(self.terms.values(), key=term_order))
        return f"Linear({self.dtype}: {terms + ' + ' if terms else ''}{self.const})"


def term_order(item: tuple[PrimExpr, int]) -> tuple[int, int, int, str]:
    """The sort key of a (atom, coefficient) term in canonical order."""
    # Larger strides first (`io*16 + ii`), products before variables, then creation order.
    atom, coef = item
    if isinstance(atom, Var):
        return (-abs(coef), 1, atom.uid, "")
    return (-abs(coef), 0 if isinstance(atom, Mul) else 2, 0, expr_text(atom))
