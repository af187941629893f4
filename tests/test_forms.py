"""Each block's form by measured speed where the user leaves the target open (issue 20, item 2):
the original ops stay where the cost table says the fused form is slower; a named target is kept."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
from attention_graphs import Variant, build

from ortflash.op.policy import SoftmaxPolicy
from ortflash.pipeline import forms
from ortflash.pipeline.optimize import optimize

RESULTS_DIR = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
NO_CHECK = {"load_check": lambda m, r: None}


def _static(length: int, head_dim: int = 32) -> onnx.ModelProto:
    """One block whose query and key lengths are fixed at ``length``."""
    model = build(Variant(head_dim=head_dim))
    for value in model.graph.input:
        dims = value.type.tensor_type.shape.dim
        for axis, size in enumerate([1, 2, length, head_dim]):
            dims[axis].Clear()
            dims[axis].dim_value = size
    return model


def _a_measured_crossover(kind: str = "none") -> tuple[str, int, int]:
    """A (form, head dim, crossover) the table has for blocks of ``kind`` (the test graphs' blocks
    have no mask), for the tests that need a form that wins."""
    for form, by_dim in forms.CPU_CROSSOVERS[kind].items():
        for dim, at in by_dim.items():
            if at is not None and form in ("naive", "online"):
                return form, dim, at
    pytest.skip("no FlashAttention form beat the original ops at any measured length on the table's machine")


def test_the_table_in_code_is_the_committed_benchmark_results():
    """Per mask kind, form and head dim: the largest crossover of the kind's runs (CPU time, and
    wall time where the kind has its own run, else the padding stack's wall-time run)."""
    assert set(forms.CPU_CROSSOVERS) == set(forms.MASK_KINDS) == set(forms.RESULTS_FILES)
    for kind, by_form in forms.CPU_CROSSOVERS.items():
        names = list(forms.RESULTS_FILES[kind])
        if len(names) == 1:
            names.append(forms.WALL_FOR_ALL)
        runs = [json.loads((RESULTS_DIR / f"{name}.json").read_text()) for name in names]
        for form, by_dim in by_form.items():
            for dim, at in by_dim.items():
                measured = [run["forms"][form][str(dim)]["crossover"] for run in runs]
                assert at == (None if None in measured else max(measured)), (kind, form, dim, measured)
        assert {int(d) for d in runs[0]["forms"]["naive"]} == set(by_form["naive"]), kind
        assert max(runs[0]["seq_lens"]) == forms.MEASURED_UP_TO, kind


@pytest.mark.parametrize(
    ("stack", "kind"),
    [("nomask", "none"), ("padding", "padding"), ("causal_mask", "causal"), ("causal", "causal"), ("bias", "bias")],
)
def test_each_block_reads_the_row_of_its_mask_kind(stack, kind):
    """The benchmark's own stacks: each fused block is classified as the row that measured it."""
    import sys

    sys.path.insert(0, str(RESULTS_DIR.parents[0]))
    from cpu_attention import build_model

    _, report = optimize(build_model(layers=1, stack=stack, heads=2, head_dim=32), target="ortflash", **NO_CHECK)
    assert [b.mask_kind for b in report.blocks] == [kind]


def test_a_full_bias_or_an_unproved_operand_reads_the_bias_row_and_a_padding_part_does_not():
    assert forms.mask_kind(False, ()) == "none"
    assert forms.mask_kind(False, (1,)) == "padding"
    assert forms.mask_kind(True, (1,)) == forms.mask_kind(True, ()) == "causal"
    assert forms.mask_kind(True, (1, 64)) == forms.mask_kind(False, (None,)) == "bias"


def test_a_block_at_a_short_static_length_keeps_the_original_ops():
    model = _static(16)
    out, report = optimize(model, **NO_CHECK)
    assert report.fused == 0 and out is model  # written unchanged
    assert "the original ops are faster at 16 keys" in report.blocks[0].reason
    assert "kept the original ops" in report.blocks[0].detail and "key length 16" in report.blocks[0].detail
    assert report.blocks[0].head_dim == 32 and report.blocks[0].mask_kind == "none"  # a kept row says its kind


def test_a_named_target_is_written_as_asked_at_any_length():
    out, report = optimize(_static(16), target="ortflash", **NO_CHECK)
    assert report.fused == 1 and [n.op_type for n in out.graph.node].count("FlashAttention") == 1
    out, report = optimize(_static(16), target="contrib", **NO_CHECK)
    assert report.blocks[0].lowered_to == "com.microsoft.MultiHeadAttention"


