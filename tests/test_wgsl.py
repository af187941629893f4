"""The WGSL kernels (naive.wgsl, flash.wgsl) against the numpy reference.

Runs on whatever adapter wgpu finds: a GPU, or Mesa's software Vulkan driver
(lavapipe, Debian package mesa-vulkan-drivers) as in CI. The tests skip only
when wgpu finds no adapter at all. Sizes are small (lavapipe on two cores) but
cover the edges: lengths that are not multiples of the tile (1, 63, 65, 300),
several head dims, Dv != D, grouped KV heads, broadcast bias and masks, fully
masked rows, causal masks and float16.
"""

from __future__ import annotations

import numpy as np
import pytest

from ortflash.kernels import reference
from ortflash.kernels.wgpu import kernel as wk
from ortflash.op.policy import SoftmaxPolicy

pytestmark = pytest.mark.skipif(not wk.available(), reason=wk.unavailable_reason() or "no wgpu adapter")

KERNELS = ("naive", "online")
F32_ATOL = 1e-4  # unit-normal inputs: the kernels land near 1e-6


@pytest.fixture(scope="module")
def runner():
    return wk.runner()


def make(rng, b, hq, hkv, sq, sk, d, dv=None, dtype=np.float32):
    dv = dv or d
    q = rng.standard_normal((b, hq, sq, d)).astype(dtype)
    k = rng.standard_normal((b, hkv, sk, d)).astype(dtype)
    v = rng.standard_normal((b, hkv, sk, dv)).astype(dtype)
    return q, k, v


def check(got, want, atol=F32_ATOL, rtol=0.0):
    """Same shape and dtype, NaN exactly where the reference has NaN, close elsewhere."""
    assert got.shape == want.shape and got.dtype == want.dtype
    nan_got, nan_want = np.isnan(got), np.isnan(want)
    assert np.array_equal(nan_got, nan_want), f"NaN at {np.argwhere(nan_got != nan_want)[:5]}"
    g = got[~nan_want].astype(np.float64)
    w = want[~nan_want].astype(np.float64)
    if g.size:
        err = np.abs(g - w) - rtol * np.abs(w)
        assert err.max() <= atol, f"max error {np.abs(g - w).max():.3g} > {atol} (+{rtol} rel)"


def run_both(q, k, v, bias=None, mask=None, kernel="online", atol=F32_ATOL, rtol=0.0, **attrs):
    attrs.setdefault("scale", q.shape[-1] ** -0.5)
    want = reference.flash_attention(q, k, v, bias, mask, **attrs)
    got = wk.flash_attention(q, k, v, bias, mask, policy=SoftmaxPolicy(kernel), **attrs)
    check(got, want, atol, rtol)
    return got, want


# --------------------------------------------------------------------------- shapes


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize(
    "sq,sk",
    [(1, 1), (1, 300), (63, 63), (64, 64), (65, 65), (256, 256), (300, 300), (63, 300), (300, 65), (65, 1)],
)
def test_sequence_lengths(kernel, sq, sk):
    rng = np.random.default_rng(sq * 1000 + sk)
    run_both(*make(rng, 1, 2, 2, sq, sk, 64), kernel=kernel)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("d", [32, 64, 80, 128, 256])
def test_head_dims(kernel, d):
    rng = np.random.default_rng(d)
    run_both(*make(rng, 1, 2, 2, 65, 70, d), kernel=kernel)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("d,dv", [(64, 32), (32, 128), (80, 48), (128, 64), (36, 20)])
def test_value_dim_differs(kernel, d, dv):
    rng = np.random.default_rng(d * 7 + dv)
    got, _ = run_both(*make(rng, 2, 2, 2, 33, 67, d, dv), kernel=kernel)
    assert got.shape == (2, 2, 33, dv)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("hkv", [2, 1])
def test_grouped_kv_heads(kernel, hkv):
    rng = np.random.default_rng(hkv)
    q, k, v = make(rng, 2, 4, hkv, 40, 90, 64)
    bias = rng.standard_normal((2, 4, 40, 90)).astype(np.float32)
    run_both(q, k, v, bias, kernel=kernel)
    run_both(q, k, v, kernel=kernel, is_causal=1)


# --------------------------------------------------------------------------- bias and mask


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("shape", ["B11S", "BHSS", "1HSS", "SS", "S"])
def test_bias_broadcast(kernel, shape):
    b, h, sq, sk = 2, 2, 37, 75
    dims = {"B11S": (b, 1, 1, sk), "BHSS": (b, h, sq, sk), "1HSS": (1, h, sq, sk), "SS": (sq, sk), "S": (sk,)}[shape]
    rng = np.random.default_rng(len(shape))
    q, k, v = make(rng, b, h, h, sq, sk, 64)
    bias = (2 * rng.standard_normal(dims)).astype(np.float32)
    run_both(q, k, v, bias, kernel=kernel)


