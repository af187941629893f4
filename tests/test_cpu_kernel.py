"""The compiled CPU FlashAttention kernel against the numpy reference and a float64 truth.

Every ISA build this CPU runs is tested (chosen through ORTFLASH_CPU_ISA), in both softmax
modes. Errors against float64 must be no worse than the numpy reference's (a ratio); the
discrete outcomes (NaN, 0, a uniform row) must match the reference exactly.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from ortflash.kernels import cpu, reference

LOWEST = float(np.finfo(np.float32).min)
MODES = ("naive", "online")


def runnable_isas() -> list[str]:
    """ISA builds that import here and whose features this CPU has."""
    features = cpu._cpu_features()
    found = []
    for isa, needs in cpu.ISA_REQUIREMENTS.items():
        try:
            cpu._import_build(isa)
        except ImportError:
            continue
        if set(needs) <= features:
            found.append(isa)
    return found


ISAS = runnable_isas()


@pytest.fixture(params=ISAS or [pytest.param("none", marks=pytest.mark.skip(reason="no compiled kernel"))])
def isa(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(cpu.ISA_ENV, request.param)
    assert cpu.isa() == request.param
    return request.param


def truth(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    bias: np.ndarray | None = None,
    mask: np.ndarray | None = None,
    *,
    scale: float = 1.0,
    is_causal: int = 0,
    mask_fill: float = -np.inf,
    masked_rows: str = "nan",
    softcap: float = 0.0,
    bias_after_mask: int = 0,
    **_: object,
) -> np.ndarray:
    """The spec in float64 with the naive softmax, K/V heads repeated (deliberately simple)."""
    q, k, v = (np.asarray(t, np.float64) for t in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    s = scale * (q @ np.swapaxes(k, -1, -2))
    if softcap > 0:
        s = softcap * np.tanh(s / softcap)
    if bias is not None and not bias_after_mask:
        s = s + np.asarray(bias, np.float64)
    if mask is not None:
        s = np.where(mask, s, mask_fill)
    if is_causal:
        sq, sk = s.shape[-2:]
        offset = sk - sq if is_causal == 2 else 0  # bottom-right: query i sees keys j <= i + Sk - Sq
        s = np.where(np.tril(np.ones((sq, sk), bool), k=offset), s, mask_fill)
    if bias is not None and bias_after_mask:
        with np.errstate(invalid="ignore", over="ignore"):
            s = s + np.asarray(bias, np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        p = np.exp(s - s.max(axis=-1, keepdims=True))
        p = p / p.sum(axis=-1, keepdims=True)
    if masked_rows == "zero":
        p = np.where(np.isnan(p), 0, p)
    return p @ v


def inputs(
    b: int = 1,
    hq: int = 2,
    hkv: int = 2,
    sq: int = 8,
    sk: int = 8,
    d: int = 16,
    dv: int | None = None,
    dtype: type = np.float32,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((b, hq, sq, d)).astype(dtype)
    k = rng.standard_normal((b, hkv, sk, d)).astype(dtype)
    v = rng.standard_normal((b, hkv, sk, dv or d)).astype(dtype)
    return q, k, v


def check(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    bias: np.ndarray | None = None,
    mask: np.ndarray | None = None,
    **attrs: object,
) -> np.ndarray:
    """Run the compiled kernel and assert it against the reference and the float64 truth."""
    got = cpu.flash_attention(q, k, v, bias, mask, **attrs)
    ref = reference.flash_attention(q, k, v, bias, mask, **attrs)
    assert got.dtype == ref.dtype and got.shape == ref.shape
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref), err_msg="NaN pattern differs from the reference")
    np.testing.assert_array_equal(np.isinf(got), np.isinf(ref))
    exact = truth(q, k, v, bias, mask, **attrs)
    finite = np.isfinite(ref)
    if finite.any():
        err_got = np.max(np.abs(got[finite].astype(np.float64) - exact[finite]))
        # the reference's error in either softmax mode (its block-1 online run sums differently)
        naive = reference.flash_attention(q, k, v, bias, mask, **{**attrs, "softmax": "naive"})
        err_ref = max(np.max(np.abs(r[finite].astype(np.float64) - exact[finite])) for r in (ref, naive))
        slack = 1e-6 if q.dtype != np.float16 else 1e-3
        assert err_got <= 2 * err_ref + slack, f"compiled error {err_got:.3g} vs reference {err_ref:.3g}"
    return got


SHAPES = [  # (B, Hq, Hkv, Sq, Sk, D, Dv)
    (1, 8, 2, 63, 65, 64, 64),
    (2, 8, 1, 7, 300, 15, 15),
    (1, 2, 2, 1, 1, 1, 1),
    (1, 4, 4, 65, 63, 80, 80),
    (1, 2, 1, 70, 7, 128, 128),
    (1, 3, 3, 64, 64, 64, 80),
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_matches_reference(isa: str, mode: str, dtype: type, shape: tuple[int, ...]) -> None:
    b, hq, hkv, sq, sk, d, dv = shape
    q, k, v = inputs(b, hq, hkv, sq, sk, d, dv, dtype)
    check(q, k, v, softmax=mode, scale=d**-0.5)


def bias_and_mask(
    shape_name: str, b: int, hq: int, sq: int, sk: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    shape = {"sk": (sk,), "b11k": (b, 1, 1, sk), "b1qk": (b, 1, sq, sk), "1hqk": (1, hq, sq, sk)}[shape_name]
    return rng.standard_normal(shape).astype(np.float32), rng.random(shape) > 0.3


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape_name", ["sk", "b11k", "b1qk", "1hqk"])
def test_bias_and_mask_broadcast(isa: str, mode: str, shape_name: str) -> None:
    b, hq, hkv, sq, sk = 2, 4, 2, 33, 70
    q, k, v = inputs(b, hq, hkv, sq, sk, 24)
    bias, mask = bias_and_mask(shape_name, b, hq, sq, sk, np.random.default_rng(1))
    check(q, k, v, bias, None, softmax=mode, block_size=16)
    check(q, k, v, bias.astype(np.float16), None, softmax=mode)
    check(q, k, v, None, mask, softmax=mode, block_size=16)
    check(q, k, v, bias, mask, softmax=mode, mask_fill=-1e4)
    # a broadcast view (0 strides) and a non-contiguous bias take the strided path
    check(q, k, v, np.broadcast_to(bias, np.broadcast_shapes(bias.shape, (b, 1, 1, sk))), None, softmax=mode)
    check(q, k, v, np.asfortranarray(bias), None, softmax=mode)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("sq,sk", [(20, 70), (70, 70), (70, 20), (1, 9), (9, 1)])
@pytest.mark.parametrize("fill", [-np.inf, -1e4, LOWEST])
@pytest.mark.parametrize("causal", [1, 2])
def test_causal(isa: str, mode: str, sq: int, sk: int, fill: float, causal: int) -> None:
    """Top-left (1) and bottom-right (2) alignment; with 2 and Sq > Sk the first Sq - Sk rows
    see no key, with 1 and Sq < Sk the tiles right of every row are skipped."""
    q, k, v = inputs(1, 4, 2, sq, sk, 16)
    padding = np.ones((1, 1, 1, sk), bool)
    padding[..., : sk // 3] = False  # left padding: the first rows see no key at all
    for block in (1, 16, 64, 1000):
        check(q, k, v, softmax=mode, is_causal=causal, mask_fill=fill, block_size=block)
        for rows in ("nan", "zero"):
            check(
                q,
                k,
                v,
                None,
                padding,
                softmax=mode,
                is_causal=causal,
                mask_fill=fill,
                masked_rows=rows,
                block_size=block,
            )


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("sq,sk", [(20, 70), (70, 70), (70, 20)])
def test_bottom_right_causal_is_the_last_rows_of_top_left(isa: str, mode: str, sq: int, sk: int) -> None:
    """is_causal=2 on Sq queries is is_causal=1 on Sk queries keeping the last Sq rows (Sq <= Sk),
    bit for bit in the compiled kernel; with Sq > Sk the first Sq - Sk rows see no key."""
    q, k, v = inputs(1, 2, 1, max(sq, sk), sk, 16)
    for block in (16, 1000):
        top_left = cpu.flash_attention(q, k, v, softmax=mode, is_causal=1, block_size=block)
        last = q[:, :, -sq:]
        bottom_right = cpu.flash_attention(last, k, v, softmax=mode, is_causal=2, block_size=block)
        if sq <= sk:
            np.testing.assert_allclose(bottom_right, top_left[:, :, -sq:], rtol=1e-6, atol=1e-6)
        else:
            assert np.isnan(bottom_right[:, :, : sq - sk]).all()
            assert np.isfinite(bottom_right[:, :, sq - sk :]).all()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fill", [-np.inf, -1e4, LOWEST])
@pytest.mark.parametrize("causal", [0, 1, 2])
def test_bias_after_mask(isa: str, mode: str, fill: float, causal: int) -> None:
    """GPT-Neo's order: the mask and causal fills first, then the bias (a masked score is
    fill + bias). With fill float32-lowest and a lowest padding bias, masked keys reach -inf."""
    b, sq, sk = 2, 33, 70
    q, k, v = inputs(b, 4, 2, sq, sk, 16)
    rng = np.random.default_rng(5)
    bias = rng.standard_normal((b, 1, sq, sk)).astype(np.float32)
    bias[0, ..., 50:] = LOWEST  # padding, added on top of the fill
    mask = rng.random((1, 1, sq, sk)) > 0.3
    mask[..., 4, :] = False  # a row the mask removes: its scores are fill + bias, not uniform
    for block in (16, 1000):
        for rows in ("nan", "zero"):
            got = check(
                q,
                k,
                v,
                bias,
                mask,
                softmax=mode,
                is_causal=causal,
                mask_fill=fill,
                masked_rows=rows,
                bias_after_mask=1,
                block_size=block,
            )
            before = cpu.flash_attention(
                q, k, v, bias, mask, softmax=mode, is_causal=causal, mask_fill=fill, masked_rows=rows, block_size=block
            )
            if np.isfinite(fill):  # the order matters exactly where every key of a row is masked
                assert not np.allclose(got[:, :, 4], before[:, :, 4], equal_nan=True)
        check(q, k, v, bias[..., :1, :], None, softmax=mode, is_causal=causal, mask_fill=fill, bias_after_mask=1)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("rows", ["nan", "zero"])
@pytest.mark.parametrize("fill", [-np.inf, -1e4, LOWEST])
def test_fully_masked_rows(isa: str, mode: str, rows: str, fill: float) -> None:
    q, k, v = inputs(2, 2, 1, 9, 40, 8)
    mask = np.random.default_rng(2).random((2, 1, 9, 40)) > 0.5
    mask[0, :, 3] = False  # one query row of batch 0 sees nothing
    mask[1] = False  # batch 1 sees nothing at all
    got = check(q, k, v, None, mask, softmax=mode, masked_rows=rows, mask_fill=fill, block_size=16)
    if fill == -np.inf:
        assert np.isnan(got[1]).all() if rows == "nan" else (got[1] == 0).all()
    else:  # a finite fill: the fully masked row is a uniform softmax over all keys
        np.testing.assert_allclose(got[1, 0, 0], v[1, 0].mean(axis=0), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", MODES)
def test_minus_inf_bias_and_softcap(isa: str, mode: str) -> None:
    q, k, v = inputs(1, 4, 2, 30, 50, 32)
    bias = np.random.default_rng(3).standard_normal((1, 1, 30, 50)).astype(np.float32)
    bias[..., ::3] = -np.inf
    bias[0, 0, 5] = -np.inf  # a whole row
    for rows in ("nan", "zero"):
        check(q, k, v, bias, softmax=mode, masked_rows=rows, block_size=16)
    check(q, k, v, bias[..., 1:2, :], softmax=mode, softcap=3.0, scale=2.0)
    check(q, k, v, softmax=mode, softcap=0.5)


@pytest.mark.parametrize("mode", MODES)
def test_nan_inputs_propagate(isa: str, mode: str) -> None:
    q, k, v = inputs(1, 2, 1, 20, 40, 16)
    q[0, 0, 3, 5] = np.nan
    k[0, 0, 30, 2] = np.nan
    v[0, 0, 7, 1] = np.nan
    bias = np.zeros((1, 1, 20, 40), np.float32)
    bias[0, 0, 11, 0] = np.nan
    for rows in ("nan", "zero"):
        got = check(q, k, v, bias, softmax=mode, masked_rows=rows, block_size=16)
        assert np.isnan(got).any()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fill", [-np.inf, -1e4, LOWEST])
def test_padded_key_tiles(isa: str, mode: str, fill: float) -> None:
    """Key tiles that a padding bias or mask removes (the online kernel skips them once it has
    proved they weigh exactly 0) give the reference's result, NaN and inf in them included."""
    q, k, v = inputs(2, 4, 2, 40, 200, 16)
    bias = np.zeros((2, 1, 1, 200), np.float32)
    bias[0, ..., 120:] = fill  # item 0 padded at the end, item 1 at the start
    bias[1, ..., :130] = fill
    mask = bias == 0
    for block in (16, 20, 64):
        check(q, k, v, bias, softmax=mode, block_size=block)
        check(q, k, v, None, mask, softmax=mode, block_size=block, mask_fill=fill)
        check(q, k, v, bias, mask, softmax=mode, block_size=block, mask_fill=-np.inf, masked_rows="zero")
        check(q, k, v, bias[..., :1, :], softmax=mode, block_size=block, is_causal=1, mask_fill=fill)
    rows = np.zeros((2, 1, 40, 200), np.float32) + bias
    rows[0, 0, 7] = fill  # a query row that sees no key keeps a uniform (or NaN) softmax
    check(q, k, v, rows, softmax=mode, block_size=16)
    for tensor, value in ((v, np.inf), (v, np.nan), (k, np.nan), (k, np.inf)):
        poisoned = tensor.copy()
        poisoned[0, 1, 190, 3] = value  # in a padded tile: must still reach the output as in the reference
        args = (q, poisoned, v) if tensor is k else (q, k, poisoned)
        check(*args, bias, softmax=mode, block_size=16)


