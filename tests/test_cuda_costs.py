"""The CUDA EP's float16 causal cost rows (lowering/cuda_measured.py CROSSOVERS) held to the data they
name (one block, B1 H16, static and symbolic, on the H200): an exported causal mask lowered by
`--target cuda` (Attention-23 where the table times it fastest, the model's opset raised for it, else
GroupQueryAttention; CAUSAL_RESULTS, cuda_forms_causal_attn23_f16.md) ran 1.43-3.15x the original at 1024
keys, D64 and D128, 2.18x and more from 2048, where the cells of a model left as it was read 0.99-1.10x, so
`--ep cuda` lowers it from 1024 there; a causal block with a padding part (causal_padding; CAUSAL_PADDING_RESULTS,
cuda_forms_causal_padding_f16.md), lowered as MultiHeadAttention's own causal mask with the padding row
in attention_bias, ran 1.61-2.05x at 2048 and 3.24-4.24x at 4096, so its row lowers from 2048 (its form
before, the causal bias + guard, ran 0.43-1.01x at every length: never)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ortflash.lowering import cuda_measured
from ortflash.op.policy import SoftmaxPolicy
from ortflash.pipeline import forms

ROOT = Path(__file__).resolve().parents[1]


def _fused(head_dim: int, length: int, target: str = "cuda", kind: str = "causal") -> bool:
    policy = SoftmaxPolicy.for_new_nodes()
    return forms.choose(target, policy, head_dim, [length], kind, "cuda", "float16").fused


def _measured() -> dict[tuple[str, int, str, int, str], float]:
    """(stack, head dim, shape, S, variant) -> ms of CAUSAL_RESULTS' run."""
    data = json.loads((ROOT / cuda_measured.CAUSAL_RESULTS).with_suffix(".json").read_text())
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


def _measured_padding() -> dict[tuple[int, str, int, str], float]:
    """(head dim, shape, S, variant) -> ms of CAUSAL_PADDING_RESULTS' float16 run."""
    data = json.loads((ROOT / cuda_measured.CAUSAL_PADDING_RESULTS).with_suffix(".json").read_text())
    return {
        (r["head_dim"], r["shape"], r["seq"], r["variant"]): r["ms"]
        for r in data["rows"]
        if "ms" in r and r.get("dtype") == "float16" and r.get("stack") == "causal_padding"
    }


def test_the_rows_are_the_named_results_file():
    ms = _measured()
    row = cuda_measured.CROSSOVERS["float16"]["causal"]["cuda"]
    for d in (64, 128):
        assert row[d] == 1024
        for shape in ("static", "symbolic"):
            for s in (1024, 2048, 4096):
                own = ms[("causal_mask", d, shape, s, "original")] / ms[("causal_mask", d, shape, s, "cuda")]
                assert own >= (1.4 if s == 1024 else 2.0), (d, shape, s, own)  # 1.43-3.15x at 1024, 2.18-7.80x on
    assert (ROOT / cuda_measured.CAUSAL_RESULTS).exists() and (ROOT / cuda_measured.CROSSOVER_RESULTS).exists()


def test_the_causal_padding_row_is_its_results_file():
    """From 2048 at D64/D128, where the form --target cuda writes ran >= 1.5x static and symbolic (and
    won at 16384 against the original's ops as --ep cuda kept them); 1024 not taken (1.03-1.24x, not
    clear of the noise); the form before it lost everywhere; D32 and contrib never (not measured, lost)."""
    ms = _measured_padding()
    padded = cuda_measured.CROSSOVERS["float16"]["causal_padding"]
    assert dict(padded["cuda"]) == {32: None, 64: 2048, 128: 2048}
    assert set(padded["contrib"].values()) == {None}
    for d in (64, 128):
        for shape in ("static", "symbolic"):
            for s in (2048, 4096):
                won = ms[(d, shape, s, "original")] / ms[(d, shape, s, "cuda")]
                assert won >= 1.5, (d, shape, s, won)  # 1.61-4.24x
                assert ms[(d, shape, s, "cuda")] == pytest.approx(ms[(d, shape, s, "cuda:mha_causal_padding")], 0.1)
                before = ms[(d, shape, s, "original")] / ms[(d, shape, s, "cuda:mha_bias")]
                assert before < 1.05, (d, shape, s, before)  # 0.53-1.01x
                contrib = ms[(d, shape, s, "original")] / ms[(d, shape, s, "contrib")]
                assert contrib < 1.0, (d, shape, s, contrib)
            assert ms[(d, shape, 16384, "ep_cuda")] / ms[(d, shape, 16384, "cuda")] >= 4.0  # 5.6-7.1x
            assert ms[(d, shape, 1024, "original")] / ms[(d, shape, 1024, "cuda")] < 1.3  # 1024: not taken


