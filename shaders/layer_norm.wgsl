// layer_norm: y[r, :] = (x[r, :] - mean) / sqrt(var + eps) * w + b, per row,
// with the biased variance (torch.nn.LayerNorm). Two passes over the row
// (mean, then the squared deviations) as the CPU reference does, so a large
// mean does not cancel the variance.
// bindings: 0 params {n, rows, eps}, 1 x: array<f32> (rows*n), 2 w: array<f32> (n),
//           3 b: array<f32> (n), 4 y: array<f32> (rows*n)
// dispatch: one workgroup of WG threads per row, rows spread over x and y
// (see gpu::ops::groups_1d)
// variants: SUBGROUPS reduces with subgroupAdd, otherwise a shared-memory tree.

struct Params { n: u32, rows: u32, eps: f32, _p0: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read> b: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;

override WG: u32 = 256u;

var<workgroup> partial: array<f32, 256>;

// Sum of `v` over the workgroup, returned to every thread.
fn workgroup_sum(v: f32, lid: u32
#if SUBGROUPS
                 , sid: u32, ssize: u32
#endif
) -> f32 {
#if SUBGROUPS
    let s = subgroupAdd(v);
    if (sid == 0u) {
        partial[lid / ssize] = s;
    }
    workgroupBarrier();
    var total = 0.0;
    for (var i = 0u; i < WG / ssize; i++) {
        total += partial[i];
    }
#else
    partial[lid] = v;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride /= 2u) {
        if (lid < stride) {
            partial[lid] += partial[lid + stride];
        }
        workgroupBarrier();
    }
    let total = partial[0];
#endif
    // Everyone has read the partials before the next call overwrites them.
    workgroupBarrier();
    return total;
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32
#if SUBGROUPS
        , @builtin(subgroup_invocation_id) sid: u32, @builtin(subgroup_size) ssize: u32
#endif
) {
    let row = wid.y * nwg.x + wid.x;
    if (row >= p.rows) {
        return;
    }
    let base = row * p.n;
    var acc = 0.0;
    for (var i = lid; i < p.n; i += WG) {
        acc += x[base + i];
    }
#if SUBGROUPS
    let mean = workgroup_sum(acc, lid, sid, ssize) / f32(p.n);
#else
    let mean = workgroup_sum(acc, lid) / f32(p.n);
#endif
    acc = 0.0;
    for (var i = lid; i < p.n; i += WG) {
        let d = x[base + i] - mean;
        acc += d * d;
    }
#if SUBGROUPS
    let variance = workgroup_sum(acc, lid, sid, ssize) / f32(p.n);
#else
    let variance = workgroup_sum(acc, lid) / f32(p.n);
#endif
    let inv = inverseSqrt(variance + p.eps);
    for (var i = lid; i < p.n; i += WG) {
        y[base + i] = (x[base + i] - mean) * inv * w[i] + b[i];
    }
}
