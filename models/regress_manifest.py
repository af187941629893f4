"""Write models/regress.toml, the zoo's `ortflash regress` manifest, from models/manifest.json.

    python models/regress_manifest.py            # rewrite models/regress.toml
    ortflash regress models/regress.toml -j 2    # check the zoo as CI does

Every model with a file and a passing export check gets one entry: the attention blocks the
generator counted, expected fused for every target (each block lowers to both native targets
today; where one stops lowering, `ortflash regress models/regress.toml --update` records the new
count after showing it, and this script keeps what it recorded), and the input sizes tests/test_zoo.py checks: batch 1 at 7 tokens and
batch 2 at 21 (a model of fixed length: batch 2 at its size). The policy is `auto` with 8-key
tiles from 16 keys, so the short case runs naive, the long one online over a partial last tile,
and verify reruns at 16 keys wherever a block has not yet run online.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
TARGETS = ("ortflash", "contrib", "onnx")
DEFAULTS = {"softmax": "auto", "block_size": 8, "min_seq_len": 16}


def recorded_blocks(path: str) -> dict[str, dict[str, int]]:
    """File -> blocks per target that an existing regress.toml records (what --update last wrote)."""
    if not os.path.exists(path):
        return {}
    from ortflash.regress.manifest import read_document

    document = read_document(path)
    return {entry["path"]: dict(entry.get("blocks", {})) for entry in document.get("model", [])}


def zoo_entries(manifest: dict[str, Any], recorded: dict[str, dict[str, int]]) -> list[dict[str, Any]]:
    """One [[model]] per zoo file that exported and checked ok, in the zoo manifest's order.

    FlashAttention must fuse the blocks the generator counted; the native targets keep what the
    manifest recorded for the file (a model new to it: every block)."""
    entries = []
    for model in manifest["models"]:
        if not model.get("file") or not model.get("check", {}).get("ok", True):
            continue
        dynamic = model.get("dynamic", {})
        batch = 2 if dynamic.get("batch", True) else 1
        cases = (
            [{"batch": 1, "seq_len": 7}, {"batch": batch, "seq_len": 21}]
            if dynamic.get("seq", True)
            else [{"batch": batch}]
        )
        entry: dict[str, Any] = {
            "path": model["file"],
            "blocks": {
                target: model["attention_blocks"]
                if target == "ortflash"
                else recorded.get(model["file"], {}).get(target, model["attention_blocks"])
                for target in TARGETS
            },
            "cases": cases,
        }
        if model.get("feed_dims"):
            entry["dims"] = dict(model["feed_dims"])
        entries.append(entry)
    return entries


def main() -> int:
    from ortflash.regress.update import to_toml

    with open(os.path.join(HERE, "manifest.json")) as f:
        manifest = json.load(f)
    out = os.path.join(HERE, "regress.toml")
    document = {"version": 1, "defaults": DEFAULTS, "model": zoo_entries(manifest, recorded_blocks(out))}
    with open(out, "w") as f:
        f.write(to_toml(document))
    print(f"wrote {out}: {len(document['model'])} models")
    return 0


if __name__ == "__main__":
    sys.exit(main())
