"""validate's batch-1 retry (issue 33 item 11): random inputs a model does not take at --batch
(an export that fixes the batch at 1 inside the graph) are retried at batch 1 with verify's note,
where validate exited 2 while verify, optimize --verify and regress passed."""

from __future__ import annotations

import json

import numpy as np
import pytest
from attention_graphs import batch_one_only as batch_one_only_model

import ortflash
from ortflash.cli import main


@pytest.fixture()
def batch_one_only(tmp_path) -> tuple[str, str]:
    """A model whose Reshape fixes the batch at 1, and its fused model."""
    return batch_one_only_model(tmp_path)


@pytest.mark.parametrize("optimized", [True, False])
def test_validate_runs_at_batch_1_where_the_model_runs_only_there(batch_one_only, optimized, tmp_path, capsys):
    path, fused = batch_one_only
    doc = tmp_path / "v.json"
    assert main(["validate", path, *(["--optimized", fused] if optimized else []), "--json", str(doc)]) == 0
    out = capsys.readouterr().out
    (note,) = [line for line in out.splitlines() if line.startswith("note: ran at batch 1")]
    assert "does not run at batch 2 on the batch dim (axis 0 of x)" in note
    written = json.loads(doc.read_text())
    assert written["validation"]["ok"] and len(written["validation"]["nodes"]) == 1
    assert written["validation"]["nodes"][0]["shapes"].startswith("Q[1, ")
    assert [n for n in written["notes"] if n.startswith("ran at batch 1")] == [note.removeprefix("note: ")]


def test_the_api_says_it_ran_at_batch_1(batch_one_only):
    path, fused = batch_one_only
    result = ortflash.validate(path, fused)
    assert result.ok and len(result.nodes) == 1 and result.nodes[0].shapes.startswith("Q[1, ")
    assert len(result.notes) == 1 and result.notes[0].startswith("ran at batch 1")


def test_the_users_inputs_at_batch_2_are_not_resized_one_line_exit_2(batch_one_only, tmp_path, capsys):
    path, fused = batch_one_only
    np.savez(tmp_path / "wrong.npz", x=np.zeros((2, 16, 32), np.float32))  # the user's inputs: never resized
    assert main(["validate", path, "--optimized", fused, "--feeds", str(tmp_path / "wrong.npz")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "requested shape:{1,16,2,16}" in err[0]
