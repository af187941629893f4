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


def test_a_causal_block_with_a_padding_mask_reads_its_own_row():
    """Causal + padding lowers to the causal bias and the masked-rows guard (cuda.choose_form), the
    form crossover_cuda.md timed at 0.85-0.94x at 2048: its row keeps 4096 where the own-causal forms'
    moved to 2048; tables without the row (the CPU's, WebGPU's) read the causal one."""
    assert forms.mask_kind(True, (1,)) == "causal_padding" and forms.mask_kind(True, ()) == "causal"
    policy = SoftmaxPolicy.for_new_nodes()
    for d in (32, 64, 128):
        kept = forms.choose("cuda", policy, d, [2048], "causal_padding", "cuda", "float16")
        assert not kept.fused and "causal with a padding mask" in kept.why, kept.why
        assert forms.choose("cuda", policy, d, [4096], "causal_padding", "cuda", "float16").fused
    for ep in (None, "webgpu"):
        t = forms.table(ep, "float32", "avx512")
        assert t["causal_padding"] == t["causal"]


def test_optimize_keeps_a_padded_causal_float16_block_at_2048_on_cuda(monkeypatch):
    """End to end: a float16 decoder (head dim 64) whose mask is causal + attention_mask padding, at
    2048 keys under --ep cuda, keeps its ops (the row above); without the padding it is lowered."""
    import test_causal_proof
    from onnx import TensorProto

    import ortflash

    monkeypatch.setattr(test_causal_proof, "D", 64)  # a head dim the 2048 row was measured at
    for padding, lowered in (("unsqueeze", False), ("none", True)):
        model = test_causal_proof._decoder(padding=padding, dtype=TensorProto.FLOAT16, fill=float("-inf"))
        _, report = ortflash.optimize(model, ep="cuda", seq_lens=[2048])
        kinds = [b.mask_kind for b in report.blocks]
        assert kinds == ["causal" if padding == "none" else "causal_padding"] * 2, kinds
        assert [b.head_dim for b in report.blocks] == [64, 64]
        assert [b.lowered_to is not None for b in report.blocks] == [lowered] * 2, [b.reason for b in report.blocks]
