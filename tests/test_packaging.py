"""Issue 25 item 2: what a package index and other machines take from us.

- The generic kernel build compiles for aarch64 (Debian's g++-aarch64-linux-gnu, installed by .ci/run)
  with setup.py's own flags: no x86 intrinsic outside the ISA guards, so an sdist installs on arm64.
- The compiled modules import no glibc symbol newer than manylinux_2_24 allows (2.24), which is
  what lets ``auditwheel repair`` tag the wheel manylinux_2_24 (.ci/run repairs it and checks the tag).
- The sdist carries what a build from it needs, and its metadata names the license file, the
  classifiers and the Python versions.

.ci/run builds both artifacts (the wheel from the sdist), installs the wheel in a clean venv and runs the kernel tests and
``ortflash optimize --verify`` there; this file checks what can be checked without a second venv.
"""

from __future__ import annotations

import ast
import email
import glob
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile

import pytest
import tomllib

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
CROSS = "aarch64-linux-gnu-g++"
EM_AARCH64 = 183  # ELF e_machine
NEWEST_GLIBC = (2, 24)  # manylinux_2_24: the tag .ci/run asks auditwheel for
NEWEST_GLIBCXX = (3, 4, 22)  # and the libstdc++ and C++ ABI versions auditwheel allows with it
NEWEST_CXXABI = (1, 3, 10)


def setup_flags() -> tuple[list[str], dict[str, list[str]]]:
    """COMMON_FLAGS and ISA_FLAGS as setup.py writes them (read, not run: running it builds)."""
    with open(os.path.join(ROOT, "setup.py")) as f:
        tree = ast.parse(f.read())
    found: dict[str, object] = {}
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        if isinstance(target, ast.Name) and target.id in ("COMMON_FLAGS", "ISA_FLAGS") and node.value is not None:
            found[target.id] = ast.literal_eval(node.value)
    return found["COMMON_FLAGS"], found["ISA_FLAGS"]  # type: ignore[return-value]


@pytest.mark.skipif(
    shutil.which(CROSS) is None, reason=f"{CROSS} is not installed (apt-get install g++-aarch64-linux-gnu)"
)
def test_the_generic_kernel_compiles_for_aarch64(tmp_path):
    common, isa = setup_flags()
    assert isa["generic"] == []
    obj = tmp_path / "module_generic.o"
    # Python's headers are this interpreter's: only pyconfig.h is per-architecture, and its sizes
    # (LP64, little-endian) are aarch64's too; the object is not linked or run.
    done = subprocess.run(
        [CROSS, *common, *isa["generic"], "-fPIC", "-Werror", "-I", sysconfig.get_paths()["include"]]
        + ["-c", "csrc/module_generic.cpp", "-o", str(obj)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    header = obj.read_bytes()[:20]
    assert header[:4] == b"\x7fELF" and int.from_bytes(header[18:20], "little") == EM_AARCH64
    # the x86 flags really would not compile there: the ISA builds are x86-only by setup.py's choice
    refused = subprocess.run(
        [CROSS, *isa["avx2"], "-x", "c++", "-c", "-", "-o", os.devnull], input="", text=True, capture_output=True
    )
    assert refused.returncode != 0


def _glibc_versions(path: str, library: str = "GLIBC") -> set[tuple[int, ...]]:
    """The LIBRARY_x.y versions (GLIBC, GLIBCXX, CXXABI) a shared object's dynamic symbols ask for."""
    out = subprocess.run(["objdump", "-T", path], capture_output=True, text=True, check=True).stdout
    return {tuple(int(p) for p in v.split(".")) for v in re.findall(rf"\b{library}_([0-9.]+)\b", out)}


@pytest.mark.skipif(shutil.which("objdump") is None, reason="objdump (binutils) is not installed")
def test_the_compiled_kernels_need_no_glibc_newer_than_manylinux_2_24():
    built = sorted(glob.glob(os.path.join(ROOT, "ortflash", "kernels", "_flash_*.so")))
    assert built, "no compiled kernel here: pip install -e . builds them"
    for path in built:
        newest = max(_glibc_versions(path))
        # libstdc++'s inline code read __libc_single_threaded (GLIBC_2.32) before setup.py's -include
        assert newest <= NEWEST_GLIBC, f"{os.path.basename(path)} needs GLIBC_{'.'.join(map(str, newest))}"
        # manylinux_2_24's libstdc++ (GCC 6): std::condition_variable::wait of libstdc++ 12 is
        # GLIBCXX_3.4.30, and std::mutex::try_lock pthread_mutex_trylock@GLIBC_2.34 (the worker pool)
        for library, allowed in (("GLIBCXX", NEWEST_GLIBCXX), ("CXXABI", NEWEST_CXXABI)):
            newest = max(_glibc_versions(path, library), default=(0,))
            assert newest <= allowed, f"{os.path.basename(path)} needs {library}_{'.'.join(map(str, newest))}"


def test_the_sdist_has_the_sources_license_and_metadata(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "build", "--sdist", "--outdir", str(tmp_path), ROOT],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (sdist,) = glob.glob(str(tmp_path / "ortflash-*.tar.gz"))
    with tarfile.open(sdist) as tar:
        names = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
        pkg_info = tar.extractfile(next(n for n in tar.getnames() if n.endswith("/PKG-INFO"))).read().decode()
    for needed in (
        "LICENSE",
        "setup.py",
        "pyproject.toml",
        "README.md",
        "csrc/flash_attention.hpp",
        "csrc/libc_single_threaded.hpp",
        "csrc/module_generic.cpp",
        "ortflash/py.typed",
        "ortflash/lowering/cuda_capabilities.json",  # the measured tables the GPU targets load
        "ortflash/lowering/webgpu_capabilities.json",
    ):
        assert needed in names, needed
    metadata = email.message_from_string(pkg_info)
    assert metadata["License-Expression"] == "MIT" and metadata.get_all("License-File") == ["LICENSE"]
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    assert metadata["Requires-Python"] == project["requires-python"]
    classifiers = metadata.get_all("Classifier")
    assert classifiers == project["classifiers"]
    tested = f"Programming Language :: Python :: {sys.version_info.major}.{sys.version_info.minor}"
    assert tested in classifiers  # the version this suite runs on is one the package names
