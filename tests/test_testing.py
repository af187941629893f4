"""Issue 15: ortflash.testing's assertions and the pytest plugin, on good and broken models."""

from __future__ import annotations

import os
import textwrap

import onnx
import pytest
import tomllib
from attention_graphs import Variant, build, tamper_scale

import ortflash
from ortflash import OrtflashError
from ortflash.testing import assert_equivalent, assert_fuses

ROOT = os.path.join(os.path.dirname(__file__), "..")


def test_assert_fuses_returns_the_optimized_model():
    fused = assert_fuses(build(Variant()), blocks=1)
    assert sum(n.op_type == "FlashAttention" for n in fused.graph.node) == 1


def test_assert_fuses_lists_the_softmax_kept_and_why():
    no_longer_fuses = build(Variant(softmax_axis=2))
    with pytest.raises(AssertionError) as failure:
        assert_fuses(no_longer_fuses, blocks=1)
    message = str(failure.value)
    assert "expected 1 attention block(s) fused for target 'ortflash', got 0" in message
    assert "kept Softmax_0: Softmax is over axis 2, not the last axis" in message


def test_assert_fuses_counts_only_blocks_lowered_for_a_native_target():
    negative_scale = build(Variant(scale=-0.125))
    assert_fuses(negative_scale, blocks=1)  # FlashAttention takes it
    with pytest.raises(AssertionError, match=r"got 0[\s\S]*not lowered to contrib: scale -0.125 is negative"):
        assert_fuses(negative_scale, blocks=1, target="contrib")


def test_assert_equivalent_passes_and_returns_the_result():
    original = build(Variant(bias_shapes=(("B", 1, 1, "T"),)))
    result = assert_equivalent(original, assert_fuses(original, blocks=1))
    assert result.ok and result.outputs["out"].max_abs < 1e-5


def test_assert_equivalent_shows_the_worst_element_of_a_tampered_scale():
    original = build(Variant())
    broken = tamper_scale(assert_fuses(original, blocks=1), 1.5)
    with pytest.raises(AssertionError) as failure:
        assert_equivalent(original, broken)
    message = str(failure.value)
    worst = ortflash.verify(original, broken).outputs["out"]
    index = "[" + ", ".join(map(str, worst.worst_index)) + "]"
    assert f"out: worst at {index}: expected {worst.worst_expected!r}, got {worst.worst_actual!r}" in message
    assert "as configured (inputs q [2, 2, 16, 32]" in message


def test_assert_equivalent_of_an_unloadable_model_raises(tmp_path):
    garbage = tmp_path / "broken.onnx"
    garbage.write_bytes(b"\x00not onnx")
    with pytest.raises(OrtflashError, match="not a readable ONNX model"):
        assert_equivalent(build(Variant()), str(garbage))


def test_the_plugin_is_declared_as_a_pytest11_entry_point():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        entry_points = tomllib.load(f)["project"]["entry-points"]["pytest11"]
    assert entry_points == {"ortflash.pytest_plugin": "ortflash.pytest_plugin"}


def test_the_plugin_runs_each_model_and_target_of_a_manifest_as_a_test(tmp_path, capsys):
    onnx.save(build(Variant()), str(tmp_path / "good.onnx"))
    onnx.save(build(Variant(softmax_axis=2)), str(tmp_path / "unfused.onnx"))
    (tmp_path / "models.toml").write_text(
        textwrap.dedent(
            """
            [[model]]
            path = "good.onnx"
            blocks = { ortflash = 1, onnx = 1 }

            [[model]]
            path = "unfused.onnx"
            blocks = { ortflash = 1 }
            """
        )
    )
    (tmp_path / "test_models.py").write_text(
        textwrap.dedent(
            """
            import pytest

            @pytest.mark.ortflash_manifest("models.toml")
            def test_green(ortflash_case):
                ortflash_case.assert_ok()
            """
        )
    )
    # in this process (an interpreter start costs more than the checks), the plugin module handed over
    # by itself: registered under its entry point's name, so an installed entry point is not loaded twice
    from ortflash import pytest_plugin

    code = pytest.main(
        [str(tmp_path), "-q", "-rA", "-p", "no:cacheprovider", "--rootdir", str(tmp_path)], plugins=[pytest_plugin]
    )
    out = capsys.readouterr().out
    assert code == pytest.ExitCode.TESTS_FAILED, out
    # "-rA" lines read "STATUS path::id", and a wide terminal appends " - message" to failures
    outcomes = {
        line.split()[1].split("::")[-1]: line.split()[0]
        for line in out.splitlines()
        if line.split()[:1] in (["PASSED"], ["FAILED"]) and "test_models.py::" in line
    }
    assert outcomes == {
        "test_green[good.onnx[ortflash]]": "PASSED",
        "test_green[good.onnx[onnx]]": "PASSED",
        "test_green[unfused.onnx[ortflash]]": "FAILED",
    }, out
    assert "0 of 1 expected blocks fused; kept Softmax_0: Softmax is over axis 2" in out
    assert "1 failed, 2 passed" in out
