"""FlashAttention as a native ONNX Runtime op (issue 30 item 2): the compiled kernel called by ONNX Runtime
on its own buffers, with no Python per call, in place of onnxruntime-extensions' Python bridge.

Every check compares the two paths in one process: ``ortflash.InferenceSession`` (native by default) and
the same session with ``native=False`` (the bridge, the Python path it replaces). The outputs must be
bit-identical: both call the same compiled problem with the same arguments. The call counter of the build
proves the native op ran (it does not count bridge calls).
"""

from __future__ import annotations

import json
import math
import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from attention_graphs import F16, Variant, build, feeds
from onnx import TensorProto, helper

import ortflash
from ortflash.kernels import cpu, native_op
from ortflash.op import spec
from ortflash.op.node import DISPATCH_KEY, flash_nodes
from ortflash.op.side_channel import SideChannel

pytestmark = pytest.mark.skipif(not cpu.available(), reason="no compiled kernel")

ZOO = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "models")
LOWEST = float(np.finfo(np.float32).min)


def single_node(attrs: dict, *, bias: tuple | None = None, mask: tuple | None = None) -> onnx.ModelProto:
    """One bridge FlashAttention node as fusion writes it (declared attributes, the rest in the side
    channel; an absent bias or mask as the neutral placeholder scalar), inputs q, k, v (+ bias, mask)."""
    full = spec.validate(attrs)
    declared = {name: full[name] for name in spec.DECLARED if name != "exact_floats"}
    declared["exact_floats"] = SideChannel.of_attributes(full).encode()
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("q", "k", "v")]
    inits = []
    if bias is None:
        inits.append(onnx.numpy_helper.from_array(np.array(0.0, np.float32), "bias"))
    else:
        inputs.append(helper.make_tensor_value_info("bias", TensorProto.FLOAT, None))
    if mask is None:
        inits.append(onnx.numpy_helper.from_array(np.array(True), "mask"))
    else:
        inputs.append(helper.make_tensor_value_info("mask", TensorProto.BOOL, None))
    node = helper.make_node(spec.OP_TYPE, ["q", "k", "v", "bias", "mask"], ["out"], domain=spec.DOMAIN, **declared)
    graph = helper.make_graph(
        [node], "one", inputs, [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)], inits
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(spec.DOMAIN, spec.DOMAIN_VERSION)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=8)


def both_paths(model: onnx.ModelProto, f: dict, **options) -> tuple[np.ndarray, np.ndarray]:
    """(native, bridge) first outputs; asserts every FlashAttention node ran natively, once per run."""
    native = ortflash.InferenceSession(model, **options)
    assert native.native_nodes == len(flash_nodes(model)) > 0
    before = native_op.calls()
    got = native.run(None, f)[0]
    assert native_op.calls() - before == native.native_nodes
    bridge = ortflash.InferenceSession(model, native=False, **options)
    assert bridge.native_nodes == 0
    return got, bridge.run(None, f)[0]


def qkv(b=2, hq=4, hkv=4, sq=37, sk=37, d=16, seed=0) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "q": rng.standard_normal((b, hq, sq, d), dtype=np.float32),
        "k": rng.standard_normal((b, hkv, sk, d), dtype=np.float32),
        "v": rng.standard_normal((b, hkv, sk, d), dtype=np.float32),
    }


def padding_bias(b: int, sk: int) -> np.ndarray:
    bias = np.zeros((b, 1, 1, sk), np.float32)
    bias[1, ..., sk - 9 :] = LOWEST  # the second item padded
    return bias


