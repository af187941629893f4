"""One writer for the GPU targets (lowering/gpu.lower_gpu, issue 32 item 2): cuda and webgpu are a
capability table and a GpuProfile each, and a third EP is the same: a table and a profile, with the
opening, the precision, the operands and the output written by lower_gpu."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_webgpu_guards import LOWEST, _fa_node, padded_feeds, padded_model, plain_run

import ortflash.lowering as lowering
from ortflash.checks.compare import compare
from ortflash.checks.sessions import run_model
from ortflash.lowering import OP_MHA, cuda, gpu, lower, webgpu
from ortflash.lowering.measured import Capability, CapabilityTable
from ortflash.lowering.targets import REGISTRY, Target


def test_the_gpu_targets_write_through_their_profiles():
    assert REGISTRY["cuda"].write == cuda.CUDA_PROFILE.lower
    assert REGISTRY["webgpu"].write == webgpu.WEBGPU_PROFILE.lower
    for profile in (cuda.CUDA_PROFILE, webgpu.WEBGPU_PROFILE):
        # every form the choice can name has a writer, and MultiHeadAttention's take one head count
        # (but cuda's causal_padding form, timed as users run it by benchmarks/cuda_forms.py, not the probe:
        # cuda_forms_causal_padding_f16.md, held by tests/test_cuda_costs.py)
        probed = set(profile.forms) - {cuda.FORM_MHA_CAUSAL_PADDING}
        assert {f for f, _ in profile.capabilities} >= probed, profile.ep
        assert all(form.one_head_count == (form.op == OP_MHA) for form in profile.forms.values()), profile.ep
    assert cuda.CUDA_PROFILE.native_float16 and not webgpu.WEBGPU_PROFILE.native_float16


def test_a_capability_table_loads_from_its_json_rows(tmp_path):
    """Each EP's rows are data (lowering/<ep>_capabilities.json): CapabilityTable.load reads them in
    order, every field given (ms null where not timed), why optional; anything else is an error."""
    row = {"form": "mha_bias", "case": "padding", "on_gpu": True, "right": True, "kernel": "", "ms": None}
    timed = {**row, "case": "causal", "kernel": "FLASH_ATTENTION", "ms": 0.047, "why": "read by choose_form"}
    path = tmp_path / "toy_capabilities.json"
    path.write_text(json.dumps({"about": "a toy EP", "rows": [row, timed]}))
    table = CapabilityTable.load(path)
    assert list(table.items()) == [
        (("mha_bias", "padding"), Capability(on_gpu=True, right=True)),
        (("mha_bias", "causal"), Capability(on_gpu=True, right=True, kernel="FLASH_ATTENTION", ms=0.047)),
    ]
    for rows in (
        [row, row],
        [{k: v for k, v in row.items() if k != "ms"}],
        [{**row, "speed": 1.0}],
        [{**row, "right": 1}],
    ):
        path.write_text(json.dumps({"rows": rows}))
        with pytest.raises(ValueError):
            CapabilityTable.load(path)


def _toy_profile(right: bool) -> gpu.GpuProfile:
    """A third EP: one measured row, MultiHeadAttention with attention_bias (webgpu's writer)."""
    table = CapabilityTable({("mha_bias", "padding"): Capability(on_gpu=True, right=right)})

    def choose(call, dims, half, opset):
        usable = table.usable("mha_bias", "padding")
        return ("mha_bias", "the toy EP's one form") if usable else (None, "")

    return gpu.GpuProfile(
        ep="Toy",
        capabilities=table,
        refusals=(gpu.Refusal(lambda call: call.softcap > 0, "softcap: not in the Toy capability table"),),
        choose=choose,
        forms={"mha_bias": webgpu.WEBGPU_PROFILE.forms["mha_bias"]},
        native_float16=False,
    )


def _with_target(monkeypatch, profile: gpu.GpuProfile) -> None:
    toy = Target("toy", profile.lower, "a toy EP's forms", min_opset=13, domain=REGISTRY["cuda"].domain)
    monkeypatch.setattr(lowering, "REGISTRY", {**REGISTRY, "toy": toy})


def test_a_third_ep_is_a_table_and_a_profile(monkeypatch):
    _with_target(monkeypatch, _toy_profile(right=True))
    model = padded_model(layers=1)
    lowered, notes = lower(model, "toy")
    assert [n.op for n in notes] == [OP_MHA] and notes[0].lowered, notes
    assert notes[0].reason.startswith("the toy EP's one form; 4 query / 4 key-value heads"), notes[0].reason
    # the same nodes as the webgpu target, which writes this form the same way
    webgpu_lowered, _ = lower(model, "webgpu")
    assert [n.op_type for n in lowered.graph.node] == [n.op_type for n in webgpu_lowered.graph.node]
    f = padded_feeds(0)
    want, got = run_model(model, f), plain_run(lowered, f)
    assert compare(want["o0"], got["o0"], "o0", 1e-4, 1e-5).ok
    assert np.isfinite(got["o0"]).all()


def _softcapped(softcap: float):
    """padded_model's one block with a softcap (no other change)."""
    model = padded_model(layers=1)
    old = model.graph.node[-1]
    attrs = dict(scale=0.3, is_causal=1, mask_fill=LOWEST, masked_rows="nan", softcap=softcap)
    new = _fa_node(list(old.input), old.output[0], old.name, **attrs)
    model.graph.node.remove(old)
    model.graph.node.append(new)
    return model


@pytest.mark.parametrize(
    ("right", "softcap", "reason"),
    [
        (False, 0.0, "no form in the Toy capability table is right on the GPU for this block"),
        (True, 30.0, "softcap: not in the Toy capability table"),
    ],
)
def test_a_profile_refuses_with_its_own_table_and_reasons(monkeypatch, right, softcap, reason):
    _with_target(monkeypatch, _toy_profile(right=right))
    _, notes = lower(_softcapped(softcap) if softcap else padded_model(layers=1), "toy")
    assert not notes[0].lowered and notes[0].reason.startswith(f"{reason}; "), notes[0].reason
    # the cuda target refuses the same softcapped block with its own words
    if softcap:
        _, cuda_notes = lower(_softcapped(softcap), "cuda")
        assert cuda_notes[0].reason.startswith(cuda.CUDA_PROFILE.refusals[1].why + "; "), cuda_notes[0].reason
