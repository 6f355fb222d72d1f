// durations: a sentence's frames, computed on the device so that the length regulation,
// the flow and the decoder follow the duration predictor in the same submission.
// d[j] = ceil(exp(logw[j]) * length_scale) with logw = (z[j] - m) * inv (the duration
// predictor's last, affine, flow), 0 where that is not a positive finite number, at most
// MAX_PHONEME_FRAMES; ends[j] = d[0] + ... + d[j] (saturating); for sentence s of a batch,
// lens[2 s ..] = [frames, total] with total = ends[t - 1] and frames = max(total, 1), or 0
// when total is past cap (what the buffers behind it hold): then nothing runs for it, and
// the host, reading total back, runs the sentence again with more.
// Then the indirect dispatch sizes of every dispatch that runs over the frames, for the
// most frames of sentences 0 ..= s (those before s wrote theirs in earlier dispatches): for
// geometry g = (mul, add, per, rows; z), n = frames * mul + add items at per a workgroup:
// (ceil(n / per), rows, z) when rows > 0, else ceil(n / per) workgroups up to 65535
// along x, then rows of 65535 (gpu::speech::groups_wide), z along z. Twins: cpu::durations,
// cpu::frame_ends, gpu::speech::Geometry::groups.
// z is read from z_off on (a batch's buffer).
// bindings: 0 params, 1 z: [t], 2 geometry: [2 geometries] vec4<u32> ((mul, add as i32
//           bits, per, rows), (z, 0, 0, 0)), 3 ends: [t] u32, 4 lens: [2 sentences] u32,
//           5 args: [3 geometries] u32
// dispatch: (1, 1, 1): one workgroup; each invocation sums a run of ceil(t / WG) phonemes.

struct Params {
    t: u32, cap: u32, geometries: u32, sentence: u32,
    m: f32, inv: f32, length_scale: f32, z_off: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> z: array<f32>;
@group(0) @binding(2) var<storage, read> geometry: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read_write> ends: array<u32>;
@group(0) @binding(4) var<storage, read_write> lens: array<u32>;
@group(0) @binding(5) var<storage, read_write> args: array<u32>;

const WG: u32 = 64u;
const MAX_PHONEME_FRAMES: u32 = 1048576u;
const MAX_GROUPS: u32 = 65535u;

var<workgroup> before: array<u32, 64>;
var<workgroup> frames_wg: u32;

fn add_sat(a: u32, b: u32) -> u32 {
    if (a > 0xffffffffu - b) {
        return 0xffffffffu;
    }
    return a + b;
}

// frames * mul + add items (saturating at 2^31 - 1, never below 0).
fn items(frames: u32, geo: vec4<u32>) -> u32 {
    if (geo.x != 0u && frames > 0x7fffffffu / geo.x) {
        return 0x7fffffffu;
    }
    let prod = frames * geo.x;
    let add = bitcast<i32>(geo.y);
    if (add >= 0) {
        return prod + u32(add);
    }
    return prod - min(prod, u32(-add));
}

fn duration(j: u32) -> u32 {
    let logw = (z[p.z_off + j] - p.m) * p.inv;
    let w = ceil(exp(logw) * p.length_scale);
    // NaN fails the first test, infinity the second.
    if (!(w > 0.0) || w > 3.4028235e38) {
        return 0u;
    }
    return u32(min(w, f32(MAX_PHONEME_FRAMES)));
}

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) lid: u32) {
    let run = (p.t + WG - 1u) / WG;
    let first = min(lid * run, p.t);
    let last = min(first + run, p.t);
    var s = 0u;
    for (var j = first; j < last; j++) {
        s = add_sat(s, duration(j));
    }
    before[lid] = s;
    workgroupBarrier();
    if (lid == 0u) {
        var total = 0u;
        for (var i = 0u; i < WG; i++) {
            let v = before[i];
            before[i] = total;
            total = add_sat(total, v);
        }
        var frames = max(total, 1u);
        if (total > p.cap) {
            frames = 0u;
        }
        lens[2u * p.sentence] = frames;
        lens[2u * p.sentence + 1u] = total;
        // The dispatches run the longest sentence so far.
        var most = frames;
        for (var b = 0u; b < p.sentence; b++) {
            most = max(most, lens[2u * b]);
        }
        frames_wg = most;
    }
    workgroupBarrier();
    s = before[lid];
    for (var j = first; j < last; j++) {
        s = add_sat(s, duration(j));
        ends[j] = s;
    }
    let frames = frames_wg;
    for (var g = lid; g < p.geometries; g += WG) {
        let geo = geometry[2u * g];
        let z = geometry[2u * g + 1u].x;
        let n = items(frames, geo);
        let groups = n / geo.z + select(0u, 1u, n % geo.z != 0u);
        var dims = vec3<u32>(groups, geo.w, z);
        if (geo.w == 0u) {
            dims = vec3<u32>(min(groups, MAX_GROUPS), (groups + MAX_GROUPS - 1u) / MAX_GROUPS, z);
        }
        // Never past the limit per dimension (the host sizes cap so that it is not reached).
        dims = min(dims, vec3<u32>(MAX_GROUPS));
        args[3u * g] = dims.x;
        args[3u * g + 1u] = dims.y;
        args[3u * g + 2u] = dims.z;
    }
}
