// top_k: the k largest of n values (k <= n, k <= 256) as (index, value) pairs
// for sampling with a small readback; which k values are chosen matches a
// stable sort by value, descending (ties at the k-th value go to the lowest
// indices), as cpu::top_k and run::sampling do. Unordered: the host sorts.
// Values are ordered by their bits made monotonic (key), so a radix select
// over four 8-bit digits, most significant first, finds the k-th key T with
// one workgroup histogram per digit; then every key > T and the first
// (lowest-index) keys == T are written, in index order per thread range:
// all keys > T in index order, then the ties, in index order.
// Three kernels from this file (gpu::llm_ops::top_k):
//   top_k           one workgroup over x[0..n];
//   top_k_part      PARTIAL: workgroup g over the slice x[g SLICE .. (g + 1)
//                   SLICE) (the last one also takes the rest up to n, so each
//                   holds >= k values), its k pairs to out[2 k g ..];
//   top_k (MERGE)   one workgroup over n pairs (index, value bits) from
//                   top_k_part, keeping their indices. Ties at the final
//                   threshold lie in index order in that list (slices in
//                   order; within one, in one group), so the result is the
//                   one-workgroup kernel's.
// MASKED (top_k_masked, top_k_part_masked; sampling under a grammar): the
//   same over x with every value whose bit i % 32 of allowed[i / 32] is
//   clear taken as -inf (3 allowed: array<u32> [ceil(n / 32)]), unless it
//   is not finite: a NaN or an infinity still shows among the candidates,
//   for the host's check of damaged logits.
// ROWS (top_k_rows, top_k_part_rows; batched decode): the same for each of
//   several rows of x ([rows, n]; MERGE: [rows, n] pairs), row r in
//   workgroups (g, r): its pairs at out[2 k r ..] (PARTIAL: [2 k (r groups
//   + g) ..]).
// bindings: 0 params {n, k}, 1 x: [n] (MERGE: array<u32> [2 n] pairs),
//           2 out: array<u32> [2 k] (PARTIAL: [2 k groups]) (read_write):
//           pairs (index, bitcast<u32>(value))
// dispatch: one workgroup of 256 threads; PARTIAL: floor(n / SLICE)

struct Params { n: u32, k: u32, _p0: u32, _p1: u32 }

@group(0) @binding(0) var<uniform> p: Params;
#if MERGE
@group(0) @binding(1) var<storage, read> x: array<u32>;
#else
@group(0) @binding(1) var<storage, read> x: array<f32>;
#endif
@group(0) @binding(2) var<storage, read_write> out: array<u32>;
#if MASKED
@group(0) @binding(3) var<storage, read> allowed: array<u32>;
#endif

const SLICE: u32 = 4096u;

// Where this workgroup's row starts in x (ROWS), in values or pairs.
var<private> xo: u32 = 0u;

#if MERGE
fn value(i: u32) -> f32 {
    return bitcast<f32>(x[2u * (xo + i) + 1u]);
}
fn index(i: u32) -> u32 {
    return x[2u * (xo + i)];
}
#else
fn value(i: u32) -> f32 {
#if MASKED
    let v = x[xo + i];
    let on = ((allowed[i >> 5u] >> (i & 31u)) & 1u) == 1u;
    let finite = (bitcast<u32>(v) & 0x7f800000u) != 0x7f800000u;
    // -inf from v's bits at run time: Tint (Chrome) refuses -inf as a
    // constant expression.
    let neg_inf = bitcast<f32>((bitcast<u32>(v) & 0u) | 0xff800000u);
    return select(v, neg_inf, !on && finite);
#else
    return x[xo + i];
#endif
}
fn index(i: u32) -> u32 {
    return i;
}
#endif

const WG: u32 = 256u;

var<workgroup> hist: array<atomic<u32>, 256>;
var<workgroup> chosen: vec2<u32>; // (prefix so far, how many keys == prefix to take)
var<workgroup> scan_gt: array<u32, 256>;
var<workgroup> scan_eq: array<u32, 256>;

// Larger value, larger key (negative values have all bits flipped).
fn key(v: f32) -> u32 {
    let b = bitcast<u32>(v);
    return select(b | 0x80000000u, ~b, (b & 0x80000000u) != 0u);
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
#if ROWS
    xo = wid.y * p.n;
#if PARTIAL
    let group = wid.y * (p.n / SLICE) + wid.x;
#else
    let group = wid.y;
#endif
#else
    let group = wid.x;
#endif
#if PARTIAL
    let first = wid.x * SLICE;
    let end = select(first + SLICE, p.n, wid.x + 1u == p.n / SLICE);
    let base = group * p.k;
#else
    let first = 0u;
    let end = p.n;
    let base = group * p.k;
#endif
    var prefix = 0u;
    var mask = 0u;
    var remaining = p.k;
    for (var round = 0u; round < 4u; round++) {
        let shift = 24u - 8u * round;
        atomicStore(&hist[lid], 0u);
        workgroupBarrier();
        for (var i = first + lid; i < end; i += WG) {
            let kk = key(value(i));
            if ((kk & mask) == prefix) {
                atomicAdd(&hist[(kk >> shift) & 255u], 1u);
            }
        }
        workgroupBarrier();
        if (lid == 0u) {
            // The digit at which the count of larger-or-equal keys reaches
            // the number still to find.
            var above = 0u;
            var digit = 0u;
            for (var d = 255; d >= 0; d--) {
                let c = atomicLoad(&hist[u32(d)]);
                if (above + c >= remaining) {
                    digit = u32(d);
                    break;
                }
                above += c;
            }
            chosen = vec2<u32>(prefix | (digit << shift), remaining - above);
        }
        workgroupBarrier();
        prefix = chosen.x;
        remaining = chosen.y;
        mask |= 255u << shift;
        workgroupBarrier();
    }
    // prefix is now the k-th largest key T; take every key > T and the
    // first `remaining` keys == T by index.
    let chunk = (end - first + WG - 1u) / WG;
    let lo = min(first + lid * chunk, end);
    let hi = min(lo + chunk, end);
    var gt = 0u;
    var eq = 0u;
    for (var i = lo; i < hi; i++) {
        let kk = key(value(i));
        gt += u32(kk > prefix);
        eq += u32(kk == prefix);
    }
    scan_gt[lid] = gt;
    scan_eq[lid] = eq;
    workgroupBarrier();
    // Inclusive prefix sums over the threads (Hillis-Steele).
    for (var s = 1u; s < WG; s <<= 1u) {
        var a = 0u;
        var b = 0u;
        if (lid >= s) {
            a = scan_gt[lid - s];
            b = scan_eq[lid - s];
        }
        workgroupBarrier();
        scan_gt[lid] += a;
        scan_eq[lid] += b;
        workgroupBarrier();
    }
    var at_gt = scan_gt[lid] - gt;
    var at_eq = scan_eq[lid] - eq;
    let n_gt = p.k - remaining;
    for (var i = lo; i < hi; i++) {
        let v = value(i);
        let kk = key(v);
        if (kk > prefix) {
            out[2u * (base + at_gt)] = index(i);
            out[2u * (base + at_gt) + 1u] = bitcast<u32>(v);
            at_gt++;
        } else if (kk == prefix) {
            if (at_eq < remaining) {
                out[2u * (base + n_gt + at_eq)] = index(i);
                out[2u * (base + n_gt + at_eq) + 1u] = bitcast<u32>(v);
            }
            at_eq++;
        }
    }
}
