"""Build the compiled FlashAttention CPU kernel; the package metadata lives in pyproject.toml.

The same C++ source (csrc/flash_attention.hpp) is built once per instruction set, as three
extension modules; ortflash.kernels.cpu imports the best one the CPU runs. Nothing is built
with -march=native, so a wheel runs on any x86-64 CPU (and the generic build elsewhere).
"""

from __future__ import annotations

import glob
import platform
import sys

from setuptools import Extension, setup

COMMON_FLAGS = [
    "-std=c++17",
    "-O3",
    "-pthread",
    "-fvisibility=hidden",
    "-ffp-contract=fast",  # fused multiply-add in the tile products; no -ffast-math (inf/NaN must hold)
    "-fno-math-errno",
    "-g0",
    # a copy of glibc's __libc_single_threaded inside each module: the wheel then needs no glibc newer
    # than 2.17's symbols (manylinux_2_24 with the libstdc++ it uses); the header says why it is safe
    "-include",
    "csrc/libc_single_threaded.hpp",
]

ISA_FLAGS: dict[str, list[str]] = {
    "avx512": ["-mavx512f", "-mavx512dq", "-mavx512vl", "-mavx512bw", "-mavx2", "-mfma", "-mf16c"],
    "avx2": ["-mavx2", "-mfma", "-mf16c"],
    "generic": [],
}


def is_x86() -> bool:
    return platform.machine().lower() in {"x86_64", "amd64", "i386", "i686", "x86"}


def kernel_extension(isa: str) -> Extension:
    return Extension(
        f"ortflash.kernels._flash_{isa}",
        sources=[f"csrc/module_{isa}.cpp"],
        depends=["csrc/flash_attention.hpp", "csrc/libc_single_threaded.hpp", *sorted(glob.glob("csrc/flash/*.hpp"))],
        language="c++",
        extra_compile_args=COMMON_FLAGS + ISA_FLAGS[isa],
        extra_link_args=["-pthread"],
    )


def kernel_extensions() -> list[Extension]:
    if sys.platform == "win32":
        return []  # GCC/Clang flags only; Windows uses the numpy fallback
    return [kernel_extension(isa) for isa in (("avx512", "avx2", "generic") if is_x86() else ("generic",))]


# The three builds compile in parallel (build_ext --parallel).
setup(ext_modules=kernel_extensions(), options={"build_ext": {"parallel": True}})
