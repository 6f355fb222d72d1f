// concat: y[offset + i] = x[i] for i < n: one part of a channel concatenation of one
//         image (parts are contiguous blocks in [c, h, w] order); one dispatch per part.
// bindings: 0 params {n, offset}, 1 x: array<f32> (n), 2 y: array<f32> (>= offset + n)
// dispatch: ceil(n / WG) workgroups spread over x and y (gpu::ops::groups_1d)

struct Params { n: u32, offset: u32, _p0: u32, _p1: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;

override WG: u32 = 256u;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = (wid.y * nwg.x + wid.x) * WG + lid;
    if (i < p.n) {
        y[p.offset + i] = x[i];
    }
}
