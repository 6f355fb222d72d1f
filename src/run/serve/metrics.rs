//! The server's counters, gauges and latency histograms, rendered in
//! Prometheus' text format for `GET /metrics`.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// Upper bounds of the latency buckets, in seconds.
const BUCKETS: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

#[derive(Default)]
struct Histogram {
    counts: [u64; BUCKETS.len()],
    sum: f64,
    count: u64,
}

impl Histogram {
    fn observe(&mut self, d: Duration) {
        let s = d.as_secs_f64();
        for (c, &b) in self.counts.iter_mut().zip(&BUCKETS) {
            if s <= b {
                *c += 1;
            }
        }
        self.sum += s;
        self.count += 1;
    }

    fn render(&self, name: &str, help: &str, out: &mut String) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (c, b) in self.counts.iter().zip(&BUCKETS) {
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {c}");
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(out, "{name}_sum {}", self.sum);
        let _ = writeln!(out, "{name}_count {}", self.count);
    }
}

#[derive(Default)]
pub struct Metrics {
    /// Requests answered, by endpoint and status.
    requests: Mutex<Vec<(String, u16, u64)>>,
    pub prompt_tokens: AtomicU64,
    pub completion_tokens: AtomicU64,
    pub cancelled: AtomicU64,
    /// Sequences sent back to the queue when the cache ran out.
    pub preempted: AtomicU64,
    /// Generation requests queued and not yet admitted.
    pub waiting: AtomicUsize,
    pub running: AtomicUsize,
    pub kv_blocks_in_use: AtomicUsize,
    pub kv_blocks_total: AtomicUsize,
    steps: AtomicU64,
    step_sequences: AtomicU64,
    latencies: Mutex<[Histogram; 4]>,
}

const TTFT: usize = 0;
const ITL: usize = 1;
const REQUEST: usize = 2;
const STEP: usize = 3;

impl Metrics {
    pub fn count_request(&self, endpoint: &str, status: u16) {
        let mut r = self.requests.lock().expect("metrics lock");
        match r.iter_mut().find(|(e, s, _)| e == endpoint && *s == status) {
            Some((_, _, n)) => *n += 1,
            None => r.push((endpoint.to_string(), status, 1)),
        }
    }

    fn observe(&self, which: usize, d: Duration) {
        self.latencies.lock().expect("metrics lock")[which].observe(d);
    }

    pub fn observe_first_token(&self, d: Duration) {
        self.observe(TTFT, d)
    }

    pub fn observe_inter_token(&self, d: Duration) {
        self.observe(ITL, d)
    }

    pub fn observe_request(&self, d: Duration) {
        self.observe(REQUEST, d)
    }

    pub fn observe_step(&self, d: Duration, sequences: usize) {
        self.steps.fetch_add(1, Ordering::Relaxed);
        self.step_sequences
            .fetch_add(sequences as u64, Ordering::Relaxed);
        self.observe(STEP, d)
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        out.push_str("# HELP lfm_requests_total HTTP requests answered.\n# TYPE lfm_requests_total counter\n");
        for (e, s, n) in self.requests.lock().expect("metrics lock").iter() {
            let _ = writeln!(
                out,
                "lfm_requests_total{{endpoint=\"{e}\",status=\"{s}\"}} {n}"
            );
        }
        let counters = [
            (
                "lfm_prompt_tokens_total",
                "Prompt tokens prefilled or taken from the prefix cache.",
                self.prompt_tokens.load(Ordering::Relaxed),
            ),
            (
                "lfm_generation_tokens_total",
                "Tokens generated.",
                self.completion_tokens.load(Ordering::Relaxed),
            ),
            (
                "lfm_cancelled_total",
                "Generation requests whose client went away.",
                self.cancelled.load(Ordering::Relaxed),
            ),
            (
                "lfm_preemptions_total",
                "Sequences sent back to the queue when the KV cache ran out.",
                self.preempted.load(Ordering::Relaxed),
            ),
            (
                "lfm_batch_steps_total",
                "Batched forward passes.",
                self.steps.load(Ordering::Relaxed),
            ),
            (
                "lfm_batch_step_sequences_total",
                "Sequences summed over the batched passes.",
                self.step_sequences.load(Ordering::Relaxed),
            ),
        ];
        for (name, help, v) in counters {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}"
            );
        }
        let gauges = [
            (
                "lfm_queue_depth",
                "Generation requests waiting for admission.",
                self.waiting.load(Ordering::Relaxed),
            ),
            (
                "lfm_running_sequences",
                "Sequences in the running batch.",
                self.running.load(Ordering::Relaxed),
            ),
            (
                "lfm_kv_blocks_in_use",
                "KV cache blocks held by running sequences.",
                self.kv_blocks_in_use.load(Ordering::Relaxed),
            ),
            (
                "lfm_kv_blocks_total",
                "KV cache blocks in all.",
                self.kv_blocks_total.load(Ordering::Relaxed),
            ),
        ];
        for (name, help, v) in gauges {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        }
        let h = self.latencies.lock().expect("metrics lock");
        h[TTFT].render(
            "lfm_time_to_first_token_seconds",
            "From arrival to the first generated token.",
            &mut out,
        );
        h[ITL].render(
            "lfm_inter_token_latency_seconds",
            "Between consecutive tokens of a sequence.",
            &mut out,
        );
        h[REQUEST].render(
            "lfm_request_duration_seconds",
            "From arrival to the last token.",
            &mut out,
        );
        h[STEP].render(
            "lfm_batch_step_seconds",
            "One batched forward pass.",
            &mut out,
        );
        out
    }
}
