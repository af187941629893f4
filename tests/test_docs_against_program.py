"""The docs against the program (issue 33 items 15 and 16): what the program does or takes is
documented where a user looks, and the wording of counts is right."""

from __future__ import annotations

import dataclasses
import json
import os
import re

import onnx
import pytest
from attention_graphs import Variant, build

import ortflash
from ortflash.cli import build_parser, main
from ortflash.kernels.config import ConfigError
from ortflash.lowering import TARGETS
from ortflash.op.spec import SpecError
from ortflash.regress.manifest import _MODEL_KEYS

DOCS = os.path.join(os.path.dirname(__file__), os.pardir, "docs")


def _doc(name: str) -> str:
    with open(os.path.join(DOCS, name)) as f:
        return f.read()


def test_every_key_of_a_json_block_is_documented():
    text = _doc("command-line.md")
    json_section = text[text.index("## JSON output") : text.index("## Every option")]
    for field in dataclasses.fields(ortflash.Block):
        assert f"`{field.name}`" in json_section, field.name


def test_every_manifest_key_and_target_is_documented():
    text = _doc("testing.md")
    for key in _MODEL_KEYS:
        assert f"`{key}" in text or f"\n{key} = " in text, key  # in words, or in the example manifest
    for target in TARGETS:
        assert f"`{target}`" in text, target


@pytest.mark.parametrize(
    ("options", "raised"),
    [({"backend": "gpu"}, ConfigError), ({"threads": 0}, ConfigError), ({"softmax": "fast"}, SpecError)],
)
def test_the_sessions_exceptions_are_the_documented_ones(options, raised, tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(build(Variant()), path)
    with pytest.raises(raised):
        ortflash.InferenceSession(str(path), **options)
    text = _doc("python-api.md")
    assert f"`ortflash.{raised.__module__.removeprefix('ortflash.')}.{raised.__name__}`" in text
    assert issubclass(raised, ValueError) and "a `ValueError` for an option" in text


def test_the_pass_pipeline_says_to_install_onnxscript():
    assert "`pip install onnxscript`" in _doc("python-api.md")


def test_online_softmax_help_says_the_cost_table_decides():
    optimize = next(
        a
        for a in build_parser()._subparsers._group_actions[0].choices["optimize"]._actions  # noqa: SLF001
        if "--online-softmax" in a.option_strings
    )
    assert "cost table" in optimize.help and "--target ortflash fuses every block" in optimize.help


def test_inspect_previews_a_target(tmp_path, capsys):
    path, doc = tmp_path / "m.onnx", tmp_path / "r.json"
    onnx.save(build(Variant()), path)
    assert main(["inspect", str(path), "--target", "contrib", "--json", str(doc)]) == 0
    written = json.loads(doc.read_text())
    assert [b["lowered_to"] for b in written["blocks"]] == ["com.microsoft.MultiHeadAttention"]
    assert written["target"]["chosen"] == "contrib" and not (tmp_path / "m.flash.onnx").exists()
    assert main(["inspect", str(path), "--target", "contrib", "--ep", "cpu"]) == 2


def test_one_fused_node_is_singular(tmp_path, capsys):
    path = tmp_path / "m.onnx"
    onnx.save(build(Variant()), path)
    assert main(["validate", str(path)]) == 0
    out = capsys.readouterr().out
    assert "validated: 1 fused node agrees" in out and not re.search(r"\b1 fused nodes\b", out)
