"""``optimize --tune`` (``optimize_tuned``): time this model's candidate forms on this machine at
the user's lengths and keep the fastest, instead of predicting from the cost table; the choice is
cached. It sits above the pipeline (ortflash/optimize.py) and the bench that times it.

The candidates are whole models: the original as given, every fused block in the chosen target's
form, and the cost table's choice where that differs (some blocks kept). Each is timed by
``ortflash bench`` (each candidate and length in its own process, rounds alternating, ratios
against the original in the same run, the path users run). A candidate is taken only where it ran
at least as fast as the original at every length asked for; of those, the fastest by the geometric
mean of its ratios. So the written model is never measured slower than the input here.

The cache (``TuneCache``) is one JSON file per key under a folder the caller names (the CLI's
default: ``$XDG_CACHE_HOME/ortflash/tune``). The key is the hash of the input model's bytes and of
the external data files its tensors name (two models of one graph and other weights are two
models), the execution provider, the machine (CPU model, its vector units, its core count), the versions of
ortflash, ONNX Runtime and onnx, the lengths, the softmax policy and the target asked for: a hit
rebuilds the candidates (deterministic) and takes the cached label without timing anything.
"""

from __future__ import annotations

import datetime
import hashlib
import io
import json
import math
import os
import platform
import re
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx

from ..errors import OrtflashError
from ..model_io import ModelLike, copy_external_data, external_locations, load
from ..op.policy import SoftmaxPolicy
from ..report import Report

ORIGINAL = "original"
# What pipeline/optimize.py adds to the target's why where the cost table kept blocks' original ops.
_TABLE_KEPT = re.compile(
    r"; (every fused block|\d+ of \d+ fused blocks) then kept the original ops, faster there \([^)]*\)"
)
CACHE_SCHEMA = 1


@dataclass(frozen=True)
class TuneSettings:
    """What ``optimize(tune=...)`` measures with: the lengths, where the choices are cached (None:
    not cached), and how long it measures."""

    seq_lens: tuple[int, ...]  # empty: the model's one fixed size (every block's key length static)
    cache_dir: str | None = None
    repeats: int = 5
    rounds: int = 2
    threads: int | None = None  # ORT intra-op and kernel threads per worker; None: the libraries' own


@dataclass(frozen=True)
class Measured:
    """The candidate taken, and what each one measured: ratio to the original per length."""

    chosen: str
    ratios: Mapping[str, Mapping[int, float | None]]
    cached: bool
    key: str

    def why(self) -> str:
        """The report's sentence for the choice."""
        source = "cached measurement" if self.cached else "measured here"
        lengths = ", ".join(str(s) for s in next(iter(self.ratios.values()), {}))
        cells = "; ".join(
            f"{label} {'/'.join('-' if r is None else f'{r:.2f}x' for r in by_len.values())}"
            for label, by_len in self.ratios.items()
        )
        return f"--tune ({source}, key {self.key[:12]}): at S = {lengths}, against the original: {cells}; took {self.chosen}"


def machine() -> dict[str, Any]:
    """What a measurement is valid for: the CPU and the versions that run the model."""
    import onnxruntime

    from .._version import __version__

    model, flags = "", []
    try:
        with open("/proc/cpuinfo") as info:
            lines = info.read().splitlines()
        model = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "")
        flags = next((line.split(":", 1)[1].split() for line in lines if line.startswith("flags")), [])
    except OSError:
        pass
    return {
        "cpu": model or platform.processor() or platform.machine(),
        "vector": sorted(f for f in flags if f in ("avx2", "avx512f", "fma", "neon", "asimd")),
        "cores": os.cpu_count(),
        "ortflash": __version__,
        "onnxruntime": onnxruntime.__version__,
        "onnx": onnx.__version__,
    }


