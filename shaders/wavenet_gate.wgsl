// wavenet_gate: WaveNet's gated activation (VITS's fused_add_tanh_sigmoid_multiply):
// y[c, t] = tanh(x[c, t] + g[g_off + c]) * sigmoid(x[h + c, t] + g[g_off + h + c]),
// g holding a per-channel conditioning offset for each layer (a speaker's; zeros for none).
// The length is t = frames * t_mul + t_add with frames = lens[0] (as conv1d's).
// Twin: cpu::wavenet_gate.
// bindings: 0 params {h, t_mul, t_add, g_off}, 1 x: [2h, t], 2 g: [g_off + 2h ..],
//           3 lens: u32, 4 y: [h, t] (read_write)
// dispatch: ceil(h t / 256) workgroups, up to 65535 along x, then rows of 65535
// (gpu::speech::groups_wide; no num_workgroups, which D3D12 leaves 0 in indirect
// dispatches), direct or indirect

struct Params { h: u32, t_mul: u32, t_add: i32, g_off: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> g: array<f32>;
@group(0) @binding(3) var<storage, read> lens: array<u32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let t = u32(i32(lens[0] * p.t_mul) + p.t_add);
    let i = (wid.y * 65535u + wid.x) * 256u + lid;
    if (i >= p.h * t) {
        return;
    }
    let c = i / t;
    let a = x[i] + g[p.g_off + c];
    let b = x[p.h * t + i] + g[p.g_off + p.h + c];
    // tanh saturates to +-1 in f32 well before 15; clamping keeps exp finite.
    let ta = tanh(clamp(a, -15.0, 15.0));
    y[i] = ta * (1.0 / (1.0 + exp(-b)));
}
