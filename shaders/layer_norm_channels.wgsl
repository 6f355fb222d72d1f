// layer_norm_channels: VITS's modules.LayerNorm over x: [c, t] (channels at
// each time step): y[:, t] = act((x[:, t] - mean) / sqrt(var + eps) * gamma + beta) + res[:, t],
// act = GELU (erf.wgsl) when flags & 1, identity otherwise; res read when flags & 2.
// Biased variance in two passes over the channels, as cpu::layer_norm_channels.
// The length is t = frames * t_mul + t_add with frames = lens[2 s] (t_mul = 0: t fixed when
// recorded); workgroup z runs sentence s = first + z of a batch, each buffer's at s times its
// stride (what lies past a sentence's t is never read or written; a sentence of 0 frames runs
// nothing).
// bindings: 0 params, 1 x: [c, t], 2 gamma: [c], 3 beta: [c], 4 res: [c, t]
//           (read only with flags & 2), 5 lens: [frames, total] u32 a sentence, 6 y: [c, t]
// dispatch: ceil(t / WG) workgroups, up to 65535 along x, then rows of 65535
// (gpu::speech::groups_wide), the sentences along z, direct or indirect; one
// invocation a time step, reading its channels t apart (neighbours read neighbours).

struct Params {
    c: u32, t_mul: u32, t_add: i32, flags: u32,
    eps: f32, first: u32, stride: u32, _p0: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> gamma: array<f32>;
@group(0) @binding(3) var<storage, read> beta: array<f32>;
@group(0) @binding(4) var<storage, read> res: array<f32>;
@group(0) @binding(5) var<storage, read> lens: array<u32>;
@group(0) @binding(6) var<storage, read_write> y: array<f32>;

override WG: u32 = 64u;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let s = p.first + wid.z;
    let frames = lens[2u * s];
    if (p.t_mul != 0u && frames == 0u) {
        return;
    }
    let t = u32(i32(frames * p.t_mul) + p.t_add);
    let base = s * p.stride;
    let ti = (wid.y * 65535u + wid.x) * WG + lid;
    if (ti >= t) {
        return;
    }
    var sum = 0.0;
    for (var ch = 0u; ch < p.c; ch++) {
        sum += x[base + ch * t + ti];
    }
    let mean = sum / f32(p.c);
    var sq = 0.0;
    for (var ch = 0u; ch < p.c; ch++) {
        let d = x[base + ch * t + ti] - mean;
        sq += d * d;
    }
    let inv = 1.0 / sqrt(sq / f32(p.c) + p.eps);
    for (var ch = 0u; ch < p.c; ch++) {
        let i = base + ch * t + ti;
        var v = (x[i] - mean) * inv * gamma[ch] + beta[ch];
        if ((p.flags & 1u) != 0u) {
            v = gelu_f32(v);
        }
        if ((p.flags & 2u) != 0u) {
            v += res[i];
        }
        y[i] = v;
    }
}
