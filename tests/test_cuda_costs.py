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
from ortflash.lowering.measured import EVERY_LENGTH
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
    # D64 at every length (SHORT_CAUSAL_RESULTS); D128's symbolic form not clear of the noise below 1024
    assert [_fused(d, s) for s in (1, 37, 512)] == [d == 64] * 3


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
    assert row[64] == EVERY_LENGTH and row[128] == 1024
    for d in (64, 128):
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


def _short_runs() -> list[dict[tuple[int, str, int, str], float]]:
    """(head dim, shape, S, variant) -> ms of the exported causal-mask block, per run of SHORT_CAUSAL_RESULTS."""
    runs = []
    for name in (cuda_measured.SHORT_CAUSAL_RESULTS, cuda_measured.SHORT_CAUSAL_RESULTS.replace(".md", "_run2.md")):
        data = json.loads((ROOT / name).with_suffix(".json").read_text())
        runs.append(
            {
                (r["head_dim"], r["shape"], r["seq"], r["variant"]): r["ms"]
                for r in data["rows"]
                if "ms" in r and r.get("stack") == "causal_mask" and r.get("dtype") == "float16"
            }
        )
    return runs


def test_the_every_length_row_is_its_results_files():
    """D64 takes the lowered form from one key: in both runs, static and symbolic, S = 1-1024, it ran
    1.10-2.93x the original (1.10 and 1.17x static at one key, 1.6x and more from 4; the unchanged
    model's cells read 0.83-1.16x); D128's symbolic form
    did not clear 1.2x below 1024 in either run, so its row stays at 1024."""
    lengths = (1, 4, 16, 32, 64, 128, 256, 512, 1024)
    for ms in _short_runs():
        for shape in ("static", "symbolic"):
            own = [ms[(64, shape, s, "original")] / ms[(64, shape, s, "cuda")] for s in lengths]
            assert min(own) >= 1.09 and min(own[1:]) >= 1.6, (shape, own)
        d128 = [ms[(128, "symbolic", s, "original")] / ms[(128, "symbolic", s, "cuda")] for s in lengths[:-1]]
        assert max(d128) < 1.2, d128


def test_every_length_needs_the_query_length_to_be_the_key_length():
    """A length known only at run time: a block whose Sq == Sk is proved takes the every-length row
    with no If; one that may run a one-query step against a cache (not measured) keeps its ops."""
    policy = SoftmaxPolicy.for_new_nodes()
    square = forms.choose("cuda", policy, 64, None, "causal", "cuda", "float16", queries_are_keys=True)
    assert square.fused and square.dispatch_from is None and "every key length" in square.why
    cached = forms.choose("cuda", policy, 64, None, "causal", "cuda", "float16", queries_are_keys=False)
    assert not cached.fused and cached.dispatch_from is None
    assert not forms.choose("cuda", policy, 128, None, "causal", "cuda", "float16", queries_are_keys=True).fused


@pytest.mark.parametrize("d", [64, 128])
def test_ep_cuda_lowers_a_dynamic_float16_causal_decoder_at_d64_with_no_if(monkeypatch, d):
    """End to end, no --seq-lens: the float16 decoder with an exported causal mask (its length a name)
    becomes Attention-23 under --ep cuda at D64, with no If on the length; at D128 it is left as it was."""
    import test_causal_proof
    from onnx import TensorProto

    import ortflash

    monkeypatch.setattr(test_causal_proof, "D", d)
    model = test_causal_proof._decoder(padding="none", dtype=TensorProto.FLOAT16, fill=float("-inf"))
    written, report = ortflash.optimize(model, ep="cuda")
    ops = [n.op_type for n in written.graph.node]
    assert [b.mask_kind for b in report.blocks] == ["causal"] * 2
    assert "If" not in ops and "FlashAttention" not in ops
    assert ops.count("Attention") == (2 if d == 64 else 0), ops
    assert [b.lowered_to is not None for b in report.blocks] == [d == 64] * 2, [b.reason for b in report.blocks]


def _onnx_attention_block(head_dim: int = 64, heads: int = 4):
    from onnx import TensorProto, helper

    hidden = heads * head_dim
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT16, [1, "seq", hidden]) for n in ("q", "k", "v", "o")]
    node = helper.make_node("Attention", ["q", "k", "v"], ["o"], q_num_heads=heads, kv_num_heads=heads, is_causal=1)
    graph = helper.make_graph([node], "attention_op", io[:3], io[3:])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    model.ir_version = 10
    return model


def test_ep_cuda_keeps_a_block_that_is_already_onnx_attention():
    """ONNX's Attention op runs on the CUDA EP's own flash kernel: rewritten for it, the block ran
    0.28-0.92x the op at 1-2048 keys (ONE_OP_RESULTS), so --ep cuda keeps it at every length (it was
    lowered from 1024 before); --target cuda still rewrites it."""
    import ortflash

    model = _onnx_attention_block()
    for lengths in (None, [37], [2048]):
        written, report = ortflash.optimize(model, ep="cuda", seq_lens=lengths)
        assert report.blocks[0].lowered_to is None and not report.blocks[0].fused, report.blocks[0].reason
        assert "runs natively" in report.blocks[0].reason
        assert [n.op_type for n in written.graph.node] == ["Attention"]
    _, forced = ortflash.optimize(model, target="cuda")
    assert forced.blocks[0].lowered_to is not None
