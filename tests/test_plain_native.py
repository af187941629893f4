"""Plain sessions on the native op (issue 30): ``onnxruntime.InferenceSession(path, ortflash.session_options())``
runs the user's file as written (nodes of ai.onnx.contrib with the exact_floats side channel) on the compiled
kernel's native op, which reads those nodes itself (csrc/flash/side_channel.hpp), with no Python per call.

The C++ reading is held to the Python one (op/side_channel, spec.validate, native_op.native_attributes) on every
FlashAttention node fusion writes for the zoo, and on side-channel texts at the edges of Python's int() and
float(). The build's call counter proves a session ran natively (the bridge does not count).
"""

from __future__ import annotations

import glob
import math
import os
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from attention_graphs import Variant, build, feeds
from onnx import TensorProto, helper
from test_native_op import CASES, LOWEST, padding_bias, qkv, single_node

import ortflash
from ortflash.kernels import cpu, native_op
from ortflash.kernels.config import KernelConfig
from ortflash.op import spec
from ortflash.op.node import flash_nodes, node_attributes
from ortflash.op.side_channel import SideChannel
from ortflash.session import REGISTERED_KEY, SPINNING_KEY, configure_model

pytestmark = pytest.mark.skipif(not cpu.available(), reason="no compiled kernel")

ZOO = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "models")
DEFAULT_THREADS = 3  # not this machine's count: the reading must take the one it is given


def raw_attributes(node: onnx.NodeProto) -> dict[str, Any]:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def python_reading(node: onnx.NodeProto, default_threads: int) -> dict[str, Any] | str:
    """What ortflash.InferenceSession's native path makes of a node (its error's type where it refuses)."""
    try:
        attrs = node_attributes(node)
        config = KernelConfig.of_side_channel(SideChannel.decode(attrs.get("exact_floats")))
        if config.backend != "cpu":
            return "refused"
        return native_op.native_attributes(attrs, config.threads or default_threads)
    except (ValueError, TypeError):  # SpecError, ConfigError, a garbled number
        return "refused"


def cpp_reading(node: onnx.NodeProto, default_threads: int) -> dict[str, Any] | str:
    try:
        return cpu.selection().module.decode_bridge_node(raw_attributes(node), default_threads)
    except ValueError:
        return "refused"


def zoo_nodes() -> list[tuple[str, onnx.NodeProto]]:
    nodes = []
    for path in sorted(glob.glob(os.path.join(ZOO, "*.onnx"))):
        name = os.path.basename(path)[: -len(".onnx")]
        for softmax in ("naive", "online"):
            fused, _ = ortflash.optimize(path, target="ortflash", softmax=softmax, min_seq_len=0)
            nodes += [(f"{name} {softmax} {i}", n) for i, n in enumerate(flash_nodes(fused))]
    return nodes


def test_both_readings_agree_on_every_zoo_node():
    nodes = zoo_nodes()
    assert len(nodes) >= 200  # 2 softmax modes x the zoo's fused blocks
    seen = set()
    for label, node in nodes:
        want = python_reading(node, DEFAULT_THREADS)
        assert want != "refused", label
        assert cpp_reading(node, DEFAULT_THREADS) == want, label
        seen.add((want["is_causal"], want["mask_fill"] == -math.inf, want["softmax"], want["window_left"] >= 0))
    assert len(seen) >= 5  # causal and not, finite and -inf fills, both modes, a sliding window


SIDE_CHANNELS = [
    "",
    "scale=0.125",
    "scale=0.17677669529663687;mask_fill=-inf;softcap=0.0",
    "scale= 0.1767766952966369 ",  # float() strips
    " scale=0.1767766952966369",  # the name is not stripped: not an item of the op
    "scale=0.17677",  # agrees to 6 digits with the attribute below: taken
    "scale=0.5",  # edited attribute wins
    "scale=1_7.5e-2",
    "scale=1__7.5e-2",
    "scale=0x1p-3",  # not Python's float
    "scale=.125;scale=0.1767766952966369",
    "mask_fill=-3.4028234663852886e+38",
    "mask_fill=-INFINITY",
    "mask_fill=nan",
    "window_left=7",
    "window_left= 7 ;window_right=+2",
    "window_left=7_0",
    "window_left=7.0",  # int() refuses: ignored
    "window_left=-2",  # out of the contract
    "bias_after_mask=1",
    "bias_after_mask=1=2",
    "threads=2",
    "threads=2;threads=1",
    " threads = 4 ;backend = cpu",
    "threads=",
    "threads=0",
    "threads=two",
    "backend=reference",
    "backend=numpy",
    ";;scale=0.1767766952966369;;",
    "colour=blue;scale=0.1767766952966369",
]


