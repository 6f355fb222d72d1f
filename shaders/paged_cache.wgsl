// The paged KV cache the batched (ROWS) kernels address: a sequence's
// positions live in blocks of KV_BLOCK cache rows, wherever its block table
// puts them (models::kv_blocks). Word 4 of a row's record
// (gpu::llm_ops::ROW_RECORD) says where its sequence's table starts in the
// same `step` buffer; position j is in block step[table + j / KV_BLOCK].

// models::kv_blocks::BLOCK
const KV_BLOCK: u32 = 16u;

// The cache row of position j of the sequence whose table starts at
// step[table].
fn cache_row(table: u32, j: u32) -> u32 {
    return step[table + j / KV_BLOCK] * KV_BLOCK + j % KV_BLOCK;
}
