"""The regress manifest: which models to check, and what each must still do.

A manifest is TOML (``.toml``) or JSON (``.json``) with the same structure::

    version = 1

    [defaults]                 # optional: any key a [[model]] takes, for every model
    softmax = "auto"           # the policy optimize writes (naive | online | auto) ...
    block_size = 128           # ... its online tile
    min_seq_len = 1024         # ... and where auto turns online
    rtol = 1e-4                # tolerances (default: float32 rounding; float16 outputs looser)
    atol = 1e-5

    [[model]]
    path = "models/encoder.onnx"       # relative to the manifest; a glob checks each file it matches
    blocks = { ortflash = 12, contrib = 12 }   # blocks each target must fuse (the targets checked)
    cases = [{ batch = 1, seq_len = 7 }, { batch = 2, seq_len = 21 }]   # random inputs, one run each
    dims = { past_sequence_length = 4 }        # named input dims of the random inputs
    feeds = "inputs/encoder.npz"               # or your own inputs (then cases are not used)
    baseline = { file = "bench/encoder.json", max_slowdown = 1.15 }   # an `ortflash bench` result

Paths are relative to the manifest's folder. A file matched by a literal path takes that entry
even where a glob matches it too; a file two globs match takes the first.
"""

from __future__ import annotations

import glob
import importlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from ..errors import OrtflashError
from ..lowering import TARGETS
from ..op import spec
from ..op.policy import SoftmaxPolicy

MANIFEST_VERSION = 1
SUFFIXES = (".toml", ".json")
DEFAULT_MAX_SLOWDOWN = 1.15
DEFAULT_SEQ_LEN = 16
DEFAULT_BATCH = 2

# every key a [[model]] (or [defaults]) takes, with the type its value must have
_MODEL_KEYS: Mapping[str, type | tuple[type, ...]] = MappingProxyType(
    {
        "path": str,
        "blocks": dict,
        "targets": list,
        "cases": list,
        "dims": dict,
        "feeds": str,
        "rtol": (int, float),
        "atol": (int, float),
        "softmax": str,
        "block_size": int,
        "min_seq_len": int,
        "ort_opt_level": str,
        "baseline": dict,
    }
)
_CASE_KEYS = frozenset({"batch", "seq_len", "dims"})
_BASELINE_KEYS = frozenset({"file", "max_slowdown"})
_TOP_KEYS = frozenset({"version", "defaults", "model"})


@dataclass(frozen=True)
class InputCase:
    """One set of random inputs: its batch, sequence length and named dims."""

    batch: int = DEFAULT_BATCH
    seq_len: int = DEFAULT_SEQ_LEN
    dims: Mapping[str, int] = field(default_factory=dict)

    def label(self) -> str:
        dims = "".join(f",{k}={v}" for k, v in self.dims.items())
        return f"b{self.batch}s{self.seq_len}{dims}"


@dataclass(frozen=True)
class Baseline:
    """An `ortflash bench` results JSON and the slowdown allowed against its time ratios."""

    file: str  # absolute
    max_slowdown: float = DEFAULT_MAX_SLOWDOWN


@dataclass(frozen=True)
class ModelCheck:
    """What one model file must still do (one [[model]] entry, applied to one file it names)."""

    file: str  # absolute path of the model
    shown: str  # the path as rows name it (relative to the manifest)
    entry: int  # index of its [[model]] entry
    blocks: Mapping[str, int | None]  # target -> blocks it must fuse (None: no expectation yet)
    cases: tuple[InputCase, ...]
    feeds: str | None  # absolute path of an .npz of inputs
    rtol: float | None
    atol: float | None
    policy: SoftmaxPolicy
    ort_opt_level: str
    baseline: Baseline | None

    @property
    def targets(self) -> tuple[str, ...]:
        return tuple(self.blocks)


@dataclass
class Manifest:
    path: str
    document: dict[str, Any]  # as read: --update rewrites it
    checks: list[ModelCheck]
    unmatched: list[str]  # [[model]] paths (globs) that name no file

    @property
    def folder(self) -> str:
        return os.path.dirname(os.path.abspath(self.path))


