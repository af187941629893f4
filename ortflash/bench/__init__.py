"""ortflash.bench: latency and peak memory of a model's variants against sequence length.

Each (variant, S) runs in its own worker process and is timed through the public seams a user
runs (``ortflash.InferenceSession``, ``onnxruntime.InferenceSession``); nothing in ortflash or
onnxruntime-extensions is patched. Fused variants also report their kernel called directly.

  variants  what each variant is, how it is built and opened
  inputs    feeds that follow the model's declared dims
  worker    one measurement (``python -m ortflash.bench.worker CFG.json``)
  direct    the kernels called outside ONNX Runtime, and the PyTorch peer
  probes    machine, versions, peak memory
  sweep     one worker process per (variant, S), progress and timeouts
  report    ratios, tables, markdown, plot
  baseline  the regression guard (``--baseline OLD.json --max-slowdown 1.15``)
  cli       the ``ortflash bench`` options
"""

from .baseline import compare as compare_baseline
from .baseline import load_baseline
from .cli import add_arguments, main, run
from .probes import machine_info, versions
from .report import merge_rounds, ratios, write_results
from .sweep import DEFAULT_SEQ_LENS, bench
from .variants import DEFAULT_VARIANTS, VARIANTS, parse_variant

__all__ = [
    "DEFAULT_SEQ_LENS",
    "DEFAULT_VARIANTS",
    "VARIANTS",
    "add_arguments",
    "bench",
    "compare_baseline",
    "load_baseline",
    "machine_info",
    "main",
    "merge_rounds",
    "parse_variant",
    "ratios",
    "run",
    "versions",
    "write_results",
]
