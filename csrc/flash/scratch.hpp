// Per-thread state of the packed path (scratch buffers, deferred tiles), its query rows and its output rows.
// Part of csrc/flash_attention.hpp (one translation unit per ISA build); it includes the standard headers.
#pragma once

#include "simd.hpp"
#include "problem.hpp"
#include "pack.hpp"

namespace {

// A key tile that the bias or mask pushes far below the other scores, set aside until the row
// maxima of the other tiles are known (then it is skipped when provably worthless).
struct DeferredTile {
    int tile;
    float ceiling;    // an upper bound on bias (or fill) over the tile, before the product
    bool all_filled;  // every score of the tile is mask_fill (the mask keeps none)
    bool some_filled;
    bool dropped = false;  // proved worthless and left out
};

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

}  // namespace
