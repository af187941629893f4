// One score row finished in the spec's order (softcap, bias, mask, causal and window fills), and its max.
// Part of csrc/flash_attention.hpp (one translation unit per ISA build); it includes the standard headers.
#pragma once

#include "simd.hpp"
#include "problem.hpp"

namespace {

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

// finish_scores, then the row's largest value (row_max over `width` columns), in one pass
// when the row needs nothing but a float32 bias row added.

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

}  // namespace
