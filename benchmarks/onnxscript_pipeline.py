"""ortflash's passes and onnxscript's ``optimize_for_ort`` in one pipeline, on every zoo model, both orders.

Every model is first cleaned by onnxscript's ``optimize`` (constant folding, dead code), as the README's
pipeline does. Then, in each order:

- A, onnxscript first: ``optimize_for_ort`` (its transformer fusions: MultiHeadAttention,
  GroupQueryAttention, packed Attention, SkipLayerNormalization, ...), then ``FuseAttention``;
- B, ortflash first: ``FuseAttention``, then ``optimize_for_ort``.

``FuseAttention`` runs with ``target="ortflash"`` (every block it proves becomes a FlashAttention node),
so the table shows what each tool fuses, not the cost table's choice. For each order: the attention ops
each tool wrote, and whether the result loads in ONNX Runtime and matches the original model
(``ortflash.verify``, random inputs, float32 tolerances), with its worst error.

    python benchmarks/onnxscript_pipeline.py [--models 'bert_*'] [--out benchmarks/results/onnxscript_pipeline.md]
"""

from __future__ import annotations

import argparse
import collections
import datetime
import fnmatch
import json
import logging
import os
import platform
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import onnx_ir as ir
import onnxruntime
import onnxscript
import onnxscript.optimizer
from onnxscript.rewriter.ort_fusions import optimize_for_ort

import ortflash
from ortflash.op import spec
from ortflash.passes import FuseAttention

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
ZOO = os.path.join(ROOT, "models")
RESULTS = os.path.join(ROOT, "benchmarks", "results", "onnxscript_pipeline.md")
# the com.microsoft ops optimize_for_ort writes for an attention block
ATTENTION_OPS = ("MultiHeadAttention", "GroupQueryAttention", "Attention")


@dataclass
class Outcome:
    """One order's result on one model."""

    onnxscript_ops: dict[str, int]  # com.microsoft attention ops in the result, by op type
    ortflash_fused: str  # "n of m" rows, as the report counts them
    flash_nodes: int  # FlashAttention nodes in the result
    softmax_left: int  # Softmax nodes in the result
    verified: str  # "ok 2.6e-06", or what failed
    kept_why: str = ""  # the first block ortflash did not fuse: why
    ofo_fusions: int = 0  # fusions optimize_for_ort counted (attention, layer norms, GELU, ...)
    fused_matmuls: int = 0  # com.microsoft FusedMatMul nodes (a MatMul with its Transpose folded in)


def _cpu() -> str:
    with open("/proc/cpuinfo") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                return value.strip()
    return platform.processor()


def _ops(model: ir.Model) -> collections.Counter[str]:
    return collections.Counter(
        n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}" for n in model.graph.all_nodes()
    )


def _verify(path: str, model: ir.Model) -> str:
    try:
        result = ortflash.verify(path, ir.to_proto(model))
    except ortflash.OrtflashError as exc:
        return f"error: {str(exc).splitlines()[0][:120]}"
    except Exception as exc:  # noqa: BLE001 - ONNX Runtime's load errors are of several types
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
    worst = max((d.max_abs for d in result.outputs.values() if d.max_abs is not None), default=0.0)
    return f"{'ok' if result.ok else 'MISMATCH'} {worst:.2g}"


def _outcome(model: ir.Model, report: ortflash.Report, fusions: dict[str, int], path: str) -> Outcome:
    ops = _ops(model)
    kept = next((b for b in report.blocks if not b.fused), None)
    return Outcome(
        onnxscript_ops={op: ops[f"com.microsoft.{op}"] for op in ATTENTION_OPS if ops[f"com.microsoft.{op}"]},
        ortflash_fused=f"{report.fused} of {len(report.blocks)}",
        flash_nodes=ops[f"{spec.DOMAIN}.{spec.OP_TYPE}"],
        softmax_left=ops["Softmax"],
        verified=_verify(path, model),
        kept_why="" if kept is None else kept.reason[:90],
        ofo_fusions=sum(fusions.values()),
        fused_matmuls=ops["com.microsoft.FusedMatMul"],
    )


def _cleaned(path: str) -> ir.Model:
    """The zoo model after onnxscript's ``optimize`` (in place), loaded afresh for each order."""
    model = ir.load(path)
    onnxscript.optimizer.optimize_ir(model)
    return model


def _raised(stage: str, exc: Exception) -> Outcome:
    return Outcome({}, "", 0, 0, f"{stage} raised {type(exc).__name__}: {str(exc).splitlines()[0][:100]}")


def run_model(path: str) -> tuple[dict[str, str], dict[str, Outcome]]:
    """Each order's outcome, and the verification of each onnxscript stage alone (``optimize``, then
    ``optimize_for_ort``), so that a failure in an order is laid at the stage that has it."""
    alone = {"optimize": _verify(path, _cleaned(path))}
    outcomes: dict[str, Outcome] = {}
    try:
        onnxscript_first, first_fusions = optimize_for_ort(_cleaned(path))
        alone["optimize_for_ort"] = _verify(path, onnxscript_first)
        then_ortflash = FuseAttention(target="ortflash")(onnxscript_first)
        outcomes["A"] = _outcome(then_ortflash.model, then_ortflash.report, first_fusions, path)
    except Exception as exc:  # noqa: BLE001 - either tool may raise anything; the row says what
        alone.setdefault("optimize_for_ort", f"raised {type(exc).__name__}")
        outcomes["A"] = _raised("A", exc)
    try:
        ortflash_first = FuseAttention(target="ortflash")(_cleaned(path))
        then_onnxscript, then_fusions = optimize_for_ort(ortflash_first.model)
        outcomes["B"] = _outcome(then_onnxscript, ortflash_first.report, then_fusions, path)
    except Exception as exc:  # noqa: BLE001
        outcomes["B"] = _raised("B", exc)
    return alone, outcomes


