"""What one NVIDIA H200 measured of ONNX Runtime's CUDA EP, as the CUDA target reads it:
CAPABILITIES, each candidate form's kernel, time and rightness per case, read from
cuda_capabilities.json beside this module (lowering/cuda.choose_form picks the form from it;
benchmarks/cuda_capabilities.py, tests/test_cuda_table.py holds it to the committed JSON), and CROSSOVERS, the cost table of the `cuda` target's output against the original
graph per element type, mask kind and head dim (pipeline/forms reads it through the EP's record,
lowering/targets.PROVIDERS["cuda"]; tests/test_forms.py and tests/test_cuda_costs.py hold it to the
results files named here)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

from .measured import EVERY_LENGTH, CapabilityTable, CostRecord, Crossovers

# (form, case) -> what the CUDA EP did, measured 2026-12-01 on an NVIDIA H200 (driver 580.159.04)
# with onnxruntime-gpu 1.31.1 (benchmarks/results/cuda_capabilities.md), kept as data in
# cuda_capabilities.json beside this module (each row's "why" says why it is kept). Forms and case
# names are benchmarks/cuda_capabilities.py's; only the rows the choices read (lowering/cuda.py), or
# that say why a form is not chosen, are copied there, and tests/test_cuda_table.py checks each
# against the committed JSON.
# - A causal block with no bias or mask (Sq == Sk) takes the fastest of these three at its case
#   (choose_form): GroupQueryAttention (cuDNN flash in float16; on the CPU in float32, 0 of 1 nodes
#   on CUDA), MultiHeadAttention unidirectional=1 without bias (cuDNN flash in float16) and
#   Attention-23 is_causal on [B, S, H·D] (flash in float16): the rows gqa, mha_causal and
#   attn23_causal_bsd at causal_{f16,f32}_d{64,128}_s{37,1024,4096,16384}. kernel: what ORT printed;
#   ms: the op alone, median, I/O bound, the EP's default session (TF32 on in float32).
# - MultiHeadAttention with attention_bias (mha_bias): cuDNN flash in float16, MATH /
#   memory-efficient in float32; rows of -inf (dead_rows_neginf) finite on the EP, NaN on the CPU
#   EP (the lowering writes such rows out).
# - key_padding_mask (mha_kpm): the unfused MATH kernel at 4096 (1.22 ms against 0.32 with
#   attention_bias), refused at 16384.
# - the decomposed graph in float16 (unfused): rows of float16-lowest wrong (about 1.0); refused at 16384.
CAPABILITIES = CapabilityTable.load(Path(__file__).with_name("cuda_capabilities.json"))


# The CUDA EP's cost table, by element type, which pipeline/forms.py reads through the EP's record
# (lowering/targets.py: PROVIDERS["cuda"]) where --ep cuda leaves the form open (onnxruntime-gpu
# 1.31.1 on an NVIDIA H200, its defaults: TF32 on; wall time with inputs and outputs bound on the
# GPU; benchmarks/crossover_cuda.py -> CROSSOVER_RESULTS): the `cuda` target's output against the
# original graph. In float32 the original's TF32 products beat every form the target writes
# (MultiHeadAttention's float32 kernels do not use them) at every measured length; in float16
# cuDNN's flash attention wins from 2048 keys with a padding mask, at every length without a mask,
# never with a full bias ([1, H, S, S]). Causal D64/D128 from 1024 (CAUSAL_RESULTS: the own-causal forms written in
# float16, Attention-23 where the table times it fastest, the model's opset raised for it, else GroupQueryAttention:
# 1.43-3.15x at 1024, 2.18-4.20x at 2048, 3.66-7.80x at 4096, where the unchanged cells read 0.99-1.10x), D32 and contrib 4096; causal_padding D64/D128 from 2048 (CAUSAL_PADDING_RESULTS: the own causal mask + the
# padding row, 1.61-2.05x at 2048, 3.24-4.24x at 4096; 1.03-1.24x at 1024, not clear of the noise), D32 and contrib never.
# Causal D64 at every length (SHORT_CAUSAL_RESULTS, two runs, S = 1-1024): Attention-23 on ORT's FLASH
# kernel (cuDNN's at one key) ran 1.10-2.25x the original static and 1.87-2.93x symbolic, where the
# unchanged model read 0.83-1.16x; D128 stays from 1024: its symbolic form (GroupQueryAttention, cuDNN)
# ran only 1.02-1.17x below 1024, not clear of that noise.
CROSSOVER_RESULTS = "benchmarks/results/crossover_cuda.md"
CAUSAL_RESULTS = "benchmarks/results/cuda_forms_causal_attn23_f16.md"  # the float16 causal rows' D64/D128
SHORT_CAUSAL_RESULTS = "benchmarks/results/cuda_forms_short_causal.md"  # their D64 row below 1024
# A block that was one ONNX Attention op (is_causal, [B, S, H·D]) lowered for the CUDA EP ran 0.28-0.92x
# the op itself at 1-2048 keys (1.17-1.35x at 4096): the op is ORT's own flash kernel already
ONE_OP_RESULTS = SHORT_CAUSAL_RESULTS
CAUSAL_PADDING_RESULTS = "benchmarks/results/cuda_forms_causal_padding_f16.md"  # the causal_padding rows
# MultiHeadAttention unidirectional=1 (no bias) rebuilding its cuDNN graph per call (lowering/cuda.py)
CUDNN_REBUILT_RESULTS = "benchmarks/results/cuda_cudnn_causal.md"
# the rows measured apart from crossover_cuda.md, by (element type, mask kind): what a choice's detail names
KIND_RESULTS: Mapping[tuple[str, str], str] = MappingProxyType(
    {
        ("float16", "causal"): f"{CAUSAL_RESULTS} (D64/D128), {SHORT_CAUSAL_RESULTS} (D64 below 1024) and "
        f"{CROSSOVER_RESULTS} (D32)",
        ("float16", "causal_padding"): CAUSAL_PADDING_RESULTS,
    }
)
CROSSOVERS_MEASURED_UP_TO = 4096  # the table's longest key length


def _cost_row(cuda_row: Mapping[int, int | None], contrib: Mapping[int, int | None] | None = None) -> Mapping:
    row = MappingProxyType(dict(cuda_row))  # contrib: 0.39-0.54x at 2048-4096 causal (CAUSAL_RESULTS)
    return MappingProxyType({"cuda": row, "contrib": row if contrib is None else MappingProxyType(dict(contrib))})


_NEVER = _cost_row({32: None, 64: None, 128: None})
CROSSOVERS: Mapping[str, Crossovers] = MappingProxyType(
    {
        "float32": MappingProxyType({"padding": _NEVER, "none": _NEVER, "causal": _NEVER, "bias": _NEVER}),
        "float16": MappingProxyType(
            {
                "padding": _cost_row({32: 2048, 64: 2048, 128: 2048}),
                "none": _cost_row({32: 64, 64: 64, 128: 64}),
                "causal": _cost_row({32: 4096, 64: EVERY_LENGTH, 128: 1024}, {32: 4096, 64: 4096, 128: 4096}),
                "causal_padding": _cost_row({32: None, 64: 2048, 128: 2048}, {32: None, 64: None, 128: None}),
                "bias": _NEVER,
            }
        ),
    }
)
# a block of no known element type (or one without a table: bfloat16) takes this one's, which keeps most
CROSSOVERS_UNKNOWN_DTYPE = "float32"  # (tests/test_forms.py holds it to keep every block another keeps)
MEASURED = CostRecord(
    CROSSOVERS_MEASURED_UP_TO, CROSSOVERS, CROSSOVERS_UNKNOWN_DTYPE, CROSSOVER_RESULTS, KIND_RESULTS, ONE_OP_RESULTS
)
