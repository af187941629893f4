// Shared by naive.wgsl and flash.wgsl: the per-dispatch parameters and the
// score of one (query row, key) pair exactly as ortflash/spec.py defines it:
//
//     s = scale * q.k ; s = softcap * tanh(s / softcap) ; s += bias
//     s = mask ? s : mask_fill ; s = (key <= row + Sk - Sq or not causal) ? s : mask_fill
//     s = (key >= row + offset - window_left or no window) ? s : mask_fill
//
// with the bias added after the mask and the causal fill instead when
// bias_after_mask = 1 (FLAG_BIAS_AFTER_MASK), and the causal diagonal at the
// top left (is_causal 1: shifts 0) or bottom right (is_causal 2) as the two
// shifts of Params say.

struct Params {
    heads_q: u32,     // Hq
    group: u32,       // Hq / Hkv: query heads that share one K/V head
    seq_q: u32,       // Sq
    seq_k: u32,       // Sk
    flags: u32,       // FLAG_* below
    bh0: u32,         // first (batch * Hq + head) of this dispatch
    row0: u32,        // first query row of this dispatch (naive chunks)
    rows: u32,        // query rows in this dispatch (naive chunks)
    scale: f32,
    softcap: f32,
    mask_fill: f32,   // may be -inf
    neg_inf: f32,     // -inf, given at run time: a WGSL constant may not be infinite
    empty_row: f32,   // what a fully masked row yields: NaN (masked_rows=nan) or 0
    // Causal: key is masked when key + causal_key_shift > row + causal_row_shift
    // (params.py shifts of the causal offset: both 0 top-left; Sk - Sq or Sq - Sk bottom-right).
    causal_row_shift: u32,
    causal_key_shift: u32,
    // Window: key is masked when key + window_key_shift < row + window_row_shift
    // (params.py: row shift - key shift = the causal offset - window_left).
    window_row_shift: u32,
    window_key_shift: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
    // Element strides of bias / mask per dimension (batch, head, row, key);
    // a broadcast dimension has stride 0, so no broadcast copy is ever made.
    bias_stride: vec4<u32>,
    mask_stride: vec4<u32>,
}

const FLAG_BIAS: u32 = 1u;
const FLAG_MASK: u32 = 2u;
const FLAG_CAUSAL: u32 = 4u;
const FLAG_SOFTCAP: u32 = 8u;
// Causal and mask_fill == -inf: key tiles right of the diagonal add exactly
// nothing, so the flash kernel may skip them.
const FLAG_SKIP_CAUSAL_TILES: u32 = 16u;
// Any of bias, mask, causal, softcap or window: the plain path (scale only) is not enough.
const FLAG_ANY_EXTRA: u32 = 143u;
// The bias is added after the mask and the causal fill (bias_after_mask = 1).
const FLAG_BIAS_AFTER_MASK: u32 = 32u;
// With FLAG_SKIP_CAUSAL_TILES: flash.wgsl starts the heaviest row tiles first.
const FLAG_HEAVY_FIRST: u32 = 64u;
// A window's left edge (window_left): keys left of it are filled like causal ones.
const FLAG_WINDOW: u32 = 128u;
// Window and mask_fill == -inf: key tiles left of every row's window add exactly nothing.
const FLAG_SKIP_WINDOW_TILES: u32 = 256u;

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(4) var<storage, read> bias_buf: array<f32>;
// Boolean mask, one byte per element, four bytes packed in each u32.
@group(0) @binding(5) var<storage, read> mask_buf: array<u32>;

// tanh through exp, clamped: some drivers' tanh is a low-precision
// approximation, and (e^2x - 1)/(e^2x + 1) overflows for large |x|. Past
// |x| = 10, tanh is 1 to float32 precision.
fn soft_tanh(x: f32) -> f32 {
    let a = min(abs(x), 10.0);
    let e = exp(-2.0 * a);
    return sign(x) * (1.0 - e) / (1.0 + e);
}

fn mask_allows(element: u32) -> bool {
    let word = mask_buf[element >> 2u];
    return ((word >> ((element & 3u) * 8u)) & 0xffu) != 0u;
}

// Base offsets of one (batch, head) into the broadcast bias and mask.
fn bias_base(b: u32, h: u32) -> u32 {
    return b * params.bias_stride.x + h * params.bias_stride.y;
}
fn mask_base(b: u32, h: u32) -> u32 {
    return b * params.mask_stride.x + h * params.mask_stride.y;
}

// The final score of query `row` against key `key` (both in range) given the
// raw dot product q.k.
fn score_of(dot: f32, bbase: u32, mbase: u32, row: u32, key: u32) -> f32 {
    var s = dot * params.scale;
    let flags = params.flags;
    if ((flags & FLAG_ANY_EXTRA) == 0u) {
        return s;
    }
    if ((flags & FLAG_SOFTCAP) != 0u) {
        s = params.softcap * soft_tanh(s / params.softcap);
    }
    let bias_first = (flags & (FLAG_BIAS | FLAG_BIAS_AFTER_MASK)) == FLAG_BIAS;
    if (bias_first) {
        s += bias_buf[bbase + row * params.bias_stride.z + key * params.bias_stride.w];
    }
    if ((flags & FLAG_MASK) != 0u) {
        if (!mask_allows(mbase + row * params.mask_stride.z + key * params.mask_stride.w)) {
            s = params.mask_fill;
        }
    }
    if ((flags & FLAG_CAUSAL) != 0u && key + params.causal_key_shift > row + params.causal_row_shift) {
        s = params.mask_fill;
    }
    if ((flags & FLAG_WINDOW) != 0u && key + params.window_key_shift < row + params.window_row_shift) {
        s = params.mask_fill;
    }
    if ((flags & FLAG_BIAS) != 0u && !bias_first) {
        s += bias_buf[bbase + row * params.bias_stride.z + key * params.bias_stride.w];
    }
    return s;
}
