"""ortflash: fuse attention in exported ONNX transformers into one FlashAttention op."""

from .errors import OrtflashError
from .lowering import LoweringNote, lower
from .model_io import save
from .optimize import optimize
from .policy import SoftmaxPolicy
from .report import Block, Report
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
