"""The pytest plugin (entry point ``pytest11``): every model of a regress manifest as its own test.

A test that takes the ``ortflash_case`` fixture runs once per model and target of a manifest::

    def test_models_stay_green(ortflash_case):
        ortflash_case.assert_ok()

The manifest comes from, in this order: ``@pytest.mark.ortflash_manifest("PATH")`` on the test
(relative to the test file), ``pytest --ortflash-manifest PATH`` (relative to where pytest runs),
or ``ortflash_manifest = "PATH"`` in the pytest configuration (relative to its root). Each case
makes the checks ``ortflash regress`` makes for that row, and fails with its problems in words.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

import pytest

from .regress.manifest import ModelCheck, load_manifest
from .regress.model_checks import BENCH_ROW, CheckResult, check_model

FIXTURE = "ortflash_case"
MARKER = "ortflash_manifest"
OPTION = "--ortflash-manifest"
INI = "ortflash_manifest"


@dataclass(frozen=True)
class RegressCase:
    """One model and one target of a manifest (target ``bench``: its speed against the baseline)."""

    check: ModelCheck
    target: str

    @property
    def id(self) -> str:
        return f"{self.check.shown}[{self.target}]"

    def run(self) -> CheckResult:
        """The row ``ortflash regress`` would print for this model and target."""
        if self.target == BENCH_ROW:
            only = dataclasses.replace(self.check, blocks={})
        else:
            only = dataclasses.replace(self.check, blocks={self.target: self.check.blocks[self.target]}, baseline=None)
        (row,) = check_model(only)
        return row

    def assert_ok(self) -> CheckResult:
        row = self.run()
        if not row.ok:
            raise AssertionError(f"{self.id} regressed:\n" + "\n".join(f"  {p}" for p in row.problems))
        return row


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("ortflash")
    group.addoption(OPTION, metavar="PATH", help=f"regress manifest whose models the {FIXTURE} fixture runs")
    parser.addini(INI, help=f"regress manifest whose models the {FIXTURE} fixture runs (relative to the rootdir)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{MARKER}(path): the regress manifest whose models {FIXTURE} runs")


def _manifest_path(metafunc: pytest.Metafunc) -> str:
    marker = metafunc.definition.get_closest_marker(MARKER)
    if marker is not None and marker.args:
        return os.path.join(os.path.dirname(str(metafunc.definition.path)), str(marker.args[0]))
    given = metafunc.config.getoption(OPTION)
    if given:
        return os.path.abspath(str(given))
    ini = metafunc.config.getini(INI)
    if ini:
        return os.path.join(str(metafunc.config.rootpath), str(ini))
    raise pytest.UsageError(
        f"{metafunc.definition.nodeid} takes {FIXTURE}: give a manifest with @pytest.mark.{MARKER}(PATH), "
        f"{OPTION} PATH or the {INI} ini option"
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if FIXTURE not in metafunc.fixturenames:
        return
    from .errors import OrtflashError

    try:
        manifest = load_manifest(_manifest_path(metafunc))
    except OrtflashError as exc:
        raise pytest.UsageError(str(exc)) from None
    cases = [RegressCase(check, target) for check in manifest.checks for target in check.targets]
    cases += [RegressCase(check, BENCH_ROW) for check in manifest.checks if check.baseline is not None]
    metafunc.parametrize(FIXTURE, cases, ids=[case.id for case in cases])
