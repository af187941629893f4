// Row reductions across the C invocations of a row group by subgroup shuffles
// (flash.wgsl with SG = 1). The host selects this file only when the device has
// the `subgroup` feature and its subgroups hold whole row groups: C lanes in a
// row, C a power of two no larger than the subgroup size (probed by the runner).
// No `enable subgroups;`: wgpu's compiler rejects the directive but accepts
// the builtins once the device has the feature.

fn row_group_max(x: vec4<f32>) -> vec4<f32> {
    var m = x;
    for (var lane_mask = 1u; lane_mask < C; lane_mask <<= 1u) {
        m = max(m, subgroupShuffleXor(m, lane_mask));
    }
    return m;
}

fn row_group_sum(x: vec4<f32>) -> vec4<f32> {
    var total = x;
    for (var lane_mask = 1u; lane_mask < C; lane_mask <<= 1u) {
        total += subgroupShuffleXor(total, lane_mask);
    }
    return total;
}