@pytest.mark.parametrize("kernel", KERNELS)
def test_padding_bias_with_inf(kernel):
    """A -inf padding bias: fully padded batch rows give NaN, like the reference."""
    rng = np.random.default_rng(5)
    q, k, v = make(rng, 2, 2, 2, 20, 70, 32)
    bias = np.zeros((2, 1, 1, 70), np.float32)
    bias[0, ..., 50:] = -np.inf
    bias[1] = -np.inf  # every key of batch 1 padded
    got, _ = run_both(q, k, v, bias, kernel=kernel)
    assert np.isnan(got[1]).all() and not np.isnan(got[0]).any()


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("masked_rows", ["nan", "zero"])
@pytest.mark.parametrize("shape", ["BHSS", "11SS", "B11S"])
def test_bool_mask_fully_masked_rows(kernel, masked_rows, shape):
    b, h, sq, sk = 2, 2, 45, 130
    dims = {"BHSS": (b, h, sq, sk), "11SS": (1, 1, sq, sk), "B11S": (b, 1, 1, sk)}[shape]
    rng = np.random.default_rng(11)
    q, k, v = make(rng, b, h, h, sq, sk, 64)
    mask = rng.random(dims) > 0.4
    if shape == "B11S":
        mask[1] = False  # batch 1: every row fully masked
    else:
        mask[..., [0, 17, 44], :] = False  # rows 0, 17, 44 fully masked
    got, want = run_both(q, k, v, mask=mask, kernel=kernel, masked_rows=masked_rows)
    empty = got[1] if shape == "B11S" else got[:, :, [0, 17, 44]]
    if masked_rows == "nan":
        assert np.isnan(empty).all()
    else:
        assert (empty == 0).all() and not np.isnan(got).any()


@pytest.mark.parametrize("kernel", KERNELS)
def test_mask_with_finite_fill_and_bias(kernel):
    """mask_fill finite: a fully masked row is a uniform average, not NaN."""
    rng = np.random.default_rng(12)
    q, k, v = make(rng, 1, 2, 2, 30, 100, 64)
    mask = rng.random((1, 2, 30, 100)) > 0.5
    mask[..., 3, :] = False
    bias = rng.standard_normal((1, 1, 30, 100)).astype(np.float32)
    got, _ = run_both(q, k, v, bias, mask, kernel=kernel, mask_fill=-1e4)
    assert not np.isnan(got).any()


@pytest.mark.parametrize("kernel", KERNELS)
def test_float32_lowest_fill_and_bias_stay_finite(kernel):
    """Exported models mask with float32's lowest, finite: a row that sees only such scores is
    the uniform average of V (the reference's softmax of equal scores), never NaN. Regression:
    flash.wgsl once carried scores times log2(e), which turns lowest into -inf."""
    lowest = float(np.finfo(np.float32).min)
    rng = np.random.default_rng(13)
    b, h, sq, sk = 2, 2, 150, 150  # several key tiles; rows not a multiple of a row block
    q, k, v = make(rng, b, h, h, sq, sk, 32)
    keep = np.ones((b, 1, 1, sk), bool)
    keep[0, ..., :5] = False  # batch 0 left-padded: with causal, rows 0-4 see no key
    keep[1, ..., 140:] = False  # batch 1 right-padded
    uniform = v.astype(np.float64).mean(axis=2)  # [B, H, Dv]

    got, _ = run_both(q, k, v, mask=keep, kernel=kernel, is_causal=1, mask_fill=lowest)
    assert not np.isnan(got).any()
    np.testing.assert_allclose(got[0, :, :5], np.repeat(uniform[0, :, None], 5, axis=1), atol=F32_ATOL)

    padding_bias = np.where(keep, 0.0, lowest).astype(np.float32)
    padding_bias[1] = lowest  # every key of batch 1 biased away: every row uniform
    got, _ = run_both(q[:, :, :21], k, v, padding_bias, kernel=kernel)
    assert not np.isnan(got).any()
    np.testing.assert_allclose(got[1], np.repeat(uniform[1, :, None], 21, axis=1), atol=F32_ATOL)


# --------------------------------------------------------------------------- causal, softcap


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("sq,sk", [(100, 100), (256, 256), (37, 150), (150, 37), (1, 65), (65, 300)])
def test_causal(kernel, sq, sk):
    rng = np.random.default_rng(sq + sk)
    run_both(*make(rng, 1, 2, 2, sq, sk, 64), kernel=kernel, is_causal=1)


@pytest.mark.parametrize("kernel", KERNELS)
def test_causal_with_finite_fill_and_mask(kernel):
    """No tile skipping when masked keys still weigh something (finite mask_fill)."""
    rng = np.random.default_rng(21)
    q, k, v = make(rng, 1, 2, 2, 70, 140, 64)
    mask = rng.random((1, 1, 70, 140)) > 0.2
    run_both(q, k, v, mask=mask, kernel=kernel, is_causal=1, mask_fill=-2.0)


