// argmax in two kernels from this file, the first one on ties (torch.argmax,
// cpu::argmax); NaNs are never chosen over a number, and any NaN or infinity
// in x is flagged, so a greedy step reading back only its token still sees
// damaged logits:
//   argmax_part (PARTIAL): workgroup g finds the best of x[g CHUNK ..
//       (g + 1) CHUNK) and writes (value bits, index, flag) to part[3 g ..
//       3 g + 3) (index NONE for an empty or all-NaN slice; flag 1 when the
//       slice holds a NaN or an infinity, else 0);
//   argmax: out[0] = the index of the best of the `groups` triples in part
//       (0 when none), out[1] = 1 when any of them is flagged, else 0.
// bindings: 0 params {n, groups}, PARTIAL: 1 x: [n], 2 part: array<u32> [3 groups];
//           otherwise 1 part, 2 out: array<u32> [2] (read_write)
// dispatch: PARTIAL: `groups` = ceil(n / CHUNK) workgroups; argmax: one;
//           256 threads each
// ROWS (argmax_part_rows, argmax_rows; batched decode): the same for each
//   of several rows of x ([rows, n]): row r's slices are workgroups (g, r)
//   writing part[3 (r groups + g) ..], and workgroup r of argmax writes
//   out[2 r], out[2 r + 1].
// MASKED (argmax_part_masked; decoding under a grammar): PARTIAL over only
//   the x[j] whose bit j % 32 of mask[j / 32] is set (3 mask: array<u32>
//   [ceil(n / 32)]), so the logits never leave the device; the non-finite
//   flag still covers every x[j], as the host's check of all logits does.

struct Params { n: u32, groups: u32, _p1: u32, _p2: u32 }

@group(0) @binding(0) var<uniform> p: Params;
#if PARTIAL
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> part: array<u32>;
#if MASKED
@group(0) @binding(3) var<storage, read> mask: array<u32>;
#endif
#else
@group(0) @binding(1) var<storage, read> part: array<u32>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;
#endif

const CHUNK: u32 = 1024u;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    var v = 0.0;
    var i = NONE;
    var flag = 0u;
#if ROWS
#if PARTIAL
    let xo = wid.y * p.n;
    let po = 3u * (wid.y * p.groups + wid.x);
#else
    let po = 3u * wid.x * p.groups;
    let oo = 2u * wid.x;
#endif
#else
#if PARTIAL
    let xo = 0u;
    let po = 3u * wid.x;
#else
    let po = 0u;
    let oo = 0u;
#endif
#endif
#if PARTIAL
    let end = min(p.n, (wid.x + 1u) * CHUNK);
    for (var j = wid.x * CHUNK + lid; j < end; j += 256u) {
        let xj = x[xo + j];
        // Bits, not comparisons: no compiler may assume the value finite.
        if ((bitcast<u32>(xj) & EXPONENT) == EXPONENT) {
            flag = 1u;
        }
#if MASKED
        let allowed = ((mask[j >> 5u] >> (j & 31u)) & 1u) == 1u;
#else
        let allowed = true;
#endif
        if (allowed && xj == xj && better(xj, j, v, i)) {
            v = xj;
            i = j;
        }
    }
#else
    for (var g = lid; g < p.groups; g += 256u) {
        let vg = bitcast<f32>(part[po + 3u * g]);
        let ig = part[po + 3u * g + 1u];
        flag = max(flag, part[po + 3u * g + 2u]);
        if (better(vg, ig, v, i)) {
            v = vg;
            i = ig;
        }
    }
#endif
    workgroup_best(lid, v, i, flag);
    if (lid == 0u) {
#if PARTIAL
        part[po] = bitcast<u32>(bv[0]);
        part[po + 1u] = bi[0];
        part[po + 2u] = bf[0];
#else
        out[oo] = select(bi[0], 0u, bi[0] == NONE);
        out[oo + 1u] = bf[0];
#endif
    }
}
