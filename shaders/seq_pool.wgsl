// seq_pool: sentence-transformers' pooling of a ragged batch, on the device,
// so an embedding pass reads back one vector a sequence instead of every
// token's hidden state. For sequence s (rows q_start .. q_start + q_len of
// x) and each requested mode m, out[s, m * d + c] is, over its rows r in order:
//   0 cls:           x[first, c]
//   1 last:          x[last, c]
//   2 max:           max_r x[r, c]
//   3 mean:          sum_r x[r, c] / n
//   4 mean_sqrt_len: sum_r x[r, c] / sqrt(n)
//   5 weighted_mean: sum_r (i + 1) x[r, c] / sum_i (i + 1)   (i: the row's index in s)
// The sums run over the rows in order, as the CPU twin (run::embed::pool) does.
// bindings: 0 params, 1 x: [rows, d], 2 seqs: array<u32>, per sequence
//           {q_start, q_len, kv_start, kv_len} (gpu::dense::pack_seqs),
//           3 out: [n_seqs, n_modes * d] (read_write)
// dispatch: one workgroup of 64 threads a sequence, spread over x and y
// (gpu::ops::groups_1d); the threads stride over the columns.

struct Params {
    d: u32, n_seqs: u32, n_modes: u32, _p0: u32,
    modes: vec4<u32>,   // modes 0..3 in the order of the output
    modes2: vec4<u32>,  // modes 4, 5
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> seqs: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

fn mode_at(i: u32) -> u32 {
    if (i < 4u) {
        return p.modes[i];
    }
    return p.modes2[i - 4u];
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let s = wid.y * nwg.x + wid.x;
    if (s >= p.n_seqs) {
        return;
    }
    let start = seqs[4u * s];
    let n = seqs[4u * s + 1u];
    let width = p.n_modes * p.d;
    for (var mi = 0u; mi < p.n_modes; mi++) {
        let mode = mode_at(mi);
        for (var c = lid; c < p.d; c += 64u) {
            var v = 0.0;
            switch mode {
                case 0u: { v = x[start * p.d + c]; }
                case 1u: { v = x[(start + n - 1u) * p.d + c]; }
                case 2u: {
                    v = x[start * p.d + c];
                    for (var r = 1u; r < n; r++) {
                        v = max(v, x[(start + r) * p.d + c]);
                    }
                }
                default: {
                    var total = 0.0;
                    for (var r = 0u; r < n; r++) {
                        var w = 1.0;
                        if (mode == 5u) {
                            w = f32(r + 1u);
                        }
                        total += w;
                        v += w * x[(start + r) * p.d + c];
                    }
                    if (mode == 4u) {
                        total = sqrt(total);
                    }
                    v /= total;
                }
            }
            out[s * width + mi * p.d + c] = v;
        }
    }
}