@pytest.mark.parametrize("kernel", KERNELS)
def test_softcap(kernel):
    rng = np.random.default_rng(31)
    q, k, v = make(rng, 1, 2, 2, 50, 130, 64)
    run_both(3 * q, k, v, kernel=kernel, softcap=5.0, scale=0.5)  # scores far past the cap
    bias = rng.standard_normal((1, 2, 50, 130)).astype(np.float32)
    run_both(q, k, v, bias, kernel=kernel, softcap=1.5, is_causal=1)


# --------------------------------------------------------------------------- is_causal=2, bias_after_mask


def attention_f64(q, k, v, bias=None, mask=None, *, scale, is_causal=0, bias_after_mask=0, mask_fill=-np.inf):
    """The op's formula in float64, written out here (not reference.py): the bias before the mask
    (or after the mask and the causal fill), causal top-left (1) or bottom-right (2)."""
    group = q.shape[1] // k.shape[1]
    k64, v64 = (np.repeat(t.astype(np.float64), group, axis=1) for t in (k, v))
    s = scale * (q.astype(np.float64) @ np.swapaxes(k64, -1, -2))
    sq, sk = s.shape[-2:]
    with np.errstate(invalid="ignore", over="ignore"):
        if bias is not None and not bias_after_mask:
            s = s + bias
        if mask is not None:
            s = np.where(mask, s, mask_fill)
        if is_causal:
            offset = sk - sq if is_causal == 2 else 0
            visible = np.arange(sk)[None, :] <= np.arange(sq)[:, None] + offset
            s = np.where(visible, s, mask_fill)
        if bias is not None and bias_after_mask:
            s = s + bias
        s = s - s.max(axis=-1, keepdims=True)
        p = np.exp(s)
        p = p / p.sum(axis=-1, keepdims=True)
    return p @ v64


def run_contract(runner_, q, k, v, bias=None, mask=None, *, kernel, tile=None, atol=F32_ATOL, **attrs):
    """The WGSL kernel (through the runner: spec.validate may not know is_causal=2 yet) against
    attention_f64; the kernel's output is returned."""
    from ortflash.op import spec

    extra = {name: attrs.pop(name) for name in ("is_causal", "bias_after_mask") if name in attrs}
    validated = {**spec.validate({"scale": q.shape[-1] ** -0.5, **attrs}), "bias_after_mask": 0, **extra}
    got = runner_.attention(q, k, v, bias=bias, mask=mask, attrs=validated, kernel=kernel, tile=tile)
    want = attention_f64(
        q,
        k,
        v,
        bias,
        mask,
        scale=validated["scale"],
        is_causal=validated["is_causal"],
        bias_after_mask=validated["bias_after_mask"],
        mask_fill=validated["mask_fill"],
    ).astype(q.dtype)
    check(got, want, atol)
    return got


@pytest.mark.parametrize("kernel", ("flash", "naive"))
@pytest.mark.parametrize("sq,sk", [(37, 150), (150, 37), (1, 65), (65, 300), (300, 65)])
def test_causal_bottom_right(runner, kernel, sq, sk):
    """is_causal=2: query i sees keys j <= i + Sk - Sq; with Sq > Sk the first Sq - Sk rows see no
    key and come out NaN (masked_rows=nan), like any fully masked row."""
    rng = np.random.default_rng(sq * 3 + sk)
    got = run_contract(runner, *make(rng, 1, 2, 1, sq, sk, 64), kernel=kernel, is_causal=2)
    empty_rows = max(0, sq - sk)
    assert np.isnan(got[:, :, :empty_rows]).all() and not np.isnan(got[:, :, empty_rows:]).any()


@pytest.mark.parametrize("sq,sk", [(37, 150), (150, 37), (64, 64), (65, 300)])
def test_causal_bottom_right_small_tiles(runner, sq, sk):
    """Many key tiles per row tile: the skipped tiles, the plain tiles left of the diagonal and
    the ones across it, for both diagonals, with a mask and masked_rows=zero."""
    from ortflash.kernels.wgpu.tiles import FlashTile
    from ortflash.op import spec

    rng = np.random.default_rng(sq + 7 * sk)
    q, k, v = make(rng, 1, 2, 2, sq, sk, 64)
    mask = rng.random((1, 1, sq, sk)) > 0.1
    zero_rows = spec.validate({"scale": 0.125, "masked_rows": "zero"})
    for is_causal in (1, 2):
        for tile in (FlashTile(16, 16, 4, 1, 4), FlashTile(32, 32, 8, 2, 2)):
            run_contract(runner, q, k, v, kernel="flash", tile=tile, is_causal=is_causal)
            attrs = {**zero_rows, "is_causal": is_causal}
            got = runner.attention(q, k, v, mask=mask, attrs=attrs, kernel="flash", tile=tile)
            want = attention_f64(q, k, v, mask=mask, scale=0.125, is_causal=is_causal)
            check(got, np.nan_to_num(want, nan=0.0).astype(np.float32))


