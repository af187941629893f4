"""Architectures outside the zoo (issue 12's general case; models/outside_models.py exports them,
benchmarks/results/outside_models.md has the table): the export forms they showed that the rules
did not read, each on a hand-built block or a small export in tests/data/outside/."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from attention_graphs import feeds, initializer, model_of, tensor
from onnx import helper

import ortflash
from ortflash.op import spec

DATA = Path(__file__).parent / "data" / "outside"
HEADS, HEAD_DIM = 4, 8


def run(model: onnx.ModelProto, f: dict) -> np.ndarray:
    if any(n.domain == spec.DOMAIN for n in model.graph.node):
        return ortflash.InferenceSession(model, softmax="naive").run(None, f)[0]
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {i.name: f[i.name] for i in session.get_inputs()})[0]


def per_head_block(split_scores: bool = True, alibi_rows: str = "BH", causal: bool = False) -> onnx.ModelProto:
    """Bloom's form: Q·Kᵀ per batch·head [B·H, S, T] (with an ALiBi bias of B·H rows, or one),
    viewed as [B, H, S, T] for the padding bias and the Softmax, viewed back for P·V; output
    [B·H, S, D]. split_scores False: the scores are computed 4D and only P is viewed as 3D."""
    h, d = HEADS, HEAD_DIM
    inputs = [
        tensor("q", ["B", h, "S", d]),
        tensor("k", ["B", h, "T", d]),
        tensor("v", ["B", h, "T", d]),
        tensor("alibi", ["B", h, 1, "T"] if alibi_rows == "BH" else [1, 1, "T"]),
        tensor("bias", ["B", 1, "S", "T"]),
    ]
    inits = [
        initializer("rows3", [-1, 0, 0]),
        initializer("scale", 0.35, np.float32),
        initializer("heads", [h]),
        initializer("i0", [0]),
        initializer("i1", [1]),
        initializer("i2", [2]),
        initializer("i3", [3]),
        initializer("i4", [4]),
        initializer("minus1", [-1]),
    ]
    nodes = [
        helper.make_node("Reshape", ["q", "rows3_q"], ["q3"]),
        helper.make_node("Reshape", ["k", "rows3_k"], ["k3"]),
        helper.make_node("Reshape", ["v", "rows3_v"], ["v3"]),
        helper.make_node("Transpose", ["k3"], ["kt3"], perm=[0, 2, 1]),
    ]
    # [B·H, S, D] targets from the 4D shapes (as exporters compute them): [-1, S, D]
    for x in ("q", "k", "v"):
        nodes += [
            helper.make_node("Shape", [x], [f"{x}_shape"]),
            helper.make_node("Slice", [f"{x}_shape", "i2", "i4"], [f"{x}_sd"]),
            helper.make_node("Concat", ["minus1", f"{x}_sd"], [f"rows3_{x}"], axis=0),
        ]
    nodes += [  # S and T from the shapes of Q and K, as exporters read them
        helper.make_node("Slice", ["q_shape", "i2", "i3"], ["rows"]),
        helper.make_node("Slice", ["k_shape", "i2", "i3"], ["keys"]),
    ]
    if split_scores:
        nodes += [
            helper.make_node("MatMul", ["q3", "kt3"], ["s3"]),
            helper.make_node("Mul", ["s3", "scale"], ["s3_scaled"]),
        ]
        if alibi_rows == "BH":
            nodes += [
                helper.make_node("Shape", ["alibi"], ["alibi_shape"]),
                helper.make_node("Slice", ["alibi_shape", "i2", "i4"], ["alibi_tail"]),
                helper.make_node("Concat", ["minus1", "alibi_tail"], ["alibi_target"], axis=0),
                helper.make_node("Reshape", ["alibi", "alibi_target"], ["alibi3"]),
            ]
        else:
            nodes.append(helper.make_node("Identity", ["alibi"], ["alibi3"]))
        nodes += [
            helper.make_node("Add", ["s3_scaled", "alibi3"], ["s3_biased"]),
            helper.make_node("Slice", ["q_shape", "i0", "i1"], ["batch"]),
            helper.make_node("Concat", ["batch", "heads", "rows", "keys"], ["s4_target"], axis=0),
            helper.make_node("Reshape", ["s3_biased", "s4_target"], ["s4"]),
        ]
    else:
        nodes += [
            helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
            helper.make_node("MatMul", ["q", "kt"], ["s4_raw"]),
            helper.make_node("Mul", ["s4_raw", "scale"], ["s4"]),
        ]
    if causal:  # the padding bias input replaced by where(j <= i, 0, -inf) [1, 1, S, T]
        inputs = [x for x in inputs if x.name != "bias"]
        inits += [initializer("zero", 0, np.int64), initializer("one", 1, np.int64)]
        inits += [initializer("f0", 0.0, np.float32), initializer("ninf", -np.inf, np.float32)]
        nodes += [
            helper.make_node("Squeeze", ["rows", "i0"], ["rows_n"]),
            helper.make_node("Squeeze", ["keys", "i0"], ["keys_n"]),
            helper.make_node("Range", ["zero", "rows_n", "one"], ["row_ids"]),
            helper.make_node("Range", ["zero", "keys_n", "one"], ["key_ids"]),
            helper.make_node("Unsqueeze", ["row_ids", "i1"], ["row_col"]),
            helper.make_node("Unsqueeze", ["key_ids", "i0"], ["key_row"]),
            helper.make_node("LessOrEqual", ["key_row", "row_col"], ["allowed"]),
            helper.make_node("Where", ["allowed", "f0", "ninf"], ["causal2"]),
            helper.make_node("Unsqueeze", ["causal2", "i01"], ["bias"]),
        ]
        inits.append(initializer("i01", [0, 1]))
    nodes += [
        helper.make_node("Add", ["s4", "bias"], ["s4_masked"]),
        helper.make_node("Softmax", ["s4_masked"], ["p4"], axis=-1),
        helper.make_node("Concat", ["minus1", "rows", "keys"], ["p3_target"], axis=0),
        helper.make_node("Reshape", ["p4", "p3_target"], ["p3"]),
        helper.make_node("MatMul", ["p3", "v3"], ["out"]),
    ]
    return model_of(nodes, inputs, [i for i in inits if i.name != "rows3"], opset=17)


SIZES = {"B": 2, "S": 5, "T": 7}


@pytest.mark.parametrize("target", ["ortflash", "contrib", "onnx"])
@pytest.mark.parametrize("alibi_rows", ["BH", "one"])
def test_per_head_scores_viewed_as_heads_fuse_and_compute_the_same(target: str, alibi_rows: str) -> None:
    model = per_head_block(alibi_rows=alibi_rows)
    out, report = ortflash.optimize(model, softmax="naive", target=target)
    assert report.fused == 1, report.blocks[0].reason
    block = report.blocks[0]
    assert (block.heads, block.head_dim) == (HEADS, HEAD_DIM)
    assert "Reshape(B,H)" in block.pattern and "Reshape(B·H)" in block.pattern
    assert "Softmax" not in [n.op_type for n in out.graph.node]
    if target != "ortflash":
        assert block.lowered_to, block.reason  # lowered to the native op
    f = feeds(model, SIZES, np.random.default_rng(3))
    want, got = run(model, f), run(out, f)
    assert got.shape == want.shape == (SIZES["B"] * HEADS, SIZES["S"], HEAD_DIM)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("target", ["ortflash", "contrib"])
def test_per_head_block_with_a_causal_mask_is_proved_causal(target: str) -> None:
    """The 4D view's one bias (Bloom: causal + padding) is read as is_causal: no [S, T] tensor left."""
    model = per_head_block(causal=True)
    out, report = ortflash.optimize(model, softmax="naive", target=target)
    assert report.fused == 1
    assert report.blocks[0].reason.startswith("causal (is_causal=1"), report.blocks[0].reason
    if target == "ortflash":  # the causal subgraph is gone (contrib writes its own where Sq != Sk)
        assert "LessOrEqual" not in [n.op_type for n in out.graph.node]
        (node,) = [n for n in out.graph.node if n.domain == spec.DOMAIN]
        assert helper.get_node_attr_value(node, "is_causal") == 1
    f = feeds(model, SIZES, np.random.default_rng(5))
    np.testing.assert_allclose(run(out, f), run(model, f), rtol=1e-4, atol=1e-5)


