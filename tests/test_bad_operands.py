"""A FlashAttention bias or mask whose key axis is neither 1 nor the keys' count is an error
in every kernel; in an ONNX Runtime session the native op fails the run with an error naming the input,
and the Python bridge warns (an exception escaping into the extensions bridge would abort the process, so
it returns NaNs, loudly); before, a bias 4
keys wide against 6 keys ran, with key tiles short or empty, into an all-NaN output and no word."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import ortflash
from ortflash.kernels import cpu, reference
from ortflash.op import spec

RNG = np.random.default_rng(0)
Q = RNG.standard_normal((1, 2, 3, 8)).astype(np.float32)
K = RNG.standard_normal((1, 2, 6, 8)).astype(np.float32)


@pytest.mark.parametrize(
    ("bias", "mask"),
    [
        (np.zeros((1, 1, 1, 4), np.float32), None),  # fewer keys than K has
        (np.zeros((1, 2, 3, 9), np.float32), None),  # more
        (None, np.ones((1, 1, 3, 5), bool)),
    ],
)
def test_an_operand_that_does_not_broadcast_is_refused_by_both_kernels(bias, mask):
    for kernel in (reference.flash_attention, cpu.flash_attention):
        with pytest.raises(ValueError, match="does not broadcast to the scores' 6 keys"):
            kernel(Q, K, K, bias, mask)


def test_in_an_onnx_runtime_session_the_warning_says_why():
    attrs = spec.validate({})
    declared = {name: attrs[name] for name in spec.DECLARED}
    node = helper.make_node(spec.OP_TYPE, ["q", "k", "v", "bias", "mask"], ["o"], domain=spec.DOMAIN, **declared)
    io = [helper.make_tensor_value_info(x, TensorProto.FLOAT, None) for x in ("q", "k", "v", "bias")]
    io.append(helper.make_tensor_value_info("mask", TensorProto.BOOL, None))
    graph = helper.make_graph([node], "g", io, [helper.make_tensor_value_info("o", TensorProto.FLOAT, None)])
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(spec.DOMAIN, 1)], ir_version=8
    )
    feeds = {"q": Q, "k": K, "v": K, "bias": np.zeros((1, 1, 1, 4), np.float32), "mask": np.ones((1,), bool)}
    bridge = ortflash.InferenceSession(model, native=False)
    with pytest.warns(RuntimeWarning, match="does not broadcast to the scores' 6 keys"):
        out = bridge.run(None, feeds)[0]
    assert np.isnan(out).all()
    # the native op (a plain session's, and ortflash.InferenceSession's by default) fails the run, naming the input
    quiet = ort.RunOptions()
    quiet.log_severity_level = 4
    for sess in (
        ort.InferenceSession(model.SerializeToString(), ortflash.session_options()),
        ortflash.InferenceSession(model),
    ):
        with pytest.raises(Exception, match="bias axis 3 has size 4; want 1 or 6"):
            sess.run(None, feeds, quiet)
