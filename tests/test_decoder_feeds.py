"""Issue 22 item 2: verify with no feeds makes a decoder's inputs from what its graph says of their dims.

A transformers 5.x dynamo export of a decoder with a cache names its attention mask with symbols of
its own ([s43, s53], where the batch is s10 and the keys past + new, s70 + s15): the mask is read by
a GatherND over Range(batch) x Range(past + new), and a mask of another shape makes ONNX Runtime
fail ("GatherND ... invalid index"). The fixtures are the smallest graphs of that form, made here.
"""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import ortflash
from ortflash.checks.feeds import decoder_cases, make_feeds
from ortflash.checks.input_dims import tied_dims
from ortflash.cli import main

HEADS, HEAD_DIM = 2, 8


def _int(name: str, value: object) -> onnx.TensorProto:
    return onnx.numpy_helper.from_array(np.asarray(value, np.int64), name)


def dynamo_mask_decoder(positions: bool = False) -> onnx.ModelProto:
    """One cached attention block: q [s10, H, s15, D] over past_key/past_value [s10, H, s70, D] and
    itself, under a padding mask [s43, s53] read as dynamo writes it: GatherND(mask, indices) with
    indices [B, T, 2] over Range(batch) and Range(past + new). ``positions``: a position_ids
    [s10, s15] input added to the queries (rotary-free), whose values must be past .. past + new - 1."""
    f = TensorProto.FLOAT
    inputs = [
        helper.make_tensor_value_info("q", f, ["s10", HEADS, "s15", HEAD_DIM]),
        helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["s43", "s53"]),
        helper.make_tensor_value_info("past_key", f, ["s10", HEADS, "s70", HEAD_DIM]),
        helper.make_tensor_value_info("past_value", f, ["s10", HEADS, "s70", HEAD_DIM]),
    ]
    nodes = [
        helper.make_node("Concat", ["past_key", "q"], ["key"], axis=2),
        helper.make_node("Concat", ["past_value", "q"], ["value"], axis=2),
        helper.make_node("Shape", ["past_key"], ["batch_1d"], start=0, end=1),
        helper.make_node("Shape", ["past_key"], ["past_1d"], start=2, end=3),
        helper.make_node("Shape", ["q"], ["new_1d"], start=2, end=3),
        helper.make_node("Squeeze", ["batch_1d"], ["batch"]),
        helper.make_node("Add", ["past_1d", "new_1d"], ["total_1d"]),
        helper.make_node("Squeeze", ["total_1d"], ["total"]),
        helper.make_node("Range", ["zero", "batch", "one"], ["batch_idx"]),
        helper.make_node("Range", ["zero", "total", "one"], ["key_idx"]),
        helper.make_node("Unsqueeze", ["batch_idx", "axis1"], ["batch_col"]),  # [B, 1]
        helper.make_node("Unsqueeze", ["key_idx", "axis0"], ["key_row"]),  # [1, T]
        helper.make_node("Max", ["batch_col", "key_row"], ["grid"]),
        helper.make_node("Shape", ["grid"], ["grid_shape"]),
        helper.make_node("Expand", ["batch_col", "grid_shape"], ["b_grid"]),
        helper.make_node("Expand", ["key_row", "grid_shape"], ["k_grid"]),
        helper.make_node("Unsqueeze", ["b_grid", "last"], ["b_last"]),
        helper.make_node("Unsqueeze", ["k_grid", "last"], ["k_last"]),
        helper.make_node("Concat", ["b_last", "k_last"], ["indices"], axis=-1),  # [B, T, 2]
        helper.make_node("Cast", ["attention_mask"], ["mask_bool"], to=TensorProto.BOOL),
        helper.make_node("GatherND", ["mask_bool", "indices"], ["keep"]),  # [B, T]
        helper.make_node("Unsqueeze", ["keep", "axes12"], ["keep4"]),  # [B, 1, 1, T]
        helper.make_node("Where", ["keep4", "zero_f", "lowest"], ["bias"]),
        helper.make_node("Transpose", ["key"], ["key_t"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "key_t"], ["s0"]),
        helper.make_node("Mul", ["s0", "scale"], ["s1"]),
        helper.make_node("Add", ["s1", "bias"], ["s2"]),
        helper.make_node("Softmax", ["s2"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "value"], ["out"]),
    ]
    inits = [
        _int("zero", 0),
        _int("one", 1),
        _int("axis0", [0]),
        _int("axis1", [1]),
        _int("last", [-1]),
        _int("axes12", [1, 2]),
        onnx.numpy_helper.from_array(np.array(0.0, np.float32), "zero_f"),
        onnx.numpy_helper.from_array(np.array(np.finfo(np.float32).min, np.float32), "lowest"),
        onnx.numpy_helper.from_array(np.array(HEAD_DIM**-0.5, np.float32), "scale"),
    ]
    outputs = [helper.make_tensor_value_info("out", f, None)]
    if positions:
        # position_ids beyond the cache are out of the table's range: a Gather into a table of
        # past + new rows only works where the positions continue the cache
        inputs.append(helper.make_tensor_value_info("position_ids", TensorProto.INT64, ["s10", "s15"]))
        nodes += [
            helper.make_node("Range", ["zero", "total", "one"], ["table_rows"]),
            helper.make_node("Cast", ["table_rows"], ["table"], to=TensorProto.FLOAT),
            helper.make_node("Gather", ["table", "position_ids"], ["picked"]),
            helper.make_node("ReduceMax", ["picked"], ["last_position"], keepdims=0),
            helper.make_node("Cast", ["total"], ["total_f"], to=TensorProto.FLOAT),
            helper.make_node("Sub", ["total_f", "last_position"], ["after_last"]),
        ]
        outputs.append(helper.make_tensor_value_info("after_last", f, None))
    graph = helper.make_graph(nodes, "dynamo_mask_decoder", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    return model


def test_the_graph_ties_the_masks_own_symbols_to_the_batch_and_past_plus_new() -> None:
    tied = {
        name: [(atom[1], coef) for atom, coef in lin.coeffs] for name, lin in tied_dims(dynamo_mask_decoder()).items()
    }
    assert tied == {"s43": [("s10", 1)], "s53": [("s15", 1), ("s70", 1)]}


def test_each_case_gets_a_mask_of_batch_by_past_plus_new() -> None:
    model = dynamo_mask_decoder()
    cases = decoder_cases(model, seq_len=16, batch=2)
    shapes = [{k: list(v.shape) for k, v in make_feeds(model, seq_len=16, batch=2, dims=d).items()} for _, d in cases]
    assert [s["attention_mask"] for s in shapes] == [[2, 16], [2, 17]]
    assert [s["q"] for s in shapes] == [[2, HEADS, 16, HEAD_DIM], [2, HEADS, 1, HEAD_DIM]]
    assert [s["past_key"] for s in shapes] == [[2, HEADS, 0, HEAD_DIM], [2, HEADS, 16, HEAD_DIM]]


def test_a_cache_position_of_its_own_length_counts_the_new_tokens() -> None:
    model = dynamo_mask_decoder()
    model.graph.input.append(helper.make_tensor_value_info("cache_position", TensorProto.INT64, ["s99"]))
    shapes = [make_feeds(model, seq_len=16, batch=2, dims=d)["cache_position"] for _, d in decoder_cases(model)]
    np.testing.assert_array_equal(shapes[0], np.arange(16))  # prefill: positions 0 .. 15
    np.testing.assert_array_equal(shapes[1], [16])  # decode: the one new token, after 16 cached


def test_position_ids_continue_the_cache() -> None:
    model = dynamo_mask_decoder(positions=True)
    _, decode = decoder_cases(model, seq_len=16, batch=2)[1]
    feeds = make_feeds(model, seq_len=16, batch=2, dims=decode)
    np.testing.assert_array_equal(feeds["position_ids"], [[16], [16]])
    outputs = ortflash.InferenceSession(model).run(None, feeds)
    assert float(outputs[1]) == 1.0  # the last position is the last key's


@pytest.mark.parametrize("positions", [False, True])
def test_verify_with_no_feeds_passes_in_prefill_and_decode(positions: bool) -> None:
    model = dynamo_mask_decoder(positions)
    fused, _ = ortflash.optimize(model, target="ortflash")
    assert sum(n.op_type == "FlashAttention" for n in fused.graph.node) == 1
    result = ortflash.verify(model, fused)
    assert result.ok
    assert [run.inputs["attention_mask"] for run in result.runs[:2]] == [[2, 16], [2, 17]]
    assert [run.key_lengths for run in result.runs[:2]] == [
        {n.name: 16 for n in fused.graph.node if n.op_type == "FlashAttention"},
        {n.name: 17 for n in fused.graph.node if n.op_type == "FlashAttention"},
    ]


def test_cli_optimize_verify_with_no_feeds_exits_0(tmp_path) -> None:
    path = str(tmp_path / "decoder.onnx")
    onnx.save(dynamo_mask_decoder(), path)
    assert main(["optimize", path, "--target", "ortflash", "--verify", "-q", "-o", str(tmp_path / "o.onnx")]) == 0


ZOO = os.path.join(os.path.dirname(__file__), "..", "models")


def _own_mask_symbols(path: str) -> onnx.ModelProto:
    """A zoo dynamo export with its mask's batch named on its own and s-style names elsewhere, as a
    dynamo export with automatic dims writes them ([s43, s53] where the batch is s10)."""
    model = onnx.load(path)
    renamed = {"batch": "s10", "seq": "s15", "past": "s70"}
    for vi in [*model.graph.input, *model.graph.output, *model.graph.value_info]:
        for axis, d in enumerate(vi.type.tensor_type.shape.dim):
            if vi.name == "attention_mask" and axis == 0:
                d.dim_param = "s43"
            elif d.dim_param:
                d.dim_param = " + ".join(renamed.get(t, t) for t in d.dim_param.split(" + "))
    return model


@pytest.mark.parametrize("name", ["gpt2_cache_sdpa_dynamo", "llama_cache_eager_dynamo"])
def test_zoo_dynamo_decoder_with_its_own_mask_symbols_verifies_with_no_feeds(name: str) -> None:
    """GPT-2 views the mask to [batch, -1] before its GatherND; Llama reads it directly."""
    model = _own_mask_symbols(os.path.join(ZOO, f"{name}.onnx"))
    assert [d.dim_param for d in model.graph.input[1].type.tensor_type.shape.dim] == ["s43", "s53"]
    fused, _ = ortflash.optimize(model, target="ortflash")
    result = ortflash.verify(model, fused)
    assert result.ok
    assert [run.inputs["attention_mask"] for run in result.runs[:2]] == [[2, 16], [2, 17]]
    assert [run.inputs["input_ids"] for run in result.runs[:2]] == [[2, 16], [2, 1]]
