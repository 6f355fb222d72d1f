// attention_tiled_merge: combines the partial results of attention_tiled's
// SPLIT variant (per row, head and split: the unnormalised sums acc_s, the
// running max m_s and sum l_s) into the attention output:
//   M = max_s m_s, out = sum_s acc_s e^(m_s - M) / sum_s l_s e^(m_s - M)
// (a split without keys has m_s = -3e38 and l_s = 0: it weighs nothing).
// bindings: 0 params {rows, heads, splits, head_dim},
//           1 part: array<f32> [rows, heads, splits, head_dim + 2],
//           2 out: array<f32> [rows, heads * head_dim] (read_write)
// dispatch: (rows, heads, 1) workgroups of 64 threads, thread e on head
// dimension e (head_dim <= 64).

struct Params { rows: u32, heads: u32, splits: u32, head_dim: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> part: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;

const LOWEST: f32 = -3.0e38;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) e: u32) {
    let row = wid.x;
    let h = wid.y;
    let w = p.head_dim + 2u;
    let base = (row * p.heads + h) * p.splits * w;
    var mx = LOWEST;
    for (var s = 0u; s < p.splits; s++) {
        mx = max(mx, part[base + s * w + p.head_dim]);
    }
    var total = 0.0;
    var acc = 0.0;
    for (var s = 0u; s < p.splits; s++) {
        let at = base + s * w;
        let weight = exp(part[at + p.head_dim] - mx);
        total += weight * part[at + p.head_dim + 1u];
        if (e < p.head_dim) {
            acc += weight * part[at + e];
        }
    }
    if (e < p.head_dim) {
        out[(row * p.heads + h) * p.head_dim + e] = acc / total;
    }
}