def cache_key(
    model: onnx.ModelProto,
    *,
    ep: str,
    seq_lens: Sequence[int],
    policy: str,
    target: str | None,
    weights_dir: str | None = None,
) -> str:
    """The cache's key; weights_dir: the folder the model's external data locations are relative to
    (None: a model in memory, whose external data is named by location only)."""
    digest = hashlib.sha256(model.SerializeToString(deterministic=True)).hexdigest()
    parts = {
        "model": digest,
        "weights": _external_digests(model, weights_dir),
        "ep": ep,
        "machine": machine(),
        "seq_lens": list(seq_lens),
        "policy": policy,
        "target": target,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def _external_digests(model: onnx.ModelProto, weights_dir: str | None) -> dict[str, str | None]:
    """The sha256 of each external data file the model names, by location (None: not found; the
    timing then fails and nothing is cached). The graph alone does not say which weights it runs."""
    found: dict[str, str | None] = {}
    for loc in external_locations(model):
        path = os.path.join(weights_dir, loc) if weights_dir is not None else None
        if path is None or not os.path.isfile(path):
            found[loc] = None
            continue
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
        found[loc] = digest.hexdigest()
    return found


def choose_fastest(ratios: Mapping[str, Mapping[int, float | None]]) -> str:
    """The candidate at least as fast as the original at every length, fastest by geometric mean;
    the original where none is."""
    best, best_mean = ORIGINAL, 1.0
    for label, by_len in ratios.items():
        values = list(by_len.values())
        if label == ORIGINAL or not values or any(r is None or r < 1.0 for r in values):
            continue
        mean = math.exp(sum(math.log(r) for r in values if r is not None) / len(values))
        if mean > best_mean:
            best, best_mean = label, mean
    return best


def measure(
    original: onnx.ModelProto,
    candidates: Mapping[str, onnx.ModelProto],
    settings: TuneSettings,
    *,
    key: str,
    weights_dir: str | None = None,
) -> Measured:
    """Time ``candidates`` (label -> model, the original not among them) against ``original``, or
    read the cached choice for ``key``; the choice is written to the cache when measured."""
    cached = _read_cache(settings.cache_dir, key)
    if cached is not None and (cached["chosen"] == ORIGINAL or cached["chosen"] in candidates):
        ratios = {label: {int(s): r for s, r in by_len.items()} for label, by_len in cached["ratios"].items()}
        return Measured(cached["chosen"], ratios, cached=True, key=key)
    from rich.console import Console

    from ..bench.report import ratios as bench_ratios
    from ..bench.sweep import bench

    with tempfile.TemporaryDirectory(prefix="ortflash-tune-") as work:
        # the external weights the models name (model.onnx_data, ...) are copied beside them, at the
        # relative paths the models give: the user's folder may be read-only, and a path up out of
        # a model's folder is one ONNX Runtime does not read
        original_path = Path(work) / "original.onnx"
        onnx.save(original, original_path)
        variants = [ORIGINAL]
        for label, model in candidates.items():
            path = Path(work) / f"{label}.onnx"
            onnx.save(model, path)
            variants.append(f"{label}={path}")
        if weights_dir is not None:
            for model in (original, *candidates.values()):
                copy_external_data(model, weights_dir, work)
        try:
            results = bench(
                original_path,
                seq_lens=list(settings.seq_lens) or None,  # none given: the model's one fixed size
                variants=variants,
                repeats=settings.repeats,
                warmup=2,
                rounds=settings.rounds,
                threads=settings.threads,
                profile=False,
                plot=False,
                progress=False,
                sgemm_size=0,
                name="tune",
                console=Console(file=io.StringIO()),  # the report says what was measured
            )
        except (OSError, RuntimeError, ValueError) as exc:
            raise OrtflashError(f"--tune could not measure the candidates: {exc}") from None
    failed = _failed_timing(results)
    if failed is not None:  # an error the user sees, and nothing cached: the next run measures again
        raise OrtflashError(f"--tune could not time {failed}; nothing cached")
    by_len = bench_ratios(results)
    lengths = [int(s) for s in results["config"]["seq_lens"]]
    ratios = {label: {s: by_len.get(str(s), {}).get(label, {}).get("speedup") for s in lengths} for label in candidates}
    chosen = choose_fastest(ratios)
    _write_cache(settings.cache_dir, key, chosen, ratios)
    return Measured(chosen, ratios, cached=False, key=key)


def _failed_timing(results: Mapping[str, Any]) -> str | None:
    """The first timing of a bench run that has no result (the worker's error, a timeout), in
    words; None when every candidate was timed at every length. A variant bench stopped after a
    failure is named by that failure, not by the lengths it then skipped."""
    runs = [r for r in results["runs"] if r.get("status") != "ok"]
    first = next((r for r in runs if r.get("status") != "skipped"), runs[0] if runs else None)
    if first is None:
        return None
    why = " ".join(str(first.get("error") or first.get("status")).split())  # one line
    return f"{first['variant']} at S={first['seq_len']} ({first.get('status')}: {why})"


def default_cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "ortflash", "tune")


def _read_cache(cache_dir: str | None, key: str) -> dict[str, Any] | None:
    if cache_dir is None:
        return None
    path = Path(cache_dir) / f"{key}.json"
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None  # absent or unreadable: measure again
    if not isinstance(doc, dict) or doc.get("schema") != CACHE_SCHEMA or "chosen" not in doc:
        return None
    ratios = doc.get("ratios")
    if not isinstance(ratios, dict) or any(
        not isinstance(by_len, dict) or not by_len or None in by_len.values() for by_len in ratios.values()
    ):
        return None  # a failed timing an earlier version cached ("fused -/-"): measure again
    return doc


