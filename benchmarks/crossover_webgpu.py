"""Where ``--target webgpu`` starts to beat the original graph on ONNX Runtime's WebGPU EP: the
WebGPU side of the cost table (issue 20), in the schema of benchmarks/results/crossover_cpu.json.

The models are benchmarks/cpu_attention.py's ``padding`` and ``causal`` stacks (2 attention layers of
12 heads, Q/K/V and output projections, residual, LayerNormalization; random weights), head dims
32 and 64, as written and after ``ortflash.optimize`` + ``lower(.., "webgpu")``. Three steps, since
the GPU machine has no ortflash (the weights do not travel: the run step rebuilds them from the
same seed, bit for bit, into the data file both models point at):

    python benchmarks/crossover_webgpu.py make build/cuda_run/xwebgpu       # here
    python benchmarks/crossover_webgpu.py run build/cuda_run/xwebgpu --out OUT   # GPU machine, WebGPU plugin EP
    python benchmarks/crossover_webgpu.py table OUT/crossover_webgpu.json  # here: the .md

Each (stack, head dim, S) runs both variants in the same process on the WebGPU EP, batch 1, in
alternating order over ``ROUNDS`` rounds of ``REPEATS`` timed runs (host-to-host, median); the ratio
is original / webgpu time, so above 1 the lowered model is faster. The crossover is
crossover.py's: the least S with ratio >= WIN there and >= 1 at every larger S.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import crossover_gpu as xg  # noqa: E402 - the stacks, make step, timing and command line both GPU tables share
import ep_probe  # noqa: E402
import webgpu_capabilities as wcaps  # noqa: E402
from crossover import WIN, crossover  # noqa: E402 - the CPU table's rule (ortflash imported only in its main)

SEQ_LENS = (64, 128, 256, 512, 1024, 2048)
HEAD_DIMS = (32, 64)
STACKS = ("padding", "causal")
HEADS = xg.HEADS
LAYERS = xg.LAYERS
ROUNDS = 3
REPEATS = 5
FORM = "webgpu"
CASES = [{"stack": stack, "head_dim": d} for stack in STACKS for d in HEAD_DIMS]


def run(folder: str, out_dir: str, budget_s: float) -> None:
    import onnxruntime as ort

    ep = wcaps.register_webgpu(ort)
    os.makedirs(out_dir, exist_ok=True)
    started = time.perf_counter()
    index = json.load(open(os.path.join(folder, "index.json")))
    forms: dict[str, Any] = {}
    rows = []
    for entry in index:
        stack, d = entry["stack"], entry["head_dim"]
        stem = xg.stem(entry)
        xg.weights(entry, folder)  # the data file, bit for bit as make wrote it
        sessions = {}
        for variant in ("original", FORM):
            sess = ort.InferenceSession(
                os.path.join(folder, f"{stem}.{variant}.onnx"), wcaps.webgpu_session_options(ort, None)
            )
            if not any("WebGpu" in p or p == ep for p in sess.get_providers()):
                raise SystemExit(f"the WebGPU EP did not take {stem}.{variant}: {sess.get_providers()}")
            sessions[variant] = sess
        ratios, measured = xg.measure_lengths(
            entry,
            sessions,
            lambda by, own: {v: xg.timed_run(by[v], own[v]) for v in own},
            SEQ_LENS,
            started + budget_s,
            ROUNDS,
            REPEATS,
        )
        rows += measured
        forms.setdefault(stack, {})[str(d)] = {
            "ratios": {str(s): r for s, r in ratios.items()},
            "crossover": crossover(ratios),
        }
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": {"gpu": ep_probe.gpu(), "ep": ep, "onnxruntime": ort.__version__},
        "heads": HEADS,
        "layers": LAYERS,
        "win": WIN,
        "metric": "wall",
        "seq_lens": list(SEQ_LENS),
        "forms": {FORM: forms["padding"]} if "padding" in forms else {},
        "by_stack": {stack: {FORM: v} for stack, v in forms.items()},
        "rows": rows,
    }
    # the plugin module has no __version__; its EP device's metadata says it
    result["machine"]["onnxruntime_ep_webgpu"] = next(
        (dict(d.ep_metadata).get("version", "?") for d in ort.get_ep_devices() if d.ep_name == ep), "?"
    )
    json.dump(result, open(os.path.join(out_dir, "crossover_webgpu.json"), "w"), indent=1)


# A table row's head dim bucket (forms.crossover reads a head dim <= 32 from the 32 row, one
# between from both, >= 64 from the 64 row) and its stack: the kinds the stacks did not measure
# take the padding row (lowering/webgpu.py CROSSOVERS), so an export's no-mask or full-bias block counts there.
_STACK_OF_KIND = {"causal": "causal", "padding": "padding", "none": "padding", "bias": "padding"}


def _buckets(head_dim: int | None) -> list[int]:
    if head_dim is None:
        return list(HEAD_DIMS)
    if head_dim <= HEAD_DIMS[0]:
        return [HEAD_DIMS[0]]
    if head_dim >= HEAD_DIMS[-1]:
        return [HEAD_DIMS[-1]]
    return list(HEAD_DIMS)


def fold_exports(data: dict[str, Any], exports: dict[str, Any], variant: str = FORM) -> None:
    """Fold the held-out exports' ratios (benchmarks/webgpu_outside.py's JSON) into the stacks' rows:
    per (stack, head dim) the least ratio any measurement gave at each length, and the crossover
    of those (so a form is chosen only where no export and no stack measured it slower)."""
    for r in exports["rows"]:
        if "ms" not in r or not r.get("blocks") or r.get("lowered") == 0:
            continue  # an export whose blocks all kept their ops measures no form
        ratios = {s: ms["original"] / ms[variant] for s, ms in r["ms"].items() if variant in ms and "original" in ms}
        for block in {(b["kind"], b["head_dim"]) for b in r["blocks"]}:
            stack = _STACK_OF_KIND.get(block[0])
            if stack is None or stack not in data["by_stack"]:
                continue
            # the causal stack's original is Attention-23, which the EP runs on the CPU: it stands for no
            # export, so every causal export's ratios count in both of its rows (no export has D = 64)
            for d in _buckets(None if stack == "causal" else block[1]):
                row = data["by_stack"][stack][FORM].get(str(d))
                if row is None:
                    continue
                row.setdefault("exports", {})[r["model"]] = {s: round(x, 3) for s, x in ratios.items()}
    for by_form in data["by_stack"].values():
        for row in by_form[FORM].values():
            least: dict[int, float | None] = {int(s): x for s, x in row["ratios"].items()}
            row["stack_crossover"] = crossover(least)
            for got in row.get("exports", {}).values():
                for length, x in got.items():
                    seen = least.get(int(length))
                    least[int(length)] = x if seen is None else min(x, seen)
            row["least_ratios"] = {str(s): least[s] for s in sorted(least)}
            row["crossover"] = crossover(least)
    data["forms"] = {FORM: data["by_stack"]["padding"][FORM]} if "padding" in data["by_stack"] else {}
    data["exports"] = {"date": exports["date"], "machine": exports["machine"], "models": len(exports["rows"])}


def table(json_path: str, md_path: str, exports_path: str | None = None) -> None:
    data = json.load(open(json_path))
    if exports_path:
        runs = [json.load(open(p)) for p in exports_path.split(",")]
        merged = dict(runs[0])
        if len(runs) > 1:  # several runs of the same exports: each row counts, named by its run
            merged["rows"] = [
                dict(r, model=f"{r['model']} (run {i})") for i, d in enumerate(runs, 1) for r in d["rows"]
            ]
            merged["date"] = " and ".join(d["date"] for d in runs)
        fold_exports(data, merged)
        json.dump(data, open(json_path, "w"), indent=1)
    lines = [
        "# Where `--target webgpu` beats the original on ONNX Runtime's WebGPU EP",
        "",
        f"- date: {data['date']}; {data['machine']}",
        "- command: `bash benchmarks/webgpu_gpu_run.sh stacks` (stock onnxruntime 1.31.1 + the plugin) after "
        "`python benchmarks/crossover_webgpu.py make build/webgpu_run/xwebgpu`; with `--exports`: `python "
        "benchmarks/crossover_webgpu.py table JSON --exports benchmarks/results/webgpu_outside.json`",
        f"- models: benchmarks/cpu_attention.py's stacks, {data['layers']} layers of {data['heads']} heads; batch 1; ratio = "
        f"original ms / webgpu ms, same process, alternating rounds; crossover: the least S with ratio >= {data['win']} "
        "there and >= 1 at every larger S",
        "",
        "| stack | head dim | " + " | ".join(f"S={s}" for s in data["seq_lens"]) + " | crossover |",
        "|---|---|" + "---|" * (len(data["seq_lens"]) + 1),
    ]
    for stack, by_form in data["by_stack"].items():
        for d, row in by_form[FORM].items():
            cells = xg.ratio_cells(row, data["seq_lens"])
            lines.append(
                f"| {stack} | {d} | " + " | ".join(cells) + f" | {row.get('stack_crossover', row['crossover'])} |"
            )
    if "exports" in data:
        lines += [
            "",
            f"## With the held-out exports (benchmarks/results/webgpu_outside.md, {data['exports']['date']}, "
            f"{data['exports']['models']} model runs)",
            "",
            "The table's crossover (lowering/webgpu.py CROSSOVERS): per length the least ratio of the stack and of every export "
            "with a block of that kind and head dim (D <= 32 in the 32 row; no-mask and full-bias blocks in the padding row; "
            "causal exports in both causal rows, since the causal stack's original, Attention-23, runs on the CPU), "
            "then the rule above.",
            "",
            "| stack | head dim | exports | "
            + " | ".join(
                f"S={s}"
                for s in sorted(
                    {
                        int(s)
                        for by in data["by_stack"].values()
                        for row in by[FORM].values()
                        for s in row.get("least_ratios", {})
                    }
                )
            )
            + " | crossover |",
        ]
        lens = sorted(
            {
                int(s)
                for by in data["by_stack"].values()
                for row in by[FORM].values()
                for s in row.get("least_ratios", {})
            }
        )
        lines.append("|---|---|---|" + "---|" * (len(lens) + 1))
        for stack, by_form in data["by_stack"].items():
            for d, row in by_form[FORM].items():
                least = row.get("least_ratios", {})
                cells = [f"{least[str(s)]:.2f}" if least.get(str(s)) is not None else "-" for s in lens]
                lines.append(
                    f"| {stack} | {d} | {len(row.get('exports', {}))} | "
                    + " | ".join(cells)
                    + f" | {row['crossover']} |"
                )
    lines += ["", "| stack | D | S | original ms | webgpu ms | max abs diff |", "|---|---|---|---|---|---|"]
    for r in data["rows"]:
        lines.append(
            f"| {r['stack']} | {r['head_dim']} | {r['seq']} | {r['ms']['original']:.2f} | {r['ms'][FORM]:.2f} | {r['max_abs_diff']:.2g} |"
        )
    ep_probe.write_table(md_path, lines)


def main(argv: list[str] | None = None) -> int:
    steps = ep_probe.StepCommandLine(__doc__, md="benchmarks/results/crossover_webgpu.md", device=None)
    steps.run.add_argument("--budget-s", type=float, default=150.0)
    steps.table.add_argument(
        "--exports", help="benchmarks/webgpu_outside.py's JSON (several: comma-separated runs), folded into the rows"
    )
    return steps.call(
        argv,
        make=lambda args: xg.make(args.folder, CASES, FORM),
        run=lambda args: run(args.folder, args.out, args.budget_s),
        table=lambda args: table(args.json, args.md, args.exports),
    )


if __name__ == "__main__":
    sys.exit(main())
