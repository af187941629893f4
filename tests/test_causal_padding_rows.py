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