def test_probabilities_viewed_as_rows_without_split_scores_stay() -> None:
    """P reshaped to [B·H, S, T] while the scores were computed 4D: not the per-head form."""
    out, report = ortflash.optimize(per_head_block(split_scores=False), softmax="naive", target="ortflash")
    assert report.fused == 0
    assert "not split" in report.blocks[0].reason


# ------------------------------------------------------------- small exports (tests/data/outside)


def _report(name: str, target: str = "ortflash") -> ortflash.Report:
    return ortflash.optimize(DATA / name, softmax="naive", target=target)[1]


def _causal(report: ortflash.Report) -> int:
    return sum(1 for b in report.blocks if b.fused and b.reason.startswith("causal (is_causal="))


def test_gptj_partial_rotary_heads_and_causal_mask_are_proved() -> None:
    """GPT-J (TorchScript): Q and K are Concat(rotary half, pass-through half) of a head split
    reshaped from runtime shapes, the sin/cos tables Tiled: heads, head dim and causality proved,
    so contrib lowers both blocks (before: "head counts not static", "not proved causal")."""
    report = _report("gptj_eager_torchscript.onnx", "contrib")
    assert report.fused == 2
    assert [(b.heads, b.head_dim) for b in report.blocks] == [(4, 16), (4, 16)]
    assert [b.lowered_to for b in report.blocks] == ["com.microsoft.MultiHeadAttention"] * 2
    assert _causal(report) == 2


