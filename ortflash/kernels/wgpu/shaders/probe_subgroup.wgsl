// Run once per device by the runner (with the `subgroup` feature): every
// invocation of one 1-D workgroup writes its subgroup size and its lane, so
// the host can check that subgroups are runs of consecutive invocations
// (lane == local index mod size), which flash.wgsl's row groups rely on.

@group(0) @binding(0) var<storage, read_write> probe_out: array<vec2<u32>>;

@compute @workgroup_size(${WG})
fn main(
    @builtin(local_invocation_index) lid: u32,
    @builtin(subgroup_size) size: u32,
    @builtin(subgroup_invocation_id) lane: u32,
) {
    probe_out[lid] = vec2<u32>(size, lane);
}
