"""The compiled CPU kernel for FlashAttention: ISA dispatch and the numpy-facing call.

The C++ kernel (``csrc/``) is built three times, as ``_flash_avx512``, ``_flash_avx2`` and
``_flash_generic``; this module imports the best one the CPU runs, or the one the environment
variable ``ORTFLASH_CPU_ISA`` names (``avx512``, ``avx2`` or ``generic``). An override the CPU
cannot run falls back to the best build it can, with a warning; where no compiled build can be
imported at all, :func:`flash_attention` runs ``reference.flash_attention`` and says why, once.
"""

from __future__ import annotations

import functools
import importlib
import os
import re
import warnings
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from ..op import spec
from ..op.policy import SoftmaxPolicy
from . import reference

ISA_ENV = "ORTFLASH_CPU_ISA"

# Best first: the ISA builds and the CPU features each needs (as cpu_features() names them).
ISA_REQUIREMENTS: dict[str, tuple[str, ...]] = {
    "avx512": ("avx512f", "avx512dq", "avx512vl", "avx512bw", "avx2", "fma", "f16c"),
    "avx2": ("avx2", "fma", "f16c"),
    "generic": (),
}

# Query rows per work item. On the 2-core AVX2 EPYC 32, 64, 96 and 128 ran within noise of
# each other at S=2048 (both softmax modes); 64 keeps the naive mode's score rows small.
QUERY_TILE = 64
# Fewest rows per work item when a call has too few (batch, head, tile) items for its threads:
# the micro-kernel's row block.
MIN_QUERY_TILE = 6


def query_tile(batch_heads: int, sq: int, threads: int) -> int:
    """Rows per work item: QUERY_TILE, halved while that leaves a thread without work."""
    rows = QUERY_TILE
    while rows // 2 >= MIN_QUERY_TILE and batch_heads * -(-sq // rows) < threads:
        rows //= 2
    return rows


@dataclass(frozen=True)
class Selection:
    """The build in use: its module (None: the numpy reference) and the ISA name."""

    module: ModuleType | None
    isa: str


def _import_build(isa: str) -> ModuleType:
    return importlib.import_module(f"{__package__}._flash_{isa}")


def _cpu_features() -> frozenset[str]:
    """The CPU's features, asked of any build that imports (they all share the probe)."""
    for isa in reversed(tuple(ISA_REQUIREMENTS)):
        try:
            return frozenset(_import_build(isa).cpu_features())
        except ImportError:
            continue
    return frozenset()


def _best_build(features: frozenset[str]) -> tuple[ModuleType | None, str, str]:
    """(module, isa, why none) for the best build this CPU runs."""
    failures = []
    for isa, needs in ISA_REQUIREMENTS.items():
        if not set(needs) <= features:
            continue
        try:
            return _import_build(isa), isa, ""
        except ImportError as error:
            failures.append(f"{isa}: {error}")
    return None, "reference", "; ".join(failures) or "no build for this CPU"


@functools.cache
def _select(requested: str) -> Selection:
    """The build for an ORTFLASH_CPU_ISA value ('' = automatic); warns once per value."""
    features = _cpu_features()
    if requested:
        if not re.fullmatch(r"[a-z0-9_]+", requested):
            raise ValueError(f"{ISA_ENV}={requested!r} is not an ISA name (avx512, avx2 or generic)")
        try:
            module = _import_build(requested)
        except ImportError as error:
            warnings.warn(
                f"ortflash: {ISA_ENV}={requested} names no importable CPU kernel ({error}); "
                "FlashAttention runs the numpy reference kernel (slow)",
                RuntimeWarning,
                stacklevel=3,
            )
            return Selection(None, "reference")
        missing = sorted(set(ISA_REQUIREMENTS.get(requested, ())) - features)
        if not missing:
            return Selection(module, requested)
        best, isa, why = _best_build(features)
        warnings.warn(
            f"ortflash: {ISA_ENV}={requested} needs CPU features this machine lacks ({', '.join(missing)}); "
            f"using the {isa} kernel instead" + (f" ({why})" if why else ""),
            RuntimeWarning,
            stacklevel=3,
        )
        return Selection(best, isa)
    best, isa, why = _best_build(features)
    if best is None:
        warnings.warn(
            f"ortflash: the compiled CPU kernel is not available ({why}); FlashAttention runs the numpy "
            "reference kernel (slow). Reinstall ortflash with a C++ compiler present to build it.",
            RuntimeWarning,
            stacklevel=3,
        )
    return Selection(best, isa)


def selection() -> Selection:
    return _select(os.environ.get(ISA_ENV, "").strip().lower())


