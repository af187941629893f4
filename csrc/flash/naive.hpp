// The naive path: the softmax over the whole score row of a query tile.
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
    float* row_sum = sc.running_max.data();  // per row: the sum the output row is divided by (1: done in P)
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
        row_sum[r] = normalise_row(sr, width - first, sum, pb.zero_rows, skipped_p);
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
    divide_rows(acc, rows, dvp, row_sum);
    write_output(pb, acc, dvp, b, h, i0, rows);
}

}  // namespace
