"""optimize's load check never takes the memory of a full-size run (issue 33 item 17): a one-block
float16 model at 4096 static keys made `optimize --target contrib` peak at 1.8 GiB (the original
and the lowered model each run once at their static shapes, a 384 MiB score tensor); it is now
opened, not run, with a note, and a model whose length is free still runs at the inputs' length."""

from __future__ import annotations

import json
import subprocess
import sys

import onnx
import onnxruntime as ort
from attention_graphs import F16, Variant, build

from ortflash.checks.feeds import make_feeds
from ortflash.pipeline.first_run import RUN_BUDGET_BYTES, largest_tensor

# ONNX Runtime, numpy and ortflash imported, the model opened: about 170 MiB here; a run at S=4096
# adds over 1.5 GiB
PEAK_LIMIT_MIB = 600


def _static(seq: int, heads: int) -> onnx.ModelProto:
    """One float16 attention block, batch 1 and ``seq`` queries and keys, every dim fixed."""
    model = build(Variant(dtype=F16, heads=heads, head_dim=64))
    for vi in (*model.graph.input, *model.graph.output):
        for dim in vi.type.tensor_type.shape.dim:
            if dim.dim_param in ("B", "S", "T"):
                dim.dim_value = 1 if dim.dim_param == "B" else seq
    return model


def test_largest_tensor_is_read_from_shapes_at_the_inputs_given():
    dynamic = build(Variant())  # float32, 2 heads of 32, B, S, T free
    feeds = make_feeds(dynamic, seq_len=64, batch=2)
    assert largest_tensor(dynamic, feeds) == (2 * 2 * 64 * 64 * 4, "s0")  # the scores [B, H, S, T]
    assert largest_tensor(_static(4096, 12), {})[0] == 12 * 4096 * 4096 * 2 == 384 * 2**20 > RUN_BUDGET_BYTES


def test_optimize_of_a_long_static_model_stays_far_below_a_full_runs_memory(tmp_path):
    path, out, doc = tmp_path / "s4096.onnx", tmp_path / "out.onnx", tmp_path / "r.json"
    onnx.save(_static(4096, 12), path)
    command = [sys.executable, "-m", "ortflash", "optimize", str(path), "-o", str(out), "--target", "contrib"]
    # measured in a process of its own: RUSAGE_CHILDREN is the largest child pytest ever waited for
    measure = (
        "import resource, subprocess, sys; "
        f"run = subprocess.run({command + ['--json', str(doc)]!r}, capture_output=True, text=True); "
        "print(run.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024); "
        "print(run.stdout, run.stderr)"
    )
    proc = subprocess.run([sys.executable, "-c", measure], capture_output=True, text=True, check=True)
    code, peak_mib = map(int, proc.stdout.split("\n", 1)[0].split())
    assert code == 0, proc.stdout
    assert peak_mib < PEAK_LIMIT_MIB, proc.stdout
    assert (
        "note: the lowered model was opened, not run once: at these input shapes the original holds a 384 MiB tensor"
        in (proc.stdout)
    )
    written = json.loads(doc.read_text())
    assert written["fused"] == 1 and written["blocks"][0]["lowered_to"] == "com.microsoft.MultiHeadAttention"
    ort.InferenceSession(str(out))  # what was written loads


def test_a_small_static_model_is_still_run_once(tmp_path, monkeypatch, capsys):
    from ortflash.cli import main
    from ortflash.pipeline import first_run

    ran = []
    real = first_run.first_run

    def spy(model, **kwargs):
        ran.append(kwargs.get("feeds") is not None)
        return real(model, **kwargs)

    monkeypatch.setattr(first_run, "first_run", spy)
    path = tmp_path / "s64.onnx"
    onnx.save(_static(64, 2), path)
    assert main(["optimize", str(path), "-o", str(tmp_path / "out.onnx"), "--target", "contrib"]) == 0
    assert ran == [True] and "not run once" not in capsys.readouterr().out
