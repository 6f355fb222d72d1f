// quant_formats: reading one weight format in a kernel, a library prepended to
// gemv.wgsl, gemm.wgsl and embedding.wgsl (which declare `w: array<u32>`).
//
// Weights stay in their stored ggml format; gpu::llm_ops::pack_blocks only
// makes every block start on a 4-byte boundary. Formats whose block size is
// 2 mod 4 (Q4_0, Q5_0, Q8_0, Q6_K) have their f16 scale `d` moved out of the
// block into a tail array of f16 pairs starting at word `d_off`; the rest of
// each block keeps its byte order. F32, F16, BF16, Q4_1 and Q4_K are stored
// as they are. One define selects the format: W_F32, W_F16, W_BF16 (with
// W_FLOAT), W_Q4_0, W_Q4_1, W_Q5_0, W_Q8_0, W_Q4_K, W_Q6_K.
//
// w8(row, e0, k, d_off): elements e0..e0+7 of row `row` of a [rows, k]
// matrix, dequantised to f32 exactly as quant::dequantize_row does; e0 is a
// multiple of 8. Quantised rows are whole blocks; float rows may have any
// length and read as zero past k.
//
// w8_unpack(w8_raw(row, e0, k, d_off)) is the same values in two steps:
// w8_raw loads the words they are made from (a W8Raw: fewer registers than
// the 8 values for 16-bit and 4/8-bit formats), w8_unpack decodes them, so
// that the prefill GEMM can keep its next loads in flight through its
// multiplies (F16 prefill 20% faster on the H200). A zero W8Raw decodes to
// zeros. The decode kernels keep w8 in one step: built from the two, they
// ran 9-12% slower on the H200.

struct W8 { a: vec4<f32>, b: vec4<f32> }

fn bytes4(v: u32) -> vec4<f32> {
    return vec4<f32>(f32(v & 0xffu), f32((v >> 8u) & 0xffu), f32((v >> 16u) & 0xffu), f32(v >> 24u));
}

fn sbytes4(v: u32) -> vec4<f32> {
    let i = bitcast<i32>(v);
    return vec4<f32>(f32((i << 24u) >> 24u), f32((i << 16u) >> 24u), f32((i << 8u) >> 24u), f32(i >> 24u));
}

// The f16 scale of block `blk` from the tail array.
fn tail_scale(d_off: u32, blk: u32) -> f32 {
    let v = unpack2x16float(w[d_off + (blk >> 1u)]);
    return select(v.x, v.y, (blk & 1u) == 1u);
}

// The low (odd = 0) or high f16 of a word, as f32.
fn half_of(word: u32, odd: u32) -> f32 {
    let v = unpack2x16float(word);
    return select(v.x, v.y, odd == 1u);
}

#if W_F32
fn w1(row: u32, e: u32, k: u32) -> f32 {
    return bitcast<f32>(w[row * k + e]);
}
fn w8_fast(row: u32, e0: u32, k: u32) -> W8 {
    let b = row * k + e0;
    return W8(bitcast<vec4<f32>>(vec4<u32>(w[b], w[b + 1u], w[b + 2u], w[b + 3u])),
              bitcast<vec4<f32>>(vec4<u32>(w[b + 4u], w[b + 5u], w[b + 6u], w[b + 7u])));
}
#endif

#if W_F32
// Raw: the values (f32 words are what they decode to).
struct W8Raw { v: W8 }
fn w8_raw(row: u32, e0: u32, k: u32, d_off: u32) -> W8Raw {
    return W8Raw(w8(row, e0, k, d_off));
}
fn w8_unpack(r: W8Raw) -> W8 {
    return r.v;
}
#endif

#if W_F16
fn w1(row: u32, e: u32, k: u32) -> f32 {
    let g = row * k + e;
    let v = unpack2x16float(w[g >> 1u]);
    return select(v.x, v.y, (g & 1u) == 1u);
}
fn w8_fast(row: u32, e0: u32, k: u32) -> W8 {
    let b = (row * k + e0) >> 1u;
    return W8(vec4<f32>(unpack2x16float(w[b]), unpack2x16float(w[b + 1u])),
              vec4<f32>(unpack2x16float(w[b + 2u]), unpack2x16float(w[b + 3u])));
}
#endif

