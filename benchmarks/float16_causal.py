#!/usr/bin/env python
"""What proving float16-lowest causal masks gains (issue 33 item 18): a float16 BART (eager, HF's
``where(causal, 0, -65504)`` decoder mask) written by two trees of ortflash, the one before the
proof (its decoder self-attention fused or lowered with the full [B, 1, S, S] bias) and the one
after (is_causal, no bias), timed against the original on ONNX Runtime's CPU EP.

    /work/zooenv/bin/python benchmarks/float16_causal.py export --model bart768_f16.onnx   # torch, transformers
    python benchmarks/float16_causal.py make --model bart768_f16.onnx --tree before=/tmp/head --tree after=.
    python benchmarks/float16_causal.py time --lens 256,1024 --rounds 3 --out benchmarks/results/float16_causal

``make`` runs ``ortflash.optimize(model, target=T)`` for T in ortflash (forced fusion) and contrib
under each tree (PYTHONPATH), writing ``<tree>_<target>.onnx`` beside the model. ``time`` runs each
variant and length in its own process, one intra-op thread, and reads CPU time (process_time) per
run, rounds alternating the variants' order: the median over runs and rounds, and the ratio to the
original's (> 1: faster than the original).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

_MAKE = r"""
import sys, onnx, ortflash
model, target, out = sys.argv[1:4]
fused, report = ortflash.optimize(model, target=target)
onnx.save(fused, out, save_as_external_data=True, location=out.split("/")[-1] + ".data")
print([b.mask_kind for b in report.blocks])
"""

_TIME = r"""
import sys, time, json
import numpy as np, onnx, onnxruntime as ort, ortflash
path, tgt, runs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
options = ortflash.session_options()
options.intra_op_num_threads, options.inter_op_num_threads = 1, 1
session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
rng = np.random.default_rng(0)
feeds = {"input_ids": rng.integers(3, 1000, (1, 64)), "attention_mask": np.ones((1, 64), np.int64),
         "decoder_input_ids": rng.integers(3, 1000, (1, tgt))}
for _ in range(2):
    session.run(None, feeds)
times = []
for _ in range(runs):
    t = time.process_time(); session.run(None, feeds); times.append(time.process_time() - t)
print(json.dumps(times))
"""


def export(model: Path) -> None:
    """The float16 BART: d_model 768, 12 heads, 1 encoder and 2 decoder layers, vocabulary 1000."""
    import torch
    from transformers import BartConfig, BartForConditionalGeneration

    torch.manual_seed(0)
    config = BartConfig(
        vocab_size=1000,
        d_model=768,
        encoder_layers=1,
        decoder_layers=2,
        encoder_attention_heads=12,
        decoder_attention_heads=12,
        encoder_ffn_dim=3072,
        decoder_ffn_dim=3072,
        max_position_embeddings=2048,
    )
    config._attn_implementation = "eager"
    bart = BartForConditionalGeneration(config).half().eval()

    class Logits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = bart  # a submodule: its weights are the graph's initializers

        def forward(self, input_ids, attention_mask, decoder_input_ids):  # type: ignore[no-untyped-def]
            given = {"input_ids": input_ids, "attention_mask": attention_mask, "decoder_input_ids": decoder_input_ids}
            return self.model(**given, use_cache=False).logits

    ids, mask, dec = (
        torch.randint(3, 1000, (1, 16)),
        torch.ones(1, 16, dtype=torch.int64),
        torch.randint(3, 1000, (1, 12)),
    )
    names = ["input_ids", "attention_mask", "decoder_input_ids"]
    axes = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}}
    axes["decoder_input_ids"] = {0: "batch", 1: "tgt"}
    torch.onnx.export(
        Logits(),
        (ids, mask, dec),
        str(model),
        input_names=names,
        output_names=["logits"],
        dynamic_axes=axes,
        opset_version=17,
        dynamo=False,
    )


def make(model: Path, trees: list[str]) -> None:
    for tree in trees:
        label, root = tree.split("=", 1)
        for target in ("ortflash", "contrib"):
            out = model.parent / f"{label}_{target}.onnx"
            env = os.environ | {"PYTHONPATH": os.path.abspath(root)}
            command = [sys.executable, "-P", "-c", _MAKE, str(model), target, str(out)]  # -P: the tree, not the cwd
            done = subprocess.run(command, env=env, text=True, capture_output=True)
            print(label, target, done.stdout.strip() or done.stderr.strip()[-300:])


def time_all(
    model: Path, labels: list[str], lens: list[int], rounds: int, runs: int
) -> dict[str, dict[int, list[float]]]:
    found: dict[str, dict[int, list[float]]] = {label: {s: [] for s in lens} for label in labels}
    for r in range(rounds):
        order = labels if r % 2 == 0 else labels[::-1]
        for s in lens:
            for label in order:
                path = model if label == "original" else model.parent / f"{label}.onnx"
                command = [sys.executable, "-P", "-c", _TIME, str(path), str(s), str(runs)]
                done = subprocess.run(command, text=True, capture_output=True)
                line = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else "null"
                got = json.loads(line) if line.startswith("[") else None
                if got is None:
                    print(label, s, "failed:", done.stderr.strip()[-300:], flush=True)
                    continue
                found[label][s] += got
                print(f"round {r} S={s} {label}: {1000 * sorted(got)[len(got) // 2]:.1f} ms", flush=True)
    return found


def table(found: dict[str, dict[int, list[float]]], lens: list[int], header: str) -> str:
    def median(xs: list[float]) -> float:
        return sorted(xs)[len(xs) // 2] if xs else float("nan")

    lines = [
        header,
        "",
        "| variant | " + " | ".join(f"S={s} ms (x original)" for s in lens) + " |",
        "|---|" + "---|" * len(lens),
    ]
    for label, by_len in found.items():
        cells = []
        for s in lens:
            ms, base = 1000 * median(by_len[s]), 1000 * median(found["original"][s])
            cells.append(f"{ms:.1f} ({base / ms:.2f}x)")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["export", "make", "time"])
    parser.add_argument("--model", type=Path, default=Path("/tmp/E/bart768_f16.onnx"))
    parser.add_argument("--tree", action="append", default=[])
    parser.add_argument("--labels", default="original,before_ortflash,after_ortflash,before_contrib,after_contrib")
    parser.add_argument("--lens", default="256,1024")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.command == "export":
        export(args.model)
        return
    if args.command == "make":
        make(args.model, args.tree)
        return
    lens = [int(s) for s in args.lens.split(",")]
    found = time_all(args.model, args.labels.split(","), lens, args.rounds, args.runs)
    load = os.getloadavg()
    header = f"machine: {platform.processor() or platform.machine()}, load {load[0]:.1f}/{load[1]:.1f}/{load[2]:.1f} at the end"
    print(table(found, lens, header))
    if args.out:
        args.out.with_suffix(".json").write_text(json.dumps({"lens": lens, "cpu_seconds": found}, indent=1))


if __name__ == "__main__":
    main()
