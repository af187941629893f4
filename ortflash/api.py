"""The public checking API: ``ortflash.verify``, ``ortflash.validate`` and ``ortflash.make_feeds``.

Thin, typed front doors to ``ortflash.checks`` (which the CLI prints from): each takes a path,
an ``onnx.ModelProto`` or an ``onnx_ir.Model``, raises :class:`OrtflashError` for a model or
inputs ONNX Runtime cannot take, and returns a result object instead of printing.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from .checks import feeds as _feeds
from .checks import validate as _validate
from .checks import verify as _verify
from .checks.compare import OutputDiff, tolerance
from .checks.validate import NodeCheck
from .checks.verify import VERIFY_OPT_LEVEL, VerifyRun
from .errors import OrtflashError
from .kernels.config import DEFAULT_BACKEND
from .model_io import ModelLike, external_locations, load
from .op.policy import SoftmaxPolicy
from .op.spec import SpecError

__all__ = ["OutputDiff", "NodeCheck", "VerifyRun", "VerifyResult", "ValidateResult", "verify", "validate", "make_feeds"]

Feeds = Mapping[str, np.ndarray]


@dataclass(frozen=True)
class VerifyResult:
    """What :func:`verify` ran and found.

    ``runs``: each comparison (its input shapes, the softmax each fused node ran, the key lengths
    it saw, one :class:`OutputDiff` per output); ``outputs``: the worst diff of each output over
    all runs; ``notes``: softmax modes that had to be forced, and why, a batch of 1 where the
    model ran only there, and the model's own noise; ``noise``: output name -> the model's own
    noise (max |float32 - float64| of the original) where it is beyond the tolerance on its own,
    which raised that output's atol by ``checks.compare.NOISE_FACTOR`` times it (empty otherwise).
    """

    ok: bool
    rtol: float
    atol: float
    ort_opt_level: str
    runs: tuple[VerifyRun, ...]
    notes: tuple[str, ...] = ()
    deployed_softmax: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    noise: Mapping[str, float] = field(default_factory=dict)

    @property
    def outputs(self) -> dict[str, OutputDiff]:
        """Output name -> its worst diff over every run (an incomparable one, or the largest err / tolerance)."""
        worst: dict[str, OutputDiff] = {}
        for run in self.runs:
            for diff in run.diffs:
                seen = worst.get(diff.name)
                if seen is None or _badness(diff) > _badness(seen):
                    worst[diff.name] = diff
        return worst

    @property
    def softmax_modes(self) -> set[str]:
        """Every softmax some fused node ran in some run."""
        return {mode for run in self.runs for mode in run.modes.values()}

    def to_dict(self) -> dict[str, Any]:
        """The ``verification`` object of the JSON document (schema ``ortflash.result``)."""
        verification = _verify.Verification(self.rtol, self.atol, self.ort_opt_level)
        verification.runs = list(self.runs)
        verification.notes = list(self.notes)
        verification.deployed = {k: list(v) for k, v in self.deployed_softmax.items()}
        return verification.to_dict()


@dataclass(frozen=True)
class ValidateResult:
    """What :func:`validate` found: one :class:`NodeCheck` per fused node, run by ``backend``."""

    ok: bool
    backend: str
    rtol: float
    atol: float
    nodes: tuple[NodeCheck, ...]
    notes: tuple[str, ...] = ()  # e.g. random inputs run at batch 1, the model not running at ``batch``


def _badness(diff: OutputDiff) -> tuple[bool, float, int]:
    return (not diff.ok, diff.of_tolerance, diff.nan_mismatch)


def _source(model: ModelLike) -> onnx.ModelProto | str:
    """A path (its external weights stay on disk, read from its folder) or a proto; an onnx_ir model as a proto."""
    if isinstance(model, ir.Model):
        return ir.serde.serialize_model(model)
    if isinstance(model, (str, os.PathLike)):
        load(model)  # a one-line OrtflashError for a missing or unreadable file, before any work
        return os.fspath(model)
    return load(model)


def _with_weights(model: ModelLike) -> onnx.ModelProto:
    """The model with any external weights read in (validate runs the original graph from memory)."""
    proto = load(model)
    if isinstance(model, (str, os.PathLike)) and external_locations(proto):
        return onnx.load(os.fspath(model))
    return proto


def _override(softmax: str | None) -> SoftmaxPolicy | None:
    try:
        return SoftmaxPolicy.from_options(softmax)
    except SpecError as exc:
        raise OrtflashError(str(exc)) from None


def make_feeds(
    model: ModelLike,
    *,
    dims: Mapping[str, int] | None = None,
    seq_len: int = 16,
    batch: int = 2,
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """Random inputs for every graph input of ``model``, from its types and shapes.

    Attention masks pad (item 0 at the end, item 1 at the start); token ids stay below the
    embedding table's rows; named dims take their value from ``dims``, else (a decoder with a
    cache) follow its past and new lengths, else the batch or ``seq_len`` by their name.
    """
    return _feeds.make_feeds(load(model), seq_len=seq_len, batch=batch, seed=seed, dims=dict(dims or {}))


def verify(
    original: ModelLike,
    optimized: ModelLike,
    feeds: Feeds | None = None,
    *,
    rtol: float | None = None,
    atol: float | None = None,
    softmax: str | None = None,
    dims: Mapping[str, int] | None = None,
    seq_len: int = 16,
    batch: int = 2,
    ort_opt_level: str = VERIFY_OPT_LEVEL,
    weights_dir: str | None = None,
    measure_noise: bool | None = None,
) -> VerifyResult:
    """Run both models in ONNX Runtime on the same inputs and compare every output.

    As ``ortflash verify``: each fused node runs in every softmax it runs deployed (an ``auto``
    node naive and online), unless ``softmax`` (naive | online | auto) overrides every node's.
    ``feeds``: your inputs (never resized); None: random ones (:func:`make_feeds` with ``dims``,
    ``seq_len``, ``batch``). Tolerances default to float32 rounding (``rtol 1e-4, atol 1e-5``;
    ``2e-2, 2e-3`` for a model that computes in float16: a float16 output or float16 values inside).
    ``weights_dir``: where a proto ``optimized`` reads external weights (default: the folder of
    ``original`` when it is a path). ``measure_noise``: run the
    original in float64 too, and where an output of the original is itself beyond the tolerance
    of it, raise that output's atol by twice that noise (None: only where no tolerance is given).
    Random inputs the original does not take at ``batch`` > 1 are retried at batch 1 (a note says so).
    """
    original_source, optimized_source = _source(original), _source(optimized)
    if weights_dir is None and isinstance(original_source, str) and not isinstance(optimized_source, str):
        weights_dir = os.path.dirname(os.path.abspath(original_source))
    verification = _verify.verify_every_softmax(
        original_source,
        optimized_source,
        feeds=None if feeds is None else dict(feeds),
        seq_len=seq_len,
        batch=batch,
        policy=_override(softmax),
        rtol=rtol,
        atol=atol,
        weights_dir=weights_dir,
        dims=dims,
        opt_level=ort_opt_level,
        measure_noise=measure_noise,
    )
    return VerifyResult(
        ok=verification.ok,
        rtol=verification.rtol,
        atol=verification.atol,
        ort_opt_level=verification.ort_opt_level,
        runs=tuple(verification.runs),
        notes=tuple(verification.notes),
        deployed_softmax={k: tuple(v) for k, v in verification.deployed.items()},
        noise=verification.noise,
    )


def validate(
    original: ModelLike,
    optimized: ModelLike | None = None,
    feeds: Feeds | None = None,
    *,
    backend: str = DEFAULT_BACKEND,
    rtol: float | None = None,
    atol: float | None = None,
    softmax: str | None = None,
    dims: Mapping[str, int] | None = None,
    seq_len: int = 16,
    batch: int = 2,
) -> ValidateResult:
    """Check each fused node of ``optimized`` on its own, node by node, as ``ortflash validate``.

    The original runs in ONNX Runtime exposing each fused node's inputs and the value the
    replaced subgraph computed; the node's kernel (``backend``: cpu | reference | wgpu) runs on
    those inputs and is compared with it. ``optimized`` None: ``ortflash.optimize(original, target="ortflash")`` (FlashAttention nodes to validate).
    Random inputs the original does not take at ``batch`` > 1 are retried at batch 1 (``notes`` says so), as :func:`verify`.
    """
    from .pipeline.optimize import optimize

    original_proto = _with_weights(original)
    optimized_proto = optimize(original_proto, target="ortflash")[0] if optimized is None else _with_weights(optimized)
    rtol, atol = tolerance(original_proto, rtol, atol)
    options: dict[str, Any] = {"backend": backend, "policy": _override(softmax), "rtol": rtol, "atol": atol}
    notes: tuple[str, ...] = ()
    if feeds is not None:
        nodes = _validate.validate(original_proto, optimized_proto, dict(feeds), **options)
    else:
        nodes, note = _validate.validate_random(
            original_proto,
            optimized_proto,
            lambda at: make_feeds(original_proto, dims=dims, seq_len=seq_len, batch=at),
            batch,
            **options,
        )
        notes = (note,) if note else ()
    return ValidateResult(all(n.ok for n in nodes), backend, rtol, atol, tuple(nodes), notes)
