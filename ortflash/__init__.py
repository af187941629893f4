"""ortflash: fuse attention in exported ONNX transformers into one FlashAttention op."""

import importlib
import sys
import types
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ._version import __version__ as __version__
from .errors import OrtflashError

if TYPE_CHECKING:
    from .api import NodeCheck, OutputDiff, ValidateResult, VerifyResult, make_feeds, validate, verify
    from .lowering import LoweringNote, lower
    from .model_io import save
    from .op.policy import SoftmaxPolicy
    from .pipeline.optimize import optimize
    from .report import Block, Report
    from .session import InferenceSession, session_options

# Every public name but OrtflashError is imported where it is first used, from the module named here.
# `import ortflash` then costs nothing, so the `ortflash` command turns a Ctrl-C into exit 130 from
# its first instruction (onnx, onnx_ir and ONNX Runtime take about 0.9 s to import, and a Ctrl-C in
# them printed a 28-line traceback); and the checking API's onnxruntime-extensions, whose import
# pulls in torch where torch is installed (several seconds), loads only when it is used.
_PUBLIC: Mapping[str, str] = types.MappingProxyType(
    {
        "optimize": "pipeline.optimize",
        "save": "model_io",
        "session_options": "session",
        "InferenceSession": "session",
        "SoftmaxPolicy": "op.policy",
        "Report": "report",
        "Block": "report",
        "lower": "lowering",
        "LoweringNote": "lowering",
        **dict.fromkeys(
            ("verify", "validate", "make_feeds", "VerifyResult", "ValidateResult", "OutputDiff", "NodeCheck"), "api"
        ),
    }
)


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        value = getattr(importlib.import_module(f".{_PUBLIC[name]}", __name__), name)
        setattr(sys.modules[__name__], name, value)
        return value
    try:  # a submodule not imported yet (ortflash.op, ortflash.model_io, ...), as an eager package had them
        return importlib.import_module(f".{name}", __name__)
    except ModuleNotFoundError as exc:
        if exc.name != f"{__name__}.{name}":
            raise
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
