"""Write the option tables of docs/command-line.md from the parser itself (ortflash.cli.build_parser).

python docs/cli_reference.py          # rewrite the tables between the markers
python docs/cli_reference.py --check  # exit 1 where the page differs from the parser (tests/test_docs.py)
"""

from __future__ import annotations

import argparse
import os
import sys

PAGE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "command-line.md")
BEGIN = "<!-- option tables: written by docs/cli_reference.py -->"
END = "<!-- end of option tables -->"


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _row(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    formatter = parser._get_formatter()
    names = ", ".join(f"`{o}`" for o in action.option_strings) or f"`{action.dest}` (positional)"
    takes = ""
    if action.nargs != 0:
        if action.choices is not None:
            takes = "|".join(str(c) for c in action.choices)
        else:
            takes = action.metavar if isinstance(action.metavar, str) else action.dest.upper()
    helped = formatter._expand_help(action) if action.help not in (None, argparse.SUPPRESS) else ""
    return f"| {names} | {_cell(f'`{takes}`' if takes else '')} | {_cell(helped)} |"


def tables() -> str:
    from ortflash.cli import build_parser

    parser = build_parser()
    lines = [BEGIN, ""]
    top = [a for a in parser._actions if a.option_strings and a.help != argparse.SUPPRESS]
    lines += ["### `ortflash`", "", "| option | takes | what it does |", "|---|---|---|"]
    lines += [_row(parser, a) for a in top]
    for name, command in _commands(parser).items():
        lines += ["", f"### `ortflash {name}`", "", "| option | takes | what it does |", "|---|---|---|"]
        lines += [_row(command, a) for a in command._actions if a.help != argparse.SUPPRESS]
    return "\n".join([*lines, "", END])


def main() -> int:
    check = "--check" in sys.argv[1:]
    with open(PAGE) as f:
        page = f.read()
    head, rest = page.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    written = head + tables() + tail
    if check:
        if written != page:
            print(
                f"{PAGE}: the option tables differ from the parser: run python docs/cli_reference.py", file=sys.stderr
            )
            return 1
        return 0
    with open(PAGE, "w") as f:
        f.write(written)
    return 0


if __name__ == "__main__":
    sys.exit(main())
