// Naive attention, three passes: the baseline that flash.wgsl is measured
// against, and the shader behind softmax=naive.
//
//   scores:       S = score_of(Q K^T)      written to a device buffer
//   softmax_rows: P = softmax(S) row-wise  in place
//   weighted_sum: O = P V
//
// One dispatch of each pass covers a chunk of the problem: params.rows query
// rows (from params.row0) of each of the (batch, head) pairs bh0 .. bh0 +
// num_workgroups.z - 1. The runner sizes the chunks so that the score buffer
// [heads in chunk, rows, Sk] fits the adapter's buffer limits.
//
// Specialisation constants: the host substitutes each dollar-brace field
// below (string.Template syntax) before compiling. T and SM come from
// NAIVE_TILE and NAIVE_SOFTMAX_WORKGROUP in assemble.py, which the dispatch
// planner also sizes the grids with.

const D4: u32 = ${D4}u;     // head dim of Q/K, in vec4s
const DV4: u32 = ${DV4}u;   // head dim of V/O, in vec4s
const T: u32 = ${T}u;       // tile edge (T x T invocations; 8 <= T, T * T <= 256)
const TD4: u32 = 4u;        // head-dim chunk staged per step, in vec4s (16 floats)

@group(0) @binding(7) var<storage, read_write> scores: array<f32>;

// The K/V head (batch * Hkv + kv head) that query head bh (batch * Hq + head) reads.
fn kv_head_of(bh: u32) -> u32 {
    let b = bh / params.heads_q;
    let h = bh % params.heads_q;
    return b * (params.heads_q / params.group) + h / params.group;
}

// Score-buffer index of (head z of the chunk, row of the chunk, key).
fn score_index(z: u32, chunk_row: u32, key: u32) -> u32 {
    return (z * params.rows + chunk_row) * params.seq_k + key;
}

var<workgroup> qs: array<vec4<f32>, T * TD4>;
var<workgroup> ks: array<vec4<f32>, T * TD4>;

// Pass 1: one invocation per score; a T x T tile of (rows, keys) per workgroup.
@compute @workgroup_size(T, T)
fn scores_pass(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let bh = params.bh0 + wid.z;
    let b = bh / params.heads_q;
    let h = bh % params.heads_q;
    let bkv = kv_head_of(bh);
    let chunk_row = wid.y * T + lid.y;
    let row = params.row0 + chunk_row;
    let key = wid.x * T + lid.x;
    let flat = lid.y * T + lid.x;
    let row_tile = params.row0 + wid.y * T;
    let key_tile = wid.x * T;

    var qk = 0.0;
    for (var d0 = 0u; d0 < D4; d0 += TD4) {
        workgroupBarrier();
        // T * T invocations: the first T * TD4 stage Q, the next T * TD4 stage K.
        if (flat < T * TD4) {
            let r = flat / TD4;
            let dq = d0 + flat % TD4;
            var x = vec4<f32>(0.0);
            if (row_tile + r < params.row0 + params.rows && dq < D4) {
                x = load_q((bh * params.seq_q + row_tile + r) * D4 + dq);
            }
            qs[flat] = x;
        } else if (flat < 2u * T * TD4) {
            let i = flat - T * TD4;
            let kr = i / TD4;
            let dq = d0 + i % TD4;
            var x = vec4<f32>(0.0);
            if (key_tile + kr < params.seq_k && dq < D4) {
                x = load_k((bkv * params.seq_k + key_tile + kr) * D4 + dq);
            }
            ks[i] = x;
        }
        workgroupBarrier();
        for (var t = 0u; t < TD4; t++) {
            qk += dot(qs[lid.y * TD4 + t], ks[lid.x * TD4 + t]);
        }
    }
    if (chunk_row < params.rows && key < params.seq_k) {
        scores[score_index(wid.z, chunk_row, key)] =
            score_of(qk, bias_base(b, h), mask_base(b, h), row, key);
    }
}

const SM: u32 = ${SM}u;     // invocations per softmax workgroup (a power of two)
var<workgroup> red: array<f32, SM>;

// Reduce red[0..SM) to red[0] with op max (is_max) or sum.
fn reduce_red(lid: u32, is_max: bool) {
    for (var stride = SM / 2u; stride > 0u; stride /= 2u) {
        workgroupBarrier();
        if (lid < stride) {
            if (is_max) {
                red[lid] = max(red[lid], red[lid + stride]);
            } else {
                red[lid] = red[lid] + red[lid + stride];
            }
        }
    }
    workgroupBarrier();
}

// Pass 2: one workgroup per score row: max, sum of exp, normalise in place.
@compute @workgroup_size(SM)
fn softmax_pass(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let base = score_index(wid.z, wid.x, 0u);
    let sk = params.seq_k;
    var m = params.neg_inf;
    for (var j = lid; j < sk; j += SM) {
        m = max(m, scores[base + j]);
    }
    red[lid] = m;
    reduce_red(lid, true);
    // A uniform load: every invocation takes the same branch below.
    let row_max = workgroupUniformLoad(&red[0]);
    if (row_max == params.neg_inf) {
        // Every score is -inf: softmax is 0/0. The reference yields NaN;
        // masked_rows=zero turns it into 0. params.empty_row is that value.
        for (var j = lid; j < sk; j += SM) {
            scores[base + j] = params.empty_row;
        }
        return;
    }
    var total = 0.0;
    for (var j = lid; j < sk; j += SM) {
        let e = exp(scores[base + j] - row_max);
        scores[base + j] = e;
        total += e;
    }
    red[lid] = total;
    reduce_red(lid, false);
    let row_sum = workgroupUniformLoad(&red[0]);
    for (var j = lid; j < sk; j += SM) {
        scores[base + j] = scores[base + j] / row_sum;
    }
}

var<workgroup> ps: array<f32, T * T>;
var<workgroup> vs: array<vec4<f32>, T * T>;

// Pass 3: O = P V; a workgroup computes T rows x 4T output columns, one vec4
// per invocation.
@compute @workgroup_size(T, T)
fn weighted_sum_pass(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let bh = params.bh0 + wid.z;
    let bkv = kv_head_of(bh);
    let chunk_row = wid.y * T + lid.y;
    let col = wid.x * T + lid.x;       // vec4 column
    let sk = params.seq_k;
    var out = vec4<f32>(0.0);
    for (var j0 = 0u; j0 < sk; j0 += T) {
        workgroupBarrier();
        // P tile: T rows x T keys; V tile: T keys x T vec4 columns.
        let pr = wid.y * T + lid.y;
        var p = 0.0;
        if (pr < params.rows && j0 + lid.x < sk) {
            p = scores[score_index(wid.z, pr, j0 + lid.x)];
        }
        ps[lid.y * T + lid.x] = p;
        var x = vec4<f32>(0.0);
        if (j0 + lid.y < sk && col < DV4) {
            x = load_v((bkv * sk + j0 + lid.y) * DV4 + col);
        }
        vs[lid.y * T + lid.x] = x;
        workgroupBarrier();
        for (var j = 0u; j < T; j++) {
            out += ps[lid.y * T + j] * vs[j * T + lid.x];
        }
    }
    if (chunk_row < params.rows && col < DV4) {
        store_o((bh * params.seq_q + params.row0 + chunk_row) * DV4 + col, out);
    }
}
