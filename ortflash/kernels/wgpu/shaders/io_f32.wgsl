// I/O for float32 tensors. assemble.py prepends exactly one io_*.wgsl file to a
// kernel; the kernel only sees load_q/load_k/load_v (float32 vec4 out) and
// store_o (float32 vec4 in), so the arithmetic is the same for every dtype.
// Indices count vec4s: the head dims are padded to multiples of 4 by the host.

@group(0) @binding(1) var<storage, read> q_buf: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> k_buf: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> v_buf: array<vec4<f32>>;
@group(0) @binding(6) var<storage, read_write> o_buf: array<vec4<f32>>;

fn load_q(i: u32) -> vec4<f32> { return q_buf[i]; }
fn load_k(i: u32) -> vec4<f32> { return k_buf[i]; }
fn load_v(i: u32) -> vec4<f32> { return v_buf[i]; }
fn store_o(i: u32, x: vec4<f32>) { o_buf[i] = x; }
