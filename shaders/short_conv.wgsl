// short_conv: LFM2's gated short convolution over n tokens (prefill),
// continuing from and updating the state (the last L-1 gated inputs):
// bx[t] = B[t] * X[t]; y[t, c] = C[t, c] * sum_j conv[c, j] seq[t + j, c],
// where seq is the state followed by bx. bcx holds B, C, X side by side.
// bindings: 0 params {hidden, n, l}, 1 bcx: [n, 3 hidden], 2 conv: [hidden, l],
//           3 state: [l-1, hidden] (read_write), 4 y: [n, hidden] (read_write)
// dispatch: ceil(hidden / 64) workgroups of 64 threads, one channel each

struct Params { hidden: u32, n: u32, l: u32, _p0: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> bcx: array<f32>;
@group(0) @binding(2) var<storage, read> conv: array<f32>;
@group(0) @binding(3) var<storage, read_write> state: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;

fn seq(i: u32, c: u32) -> f32 {
    let hist = p.l - 1u;
    if (i < hist) {
        return state[i * p.hidden + c];
    }
    let t = i - hist;
    return bcx[t * 3u * p.hidden + c] * bcx[t * 3u * p.hidden + 2u * p.hidden + c];
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let c = gid.x;
    if (c >= p.hidden) {
        return;
    }
    for (var t = 0u; t < p.n; t++) {
        var a = 0.0;
        for (var j = 0u; j < p.l; j++) {
            a += conv[c * p.l + j] * seq(t + j, c);
        }
        y[t * p.hidden + c] = bcx[t * 3u * p.hidden + p.hidden + c] * a;
    }
    // The new state is seq[n .. n + l - 1]; ascending j only reads entries
    // not yet overwritten (n >= 1).
    for (var j = 0u; j + 1u < p.l; j++) {
        state[j * p.hidden + c] = seq(p.n + j, c);
    }
}
