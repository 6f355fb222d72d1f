// expand_prior: VITS's length regulation and prior sample for channels ch0 .. ch0 + c:
// y[k, f] = m[ch, j] + noise[ch, f] * exp(logs[ch, j]) * noise_scale with ch = ch0 + k and
// j the phoneme frame f repeats: the first with ends[j] > f, ends being the durations'
// running sums (as cpu::expand_prior on cpu::frame_phonemes). Phonemes that all last 0
// frames (ends[t - 1] = 0) give a prior of mean 0 and log-std 0 (the one frame VITS
// decodes then). frames = lens[2 s] * f_mul + f_add (1, 0: sentence s's frame count
// written on the device; 0, n: n fixed when recorded), s = first (one sentence of a batch,
// whose y starts at s * y_stride and stats at stats_off; the dispatch is sized for the
// batch's longest).
// bindings: 0 params, 1 stats: [2 channels, t] (m, then logs), 2 ends: [t] u32,
//           3 noise: [channels, frames] (a longer buffer's prefix), 4 lens: [frames,
//           total] u32 a sentence,
//           5 y: [c, frames]
// dispatch: ceil(c * frames / WG) workgroups, up to 65535 along x, then rows of 65535
// (gpu::speech::groups_wide), direct or indirect.

struct Params {
    c: u32, f_mul: u32, f_add: i32, t: u32,
    ch0: u32, channels: u32, noise_scale: f32, first: u32,
    y_stride: u32, stats_off: u32, _p1: u32, _p2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> stats: array<f32>;
@group(0) @binding(2) var<storage, read> ends: array<u32>;
@group(0) @binding(3) var<storage, read> noise: array<f32>;
@group(0) @binding(4) var<storage, read> lens: array<u32>;
@group(0) @binding(5) var<storage, read_write> y: array<f32>;

override WG: u32 = 256u;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let frames = u32(i32(lens[2u * p.first] * p.f_mul) + p.f_add);
    let i = (wid.y * 65535u + wid.x) * WG + lid;
    if (i >= p.c * frames) {
        return;
    }
    let ch = p.ch0 + i / frames;
    let f = i % frames;
    var m = 0.0;
    var logs = 0.0;
    if (ends[p.t - 1u] > 0u) {
        // The first phoneme whose running sum passes f.
        var lo = 0u;
        var hi = p.t - 1u;
        while (lo < hi) {
            let mid = (lo + hi) / 2u;
            if (ends[mid] > f) {
                hi = mid;
            } else {
                lo = mid + 1u;
            }
        }
        m = stats[p.stats_off + ch * p.t + lo];
        logs = stats[p.stats_off + (p.channels + ch) * p.t + lo];
    }
    y[p.first * p.y_stride + i] = m + noise[ch * frames + f] * exp(logs) * p.noise_scale;
}
