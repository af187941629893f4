"""Bench results as numbers and pictures: rounds merged, ratios, a rich table, markdown, a plot, files."""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path
from typing import Any

from ..errors import OrtflashError
from .inputs import FIXED_SIZE

Results = dict[str, Any]


def seq_label(s: int) -> str:
    return "fixed" if s == FIXED_SIZE else str(s)


def merge_rounds(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One result from the rounds of one (variant, S): all timed runs pooled, the largest memory."""
    ok = [r for r in runs if r.get("status") == "ok"]
    if not ok:
        return dict(runs[-1])
    if len(ok) == 1 and len(runs) == 1:
        return dict(ok[0])
    out = dict(ok[0])
    times = [t for r in ok for t in r["latency_ms"]["runs"]]
    cpu = [t for r in ok for t in r["latency_ms"].get("cpu_runs", [])]
    out["latency_ms"] = {
        **ok[0]["latency_ms"],
        "median": round(statistics.median(times), 3),
        "min": min(times),
        "max": max(times),
        "runs": times,
        "repeats": len(times),
        "round_medians": [r["latency_ms"]["median"] for r in ok],
    }
    if cpu:
        out["latency_ms"].update(cpu_median=round(statistics.median(cpu), 3), cpu_runs=cpu)
    out["memory_mb"] = {k: max(r["memory_mb"][k] for r in ok) for k in ok[0]["memory_mb"]}
    out["memory_mb"]["round_inference_peaks"] = [r["memory_mb"]["inference_peak"] for r in ok]
    if all("kernel_ms" in r for r in ok):
        kernel = [t for r in ok for t in r["kernel_ms"]["runs"]]
        out["kernel_ms"] = {**ok[0]["kernel_ms"], "median": round(statistics.median(kernel), 3), "runs": kernel}
        out["session_over_kernel"] = round(out["latency_ms"]["median"] / out["kernel_ms"]["median"], 3)
    out["rounds"] = len(ok)
    out["wall_s"] = round(sum(r.get("wall_s", 0) for r in runs), 1)
    failed = [r for r in runs if r.get("status") != "ok"]
    if failed:
        out["failed_rounds"] = [
            {"round": r.get("round"), "status": r.get("status"), "error": r.get("error")} for r in failed
        ]
    return out


def ok_run(results: Results, variant: str, s: int) -> dict[str, Any] | None:
    for r in results["runs"]:
        if r["variant"] == variant and r["seq_len"] == s and r.get("status") == "ok":
            return r
    return None


def variant_labels(results: Results) -> list[str]:
    return list(dict.fromkeys(r["variant"] for r in results["runs"]))


def ratios(results: Results, baseline: str = "original") -> dict[str, dict[str, dict[str, float | None]]]:
    """Per sequence length and variant: speedup (baseline time / variant time) and memory ratios."""
    out = {}
    for s in results["config"]["seq_lens"]:
        base = ok_run(results, baseline, s)
        if not base:
            continue
        row = {}
        for v in variant_labels(results):
            r = ok_run(results, v, s)
            if not r:
                continue
            bm, rm = base["memory_mb"], r["memory_mb"]
            bc, rc = base["latency_ms"].get("cpu_median"), r["latency_ms"].get("cpu_median")
            row[v] = {
                "speedup": round(base["latency_ms"]["median"] / r["latency_ms"]["median"], 3),
                "cpu_speedup": round(bc / rc, 3) if bc and rc else None,
                "inference_memory": round(rm["inference_peak"] / bm["inference_peak"], 3)
                if bm["inference_peak"] > 0
                else None,
                "process_memory": round(rm["process_peak"] / bm["process_peak"], 3),
            }
        out[str(s)] = row
    return out


def _ms(val: float) -> str:
    return f"{val:,.0f} ms" if val >= 100 else f"{val:.1f} ms"


def _cell(results: Results, v: str, s: int, key: str) -> str:
    r = ok_run(results, v, s)
    if not r:
        for x in results["runs"]:
            if x["variant"] == v and x["seq_len"] == s:
                return {"skipped": "skip", "timeout": "timeout", "unavailable": "n/a"}.get(x.get("status", ""), "error")
        return ""
    rat = results.get("ratios", {}).get(str(s), {}).get(v, {})
    if key in ("latency", "cpu"):
        val = r["latency_ms"]["median" if key == "latency" else "cpu_median"]
        if val is None:
            return ""
        sp = rat.get("speedup" if key == "latency" else "cpu_speedup")
        return _ms(val) + (f" ({sp:.2f}x)" if sp is not None and v != "original" else "")
    mem = r["memory_mb"]["inference_peak" if key == "memory" else "process_peak"]
    ratio = rat.get("inference_memory" if key == "memory" else "process_memory")
    return f"{mem:,.0f} MiB" + (f" ({ratio:.2f}x)" if ratio is not None and v != "original" else "")


def make_console() -> Any:
    """The bench's console on stdout: a terminal's own width; in a pipe or a file, as wide as a line
    needs (the CLI's PIPE_WIDTH), so titles and notes are not wrapped at rich's default 80 columns
    where a log or a script reads them (the tables were already printed at their full width)."""
    import sys

    from rich.console import Console

    from ..arg_types import PIPE_WIDTH

    terminal = sys.stdout.isatty()
    return Console(width=None if terminal else PIPE_WIDTH, highlight=terminal)


def print_table(results: Results, console: Any = None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    variants = variant_labels(results)
    for key, title in (
        ("latency", "median latency (speedup vs original)"),
        ("memory", "inference peak memory above the loaded session (ratio vs original)"),
    ):
        # the title on a line of its own: a table's title is wrapped to the table's width
        console.print(f"{results['title']}: {title}", markup=False, highlight=False)
        table = Table()
        table.add_column("S", justify="right")
        for v in variants:
            table.add_column(v, justify="right")
        for s in results["config"]["seq_lens"]:
            table.add_row(seq_label(s), *[_cell(results, v, s, key) for v in variants])
        # a log or pipe gets the whole table unfolded; a terminal gets its own width
        console.print(table, width=None if console.is_terminal else max(console.width, 12 + 20 * len(variants)))
    rated = [r for r in results["runs"] if r.get("kernel_gflops")]
    if rated:
        console.print(f"{results['title']}: the kernel called directly", markup=False, highlight=False)
        table = Table()
        for column in ("S", "variant", "kernel", "kernel GFLOP/s", "of sgemm"):
            table.add_column(column, justify="left" if column == "variant" else "right")
        for r in rated:
            table.add_row(
                seq_label(r["seq_len"]),
                r["variant"],
                _ms(r["kernel_ms"]["median"]),
                f"{r['kernel_gflops']:.1f}",
                _percent(r.get("kernel_vs_sgemm")),
            )
        console.print(table)
        line = sgemm_line(results)
        if line:
            console.print(line, markup=False, highlight=False)


def _md_table(results: Results, key: str) -> list[str]:
    variants = variant_labels(results)
    lines = ["| S | " + " | ".join(variants) + " |", "|---:|" + "---:|" * len(variants)]
    for s in results["config"]["seq_lens"]:
        lines.append(f"| {seq_label(s)} | " + " | ".join(_cell(results, v, s, key) for v in variants) + " |")
    return lines


def _header(results: Results) -> list[str]:
    m, v, c = results["machine"], results["versions"], results["config"]
    return [
        f"# {results['title']}",
        "",
        f"- date: {results['date']}",
        (
            f"- machine: {m['cpu']}, {m['usable_cores']} usable cores ({m['logical_cores']} logical), "
            f"{m['memory_gib']} GiB, {m['os']}, Python {m['python']}"
        ),
        (
            f"- load average at start / end: {results.get('loadavg_start')} / {results.get('loadavg_end')} "
            "(other jobs share this machine: compare the ratios, measured side by side)"
        ),
        "- versions: " + ", ".join(f"{k} {x}" for k, x in v.items()),
        f"- CPU kernel ISA: {c.get('isa') or 'chosen at import by CPU feature'}"
        + (f"; used: {', '.join(sorted(results['isa_used']))}" if results.get("isa_used") else ""),
        f"- threads per worker: {c.get('threads') or 'the libraries default'}; rounds: {c.get('rounds', 1)}",
        (
            f"- model: `{results['model']}`; batch {c['batch']}; block size {c['block_size']}; "
            f"{c['warmup']} untimed run(s) then up to {c['repeats']} timed runs"
        ),
        (
            "- each (variant, S) ran in its own process; latency is the median of the timed runs of "
            "`session.run` of the session users open (`ortflash.InferenceSession` for fused models), inputs "
            "from the model's declared dims (seed 0, padding attention mask)"
        ),
        (
            "- memory: peak resident set size during the runs minus the RSS just before the first run "
            "(Linux VmHWM reset through /proc/self/clear_refs: exact, not sampled)"
        ),
    ] + [f"- {note}" for note in results.get("notes", []) + [sgemm_line(results)] if note]


def _kernel_table(results: Results) -> list[str]:
    rows = [r for r in results["runs"] if r.get("status") == "ok" and ("kernel_ms" in r or "attention_nodes" in r)]
    if not rows:
        return []
    lines = [
        "",
        "## Session vs the kernel called directly (the ONNX Runtime bridge's cost), per run",
        "",
        (
            "kernel: the FlashAttention kernel the session's nodes run, called on the same Q/K/V/bias/mask "
            "the fused nodes received, summed over the nodes of one run. session / kernel includes the rest of "
            "the graph; ORT node: the FlashAttention nodes' time in ORT's profile (a separate warm run), so "
            "node / kernel is the bridge's own cost. The torch-sdpa peer times that attention alone (no "
            "projections): compare it with the kernel column, not with the sessions."
        ),
        "",
        "| S | variant | session | kernel | session / kernel | ORT node | node / kernel | kernel GFLOP/s | "
        "of sgemm | kernel used |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        if "kernel_ms" not in r:  # the peer: attention only, no session
            lines.append(
                f"| {seq_label(r['seq_len'])} | {r['variant']} | | {_ms(r['latency_ms']['median'])} | | | | | | "
                f"PyTorch scaled_dot_product_attention ({r.get('torch_threads')} threads) |"
            )
            continue
        k = r["kernel_ms"]
        used = (
            k["kernel"]
            + (f" ({k['isa']})" if k.get("isa") else "")
            + (f"; {k['fallback']}" if k.get("fallback") else "")
        )
        lines.append(
            f"| {seq_label(r['seq_len'])} | {r['variant']} | {_ms(r['latency_ms']['median'])} | "
            f"{_ms(k['median'])} | {r.get('session_over_kernel')} | "
            f"{_ms(r['ort_node_ms']) if r.get('ort_node_ms') else ''} | {r.get('node_over_kernel') or ''} | "
            f"{r.get('kernel_gflops', '')} | {_percent(r.get('kernel_vs_sgemm'))} | {used} |"
        )
    return lines


def _percent(fraction: float | None) -> str:
    return "" if fraction is None else f"{fraction:.0%}"


def sgemm_line(results: Results) -> str | None:
    """The run's sgemm rate, in words, or None when it was not measured."""
    rate = results.get("sgemm")
    if not rate:
        return None
    if "gflops" not in rate:
        return f"sgemm rate: not measured ({rate['start'].get('error') or rate['end'].get('error')})"
    both = " / ".join(str(rate[k].get("gflops", rate[k].get("status"))) for k in ("start", "end"))
    return (
        f"sgemm rate: {rate['gflops']} GFLOP/s ({rate['method']}, {rate['blas']}; best of the measurements at the "
        f"run's start / end: {both}); kernel GFLOP/s counts attention's two products, 2*Sq*Sk*(D+Dv)*H*B FLOPs "
        "(4*S^2*D*H*B for D = Dv; only the visible pairs under is_causal), over the kernel called directly"
    )


def markdown(results: Results) -> str:
    lines = _header(results)
    lines += ["", "## Median latency (speedup vs original, higher is better)", ""] + _md_table(results, "latency")
    lines += ["", "## CPU time per run, all threads (ratio original / variant)", ""] + _md_table(results, "cpu")
    lines += ["", "## Inference peak memory (ratio vs original, lower is better)", ""] + _md_table(results, "memory")
    lines += ["", "## Process peak RSS (session creation and runs, absolute)", ""] + _md_table(results, "process")
    lines += _kernel_table(results)
    ops: dict[str, dict[str, int]] = {}
    for r in results["runs"]:
        if r.get("status") == "ok" and "ort_graph_ops" in r:
            ops.setdefault(r["variant"], r["ort_graph_ops"])
    if ops:
        lines += ["", "## Attention ops in ORT's optimized graph (first sequence length run)", ""]
        lines += [
            f"- {var}: " + (", ".join(f"{k} {n}" for k, n in (counts or {}).items()) or "none")
            for var, counts in ops.items()
        ]
    bad = [r for r in results["runs"] if r.get("status") != "ok"]
    if bad:
        lines += ["", "## Not measured", ""]
        lines += [f"- S={seq_label(r['seq_len'])} {r['variant']}: {r['status']}: {r.get('error', '')}" for r in bad]
    if results.get("baseline_check"):
        lines += ["", "## Regression check against a baseline", ""] + [
            f"- {x}" for x in results["baseline_check"]["lines"]
        ]
    return "\n".join(lines + [""])


def plot_results(results: Results, path: Path) -> str | None:
    """Latency and memory against S on log axes; None when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    seq_lens = results["config"]["seq_lens"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for v in variant_labels(results):
        pts = [(s, r) for s, r in ((s, ok_run(results, v, s)) for s in seq_lens) if r]
        if not pts:
            continue
        style = {"color": "black", "linewidth": 2.5, "linestyle": "--"} if v == "original" else {}
        xs = [s for s, _ in pts]
        axes[0].plot(xs, [r["latency_ms"]["median"] for _, r in pts], marker="o", label=v, **style)
        axes[1].plot(xs, [max(r["memory_mb"]["inference_peak"], 0.1) for _, r in pts], marker="o", label=v, **style)
    for ax, ylabel in zip(axes, ("median latency (ms)", "inference peak memory (MiB)")):
        if FIXED_SIZE not in seq_lens:
            ax.set_xscale("log", base=2)
        ax.set_xticks(seq_lens)
        ax.set_xticklabels([seq_label(s) for s in seq_lens])
        ax.set_yscale("log")
        ax.set_xlabel("sequence length")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    m = results["machine"]
    fig.suptitle(f"{results['title']}\n{m['cpu']}, {m['usable_cores']} cores, {results['date']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return str(path)


def check_out_dir(out_dir: str, name: str) -> None:
    """Bad usage, said before anything is measured (OrtflashError, one line): an --out that is a
    file, or that cannot be made or written, and a --name that is not a plain file name."""
    if not name or os.sep in name or name in (os.curdir, os.pardir):
        raise OrtflashError(f"--name {name!r}: give a file stem, not a path")
    existing = os.path.abspath(out_dir)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise OrtflashError(f"--out {out_dir}: {existing} is a file, not a folder")
    if not os.access(existing, os.W_OK):
        raise OrtflashError(f"--out {out_dir}: the folder {existing} is not writable")


def write_results(
    results: Results, out_dir: str | Path, name: str = "bench", *, plot: bool = True, console: Any = None
) -> dict[str, str]:
    """NAME.json (also a valid --baseline), NAME.md and, with matplotlib, NAME.png in out_dir;
    a folder or file that cannot be written is an OrtflashError (one line)."""
    out_dir = Path(out_dir)
    paths = {"json": str(out_dir / f"{name}.json"), "md": str(out_dir / f"{name}.md")}
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        with open(paths["json"], "w") as f:
            json.dump({k: x for k, x in results.items() if k != "files"}, f, indent=1)
            f.write("\n")
        Path(paths["md"]).write_text(markdown(results))
    except OSError as exc:
        raise OrtflashError(f"--out {out_dir}: could not write the results ({exc.strerror or exc})") from None
    if plot:
        png = plot_results(results, out_dir / f"{name}.png")
        if png:
            paths["png"] = png
        elif console is not None:
            console.print(
                "[yellow]matplotlib is not installed: no plot written[/] "
                "(pip install matplotlib; the JSON and markdown have every number)"
            )
    if console is not None:
        console.print("wrote " + ", ".join(paths.values()))
    return paths
