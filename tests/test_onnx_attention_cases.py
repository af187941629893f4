"""Issue 22 item 5: ONNX's own Attention test cases (the generators the onnx package ships).

Attention-25's sliding window (left_window_size / right_window_size), a rank-1 attn_mask and a
mask over fewer keys than past + new are ONNX's rules that ONNX Runtime 1.31 does not run: the
rewrite writes them as FlashAttention masks, checked here against ONNX's reference outputs.
benchmarks/onnx_attention_cases.py runs every case and lists each one not run as FlashAttention.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
import onnx_attention_cases as cases  # noqa: E402

ALL = {c.name: c for c in cases.attention_cases()}
# ONNX's rules that ONNX Runtime 1.31 refuses to run, now rewritten
NEWLY_FUSED = [
    "test_attention_3d_local_window",
    "test_attention_bidirectional_window",
    "test_attention_local_window",
    "test_attention_local_window_default",
    "test_attention_local_window_ext_cache_float16_mask",
    "test_attention_local_window_ext_cache_rank2_mask",
    "test_attention_local_window_ext_cache_rank3_head_mask",
    "test_attention_local_window_ext_cache_rank4_batch_mask",
    "test_attention_local_window_rank1_boolean_mask",
    "test_attention_local_window_with_past",
    "test_attention_4d_diff_heads_mask4d_padded_kv",
]


def test_onnx_ships_the_cases_counted() -> None:
    assert len(ALL) == 186 and sum(name.endswith("_expanded") for name in ALL) == 93


@pytest.mark.parametrize("name", NEWLY_FUSED)
def test_onnx_rules_ort_does_not_run_are_fused_and_match_onnx_reference(name: str) -> None:
    result = cases.run_case(ALL[name])
    assert not result.ort_runs  # ONNX Runtime refuses the original: the reference is ONNX's
    assert result.ok, result.reason
    assert result.fused_nodes == 1


def test_a_window_is_written_as_a_mask_that_differs_from_no_window() -> None:
    """The reference outputs are not those of the same node without its window."""
    import ortflash

    case = ALL["test_attention_local_window"]
    fused, _ = ortflash.optimize(case.model, target="ortflash")
    feeds = cases._feeds(case)
    got = ortflash.InferenceSession(fused).run(None, feeds)[0]
    expected = np.asarray(case.data_sets[0][1][0])
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    unwindowed = case.model.__deepcopy__()
    node = unwindowed.graph.node[0]
    kept = [a for a in node.attribute if a.name not in ("left_window_size", "right_window_size")]
    del node.attribute[:]
    node.attribute.extend(kept)
    plain = ortflash.InferenceSession(ortflash.optimize(unwindowed, target="ortflash")[0]).run(None, feeds)[0]
    assert np.abs(plain - expected).max() > 1e-2


@pytest.mark.parametrize(
    "name",
    ["test_attention_4d_with_qk_matmul_softmax", "test_attention_4d_with_qk_matmul_softmax_expanded"],
)
def test_a_case_asking_for_the_score_matrix_stays_with_its_reason(name: str) -> None:
    result = cases.run_case(ALL[name])
    assert result.ort_runs and not result.ok
    assert "qk_matmul_output" in result.reason or "is read by Identity, MatMul" in result.reason


@pytest.mark.parametrize(
    ("name", "is_causal", "window"),
    [("test_attention_local_window", 1, (2, -1)), ("test_attention_bidirectional_window", 0, (1, 2))],
)
def test_a_window_without_a_past_is_the_ops_own(name: str, is_causal: int, window: tuple[int, int]) -> None:
    """Without a past ONNX's query position is the op's: the window is FlashAttention's own
    (tiles outside the band skipped), not a mask tensor."""
    import ortflash
    from ortflash.op.node import node_attributes

    fused, _ = ortflash.optimize(ALL[name].model, target="ortflash")
    (node,) = [n for n in fused.graph.node if n.op_type == "FlashAttention"]
    attrs = node_attributes(node)
    assert (attrs["is_causal"], attrs["window_left"], attrs["window_right"]) == (is_causal, *window)
    producers = {o: n.op_type for n in fused.graph.node for o in n.output}
    assert producers.get(node.input[4]) in (None, "Constant")  # no mask computed from the window