def test_a_causal_block_with_a_padding_mask_reads_its_own_row():
    """Causal + padding lowers to the own causal mask + padding row (cuda.choose_form): its row lowers
    from 2048 at D64/D128, where the own-causal forms' row lowers from 1024; tables without the row
    (the CPU's, WebGPU's) read the causal one."""
    assert forms.mask_kind(True, (1,)) == "causal_padding" and forms.mask_kind(True, ()) == "causal"
    policy = SoftmaxPolicy.for_new_nodes()
    for d in (32, 64, 128):
        for s in (1024, 2048, 4096):
            choice = forms.choose("cuda", policy, d, [s], "causal_padding", "cuda", "float16")
            assert choice.fused == (d != 32 and s >= 2048), (d, s, choice.why)
            if not choice.fused:
                assert "causal with a padding mask" in choice.why, choice.why
    for ep in (None, "webgpu"):
        t = forms.table(ep, "float32", "avx512")
        assert t["causal_padding"] == t["causal"]


def test_optimize_lowers_a_padded_causal_float16_block_from_2048_on_cuda(monkeypatch):
    """End to end: a float16 decoder (head dim 64) whose mask is causal + attention_mask padding, under
    --ep cuda: kept at 1024 keys (its row), lowered at 2048 as MultiHeadAttention with its own causal
    mask; without the padding it is lowered at both (the causal row: from 1024)."""
    import test_causal_proof
    from onnx import TensorProto, helper

    import ortflash

    monkeypatch.setattr(test_causal_proof, "D", 64)  # a head dim the rows were measured at
    for padding in ("unsqueeze", "none"):
        model = test_causal_proof._decoder(padding=padding, dtype=TensorProto.FLOAT16, fill=float("-inf"))
        for length in (1024, 2048):
            written, report = ortflash.optimize(model, ep="cuda", seq_lens=[length])
            kinds = [b.mask_kind for b in report.blocks]
            assert kinds == ["causal" if padding == "none" else "causal_padding"] * 2, kinds
            assert [b.head_dim for b in report.blocks] == [64, 64]
            lowered = padding == "none" or length >= 2048
            assert [b.lowered_to is not None for b in report.blocks] == [lowered] * 2, [b.reason for b in report.blocks]
            if padding != "none" and lowered:
                mha = [n for n in written.graph.node if n.op_type == "MultiHeadAttention"]
                assert len(mha) == 2
                assert all(
                    helper.get_attribute_value(a) == 1 for n in mha for a in n.attribute if a.name == "unidirectional"
                )
                assert all(len(n.input) == 6 and n.input[5] for n in mha)


def test_a_choice_names_the_results_file_its_row_was_read_from():
    """The detail names the file each row came from: causal_padding's run, the float16 causal rows' run
    (and crossover_cuda.md for D32), crossover_cuda.md for the rest (it named crossover_cuda.md for all)."""
    policy = SoftmaxPolicy.for_new_nodes()

    def why(kind: str, dtype: str, d: int = 64) -> str:
        return forms.choose("cuda", policy, d, [2048], kind, "cuda", dtype).detail

    assert "cuda_forms_causal_padding_f16.md" in why("causal_padding", "float16")
    assert "cuda_forms_causal_attn23_f16.md" in why("causal", "float16")
    assert "cuda_forms_causal" not in why("padding", "float16") and "crossover_cuda.md" in why("padding", "float16")
    assert "cuda_forms_causal" not in why("causal", "float32") and "crossover_cuda.md" in why("causal", "float32")
