"""The CUDA EP's float16 causal cost rows (lowering/cuda.py CROSSOVERS) held to the data they name
(cuda.CAUSAL_RESULTS, benchmarks/results/cuda_forms_causal_f16.md: one block, B1 H16, static and
symbolic, on the H200): an exported causal mask lowered by `--target cuda` (the own-causal forms) ran
1.74-2.43x the original at 1024 keys, D64 and D128, so `--ep cuda` lowers it from 1024 there (was 2048,
and 4096 before that); a causal block with a padding part (causal_padding, lowered as the causal bias +
guard) ran 0.42-0.99x at every measured length, so its row is never."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ortflash.lowering import cuda
from ortflash.op.policy import SoftmaxPolicy
from ortflash.pipeline import forms

ROOT = Path(__file__).resolve().parents[1]


def _fused(head_dim: int, length: int, target: str = "cuda", kind: str = "causal") -> bool:
    policy = SoftmaxPolicy.for_new_nodes()
    return forms.choose(target, policy, head_dim, [length], kind, "cuda", "float16").fused


def _measured() -> dict[tuple[str, int, str, int, str], float]:
    """(stack, head dim, shape, S, variant) -> ms of CAUSAL_RESULTS' run."""
    data = json.loads((ROOT / cuda.CAUSAL_RESULTS).with_suffix(".json").read_text())
    return {
        (r["stack"], r["head_dim"], r["shape"], r["seq"], r["variant"]): r["ms"]
        for r in data["rows"]
        if "ms" in r and r.get("dtype") == "float16"
    }


@pytest.mark.parametrize("d", [64, 128])
def test_float16_causal_lowers_from_1024_at_the_measured_head_dims(d):
    assert _fused(d, 1024) and _fused(d, 2048) and _fused(d, 4096)
    assert not _fused(d, 512)  # 512 not measured with the own-causal forms


def test_float16_causal_keeps_4096_where_not_re_measured():
    assert not _fused(32, 2048) and _fused(32, 4096)  # D32: crossover_cuda.md's row
    assert not _fused(64, 2048, "contrib") and _fused(64, 4096, "contrib")  # contrib: crossover_cuda.md's row


def test_the_rows_are_the_named_results_file():
    ms = _measured()
    row = cuda.CROSSOVERS["float16"]["causal"]["cuda"]
    padded = cuda.CROSSOVERS["float16"]["causal_padding"]["cuda"]
    for d in (64, 128):
        assert row[d] == 1024 and padded[d] is None
        for shape in ("static", "symbolic"):
            for s in (1024, 2048, 4096):
                own = ms[("causal_mask", d, shape, s, "original")] / ms[("causal_mask", d, shape, s, "cuda")]
                assert own >= 1.5, (d, shape, s, own)  # 1.74-9.97x
                bias = ms[("causal_padding", d, shape, s, "original")] / ms[("causal_padding", d, shape, s, "cuda")]
                assert bias < 1.0, (d, shape, s, bias)  # 0.42-0.99x: never lowered
    assert (ROOT / cuda.CAUSAL_RESULTS).exists() and (ROOT / cuda.CROSSOVER_RESULTS).exists()


def test_a_causal_block_with_a_padding_mask_reads_its_own_row():
    """Causal + padding lowers to the causal bias and the masked-rows guard (cuda.choose_form), which
    lost at every measured length: kept, where the own-causal forms' row lowers from 1024; tables
    without the row (the CPU's, WebGPU's) read the causal one."""
    assert forms.mask_kind(True, (1,)) == "causal_padding" and forms.mask_kind(True, ()) == "causal"
    policy = SoftmaxPolicy.for_new_nodes()
    for d in (32, 64, 128):
        for s in (1024, 2048, 4096):
            kept = forms.choose("cuda", policy, d, [s], "causal_padding", "cuda", "float16")
            assert not kept.fused and "causal with a padding mask" in kept.why, kept.why
    for ep in (None, "webgpu"):
        t = forms.table(ep, "float32", "avx512")
        assert t["causal_padding"] == t["causal"]


def test_optimize_keeps_a_padded_causal_float16_block_at_2048_on_cuda(monkeypatch):
    """End to end: a float16 decoder (head dim 64) whose mask is causal + attention_mask padding, at
    2048 keys under --ep cuda, keeps its ops (the row above); without the padding it is lowered."""
    import test_causal_proof
    from onnx import TensorProto

    import ortflash

    monkeypatch.setattr(test_causal_proof, "D", 64)  # a head dim the rows were measured at
    for padding, lowered in (("unsqueeze", False), ("none", True)):
        model = test_causal_proof._decoder(padding=padding, dtype=TensorProto.FLOAT16, fill=float("-inf"))
        _, report = ortflash.optimize(model, ep="cuda", seq_lens=[2048])
        kinds = [b.mask_kind for b in report.blocks]
        assert kinds == ["causal" if padding == "none" else "causal_padding"] * 2, kinds
        assert [b.head_dim for b in report.blocks] == [64, 64]
        assert [b.lowered_to is not None for b in report.blocks] == [lowered] * 2, [b.reason for b in report.blocks]
