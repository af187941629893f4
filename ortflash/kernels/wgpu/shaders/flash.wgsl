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
// is marked `// @unroll`, and assemble.py writes such a loop out once per value
// of its counter (as a `const`), so every private index is a constant.
// (Left as loops, NVIDIA's Vulkan compiler put the arrays in local memory,
// 3-10x slower, and lavapipe has miscompiled such dynamic indexing.)
//
// Scores stay in natural units, exactly as score_of (spec.py) defines them,
// and log2(e) is applied only to differences: p = exp2((s - m) * LOG2E).
// Scores may not be carried in log2 units (log2(e) folded into the scale):
// a finite mask_fill or bias below -FLT_MAX / log2(e) (float32's lowest, as
// exported models use) would become -inf there, and a row masked with such a
// finite fill would turn into NaN instead of the reference's uniform average.
// s - m is 0 or negative, so (s - m) * LOG2E can only underflow exp2 to 0.
//
// Precision: whatever the io dtype, values are widened to f32 as they are
// staged (io_f16.wgsl), and every product, dot-product sum, running max,
// running sum and output accumulator is f32; O is narrowed once when stored.
// (f16 products with f32 sums would need a conversion per product on SIMT
// cores; the H200 measurements are in benchmarks/results.)
//
// Causal (top-left or bottom-right diagonal, common.wgsl's shifts): key tiles
// right of the diagonal are skipped (mask_fill -inf, params.py says when), tiles
// wholly left of it take the plain path (no per-element check), and only the
// tiles that cross the diagonal evaluate score_of per element.
//
// Variants (specialisation constants, chosen by the host):
//   SG = 1: the C invocations of a row group are lanes of one subgroup, and the
//     row maxima and sums are reduced by subgroup shuffles (reduce_subgroup.wgsl)
//     instead of a round trip through workgroup memory and a barrier;
//   KVS = 1: the K and V tiles have their own workgroup memory and are staged
//     together, so their loads overlap and one barrier per tile goes.
//
// Specialisation constants: assemble.py substitutes each dollar-brace field
// below (string.Template syntax) before compiling.

const D4: u32 = ${D4}u;      // head dim of Q/K, in vec4s
const DV4: u32 = ${DV4}u;    // head dim of V/O, in vec4s
const BR: u32 = ${BR}u;      // query rows per workgroup
const BC: u32 = ${BC}u;      // keys per tile
const C: u32 = ${C}u;        // invocations per row group
const RV: u32 = ${RV}u;      // vec4 row blocks per invocation
const VPT: u32 = ${VPT}u;    // vec4 output columns per invocation (VPT * C >= DV4)
const KPT: u32 = ${KPT}u;    // keys per invocation in the score phase (BC / C)
const SG: u32 = ${SG}u;      // 1: row reductions by subgroup shuffles
const KVS: u32 = ${KVS}u;    // 1: separate K and V tiles, staged together
const KV_SIZE: u32 = ${KV_SIZE}u;  // vec4s of kv_tile
const V_OFF: u32 = ${V_OFF}u;      // where the V tile starts in kv_tile
const RED_SIZE: u32 = ${RED_SIZE}u;  // vec4s of red_tile: C * BR / 4, or 1 when SG = 1 (unused)
const LOG2E: f32 = 1.4426950408889634;

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
// The K tile (key-major, KROW vec4 per key) and the V tile (VROW per key) at
// V_OFF: after the K tile (KVS = 1), or in its place once it is read (KVS = 0).
var<workgroup> kv_tile: array<vec4<f32>, KV_SIZE>;
// P^T: p_tile[key * PROW + r] = probabilities of rows 4r..4r+3 for that key.
var<workgroup> p_tile: array<vec4<f32>, BC * PROW>;
// Row-wise partial maxima (per tile) and partial sums (at the end), one
// vec4 per (invocation of a row group, row block); unused when SG = 1, and
// then one vec4 only, leaving the workgroup storage to larger tiles (D=128,
// 64 rows x 16 keys, 16 lanes a row group: 45.5 KiB instead of 49.7).
var<workgroup> red_tile: array<vec4<f32>, RED_SIZE>;

