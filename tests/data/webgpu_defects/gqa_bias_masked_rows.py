"""com.microsoft GroupQueryAttention (causal, no past) with an attention_bias for a left-padded
sequence: the first 3 keys masked with float32-lowest, so query rows 0-2 see no key (fully masked
rows). The WebGPU EP differs from the CPU EP; with those rows given one visible key (run with
--alive) the two agree: the fully masked rows are the cause."""

import sys

import numpy as np
from _repro import differs, main

rng = np.random.default_rng(0)
feeds = {n: rng.standard_normal((1, 8, 64)).astype(np.float32) for n in "qkv"}
feeds["seqlens_k"] = np.array([7], np.int32)
feeds["total"] = np.array(8, np.int32)
lowest = np.finfo(np.float32).min
keep = np.tril(np.ones((8, 8), bool))
keep[:, :3] = False
if "--alive" in sys.argv:
    keep[:3, 0] = True
feeds["bias"] = np.where(keep, 0.0, lowest).astype(np.float32)[None, None]
sys.exit(main("gqa_bias_masked_rows.onnx", feeds, "fully masked rows in attention_bias", differs))
