"""com.microsoft MultiHeadAttention with a 2D key_padding_mask: the WebGPU EP takes the node at
session creation, then fails at run time with "input key_padding_mask not implemented for webgpu"
(no CPU fallback for the node)."""

import sys

import numpy as np
from _repro import main

rng = np.random.default_rng(0)
feeds = {n: rng.standard_normal((1, 8, 64)).astype(np.float32) for n in "qkv"}
feeds["kpm"] = np.array([[1, 1, 1, 1, 1, 0, 0, 0]], np.int32)
sys.exit(
    main(
        "mha_key_padding_mask.onnx", feeds, "key_padding_mask", lambda e, a, err: a is None and "not implemented" in err
    )
)
