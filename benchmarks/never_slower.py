"""Never slower: what `ortflash optimize` writes, against the model it was given, at the lengths
real encoders run (issue 20's targets), with what fusing every block would have cost beside it.

For each model and sequence length S, each way a user leaves the target open is run through
``ortflash.optimize(..., seq_lens=[S])`` (the default, ``--online-softmax``, ``--ep cpu``):
where it keeps every block's original ops the written model is the input itself, so its ratio is
1.00 by construction (checked: the same object comes back); where it fuses, the written model is
timed against the original with ``ortflash bench`` at S. The explicit targets (``naive``,
``online``, ``contrib``, ``onnx``: every block fused as asked) are timed in the same run, one
process per variant and length, rounds alternating.

Models: attention stacks of real encoders' sizes built by benchmarks/cpu_attention.py (random
weights; no exported checkpoint can be fetched here): MiniLM-L6 (6 layers, 12 heads x 32, padding
mask, dynamic length) and ViT-S/16 (12 layers, 6 heads x 64, no mask, 197 positions fixed in the
graph); and zoo exports with a dynamic length. Results: benchmarks/results/never_slower.{md,json,png}.

    python benchmarks/never_slower.py
    python benchmarks/never_slower.py --models minilm_l6 --seq-lens 16,128 --rounds 1 --out /tmp/ns
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

SEQ_LENS = (16, 32, 64, 128, 256, 512)
VIT_POSITIONS = 197
MODES: dict[str, dict[str, Any]] = {"default": {}, "online": {"online_softmax": True}, "auto_cpu": {"ep": "cpu"}}
FORMS = ("naive", "online", "contrib", "onnx")
ZOO = ("bert_sdpa_dynamo", "gpt2_sdpa_torchscript", "t5_eager_dynamo")


def _static_length(model: Any, length: int) -> Any:
    for value in list(model.graph.input) + list(model.graph.output):
        dims = value.type.tensor_type.shape.dim
        dims[1].Clear()
        dims[1].dim_value = length
    return model


def build(name: str, folder: Path) -> tuple[Path, list[int] | None]:
    """The model file and the lengths it runs at (None: the run's --seq-lens)."""
    import onnx
    from cpu_attention import build_model

    path = folder / f"{name}.onnx"
    if name == "minilm_l6":
        onnx.save(build_model(layers=6, stack="padding", heads=12, head_dim=32), path)
        return path, None
    if name == "vit_s16":
        model = _static_length(build_model(layers=12, stack="nomask", heads=6, head_dim=64), VIT_POSITIONS)
        onnx.save(model, path)
        return path, [VIT_POSITIONS]
    return ROOT / "models" / f"{name}.onnx", None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(("minilm_l6", "vit_s16", *ZOO)))
    parser.add_argument("--seq-lens", default=",".join(map(str, SEQ_LENS)))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    parser.add_argument("--merge", action="store_true", help="keep the other models of an earlier run's JSON in --out")
    args = parser.parse_args(argv)

    import onnx
    from crossover import _cpu

    import ortflash
    from ortflash.bench.report import ratios as bench_ratios
    from ortflash.bench.sweep import bench

    doc: dict[str, Any] = {"date": datetime.date.today().isoformat(), "machine": _cpu(), "models": {}}
    asked = [int(s) for s in args.seq_lens.split(",")]
    with tempfile.TemporaryDirectory() as work:
        folder = Path(work)
        for name in args.models.split(","):
            path, fixed = build(name, folder)
            lengths = fixed or asked
            written: dict[str, dict[int, Any]] = {}
            variants = ["original", *FORMS]
            for mode, options in MODES.items():
                for s in lengths:
                    model, report = ortflash.optimize(str(path), seq_lens=[s], **options)
                    if report.fused == 0:
                        written.setdefault(mode, {})[s] = {"kept": True, "why": report.blocks[0].reason}
                        continue
                    out = folder / f"{name}_{mode}_{s}.onnx"
                    onnx.save(model, out)
                    label = f"{mode}@{s}"
                    variants.append(f"{label}={out}")
                    written.setdefault(mode, {})[s] = {"kept": False, "variant": label, "fused": report.fused}
            results = bench(
                path,
                seq_lens=None if fixed else lengths,  # a model with fixed shapes runs at its one size
                variants=tuple(variants),
                repeats=args.repeats,
                warmup=3,
                rounds=args.rounds,
                profile=False,
                plot=False,
                progress=False,
                name=f"never_slower_{name}",
            )
            by_length = bench_ratios(results)
            if fixed:  # bench names the one size by the model's own length
                by_length = {str(fixed[0]): next(iter(by_length.values()), {})}
            row: dict[str, Any] = {"lengths": lengths, "forms": {}, "written": {}}
            for form in FORMS:
                row["forms"][form] = {str(s): by_length.get(str(s), {}).get(form, {}).get("speedup") for s in lengths}
            for mode, per_length in written.items():
                row["written"][mode] = {}
                for s, w in per_length.items():
                    ratio = 1.0 if w["kept"] else by_length.get(str(s), {}).get(w["variant"], {}).get("speedup")
                    row["written"][mode][str(s)] = {**w, "ratio": ratio}
            doc["models"][name] = row
            print(name, json.dumps(row["written"])[:400], flush=True)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    earlier = out_dir / "never_slower.json"
    if args.merge and earlier.exists():  # models measured in an earlier run stay, with that run's machine line
        doc["models"] = {**json.loads(earlier.read_text())["models"], **doc["models"]}
    (out_dir / "never_slower.json").write_text(json.dumps(doc, indent=1) + "\n")
    (out_dir / "never_slower.md").write_text(_markdown(doc))
    _plot(doc, out_dir / "never_slower.png")
    return 0


