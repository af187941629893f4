"""The ortflash command line's arguments: the parser of every command and the options they share.

The commands themselves (what each does with its arguments) are in ``ortflash.cli``.
"""

from __future__ import annotations

import argparse
import math
import signal
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, NoReturn

from . import __version__, spec
from .arg_types import int_at_least, positive_int, positive_ints
from .checks.compare import (
    FLOAT16_TOLERANCE,
    FLOAT32_TOLERANCE,
)
from .kernels.config import BACKENDS, DEFAULT_BACKEND
from .lowering import TARGETS
from .optimize import AUTO, EP_TARGETS, EXECUTION_PROVIDERS
from .policy import SoftmaxPolicy

if TYPE_CHECKING:
    pass

EXIT_OK = 0
EXIT_MISMATCH = 1  # a check ran and failed: outputs differ, or ONNX Runtime cannot load what was made
EXIT_USAGE = 2  # bad input or usage: one line on stderr
EXIT_INTERRUPTED = 128 + signal.SIGINT  # 130, as a shell reports a run stopped by Ctrl-C

ONNX_SUFFIX = ".onnx"
OPTIMIZED_SUFFIX = ".flash.onnx"
# A model whose --verify failed is written under this name (OUT.unverified.onnx), never at OUT.
UNVERIFIED_SUFFIX = ".unverified.onnx"
# `validate --backend wgsl`: the name the CLI used for the wgpu backend before the names were shared
BACKEND_ALIASES = MappingProxyType({"wgsl": "wgpu"})
# `--json -`: the JSON goes to stdout, and the tables to stderr
STDOUT = "-"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit 2 (argparse prints usage + error otherwise)
        self.exit(EXIT_USAGE, f"ortflash: error: {message} (see {self.prog} --help)\n")


def _nonneg_int(text: str) -> int:
    return int_at_least(text, 0, "must be >= 0")


def _tolerance(text: str) -> float:
    """argparse type of --rtol/--atol: a finite number >= 0 (a negative one fails every comparison)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value


def _add_policy(p: argparse.ArgumentParser, overrides: bool) -> None:
    """The softmax options; ``overrides``: they override the fused nodes' own (verify)."""
    g = p.add_mutually_exclusive_group()
    g.add_argument(
        "--online-softmax",
        action="store_true",
        help="the proposal's switch: online softmax for key lengths >= --min-seq-len (same as --softmax auto)",
    )
    g.add_argument(
        "--softmax",
        choices=spec.SOFTMAX_MODES,
        help="softmax of every fused node" + (" (default: each node's own)" if overrides else " (default naive)"),
    )
    keep = " with a softmax option; alone it overrides only this, each node keeping its softmax" if overrides else ""
    p.add_argument(
        "--block-size",
        type=positive_int,
        help=f"keys per tile in the online softmax (default {spec.ATTRIBUTES['block_size'].default}{keep})",
    )
    p.add_argument(
        "--min-seq-len",
        type=_nonneg_int,
        help=f"under auto, the key length from which online is used "
        f"(default {spec.ATTRIBUTES['min_seq_len'].default}{keep})",
    )


def policy_from_args(args: argparse.Namespace) -> SoftmaxPolicy | None:
    """The policy the softmax options ask for; None when none is given."""
    return SoftmaxPolicy.from_options(
        getattr(args, "softmax", None),
        getattr(args, "online_softmax", False) or None,
        getattr(args, "block_size", None),
        getattr(args, "min_seq_len", None),
    )


def new_nodes_policy(args: argparse.Namespace) -> SoftmaxPolicy:
    """The policy optimize writes on the nodes it creates: the options given, the defaults for the rest."""
    return SoftmaxPolicy.for_new_nodes(
        getattr(args, "softmax", None),
        getattr(args, "online_softmax", False) or None,
        getattr(args, "block_size", None),
        getattr(args, "min_seq_len", None),
    )


def _dim_setting(text: str) -> tuple[str, int]:
    """NAME=VALUE of --dim: a named input dim and its size."""
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name, _nonneg_int(value)


def _add_feeds(p: argparse.ArgumentParser) -> None:
    p.add_argument("--feeds", help=".npz file of inputs (default: random inputs with padded attention masks)")
    p.add_argument(
        "--dim",
        type=_dim_setting,
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="size of a named input dim in random inputs (repeatable; a decoder's mask length "
        "follows its past and new lengths unless set too)",
    )
    p.add_argument(
        "--seq-len", type=positive_int, default=16, help="sequence length of random inputs (default %(default)s)"
    )
    p.add_argument("--batch", type=positive_int, default=2, help="batch size of random inputs (default %(default)s)")
    (rtol, atol), (rtol16, atol16) = FLOAT32_TOLERANCE, FLOAT16_TOLERANCE
    p.add_argument(
        "--rtol",
        type=_tolerance,
        default=None,
        help=f"relative tolerance (default {rtol:g}; {rtol16:g} for float16 models)",
    )
    p.add_argument(
        "--atol",
        type=_tolerance,
        default=None,
        help=f"absolute tolerance (default {atol:g}; {atol16:g} for float16 models)",
    )


