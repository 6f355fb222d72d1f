// short_conv: LFM2's gated short convolution over n tokens (prefill) at
// positions pos0 = step[1] onwards, continuing from and updating the state:
// bx[t] = B[t] * X[t]; y[t, c] = C[t, c] * sum_j conv[c, j] seq[t + j, c],
// where seq is bx of positions pos0 - (l - 1) .. pos0 + n - 1. bcx holds B, C,
// X side by side. The state is the ring gemv_conv keeps: [ring, hidden]
// (ring >= l), bx of position q in row q % ring.
// bindings: 0 params {hidden, n, l, ring}, 1 bcx: [n, 3 hidden], 2 conv: [hidden, l],
//           3 state: [ring, hidden] (read_write), 4 step: array<u32> [token, pos0, ...],
//           5 y: [n, hidden] (read_write)
// dispatch: (ceil(hidden / 64), ceil(n / TOK)) workgroups of 64 threads, one
//           channel each, over a block of TOK tokens; needs l - 1 <= TOK
//
// Only the first token block reads the state (its first l - 1 tokens reach
// back before pos0), so only its threads write it, each its own channel
// after its own reads: the other blocks never touch it, and no two
// workgroups race on it.

struct Params { hidden: u32, n: u32, l: u32, ring: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> bcx: array<f32>;
@group(0) @binding(2) var<storage, read> conv: array<f32>;
@group(0) @binding(3) var<storage, read_write> state: array<f32>;
@group(0) @binding(4) var<storage, read> step: array<u32>;
@group(0) @binding(5) var<storage, read_write> y: array<f32>;

fn bx(t: u32, c: u32) -> f32 {
    return bcx[t * 3u * p.hidden + c] * bcx[t * 3u * p.hidden + 2u * p.hidden + c];
}

fn seq(i: u32, c: u32, pos0: u32) -> f32 {
    let hist = p.l - 1u;
    if (i < hist) {
        // Position pos0 - hist + i, congruent to pos0 + ring - hist + i.
        return state[((pos0 + p.ring - hist + i) % p.ring) * p.hidden + c];
    }
    return bx(i - hist, c);
}

const TOK: u32 = 16u;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let c = gid.x;
    if (c >= p.hidden) {
        return;
    }
    let pos0 = step[1];
    let t0 = wid.y * TOK;
    for (var t = t0; t < min(t0 + TOK, p.n); t++) {
        var a = 0.0;
        for (var j = 0u; j < p.l; j++) {
            a += conv[c * p.l + j] * seq(t + j, c, pos0);
        }
        y[t * p.hidden + c] = bcx[t * 3u * p.hidden + p.hidden + c] * a;
    }
    if (wid.y != 0u) {
        return;
    }
    // The chunk's last (up to ring) positions into their rows, after all
    // reads.
    for (var t = select(0u, p.n - p.ring, p.n > p.ring); t < p.n; t++) {
        state[((pos0 + t) % p.ring) * p.hidden + c] = bx(t, c);
    }
}
