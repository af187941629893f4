"""A model at an IR version newer than ONNX Runtime reads (onnx 1.23's make_model writes 14, ONNX
Runtime 1.31 reads 13) is written at the version it loads, with the note, whether or not it has a
block to fuse (issue 33 item 6).

Seen before: with nothing to fuse, "ONNX Runtime could not load the input model", exit 2; with a
block, written at IR 13, exit 0."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from attention_graphs import projected_block
from onnx import TensorProto, helper

from ortflash.cli import main


def relu_model() -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def block_model() -> onnx.ModelProto:
    model = projected_block("Identity", opset=17)
    model.ir_version = onnx.IR_VERSION
    return model


@pytest.mark.parametrize("make", [relu_model, block_model], ids=["nothing_to_fuse", "one_block"])
def test_an_ir_14_model_is_written_at_13_with_the_note(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], make
) -> None:
    model = make()
    assert model.ir_version == 14
    src, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(model, src)
    assert main(["optimize", str(src), "-o", str(out)]) == 0  # the default target, as the user ran it
    assert "IR version 14 stamped 13" in capsys.readouterr().out
    written = onnx.load(out)
    assert written.ir_version == 13
    if make is relu_model:  # the same graph, loadable in plain ONNX Runtime
        assert written.graph == model.graph
        session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
        x = np.array([[-1.0, 0.5, -2.0, 3.0]], np.float32)
        np.testing.assert_array_equal(session.run(None, {"x": x})[0], np.maximum(x, 0))
