// short_conv: LFM2's gated short convolution over n tokens (prefill) at
// positions pos0 = step[1] onwards, continuing from and updating the state:
// bx[t] = B[t] * X[t]; y[t, c] = C[t, c] * sum_j conv[c, j] seq[t + j, c],
// where seq is bx of positions pos0 - (l - 1) .. pos0 + n - 1. bcx holds B, C,
// X side by side. The state is the ring gemv_conv keeps: [ring, hidden]
// (ring >= l), bx of position q in row q % ring.
// bindings: 0 params {hidden, n, l, ring}, 1 bcx: [n, 3 hidden], 2 conv: [hidden, l],
//           3 state: [ring, hidden] (read_write), 4 step: array<u32> [token, pos0, ...],
//           5 y: [n, hidden] (read_write)
// dispatch: (ceil(hidden / 64), ceil(n / TOK)) workgroups of 256 threads,
//           64 channels over a block of TOK tokens, each channel's tokens
//           shared by 4 threads (SUB each); needs l - 1 <= TOK
//
// Only the first token block reads the state (its first l - 1 tokens reach
// back before pos0), so only its threads write it, after a barrier behind
// every read: the other blocks never touch it, and no two workgroups race
// on it.
// ROWS (short_conv_rows, batched prefill): the n rows are the prompt chunks
//   of several sequences one after another, each at its own positions with
//   its own ring. Row t's record (step[8 t ..], gpu::llm_ops::ROW_RECORD)
//   gives its ring's first row (step[8 t + 5]) and its sequence's first and
//   past-last rows (step[8 t + 6], step[8 t + 7]); the sequence's first row
//   holds its pos0. Workgroup y takes the token block that starts at row
//   step[9 n + y] (0xffffffff: none), a block never crossing sequences, so
//   each sequence's rows run exactly as the single kernel runs them alone.
//   It also keeps the last l - 1 values of bx of every KV cache block it
//   fills (paged_cache.wgsl; the block table of row t starts at
//   step[step[8 t + 4]]) in hist ([blocks, l - 1, hidden], binding 6): the
//   state a sequence that takes the block from the prefix cache starts
//   from.

struct Params { hidden: u32, n: u32, l: u32, ring: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> bcx: array<f32>;
@group(0) @binding(2) var<storage, read> conv: array<f32>;
@group(0) @binding(3) var<storage, read_write> state: array<f32>;
@group(0) @binding(4) var<storage, read> step: array<u32>;
@group(0) @binding(5) var<storage, read_write> y: array<f32>;
#if ROWS
@group(0) @binding(6) var<storage, read_write> hist: array<f32>;
#endif

fn bx(t: u32, c: u32) -> f32 {
    return bcx[t * 3u * p.hidden + c] * bcx[t * 3u * p.hidden + 2u * p.hidden + c];
}

// Element i of seq for the sequence whose first row is `first` and whose
// ring starts at row `rb` of the state.
fn seq(i: u32, c: u32, pos0: u32, first: u32, rb: u32) -> f32 {
    let hist = p.l - 1u;
    if (i < hist) {
        // Position pos0 - hist + i, congruent to pos0 + ring - hist + i.
        return state[(rb + (pos0 + p.ring - hist + i) % p.ring) * p.hidden + c];
    }
    return bx(first + i - hist, c);
}

// Tokens a workgroup (a block), and a thread's share of them: 4 threads a
// channel, so a chunk's blocks fill a large GPU (BENCHMARKS.md,
// thirty-eighth session).
const TOK: u32 = 16u;
const SUB: u32 = 4u;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let c = wid.x * 64u + (lid & 63u);
    let part = lid >> 6u;
#if ROWS
    let t0 = step[9u * p.n + wid.y];
    if (t0 == 0xffffffffu) {
        return;
    }
    let first = step[8u * t0 + 6u];
    let end = step[8u * t0 + 7u];
    let rb = step[8u * t0 + 5u];
    let pos0 = step[8u * first + 1u];
#else
    let t0 = wid.y * TOK;
    let first = 0u;
    let end = p.n;
    let rb = 0u;
    let pos0 = step[1];
#endif
    let live = c < p.hidden;
    if (live) {
        let ta = t0 + part * SUB;
        for (var t = ta; t < min(ta + SUB, end); t++) {
            var a = 0.0;
            for (var j = 0u; j < p.l; j++) {
                a += conv[c * p.l + j] * seq(t - first + j, c, pos0, first, rb);
            }
            y[t * p.hidden + c] = bcx[t * 3u * p.hidden + p.hidden + c] * a;
#if ROWS
            // One of the last l - 1 positions of its block.
            let q = pos0 + t - first;
            let h = p.l - 1u;
            let r = q % KV_BLOCK;
            if (r + h >= KV_BLOCK) {
                let b = step[step[8u * t + 4u] + q / KV_BLOCK];
                hist[(b * h + r + h - KV_BLOCK) * p.hidden + c] = bx(t, c);
            }
#endif
        }
    }
    // Every thread's reads of the state (the first block's) before it is
    // written: a storage barrier, as the rows read and written may be the
    // same (the ring wraps) and are storage.
    storageBarrier();
    if (t0 != first || !live) {
        return;
    }
    // The chunk's last (up to ring) positions into their rows.
    let n = end - first;
    for (var t = select(0u, n - p.ring, n > p.ring) + part; t < n; t += SUB) {
        state[(rb + (pos0 + t) % p.ring) * p.hidden + c] = bx(first + t, c);
    }
}
