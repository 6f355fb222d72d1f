// add: y = a + b, elementwise (residual connections).
// bindings: 0 params {n}, 1 a: array<f32> (n), 2 b: array<f32> (n), 3 y: array<f32> (n)
// dispatch: ceil(n / WG) workgroups, spread over x and y (see gpu::ops::groups_1d)

struct Params { n: u32, _p0: u32, _p1: u32, _p2: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;

override WG: u32 = 256u;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = (wid.y * nwg.x + wid.x) * WG + lid;
    if (i < p.n) {
        y[i] = a[i] + b[i];
    }
}
