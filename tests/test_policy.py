"""The softmax policy's four promises."""

import numpy as np
import pytest

from ortflash import SoftmaxPolicy
from ortflash.kernels.reference import flash_attention
from ortflash.op import spec


def test_online_and_naive_agree_numerically():
    rng = np.random.default_rng(1)
    q = rng.standard_normal((2, 3, 70, 64), np.float32)
    k = rng.standard_normal((2, 3, 333, 64), np.float32)
    v = rng.standard_normal((2, 3, 333, 64), np.float32)
    bias = np.where(rng.random((2, 1, 1, 333)) < 0.2, np.float32(-1e9), np.float32(0))
    naive = flash_attention(q, k, v, bias, scale=0.125, policy=SoftmaxPolicy("naive"))
    online = flash_attention(q, k, v, bias, scale=0.125, policy=SoftmaxPolicy("online", block_size=32))
    assert np.abs(naive - online).max() < 2e-6
    assert not np.allclose(naive, 0)


def test_long_sequence_picks_online_when_option_on():
    policy = SoftmaxPolicy.for_new_nodes(online_softmax=True, min_seq_len=512)
    assert policy.mode == "auto"
    assert policy.choose(512) == "online"
    assert policy.choose(4096) == "online"


def test_short_sequence_uses_naive_under_auto():
    policy = SoftmaxPolicy("auto", min_seq_len=512)
    assert policy.choose(511) == "naive"
    assert policy.choose(1) == "naive"


def test_option_off_means_naive_everywhere():
    policy = SoftmaxPolicy.for_new_nodes(online_softmax=False)
    assert policy.mode == "naive"
    assert {policy.choose(n) for n in (1, 1024, 1 << 20)} == {"naive"}


@pytest.mark.parametrize(
    "attrs",
    [
        {"softmax": "fast"},
        {"block_size": 0},
        {"block_size": -3},
        {"min_seq_len": -1},
        {"scale": 0.0},
        {"masked_rows": "inf"},
        {"is_causal": 3},
        {"bias_after_mask": 2},
        {"nope": 1},
    ],
)
def test_schema_rejects_bad_attribute_values(attrs):
    with pytest.raises(spec.SpecError):
        spec.validate(attrs)


def test_schema_fills_defaults_from_one_table():
    attrs = spec.validate({"scale": 0.5})
    assert attrs["block_size"] == spec.ATTRIBUTES["block_size"].default
    assert attrs["softmax"] == "auto" and attrs["masked_rows"] == "nan"
    assert SoftmaxPolicy().block_size == spec.ATTRIBUTES["block_size"].default
