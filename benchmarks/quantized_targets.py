#!/usr/bin/env python
"""Quantized models under ``--target onnx`` (issue 33 item 2): how many lower, load in plain ONNX
Runtime and match the quantized original.

    python benchmarks/quantized_targets.py build --out /tmp/q models/*.onnx /work/exports/*.onnx
    python benchmarks/quantized_targets.py measure /tmp/q/*.onnx --json after.json
    PYTHONPATH=/tmp/before python benchmarks/quantized_targets.py measure /tmp/q/*.onnx --json before.json

``build`` writes two quantized copies of each model as ONNX Runtime's quantizer makes them:
``<name>.dyn.onnx`` (quantize_dynamic, its defaults: DynamicQuantizeLinear + MatMulInteger) and
``<name>.qdq.onnx`` (quantize_static, QDQ format, per-tensor, calibrated on 4 random batches from
ortflash.checks.feeds.make_feeds; it also quantizes attention's own MatMuls, so the Softmax sits
between QuantizeLinear nodes and no block is fused) and ``<name>.qdqw.onnx`` (the same with
attention's MatMuls, those of two computed operands, excluded, and only MatMul/Gemm quantized:
QDQ on the projections only, as a model quantized for its weights is).
``--kinds`` picks some. A model the quantizer fails on is skipped with its error.

``measure`` runs each model in its own process (run it on a tree no one edits meanwhile:
``PYTHONPATH=<snapshot> python -P``; a half-edited working tree fails imports): ortflash.optimize(target="onnx"), then an
onnxruntime.InferenceSession of the written model without ortflash's session options (it loads),
then ortflash.verify against the quantized original where a block was lowered (it matches). One JSON row per model: blocks,
blocks lowered (Attention nodes), FlashAttention nodes left, loads, verified, the first opset
refusal seen in a row's reason.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

_ONE = r"""
import json, sys
import onnx, onnxruntime as ort, ortflash
from ortflash.errors import OrtflashError
row = {"model": sys.argv[1]}
try:
    out, report = ortflash.optimize(sys.argv[1], target="onnx")
except OrtflashError as e:
    print(json.dumps(row | {"error": str(e)})); sys.exit(0)
from ortflash.model_io import graphs_of
ops = [n.op_type for g in graphs_of(out.graph) for n in g.node]  # If/Loop bodies too (a merged decoder's)
row |= {"blocks": len(report.blocks), "lowered": ops.count("Attention"),
        "flash_left": ops.count("FlashAttention"),
        "refusal": next((b.reason for b in report.blocks if "opset" in b.reason), "")}
try:
    ort.InferenceSession(out.SerializeToString(), providers=["CPUExecutionProvider"])
    row["loads"] = True
except Exception as e:
    row["loads"] = False; row["load_error"] = str(e).splitlines()[0][:200]
try:
    run = row["loads"] and row["lowered"] and sys.argv[2] == "verify"
    row["verified"] = bool(ortflash.verify(sys.argv[1], out, seq_len=16).ok) if run else None
except OrtflashError as e:
    row["verified"] = False; row["verify_error"] = str(e)[:200]
print(json.dumps(row))
"""


def _attention_matmuls(model: Any) -> list[str]:
    weights = {i.name for i in model.graph.initializer}
    return [n.name for n in model.graph.node if n.op_type == "MatMul" and not weights & set(n.input)]


def build(paths: list[str], out: Path, kinds: list[str]) -> None:
    import onnx
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_dynamic, quantize_static

    from ortflash.checks.feeds import make_feeds

    class Random(CalibrationDataReader):
        def __init__(self, model: onnx.ModelProto) -> None:
            self.batches = iter([make_feeds(model, seed=seed) for seed in range(4)])

        def get_next(self):  # type: ignore[no-untyped-def]
            return next(self.batches, None)

    out.mkdir(parents=True, exist_ok=True)
    for path in paths:
        stem = Path(path).stem
        model = onnx.load(path)
        for kind in kinds:
            target = out / f"{stem}.{kind}.onnx"
            try:
                if kind == "dyn":
                    quantize_dynamic(path, target)
                else:
                    # qdqw: only the projections' MatMul/Gemm (a Softmax is quantized by default too)
                    projections = {
                        "nodes_to_exclude": _attention_matmuls(model),
                        "op_types_to_quantize": ["MatMul", "Gemm"],
                    }
                    quantize_static(
                        path,
                        target,
                        Random(model),
                        quant_format=QuantFormat.QDQ,
                        **(projections if kind == "qdqw" else {}),
                    )
                print(f"{target}: written")
            except Exception as exc:  # noqa: BLE001 - the quantizer's own failures are a skipped model
                print(f"{target}: skipped ({type(exc).__name__}: {str(exc).splitlines()[0][:120]})")


def measure(paths: list[str], verify: bool) -> list[dict[str, object]]:
    rows = []
    for path in paths:
        done = subprocess.run(
            [sys.executable, "-c", _ONE, path, "verify" if verify else "no"],
            capture_output=True,
            text=True,
            timeout=1800,
        )
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        row = json.loads(lines[-1]) if lines else {"model": path, "error": done.stderr.strip()[-300:]}
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def summary(rows: list[dict[str, object]]) -> str:
    with_blocks = [r for r in rows if r.get("blocks")]
    lowered = [r for r in with_blocks if r.get("lowered") and not r.get("flash_left")]
    loads = [r for r in with_blocks if r.get("loads")]
    verified = [r for r in lowered if r.get("verified")]
    return (
        f"{len(rows)} models, {len(with_blocks)} with blocks: {len(lowered)} lowered every block to Attention-23"
        f" ({sum(int(str(r.get('lowered', 0))) for r in rows)} blocks of {sum(int(str(r.get('blocks', 0))) for r in rows)}),"
        f" {len(loads)} load in plain ONNX Runtime, {len(verified)} lowered and verified"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["build", "measure"])
    parser.add_argument("models", nargs="+")
    parser.add_argument("--out", type=Path, default=Path("/tmp/q"))
    parser.add_argument("--json", type=Path)
    parser.add_argument("--kinds", default="dyn,qdq,qdqw")
    parser.add_argument("--no-verify", action="store_true", help="skip verify (a model that lowers nothing)")
    args = parser.parse_args()
    if args.command == "build":
        build(args.models, args.out, args.kinds.split(","))
        return
    rows = measure(args.models, not args.no_verify)
    print(summary(rows))
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "summary": summary(rows)}, indent=1))


if __name__ == "__main__":
    main()