CASES = {
    "no mask, naive": ({}, {}),
    "no mask, online": ({"softmax": "online", "block_size": 8}, {}),
    "auto under min_seq_len": ({"softmax": "auto", "min_seq_len": 38, "block_size": 8}, {}),
    "auto at min_seq_len": ({"softmax": "auto", "min_seq_len": 37, "block_size": 8}, {}),
    "exact scale": ({"scale": 1 / math.sqrt(32.0)}, {}),
    "padding bias": ({"softmax": "online", "block_size": 16}, {"bias": "padding"}),
    "padding bias, naive": ({}, {"bias": "padding"}),
    "full bias": ({}, {"bias": (2, 4, 37, 37)}),
    "bias of rank 2": ({}, {"bias": (37, 37)}),
    "bool padding mask": ({"softmax": "online", "block_size": 16}, {"mask": (2, 1, 1, 37)}),
    "bool full mask, finite fill": ({"mask_fill": LOWEST}, {"mask": (2, 1, 37, 37)}),
    "causal": ({"is_causal": 1, "softmax": "online", "block_size": 8}, {}),
    "causal bottom-right": ({"is_causal": 2}, {"sq": 5}),
    "decode step": ({"is_causal": 2, "softmax": "online", "block_size": 16}, {"sq": 1, "bias": "padding"}),
    "sliding window": ({"is_causal": 1, "window_left": 7}, {}),
    "window right": ({"window_left": 3, "window_right": 2}, {}),
    "softcap": ({"softcap": 20.0, "scale": 0.5}, {}),
    "bias after mask": ({"bias_after_mask": 1, "mask_fill": LOWEST, "is_causal": 1}, {"bias": (2, 1, 1, 37)}),
    "zero rows": ({"masked_rows": "zero", "is_causal": 2}, {"sq": 45}),
    "grouped query heads": ({"softmax": "online", "block_size": 8}, {"hkv": 2}),
    "long, online, padding": ({"softmax": "online"}, {"sq": 300, "sk": 300, "bias": "padding"}),
}


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", list(CASES))
def test_the_native_op_gives_the_python_paths_bits(case, threads):
    attrs, shape = CASES[case]
    dims = {key: shape[key] for key in ("sq", "sk", "hkv") if key in shape}
    if "sq" in dims and "sk" not in dims:
        dims["sk"] = 37
    f = qkv(**dims)
    b, hq, sq, _ = f["q"].shape
    sk = f["k"].shape[2]
    bias_shape = mask_shape = None
    rng = np.random.default_rng(1)
    if shape.get("bias") == "padding":
        f["bias"] = padding_bias(b, sk)
        bias_shape = f["bias"].shape
    elif "bias" in shape:
        bias_shape = shape["bias"]
        f["bias"] = rng.standard_normal(bias_shape).astype(np.float32)
    if "mask" in shape:
        mask_shape = shape["mask"]
        f["mask"] = rng.random(mask_shape) > 0.3
        f["mask"][..., 0] = True
    got, want = both_paths(single_node(attrs, bias=bias_shape, mask=mask_shape), f, threads=threads)
    assert got.shape == (b, hq, sq, f["v"].shape[3])
    np.testing.assert_array_equal(got, want)


def test_no_keys_give_zeros_as_the_reference_does():
    f = qkv(sk=0)
    got, want = both_paths(single_node({}), f)
    assert got.shape == (2, 4, 37, 16) and not got.any()
    np.testing.assert_array_equal(got, want)


def test_an_error_is_an_ort_error_with_a_message_not_an_abort():
    f = qkv()
    f["bias"] = np.zeros((2, 1, 3, 37), np.float32)  # does not broadcast over 37 queries
    session = ortflash.InferenceSession(single_node({}, bias=(2, 1, 3, 37)))
    assert session.native_nodes == 1
    quiet = ort.RunOptions()
    quiet.log_severity_level = 4
    with pytest.raises(Exception, match="bias axis 2 has size 3; want 1 or 37"):
        session.run(None, f, quiet)
    f["bias"] = np.zeros((2, 1, 1, 37), np.float32)  # and the session still runs
    np.testing.assert_array_equal(
        session.run(None, f)[0], ortflash.InferenceSession(single_node({})).run(None, qkv())[0]
    )


def test_what_stays_on_the_bridge(monkeypatch):
    model = single_node({})
    assert ortflash.InferenceSession(model, native=False).native_nodes == 0
    assert ortflash.InferenceSession(model, backend="reference").native_nodes == 0
    bad = single_node({})
    next(a for a in bad.graph.node[0].attribute if a.name == "is_causal").i = 7  # outside the contract
    assert ortflash.InferenceSession(bad).native_nodes == 0
    f = qkv()
    right = ortflash.InferenceSession(model).run(None, f)[0]
    real = cpu.flash_attention
    monkeypatch.setattr(cpu, "flash_attention", lambda *a, **kw: real(*a, **kw) + 1.0)
    replaced = ortflash.InferenceSession(model)
    assert replaced.native_nodes == 0  # a test's replaced kernel must be the one that runs
    np.testing.assert_array_equal(replaced.run(None, f)[0], right + 1.0)


def test_options_given_twice_register_the_library_once():
    model, f = single_node({}), qkv()
    options = ortflash.session_options()
    first = ortflash.InferenceSession(model, sess_options=options).run(None, f)[0]
    second = ortflash.InferenceSession(model, sess_options=options).run(None, f)[0]  # no "Conflicting" refusal
    np.testing.assert_array_equal(first, second)
    assert options.get_session_config_entry(native_op.REGISTERED_KEY) == cpu.selection().module.__file__


