"""An If on the length past the longest run a model takes never takes its fused side, and costs at
every length (pipeline/length_reach.py): such a block keeps its original ops, with why."""

from collections import Counter
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import ortflash
from ortflash.pipeline.length_reach import LengthReach

MODELS = Path(__file__).resolve().parents[1] / "models"


def _positions_model(rows: int, scores: bool = False) -> onnx.ModelProto:
    """x [1, S, 8] + table[Range(0, S)]: a learned position table of ``rows`` rows stops every run
    past ``rows`` tokens; ``scores`` adds x x^T, an [1, S, S] tensor (the run's size grows as S^2)."""
    table = numpy_helper.from_array(np.ones((rows, 8), np.float32), "table")
    consts = [
        numpy_helper.from_array(np.array(0, np.int64), "zero"),
        numpy_helper.from_array(np.array(1, np.int64), "one"),
    ]
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "one"], ["length"], axis=0),
        helper.make_node("Range", ["zero", "length", "one"], ["positions"]),
        helper.make_node("Gather", ["table", "positions"], ["pe"], axis=0),
        helper.make_node("Add", ["x", "pe"], ["y"]),
    ]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "S", 8])]
    if scores:
        nodes += [
            helper.make_node("Transpose", ["y"], ["yt"], perm=[0, 2, 1]),
            helper.make_node("MatMul", ["y", "yt"], ["s"]),
        ]
        outputs.append(helper.make_tensor_value_info("s", TensorProto.FLOAT, [1, "S", "S"]))
    graph = helper.make_graph(
        nodes,
        "positions",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "S", 8])],
        outputs,
        [table, *consts],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_a_position_table_stops_runs_past_its_rows() -> None:
    reach = LengthReach(_positions_model(64))
    assert reach.stops_before(64) is None
    stop = reach.stops_before(65)
    assert stop is not None and "could not run the original model" in stop, stop


def test_a_model_that_stops_at_the_short_length_too_is_not_read_as_length_bound() -> None:
    # fails at 16 keys already: whatever stops it, it is not a length reached at 512
    assert LengthReach(_positions_model(8)).stops_before(512) is None


def test_a_run_over_the_load_checks_budget_is_not_made() -> None:
    reach = LengthReach(_positions_model(64, scores=True))
    assert reach.stops_before(128) is not None  # small: run, and stopped by the table
    assert reach.stops_before(8192) is None  # [1, 8192, 8192] float32 is 256 MiB: not run, If kept


def test_the_default_writes_no_if_where_the_model_stops_before_the_crossover() -> None:
    """The zoo's BERT has 128 positions (its token_type_ids buffer, Expanded to the length): the
    AVX-512 table's padding row switches at 512 keys, which no run reaches. Before, each block was an
    If that always took the original ops (0.94-0.97x the original at S = 16-128 on a Zen 4)."""
    path = MODELS / "bert_eager_torchscript.onnx"
    model, report = ortflash.optimize(path, online_softmax=True, cpu_class="avx512")
    assert len(report.blocks) == 2 and report.fused == 0, [b.reason for b in report.blocks]
    for block in report.blocks:
        assert block.reason == "the original ops: the model does not run at 512 keys, where the fused form would start"
        assert "invalid expand shape" in block.detail and block.fused_from is None, block.detail
        assert block.mask_kind == "padding"  # what the proof read stays on the row
    ops = Counter(n.op_type for n in model.graph.node)
    assert ops == Counter(n.op_type for n in onnx.load(path).graph.node), ops
    # --seq-lens names the lengths: no If, no run needed, the table decides at them
    _, given = ortflash.optimize(path, online_softmax=True, cpu_class="avx512", seq_lens=[128])
    assert all("does not run" not in b.reason for b in given.blocks)


def test_a_model_of_two_lengths_keeps_its_ifs_where_one_length_runs_that_long() -> None:
    """Optimum's tiny Whisper decoder: its 64 positions stop the decoder's tokens, not the encoder's
    frames that the cross-attention's keys follow. The reading does not tell which length a block's
    keys follow, so one length that runs 128 long keeps both Ifs (before the per-length runs, the
    cross-attention's If was dropped with the self-attention's)."""
    path = Path(__file__).resolve().parent / "data" / "outside" / "optimum_whisper_decoder_with_past_model.onnx"
    model, report = ortflash.optimize(path, online_softmax=True, cpu_class="avx512")
    assert [b.fused_from for b in report.blocks] == [128, 128], [b.reason for b in report.blocks]
    assert sum(n.op_type == "If" for n in model.graph.node) == 2
