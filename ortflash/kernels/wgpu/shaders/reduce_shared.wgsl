// Stand-ins for reduce_subgroup.wgsl on devices without usable subgroups
// (flash.wgsl with SG = 0 reduces through workgroup memory and never calls
// these; they exist so the kernel compiles without the `subgroup` feature).

fn row_group_max(x: vec4<f32>) -> vec4<f32> {
    return x;
}

fn row_group_sum(x: vec4<f32>) -> vec4<f32> {
    return x;
}
