// gemv_sum: the end of a batched GEMV split over k (gemv.wgsl's COLS with
// p.split): adds each output's group sums from `part` in order, from 0 (the
// one order of summation, gemv_common.wgsl), and applies the epilogue. The
// defines are those of the GEMV it ends (ADD, NORM, SWIGLU, GELU, CONV);
// the params are the same.
//
// bindings: 0 params, 1 part, CONV: 2 conv [hidden, L], 3 state, 4 step
//           (row records, as the COLS kernel reads them); last: y
// dispatch: (ceil(rows / 64), cols); a thread an output element.

@group(0) @binding(1) var<storage, read> part: array<f32>;
#if CONV
@group(0) @binding(2) var<storage, read> conv: array<f32>;
@group(0) @binding(3) var<storage, read_write> state: array<f32>;
@group(0) @binding(4) var<storage, read> step: array<u32>;
@group(0) @binding(5) var<storage, read_write> y: array<f32>;
#else
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
#endif

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let row = gid.x;
    let col = gid.y;
    if (row >= p.rows || col >= p.cols) {
        return;
    }
    let groups = group_count();
    var v = vec3<f32>();
    for (var q = 0u; q < PARTS; q++) {
        var t = 0.0;
        for (var g = 0u; g < groups; g++) {
            t += part[part_at(g, q, col, row)];
        }
        v[q] = t;
    }
    var ss = 0.0;
#if NORM
    for (var g = 0u; g < groups; g++) {
        ss += part[part_ss_at(g, col)];
    }
#endif
    var place = vec2<u32>();
#if CONV
    place = conv_place(col);
#endif
    finish(row, col, v.x, v.y, v.z, ss, place.x, place.y);
}
