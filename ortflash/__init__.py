"""ortflash: fuse attention in exported ONNX transformers into one FlashAttention op."""

from typing import TYPE_CHECKING, Any

from ._version import __version__ as __version__
from .errors import OrtflashError
from .lowering import LoweringNote, lower
from .model_io import save
from .optimize import optimize
from .policy import SoftmaxPolicy
from .report import Block, Report
from .session import InferenceSession, session_options

if TYPE_CHECKING:
    from .api import NodeCheck, OutputDiff, ValidateResult, VerifyResult, make_feeds, validate, verify

# The checking API imports onnxruntime-extensions, whose import pulls in torch where torch is
# installed (several seconds); `import ortflash` and the CLI load it only when it is used.
_API_NAMES = frozenset(
    {"verify", "validate", "make_feeds", "VerifyResult", "ValidateResult", "OutputDiff", "NodeCheck"}
)


def __getattr__(name: str) -> Any:
    if name in _API_NAMES:
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module 'ortflash' has no attribute {name!r}")


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
    "verify",
    "validate",
    "make_feeds",
    "VerifyResult",
    "ValidateResult",
    "OutputDiff",
    "NodeCheck",
]
