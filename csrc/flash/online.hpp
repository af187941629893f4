// The online path: the softmax over one key tile at a time, with running max and sum.
// Part of csrc/flash_attention.hpp (one translation unit per ISA build); it includes the standard headers.
#pragma once

#include "simd.hpp"
#include "tiles.hpp"
#include "problem.hpp"
#include "pack.hpp"
#include "scores.hpp"
#include "scratch.hpp"
#include "bounds.hpp"
#include "padding.hpp"

namespace {

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
    // Keys [j0, j0 + keys) of one tile: the whole tile, its unpadded head, or one set-aside group.
    auto process = [&](int j0, int keys) {
        const int t = j0 / block;  // a group starts on a panel of its tile (block % group == 0)
        float* s = sc.s.ptr;
        qk_tile(rows, q, pb.D, pb.D, kpack + size_t(t) * pk.tile_floats + size_t(j0 - t * block) * pb.D,
                ceil_div(keys, NR), s, ld_s, pb.scale);
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
    // A padded tail is set aside group by group from the tile's end (a padding mask keeps a
    // prefix of the keys, so a tile that holds the last kept key is mostly padded past it), the
    // rest of the tile processed now; a set-aside group weighs exactly nothing or comes last.
    const int group = pk.group_keys;
    for (int t = first_tile; t < tiles; ++t) {
        const int j0 = t * block, end = std::min(j0 + block, pb.Sk);
        int kept = end;
        while (kept > j0) {
            const int g0 = (kept - 1) / group * group;
            if (!skip.defer(g0 / group, g0, kept - g0)) break;
            kept = g0;
        }
        if (kept > j0) process(j0, kept - j0);
    }
    for (const DeferredTile& d : sc.deferred)
        if (!skip.worthless(d, m)) process(d.tile * group, std::min(group, pb.Sk - d.tile * group));
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

}  // namespace
