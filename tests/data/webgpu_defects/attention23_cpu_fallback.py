"""ONNX Attention (opset 23): the WebGPU EP has no kernel for it, and the node runs on the CPU EP
(right, but off the GPU). Shown by the node placement in the session's profile."""

import json
import os
import sys

import numpy as np
from _repro import HERE, webgpu_session

rng = np.random.default_rng(0)
feeds = {n: rng.standard_normal((1, 8, 64)).astype(np.float32) for n in "qkv"}
print("attention23_cpu_fallback.onnx: where ONNX Attention-23 runs")
sess = webgpu_session(os.path.join(HERE, "attention23_cpu_fallback.onnx"), profile=True)
if sess is None:
    sys.exit(0)
sess.run(None, feeds)
profile = sess.end_profiling()
placed = {
    e["args"]["op_name"]: e["args"]["provider"]
    for e in json.load(open(profile))
    if e.get("cat") == "Node" and "provider" in e.get("args", {})
}
os.remove(profile)
print(f"providers: {sess.get_providers()}; node placement: {placed}")
shown = placed.get("Attention") == "CPUExecutionProvider"
print("REPRODUCED" if shown else "not reproduced (fixed in this version?)")
sys.exit(0 if shown != ("--expect-fixed" in sys.argv) else 1)
