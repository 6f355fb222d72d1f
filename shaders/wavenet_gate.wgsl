// wavenet_gate: WaveNet's gated activation (VITS's fused_add_tanh_sigmoid_multiply):
// y[c, t] = tanh(x[c, t] + g[g_off + c]) * sigmoid(x[h + c, t] + g[g_off + h + c]),
// g holding a per-channel conditioning offset for each layer (a speaker's; zeros for none).
// The length is t = frames * t_mul + t_add with frames = lens[2 s] (as conv1d's); workgroup
// z runs sentence s = first + z of a batch, x at s * x_stride, y at s * y_stride (a sentence
// of 0 frames runs nothing).
// Twin: cpu::wavenet_gate.
// bindings: 0 params {h, t_mul, t_add, g_off, first, x_stride, y_stride}, 1 x: [2h, t],
//           2 g: [g_off + 2h ..], 3 lens: [frames, total] u32 a sentence, 4 y: [h, t]
// dispatch: ceil(h t / 256) workgroups (z: the sentences), up to 65535 along x, then rows of 65535
// (gpu::speech::groups_wide; no num_workgroups, which D3D12 leaves 0 in indirect
// dispatches), direct or indirect

struct Params {
    h: u32, t_mul: u32, t_add: i32, g_off: u32,
    first: u32, x_stride: u32, y_stride: u32, _p0: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> g: array<f32>;
@group(0) @binding(3) var<storage, read> lens: array<u32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let s = p.first + wid.z;
    let frames = lens[2u * s];
    if (p.t_mul != 0u && frames == 0u) {
        return;
    }
    let t = u32(i32(frames * p.t_mul) + p.t_add);
    let i = (wid.y * 65535u + wid.x) * 256u + lid;
    if (i >= p.h * t) {
        return;
    }
    let c = i / t;
    let xb = s * p.x_stride;
    let a = x[xb + i] + g[p.g_off + c];
    let b = x[xb + p.h * t + i] + g[p.g_off + p.h + c];
    // tanh saturates to +-1 in f32 well before 15; clamping keeps exp finite.
    let ta = tanh(clamp(a, -15.0, 15.0));
    y[s * p.y_stride + i] = ta * (1.0 / (1.0 + exp(-b)));
}
