// The padding skip: key groups a bias or mask pushes far below the row maxima, set aside and dropped when provably worthless.
// Part of csrc/flash_attention.hpp (one translation unit per ISA build); it includes the standard headers.
#pragma once

#include "simd.hpp"
#include "problem.hpp"
#include "pack.hpp"
#include "scratch.hpp"
#include "bounds.hpp"

namespace {

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

// The skipping of padded key groups (ONLINE_GROUP_KEYS keys of an online tile, or NAIVE_GROUP_KEYS) for the query
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

}  // namespace
