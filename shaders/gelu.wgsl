// gelu: y = 0.5 x (1 + erf(x / sqrt 2)), elementwise (erf from erf.wgsl).
// bindings: 0 params {n}, 1 x: array<f32> (n), 2 y: array<f32> (n)
// dispatch: ceil(n / WG) workgroups, spread over x and y (see gpu::ops::groups_1d)

struct Params { n: u32, _p0: u32, _p1: u32, _p2: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;

override WG: u32 = 256u;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = (wid.y * nwg.x + wid.x) * WG + lid;
    if (i < p.n) {
        y[i] = gelu_f32(x[i]);
    }
}
