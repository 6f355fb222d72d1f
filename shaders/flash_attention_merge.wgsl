// flash_attention_merge: combines the per-split partial results of
// flash_attention (unnormalised sums acc, running max m, running sum l):
// M = max m_s, out = sum_s acc_s e^(m_s - M) / sum_s l_s e^(m_s - M).
// bindings: 0 params (attention_params.wgsl), 1 part: [n_q, heads, splits, hd + 2],
//           2 step: array<u32> [token, pos0, kv_len, splits], 3 out: [n_q, heads * hd]
// dispatch: (heads, n_q, 1) workgroups of 64 threads; splits <= 128
//           (llm_ops::MAX_SPLITS)
// ROWS (flash_attention_merge_rows, batched decode): row t's splits come
//   from its row record (step[8 t + 3]), part keeps p.part_splits per head
//   (flash_attention.wgsl), and a row of one split (written by
//   flash_attention itself) is left alone.

@group(0) @binding(1) var<storage, read> part: array<f32>;
@group(0) @binding(2) var<storage, read> step: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

const MAX_SPLITS: u32 = 128u;
// e^(m_s - M) of each split.
var<workgroup> wt: array<f32, MAX_SPLITS>;
var<workgroup> red: array<f32, 64>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let h = wid.x;
    let t = wid.y;
    let hd = p.hd;
#if ROWS
    let splits = min(step[8u * t + 3u], MAX_SPLITS);
    if (splits <= 1u) {
        return;
    }
    let base = (t * p.heads + h) * p.part_splits * (hd + 2u);
#else
    let splits = min(step[3], MAX_SPLITS);
    let base = (t * p.heads + h) * splits * (hd + 2u);
#endif
    // The splits' maxima and sums are read once, by one thread each.
    var mx = -1.0e30;
    for (var s = lid; s < splits; s += 64u) {
        mx = max(mx, part[base + s * (hd + 2u) + hd]);
    }
    red[lid] = mx;
    workgroupBarrier();
    for (var st = 32u; st > 0u; st >>= 1u) {
        if (lid < st) {
            red[lid] = max(red[lid], red[lid + st]);
        }
        workgroupBarrier();
    }
    mx = red[0];
    workgroupBarrier();
    var l = 0.0;
    for (var s = lid; s < splits; s += 64u) {
        let b = base + s * (hd + 2u);
        let e = exp(part[b + hd] - mx);
        wt[s] = e;
        l += part[b + hd + 1u] * e;
    }
    red[lid] = l;
    workgroupBarrier();
    for (var st = 32u; st > 0u; st >>= 1u) {
        if (lid < st) {
            red[lid] += red[lid + st];
        }
        workgroupBarrier();
    }
    l = red[0];
    for (var d = lid; d < hd; d += 64u) {
        // Four splits per step with independent sums (loads in flight together).
        var o4 = vec4<f32>();
        var s = 0u;
        let st = hd + 2u;
        for (; s + 4u <= splits; s += 4u) {
            let b = base + s * st + d;
            o4 += vec4<f32>(part[b], part[b + st], part[b + 2u * st], part[b + 3u * st])
                * vec4<f32>(wt[s], wt[s + 1u], wt[s + 2u], wt[s + 3u]);
        }
        for (; s < splits; s++) {
            o4.x += part[base + s * st + d] * wt[s];
        }
        out[(t * p.heads + h) * hd + d] = ((o4.x + o4.y) + (o4.z + o4.w)) / l;
    }
}