def _cell_ops(ops: dict[str, int]) -> str:
    return ", ".join(f"{n} {op}" for op, n in ops.items()) or "none"


def write_markdown(results: dict[str, tuple[dict[str, str], dict[str, Outcome]]], out: str) -> None:
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# ortflash passes and onnxscript's optimize_for_ort in one pipeline",
        "",
        f"Written by `benchmarks/onnxscript_pipeline.py` on {date}; machine: {_cpu()}; onnxscript "
        f"{onnxscript.__version__}, onnx-ir {ir.__version__}, ONNX Runtime {onnxruntime.__version__}, "
        f"ortflash {ortflash.__version__}.",
        "",
        'Each model: onnxscript `optimize` first (its result verified alone: "optimize"); then **A** = '
        '`optimize_for_ort` (verified alone: "ofo alone") then `FuseAttention(target="ortflash")`, **B** = the '
        'same two the other way round. "ms ops": the com.microsoft attention ops in the result; FusedMatMul: its com.microsoft FusedMatMul nodes '
        '(Q·Kᵀ with the Transpose folded in, which ortflash\'s rules do not read); "ortflash": '
        "report rows fused (of its Softmax/Attention rows); FA: FlashAttention nodes in the result; verify: "
        "`ortflash.verify` against the original file (random inputs, batch 2, 16 positions, float32 "
        "tolerances), worst absolute error.",
        "",
        "| model | optimize | ofo alone | A: ofo fusions | A: ms ops | A: FusedMatMul | A: ortflash | A: FA | A: Softmax left "
        "| A: first block kept, why | A: verify | B: ortflash | B: FA | B: ofo fusions | B: ms ops | B: verify |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, (alone, by_order) in results.items():
        a, b = by_order["A"], by_order["B"]
        lines.append(
            f"| {name} | {alone['optimize']} | {alone['optimize_for_ort']} | {a.ofo_fusions} "
            f"| {_cell_ops(a.onnxscript_ops)} | {a.fused_matmuls} | {a.ortflash_fused} | {a.flash_nodes} | {a.softmax_left} "
            f"| {a.kept_why.replace('|', '/')} | {a.verified} | {b.ortflash_fused} | {b.flash_nodes} "
            f"| {b.ofo_fusions} | {_cell_ops(b.onnxscript_ops)} | {b.verified} |"
        )
    orders = [r for _, r in results.values()]

    def count(order: str, test: Callable[[Outcome], bool]) -> int:
        return sum(1 for r in orders if test(r[order]))

    ok = {o: count(o, lambda x: x.verified.startswith("ok")) for o in ("A", "B")}
    ofo_ok = sum(1 for alone, _ in results.values() if alone["optimize_for_ort"].startswith("ok"))
    lines += [
        "",
        f"Totals over {len(results)} models: optimize_for_ort alone verified in {ofo_ok}. "
        f"A: onnxscript wrote attention ops in {count('A', lambda x: bool(x.onnxscript_ops))}, ortflash then "
        f"fused blocks in {count('A', lambda x: x.flash_nodes > 0)}, {ok['A']} verified. "
        f"B: ortflash fused blocks in {count('B', lambda x: x.flash_nodes > 0)}, onnxscript then wrote attention "
        f"ops in {count('B', lambda x: bool(x.onnxscript_ops))}, {ok['B']} verified.",
        "",
    ]
    with open(out, "w") as f:
        f.write("\n".join(lines))
    document = {k: {"alone": alone, **{o: vars(v) for o, v in r.items()}} for k, (alone, r) in results.items()}
    with open(os.path.splitext(out)[0] + ".json", "w") as f:
        json.dump(document, f, indent=1)
        f.write("\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="*", help="glob of zoo file names (default: all of models/manifest.json)")
    parser.add_argument("--out", default=RESULTS, help="Markdown results file (a .json beside it)")
    args = parser.parse_args()
    with open(os.path.join(ZOO, "manifest.json")) as f:
        files = [m["file"] for m in json.load(f)["models"] if fnmatch.fnmatch(m["file"], args.models)]
    warnings.simplefilter("ignore")  # onnxscript's and torch's deprecation chatter
    logging.getLogger("onnx_ir").setLevel(logging.ERROR)  # an invalid model's every input, once per load
    results: dict[str, tuple[dict[str, str], dict[str, Outcome]]] = {}
    for name in files:
        results[name] = run_model(os.path.join(ZOO, name))
        alone, by_order = results[name]
        a, b = by_order["A"], by_order["B"]
        print(
            f"{name}: ofo alone {alone['optimize_for_ort']}; A {_cell_ops(a.onnxscript_ops)}, ortflash "
            f"{a.ortflash_fused}, {a.verified}; B ortflash {b.ortflash_fused}, {_cell_ops(b.onnxscript_ops)}, "
            f"{b.verified}",
            flush=True,
        )
    write_markdown(results, args.out)


if __name__ == "__main__":
    main()