@pytest.mark.parametrize("mode", MODES)
def test_padded_tail_is_exactly_the_shorter_sequence(isa: str, mode: str) -> None:
    """A padded tail of whole key tiles weighs exactly nothing: the output is bit-identical."""
    q, k, v = inputs(1, 4, 2, 50, 200, 32)
    bias = np.zeros((1, 1, 1, 200), np.float32)
    bias[..., 64:] = LOWEST
    padded = cpu.flash_attention(q, k, v, bias, softmax=mode, block_size=32)
    short = cpu.flash_attention(q, k[:, :, :64], v[:, :, :64], softmax=mode, block_size=32)
    np.testing.assert_array_equal(padded, short)


@pytest.mark.parametrize("fill", [-np.inf, -1e4, LOWEST])
@pytest.mark.parametrize("kept", [75, 96, 171])
def test_padded_tail_inside_an_online_tile(isa: str, fill: float, kept: int) -> None:
    """The online tile that holds the last kept key sets its padded tail aside group by group
    (ONLINE_GROUP_KEYS keys; csrc/flash/online.hpp) and processes its head: the reference's
    result, bit-identical to the shorter sequence, with NaN and inf in the tail still reaching
    the output (a group that holds them is not set aside)."""
    q, k, v = inputs(2, 4, 2, 70, 256, 32)
    bias = np.zeros((2, 1, 1, 256), np.float32)
    bias[0, ..., kept:] = fill
    bias[1, ..., : 256 - kept] = fill  # padded at the start: tail groups of the first tile
    mask = bias == 0
    for block in (64, 128, 256):
        check(q, k, v, bias, softmax="online", block_size=block)
        check(q, k, v, None, mask, softmax="online", block_size=block, mask_fill=fill)
        check(q, k, v, bias[..., :1, :], softmax="online", block_size=block, is_causal=1, mask_fill=fill)
        if fill == LOWEST:
            padded = cpu.flash_attention(q[:1], k[:1], v[:1], bias[:1], softmax="online", block_size=block)
            short = cpu.flash_attention(q[:1], k[:1, :, :kept], v[:1, :, :kept], softmax="online", block_size=block)
            np.testing.assert_array_equal(padded, short)
    for tensor, value in ((v, np.inf), (v, np.nan), (k, np.nan), (k, np.inf)):
        poisoned = tensor.copy()
        poisoned[0, 1, 250, 3] = value  # in the padded tail's last group
        args = (q, poisoned, v) if tensor is k else (q, k, poisoned)
        check(*args, bias, softmax="online", block_size=128)


