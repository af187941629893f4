#!/usr/bin/env python
"""Export random-weight encoders of REAL sizes (issue 30 items 1-2: where the fused op's time goes
at the lengths real models run), with a dynamic batch and sequence length.

Run with the torch venv (never in CI; the exports stay out of git, in /work/exports by default):

    /work/zooenv/bin/python models/real_size_exports.py
    /work/zooenv/bin/python models/real_size_exports.py --out /tmp/exports --only minilm_l3_eager_torchscript

Models (built from `transformers` configs, never downloaded, torch.manual_seed(0)):

- minilm_l3 / minilm_l6: BERT, hidden 384, 12 heads x 32, FFN 1536, vocab 30522, 512 positions
  (all-MiniLM-L6-v2's shape, and its 3-layer sibling); input_ids + attention_mask.
- bert_h6d64_l4: the same BERT with 6 heads x 64 (D = 64 at a dynamic length S = 16..512).
- vit_s: ViT-S/16, hidden 384, 6 heads x 64, FFN 1536, 224 x 224 image, patch 16 -> 197 tokens
  (fixed), 6 of its 12 layers (the per-layer cost is what is measured; 6 keeps the runs short).
- bloom_h12d64_l2: BLOOM (ALiBi beside the causal + padding mask), hidden 768, 12 heads x 64, 2 layers,
  vocab 30522, no position table (any length).
- gpt_neo_h12d64_l2: GPT-Neo-125M's width (hidden 768, 12 heads x 64), one global and one local layer
  (window 256), 2048 positions: its own causal buffer filled before Hugging Face's causal + padding mask.

Exporters: TorchScript (dynamo=False, opset 17) with eager attention for every model, and the
dynamo exporter with SDPA for minilm_l6 (kept only if it exports and matches PyTorch).
Each export is checked against PyTorch in ONNX Runtime (B2 with padding, two lengths) and listed
in OUT/manifest.json; OUT/READY is touched when all are written.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import generate as zoo  # noqa: E402

SEED = 0
VOCAB = 30522
MAX_POS = 512
# The zoo's 0.15 is for hidden 64; a query/key element's variance grows with the hidden size, so
# 0.15 * sqrt(64 / 384) keeps the attention scores O(1) (not a one-hot softmax) at hidden 384.
INIT_STD = 0.06
TOL = 2e-4
IMAGE, PATCH = 224, 16


@dataclass
class Spec:
    name: str
    kind: str  # "bert" | "vit" | "bloom" | "gpt_neo"
    layers: int
    heads: int
    head_dim: int
    attn_impl: str
    exporter: str  # "torchscript" | "dynamo"


SPECS = [
    Spec("minilm_l3_eager_torchscript", "bert", 3, 12, 32, "eager", "torchscript"),
    Spec("minilm_l6_eager_torchscript", "bert", 6, 12, 32, "eager", "torchscript"),
    Spec("minilm_l6_sdpa_dynamo", "bert", 6, 12, 32, "sdpa", "dynamo"),
    Spec("bert_h6d64_l4_eager_torchscript", "bert", 4, 6, 64, "eager", "torchscript"),
    Spec("vit_s_l6_eager_torchscript", "vit", 6, 6, 64, "eager", "torchscript"),
    # ALiBi beside a causal mask (BLOOM-560m's 16 x 64 heads at BERT-base's width): any length, no positions
    Spec("bloom_h12d64_l2_eager_torchscript", "bloom", 2, 12, 64, "eager", "torchscript"),
    # a causal Where, then a causal + padding bias added after it (GPT-Neo-125M's heads, 2 of its 12 layers)
    Spec("gpt_neo_h12d64_l2_eager_torchscript", "gpt_neo", 2, 12, 64, "eager", "torchscript"),
]


def build(spec: Spec) -> torch.nn.Module:
    hidden = spec.heads * spec.head_dim
    if spec.kind == "bert":
        from transformers import BertConfig, BertModel

        cfg = BertConfig(
            vocab_size=VOCAB,
            hidden_size=hidden,
            num_hidden_layers=spec.layers,
            num_attention_heads=spec.heads,
            intermediate_size=4 * hidden,
            max_position_embeddings=MAX_POS,
            type_vocab_size=2,
            initializer_range=INIT_STD,
        )
        zoo._set_impl(cfg, spec.attn_impl)
        return zoo.EncoderWrapper(zoo._perturb_constant_params(BertModel(cfg, add_pooling_layer=False)))
    if spec.kind == "bloom":
        from transformers import BloomConfig, BloomModel

        cfg = BloomConfig(
            vocab_size=VOCAB,
            hidden_size=hidden,
            n_layer=spec.layers,
            n_head=spec.heads,
            use_cache=False,
            bos_token_id=0,
            eos_token_id=0,
            pad_token_id=0,
            initializer_range=INIT_STD,
        )
        zoo._set_impl(cfg, spec.attn_impl)
        return zoo.EncoderWrapper(zoo._perturb_constant_params(BloomModel(cfg)))
    if spec.kind == "gpt_neo":
        from transformers import GPTNeoConfig, GPTNeoModel

        cfg = GPTNeoConfig(
            vocab_size=VOCAB,
            max_position_embeddings=2048,
            hidden_size=hidden,
            num_layers=spec.layers,
            attention_types=[[["global", "local"], spec.layers // 2]],
            num_heads=spec.heads,
            window_size=256,
            use_cache=False,
            bos_token_id=0,
            eos_token_id=0,
            initializer_range=INIT_STD,
        )
        zoo._set_impl(cfg, spec.attn_impl)
        return zoo.EncoderWrapper(zoo._perturb_constant_params(GPTNeoModel(cfg)))
    from transformers import ViTConfig, ViTModel

    cfg = ViTConfig(
        hidden_size=hidden,
        num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads,
        intermediate_size=4 * hidden,
        image_size=IMAGE,
        patch_size=PATCH,
        num_channels=3,
        initializer_range=INIT_STD,
    )
    zoo._set_impl(cfg, spec.attn_impl)
    return zoo.PixelWrapper(zoo._perturb_constant_params(ViTModel(cfg, add_pooling_layer=False)))


def feeds_for(spec: Spec, batch: int, seq: int, pad: int, rng: np.random.Generator) -> dict:
    if spec.kind == "vit":
        return {"pixel_values": rng.standard_normal((batch, 3, IMAGE, IMAGE)).astype(np.float32)}
    mask = np.ones((batch, seq), dtype=np.int64)
    if pad and batch > 1:
        mask[-1, seq - pad :] = 0
    return {"input_ids": rng.integers(1, VOCAB, size=(batch, seq), dtype=np.int64), "attention_mask": mask}


def export(spec: Spec, wrapper: torch.nn.Module, path: Path) -> None:
    rng = np.random.default_rng(1234)
    example_feeds = feeds_for(spec, 2, 16, 5, rng)
    names = list(example_feeds)
    example = tuple(torch.from_numpy(example_feeds[n]) for n in names)
    if spec.exporter == "torchscript":
        zoo._register_diff_symbolic()
        dyn = {n: ({0: "batch", 1: "seq"} if spec.kind != "vit" else {0: "batch"}) for n in names}
        dyn["last_hidden_state"] = {0: "batch", 1: "seq"} if spec.kind != "vit" else {0: "batch"}
        torch.onnx.export(
            wrapper,
            example,
            str(path),
            input_names=names,
            output_names=["last_hidden_state"],
            dynamic_axes=dyn,
            opset_version=17,
            do_constant_folding=True,
            dynamo=False,
        )
    else:
        batch = torch.export.Dim("batch", min=1, max=64)
        seq = torch.export.Dim("seq", min=2, max=MAX_POS)
        dyn = tuple({0: batch, 1: seq} if spec.kind != "vit" else {0: batch} for _ in names)
        prog = torch.onnx.export(
            wrapper,
            example,
            dynamo=True,
            input_names=names,
            output_names=["last_hidden_state"],
            dynamic_shapes=dyn,
            optimize=True,
            verbose=False,
        )
        prog.save(str(path))
    zoo.postprocess(path)


def check(spec: Spec, wrapper: torch.nn.Module, path: Path) -> list[dict]:
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(SEED)
    cases = [(1, 7, 0), (2, 23, 9), (1, 300, 0)] if spec.kind != "vit" else [(1, 0, 0), (2, 0, 0)]
    out = []
    for batch, seq, pad in cases:
        feeds = feeds_for(spec, batch, seq, pad, rng)
        with torch.no_grad():
            want = wrapper(*(torch.from_numpy(v) for v in feeds.values())).numpy()
        got = sess.run(None, feeds)[0]
        diff = float(np.max(np.abs(got - want))) if got.shape == want.shape else float("inf")
        out.append({"batch": batch, "seq": seq, "pad": pad, "max_abs_diff": diff, "ok": diff < TOL})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("/work/exports"))
    ap.add_argument("--only", nargs="*", help="names of SPECS to export")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    specs = [s for s in SPECS if not args.only or s.name in args.only]
    manifest_path = args.out / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {"models": [], "skipped": []}
    done = {s.name for s in specs}
    manifest["models"] = [m for m in manifest["models"] if m["name"] not in done]
    manifest["skipped"] = [m for m in manifest["skipped"] if m["name"] not in done]
    for spec in specs:
        path = args.out / f"{spec.name}.onnx"
        torch.manual_seed(SEED)
        wrapper = build(spec).eval()
        t0 = time.time()
        sink = io.StringIO()
        try:
            with warnings.catch_warnings(), contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
                warnings.simplefilter("ignore")
                with torch.no_grad():
                    export(spec, wrapper, path)
            cases = check(spec, wrapper, path)
        except Exception as e:  # noqa: BLE001 - one line per failed export, in the manifest
            manifest["skipped"].append({"name": spec.name, "reason": f"{type(e).__name__}: {e}".splitlines()[0][:300]})
            path.unlink(missing_ok=True)
            print(f"{spec.name}: SKIPPED {manifest['skipped'][-1]['reason']}")
            continue
        ok = all(c["ok"] for c in cases)
        if not ok:
            manifest["skipped"].append({"name": spec.name, "reason": f"does not match PyTorch: {cases}"})
            path.unlink(missing_ok=True)
            print(f"{spec.name}: WRONG {cases}")
            continue
        manifest["models"].append(
            {
                "name": spec.name,
                "file": path.name,
                "kind": spec.kind,
                "layers": spec.layers,
                "heads": spec.heads,
                "head_dim": spec.head_dim,
                "attn_impl": spec.attn_impl,
                "exporter": spec.exporter,
                "seq": "dynamic" if spec.kind != "vit" else (IMAGE // PATCH) ** 2 + 1,
                "size_bytes": path.stat().st_size,
                "check": cases,
                "export_s": round(time.time() - t0, 1),
            }
        )
        print(
            f"{spec.name}: ok, {path.stat().st_size / 1e6:.1f} MB, max diff "
            f"{max(c['max_abs_diff'] for c in cases):.2g}, {time.time() - t0:.0f} s"
        )
    manifest_path.write_text(json.dumps(manifest, indent=1) + "\n")
    (args.out / "READY").touch()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
