"""MatMul -> Softmax -> MatMul, B=1, 16 heads, S=8192, D=64 (float32): the score tensor is 4 GiB.
The WebGPU EP returns wrong outputs (max abs error ~4e3 on an H200) and reports nothing."""

import sys

import numpy as np
from _repro import differs, main

rng = np.random.default_rng(0)
feeds = {n: rng.standard_normal((1, 16, 8192, 64)).astype(np.float32) for n in "qkv"}
sys.exit(main("unfused_s8192.onnx", feeds, "a 4 GiB score tensor: wrong outputs, no error", differs))