@pytest.mark.parametrize("mode", MODES)
def test_threads_give_identical_results(isa: str, mode: str) -> None:
    q, k, v = inputs(2, 4, 2, 130, 200, 64)
    mask = np.random.default_rng(4).random((2, 1, 1, 200)) > 0.2
    one = cpu.flash_attention(q, k, v, None, mask, softmax=mode, threads=1)
    two = cpu.flash_attention(q, k, v, None, mask, softmax=mode, threads=2)
    np.testing.assert_array_equal(one, two)


@pytest.mark.parametrize("block", [1, 16, 64, 1000])
def test_online_block_sizes(isa: str, block: int) -> None:
    q, k, v = inputs(1, 2, 2, 65, 300, 64)
    check(q, k, v, softmax="online", block_size=block)


def test_policy_and_auto_mode(isa: str) -> None:
    from ortflash.op.policy import SoftmaxPolicy

    q, k, v = inputs(1, 2, 2, 10, 40, 16)
    for policy in (SoftmaxPolicy("online", 16), SoftmaxPolicy("auto", 16, 32), SoftmaxPolicy("auto", 8, 64)):
        got = cpu.flash_attention(q, k, v, policy=policy)
        np.testing.assert_allclose(got, reference.flash_attention(q, k, v, policy=policy), atol=2e-6)


