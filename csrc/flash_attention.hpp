// FlashAttention on the CPU: the semantics of ortflash/spec.py, computed in float32 tiles.
//
// One source, built three times by setup.py (module_avx512.cpp, module_avx2.cpp,
// module_generic.cpp) with different ISA flags; the vector width follows the flags through
// GCC vector extensions. ortflash/kernels/cpu.py imports the best build the CPU runs.
//
// Work is split over (batch, query head, query tile). For each query tile the scores of a key
// tile are one register-blocked product (MR query rows broadcast x NR packed K^T columns), the
// softmax runs over that tile (online) or over the whole score row (naive), and P x V is a
// second register-blocked product with Dv across the vector lanes. K^T and V are packed once
// per kv head and shared by the grouped query heads. Nothing here is proportional to Sq * Sk.
// A call with few query rows per kv head (a decode step: (Hq / Hkv) * Sq <= DIRECT_MAX_ROWS)
// packs nothing: work is split over (batch, kv head), and K and V are read in place (run_direct).
//
// The discrete edge cases follow ortflash/kernels/reference.py operation by operation: NaN
// propagates through the row max, a fully -inf row yields NaN (or 0 with masked_rows="zero"),
// and a finite mask_fill gives masked keys that weight, including the causal keys right of the
// diagonal that are never multiplied (their scores are all mask_fill, so they enter the softmax
// as one closed-form term: count * exp(fill - max) and exp(fill - max) * suffix sum of V).
// One difference is by design: V rows of skipped causal keys are never read, so a NaN there
// does not reach the output (the reference multiplies it by p = 0).
//
// Padding is skipped, not multiplied: in online mode a key tile whose bias or mask puts every
// score far below the rest (a padded tail, e.g. bias = float32 lowest) is set aside until the
// other tiles have set the row maxima, and then dropped when a Cauchy-Schwarz bound
// (|score| <= |scale| |q| |k|, key norms recorded while packing) proves each of its exps is
// exactly 0 and its V rows are finite, so it would add exactly 0 to the sums. NaN or inf in
// its K or V, or a row that sees no other key, keeps the tile in (then processed last).
//
// Scores stay in natural units and log2(e) is applied inside vexp to (score - max): folding
// scale * log2(e) into the scores would turn a float32-lowest mask_fill into -inf, and a
// row masked with that finite fill must stay a uniform softmax, not become NaN.

#ifndef ORTFLASH_MODULE_NAME
#error "define ORTFLASH_MODULE_NAME (the extension module's name) before including this file"
#endif

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <thread>
#include <vector>

#if defined(__SSE2__) || defined(__AVX__)
#include <immintrin.h>
#endif

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
// Cody-Waite reduction x = n ln2 + r, |r| <= ln2/2, a degree-6 polynomial for e^r (cephes'
// expf coefficients), and 2^n written into the exponent bits. The softmax only asks for x <= 0
// (a score minus a maximum), and the result is right for every x <= 88: -inf -> 0, NaN -> NaN
// (it flows through the arithmetic), and below -87.3 (where e^x is subnormal, far below the
// float32 rounding of a softmax sum that holds e^0 = 1) it is 0. No -ffast-math.
inline vf vexp(vf x) {
    const vf lo = splat(-87.33f);
    const vf xc = lo > x ? lo : x;  // maxps(lo, x): NaN stays NaN
    const vf magic = splat(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer
    const vf n = (xc * splat(1.44269504088896341f) + magic) - magic;
    vf r = xc - n * splat(0.693359375f);
    r = r - n * splat(-2.12194440e-4f);
    vf p = splat(1.9875691500e-4f);
    p = p * r + splat(1.3981999507e-3f);
    p = p * r + splat(8.3334519073e-3f);
    p = p * r + splat(4.1665795894e-2f);
    p = p * r + splat(1.6666665459e-1f);
    p = p * r + splat(5.0000001201e-1f);
    const vf y = (p * (r * r) + r + splat(1.0f)) * (vf)((__builtin_convertvector(n, vi) + 127) << 23);
    return x < lo ? splat(0.0f) : y;
}

inline float scalar_exp(float x) {
    vf v = vexp(splat(x));
    return v[0];
}

// ---- the two tile products ----

// s[i][0..NR) = scale * (q row i) . (K^T panel), for R query rows (row stride ld_q).
template <int R>
inline void qk_block(const float* q, int ld_q, int D, const float* panel, float* s, int ld_s, float scale) {
    // Row pointers and a pointer-sized index keep the loop free of index arithmetic: with int
    // indices GCC re-extends every address, and the extra instructions stall the front end.
    const float* row[R];
    for (int i = 0; i < R; ++i) row[i] = q + ptrdiff_t(i) * ld_q;
    vf c[R][NV];
    for (int i = 0; i < R; ++i)
        for (int n = 0; n < NV; ++n) c[i][n] = vf{};
    for (ptrdiff_t d = 0; d < D; ++d, panel += NR) {
        vf b[NV];
        for (int n = 0; n < NV; ++n) b[n] = loadu(panel + n * W);
        for (int i = 0; i < R; ++i) {
            const vf a = splat(row[i][d]);
            for (int n = 0; n < NV; ++n) c[i][n] += a * b[n];
        }
    }
    const vf sc = splat(scale);
    for (int i = 0; i < R; ++i)
        for (int n = 0; n < NV; ++n) storeu(s + i * ld_s + n * W, c[i][n] * sc);
}

// The last rows (fewer than MR) of a tile: the block of exactly that many rows.
template <int R>
inline void qk_rest(int rows, const float* q, int ld_q, int D, const float* panel, float* s, int ld_s, float scale) {
    if constexpr (R > 0) {
        if (rows == R)
            qk_block<R>(q, ld_q, D, panel, s, ld_s, scale);
        else
            qk_rest<R - 1>(rows, q, ld_q, D, panel, s, ld_s, scale);
    }
}

// Scores of `rows` query rows against `panels` packed panels (NR keys each).
void qk_tile(int rows, const float* q, int ld_q, int D, const float* packed, int panels, float* s, int ld_s,
             float scale) {
    for (int p = 0; p < panels; ++p) {
        const float* panel = packed + size_t(p) * D * NR;
        int r = 0;
        for (; r + MR <= rows; r += MR) qk_block<MR>(q + r * ld_q, ld_q, D, panel, s + r * ld_s + p * NR, ld_s, scale);
        qk_rest<MR - 1>(rows - r, q + r * ld_q, ld_q, D, panel, s + r * ld_s + p * NR, ld_s, scale);
    }
}

// acc[i][0..NC*W) += sum_k p[i][k] * v[k][0..NC*W), for R rows.
template <int R, int NC>
inline void pv_block(const float* p, int ld_p, int keys, const float* v, int ld_v, float* acc, int ld_acc) {
    const float* row[R];  // as in qk_block: no index arithmetic in the loop
    for (int i = 0; i < R; ++i) row[i] = p + ptrdiff_t(i) * ld_p;
    vf c[R][NC];
    for (int i = 0; i < R; ++i)
        for (int n = 0; n < NC; ++n) c[i][n] = loadu(acc + i * ld_acc + n * W);
    for (ptrdiff_t k = 0; k < keys; ++k, v += ld_v) {
        vf b[NC];
        for (int n = 0; n < NC; ++n) b[n] = loadu(v + n * W);
        for (int i = 0; i < R; ++i) {
            const vf a = splat(row[i][k]);
            for (int n = 0; n < NC; ++n) c[i][n] += a * b[n];
        }
    }
    for (int i = 0; i < R; ++i)
        for (int n = 0; n < NC; ++n) storeu(acc + i * ld_acc + n * W, c[i][n]);
}

template <int R, int NC>
inline void pv_rest(int rows, const float* p, int ld_p, int keys, const float* v, int ld_v, float* acc, int ld_acc) {
    if constexpr (R > 0) {
        if (rows == R)
            pv_block<R, NC>(p, ld_p, keys, v, ld_v, acc, ld_acc);
        else
            pv_rest<R - 1, NC>(rows, p, ld_p, keys, v, ld_v, acc, ld_acc);
    }
}

template <int NC>
void pv_rows(int rows, const float* p, int ld_p, int keys, const float* v, int ld_v, float* acc, int ld_acc) {
    int r = 0;
    for (; r + PV_MR <= rows; r += PV_MR)
        pv_block<PV_MR, NC>(p + r * ld_p, ld_p, keys, v, ld_v, acc + r * ld_acc, ld_acc);
    pv_rest<PV_MR - 1, NC>(rows - r, p + r * ld_p, ld_p, keys, v, ld_v, acc + r * ld_acc, ld_acc);
}

template <int NC>
void pv_columns(int rows, const float* p, int ld_p, int keys, const float* v, int dvp, float* acc, int& col) {
    for (; col + NC * W <= dvp; col += NC * W) pv_rows<NC>(rows, p, ld_p, keys, v + col, dvp, acc + col, dvp);
    if constexpr (NC > 1) pv_columns<NC - 1>(rows, p, ld_p, keys, v, dvp, acc, col);
}

// acc[rows][Dvp] += P[rows][keys] x V[keys][Dvp]  (Dvp a multiple of W)
void pv_tile(int rows, const float* p, int ld_p, int keys, const float* v, int dvp, float* acc) {
    for (int k0 = 0; k0 < keys; k0 += PV_KEY_CHUNK) {
        int col = 0;
        pv_columns<PV_NV>(rows, p + k0, ld_p, std::min(PV_KEY_CHUNK, keys - k0), v + size_t(k0) * dvp, dvp, acc, col);
    }
}

// ---- the call ----

struct Broadcast4 {  // an optional bias or mask: base pointer and element strides, 0 on broadcast axes
    const char* data = nullptr;
    int64_t stride[4] = {0, 0, 0, 0};
    int item = 0;
    bool half = false;
};

struct Problem {
    int B, Hq, Hkv, Sq, Sk, D, Dv;
    const void* q;
    const void* k;
    const void* v;
    void* out;
    bool q_half, k_half, v_half;
    Broadcast4 bias, mask;
    float scale, mask_fill, softcap;
    bool causal, zero_rows, online;
    int causal_offset;     // with causal: query i sees key j <= i + causal_offset (spec.key_bounds: the
                           // causal frontier, or a window's right edge)
    bool windowed;         // a window's left edge: query i sees key j >= i + left_offset
    int left_offset;
    bool bias_after_mask;  // the bias is added after the mask and causal fills (spec: bias_after_mask)
    int block;       // keys per tile of the online softmax
    int query_tile;  // query rows per work item
    int threads;
};

struct AlignedFloats {  // a 64-byte aligned float buffer
    float* ptr = nullptr;
    explicit AlignedFloats(size_t n) {
        if (n == 0) n = 1;
        ptr = static_cast<float*>(std::aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64));
        if (!ptr) throw std::bad_alloc();
    }
    ~AlignedFloats() { std::free(ptr); }
    AlignedFloats(const AlignedFloats&) = delete;
    AlignedFloats& operator=(const AlignedFloats&) = delete;
};

