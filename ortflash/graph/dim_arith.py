"""What a dim is and how dims combine, with no graph: the terms (an int, a symbol, ``DimOf``,
``Scaled``, None), their arithmetic, Reshape's target arithmetic, and ``check_shape``. The
evaluator that reads them from a graph is shapes.py, which re-exports these names.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class DimOf:
    """Dim ``axis`` of the tensor whose ``id()`` is ``tensor``, when no name or size is known."""

    tensor: int
    axis: int


@dataclass(frozen=True)
class Scaled:
    """A symbolic dim times a static factor."""

    dim: str | DimOf
    factor: int


Dim = int | str | DimOf | Scaled | None


def same_dim(a: Dim, b: Dim) -> bool:
    """Two dims proved equal: equal static sizes, or one symbolic term."""
    return a is not None and b is not None and a == b


def may_broadcast(a: Dim, b: Dim) -> bool:
    """Two batch dims of operands that may differ at run time by broadcasting: not proved equal,
    and one is 1 or both are static. Symbolic dims that are not proved equal are taken to be one
    size: exporters name one batch several ways, and a broadcast batch is written with a 1."""
    return not same_dim(a, b) and (a == 1 or b == 1 or (isinstance(a, int) and isinstance(b, int)))


def static(d: Dim) -> int | None:
    """d when it is a static size."""
    return d if isinstance(d, int) else None


def times(d: Dim, factor: int) -> Dim:
    """d · factor as a dim term."""
    if d is None:
        return None
    if isinstance(d, int):
        return d * factor
    if isinstance(d, Scaled):
        return Scaled(d.dim, d.factor * factor)
    return d if factor == 1 else Scaled(d, factor)


def divided(d: Dim, divisor: int) -> Dim:
    """d / divisor as a dim term where it divides exactly (integer division of a size)."""
    if isinstance(d, int):
        return d // divisor if d % divisor == 0 else None
    if isinstance(d, Scaled) and d.factor % divisor == 0:
        return times(d.dim, d.factor // divisor)
    return d if divisor == 1 else None


def apply_reshape(target: Sequence[Dim], in_dims: Sequence[Dim] | None, allowzero: bool = False) -> list[Dim]:
    """The output dims of Reshape(x, target) for x of dims in_dims: 0 copies the input dim
    (unless allowzero), -1 is what the element count leaves (None where it cannot be proved)."""
    dims = list(target)
    for i, d in enumerate(dims):
        if d == 0 and not allowzero:
            dims[i] = in_dims[i] if in_dims is not None and i < len(in_dims) else None
    if dims.count(-1) == 1:
        dims[dims.index(-1)] = _quotient(in_dims, [d for d in dims if d != -1])
    return [None if d == -1 else d for d in dims]


def _quotient(total: Sequence[Dim] | None, part: Sequence[Dim]) -> Dim:
    """prod(total) / prod(part) as a dim, when the symbols cancel to at most one left over."""
    if total is None or None in total or None in part:
        return None
    total_int, total_sym = _factor(total)
    part_int, part_sym = _factor(part)
    if total_int is None or part_int is None or part_int <= 0 or total_int % part_int:
        return None
    left = list(total_sym)
    for s in part_sym:
        if s not in left:
            return None
        left.remove(s)
    factor = total_int // part_int
    if not left:
        return factor
    return times(left[0], factor) if len(left) == 1 else None


def _factor(dims: Sequence[Dim]) -> tuple[int | None, list[str | DimOf]]:
    """(the static product, the symbols) of a product of dims."""
    ints: list[int] = []
    syms: list[str | DimOf] = []
    for d in dims:
        if isinstance(d, int):
            ints.append(d)
        elif isinstance(d, Scaled):
            ints.append(d.factor)
            syms.append(d.dim)
        elif d is not None:
            syms.append(d)
        else:
            return None, []
    return math.prod(ints), syms


class Bindings(dict[str, Dim]):
    """Names of dims bound by ``check_shape``: the first use binds, later uses must agree."""


def check_shape(bindings: Bindings, dims: Sequence[Dim] | None, pattern: str) -> bool:
    """Whether dims match pattern (names separated by spaces, ints, or ``_`` for any dim),
    binding each new name; a name already bound must be proved the same dim."""
    names = pattern.split()
    if dims is None or len(dims) != len(names):
        return False
    for name, d in zip(names, dims):
        if name == "_":
            continue
        if name.lstrip("-").isdigit():
            if d != int(name):
                return False
        elif name in bindings:
            if not same_dim(bindings[name], d):
                return False
        else:
            bindings[name] = d
    return True
