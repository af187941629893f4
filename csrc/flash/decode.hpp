// The decode path: few query rows per kv head, K and V read in place, nothing packed.
// Part of csrc/flash_attention.hpp (one translation unit per ISA build); it includes the standard headers.
#pragma once

#include "simd.hpp"
#include "problem.hpp"
#include "threads.hpp"
#include "pack.hpp"
#include "scores.hpp"
#include "scratch.hpp"
#include "bounds.hpp"
#include "online.hpp"

namespace {

// ---- few query rows (a decode step, a short prefill): K and V read in place, nothing packed ----
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
// (query heads per kv head) x Sq at most, for this path. Up to 64 rows it beats packing K^T and V
// for the tiled path also for a prefill (one pass over a small score tile, every row of a head at
// once): B=1, H=12, D=32 at S=32 40 instead of 49 us, S=64 121 instead of 141 us (AVX-512 build, one
// thread); at 96-128 rows the two are within 5% and the tiled path keeps its padding skip.
constexpr int DIRECT_MAX_ROWS = 64;
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

// The last rows (fewer than R) of transposed_scores_rows: the block of exactly that many rows.
template <int R, int V>
inline void transposed_scores_rest(int rows, const float* q, int D, const float* kt, int ld_t, float* s, int ld_s,
                                   float scale) {
    if constexpr (R > 0) {
        if (rows == R)
            transposed_scores_block<R, V>(q, D, kt, ld_t, s, ld_s, scale);
        else
            transposed_scores_rest<R - 1, V>(rows, q, D, kt, ld_t, s, ld_s, scale);
    }
}

// 12 accumulators (6 rows x 2 vectors, or 12 rows x 1) with the loaded key vectors and one
// broadcast in 16 registers, as qk_block: 3 loads per 4 FMAs. The 2 x 4 block it replaces
// loaded 6 per 8, and B=1, H=12, D=32 spent more on its scores than on P x V at S = 32.
template <int V>
void transposed_scores_rows(int rows, const float* q, int D, const float* kt, int ld_t, float* s, int ld_s,
                            float scale) {
    constexpr int R = V == 2 ? 6 : 12;
    int r = 0;
    for (; r + R <= rows; r += R)
        transposed_scores_block<R, V>(q + size_t(r) * D, D, kt, ld_t, s + size_t(r) * ld_s, ld_s, scale);
    transposed_scores_rest<R - 1, V>(rows - r, q + size_t(r) * D, D, kt, ld_t, s + size_t(r) * ld_s, ld_s, scale);
}

// direct_scores through a transposed copy of the keys (kt: D x round_up(keys, W) floats). It also
// writes columns [keys, round_up(keys, W)), which finish_scores_max then sets to -inf.
void direct_scores_transposed(int rows, const float* q, int D, const float* k, int keys, float* s, int ld_s,
                              float scale, float* kt) {
    const int width = round_up(keys, W);
    int j = 0;
    if (TRANSPOSE8 && D % 8 == 0)
        for (; j + 8 <= keys; j += 8)
            for (int d0 = 0; d0 < D; d0 += 8) transpose_keys8(k + size_t(j) * D, D, d0, kt, width, j);
    for (; j < keys; ++j)
        for (int d = 0; d < D; ++d) kt[size_t(d) * width + j] = k[size_t(j) * D + d];
    for (j = keys; j < width; ++j)
        for (int d = 0; d < D; ++d) kt[size_t(d) * width + j] = 0.0f;
    j = 0;
    for (; j + 2 * W <= width; j += 2 * W) transposed_scores_rows<2>(rows, q, D, kt + j, width, s + j, ld_s, scale);
    if (j < width) transposed_scores_rows<1>(rows, q, D, kt + j, width, s + j, ld_s, scale);
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
        float* row_sum = sc.running_max.data();      // per row: what normalise_row left to the output
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
            row_sum[r] = normalise_row(sr, width, sum, pb.zero_rows, lp);
            left_weight[r] = lp;
            left_read |= lp != 0.0f;
        }
        if (n > 0) direct_pv_keys(pb, sc, head, rows, s, ld_s, first, n, dvp, acc);
        if (left_read) {
            const float* vsum = direct_left_sum(pb, sc, head, first, dvp);
            for (int r = 0; r < rows; ++r)
                for (int c = 0; c < dvp; ++c) acc[size_t(r) * dvp + c] += left_weight[r] * vsum[c];
        }
        divide_rows(acc, rows, dvp, row_sum);
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

}  // namespace
