"""ortflash: fuse attention in exported ONNX transformers into one FlashAttention op."""

from .optimize import OrtflashError, optimize, save
from .policy import SoftmaxPolicy
from .report import Block, Report
from .rewrites.lower import LoweringNote, lower
from .session import InferenceSession, session_options

__version__ = "0.1.0"
__all__ = [
    "optimize",
    "save",
    "session_options",
    "InferenceSession",
    "SoftmaxPolicy",
    "Report",
    "Block",
    "OrtflashError",
    "lower",
    "LoweringNote",
]
