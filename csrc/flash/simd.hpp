// SIMD helpers: the vector width and micro-kernel shapes of this ISA build, vector loads, float16 <-> float32, exp, row max and sum.
// Part of csrc/flash_attention.hpp (one translation unit per ISA build); it includes the standard headers.
#pragma once

namespace {

#if defined(__AVX512F__)
constexpr int W = 16;  // float lanes per vector
constexpr const char* ISA_NAME = "avx512";
#elif defined(__AVX2__)
constexpr int W = 8;
constexpr const char* ISA_NAME = "avx2";
#else
constexpr int W = 4;  // SSE2 on x86-64, NEON-sized elsewhere
constexpr const char* ISA_NAME = "generic";
#endif

typedef float vf __attribute__((vector_size(W * 4)));
typedef int32_t vi __attribute__((vector_size(W * 4)));

// Micro-kernel shapes: MR rows x NV vectors of accumulators. With 16 vector registers
// (SSE2, AVX2) that is 12 accumulators, leaving room for the broadcast and the loaded vectors;
// AVX-512's 32 registers hold 16. Chosen by a sweep (AVX2 and AVX-512 builds on a Xeon, AVX2
// on the EPYC): QK^T 6x2 / P.V 3x4 for AVX2, 8x2 / 8x2 for AVX-512. -D overrides for sweeps.
#ifndef ORTFLASH_QK_MR
#if defined(__AVX512F__)
#define ORTFLASH_QK_MR 8
#define ORTFLASH_QK_NV 2
#define ORTFLASH_PV_MR 8
#define ORTFLASH_PV_NV 2
#else
#define ORTFLASH_QK_MR 6
#define ORTFLASH_QK_NV 2
#define ORTFLASH_PV_MR 3
#define ORTFLASH_PV_NV 4
#endif
#endif
constexpr int MR = ORTFLASH_QK_MR;
constexpr int NV = ORTFLASH_QK_NV;
constexpr int NR = NV * W;  // packed K^T panel width (keys)
constexpr int PV_MR = ORTFLASH_PV_MR;
constexpr int PV_NV = ORTFLASH_PV_NV;
constexpr int PV_KEY_CHUNK = 256;  // keys of V kept in L1 while the P x V rows sweep them

constexpr float NEG_INF = -std::numeric_limits<float>::infinity();

inline vf loadu(const float* p) {
    vf v;
    __builtin_memcpy(&v, p, sizeof v);
    return v;
}
inline void storeu(float* p, vf v) { __builtin_memcpy(p, &v, sizeof v); }
inline vf splat(float x) {  // one broadcast instruction (GCC 12 builds a lane loop lane by lane)
#if defined(__AVX512F__)
    return (vf)_mm512_set1_ps(x);
#elif defined(__AVX__)
    return (vf)_mm256_set1_ps(x);
#elif defined(__SSE2__)
    return (vf)_mm_set1_ps(x);
#else
    return x - vf{};  // x - 0 is x for every x (-0 included), so it folds to a broadcast
#endif
}
inline int round_up(int n, int m) { return (n + m - 1) / m * m; }
inline int ceil_div(int n, int m) { return (n + m - 1) / m; }

// ---- float16 <-> float32 (IEEE binary16; float -> half rounds to nearest even, like numpy) ----

inline float half_to_float(uint16_t h) {
    const uint32_t sign = uint32_t(h & 0x8000u) << 16;
    const uint32_t exponent = (h >> 10) & 0x1fu;
    const uint32_t mantissa = h & 0x3ffu;
    uint32_t bits;
    if (exponent == 0) {
        float magnitude = float(mantissa) * 5.9604644775390625e-08f;  // subnormal: mantissa * 2^-24
        __builtin_memcpy(&bits, &magnitude, 4);
        bits |= sign;
    } else if (exponent == 31) {
        bits = sign | 0x7f800000u | (mantissa << 13);
    } else {
        bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
    }
    float f;
    __builtin_memcpy(&f, &bits, 4);
    return f;
}

inline uint16_t float_to_half(float f) {
    uint32_t x;
    __builtin_memcpy(&x, &f, 4);
    const uint16_t sign = uint16_t((x >> 16) & 0x8000u);
    const uint32_t magnitude = x & 0x7fffffffu;
    if (magnitude >= 0x7f800000u)  // inf, NaN (kept quiet)
        return sign | 0x7c00u | (magnitude > 0x7f800000u ? 0x200u | ((magnitude >> 13) & 0x3ffu) : 0u);
    if (magnitude >= 0x477ff000u) return sign | 0x7c00u;  // >= 65520 rounds to inf
    if (magnitude < 0x38800000u) {                       // below 2^-14: a half subnormal
        float a;
        __builtin_memcpy(&a, &magnitude, 4);
        return sign | uint16_t(std::nearbyint(a * 16777216.0f));  // exact scaling, one rounding
    }
    const uint32_t rounded = magnitude + 0xfffu + ((magnitude >> 13) & 1u);
    return sign | uint16_t((rounded - 0x38000000u) >> 13);
}

inline void halves_to_floats(const uint16_t* src, float* dst, int n) {
    int i = 0;
#if defined(__F16C__) && defined(__AVX__)
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
#endif
    for (; i < n; ++i) dst[i] = half_to_float(src[i]);
}

inline void floats_to_halves(const float* src, uint16_t* dst, int n) {
    int i = 0;
#if defined(__F16C__) && defined(__AVX__)
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
#endif
    for (; i < n; ++i) dst[i] = float_to_half(src[i]);
}

// ---- e^x, vectorised ----
// Cody-Waite reduction x = n ln2 + r, |r| <= ln2/2, a degree-5 polynomial for e^r with e^0 = 1
// exactly (fitted for relative error: at most 1.7e-7 over [-87.3, 0] in float32, 3 ulp; the
// degree-7 cephes form it replaces was 1 ulp, and cost 5 more instructions per vector, a
// quarter of the naive softmax's exp), and 2^n written into the exponent bits: the magic
// constant that rounds x log2(e) to an integer also carries the exponent bias 127, so the
// float's own bits shifted left by 23 are 2^n (no float -> int conversion). The softmax only
// asks for x <= 0 (a score minus a maximum), and the result is right for every x <= 88:
// -inf -> 0, NaN -> NaN (it flows through the arithmetic), and below -87.33 (where e^x is
// subnormal, far below the float32 rounding of a softmax sum that holds e^0 = 1) it is 0,
// which the padding skip relies on. No -ffast-math.
inline vf vexp(vf x) {
    const vf lo = splat(-87.33f);
    const vf xc = lo > x ? lo : x;  // maxps(lo, x): NaN stays NaN
    const vf magic = splat(12582912.0f + 127.0f);  // 1.5 * 2^23 (+ 127): adding it rounds to an integer
    const vf t = xc * splat(1.44269504088896341f) + magic;
    const vf n = t - magic;
    vf r = xc - n * splat(0.693359375f);
    r = r - n * splat(-2.12194440e-4f);
    vf p = splat(8.291284553706646e-3f);
    p = p * r + splat(4.189792647957802e-2f);
    p = p * r + splat(1.6667620837688446e-1f);
    p = p * r + splat(4.999915063381195e-1f);
    p = p * r + splat(9.999997019767761e-1f);
    p = p * r + splat(1.0f);
    const vf y = p * (vf)((vi)t << 23);  // n + 127 in [1, 255] sits in t's low mantissa bits
    return x < lo ? splat(0.0f) : y;
}

inline float scalar_exp(float x) {
    vf v = vexp(splat(x));
    return v[0];
}

// Horizontal reductions as trees (log2(W) dependent steps, not W).
#if defined(__AVX__) && !defined(__AVX512F__)
// The same trees in registers (GCC builds the array versions below through the stack).
inline float lanes_max(vf v) {
    __m128 x = _mm_max_ps(_mm256_castps256_ps128((__m256)v), _mm256_extractf128_ps((__m256)v, 1));
    x = _mm_max_ps(x, _mm_movehl_ps(x, x));
    return _mm_cvtss_f32(_mm_max_ss(x, _mm_movehdup_ps(x)));
}
inline float lanes_sum(vf v) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128((__m256)v), _mm256_extractf128_ps((__m256)v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    return _mm_cvtss_f32(_mm_add_ss(x, _mm_movehdup_ps(x)));
}
#elif defined(__AVX512F__)
// The same trees in registers: first the two 256-bit halves (lanes i and i + 8, as the array
// version pairs them), then as AVX2 does. Through the stack, the per-row reductions of a short
// (64-key) tile's max and sum were about a quarter of the online tile's own time at S = 64.
inline float lanes_max(vf v) {
    const __m256 h = _mm256_max_ps(_mm512_castps512_ps256((__m512)v),
                                   _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd((__m512)v), 1)));
    __m128 x = _mm_max_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    x = _mm_max_ps(x, _mm_movehl_ps(x, x));
    return _mm_cvtss_f32(_mm_max_ss(x, _mm_movehdup_ps(x)));
}
inline float lanes_sum(vf v) {
    const __m256 h = _mm256_add_ps(_mm512_castps512_ps256((__m512)v),
                                   _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd((__m512)v), 1)));
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    return _mm_cvtss_f32(_mm_add_ss(x, _mm_movehdup_ps(x)));
}
#else
inline float lanes_max(vf v) {
    float a[W];
    __builtin_memcpy(a, &v, sizeof v);
    for (int w = W / 2; w > 0; w /= 2)
        for (int i = 0; i < w; ++i) a[i] = a[i] > a[i + w] ? a[i] : a[i + w];
    return a[0];
}
inline float lanes_sum(vf v) {
    float a[W];
    __builtin_memcpy(a, &v, sizeof v);
    for (int w = W / 2; w > 0; w /= 2)
        for (int i = 0; i < w; ++i) a[i] += a[i + w];
    return a[0];
}
#endif

