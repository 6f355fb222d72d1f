// copy: y = x, 16 bytes per invocation and step; the bandwidth probe of
// `scoreboard` (what a kernel, rather than the copy engine, can stream).
// bindings: 0 params {n: vec4 elements}, 1 x: array<vec4<u32>> (n), 2 y (n)
// dispatch: any number of workgroups, spread over x and y (gpu::ops::groups_1d);
//           each invocation strides over the whole buffer.

struct Params { n: u32, _p0: u32, _p1: u32, _p2: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read_write> y: array<vec4<u32>>;

override WG: u32 = 256u;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let threads = nwg.x * nwg.y * WG;
    for (var i = (wid.y * nwg.x + wid.x) * WG + lid; i < p.n; i += threads) {
        y[i] = x[i];
    }
}