#if W_BF16
fn bf16_pair(v: u32) -> vec2<f32> {
    return vec2<f32>(bitcast<f32>(v << 16u), bitcast<f32>(v & 0xffff0000u));
}
fn w1(row: u32, e: u32, k: u32) -> f32 {
    let g = row * k + e;
    let v = bf16_pair(w[g >> 1u]);
    return select(v.x, v.y, (g & 1u) == 1u);
}
fn w8_fast(row: u32, e0: u32, k: u32) -> W8 {
    let b = (row * k + e0) >> 1u;
    return W8(vec4<f32>(bf16_pair(w[b]), bf16_pair(w[b + 1u])),
              vec4<f32>(bf16_pair(w[b + 2u]), bf16_pair(w[b + 3u])));
}
#endif

#if W_FLOAT
fn w8(row: u32, e0: u32, k: u32, d_off: u32) -> W8 {
    // Whole rows of 8: every group of 8 starts on a word boundary.
    if ((k & 7u) == 0u) {
        return w8_fast(row, e0, k);
    }
    var v = array<f32, 8>();
    for (var i = 0u; i < 8u; i++) {
        if (e0 + i < k) {
            v[i] = w1(row, e0 + i, k);
        }
    }
    return W8(vec4<f32>(v[0], v[1], v[2], v[3]), vec4<f32>(v[4], v[5], v[6], v[7]));
}
#endif

#if W_F16
// A pair of f16 values and their word.
fn word16(v: vec2<f32>) -> u32 {
    return pack2x16float(v);
}
fn pair16(v: u32) -> vec2<f32> {
    return unpack2x16float(v);
}
#endif

#if W_BF16
// A pair of bf16 values and their word.
fn word16(v: vec2<f32>) -> u32 {
    return (bitcast<u32>(v.x) >> 16u) | (bitcast<u32>(v.y) & 0xffff0000u);
}
fn pair16(v: u32) -> vec2<f32> {
    return bf16_pair(v);
}
#endif

#if W_FLOAT
#if !W_F32
// F16, BF16 raw: four words of two 16-bit values each.
struct W8Raw { h: vec4<u32> }
fn w8_raw(row: u32, e0: u32, k: u32, d_off: u32) -> W8Raw {
    if ((k & 7u) == 0u) {
        let b = (row * k + e0) >> 1u;
        return W8Raw(vec4<u32>(w[b], w[b + 1u], w[b + 2u], w[b + 3u]));
    }
    // Rows not of whole words: w8's values, packed again (exactly).
    let v = w8(row, e0, k, d_off);
    return W8Raw(vec4<u32>(word16(v.a.xy), word16(v.a.zw), word16(v.b.xy), word16(v.b.zw)));
}
fn w8_unpack(r: W8Raw) -> W8 {
    return W8(vec4<f32>(pair16(r.h.x), pair16(r.h.y)), vec4<f32>(pair16(r.h.z), pair16(r.h.w)));
}
#endif
#endif

#if W_Q4_0
// 32 weights: qs[16] (low nibbles = elements 0..15, high = 16..31), d in the tail.
fn w8(row: u32, e0: u32, k: u32, d_off: u32) -> W8 {
    let blk = row * (k >> 5u) + (e0 >> 5u);
    let o = e0 & 31u;
    let base = blk * 4u + ((o & 15u) >> 2u);
    let sh = (o >> 4u) * 4u;
    let d = tail_scale(d_off, blk);
    let q0 = bytes4((w[base] >> sh) & 0x0f0f0f0fu) - 8.0;
    let q1 = bytes4((w[base + 1u] >> sh) & 0x0f0f0f0fu) - 8.0;
    return W8(d * q0, d * q1);
}
// Raw: the two qs words, the tail word, the nibble shift | (blk & 1) << 5.
struct W8Raw { q: vec2<u32>, d: u32, sel: u32 }
fn w8_raw(row: u32, e0: u32, k: u32, d_off: u32) -> W8Raw {
    let blk = row * (k >> 5u) + (e0 >> 5u);
    let o = e0 & 31u;
    let base = blk * 4u + ((o & 15u) >> 2u);
    let sel = (o >> 4u) * 4u | (blk & 1u) << 5u;
    return W8Raw(vec2<u32>(w[base], w[base + 1u]), w[d_off + (blk >> 1u)], sel);
}
fn w8_unpack(r: W8Raw) -> W8 {
    let sh = r.sel & 31u;
    let d = half_of(r.d, r.sel >> 5u);
    let q0 = bytes4((r.q.x >> sh) & 0x0f0f0f0fu) - 8.0;
    let q1 = bytes4((r.q.y >> sh) & 0x0f0f0f0fu) - 8.0;
    return W8(d * q0, d * q1);
}
#endif

