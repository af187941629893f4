#!/usr/bin/env python
"""ONNX's own test cases for the Attention op, through ortflash: how many run as FlashAttention.

The onnx package ships the generators of its backend node tests (``onnx.backend.test.case.node``):
every ``test_attention_*`` case is one Attention node (opset 23 or 24) with inputs and the outputs
ONNX's reference computes, and each ``*_expanded`` case is the same node written as its function
body (MatMuls, Softmax, Where, ...), which ortflash must fuse back from the primitives.

For each case this runs the model in ONNX Runtime, optimizes it with ``--target ortflash``, and
checks the optimized model against the original in ONNX Runtime with ``ortflash.verify`` on the
case's own inputs. A case counts as run as FlashAttention when every Attention node (or the whole
expanded body) became FlashAttention nodes and verify passes; every other case is listed with its
reason (ONNX Runtime's error, the reason ortflash kept the block, or the verify failure).

    python benchmarks/onnx_attention_cases.py                 # writes benchmarks/results/onnx_attention_cases.md
    python benchmarks/onnx_attention_cases.py --only 4d_gqa   # cases whose name contains it, printed only
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import subprocess
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

ort.set_default_logger_severity(3)

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"


@dataclass
class CaseResult:
    name: str
    expanded: bool
    ort_runs: bool
    fused_nodes: int
    ok: bool
    reason: str  # "" where it ran as FlashAttention


def attention_cases() -> list:
    """ONNX's Attention node test cases (with their expanded twins), generated from the onnx package.

    Only the Attention generator module is imported: ``collect_testcases`` imports every op's
    (about 40 s here); the module-level filter it sets is the one that keeps the others out."""
    import onnx.backend.test.case.node as node_cases

    node_cases._TargetOpType = "Attention"  # type: ignore[attr-defined]
    import onnx.backend.test.case.node.attention  # noqa: F401  (registers its cases on import)

    cases = [c for c in node_cases._NodeTestCases if c.name.startswith("test_attention")]  # type: ignore[attr-defined]
    return sorted(cases, key=lambda c: c.name)


def _feeds(case) -> dict[str, np.ndarray]:
    inputs, _ = case.data_sets[0]
    names = [i.name for i in case.model.graph.input]
    return {n: np.asarray(v) for n, v in zip(names, inputs)}


def _ort_error(exc: Exception) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:200]


def _fuse(case) -> tuple[onnx.ModelProto | None, int, str]:
    """(the optimized model, its FlashAttention nodes, why the case is not run as FlashAttention)."""
    import ortflash
    from ortflash.errors import OrtflashError

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            fused, report = ortflash.optimize(case.model, target="ortflash")
        except OrtflashError as exc:
            return None, 0, f"optimize refused: {exc}"
    flash = sum(n.op_type == "FlashAttention" for n in fused.graph.node)
    left = any(n.op_type == "Attention" for n in fused.graph.node)
    kept = [b.reason for b in report.blocks if not b.fused]
    if not flash or left or kept:
        reason = "; ".join(kept) or ("no block found" if not left else "the Attention node stays")
        return fused, flash, f"kept: {reason}"
    return fused, flash, ""


def _against_reference(case, fused: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> str:
    """The optimized model against the outputs ONNX's reference gives for the case ("" where they
    agree within verify's tolerance), for a case whose original ONNX Runtime does not run."""
    import ortflash
    from ortflash.checks.compare import compare_outputs, tolerance

    _, outputs = case.data_sets[0]
    names = [o.name for o in case.model.graph.output]
    expected = {n: np.asarray(v) for n, v in zip(names, outputs)}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = ortflash.InferenceSession(fused).run(None, feeds)
    except Exception as exc:  # noqa: BLE001 - the session's refusal is the reason
        return f"the optimized model does not run: {_ort_error(exc)}"
    actual = dict(zip([o.name for o in fused.graph.output], got))
    rtol, atol = tolerance(case.model, None, None)
    bad = [d for d in compare_outputs(expected, actual, rtol, atol) if not d.ok]
    if bad:
        worst = max(bad, key=lambda d: (d.nan_mismatch, d.of_tolerance))
        how = worst.problem or (
            f"{worst.nan_mismatch} NaN mismatches"
            if worst.nan_mismatch
            else f"off by {worst.max_abs:.2g} ({worst.of_tolerance:.3g} x tolerance)"
        )
        return f"differs from ONNX's reference: {worst.name} {how}"
    return ""