def _fail(path: str, where: str, message: str) -> OrtflashError:
    return OrtflashError(f"{path}: {where}: {message}")


def toml_loads(text: str, path: str) -> dict[str, Any]:
    """TOML through the standard library's tomllib (Python 3.11+), or tomli where it is installed."""
    for name in ("tomllib", "tomli"):
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError:
            continue
        try:
            parsed: dict[str, Any] = module.loads(text)
        except module.TOMLDecodeError as exc:
            raise OrtflashError(f"{path}: not a valid manifest ({str(exc).splitlines()[0]})") from None
        return parsed
    raise OrtflashError(
        f"{path}: reading TOML needs Python 3.11 or `pip install tomli`; a .json manifest works anywhere"
    )


def read_document(path: str) -> dict[str, Any]:
    """The manifest file as a dict; a one-line OrtflashError where it is missing or malformed."""
    if not path.endswith(SUFFIXES):
        raise OrtflashError(f"{path}: a manifest is a .toml or .json file")
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise OrtflashError(f"{path}: cannot read the manifest ({exc.strerror or exc})") from None
    try:
        doc = toml_loads(raw.decode(), path) if path.endswith(".toml") else json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise OrtflashError(f"{path}: not a valid manifest ({str(exc).splitlines()[0]})") from None
    if not isinstance(doc, dict):
        raise OrtflashError(f"{path}: not a valid manifest (expected a table at the top)")
    return doc


def _check_keys(path: str, where: str, table: Mapping[str, Any], allowed: Mapping[str, Any] | frozenset[str]) -> None:
    for key, value in table.items():
        if key not in allowed:
            raise _fail(path, where, f"unknown key {key!r} (known: {', '.join(sorted(allowed))})")
        if isinstance(allowed, Mapping):
            want = allowed[key]
            if isinstance(value, bool) or not isinstance(value, want):
                raise _fail(path, where, f"{key} has the wrong type ({type(value).__name__})")


def _int_map(path: str, where: str, key: str, table: Mapping[str, Any], minimum: int) -> dict[str, int]:
    out = {}
    for name, value in table.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise _fail(path, where, f"{key}.{name} must be an integer >= {minimum}, got {value!r}")
        out[str(name)] = value
    return out


def _cases(path: str, where: str, raw: list[Any], dims: Mapping[str, int]) -> tuple[InputCase, ...]:
    cases = []
    for i, case in enumerate(raw):
        here = f"{where}, cases[{i}]"
        if not isinstance(case, dict):
            raise _fail(path, here, "a case is a table such as { batch = 1, seq_len = 7 }")
        _check_keys(path, here, case, _CASE_KEYS)
        sizes = _int_map(path, here, "case", {k: v for k, v in case.items() if k != "dims"}, 1)
        case_dims = (
            _int_map(path, here, "dims", case.get("dims", {}), 0) if isinstance(case.get("dims", {}), dict) else {}
        )
        cases.append(
            InputCase(sizes.get("batch", DEFAULT_BATCH), sizes.get("seq_len", DEFAULT_SEQ_LEN), {**dims, **case_dims})
        )
    return tuple(cases) or (InputCase(dims=dict(dims)),)


def _policy(path: str, where: str, settings: Mapping[str, Any]) -> SoftmaxPolicy:
    try:
        return SoftmaxPolicy.for_new_nodes(
            settings.get("softmax"), None, settings.get("block_size"), settings.get("min_seq_len")
        )
    except spec.SpecError as exc:
        raise _fail(path, where, str(exc)) from None


def _files(folder: str, pattern: str) -> list[str]:
    full = os.path.join(folder, pattern)
    if glob.has_magic(pattern):
        return sorted(p for p in glob.glob(full, recursive=True) if os.path.isfile(p))
    return [full]  # a literal path that is missing is checked, and fails as unloadable