@pytest.mark.parametrize("kernel", ("flash", "naive"))
@pytest.mark.parametrize("is_causal", [0, 1, 2])
def test_bias_after_mask(runner, kernel, is_causal):
    """bias_after_mask=1 (GPT-Neo's eager order): masked scores are mask_fill + bias, so with a
    finite fill the result differs from the default order, and each order matches its formula."""
    rng = np.random.default_rng(11 + is_causal)
    q, k, v = make(rng, 2, 2, 2, 45, 90, 32)
    bias = (3 * rng.standard_normal((2, 1, 45, 90))).astype(np.float32)
    mask = rng.random((2, 1, 1, 90)) > 0.3
    after = run_contract(
        runner, q, k, v, bias, mask, kernel=kernel, is_causal=is_causal, bias_after_mask=1, mask_fill=-2.0
    )
    before = run_contract(runner, q, k, v, bias, mask, kernel=kernel, is_causal=is_causal, mask_fill=-2.0)
    assert np.abs(after - before).max() > 1e-2  # the order matters here: the test tells them apart
    run_contract(runner, q, k, v, bias, mask, kernel=kernel, is_causal=is_causal, bias_after_mask=1)


@pytest.mark.parametrize("kernel", ("flash", "naive"))
def test_bias_after_mask_inf_bias_on_causal_keys(runner, kernel):
    """With bias_after_mask=1 a +inf bias on a key hidden by the causal fill gives -inf + inf =
    NaN, which the formula propagates: the flash kernel must not skip that tile."""
    from ortflash.kernels.wgpu.params import FLAG_SKIP_CAUSAL_TILES, Problem, prepare
    from ortflash.op import spec

    rng = np.random.default_rng(17)
    q, k, v = make(rng, 1, 1, 1, 40, 200, 32)
    bias = np.zeros((1, 1, 40, 200), np.float32)
    bias[0, 0, 3, 150] = np.inf  # right of row 3's diagonal (both alignments)
    got = run_contract(runner, q, k, v, bias, kernel=kernel, is_causal=1, bias_after_mask=1)
    assert np.isnan(got[0, 0, 3]).all() and not np.isnan(np.delete(got[0, 0], 3, axis=0)).any()

    attrs = {**spec.validate({"scale": 0.5}), "is_causal": 2}
    flags = [
        int(
            prepare(
                Problem.of(q, k, v), q, k, v, b, None, {**attrs, "bias_after_mask": after}, f16_on_device=False
            ).params["flags"][0]
        )
        for b, after in ((bias, 1), (bias, 0), (np.zeros_like(bias), 1), (None, 1))
    ]
    assert [bool(f & FLAG_SKIP_CAUSAL_TILES) for f in flags] == [False, True, True, True]


def test_contract_keywords_through_the_kernel():
    """flash_attention takes bias_after_mask as a keyword (how the bridge passes it) and is_causal=2
    once spec.validate accepts it; a bad bias_after_mask is a SpecError."""
    from ortflash.op import spec

    rng = np.random.default_rng(23)
    q, k, v = make(rng, 1, 2, 2, 30, 50, 32)
    bias = rng.standard_normal((1, 2, 30, 50)).astype(np.float32)
    mask = rng.random((1, 1, 30, 50)) > 0.3
    got = wk.flash_attention(q, k, v, bias, mask, scale=0.2, mask_fill=-1.0, bias_after_mask=1)
    check(got, attention_f64(q, k, v, bias, mask, scale=0.2, mask_fill=-1.0, bias_after_mask=1).astype(np.float32))
    with pytest.raises(spec.SpecError):
        wk.flash_attention(q, k, v, scale=0.2, bias_after_mask=2)
    try:
        spec.validate({"is_causal": 2})
    except spec.SpecError:
        return  # the contract's is_causal=2 is not in spec.py yet; the runner tests above cover it
    got = wk.flash_attention(q, k, v, scale=0.2, is_causal=2)
    check(got, attention_f64(q, k, v, scale=0.2, is_causal=2).astype(np.float32))


