"""The ortflash command line: one module per command, found through one table.

Every command module has ``HELP`` (its line in ``ortflash --help``), ``add_arguments(parser)``
(its options) and ``run(args) -> int`` (the exit code); ``build_parser()`` builds the whole
parser from them. Shared options and exit codes are in ``args``, argument types in
``ortflash.arg_types``, tables and JSON in ``output``, models and inputs in ``inputs``.

Only a problem with the user's input (an ``OrtflashError``, which every check raises for a model
or inputs ONNX Runtime cannot take) becomes exit 2 with one line on stderr; any other exception
is a bug in ortflash and shows its traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType, ModuleType
from typing import NoReturn

from .._version import __version__
from ..errors import OrtflashError
from . import bench, inspect, optimize, regress, validate, verify, web_check
from .args import EXIT_INTERRUPTED, EXIT_MISMATCH, EXIT_OK, EXIT_USAGE, Parser, output_options
from .output import check_json_target, write_error_json

__all__ = ["COMMANDS", "EXIT_INTERRUPTED", "EXIT_MISMATCH", "EXIT_OK", "EXIT_USAGE", "build_parser", "main"]


@dataclass(frozen=True)
class Command:
    module: ModuleType  # HELP, add_arguments(parser), run(args) -> int
    output_options: bool = True  # --quiet and --json (bench writes its own result files)


# In the order of ``ortflash --help``.
COMMANDS: Mapping[str, Command] = MappingProxyType(
    {
        "optimize": Command(optimize),
        "inspect": Command(inspect),
        "validate": Command(validate),
        "web-check": Command(web_check),
        "bench": Command(bench, output_options=False),
        "regress": Command(regress),
        "verify": Command(verify),
    }
)


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``ortflash`` with every command's sub-parser."""
    parser = Parser(
        prog="ortflash", description="Fuse attention in ONNX models into one FlashAttention op, and prove it."
    )
    parser.add_argument("--version", action="version", version=f"ortflash {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    shared = [output_options()]
    for name, command in COMMANDS.items():
        p = sub.add_parser(name, parents=shared if command.output_options else [], help=command.module.HELP)
        command.module.add_arguments(p)
    return parser


# The positional argument that names each command's model (regress: its manifest).
_MODEL_ARGUMENTS = ("model", "original", "manifest")


def _json_of_unparsed(argv: Sequence[str]) -> tuple[str | None, str | None]:
    """(command, --json PATH) of a command line that did not parse, read as far as it can be."""
    command = next((a for a in argv if a in COMMANDS), None)
    if command is None or not COMMANDS[command].output_options:
        return command, None
    lenient = _Lenient(add_help=False)
    lenient.add_argument("--json")
    try:
        known, _ = lenient.parse_known_args(list(argv[list(argv).index(command) + 1 :]))
    except ValueError:  # --json itself did not parse: argparse has said so
        return command, None
    return command, known.json


class _Lenient(argparse.ArgumentParser):
    """A parser that raises where argparse would print and exit: the one line is said already."""

    def error(self, message: str) -> NoReturn:
        raise ValueError(message)


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as stop:
        if stop.code == EXIT_USAGE:  # argparse said the one line; --json still gets its document
            command, json_path = _json_of_unparsed(argv)
            if command is not None:
                write_error_json(command, json_path, None, EXIT_USAGE, "the command line did not parse")
        raise
    json_path = getattr(args, "json", None)
    model = next((str(getattr(args, k)) for k in _MODEL_ARGUMENTS if getattr(args, k, None) is not None), None)
    try:
        check_json_target(json_path)
        code: int = COMMANDS[args.command].module.run(args)
        return code
    except OrtflashError as exc:
        print(f"ortflash: error: {exc}", file=sys.stderr)
        write_error_json(args.command, json_path, model, EXIT_USAGE, str(exc))
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("ortflash: interrupted", file=sys.stderr)
        write_error_json(args.command, json_path, model, EXIT_INTERRUPTED, "interrupted")
        return EXIT_INTERRUPTED
    except Exception as exc:  # a bug in ortflash: its traceback follows, and the file is not an old run's
        write_error_json(args.command, json_path, model, EXIT_MISMATCH, f"internal error: {type(exc).__name__}: {exc}")
        raise


def entry() -> None:
    sys.exit(main())
