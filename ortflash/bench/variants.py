"""The variants bench compares, how each is built from the model file, and how its session opens.

``original``     the model as given;
``naive`` / ``online``  ``ortflash.optimize`` with that softmax (online from key length 0,
                 ``block_size`` keys per tile; ``online@128`` picks the tile), run by
                 ``ortflash.InferenceSession`` on the compiled CPU kernel (backend ``cpu``);
``reference``    the online fusion run by the numpy kernels (backend ``reference``);
``contrib`` / ``onnx``  the naive fusion lowered by ``ortflash.lower`` to com.microsoft
                 MultiHeadAttention or to ONNX Attention-23;
``torch-sdpa``   a peer, not an ONNX model: PyTorch's CPU ``scaled_dot_product_attention`` on the
                 Q/K/V/bias/mask the fused nodes receive (only where torch imports);
``LABEL=PATH.onnx``  any other model file, run as it is on the same inputs.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import onnx
import onnxruntime as ort

from ..model_io import graphs_of
from ..op import spec
from ..op.policy import SoftmaxPolicy

VARIANTS = ("original", "naive", "online", "contrib", "onnx", "reference", "torch-sdpa")
DEFAULT_VARIANTS = ("original", "naive", "online", "contrib", "onnx")
# variants whose attention runs in ortflash's FlashAttention op: (softmax, kernel backend)
FUSED = {"naive": ("naive", "cpu"), "online": ("online", "cpu"), "reference": ("online", "reference")}
LOWERED = ("contrib", "onnx")
TILED = ("naive", "online", "reference")  # the kinds that take @BLOCK_SIZE
DEFAULT_BLOCK_SIZE = int(spec.ATTRIBUTES["block_size"].default)  # type: ignore[call-overload]
# Op types that compute attention in one node (ortflash's, ONNX's and ONNX Runtime's contrib
# ops): what a fused or lowered model shows, and what other tools' fusions produce.
ATTENTION_OP_TYPES = frozenset(
    {
        "FlashAttention",
        "Attention",
        "MultiHeadAttention",
        "GroupQueryAttention",
        "PackedAttention",
        "PackedMultiHeadAttention",
        "DecoderMaskedMultiHeadAttention",
        "DecoderMaskedSelfAttention",
        "DecoderAttention",
        "LongformerAttention",
        "SparseAttention",
        "PagedAttention",
        "QAttention",
        "QOrderedAttention",
        "MultiHeadAttentionFused",
    }
)


class VariantName(NamedTuple):
    """A parsed variant: 'online@512' -> ('online@512', 'online', 512, None)."""

    label: str
    kind: str  # one of VARIANTS, or "file"
    block_size: int | None
    path: str | None


class Unavailable(RuntimeError):
    """A variant this machine cannot run (not a failure of the variant)."""


def parse_variant(variant: str) -> VariantName:
    """'online@512' -> (label, kind, block size, None); 'mha=m.onnx' -> ('mha', 'file', None, 'm.onnx')."""
    if "=" in variant:
        label, path = variant.split("=", 1)
        return VariantName(label, "file", None, path)
    kind, at, bs = variant.partition("@")
    if kind not in VARIANTS:
        raise ValueError(
            f"unknown variant {variant!r}: use one of {', '.join(VARIANTS)} "
            f"({'/'.join(TILED)} optionally @BLOCK_SIZE) or LABEL=PATH.onnx"
        )
    if at and kind not in TILED:
        raise ValueError(f"{variant!r}: only {', '.join(TILED)} take a block size after @")
    if at and (not bs.isdigit() or int(bs) < 1):
        raise ValueError(f"{variant!r}: the block size after @ must be a positive integer")
    return VariantName(variant, kind, int(bs) if bs else None, None)


def torch_available() -> bool:
    return importlib.util.find_spec("torch") is not None


@dataclass
class BuiltVariant:
    """One variant's model and how to run it."""

    name: VariantName
    model: onnx.ModelProto
    block_size: int
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def fused_kind(self) -> str:
        """The kind whose FlashAttention nodes run in ortflash ('' for ORT-only variants)."""
        return self.name.kind if self.name.kind in FUSED else ""

    @property
    def softmax(self) -> str | None:
        return FUSED[self.name.kind][0] if self.fused_kind else None

    @property
    def backend(self) -> str | None:
        return FUSED[self.name.kind][1] if self.fused_kind else None