def test_contract_features_through_an_ortflash_session():
    """End to end: a FlashAttention node with is_causal=2 and bias_after_mask=1 (the latter only in
    the side channel, as the emitter writes it) run by InferenceSession(backend="wgpu") agrees with
    the numpy reference, Sq > Sk (the first Sq - Sk rows see no key: mask_fill + bias there)."""
    import onnx
    from onnx import TensorProto, helper

    import ortflash
    from ortflash.op import side_channel, spec

    attrs = spec.validate({"scale": 0.5, "is_causal": 2, "mask_fill": -100.0, "bias_after_mask": 1})
    declared = {name: attrs[name] for name in spec.DECLARED}
    declared["exact_floats"] = side_channel.SideChannel.of_attributes(attrs).encode()
    node = helper.make_node(spec.OP_TYPE, ["q", "k", "v", "bias", "mask"], ["o"], domain=spec.DOMAIN, **declared)
    node.attribute.append(helper.make_attribute("bias_after_mask", 1))
    io = [helper.make_tensor_value_info(x, TensorProto.FLOAT, None) for x in ("q", "k", "v", "bias")]
    io.append(helper.make_tensor_value_info("mask", TensorProto.BOOL, None))
    graph = helper.make_graph([node], "g", io, [helper.make_tensor_value_info("o", TensorProto.FLOAT, None)])
    model: onnx.ModelProto = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(spec.DOMAIN, 1)], ir_version=8
    )
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 2, 40, 16)).astype(np.float32)
    k, v = (rng.standard_normal((1, 2, 30, 16)).astype(np.float32) for _ in range(2))
    bias = rng.standard_normal((1, 1, 40, 30)).astype(np.float32)
    mask = rng.random((1, 1, 40, 30)) > 0.3
    feeds = {"q": q, "k": k, "v": v, "bias": bias, "mask": mask}
    want = reference.flash_attention(q, k, v, bias, mask, **attrs)
    for softmax in ("naive", "online"):
        sess = ortflash.InferenceSession(model, backend="wgpu", softmax=softmax)
        got = sess.run(None, feeds)[0]
        check(got, want)
    other = reference.flash_attention(q, k, v, bias, mask, **{**attrs, "bias_after_mask": 0})
    assert np.abs(other - want).max() > 0.1  # the order is what the session got right


# --------------------------------------------------------------------------- float16


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("d,sq,sk", [(64, 65, 300), (128, 64, 64), (80, 1, 63)])
def test_float16(kernel, d, sq, sk):
    rng = np.random.default_rng(d + sq)
    q, k, v = make(rng, 1, 4, 2, sq, sk, d, dtype=np.float16)
    mask = rng.random((1, 1, sq, sk)) > 0.3
    got, _ = run_both(q, k, v, mask=mask, kernel=kernel, atol=2e-3, rtol=2e-3)
    assert got.dtype == np.float16


def test_float16_converted_on_host():
    """An adapter without shader-f16: float16 travels as float32, O comes back float16."""
    from ortflash.kernels.wgpu.device import Runner
    from ortflash.op import spec

    host = Runner(use_f16=False, use_timestamps=False)
    assert not host.has_f16
    rng = np.random.default_rng(41)
    q, k, v = make(rng, 1, 2, 2, 65, 130, 64, dtype=np.float16)
    attrs = spec.validate({"scale": 0.125, "is_causal": 1})
    want = reference.flash_attention(q, k, v, scale=0.125, is_causal=1)
    for kernel in ("flash", "naive"):
        got = host.attention(q, k, v, attrs=attrs, kernel=kernel)
        assert host.last_plan["io"] == "f32"
        check(got, want, 2e-3, 2e-3)


# --------------------------------------------------------------------------- tiles and chunks


# All fit lavapipe's 32 KiB of workgroup storage at D=64.
TILES = [
    dict(br=32, bc=32, c=8, rv=2, vpt=2),
    dict(br=64, bc=16, c=4, rv=2, vpt=4),
    dict(br=16, bc=64, c=8, rv=1, vpt=2),
    dict(br=16, bc=16, c=4, rv=1, vpt=4),
    dict(br=32, bc=32, c=16, rv=2, vpt=1),
    dict(br=32, bc=16, c=4, rv=1, vpt=4, kv_split=1),
    dict(br=48, bc=16, c=8, rv=1, vpt=2),
    dict(br=16, bc=32, c=8, rv=2, vpt=2, kv_split=1),
]


@pytest.mark.parametrize(
    "tile",
    TILES,
    ids=lambda t: "br{br}-bc{bc}-c{c}-rv{rv}-vpt{vpt}".format(**t) + ("-kvs" if t.get("kv_split") else ""),
)
@pytest.mark.parametrize("sq,sk", [(64, 64), (256, 256), (300, 301)])
def test_flash_tiles(runner, tile, sq, sk):
    """Register-tiling variants (private arrays indexed in unrolled loops), at and past the tile edges."""
    from ortflash.kernels.wgpu.tiles import FlashTile
    from ortflash.op import spec

    t = FlashTile(**tile)
    if t.smem_bytes(16) > runner.limits["max-compute-workgroup-storage-size"]:
        pytest.skip(f"{t} needs more workgroup storage than this adapter has")
    rng = np.random.default_rng(sq + t.br + t.bc)
    q, k, v = make(rng, 1, 2, 1, sq, sk, 64)
    mask = rng.random((1, 2, sq, sk)) > 0.2
    attrs = spec.validate({"scale": 0.125, "is_causal": 1})
    got = runner.attention(q, k, v, mask=mask, attrs=attrs, kernel="flash", tile=t)
    assert runner.last_plan["tile"] == t
    check(got, reference.flash_attention(q, k, v, mask=mask, scale=0.125, is_causal=1))


