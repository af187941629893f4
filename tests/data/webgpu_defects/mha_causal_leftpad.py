"""com.microsoft MultiHeadAttention, causal + left padding written into attention_bias with
float32-lowest (what transformers writes; rows 0-2 see only padding). onnxruntime-node 1.30's WebGPU
EP differed from the CPU on GPT-2 and Llama lowered this way (benchmarks/results/web_gpu_h200.md);
this isolated block matches on onnxruntime 1.32 + onnxruntime-ep-webgpu 0.4.0 (an H200)."""

import sys

import numpy as np
from _repro import differs, main

rng = np.random.default_rng(0)
feeds = {n: rng.standard_normal((1, 8, 64)).astype(np.float32) for n in "qkv"}
keep = np.tril(np.ones((8, 8), bool))
keep[:, :3] = False
feeds["bias"] = np.where(keep, 0.0, np.finfo(np.float32).min).astype(np.float32)[None, None]
sys.exit(main("mha_causal_leftpad.onnx", feeds, "causal + left padding, float32-lowest", differs))
