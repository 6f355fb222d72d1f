// The workgroup's best (value, index) with the first index on ties, and
// whether any thread saw a NaN or an infinity: shared by argmax.wgsl and
// sample.wgsl (their first step), which are concatenated after this file.

const NONE: u32 = 0xffffffffu;
// The exponent bits of an f32: all set for an infinity or a NaN.
const EXPONENT: u32 = 0x7f800000u;

var<workgroup> bv: array<f32, 256>;
var<workgroup> bi: array<u32, 256>;
var<workgroup> bf: array<u32, 256>;

// (v, i) beats (w, j): strictly greater, or the same value earlier; an empty
// slot (index NONE) loses to anything.
fn better(v: f32, i: u32, w: f32, j: u32) -> bool {
    if (i == NONE) {
        return false;
    }
    if (j == NONE) {
        return true;
    }
    return v > w || (v == w && i < j);
}

// Reduces the 256 threads' (v, i, flag) over the workgroup: afterwards
// bv[0], bi[0] hold the best and bf[0] the largest flag. Every thread calls
// it, in uniform control flow.
fn workgroup_best(lid: u32, v: f32, i: u32, flag: u32) {
    bv[lid] = v;
    bi[lid] = i;
    bf[lid] = flag;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s >>= 1u) {
        if (lid < s) {
            if (better(bv[lid + s], bi[lid + s], bv[lid], bi[lid])) {
                bv[lid] = bv[lid + s];
                bi[lid] = bi[lid + s];
            }
            bf[lid] = max(bf[lid], bf[lid + s]);
        }
        workgroupBarrier();
    }
}