def test_layouts_and_dtypes(isa: str) -> None:
    q, k, v = inputs(1, 4, 2, 40, 50, 32)
    strided = np.swapaxes(np.swapaxes(q, 1, 2).copy(), 1, 2)  # non-contiguous Q
    check(strided, k, v, softmax="online")
    got = check(q.astype(np.float64), k, v, softmax="naive")  # computed in float32, returned as float64
    assert got.dtype == np.float64
    check(q.astype(np.float16), k, v.astype(np.float16), softmax="online")
    check(q, k, v, np.zeros(50, np.float64), np.ones(50, np.int8), softmax="naive")


def test_dispatch_follows_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ISAS:
        monkeypatch.setenv(cpu.ISA_ENV, name)
        assert cpu.isa() == name and cpu.selection().module.ISA == name and cpu.available()
    monkeypatch.delenv(cpu.ISA_ENV, raising=False)
    if ISAS:
        assert cpu.isa() == ISAS[0]  # the best this CPU runs
    unrunnable = [name for name in cpu.ISA_REQUIREMENTS if name not in ISAS]
    for name in unrunnable:
        monkeypatch.setenv(cpu.ISA_ENV, name)
        with pytest.warns(RuntimeWarning, match=name):
            cpu._select.cache_clear()
            assert cpu.isa() == (ISAS[0] if ISAS else "reference")


