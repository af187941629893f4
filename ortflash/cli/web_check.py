"""``ortflash web-check MODEL``: a lowered model in onnxruntime-web, onnxruntime-node, the WebGPU
plugin EP or a headless browser, against ONNX Runtime in Python."""

from __future__ import annotations

import argparse

from ..arg_types import console_for
from ..checks.compare import tolerance, tolerance_text
from ..model_io import load
from ..report import result_document
from .args import EXIT_MISMATCH, EXIT_OK, add_feeds
from .inputs import load_feeds
from .output import print_diffs, write_json

HELP = "run a lowered model in onnxruntime-web / onnxruntime-node and compare with ONNX Runtime"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "model", help="a model without FlashAttention nodes (ortflash optimize ... --target contrib or --target onnx)"
    )
    p.add_argument(
        "--runtime",
        choices=("web-wasm", "node-cpu", "node-webgpu", "python-webgpu", "browser-wasm", "browser-webgpu"),
        default="web-wasm",
        help="web-wasm: onnxruntime-web's wasm backend under Node; node-cpu / node-webgpu: onnxruntime-node's "
        "CPU / WebGPU execution provider; python-webgpu: onnxruntime with the onnxruntime-ep-webgpu plugin; "
        "browser-wasm / browser-webgpu: onnxruntime-web in headless Chromium (selenium) (default %(default)s)",
    )
    add_feeds(p)


def run(args: argparse.Namespace) -> int:
    from ..checks.verify_result import diff_dict
    from ..checks.web_check import web_check

    console = console_for(args)
    model = load(args.model)
    rtol, atol = tolerance(model, args.rtol, args.atol)
    diffs = web_check(model, load_feeds(args, model), runtime=args.runtime, rtol=rtol, atol=atol)
    ok = print_diffs(diffs, console, f"ONNX Runtime (Python, CPU) vs {args.runtime}")
    console.print(f"tolerance: {tolerance_text(rtol, atol)}", markup=False)
    console.print(
        f"web-check: outputs match in {args.runtime}"
        if ok
        else f"[red]web-check FAILED[/]: outputs differ in {args.runtime}"
    )
    code = EXIT_OK if ok else EXIT_MISMATCH
    write_json(
        args,
        result_document(
            "web-check",
            code,
            model=args.model,
            web_check={
                "runtime": args.runtime,
                "rtol": rtol,
                "atol": atol,
                "ok": ok,
                "outputs": [diff_dict(d) for d in diffs],
            },
        ),
    )
    return code
