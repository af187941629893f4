"""Each block's form by measured speed where the user leaves the target open (issue 20, item 2):
the original ops stay where the cost table says the fused form is slower; a named target is kept."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
from attention_graphs import Variant, build
from conftest import PINNED_CPU_CLASS

from ortflash.lowering import cuda_measured, webgpu
from ortflash.lowering.measured import CostRecord
from ortflash.lowering.targets import PROVIDERS, ExecutionProvider
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
    for form, by_dim in forms.CPU_CROSSOVERS[PINNED_CPU_CLASS][kind].items():
        for dim, at in by_dim.items():
            if at is not None and form in ("naive", "online"):
                return form, dim, at
    pytest.skip("no FlashAttention form beat the original ops at any measured length on the table's machine")


def _stack_crossover_rule():
    import sys

    sys.path.insert(0, str(RESULTS_DIR.parents[0]))
    from crossover import crossover

    return crossover


def _real_size_bounds(
    cpu_class: str, kind: str, stack_lengths: set[int], names: tuple[str, ...] | None = None
) -> dict[int, list[int | None]]:
    """head dim -> each real-size export's bound on the row (forms.REAL_SIZE_FILES, or ``names``):
    its crossover by the stack's rule, or the stack's next measured length past the longest it ran at."""
    crossover = _stack_crossover_rule()
    bounds: dict[int, list[int | None]] = {}
    for name in forms.REAL_SIZE_FILES.get(cpu_class, {}).get(kind, ()) if names is None else names:
        doc = json.loads((RESULTS_DIR / f"{name}.json").read_text())
        assert doc["kernel_isa"] == cpu_class, name
        for model in doc["models"].values():
            if model["kind"] != kind:
                continue
            ratios = {int(s): r for s, r in model["cpu_time_ratios"].items()}
            at = crossover(ratios)
            if at is None:
                past = [s for s in stack_lengths if s > max(ratios)]
                at = min(past) if past else None
            bounds.setdefault(model["head_dim"], []).append(at)
    return bounds


@pytest.mark.parametrize("cpu_class", ["avx512", "avx2"])
def test_each_class_table_in_code_is_its_committed_benchmark_results(cpu_class):
    """Per CPU class, mask kind, form and head dim: the largest crossover of the kind's runs, each
    run measured on a machine of that class (its kernel build), unless the kind is borrowed; for
    the FlashAttention forms, also of the real-size exports' runs where the class lists them."""
    table = forms.CPU_CROSSOVERS[cpu_class]
    assert set(table) == set(forms.MASK_KINDS) == set(forms.RESULTS_FILES[cpu_class])
    assert set(forms.REAL_SIZE_FILES.get(cpu_class, {})) <= set(forms.MASK_KINDS)
    for kind, by_form in table.items():
        runs = [json.loads((RESULTS_DIR / f"{name}.json").read_text()) for name in forms.RESULTS_FILES[cpu_class][kind]]
        measured_on = forms.BORROWED.get(cpu_class, {}).get(kind, cpu_class)
        assert {run["machine"]["kernel_isa"] for run in runs} == {measured_on}, (cpu_class, kind)
        exports = _real_size_bounds(cpu_class, kind, {s for run in runs for s in run["seq_lens"]})
        assert set(exports) <= set(by_form["naive"]), (cpu_class, kind, exports)  # a head dim the table has
        for form, by_dim in by_form.items():
            for dim, at in by_dim.items():
                # a run that timed some forms only (the Xeon's bias check) bounds those
                measured = [run["forms"][form][str(dim)]["crossover"] for run in runs if form in run["forms"]]
                if form in forms.REAL_SIZE_FORMS:
                    measured += exports.get(dim, [])
                assert at == (None if None in measured else max(measured)), (cpu_class, kind, form, dim, measured)
        assert {int(d) for d in runs[0]["forms"]["naive"]} == set(by_form["naive"]), kind
        assert max(runs[0]["seq_lens"]) == forms.MEASURED_UP_TO, kind
    for kind, lender in forms.BORROWED.get(cpu_class, {}).items():  # a borrowed row is the lender's, whole
        assert table[kind] == forms.CPU_CROSSOVERS[lender][kind]


