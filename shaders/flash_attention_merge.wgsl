// flash_attention_merge: combines the per-split partial results of
// flash_attention (unnormalised sums acc, running max m, running sum l):
// M = max m_s, out = sum_s acc_s e^(m_s - M) / sum_s l_s e^(m_s - M).
// bindings: 0 params (as flash_attention), 1 part: [n_q, heads, splits, hd + 2],
//           2 step: array<u32> [token, pos0, kv_len, splits], 3 out: [n_q, heads * hd]
// dispatch: (heads, n_q, 1) workgroups of 64 threads

struct Params {
    heads: u32,
    kv_heads: u32,
    hd: u32,
    n_q: u32,
    scale: f32,
    kv_stride: u32,
    _p0: u32,
    _p1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> part: array<f32>;
@group(0) @binding(2) var<storage, read> step: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let h = wid.x;
    let t = wid.y;
    let hd = p.hd;
    let splits = step[3];
    let base = (t * p.heads + h) * splits * (hd + 2u);
    var mx = -1.0e30;
    for (var s = 0u; s < splits; s++) {
        mx = max(mx, part[base + s * (hd + 2u) + hd]);
    }
    var l = 0.0;
    for (var s = 0u; s < splits; s++) {
        let b = base + s * (hd + 2u);
        l += part[b + hd + 1u] * exp(part[b + hd] - mx);
    }
    for (var d = lid; d < hd; d += 64u) {
        var o = 0.0;
        for (var s = 0u; s < splits; s++) {
            let b = base + s * (hd + 2u);
            o += part[b + d] * exp(part[b + hd] - mx);
        }
        out[(t * p.heads + h) * hd + d] = o / l;
    }
}