@pytest.mark.parametrize("text", SIDE_CHANNELS)
@pytest.mark.parametrize("scale", [0.1767766952966369, 0.5, 3])
def test_both_readings_agree_on_side_channels_at_the_edges(text, scale):
    node = helper.make_node(
        spec.OP_TYPE, ["q", "k", "v"], ["o"], domain=spec.DOMAIN, scale=scale, mask_fill=LOWEST, exact_floats=text
    )
    assert cpp_reading(node, DEFAULT_THREADS) == python_reading(node, DEFAULT_THREADS)


@pytest.mark.parametrize(
    "attrs",
    [
        {},
        {"scale": "0.25"},
        {"scale": "a quarter"},
        {"is_causal": 7},
        {"is_causal": 1.0},
        {"softmax": "fast"},
        {"softmax": 1},
        {"masked_rows": "zero", "softcap": 30.0, "block_size": 16, "min_seq_len": 0},
        {"block_size": 0},
        {"mask_fill": 1.0},
        {"window_left": 3, "exact_floats": ""},  # an undeclared attribute on the node, none in the channel
        {"window_left": 3, "exact_floats": "window_left=5"},  # the channel's wins
    ],
)
def test_both_readings_agree_on_attributes_at_the_edges(attrs):
    node = helper.make_node(spec.OP_TYPE, ["q", "k", "v"], ["o"], domain=spec.DOMAIN, **attrs)
    assert cpp_reading(node, DEFAULT_THREADS) == python_reading(node, DEFAULT_THREADS)


def plain_session(model: onnx.ModelProto, options: ort.SessionOptions | None = None) -> ort.InferenceSession:
    so = ortflash.session_options(base=options)
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def run_counting(session: Any, f: dict) -> tuple[list[np.ndarray], int]:
    before = native_op.calls()
    out = session.run(None, f)
    return out, native_op.calls() - before


@pytest.mark.parametrize("case", list(CASES))
def test_a_plain_session_runs_natively_with_the_sessions_bits(case):
    attrs, shape = CASES[case]
    dims = {key: shape[key] for key in ("sq", "sk", "hkv") if key in shape}
    if "sq" in dims and "sk" not in dims:
        dims["sk"] = 37
    f = qkv(**dims)
    b, _, _, _ = f["q"].shape
    sk = f["k"].shape[2]
    rng = np.random.default_rng(1)
    bias_shape = mask_shape = None
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
    model = single_node(attrs, bias=bias_shape, mask=mask_shape)
    got, calls = run_counting(plain_session(model), f)
    assert calls == 1  # the native op ran, not the bridge
    for native in (True, False):
        np.testing.assert_array_equal(got[0], ortflash.InferenceSession(model, native=native).run(None, f)[0])


