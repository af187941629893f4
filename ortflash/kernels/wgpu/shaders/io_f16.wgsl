// I/O for float16 tensors on adapters with the `shader-f16` feature: buffers
// hold vec4<f16>; values widen to float32 as they are loaded, so every product
// and sum in the kernels is float32, and narrow once when O is stored.
enable f16;

@group(0) @binding(1) var<storage, read> q_buf: array<vec4<f16>>;
@group(0) @binding(2) var<storage, read> k_buf: array<vec4<f16>>;
@group(0) @binding(3) var<storage, read> v_buf: array<vec4<f16>>;
@group(0) @binding(6) var<storage, read_write> o_buf: array<vec4<f16>>;

fn load_q(i: u32) -> vec4<f32> { return vec4<f32>(q_buf[i]); }
fn load_k(i: u32) -> vec4<f32> { return vec4<f32>(k_buf[i]); }
fn load_v(i: u32) -> vec4<f32> { return vec4<f32>(v_buf[i]); }
fn store_o(i: u32, x: vec4<f32>) { o_buf[i] = vec4<f16>(x); }
