"""Where ``--target cuda`` starts to beat the original graph on ONNX Runtime's CUDA EP: the CUDA
side of the cost table (ortflash/forms.py), in the schema of benchmarks/results/crossover_webgpu.json.

The models are benchmarks/cpu_attention.py's stacks (2 attention layers of 12 heads, Q/K/V and
output projections, residual, LayerNormalization; random weights): ``padding`` (a [B, 1, 1, S]
padding bias), ``causal_mask`` (an exported causal mask subgraph, [S, S]), ``nomask`` and ``bias``
(a [1, H, S, S] position bias), head dims 32, 64 and 128, in float32 and in float16 (every float
tensor of the same model made float16), as written and after ``ortflash.optimize`` +
``lower(.., "cuda")``. Three
steps, since the GPU machine has no ortflash (the weights do not travel: the run step rebuilds them
from the same seed, bit for bit, into the data file both models point at):

    python benchmarks/crossover_cuda.py make build/cuda_run/xcuda          # here
    bash benchmarks/cuda_gpu_run.sh install crossover                     # GPU machine (onnxruntime-gpu)
    python benchmarks/crossover_cuda.py table OUT/crossover_cuda.json     # here: the .md

Each (stack, head dim, S) runs both variants in the same process on the CUDA EP with its defaults
(TF32 on), batch 1, inputs and outputs bound on the GPU (no host copies timed), in alternating order
over ``ROUNDS`` rounds of ``REPEATS`` timed runs (median); the ratio is original / cuda time, so
above 1 the lowered model is faster. The crossover is crossover.py's: the least S with ratio >= WIN
there and >= 1 at every larger S.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import crossover_gpu as xg  # noqa: E402 - the stacks, make step, timing and command line both GPU tables share
import cuda_capabilities as caps  # noqa: E402
import ep_probe  # noqa: E402
from crossover import WIN, crossover  # noqa: E402 - the CPU table's rule (ortflash imported only in its main)

SEQ_LENS = (64, 128, 256, 512, 1024, 2048, 4096)
HEAD_DIMS = (32, 64, 128)
STACKS = ("padding", "causal_mask", "nomask", "bias")
DTYPES = ("float32", "float16")
HEADS = xg.HEADS
LAYERS = xg.LAYERS
ROUNDS = 3
REPEATS = 10
FORM = "cuda"
CASES = [{"stack": s, "head_dim": d, "dtype": t} for t in DTYPES for s in STACKS for d in HEAD_DIMS]


def run(folder: str, out_dir: str, budget_s: float) -> None:
    import onnxruntime as ort

    if hasattr(ort, "preload_dlls"):
        ort.preload_dlls()
    os.makedirs(out_dir, exist_ok=True)
    started = time.perf_counter()
    index = json.load(open(os.path.join(folder, "index.json")))
    forms: dict[str, Any] = {}
    rows = []
    for entry in index:
        stack, d, dtype = entry["stack"], entry["head_dim"], entry["dtype"]
        stem = xg.stem(entry)
        xg.weights(entry, folder)  # the data file, bit for bit as make wrote it
        sessions = {}
        for variant in ("original", FORM):
            sess = ort.InferenceSession(
                os.path.join(folder, f"{stem}.{variant}.onnx"),
                providers=[("CUDAExecutionProvider", {"device_id": "0"}), "CPUExecutionProvider"],
            )
            if sess.get_providers()[0] != "CUDAExecutionProvider":
                raise SystemExit(f"the CUDA EP did not take {stem}.{variant}: {sess.get_providers()}")
            sessions[variant] = sess
        ratios, measured = xg.measure_lengths(
            entry,
            sessions,
            lambda by, own: {v: caps.timed_call(by[v], caps.bind_on_gpu(ort, by[v], own[v])) for v in own},
            SEQ_LENS,
            started + budget_s,
            ROUNDS,
            REPEATS,
            warm_each_round=True,
            ms_digits=4,
        )
        rows += measured
        forms.setdefault(dtype, {}).setdefault(stack, {})[str(d)] = {
            "ratios": {str(s): r for s, r in ratios.items()},
            "crossover": crossover(ratios),
        }
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": {"gpu": ep_probe.gpu(), "ep": "CUDAExecutionProvider", "onnxruntime": ort.__version__},
        "heads": HEADS,
        "layers": LAYERS,
        "win": WIN,
        "metric": "wall, I/O bound on the GPU",
        "seq_lens": list(SEQ_LENS),
        "dtypes": list(DTYPES),
        "by_dtype": {dtype: {stack: {FORM: v} for stack, v in by_stack.items()} for dtype, by_stack in forms.items()},
        "rows": rows,
    }
    json.dump(result, open(os.path.join(out_dir, "crossover_cuda.json"), "w"), indent=1)


def table(json_path: str, md_path: str) -> None:
    data = json.load(open(json_path))
    lines = [
        "# Where `--target cuda` beats the original on ONNX Runtime's CUDA EP",
        "",
        f"- date: {data['date']}; {data['machine']}",
        "- command: `bash benchmarks/cuda_gpu_run.sh install crossover` after "
        "`python benchmarks/crossover_cuda.py make build/cuda_run/xcuda`",
        f"- models: benchmarks/cpu_attention.py's stacks, float32 and float16, {data['layers']} layers of {data['heads']} heads; "
        "batch 1; the EP's defaults (TF32 on); inputs and outputs bound on the GPU; ratio = original ms / cuda ms, "
        f"same process, alternating rounds; crossover: the least S with ratio >= {data['win']} there and >= 1 at every "
        "larger S",
        "",
        "| dtype | stack | head dim | " + " | ".join(f"S={s}" for s in data["seq_lens"]) + " | crossover |",
        "|---|---|---|" + "---|" * (len(data["seq_lens"]) + 1),
    ]
    for dtype, by_stack in data["by_dtype"].items():
        for stack, by_form in by_stack.items():
            for d, row in by_form[FORM].items():
                cells = xg.ratio_cells(row, data["seq_lens"])
                lines.append(f"| {dtype} | {stack} | {d} | " + " | ".join(cells) + f" | {row['crossover']} |")
    lines += [
        "",
        "| dtype | stack | D | S | original ms | cuda ms | max abs diff |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in data["rows"]:
        lines.append(
            f"| {r['dtype']} | {r['stack']} | {r['head_dim']} | {r['seq']} | {r['ms']['original']:.3f} | "
            f"{r['ms'][FORM]:.3f} | {r['max_abs_diff']:.2g} |"
        )
    ep_probe.write_table(md_path, lines)


def main(argv: list[str] | None = None) -> int:
    return xg.main(
        __doc__,
        "benchmarks/results/crossover_cuda.md",
        argv,
        make=lambda folder: xg.make(folder, CASES, FORM),
        run=run,
        table=table,
        budget_s=200.0,
    )


if __name__ == "__main__":
    sys.exit(main())