// The final scores of one row block (4 rows from row0) for one key.
// `plain`: no bias, mask, softcap or causal check applies to this tile.
fn finish4(dots: vec4<f32>, bb: u32, mb: u32, row0: u32, key: u32, plain: bool) -> vec4<f32> {
    if (key >= params.seq_k) {
        // Past the end of the keys: not a masked key but no key at all; it
        // must weigh exactly 0 whatever mask_fill is.
        return vec4<f32>(params.neg_inf);
    }
    if (plain) {
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
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) n_groups: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    // Which row tile of which head. With causal tiles skipped (the host sets
    // FLAG_HEAVY_FIRST only then) the row tiles differ in work (the last sees
    // every key tile, the first one) and the dispatch ends when its longest
    // workgroup does. GPUs start workgroups roughly in index order, so the
    // index is remapped heaviest first across all heads of the dispatch (row
    // tile n-1 of every head, then n-2, ...): the heavy ones start at once and
    // the light ones fill the end. Any order computes the same rows: each
    // (row tile, head) is independent, and the map below is a bijection of the
    // grid (the planner keeps n_groups.x * n_groups.y below 2^32).
    var row_tile = wid.x;
    var head_in_dispatch = wid.y;
    if ((params.flags & FLAG_HEAVY_FIRST) != 0u) {
        let linear = wid.y * n_groups.x + wid.x;
        row_tile = n_groups.x - 1u - linear / n_groups.y;
        head_in_dispatch = linear % n_groups.y;
    }
    let heads_q = params.heads_q;
    let bh = params.bh0 + head_in_dispatch;       // batch * Hq + query head
    let b = bh / heads_q;
    let h = bh % heads_q;
    let kv_heads = heads_q / params.group;
    let bkv = b * kv_heads + h / params.group;    // grouped-query: shared K/V head, no repeat
    let sq = params.seq_q;
    let sk = params.seq_k;
    let q0 = row_tile * BR;
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
    var running_sum: array<vec4<f32>, RV>;   // l: sum of e^(score - m) over this invocation's keys
    var acc: array<vec4<f32>, TM * VPT>;     // unnormalised output, in units of e^-m
    // @unroll
    for (var r = 0u; r < RV; r++) {
        running_max[r] = neg_inf;
    }

    // Causal: rows q0..q0+BR-1 see no key past q0+BR-1 + row shift - key shift
    // (top-left: shifts 0; bottom-right: the diagonal moved by Sk - Sq). When
    // that is below key 0 no tile runs and the rows end fully masked.
    let row_shift = params.causal_row_shift;
    let key_shift = params.causal_key_shift;
    var k_end = sk;
    if ((params.flags & FLAG_SKIP_CAUSAL_TILES) != 0u) {
        let past_last = q0 + BR + row_shift;   // one past the last visible key, before the key shift
        k_end = select(0u, min(sk, past_last - key_shift), past_last > key_shift);
    }
    // Window: rows q0.. see no key before q0 + window row shift - window key shift; the tiles
    // wholly before it are skipped (first tile aligned down to BC).
    let wrow_shift = params.window_row_shift;
    let wkey_shift = params.window_key_shift;
    var k_start = 0u;
    if ((params.flags & FLAG_SKIP_WINDOW_TILES) != 0u && q0 + wrow_shift > wkey_shift) {
        k_start = min(sk, q0 + wrow_shift - wkey_shift) / BC * BC;
    }
    let k_base = bkv * sk * D4;
    let v_base = bkv * sk * DV4;
    let extra = params.flags & FLAG_ANY_EXTRA;

    for (var k0 = k_start; k0 < k_end; k0 += BC) {
        workgroupBarrier();   // everyone is done with the previous K/V and P tiles
        for (var i = lid; i < BC * D4; i += WG) {
            let key = i / D4;
            let dq = i % D4;
            var x = vec4<f32>(0.0);
            if (k0 + key < sk) {
                x = load_k(k_base + (k0 + key) * D4 + dq);
            }
            kv_tile[key * KROW + dq] = x;
        }
        if (KVS == 1u) {
            stage_v(v_base, k0, lid);
        }
        workgroupBarrier();
        // Off the diagonal (and inside every row's window), a causal- or window-only tile needs no
        // per-element check: every key is visible to every row (k0 + BC - 1 + key shift <= q0 +
        // row shift, and k0 + window key shift >= q0 + BR - 1 + window row shift).
        let edges_only = (extra & ~(FLAG_CAUSAL | FLAG_WINDOW)) == 0u;
        let right_clear = (extra & FLAG_CAUSAL) == 0u || k0 + BC + key_shift <= q0 + 1u + row_shift;
        let left_clear = (extra & FLAG_WINDOW) == 0u || k0 + wkey_shift >= q0 + BR - 1u + wrow_shift;
        let plain = extra == 0u || (edges_only && right_clear && left_clear);

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
                s[kk * RV + r] = finish4(s[kk * RV + r], bb, mb, q0 + (rb0 + r) * 4u, k0 + kk * C + c, plain);
            }
        }
        var tile_max: array<vec4<f32>, RV>;
        // @unroll
        for (var r = 0u; r < RV; r++) {
            var part = s[r];
            // @unroll
            for (var kk = 1u; kk < KPT; kk++) {
                part = max(part, s[kk * RV + r]);
            }
            tile_max[r] = part;
        }
        if (SG == 1u) {
            // @unroll
            for (var r = 0u; r < RV; r++) {
                tile_max[r] = row_group_max(tile_max[r]);
            }
        } else {
            // @unroll
            for (var r = 0u; r < RV; r++) {
                red_tile[c * BR4 + rb0 + r] = tile_max[r];
            }
        }
        if (SG == 0u || KVS == 0u) {
            workgroupBarrier();   // partial maxima visible; the K tile is no longer read
        }
        if (SG == 0u) {
            // @unroll
            for (var r = 0u; r < RV; r++) {
                var m = red_tile[rb0 + r];
                for (var cc = 1u; cc < C; cc++) {
                    m = max(m, red_tile[cc * BR4 + rb0 + r]);
                }
                tile_max[r] = m;
            }
        }

        // The rescaling trick: with m the running max, acc and l hold sums in
        // units of e^-m. When a tile raises the max to m', everything summed
        // so far is multiplied by e^(m - m') before the tile's own e^(s - m')
        // terms are added, so no score row is ever kept whole. Each e^x is
        // exp2(x * LOG2E), x a difference of scores (see the top of the file).
        // @unroll
        for (var r = 0u; r < RV; r++) {
            let m_new = max(running_max[r], tile_max[r]);
            // A row that has seen only -inf so far keeps 0 as its reference,
            // so e^(-inf - ref) = 0 instead of NaN; a fully masked row ends
            // with running_sum 0.
            let ref_max = select(m_new, vec4<f32>(0.0), m_new == neg_inf);
            let rescale = exp2((running_max[r] - ref_max) * LOG2E);
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
                let p = exp2((s[kk * RV + r] - ref_max) * LOG2E);
                running_sum[r] += p;
                p_tile[(kk * C + c) * PROW + rb0 + r] = p;
            }
        }

        if (KVS == 0u) {
            stage_v(v_base, k0, lid);   // where the K tile was
        }
        workgroupBarrier();   // P (and V) visible

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
                let x = kv_tile[V_OFF + j * VROW + v * C + c];
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
    var totals: array<vec4<f32>, RV>;
    if (SG == 1u) {
        // @unroll
        for (var r = 0u; r < RV; r++) {
            totals[r] = row_group_sum(running_sum[r]);
        }
    } else {
        // @unroll
        for (var r = 0u; r < RV; r++) {
            red_tile[c * BR4 + rb0 + r] = running_sum[r];
        }
    }
    workgroupBarrier();
    if (SG == 0u) {
        // @unroll
        for (var r = 0u; r < RV; r++) {
            var total = red_tile[rb0 + r];
            for (var cc = 1u; cc < C; cc++) {
                total += red_tile[cc * BR4 + rb0 + r];
            }
            totals[r] = total;
        }
    }
    let o_base = bh * sq * DV4;
    // @unroll
    for (var r = 0u; r < RV; r++) {
        let total = totals[r];
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

// Stage the V tile of keys k0.. at V_OFF; keys past Sk are zeros so that
// their p = 0 adds exactly 0.
fn stage_v(v_base: u32, k0: u32, lid: u32) {
    for (var i = lid; i < BC * DV4; i += WG) {
        let key = i / DV4;
        let dv = i % DV4;
        var x = vec4<f32>(0.0);
        if (k0 + key < params.seq_k) {
            x = load_v(v_base + (k0 + key) * DV4 + dv);
        }
        kv_tile[V_OFF + key * VROW + dv] = x;
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
