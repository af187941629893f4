"""What a model that picks its form by the run's length costs, and what it gains (issue 30 items 4, 5).

Part 1, the dispatch's own cost: each model against itself with the dispatch added and the
original ops in BOTH branches (so only the If differs), three ways:

  ``if_shared``    an If per attention block, one condition per distinct key-length dim shared by
                   the blocks (pipeline/length_dispatch.py, what ``ortflash optimize`` writes);
  ``if_per_block`` an If per block, each computing its own condition from its own K;
  ``if_top``       one If at the top whose two branches are the whole graph, the weights read from
                   the outer scope as initializers;

and ``default``: what ``ortflash optimize M --online-softmax`` writes (no --target, no --seq-lens),
whose fused branch runs from the cost table's crossover.

Part 2, the default's gain where the length is known only at run time: the 2-layer BERT-base-sized
stacks of benchmarks/cpu_attention.py (padding, causal_mask) at short and long S, original against
``default``.

Each variant runs in its own process through ``ortflash.bench.bench`` (rounds alternated, CPU time
at one thread per worker, and wall time). Writes benchmarks/results/length_dispatch.{md,json}.

    python benchmarks/length_dispatch.py --part cost --models /work/exports/minilm_l3_eager_torchscript.onnx
    python benchmarks/length_dispatch.py --part gain --seq-lens 32,4096
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import onnx
from onnx import helper

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))


def top_level_if(model: onnx.ModelProto, length_input: str, axis: int) -> onnx.ModelProto:
    """``model`` as one If on the length of ``length_input``'s ``axis`` whose branches both hold
    the whole graph; the weights stay initializers of the outer graph, read from both branches."""
    graph = model.graph

    def branch(side: str) -> onnx.GraphProto:
        made = {o for n in graph.node for o in n.output if o}
        nodes = []
        for n in graph.node:
            copy = onnx.NodeProto()
            copy.CopyFrom(n)
            copy.name = f"{n.name}/{side}"
            copy.input[:] = [f"{i}/{side}" if i in made else i for i in n.input]
            copy.output[:] = [f"{o}/{side}" if o else o for o in n.output]
            nodes.append(copy)
        outputs = []
        for o in graph.output:
            vi = onnx.ValueInfoProto()
            vi.CopyFrom(o)
            vi.name = f"{o.name}/{side}"
            outputs.append(vi)
        return helper.make_graph(nodes, f"top/{side}", [], outputs)

    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    del out.graph.value_info[:]
    out.graph.initializer.append(helper.make_tensor("top/from", onnx.TensorProto.INT64, [1], [1 << 40]))
    out.graph.node.extend(
        [
            helper.make_node("Shape", [length_input], ["top/len"], start=axis, end=axis + 1),
            helper.make_node("GreaterOrEqual", ["top/len", "top/from"], ["top/long"]),
            helper.make_node(
                "If",
                ["top/long"],
                [o.name for o in graph.output],
                then_branch=branch("fused"),
                else_branch=branch("original"),
            ),
        ]
    )
    return out


def _configured(model: onnx.ModelProto, threads: int | None) -> onnx.ModelProto:
    """FlashAttention nodes (subgraphs included) set to the kernel threads the workers run at."""
    from ortflash.kernels.config import KernelConfig
    from ortflash.session import configure_model

    return configure_model(model, config=KernelConfig("cpu", threads))


def interleaved(
    path: str, variants: dict[str, str], threads: int | None, runs: int = 200, seq_lens: tuple[int, ...] = (32,)
) -> dict[str, Any]:
    """A second reading in one process: the original and each witness variant run in turn, one call
    each per round, ``runs`` rounds; the median CPU time per call (ms). A run of one process sees the
    same machine state for every variant, which a run per process does not."""
    import time

    import numpy as np
    import onnxruntime as ort

    import ortflash
    from ortflash.checks.feeds import make_feeds
    from ortflash.model_io import graphs_of

    so = ort.SessionOptions()
    if threads:
        so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    sessions = {"original": ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])}
    for label, file in variants.items():
        model = onnx.load(file)
        if any(n.domain == "ai.onnx.contrib" for g in graphs_of(model.graph) for n in g.node):
            sessions[label] = ortflash.InferenceSession(model, sess_options=so, threads=threads)
        else:
            sessions[label] = ort.InferenceSession(file, so, providers=["CPUExecutionProvider"])
    out: dict[str, Any] = {}
    for seq in seq_lens:
        feeds = make_feeds(onnx.load(path, load_external_data=False), seq_len=seq, batch=1)
        times: dict[str, list[float]] = {k: [] for k in sessions}
        for _ in range(5):
            for s in sessions.values():
                s.run(None, feeds)
        for _ in range(runs):
            for label, s in sessions.items():
                t = time.process_time()
                s.run(None, feeds)
                times[label].append((time.process_time() - t) * 1e3)
        base = float(np.median(times["original"]))
        out[str(seq)] = {
            k: {"median_ms": float(np.median(v)), "ratio": base / float(np.median(v))} for k, v in times.items()
        }
    return out


def cost_variants(path: str, work: Path, threads: int | None) -> tuple[list[str], dict[str, Any]]:
    import ortflash
    from ortflash.model_shapes import with_shapes
    from ortflash.pipeline.length_dispatch import Threshold, dispatch

    original = onnx.load(path)
    stem = Path(path).stem
    fused, report = ortflash.optimize(path, online_softmax=True, target="ortflash")
    rows = {
        i: Threshold(1 << 40, None)
        for i, b in enumerate(report.blocks)
        if b.fused and "_branch/" not in b.name and ".body" not in b.name
    }
    inferred = with_shapes(original)[0]
    variants = []
    info: dict[str, Any] = {"blocks": len(report.blocks), "dispatched": len(rows)}
    for label, share in (("if_shared", True), ("if_per_block", False)):
        built = dispatch(original, fused, rows, inferred, witness=True, share_conditions=share)
        assert not built.left, built.left
        target = work / f"{stem}_{label}.onnx"
        onnx.save(built.model, target)
        variants.append(f"{label}={target}")
        info[f"{label}_length_nodes"] = sum(
            n.name.startswith("ortflash/length_dispatch") for n in built.model.graph.node
        )
    same = work / f"{stem}_same.onnx"  # the original again: what an unchanged model reads (the noise)
    onnx.save(original, same)
    variants.append(f"same={same}")
    first = original.graph.input[0]
    axis = 1 if len(first.type.tensor_type.shape.dim) >= 2 else 0
    target = work / f"{stem}_if_top.onnx"
    onnx.save(top_level_if(original, first.name, axis), target)
    variants.append(f"if_top={target}")
    info["in_process_ms"] = interleaved(path, {v.split("=")[0]: v.split("=")[1] for v in variants}, threads)
    default, default_report = ortflash.optimize(path, online_softmax=True)
    target = work / f"{stem}_default.onnx"
    onnx.save(_configured(default, threads), target)
    variants.append(f"default={target}")
    info["default_rows"] = [b.reason for b in default_report.blocks]
    return variants, info


def gain_variants(
    path: str, work: Path, threads: int | None, runs: int = 40, seq_lens: Sequence[int] = (16, 32, 64, 128, 256, 512)
) -> tuple[list[str], dict[str, Any]]:
    """The default's model, and its in-process reading against the original at ``seq_lens``
    (``runs`` rounds; ``same``, the original file again, is the reading's own noise)."""
    import ortflash

    stem = Path(path).stem
    default, report = ortflash.optimize(path, online_softmax=True)
    target = work / f"{stem}_default.onnx"
    onnx.save(_configured(default, threads), target)
    same = work / f"{stem}_same.onnx"
    onnx.save(onnx.load(path), same)
    witnesses = {"default": str(target), "same": str(same)}
    in_process = interleaved(path, witnesses, threads, runs=runs, seq_lens=tuple(seq_lens))
    return [f"default={target}"], {"default_rows": [b.reason for b in report.blocks], "in_process_ms": in_process}


def count(folders: list[str], out: Path, cpu_class: str | None = None) -> int:
    """Part 3: how many attention blocks ``ortflash optimize M --online-softmax`` (no other flag)
    gives a fused path, per model of each folder's *.onnx, and by which form and length; under the
    CPU table of ``cpu_class`` (None: the running kernel build's, what the command reads)."""
    import glob

    import ortflash
    from ortflash.pipeline import forms

    rows: list[dict[str, Any]] = []
    for folder in folders:
        for path in sorted(glob.glob(os.path.join(folder, "*.onnx"))):
            try:
                _, report = ortflash.optimize(path, online_softmax=True, cpu_class=cpu_class)
                _, forced = ortflash.optimize(path, online_softmax=True, target="ortflash")
            except Exception as exc:  # a model the pipeline refuses is counted as such
                rows.append({"model": path, "error": str(exc)[:200]})
                continue
            rows.append(
                {
                    "model": path,
                    "blocks": len(report.blocks),
                    "read": forced.fused,  # blocks the rules prove (fused with --target ortflash)
                    "fused_path": report.fused,
                    "dispatched": sum(b.fused_from is not None for b in report.blocks),
                    # blocks whose fused form wins from a length no run of the original reaches (a
                    # position table shorter than the crossover): kept, with no If (pipeline/length_reach.py)
                    "kept_unreached": sum("does not run at" in b.reason for b in report.blocks),
                    "kept_kinds": [b.mask_kind for b in report.blocks if not b.fused and b.mask_kind],
                    "reasons": sorted({b.reason for b in report.blocks}),
                }
            )
            print(json.dumps(rows[-1])[:300], flush=True)
    ok = [r for r in rows if "error" not in r]
    total = {
        "models": len(ok),
        "refused": len(rows) - len(ok),
        "blocks": sum(r["blocks"] for r in ok),
        "read": sum(r["read"] for r in ok),
        "fused_path": sum(r["fused_path"] for r in ok),
        "dispatched": sum(r["dispatched"] for r in ok),
        "kept_unreached": sum(r["kept_unreached"] for r in ok),
    }
    kinds: dict[str, int] = {}
    for r in ok:
        for kind in r["kept_kinds"]:
            kinds[kind] = kinds.get(kind, 0) + 1
    total["kept_by_kind"] = kinds
    doc = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="minutes"), "machine": machine()}
    doc["cpu_class"] = cpu_class or forms.running_cpu_class()
    doc |= {"folders": folders, "total": total, "models": rows}
    out.mkdir(parents=True, exist_ok=True)
    (out / "count.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(total), flush=True)
    return 0


def machine() -> dict[str, Any]:
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    fields = dict(line.split(":", 1) for line in lscpu.splitlines() if ":" in line)
    flags = fields.get("Flags", "")
    return {
        "cpu": fields.get("Model name", "?").strip(),
        "cpus": fields.get("CPU(s)", "?").strip(),
        "avx512f": "avx512f" in flags,
        "avx2": "avx2" in flags,
        "load_average": os.getloadavg(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=("cost", "gain", "count"), required=True)
    parser.add_argument("--models", default="", help="comma-separated model files (gain: the stacks by default)")
    parser.add_argument("--seq-lens", default="32")
    parser.add_argument("--only", default="", help="comma-separated variant labels to run (default: all of the part)")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "length_dispatch_runs"))
    parser.add_argument("--cpu-class", default=None, help="count: the CPU table to read (default the running build's)")
    parser.add_argument("--in-process-runs", type=int, default=40, help="gain: rounds of the in-process reading")
    parser.add_argument("--no-bench", action="store_true", help="gain: the in-process reading only, no run per process")
    args = parser.parse_args(argv)

    if args.part == "count":
        return count(args.models.split(","), Path(args.out), args.cpu_class)
    from ortflash.bench.report import ratios
    from ortflash.bench.sweep import bench

    seq_lens = [int(s) for s in args.seq_lens.split(",")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        models = [m for m in args.models.split(",") if m]
        if args.part == "gain" and not models:
            from cpu_attention import build_model

            for stack in ("padding", "causal_mask"):
                target = work / f"bert_base_{stack}_2l.onnx"
                onnx.save(build_model(layers=2, stack=stack), target)
                models.append(str(target))
        for path in models:
            if args.part == "cost":
                variants, info = cost_variants(path, work, args.threads or None)
            else:
                variants, info = gain_variants(path, work, args.threads or None, args.in_process_runs, seq_lens)
            if args.no_bench and args.part == "gain":
                variants = []
            if args.only:
                variants = [v for v in variants if v.split("=")[0] in args.only.split(",")]
            started = machine()
            results = (
                {"runs": [], "config": {"seq_lens": []}}
                if args.no_bench and args.part == "gain"
                else bench(
                    path,
                    seq_lens=seq_lens,
                    variants=("original", *variants),
                    repeats=args.repeats,
                    warmup=3,
                    rounds=args.rounds,
                    threads=args.threads or None,
                    profile=False,
                    plot=False,
                    progress=False,
                    name=f"length_dispatch_{Path(path).stem}",
                )
            )
            doc = {
                "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="minutes"),
                "machine": started,
                "load_average_after": os.getloadavg(),
                "model": Path(path).name,
                "part": args.part,
                "threads": args.threads,
                "repeats": args.repeats,
                "rounds": args.rounds,
                "info": info,
                "ratios": ratios(results),
                "median_ms": {
                    str(s): {
                        r["variant"]: r.get("latency_ms", {}).get("median")
                        for r in results["runs"]
                        if r.get("seq_len") == s and r.get("ok", True)
                    }
                    for s in seq_lens
                },
            }
            name = f"{args.part}_{Path(path).stem}_{'_'.join(map(str, seq_lens))}.json"
            (out / name).write_text(json.dumps(doc, indent=1) + "\n")
            print(json.dumps({"model": doc["model"], "ratios": doc["ratios"]}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
