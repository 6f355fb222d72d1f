// embed_channels: the text encoder's embedding lookup, channel-major:
// y[c, i] = table[ids[i], c] * scale for c < hidden, i < t (as cpu::embed_channels).
// bindings: 0 params, 1 table: [vocab, hidden], 2 ids: [t] u32 (each < vocab),
//           3 y: [hidden, t]
// dispatch: ceil(hidden * t / WG) workgroups spread over x and y (gpu::ops::groups_1d).

struct Params {
    hidden: u32, t: u32, scale: f32, _p0: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> table: array<f32>;
@group(0) @binding(2) var<storage, read> ids: array<u32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;

override WG: u32 = 256u;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let k = (wid.y * nwg.x + wid.x) * WG + lid;
    if (k >= p.hidden * p.t) {
        return;
    }
    let c = k / p.t;
    let i = k % p.t;
    y[k] = table[ids[i] * p.hidden + c] * p.scale;
}
