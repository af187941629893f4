"""Kernel configuration belongs to a session: sessions in one process never change each other.

Before this was per session, ``ortflash.InferenceSession(softmax=...)`` and ``backend=...``
set process globals of the bridge, so building one session changed what an earlier,
independent session (a plain onnxruntime session with ``ortflash.session_options()``)
computed, and two sessions running in parallel threads raced.
"""

from __future__ import annotations

import concurrent.futures

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from attention_graphs import Variant, build, feeds

import ortflash
from ortflash.kernels.config import ConfigError, KernelConfig
from ortflash.op import spec
from ortflash.op.side_channel import SideChannel
from ortflash.session import configure_model

DIMS = {"B": 2, "S": 48, "T": 48}


@pytest.fixture(scope="module")
def fused_and_feeds() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    model = build(Variant(bias_shapes=(("B", 1, 1, "T"),)))
    fused, report = ortflash.optimize(model, softmax="naive", target="ortflash")
    assert report.fused == 1
    return fused, feeds(model, DIMS, np.random.default_rng(0))


def _plain(model: onnx.ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(
        model.SerializeToString(), ortflash.session_options(), providers=["CPUExecutionProvider"]
    )


def test_a_later_session_does_not_change_an_earlier_one(fused_and_feeds):
    fused, f = fused_and_feeds
    plain = _plain(fused)  # runs the naive softmax written on the nodes
    before = plain.run(None, f)[0]
    online = ortflash.InferenceSession(fused, softmax="online", block_size=5, backend="reference")
    online_out = online.run(None, f)[0]
    # The test means something only if the two configurations give different bits.
    assert not np.array_equal(before, online_out)
    np.testing.assert_allclose(online_out, before, rtol=1e-5, atol=1e-6)
    after = plain.run(None, f)[0]
    assert np.array_equal(before, after)
    # and the reverse: the online session still runs online after the plain one ran
    assert np.array_equal(online.run(None, f)[0], online_out)


def test_sessions_in_parallel_threads_keep_their_own_configuration(fused_and_feeds):
    fused, f = fused_and_feeds
    sessions = {
        "naive": ortflash.InferenceSession(fused, softmax="naive", backend="reference"),
        "online": ortflash.InferenceSession(fused, softmax="online", block_size=5, backend="reference"),
        "online-cpu": ortflash.InferenceSession(fused, softmax="online", block_size=7, threads=1),
    }
    expected = {name: s.run(None, f)[0] for name, s in sessions.items()}
    assert not np.array_equal(expected["naive"], expected["online"])

    def run(name: str) -> bool:
        return bool(np.array_equal(sessions[name].run(None, f)[0], expected[name]))

    names = list(sessions) * 12
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(run, names))
    assert results.count(True) == len(names)


def test_configure_model_writes_policy_and_runtime_on_a_copy(fused_and_feeds):
    fused, _ = fused_and_feeds
    policy = ortflash.SoftmaxPolicy("online", block_size=32, min_seq_len=0)
    configured = configure_model(fused, policy=policy, config=KernelConfig("reference", threads=3))
    node = next(n for n in configured.graph.node if n.op_type == spec.OP_TYPE)
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    assert attrs["softmax"] == b"online" and attrs["block_size"] == 32 and attrs["min_seq_len"] == 0
    channel = SideChannel.decode(attrs["exact_floats"])
    assert KernelConfig.of_side_channel(channel) == KernelConfig("reference", threads=3)
    floats = channel.op_text
    original = next(n for n in fused.graph.node if n.op_type == spec.OP_TYPE)
    original_floats = onnx.helper.get_attribute_value(
        next(a for a in original.attribute if a.name == "exact_floats")
    ).decode()
    assert floats == original_floats and "backend" not in original_floats
    # a second session's choice replaces the first's, the op's items kept as written
    again = configure_model(configured, config=KernelConfig("cpu"))
    text = next(
        a.s for a in again.graph.node if a.op_type == spec.OP_TYPE for a in a.attribute if a.name == "exact_floats"
    )
    assert text.decode() == f"{original_floats};backend=cpu"


