"""A block proved causal with a padding part is a 'causal_padding' row (which a table without a row of
its own reads as 'causal': forms.REFINED_KINDS), not a 'bias' one.

The proof writes the padding part as a sliced look-up of the mask (fusion/causal/write); the rank
of a Slice was unknown to graph/ir_utils.rank, so the row's query-axis reading took the 2-D mask's
batch axis for a query axis and called the block 'bias', which the cost table never fuses: 36 of
the zoo's blocks (every KV-cache decoder) were kept by the default although they were proved
causal. Found by benchmarks/expanded_mask_counts.py (issue 30 item 3's before counts)."""

from __future__ import annotations

from pathlib import Path

import pytest

import ortflash
from ortflash.pipeline import forms

MODELS = Path(__file__).resolve().parents[1] / "models"


@pytest.mark.parametrize(
    "name",
    [
        "gpt2_cache_eager_dynamo",
        "llama_cache_sdpa_torchscript",
        "qwen2_cache_eager_torchscript",
        "mistral_cache_sdpa_dynamo",
    ],
)
def test_a_kv_cache_decoders_causal_blocks_are_causal_rows(name: str) -> None:
    _, report = ortflash.optimize(MODELS / f"{name}.onnx", target="ortflash", online_softmax=True)
    assert [b.mask_kind for b in report.blocks] == ["causal_padding", "causal_padding"]
    assert forms.parent_kind("causal_padding") == "causal"
    assert all("causal" in b.mask and "padding" in b.mask for b in report.blocks)


def test_t5s_position_bias_stays_a_bias_row() -> None:
    _, report = ortflash.optimize(MODELS / "t5_eager_torchscript.onnx", target="ortflash", online_softmax=True)
    assert [b.mask_kind for b in report.blocks].count("bias") >= 2


OUTSIDE = Path(__file__).resolve().parent / "data" / "outside"


@pytest.mark.parametrize(
    "name",
    [
        # MPT: the ALiBi table [1, H, 1, max] sliced to the keys; the padding part written by the proof
        # (a Not of the [B, 1, 1, Sk] look-up) has a rank and no inferred dims
        "mpt_eager_torchscript",
        # the dynamo export's slice of the table: a query axis of 1 - Max(0, 1 - seq), one row
        "mpt_eager_dynamo",
        # BLOOM: ALiBi [B·H, 1, Sk] through baddbmm, viewed as [B, H, 1, Sk] by fusion's own Reshape
        "bloom_eager_torchscript",
    ],
)
def test_an_alibi_bias_beside_a_proved_causal_mask_is_a_causal_padding_row(name: str) -> None:
    """ALiBi is constant over the queries: with the causal mask proved, such a block reads the causal
    row, not the full-bias one (which keeps the block's ops on the AVX2 table at every length). Before,
    the row's query-axis reading stopped at a rank without dims, at a Reshape and at a Slice: 'bias'."""
    _, report = ortflash.optimize(OUTSIDE / f"{name}.onnx", target="ortflash", online_softmax=True)
    assert [b.mask_kind for b in report.blocks] == ["causal_padding", "causal_padding"], [
        b.reason for b in report.blocks
    ]
    _, default = ortflash.optimize(OUTSIDE / f"{name}.onnx", online_softmax=True, cpu_class="avx2")
    reasons = [b.reason for b in default.blocks]
    # the row's crossover is where the If switches, in an export that runs that long (BLOOM's ALiBi
    # has no table); MPT's tiny export stops before it (its position table), so no If is written
    assert all("original ops below" in r or "does not run at" in r for r in reasons), reasons
    assert [b.mask_kind for b in default.blocks] == ["causal_padding", "causal_padding"], reasons
    assert forms.crossover("online", 4, "causal", cpu_class="avx2") is not None
    assert forms.crossover("online", 4, "bias", cpu_class="avx2") is None  # what the 'bias' row said
