"""Issue 24 (trust and polish, round three): each rough edge a new user hit, on real sessions of small models."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from attention_graphs import projected_block

import ortflash


@pytest.mark.parametrize("location", ["model.onnx.data", "weights/model.data"])
def test_session_finds_external_data_from_another_working_directory(tmp_path, monkeypatch, location):
    """Item 0: the session hands ORT bytes, and ORT resolved the data file against the cwd."""
    fused, _ = ortflash.optimize(projected_block(upstream="Identity"))
    folder = tmp_path / "model"
    (folder / "weights").mkdir(parents=True)
    path = folder / "model.onnx"
    onnx.save(fused, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location=location)
    assert os.path.isfile(folder / location) and ortflash.model_io.external_locations(
        onnx.load(path, load_external_data=False)
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    x = np.random.default_rng(0).standard_normal((2, 5, 32)).astype(np.float32)
    got = ortflash.InferenceSession(str(path)).run(None, {"x": x})[0]
    inline = ortflash.InferenceSession(onnx.load(path)).run(None, {"x": x})[0]  # weights read in: no folder needed
    assert got.shape == (2, 5, 32)
    np.testing.assert_array_equal(got, inline)
