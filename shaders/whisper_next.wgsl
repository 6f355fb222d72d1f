// whisper_next: greedy decoding a step ahead on the device. Each row's token
// picked by whisper_select (picks: `words` u32 a row, the token at word 4)
// goes into the row's rule state, the rule of its next step is written (the
// CPU twin: cpu::whisper::whisper_next, RuleState::push and ::rule), and
// the token's embedding row is copied out for the next pass.
// bindings: 0 params, 1 picks: array<u32> (rows * words), 2 table: [vocab, d]
//           f32, 3 states: array<u32> (rows * 4: len, last_is_ts,
//           penultimate_is_ts, last_ts), 4 rules: array<u32> (rows * 8,
//           cpu::whisper::RowRule), 5 emb: [rows, d] f32
// dispatch: rows workgroups of 64 threads

struct Params {
    d: u32,
    vocab: u32,
    timestamp_begin: u32,
    eot: u32,
    timestamps: u32,
    _pad: u32,
    words: u32,
    rows: u32,
}

const NO_TOKEN: u32 = 0xffffffffu;

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> picks: array<u32>;
@group(0) @binding(2) var<storage, read> table: array<f32>;
@group(0) @binding(3) var<storage, read_write> states: array<u32>;
@group(0) @binding(4) var<storage, read_write> rules: array<u32>;
@group(0) @binding(5) var<storage, read_write> emb: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let r = wid.x;
    if (r >= p.rows) {
        return;
    }
    // A damaged row's pick may be anything: stay inside the table.
    let tok = min(picks[r * p.words + 4u], p.vocab - 1u);
    if (lid == 0u) {
        let tb = p.timestamp_begin;
        // RuleState::push
        let len = min(states[r * 4u] + 1u, 2u);
        let last_is_ts = u32(tok >= tb);
        let penultimate_is_ts = states[r * 4u + 1u];
        var last_ts = states[r * 4u + 3u];
        if (tok >= tb) {
            last_ts = tok;
        }
        states[r * 4u] = len;
        states[r * 4u + 1u] = last_is_ts;
        states[r * 4u + 2u] = penultimate_is_ts;
        states[r * 4u + 3u] = last_ts;
        // RuleState::rule (len is at least 1 here)
        var text_end = 0u;
        var ts_from = 0u;
        var ts_end = p.vocab;
        if (p.timestamps != 0u) {
            let last_was_ts = last_is_ts != 0u;
            let penultimate_was_ts = len < 2u || penultimate_is_ts != 0u;
            if (last_was_ts) {
                if (penultimate_was_ts) {
                    ts_end = tb;
                } else {
                    text_end = p.eot;
                }
            }
            if (last_ts != NO_TOKEN) {
                ts_from = select(last_ts + 1u, last_ts, last_was_ts && !penultimate_was_ts);
            }
        }
        let o = r * 8u;
        rules[o] = text_end;
        rules[o + 1u] = ts_from;
        rules[o + 2u] = ts_end;
        rules[o + 3u] = 0u;
        rules[o + 4u] = NO_TOKEN;
        rules[o + 5u] = 0u;
        rules[o + 6u] = 0u;
        rules[o + 7u] = 0u;
    }
    for (var e = lid; e < p.d; e += 64u) {
        emb[r * p.d + e] = table[tok * p.d + e];
    }
}
