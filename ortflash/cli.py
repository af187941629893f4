"""The ortflash command line: optimize, inspect, verify."""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

from . import spec
from .optimize import OrtflashError, external_locations, load, optimize, save
from .policy import SoftmaxPolicy

EXIT_OK, EXIT_MISMATCH, EXIT_USAGE = 0, 1, 2


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2 (argparse prints usage + error otherwise)
        self.exit(EXIT_USAGE, f"ortflash: error: {message} (see ortflash {self.prog.split()[-1]} --help)\n")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def _nonneg_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _add_policy(p: argparse.ArgumentParser, default_mode: str | None) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--online-softmax", action="store_true",
                   help="the proposal's switch: online softmax for key lengths >= --min-seq-len (same as --softmax auto)")
    g.add_argument("--softmax", choices=spec.SOFTMAX_MODES, default=default_mode,
                   help="softmax of the fused nodes" + (f" (default {default_mode})" if default_mode else ""))
    p.add_argument("--block-size", type=_positive_int, default=spec.ATTRIBUTES["block_size"].default,
                   help="keys per tile in the online softmax (default %(default)s)")
    p.add_argument("--min-seq-len", type=_nonneg_int, default=spec.ATTRIBUTES["min_seq_len"].default,
                   help="under auto, the key length from which online is used (default %(default)s)")


def _policy(args) -> SoftmaxPolicy | None:
    if args.online_softmax:
        return SoftmaxPolicy("auto", args.block_size, args.min_seq_len)
    if args.softmax:
        return SoftmaxPolicy(args.softmax, args.block_size, args.min_seq_len)
    return None