def test_phi3_second_layer_mask_is_proved_causal() -> None:
    """Phi-3 (TorchScript): the second layer's scores reach the inputs through RMSNorm's
    ReduceMean and a gated MLP whose halves shape inference leaves unnamed; before, only layer 0
    was proved causal, and the head dim (a Concat with an empty pass-through slice) was unknown."""
    report = _report("phi3_eager_torchscript.onnx")
    assert report.fused == 2
    assert _causal(report) == 2
    assert [b.head_dim for b in report.blocks] == [16, 16]


def test_clip_position_table_cut_to_the_sequence_is_proved_causal() -> None:
    """CLIP text (sdpa, TorchScript): embeddings + position_table[:, :seq]; the sum's length is
    seq wherever the graph runs, so the causal mask's rows are the scores' rows."""
    report = _report("clip_text_sdpa_torchscript.onnx")
    assert report.fused == 2
    assert _causal(report) == 2


def test_decoder_with_cache_and_no_padding_mask_is_proved_causal() -> None:
    """BART decoder step with a self-attention cache and no decoder mask: the padding lookup
    indexes a flattened [B, past + new] all-ones mask at b * (past + new) + j; the self block
    is bottom-right causal, the cross block has no causal mask (its encoder padding, expanded
    over the queries, is fed as [B, 1, 1, Sk])."""
    report = _report("bart_decoder_cache_eager_torchscript.onnx")
    assert report.fused == 2
    assert [b.reason.split(",")[0] for b in report.blocks] == [
        "causal (is_causal=2",
        "the bias is constant over the queries: fed as ['batch'",
    ]


def test_small_exports_verify_on_their_own_inputs() -> None:
    """The rewritten exports compute what the originals compute (random inputs, padded batch)."""
    for name in ("gptj_eager_torchscript.onnx", "clip_text_sdpa_torchscript.onnx"):
        model, report = ortflash.optimize(DATA / name, softmax="naive", target="contrib")
        result = ortflash.verify(DATA / name, model, seq_len=9, batch=2)
        assert result.ok, (name, result)