def test_missing_build_falls_back_to_reference_with_one_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cpu.ISA_ENV, "notbuilt")
    cpu._select.cache_clear()
    q, k, v = inputs(1, 2, 1, 5, 6, 8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = cpu.flash_attention(q, k, v, softmax="online", block_size=2)
        second = cpu.flash_attention(q, k, v, softmax="naive")
    assert len([w for w in caught if issubclass(w.category, RuntimeWarning)]) == 1
    assert "notbuilt" in str(caught[0].message) and "numpy reference" in str(caught[0].message)
    assert not cpu.available() and cpu.isa() == "reference"
    np.testing.assert_array_equal(first, reference.flash_attention(q, k, v, softmax="online", block_size=2))
    np.testing.assert_array_equal(second, reference.flash_attention(q, k, v, softmax="naive"))


def decode_cases(
    b: int, hq: int, sq: int, sk: int, seed: int
) -> list[tuple[np.ndarray | None, np.ndarray | None, dict]]:
    """(bias, mask, attributes) covering every feature of the kernel, for a few query rows."""
    rng = np.random.default_rng(seed)
    keep = rng.random((b, 1, 1, sk)) > 0.3
    keep[..., -1] = True
    row_bias = rng.standard_normal((b, hq, sq, sk)).astype(np.float32)
    padded = np.zeros((b, 1, 1, sk), np.float32)
    padded[0, ..., sk // 2 + 1 :] = LOWEST  # item 0 padded at the end: its tail weighs exactly 0
    blind = rng.random((b, hq, sq, sk)) > 0.4
    blind[0, 1, 0] = False  # one query row sees no key
    strided_mask = np.ones((b, 1, sq, 2 * sk), bool)[..., ::2]
    strided_mask[..., : sk // 3] = False
    cases: list[tuple[np.ndarray | None, np.ndarray | None, dict]] = [
        (None, None, {}),
        (row_bias[:1, :1, :1], None, {}),  # [1, 1, 1, Sk] broadcast
        (row_bias.astype(np.float16), None, {}),
        (np.asfortranarray(row_bias), None, {"softcap": 2.0, "scale": 3.0}),
        (padded, None, {}),
        (None, keep, {"mask_fill": -1e4}),
        (None, strided_mask, {"mask_fill": LOWEST}),
        (row_bias, keep, {"bias_after_mask": 1, "is_causal": 1}),
        (row_bias[:, :1], keep, {"bias_after_mask": 1, "mask_fill": -1e4}),
    ]
    for rows in ("nan", "zero"):
        cases.append((None, blind, {"masked_rows": rows}))
        cases.append((row_bias, blind, {"masked_rows": rows, "mask_fill": LOWEST, "softcap": 1.5}))
    for causal in (1, 2):
        for fill in (-np.inf, -1e4, LOWEST):
            cases.append((None, None, {"is_causal": causal, "mask_fill": fill}))
            cases.append((row_bias, keep, {"is_causal": causal, "mask_fill": fill, "masked_rows": "zero"}))
    return cases


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("sq", [1, 2, 3])
@pytest.mark.parametrize("sk", [1, 2, 9, 64, 257, 3000])
def test_decode_rows_read_the_cache_in_place(isa: str, mode: str, sq: int, sk: int) -> None:
    """A few query rows per kv head (a decode step: the kernel then reads K and V where they lie,
    all query heads of a kv head in one pass) against the float64 truth, with every feature."""
    b, hq, hkv, d, dv = 2, 8, 2, 20, 12  # D and Dv not whole vectors: the tails and the staged V
    q, k, v = inputs(b, hq, hkv, sq, sk, d, dv, seed=sk)
    for bias, mask, attrs in decode_cases(b, hq, sq, sk, seed=sq):
        for block in (16, 1000):
            check(q, k, v, bias, mask, softmax=mode, block_size=block, **{"scale": d**-0.5, **attrs})
    q16, k16, v16 = (t.astype(np.float16) for t in (q, k, v))
    check(q16, k16, v16, softmax=mode, block_size=16, scale=d**-0.5)
    check(q16, k16, v16, None, np.ones((1, 1, 1, sk), bool), softmax=mode, is_causal=2)
    qw, kw, vw = inputs(1, 8, 2, sq, sk, 64, 64, seed=1)  # D, Dv whole vectors: V read in place
    check(qw, kw, vw, softmax=mode, block_size=64, scale=0.125)
    one = cpu.flash_attention(qw, kw, vw, softmax=mode, threads=1)
    np.testing.assert_array_equal(one, cpu.flash_attention(qw, kw, vw, softmax=mode, threads=2))