@pytest.mark.parametrize("name", ["bert_sdpa_dynamo", "llama_cache_eager_dynamo", "gpt_neo_eager_torchscript"])
def test_a_zoo_model_written_to_disk_runs_natively_in_a_plain_session(name, tmp_path):
    path = os.path.join(ZOO, f"{name}.onnx")
    out = str(tmp_path / "fused.onnx")
    fused, report = ortflash.optimize(path, target="ortflash", online_softmax=True)
    onnx.save(fused, out)
    f = ortflash.make_feeds(path, seq_len=19, batch=2)
    session = ort.InferenceSession(out, ortflash.session_options(), providers=["CPUExecutionProvider"])
    got, calls = run_counting(session, f)
    assert calls == report.fused >= 1
    for a, b in zip(got, ortflash.InferenceSession(fused, native=False).run(None, f), strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_length_dispatch_runs_natively_in_a_plain_session():
    model = build(Variant(bias_shapes=(("B", 1, 1, "T"),), heads=4, head_dim=32))
    fused, _ = ortflash.optimize(model, online_softmax=True, cpu_class="avx2")
    assert any(n.op_type == "If" for n in fused.graph.node)
    session = plain_session(fused)
    for seq, want_calls in ((8, 0), (512, 1)):
        f = feeds(model, {"B": 2, "S": seq, "T": seq}, np.random.default_rng(seq))
        got, calls = run_counting(session, f)
        assert calls == want_calls
        np.testing.assert_array_equal(got[0], ortflash.InferenceSession(fused, native=False).run(None, f)[0])


def with_string_lower(model: onnx.ModelProto) -> onnx.ModelProto:
    """model with an onnxruntime-extensions op beside its FlashAttention, both in ai.onnx.contrib."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    out.graph.node.append(helper.make_node("StringLower", ["text"], ["lower"], domain=spec.DOMAIN))
    out.graph.input.append(helper.make_tensor_value_info("text", TensorProto.STRING, [None]))
    out.graph.output.append(helper.make_tensor_value_info("lower", TensorProto.STRING, [None]))
    return out


def test_extensions_ops_run_beside_the_native_op():
    """ONNX Runtime takes one ai.onnx.contrib domain per session: the native op joins onnxruntime-extensions'
    own (its tokenizers and the rest), which session_options() registers."""
    model = with_string_lower(single_node({}))
    f = {**qkv(), "text": np.array(["FlashAttention", "ONNX"])}
    (out, lower), calls = run_counting(plain_session(model), f)
    assert calls == 1 and lower.tolist() == ["flashattention", "onnx"]
    np.testing.assert_array_equal(out, ortflash.InferenceSession(single_node({})).run(None, qkv())[0])
    # a user's own options with onnxruntime-extensions' library, in a process where ortflash is in use
    from onnxruntime_extensions import get_library_path

    native_op.provide_contrib_op()
    own = ort.SessionOptions()
    own.register_custom_ops_library(get_library_path())
    (out2, lower2), calls = run_counting(ort.InferenceSession(model.SerializeToString(), own), f)
    assert calls == 1 and lower2.tolist() == lower.tolist()
    np.testing.assert_array_equal(out2, out)


def test_a_node_outside_the_contract_is_refused_with_the_reason():
    bad = single_node({})
    next(a for a in bad.graph.node[0].attribute if a.name == "is_causal").i = 7
    with pytest.raises(Exception, match="outside the op's contract: is_causal = 7 is out of range"):
        plain_session(bad)
    asks_python = single_node({})
    channel = next(a for a in asks_python.graph.node[0].attribute if a.name == "exact_floats")
    channel.s += b";backend=reference"
    with pytest.raises(Exception, match="asks for backend reference, which runs in Python"):
        plain_session(asks_python)


def test_a_configured_copy_runs_where_its_configuration_says():
    """configure_model: the compiled kernel natively (threads from the side channel), another backend on the
    Python bridge, in the plain session it is opened in."""
    model, f = single_node({"softmax": "online", "block_size": 8}), qkv()
    want = ortflash.InferenceSession(model, native=False).run(None, f)[0]
    native, calls = run_counting(plain_session(configure_model(model, config=KernelConfig("cpu", threads=1))), f)
    assert calls == 1
    np.testing.assert_array_equal(native[0], want)
    reference, calls = run_counting(plain_session(configure_model(model, config=KernelConfig("reference"))), f)
    assert calls == 0
    np.testing.assert_allclose(reference[0], want, rtol=1e-5, atol=1e-6)
    again = configure_model(configure_model(model, config=KernelConfig("reference")), config=KernelConfig("cpu"))
    assert len(flash_nodes(again)) == 1  # back in ai.onnx.contrib: native again
    assert run_counting(plain_session(again), f)[1] == 1


def test_session_options_rules_still_hold():
    chosen = ort.SessionOptions()
    chosen.add_session_config_entry(SPINNING_KEY, "1")
    assert ortflash.session_options(base=chosen).get_session_config_entry(SPINNING_KEY) == "1"
    options = ortflash.session_options()
    assert options.get_session_config_entry(SPINNING_KEY) == "0"
    assert ortflash.session_options(base=options) is options  # registered once: no "Conflicting" refusal
    model, f = single_node({}), qkv()
    first, calls = run_counting(plain_session(model, options), f)
    second, more = run_counting(ort.InferenceSession(model.SerializeToString(), options), f)
    assert calls == more == 1
    np.testing.assert_array_equal(first[0], second[0])
    assert options.get_session_config_entry(REGISTERED_KEY)
    # the same options serve ortflash.InferenceSession, which adds the ortflash.native library once
    session = ortflash.InferenceSession(model, sess_options=options)
    assert session.native_nodes == 1
    np.testing.assert_array_equal(session.run(None, f)[0], first[0])
    assert native_op.provide_contrib_op() == "native"
