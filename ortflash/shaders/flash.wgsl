// FlashAttention forward, online softmax (one pass over key tiles).
//
// One workgroup computes BR query rows of one (batch, query head). It walks
// the keys in tiles of BC: each K tile and then V tile is staged in workgroup
// memory, the BR x BC scores are computed from Q (kept in workgroup memory,
// transposed) and the K tile, and the output rows are updated from the V tile.
// The score matrix never exists in device memory.
//
// Invocation layout (register tiling): the workgroup is GROUPS row groups of C
// invocations. An invocation owns TM = 4*RV query rows, held as RV vec4s of
// four consecutive rows, and
//   - in the score phase, KPT keys of the tile (keys c, c+C, c+2C, ...), so it
//     computes a TM x KPT block of scores;
//   - in the output phase, VPT vec4 columns of V/O (columns c, c+C, ...), so it
//     accumulates a TM x 4*VPT block of the output.
// Per-invocation arrays must live in registers: every loop that indexes one
// is marked `// @unroll`, and runner.py writes such a loop out once per value
// of its counter (as a `const`), so every private index is a constant.
// (Left as loops, NVIDIA's Vulkan compiler put the arrays in local memory,
// 3-10x slower, and lavapipe has miscompiled such dynamic indexing.)
//
// Specialisation constants: runner.py substitutes each dollar-brace field
// below (string.Template syntax) before compiling.

const D4: u32 = ${D4}u;      // head dim of Q/K, in vec4s
const DV4: u32 = ${DV4}u;    // head dim of V/O, in vec4s
const BR: u32 = ${BR}u;      // query rows per workgroup
const BC: u32 = ${BC}u;      // keys per tile
const C: u32 = ${C}u;        // invocations per row group
const RV: u32 = ${RV}u;      // vec4 row blocks per invocation
const VPT: u32 = ${VPT}u;    // vec4 output columns per invocation (VPT * C >= DV4)
const KPT: u32 = ${KPT}u;    // keys per invocation in the score phase (BC / C)

const TM: u32 = 4u * RV;
const GROUPS: u32 = BR / TM;
const WG: u32 = GROUPS * C;
const BR4: u32 = BR / 4u;
const KROW: u32 = D4 + 1u;    // K tile row stride: one vec4 of padding spreads keys over banks
const VROW: u32 = VPT * C;    // V tile row stride (>= DV4; the extra columns are never stored)
const PROW: u32 = BR4 + 1u;   // P tile row stride, padded likewise

// Q^T: q_tile[d * BR4 + r] holds dimension d of rows 4r..4r+3, so a vec4 load
// gives one dimension of four rows.
var<workgroup> q_tile: array<vec4<f32>, D4 * 4u * BR4>;
// The K tile (key-major, KROW vec4 per key), then the V tile (VROW per key).
var<workgroup> kv_tile: array<vec4<f32>, max(BC * KROW, BC * VROW)>;
// P^T: p_tile[key * PROW + r] = probabilities of rows 4r..4r+3 for that key.
var<workgroup> p_tile: array<vec4<f32>, BC * PROW>;
// Row-wise partial maxima (per tile) and partial sums (at the end), one
// vec4 per (invocation of a row group, row block).
var<workgroup> red_tile: array<vec4<f32>, C * BR4>;

