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
    try:
        import onnxruntime_ep_webgpu as wep

        result["machine"]["onnxruntime_ep_webgpu"] = getattr(wep, "__version__", "?")
    except ImportError:
        pass
    json.dump(result, open(os.path.join(out_dir, "crossover_webgpu.json"), "w"), indent=1)


def table(json_path: str, md_path: str) -> None:
    data = json.load(open(json_path))
    lines = [
        "# Where `--target webgpu` beats the original on ONNX Runtime's WebGPU EP",
        "",
        f"- date: {data['date']}; {data['machine']}",
        "- command: `benchmarks/cuda_gpu_run.sh webgpu` after `python benchmarks/crossover_webgpu.py make build/cuda_run/xwebgpu`",
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
            lines.append(f"| {stack} | {d} | " + " | ".join(cells) + f" | {row['crossover']} |")
    lines += ["", "| stack | D | S | original ms | webgpu ms | max abs diff |", "|---|---|---|---|---|---|"]
    for r in data["rows"]:
        lines.append(
            f"| {r['stack']} | {r['head_dim']} | {r['seq']} | {r['ms']['original']:.2f} | {r['ms'][FORM]:.2f} | {r['max_abs_diff']:.2g} |"
        )
    ep_probe.write_table(md_path, lines)


def main(argv: list[str] | None = None) -> int:
    return xg.main(
        __doc__,
        "benchmarks/results/crossover_webgpu.md",
        argv,
        make=lambda folder: xg.make(folder, CASES, FORM),
        run=run,
        table=table,
        budget_s=150.0,
    )


if __name__ == "__main__":
    sys.exit(main())