// Runs body(item) for item in [0, items) on `threads` threads (the caller's included), items
// handed out one at a time so that uneven items (causal rows) balance. Returns false when a
// thread ran out of memory.
template <class Body>
bool parallel_items(int items, int threads, const Body& body) {
    std::atomic<int> next{0};
    std::atomic<bool> failed{false};
    auto worker = [&]() {
        try {
            auto run_item = body();  // per-thread state (scratch) lives in the returned closure
            for (int i = next.fetch_add(1); i < items && !failed.load(); i = next.fetch_add(1)) run_item(i);
        } catch (const std::bad_alloc&) {
            failed.store(true);
        }
    };
    const int n = std::max(1, std::min(threads, items));
    std::vector<std::thread> pool;
    pool.reserve(n - 1);
    for (int t = 1; t < n; ++t) pool.emplace_back(worker);
    worker();
    for (auto& t : pool) t.join();
    return !failed.load();
}

struct Packed {  // K^T panels, V rows (padded to Dvp) and, when needed, V suffix and prefix sums, per (b, kv head)
    int key_tile;      // keys per packed tile (block for online, Sk for naive)
    int tile_floats;   // floats per packed K tile
    int tiles;
    int dvp;
    bool suffix, prefix;
    size_t k_floats, v_floats, s_floats, p_floats;  // per kv head
    AlignedFloats k, v, vsuffix, vprefix;
    // Per (kv head, key group): the largest |k| of the group's keys (NaN when any is NaN) and
    // whether every V value of the group is finite and below V_SKIPPABLE_LIMIT, which together
    // let PaddingSkip prove that a masked group would contribute exactly nothing. A group is
    // an online tile, or NAIVE_GROUP_KEYS keys in the naive mode (which packs one tile of Sk).
    int group_keys, groups;  // keys per group, groups per kv head
    std::vector<float> key_norm;
    std::vector<uint8_t> v_bounded;
    Packed(const Problem& pb, int key_tile_, int group_keys_, bool suffix_, bool prefix_)
        : key_tile(key_tile_),
          tile_floats(round_up(key_tile_, NR) * pb.D),
          tiles(ceil_div(pb.Sk, key_tile_)),
          dvp(round_up(pb.Dv, W)),
          suffix(suffix_),
          prefix(prefix_),
          k_floats(size_t(tiles) * tile_floats),
          v_floats(size_t(pb.Sk) * dvp),
          s_floats(suffix_ ? size_t(pb.Sk + 1) * dvp : 0),
          p_floats(prefix_ ? size_t(pb.Sk + 1) * dvp : 0),
          k(k_floats * pb.B * pb.Hkv),
          v(v_floats * pb.B * pb.Hkv),
          vsuffix(s_floats * pb.B * pb.Hkv),
          vprefix(p_floats * pb.B * pb.Hkv),
          group_keys(group_keys_),
          groups(ceil_div(pb.Sk, group_keys_)),
          key_norm(size_t(groups) * pb.B * pb.Hkv),
          v_bounded(size_t(groups) * pb.B * pb.Hkv) {}
};

// A V value this large could overflow the accumulator when an earlier tile's weight is
// rescaled by 0; below it, a weight of exactly 0 adds exactly 0.
constexpr float V_SKIPPABLE_LIMIT = 1e30f;
// Keys per group that the naive mode may skip: a multiple of NR for every ISA build.
constexpr int NAIVE_GROUP_KEYS = 64;
static_assert(NAIVE_GROUP_KEYS % NR == 0 && NAIVE_GROUP_KEYS % W == 0, "groups must be whole panels");

// The largest Euclidean norm of n vectors of length d (row stride d); NaN when any element is.
inline float max_norm(const float* x, int n, int d) {
    float largest = 0.0f;
    for (int j = 0; j < n; ++j) {
        float sum = 0.0f;
        for (int c = 0; c < d; ++c) sum += x[size_t(j) * d + c] * x[size_t(j) * d + c];
        if (sum != sum) return sum;
        largest = std::max(largest, sum);
    }
    return std::sqrt(largest);
}

void pack_head(const Problem& pb, Packed& pk, int bh, std::vector<float>& row) {
    const int D = pb.D, Dv = pb.Dv, Sk = pb.Sk, dvp = pk.dvp;
    float* kdst = pk.k.ptr + pk.k_floats * bh;
    float* vdst = pk.v.ptr + pk.v_floats * bh;
    row.resize(std::max(D, Dv));
    for (int t = 0; t < pk.tiles; ++t) {
        const int j0 = t * pk.key_tile;
        const int keys = std::min(pk.key_tile, Sk - j0);
        float* tile = kdst + size_t(t) * pk.tile_floats;
        std::fill(tile, tile + size_t(ceil_div(keys, NR)) * NR * D, 0.0f);
        for (int j = 0; j < keys; ++j) {
            const size_t at = (size_t(bh) * Sk + j0 + j) * D;
            const float* src = row.data();
            if (pb.k_half)
                halves_to_floats(static_cast<const uint16_t*>(pb.k) + at, row.data(), D);
            else
                src = static_cast<const float*>(pb.k) + at;
            float* panel = tile + size_t(j / NR) * D * NR + j % NR;
            for (int d = 0; d < D; ++d) panel[d * NR] = src[d];
            const float norm = max_norm(src, 1, D);
            const int key = j0 + j;
            float& largest = pk.key_norm[size_t(bh) * pk.groups + key / pk.group_keys];
            largest = key % pk.group_keys == 0 ? norm
                      : (norm != norm || largest != largest) ? NAN : std::max(largest, norm);
        }
    }
    for (int j = 0; j < Sk; ++j) {
        const size_t at = (size_t(bh) * Sk + j) * Dv;
        float* dst = vdst + size_t(j) * dvp;
        if (pb.v_half)
            halves_to_floats(static_cast<const uint16_t*>(pb.v) + at, dst, Dv);
        else
            std::memcpy(dst, static_cast<const float*>(pb.v) + at, sizeof(float) * Dv);
        std::fill(dst + Dv, dst + dvp, 0.0f);
    }
    for (int g = 0; g < pk.groups; ++g) {
        const int j0 = g * pk.group_keys, keys = std::min(pk.group_keys, Sk - j0);
        bool bounded = true;
        for (size_t c = size_t(j0) * dvp; c < size_t(j0 + keys) * dvp; ++c)
            bounded &= std::fabs(vdst[c]) < V_SKIPPABLE_LIMIT;  // false for inf and NaN
        pk.v_bounded[size_t(bh) * pk.groups + g] = bounded;
    }
    if (pk.suffix) {
        float* sdst = pk.vsuffix.ptr + pk.s_floats * bh;
        std::fill(sdst + size_t(Sk) * dvp, sdst + size_t(Sk + 1) * dvp, 0.0f);
        for (int j = Sk - 1; j >= 0; --j)
            for (int c = 0; c < dvp; ++c) sdst[size_t(j) * dvp + c] = sdst[size_t(j + 1) * dvp + c] + vdst[size_t(j) * dvp + c];
    }
    if (pk.prefix) {  // row j: the sum of V rows [0, j) (the keys left of a window)
        float* pdst = pk.vprefix.ptr + pk.p_floats * bh;
        std::fill(pdst, pdst + dvp, 0.0f);
        for (int j = 0; j < Sk; ++j)
            for (int c = 0; c < dvp; ++c) pdst[size_t(j + 1) * dvp + c] = pdst[size_t(j) * dvp + c] + vdst[size_t(j) * dvp + c];
    }
}

// Scores of one row, in place: softcap, + bias, mask, causal and window (only when the tile
// crosses a frontier: `diagonal`), in the spec's order; columns [keys, round_up(keys, W)) become -inf so the vector
// loops that follow may run over whole vectors.
void add_bias(const Problem& pb, float* s, int keys, int b, int h, int i, int j0, std::vector<float>& row);

