"""GPT-Neo's padded query rows under ``--target onnx`` on the CUDA EP (issue 31): which form is off
there and why. ``make FOLDER`` (here): the zoo's two GPT-Neo exports, original and lowered
(``onnx``; ``onnx`` with ``prove_causal=False``, causality left in the mask tensor; ``contrib``),
and one padded batch (2 x 37: a row left-padded by 9, one right-padded by 7). ``run FOLDER --out
OUT`` (the GPU machine): each on the CUDA EP (TF32 off) and the CPU EP, at ORT's default
optimization level and with it off, against the original on the CPU EP, the error split into valid
and padded query positions. Writes OUT/gpt_neo_cuda.json."""

from __future__ import annotations

import json
import os
import sys

import numpy as np

STEMS = ("gpt_neo_eager_dynamo", "gpt_neo_eager_torchscript")
VARIANTS = ("original", "onnx", "onnx_mask_causal", "contrib")


def make(folder: str) -> None:
    import onnx

    import ortflash

    os.makedirs(folder, exist_ok=True)
    for stem in STEMS:
        model = onnx.load(f"models/{stem}.onnx")
        forms = {
            "original": model,
            "onnx": ortflash.optimize(model, target="onnx")[0],
            "onnx_mask_causal": ortflash.optimize(model, target="onnx", prove_causal=False)[0],
            "contrib": ortflash.optimize(model, target="contrib")[0],
        }
        for name, m in forms.items():
            onnx.save(m, os.path.join(folder, f"{stem}.{name}.onnx"))
    rng = np.random.default_rng(0)
    mask = np.ones((2, 37), np.int64)
    mask[1, :9] = 0
    mask[0, 30:] = 0
    np.savez(
        os.path.join(folder, "feeds.npz"), input_ids=rng.integers(0, 100, (2, 37)).astype(np.int64), attention_mask=mask
    )


def run(folder: str, out_dir: str) -> None:
    import onnxruntime as ort

    if hasattr(ort, "preload_dlls"):
        ort.preload_dlls()
    feeds = dict(np.load(os.path.join(folder, "feeds.npz")))
    valid = feeds["attention_mask"] == 1
    rows = []
    for stem in STEMS:
        ref = ort.InferenceSession(
            os.path.join(folder, f"{stem}.original.onnx"), providers=["CPUExecutionProvider"]
        ).run(None, feeds)[0]
        for variant in VARIANTS:
            for ep in ("cuda", "cpu"):
                for level in ("default", "off"):
                    so = ort.SessionOptions()
                    so.log_severity_level = 3
                    if level == "off":
                        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
                    providers = (
                        [("CUDAExecutionProvider", {"use_tf32": "0"}), "CPUExecutionProvider"]
                        if ep == "cuda"
                        else ["CPUExecutionProvider"]
                    )
                    row = {"model": stem, "variant": variant, "ep": ep, "opt": level}
                    try:
                        sess = ort.InferenceSession(
                            os.path.join(folder, f"{stem}.{variant}.onnx"), so, providers=providers
                        )
                        out = sess.run(None, feeds)[0]
                        d = np.abs(out.astype(np.float64) - ref).max(-1)
                        row.update(
                            valid_err=float(d[valid].max()),
                            padded_err=float(d[~valid].max()),
                            padded_rows_off=[[int(b), int(s)] for b, s in zip(*np.nonzero(d > 1e-3))][:40],
                            providers=sess.get_providers()[:1],
                        )
                    except Exception as exc:  # noqa: BLE001
                        row["error"] = str(exc).splitlines()[0][:300]
                    rows.append(row)
                    print(json.dumps({k: v for k, v in row.items() if k != "padded_rows_off"}), flush=True)
    json.dump(
        {"onnxruntime": ort.__version__, "rows": rows}, open(os.path.join(out_dir, "gpt_neo_cuda.json"), "w"), indent=1
    )


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2])
    else:
        run(sys.argv[2], sys.argv[sys.argv.index("--out") + 1])
