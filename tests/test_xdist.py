"""Issue 25 item 3: the regress pytest plugin under pytest-xdist (``pytest -n 2``).

Every worker collects the manifest itself (pytest_generate_tests runs in each), so the cases must come
out in the same order everywhere and each must run once, on one worker. This runs a real pytest with
two xdist workers in a subprocess (the workers are processes anyway) and counts the JUnit test cases.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET

import onnx
from attention_graphs import Variant, build

ROOT = os.path.join(os.path.dirname(__file__), "..")


def test_the_plugin_under_xdist_runs_each_case_once(tmp_path):
    onnx.save(build(Variant()), str(tmp_path / "plain.onnx"))
    onnx.save(build(Variant(bias_shapes=(("B", 1, 1, "T"),))), str(tmp_path / "padded.onnx"))
    (tmp_path / "models.toml").write_text(
        textwrap.dedent(
            """
            [[model]]
            path = "plain.onnx"
            blocks = { ortflash = 1, onnx = 1 }

            [[model]]
            path = "padded.onnx"
            blocks = { ortflash = 1, contrib = 1 }
            """
        )
    )
    (tmp_path / "test_models.py").write_text(
        textwrap.dedent(
            """
            def test_green(ortflash_case):
                ortflash_case.assert_ok()
            """
        )
    )
    junit = tmp_path / "cases.xml"
    # the plugin is found through its installed pytest11 entry point, in the controller and in each worker
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "-v", "-p", "no:cacheprovider", "--rootdir", str(tmp_path)]
        + ["--ortflash-manifest", str(tmp_path / "models.toml"), f"--junit-xml={junit}", str(tmp_path)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    cases = [case.get("name") for case in ET.parse(junit).getroot().iter("testcase")]
    assert sorted(cases) == sorted(
        [
            "test_green[plain.onnx[ortflash]]",
            "test_green[plain.onnx[onnx]]",
            "test_green[padded.onnx[ortflash]]",
            "test_green[padded.onnx[contrib]]",
        ]
    ), done.stdout
    # both workers took cases (xdist's load scheduling hands out 4 cases on 2 workers two apiece)
    ran_on = {line.split()[0] for line in done.stdout.splitlines() if line.startswith("[gw") and "PASSED" in line}
    assert ran_on == {"[gw0]", "[gw1]"}, done.stdout
    assert "4 passed" in done.stdout, done.stdout