// Largest value of s[0..n) (n a multiple of W), NaN when any is NaN (like numpy's max). Two
// independent chains halve the loop's latency on short (64-key) tiles.
inline float row_max(const float* s, int n) {
    vf m0 = splat(NEG_INF), m1 = m0;
    vi nan = vi{};
    int j = 0;
    for (; j + 2 * W <= n; j += 2 * W) {
        const vf x0 = loadu(s + j), x1 = loadu(s + j + W);
        nan |= (x0 != x0) | (x1 != x1);
        m0 = x0 > m0 ? x0 : m0;
        m1 = x1 > m1 ? x1 : m1;
    }
    if (j < n) {
        const vf x = loadu(s + j);
        nan |= (x != x);
        m0 = x > m0 ? x : m0;
    }
    bool any_nan = false;
    for (int l = 0; l < W; ++l) any_nan |= nan[l] != 0;
    return any_nan ? std::numeric_limits<float>::quiet_NaN() : lanes_max(m0 > m1 ? m0 : m1);
}

inline float nan_max(float a, float b) {  // numpy.maximum: NaN wins
    if (a != a) return a;
    if (b != b) return b;
    return a > b ? a : b;
}

// s[j] = exp(s[j] - ref) in place over n (a multiple of W) columns; returns their sum.
inline float exp_row(float* s, int n, float ref) {
    const vf r = splat(ref);
    vf total0 = vf{}, total1 = vf{};
    int j = 0;
    for (; j + 2 * W <= n; j += 2 * W) {
        const vf e0 = vexp(loadu(s + j) - r), e1 = vexp(loadu(s + j + W) - r);
        storeu(s + j, e0);
        storeu(s + j + W, e1);
        total0 += e0;
        total1 += e1;
    }
    if (j < n) {
        const vf e = vexp(loadu(s + j) - r);
        storeu(s + j, e);
        total0 += e;
    }
    return lanes_sum(total0 + total1);
}