@pytest.mark.parametrize("subgroups", [True, False], ids=["subgroups", "shared-memory"])
def test_row_reductions_with_and_without_subgroups(subgroups):
    """Both reductions of flash.wgsl: subgroup shuffles where the device has them (lavapipe does,
    8 lanes), and the workgroup-memory fallback (a device made without the feature, checked
    shaders) that adapters without subgroups run."""
    from ortflash.kernels.wgpu.device import Runner
    from ortflash.kernels.wgpu.tiles import FlashTile
    from ortflash.op import spec

    dev = Runner(use_subgroups=subgroups, trusted_shaders=subgroups)
    if subgroups and not dev.subgroup_size:
        pytest.skip("this adapter offers no usable subgroups")
    rng = np.random.default_rng(42)
    q, k, v = make(rng, 1, 2, 1, 150, 170, 64)
    mask = rng.random((1, 2, 150, 170)) > 0.3
    mask[..., 7, :] = False
    attrs = spec.validate({"scale": 0.125, "is_causal": 1, "masked_rows": "zero"})
    want = reference.flash_attention(q, k, v, mask=mask, **attrs)
    for tile in (FlashTile(32, 16, 4, 1, 4), FlashTile(32, 32, 8, 2, 2, kv_split=1)):
        got = dev.attention(q, k, v, mask=mask, attrs=attrs, kernel="flash", tile=tile)
        assert dev.last_plan["subgroups"] == int(subgroups and tile.c <= dev.subgroup_size)
        check(got, want)
    unmasked = dev.attention(q, k, v, attrs=spec.validate({"scale": 0.125}), kernel="flash")
    check(unmasked, reference.flash_attention(q, k, v, scale=0.125))


def test_buffers_reused_across_calls(runner):
    """Calls of the same sizes reuse every device and staging buffer (no allocation per call)."""
    from ortflash.op import spec

    rng = np.random.default_rng(43)
    q, k, v = make(rng, 1, 2, 2, 96, 96, 64)
    attrs = spec.validate({"scale": 0.125})
    runner.attention(q, k, v, attrs=attrs, kernel="flash")
    before = dict(runner._buffers)
    for _ in range(2):
        got = runner.attention(*make(rng, 1, 2, 2, 96, 96, 64), attrs=attrs, kernel="flash")
    assert runner._buffers == before and all(runner._buffers[r] is b for r, b in before.items())
    assert {"q", "k", "v", "o", "q_upload", "staging"} <= set(before)
    assert got.shape == (1, 2, 96, 64)
    assert set(runner.last_timing) == {"prepare_ms", "stage_ms", "submit_ms", "wait_ms", "read_ms"}


def test_naive_score_chunks(runner):
    """The naive kernel splits heads and rows when the score buffer would exceed its cap."""
    from ortflash.op import spec

    rng = np.random.default_rng(51)
    q, k, v = make(rng, 2, 2, 1, 70, 90, 32)
    bias = rng.standard_normal((2, 2, 70, 90)).astype(np.float32)
    attrs = spec.validate({"scale": 0.2, "is_causal": 1})
    want = reference.flash_attention(q, k, v, bias, **attrs)
    for cap, at_least in [(70 * 90 * 4 * 2, 2), (16 * 90 * 4, 8)]:  # two heads per chunk; 16 rows per chunk
        got = runner.attention(q, k, v, bias=bias, attrs=attrs, kernel="naive", score_chunk_bytes=cap)
        assert runner.last_plan["chunks"] >= at_least
        check(got, want)


# --------------------------------------------------------------------------- policy and runner


def test_policy_picks_the_shader(runner):
    rng = np.random.default_rng(61)
    q, k, v = make(rng, 1, 2, 2, 16, 100, 32)
    wk.flash_attention(q, k, v, softmax="auto", min_seq_len=64)
    assert runner.last_plan["kernel"] == "flash"
    wk.flash_attention(q, k, v, softmax="auto", min_seq_len=128)
    assert runner.last_plan["kernel"] == "naive"
    wk.flash_attention(q, k, v, policy=SoftmaxPolicy("online"), softmax="naive")
    assert runner.last_plan["kernel"] == "flash"
    # an override that sets only a size keeps the node's own mode (SoftmaxPolicy.for_node, as every
    # kernel reads it); the wgpu kernel's own rule took the override whole and raised in choose
    wk.flash_attention(q, k, v, policy=SoftmaxPolicy.from_options(block_size=32), softmax="online")
    assert runner.last_plan["kernel"] == "flash"


