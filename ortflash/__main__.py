"""`python -m ortflash` and the `ortflash` command (pyproject's script): the command line, with a
Ctrl-C at any point, the imports of its first second included, exit 130 and one line.

``import ortflash`` imports nothing heavy (see ortflash/__init__.py), so this module's code runs
about 0.02 s after the interpreter starts; everything else is imported inside the guard.
"""

import sys

# 128 + SIGINT, as a shell reports a run stopped by Ctrl-C (ortflash.cli.args.EXIT_INTERRUPTED:
# not imported from there, whose imports are what this guards)
_EXIT_INTERRUPTED = 130


def entry() -> None:
    try:
        from .cli import main

        code = main()
    except KeyboardInterrupt:
        print("ortflash: interrupted", file=sys.stderr)
        code = _EXIT_INTERRUPTED
    sys.exit(code)


if __name__ == "__main__":
    entry()
