"""``ortflash validate ORIGINAL``: each fused node's kernel (cpu, reference or wgpu) against the
naive ONNX Runtime subgraph it replaces, node by node."""

from __future__ import annotations

import argparse
from dataclasses import asdict
from types import MappingProxyType

from ..arg_types import console_for, positive_int
from ..checks.compare import tolerance, tolerance_text
from ..kernels.config import BACKENDS, DEFAULT_BACKEND
from ..pipeline.optimize import optimize
from ..report import result_document
from .args import EXIT_MISMATCH, EXIT_OK, add_feeds, policy_from_args
from .inputs import check_dims, load_feeds, load_with_weights
from .output import ERROR_COLUMNS, error_cells, finite, print_results, write_json

HELP = "check each fused node's kernel against the naive ORT subgraph"
# `validate --backend wgsl`: the name the CLI used for the wgpu backend before the names were shared
BACKEND_ALIASES = MappingProxyType({"wgsl": "wgpu"})


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("original")
    p.add_argument("--optimized", help="a fused model of ORIGINAL (default: optimize ORIGINAL now)")
    p.add_argument(
        "--backend",
        choices=(*BACKENDS, *BACKEND_ALIASES),
        default=DEFAULT_BACKEND,
        help="kernel to check: cpu (compiled), reference (numpy) or wgpu (the WGSL shaders; "
        "wgsl is another name for it) (default %(default)s)",
    )
    p.add_argument("--softmax", choices=("naive", "online"), help="softmax to run (default: each node's own)")
    p.add_argument("--block-size", type=positive_int, help="keys per tile for online (default: each node's own)")
    add_feeds(p)


def _backend_label(backend: str) -> str:
    if backend == "wgpu":
        from ..kernels.wgpu import kernel as wgpu_kernel

        info = wgpu_kernel.adapter_info()  # device, backend, driver, features...
        details = ", ".join(str(info[k]) for k in ("backend", "driver") if info.get(k))
        return f"WGSL on {info.get('device', 'an unnamed adapter')}" + (f" ({details})" if details else "")
    return {"cpu": "the compiled CPU kernel", "reference": "numpy (CPU)"}[backend]


def run(args: argparse.Namespace) -> int:
    from ..checks.feeds import make_feeds
    from ..checks.validate import check_derived, in_subgraphs, validate, validate_random

    console = console_for(args)
    backend = BACKEND_ALIASES.get(args.backend, args.backend)
    original = load_with_weights(args.original)
    optimized = load_with_weights(args.optimized) if args.optimized else optimize(original, target="ortflash")[0]
    if args.optimized:
        check_derived(original, optimized, args.original, args.optimized)
    rtol, atol = tolerance(original, args.rtol, args.atol)
    options = {"backend": backend, "policy": policy_from_args(args), "rtol": rtol, "atol": atol}
    notes = []
    if args.feeds:  # the user's inputs: never resized
        checks = validate(original, optimized, load_feeds(args, original), **options)
    else:  # random ones: at batch 1 where the model does not run at --batch (a note says so), as verify
        check_dims(args, original)
        checks, batch_note = validate_random(
            original,
            optimized,
            lambda batch: make_feeds(original, seq_len=args.seq_len, batch=batch, dims=dict(args.dim)),
            args.batch,
            **options,
        )
        notes += [batch_note] if batch_note else []
    for note in notes:
        console.print(f"note: {note}", markup=False)
    ok = True
    unchecked = in_subgraphs(optimized)
    if unchecked:
        console.print(
            f"{unchecked} fused node{'s' if unchecked != 1 else ''} inside If/Loop/Scan bodies not validated node by "
            "node (ONNX Runtime cannot expose a subgraph's values); `ortflash verify` checks them end to end",
            markup=False,
        )
    if not checks:
        console.print("no FlashAttention node to validate")
    else:
        rows = [((c.node, c.replaces, c.mode, c.shapes, *error_cells(c)), c.ok) for c in checks]
        ok = print_results(
            console,
            f"each fused node, {_backend_label(backend)}, against the naive ONNX Runtime subgraph",
            ("node", "replaces", "softmax", "shapes", *ERROR_COLUMNS),
            rows,
            fold=True,
        )
        console.print(f"tolerance: {tolerance_text(rtol, atol)}", markup=False)
        agree = f"{len(checks)} fused node agrees" if len(checks) == 1 else f"{len(checks)} fused nodes agree"
        console.print(f"validated: {agree}" if ok else "[red]validation FAILED[/]")
    code = EXIT_OK if ok else EXIT_MISMATCH
    nodes = [
        {
            **asdict(c),
            "max_abs": finite(c.max_abs),
            "max_rel": finite(c.max_rel),
            "of_tolerance": finite(c.of_tolerance),
            "problem": c.problem or None,
        }
        for c in checks
    ]
    write_json(
        args,
        result_document(
            "validate",
            code,
            model=args.original,
            output=args.optimized,
            validation={"backend": backend, "rtol": rtol, "atol": atol, "ok": ok, "nodes": nodes},
            notes=notes,
        ),
    )
    return code
