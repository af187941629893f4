// Packing: K^T panels, padded V rows, V suffix/prefix sums and per-group key norms, once per (batch, kv head).
// Part of csrc/flash_attention.hpp (one translation unit per ISA build); it includes the standard headers.
#pragma once

#include "simd.hpp"
#include "problem.hpp"

namespace {

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
    // ONLINE_GROUP_KEYS keys of an online tile (or the tile), or NAIVE_GROUP_KEYS keys in the
    // naive mode (which packs one tile of Sk).
    int group_keys, groups;  // keys per group, groups per kv head
    bool bounds;             // key_norm and v_bounded are filled (a bias or mask: PaddingSkip reads them)
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
          bounds(pb.bias.data || pb.mask.data),
          key_norm(size_t(groups) * pb.B * pb.Hkv),
          v_bounded(size_t(groups) * pb.B * pb.Hkv) {}
};

// A V value this large could overflow the accumulator when an earlier tile's weight is
// rescaled by 0; below it, a weight of exactly 0 adds exactly 0.
constexpr float V_SKIPPABLE_LIMIT = 1e30f;
// Keys per group that the naive mode may skip: a multiple of NR for every ISA build.
constexpr int NAIVE_GROUP_KEYS = 64;
static_assert(NAIVE_GROUP_KEYS % NR == 0 && NAIVE_GROUP_KEYS % W == 0, "groups must be whole panels");
// Keys per group that the online mode may skip, where its tile holds a whole number of them
// (else a group is the tile): smaller than the tile, so that the padded tail of the tile that
// holds the last kept key is skipped too (S = 256 with a third padded: 1.66 -> 1.35 ms).
constexpr int ONLINE_GROUP_KEYS = 32;
static_assert(ONLINE_GROUP_KEYS % NR == 0 && ONLINE_GROUP_KEYS % W == 0, "groups must be whole panels");
inline int online_group_keys(int block) { return block % ONLINE_GROUP_KEYS == 0 ? ONLINE_GROUP_KEYS : block; }

// The sum of squares of d floats, in vector lanes: a scalar sum is one serial chain of d
// dependent adds (no -ffast-math, so GCC keeps it), which made the key and query norms of the
// padding skip ~40% of a call at S = 64, H = 12, D = 32. The norms only bound the scores (with
// 1% slack), so the lane order's different rounding does not matter. NaN and inf propagate.
inline float sum_squares(const float* x, int d) {
    vf a0 = vf{}, a1 = vf{};
    int c = 0;
    for (; c + 2 * W <= d; c += 2 * W) {
        const vf x0 = loadu(x + c), x1 = loadu(x + c + W);
        a0 += x0 * x0;
        a1 += x1 * x1;
    }
    for (; c + W <= d; c += W) {
        const vf x0 = loadu(x + c);
        a0 += x0 * x0;
    }
    float sum = lanes_sum(a0 + a1);
    for (; c < d; ++c) sum += x[c] * x[c];
    return sum;
}

// The largest Euclidean norm of n vectors of length d (row stride d); NaN when any element is.
inline float max_norm(const float* x, int n, int d) {
    float largest = 0.0f;
    for (int j = 0; j < n; ++j) {
        const float sum = sum_squares(x + size_t(j) * d, d);
        if (sum != sum) return sum;
        largest = std::max(largest, sum);
    }
    return std::sqrt(largest);
}

// Columns [c0, c0 + 8) of rows [d0, d0 + 8) of a transposed key block (row stride ld: NR in a K^T
// panel, the chunk's width in decode's kt) from 8 key rows (row stride D): an 8 x 8 transpose in
// registers. Element for element the same copy as the scalar loops it replaces.
#if defined(__AVX__) && !defined(__AVX512F__)
inline void transpose_keys8(const float* src, int D, int d0, float* panel, int ld, int c0) {
    __m256 r[8], t[8];
    for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + size_t(i) * D + d0);
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        r[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
        r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xee);
        r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xee);
    }
    for (int i = 0; i < 4; ++i) {  // row d0 + i: keys 0-3 from r[i], 4-7 from r[i + 4]; rows d0 + 4 + i alike
        _mm256_storeu_ps(panel + size_t(d0 + i) * ld + c0, _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
        _mm256_storeu_ps(panel + size_t(d0 + 4 + i) * ld + c0, _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
    }
}
constexpr bool TRANSPOSE8 = true;
#else
inline void transpose_keys8(const float*, int, int, float*, int, int) {}
constexpr bool TRANSPOSE8 = false;
#endif

// Whether every value of v[0..n) (n a multiple of W) is finite and below V_SKIPPABLE_LIMIT in magnitude.
inline bool all_bounded(const float* v, size_t n) {
    vi ok = vi{} - 1;
    const vf limit = splat(V_SKIPPABLE_LIMIT);
    for (size_t c = 0; c < n; c += W) {
        const vf x = loadu(v + c);
        ok &= (x < limit) & (x > -limit);  // false for inf and NaN
    }
    bool all = true;
    for (int l = 0; l < W; ++l) all &= ok[l] != 0;
    return all;
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
        const float* kf = pb.k_half ? nullptr : static_cast<const float*>(pb.k) + (size_t(bh) * Sk + j0) * D;
        int j = 0;
        if (TRANSPOSE8 && kf && D % 8 == 0 && NR % 8 == 0)  // whole groups of 8 keys, 8 dims at a time
            for (; j + 8 <= keys; j += 8)
                for (int d0 = 0; d0 < D; d0 += 8)
                    transpose_keys8(kf + size_t(j) * D, D, d0, tile + size_t(j / NR) * D * NR, NR, j % NR);
        for (; j < keys; ++j) {
            const size_t at = (size_t(bh) * Sk + j0 + j) * D;
            const float* src = row.data();
            if (pb.k_half)
                halves_to_floats(static_cast<const uint16_t*>(pb.k) + at, row.data(), D);
            else
                src = static_cast<const float*>(pb.k) + at;
            float* __restrict panel = tile + size_t(j / NR) * D * NR + j % NR;
            for (int d = 0; d < D; ++d) panel[d * NR] = src[d];
        }
        if (!pk.bounds) continue;
        for (int jj = 0; jj < keys; ++jj) {
            const size_t at = (size_t(bh) * Sk + j0 + jj) * D;
            const float* src = row.data();
            if (pb.k_half)
                halves_to_floats(static_cast<const uint16_t*>(pb.k) + at, row.data(), D);
            else
                src = static_cast<const float*>(pb.k) + at;
            const float norm = max_norm(src, 1, D);
            const int key = j0 + jj;
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
    if (pk.bounds)
        for (int g = 0; g < pk.groups; ++g) {
            const int j0 = g * pk.group_keys, keys = std::min(pk.group_keys, Sk - j0);
            pk.v_bounded[size_t(bh) * pk.groups + g] = all_bounded(vdst + size_t(j0) * dvp, size_t(keys) * dvp);
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

}  // namespace
