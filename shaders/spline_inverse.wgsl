// spline_inverse: the inverse of VITS's rational-quadratic spline with linear tails
// (transforms.unconstrained_rational_quadratic_spline, inverse=True) at every time step:
// y[t] = spline^-1(x[t]) with the knots from h[:, t] = (bins widths, bins heights, each
// * norm, then bins - 1 inner derivatives); |x| > tail passes through.
// As cpu::spline_inverse_rows.
// The length is t = frames * t_mul + t_add with frames = lens[2 s] (t_mul = 0: t fixed when
// recorded); workgroup z runs sentence s = first + z of a batch, each buffer's at s times its
// stride (what lies past a sentence's t is never read or written; a sentence of 0 frames runs
// nothing).
// bindings: 0 params, 1 x: [t], 2 h: [3 bins - 1, t], 3 lens: [frames, total] u32 a
//           sentence, 4 y: [t]
// dispatch: ceil(t / WG) workgroups, up to 65535 along x, then rows of 65535
// (gpu::speech::groups_wide), the sentences along z, direct or indirect; one
// invocation a time step; bins <= 32, the knot arrays' 33 (checked by gpu::speech::spline_inverse).

struct Params {
    t_mul: u32, t_add: i32, bins: u32, norm: f32,
    edge: f32, tail: f32, min_bin: f32, min_deriv: f32,
    first: u32, x_stride: u32, h_stride: u32, _p0: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> h: array<f32>;
@group(0) @binding(3) var<storage, read> lens: array<u32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;

override WG: u32 = 64u;

fn softplus(v: f32) -> f32 {
    if (v > 20.0) {
        return v;
    }
    return log(1.0 + exp(v));
}

fn deriv(i: u32, ti: u32, hb: u32, t: u32) -> f32 {
    var u = p.edge;
    if (i > 0u && i < p.bins) {
        u = h[hb + (2u * p.bins + i - 1u) * t + ti];
    }
    return p.min_deriv + softplus(u);
}

// Knots of the widths (first = 0) or heights (first = bins): softmax of the scaled
// parameters, floored at min_bin, cumulated over [-tail, tail].
fn knots(first: u32, ti: u32, hb: u32, t: u32, k: ptr<function, array<f32, 33>>) {
    var mx = h[hb + first * t + ti] * p.norm;
    for (var b = 1u; b < p.bins; b++) {
        mx = max(mx, h[hb + (first + b) * t + ti] * p.norm);
    }
    var sum = 0.0;
    for (var b = 0u; b < p.bins; b++) {
        sum += exp(h[hb + (first + b) * t + ti] * p.norm - mx);
    }
    let inv = 1.0 / sum;
    var acc = 0.0;
    (*k)[0] = -p.tail;
    for (var b = 0u; b < p.bins; b++) {
        let s = exp(h[hb + (first + b) * t + ti] * p.norm - mx) * inv;
        acc += p.min_bin + (1.0 - p.min_bin * f32(p.bins)) * s;
        (*k)[b + 1u] = 2.0 * p.tail * acc - p.tail;
    }
    (*k)[p.bins] = p.tail;
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let sn = p.first + wid.z;
    let frames = lens[2u * sn];
    if (p.t_mul != 0u && frames == 0u) {
        return;
    }
    let t = u32(i32(frames * p.t_mul) + p.t_add);
    let ti = (wid.y * 65535u + wid.x) * WG + lid;
    if (ti >= t) {
        return;
    }
    let xi = sn * p.x_stride + ti;
    let hb = sn * p.h_stride;
    let xv = x[xi];
    if (!(xv >= -p.tail && xv <= p.tail)) {
        y[xi] = xv;
        return;
    }
    var cw: array<f32, 33>;
    var ch: array<f32, 33>;
    knots(0u, ti, hb, t, &cw);
    knots(p.bins, ti, hb, t, &ch);
    // searchsorted over the height knots, the last one nudged up by 1e-6.
    var bin = 0u;
    for (var i = 0u; i <= p.bins; i++) {
        var k = ch[i];
        if (i == p.bins) {
            k += 1e-6;
        }
        if (xv >= k) {
            bin = i;
        }
    }
    bin = min(bin, p.bins - 1u);
    let in_cw = cw[bin];
    let in_w = cw[bin + 1u] - cw[bin];
    let in_ch = ch[bin];
    let in_h = ch[bin + 1u] - ch[bin];
    let delta = in_h / in_w;
    let d0 = deriv(bin, ti, hb, t);
    let d1 = deriv(bin + 1u, ti, hb, t);
    let dx = xv - in_ch;
    let s = d0 + d1 - 2.0 * delta;
    let qa = dx * s + in_h * (delta - d0);
    let qb = in_h * d0 - dx * s;
    let qc = -delta * dx;
    let disc = max(qb * qb - 4.0 * qa * qc, 0.0);
    let root = (2.0 * qc) / (-qb - sqrt(disc));
    y[xi] = root * in_w + in_cw;
}
