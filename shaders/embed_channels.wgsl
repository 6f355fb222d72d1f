// embed_channels: the text encoder's embedding lookup, channel-major:
// y[c, i] = table[ids[i], c] * scale for c < hidden, i < t (as cpu::embed_channels).
// bindings: 0 params, 1 table: [vocab, hidden], 2 ids: [t] u32 (each < vocab),
// The length is t = frames * t_mul + t_add with frames = lens[2 s] (t_mul = 0: t fixed when
// recorded); workgroup z runs sentence s = first + z of a batch, each buffer's at s times its
// stride (what lies past a sentence's t is never read or written; a sentence of 0 frames runs
// nothing).
//           3 lens: [frames, total] u32 a sentence, 4 y: [hidden, t]
// dispatch: ceil(hidden * t / WG) workgroups, up to 65535 along x, then rows of 65535
// (gpu::speech::groups_wide), the sentences along z, direct or indirect.

struct Params {
    hidden: u32, t_mul: u32, t_add: i32, scale: f32,
    first: u32, ids_stride: u32, y_stride: u32, _p0: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> table: array<f32>;
@group(0) @binding(2) var<storage, read> ids: array<u32>;
@group(0) @binding(3) var<storage, read> lens: array<u32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;

override WG: u32 = 256u;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let s = p.first + wid.z;
    let frames = lens[2u * s];
    if (p.t_mul != 0u && frames == 0u) {
        return;
    }
    let t = u32(i32(frames * p.t_mul) + p.t_add);
    let k = (wid.y * 65535u + wid.x) * WG + lid;
    if (k >= p.hidden * t) {
        return;
    }
    let c = k / t;
    let i = k % t;
    y[s * p.y_stride + k] = table[ids[s * p.ids_stride + i] * p.hidden + c] * p.scale;
}
