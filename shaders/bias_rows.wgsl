// bias_rows: y[t, j] = bias[j] + residual[t, j] (either term optional): the
// starting value of a linear layer's output that a GEMM then adds its
// products to (gemm_add), so bias and residual cost no extra epilogue.
// bindings: 0 params {cols, rows, has_bias, has_residual}, 1 bias: [cols],
//           2 residual: [rows, cols], 3 y: [rows, cols] (read_write)
// dispatch: ceil(rows cols / 256) workgroups, spread over x and y (gpu::ops::groups_1d)

struct Params { cols: u32, rows: u32, has_bias: u32, has_residual: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> bias: array<f32>;
@group(0) @binding(2) var<storage, read> residual: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let idx = (wid.y * nwg.x + wid.x) * 256u + lid;
    if (idx >= p.cols * p.rows) {
        return;
    }
    var v = 0.0;
    if (p.has_bias != 0u) {
        v = bias[idx % p.cols];
    }
    if (p.has_residual != 0u) {
        v += residual[idx];
    }
    y[idx] = v;
}
