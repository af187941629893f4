// Runs one call: the decode path for few query rows, else packs K and V and runs the query tiles over threads.
// Part of csrc/flash_attention.hpp (one translation unit per ISA build); it includes the standard headers.
#pragma once

#include "problem.hpp"
#include "threads.hpp"
#include "pack.hpp"
#include "scratch.hpp"
#include "bounds.hpp"
#include "online.hpp"
#include "naive.hpp"
#include "decode.hpp"

namespace {

bool run_problem(const Problem& pb) {
    if (pb.Hq / pb.Hkv * pb.Sq <= DIRECT_MAX_ROWS) return run_direct(pb);
    const int key_tile = pb.online ? std::min(pb.block, pb.Sk) : pb.Sk;
    Packed pk(pb, key_tile, pb.online ? online_group_keys(pb.block) : NAIVE_GROUP_KEYS, skipped_keys_count(pb),
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

}  // namespace
