"""Held-out exports and the zoo's GPT-Neo on ONNX Runtime's CUDA EP under ``--target cuda``,
``--target onnx`` and ``--target contrib`` (issue 31's first "Done when": every written model loads on
the CUDA EP and is right against the original on the CPU EP).

    python benchmarks/cuda_held_out.py make build/cuda_run/held --src /work/outside --only GLOBS  # here
    python benchmarks/cuda_held_out.py run build/cuda_run/held --out OUT   # GPU machine (numpy, onnxruntime-gpu)
    python benchmarks/cuda_held_out.py table OUT/cuda_held_out.json benchmarks/results/cuda_held_out.md

Per model and target: the ops the lowering wrote (here), whether the CUDA EP loads the file (TF32 off)
and every output against the original on the CPU EP (same ORT build) at batch 2, 37 positions,
make_feeds's padded masks (item 0 padded at the end, item 1 at the start). The error is split into
the valid and the padded query positions of every output shaped [batch, 37, ...]; other outputs
(a KV cache) are counted in ``other``. Right: ep_probe.error's float32 tolerance on every output.
"""

from __future__ import annotations

import fnmatch
import glob
import json
import os
import sys
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ep_probe  # noqa: E402
import webgpu_zoo as wz  # noqa: E402

TARGETS = ("cuda", "onnx", "contrib")
CHECK = {"seq": 37, "batch": 2}
ZOO_GPT_NEO = ("models/gpt_neo_eager_dynamo.onnx", "models/gpt_neo_eager_torchscript.onnx")
NATIVE_OPS = ("MultiHeadAttention", "GroupQueryAttention", "Attention", "FlashAttention")


def make(folder: str, src: str, only: str | None) -> None:
    import onnx

    import ortflash
    from ortflash.checks.feeds import make_feeds

    os.makedirs(folder, exist_ok=True)
    paths = sorted(glob.glob(os.path.join(src, "*.onnx")))
    if only:
        paths = [p for p in paths if any(fnmatch.fnmatch(os.path.basename(p)[:-5], g) for g in only.split(","))]
    index = []
    for path in [*paths, *ZOO_GPT_NEO]:
        stem = os.path.basename(path)[: -len(".onnx")]
        model = onnx.load(path)
        table = wz._shared_weights(model, os.path.join(folder, f"{stem}.data"))
        wz._save_sharing(model, os.path.join(folder, f"{stem}.original.onnx"), f"{stem}.data", table)
        row: dict[str, Any] = {"model": stem, "source": path, "targets": {}}
        for target in TARGETS:
            try:
                written, report = ortflash.optimize(model, target=target)
            except Exception as exc:  # noqa: BLE001 - recorded: a target that refuses the model
                row["targets"][target] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
                continue
            wz._save_sharing(written, os.path.join(folder, f"{stem}.{target}.onnx"), f"{stem}.data", table)
            ops = [n.op_type for n in written.graph.node]
            row["targets"][target] = {
                "fused": report.fused,
                "native": {op: ops.count(op) for op in NATIVE_OPS if op in ops},
            }
        np.savez(
            os.path.join(folder, f"{stem}.check.npz"),
            **make_feeds(model, seq_len=CHECK["seq"], batch=CHECK["batch"], seed=0),
        )
        index.append(row)
        print(stem, {t: row["targets"][t].get("native", row["targets"][t].get("error")) for t in TARGETS}, flush=True)
    json.dump(index, open(os.path.join(folder, "index.json"), "w"), indent=1)


def _query_valid(feeds: dict[str, np.ndarray]) -> np.ndarray | None:
    """[batch, 37] True at the valid query positions: the last 37 columns of a 2-D padding mask."""
    for name, value in feeds.items():
        if "mask" in name.lower() and value.ndim == 2 and value.shape[0] == CHECK["batch"]:
            return np.asarray(value[:, -CHECK["seq"] :] != 0)
    return None


def _errors(want: list[np.ndarray], got: list[np.ndarray], valid: np.ndarray | None) -> dict[str, Any]:
    """ep_probe.compare, and the largest difference at valid / padded query positions / elsewhere."""
    result = ep_probe.compare(want, got)
    split = {"valid": 0.0, "padded": 0.0, "other": 0.0}
    for w, g in zip(want, got):
        if not np.issubdtype(w.dtype, np.floating):
            continue
        with np.errstate(invalid="ignore"):
            d = np.where(w == g, 0.0, np.abs(w.astype(np.float64) - g.astype(np.float64)))
        d = np.nan_to_num(d, nan=np.inf)
        if w.ndim >= 2 and w.shape[:2] == (CHECK["batch"], CHECK["seq"]):
            per_pos = d.reshape(*w.shape[:2], -1).max(-1)
            mask = valid if valid is not None else np.ones(w.shape[:2], bool)
            split["valid"] = max(split["valid"], float(per_pos[mask].max(initial=0.0)))
            split["padded"] = max(split["padded"], float(per_pos[~mask].max(initial=0.0)))
        else:
            split["other"] = max(split["other"], float(d.max(initial=0.0)))
    return {**result, **split}