def run_case(case) -> CaseResult:
    """The case through ortflash: optimized, then verified against the original in ONNX Runtime,
    or, where ONNX Runtime does not run the original, against ONNX's reference outputs."""
    import ortflash
    from ortflash.errors import OrtflashError

    expanded = case.name.endswith("_expanded")
    feeds = _feeds(case)
    try:
        quiet = ort.SessionOptions()
        quiet.log_severity_level = 4  # its refusal is recorded below, not logged
        session = ort.InferenceSession(case.model.SerializeToString(), quiet, providers=["CPUExecutionProvider"])
        run_options = ort.RunOptions()
        run_options.log_severity_level = 4
        session.run(None, feeds, run_options)
        ort_error = ""
    except Exception as exc:  # noqa: BLE001 - ONNX Runtime's own refusal is recorded
        ort_error = _ort_error(exc)
    fused, flash, why = _fuse(case)
    if why or fused is None:
        prefix = f"ONNX Runtime does not run the original ({ort_error}); " if ort_error else ""
        return CaseResult(case.name, expanded, not ort_error, flash, False, prefix + why)
    if ort_error:
        why = _against_reference(case, fused, feeds)
        return CaseResult(case.name, expanded, False, flash, not why, why and f"{why} (ONNX Runtime: {ort_error})")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            result = ortflash.verify(case.model, fused, feeds)
        except OrtflashError as exc:
            return CaseResult(case.name, expanded, True, flash, False, f"verify could not run: {exc}")
    if not result.ok:
        worst = max(result.outputs.values(), key=lambda d: d.of_tolerance)
        why = f"verify failed: {worst.name} off by {worst.max_abs:.2g} ({worst.of_tolerance:.3g} x tolerance)"
        return CaseResult(case.name, expanded, True, flash, False, why)
    return CaseResult(case.name, expanded, True, flash, True, "")


def _machine() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        return next((ln.split(":", 1)[1].strip() for ln in out.splitlines() if ln.startswith("Model name")), "")
    except OSError:
        return platform.processor()


def table(results: list[CaseResult]) -> str:
    import ortflash

    direct = [r for r in results if not r.expanded]
    bodies = [r for r in results if r.expanded]
    lines = [
        "# ONNX's own Attention test cases through ortflash",
        "",
        f"Made by `python benchmarks/onnx_attention_cases.py` on {datetime.date.today()} "
        f"({_machine()}; onnx {onnx.__version__}, onnxruntime {ort.__version__}, ortflash {ortflash.__version__}).",
        "",
        "Cases: the `test_attention_*` node tests onnx generates (`onnx.backend.test.case.node.attention`), each run",
        'on its own inputs: the original in ONNX Runtime, `ortflash.optimize(target="ortflash")`, and',
        "`ortflash.verify` of the optimized model against the original. `*_expanded` cases are the op's",
        "function body in primitives, which must be fused back.",
        "",
        "| cases | ONNX Runtime runs the original | run as FlashAttention, verified |",
        "| --- | --- | --- |",
        f"| Attention nodes | {sum(r.ort_runs for r in direct)} of {len(direct)} | "
        f"{sum(r.ok for r in direct)} of {len(direct)} |",
        f"| expanded bodies | {sum(r.ort_runs for r in bodies)} of {len(bodies)} | "
        f"{sum(r.ok for r in bodies)} of {len(bodies)} |",
        f"| all | {sum(r.ort_runs for r in results)} of {len(results)} | {sum(r.ok for r in results)} of {len(results)} |",
        "",
        "A case ONNX Runtime does not run (Attention-25's window, bfloat16, a mask over fewer keys than",
        "past + new) counts as run as FlashAttention where its optimized model matches ONNX's reference",
        "outputs, the ones the case ships.",
        "",
        *_grouped(results),
        "",
        "## Every case not run as FlashAttention, and why",
        "",
        "| case | reason |",
        "| --- | --- |",
    ]
    lines += [f"| {r.name} | {r.reason.replace('|', '/')} |" for r in results if not r.ok]
    return "\n".join(lines) + "\n"


# The reasons that account for the cases left, by the words their reason holds.
_GROUPS = (
    (
        ("qk_matmul_output", "is read by Identity, MatMul"),
        "ask for the score or probability matrix as an output (qk_matmul_output, or the expanded body's "
        "Softmax read by an Identity to a graph output): the [B, H, Sq, T] matrix is then made whatever "
        "computes Y, so a fused op would add work, not save it",
    ),
    (("BFLOAT16", "bf16"), "are bfloat16, which neither ONNX Runtime's CPU kernels nor FlashAttention run"),
)


def _grouped(results: list[CaseResult]) -> list[str]:
    left = [r for r in results if not r.ok]
    lines = [f"{len(left)} cases are not run as FlashAttention:"]
    counted: set[str] = set()
    for words, meaning in _GROUPS:
        hits = [r for r in left if r.name not in counted and any(w in r.reason or w in r.name for w in words)]
        counted |= {r.name for r in hits}
        if hits:
            lines.append(f"- {len(hits)} {meaning};")
    rest = [r for r in left if r.name not in counted]
    if rest:
        lines.append(f"- {len(rest)} for the reasons listed below.")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", help="run the cases whose name contains this, and print them (nothing written)")
    parser.add_argument("--out", default=str(RESULTS / "onnx_attention_cases"), help="results path, without suffix")
    args = parser.parse_args(argv)
    cases = attention_cases()
    if args.only:
        cases = [c for c in cases if args.only in c.name]
    results = []
    for case in cases:
        r = run_case(case)
        results.append(r)
        print(f"{r.name}: {'ok' if r.ok else r.reason}", file=sys.stderr)
    if args.only:
        return 0
    Path(args.out + ".md").write_text(table(results))
    Path(args.out + ".json").write_text(json.dumps([r.__dict__ for r in results], indent=1) + "\n")
    print(table(results).split("## Every")[0])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
