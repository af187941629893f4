"""The one way a check runs a model in ONNX Runtime: ortflash's session, errors as one line.

Every check (verify, validate, web_check) opens its sessions here, through
``ortflash.InferenceSession``, so FlashAttention nodes run with the policy asked for
and a plain model runs as in ONNX Runtime. An error ONNX Runtime raises for the
model or the inputs becomes an :class:`OrtflashError` (the CLI's exit 2); any other
exception is a bug in ortflash and is left to propagate.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from types import MappingProxyType

import numpy as np
import onnx
import onnxruntime as ort
from onnxruntime.capi import onnxruntime_pybind11_state as ort_state

from ..errors import OrtflashError
from ..op.policy import SoftmaxPolicy
from ..session import InferenceSession

ModelSource = onnx.ModelProto | str | os.PathLike[str]

# ONNX Runtime's graph optimization levels, by the names the CLI's --ort-opt-level takes.
ORT_OPT_LEVELS: Mapping[str, ort.GraphOptimizationLevel] = MappingProxyType(
    {
        "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }
)
# ONNX Runtime's own default (what a plain session, and so a deployment, runs at).
ORT_DEFAULT_OPT_LEVEL = "all"

# Longest error text a check quotes from ONNX Runtime or Node in its one-line message.
MESSAGE_CHARS = 300

# ONNX Runtime's errors for a model or inputs it cannot take (separate classes, no common base);
# its Python wrapper raises ValueError for missing or unknown input names.
_ORT_ERRORS: tuple[type[Exception], ...] = (
    ort_state.Fail,
    ort_state.InvalidArgument,
    ort_state.InvalidGraph,
    ort_state.InvalidProtobuf,
    ort_state.NoSuchFile,
    ort_state.NoModel,
    ort_state.NotFound,
    ort_state.NotImplemented,
    ort_state.RuntimeException,
    ort_state.EPFail,
)
_RUN_ERRORS: tuple[type[Exception], ...] = (*_ORT_ERRORS, ValueError)
# ONNX Runtime's log severities: 0 verbose .. 3 error, 4 fatal
_FATAL_ONLY = 4
# Where ONNX Runtime reads external weights of a model handed over as bytes.
_EXTERNAL_DATA_FOLDER = "session.model_external_initializers_file_folder_path"

_ORT_PREFIX = re.compile(
    r"^(?:\[ONNXRuntimeError\] : \d+ : \w+ : )?(?:Can't create a session\. )?"
    r"(?:ERROR_CODE: \d+, ERROR_MESSAGE: )?"
)
# A kernel's failure: "Non-zero status code returned while running X node. Name:'' Status Message: <location> ..."
_STATUS_MESSAGE = "Status Message: "
_SOURCE_LOCATION = re.compile(r"^\S+\.(?:cc|cpp|h|hpp):\d+ ")


def clean_ort_message(text: str) -> str:
    """An ONNX Runtime error without its wrapper, source location and C++ signature (also where a
    kernel's status follows "Status Message: ")."""
    text = _ORT_PREFIX.sub("", text.strip())
    head, status, tail = text.partition(_STATUS_MESSAGE)
    if status:
        return head + status + clean_ort_message(tail)
    if _SOURCE_LOCATION.match(text):
        rest = _SOURCE_LOCATION.sub("", text, count=1)
        depth, start = 0, rest.find("(")
        for i in range(max(start, 0), len(rest) if start >= 0 else 0):  # skip the signature's balanced (...)
            depth += {"(": 1, ")": -1}.get(rest[i], 0)
            if depth == 0:
                rest = rest[i + 1 :]
                rest = rest.removeprefix("::<lambda()>")
                break
        text = rest.strip() or text
    return text


def one_line(text: str, fallback: str) -> str:
    """The first line of a message (``fallback`` where it is empty), shortened to MESSAGE_CHARS."""
    text = text.strip()
    return (text.splitlines()[0] if text else fallback)[:MESSAGE_CHARS]


def _ort_error(exc: Exception) -> str:
    """ONNX Runtime's message on one line, its end kept: the cause (shapes, names) is said last."""
    lines = [line.strip() for line in clean_ort_message(str(exc)).splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    text = lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}"
    if len(text) <= MESSAGE_CHARS:
        return text
    head = MESSAGE_CHARS // 3
    return f"{text[:head]} ... {text[-(MESSAGE_CHARS - head) :]}"


def open_session(
    model: ModelSource,
    policy: SoftmaxPolicy | None = None,
    *,
    what: str = "the model",
    weights_dir: str | None = None,
    opt_level: str = ORT_DEFAULT_OPT_LEVEL,
    config: Mapping[str, str] = MappingProxyType({}),
) -> InferenceSession:
    """A CPU session for ``model`` at the graph optimization level ``opt_level`` (a key of ORT_OPT_LEVELS).

    A path keeps its external weights on disk, read from its folder; a proto whose weights
    are external references reads them from ``weights_dir``. ``config``: extra session
    config entries (``SessionOptions.add_session_config_entry``).
    """
    options = ort.SessionOptions()
    for key, value in config.items():
        options.add_session_config_entry(key, value)
    options.graph_optimization_level = ORT_OPT_LEVELS[opt_level]
    options.log_severity_level = _FATAL_ONLY  # a load error is raised below as one line; warnings are not the user's
    if not isinstance(model, onnx.ModelProto):
        options.add_session_config_entry(_EXTERNAL_DATA_FOLDER, os.path.dirname(os.path.abspath(model)))
    elif weights_dir is not None:
        options.add_session_config_entry(_EXTERNAL_DATA_FOLDER, os.path.abspath(weights_dir))
    try:
        return InferenceSession(model, sess_options=options, policy=policy)
    except _ORT_ERRORS as exc:
        raise OrtflashError(f"ONNX Runtime could not load {what}: {_ort_error(exc)}") from None


def run_model(
    model: ModelSource,
    feeds: dict[str, np.ndarray],
    policy: SoftmaxPolicy | None = None,
    *,
    what: str = "the model",
    weights_dir: str | None = None,
    opt_level: str = ORT_DEFAULT_OPT_LEVEL,
) -> dict[str, np.ndarray]:
    """Every output of ``model`` on ``feeds``, by name (``what`` names the model in errors)."""
    session = open_session(model, policy, what=what, weights_dir=weights_dir, opt_level=opt_level)
    return run_session(session, feeds, what=what)


def run_session(
    session: InferenceSession, feeds: dict[str, np.ndarray], *, what: str = "the model"
) -> dict[str, np.ndarray]:
    """Every output of an open session on ``feeds``, by name."""
    names = [o.name for o in session.get_outputs()]
    # the error raised below is the message; ONNX Runtime's own log line of it would be a second one
    quiet = ort.RunOptions()
    quiet.log_severity_level = _FATAL_ONLY
    try:
        return dict(zip(names, session.run(names, feeds, quiet)))
    except _RUN_ERRORS as exc:
        raise OrtflashError(f"ONNX Runtime could not run {what}: {_ort_error(exc)}") from None