// The final scores of one row block (4 rows from row0) for one key.
fn finish4(dots: vec4<f32>, bb: u32, mb: u32, row0: u32, key: u32) -> vec4<f32> {
    if (key >= params.seq_k) {
        // Past the end of the keys: not a masked key but no key at all; it
        // must weigh exactly 0 whatever mask_fill is.
        return vec4<f32>(params.neg_inf);
    }
    if ((params.flags & FLAG_ANY_EXTRA) == 0u) {
        return dots * params.scale;
    }
    // Rows past Sq are computed but never stored; clamp them so bias/mask
    // reads stay inside their buffers.
    let last = params.seq_q - 1u;
    return vec4<f32>(
        score_of(dots.x, bb, mb, min(row0, last), key),
        score_of(dots.y, bb, mb, min(row0 + 1u, last), key),
        score_of(dots.z, bb, mb, min(row0 + 2u, last), key),
        score_of(dots.w, bb, mb, min(row0 + 3u, last), key),
    );
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let heads_q = params.heads_q;
    let bh = params.bh0 + wid.y;                  // batch * Hq + query head
    let b = bh / heads_q;
    let h = bh % heads_q;
    let kv_heads = heads_q / params.group;
    let bkv = b * kv_heads + h / params.group;    // grouped-query: shared K/V head, no repeat
    let sq = params.seq_q;
    let sk = params.seq_k;
    let q0 = wid.x * BR;
    let grp = lid / C;
    let c = lid % C;
    let rb0 = grp * RV;                           // this invocation's first row block
    let bb = bias_base(b, h);
    let mb = mask_base(b, h);
    let neg_inf = vec4<f32>(params.neg_inf);

    // Stage Q^T once; rows past Sq are zeros.
    let q_base = bh * sq * D4;
    for (var i = lid; i < BR * D4; i += WG) {
        let row = i / D4;
        let dq = i % D4;
        var x = vec4<f32>(0.0);
        if (q0 + row < sq) {
            x = load_q(q_base + (q0 + row) * D4 + dq);
        }
        let slot = 4u * dq * BR4 + row / 4u;
        let lane = row % 4u;
        q_tile[slot][lane] = x.x;
        q_tile[slot + BR4][lane] = x.y;
        q_tile[slot + 2u * BR4][lane] = x.z;
        q_tile[slot + 3u * BR4][lane] = x.w;
    }

    var running_max: array<vec4<f32>, RV>;   // m: largest score seen so far, per row
    var running_sum: array<vec4<f32>, RV>;   // l: sum of exp(score - m) over this invocation's keys
    var acc: array<vec4<f32>, TM * VPT>;     // unnormalised output, in units of exp(-m)
    // @unroll
    for (var r = 0u; r < RV; r++) {
        running_max[r] = neg_inf;
    }

    // Causal, top-left aligned: rows q0..q0+BR-1 see no key past q0+BR-1.
    var k_end = sk;
    if ((params.flags & FLAG_SKIP_CAUSAL_TILES) != 0u) {
        k_end = min(sk, q0 + BR);
    }
    let k_base = bkv * sk * D4;
    let v_base = bkv * sk * DV4;

    for (var k0 = 0u; k0 < k_end; k0 += BC) {
        workgroupBarrier();   // everyone is done with the previous V tile
        for (var i = lid; i < BC * D4; i += WG) {
            let key = i / D4;
            let dq = i % D4;
            var x = vec4<f32>(0.0);
            if (k0 + key < sk) {
                x = load_k(k_base + (k0 + key) * D4 + dq);
            }
            kv_tile[key * KROW + dq] = x;
        }
        workgroupBarrier();

        // Scores: s[kk * RV + r] = q.k of row block r with key kk*C + c.
        // Zeroed explicitly: a `var` declared in a loop body is not reliably
        // re-initialised on every iteration once compiled.
        var s: array<vec4<f32>, KPT * RV>;
        // @unroll
        for (var kk = 0u; kk < KPT; kk++) {
            // @unroll
            for (var r = 0u; r < RV; r++) {
                s[kk * RV + r] = vec4<f32>(0.0);
            }
        }
        for (var dq = 0u; dq < D4; dq++) {
            var qx: array<vec4<f32>, RV>;
            var qy: array<vec4<f32>, RV>;
            var qz: array<vec4<f32>, RV>;
            var qw: array<vec4<f32>, RV>;
            let qs = 4u * dq * BR4 + rb0;
            // @unroll
            for (var r = 0u; r < RV; r++) {
                qx[r] = q_tile[qs + r];
                qy[r] = q_tile[qs + BR4 + r];
                qz[r] = q_tile[qs + 2u * BR4 + r];
                qw[r] = q_tile[qs + 3u * BR4 + r];
            }
            // @unroll
            for (var kk = 0u; kk < KPT; kk++) {
                let kx = kv_tile[(kk * C + c) * KROW + dq];
                // @unroll
                for (var r = 0u; r < RV; r++) {
                    s[kk * RV + r] += qx[r] * kx.x + qy[r] * kx.y + qz[r] * kx.z + qw[r] * kx.w;
                }
            }
        }

        // Scale, cap, bias, mask; then this invocation's share of each row's tile maximum.
        // @unroll
        for (var kk = 0u; kk < KPT; kk++) {
            // @unroll
            for (var r = 0u; r < RV; r++) {
                s[kk * RV + r] = finish4(s[kk * RV + r], bb, mb, q0 + (rb0 + r) * 4u, k0 + kk * C + c);
            }
        }
        // @unroll
        for (var r = 0u; r < RV; r++) {
            var part = s[r];
            // @unroll
            for (var kk = 1u; kk < KPT; kk++) {
                part = max(part, s[kk * RV + r]);
            }
            red_tile[c * BR4 + rb0 + r] = part;
        }
        workgroupBarrier();   // partial maxima visible; the K tile is no longer read

        // The rescaling trick: with m the running max, acc and l hold sums in
        // units of exp(-m). When a tile raises the max to m', everything
        // summed so far is multiplied by exp(m - m') before the tile's own
        // exp(s - m') terms are added, so no score row is ever kept whole.
        // @unroll
        for (var r = 0u; r < RV; r++) {
            var tile_max = red_tile[rb0 + r];
            for (var cc = 1u; cc < C; cc++) {
                tile_max = max(tile_max, red_tile[cc * BR4 + rb0 + r]);
            }
            let m_new = max(running_max[r], tile_max);
            // A row that has seen only -inf so far keeps 0 as its reference,
            // so exp(-inf - ref) = 0 instead of NaN; a fully masked row ends
            // with running_sum 0.
            let ref_max = select(m_new, vec4<f32>(0.0), m_new == neg_inf);
            let rescale = exp(running_max[r] - ref_max);
            running_max[r] = m_new;
            running_sum[r] *= rescale;
            // @unroll
            for (var v = 0u; v < VPT; v++) {
                acc[(4u * r) * VPT + v] *= rescale.x;
                acc[(4u * r + 1u) * VPT + v] *= rescale.y;
                acc[(4u * r + 2u) * VPT + v] *= rescale.z;
                acc[(4u * r + 3u) * VPT + v] *= rescale.w;
            }
            // @unroll
            for (var kk = 0u; kk < KPT; kk++) {
                let p = exp(s[kk * RV + r] - ref_max);
                running_sum[r] += p;
                p_tile[(kk * C + c) * PROW + rb0 + r] = p;
            }
        }

        // Stage the V tile where the K tile was; keys past Sk are zeros so
        // that their p = 0 adds exactly 0.
        for (var i = lid; i < BC * DV4; i += WG) {
            let key = i / DV4;
            let dv = i % DV4;
            var x = vec4<f32>(0.0);
            if (k0 + key < sk) {
                x = load_v(v_base + (k0 + key) * DV4 + dv);
            }
            kv_tile[key * VROW + dv] = x;
        }
        workgroupBarrier();

        // acc += P V over this tile's keys.
        let n_keys = min(BC, sk - k0);
        for (var j = 0u; j < n_keys; j++) {
            var p: array<vec4<f32>, RV>;
            // @unroll
            for (var r = 0u; r < RV; r++) {
                p[r] = p_tile[j * PROW + rb0 + r];
            }
            // @unroll
            for (var v = 0u; v < VPT; v++) {
                let x = kv_tile[j * VROW + v * C + c];
                // @unroll
                for (var r = 0u; r < RV; r++) {
                    acc[(4u * r) * VPT + v] += p[r].x * x;
                    acc[(4u * r + 1u) * VPT + v] += p[r].y * x;
                    acc[(4u * r + 2u) * VPT + v] += p[r].z * x;
                    acc[(4u * r + 3u) * VPT + v] += p[r].w * x;
                }
            }
        }
    }

    // Each invocation summed only its own keys: add up the row group's
    // partial sums. (red_tile was last read before the last V barrier.)
    // @unroll
    for (var r = 0u; r < RV; r++) {
        red_tile[c * BR4 + rb0 + r] = running_sum[r];
    }
    workgroupBarrier();
    let o_base = bh * sq * DV4;
    // @unroll
    for (var r = 0u; r < RV; r++) {
        var total = red_tile[rb0 + r];
        for (var cc = 1u; cc < C; cc++) {
            total += red_tile[cc * BR4 + rb0 + r];
        }
        let row0 = q0 + (rb0 + r) * 4u;
        // @unroll
        for (var v = 0u; v < VPT; v++) {
            let col = v * C + c;
            if (col < DV4) {
                store_row(o_base, row0, col, acc[(4u * r) * VPT + v], total.x);
                store_row(o_base, row0 + 1u, col, acc[(4u * r + 1u) * VPT + v], total.y);
                store_row(o_base, row0 + 2u, col, acc[(4u * r + 2u) * VPT + v], total.z);
                store_row(o_base, row0 + 3u, col, acc[(4u * r + 3u) * VPT + v], total.w);
            }
        }
    }
}

// Normalise and store 4 output columns of one row; a row whose sum is 0 had
// every key masked with -inf and yields empty_row (NaN or 0, masked_rows).
fn store_row(o_base: u32, row: u32, col: u32, x: vec4<f32>, total: f32) {
    if (row >= params.seq_q) {
        return;
    }
    var out = vec4<f32>(params.empty_row);
    if (total != 0.0) {
        out = x / total;
    }
    store_o(o_base + row * DV4 + col, out);
}
