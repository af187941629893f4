"""The CUDA EP's float16 causal cost row (lowering/cuda.py CROSSOVERS) held to the data it names:
an exported causal mask lowered by `--target cuda` (the own-causal forms) ran 3.20-3.66x the original
at S=2048, D64 and D128 (benchmarks/results/cuda_forms_f16_static.md), so `--ep cuda` lowers it from
2048 keys there (was 4096, from crossover_cuda.md's run of the older causal-bias form)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ortflash.lowering import cuda
from ortflash.op.policy import SoftmaxPolicy
from ortflash.pipeline import forms

ROOT = Path(__file__).resolve().parents[1]


def _fused(head_dim: int, length: int, target: str = "cuda") -> bool:
    policy = SoftmaxPolicy.for_new_nodes()
    return forms.choose(target, policy, head_dim, [length], "causal", "cuda", "float16").fused


@pytest.mark.parametrize("d", [64, 128])
def test_float16_causal_lowers_from_2048_at_the_measured_head_dims(d):
    assert _fused(d, 2048) and _fused(d, 4096)
    assert not _fused(d, 1024)  # 1024 not measured with the own-causal forms


def test_float16_causal_keeps_4096_where_not_re_measured():
    assert not _fused(32, 2048) and _fused(32, 4096)  # D32: crossover_cuda.md's row
    assert not _fused(64, 2048, "contrib") and _fused(64, 4096, "contrib")  # contrib never won there


def test_the_row_is_the_named_results_files():
    data = json.loads((ROOT / cuda.CAUSAL_RESULTS).with_suffix(".json").read_text())
    ms = {
        (r["head_dim"], r["variant"]): r["ms"]
        for r in data["rows"]
        if r.get("stack") == "causal_mask" and r.get("seq") == 2048 and r.get("shape") == "static"
    }
    row = cuda.CROSSOVERS["float16"]["causal"]["cuda"]
    for d in (64, 128):
        assert ms[(d, "original")] / ms[(d, "cuda")] >= 3.0  # 3.66x, 3.20x
        assert row[d] == 2048
    assert (ROOT / cuda.CROSSOVER_RESULTS).exists()
