"""Orchestration: one worker process per (variant, sequence length, round), progress, timeouts.

Every (variant, S) runs in its OWN process (``python -m ortflash.bench.worker CFG.json``), so
one variant's memory, arena or thread pools never touch another's measurement.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..errors import OrtflashError
from ..model_io import copy_external_data, load
from . import inputs, report, sgemm
from .probes import loadavg, machine_info, versions
from .variants import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_VARIANTS,
    parse_variant,
    torch_available,
)
from .worker import ISA_ENV

DEFAULT_SEQ_LENS = (512, 1024, 2048, 4096, 8192)
BLAS_THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def _worker_env(cfg: dict[str, Any]) -> dict[str, str]:
    env = dict(os.environ)
    if cfg.get("threads"):  # numpy's BLAS reads these when it loads
        for var in BLAS_THREAD_VARS:
            env[var] = str(cfg["threads"])
    if cfg.get("isa"):
        env[ISA_ENV] = cfg["isa"]
    return env


def run_one(cfg: dict[str, Any], timeout: float, tick: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run one worker process on cfg; its result, or why there is none."""
    with tempfile.TemporaryDirectory(prefix="ortflash-bench-") as tmp:
        cfg = {**cfg, "result_file": os.path.join(tmp, "result.json"), "status_file": os.path.join(tmp, "status")}
        cfg_path = os.path.join(tmp, "cfg.json")
        Path(cfg_path).write_text(json.dumps(cfg))
        base = {"variant": cfg["variant"], "seq_len": cfg["seq_len"], "batch": cfg["batch"]}
        t0 = time.monotonic()
        with open(os.path.join(tmp, "log"), "w+") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "ortflash.bench.worker", cfg_path],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=_worker_env(cfg),
            )
            timed_out = False
            while proc.poll() is None:
                if time.monotonic() - t0 > timeout:
                    proc.kill()
                    proc.wait()
                    timed_out = True
                    break
                if tick:
                    try:
                        tick(Path(cfg["status_file"]).read_text())
                    except OSError:
                        pass
                time.sleep(0.2)
            base["wall_s"] = round(time.monotonic() - t0, 1)
            if timed_out:
                return {**base, "status": "timeout", "error": f"no result within {timeout:g} s"}
            try:
                return {**json.loads(Path(cfg["result_file"]).read_text()), **base}
            except (OSError, json.JSONDecodeError):
                log.seek(0)
                tail = [line for line in log.read().strip().splitlines() if line.strip()][-3:]
                why = "killed (out of memory?)" if proc.returncode in (-9, 137) else f"exit code {proc.returncode}"
                return {**base, "status": "error", "error": f"worker {why}: {' | '.join(tail)[-300:]}"}


def plan_lengths(
    model_path: str, seq_lens: Sequence[int] | None, dims: dict[str, int] | None
) -> tuple[list[int], list[str]]:
    """(the sequence lengths to run, notes on the ones left out) from what the model declares."""
    model = load(model_path)
    if not inputs.has_sequence_dim(model, dims):
        shapes = ", ".join(
            f"{vi.name} {[d.dim_param or d.dim_value for d in vi.type.tensor_type.shape.dim]}"
            for vi in model.graph.input
        )
        if seq_lens is not None:
            raise OrtflashError(
                f"{model_path} has no sequence dimension (its inputs are fixed: {shapes}): "
                "it runs at its one size; leave out --seq-lens"
            )
        return [inputs.FIXED_SIZE], [f"the model has no sequence dimension ({shapes}): measured at its one fixed size"]
    wanted = list(seq_lens if seq_lens is not None else DEFAULT_SEQ_LENS)
    keep = [s for s in wanted if inputs.unsupported_length(model, s) is None]
    notes = [f"not run: {inputs.unsupported_length(model, s)}" for s in wanted if s not in keep]
    if not keep:
        raise OrtflashError(f"{model_path}: " + "; ".join(n.removeprefix("not run: ") for n in notes))
    return keep, notes