def test_a_dynamic_length_block_dispatches_on_the_length_unless_the_lengths_are_given():
    """A length known only at run time: the fused form from the table's crossover, the original ops
    below (an If on the length), where a form wins at some length; with --seq-lens, no If."""
    form, dim, at = _a_measured_crossover()
    policy = {"softmax": form}
    out, report = optimize(build(Variant(head_dim=dim)), **policy, **NO_CHECK)
    assert report.fused == 1 and report.blocks[0].fused_from == at
    assert report.blocks[0].reason == f"{form} from {at} keys, original ops below"
    assert "known only at run time" in report.blocks[0].detail
    assert [n.op_type for n in out.graph.node].count("If") == 1
    _, long_report = optimize(build(Variant(head_dim=dim)), seq_lens=[at, 4 * at], **policy, **NO_CHECK)
    assert long_report.fused == 1 and long_report.blocks[0].fused_from is None
    assert f"faster than the original ops at key length {at}" in long_report.blocks[0].detail
    _, mixed = optimize(build(Variant(head_dim=dim)), seq_lens=[at // 2, at], **policy, **NO_CHECK)
    assert mixed.fused == 0 and f"at key length {at // 2}" in mixed.blocks[0].detail


def test_a_dynamic_length_block_no_form_beats_keeps_the_original_ops_and_says_why():
    never = [d for d, at in forms.CPU_CROSSOVERS["none"]["online"].items() if at is None]
    if not never:
        pytest.skip("online beats the original ops at some length at every measured head dim")
    model = build(Variant(head_dim=never[0]))
    out, report = optimize(model, online_softmax=True, **NO_CHECK)
    assert report.fused == 0 and out is model and report.blocks[0].mask_kind == "none"
    assert "wins at no measured length" in report.blocks[0].reason
    assert "known only at run time" in report.blocks[0].detail


def test_a_block_at_or_past_its_crossover_is_fused_and_says_why():
    form, dim, at = _a_measured_crossover()
    out, report = optimize(_static(at, dim), softmax=form, **NO_CHECK)
    assert report.fused == 1 and "faster than the original ops" in report.blocks[0].detail
    _, short = optimize(_static(at // 2, dim), softmax=form, **NO_CHECK)
    assert short.fused == 0


@pytest.mark.parametrize(
    ("head_dim", "expected"),
    [(16, {32}), (32, {32}), (48, {32, 64}), (64, {64}), (128, {64}), (None, {32, 64})],
)
def test_a_head_dim_between_measured_ones_takes_the_slower_of_its_neighbours(head_dim, expected):
    for kind, by_form in forms.CPU_CROSSOVERS.items():
        for form, by_dim in by_form.items():
            values = [by_dim[d] for d in expected]
            want = None if any(v is None for v in values) else max(values)  # type: ignore[type-var]
            assert forms.crossover(form, head_dim, kind) == want, (kind, form, head_dim)


def test_auto_runs_the_online_softmax_from_min_seq_len_so_its_form_follows_the_length():
    policy = SoftmaxPolicy.for_new_nodes(online_softmax=True)
    assert forms.form_at("ortflash", policy, 512) == "naive" and forms.form_at("ortflash", policy, 4096) == "online"
    assert forms.form_at("contrib", policy, 16) == "contrib" and forms.form_at("webgpu", policy, 16) == "webgpu"


def test_where_the_model_with_blocks_kept_does_not_load_the_whole_fused_one_is_written_and_says_so():
    from onnx import compose

    short, long = compose.add_prefix(_static(16), "a_"), compose.add_prefix(_static(4096), "b_")
    graphs = (short.graph, long.graph)
    model = onnx.helper.make_model(
        onnx.helper.make_graph(
            [n for g in graphs for n in g.node],
            "two_blocks",
            [i for g in graphs for i in g.input],
            [o for g in graphs for o in g.output],
            [t for g in graphs for t in g.initializer],
        ),
        opset_imports=list(short.opset_import),
    )
    model.ir_version = short.ir_version

    def refuses_one_node(m: onnx.ModelProto, report) -> str | None:  # loads only with both blocks fused
        return "refused" if [n.op_type for n in m.graph.node].count("FlashAttention") == 1 else None

    # online: the form the table has winning at 4096 for blocks with no mask (head dim 32)
    out, report = optimize(model, softmax="online", load_check=refuses_one_node)
    assert report.fused == 2 and "the original ops were not kept where faster: refused" in report.notes
    assert report.target is not None and "kept the original ops" not in report.target.why
    _, kept = optimize(model, softmax="online", **NO_CHECK)
    assert kept.fused == 1 and kept.target is not None and "1 of 2 fused blocks then kept" in kept.target.why


def _static_f16(length: int, head_dim: int = 32) -> onnx.ModelProto:
    model = _static(length, head_dim)
    f16 = build(Variant(head_dim=head_dim, dtype=onnx.TensorProto.FLOAT16))
    for value, typed in zip(model.graph.input, f16.graph.input):
        value.type.tensor_type.elem_type = typed.type.tensor_type.elem_type
    del model.graph.node[:], model.graph.initializer[:]
    model.graph.node.extend(f16.graph.node)
    model.graph.initializer.extend(f16.graph.initializer)
    model.graph.output[0].type.tensor_type.elem_type = f16.graph.output[0].type.tensor_type.elem_type
    return model


def test_the_cpu_table_does_not_decide_for_another_ep():
    """A short static block the CPU table keeps is lowered for --ep cuda where the CUDA table, by
    element type, says the lowered form is faster (float16, no mask: from 64 keys)."""
    _, cpu = optimize(_static_f16(64), ep="cpu", **NO_CHECK)
    assert cpu.fused == 0
    _, cuda = optimize(_static_f16(64), ep="cuda", **NO_CHECK)
    assert cuda.fused == 1 and cuda.blocks[0].lowered_to is not None and cuda.blocks[0].dtype == "float16"
    assert "crossover_cuda" in cuda.blocks[0].detail and "float16" in cuda.blocks[0].detail


def test_ep_cuda_keeps_float32_blocks_and_short_float16_ones_and_says_why():
    """float32: the original's TF32 products beat the cuda target at every measured length."""
    _, f32 = optimize(_static(64), ep="cuda", **NO_CHECK)
    assert f32.fused == 0 and f32.blocks[0].dtype == "float32"
    assert "crossover_cuda" in f32.blocks[0].detail and "float32" in f32.blocks[0].detail, f32.blocks[0].detail
    _, short = optimize(_static_f16(16), ep="cuda", **NO_CHECK)
    assert short.fused == 0 and "at key length 16, cuda beats them only from 64" in short.blocks[0].detail
    policy = SoftmaxPolicy.for_new_nodes()
    assert not forms.choose("cuda", policy, 64, [1024], "padding", "cuda", "float16").fused
    assert forms.choose("cuda", policy, 64, [2048], "padding", "cuda", "float16").fused
    assert not forms.choose("cuda", policy, 64, [2048], "causal", "cuda", "float16").fused
    assert forms.choose("cuda", policy, 128, [4096], "causal", "cuda", "float16").fused
    # an element type without a table of its own is decided as float32, the table that keeps most
    unknown = forms.choose("cuda", policy, 64, [4096], "padding", "cuda", None)
    assert not unknown.fused and "as float32" in unknown.detail
    # where --ep cuda falls back to contrib (a block cuda cannot lower), the same row decides
    assert not forms.choose("contrib", policy, 64, None, "causal", "cuda", "float32").fused


def test_the_cuda_table_is_its_committed_benchmark_results():
    doc = json.loads((RESULTS_DIR / "crossover_cuda.json").read_text())
    kinds = {"padding": "padding", "causal_mask": "causal", "nomask": "none", "bias": "bias"}
    assert set(doc["by_dtype"]) == set(forms.CUDA_CROSSOVERS)
    for dtype, by_stack in doc["by_dtype"].items():
        assert set(by_stack) == set(kinds)
        for stack, kind in kinds.items():
            rows = by_stack[stack]["cuda"]
            assert {int(d) for d in rows} == set(forms.CUDA_CROSSOVERS[dtype][kind]["cuda"]), (dtype, stack)
            for dim, row in rows.items():
                assert forms.CUDA_CROSSOVERS[dtype][kind]["cuda"][int(dim)] == row["crossover"], (dtype, stack, dim)
            # contrib writes the ops the cuda target chooses among: it takes the measured row
            assert forms.CUDA_CROSSOVERS[dtype][kind]["contrib"] == forms.CUDA_CROSSOVERS[dtype][kind]["cuda"]
    assert max(doc["seq_lens"]) == forms.CUDA_MEASURED_UP_TO
    # the table an unknown element type takes keeps every block any other table keeps
    taken = forms.CUDA_CROSSOVERS[forms.CUDA_UNKNOWN_DTYPE]
    for table in forms.CUDA_CROSSOVERS.values():
        for kind, by_form in table.items():
            for dim, at in by_form["cuda"].items():
                mine = taken[kind]["cuda"][dim]
                assert mine is None or (at is not None and mine >= at), (kind, dim)


def test_the_webgpu_table_is_its_committed_benchmark_results():
    doc = json.loads((RESULTS_DIR / "crossover_webgpu.json").read_text())
    for stack, kind in (("padding", "padding"), ("causal", "causal")):
        for dim, row in doc["by_stack"][stack]["webgpu"].items():
            assert forms.WEBGPU_CROSSOVERS[kind]["webgpu"][int(dim)] == row["crossover"], (stack, dim)
    # the kinds not measured take the padding row, the slower of the two
    assert forms.WEBGPU_CROSSOVERS["none"] == forms.WEBGPU_CROSSOVERS["bias"] == forms.WEBGPU_CROSSOVERS["padding"]
    assert max(doc["seq_lens"]) == forms.MEASURED_UP_TO


def test_ep_webgpu_keeps_a_short_block_that_the_webgpu_table_says_is_slower_and_says_so():
    _, short = optimize(_static(128), ep="webgpu", **NO_CHECK)
    assert short.fused == 0 and "crossover_webgpu" in short.blocks[0].detail, short.blocks[0].detail
    assert forms.choose("webgpu", SoftmaxPolicy.for_new_nodes(), 32, [64], "causal", "webgpu").fused
    assert not forms.choose("webgpu", SoftmaxPolicy.for_new_nodes(), 32, [1024], "padding", "webgpu").fused
    assert forms.choose("webgpu", SoftmaxPolicy.for_new_nodes(), 64, [2048], "padding", "webgpu").fused
