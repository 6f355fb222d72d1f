// sample_rows: one token drawn from each row of logits where they are, the
// draw of the CPU's `sampling::draw_unsorted` (the sampler without top-k and
// top-p), so that only the tokens leave the device. Workgroup r takes row r
// of x ([rows, n]) with its draw d = draws[r] = (u, 1 / temperature, cut,
// sampled):
//   1. max: the largest finite logit (the first on ties), and whether the
//      row holds a NaN or an infinity;
//   2. thread t sums the weights e^((l - max) / temperature) of the finite
//      logits at or above max + cut in its block, tokens t, t + 256, ...
//      in that order (exp_poly: sampling.rs's polynomial, same constants);
//   3. thread 0 adds the 256 block sums in order, r = u x total, walks the
//      blocks to the one where the running sum passes r, then its tokens.
// A row with sampled = 0 takes step 1's argmax. out[2 r] = the token,
// out[2 r + 1] = 1 when the row holds a NaN or an infinity (the host fails
// the step, as for argmax_rows), else 0.
// bindings: 0 params {n}, 1 x: [rows, n], 2 draws: [rows] vec4, 3 out:
//           array<u32> [2 rows] (read_write)
// dispatch: `rows` workgroups of 256 threads

struct Params { n: u32, _p0: u32, _p1: u32, _p2: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> draws: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> out: array<u32>;

var<workgroup> sums: array<f32, 256>;

fn finite(v: f32) -> bool {
    // Bits, not comparisons: no compiler may assume the value finite.
    return (bitcast<u32>(v) & EXPONENT) != EXPONENT;
}

// e^x as sampling.rs's exp_poly (with FMA): x = n ln 2 + r, Cephes' degree-6
// polynomial for e^r, 2^n put into the exponent bits. n is rounded with
// round(), not exp_poly's 1.5 * 2^23 trick, which a shader compiler may
// fold away ((t + c) - c = t); the two differ only where x log2(e) is within
// an f32 rounding of a half.
fn exp_poly(x0: f32) -> f32 {
    let x = clamp(x0, -87.33655, 88.37626);
    let n = round(x * 1.4426950408889634);
    var r = fma(n, -0.6933594, x);
    r = fma(n, 2.1219444e-4, r);
    var q = 1.9875691e-4;
    q = fma(q, r, 1.3981999e-3);
    q = fma(q, r, 8.333452e-3);
    q = fma(q, r, 4.1665796e-2);
    q = fma(q, r, 0.16666665);
    q = fma(q, r, 0.5);
    let e = fma(q * r, r, r) + 1.0;
    let scale = bitcast<f32>(u32(i32(n) + 127) << 23u);
    return e * scale;
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = wid.x;
    let xo = row * p.n;
    let d = draws[row];
    var v = 0.0;
    var i = NONE;
    var flag = 0u;
    for (var j = lid; j < p.n; j += 256u) {
        let xj = x[xo + j];
        if (!finite(xj)) {
            flag = 1u;
        } else if (better(xj, j, v, i)) {
            v = xj;
            i = j;
        }
    }
    workgroup_best(lid, v, i, flag);
    let max_v = bv[0];
    let best = bi[0];
    let cut = max_v + d.z;
    var sum = 0.0;
    for (var j = lid; j < p.n; j += 256u) {
        let xj = x[xo + j];
        if (finite(xj) && xj >= cut) {
            sum += exp_poly((xj - max_v) * d.y);
        }
    }
    sums[lid] = sum;
    workgroupBarrier();
    if (lid == 0u) {
        var token = select(best, 0u, best == NONE);
        if (d.w != 0.0 && best != NONE) {
            var total = 0.0;
            for (var b = 0u; b < 256u; b++) {
                total += sums[b];
            }
            let r = d.x * total;
            var cum = 0.0;
            var last = NONE;
            for (var b = 0u; b < 256u; b++) {
                let s = sums[b];
                if (s > 0.0) {
                    last = b;
                    if (r < cum + s) {
                        break;
                    }
                    cum += s;
                }
            }
            if (last != NONE) {
                token = last;
                for (var j = last; j < p.n; j += 256u) {
                    let xj = x[xo + j];
                    if (finite(xj) && xj >= cut) {
                        token = j;
                        cum += exp_poly((xj - max_v) * d.y);
                        if (r < cum) {
                            break;
                        }
                    }
                }
            }
        }
        out[2u * row] = token;
        out[2u * row + 1u] = bf[0];
    }
}
