"""Softmax over a row that is -inf everywhere: the CPU EP gives NaN (exp(-inf - -inf)); the WebGPU EP
does not, so the two EPs disagree on fully masked attention rows."""

import sys

import numpy as np
from _repro import differs, main

rng = np.random.default_rng(0)
x = rng.standard_normal((4, 8)).astype(np.float32)
x[1] = -np.inf
sys.exit(main("softmax_neginf_row.onnx", {"x": x}, "Softmax of an all -inf row", differs))