def test_the_real_size_results_are_their_committed_runs():
    """Each real-size file holds the ratios of the run it names (the AVX2 one: the committed
    markdown table of the default's run, at the lengths its fused branch ran), and its summary rows
    are the bounds the table reads."""
    import re

    for cpu_class, by_kind in forms.REAL_SIZE_FILES.items():
        for names in by_kind.values():
            for name in names:
                doc = json.loads((RESULTS_DIR / f"{name}.json").read_text())
                for kind, by_dim in doc["rows"].items():
                    for dim, row in by_dim.items():
                        got = _real_size_bounds(cpu_class, kind, set(doc["stack_lengths"]), (name,))[int(dim)]
                        assert row["bound"] == (None if None in got else max(got)), (name, kind, dim)  # type: ignore[type-var]
                assert doc["models"] and all(m["cpu_time_ratios"] for m in doc["models"].values()), name
    avx2 = json.loads((RESULTS_DIR / "crossover_real_size_avx2.json").read_text())
    table = (RESULTS_DIR / "default_real_size_avx2.md").read_text()
    cells = re.findall(r"^\| (\w+) \| \d+ x (\d+) \| (\d+) \| ([\d.]+)x \|", table, re.M)
    fused = {(m, int(s)): float(r) for m, _, s, r in cells if int(s) >= 256}  # naive from 256 keys in that run
    held = {(m, int(s)): r for m, d in avx2["models"].items() for s, r in d["cpu_time_ratios"].items()}
    assert held == fused and len(held) == 4