def available() -> bool:
    """True when a compiled kernel runs FlashAttention (not the numpy fallback)."""
    return selection().module is not None


def isa() -> str:
    """'avx512', 'avx2', 'generic', or 'reference' when no compiled kernel is available."""
    return selection().isa


def default_threads() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _as_4d(t: np.ndarray) -> np.ndarray:
    return t.reshape((1,) * (4 - t.ndim) + t.shape) if t.ndim < 4 else t


Operands = tuple[np.ndarray, np.ndarray, np.ndarray, "np.ndarray | None", "np.ndarray | None"]
_FLOATS = (np.float32, np.float16)
_BOOLS = (np.bool_,)


def _broadcast_operand(
    t: np.ndarray | None, dtypes: tuple[type, ...], scores: tuple[int, int, int, int]
) -> np.ndarray | None:
    """A bias or mask as the kernel reads it (4-D, strided), or None where it does not fit the scores."""
    t = np.asarray(t)
    if t.ndim > 4 or any(n != 1 and n != m for n, m in zip(_as_4d(t).shape, scores)):
        return None
    return _as_4d(t if t.dtype in dtypes else t.astype(dtypes[0]))


def _dense(t: np.ndarray) -> np.ndarray:
    # No copy for what the kernel takes as it is: C-contiguous float32 or float16.
    if t.dtype in _FLOATS and t.flags.c_contiguous:
        return t
    return np.ascontiguousarray(t if t.dtype in _FLOATS else t.astype(np.float32))


def _kernel_operands(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, bias: np.ndarray | None, mask: np.ndarray | None
) -> Operands | None:
    """The arrays the compiled kernel takes, or None where only the reference handles the call
    (shapes outside the kernel's contract: the reference then decides, error or result)."""
    q, k, v = np.asarray(q), np.asarray(k), np.asarray(v)
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        return None
    b, hq, sq, d = q.shape
    if (
        k.shape[0] != b
        or v.shape[0] != b
        or k.shape[1] == 0
        or hq % k.shape[1]
        or k.shape[3] != d
        or v.shape[1:3] != k.shape[1:3]
        or min(q.shape + k.shape + v.shape) == 0
    ):
        return None
    scores = (b, hq, sq, k.shape[2])
    bias_4d = None if bias is None else _broadcast_operand(bias, _FLOATS, scores)
    mask_4d = None if mask is None else _broadcast_operand(mask, _BOOLS, scores)
    if (bias is not None and bias_4d is None) or (mask is not None and mask_4d is None):
        return None
    return _dense(q), _dense(k), _dense(v), bias_4d, mask_4d


@dataclass(frozen=True)
class KernelCall:
    """A node's attributes validated and resolved into the compiled kernel's scalar arguments.

    It depends on the attributes and the policy override only, so it is resolved once per
    distinct set of them (:func:`kernel_call`), not on every call: the validation used to
    be about a third of a decode step's Python time per node.
    """

    policy: SoftmaxPolicy  # the node's own, with the override applied
    scale: float
    is_causal: int
    mask_fill: float
    zero_rows: bool
    softcap: float
    block_size: int
    bias_after_mask: bool
    window_left: int  # spec.py: -1 unbounded
    window_right: int

    def run(
        self,
        module: ModuleType,
        q: np.ndarray,
        k: np.ndarray,
        v: np.ndarray,
        bias: np.ndarray | None,
        mask: np.ndarray | None,
        threads: int,
    ) -> np.ndarray:
        """O by the compiled kernel ``module`` on operands laid out for it (bias and mask 4-D): the one
        place these fields become its arguments. What the kernel refuses raises (TypeError, ValueError,
        BufferError, IndexError); PreparedCall then goes the general way."""
        out = np.empty(q.shape[:3] + v.shape[3:], dtype=q.dtype)
        # Positional: the module parses these about 1 us faster than as keywords.
        module.flash_attention(
            q,
            k,
            v,
            out,
            bias,
            mask,
            self.scale,
            self.is_causal,
            self.mask_fill,
            self.zero_rows,
            self.softcap,
            self.policy.choose(k.shape[2]) == "online",
            self.block_size,
            query_tile(q.shape[0] * q.shape[1], q.shape[2], threads),
            threads,
            self.bias_after_mask,
            self.window_left,
            self.window_right,
        )
        return out


