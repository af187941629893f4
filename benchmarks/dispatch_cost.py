"""What the default's length If costs, read across many sessions (issue 30 item 4: at most 2% at S = 32).

Two sessions of one file in one process differ by 3-5% on these machines (where each session's
buffers land), more than the If costs, so one session per variant cannot read it. Here every
variant opens ``--sessions`` sessions, all in one process; each round runs each session once, in
turn; a variant's figure is the median over its sessions of each session's median CPU time per
run (one intra-op thread, so CPU time is the run's time).

``models`` (real exports, batch 1, the length given at run time):
  ``original``          the export, plain ``ort.SessionOptions``;
  ``original_options``  the export opened with ``ortflash.session_options()`` (the custom-op
                        library registered, intra-op spinning off): what the options alone cost;
  ``default``           what ``ortflash optimize M --online-softmax`` writes, opened as users do
                        (``ortflash.session_options()``); below the crossover its Ifs take the
                        original ops, so ``default`` against ``original_options`` is the If's cost;
  ``forced``            with ``--forced``: ``ortflash optimize M --target ortflash --online-softmax``
                        (every block FlashAttention at every length, no If), opened as users do: the
                        forced-fusion reading of issue 30's first target, at this noise.

``isolated``: one attention block's ops (Transpose, MatMul, Mul, Add, Softmax, MatMul; H x S x D,
a [1, 1, 1, S] bias) at the top level against the same ops inside an If whose condition is false,
per S: what an If costs per call with nothing else in the model.

    python benchmarks/dispatch_cost.py models --models A.onnx,B.onnx --seq-lens 16,32,128
    python benchmarks/dispatch_cost.py isolated --heads 12 --head-dim 32
Writes OUT/NAME.{json,md} (``--out``, default benchmarks/results/; ``--name``, default
dispatch_cost_<part>).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from length_dispatch import _configured, machine  # noqa: E402

Run = Callable[[], object]


def one_thread(options: ort.SessionOptions | None = None) -> ort.SessionOptions:
    so = options or ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = 1, 1
    return so


def read_sessions(runs_of: dict[str, list[Run]], rounds: int, warmup: int = 5) -> dict[str, dict[str, float]]:
    """Each variant's runs (one per session) called in turn, ``rounds`` times: per variant the
    median over its sessions of each session's median CPU time (ms), and their least and most."""
    every = [(label, i, run) for label, runs in runs_of.items() for i, run in enumerate(runs)]
    times: dict[tuple[str, int], list[float]] = {(label, i): [] for label, i, _ in every}
    for _ in range(warmup):
        for _, _, run in every:
            run()
    for _ in range(rounds):
        for label, i, run in every:
            start = time.process_time()
            run()
            times[(label, i)].append((time.process_time() - start) * 1e3)
    out = {}
    for label, runs in runs_of.items():
        per_session = [float(np.median(times[(label, i)])) for i in range(len(runs))]
        out[label] = {"ms": float(np.median(per_session)), "least": min(per_session), "most": max(per_session)}
    return out


def models_part(
    paths: Sequence[str], seq_lens: Sequence[int], sessions: int, rounds: int, forced: bool = False
) -> list[dict[str, Any]]:
    import ortflash
    from ortflash.checks.feeds import make_feeds

    found = []
    for path in paths:
        default, report = ortflash.optimize(path, online_softmax=True)
        default = _configured(default, 1)  # the fused branch's kernel at the one thread the session runs
        serialized = default.SerializeToString()  # once: every default session opens the same bytes
        files = {"original": (path, False), "original_options": (path, True), "default": (serialized, True)}
        if forced:
            fused, _ = ortflash.optimize(path, target="ortflash", online_softmax=True)
            files["forced"] = (_configured(fused, 1).SerializeToString(), True)
        opened: dict[str, list[ort.InferenceSession]] = {label: [] for label in files}
        for _ in range(sessions):  # the variants' sessions opened in turn, so no variant gets all the first places
            for label, (model, with_options) in files.items():
                so = one_thread(ortflash.session_options() if with_options else None)
                opened[label].append(ort.InferenceSession(model, so, providers=["CPUExecutionProvider"]))
        row: dict[str, Any] = {
            "model": Path(path).name,
            "blocks": [b.reason for b in report.blocks],
            "ifs": sum(n.op_type == "If" for n in default.graph.node),
            "by_seq": {},
        }
        graph_only = onnx.load(path, load_external_data=False)  # what make_feeds reads: the inputs
        for seq in seq_lens:
            feeds = make_feeds(graph_only, seq_len=seq, batch=1)
            try:
                reading = read_sessions(
                    {label: [lambda s=s, f=feeds: s.run(None, f) for s in ss] for label, ss in opened.items()}, rounds
                )
            except Exception as error:  # the export cannot run this length (a position table shorter than S)
                row.setdefault("not_run", {})[str(seq)] = str(error).splitlines()[0][:200]
                print(Path(path).stem, seq, "not run:", row["not_run"][str(seq)], flush=True)
                continue
            row["by_seq"][str(seq)] = reading
            print(Path(path).stem, seq, _said(reading, "original"), flush=True)
        found.append(row)
    return found