def run(folder: str, out_dir: str) -> None:
    import onnxruntime as ort

    if hasattr(ort, "preload_dlls"):
        ort.preload_dlls()
    start = time.time()
    index = json.load(open(os.path.join(folder, "index.json")))
    rows = []
    for entry in index:
        stem = entry["model"]
        feeds = dict(np.load(os.path.join(folder, f"{stem}.check.npz")))
        valid = _query_valid(feeds)
        so = ep_probe.session_options(ort, None)
        want = ort.InferenceSession(
            os.path.join(folder, f"{stem}.original.onnx"), so, providers=["CPUExecutionProvider"]
        ).run(None, feeds)
        for variant in ("original", *TARGETS):
            path = os.path.join(folder, f"{stem}.{variant}.onnx")
            row: dict[str, Any] = {"model": stem, "variant": variant}
            if not os.path.exists(path):
                row["error"] = "not written"
                rows.append(row)
                continue
            try:
                sess = ort.InferenceSession(
                    path,
                    ep_probe.session_options(ort, None),
                    providers=[("CUDAExecutionProvider", {"use_tf32": "0"}), "CPUExecutionProvider"],
                )
                row["loads"] = True
                row["providers"] = sess.get_providers()[:1]
                row.update(_errors(want, sess.run(None, feeds), valid))
            except Exception as exc:  # noqa: BLE001 - recorded per row
                row.setdefault("loads", False)
                row["error"] = str(exc).splitlines()[0][:300]
            rows.append(row)
            print(json.dumps(row), flush=True)
        _dump(
            os.path.join(out_dir, f"{os.path.basename(folder.rstrip('/'))}.json"), ort, start, index, rows
        )  # after each model: a timeout keeps what ran


def _dump(json_path: str, ort: Any, start: float, index: list[dict[str, Any]], rows: list[dict[str, Any]]) -> None:
    json.dump(
        {
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "gpu": ep_probe.gpu(),
            "onnxruntime": ort.__version__,
            "seconds": round(time.time() - start, 1),
            "index": [e for e in index if any(r["model"] == e["model"] for r in rows)],
            "rows": rows,
        },
        open(json_path, "w"),
        indent=1,
    )


def _cell(r: dict[str, Any] | None) -> str:
    if r is None:
        return "-"
    if not r.get("loads"):
        return f"**does not load**: {r.get('error', '')[:90]}"
    if "error" in r:
        return f"**fails to run**: {r['error'][:90]}"
    if r["nan_mismatch"]:  # NaN where the CPU EP has none (or the reverse): the split reads inf there
        return f"**wrong**: NaN mismatch at {r['nan_mismatch']} elements (finite elements off by {r['max_abs']:.1e})"
    verdict = "right" if r["ok"] else "**wrong**"
    other = f" / other {r['other']:.1e}" if r["other"] else ""
    return f"{verdict} ({r['valid']:.1e} / {r['padded']:.1e}{other})"


def table(json_path: str, md_path: str, header: list[str]) -> None:
    data = json.load(open(json_path))
    by = {(r["model"], r["variant"]): r for r in data["rows"]}
    lines = [*header, "", "| model | native ops written (cuda; onnx; contrib) | original | cuda | onnx | contrib |"]
    lines.append("|---|---|---|---|---|---|")
    counts = {v: [0, 0, 0] for v in ("original", *TARGETS)}  # loads, right, models
    for entry in data["index"]:
        stem = entry["model"]
        ops = "; ".join(
            ", ".join(f"{k} {v}" for k, v in entry["targets"][t].get("native", {}).items()) or "kept" for t in TARGETS
        )
        cells = []
        for v in ("original", *TARGETS):
            r = by.get((stem, v))
            counts[v][2] += 1
            if r and r.get("loads"):
                counts[v][0] += 1
                counts[v][1] += int(bool(r.get("ok")))
            cells.append(_cell(r))
        lines.append(f"| {stem} | {ops} | " + " | ".join(cells) + " |")
    lines += ["", "| variant | load on the CUDA EP | right |", "|---|---|---|"]
    lines += [f"| {v} | {c[0]}/{c[2]} | {c[1]}/{c[2]} |" for v, c in counts.items()]
    ep_probe.write_table(md_path, lines)


def main(argv: list[str]) -> int:
    if argv[0] == "make":
        only = argv[argv.index("--only") + 1] if "--only" in argv else None
        make(argv[1], argv[argv.index("--src") + 1], only)
    elif argv[0] == "run":
        run(argv[1], argv[argv.index("--out") + 1])
    else:
        header = open(argv[3]).read().splitlines() if len(argv) > 3 else []
        table(argv[1], argv[2], header)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
