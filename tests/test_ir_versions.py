"""IR versions (ortflash/pipeline/ir_versions.py, issue 22 item 5): onnx 1.23's make_model stamps IR 14,
which ONNX Runtime 1.31 does not open; such a model is stamped with the IR version ONNX Runtime
loads where nothing in it needs a newer one, and refused, naming what needs it, where something does."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import ortflash
from ortflash.errors import OrtflashError
from ortflash.pipeline.ir_versions import ir_version_onnxruntime_loads, least_ir_version, stamp_loadable_ir_version
from ortflash.pipeline.optimize import optimize


def model_with(nodes: list | None = None, inits: list | None = None, value_info: list | None = None) -> onnx.ModelProto:
    """x -> Relu -> y, plus nodes and initializers, stamped by make_model (IR onnx.IR_VERSION)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"]), *(nodes or [])], "g", [x], [y], inits or [])
    graph.value_info.extend(value_info or [])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def opens(model: onnx.ModelProto) -> bool:
    try:
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception:  # noqa: BLE001
        return False
    return True


def test_onnx_runtime_loads_ir_13_at_most_and_make_model_writes_14():
    # pinned: an upgrade of either changes what the stamping has to do, and fails here first
    assert (ort.__version__.startswith("1.31"), onnx.__version__.startswith("1.23")) == (True, True)
    assert ir_version_onnxruntime_loads() == 13
    assert model_with().ir_version == 14 and not opens(model_with())


def test_a_model_that_needs_nothing_newer_is_stamped_13_and_computes_the_same():
    model = model_with()
    stamped, note = stamp_loadable_ir_version(model)
    assert stamped.ir_version == 13 and model.ir_version == 14  # the input is not modified
    assert (
        note
        == f"IR version 14 stamped 13, the newest ONNX Runtime {ort.__version__} loads (the model needs no newer one)"
    )
    x = np.array([[-1.0, 2.0, -3.0], [4.0, -5.0, 6.0]], np.float32)
    session = ort.InferenceSession(stamped.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(session.run(None, {"x": x})[0], np.maximum(x, 0))
    assert stamped.graph == model.graph


def test_a_model_already_loadable_comes_back_as_it_is():
    model = model_with()
    model.ir_version = 10
    assert stamp_loadable_ir_version(model) == (model, None)


def _in_if_branch(nodes: list) -> onnx.NodeProto:
    out = helper.make_tensor_value_info("b", TensorProto.FLOAT, [2, 3])
    branch = helper.make_graph(nodes, "branch", [], [out])
    return helper.make_node("If", ["c"], ["b_out"], then_branch=branch, else_branch=branch)


NEEDS = {
    "node metadata (ortflash's block ids)": (
        lambda: _with_node_metadata(model_with()),
        10,
        "metadata on node Relu in graph g",
    ),
    "a float8 initializer": (
        lambda: model_with(inits=[helper.make_tensor("w8", TensorProto.FLOAT8E4M3FN, [1], [1.0])]),
        9,
        "FLOAT8E4M3FN in initializer w8",
    ),
    "a Cast to float4 in an If branch": (
        lambda: model_with([_in_if_branch([helper.make_node("Cast", ["x"], ["b"], to=TensorProto.FLOAT4E2M1)])]),
        11,
        "FLOAT4E2M1 in attribute to of node Cast in graph branch",
    ),
    "an int2 value": (
        lambda: model_with(value_info=[helper.make_tensor_value_info("i2", TensorProto.INT2, [2])]),
        13,
        "INT2 in value i2 in graph g",
    ),
    "a float6 constant": (
        lambda: model_with(
            [
                helper.make_node(
                    "Constant", [], ["c6"], value=helper.make_tensor("t", TensorProto.FLOAT6E2M3, [1], [1.0])
                )
            ]
        ),
        14,
        "FLOAT6E2M3 in attribute value of node Constant in graph g",
    ),
}


def _with_node_metadata(model: onnx.ModelProto) -> onnx.ModelProto:
    model.graph.node[0].metadata_props.add(key="ortflash.block", value="Softmax_0")
    return model


@pytest.mark.parametrize("case", sorted(NEEDS))
def test_what_a_model_uses_sets_the_least_ir_version(case):
    make, version, what = NEEDS[case]
    assert least_ir_version(make()) == (version, what)


def test_a_model_that_needs_a_newer_ir_version_is_refused_with_the_reason():
    make, _, what = NEEDS["a float6 constant"]
    with pytest.raises(
        OrtflashError, match=r"loads IR version 13 at most, and the model needs IR version 14 \(FLOAT6E2M3"
    ):
        stamp_loadable_ir_version(make())


def test_the_least_version_needed_is_kept_below_the_stamp():
    model = _with_node_metadata(model_with())
    stamped, note = stamp_loadable_ir_version(model)
    assert stamped.ir_version == 13 and note is not None and "needs 10 (metadata on node Relu" in note
    assert opens(stamped)
    assert least_ir_version(model_with()) == (3, "opset imports")


def test_optimize_stamps_what_it_writes_loadable_and_says_so(tmp_path):
    """An input stamped IR 14 (onnx 1.23's make_model) that fuses: the written model is stamped
    13, loads in ONNX Runtime, and the report's notes say why; the CLI exits 0."""
    import subprocess
    import sys

    from attention_graphs import Variant, build

    model = build(Variant())
    model.ir_version = 14
    path = tmp_path / "ir14.onnx"
    onnx.save(model, path)
    out, report = optimize(path, target="ortflash")
    assert out.ir_version == 13 and any("IR version 14 stamped 13" in n for n in report.notes), report.notes
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "ortflash",
            "optimize",
            str(path),
            "--target",
            "ortflash",
            "-o",
            str(tmp_path / "o.onnx"),
        ],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr
    assert onnx.load(tmp_path / "o.onnx").ir_version == 13
    ort.InferenceSession(str(tmp_path / "o.onnx"), ortflash.session_options(), providers=["CPUExecutionProvider"])
