"""Where ONNX Runtime's WebGPU plugin EP runs a length If and its branches (issue 31 item 4: the If
measured ~1.2 ms per step there, benchmarks/results/decode_gpu.md). On the GPU machine, after
decode_gpu.py make: ``python3 benchmarks/webgpu_if_placement.py FOLDER OUT``; per model, the EP of
each node the profile names (If, the attention ops, the branch nodes), a decode step and a prefill."""

from __future__ import annotations

import glob
import json
import os
import sys
from collections import Counter

sys.path.insert(0, os.path.dirname(__file__))
import decode_gpu as dg  # noqa: E402


def main(folder: str, out: str) -> None:
    import onnxruntime as ort
    import onnxruntime_ep_webgpu as wep

    ort.register_execution_provider_library("webgpu", wep.get_library_path())
    device = next(d for d in ort.get_ep_devices() if d.ep_name == wep.get_ep_name())
    index = json.load(open(os.path.join(folder, "index.json")))
    rows = []
    for row in index["models"]:
        if row["model"] not in ("llama_cache_eager_torchscript", "block_f32"):
            continue
        for variant in ("ep_webgpu", "target_webgpu", "original"):
            for case, seq, past in (("decode", 1, 127), ("prefill", 2048, 0)):
                so = ort.SessionOptions()
                so.log_severity_level = 3
                so.enable_profiling = True
                so.profile_file_prefix = os.path.join(out, "prof")
                so.add_provider_for_devices([device], {})
                sess = ort.InferenceSession(os.path.join(folder, row["variants"][variant]), so)
                sess.run(None, dg._feeds(row, seq, past))
                events = json.load(open(sess.end_profiling()))
                placed: Counter[str] = Counter()
                for ev in events:
                    args = ev.get("args", {})
                    if ev.get("cat") == "Node" and "provider" in args and ev["name"].endswith("_kernel_time"):
                        placed[f"{args.get('op_name')}@{args['provider']}"] += 1
                rec = {"model": row["model"], "variant": variant, "case": case, "placed": dict(sorted(placed.items()))}
                rows.append(rec)
                print(json.dumps(rec), flush=True)
                for f in glob.glob(os.path.join(out, "prof*")):
                    os.remove(f)
    json.dump(
        {"onnxruntime": ort.__version__, "rows": rows},
        open(os.path.join(out, "webgpu_if_placement.json"), "w"),
        indent=1,
    )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
