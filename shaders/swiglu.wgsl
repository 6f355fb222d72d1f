// swiglu: y[t, i] = silu(gu[t, i]) * gu[t, f + i] (with GELU: gelu_tanh for
// silu, GeGLU); gu holds the gate and up
// projections of each token side by side ([n, 2 f]), as gemm writes them.
// bindings: 0 params {f, n}, 1 gu: [n, 2 f], 2 y: [n, f] (read_write)
// dispatch: ceil(n f / 256) workgroups, spread over x and y (gpu::ops::groups_1d)

struct Params { f: u32, n: u32, _p0: u32, _p1: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> gu: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let idx = (wid.y * nwg.x + wid.x) * 256u + lid;
    if (idx >= p.f * p.n) {
        return;
    }
    let t = idx / p.f;
    let i = idx % p.f;
    let g = gu[t * 2u * p.f + i];
#if GELU
    // tanh through exp of a non-positive argument: no overflow at large |g|.
    let u = 0.7978845608028654 * (g + 0.044715 * g * g * g);
    let e = exp(-2.0 * abs(u));
    let th = (1.0 - e) / (1.0 + e);
    let a = 0.5 * g * (1.0 + select(th, -th, u < 0.0));
#else
    let a = g / (1.0 + exp(-g));
#endif
    y[idx] = a * gu[t * 2u * p.f + p.f + i];
}
