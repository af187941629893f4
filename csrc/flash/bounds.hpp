// Which keys the causal frontier and a window leave out of a query tile: never multiplied.
// Part of csrc/flash_attention.hpp (one translation unit per ISA build); it includes the standard headers.
#pragma once

#include "problem.hpp"

namespace {

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

}  // namespace
