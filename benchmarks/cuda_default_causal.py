"""`ortflash optimize M --ep cuda` with no --seq-lens, on a float16 decoder stack whose length is a name,
against the model as it was, on ONNX Runtime's CUDA EP (issue 31 item 4: the symbolic length).

The model is cpu_attention.py's 2-layer stack with an exported causal mask (the causal_mask stack:
projections, the mask built from Range / Greater / Where, no attention_mask input), hidden 768, as
12 heads of 64 and 6 heads of 128, in float16 (crossover_gpu._as_float16). ``make`` writes the
original and what `--ep cuda` writes for it (the report's reason per block in index.json); ``run``
times both in one process on the GPU, I/O bound there, alternating, at each length; ``table``
writes the markdown.

    python benchmarks/cuda_default_causal.py make build/cuda_run/default_causal
    python benchmarks/cuda_default_causal.py run build/cuda_run/default_causal --out OUT   # on the GPU machine
    python benchmarks/cuda_default_causal.py table OUT/cuda_default_causal.json --md benchmarks/results/cuda_default_causal.md
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ep_probe  # noqa: E402

SHAPES = ((12, 64), (6, 128))  # heads x head dim, hidden 768
LENGTHS = (16, 64, 256, 1024, 2048, 4096)
VARIANTS = ("original", "ep_cuda")


def make(folder: str) -> None:
    import cpu_attention
    import crossover_gpu
    import onnx
    from onnx import numpy_helper

    import ortflash

    os.makedirs(folder, exist_ok=True)
    index = []
    for heads, d in SHAPES:
        stack = cpu_attention.build_model(2, stack="causal_mask", heads=heads, head_dim=d)
        for t in stack.graph.initializer:  # weights on multiples of 1/64, so that the bundle packs small
            a = numpy_helper.to_array(t)
            if a.size > 1024:
                t.CopyFrom(numpy_helper.from_array((np.round(a * 64) / 64).astype(a.dtype), t.name))
        original = crossover_gpu._as_float16(stack)
        written, report = ortflash.optimize(original, ep="cuda")
        stem = f"causal_mask_h{heads}d{d}"
        onnx.save(original, os.path.join(folder, f"{stem}.original.onnx"))
        onnx.save(written, os.path.join(folder, f"{stem}.ep_cuda.onnx"))
        ops = sorted({n.op_type for n in written.graph.node} & {"Attention", "GroupQueryAttention", "If", "Softmax"})
        reasons = [f"{b.name}: {b.lowered_to or 'kept'}: {b.reason}" for b in report.blocks]
        index.append({"stem": stem, "heads": heads, "head_dim": d, "ops": ops, "reasons": reasons})
        print(stem, ops, reasons, flush=True)
    json.dump(index, open(os.path.join(folder, "index.json"), "w"), indent=1)


def run(folder: str, out_dir: str) -> None:
    import cuda_capabilities as caps
    import cuda_forms
    import onnxruntime as ort

    if hasattr(ort, "preload_dlls"):
        ort.preload_dlls()
    os.makedirs(out_dir, exist_ok=True)
    index = json.load(open(os.path.join(folder, "index.json")))
    rows: list[dict[str, Any]] = []
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": {"gpu": ep_probe.gpu(), "ep": "CUDAExecutionProvider", "onnxruntime": ort.__version__},
        "models": index,
        "rows": rows,
    }
    for entry in index:
        sessions = {
            v: cuda_forms.session(ort, os.path.join(folder, f"{entry['stem']}.{v}.onnx"), True) for v in VARIANTS
        }
        for s in LENGTHS:
            rng = np.random.default_rng(s)
            feeds = {"hidden_states": rng.standard_normal((1, s, 768), dtype=np.float32).astype(np.float16)}
            outs = {v: sess.run(None, feeds)[0] for v, sess in sessions.items()}
            timers = {v: caps.timed_call(sess, caps.bind_on_gpu(ort, sess, feeds)) for v, sess in sessions.items()}
            ms = cuda_forms.ep_probe_alternating(timers)
            row = {"stem": entry["stem"], "seq": s, **{f"{v}_ms": round(ms[v], 4) for v in VARIANTS}}
            row.update(
                ep_probe.error(outs["original"].astype(np.float32), outs["ep_cuda"].astype(np.float32), "float16")
            )
            rows.append(row)
            print(json.dumps(row, default=str), flush=True)
    json.dump(result, open(os.path.join(out_dir, "cuda_default_causal.json"), "w"), indent=1, default=str)


def table(json_path: str, md_path: str) -> None:
    data = json.load(open(json_path))
    lines = [
        "# `--ep cuda` with no `--seq-lens` on a float16 causal stack of symbolic length",
        "",
        f"- date: {data['date']}; {data['machine']}",
        "- command: `python benchmarks/cuda_default_causal.py make` here, `run` on the GPU machine",
        "- cpu_attention.py's 2-layer causal_mask stack (hidden 768, projections, the mask exported as "
        "Range/Greater/Where), float16, batch 1, the length a name; ms: median wall, I/O bound on the GPU, "
        "both variants alternating in one process, the EP's defaults; ratio = original / ep_cuda",
        "",
    ]
    for m in data["models"]:
        lines += [f"- `{m['stem']}`: `--ep cuda` wrote {', '.join(m['ops']) or 'no attention op'}; " + m["reasons"][0]]
    lines += ["", "| model | S | original ms | ep_cuda ms | ratio | max err | ok |", "|---|---|---|---|---|---|---|"]
    for r in data["rows"]:
        ratio = r["original_ms"] / r["ep_cuda_ms"]
        err = r.get("max_abs")
        lines.append(
            f"| {r['stem']} | {r['seq']} | {r['original_ms']:.3f} | {r['ep_cuda_ms']:.3f} | {ratio:.2f}x | "
            f"{'' if err is None else f'{err:.3g}'} | {'yes' if r.get('ok') else 'no'} |"
        )
    ep_probe.write_table(md_path, lines)


def main(argv: list[str] | None = None) -> int:
    steps = ep_probe.StepCommandLine(__doc__, md="benchmarks/results/cuda_default_causal.md", device=None)
    return steps.call(
        argv,
        make=lambda args: make(args.folder),
        run=lambda args: run(args.folder, args.out),
        table=lambda args: table(args.json, args.md),
    )


if __name__ == "__main__":
    sys.exit(main())
