// conv1d: y[o, t] = act_out(b[o] + sum_{i,k} w[o, i, k] * act_in(x[i, t + k*dilation - pad_left])
//                  + res[o, t] + sum[o, t])
// with act_in(v) = leaky_relu(v * in_scale, in_slope) (in_slope 1 = identity) and
// act_out = tanh when TANH, else identity; out-of-range inputs are zero padding.
// Stride 1, groups 1 (what the HiFi-GAN decoder and the flow's WaveNet use).
// The input length is t_in = frames * t_mul + t_add with frames = lens[2 s] (sentence s's
// frame count, written on the device; t_mul = 0 for a length fixed when recorded), and
// t_out = t_in + pad_left + pad_right - dilation * (kernel - 1). Workgroup z runs sentence
// s = first + z of a batch: its x at s * x_stride, its y, res and sum at s * y_stride; a
// sentence of 0 frames (past its buffers) runs nothing.
// bindings: 0 params, 1 x: [c_in, t_in], 2 w: packed [c_in, kernel, c_out_pad / 4] vec4
//           (gpu::speech::pack_conv1d_weights; c_out_pad = c_out rounded up to 8, zeros),
//           3 b: [c_out], 4 res: [c_out, t_out] (read only with RES), 5 sum: [c_out, t_out]
//           (read only with SUM), 6 lens: [frames, total] u32 a sentence, 7 y: [c_out, t_out]
// (each a sentence's, one after another)
// dispatch: (ceil(t_out / WG), ceil(c_out / 8), sentences), direct or indirect (sized on the
// device for the longest sentence; workgroups past t_out return); each invocation computes one time
// step for 8 output channels, so every input value read feeds 8 products, held in two
// vec4 registers, and the whole workgroup reads the same two vec4 weights.

struct Params {
    c_in: u32, c_out: u32, t_mul: u32, t_add: i32,
    kernel: u32, dilation: u32, pad_left: u32, pad_right: u32,
    in_scale: f32, in_slope: f32, flags: u32, c_out_pad: u32,
    first: u32, x_stride: u32, y_stride: u32, _p0: u32,
}

// flags
const RES: u32 = 1u;
const SUM: u32 = 2u;
const TANH: u32 = 4u;

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> b: array<f32>;
@group(0) @binding(4) var<storage, read> res: array<f32>;
@group(0) @binding(5) var<storage, read> sum: array<f32>;
@group(0) @binding(6) var<storage, read> lens: array<u32>;
@group(0) @binding(7) var<storage, read_write> y: array<f32>;

override WG: u32 = 64u;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let s = p.first + wid.z;
    let frames = lens[2u * s];
    if (p.t_mul != 0u && frames == 0u) {
        return;
    }
    let t_in = u32(i32(frames * p.t_mul) + p.t_add);
    let xb = s * p.x_stride;
    let yb = s * p.y_stride;
    let t_out = i32(t_in + p.pad_left + p.pad_right) - i32(p.dilation * (p.kernel - 1u));
    let t = wid.x * WG + lid;
    let o0 = wid.y * 8u;
    if (i32(t) >= t_out) {
        return;
    }
    var acc0 = vec4<f32>(0.0);
    var acc1 = vec4<f32>(0.0);
    let row = p.c_out_pad / 4u;
    for (var k = 0u; k < p.kernel; k++) {
        let src = i32(t + k * p.dilation) - i32(p.pad_left);
        if (src < 0 || src >= i32(t_in)) {
            continue;
        }
        var xi = xb + u32(src);
        var wi = k * row + o0 / 4u;
        let wstep = p.kernel * row;
        for (var i = 0u; i < p.c_in; i++) {
            var v = x[xi] * p.in_scale;
            if (v < 0.0) {
                v = v * p.in_slope;
            }
            acc0 += v * w[wi];
            acc1 += v * w[wi + 1u];
            xi += t_in;
            wi += wstep;
        }
    }
    for (var j = 0u; j < 8u; j++) {
        let o = o0 + j;
        if (o >= p.c_out) {
            break;
        }
        var v = b[o];
        if (j < 4u) {
            v += acc0[j];
        } else {
            v += acc1[j - 4u];
        }
        let at = yb + o * u32(t_out) + t;
        if ((p.flags & RES) != 0u) {
            v += res[at];
        }
        if ((p.flags & SUM) != 0u) {
            v += sum[at];
        }
        if ((p.flags & TANH) != 0u) {
            v = tanh(v);
        }
        y[at] = v;
    }
}