def test_naive_and_online_agree():
    rng = np.random.default_rng(71)
    q, k, v = make(rng, 1, 4, 2, 120, 200, 64)
    bias = rng.standard_normal((1, 4, 120, 200)).astype(np.float32)
    a = wk.flash_attention(q, k, v, bias, policy=SoftmaxPolicy("naive"), is_causal=1, scale=0.125)
    b = wk.flash_attention(q, k, v, bias, policy=SoftmaxPolicy("online"), is_causal=1, scale=0.125)
    check(a, b, 1e-5)


def test_runner_reports_and_caches(runner):
    info = wk.adapter_info()
    assert info["device"] and info["backend"]
    assert info["max_workgroup_storage"] >= 16384
    rng = np.random.default_rng(81)
    q, k, v = make(rng, 1, 2, 2, 48, 48, 64)
    wk.flash_attention(q, k, v, policy=SoftmaxPolicy("online"))
    compiled = len(runner._pipelines)
    wk.flash_attention(q, k, v, policy=SoftmaxPolicy("online"))
    assert len(runner._pipelines) == compiled  # same specialisation: no new pipeline
    assert runner.last_host_ms > 0
    if runner.has_timestamps:
        assert wk.last_device_ms() is not None and wk.last_device_ms() > 0


def test_tile_choice_respects_limits(runner):
    from ortflash.kernels.wgpu.tiles import flash_tiles

    for d in (32, 64, 80, 128, 256):
        for limit in (16384, 32768, 49152):
            tiles = flash_tiles(d // 4, d // 4, 4096, limit, 256)
            assert tiles, (d, limit)
            assert all(t.smem_bytes(d // 4) <= limit for t in tiles)


def test_rejects_bad_shapes():
    rng = np.random.default_rng(91)
    q, k, v = make(rng, 1, 3, 2, 8, 8, 32)
    with pytest.raises(ValueError):
        wk.flash_attention(q, k, v)
    q, k, v = make(rng, 1, 2, 2, 8, 8, 32)
    with pytest.raises(ValueError):
        wk.flash_attention(q, k, v, np.zeros((1, 2, 8, 5), np.float32))
    with pytest.raises(ValueError):
        wk.flash_attention(q[0], k, v)


# --------------------------------------------------------------------------- host-side seams (no device)


def test_available_does_not_cache_a_failure(monkeypatch):
    """A probe that fails is retried on the next call; a success is kept."""
    from ortflash.kernels.wgpu import adapter

    real = adapter.find_adapter
    wk._probe_adapter.cache_clear()
    monkeypatch.setattr(adapter, "find_adapter", lambda prefer=None: adapter.AdapterSearch(None, "driver busy"))
    assert not wk.available()
    assert "driver busy" in wk.unavailable_reason()
    monkeypatch.setattr(adapter, "find_adapter", real)
    assert wk.available() and wk.unavailable_reason() == ""


def test_binding_limit_is_a_named_memory_error():
    from ortflash.kernels.wgpu.limits import BindingTooLarge, DeviceLimits
    from ortflash.kernels.wgpu.params import Problem, prepare
    from ortflash.kernels.wgpu.plan import plan_naive
    from ortflash.op import spec

    q, k, v = make(np.random.default_rng(0), 1, 2, 2, 8, 300, 32)
    problem = Problem.of(q, k, v)
    operands = prepare(problem, q, k, v, None, None, spec.validate({}), f16_on_device=False)
    tiny = DeviceLimits(storage_binding_bytes=4 * 299)
    with pytest.raises(BindingTooLarge) as caught:
        plan_naive(problem, operands.io, operands.params, None, tiny)
    assert isinstance(caught.value, MemoryError)
    with pytest.raises(BindingTooLarge):
        tiny.check_binding("q", 4 * 300)


def test_naive_grid_and_shader_share_the_tile_edge():
    """The naive kernel's tile edge and softmax width are written once, in Python."""
    from ortflash.kernels.wgpu.assemble import NAIVE_SOFTMAX_WORKGROUP, NAIVE_TILE, assemble, naive_constants
    from ortflash.kernels.wgpu.limits import DeviceLimits
    from ortflash.kernels.wgpu.params import Problem, prepare
    from ortflash.kernels.wgpu.plan import plan_naive
    from ortflash.op import spec

    src = assemble("naive", "f32", naive_constants(16, 16))
    assert "${" not in src
    assert f"const T: u32 = {NAIVE_TILE}u;" in src and f"const SM: u32 = {NAIVE_SOFTMAX_WORKGROUP}u;" in src
    q, k, v = make(np.random.default_rng(1), 1, 3, 1, 40, 70, 64)
    problem = Problem.of(q, k, v)
    operands = prepare(problem, q, k, v, None, None, spec.validate({}), f16_on_device=False)
    planned = plan_naive(problem, operands.io, operands.params, None, DeviceLimits())
    scores, softmax, weighted_sum = planned.dispatches[:3]
    assert scores.grid == (-(-70 // NAIVE_TILE), -(-40 // NAIVE_TILE), 3)
    assert softmax.grid == (40, 1, 3)
    assert weighted_sum.grid == (1, -(-40 // NAIVE_TILE), 3)
    assert planned.score_bytes == 3 * 40 * 70 * 4


# --------------------------------------------------------------------------- workgroup storage with subgroups


def test_subgroup_reductions_free_their_workgroup_storage():
    """With subgroup reductions red_tile shrinks to one vec4: a D=128 tile of 64 query rows and 16
    lanes a row group then fits the H200's 48 KiB (it does not without subgroups)."""
    from ortflash.kernels.wgpu.tiles import FlashTile, flash_tiles

    wide = FlashTile(br=64, bc=16, c=16, rv=1, vpt=2)
    assert wide.smem_bytes(32, subgroup_size=32) == 45584 <= 49152 < wide.smem_bytes(32) == 49664
    assert wide.constants(32, 32, subgroup_size=32)["RED_SIZE"] == 1
    assert wide.constants(32, 32)["RED_SIZE"] == 16 * 64 // 4
    with_sg = flash_tiles(32, 32, 4096, 49152, 1024, subgroup_size=32)
    without = flash_tiles(32, 32, 4096, 49152, 1024)
    assert wide in with_sg and wide not in without
    assert all(t.smem_bytes(32, 32) <= 49152 for t in with_sg)


@pytest.mark.parametrize("is_causal", [0, 1, 2])
def test_tile_that_fits_only_with_subgroup_reductions(is_causal):
    """D=56 (14 vec4s), 64 rows x 32 keys, 8 lanes a row group: 33280 bytes of workgroup storage with
    the shared-memory reduction, 31248 with subgroup shuffles, so on lavapipe (32 KiB, subgroups of
    8) it runs only with subgroups; causal rows run heaviest row tiles first, bottom-right with
    Sq != Sk included."""
    from ortflash.kernels.wgpu.device import Runner
    from ortflash.kernels.wgpu.tiles import FlashTile

    tile = FlashTile(br=64, bc=32, c=8, rv=1, vpt=2)
    assert tile.smem_bytes(14, subgroup_size=8) == 31248 and tile.smem_bytes(14) == 33280
    dev = Runner()
    limit = dev.limits["max-compute-workgroup-storage-size"]
    if not (dev.subgroup_size >= 8 and tile.smem_bytes(14, dev.subgroup_size) <= limit):
        pytest.skip("needs subgroups of >= 8 lanes and 31248 bytes of workgroup storage")
    rng = np.random.default_rng(56 + is_causal)
    sq, sk = (200, 230) if is_causal == 2 else (200, 200)
    q, k, v = make(rng, 1, 3, 1, sq, sk, 56)
    got = run_contract(dev, q, k, v, kernel="flash", tile=tile, is_causal=is_causal)
    assert dev.last_plan["tile"] == tile and dev.last_plan["subgroups"] == 1
    assert np.isfinite(got).all() and got.shape == (1, 3, sq, 56)
    if limit < tile.smem_bytes(14):
        no_sg = Runner(use_subgroups=False)
        with pytest.raises(ValueError, match="workgroup storage"):
            run_contract(no_sg, q, k, v, kernel="flash", tile=tile, is_causal=is_causal)


@pytest.mark.parametrize("is_causal", [1, 2])
def test_heavy_first_order_changes_nothing_but_the_order(is_causal):
    """Causal with skipped tiles runs the row tiles of all heads heaviest first (FLAG_HEAVY_FIRST):
    the same workgroups in another order, so the output is bit-identical to the grid order and
    matches float64; a finite fill (no tile skipped) never sets the flag."""
    from ortflash.kernels.wgpu.device import Runner
    from ortflash.kernels.wgpu.params import FLAG_HEAVY_FIRST, Problem, prepare
    from ortflash.kernels.wgpu.tiles import FlashTile
    from ortflash.op import spec

    rng = np.random.default_rng(7 + is_causal)
    q, k, v = make(rng, 2, 3, 1, 150, 170, 32)
    tile = FlashTile(32, 16, 4, 1, 2)
    heavy_first = run_contract(Runner(), q, k, v, kernel="flash", tile=tile, is_causal=is_causal)
    grid_order = run_contract(Runner(causal_heavy_first=False), q, k, v, kernel="flash", tile=tile, is_causal=is_causal)
    assert np.array_equal(heavy_first, grid_order)
    problem = Problem.of(q, k, v)
    attrs = spec.validate({"scale": 0.2, "is_causal": 1})
    assert prepare(problem, q, k, v, None, None, attrs, f16_on_device=False).params["flags"][0] & FLAG_HEAVY_FIRST
    finite = spec.validate({"scale": 0.2, "is_causal": 1, "mask_fill": -1e4})
    assert not prepare(problem, q, k, v, None, None, finite, f16_on_device=False).params["flags"][0] & FLAG_HEAVY_FIRST
