"""WGSL attention kernels (naive.wgsl, flash.wgsl) and their wgpu runner (runner.py)."""
