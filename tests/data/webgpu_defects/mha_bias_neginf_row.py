"""com.microsoft MultiHeadAttention (B=2, S=96, 4 heads of 64) whose attention_bias is -inf on every
key of 10 query rows: NaN on the CPU EP; finite values on the WebGPU EP (an H200, onnxruntime 1.32 +
onnxruntime-ep-webgpu 0.4.0, measured by benchmarks/webgpu_capabilities.py: dead_rows_neginf).
With 8 positions and 2 heads of 32 instead, the EP gave NaN like the CPU."""

import sys

import numpy as np
from _repro import differs, main

rng = np.random.default_rng(0)
feeds = {n: rng.standard_normal((2, 96, 256)).astype(np.float32) for n in "qkv"}
bias = np.zeros((2, 1, 96, 96), np.float32)
bias[1, 0, :10, :] = -np.inf  # batch item 1, query rows 0-9: every key masked
feeds["bias"] = bias
sys.exit(main("mha_bias_neginf_row.onnx", feeds, "attention_bias rows of -inf", differs))
