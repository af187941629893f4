"""Dims as terms: a dim that is a sum of symbols (a KV cache's ``past + seq``) as a linear form, so
that two dims are proved equal when their forms are; and the dims of a broadcast, as the deep
reading of graph/interpret proves them.

Sums are written as ONNX Runtime's symbolic shape inference names them, and a Slice of a static
axis cut to a symbolic length as ``min(e, N)`` (``CAPPED``).
"""

from __future__ import annotations

from . import shapes
from .terms import Atom, Lin


def dims_equal(a: shapes.Dim, b: shapes.Dim) -> bool:
    """Two dims proved equal (sums of symbols compared as linear forms)."""
    if shapes.same_dim(a, b):
        return True
    la, lb = dim_lin(a), dim_lin(b)
    return la is not None and la == lb


# Sums of symbolic dims (a KV cache's past + new) are written as ONNX Runtime's symbolic shape
# inference names them: "past + seq", symbols sorted, a constant last. A symbol is taken apart
# only where every term is a plain name or an integer.
_SUM = " + "


def dim_lin(d: shapes.Dim) -> Lin | None:
    """d as a linear form over dim atoms; None for an unknown dim."""
    if d is None:
        return None
    if isinstance(d, int):
        return Lin((), d)
    if isinstance(d, str) and _SUM in d:
        terms = d.split(_SUM)
        if all(t.strip() and (t.isdigit() or t.isidentifier()) for t in terms):
            coeffs: dict[Atom, int] = {}
            const = 0
            for t in terms:
                if t.isdigit():
                    const += int(t)
                else:
                    coeffs[("d", t)] = coeffs.get(("d", t), 0) + 1
            return Lin.of(coeffs, const)
    return Lin.of({("d", d): 1})


def lin_dim(lin: Lin) -> shapes.Dim:
    """The dim term of a linear form over dim atoms (a sum of names written as _SUM does)."""
    if not lin.coeffs:
        return lin.const if lin.const >= 0 else None
    if lin.const == 0 and len(lin.coeffs) == 1:
        (atom, coef) = lin.coeffs[0]
        if atom[0] == "d" and coef == 1:
            return atom[1]  # type: ignore[return-value]
    names: list[str] = []
    for atom, coef in lin.coeffs:
        if atom[0] != "d" or not isinstance(atom[1], str) or not atom[1].isidentifier() or coef < 1:
            return None
        names += [atom[1]] * coef
    if lin.const < 0:
        return None
    return _SUM.join(sorted(names) + ([str(lin.const)] if lin.const else []))


def dim_sum(parts: list[shapes.Dim], signs: list[int] | None = None) -> shapes.Dim:
    """sum(sign * part) as a dim term; None where a part is unknown or the sum cannot be written."""
    total = Lin()
    for k, d in enumerate(parts):
        lin = dim_lin(d)
        if lin is None:
            return None
        total = total.plus(lin, 1 if signs is None else signs[k])
    return lin_dim(total)


CAPPED = "min("  # "min(e, N)": Slice(x, 0, e) of an axis of static size N > 1


def _capped_meets(capped: shapes.Dim, other: shapes.Dim) -> bool:
    """Whether capped is "min(e, N)" and other is e: broadcast together they run only where
    min(e, N) is e or 1, and it is 1 (N > 1) only where e is 1; so the result is e."""
    return (
        isinstance(capped, str)
        and isinstance(other, str)
        and capped == f"{CAPPED}{other}, " + capped.rsplit(", ", 1)[-1]
    )


def broadcast_dims(parts: list[list[shapes.Dim]]) -> list[shapes.Dim] | None:
    """The dims of a broadcast result, None on an axis where two symbols are not proved equal
    (the other axes stay proved); None for all when two static sizes clash. A static size above
    1 is the result against a symbol: the symbol is either 1 or that size."""
    rank = max(len(p) for p in parts)
    out: list[shapes.Dim] = [1] * rank
    for p in parts:
        for a, d in enumerate(p, rank - len(p)):
            o = out[a]
            if d == 1 or shapes.same_dim(o, d) or _capped_meets(d, o):
                continue
            if _capped_meets(o, d):
                out[a] = d
            elif isinstance(d, int) and not isinstance(o, int):
                out[a] = d
            elif isinstance(o, int) and o != 1 and not isinstance(d, int):
                continue
            elif isinstance(o, int) and isinstance(d, int) and o != 1:
                return None
            elif o == 1:
                out[a] = d
            else:
                out[a] = None
    return out


def decided_equal(x: shapes.Dim, y: shapes.Dim) -> bool | None:
    """Whether two shape entries are equal, where that is decided (a dim is never negative)."""
    if isinstance(x, int) and isinstance(y, int):
        return x == y
    if x is None or y is None:
        return None
    if shapes.same_dim(x, y):
        return True
    if (isinstance(x, int) and x < 0) or (isinstance(y, int) and y < 0):
        return False
    return None
