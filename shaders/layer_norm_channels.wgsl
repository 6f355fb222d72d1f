// layer_norm_channels: VITS's modules.LayerNorm over x: [c, t] (channels at
// each time step): y[:, t] = act((x[:, t] - mean) / sqrt(var + eps) * gamma + beta) + res[:, t],
// act = GELU (erf.wgsl) when flags & 1, identity otherwise; res read when flags & 2.
// Biased variance in two passes over the channels, as cpu::layer_norm_channels.
// bindings: 0 params, 1 x: [c, t], 2 gamma: [c], 3 beta: [c], 4 res: [c, t]
//           (read only with flags & 2), 5 y: [c, t]
// dispatch: ceil(t / WG) workgroups spread over x and y (gpu::ops::groups_1d); one
// invocation a time step, reading its channels t apart (neighbours read neighbours).

struct Params { c: u32, t: u32, eps: f32, flags: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> gamma: array<f32>;
@group(0) @binding(3) var<storage, read> beta: array<f32>;
@group(0) @binding(4) var<storage, read> res: array<f32>;
@group(0) @binding(5) var<storage, read_write> y: array<f32>;

override WG: u32 = 64u;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let ti = (wid.y * nwg.x + wid.x) * WG + lid;
    if (ti >= p.t) {
        return;
    }
    var sum = 0.0;
    for (var ch = 0u; ch < p.c; ch++) {
        sum += x[ch * p.t + ti];
    }
    let mean = sum / f32(p.c);
    var sq = 0.0;
    for (var ch = 0u; ch < p.c; ch++) {
        let d = x[ch * p.t + ti] - mean;
        sq += d * d;
    }
    let inv = 1.0 / sqrt(sq / f32(p.c) + p.eps);
    for (var ch = 0u; ch < p.c; ch++) {
        let i = ch * p.t + ti;
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