void finish_scores(const Problem& pb, float* s, int keys, int b, int h, int i, int j0, bool diagonal,
                   std::vector<float>& row) {
    if (pb.softcap > 0.0f) {
        const float cap = pb.softcap;
        for (int j = 0; j < keys; ++j) s[j] = cap * std::tanh(s[j] / cap);
    }
    if (!pb.bias_after_mask) add_bias(pb, s, keys, b, h, i, j0, row);
    const float fill = pb.mask_fill;
    if (pb.mask.data) {
        const Broadcast4& ms = pb.mask;
        const int64_t sj = ms.stride[3];
        const uint8_t* keep = reinterpret_cast<const uint8_t*>(ms.data) + b * ms.stride[0] + h * ms.stride[1] +
                              i * ms.stride[2] + j0 * sj;
        if (sj == 1) {
            for (int j = 0; j < keys; ++j) s[j] = keep[j] ? s[j] : fill;
        } else {
            for (int j = 0; j < keys; ++j) s[j] = keep[j * sj] ? s[j] : fill;
        }
    }
    if (diagonal && pb.causal)  // key j0 + j is right of query i when j > i + causal_offset - j0
        for (int j = std::max(0, i + pb.causal_offset - j0 + 1); j < keys; ++j) s[j] = fill;
    if (diagonal && pb.windowed)  // and left of its window when j < i + left_offset - j0
        for (int j = 0, end = std::min(keys, i + pb.left_offset - j0); j < end; ++j) s[j] = fill;
    if (pb.bias_after_mask) add_bias(pb, s, keys, b, h, i, j0, row);
    for (int j = keys; j < round_up(keys, W); ++j) s[j] = NEG_INF;
}

