"""Issue 25 item 4: the README and docs/ say what runs.

- Every Python and shell snippet of README.md and docs/*.md runs: Python ones in this process, in a
  folder holding the zoo's BERT as ``model.onnx``; shell ones with bash in a folder where ``models/``
  is the zoo. A snippet marked ``<!-- snippet: syntax-only (why) -->`` on the line before its fence
  (it sets up a machine, needs a GPU or runs for minutes) is only parsed: Python compiled, shell by
  ``bash -n``, each of its ``ortflash`` commands by the real parser, each script it names found.
- Every option of every command is on the command-line page, and its option tables are the ones
  ``docs/cli_reference.py`` writes from the parser now.
- Every relative link of README.md, docs/, ARCHITECTURE.md and CONTRIBUTING.md reaches a file, and
  a link to a heading reaches a heading of that page.
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
DOCS = os.path.join(ROOT, "docs")
ZOO = os.path.join(ROOT, "models")
PAGES = [os.path.join(ROOT, "README.md"), *sorted(glob.glob(os.path.join(DOCS, "*.md")))]
LINKED = [*PAGES, os.path.join(ROOT, "ARCHITECTURE.md"), os.path.join(ROOT, "CONTRIBUTING.md")]
SYNTAX_ONLY = re.compile(r"<!-- snippet: syntax-only \((.+?)\) -->")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.DOTALL | re.MULTILINE)
PYTHON, SHELL = ("python",), ("bash", "sh", "shell", "console")
README_LINES = 150


@dataclasses.dataclass(frozen=True)
class Snippet:
    page: str  # relative to the root
    line: int
    language: str
    code: str
    syntax_only: str | None  # why it is only parsed

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def snippets(languages: tuple[str, ...]) -> list[Snippet]:
    found = []
    for page in PAGES:
        with open(page) as f:
            text = f.read()
        for match in FENCE.finditer(text):
            if match.group(1) not in languages:
                continue
            before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
            marked = SYNTAX_ONLY.fullmatch(before.strip())
            line = text.count("\n", 0, match.start()) + 1
            found.append(
                Snippet(os.path.relpath(page, ROOT), line, match.group(1), match.group(2), marked and marked.group(1))
            )
    return found


def test_every_page_has_snippets_and_most_run():
    python, shell = snippets(PYTHON), snippets(SHELL)
    assert len(python) >= 5 and len(shell) >= 4
    assert sum(s.syntax_only is None for s in python) >= 5  # the GPU-free Python all runs


@pytest.mark.parametrize("snippet", snippets(PYTHON), ids=lambda s: s.id)
def test_the_python_snippet_runs(snippet, tmp_path, monkeypatch):
    code = compile(snippet.code, snippet.id, "exec")
    if snippet.syntax_only:
        return
    shutil.copy(os.path.join(ZOO, "bert_sdpa_dynamo.onnx"), tmp_path / "model.onnx")
    monkeypatch.chdir(tmp_path)
    exec(code, {"__name__": "__snippet__"})  # noqa: S102 - the page's own code


def _commands(code: str) -> list[str]:
    """The snippet's commands, one per logical line (backslash continuations joined, comments dropped)."""
    joined = re.sub(r"\\\n\s*", " ", code)
    lines = [line.split(" #", 1)[0].strip() for line in joined.splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def _parse_ortflash(command: str) -> None:
    """Parse one ``ortflash ...`` command with the real parser (an unknown option exits 2)."""
    from ortflash.cli import build_parser

    argv = shlex.split(command)[1:]
    argv = argv[: argv.index("&&")] if "&&" in argv else argv
    try:
        build_parser().parse_args(argv)
    except SystemExit as exc:
        raise AssertionError(f"the parser refuses: {command}") from exc


@pytest.mark.parametrize("snippet", snippets(SHELL), ids=lambda s: s.id)
def test_the_shell_snippet_runs(snippet, tmp_path):
    checked = subprocess.run(["bash", "-n"], input=snippet.code, text=True, capture_output=True)
    assert checked.returncode == 0, checked.stderr
    for command in _commands(snippet.code):
        for part in command.split("&&"):
            part = part.strip()
            if part.startswith("ortflash "):
                _parse_ortflash(part)
            script = re.match(r"python3? (\S+\.py)\b", part)
            if script:
                assert os.path.isfile(os.path.join(ROOT, script.group(1))), part
    if snippet.syntax_only:
        return
    os.symlink(ZOO, tmp_path / "models")
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", snippet.code],
        cwd=tmp_path,
        env=env,
        text=True,
        capture_output=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def test_the_quick_start_command_runs(tmp_path):
    """The quick start's first command, past its setup (the venv and the editable install are this
    test's own): the fused BERT is written and verified."""
    (snippet,) = [s for s in snippets(SHELL) if s.page == "README.md" and "ortflash optimize" in s.code]
    (line,) = [c for c in _commands(snippet.code) if "ortflash optimize" in c]
    command = line[line.index("ortflash optimize") :]
    os.symlink(ZOO, tmp_path / "models")
    done = subprocess.run(
        [sys.executable, "-m", "ortflash", *shlex.split(command)[1:]],
        cwd=tmp_path,
        text=True,
        capture_output=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (tmp_path / "bert.flash.onnx").is_file()
    assert "2 of 2 attention blocks" in done.stdout


def _every_option() -> dict[str, list[str]]:
    from ortflash.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    options = {"": [o for a in parser._actions for o in a.option_strings]}
    for name, command in sub.choices.items():
        options[name] = [o for a in command._actions for o in a.option_strings]
    return options


def test_every_option_of_every_command_is_on_the_command_line_page():
    with open(os.path.join(DOCS, "command-line.md")) as f:
        page = f.read()
    missing = []
    for command, options in _every_option().items():
        section = page.split(f"### `ortflash {command}`".replace("ortflash `", "ortflash`"), 1)
        assert len(section) == 2, f"no section for ortflash {command}"
        body = section[1].split("\n### ", 1)[0]
        missing += [f"{command} {o}" for o in options if f"`{o}`" not in body]
    assert missing == []
    # and in the synopsis (the README's old test, item 16 of issue 21): every command there
    synopsis = page.split("```", 2)[1]
    assert {
        re.match(r"ortflash (\S+)", line).group(1) for line in synopsis.splitlines() if line.startswith("ortflash ")
    } == {
        "--version",
        *[c for c in _every_option() if c],
    }


def test_the_option_tables_are_the_parsers():
    done = subprocess.run(
        [sys.executable, os.path.join(DOCS, "cli_reference.py"), "--check"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr


def _slug(heading: str) -> str:
    """A heading's anchor as GitHub writes it."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: str) -> set[str]:
    with open(path) as f:
        text = FENCE.sub("", f.read())
    return {_slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, re.MULTILINE)}


def test_every_relative_link_reaches_a_file_and_heading():
    broken = []
    for page in LINKED:
        with open(page) as f:
            text = FENCE.sub("", f.read())
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue  # an absolute URL
            path, _, anchor = target.partition("#")
            resolved = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
            where = f"{os.path.relpath(page, ROOT)}: {target}"
            if not os.path.exists(resolved):
                broken.append(where)
            elif anchor and resolved.endswith(".md") and anchor not in _anchors(resolved):
                broken.append(f"{where} (no such heading)")
    assert broken == []


def test_the_readme_is_short_and_links_every_page():
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    assert len(readme.splitlines()) <= README_LINES
    for page in glob.glob(os.path.join(DOCS, "*.md")):
        assert f"docs/{os.path.basename(page)}" in readme, page
