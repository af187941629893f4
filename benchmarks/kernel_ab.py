"""Two builds of the CPU kernel side by side in one process (issue 30 item 2): the AVX-512 module of
each tree (built in place), called alternately on the same arrays, 7 alternated loops each, the
minimum per call, one thread; naive and online, with a zero [B, 1, 1, S] bias and with its last
third padded (float32 lowest). Bit-identity of the two builds' outputs is checked per cell.

    python benchmarks/kernel_ab.py OLD_TREE NEW_TREE 64,128,256,512 HEADS HEAD_DIM
"""
import sys, time, glob, importlib.util, importlib.machinery, numpy as np
def load(d, tag):
    path = glob.glob(f"{d}/ortflash/kernels/_flash_avx512*.so")[0]
    loader = importlib.machinery.ExtensionFileLoader("_flash_avx512", path)
    spec = importlib.util.spec_from_file_location("_flash_avx512", path, loader=loader)
    m = importlib.util.module_from_spec(spec); loader.exec_module(m); return m
old, new = load(sys.argv[1], "old"), load(sys.argv[2], "new")
assert old is not new
rng = np.random.default_rng(0)
H, D = int(sys.argv[4]), int(sys.argv[5])
for S in [int(s) for s in sys.argv[3].split(",")]:
    q = rng.standard_normal((1, H, S, D), dtype=np.float32); k = rng.standard_normal((1, H, S, D), dtype=np.float32); v = rng.standard_normal((1, H, S, D), dtype=np.float32)
    res = []
    for online in (False, True):
        for padded in (False, True):
            bias = np.zeros((1, 1, 1, S), np.float32)
            if padded: bias[..., -(S // 3):] = np.finfo(np.float32).min
            qt = 64 if H * S > 256 else 16
            outs = {}
            f = {}
            for tag, m in (("old", old), ("new", new)):
                out = np.empty_like(q); outs[tag] = out
                f[tag] = (lambda m=m, out=out: m.flash_attention(q, k, v, out, bias, None, D ** -0.5, 0, float("-inf"), False, 0.0, online, 128, qt, 1, False, -1, -1))
            reps = max(3, int(1e7 / (S * S * H * D)))
            best = {"old": 1e9, "new": 1e9}
            for _ in range(7):
                for tag in ("old", "new"):
                    a = time.perf_counter()
                    for _ in range(reps): f[tag]()
                    best[tag] = min(best[tag], (time.perf_counter() - a) / reps)
            same = np.array_equal(outs["old"], outs["new"]); err = float(np.abs(outs["old"] - outs["new"]).max())
            res.append(f"{'on' if online else 'nv'}{'P' if padded else '-'} {best['old']*1e6:7.1f}->{best['new']*1e6:7.1f} ({best['old']/best['new']:.2f}x{'' if same else f' d={err:.1e}'})")
    print(S, " | ".join(res), flush=True)
