// global_avg_pool: y[c] = mean of x[c, 0..n] (one image, [c, h*w]).
// bindings: 0 params {c, n}, 1 x: array<f32> (c*n), 2 y: array<f32> (c)
// dispatch: one workgroup of 256 threads per channel, spread over x and y
//           (gpu::ops::groups_1d(c, 1)); a shared-memory tree sums each channel.

struct Params { c: u32, n: u32, _p0: u32, _p1: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;

const WG: u32 = 256u;
var<workgroup> partial: array<f32, WG>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let c = wid.y * nwg.x + wid.x;
    // Uniform control flow: every thread of a workgroup takes the same path.
    if (c >= p.c) {
        return;
    }
    var acc = 0.0;
    for (var i = lid; i < p.n; i += WG) {
        acc += x[c * p.n + i];
    }
    partial[lid] = acc;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride /= 2u) {
        if (lid < stride) {
            partial[lid] += partial[lid + stride];
        }
        workgroupBarrier();
    }
    if (lid == 0u) {
        y[c] = partial[0] / f32(p.n);
    }
}
