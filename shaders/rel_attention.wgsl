// rel_attention: VITS's multi-head self-attention with relative-position keys and
// values shared by all heads (attentions.MultiHeadAttention, window_size set), over
// [channels, time] activations. For head h, query i: s_j = qs . k_j (+ qs . rel_k[j - i + w]
// when |j - i| <= w) with qs = q_i / sqrt(dk); p = softmax(s); y_i = sum_j p_j v_j
// + sum_{|r| <= w} p_{i+r} rel_v[r + w].
// bindings: 0 params, 1 qkv: [3 c, t] (q channels 0..c, k c..2c, v 2c..3c; head h is
//           channels h dk .. (h + 1) dk of each), 2 rel_k: [2w + 1, dk], 3 rel_v: [2w + 1, dk],
// The length is t = frames * t_mul + t_add with frames = lens[2 s] (t_mul = 0: t fixed when
// recorded); workgroup z runs sentence s = first + z of a batch, each buffer's at s times its
// stride (what lies past a sentence's t is never read or written; a sentence of 0 frames runs
// nothing).
//           4 scores: [heads, t, t] scratch (scores, then exp(s - max)), 5 lens: [frames,
//           total] u32 a sentence, 6 y: [c, t]
// dispatch: (t, heads, sentences) workgroups of WG, direct or indirect (sized for the
// longest; queries past a sentence's t return): the threads split the keys (scores, max,
// sum), then the head's dk channels (the weighted sums), so no thread loops over
// more than ceil(t / WG) * 2 dk or ceil(dk / WG) * (t + 2w + 1) steps.

struct Params {
    t_mul: u32, t_add: i32, dk: u32, heads: u32,
    window: u32, scale: f32, first: u32, x_stride: u32,
    scores_stride: u32, y_stride: u32, _p0: u32, _p1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> qkv: array<f32>;
@group(0) @binding(2) var<storage, read> rel_k: array<f32>;
@group(0) @binding(3) var<storage, read> rel_v: array<f32>;
@group(0) @binding(4) var<storage, read_write> scores: array<f32>;
@group(0) @binding(5) var<storage, read> lens: array<u32>;
@group(0) @binding(6) var<storage, read_write> y: array<f32>;

const WG: u32 = 64u;

// dk <= MAX_DK (checked by gpu::speech::rel_attention).
const MAX_DK: u32 = 256u;

var<workgroup> red: array<f32, WG>;
var<workgroup> qs: array<f32, MAX_DK>;

// Max (when is_max) or sum of `v` over the workgroup, returned to every thread.
fn reduce(v: f32, lid: u32, is_max: bool) -> f32 {
    red[lid] = v;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride /= 2u) {
        if (lid < stride) {
            if (is_max) {
                red[lid] = max(red[lid], red[lid + stride]);
            } else {
                red[lid] += red[lid + stride];
            }
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let sn = p.first + wid.z;
    let frames = lens[2u * sn];
    let t = u32(i32(frames * p.t_mul) + p.t_add);
    let i = wid.x;
    // Uniform per workgroup: the barriers below stay in uniform control flow.
    if ((p.t_mul != 0u && frames == 0u) || i >= t) {
        return;
    }
    let h = wid.y;
    let dk = p.dk;
    let c = p.heads * dk;
    let xb = sn * p.x_stride;
    let q0 = xb + h * dk * t + i;
    let k0 = xb + (c + h * dk) * t;
    let v0 = xb + (2u * c + h * dk) * t;
    let row = sn * p.scores_stride + (h * t + i) * t;
    let w = i32(p.window);
    // The scaled query, once for the workgroup.
    for (var d = lid; d < dk; d += WG) {
        qs[d] = qkv[q0 + d * t] * p.scale;
    }
    workgroupBarrier();
    // Scores. A finite floor (not a constant -inf, which Tint refuses) starts the
    // max; threads without a key (t < WG) keep it.
    var mx = -3.0e38;
    for (var j = lid; j < t; j += WG) {
        var s = 0.0;
        for (var d = 0u; d < dk; d++) {
            s += qs[d] * qkv[k0 + d * t + j];
        }
        let r = i32(j) - i32(i);
        if (abs(r) <= w) {
            let e = u32(r + w) * dk;
            var sr = 0.0;
            for (var d = 0u; d < dk; d++) {
                sr += qs[d] * rel_k[e + d];
            }
            s += sr;
        }
        scores[row + j] = s;
        mx = max(mx, s);
    }
    mx = reduce(mx, lid, true);
    var sum = 0.0;
    for (var j = lid; j < t; j += WG) {
        let e = exp(scores[row + j] - mx);
        scores[row + j] = e;
        sum += e;
    }
    sum = reduce(sum, lid, false);
    // Every thread's exponentials are written before any thread reads them.
    storageBarrier();
    workgroupBarrier();
    let inv = 1.0 / sum;
    for (var d = lid; d < dk; d += WG) {
        var o = 0.0;
        for (var j = 0u; j < t; j++) {
            o += (scores[row + j] * inv) * qkv[v0 + d * t + j];
        }
        for (var r = -w; r <= w; r++) {
            let j = i32(i) + r;
            if (j >= 0 && j < i32(t)) {
                o += (scores[row + u32(j)] * inv) * rel_v[u32(r + w) * dk + d];
            }
        }
        y[sn * p.y_stride + (h * dk + d) * t + i] = o;
    }
}