#if W_Q4_1
// 32 weights in 5 words: d and m (f16 pair), then qs[16]; value d * q + m.
fn w8(row: u32, e0: u32, k: u32, d_off: u32) -> W8 {
    let blk = row * (k >> 5u) + (e0 >> 5u);
    let o = e0 & 31u;
    let base = blk * 5u + 1u + ((o & 15u) >> 2u);
    let sh = (o >> 4u) * 4u;
    let dm = unpack2x16float(w[blk * 5u]);
    let q0 = bytes4((w[base] >> sh) & 0x0f0f0f0fu);
    let q1 = bytes4((w[base + 1u] >> sh) & 0x0f0f0f0fu);
    return W8(q0 * dm.x + dm.y, q1 * dm.x + dm.y);
}
// Raw: the two qs words, the d/m word, the nibble shift.
struct W8Raw { q: vec2<u32>, dm: u32, sh: u32 }
fn w8_raw(row: u32, e0: u32, k: u32, d_off: u32) -> W8Raw {
    let blk = row * (k >> 5u) + (e0 >> 5u);
    let o = e0 & 31u;
    let base = blk * 5u + 1u + ((o & 15u) >> 2u);
    return W8Raw(vec2<u32>(w[base], w[base + 1u]), w[blk * 5u], (o >> 4u) * 4u);
}
fn w8_unpack(r: W8Raw) -> W8 {
    let dm = unpack2x16float(r.dm);
    let q0 = bytes4((r.q.x >> r.sh) & 0x0f0f0f0fu);
    let q1 = bytes4((r.q.y >> r.sh) & 0x0f0f0f0fu);
    return W8(q0 * dm.x + dm.y, q1 * dm.x + dm.y);
}
#endif

#if W_Q5_0
// 32 weights in 5 words: qh (bit j = fifth bit of element j), qs[16]; d in the tail.
fn spread4(h: u32) -> u32 {
    return ((h & 1u) | ((h & 2u) << 7u) | ((h & 4u) << 14u) | ((h & 8u) << 21u)) << 4u;
}
fn w8(row: u32, e0: u32, k: u32, d_off: u32) -> W8 {
    let blk = row * (k >> 5u) + (e0 >> 5u);
    let o = e0 & 31u;
    let hb = w[blk * 5u] >> o;
    let base = blk * 5u + 1u + ((o & 15u) >> 2u);
    let sh = (o >> 4u) * 4u;
    let d = tail_scale(d_off, blk);
    let q0 = bytes4(((w[base] >> sh) & 0x0f0f0f0fu) | spread4(hb)) - 16.0;
    let q1 = bytes4(((w[base + 1u] >> sh) & 0x0f0f0f0fu) | spread4(hb >> 4u)) - 16.0;
    return W8(d * q0, d * q1);
}
// Raw: the two qs words, the qh word, the tail word, o | (blk & 1) << 5.
struct W8Raw { q: vec2<u32>, qh: u32, d: u32, sel: u32 }
fn w8_raw(row: u32, e0: u32, k: u32, d_off: u32) -> W8Raw {
    let blk = row * (k >> 5u) + (e0 >> 5u);
    let o = e0 & 31u;
    let base = blk * 5u + 1u + ((o & 15u) >> 2u);
    return W8Raw(vec2<u32>(w[base], w[base + 1u]), w[blk * 5u], w[d_off + (blk >> 1u)],
                 o | (blk & 1u) << 5u);
}
fn w8_unpack(r: W8Raw) -> W8 {
    let o = r.sel & 31u;
    let hb = r.qh >> o;
    let sh = (o >> 4u) * 4u;
    let d = half_of(r.d, r.sel >> 5u);
    let q0 = bytes4(((r.q.x >> sh) & 0x0f0f0f0fu) | spread4(hb)) - 16.0;
    let q1 = bytes4(((r.q.y >> sh) & 0x0f0f0f0fu) | spread4(hb >> 4u)) - 16.0;
    return W8(d * q0, d * q1);
}
#endif

#if W_Q8_0
// 32 weights: qs[32] signed bytes; d in the tail.
fn w8(row: u32, e0: u32, k: u32, d_off: u32) -> W8 {
    let blk = row * (k >> 5u) + (e0 >> 5u);
    let base = blk * 8u + ((e0 & 31u) >> 2u);
    let d = tail_scale(d_off, blk);
    return W8(d * sbytes4(w[base]), d * sbytes4(w[base + 1u]));
}
// Raw: the two qs words, the tail word, blk & 1.
struct W8Raw { q: vec2<u32>, d: u32, odd: u32 }
fn w8_raw(row: u32, e0: u32, k: u32, d_off: u32) -> W8Raw {
    let blk = row * (k >> 5u) + (e0 >> 5u);
    let base = blk * 8u + ((e0 & 31u) >> 2u);
    return W8Raw(vec2<u32>(w[base], w[base + 1u]), w[d_off + (blk >> 1u)], blk & 1u);
}
fn w8_unpack(r: W8Raw) -> W8 {
    let d = half_of(r.d, r.odd);
    return W8(d * sbytes4(r.q.x), d * sbytes4(r.q.y));
}
#endif

