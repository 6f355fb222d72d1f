// Parameters of the attention kernels (flash_attention, its merge,
// prefill_attention), gpu::llm_ops::AttentionParams: query heads, key/value
// heads, head size, new queries, softmax scale, cache row length, and the
// sliding window (positions a query sees back, itself included; 0 for all),
// and for the ROWS variants the splits per head their partial results hold.

struct Params {
    heads: u32,
    kv_heads: u32,
    hd: u32,
    n_q: u32,
    scale: f32,
    kv_stride: u32,
    window: u32,
    part_splits: u32, // ROWS: splits per head in the partial-result buffer
}

@group(0) @binding(0) var<uniform> p: Params;