def _shown(file: str, folder: str) -> str:
    """How rows name a model: relative to the manifest's folder where it is inside it, else absolute."""
    relative = os.path.relpath(file, folder)
    return file if relative.startswith(os.pardir) else relative


def load_manifest(path: str) -> Manifest:
    """Read and check a manifest: one ModelCheck per model file, each with its entry's expectations."""
    from ..checks.sessions import ORT_OPT_LEVELS

    doc = read_document(path)
    _check_keys(path, "top level", doc, _TOP_KEYS)
    version = doc.get("version", MANIFEST_VERSION)
    if version != MANIFEST_VERSION:
        raise _fail(path, "version", f"this ortflash reads manifest version {MANIFEST_VERSION}, got {version!r}")
    defaults = doc.get("defaults", {})
    if not isinstance(defaults, dict):
        raise _fail(path, "defaults", "must be a table")
    _check_keys(path, "defaults", defaults, {k: v for k, v in _MODEL_KEYS.items() if k != "path"})
    entries = doc.get("model", [])
    if not isinstance(entries, list) or not entries:
        raise _fail(path, "model", "give at least one [[model]] entry with a path")
    folder = os.path.dirname(os.path.abspath(path))
    checks: dict[str, ModelCheck] = {}
    literal: set[str] = set()
    unmatched = []
    for index, entry in enumerate(entries):
        where = f"model[{index}]"
        if not isinstance(entry, dict) or "path" not in entry:
            raise _fail(path, where, "each [[model]] needs a path")
        _check_keys(path, where, entry, _MODEL_KEYS)
        settings = {**defaults, **entry}
        blocks: dict[str, int | None] = dict(_int_map(path, where, "blocks", settings.get("blocks", {}), 0))
        for target in settings.get("targets", []):
            blocks.setdefault(str(target), None)
        blocks = blocks or {"ortflash": None}
        for target in blocks:
            if target not in TARGETS:
                raise _fail(path, where, f"unknown target {target!r} (targets: {', '.join(TARGETS)})")
        level = settings.get("ort_opt_level", "disable")
        if level not in ORT_OPT_LEVELS:
            raise _fail(path, where, f"ort_opt_level must be one of {', '.join(ORT_OPT_LEVELS)}")
        dims = _int_map(path, where, "dims", settings.get("dims", {}), 0)
        baseline = None
        if "baseline" in settings:
            raw = settings["baseline"]
            _check_keys(path, f"{where}, baseline", raw, _BASELINE_KEYS)
            slowdown = raw.get("max_slowdown", DEFAULT_MAX_SLOWDOWN)
            if "file" not in raw or not isinstance(raw["file"], str):
                raise _fail(path, f"{where}, baseline", "needs file = PATH of an `ortflash bench` results JSON")
            if isinstance(slowdown, bool) or not isinstance(slowdown, (int, float)) or slowdown < 1:
                raise _fail(path, f"{where}, baseline", f"max_slowdown must be a number >= 1, got {slowdown!r}")
            baseline = Baseline(os.path.join(folder, raw["file"]), float(slowdown))
        pattern = entry["path"]
        files = _files(folder, pattern)
        if not files:
            unmatched.append(pattern)
        for file in files:
            key = os.path.normpath(os.path.abspath(file))
            if key in checks and (key in literal or glob.has_magic(pattern)):
                continue  # a literal entry, or the first glob, keeps the file
            if not glob.has_magic(pattern):
                literal.add(key)
            checks[key] = ModelCheck(
                file=key,
                shown=_shown(key, folder),
                entry=index,
                blocks=blocks,
                cases=_cases(path, where, settings.get("cases", []), dims),
                feeds=os.path.join(folder, settings["feeds"]) if "feeds" in settings else None,
                rtol=float(settings["rtol"]) if "rtol" in settings else None,
                atol=float(settings["atol"]) if "atol" in settings else None,
                policy=_policy(path, where, settings),
                ort_opt_level=level,
                baseline=baseline,
            )
    return Manifest(path, doc, sorted(checks.values(), key=lambda c: (c.entry, c.shown)), unmatched)
