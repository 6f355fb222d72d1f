// Parameters of the attention kernels (flash_attention, its merge,
// prefill_attention), gpu::llm_ops::AttentionParams: query heads, key/value
// heads, head size, new queries, softmax scale, cache row length, and the
// sliding window (positions a query sees back, itself included; 0 for all),
// for the ROWS variants the splits per head their partial results hold, and
// for flash_attention_prep what qk_rope.wgsl's params say of RoPE and the
// q/k norm.

struct Params {
    heads: u32,
    kv_heads: u32,
    hd: u32,
    n_q: u32,
    scale: f32,
    kv_stride: u32,
    window: u32,
    part_splits: u32, // ROWS: splits per head in the partial-result buffer
    half: u32,        // PREP: rotated pairs a head
    interleaved: u32, // PREP: pairs (2i, 2i + 1) rather than (i, i + half)
    eps: f32,         // PREP: the q/k norm's
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
