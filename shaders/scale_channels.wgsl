// scale_channels: y[c, i] = x[c, i] * s[c] (squeeze-and-excitation), one image [c, n].
// bindings: 0 params {n, total = c*n}, 1 x: array<f32> (c*n), 2 s: array<f32> (c),
//           3 y: array<f32> (c*n)
// dispatch: ceil(total / WG) workgroups spread over x and y (gpu::ops::groups_1d)

struct Params { n: u32, total: u32, _p0: u32, _p1: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> s: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;

override WG: u32 = 256u;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = (wid.y * nwg.x + wid.x) * WG + lid;
    if (i < p.total) {
        y[i] = x[i] * s[i / p.n];
    }
}
