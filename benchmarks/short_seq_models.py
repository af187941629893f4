"""Model-level ratios of forced fusion at the lengths real encoders run (issue 30 "Done when").

Runs ``ortflash bench MODEL --variants original,online`` (each variant and length in its own
process, rounds alternated; the original in a plain onnxruntime session, the fused model, made
with ``target="ortflash"`` and the online softmax from key length 0, in ``ortflash.InferenceSession``)
for each model, then gathers the ratios into one table with the geomean and the worst per model
and overall, from CPU time (one thread per worker: robust to a loaded machine) and from wall time.

    python benchmarks/short_seq_models.py --out benchmarks/results/short_seq_models
    python benchmarks/short_seq_models.py --gather /tmp/msm --out benchmarks/results/short_seq_models
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

EXPORTS = Path("/work/exports")
MODELS = (
    "minilm_l3_eager_torchscript",
    "minilm_l6_eager_torchscript",
    "minilm_l6_sdpa_dynamo",
    "bert_h6d64_l4_eager_torchscript",
    "vit_s_l6_eager_torchscript",
)
HEAD_DIM = {"bert_h6d64_l4_eager_torchscript": 64, "vit_s_l6_eager_torchscript": 64}
SEQ_LENS = "16,32,64,128,197,256,512"
VARIANTS = {
    "online": "`ortflash.optimize(target='ortflash', online softmax from key length 0)`",
    "forced": "`ortflash optimize M --target ortflash --online-softmax`: naive below 1024 keys, online from it",
}


def model_path(name: str) -> Path:
    """A real-size export by name, or a zoo model (models/NAME.onnx) given as zoo:NAME."""
    if name.startswith("zoo:"):
        return Path(__file__).resolve().parents[1] / "models" / f"{name[4:]}.onnx"
    return EXPORTS / f"{name}.onnx"


def geomean(xs: list[float]) -> float | None:
    return round(math.exp(sum(math.log(x) for x in xs) / len(xs)), 3) if xs else None


def gather(folder: Path, models: list[str], variant: str = "online") -> dict[str, Any]:
    out: dict[str, Any] = {"models": {}}
    every: dict[str, list[float]] = {"cpu": [], "wall": []}
    for name in models:
        path = folder / f"{name.replace(':', '_')}.json"
        if not path.exists():
            continue
        d = json.loads(path.read_text())
        rows = {}
        for seq, r in d["ratios"].items():
            fused = r.get(variant, {})
            if "cpu_speedup" in fused:
                rows[seq] = {"cpu": fused["cpu_speedup"], "wall": fused["speedup"]}
        cpu = [v["cpu"] for v in rows.values()]
        wall = [v["wall"] for v in rows.values()]
        every["cpu"] += cpu
        every["wall"] += wall
        out["models"][name] = {
            "head_dim": HEAD_DIM.get(name, 32),  # the zoo's BERT and ViT: 2 heads x 32
            "ratios": rows,
            "cpu_geomean": geomean(cpu),
            "cpu_worst": min(cpu) if cpu else None,
            "wall_geomean": geomean(wall),
            "wall_worst": min(wall) if wall else None,
            "machine": d.get("machine"),
            "date": d.get("date"),
            "loadavg": [d.get("loadavg_start"), d.get("loadavg_end")],
            "config": d.get("config"),
            "isa": d.get("isa_used"),
        }
    out["variant"] = variant
    out["all"] = {
        "cpu_geomean": geomean(every["cpu"]),
        "cpu_worst": min(every["cpu"]) if every["cpu"] else None,
        "wall_geomean": geomean(every["wall"]),
        "wall_worst": min(every["wall"]) if every["wall"] else None,
        "cases": len(every["cpu"]),
    }
    return out


def markdown(res: dict[str, Any], note: str) -> str:
    first = next(iter(res["models"].values()), {})
    cfg = first.get("config") or {}
    lines = [
        "# Forced fusion on real-size encoders at S = 16-512 (issue 30 items 1-2)",
        "",
        f"- date: {res['date']}; machine: {first.get('machine')}; kernel build: {first.get('isa')}",
        f"- `ortflash bench MODEL --variants {','.join(v.split('=')[0] for v in cfg.get('variants', []))} --threads "
        f"{cfg.get('threads')} --rounds {cfg.get('rounds')} --repeats {cfg.get('repeats')}`: each variant and length"
        " in its own process, rounds alternated; original = plain onnxruntime session (ORT defaults); the fused"
        f" variant read here: `{res.get('variant', 'online')}` ("
        + VARIANTS.get(res.get("variant", "online"), "a model given as LABEL=PATH")
        + ") in ortflash.InferenceSession",
        "- inputs: ortflash's bench feeds (batch 1, attention mask with the last third padded); models from"
        " models/real_size_exports.py (random weights)",
        "- ratio = original / fused, higher is better; `cpu`: CPU time per run (all threads), `wall`: median"
        " wall time (a shared 2-core machine: wall is noisy, CPU time is the figure to read)",
        f"- {note}" if note else "",
        "",
        "| model | D | S | cpu | wall |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, m in res["models"].items():
        for seq, r in m["ratios"].items():
            lines.append(f"| {name} | {m['head_dim']} | {seq} | {r['cpu']} | {r['wall']} |")
    lines += [
        "",
        "| model | cpu geomean | cpu worst | wall geomean | wall worst | load avg start / end |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for name, m in res["models"].items():
        lines.append(
            f"| {name} | {m['cpu_geomean']} | {m['cpu_worst']} | {m['wall_geomean']} | "
            f"{m['wall_worst']} | {m['loadavg'][0]} / {m['loadavg'][1]} |"
        )
    a = res["all"]
    lines.append(
        f"| **all {a['cases']} cases** | {a['cpu_geomean']} | {a['cpu_worst']} | {a['wall_geomean']} | "
        f"{a['wall_worst']} | |"
    )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="*", default=list(MODELS))
    ap.add_argument("--seq-lens", default=SEQ_LENS)
    ap.add_argument("--threads", default="1")
    ap.add_argument("--rounds", default="2")
    ap.add_argument("--repeats", default="10", help="timed runs per process")
    ap.add_argument("--warmup", default="3", help="untimed runs per process first (sub-ms models want tens)")
    ap.add_argument("--gather", type=Path, help="only gather the bench JSONs already in this folder")
    ap.add_argument("--work", type=Path, default=Path("/tmp/short_seq_models"))
    ap.add_argument("--note", default="")
    ap.add_argument("--variant", default="online", help="the fused variant's label in the bench JSONs to read")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    folder = args.gather or args.work
    if not args.gather:
        folder.mkdir(parents=True, exist_ok=True)
        for name in args.models:
            lengths = [] if "vit" in name else ["--seq-lens", args.seq_lens]  # ViT: 197, fixed
            cmd = [sys.executable, "-m", "ortflash", "bench", str(model_path(name)), *lengths,
                   "--variants", "original,online", "--rounds", args.rounds, "--repeats", args.repeats,
                   "--warmup", args.warmup, "--no-profile", "--sgemm-size", "0", "--threads", args.threads, "--out",
                   str(folder), "--name", name.replace(":", "_")]  # fmt: skip
            subprocess.run(cmd, check=False, env=dict(os.environ))
    res = gather(folder, args.models, args.variant)
    res["date"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(res, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(markdown(res, args.note))
    print(markdown(res, args.note))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