#if W_Q4_K
// 256 weights in 36 words: d and dmin (f16 pair), scales[12] (6-bit scale and
// min per sub-block of 32), qs[128]: 32-byte chunk c holds sub-block 2c in its
// low nibbles and 2c + 1 in its high ones. Value d * sc * q - dmin * m.
fn kbyte(at: u32, i: u32) -> u32 {
    return (w[at + (i >> 2u)] >> ((i & 3u) * 8u)) & 0xffu;
}
fn w8(row: u32, e0: u32, k: u32, d_off: u32) -> W8 {
    let blk = row * (k >> 8u) + (e0 >> 8u);
    let o = e0 & 255u;
    let j = o >> 5u;
    let bw = blk * 36u;
    let dm = unpack2x16float(w[bw]);
    var sc: u32;
    var mn: u32;
    if (j < 4u) {
        sc = kbyte(bw + 1u, j) & 63u;
        mn = kbyte(bw + 1u, j + 4u) & 63u;
    } else {
        sc = (kbyte(bw + 1u, j + 4u) & 0xfu) | ((kbyte(bw + 1u, j - 4u) >> 6u) << 4u);
        mn = (kbyte(bw + 1u, j + 4u) >> 4u) | ((kbyte(bw + 1u, j) >> 6u) << 4u);
    }
    let d = dm.x * f32(sc);
    let m = dm.y * f32(mn);
    let base = bw + 4u + (j >> 1u) * 8u + ((o & 31u) >> 2u);
    let sh = (j & 1u) * 4u;
    let q0 = bytes4((w[base] >> sh) & 0x0f0f0f0fu);
    let q1 = bytes4((w[base + 1u] >> sh) & 0x0f0f0f0fu);
    return W8(d * q0 - m, d * q1 - m);
}
// Raw: the values themselves (decoded as they load).
struct W8Raw { v: W8 }
fn w8_raw(row: u32, e0: u32, k: u32, d_off: u32) -> W8Raw {
    return W8Raw(w8(row, e0, k, d_off));
}
fn w8_unpack(r: W8Raw) -> W8 {
    return r.v;
}
#endif

#if W_Q6_K
// 256 weights in 52 words: ql[128] (low 4 bits), qh[64] (high 2 bits),
// scales[16] (signed); d in the tail. Two halves of 128; in each, quadrant
// q of 32 takes ql[l + 32 (q & 1)] >> 4 (q >> 1), qh[l] >> 2q, scale
// l / 16 + 2q (ggml's dequantize_row_q6_K). Value d * sc * (q - 32).
fn w8(row: u32, e0: u32, k: u32, d_off: u32) -> W8 {
    let blk = row * (k >> 8u) + (e0 >> 8u);
    let o = e0 & 255u;
    let h = o >> 7u;
    let quad = (o & 127u) >> 5u;
    let l = o & 31u;
    let bw = blk * 52u;
    let qlw = bw + ((64u * h + l + 32u * (quad & 1u)) >> 2u);
    let nsh = (quad >> 1u) * 4u;
    let qhw = bw + 32u + ((32u * h + l) >> 2u);
    let hsh = 2u * quad;
    let si = 8u * h + (l >> 4u) + 2u * quad;
    let scw = bitcast<i32>(w[bw + 48u + (si >> 2u)]);
    let sc = f32((scw << (24u - 8u * (si & 3u))) >> 24u);
    let d = tail_scale(d_off, blk) * sc;
    let q0 = bytes4(((w[qlw] >> nsh) & 0x0f0f0f0fu) | (((w[qhw] >> hsh) & 0x03030303u) << 4u)) - 32.0;
    let q1 = bytes4(((w[qlw + 1u] >> nsh) & 0x0f0f0f0fu) | (((w[qhw + 1u] >> hsh) & 0x03030303u) << 4u)) - 32.0;
    return W8(d * q0, d * q1);
}
// Raw: the values themselves (decoded as they load).
struct W8Raw { v: W8 }
fn w8_raw(row: u32, e0: u32, k: u32, d_off: u32) -> W8Raw {
    return W8Raw(w8(row, e0, k, d_off));
}
fn w8_unpack(r: W8Raw) -> W8 {
    return r.v;
}
#endif
