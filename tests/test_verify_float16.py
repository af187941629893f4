"""Verify's default tolerance follows the precision a model computes in, not only its outputs' type:
a model converted to float16 with its inputs and outputs kept float32 (onnxruntime.transformers.float16
with keep_io_types, the converter's usual use) rounds in float16, so a right rewrite of it is about
1e-3 from it, beyond float32's atol 1e-5. On 88 such conversions of held-out exports (2026-12-03), 43
`--target cuda --verify` runs failed at the float32 tolerance and 36 of them passed at float16's."""

from __future__ import annotations

import numpy as np
import onnx
from onnxruntime.transformers import float16
from test_verify_noise import normalized_block

import ortflash
from ortflash.checks.compare import FLOAT16_TOLERANCE, FLOAT32_TOLERANCE, computes_in_float16, default_tolerance
from ortflash.cli import main


def _float16_inside(model: onnx.ModelProto) -> onnx.ModelProto:
    return float16.convert_float_to_float16(model, keep_io_types=True)


def test_a_float16_model_with_float32_outputs_takes_the_float16_tolerance() -> None:
    model = normalized_block(0.0, skip=False)
    half = _float16_inside(model)
    assert {o.type.tensor_type.elem_type for o in half.graph.output} == {onnx.TensorProto.FLOAT}
    assert not computes_in_float16(model) and default_tolerance(model) == FLOAT32_TOLERANCE
    assert computes_in_float16(half) and default_tolerance(half) == FLOAT16_TOLERANCE


def test_a_float16_value_inside_a_subgraph_counts() -> None:
    model = normalized_block(0.0, skip=False)
    cast = onnx.helper.make_node("Cast", ["x"], ["x16"], to=onnx.TensorProto.FLOAT16)
    branch = onnx.helper.make_graph(
        [cast, onnx.helper.make_node("Cast", ["x16"], ["x32"], to=onnx.TensorProto.FLOAT)],
        "branch",
        [],
        [onnx.helper.make_tensor_value_info("x32", onnx.TensorProto.FLOAT, None)],
    )
    cond = onnx.numpy_helper.from_array(np.array(True), "cond")
    model.graph.initializer.append(cond)
    model.graph.node.append(onnx.helper.make_node("If", ["cond"], ["unused"], then_branch=branch, else_branch=branch))
    assert computes_in_float16(model)


def test_verify_checks_a_float16_model_with_float32_outputs_at_the_float16_tolerance(tmp_path, capsys) -> None:
    """ortflash optimize --verify on the float16-inside block: the tolerance in force is float16's."""
    src = tmp_path / "half.onnx"
    onnx.save(_float16_inside(normalized_block(0.0, skip=False)), src)
    out = tmp_path / "out.onnx"
    assert main(["optimize", str(src), "-o", str(out), "--target", "contrib", "--verify"]) == 0
    printed = capsys.readouterr().out
    assert f"rtol {FLOAT16_TOLERANCE[0]:g}, atol {FLOAT16_TOLERANCE[1]:g}" in printed


def test_the_noise_of_a_float16_model_is_its_float16_rounding() -> None:
    """The ill-conditioned block (tests/test_verify_noise.py) converted to float16 inside: its float64
    reference is widened from float16 too, so its own noise is its float16 rounding (before, the
    "float64" copy kept its float16 weights and casts, computed as the original did, and found none),
    and the ortflash rewrite, which computes in float32, verifies within it."""
    half = _float16_inside(normalized_block(100.0, skip=False))
    fused, _ = ortflash.optimize(half, target="ortflash")
    result = ortflash.verify(half, fused)
    assert (result.rtol, result.atol) == FLOAT16_TOLERANCE
    assert result.noise.get("y", 0.0) > FLOAT16_TOLERANCE[1], result.noise
    assert result.ok
