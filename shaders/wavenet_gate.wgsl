// wavenet_gate: WaveNet's gated activation (VITS's fused_add_tanh_sigmoid_multiply):
// y[c, t] = tanh(x[c, t] + g[g_off + c]) * sigmoid(x[h + c, t] + g[g_off + h + c]),
// g holding a per-channel conditioning offset for each layer (a speaker's; zeros for none).
// Twin: cpu::wavenet_gate.
// bindings: 0 params {h, t, g_off}, 1 x: [2h, t], 2 g: [g_off + 2h ..], 3 y: [h, t] (read_write)
// dispatch: ceil(h t / 256) workgroups, spread over x and y (gpu::ops::groups_1d)

struct Params { h: u32, t: u32, g_off: u32, _p0: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> g: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = (wid.y * nwg.x + wid.x) * 256u + lid;
    if (i >= p.h * p.t) {
        return;
    }
    let c = i / p.t;
    let a = x[i] + g[p.g_off + c];
    let b = x[p.h * p.t + i] + g[p.g_off + p.h + c];
    // tanh saturates to +-1 in f32 well before 15; clamping keeps exp finite.
    let ta = tanh(clamp(a, -15.0, 15.0));
    y[i] = ta * (1.0 / (1.0 + exp(-b)));
}