// The naive softmax's normalisation of one row of exps p[0..n) (n a multiple of W) whose sum is
// `sum` (`extra` the weight of keys entered in closed form, normalised with them). A finite sum
// (no NaN among the exps, and at least exp(0) = 1) is left to the output row, which P x V makes
// n / Dv times smaller than the score row: returns it, for divide_rows. Otherwise (NaN or inf in
// the row) the row is divided here as the spec's softmax does it, with masked_rows="zero"
// turning its NaN weights into 0, and 1 is returned.
inline float normalise_row(float* p, int n, float sum, bool zero_rows, float& extra) {
    if (std::isfinite(sum)) return sum;
    const vf total = splat(sum);
    for (int j = 0; j < n; j += W) {
        vf x = loadu(p + j) / total;
        if (zero_rows) x = x != x ? splat(0.0f) : x;
        storeu(p + j, x);
    }
    extra /= sum;
    if (zero_rows && extra != extra) extra = 0.0f;
    return 1.0f;
}

// acc[r][0..dvp) /= sum[r] for the rows whose normalisation normalise_row left to the output.
inline void divide_rows(float* acc, int rows, int dvp, const float* sum) {
    for (int r = 0; r < rows; ++r) {
        if (sum[r] == 1.0f) continue;
        const vf total = splat(sum[r]);
        float* ar = acc + size_t(r) * dvp;
        for (int c = 0; c < dvp; c += W) storeu(ar + c, loadu(ar + c) / total);
    }
}

}  // namespace