def _write_cache(
    cache_dir: str | None, key: str, chosen: str, ratios: Mapping[str, Mapping[int, float | None]]
) -> None:
    if cache_dir is None:
        return
    doc = {
        "schema": CACHE_SCHEMA,
        "chosen": chosen,
        "ratios": {label: {str(s): r for s, r in by_len.items()} for label, by_len in ratios.items()},
        "machine": machine(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    try:
        Path(cache_dir).mkdir(parents=True, exist_ok=True)
        tmp = Path(cache_dir) / f".{key}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(doc, indent=1) + "\n")
        os.replace(tmp, Path(cache_dir) / f"{key}.json")  # atomic: a concurrent reader sees all or nothing
    except OSError:
        pass  # a cache that cannot be written costs a measurement next time, nothing else


def optimize_tuned(
    model_or_path: ModelLike,
    settings: TuneSettings,
    **options: Any,
) -> tuple[onnx.ModelProto, Report]:
    """``ortflash.optimize(model_or_path, **options)`` with the target left open, then, of the
    original, every block fused (in the chosen target's form) and the cost table's choice, the one
    measured fastest here; each fused row and the target's why say what was measured."""
    import dataclasses

    from .optimize import AUTO, optimize

    target, ep = options.get("target"), options.get("ep")
    if target not in (None, AUTO):
        raise OrtflashError(
            f"--tune chooses a block's form where the target is left open; --target {target} is written as asked"
        )
    if ep not in (None, "cpu"):
        raise OrtflashError(f"--tune measures on ONNX Runtime's CPU EP, here; --ep {ep} runs elsewhere")
    by_table = optimize(model_or_path, **options)
    table_model, table_report = by_table
    assert table_report.target is not None
    chosen_target = table_report.target.chosen
    named = {k: v for k, v in options.items() if k not in ("target", "ep", "seq_lens")}
    every_block = optimize(model_or_path, target=chosen_target, **named)
    fused_model, fused_report = every_block
    candidates: dict[str, tuple[onnx.ModelProto, Report]] = {}
    if fused_report.fused:
        candidates["fused"] = every_block
    if table_report.fused and table_report.fused != fused_report.fused:
        candidates["table"] = by_table
    if not candidates:
        return by_table  # nothing fused, nothing to time
    dynamic = [b.name for b in fused_report.blocks if b.fused and b.key_len is None]
    if not settings.seq_lens and dynamic:
        raise OrtflashError(
            f"--tune times the model at the lengths it runs at: give --seq-lens (block {dynamic[0]}'s key length "
            "is known only at run time)"
        )
    original = load(model_or_path)
    policy = options.get("policy") or SoftmaxPolicy.for_new_nodes(
        *(options.get(k) for k in ("softmax", "online_softmax")),
        **{k: options[k] for k in ("block_size", "min_seq_len") if k in options},
    )
    weights_dir = (
        os.path.dirname(os.path.abspath(os.fspath(model_or_path)))
        if isinstance(model_or_path, (str, os.PathLike))
        else None
    )
    key = cache_key(
        original,
        ep=ep or "cpu",
        seq_lens=settings.seq_lens,
        policy=json.dumps(policy.attributes(), sort_keys=True),
        target=target,
        weights_dir=weights_dir,
    )
    measured = measure(
        original, {label: m for label, (m, _) in candidates.items()}, settings, key=key, weights_dir=weights_dir
    )
    why = measured.why()
    # a row's reason is one short sentence; what was measured is its detail, printed once under the table
    if measured.chosen == ORIGINAL:
        model, report = original, table_report
        for block in report.blocks:
            if block.fused:
                block.fused, block.lowered_to = False, None
                block.reason = "the original ops measured faster here (--tune)"
                block.detail = why
    else:
        model, report = candidates[measured.chosen]
        for block in report.blocks:
            if block.fused:
                block.reason = "; ".join(filter(None, [block.reason, "measured fastest here (--tune)"]))
                block.detail = "; ".join(filter(None, [block.detail, why]))
    base = table_report.target.why
    if measured.chosen != "table":  # the cost table's "then kept the original ops" is only true of its own choice
        base = _TABLE_KEPT.sub("", base)
    report.target = dataclasses.replace(table_report.target, why=f"{base}; {why}")
    return model, report