def test_kernel_config_round_trips_and_rejects_bad_values():
    for config in (KernelConfig(), KernelConfig("wgpu"), KernelConfig("cpu", threads=2)):
        text = SideChannel(("scale=0.125",)).with_runtime(config.runtime_items()).encode()
        assert KernelConfig.of_side_channel(SideChannel.decode(text)) == config
    assert KernelConfig.of_side_channel(SideChannel.decode("")) == KernelConfig()
    assert KernelConfig.of_side_channel(SideChannel.decode("scale=0.5;threads=2")) == KernelConfig(threads=2)
    with pytest.raises(ConfigError):
        KernelConfig("numpy")
    with pytest.raises(ConfigError):
        KernelConfig("cpu", threads=0)
    with pytest.raises(ConfigError):
        KernelConfig.of_side_channel(SideChannel((), (("backend", "cpu"), ("colour", "blue"))))
    with pytest.raises(ConfigError):
        ortflash.InferenceSession(build(Variant()), backend="gpu")


def test_bridge_keeps_ortflash_hook_installed():
    """The bridge's fast hook (numpy buffers, not lists) is what onnxruntime-extensions calls."""
    from onnxruntime_extensions import _ocos

    from ortflash.kernels import ort_bridge

    assert _ocos.PyCustomOpDef is not None and ort_bridge.INVOKE_HOOK.__module__ == ort_bridge.__name__
    # a private API the bridge relies on, pinned in pyproject.toml: keep it checked
    assert hasattr(_ocos.Opdef, "_odlist") and hasattr(_ocos.Opdef, "cast_attributes")


def test_session_options_turn_intra_op_spinning_off_unless_the_caller_chose():
    """ORT's idle pool threads busy-wait through a FlashAttention node and take the cores the
    compiled kernel's own threads run on (issue 12: 1.3-1.6x the causal prefill's wall time)."""
    from ortflash.session import SPINNING_KEY

    assert ortflash.session_options().get_session_config_entry(SPINNING_KEY) == "0"
    chosen = ort.SessionOptions()
    chosen.add_session_config_entry(SPINNING_KEY, "1")
    assert ortflash.session_options(base=chosen).get_session_config_entry(SPINNING_KEY) == "1"
    spinning = ort.SessionOptions()
    spinning.add_session_config_entry(SPINNING_KEY, "1")
    model = build(Variant())
    session = ortflash.InferenceSession(ortflash.optimize(model, target="ortflash")[0], sess_options=spinning)
    assert session.run(None, feeds(model, DIMS, np.random.default_rng(1)))[0].shape[0] == DIMS["B"]


def test_options_from_session_options_can_be_handed_to_inference_session(fused_and_feeds):
    """Registering the custom-op library twice on one SessionOptions makes ORT refuse the session
    ("Conflicting with a registered kernel"): session_options() registers it once per options."""
    fused, inputs = fused_and_feeds
    twice = ortflash.session_options(base=ortflash.session_options())
    want = _plain(fused).run(None, inputs)[0]
    plain = ort.InferenceSession(fused.SerializeToString(), twice, providers=["CPUExecutionProvider"])
    assert np.array_equal(plain.run(None, inputs)[0], want)
    ours = ortflash.InferenceSession(fused, sess_options=ortflash.session_options())
    assert np.array_equal(ours.run(None, inputs)[0], want)


def test_the_kernel_takes_the_session_options_intra_op_thread_count(fused_and_feeds):
    # The compiled kernel runs its own pool and never reads ONNX Runtime's thread count: before this,
    # a session given intra_op_num_threads = 1 ran its FlashAttention nodes on every core.
    fused, f = fused_and_feeds
    one = ort.SessionOptions()
    one.intra_op_num_threads = 1
    assert ortflash.InferenceSession(fused, sess_options=one).config.threads == 1
    assert ortflash.InferenceSession(fused, sess_options=one, threads=2).config.threads == 2  # the caller's word
    default = ort.SessionOptions()  # intra_op_num_threads 0: ONNX Runtime's default, no count given
    assert ortflash.InferenceSession(fused, sess_options=default).config.threads is None
    assert ortflash.InferenceSession(fused).config.threads is None
    single = ortflash.InferenceSession(fused, sess_options=one).run(None, f)[0]
    np.testing.assert_array_equal(single, ortflash.InferenceSession(fused, threads=2).run(None, f)[0])
