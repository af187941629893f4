// The two register-blocked tile products: scores = scale * Q x packed K^T panels, and acc += P x V.
// Part of csrc/flash_attention.hpp (one translation unit per ISA build); it includes the standard headers.
#pragma once

#include "simd.hpp"

namespace {

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

}  // namespace
