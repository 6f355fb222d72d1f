// pointwise: x[i] = steps applied in order to x[i], in place: a chain of elementwise
//            ops fused after a convolution (see cpu::pointwise_chain for the steps).
// bindings: 0 params {n, plane, channels, count, steps[12]}, 1 x: array<f32> (n, read-write),
//           2 affine: array<f32> (2 * channels: scale then shift; one dummy value when unused)
// step codes (x; y, z are f32 bits of the constants a, b):
//   0 mul a, 1 add a, 2 sub a, 3 div a, 4 clip [a, b], 5 relu, 6 sigmoid,
//   7 hard-sigmoid (alpha a, beta b), 8 hard-swish, 9 channel affine (channel (i / plane) % channels)
// dispatch: ceil(n / WG) workgroups spread over x and y (gpu::ops::groups_1d)

struct Params {
    n: u32, plane: u32, channels: u32, count: u32,
    steps: array<vec4<u32>, 12>,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read> affine: array<f32>;

override WG: u32 = 256u;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = (wid.y * nwg.x + wid.x) * WG + lid;
    if (i >= p.n) {
        return;
    }
    var v = x[i];
    for (var s = 0u; s < p.count; s++) {
        let step = p.steps[s];
        let a = bitcast<f32>(step.y);
        let b = bitcast<f32>(step.z);
        switch step.x {
            case 0u: { v = v * a; }
            case 1u: { v = v + a; }
            case 2u: { v = v - a; }
            case 3u: { v = v / a; }
            case 4u: { v = min(max(v, a), b); }
            case 5u: { v = max(v, 0.0); }
            case 6u: { v = 1.0 / (1.0 + exp(-v)); }
            case 7u: { v = clamp(a * v + b, 0.0, 1.0); }
            case 8u: { v = v * clamp(v + 3.0, 0.0, 6.0) / 6.0; }
            case 9u: {
                let ch = (i / p.plane) % p.channels;
                v = v * affine[ch] + affine[p.channels + ch];
            }
            default: {}
        }
    }
    x[i] = v;
}