// s[j] += bias[b, h, i, j0 + j] over one row's keys (float32 or float16 bias, any key stride).
void add_bias(const Problem& pb, float* s, int keys, int b, int h, int i, int j0, std::vector<float>& row) {
    if (pb.bias.data) {
        const Broadcast4& bs = pb.bias;
        const int64_t sj = bs.stride[3];
        const char* at = bs.data + (b * bs.stride[0] + h * bs.stride[1] + i * bs.stride[2] + j0 * sj) * bs.item;
        if (bs.half) {
            const uint16_t* src = reinterpret_cast<const uint16_t*>(at);
            if (sj == 1) {
                row.resize(keys);
                halves_to_floats(src, row.data(), keys);
                for (int j = 0; j < keys; ++j) s[j] += row[j];
            } else {
                for (int j = 0; j < keys; ++j) s[j] += half_to_float(src[j * sj]);
            }
        } else {
            const float* src = reinterpret_cast<const float*>(at);
            if (sj == 1) {
                for (int j = 0; j < keys; ++j) s[j] += src[j];
            } else {
                for (int j = 0; j < keys; ++j) s[j] += src[j * sj];
            }
        }
    }
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

// The common case of finish_scores then row_max in one pass: s[j] += bias[j] (bias may be
// null), columns [keys, width) set to -inf, and the row's largest value (NaN when any is NaN).
inline float add_bias_row_max(float* s, const float* bias, int keys, int width) {
    vf m0 = splat(NEG_INF), m1 = m0;
    vi nan = vi{};
    int j = 0;
    for (; j + 2 * W <= keys; j += 2 * W) {
        vf x0 = loadu(s + j), x1 = loadu(s + j + W);
        if (bias) {
            x0 += loadu(bias + j);
            x1 += loadu(bias + j + W);
            storeu(s + j, x0);
            storeu(s + j + W, x1);
        }
        nan |= (x0 != x0) | (x1 != x1);
        m0 = x0 > m0 ? x0 : m0;
        m1 = x1 > m1 ? x1 : m1;
    }
    if (j < width) {  // the last (partial) vectors, element by element
        for (int c = j; c < keys; ++c)
            if (bias) s[c] += bias[c];
        for (int c = keys; c < width; ++c) s[c] = NEG_INF;
        for (; j < width; j += W) {
            const vf x = loadu(s + j);
            nan |= (x != x);
            m0 = x > m0 ? x : m0;
        }
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

// A key tile that the bias or mask pushes far below the other scores, set aside until the row
// maxima of the other tiles are known (then it is skipped when provably worthless).
struct DeferredTile {
    int tile;
    float ceiling;    // an upper bound on bias (or fill) over the tile, before the product
    bool all_filled;  // every score of the tile is mask_fill (the mask keeps none)
    bool some_filled;
    bool dropped = false;  // proved worthless and left out
};

// finish_scores, then the row's largest value (row_max over `width` columns), in one pass
// when the row needs nothing but a float32 bias row added.
// One key tile of the online softmax, per row: the running max m takes the tile's max, the
// scores become exp(s - m) in place, the running sum l and the accumulator acc are rescaled to
// the new max. A row whose keys so far are all -inf keeps 0 as its reference, so exp(-inf - ref)
// is 0 rather than NaN; a fully masked row ends with l = 0 and yields 0/0 = NaN.
inline void online_update_rows(int rows, float* s, int ld_s, int width, const float* tile_max, float* m, float* l,
                               float* acc, int dvp) {
    for (int r = 0; r < rows; ++r) {
        const float new_max = nan_max(m[r], tile_max[r]);
        const float ref = new_max == NEG_INF ? 0.0f : new_max;
        // an unchanged finite maximum rescales by exp(0) = 1 exactly: no exp needed
        const float rescale = new_max == m[r] && ref == new_max ? 1.0f : scalar_exp(m[r] - ref);
        const float tile_sum = exp_row(s + size_t(r) * ld_s, width, ref);
        l[r] = l[r] * rescale + tile_sum;
        if (rescale != 1.0f) {
            float* ar = acc + size_t(r) * dvp;
            const vf f = splat(rescale);
            for (int c = 0; c < dvp; c += W) storeu(ar + c, loadu(ar + c) * f);
        }
        m[r] = new_max;
    }
}

inline float finish_scores_max(const Problem& pb, float* s, int keys, int width, int b, int h, int i, int j0,
                               bool diagonal, std::vector<float>& row) {
    const Broadcast4& bs = pb.bias;
    if (pb.softcap <= 0.0f && !pb.mask.data && !diagonal && (!bs.data || (!bs.half && bs.stride[3] == 1))) {
        const float* bias = bs.data ? reinterpret_cast<const float*>(bs.data) + b * bs.stride[0] + h * bs.stride[1] +
                                          i * bs.stride[2] + j0
                                    : nullptr;
        return add_bias_row_max(s, bias, keys, width);
    }
    finish_scores(pb, s, keys, b, h, i, j0, diagonal, row);
    return row_max(s, width);
}

// Thread scratch: O(query_tile * (key tile or Sk) + query_tile * Dvp).
struct Scratch {
    AlignedFloats q, s, acc;
    std::vector<float> running_max, running_sum, tile_max, row, query_norm;
    std::vector<struct DeferredTile> deferred;
    std::vector<float> vsum;
    // The sum of the V rows of the skipped keys [first_skipped, Sk) and [0, last_skipped).
    const float* skipped_sum(const Packed& pk, size_t head, int first_skipped, int last_skipped) {
        const float* suffix = pk.vsuffix.ptr + pk.s_floats * head + size_t(first_skipped) * pk.dvp;
        if (last_skipped == 0) return suffix;
        const float* prefix = pk.vprefix.ptr + pk.p_floats * head + size_t(last_skipped) * pk.dvp;
        vsum.resize(pk.dvp);
        for (int c = 0; c < pk.dvp; ++c) vsum[c] = suffix[c] + prefix[c];
        return vsum.data();
    }
    Scratch(const Problem& pb, int ld_s, int dvp)
        : q(pb.q_half ? size_t(pb.query_tile) * pb.D : 0),
          s(size_t(pb.query_tile) * ld_s),
          acc(size_t(pb.query_tile) * dvp),
          running_max(pb.query_tile),
          running_sum(pb.query_tile),
          tile_max(pb.query_tile) {}
};

void write_output(const Problem& pb, const float* acc, int dvp, int b, int h, int i0, int rows) {
    for (int r = 0; r < rows; ++r) {
        const size_t at = ((size_t(b) * pb.Hq + h) * pb.Sq + i0 + r) * pb.Dv;
        if (pb.q_half)
            floats_to_halves(acc + size_t(r) * dvp, static_cast<uint16_t*>(pb.out) + at, pb.Dv);
        else
            std::memcpy(static_cast<float*>(pb.out) + at, acc + size_t(r) * dvp, sizeof(float) * pb.Dv);
    }
}

// The query tile's rows as float32 (a view into Q, or converted into scratch).
const float* query_rows(const Problem& pb, Scratch& sc, int b, int h, int i0, int rows) {
    const size_t at = ((size_t(b) * pb.Hq + h) * pb.Sq + i0) * pb.D;
    if (!pb.q_half) return static_cast<const float*>(pb.q) + at;
    halves_to_floats(static_cast<const uint16_t*>(pb.q) + at, sc.q.ptr, rows * pb.D);
    return sc.q.ptr;
}

// Causal keys right of every row of the tile, and keys left of every row's window, are never
// multiplied: with mask_fill -inf they weigh exactly 0; with a finite fill their scores are all
// `fill`, entered in closed form (V suffix and prefix sums).
// Not when a bias is added after the fills: there such a score is fill + bias[j] (NaN for a
// +inf or NaN bias even with fill -inf), so every key is multiplied and filled as the spec says.
inline bool skips_causal_keys(const Problem& pb) {
    return (pb.causal || pb.windowed) && !(pb.bias_after_mask && pb.bias.data);
}
inline bool skipped_keys_count(const Problem& pb) { return skips_causal_keys(pb) && std::isfinite(pb.mask_fill); }

// Keys [0, n) of a tile of rows ending at last_row can be seen by some row (the rest are right
// of the causal frontier of every row), clamped to [0, Sk].
inline int causal_keys(const Problem& pb, int last_row) {
    return pb.causal ? std::max(0, std::min(pb.Sk, last_row + pb.causal_offset + 1)) : pb.Sk;
}
// Keys [0, n) lie left of the window of every row from first_row on, clamped to [0, Sk].
inline int left_keys(const Problem& pb, int first_row) {
    return pb.windowed ? std::max(0, std::min(pb.Sk, first_row + pb.left_offset)) : 0;
}
// Whether keys [j0, j0 + keys) cross the causal frontier or the window's left edge of some row
// in [i0, last_row].
inline bool crosses_frontier(const Problem& pb, int i0, int last_row, int j0, int keys) {
    return (pb.causal && j0 + keys - 1 > i0 + pb.causal_offset) || (pb.windowed && j0 < last_row + pb.left_offset);
}

// How far below the row maxima a score must lie for vexp to give exactly 0 (it does below
// -87.33), with room for the rounding of the bound itself.
constexpr float SKIP_MARGIN = 90.0f;

// Describes key tile [j0, j0 + keys) for rows [i0, i0 + rows) as a DeferredTile when its bias
// or mask could make every score worthless; false when it cannot (no bias or mask, NaN in
// the bias, a mask that keeps some key while there is no bias, or a bias value at or above
// `bias_limit`, where the scan stops early: an unmasked tile costs a look at one value).
bool masked_tile(const Problem& pb, int b, int h, int i0, int rows, int j0, int keys, float bias_limit,
                 DeferredTile* out) {
    // A bias added after the mask moves the masked scores too (fill + bias): not described here.
    if (pb.bias_after_mask && pb.mask.data && pb.bias.data) return false;
    bool some_kept = !pb.mask.data, some_filled = false;
    if (pb.mask.data) {
        const Broadcast4& ms = pb.mask;
        const uint8_t* base = reinterpret_cast<const uint8_t*>(ms.data) + b * ms.stride[0] + h * ms.stride[1] +
                              i0 * ms.stride[2] + j0 * ms.stride[3];
        const int distinct_rows = ms.stride[2] ? rows : 1;
        for (int r = 0; r < distinct_rows; ++r)
            for (int j = 0; j < keys; ++j) {
                const bool keep = base[r * ms.stride[2] + j * ms.stride[3]] != 0;
                if (keep && !pb.bias.data) return false;
                some_kept |= keep;
                some_filled |= !keep;
            }
        if (!some_kept) {
            *out = DeferredTile{0, pb.mask_fill, true, true};
            return true;
        }
        if (!pb.bias.data) return false;
    }
    if (!pb.bias.data) return false;
    const Broadcast4& bs = pb.bias;
    const char* base = bs.data + (b * bs.stride[0] + h * bs.stride[1] + i0 * bs.stride[2] + j0 * bs.stride[3]) * bs.item;
    const int distinct_rows = bs.stride[2] ? rows : 1;
    float largest = NEG_INF;
    for (int r = 0; r < distinct_rows; ++r)
        for (int j = 0; j < keys; ++j) {
            const int64_t at = r * bs.stride[2] + j * bs.stride[3];
            const float x = bs.half ? half_to_float(reinterpret_cast<const uint16_t*>(base)[at])
                                    : reinterpret_cast<const float*>(base)[at];
            if (!(x < bias_limit)) return false;  // NaN included
            largest = std::max(largest, x);
        }
    *out = DeferredTile{0, largest, false, some_filled};
    return true;
}

// An upper bound on row r's scores in a tile described by `d`, given |score| <= product_bound.
inline float score_ceiling(const Problem& pb, const DeferredTile& d, float product_bound) {
    if (d.all_filled) return pb.mask_fill;
    if (pb.softcap > 0.0f) product_bound = std::min(product_bound, pb.softcap);
    const float bound = d.ceiling + product_bound;
    return d.some_filled ? nan_max(bound, pb.mask_fill) : bound;
}

// The skipping of padded key groups (the online tiles, or NAIVE_GROUP_KEYS keys) for the query
// rows [i0, i0 + rows) of one head: defer() sets a group aside when its bias or mask puts it
// far below zero, worthless() then tells, given the rows' maxima, whether it weighs exactly 0.
struct PaddingSkip {
    const Problem& pb;
    const Packed& pk;
    Scratch& sc;
    size_t head;
    int b, h, i0, rows;
    bool possible;             // a bias or mask is present
    const float* query_norm;   // per row: |scale| |q| with 1% slack for the products' rounding
    const float* key_norm;     // per group of this kv head: max |k|

    PaddingSkip(const Problem& pb_, const Packed& pk_, Scratch& sc_, size_t head_, int b_, int h_, int i0_,
                int rows_, const float* q)
        : pb(pb_), pk(pk_), sc(sc_), head(head_), b(b_), h(h_), i0(i0_), rows(rows_),
          possible(pb_.bias.data || pb_.mask.data), query_norm(nullptr),
          key_norm(pk_.key_norm.data() + head_ * pk_.groups) {
        sc.deferred.clear();
        if (!possible) return;
        sc.query_norm.resize(rows);
        for (int r = 0; r < rows; ++r)
            sc.query_norm[r] = std::fabs(pb.scale) * 1.01f * max_norm(q + size_t(r) * pb.D, 1, pb.D);
        query_norm = sc.query_norm.data();
    }

    // |score| <= |scale| |q| |k| (Cauchy-Schwarz)
    float product_bound(int r, int group) const { return query_norm[r] * key_norm[group]; }

    // Appends group (keys [j0, j0 + keys)) to sc.deferred when every row's score ceiling there
    // lies SKIP_MARGIN below zero; never a causal group that crosses the diagonal.
    bool defer(int group, int j0, int keys) {
        if (!possible || crosses_frontier(pb, i0, i0 + rows - 1, j0, keys)) return false;
        float largest_product = 0.0f;
        for (int r = 0; r < rows; ++r) largest_product = nan_max(largest_product, product_bound(r, group));
        if (pb.softcap > 0.0f) largest_product = std::min(largest_product, pb.softcap);
        if (largest_product != largest_product) return false;
        DeferredTile d;
        if (!masked_tile(pb, b, h, i0, rows, j0, keys, -SKIP_MARGIN - largest_product, &d)) return false;
        d.tile = group;
        for (int r = 0; r < rows; ++r)
            if (!(score_ceiling(pb, d, product_bound(r, group)) < -SKIP_MARGIN)) return false;
        sc.deferred.push_back(d);
        return true;
    }

    // A deferred group weighs exactly nothing when each row's score ceiling lies SKIP_MARGIN
    // below the row's maximum: every exp is then 0, and (V bounded) so is its P x V term.
    bool worthless(const DeferredTile& d, const float* row_max) const {
        if (!pk.v_bounded[head * pk.groups + d.tile]) return false;
        for (int r = 0; r < rows; ++r)
            if (!(score_ceiling(pb, d, product_bound(r, d.tile)) - row_max[r] < -SKIP_MARGIN)) return false;
        return true;
    }
};

void online_tile(const Problem& pb, const Packed& pk, Scratch& sc, int b, int h, int i0, int rows) {
    const int kv = h / (pb.Hq / pb.Hkv);
    const size_t head = size_t(b) * pb.Hkv + kv;
    const int dvp = pk.dvp, block = pb.block, ld_s = round_up(block, NR);
    const float* q = query_rows(pb, sc, b, h, i0, rows);
    const float* kpack = pk.k.ptr + pk.k_floats * head;
    const float* vpack = pk.v.ptr + pk.v_floats * head;
    // m (running max) is the largest score seen so far in the row; l (running sum) is the sum of
    // exp(score - m) so far; acc holds the output unnormalised, in units of exp(-m).
    float* m = sc.running_max.data();
    float* l = sc.running_sum.data();
    float* acc = sc.acc.ptr;
    std::fill(m, m + rows, NEG_INF);
    std::fill(l, l + rows, 0.0f);
    std::fill(acc, acc + size_t(rows) * dvp, 0.0f);
    const int last_row = i0 + rows - 1;
    const int tiles = skips_causal_keys(pb) ? ceil_div(causal_keys(pb, last_row), block) : pk.tiles;
    const int first_tile = skips_causal_keys(pb) ? std::min(tiles, left_keys(pb, i0) / block) : 0;
    // Padded tiles are set aside; once the others have set m, each is dropped or processed last.
    PaddingSkip skip(pb, pk, sc, head, b, h, i0, rows, q);
    auto process = [&](int t) {
        const int j0 = t * block;
        const int keys = std::min(block, pb.Sk - j0);
        float* s = sc.s.ptr;
        qk_tile(rows, q, pb.D, pb.D, kpack + size_t(t) * pk.tile_floats, ceil_div(keys, NR), s, ld_s, pb.scale);
        // some key here lies right of some row's causal frontier, or left of its window
        const bool diagonal = crosses_frontier(pb, i0, last_row, j0, keys);
        const int width = round_up(keys, W);
        // Two passes over the rows, so that the out-of-order core overlaps the rows' short,
        // dependent chains (max -> reference -> exp -> sum) instead of waiting on each.
        float* tile_max = sc.tile_max.data();
        for (int r = 0; r < rows; ++r)
            tile_max[r] = finish_scores_max(pb, s + size_t(r) * ld_s, keys, width, b, h, i0 + r, j0, diagonal, sc.row);
        online_update_rows(rows, s, ld_s, width, tile_max, m, l, acc, dvp);
        pv_tile(rows, s, ld_s, keys, vpack + size_t(j0) * dvp, dvp, acc);
    };
    for (int t = first_tile; t < tiles; ++t)
        if (!skip.defer(t, t * block, std::min(block, pb.Sk - t * block))) process(t);
    for (const DeferredTile& d : sc.deferred)
        if (!skip.worthless(d, m)) process(d.tile);
    const int first_skipped = std::min(pb.Sk, tiles * block), last_skipped = first_tile * block;  // [0, last) too
    if (skipped_keys_count(pb) && (first_skipped < pb.Sk || last_skipped > 0)) {
        const float* vsum = sc.skipped_sum(pk, head, first_skipped, last_skipped);
        const float count = float(pb.Sk - first_skipped + last_skipped);
        for (int r = 0; r < rows; ++r) {
            const float new_max = nan_max(m[r], pb.mask_fill);
            const float rescale = scalar_exp(m[r] - new_max);
            const float p = scalar_exp(pb.mask_fill - new_max);
            l[r] = l[r] * rescale + count * p;
            float* ar = acc + size_t(r) * dvp;
            for (int c = 0; c < dvp; ++c) ar[c] = ar[c] * rescale + p * vsum[c];
            m[r] = new_max;
        }
    }
    for (int r = 0; r < rows; ++r) {
        float* ar = acc + size_t(r) * dvp;
        const bool zero = pb.zero_rows && l[r] == 0.0f;
        for (int c = 0; c < dvp; ++c) ar[c] = zero ? 0.0f : ar[c] / l[r];
    }
    write_output(pb, acc, dvp, b, h, i0, rows);
}

void naive_tile(const Problem& pb, const Packed& pk, Scratch& sc, int b, int h, int i0, int rows) {
    const int kv = h / (pb.Hq / pb.Hkv);
    const size_t head = size_t(b) * pb.Hkv + kv;
    const int dvp = pk.dvp, ld_s = round_up(pb.Sk, NR);
    const float* q = query_rows(pb, sc, b, h, i0, rows);
    const int last_row = i0 + rows - 1;
    // the rest are right of every row's causal frontier; keys [0, first) (whole groups) left of
    // every row's window
    constexpr int G = NAIVE_GROUP_KEYS;
    const int keys = skips_causal_keys(pb) ? causal_keys(pb, last_row) : pb.Sk;
    const int first = skips_causal_keys(pb) ? std::min(keys, left_keys(pb, i0)) / G * G : 0;
    const int width = round_up(keys, W);
    const bool skipped = skipped_keys_count(pb) && (keys < pb.Sk || first > 0);
    const float count = float(pb.Sk - keys + first);
    if (keys == first && !skipped) {  // no row sees a key (is_causal 2, Sq > Sk) and fill is -inf: 0/0
        const float value = pb.zero_rows ? 0.0f : std::numeric_limits<float>::quiet_NaN();
        std::fill(sc.acc.ptr, sc.acc.ptr + size_t(rows) * dvp, value);
        write_output(pb, sc.acc.ptr, dvp, b, h, i0, rows);
        return;
    }
    float* s = sc.s.ptr;
    float* acc = sc.acc.ptr;
    float* skipped_weight = sc.running_sum.data();
    float* maxima = sc.tile_max.data();
    const float* kpack = pk.k.ptr + pk.k_floats * head;
    auto group_keys = [&](int g) { return std::min(G, keys - g * G); };
    auto scores_of = [&](int g0, int g1) {  // the products of key groups [g0, g1)
        const int j0 = g0 * G, j1 = std::min(keys, g1 * G);
        qk_tile(rows, q, pb.D, pb.D, kpack + size_t(j0 / NR) * pb.D * NR, ceil_div(j1 - j0, NR), s + j0, ld_s,
                pb.scale);
    };
    // Padded groups are set aside (their scores -inf for now); the rest are multiplied in runs.
    PaddingSkip skip(pb, pk, sc, head, b, h, i0, rows, q);
    const int groups = ceil_div(keys, G);
    int run = first / G;
    for (int g = first / G; g < groups; ++g) {
        if (!skip.defer(g, g * G, group_keys(g))) continue;
        if (run < g) scores_of(run, g);
        run = g + 1;
        for (int r = 0; r < rows; ++r) std::fill_n(s + size_t(r) * ld_s + g * G, group_keys(g), NEG_INF);
    }
    if (run < groups) scores_of(run, groups);
    const bool diagonal = crosses_frontier(pb, i0, last_row, first, keys - first);
    // Finishing a -inf score leaves at most what the real one would give, so these maxima leave
    // out the deferred groups: a group is dropped when worthless against them, and otherwise
    // multiplied and finished now, and the maxima taken again.
    for (int r = 0; r < rows; ++r)
        maxima[r] = finish_scores_max(pb, s + size_t(r) * ld_s + first, keys - first, width - first, b, h, i0 + r,
                                      first, diagonal, sc.row);
    bool refinished = false;
    for (DeferredTile& d : sc.deferred) {
        d.dropped = skip.worthless(d, maxima);
        if (d.dropped) continue;
        const int j0 = d.tile * G;
        scores_of(d.tile, d.tile + 1);
        for (int r = 0; r < rows; ++r)
            finish_scores(pb, s + size_t(r) * ld_s + j0, group_keys(d.tile), b, h, i0 + r, j0, false, sc.row);
        refinished = true;
    }
    if (refinished)
        for (int r = 0; r < rows; ++r) maxima[r] = row_max(s + size_t(r) * ld_s + first, width - first);
    for (int r = 0; r < rows; ++r) {
        float* sr = s + size_t(r) * ld_s + first;
        float mx = maxima[r];
        if (skipped) mx = nan_max(mx, pb.mask_fill);
        float sum = exp_row(sr, width - first, mx);
        float skipped_p = 0.0f;
        if (skipped) {
            skipped_p = scalar_exp(pb.mask_fill - mx);
            sum += count * skipped_p;
        }
        const vf total = splat(sum);
        for (int j = 0; j < width - first; j += W) {
            vf p = loadu(sr + j) / total;
            if (pb.zero_rows) p = p != p ? splat(0.0f) : p;
            storeu(sr + j, p);
        }
        skipped_p /= sum;
        if (pb.zero_rows && skipped_p != skipped_p) skipped_p = 0.0f;
        skipped_weight[r] = skipped_p;
    }
    std::fill(acc, acc + size_t(rows) * dvp, 0.0f);
    const float* vpack = pk.v.ptr + pk.v_floats * head;
    int k0 = first;  // P x V over the keys between the dropped groups
    for (const DeferredTile& d : sc.deferred) {
        if (!d.dropped) continue;
        const int j0 = d.tile * G;
        if (k0 < j0) pv_tile(rows, s + k0, ld_s, j0 - k0, vpack + size_t(k0) * dvp, dvp, acc);
        k0 = j0 + group_keys(d.tile);
    }
    if (k0 < keys) pv_tile(rows, s + k0, ld_s, keys - k0, vpack + size_t(k0) * dvp, dvp, acc);
    if (skipped) {
        const float* vsum = sc.skipped_sum(pk, head, keys, first);
        for (int r = 0; r < rows; ++r)
            for (int c = 0; c < dvp; ++c) acc[size_t(r) * dvp + c] += skipped_weight[r] * vsum[c];
    }
    write_output(pb, acc, dvp, b, h, i0, rows);
}

// ---- few query rows (a decode step): K and V read in place, nothing packed ----
// With one or a few query rows per kv head, packing K^T and V would read and write the whole
// cache once more than the attention itself reads it. Here the rows of all query heads of one
// kv head (contiguous in Q and in the output) share one pass over that head's keys: a score is
// a dot product over D of a row-major K row, and P x V reads V rows where they lie (staged in
// small chunks only for float16 or a Dv that is not a whole number of vectors). No padding
// skip (a skipped tile adds exactly 0, so leaving it in changes nothing) and no closed form for
// the causal keys of a finite fill (they are scored as fill, as the spec writes them); causal
// keys right of every row's frontier under a -inf fill are still never read, nor keys left of
// every row's window (under a finite fill: in closed form, their V rows summed only for a row
// that sees no other key).
constexpr int DIRECT_MAX_ROWS = 16;   // (query heads per kv head) x Sq at most, for this path
constexpr int DIRECT_KEY_CHUNK = 256;  // keys staged at a time (float16 K or V, padded V)
// From this many rows on, a key chunk is transposed (D rows of keys) and scored with broadcast
// FMAs instead of one dot product and horizontal sum per (row, key): a whole call at B=1, H=12,
// Sq=Sk=16, D=32 took 19 instead of 22 us (AVX2 build) and 17 instead of 31 us (AVX-512) on a
// quiet Xeon. Below it (a decode step's 1-4 rows) the transpose costs more than it saves.
constexpr int DIRECT_TRANSPOSED_ROWS = 8;

struct DirectScratch {
    AlignedFloats q, s, acc, kstage, kt, vstage;
    std::vector<float> running_max, running_sum, tile_max, row, vsum;
    DirectScratch(const Problem& pb, int rows, int ld_s, int dvp)
        : q(pb.q_half ? size_t(rows) * pb.D : 0),
          s(size_t(rows) * ld_s),
          acc(size_t(rows) * dvp),
          kstage(pb.k_half ? size_t(DIRECT_KEY_CHUNK) * pb.D : 0),
          kt(rows >= DIRECT_TRANSPOSED_ROWS ? size_t(DIRECT_KEY_CHUNK) * pb.D : 0),
          vstage(pb.v_half || pb.Dv != dvp ? size_t(DIRECT_KEY_CHUNK) * dvp : 0),  // see direct_values
          running_max(rows),
          running_sum(rows),
          tile_max(rows) {}
};

// s[r][j] = scale * (q row r) . (k row j), for `keys` row-major keys (row stride D).
void direct_scores(int rows, const float* q, int D, const float* k, int keys, float* s, int ld_s, float scale) {
    for (int j = 0; j < keys; ++j) {
        const float* kj = k + size_t(j) * D;
        for (int r = 0; r < rows; ++r) {
            const float* qr = q + size_t(r) * D;
            vf c0 = vf{}, c1 = vf{};
            int d = 0;
            for (; d + 2 * W <= D; d += 2 * W) {
                c0 += loadu(qr + d) * loadu(kj + d);
                c1 += loadu(qr + d + W) * loadu(kj + d + W);
            }
            if (d + W <= D) {
                c0 += loadu(qr + d) * loadu(kj + d);
                d += W;
            }
            float tail = 0.0f;
            for (; d < D; ++d) tail += qr[d] * kj[d];
            s[size_t(r) * ld_s + j] = (lanes_sum(c0 + c1) + tail) * scale;
        }
    }
}

// s[r][x * W + c] = scale * (q row r) . (key column x * W + c of kt) for R rows, V vectors of keys;
// kt holds D rows of ld_t keys (the chunk transposed), so each product is a broadcast FMA.
template <int R, int V>
inline void transposed_scores_block(const float* q, int D, const float* kt, int ld_t, float* s, int ld_s,
                                    float scale) {
    vf c[R][V] = {};
    for (int d = 0; d < D; ++d) {
        vf kv[V];
        for (int x = 0; x < V; ++x) kv[x] = loadu(kt + size_t(d) * ld_t + x * W);
        for (int r = 0; r < R; ++r) {
            const vf qd = splat(q[size_t(r) * D + d]);
            for (int x = 0; x < V; ++x) c[r][x] += qd * kv[x];
        }
    }
    for (int r = 0; r < R; ++r)
        for (int x = 0; x < V; ++x) storeu(s + size_t(r) * ld_s + x * W, c[r][x] * scale);
}

template <int V>
void transposed_scores_rows(int rows, const float* q, int D, const float* kt, int ld_t, float* s, int ld_s,
                            float scale) {
    // About 8 accumulator chains (FMA latency x throughput), leaving registers for the V loads.
    constexpr int R = V >= 4 ? 2 : V == 3 ? 3 : V == 2 ? 4 : 6;
    int r = 0;
    for (; r + R <= rows; r += R)
        transposed_scores_block<R, V>(q + size_t(r) * D, D, kt, ld_t, s + size_t(r) * ld_s, ld_s, scale);
    for (; r < rows; ++r)
        transposed_scores_block<1, V>(q + size_t(r) * D, D, kt, ld_t, s + size_t(r) * ld_s, ld_s, scale);
}

// direct_scores through a transposed copy of the keys (kt: D x round_up(keys, W) floats). It also
// writes columns [keys, round_up(keys, W)), which finish_scores_max then sets to -inf.
void direct_scores_transposed(int rows, const float* q, int D, const float* k, int keys, float* s, int ld_s,
                              float scale, float* kt) {
    const int width = round_up(keys, W);
    for (int j = 0; j < keys; ++j)
        for (int d = 0; d < D; ++d) kt[size_t(d) * width + j] = k[size_t(j) * D + d];
    for (int j = keys; j < width; ++j)
        for (int d = 0; d < D; ++d) kt[size_t(d) * width + j] = 0.0f;
    int j = 0;
    for (; j + 4 * W <= width; j += 4 * W) transposed_scores_rows<4>(rows, q, D, kt + j, width, s + j, ld_s, scale);
    switch ((width - j) / W) {
        case 3:
            transposed_scores_rows<3>(rows, q, D, kt + j, width, s + j, ld_s, scale);
            break;
        case 2:
            transposed_scores_rows<2>(rows, q, D, kt + j, width, s + j, ld_s, scale);
            break;
        case 1:
            transposed_scores_rows<1>(rows, q, D, kt + j, width, s + j, ld_s, scale);
            break;
        default:
            break;
    }
}

// Keys [j0, j0 + keys) of kv head `head` as float32 rows (in place, or converted into scratch).
const float* direct_keys(const Problem& pb, DirectScratch& sc, size_t head, int j0, int keys) {
    const size_t at = (head * pb.Sk + j0) * pb.D;
    if (!pb.k_half) return static_cast<const float*>(pb.k) + at;
    halves_to_floats(static_cast<const uint16_t*>(pb.k) + at, sc.kstage.ptr, keys * pb.D);
    return sc.kstage.ptr;
}

// V rows [j0, j0 + keys) of kv head `head` as float32 rows of dvp floats (in place when they are).
const float* direct_values(const Problem& pb, DirectScratch& sc, size_t head, int j0, int keys, int dvp) {
    const size_t at = (head * pb.Sk + j0) * pb.Dv;
    if (!pb.v_half && pb.Dv == dvp) return static_cast<const float*>(pb.v) + at;
    for (int j = 0; j < keys; ++j) {
        float* dst = sc.vstage.ptr + size_t(j) * dvp;
        if (pb.v_half)
            halves_to_floats(static_cast<const uint16_t*>(pb.v) + at + size_t(j) * pb.Dv, dst, pb.Dv);
        else
            std::memcpy(dst, static_cast<const float*>(pb.v) + at + size_t(j) * pb.Dv, sizeof(float) * pb.Dv);
        std::fill(dst + pb.Dv, dst + dvp, 0.0f);
    }
    return sc.vstage.ptr;
}

// Scores of keys [j0, j0 + keys) into s (column 0 is key j0).
void direct_score_keys(const Problem& pb, DirectScratch& sc, size_t head, const float* q, int rows, int j0, int keys,
                       float* s, int ld_s) {
    for (int c = 0; c < keys; c += DIRECT_KEY_CHUNK) {
        const int n = std::min(DIRECT_KEY_CHUNK, keys - c);
        const float* k = direct_keys(pb, sc, head, j0 + c, n);
        if (rows >= DIRECT_TRANSPOSED_ROWS)
            direct_scores_transposed(rows, q, pb.D, k, n, s + c, ld_s, pb.scale, sc.kt.ptr);
        else
            direct_scores(rows, q, pb.D, k, n, s + c, ld_s, pb.scale);
    }
}

// acc += P x V over keys [j0, j0 + keys) (p column 0 is key j0).
void direct_pv_keys(const Problem& pb, DirectScratch& sc, size_t head, int rows, const float* p, int ld_p, int j0,
                    int keys, int dvp, float* acc) {
    for (int c = 0; c < keys; c += DIRECT_KEY_CHUNK) {
        const int n = std::min(DIRECT_KEY_CHUNK, keys - c);
        pv_tile(rows, p + c, ld_p, n, direct_values(pb, sc, head, j0 + c, n, dvp), dvp, acc);
    }
}

// The sum of V rows [0, count) of kv head `head` (padded to dvp): the keys left of a window under
// a finite fill, entered in closed form; read only where some row's weight for them is not 0.
const float* direct_left_sum(const Problem& pb, DirectScratch& sc, size_t head, int count, int dvp) {
    sc.vsum.assign(dvp, 0.0f);
    for (int c = 0; c < count; c += DIRECT_KEY_CHUNK) {
        const int n = std::min(DIRECT_KEY_CHUNK, count - c);
        const float* v = direct_values(pb, sc, head, c, n, dvp);
        for (int j = 0; j < n; ++j)
            for (int d = 0; d < dvp; ++d) sc.vsum[d] += v[size_t(j) * dvp + d];
    }
    return sc.vsum.data();
}

// Every query row of kv head `kv` of batch b: rows r = (query head - first head) * Sq + i.
void direct_head(const Problem& pb, DirectScratch& sc, int b, int kv) {
    const int group = pb.Hq / pb.Hkv, rows = group * pb.Sq, h0 = kv * group;
    const size_t head = size_t(b) * pb.Hkv + kv;
    const int dvp = round_up(pb.Dv, W);
    auto head_of = [&](int r) { return h0 + r / pb.Sq; };
    auto query_of = [&](int r) { return r % pb.Sq; };
    const size_t q_at = (size_t(b) * pb.Hq + h0) * pb.Sq * pb.D;
    const float* q = static_cast<const float*>(pb.q) + q_at;
    if (pb.q_half) {
        halves_to_floats(static_cast<const uint16_t*>(pb.q) + q_at, sc.q.ptr, rows * pb.D);
        q = sc.q.ptr;
    }
    // Under a -inf fill (or none skipped at all) keys right of the last row's frontier, and keys
    // left of the first row's window, weigh 0: keys [first, keys) are read. Under a finite fill
    // the keys left of the window (`closed`) are scored as fill in closed form: count * exp(fill -
    // max), and that weight times the sum of their V rows, read only where it is not 0 (a row
    // that sees no other key); the keys right of the frontier are scored as fill one by one.
    const bool skip = skips_causal_keys(pb) && !skipped_keys_count(pb);
    const bool closed = skipped_keys_count(pb) && pb.windowed;
    const int keys = skip ? causal_keys(pb, pb.Sq - 1) : pb.Sk;
    const int first = skip || closed ? std::min(keys, left_keys(pb, 0)) : 0;
    float* acc = sc.acc.ptr;
    if (keys == first && !closed) {  // no row sees a key (is_causal 2, Sq > Sk) and fill is -inf: 0/0
        const float value = pb.zero_rows ? 0.0f : std::numeric_limits<float>::quiet_NaN();
        std::fill(acc, acc + size_t(rows) * dvp, value);
        write_output(pb, acc, dvp, b, h0, 0, rows);
        return;
    }
    float* s = sc.s.ptr;
    std::fill(acc, acc + size_t(rows) * dvp, 0.0f);
    if (!pb.online) {
        // column 0 of s is key `first`
        const int ld_s = round_up(pb.Sk, W), n = keys - first, width = round_up(n, W);
        direct_score_keys(pb, sc, head, q, rows, first, n, s, ld_s);
        const bool diagonal = crosses_frontier(pb, 0, pb.Sq - 1, first, n);
        float* left_weight = sc.running_sum.data();  // per row: the weight of each key left of the window
        bool left_read = false;
        for (int r = 0; r < rows; ++r) {
            float* sr = s + size_t(r) * ld_s;
            float mx = finish_scores_max(pb, sr, n, width, b, head_of(r), query_of(r), first, diagonal, sc.row);
            if (closed && first > 0) mx = nan_max(mx, pb.mask_fill);
            float sum = exp_row(sr, width, mx);
            float lp = 0.0f;
            if (closed && first > 0) {
                lp = scalar_exp(pb.mask_fill - mx);
                sum += float(first) * lp;
            }
            const vf total = splat(sum);
            for (int j = 0; j < width; j += W) {
                vf p = loadu(sr + j) / total;
                if (pb.zero_rows) p = p != p ? splat(0.0f) : p;
                storeu(sr + j, p);
            }
            lp /= sum;
            if (pb.zero_rows && lp != lp) lp = 0.0f;
            left_weight[r] = lp;
            left_read |= lp != 0.0f;
        }
        if (n > 0) direct_pv_keys(pb, sc, head, rows, s, ld_s, first, n, dvp, acc);
        if (left_read) {
            const float* vsum = direct_left_sum(pb, sc, head, first, dvp);
            for (int r = 0; r < rows; ++r)
                for (int c = 0; c < dvp; ++c) acc[size_t(r) * dvp + c] += left_weight[r] * vsum[c];
        }
        write_output(pb, acc, dvp, b, h0, 0, rows);
        return;
    }
    // Online: one pass over key tiles of `block`, running max m and sum l per row, as online_tile.
    const int block = pb.block, ld_s = round_up(block, W);
    float* m = sc.running_max.data();
    float* l = sc.running_sum.data();
    float* tile_max = sc.tile_max.data();
    std::fill(m, m + rows, NEG_INF);
    std::fill(l, l + rows, 0.0f);
    const int tiles = ceil_div(keys, block);
    for (int t = first / block; t < tiles; ++t) {
        const int j0 = t * block;
        const int tile_keys = std::min(block, pb.Sk - j0);
        const int width = round_up(tile_keys, W);
        direct_score_keys(pb, sc, head, q, rows, j0, tile_keys, s, ld_s);
        const bool diagonal = crosses_frontier(pb, 0, pb.Sq - 1, j0, tile_keys);
        for (int r = 0; r < rows; ++r)
            tile_max[r] = finish_scores_max(pb, s + size_t(r) * ld_s, tile_keys, width, b, head_of(r), query_of(r), j0,
                                            diagonal, sc.row);
        online_update_rows(rows, s, ld_s, width, tile_max, m, l, acc, dvp);
        direct_pv_keys(pb, sc, head, rows, s, ld_s, j0, tile_keys, dvp, acc);
    }
    const int left_count = closed ? first / block * block : 0;  // whole tiles before the first read
    if (left_count > 0) {
        float* weight = tile_max;  // per row: exp(fill - m), the weight of each key left of the window
        bool left_read = false;
        for (int r = 0; r < rows; ++r) {
            const float new_max = nan_max(m[r], pb.mask_fill);
            const float rescale = scalar_exp(m[r] - new_max);
            weight[r] = scalar_exp(pb.mask_fill - new_max);
            l[r] = l[r] * rescale + float(left_count) * weight[r];
            float* ar = acc + size_t(r) * dvp;
            if (rescale != 1.0f)
                for (int c = 0; c < dvp; ++c) ar[c] *= rescale;
            m[r] = new_max;
            left_read |= weight[r] != 0.0f;
        }
        if (left_read) {
            const float* vsum = direct_left_sum(pb, sc, head, left_count, dvp);
            for (int r = 0; r < rows; ++r)
                for (int c = 0; c < dvp; ++c) acc[size_t(r) * dvp + c] += weight[r] * vsum[c];
        }
    }
    for (int r = 0; r < rows; ++r) {
        float* ar = acc + size_t(r) * dvp;
        const bool zero = pb.zero_rows && l[r] == 0.0f;
        for (int c = 0; c < dvp; ++c) ar[c] = zero ? 0.0f : ar[c] / l[r];
    }
    write_output(pb, acc, dvp, b, h0, 0, rows);
}

bool run_direct(const Problem& pb) {
    const int rows = pb.Hq / pb.Hkv * pb.Sq, dvp = round_up(pb.Dv, W);
    const int ld_s = pb.online ? round_up(pb.block, W) : round_up(pb.Sk, W);
    return parallel_items(pb.B * pb.Hkv, pb.threads, [&]() {
        return [&, sc = std::make_shared<DirectScratch>(pb, rows, ld_s, dvp)](int item) {
            direct_head(pb, *sc, item / pb.Hkv, item % pb.Hkv);
        };
    });
}

bool run_problem(const Problem& pb) {
    if (pb.Hq / pb.Hkv * pb.Sq <= DIRECT_MAX_ROWS) return run_direct(pb);
    const int key_tile = pb.online ? std::min(pb.block, pb.Sk) : pb.Sk;
    Packed pk(pb, key_tile, pb.online ? key_tile : NAIVE_GROUP_KEYS, skipped_keys_count(pb),
              skipped_keys_count(pb) && pb.windowed);
    const bool packed = parallel_items(pb.B * pb.Hkv, pb.threads, [&]() {
        return [&, row = std::vector<float>()](int bh) mutable { pack_head(pb, pk, bh, row); };
    });
    if (!packed) return false;
    const int q_tiles = ceil_div(pb.Sq, pb.query_tile);
    const int ld_s = pb.online ? round_up(pb.block, NR) : round_up(pb.Sk, NR);
    // Items run from the last query tile down: with is_causal those are the longest.
    return parallel_items(pb.B * pb.Hq * q_tiles, pb.threads, [&]() {
        return [&, sc = std::make_shared<Scratch>(pb, ld_s, pk.dvp)](int item) {
            const int t = q_tiles - 1 - item % q_tiles;
            const int bh = item / q_tiles;
            const int b = bh / pb.Hq, h = bh % pb.Hq;
            const int i0 = t * pb.query_tile;
            const int rows = std::min(pb.query_tile, pb.Sq - i0);
            if (pb.online)
                online_tile(pb, pk, *sc, b, h, i0, rows);
            else
                naive_tile(pb, pk, *sc, b, h, i0, rows);
        };
    });
}

// ---- Python interface ----

struct Buffer {  // a Py_buffer released on scope exit
    Py_buffer view{};
    bool held = false;
    bool get(PyObject* obj, int flags) {
        held = PyObject_GetBuffer(obj, &view, flags) == 0;
        return held;
    }
    ~Buffer() {
        if (held) PyBuffer_Release(&view);
    }
    char kind() const {  // the struct format letter, byte-order prefix skipped
        const char* f = view.format ? view.format : "B";
        while (*f == '@' || *f == '=' || *f == '<') ++f;
        return *f;
    }
};

bool float_kind(const Buffer& b, const char* name, bool* half) {
    const char kind = b.kind();
    if (kind == 'f' && b.view.itemsize == 4) {
        *half = false;
        return true;
    }
    if (kind == 'e' && b.view.itemsize == 2) {
        *half = true;
        return true;
    }
    PyErr_Format(PyExc_TypeError, "%s must be float32 or float16 (buffer format '%s')", name,
                 b.view.format ? b.view.format : "B");
    return false;
}

bool four_d(const Buffer& b, const char* name) {
    if (b.view.ndim != 4) {
        PyErr_Format(PyExc_ValueError, "%s must be 4-D, got %d dimensions", name, b.view.ndim);
        return false;
    }
    return true;
}

// bias or mask: 4-D, each axis 1 (broadcast, stride 0) or the scores' size.
bool broadcast_operand(const Buffer& b, const char* name, const Py_ssize_t* scores, Broadcast4* out) {
    if (!four_d(b, name)) return false;
    out->data = static_cast<const char*>(b.view.buf);
    out->item = int(b.view.itemsize);
    for (int a = 0; a < 4; ++a) {
        const Py_ssize_t n = b.view.shape[a];
        if (n != 1 && n != scores[a]) {
            PyErr_Format(PyExc_ValueError, "%s axis %d has size %zd; want 1 or %zd", name, a, n, scores[a]);
            return false;
        }
        if (b.view.strides[a] % b.view.itemsize) {
            PyErr_Format(PyExc_ValueError, "%s has a stride that is not a whole number of elements", name);
            return false;
        }
        out->stride[a] = n == 1 ? 0 : b.view.strides[a] / b.view.itemsize;
    }
    return true;
}

PyObject* py_flash_attention(PyObject*, PyObject* args, PyObject* kwargs) {
    static const char* keywords[] = {"q", "k", "v", "out", "bias", "mask", "scale", "is_causal", "mask_fill",
                                     "zero_rows", "softcap", "online", "block_size", "query_tile", "threads",
                                     "bias_after_mask", "window_left", "window_right", nullptr};
    PyObject *q_obj, *k_obj, *v_obj, *out_obj, *bias_obj, *mask_obj;
    double scale, mask_fill, softcap;
    int causal, zero_rows, online, block, query_tile, threads, bias_after_mask = 0, window_left = -1,
                                                                   window_right = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOOOdidpdpiii|pii", const_cast<char**>(keywords), &q_obj,
                                     &k_obj, &v_obj, &out_obj, &bias_obj, &mask_obj, &scale, &causal, &mask_fill,
                                     &zero_rows, &softcap, &online, &block, &query_tile, &threads, &bias_after_mask,
                                     &window_left, &window_right))
        return nullptr;
    if (causal < 0 || causal > 2) {
        PyErr_SetString(PyExc_ValueError, "is_causal must be 0, 1 or 2");
        return nullptr;
    }
    if (window_left < -1 || window_right < -1) {
        PyErr_SetString(PyExc_ValueError, "window_left and window_right must be -1 (unbounded) or >= 0");
        return nullptr;
    }
    Buffer q, k, v, out, bias, mask;
    const int dense = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT;
    if (!q.get(q_obj, dense) || !k.get(k_obj, dense) || !v.get(v_obj, dense) ||
        !out.get(out_obj, dense | PyBUF_WRITABLE))
        return nullptr;
    Problem pb{};
    if (!four_d(q, "q") || !four_d(k, "k") || !four_d(v, "v") || !four_d(out, "out")) return nullptr;
    if (!float_kind(q, "q", &pb.q_half) || !float_kind(k, "k", &pb.k_half) || !float_kind(v, "v", &pb.v_half))
        return nullptr;
    bool out_half = false;
    if (!float_kind(out, "out", &out_half)) return nullptr;
    const Py_ssize_t* qs = q.view.shape;
    const Py_ssize_t* ks = k.view.shape;
    const Py_ssize_t* vs = v.view.shape;
    const Py_ssize_t* os = out.view.shape;
    const bool shapes_ok = ks[0] == qs[0] && vs[0] == qs[0] && vs[1] == ks[1] && vs[2] == ks[2] && ks[3] == qs[3] &&
                           ks[1] > 0 && qs[1] % ks[1] == 0 && os[0] == qs[0] && os[1] == qs[1] && os[2] == qs[2] &&
                           os[3] == vs[3] && out_half == pb.q_half;
    if (!shapes_ok) {
        PyErr_SetString(PyExc_ValueError,
                        "shapes must be q [B,Hq,Sq,D], k [B,Hkv,Sk,D], v [B,Hkv,Sk,Dv], out [B,Hq,Sq,Dv] (Q's "
                        "dtype), Hq a multiple of Hkv");
        return nullptr;
    }
    for (int a = 0; a < 4; ++a)
        if (qs[a] <= 0 || ks[a] <= 0 || vs[a] <= 0 || qs[a] > INT32_MAX / 4 || ks[a] > INT32_MAX / 4) {
            PyErr_SetString(PyExc_ValueError, "every dimension must be positive (and below 2^29)");
            return nullptr;
        }
    if (block < 1 || query_tile < 1 || threads < 1) {
        PyErr_SetString(PyExc_ValueError, "block_size, query_tile and threads must be positive");
        return nullptr;
    }
    const Py_ssize_t scores[4] = {qs[0], qs[1], qs[2], ks[2]};
    const int strided = PyBUF_STRIDES | PyBUF_FORMAT;
    if (bias_obj != Py_None) {
        if (!bias.get(bias_obj, strided) || !float_kind(bias, "bias", &pb.bias.half) ||
            !broadcast_operand(bias, "bias", scores, &pb.bias))
            return nullptr;
    }
    if (mask_obj != Py_None) {
        if (!mask.get(mask_obj, strided)) return nullptr;
        if (mask.kind() != '?' || mask.view.itemsize != 1) {
            PyErr_SetString(PyExc_TypeError, "mask must be a bool array");
            return nullptr;
        }
        if (!broadcast_operand(mask, "mask", scores, &pb.mask)) return nullptr;
    }
    pb.B = int(qs[0]);
    pb.Hq = int(qs[1]);
    pb.Sq = int(qs[2]);
    pb.D = int(qs[3]);
    pb.Hkv = int(ks[1]);
    pb.Sk = int(ks[2]);
    pb.Dv = int(vs[3]);
    pb.q = q.view.buf;
    pb.k = k.view.buf;
    pb.v = v.view.buf;
    pb.out = out.view.buf;
    pb.scale = float(scale);
    pb.mask_fill = float(mask_fill);
    pb.softcap = float(softcap);
    // spec.key_bounds: position p = i + (Sk - Sq under is_causal 2, else 0); keys j <= p under
    // is_causal, j <= p + window_right under a window without it (the same right frontier, moved),
    // and j >= p - window_left.
    const int position = causal == 2 ? pb.Sk - pb.Sq : 0;
    pb.causal = causal != 0 || window_right >= 0;
    pb.causal_offset = causal != 0 ? position : position + window_right;
    pb.windowed = window_left >= 0;
    pb.left_offset = position - window_left;
    pb.bias_after_mask = bias_after_mask != 0;
    pb.zero_rows = zero_rows != 0;
    pb.online = online != 0;
    pb.block = std::min(block, pb.Sk);  // one tile holds every key when block_size >= Sk
    pb.query_tile = query_tile;
    // A thread costs tens of microseconds to start: give each at least ~4M multiply-adds.
    const double multiply_adds = double(pb.B) * pb.Hq * pb.Sq * pb.Sk * (pb.D + pb.Dv);
    pb.threads = int(std::max(1.0, std::min(double(threads), multiply_adds / double(1 << 22))));
    bool ok = false;
    Py_BEGIN_ALLOW_THREADS
    try {
        ok = run_problem(pb);
    } catch (const std::exception&) {
        ok = false;
    }
    Py_END_ALLOW_THREADS
    if (!ok) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

PyObject* py_cpu_features(PyObject*, PyObject*) {
    // What this CPU (and the OS, for the AVX register state) supports, for the ISA choice.
    PyObject* names = PyList_New(0);
    if (!names) return nullptr;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    const struct {
        const char* name;
        bool present;
    } features[] = {
        {"sse2", bool(__builtin_cpu_supports("sse2"))},         {"avx", bool(__builtin_cpu_supports("avx"))},
        {"avx2", bool(__builtin_cpu_supports("avx2"))},         {"fma", bool(__builtin_cpu_supports("fma"))},
        {"f16c", bool(__builtin_cpu_supports("f16c"))},         {"avx512f", bool(__builtin_cpu_supports("avx512f"))},
        {"avx512dq", bool(__builtin_cpu_supports("avx512dq"))}, {"avx512vl", bool(__builtin_cpu_supports("avx512vl"))},
        {"avx512bw", bool(__builtin_cpu_supports("avx512bw"))},
    };
    for (const auto& f : features) {
        if (!f.present) continue;
        PyObject* s = PyUnicode_FromString(f.name);
        if (!s || PyList_Append(names, s) < 0) {
            Py_XDECREF(s);
            Py_DECREF(names);
            return nullptr;
        }
        Py_DECREF(s);
    }
#endif
    return names;
}

PyMethodDef methods[] = {
    {"flash_attention", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(py_flash_attention)),
     METH_VARARGS | METH_KEYWORDS,
     "flash_attention(q, k, v, out, bias, mask, scale, is_causal (0/1/2), mask_fill, zero_rows, softcap, online, "
     "block_size, query_tile, threads, bias_after_mask=False, window_left=-1, window_right=-1)\n\nWrites FlashAttention of q, k, v into out (see ortflash.kernels.cpu)."},
    {"cpu_features", py_cpu_features, METH_NOARGS, "The x86 features this CPU and OS support, as names."},
    {nullptr, nullptr, 0, nullptr},
};

#define ORTFLASH_STR2(x) #x
#define ORTFLASH_STR(x) ORTFLASH_STR2(x)
#define ORTFLASH_CAT2(a, b) a##b
#define ORTFLASH_CAT(a, b) ORTFLASH_CAT2(a, b)

PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, ORTFLASH_STR(ORTFLASH_MODULE_NAME),
    "FlashAttention CPU kernel (one ISA build); use ortflash.kernels.cpu.", -1, methods, nullptr, nullptr, nullptr,
    nullptr,
};

}  // namespace

PyMODINIT_FUNC ORTFLASH_CAT(PyInit_, ORTFLASH_MODULE_NAME)(void) {
    PyObject* m = PyModule_Create(&module_def);
    if (!m) return nullptr;
    if (PyModule_AddStringConstant(m, "ISA", ISA_NAME) < 0 || PyModule_AddIntConstant(m, "VECTOR_FLOATS", W) < 0) {
        Py_DECREF(m);
        return nullptr;
    }
    return m;
}
