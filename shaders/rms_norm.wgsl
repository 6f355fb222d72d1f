// rms_norm: y[r, :] = w * x[r, :] / sqrt(mean(x[r, :]^2) + eps), per row;
// with ADD, y[r, :] += that (a post-norm joining the residual stream, Gemma-3).
// bindings: 0 params {n, rows, eps}, 1 x: array<f32> (rows*n), 2 w: array<f32> (n),
//           3 y: array<f32> (rows*n)
// dispatch: one workgroup of WG threads per row: (rows, 1, 1)
// variants: SUBGROUPS reduces with subgroupAdd, otherwise a shared-memory tree;
//           ADD accumulates into y.

struct Params { n: u32, rows: u32, eps: f32, _p0: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;

override WG: u32 = 256u;

var<workgroup> partial: array<f32, 256>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32
#if SUBGROUPS
        , @builtin(subgroup_invocation_id) sid: u32, @builtin(subgroup_size) ssize: u32
#endif
) {
    let row = wid.x;
    let base = row * p.n;
    var acc = 0.0;
    for (var i = lid; i < p.n; i += WG) {
        let v = x[base + i];
        acc += v * v;
    }
#if SUBGROUPS
    acc = subgroupAdd(acc);
    if (sid == 0u) {
        partial[lid / ssize] = acc;
    }
    workgroupBarrier();
    var total = 0.0;
    for (var s = 0u; s < WG / ssize; s++) {
        total += partial[s];
    }
#else
    partial[lid] = acc;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride /= 2u) {
        if (lid < stride) {
            partial[lid] += partial[lid + stride];
        }
        workgroupBarrier();
    }
    let total = partial[0];
#endif
    let scale = inverseSqrt(total / f32(p.n) + p.eps);
    for (var i = lid; i < p.n; i += WG) {
#if ADD
        y[base + i] += w[i] * (x[base + i] * scale);
#else
        y[base + i] = w[i] * (x[base + i] * scale);
#endif
    }
}
