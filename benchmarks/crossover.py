"""Where each fused form starts to beat the original graph on this CPU: the cost table that
``optimize`` chooses a block's form by (``ortflash/forms.py``, ``CPU_CROSSOVERS``).

For each head dim, a 2-layer attention stack of 12 heads (benchmarks/cpu_attention.py's ``padding``
stack: Q/K/V projections, ``MatMul -> Div -> Add(padding mask) -> Softmax -> MatMul``, output
projection, residual, LayerNormalization) runs through ``ortflash.bench.bench``: every variant and
length in its own process, rounds in alternating order, ratios against the original in the same
run. The forms: ``naive`` and ``online`` (FlashAttention through ``ortflash.session_options()``),
``contrib`` (ORT's MultiHeadAttention) and ``onnx`` (Attention-23).

A form's crossover is the least measured key length S where it runs at least ``WIN`` times as fast
as the original and at least as fast at every larger measured length; ``None`` where no measured
length qualifies. Results: benchmarks/results/crossover_cpu.{json,md} (machine, ISA, load, date).

    python benchmarks/crossover.py                       # head dims 32 and 64, S = 16 .. 2048
    python benchmarks/crossover.py --head-dims 32 --seq-lens 16,64,256 --rounds 1 --out /tmp/x
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

HEADS = 12
FORMS = ("naive", "online", "contrib", "onnx")
WIN = 1.05  # a form must be this much faster at its crossover: a tie is not worth a new op
DEFAULT_SEQ_LENS = (16, 32, 64, 128, 256, 512, 1024, 2048)


def crossover(ratios: dict[int, float | None], win: float = WIN) -> int | None:
    """The least S with ratio >= win there and >= 1 at every larger S; None where none is."""
    found: int | None = None
    for s in sorted(ratios, reverse=True):
        r = ratios[s]
        if r is None or r < 1.0:
            break
        if r >= win:
            found = s
    return found


def with_length_dispatch(model: Any) -> Any:
    """``model`` with each attention block (scores MatMul .. P·V MatMul) inside an ONNX ``If`` on
    the key length whose two branches both hold the block's original ops: what a rewrite that
    dispatches on the length costs at best, the If itself, on the side that keeps the original."""
    import onnx
    from onnx import helper

    graph = model.graph
    nodes_in = list(graph.node)
    producer = {o: i for i, n in enumerate(nodes_in) for o in n.output}
    consumers: dict[str, list[int]] = {}
    for i, n in enumerate(nodes_in):
        for name in n.input:
            consumers.setdefault(name, []).append(i)
    blocks = []  # node indexes of each block, scores MatMul first, P·V last
    for index in [i for i, n in enumerate(nodes_in) if n.op_type == "Softmax"]:
        chain = [index]
        while nodes_in[chain[0]].op_type != "MatMul":
            chain.insert(0, producer[nodes_in[chain[0]].input[0]])
        chain.append(consumers[nodes_in[index].output[0]][0])
        blocks.append([nodes_in[i] for i in chain])
    ends = {c[-1].output[0]: c for c in blocks}
    moved = {n.output[0] for c in blocks for n in c}
    nodes = []
    thresholds = [helper.make_tensor("dispatch_at", onnx.TensorProto.INT64, [], [1 << 40])]
    for n in nodes_in:
        if n.output[0] not in moved:
            nodes.append(n)
            continue
        if n.output[0] not in ends:
            continue
        chain = ends[n.output[0]]
        tag = chain[-1].output[0]
        kt = chain[0].input[1]
        nodes += [
            helper.make_node("Shape", [kt], [tag + "/kt_shape"], start=-1),
            helper.make_node("Squeeze", [tag + "/kt_shape"], [tag + "/sk"]),
            helper.make_node("GreaterOrEqual", [tag + "/sk", "dispatch_at"], [tag + "/long"]),
        ]

        def branch(side: str, chain: list[Any] = chain, tag: str = tag) -> Any:
            renamed = {x.output[0]: f"{x.output[0]}/{side}" for x in chain}
            body = []
            for x in chain:
                copy = onnx.NodeProto()
                copy.CopyFrom(x)
                copy.name = f"{x.name}/{side}"
                copy.input[:] = [renamed.get(i, i) for i in x.input]
                copy.output[:] = [renamed[x.output[0]]]
                body.append(copy)
            out = helper.make_tensor_value_info(renamed[tag], onnx.TensorProto.FLOAT, None)
            return helper.make_graph(body, f"{tag}/{side}", [], [out])

        nodes.append(
            helper.make_node("If", [tag + "/long"], [tag], then_branch=branch("fused"), else_branch=branch("original"))
        )
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    out.graph.initializer.extend(thresholds)
    return out


def _cpu() -> dict[str, Any]:
    model = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if "model name" in line), "")
    flags = next((line.split(":", 1)[1].split() for line in open("/proc/cpuinfo") if line.startswith("flags")), [])
    from ortflash.kernels import cpu

    return {
        "model": model or platform.processor(),
        "cores": os.cpu_count(),
        "avx512f": "avx512f" in flags,
        "avx2": "avx2" in flags,
        "kernel_isa": cpu.isa(),
        "load_average": os.getloadavg(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--head-dims", default="32,64")
    parser.add_argument("--seq-lens", default=",".join(map(str, DEFAULT_SEQ_LENS)))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    parser.add_argument("--name", default=None, help="file stem (default crossover_cpu, crossover_cpu_STACK)")
    parser.add_argument(
        "--stack",
        default="padding",
        choices=("padding", "nomask", "causal_mask", "bias"),
        help="the mask the blocks carry (benchmarks/cpu_attention.py): one row of the cost table per kind",
    )
    parser.add_argument("--no-if-dispatch", action="store_true", help="skip timing the If-dispatch variant")
    parser.add_argument(
        "--forms",
        default=",".join(FORMS),
        help=f"which of {','.join(FORMS)} to time against the original (default all)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="ORT, kernel and BLAS threads per worker (default 1: then a run's CPU time is its own work, "
        "which other load on a shared machine does not change; 0: the libraries' own)",
    )
    parser.add_argument(
        "--metric",
        choices=("cpu", "wall"),
        default="cpu",
        help="which ratio the crossovers are read from: CPU time (default, with --threads 1) or wall time",
    )
    args = parser.parse_args(argv)

    import onnx
    from cpu_attention import build_model

    from ortflash.bench.report import ratios as bench_ratios
    from ortflash.bench.sweep import bench

    seq_lens = [int(s) for s in args.seq_lens.split(",")]
    forms = tuple(f for f in FORMS if f in args.forms.split(","))
    name = args.name or ("crossover_cpu" if args.stack == "padding" else f"crossover_cpu_{args.stack}")
    machine = _cpu()
    doc: dict[str, Any] = {
        "date": datetime.date.today().isoformat(),
        "machine": machine,
        "heads": HEADS,
        "win": WIN,
        "threads": args.threads or None,
        "metric": args.metric,
        "stack": args.stack,
        "seq_lens": seq_lens,
        "rounds": args.rounds,
        "repeats": args.repeats,
        "forms": {},
    }
    with tempfile.TemporaryDirectory() as work:
        for head_dim in (int(d) for d in args.head_dims.split(",")):
            path = Path(work) / f"stack_{head_dim}.onnx"
            stack = build_model(layers=2, stack=args.stack, heads=HEADS, head_dim=head_dim)
            onnx.save(stack, path)
            variants: tuple[str, ...] = ("original", *forms)
            if not args.no_if_dispatch:
                dispatching = Path(work) / f"stack_{head_dim}_if.onnx"
                onnx.save(with_length_dispatch(stack), dispatching)
                variants += (f"if_dispatch={dispatching}",)
            results = bench(
                path,
                seq_lens=seq_lens,
                variants=variants,
                repeats=args.repeats,
                warmup=3,
                rounds=args.rounds,
                threads=args.threads or None,
                profile=False,
                plot=False,
                progress=False,
                name=f"crossover_d{head_dim}",
            )
            by_length = bench_ratios(results)
            for form in forms:
                ratios: dict[int, float | None] = {}
                cpu_ratios: dict[int, float | None] = {}
                for s in seq_lens:
                    row = by_length.get(str(s), {}).get(form)
                    ratios[s] = None if row is None else row["speedup"]
                    cpu_ratios[s] = None if row is None else row["cpu_speedup"]
                doc["forms"].setdefault(form, {})[str(head_dim)] = {
                    "ratios": {str(s): r for s, r in ratios.items()},
                    "cpu_time_ratios": {str(s): r for s, r in cpu_ratios.items()},
                    "crossover": crossover(cpu_ratios if args.metric == "cpu" else ratios),
                }
            key = "cpu_speedup" if args.metric == "cpu" else "speedup"
            # each head dim as it ends: a long run on a shared machine keeps what it measured
            print(head_dim, json.dumps({f: doc["forms"][f][str(head_dim)] for f in forms}), flush=True)
            if args.no_if_dispatch:
                continue
            doc.setdefault("if_dispatch", {})[str(head_dim)] = {
                str(s): by_length.get(str(s), {}).get("if_dispatch", {}).get(key) for s in seq_lens
            }
    doc["machine"]["load_average_end"] = os.getloadavg()  # a shared machine: what ran beside the benchmark
    write_results(doc, Path(args.out), name)
    return 0


def write_results(doc: dict[str, Any], out: Path, name: str) -> None:
    """``out/name.json`` and ``out/name.md`` from a run's ``doc`` (its ``notes``, where any, say
    what else went into it: a second run's entries, the command lines)."""
    machine, seq_lens, cpu = doc["machine"], doc["seq_lens"], doc["metric"] == "cpu"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(doc, indent=1) + "\n")
    loads = [tuple(round(x, 2) for x in machine[k]) for k in ("load_average", "load_average_end") if k in machine]
    lines = [
        f"# Crossovers on the CPU ({doc['date']})",
        "",
        f"Machine: {machine['model']}, {machine['cores']} cores, AVX-512 {machine['avx512f']}, AVX2 {machine['avx2']}, "
        f"kernel build {machine['kernel_isa']}, load average at start / end {' / '.join(map(str, loads))}.",
        f"Model: 2-layer attention stack, {doc['heads']} heads, mask `{doc['stack']}`, batch 1 (benchmarks/cpu_attention.py), "
        f"through `ortflash bench`, {doc.get('rounds', '?')} rounds alternating, {doc.get('repeats', '?')} timed runs each, "
        f"{doc['threads'] or 'default'} thread(s) per worker; ratio = original time / form time in the same run "
        f"(higher is better), read from {'CPU' if cpu else 'wall'} time.",
        f"Crossover: the least S where the form is >= {doc['win']}x and >= 1x at every larger measured S.",
        *(f"\n{note}" for note in doc.get("notes", [])),
        "",
        "| form | head dim | " + " | ".join(f"S={s}" for s in seq_lens) + " | crossover |",
        "|---|---|" + "---|" * len(seq_lens) + "---|",
    ]
    for form, by_dim in doc["forms"].items():
        for dim, row in sorted(by_dim.items()):
            shown = row["cpu_time_ratios"] if cpu else row["ratios"]
            cells = " | ".join("-" if shown[str(s)] is None else f"{shown[str(s)]:.2f}" for s in seq_lens)
            lines.append(f"| {form} | {dim} | {cells} | {row['crossover'] or 'none measured'} |")
    if doc.get("if_dispatch"):
        lines += [
            "",
            "The cost of dispatching on the length: the original stack with each attention block inside an ONNX `If` "
            "whose both branches are the block's original ops (benchmarks/crossover.py `with_length_dispatch`), "
            "against the original, in the same run:",
            "",
            "| head dim | " + " | ".join(f"S={s}" for s in seq_lens) + " |",
            "|---|" + "---|" * len(seq_lens),
        ]
    for dim, row in doc.get("if_dispatch", {}).items():
        lines.append(
            f"| {dim} | " + " | ".join("-" if row[str(s)] is None else f"{row[str(s)]:.2f}" for s in seq_lens) + " |"
        )
    (out / f"{name}.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
