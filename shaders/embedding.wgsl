// embedding: y[t, :] = scale * table[tokens[tok_off + t tok_stride], :], dequantised from any
// format of quant_formats.wgsl. A table split by rows into chunks is read
// with one dispatch per chunk; each writes only the tokens whose rows it holds.
// bindings: 0 params, 1 w: array<u32> (table chunk), 2 tokens: array<u32>,
//           3 y: [n, k] (read_write)
// dispatch: n workgroups of 64 threads, spread over x and y (gpu::ops::groups_1d)

struct Params {
    k: u32,
    n: u32,
    row0: u32,      // first table row in this chunk
    rows: u32,      // rows in this chunk
    d_off: u32,
    tok_off: u32,
    scale: f32,     // Gemma: sqrt(hidden); 1 otherwise
    tok_stride: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read> tokens: array<u32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let t = wid.y * nwg.x + wid.x;
    if (t >= p.n) {
        return;
    }
    let tok = tokens[p.tok_off + t * p.tok_stride];
    if (tok < p.row0 || tok - p.row0 >= p.rows) {
        return;
    }
    let r = tok - p.row0;
    for (var e0 = lid * 8u; e0 < p.k; e0 += 512u) {
        let v = w8(r, e0, p.k, p.d_off);
        let vals = array<f32, 8>(v.a.x, v.a.y, v.a.z, v.a.w, v.b.x, v.b.y, v.b.z, v.b.w);
        for (var i = 0u; i < 8u; i++) {
            if (e0 + i < p.k) {
                y[t * p.k + e0 + i] = vals[i] * p.scale;
            }
        }
    }
}