def bench(
    model_path: str | os.PathLike[str],
    seq_lens: Sequence[int] | None = None,
    variants: Sequence[str] = DEFAULT_VARIANTS,
    batch: int = 1,
    repeats: int = 5,
    out_dir: str | os.PathLike[str] | None = None,
    *,
    warmup: int = 1,
    block_size: int = DEFAULT_BLOCK_SIZE,
    time_budget_s: float = 60.0,
    timeout_s: float = 900.0,
    rounds: int = 1,
    rounds_max_seq: int | None = None,
    threads: int | None = None,
    isa: str | None = None,
    max_seq_len: dict[str, int] | None = None,
    profile: bool | int = True,
    sgemm_size: int = sgemm.DEFAULT_SIZE,
    dims: dict[str, int] | None = None,
    name: str = "bench",
    title: str | None = None,
    notes: list[str] | None = None,
    plot: bool = True,
    console: Any = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Median latency and peak memory of each variant at each sequence length, one process each.

    Returns the results dict; with ``out_dir`` also writes NAME.json, NAME.md and (matplotlib
    installed) NAME.png there. ``seq_lens`` None: the defaults, or the one fixed size of a model
    with no sequence dim. ``max_seq_len={"naive": 4096}`` skips a variant above a length; a
    variant that times out or fails is not run at larger lengths. ``profile``: True, False, or
    the largest S to profile (one extra warm run in a second session). ``time_budget_s``: fewer
    timed runs (at least 3) when ``repeats`` cold-run times exceed it. ``rounds``: measure every
    (variant, S) that many times in alternating order, each in a fresh process (only up to
    ``rounds_max_seq`` when given); latency is the median over all rounds' timed runs and memory
    the largest round's. ``threads``: ORT intra-op, kernel and BLAS threads per worker.
    ``isa``: the compiled CPU kernel's build, set in the workers' environment (ORTFLASH_CPU_ISA).
    ``sgemm_size``: the N of the float32 N x N x N product whose rate, measured at the start and
    the end of the run with the workers' environment, the kernel's attention GFLOP/s is given as a
    fraction of (``kernel_vs_sgemm``; see ortflash.bench.sgemm); 0 leaves it out.
    """
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    console = console or Console()
    model_path = os.fspath(model_path)
    if not os.path.exists(model_path):
        raise OrtflashError(f"{model_path}: no such file")
    load(model_path)  # a folder, a file that is not ONNX, an empty one, missing weights: one line, exit 2
    variants = list(variants)
    for v in variants:
        try:
            file = parse_variant(v).path  # a bad name fails here, before any worker starts
        except ValueError as exc:
            raise OrtflashError(str(exc)) from None
        if file is not None:
            load(file)  # a LABEL=PATH variant's file too, not one error cell per length
    if out_dir is not None:
        report.check_out_dir(os.fspath(out_dir), name)
    seq_lens, length_notes = plan_lengths(model_path, seq_lens, dims)
    for note in length_notes:
        console.print(f"[yellow]{note}[/]")
    max_seq_len = dict(max_seq_len or {})
    results: dict[str, Any] = {
        "name": name,
        "title": title or f"ortflash bench: {os.path.basename(model_path)}",
        "model": model_path,
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine_info(),
        "versions": versions(),
        "config": {
            "seq_lens": seq_lens,
            "variants": variants,
            "batch": batch,
            "repeats": repeats,
            "warmup": warmup,
            "block_size": block_size,
            "time_budget_s": time_budget_s,
            "timeout_s": timeout_s,
            "max_seq_len": max_seq_len,
            "profile": profile,
            "rounds": rounds,
            "rounds_max_seq": rounds_max_seq,
            "threads": threads,
            "isa": isa,
            "sgemm_size": sgemm_size,
        },
        "notes": list(notes or []) + length_notes,
        "loadavg_start": loadavg(),
        "runs": [],
    }
    stopped: dict[str, str] = {}
    if any(parse_variant(v).kind == "torch-sdpa" for v in variants) and not torch_available():
        stopped["torch-sdpa"] = "PyTorch is not installed (pip install torch): no peer row"
    todo = []
    for s in seq_lens:
        n = rounds if rounds_max_seq is None or s <= rounds_max_seq else 1
        for r in range(max(1, n)):
            # round 0 in the given order, then reversed, and so on: a load that drifts during the
            # run then weighs on every variant alike
            todo += [(s, v, r) for v in (variants if r % 2 == 0 else variants[::-1])]
    sgemm_env = _worker_env({"threads": threads, "isa": isa})
    sgemm_start = sgemm.measure_in_process(sgemm_size, sgemm_env) if sgemm_size else {}
    raw: dict[tuple[int, str], list[dict[str, Any]]] = {}
    # Every worker reads the same bytes, even if the file is rewritten while the benchmark runs.
    snapshot = tempfile.TemporaryDirectory(prefix="ortflash-bench-model-")
    model_copy = os.path.join(snapshot.name, os.path.basename(model_path))
    shutil.copyfile(model_path, model_copy)
    # the external data files the model's tensors name (model.onnx.data, model.onnx_data, ...), at
    # their relative paths: the copy reads the same weights as the model
    copy_external_data(load(model_path), os.path.dirname(os.path.abspath(model_path)), snapshot.name)
    with (
        snapshot,
        Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            disable=not progress,
            transient=False,
        ) as bar,
    ):
        task = bar.add_task("bench", total=len(todo))
        for s, v, rnd in todo:
            label = parse_variant(v).label
            base = {"variant": label, "seq_len": s, "batch": batch, "round": rnd}
            runs = raw.setdefault((s, v), [])
            skip = stopped.get(v) or (
                f"above the chosen limit S <= {max_seq_len[label]}"
                if label in max_seq_len and s > max_seq_len[label]
                else None
            )
            if skip:
                status = "unavailable" if v == "torch-sdpa" and v in stopped else "skipped"
                runs.append({**base, "status": status, "error": skip})
                bar.advance(task)
                continue
            prof = (profile if isinstance(profile, bool) else s <= int(profile)) and rnd == 0
            cfg = {
                "model": model_copy,
                "variant": v,
                "seq_len": s,
                "batch": batch,
                "repeats": repeats,
                "warmup": max(1, warmup),
                "block_size": block_size,
                "time_budget_s": time_budget_s,
                "profile": prof,
                "dims": dims,
                "threads": threads,
                "isa": isa,
            }
            desc = f"S={report.seq_label(s):<5s} {label:<9s}" + (f" round {rnd + 1}" if rounds > 1 else "")
            bar.update(task, description=desc)

            def tick(text: str, d: str = desc) -> None:
                bar.update(task, description=f"{d} {text}")

            res = run_one(cfg, timeout_s, tick=tick)
            res.update(variant=label, round=rnd)
            runs.append(res)
            if res["status"] == "ok":
                kernel = f"  kernel {res['kernel_ms']['median']:.1f} ms" if "kernel_ms" in res else ""
                bar.console.print(
                    f"  {desc} {res['latency_ms']['median']:10.1f} ms  "
                    f"{res['memory_mb']['inference_peak']:8.1f} MiB{kernel}  ({res['wall_s']} s)"
                )
            else:
                bar.console.print(f"  {desc} {res['status']}: {res.get('error', '')}")
                if res["status"] in ("timeout", "error", "unavailable"):
                    stopped[v] = (
                        f"not run: {res['status']} at S={s}"
                        if res["status"] != "unavailable"
                        else res.get("error", "unavailable")
                    )
            bar.advance(task)
    results["runs"] = [report.merge_rounds(raw[(s, v)]) for s in seq_lens for v in variants if (s, v) in raw]
    if sgemm_size:
        results["sgemm"] = sgemm.summary(sgemm_start, sgemm.measure_in_process(sgemm_size, sgemm_env))
    sgemm.kernel_rates(results["runs"], results.get("sgemm", {}).get("gflops"))
    results["isa_used"] = sorted({r["isa"] for r in results["runs"] if r.get("isa")})
    results["loadavg_end"] = loadavg()
    results["ratios"] = report.ratios(results)
    report.print_table(results, console)
    if out_dir is not None:
        results["files"] = report.write_results(results, os.fspath(out_dir), name, plot=plot, console=console)
    return results