def _resolve(attrs: dict[str, Any], policy: SoftmaxPolicy | None) -> KernelCall:
    attrs = spec.validate(attrs)
    resolved = SoftmaxPolicy.for_node(attrs, policy)
    return KernelCall(
        policy=resolved,
        scale=float(attrs["scale"]),
        is_causal=int(attrs["is_causal"]),
        mask_fill=float(attrs["mask_fill"]),
        zero_rows=attrs["masked_rows"] == "zero",
        softcap=float(attrs["softcap"]),
        block_size=int(resolved.block_size or spec.ATTRIBUTES["block_size"].default),  # type: ignore[call-overload]
        bias_after_mask=bool(attrs["bias_after_mask"]),
        window_left=int(attrs["window_left"]),
        window_right=int(attrs["window_right"]),
    )


AttributeKey = tuple[tuple[str, type, Any], ...]


@functools.lru_cache(maxsize=1024)
def _resolve_cached(key: AttributeKey, policy: SoftmaxPolicy | None) -> KernelCall:
    return _resolve({name: value for name, _, value in key}, policy)


def kernel_call(attrs: dict[str, Any], policy: SoftmaxPolicy | None = None) -> KernelCall:
    """The resolved call for these attributes (validated once per distinct set; SpecError if bad).

    The cache key holds each value's type as well as the value: ``True == 1`` and ``1.0 == 1``
    in Python, but ``is_causal=True`` and ``block_size=1.0`` are errors that must not hit the
    entry of a valid set. Unhashable values are resolved without the cache.
    """
    key = tuple((name, type(value), value) for name, value in attrs.items())
    try:
        return _resolve_cached(key, policy)
    except TypeError as error:
        if "unhashable" not in str(error):
            raise
        return _resolve(attrs, policy)


@dataclass(frozen=True)
class PreparedCall:
    """:func:`flash_attention` for one set of attributes, resolved once (the bridge keeps one per node).

    A call through it does only what depends on the arrays: the compiled kernel checks their
    shapes, dtypes and layout itself, and whatever it refuses (a rank below 4, float64, a bias
    that does not broadcast, no keys) goes through :func:`flash_attention`, which decides as
    it always does. ``threads`` is resolved when prepared (None: the cores this process may
    run on then). About 2 us of Python per call instead of about 15 (Sq=Sk=16, D=32;
    benchmarks/results/fixed_cost.md).
    """

    module: ModuleType
    call: KernelCall
    threads: int
    policy: SoftmaxPolicy | None
    attrs: dict[str, Any]

    def __call__(
        self, q: np.ndarray, k: np.ndarray, v: np.ndarray, bias: np.ndarray | None, mask: np.ndarray | None
    ) -> np.ndarray:
        try:
            bias_4d = bias if bias is None or bias.ndim == 4 else _as_4d(bias)
            mask_4d = mask if mask is None or mask.ndim == 4 else _as_4d(mask)
            return self.call.run(self.module, q, k, v, bias_4d, mask_4d, self.threads)
        except (TypeError, ValueError, BufferError, IndexError):  # outside the compiled kernel's contract
            return flash_attention(q, k, v, bias, mask, policy=self.policy, threads=self.threads, **self.attrs)


def prepare(
    attrs: dict[str, Any], *, policy: SoftmaxPolicy | None = None, threads: int | None = None
) -> PreparedCall | None:
    """The resolved call of :func:`flash_attention` for these attributes (SpecError if they are bad);
    None where no compiled kernel is available."""
    module = selection().module
    if module is None:
        return None
    workers = int(threads) if threads is not None else default_threads()
    return PreparedCall(module, kernel_call(attrs, policy), workers, policy, dict(attrs))


def flash_attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    bias: np.ndarray | None = None,
    mask: np.ndarray | None = None,
    *,
    policy: SoftmaxPolicy | None = None,
    threads: int | None = None,
    **attrs: Any,
) -> np.ndarray:
    """FlashAttention on numpy arrays, as ``reference.flash_attention`` computes it, compiled.

    ``threads`` caps the worker threads (None: every core this process may run on).
    """
    module = selection().module
    operands = _kernel_operands(q, k, v, bias, mask) if module is not None else None
    if module is None or operands is None or reference.no_keys_output(q, k, v) is not None:
        return reference.flash_attention(q, k, v, bias, mask, policy=policy, **attrs)
    call = kernel_call(attrs, policy)
    workers = int(threads) if threads is not None else default_threads()
    qd, kd, vd, bias_4d, mask_4d = operands
    out = call.run(module, qd, kd, vd, bias_4d, mask_4d, workers)
    q_dtype = q.dtype if isinstance(q, np.ndarray) else np.asarray(q).dtype
    return out if out.dtype == q_dtype else out.astype(q_dtype)


# What a PreparedCall stands for: where cpu.flash_attention has been replaced (a test's
# deliberately wrong kernel), the bridge calls the replacement instead of its prepared calls.
PREPARED_FOR = flash_attention