def test_the_avx2_padding_row_waits_for_the_real_size_exports():
    """The AVX2 stack fused a padding block from 256 keys at both head dims; the 6x64 BERT export
    ran 0.84x at 256 and 0.93x at 512 fused, MiniLM-L6 (12x32) 0.96x at 256: the default now
    dispatches from 1024 (D=64) and 512 (D=32), and the row names both results files."""
    policy = SoftmaxPolicy.for_new_nodes(online_softmax=True)
    for dim, start in ((32, 512), (64, 1024)):
        dynamic = forms.choose("ortflash", policy, dim, None, "padding", can_dispatch=True, cpu_class="avx2")
        assert dynamic.dispatch_from == start, (dim, dynamic)
        assert "crossover_cpu.md and benchmarks/results/crossover_real_size_avx2.md" in dynamic.detail
        assert not forms.choose("ortflash", policy, dim, [start // 2], "padding", cpu_class="avx2").fused
        assert forms.choose("ortflash", policy, dim, [start], "padding", cpu_class="avx2").fused


def test_the_generic_table_is_the_later_crossover_of_the_measured_classes():
    """The build for a CPU without AVX2 was not measured: it fuses only where both classes did."""
    generic = forms.CPU_CROSSOVERS["generic"]
    for kind, by_form in generic.items():
        for form, by_dim in by_form.items():
            for dim, at in by_dim.items():
                values = [forms.CPU_CROSSOVERS[c][kind][form][dim] for c in forms.GENERIC_FROM]
                assert at == (None if None in values else max(values)), (kind, form, dim)  # type: ignore[type-var]


def _a_crossover_the_classes_disagree_on() -> tuple[int, str, int, int]:
    """(head dim, form, AVX-512 crossover, AVX2 crossover) of the no-mask row where both classes
    have one and they differ."""
    fast, slow = forms.CPU_CROSSOVERS["avx512"]["none"], forms.CPU_CROSSOVERS["avx2"]["none"]
    for form in ("naive", "online"):
        for dim in (32, 64):
            a, b = fast[form][dim], slow[form][dim]
            if a != b:
                return dim, form, a, b  # type: ignore[return-value]
    raise AssertionError("the AVX-512 and AVX2 tables agree on every no-mask FlashAttention entry")


def test_the_cpu_class_asked_for_decides_the_form_and_the_row_says_which_table():
    """The same block, at a length between the two classes' crossovers: fused by the table of the
    class that wins there, kept by the other's; each row's detail names the table it read."""
    dim, form, a, b = _a_crossover_the_classes_disagree_on()
    winner, loser = ("avx512", "avx2") if (b is None or (a is not None and a < b)) else ("avx2", "avx512")
    at = min(x for x in (a, b) if x is not None)
    _, fused = optimize(_static(at, dim), softmax=form, cpu_class=winner, **NO_CHECK)
    _, kept = optimize(_static(at, dim), softmax=form, cpu_class=loser, **NO_CHECK)
    assert fused.fused == 1 and kept.fused == 0, (dim, form, a, b)
    names = {"avx512": "the AVX-512 CPU table", "avx2": "the AVX2 CPU table"}
    assert names[winner] in fused.blocks[0].detail and names[loser] in kept.blocks[0].detail


def test_without_a_class_the_running_machines_table_decides(monkeypatch):
    """optimize() reads the class of the kernel build it runs (conftest pins it for the suite)."""
    dim, form, a, b = _a_crossover_the_classes_disagree_on()
    at = min(x for x in (a, b) if x is not None)
    answers = {}
    for cpu_class in ("avx512", "avx2"):
        monkeypatch.setattr(forms, "running_cpu_class", lambda c=cpu_class: c)
        _, report = optimize(_static(at, dim), softmax=form, **NO_CHECK)
        _, asked = optimize(_static(at, dim), softmax=form, cpu_class=cpu_class, **NO_CHECK)
        answers[cpu_class] = report.fused
        assert report.fused == asked.fused and report.blocks[0].detail == asked.blocks[0].detail
    assert answers["avx512"] != answers["avx2"]
    monkeypatch.undo()  # the real one: the kernel build's class
    from ortflash.kernels import cpu

    assert forms.running_cpu_class() == forms.cpu_class_of(cpu.isa()) in forms.CPU_CLASSES
    assert [forms.cpu_class_of(i) for i in ("avx512", "avx2", "generic", "reference")] == [
        "avx512",
        "avx2",
        "generic",
        "generic",
    ]


def test_a_kind_not_measured_on_the_class_says_whose_row_it_read(monkeypatch):
    policy = SoftmaxPolicy.for_new_nodes()
    for kind in forms.MASK_KINDS:  # the real table: a row says it is borrowed exactly where it is
        borrowed = kind in forms.BORROWED.get("avx512", {})
        said = forms.choose("ortflash", policy, 64, [16], kind, cpu_class="avx512").detail
        assert (f"its {kind} row is the AVX2 measurement: not measured on AVX-512" in said) == borrowed, kind
    monkeypatch.setattr(forms, "BORROWED", {"avx512": {"causal": "avx2"}})
    detail = forms.choose("ortflash", policy, 64, [16], "causal", cpu_class="avx512").detail
    assert "its causal row is the AVX2 measurement: not measured on AVX-512" in detail
    assert "AVX2 measurement" not in forms.choose("ortflash", policy, 64, [16], "padding", cpu_class="avx512").detail
    assert "not measured apart" in forms.choose("ortflash", policy, 64, [16], "padding", cpu_class="generic").detail


def test_an_unknown_cpu_class_is_refused():
    from ortflash.errors import OrtflashError

    with pytest.raises(OrtflashError, match="cpu_class must be one of avx512, avx2, generic"):
        optimize(_static(16), cpu_class="sse2", **NO_CHECK)


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
    assert forms.mask_kind(True, ()) == "causal"
    assert forms.mask_kind(True, (1,)) == "causal_padding" and forms.parent_kind("causal_padding") == "causal"
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
    # a full per-query bias ([B, H, S, T]): the kind no form beats at some head dim of some class
    never = [
        (c, d) for c, table in forms.CPU_CROSSOVERS.items() for d, at in table["bias"]["online"].items() if at is None
    ]
    assert never, "online beats the original ops at some length at every measured head dim of every class"
    cpu_class, dim = never[0]
    model = build(Variant(head_dim=dim, bias_shapes=(("B", "H", "S", "T"),)))
    out, report = optimize(model, online_softmax=True, cpu_class=cpu_class, **NO_CHECK)
    assert report.fused == 0 and out is model and report.blocks[0].mask_kind == "bias"
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
    for cpu_class, table in forms.CPU_CROSSOVERS.items():
        for kind, by_form in table.items():
            for form, by_dim in by_form.items():
                values = [by_dim[d] for d in expected]
                want = None if any(v is None for v in values) else max(values)  # type: ignore[type-var]
                assert forms.crossover(form, head_dim, kind, cpu_class=cpu_class) == want, (kind, form, head_dim)


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
    element type, says the lowered form is faster (float16, no mask: from 64 keys; contrib on the
    CPU EP at head dim 64 wins only from 512-1024 keys, on both CPU classes)."""
    for cpu_class in ("avx512", "avx2"):
        _, cpu = optimize(_static_f16(64, 64), ep="cpu", cpu_class=cpu_class, **NO_CHECK)
        assert cpu.fused == 0, cpu_class
    _, cuda = optimize(_static_f16(64, 64), ep="cuda", **NO_CHECK)
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
    assert not forms.choose("cuda", policy, 128, [512], "causal", "cuda", "float16").fused
    assert forms.choose("cuda", policy, 64, [512], "causal", "cuda", "float16").fused  # every length at D64
    assert forms.choose("cuda", policy, 64, [1024], "causal", "cuda", "float16").fused  # test_cuda_costs
    assert forms.choose("cuda", policy, 128, [4096], "causal", "cuda", "float16").fused
    # an element type without a table of its own is decided as float32, the table that keeps most
    unknown = forms.choose("cuda", policy, 64, [4096], "padding", "cuda", None)
    assert not unknown.fused and "as float32" in unknown.detail
    # where --ep cuda falls back to contrib (a block cuda cannot lower), the same row decides
    assert not forms.choose("contrib", policy, 64, None, "causal", "cuda", "float32").fused


def test_the_cuda_table_is_its_committed_benchmark_results():
    doc = json.loads((RESULTS_DIR / "crossover_cuda.json").read_text())
    kinds = {"padding": "padding", "causal_mask": "causal", "nomask": "none", "bias": "bias"}
    cuda_ep = PROVIDERS["cuda"]
    assert (
        cuda_ep.measured.costs is cuda_measured.CROSSOVERS
        and cuda_ep.measured.results == "benchmarks/results/crossover_cuda.md"
    )
    assert set(doc["by_dtype"]) == set(cuda_measured.CROSSOVERS)
    for dtype, by_stack in doc["by_dtype"].items():
        assert set(by_stack) == set(kinds)
        for stack, kind in kinds.items():
            rows = by_stack[stack]["cuda"]
            assert {int(d) for d in rows} == set(cuda_measured.CROSSOVERS[dtype][kind]["cuda"]), (dtype, stack)
            # float16 causal D64/D128: cuda_measured.CAUSAL_RESULTS' own-causal forms, held there by test_cuda_costs
            later = {64, 128} if (dtype, kind) == ("float16", "causal") else set()
            for dim, row in rows.items():
                if int(dim) not in later:
                    assert cuda_measured.CROSSOVERS[dtype][kind]["cuda"][int(dim)] == row["crossover"], (
                        dtype,
                        stack,
                        dim,
                    )
                # contrib writes the ops the cuda target chooses among: it takes the measured row
                assert cuda_measured.CROSSOVERS[dtype][kind]["contrib"][int(dim)] == row["crossover"], (
                    dtype,
                    stack,
                    dim,
                )
    assert max(doc["seq_lens"]) == cuda_ep.measured.measured_up_to
    # the table an unknown element type takes keeps every block any other table keeps
    taken = cuda_measured.CROSSOVERS[cuda_ep.measured.unknown_dtype]
    for table in cuda_measured.CROSSOVERS.values():
        for kind, by_form in table.items():
            for dim, at in by_form["cuda"].items():
                mine = taken.get(kind, taken[forms.parent_kind(kind)])["cuda"][dim]
                assert mine is None or (at is not None and mine >= at), (kind, dim)


def test_the_webgpu_table_is_its_committed_benchmark_results():
    doc = json.loads((RESULTS_DIR / "crossover_webgpu.json").read_text())
    for stack, kind in (("padding", "padding"), ("causal", "causal")):
        for dim, row in doc["by_stack"][stack]["webgpu"].items():
            assert webgpu.CROSSOVERS[kind]["webgpu"][int(dim)] == row["crossover"], (stack, dim)
    # the kinds not measured take the padding row, the slower of the two
    assert webgpu.CROSSOVERS["none"] == webgpu.CROSSOVERS["bias"] == webgpu.CROSSOVERS["padding"]
    assert max(doc["seq_lens"]) == PROVIDERS["webgpu"].measured.measured_up_to
    assert PROVIDERS["webgpu"].measured.cost_table("float16") is webgpu.CROSSOVERS  # one table for every element type


def test_ep_webgpu_keeps_a_short_block_that_the_webgpu_table_says_is_slower_and_says_so():
    _, short = optimize(_static(128), ep="webgpu", **NO_CHECK)
    assert short.fused == 0 and "crossover_webgpu" in short.blocks[0].detail, short.blocks[0].detail
    # causal: held-out exports at parity up to 512 keys (benchmarks/results/webgpu_outside.md)
    assert not forms.choose("webgpu", SoftmaxPolicy.for_new_nodes(), 32, [128], "causal", "webgpu").fused
    assert forms.choose("webgpu", SoftmaxPolicy.for_new_nodes(), 32, [1024], "causal", "webgpu").fused
    assert not forms.choose("webgpu", SoftmaxPolicy.for_new_nodes(), 32, [1024], "padding", "webgpu").fused
    assert forms.choose("webgpu", SoftmaxPolicy.for_new_nodes(), 64, [2048], "padding", "webgpu").fused


def test_the_avx512_padding_row_is_bounded_by_both_machines_native_op_runs():
    """The AVX-512 padding row reads the real-size runs through the native op on both machines of the
    class: the Xeon's (MiniLM-L6 from 128, the 6x64 BERT from 32) and the Zen 5's with the current
    kernel (both from 512: the BERT 0.93x at 197), so the later, 512 / 512; not the bridge-era runs."""
    assert forms.REAL_SIZE_FILES["avx512"]["padding"] == (
        "crossover_real_size_avx512_native",
        "crossover_real_size_avx512_zen5",
    )
    policy = SoftmaxPolicy.for_new_nodes(online_softmax=True)
    for dim, start in ((32, 512), (64, 512)):
        dynamic = forms.choose("ortflash", policy, dim, None, "padding", can_dispatch=True, cpu_class="avx512")
        assert dynamic.dispatch_from == start, (dim, dynamic)
        assert "crossover_real_size_avx512_zen5.md" in dynamic.detail
        assert "crossover_real_size_avx512_run2" not in dynamic.detail


def test_a_third_ep_is_a_record_the_choice_reads(monkeypatch):
    """An EP's cost table, longest measured length and results file come from its record
    (lowering/targets.PROVIDERS): a new EP is a record with its table, no branch in forms.py."""
    by_dtype = {"float16": {kind: {"contrib": {64: 512}} for kind in forms.MASK_KINDS}}
    npu = ExecutionProvider(
        "npu",
        ("contrib",),
        CostRecord(measured_up_to=1024, costs=by_dtype, unknown_dtype="float16", results="npu_results.md"),
    )
    monkeypatch.setattr(forms, "PROVIDERS", {**PROVIDERS, "npu": npu})
    policy = SoftmaxPolicy.for_new_nodes()
    short = forms.choose("contrib", policy, 64, [256], "padding", "npu", "float16")
    assert not short.fused and "only from 512" in short.detail and "npu_results.md" in short.detail, short.detail
    assert forms.choose("contrib", policy, 64, [512], "padding", "npu", "float16").fused
    unknown = forms.choose("contrib", policy, 64, [256], "padding", "npu", None)
    assert not unknown.fused and "without a table of its own (as float16)" in unknown.detail, unknown.detail
    # a form the record's table has no row for: fused as asked, the record's name in the reason
    assert "on the npu EP" in forms.choose("onnx", policy, 64, [256], "padding", "npu", "float16").why
    # an EP without a record: the target's own form, said so
    assert "no measured cost table for the tpu EP" in forms.choose("contrib", policy, 64, [256], "padding", "tpu").why
