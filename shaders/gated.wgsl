// gated: the gated feed-forward of encoders (NomicBERT's SwiGLU, GTE's and
// ModernBERT's GeGLU with exact GELU): y[t, i] = act(gu[t, i]) * gu[t, f + i],
// gu holding each token's activated and linear halves side by side ([n, 2 f]),
// as one matmul over the stacked projections writes them.
// act: 1 GELU (erf), 2 GELU (tanh), 3 ReLU, 4 SiLU (as matmul's epilogue).
// bindings: 0 params {f, n, act}, 1 gu: [n, 2 f], 2 y: [n, f] (read_write)
// dispatch: ceil(n f / 256) workgroups, spread over x and y (gpu::ops::groups_1d)

struct Params { f: u32, n: u32, act: u32, _p0: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> gu: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;

fn activate(v: f32) -> f32 {
    switch p.act {
        case 1u: { return gelu_f32(v); }
        case 2u: { return gelu_tanh_f32(v); }
        case 3u: { return max(v, 0.0); }
        default: { return v / (1.0 + exp(-v)); }
    }
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let idx = (wid.y * nwg.x + wid.x) * 256u + lid;
    if (idx >= p.f * p.n) {
        return;
    }
    let t = idx / p.f;
    let i = idx % p.f;
    y[idx] = activate(gu[t * 2u * p.f + i]) * gu[t * 2u * p.f + p.f + i];
}