def _add_feeds(p: argparse.ArgumentParser) -> None:
    p.add_argument("--feeds", help=".npz file of inputs (default: random inputs with padded attention masks)")
    p.add_argument("--seq-len", type=_positive_int, default=16, help="sequence length of random inputs (default %(default)s)")
    p.add_argument("--batch", type=_positive_int, default=2, help="batch size of random inputs (default %(default)s)")
    p.add_argument("--rtol", type=float, default=None, help="relative tolerance (default 1e-4; 2e-2 for float16 models)")
    p.add_argument("--atol", type=float, default=None, help="absolute tolerance (default 1e-5; 2e-3 for float16 models)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="ortflash", description="Fuse attention in ONNX models into one FlashAttention op, and prove it.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("optimize", help="fuse attention blocks and write the new model")
    p.add_argument("model", help="input .onnx model (never modified)")
    p.add_argument("-o", "--output", help="output path (default: IN.flash.onnx)")
    _add_policy(p, None)
    p.add_argument("--target", choices=("ortflash", "contrib", "onnx"), default="ortflash",
                   help="ortflash: FlashAttention nodes (run with ortflash.session_options()); contrib: ONNX Runtime's "
                        "com.microsoft MultiHeadAttention/GroupQueryAttention; onnx: ONNX Attention (opset 23). A block no "
                        "native op computes exactly stays FlashAttention (default %(default)s)")
    p.add_argument("--verify", action="store_true", help="then run both models in ONNX Runtime and compare")
    _add_feeds(p)
    p.add_argument("--json", help="also write the report as JSON to this file")

    p = sub.add_parser("inspect", help="list every Softmax: fused or why not; writes nothing")
    p.add_argument("model")

    p = sub.add_parser("validate", help="check each fused node's kernel (numpy or WGSL) against the naive ORT subgraph")
    p.add_argument("original")
    p.add_argument("--optimized", help="a fused model of ORIGINAL (default: optimize ORIGINAL now)")
    p.add_argument("--backend", choices=("wgsl", "cpu"), default="cpu", help="kernel to check (default %(default)s)")
    p.add_argument("--softmax", choices=("naive", "online"), help="softmax to run (default: each node's own)")
    p.add_argument("--block-size", type=_positive_int, help="keys per tile for online")
    _add_feeds(p)

    p = sub.add_parser("web-check", help="run a lowered model in onnxruntime-web / onnxruntime-node and compare with ONNX Runtime")
    p.add_argument("model", help="a model without FlashAttention nodes (ortflash optimize ... --target contrib or --target onnx)")
    p.add_argument("--runtime", choices=("web-wasm", "node-cpu", "node-webgpu"), default="web-wasm",
                   help="web-wasm: onnxruntime-web's wasm backend under Node; node-cpu / node-webgpu: onnxruntime-node's "
                        "CPU / WebGPU execution provider (default %(default)s)")
    _add_feeds(p)

    from . import bench as _bench

    p = sub.add_parser("bench", help="latency and peak memory of each variant against sequence length, one process each")
    _bench.add_arguments(p)

    p = sub.add_parser("verify", help="compare an optimized model with its original in ONNX Runtime")
    p.add_argument("original")
    p.add_argument("optimized")
    _add_policy(p, None)
    _add_feeds(p)
    return parser


def _load_feeds(args, model):
    from .verify import make_feeds

    if not args.feeds:
        return make_feeds(model, seq_len=args.seq_len, batch=args.batch)
    if not os.path.exists(args.feeds):
        raise OrtflashError(f"{args.feeds}: no such feeds file")
    try:
        with np.load(args.feeds) as data:
            return {k: data[k] for k in data.files}
    except Exception as exc:
        raise OrtflashError(f"{args.feeds}: not a readable .npz file ({type(exc).__name__})") from None


def _print_diffs(diffs, console, title="ONNX Runtime: original vs optimized") -> bool:
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    for col in ("output", "max abs err", "max rel err", "NaN mismatches", "result"):
        table.add_column(col)
    for d in diffs:
        table.add_row(d.name, f"{d.max_abs:.3g}", f"{d.max_rel:.3g}", str(d.nan_mismatch),
                      "[green]ok[/]" if d.ok else "[red]DIFFERENT[/]")
    console.print(table)
    return all(d.ok for d in diffs)


def _verify(original, optimized, args, console) -> int:
    """original/optimized: paths (external weights resolve) or protos."""
    from .verify import verify

    feeds = _load_feeds(args, load(original))
    try:
        diffs = verify(original, optimized, feeds, rtol=args.rtol, atol=args.atol)
    except OrtflashError:
        raise
    except Exception as exc:
        raise OrtflashError(f"ONNX Runtime could not run the models: {str(exc).splitlines()[0][:300]}") from None
    ok = _print_diffs(diffs, console)
    console.print("verified: outputs match" if ok else "[red]verification FAILED[/]: outputs differ")
    return EXIT_OK if ok else EXIT_MISMATCH


def _validate(args, console) -> int:
    from rich.table import Table

    from .validate import validate

    original = load(args.original)
    if external_locations(original):  # validate runs the graph from memory: bring the weights in
        import onnx

        original = onnx.load(args.original)
    optimized = load(args.optimized) if args.optimized else optimize(original)[0]
    if external_locations(optimized):
        import onnx

        optimized = onnx.load(args.optimized)
    feeds = _load_feeds(args, original)
    try:
        checks = validate(original, optimized, feeds, backend=args.backend, softmax=args.softmax,
                          block_size=args.block_size, rtol=args.rtol, atol=args.atol)
    except (RuntimeError, ValueError) as exc:
        raise OrtflashError(str(exc).splitlines()[0]) from None
    if not checks:
        console.print("no FlashAttention node to validate")
        return EXIT_OK
    where = "numpy (CPU)"
    if args.backend == "wgsl":
        from .ops import wgpu_kernel

        where = f"WGSL on {wgpu_kernel.adapter_info()}"
    table = Table(title=f"each fused node, {where}, against the naive ONNX Runtime subgraph", title_justify="left")
    for col in ("node", "replaces", "softmax", "shapes", "max abs err", "max rel err", "NaN mismatches", "result"):
        table.add_column(col, overflow="fold")
    for c in checks:
        table.add_row(c.node, c.replaces, c.mode, c.shapes, f"{c.max_abs:.3g}", f"{c.max_rel:.3g}",
                      str(c.nan_mismatch), "[green]ok[/]" if c.ok else "[red]DIFFERENT[/]")
    console.print(table)
    ok = all(c.ok for c in checks)
    console.print(f"validated: {len(checks)} fused nodes agree" if ok else "[red]validation FAILED[/]")
    return EXIT_OK if ok else EXIT_MISMATCH


def main(argv=None) -> int:
    from rich.console import Console

    console = Console()
    args = build_parser().parse_args(argv)
    try:
        if args.command == "optimize":
            policy = _policy(args) or SoftmaxPolicy("naive", args.block_size, args.min_seq_len)
            out_path = args.output or (args.model[:-5] if args.model.endswith(".onnx") else args.model) + ".flash.onnx"
            original = load(args.model)
            model, report = optimize(original, policy=policy, target=args.target)
            report.model = args.model
            report.print(console)
            if args.target != "ortflash":
                kept = [b for b in report.blocks if b.fused and b.target == "ortflash"]
                if kept:
                    console.print(f"[yellow]{len(kept)} block(s) stay FlashAttention[/]: the output still needs "
                                  "ortflash (ortflash.session_options()) to run")
            save(model, out_path, source_dir=os.path.dirname(os.path.abspath(args.model)))
            console.print(f"wrote {out_path}")
            if args.json:
                import json

                with open(args.json, "w") as f:
                    json.dump(report.to_dict(), f, indent=2)
            if args.verify:
                from .kernels import ort_bridge as ort_op

                ort_op.configure(policy=None)
                return _verify(args.model, out_path, args, console)
            return EXIT_OK
        if args.command == "inspect":
            _, report = optimize(args.model)
            report.model = args.model
            report.print(console)
            return EXIT_OK
        if args.command == "bench":
            from . import bench

            return bench.run(args)
        if args.command == "web-check":
            from .web_check import web_check

            model = load(args.model)
            diffs = web_check(model, _load_feeds(args, model), runtime=args.runtime, rtol=args.rtol, atol=args.atol)
            ok = _print_diffs(diffs, console, title=f"ONNX Runtime (Python, CPU) vs {args.runtime}")
            console.print(f"web-check: outputs match in {args.runtime}" if ok
                          else f"[red]web-check FAILED[/]: outputs differ in {args.runtime}")
            return EXIT_OK if ok else EXIT_MISMATCH
        if args.command == "validate":
            return _validate(args, console)
        if args.command == "verify":
            from .kernels import ort_bridge as ort_op

            load(args.original), load(args.optimized)  # one-line errors for bad files
            ort_op.configure(policy=_policy(args))
            return _verify(args.original, args.optimized, args, console)
    except OrtflashError as exc:
        print(f"ortflash: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("ortflash: interrupted", file=sys.stderr)
        return 130
    return EXIT_USAGE


def entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entry()
