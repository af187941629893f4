"""Issue 22 item 3: verify knows the model's own numerical noise.

An attention block whose output projection has a large common part (every weight near 100) feeds a
LayerNormalization (or ONNX Runtime's SkipLayerNormalization, as the Whisper encoder graph of ORT's
fusion tests): the normalization cancels that common part, and the last float32 digits of the sum
become the output's. The original itself is then about 2e-3 from its float64 result, and a correct
rewrite (FlashAttention, or ORT's own MultiHeadAttention under --target contrib) about 1e-3 from
the original: 100x atol 1e-5. The same block with plain weights is within 1e-6 of its float64
result, and keeps its tolerance: a rewrite off by less than the ill-conditioned block's noise
still fails there.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from attention_graphs import tamper_scale
from onnx import TensorProto, helper

import ortflash
from ortflash.checks.compare import NOISE_FACTOR
from ortflash.cli import main

WIDTH, HEADS = 64, 4


def normalized_block(common: float, skip: bool, seed: int = 0) -> onnx.ModelProto:
    """x [B, S, 64] -> 4-head self-attention -> output projection whose weights are random plus
    ``common`` -> (Skip)LayerNormalization with the residual x. ``common`` 0: well conditioned."""
    rng = np.random.default_rng(seed)
    head = WIDTH // HEADS

    def weight(name: str, values: np.ndarray) -> onnx.TensorProto:
        return onnx.numpy_helper.from_array(np.asarray(values, np.float32), name)

    def ints(name: str, values: list[int]) -> onnx.TensorProto:
        return onnx.numpy_helper.from_array(np.asarray(values, np.int64), name)

    square = [WIDTH, WIDTH]
    inits = [
        weight("wq", rng.standard_normal(square) * WIDTH**-0.5),
        weight("wk", rng.standard_normal(square) * WIDTH**-0.5),
        weight("wv", rng.standard_normal(square) * WIDTH**-0.5),
        weight("wo", rng.standard_normal(square) * WIDTH**-0.5 + common),
        weight("bq", rng.standard_normal(WIDTH) * 0.1),
        weight("bk", rng.standard_normal(WIDTH) * 0.1),
        weight("bv", rng.standard_normal(WIDTH) * 0.1 + 1),
        weight("bo", rng.standard_normal(WIDTH) * 0.1),
        weight("gamma", np.ones(WIDTH)),
        weight("beta", np.zeros(WIDTH)),
        ints("heads", [0, 0, HEADS, head]),
        ints("merged", [0, 0, WIDTH]),
        weight("scale", head**-0.5),
    ]
    nodes = []
    for n in "qkv":
        nodes += [
            helper.make_node("MatMul", ["x", f"w{n}"], [f"{n}0"]),
            helper.make_node("Add", [f"{n}0", f"b{n}"], [f"{n}1"]),
            helper.make_node("Reshape", [f"{n}1", "heads"], [f"{n}2"]),
            helper.make_node("Transpose", [f"{n}2"], [n], perm=[0, 2, 3, 1] if n == "k" else [0, 2, 1, 3]),
        ]
    nodes += [
        helper.make_node("MatMul", ["q", "k"], ["s0"]),
        helper.make_node("Mul", ["s0", "scale"], ["s1"]),
        helper.make_node("Softmax", ["s1"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["a0"]),
        helper.make_node("Transpose", ["a0"], ["a1"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["a1", "merged"], ["a2"]),
        helper.make_node("MatMul", ["a2", "wo"], ["o0"]),
    ]
    if skip:
        nodes.append(
            helper.make_node(
                "SkipLayerNormalization",
                ["o0", "x", "gamma", "beta", "bo"],
                ["y"],
                domain="com.microsoft",
                epsilon=1e-5,
            )
        )
    else:
        nodes += [
            helper.make_node("Add", ["o0", "bo"], ["o1"]),
            helper.make_node("Add", ["o1", "x"], ["r0"]),
            helper.make_node("LayerNormalization", ["r0", "gamma", "beta"], ["y"], axis=-1, epsilon=1e-5),
        ]
    graph = helper.make_graph(
        nodes,
        "normalized_block",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", WIDTH])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid("com.microsoft", 1)] if skip else [])
    model = helper.make_model(graph, opset_imports=opsets)
    model.ir_version = 8
    return model


@pytest.mark.parametrize("skip", [False, True], ids=["LayerNormalization", "SkipLayerNormalization"])
@pytest.mark.parametrize("target", ["ortflash", "contrib"])
def test_a_correct_rewrite_of_an_ill_conditioned_model_verifies_within_its_own_noise(skip: bool, target: str) -> None:
    model = normalized_block(100.0, skip)
    fused, _ = ortflash.optimize(model, target=target)
    assert sum(n.op_type in ("FlashAttention", "MultiHeadAttention") for n in fused.graph.node) == 1
    without = ortflash.verify(model, fused, measure_noise=False)
    assert not without.ok and without.outputs["y"].max_abs > 100 * without.atol  # what it was: refused
    result = ortflash.verify(model, fused)
    assert result.ok
    assert 1e-3 < result.noise["y"] < 5e-3
    assert result.outputs["y"].max_abs < result.noise["y"]  # the rewrite is no further than the original's own noise
    (note,) = [n for n in result.notes if n.startswith("the model's own noise: ")]
    assert f"{result.noise['y']:.1e}".replace("e-0", "e-") in note
    assert result.to_dict()["noise"] == {"y": result.noise["y"]}


@pytest.mark.parametrize("skip", [False, True], ids=["LayerNormalization", "SkipLayerNormalization"])
def test_a_well_conditioned_model_keeps_its_tolerance(skip: bool) -> None:
    model = normalized_block(0.0, skip)
    result = ortflash.verify(model, ortflash.optimize(model, target="ortflash")[0])
    assert result.ok and result.noise == {} and (result.rtol, result.atol) == (1e-4, 1e-5)
    assert not any("noise" in n for n in result.notes)


def test_tampering_below_an_ill_conditioned_models_noise_fails_on_a_well_conditioned_one() -> None:
    ill = normalized_block(100.0, True)
    ill_noise = ortflash.verify(ill, ortflash.optimize(ill, target="ortflash")[0]).noise["y"]
    well = normalized_block(0.0, True)
    tampered = tamper_scale(ortflash.optimize(well, target="ortflash")[0], 1.0005)
    result = ortflash.verify(well, tampered)
    assert not result.ok and result.noise == {}
    assert 1e-4 < result.outputs["y"].max_abs < ill_noise  # smaller than the other model's noise: still refused


def test_tampering_beyond_the_noise_fails_on_the_ill_conditioned_model() -> None:
    model = normalized_block(100.0, True)
    tampered = tamper_scale(ortflash.optimize(model, target="ortflash")[0], 1.05)
    result = ortflash.verify(model, tampered)
    assert not result.ok
    assert result.outputs["y"].max_abs > 5 * NOISE_FACTOR * result.noise["y"]


def test_the_cli_says_the_models_own_noise_and_a_tolerance_given_is_kept(tmp_path, capsys) -> None:
    path = str(tmp_path / "ill.onnx")
    onnx.save(normalized_block(100.0, True), path)
    out = str(tmp_path / "out.onnx")
    assert main(["optimize", path, "--target", "ortflash", "--verify", "-o", out]) == 0
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note: the model's own noise: ")]
    assert len(notes) == 1 and "atol raised by 2 x its noise there" in notes[0]
    # a tolerance given is the one asked for: no noise allowed on top
    assert main(["verify", path, out, "--atol", "1e-5", "--rtol", "1e-4"]) == 1