def build_variant(model_path: str, name: VariantName, block_size: int = DEFAULT_BLOCK_SIZE) -> BuiltVariant:
    """The variant's model, built from the file; raises with a reason."""
    import ortflash

    block_size = name.block_size or block_size
    if name.path is not None:
        return BuiltVariant(name, onnx.load(name.path), block_size, {"source": name.path})
    original = onnx.load(model_path)
    if name.kind == "original":
        return BuiltVariant(name, original, block_size)
    if name.kind == "torch-sdpa" and not torch_available():
        raise Unavailable("PyTorch is not installed (pip install torch): no peer row")
    softmax = FUSED[name.kind][0] if name.kind in FUSED else "naive"
    fused, report = ortflash.optimize(
        original, softmax=softmax, block_size=block_size, min_seq_len=0, target="ortflash"
    )
    info: dict[str, Any] = {"blocks": len(report.blocks), "fused": report.fused}
    if name.kind in FUSED:
        info["block_size"] = block_size
    if not report.fused:
        info["note"] = "no block fused: the variant is the original model"
    if name.kind not in LOWERED:
        return BuiltVariant(name, fused, block_size, info)
    lowered, notes = ortflash.lower(fused, name.kind)
    info["lower_notes"] = [str(n) for n in (notes or [])][:20]
    return BuiltVariant(name, lowered, block_size, info)


def session_options(threads: int | None) -> ort.SessionOptions:
    so = ort.SessionOptions()
    if threads:
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
    return so


def _uses_flash_attention(model: onnx.ModelProto) -> bool:
    # subgraphs included: a model that picks its form by the length holds its nodes in If branches
    return any(n.domain == spec.DOMAIN for g in graphs_of(model.graph) for n in g.node)


def open_session(
    built: BuiltVariant, model: onnx.ModelProto, so: ort.SessionOptions, threads: int | None
) -> tuple[Any, str | None]:
    """(session, kernel backend or None) for ``model``, a form of ``built``'s model.

    Fused variants, and variants given as a file that hold FlashAttention nodes, open through
    ``ortflash.InferenceSession``, the path users run; the rest through a plain
    ``onnxruntime.InferenceSession``.
    """
    import ortflash

    if built.fused_kind and built.backend and built.softmax:
        session = ortflash.InferenceSession(
            model,
            backend=built.backend,
            threads=threads,
            sess_options=so,
            softmax=built.softmax,
            block_size=built.block_size,
            min_seq_len=0,
        )
        return session, built.backend
    if _uses_flash_attention(model):
        # a variant given as a file (NAME=PATH: what `optimize` wrote, a length If included) runs
        # its nodes as written, through the session users open, so on the native op where it applies
        return ortflash.InferenceSession(model, threads=threads, sess_options=so), None
    return open_plain_session(built, model, so, threads), None


def open_plain_session(
    built: BuiltVariant, model: onnx.ModelProto, so: ort.SessionOptions, threads: int | None
) -> ort.InferenceSession:
    """An onnxruntime.InferenceSession of the variant: fused nodes configured as
    ``ortflash.InferenceSession`` configures them (for profiling, which its wrapper cannot end)."""
    import ortflash
    from ortflash.kernels.config import KernelConfig
    from ortflash.session import configure_model

    if built.fused_kind and built.backend and built.softmax:
        policy = SoftmaxPolicy.for_new_nodes(built.softmax, None, built.block_size, 0)
        model = configure_model(model, policy=policy, config=KernelConfig(built.backend, threads))
    if _uses_flash_attention(model):
        so = ortflash.session_options(base=so)
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def count_ops(model: onnx.ModelProto) -> dict[str, int]:
    """Attention-related ops in a model, subgraphs included (an ORT-side fusion would show here)."""
    counts: dict[str, int] = {}

    for graph in graphs_of(model.graph):
        for n in graph.node:
            if n.op_type in ATTENTION_OP_TYPES or n.op_type == "Softmax":
                key = n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}"
                counts[key] = counts.get(key, 0) + 1
    return counts
