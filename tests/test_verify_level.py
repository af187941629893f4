"""verify runs both models at one ONNX Runtime graph optimization level, says which, and takes --ort-opt-level."""

from __future__ import annotations

import json
from typing import Any

import onnx
import onnxruntime as ort
import pytest
from attention_graphs import Variant, build

import ortflash
from ortflash.checks import sessions
from ortflash.checks.sessions import ORT_OPT_LEVELS
from ortflash.checks.verify import VERIFY_OPT_LEVEL, verify_every_softmax
from ortflash.cli import main


@pytest.fixture()
def pair(tmp_path) -> tuple[str, str]:
    """An attention model and its fused form, as files."""
    original = build(Variant())
    fused, _ = ortflash.optimize(original, target="ortflash")
    paths = str(tmp_path / "attn.onnx"), str(tmp_path / "attn.flash.onnx")
    onnx.save(original, paths[0])
    onnx.save(fused, paths[1])
    return paths


@pytest.fixture()
def levels_opened(monkeypatch) -> list[ort.GraphOptimizationLevel]:
    """The graph optimization level of every session a check opens, in order."""
    opened: list[ort.GraphOptimizationLevel] = []
    real = sessions.InferenceSession

    def spy(model: Any, *, sess_options: ort.SessionOptions, **kwargs: Any) -> Any:
        opened.append(sess_options.graph_optimization_level)
        return real(model, sess_options=sess_options, **kwargs)

    monkeypatch.setattr(sessions, "InferenceSession", spy)
    return opened


def test_the_default_is_optimizations_disabled_on_both_models(pair, levels_opened):
    result = verify_every_softmax(*pair)
    assert result.ok and result.ort_opt_level == VERIFY_OPT_LEVEL == "disable"
    assert len(levels_opened) >= 2  # the original and the optimized model
    assert set(levels_opened) == {ort.GraphOptimizationLevel.ORT_DISABLE_ALL}
    assert result.to_dict()["ort_opt_level"] == "disable"


@pytest.mark.parametrize("level", list(ORT_OPT_LEVELS))
def test_verify_runs_both_models_at_the_level_asked_and_says_so(pair, level, tmp_path, levels_opened, capsys):
    doc = tmp_path / "v.json"
    assert main(["verify", *pair, "--ort-opt-level", level, "--json", str(doc)]) == 0
    assert set(levels_opened) == {ORT_OPT_LEVELS[level]} and len(levels_opened) >= 2
    header = capsys.readouterr().out.splitlines()[0]
    assert header == f"ONNX Runtime graph optimization level: {level} (both models)"
    assert json.loads(doc.read_text())["verification"]["ort_opt_level"] == level


@pytest.mark.parametrize("level", list(ORT_OPT_LEVELS))
def test_the_level_reaches_the_onnx_runtime_session(pair, level):
    session = sessions.open_session(pair[1], opt_level=level)
    assert session._session.get_session_options().graph_optimization_level == ORT_OPT_LEVELS[level]


def test_optimize_verify_takes_the_level(pair, tmp_path, levels_opened):
    out, doc = tmp_path / "o.onnx", tmp_path / "o.json"
    argv = [
        "optimize",
        pair[0],
        "-o",
        str(out),
        "--verify",
        "--ort-opt-level",
        "basic",
        "--json",
        str(doc),
        "--target",
        "ortflash",
    ]
    assert main(argv) == 0 and out.exists()
    assert json.loads(doc.read_text())["verification"]["ort_opt_level"] == "basic"
    # the check before writing opens the model as deployed (ONNX Runtime's default); verify at the level asked
    assert levels_opened[0] == ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    assert set(levels_opened[1:]) == {ort.GraphOptimizationLevel.ORT_ENABLE_BASIC}


def test_optimize_verify_defaults_to_disabled(pair, tmp_path):
    doc = tmp_path / "o.json"
    assert (
        main(
            [
                "optimize",
                pair[0],
                "-o",
                str(tmp_path / "o.onnx"),
                "--verify",
                "--json",
                str(doc),
                "--target",
                "ortflash",
            ]
        )
        == 0
    )
    assert json.loads(doc.read_text())["verification"]["ort_opt_level"] == "disable"


def test_an_unknown_level_is_a_usage_error(pair, capsys):
    with pytest.raises(SystemExit) as exited:
        main(["verify", *pair, "--ort-opt-level", "max"])
    assert exited.value.code == 2 and "--ort-opt-level" in capsys.readouterr().err