def _cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _markdown(doc: dict[str, Any]) -> str:
    m = doc["machine"]
    lines = [
        f"# Never slower ({doc['date']})",
        "",
        f"Machine: {m['model']}, {m['cores']} cores, AVX-512 {m['avx512f']}, AVX2 {m['avx2']}, kernel build "
        f"{m['kernel_isa']}, load average at start {tuple(round(x, 2) for x in m['load_average'])} (a shared machine).",
        "Ratio = original time / written model's time at that length, in one `ortflash bench` run (wall time, "
        "the libraries' own threads); `1.00 kept` = every block kept its original ops, so the written model is the "
        "input itself. The form columns fuse every block as asked (`--target`), for comparison.",
        "",
    ]
    for name, row in doc["models"].items():
        lengths = row["lengths"]
        lines += [f"## {name}", "", "| what | " + " | ".join(f"S={s}" for s in lengths) + " |"]
        lines.append("|---|" + "---|" * len(lengths))
        for mode, per_length in row["written"].items():
            cells = []
            for s in lengths:
                w = per_length[str(s)]
                cells.append("1.00 kept" if w["kept"] else f"{_cell(w['ratio'])} ({w['fused']} fused)")
            lines.append(f"| written ({mode}) | " + " | ".join(cells) + " |")
        for form, by_s in row["forms"].items():
            lines.append(f"| every block {form} | " + " | ".join(_cell(by_s[str(s)]) for s in lengths) + " |")
        lines.append("")
    worst = [
        w["ratio"]
        for row in doc["models"].values()
        for per_length in row["written"].values()
        for w in per_length.values()
        if w["ratio"] is not None
    ]
    lines.append(
        f"Target (issue 20): the written model >= 1.0x at every S. Worst written ratio measured: {min(worst):.2f}."
        if worst
        else "No ratio measured."
    )
    return "\n".join(lines) + "\n"


def _plot(doc: dict[str, Any], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    names = list(doc["models"])
    fig, axes = plt.subplots(1, len(names), figsize=(4 * len(names), 3.2), squeeze=False)
    for ax, name in zip(axes[0], names):
        row = doc["models"][name]
        xs = row["lengths"]
        for form, by_s in row["forms"].items():
            ax.plot(xs, [by_s[str(s)] for s in xs], marker=".", linestyle=":", label=f"every block {form}")
        for mode, per_length in row["written"].items():
            ax.plot(xs, [per_length[str(s)]["ratio"] for s in xs], marker="o", label=f"written ({mode})")
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xscale("log", base=2)
        ax.set_title(name)
        ax.set_xlabel("S")
    axes[0][0].set_ylabel("original time / model time")
    axes[0][-1].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())
