"""Prune onnxruntime-gpu's CUDA provider library to one GPU architecture, so that the unpacked package
travels to the GPU machine in two 35 MiB pieces (benchmarks/README.md, "ONNX Runtime's CUDA EP on the
H200"). Every ``.nv_fatbin`` entry whose sm number is not ``--keep-sm`` has its payload zeroed in place
(headers and offsets kept: the loader still walks them, and picks the one kept entry for that GPU).

    python benchmarks/cuda_wheel_prune.py UNPACKED_WHEEL_DIR --keep-sm 90
"""

from __future__ import annotations

import argparse
import os
import struct
import sys

CONTAINER_MAGIC = 0xBA55ED50
CONTAINER_HEADER = struct.Struct("<IHHQ")  # magic, version, header size, size of the entries after it
ENTRY_HEADER = struct.Struct("<HHIQ")  # kind, version, header size, padded payload size
ENTRY_SM_AT = 28  # the sm number (e.g. 90) inside an entry's header


def fatbin_section(data: bytes | bytearray) -> tuple[int, int]:
    """(file offset, size) of the ELF's .nv_fatbin section (64-bit little-endian ELF only)."""
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    names_at = struct.unpack_from("<Q", data, shoff + shstrndx * shentsize + 0x18)[0]
    for i in range(shnum):
        base = shoff + i * shentsize
        name_off = struct.unpack_from("<I", data, base)[0]
        end = data.index(b"\0", names_at + name_off)
        if bytes(data[names_at + name_off : end]) == b".nv_fatbin":
            offset, size = struct.unpack_from("<QQ", data, base + 0x18)
            return offset, size
    raise SystemExit("no .nv_fatbin section")


def prune(data: bytearray, keep_sm: int) -> tuple[int, int, int]:
    """Zero the payload of every fatbin entry not for keep_sm: (entries kept, zeroed, bytes zeroed)."""
    start, size = fatbin_section(data)
    at, end = start, start + size
    kept = zeroed = zero_bytes = 0
    while at + CONTAINER_HEADER.size <= end:
        magic, _version, header, fat_size = CONTAINER_HEADER.unpack_from(data, at)
        if magic != CONTAINER_MAGIC:
            at += 8  # containers are 8-byte aligned; skip alignment padding
            continue
        entry, last = at + header, at + header + fat_size
        while entry + ENTRY_HEADER.size <= last:
            _kind, _ver, entry_header, payload = ENTRY_HEADER.unpack_from(data, entry)
            if entry_header == 0:
                break
            (sm,) = struct.unpack_from("<I", data, entry + ENTRY_SM_AT)
            body = entry + entry_header
            if sm == keep_sm:
                kept += 1
            else:
                data[body : body + payload] = bytes(payload)
                zeroed += 1
                zero_bytes += payload
            entry = body + payload
        at = last
    return kept, zeroed, zero_bytes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", help="the unpacked wheel (holds onnxruntime/capi)")
    parser.add_argument("--keep-sm", type=int, default=90)
    args = parser.parse_args(argv)
    capi = os.path.join(args.folder, "onnxruntime", "capi")
    lib = os.path.join(capi, "libonnxruntime_providers_cuda.so")
    if not os.path.exists(lib):
        print(f"error: no {lib}", file=sys.stderr)
        return 2
    data = bytearray(open(lib, "rb").read())
    kept, zeroed, zero_bytes = prune(data, args.keep_sm)
    open(lib, "wb").write(data)
    trt = os.path.join(capi, "libonnxruntime_providers_tensorrt.so")
    if os.path.exists(trt):
        os.remove(trt)
    print(
        f"kept {kept} sm_{args.keep_sm} entries, zeroed {zeroed} ({zero_bytes / 2**20:.0f} MiB); TensorRT provider dropped"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