def _add_opt_level(p: argparse.ArgumentParser, when: str = "") -> None:
    """--ort-opt-level: the ONNX Runtime graph optimization level verify runs both models at."""
    from .checks.run import ORT_OPT_LEVELS
    from .checks.verify import VERIFY_OPT_LEVEL

    p.add_argument(
        "--ort-opt-level",
        choices=tuple(ORT_OPT_LEVELS),
        default=VERIFY_OPT_LEVEL,
        help=f"ONNX Runtime graph optimization level both models run at{when} (default %(default)s: the "
        "graphs as written, so ONNX Runtime's own fusions of the original cannot make a difference)",
    )


def _add_num_heads(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--num-heads",
        type=positive_int,
        help="head count of blocks whose count cannot be proved from shapes or initializers (for "
        "instance MultiHeadAttention nodes ONNX Runtime's optimizer wrote without it)",
    )


def pipeline_options(args: argparse.Namespace) -> dict[str, Any]:
    """What ortflash.optimize takes beyond the policy and the target: --num-heads, where given,
    --no-causal-proof and --seq-lens."""
    return {
        "num_heads": getattr(args, "num_heads", None),
        "prove_causal": not getattr(args, "no_causal_proof", False),
        "seq_lens": getattr(args, "seq_lens", None),
    }


def _add_seq_lens(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--seq-lens",
        type=positive_ints,
        metavar="N[,N...]",
        help="the key lengths the model runs at: where --target is left open, a block is fused only where the "
        "measured cost table says the fused form is faster than the original ops at every one of them "
        "(default: a block's static length; a block whose length is known only at run time keeps its ops)",
    )


def _output_options() -> _Parser:
    """--quiet and --json, shared by every command but bench (which writes its own result files)."""
    p = _Parser(add_help=False)
    p.add_argument(
        "-q", "--quiet", action="store_true", help="print nothing but errors (the exit code says the result)"
    )
    p.add_argument(
        "--json",
        metavar="PATH",
        help="also write the result as JSON (schema ortflash.result, "
        "see the README); - writes it to stdout and the tables to stderr",
    )
    return p


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="ortflash", description="Fuse attention in ONNX models into one FlashAttention op, and prove it."
    )
    parser.add_argument("--version", action="version", version=f"ortflash {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    common = [_output_options()]

    p = sub.add_parser("optimize", parents=common, help="fuse attention blocks and write the new model")
    p.add_argument("model", help="input .onnx model (never modified, unless --in-place)")
    p.add_argument(
        "-o", "--output", help=f"output path (default: IN{OPTIMIZED_SUFFIX}); the input itself only with --in-place"
    )
    p.add_argument("--in-place", action="store_true", help="replace the input model with the optimized one")
    _add_policy(p, overrides=False)
    p.add_argument(
        "--target",
        choices=(*TARGETS, AUTO),
        default=None,
        help="ortflash: FlashAttention nodes (run with ortflash.session_options()); contrib: ONNX Runtime's "
        "com.microsoft MultiHeadAttention/GroupQueryAttention; onnx: ONNX Attention (opset 23); webgpu: per "
        "block the form ONNX Runtime's WebGPU EP runs on the GPU and right. A block no "
        "native op computes exactly stays FlashAttention. auto (with --ep): per model, the first target that "
        "runs natively on that EP, lowers every block and loads (default: ortflash, or contrib / onnx where "
        "fused blocks feed a quantizer)",
    )
    p.add_argument(
        "--ep",
        choices=EXECUTION_PROVIDERS,
        help="the ONNX Runtime execution provider the model is for; without --target, or with --target auto, "
        "it picks the target "
        "(in order: " + "; ".join(f"{ep}: {', '.join(order)}" for ep, order in EP_TARGETS.items()) + ")",
    )
    p.add_argument(
        "--verify",
        action="store_true",
        help="then run both models in ONNX Runtime and compare, each fused node in every softmax it runs "
        f"deployed; on a failure the model is written as OUT{UNVERIFIED_SUFFIX.removesuffix(ONNX_SUFFIX)}"
        f"{ONNX_SUFFIX} instead of OUT",
    )
    _add_feeds(p)
    _add_opt_level(p, " with --verify")
    p.add_argument(
        "--no-causal-proof",
        action="store_true",
        help="keep every block's mask tensor as the graph computes it: no is_causal read from the mask "
        "subgraph (for comparisons, and as an escape hatch)",
    )

    _add_num_heads(p)
    _add_seq_lens(p)

    p = sub.add_parser("inspect", parents=common, help="list every Softmax: fused or why not; writes nothing")
    p.add_argument("model")
    _add_num_heads(p)
    _add_seq_lens(p)

    p = sub.add_parser("validate", parents=common, help="check each fused node's kernel against the naive ORT subgraph")
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
    _add_feeds(p)

    p = sub.add_parser(
        "web-check",
        parents=common,
        help="run a lowered model in onnxruntime-web / onnxruntime-node and compare with ONNX Runtime",
    )
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
    _add_feeds(p)

    from . import bench as _bench

    p = sub.add_parser(
        "bench", help="latency and peak memory of each variant against sequence length, one process each"
    )
    _bench.add_arguments(p)

    from .regress.command import add_arguments as _regress_arguments

    p = sub.add_parser(
        "regress",
        parents=common,
        help="check a manifest of models: blocks fused, loadable, same outputs (and speed) per target",
    )
    _regress_arguments(p)

    p = sub.add_parser("verify", parents=common, help="compare an optimized model with its original in ONNX Runtime")
    p.add_argument("original")
    p.add_argument("optimized")
    _add_policy(p, overrides=True)
    _add_feeds(p)
    _add_opt_level(p)
    return parser
