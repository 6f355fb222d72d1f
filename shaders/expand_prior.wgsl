// expand_prior: VITS's length regulation and prior sample for channels ch0 .. ch0 + c:
// y[k, f] = m[ch, j] + noise[ch, f] * exp(logs[ch, j]) * noise_scale with ch = ch0 + k and
// j = idx[f] the phoneme frame f repeats (as cpu::expand_prior).
// bindings: 0 params, 1 stats: [2 channels, t] (m, then logs), 2 idx: [frames] u32,
//           3 noise: [channels, frames], 4 y: [c, frames]
// dispatch: ceil(c * frames / WG) workgroups spread over x and y (gpu::ops::groups_1d).

struct Params {
    c: u32, frames: u32, t: u32, ch0: u32,
    channels: u32, noise_scale: f32, _p0: u32, _p1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> stats: array<f32>;
@group(0) @binding(2) var<storage, read> idx: array<u32>;
@group(0) @binding(3) var<storage, read> noise: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;

override WG: u32 = 256u;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = (wid.y * nwg.x + wid.x) * WG + lid;
    if (i >= p.c * p.frames) {
        return;
    }
    let ch = p.ch0 + i / p.frames;
    let f = i % p.frames;
    let j = idx[f];
    let m = stats[ch * p.t + j];
    let logs = stats[(p.channels + ch) * p.t + j];
    y[i] = m + noise[ch * p.frames + f] * exp(logs) * p.noise_scale;
}
