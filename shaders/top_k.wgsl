// top_k: the k largest of x[0..n] (k <= n, k <= 256) as (index, value) pairs
// for sampling with a small readback; which k values are chosen matches a
// stable sort by value, descending (ties at the k-th value go to the lowest
// indices), as cpu::top_k and run::sampling do. Unordered: the host sorts.
// Values are ordered by their bits made monotonic (key), so a radix select
// over four 8-bit digits, most significant first, finds the k-th key T with
// one workgroup histogram per digit; then every key > T and the first
// (lowest-index) keys == T are written, in index order per thread range.
// bindings: 0 params {n, k}, 1 x: [n], 2 out: array<u32> [2 k]
//           (read_write): pairs (index, bitcast<u32>(value))
// dispatch: one workgroup of 256 threads

struct Params { n: u32, k: u32, _p0: u32, _p1: u32 }

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;

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
fn main(@builtin(local_invocation_index) lid: u32) {
    var prefix = 0u;
    var mask = 0u;
    var remaining = p.k;
    for (var round = 0u; round < 4u; round++) {
        let shift = 24u - 8u * round;
        atomicStore(&hist[lid], 0u);
        workgroupBarrier();
        for (var i = lid; i < p.n; i += WG) {
            let kk = key(x[i]);
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
    let chunk = (p.n + WG - 1u) / WG;
    let lo = min(lid * chunk, p.n);
    let hi = min(lo + chunk, p.n);
    var gt = 0u;
    var eq = 0u;
    for (var i = lo; i < hi; i++) {
        let kk = key(x[i]);
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
        let v = x[i];
        let kk = key(v);
        if (kk > prefix) {
            out[2u * at_gt] = i;
            out[2u * at_gt + 1u] = bitcast<u32>(v);
            at_gt++;
        } else if (kk == prefix) {
            if (at_eq < remaining) {
                out[2u * (n_gt + at_eq)] = i;
                out[2u * (n_gt + at_eq) + 1u] = bitcast<u32>(v);
            }
            at_eq++;
        }
    }
}