def test_a_float16_graph_runs_natively_between_its_casts():
    model = build(Variant(dtype=F16, bias_shapes=(("B", 1, 1, "T"),)))
    fused, report = ortflash.optimize(model, target="ortflash", softmax="online")
    assert report.fused == 1
    f = feeds(model, {"B": 2, "S": 40, "T": 40}, np.random.default_rng(0))
    got, want = both_paths(fused, f)
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got, want)


ZOO_MODELS = [
    "bert_sdpa_dynamo",
    "bert_eager_torchscript",
    "vit_sdpa_torchscript",
    "t5_sdpa_dynamo",
    "bart_eager_dynamo",
    "gpt2_cache_sdpa_torchscript",
    "llama_cache_eager_dynamo",
    "mistral_cache_sdpa_dynamo",
    "gpt_neo_eager_torchscript",
    "whisper_sdpa_dynamo",
]


@pytest.mark.parametrize("name", ZOO_MODELS)
def test_zoo_models_run_natively_with_the_bridges_bits(name):
    path = os.path.join(ZOO, f"{name}.onnx")
    fused, report = ortflash.optimize(path, target="ortflash", online_softmax=True)
    assert report.fused >= 1
    f = ortflash.make_feeds(path, seq_len=19, batch=2)
    native = ortflash.InferenceSession(fused)
    bridge = ortflash.InferenceSession(fused, native=False)
    assert native.native_nodes == len(flash_nodes(fused)) == report.fused
    before = native_op.calls()
    got = native.run(None, f)
    assert native_op.calls() - before == native.native_nodes
    for a, b in zip(got, bridge.run(None, f), strict=True):
        np.testing.assert_array_equal(a, b)


def test_nodes_in_a_length_dispatch_branch_run_natively():
    """The default output of a dynamic-length model is an If on the run's key length
    (pipeline/length_dispatch.py): its fused branch's node is rewritten too, and runs from the
    crossover the If carries, not below it."""
    model = build(Variant(bias_shapes=(("B", 1, 1, "T"),), heads=4, head_dim=32))
    fused, _ = ortflash.optimize(model, online_softmax=True, cpu_class="avx2")
    ifs = [n for n in fused.graph.node if n.op_type == "If"]
    assert len(ifs) == 1
    key_len = json.loads(next(p.value for p in ifs[0].metadata_props if p.key == DISPATCH_KEY))["key_len"]
    native = ortflash.InferenceSession(fused)
    assert native.native_nodes == 1
    bridge = ortflash.InferenceSession(fused, native=False)
    for seq, calls in ((key_len // 4, 0), (key_len, 1)):
        f = feeds(model, {"B": 2, "S": seq, "T": seq}, np.random.default_rng(seq))
        before = native_op.calls()
        got = native.run(None, f)[0]
        assert native_op.calls() - before == calls
        np.testing.assert_array_equal(got, bridge.run(None, f)[0])


@pytest.mark.parametrize("one", ["k and v", "q"])
def test_a_batch_of_one_broadcasts_as_in_the_reference(one):
    """K and V of batch 1 beside Q of batch 2 (a shared memory), or the reverse: the native op runs one
    problem per batch item, the same numbers as with the operand repeated over the batch."""
    f = qkv(b=2)
    names = ("k", "v") if one == "k and v" else ("q",)
    shared = {n: (f[n][:1] if n in names else f[n]) for n in "qkv"}
    repeated = {n: (np.repeat(shared[n], 2, axis=0) if n in names else shared[n]) for n in "qkv"}
    f["bias"] = padding_bias(2, 37)
    model = single_node({"softmax": "online", "block_size": 16}, bias=(2, 1, 1, 37))
    session = ortflash.InferenceSession(model, threads=1)
    got = session.run(None, {**shared, "bias": f["bias"]})[0]
    np.testing.assert_array_equal(got, session.run(None, {**repeated, "bias": f["bias"]})[0])
    if one == "k and v":  # the bridge takes it to the numpy reference (which refuses a Q of batch 1)
        bridge = ortflash.InferenceSession(model, threads=1, native=False)
        np.testing.assert_allclose(got, bridge.run(None, {**shared, "bias": f["bias"]})[0], rtol=1e-5, atol=1e-6)
