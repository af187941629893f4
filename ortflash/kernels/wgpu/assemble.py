"""The WGSL source of one specialised kernel, from the ``.wgsl`` files in ``shaders/``.

A kernel is assembled from three files: one ``io_*.wgsl`` (how Q/K/V/O are
stored: float32, or float16 with ``shader-f16``), ``common.wgsl`` (parameters
and the score of one query/key pair, as ortflash.spec defines it) and the
kernel itself; flash.wgsl also gets one ``reduce_*.wgsl`` (row reductions by
subgroup shuffles, or stand-ins where it reduces through workgroup memory). The ``${NAME}`` fields in a kernel are specialisation constants
(tile sizes, head dims) filled in from Python, so a number the host plans with
is written once; loops marked ``// @unroll`` are then written out.
"""

from __future__ import annotations

import re
import string
from collections.abc import Mapping
from functools import cache
from pathlib import Path

SHADER_DIR = Path(__file__).resolve().parent / "shaders"

# The naive kernel's fixed work split (naive.wgsl's T and SM), shared with the
# dispatch planner that sizes its grids.
# scores_pass and weighted_sum_pass run NAIVE_TILE x NAIVE_TILE invocations per
# workgroup, one score (or one output vec4) each: 16 x 16 = 256 is WebGPU's
# default invocation limit, and scores_pass needs at least 8 (2 x 4 vec4s of Q
# and K staged per invocation row).
NAIVE_TILE = 16
# softmax_pass runs one workgroup of this many invocations per score row; a
# power of two for its tree reduction.
NAIVE_SOFTMAX_WORKGROUP = 256


def read_shader(name: str) -> str:
    """The text of one file in shaders/."""
    return (SHADER_DIR / name).read_text()


@cache
def _template(name: str) -> string.Template:
    return string.Template(read_shader(name))


def naive_constants(d4: int, dv4: int) -> dict[str, int]:
    """The specialisation constants of naive.wgsl for head dims of d4 and dv4 vec4s."""
    return {"D4": d4, "DV4": dv4, "T": NAIVE_TILE, "SM": NAIVE_SOFTMAX_WORKGROUP}


def assemble(kernel: str, io: str, constants: Mapping[str, int]) -> str:
    """The WGSL source of one specialised kernel: io file + common.wgsl (+ for flash, its row
    reductions: by subgroup shuffles when the constant SG is 1) + kernel file."""
    body = unroll(_template(f"{kernel}.wgsl").substitute(constants), constants)
    parts = [read_shader(f"io_{io}.wgsl"), read_shader("common.wgsl")]
    if kernel == "flash":
        parts.append(read_shader("reduce_subgroup.wgsl" if constants.get("SG") else "reduce_shared.wgsl"))
    return "\n".join([*parts, body])


# `// @unroll` on the line before `for (var x = <n>u; x < <NAME or n>; x++) {`.
_UNROLL = re.compile(
    r"^(?P<indent>[ \t]*)// @unroll[ \t]*\n[ \t]*for \(var (?P<var>\w+) = (?P<start>\d+)u; "
    r"(?P=var) < (?P<stop>\w+); (?P=var)\+\+\) \{",
    re.MULTILINE,
)


def _closing_brace(src: str, open_brace: int) -> int:
    """The index of the `}` that closes the `{` at open_brace."""
    depth = 0
    for i in range(open_brace, len(src)):
        depth += src[i] == "{"
        depth -= src[i] == "}"
        if depth == 0:
            return i
    raise ValueError(f"unbalanced braces after offset {open_brace} in a // @unroll loop")


def unroll(src: str, values: Mapping[str, int]) -> str:
    """Write out every loop marked `// @unroll`: one block per counter value, the counter a `const`.

    WGSL has no unroll attribute, and a private array indexed by a loop
    counter may be kept in local memory (NVIDIA) or miscompiled (lavapipe);
    with the counter a constant, every such index is a constant. The bound is
    a literal or a name in `values` (a specialisation constant). Nested
    marked loops are written out too.
    """
    while True:
        loop = _UNROLL.search(src)
        if loop is None:
            return src
        stop = loop["stop"]
        count = int(values[stop]) if stop in values else int(stop.rstrip("u"))
        open_brace = loop.end() - 1
        close_brace = _closing_brace(src, open_brace)
        body = src[open_brace + 1 : close_brace].rstrip()
        indent = loop["indent"]
        copies = "".join(
            f"{indent}{{ const {loop['var']}: u32 = {n}u;{body}\n{indent}}}\n" for n in range(int(loop["start"]), count)
        )
        end = close_brace + 1
        if src[end : end + 1] == "\n":
            end += 1
        src = src[: loop.start()] + copies + src[end:]