def attention_block(heads: int, head_dim: int, inside_if: bool) -> onnx.ModelProto:
    """softmax(Q·Kᵀ·scale + bias)·V, its ops at the top level or inside an If that takes them."""

    def ops(prefix: str) -> list[onnx.NodeProto]:
        return [
            helper.make_node("Transpose", ["k"], [f"{prefix}kt"], perm=[0, 1, 3, 2]),
            helper.make_node("MatMul", ["q", f"{prefix}kt"], [f"{prefix}scores"]),
            helper.make_node("Mul", [f"{prefix}scores", "scale"], [f"{prefix}scaled"]),
            helper.make_node("Add", [f"{prefix}scaled", "bias"], [f"{prefix}biased"]),
            helper.make_node("Softmax", [f"{prefix}biased"], [f"{prefix}probs"], axis=-1),
            helper.make_node("MatMul", [f"{prefix}probs", "v"], [f"{prefix}out"]),
        ]

    def branch(prefix: str) -> onnx.GraphProto:
        return helper.make_graph(ops(prefix), prefix, [], [helper.make_tensor_value_info(f"{prefix}out", 1, None)])

    if inside_if:
        nodes = [
            helper.make_node("Shape", ["k"], ["key_len"], start=2, end=3),
            helper.make_node("GreaterOrEqual", ["key_len", "never"], ["long"]),
            helper.make_node("If", ["long"], ["out"], then_branch=branch("then/"), else_branch=branch("else/")),
        ]
    else:
        nodes = ops("")
    nodes.append(helper.make_node("Transpose", ["out"], ["y"], perm=[0, 2, 1, 3]))
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, heads, "S", head_dim]) for n in "qkv"]
    inputs.append(helper.make_tensor_value_info("bias", TensorProto.FLOAT, [1, 1, 1, "S"]))
    weights = [helper.make_tensor("scale", TensorProto.FLOAT, [], [head_dim**-0.5])]
    if inside_if:
        weights.append(helper.make_tensor("never", TensorProto.INT64, [1], [1 << 40]))
    graph = helper.make_graph(nodes, "block", inputs, [helper.make_tensor_value_info("y", 1, None)], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def isolated_part(heads: int, head_dim: int, seq_lens: Sequence[int], sessions: int, rounds: int) -> dict[str, Any]:
    blocks = {"top": attention_block(heads, head_dim, False), "in_if": attention_block(heads, head_dim, True)}
    opened: dict[str, list[ort.InferenceSession]] = {label: [] for label in blocks}
    for _ in range(sessions):
        for label, model in blocks.items():
            opened[label].append(
                ort.InferenceSession(model.SerializeToString(), one_thread(), providers=["CPUExecutionProvider"])
            )
    rng = np.random.default_rng(0)
    by_seq = {}
    for seq in seq_lens:
        feeds = {n: rng.standard_normal((1, heads, seq, head_dim), np.float32) for n in "qkv"}
        feeds["bias"] = np.zeros((1, 1, 1, seq), np.float32)
        reading = read_sessions(
            {label: [lambda s=s, f=feeds: s.run(None, f) for s in ss] for label, ss in opened.items()}, rounds
        )
        reading["if_us"] = {"us": (reading["in_if"]["ms"] - reading["top"]["ms"]) * 1e3}
        by_seq[str(seq)] = reading
        print(
            seq, f"top {reading['top']['ms'] * 1e3:.1f} us, in an If {reading['in_if']['ms'] * 1e3:.1f} us", flush=True
        )
    return {"heads": heads, "head_dim": head_dim, "by_seq": by_seq}


def _said(reading: dict[str, dict[str, float]], base: str) -> str:
    ref = reading[base]["ms"]
    return "  ".join(f"{k} {v['ms']:.3f} ms ({ref / v['ms']:.3f})" for k, v in reading.items())


def render(doc: dict[str, Any]) -> str:
    """The JSON document as markdown tables: ratio = the base's time / the variant's (> 1: faster)."""
    m = doc["machine"]
    lines = [
        f"Run {doc['date']} UTC on {m['cpu']}, {m['cpus']} CPUs (AVX-512F {m['avx512f']}, AVX2 {m['avx2']}), "
        f"ONNX Runtime {doc['onnxruntime']}, one intra-op thread; {doc['sessions']} sessions per variant, "
        f"{doc['rounds']} rounds; load average {m['load_average'][0]:.2f} before, {doc['load_average_after'][0]:.2f} after.",
        "",
    ]
    for row in doc.get("models", []):
        forced = all("forced" in r for r in row["by_seq"].values())
        lines += [
            f"### {row['model']} ({row['ifs']} If, {len(row['blocks'])} blocks: {row['blocks'][0] if row['blocks'] else '-'})",
            "",
            "| S | original ms [sessions' range] | original, ortflash's options | default | default / original with the same options (the If) |"
            + (" forced (`--target ortflash`) | forced / original with the same options |" if forced else ""),
            "|---|---|---|---|---|" + ("---|---|" if forced else ""),
        ]
        for seq, r in row["by_seq"].items():
            base, opts, default = r["original"], r["original_options"], r["default"]
            forced_cells = (
                f" **{base['ms'] / r['forced']['ms']:.3f}** | {opts['ms'] / r['forced']['ms']:.3f} |" if forced else ""
            )
            lines.append(
                f"| {seq} | {base['ms']:.3f} [{base['least']:.3f}-{base['most']:.3f}] | {base['ms'] / opts['ms']:.3f} "
                f"| **{base['ms'] / default['ms']:.3f}** | {opts['ms'] / default['ms']:.3f} |" + forced_cells
            )
        for seq, why in row.get("not_run", {}).items():
            lines.append(f"| {seq} | not run: {why} |")
        lines.append("")
    if "isolated" in doc:
        iso = doc["isolated"]
        lines += [
            f"### One attention block alone, H = {iso['heads']}, D = {iso['head_dim']}: its ops at the top level and inside an If",
            "",
            "| S | top level us | inside an If us | the If's cost us |",
            "|---|---|---|---|",
        ]
        for seq, r in iso["by_seq"].items():
            lines.append(
                f"| {seq} | {r['top']['ms'] * 1e3:.1f} | {r['in_if']['ms'] * 1e3:.1f} | {r['if_us']['us']:+.1f} |"
            )
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("part", choices=("models", "isolated"))
    parser.add_argument("--models", default="")
    parser.add_argument("--seq-lens", default="16,32,64,128,256")
    parser.add_argument("--sessions", type=int, default=5, help="sessions per variant")
    parser.add_argument("--rounds", type=int, default=150)
    parser.add_argument("--forced", action="store_true", help="models: also --target ortflash (forced fusion)")
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--head-dim", type=int, default=32)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    parser.add_argument("--name", default="", help="file stem (default dispatch_cost_<part>)")
    args = parser.parse_args(argv)
    seq_lens = [int(s) for s in args.seq_lens.split(",")]
    started = machine()
    doc: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="minutes"),
        "machine": started,
        "onnxruntime": ort.__version__,
        "sessions": args.sessions,
        "rounds": args.rounds,
        "threads": 1,
    }
    if args.part == "models":
        doc["models"] = models_part(
            [m for m in args.models.split(",") if m], seq_lens, args.sessions, args.rounds, forced=args.forced
        )
    else:
        doc["isolated"] = isolated_part(args.heads, args.head_dim, seq_lens, args.sessions, args.rounds)
    doc["load_average_after"] = os.getloadavg()
    out = Path(args.out) / f"{args.name or 'dispatch_cost_' + args.part}.json"
    out.parent.mkdir(parents=True, exist_ok=True)  # an --out that does not exist yet: made, not a lost run
    out.write_text(json.dumps(doc, indent=1) + "\n")
    out.with_suffix(".md").write_text(render(doc))
    print(f"wrote {out} and its .md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
