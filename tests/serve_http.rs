//! `serve` over HTTP: batched greedy output equal to `generate` alone, the
//! error answers, auth, the bounded queue, cancellation, preemption, a
//! load test, and a clean stop on SIGTERM. Each test starts its own
//! server on a free loopback port (CPU backend) and stops it.

mod common;
mod serve_support;

use serde_json::{json, Value};
use serve_support::{read_events_then_hang_up, send, Server};
use std::collections::HashMap;

fn tiny_lfm2() -> String {
    common::repo()
        .join("samples/fixtures/llm/tiny-lfm2")
        .display()
        .to_string()
}

fn tiny_llama() -> String {
    common::repo()
        .join("samples/fixtures/llm/tiny-llama")
        .display()
        .to_string()
}

/// `generate --raw` greedy text of `prompt` alone on `device` (`--cpu`,
/// `--gpu`), and its finish reason in OpenAI's terms.
fn generate_alone(device: &str, model: &str, prompt: &str, n: usize) -> (String, String) {
    let n = n.to_string();
    let o = common::run(
        env!("CARGO_BIN_EXE_generate"),
        &[
            device,
            "-m",
            model,
            "--raw",
            "--temperature",
            "0",
            "-n",
            &n,
            "-p",
            prompt,
            "--json",
        ],
    );
    assert!(o.status.success(), "{}", common::stderr(&o));
    let v: Value = serde_json::from_str(common::stdout(&o).trim()).unwrap();
    let finish = match v["finish_reason"].as_str().unwrap() {
        "length" => "length",
        _ => "stop",
    };
    (v["text"].as_str().unwrap().to_string(), finish.to_string())
}

/// POSTs a completion request from a thread of its own.
fn post_completion(port: u16, body: Value) -> std::thread::JoinHandle<serve_support::Reply> {
    std::thread::spawn(move || {
        serve_support::request(
            port,
            "POST",
            "/v1/completions",
            &[("Content-Type", "application/json")],
            body.to_string().as_bytes(),
        )
    })
}

/// The text and finish reason of a successful completion answer, streamed
/// (whole, ending in `[DONE]`) or not.
fn answer(r: &serve_support::Reply) -> (String, String) {
    assert_eq!(r.status, 200, "{}", r.text());
    let streamed = r
        .header("content-type")
        .is_some_and(|c| c.starts_with("text/event-stream"));
    if !streamed {
        let v = r.json();
        let c = &v["choices"][0];
        return (
            c["text"].as_str().unwrap().to_string(),
            c["finish_reason"].as_str().unwrap().to_string(),
        );
    }
    let events = r.events();
    assert_eq!(
        events.last().map(String::as_str),
        Some("[DONE]"),
        "{events:?}"
    );
    let (mut text, mut finish) = (String::new(), String::new());
    for e in &events[..events.len() - 1] {
        let v: Value = serde_json::from_str(e).unwrap();
        text.push_str(v["choices"][0]["text"].as_str().unwrap());
        if let Some(f) = v["choices"][0]["finish_reason"].as_str() {
            finish = f.to_string();
        }
    }
    (text, finish)
}

fn completion(s: &Server, prompt: &str, n: usize) -> Value {
    let r = s.post_json(
        "/v1/completions",
        &json!({"prompt": prompt, "max_tokens": n, "temperature": 0}).to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

#[test]
fn batched_greedy_output_equals_generate_alone() {
    let model = common::smollm2().display().to_string();
    let s = Server::start(&["--cpu", "-m", &model]);
    let prompts: Vec<(String, usize)> = (0..6)
        .map(|i| {
            let p = match i % 3 {
                0 => format!("Question {i}: what is {i} plus {i}? Answer:"),
                1 => format!("Write a list of {i} fruits, one per line, with a short note about the colour of each one:"),
                _ => "The history of the printing press".repeat(1 + i / 2),
            };
            (p, 8 + 7 * i)
        })
        .collect();
    // Different lengths arriving at different times share the batch.
    let port = s.port;
    let handles: Vec<_> = prompts
        .iter()
        .enumerate()
        .map(|(i, (p, n))| {
            std::thread::sleep(std::time::Duration::from_millis(40));
            let body =
                json!({"prompt": p, "max_tokens": n, "temperature": 0, "stream": i % 2 == 1});
            post_completion(port, body)
        })
        .collect();
    for ((p, n), h) in prompts.iter().zip(handles) {
        let got = answer(&h.join().unwrap());
        assert_eq!(got, generate_alone("--cpu", &model, p, *n), "prompt {p:?}");
    }
    // The chat endpoint renders the template as generate does.
    let r = s.post_json(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "What is the capital of France?"}], "temperature": 0, "max_tokens": 20}).to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(
        v["choices"][0]["message"]["content"],
        "The capital of France is Paris."
    );
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["usage"]["completion_tokens"], 7);
    // A repeat of the prompt takes its full blocks from the prefix cache.
    let again = s.post_json(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "What is the capital of France?"}], "temperature": 0, "max_tokens": 20}).to_string(),
    );
    let u = &again.json()["usage"];
    assert_eq!(u["prompt_tokens_details"]["cached_tokens"], 32, "{u}");
    assert_eq!(
        again.json()["choices"][0]["message"]["content"],
        "The capital of France is Paris."
    );
    s.wait_metric("lfm_kv_blocks_in_use", 0.0, 10);
}

#[test]
fn bad_requests_get_openai_errors_and_the_server_keeps_serving() {
    let s = Server::start(&["--cpu", "-m", &tiny_llama(), "--max-body-mib", "1"]);
    let cases: Vec<(&str, String, u16, Option<&str>)> = vec![
        ("/v1/completions", "{not json".into(), 400, None),
        (
            "/v1/completions",
            json!({"prompt": 5}).to_string(),
            400,
            Some("prompt"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "hi", "temperature": "hot"}).to_string(),
            400,
            Some("temperature"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "hi", "temperature": 7}).to_string(),
            400,
            Some("temperature"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "hi", "max_tokens": 0}).to_string(),
            400,
            Some("max_tokens"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "hi", "max_tokens": 100_000_000}).to_string(),
            400,
            Some("max_tokens"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "hi", "n": 2}).to_string(),
            400,
            Some("n"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "hi", "stop": [""]}).to_string(),
            400,
            Some("stop"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "hi", "logit_bias": {"abc": 1}}).to_string(),
            400,
            Some("logit_bias"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "hi", "logit_bias": {"99999": 1}}).to_string(),
            400,
            Some("logit_bias"),
        ),
        (
            "/v1/completions",
            json!({"prompt": ""}).to_string(),
            400,
            Some("prompt"),
        ),
        (
            "/v1/completions",
            json!({"prompt": [1, 2, 99999]}).to_string(),
            400,
            Some("prompt"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "hi", "response_format": {"type": "yaml"}}).to_string(),
            400,
            Some("response_format.type"),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": []}).to_string(),
            400,
            Some("messages"),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "wizard", "content": "x"}]}).to_string(),
            400,
            Some("messages[0].role"),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": "hello"}).to_string(),
            400,
            Some("messages"),
        ),
        (
            "/v1/embeddings",
            json!({"input": "hi"}).to_string(),
            404,
            None,
        ),
        ("/v1/nowhere", "{}".into(), 404, None),
    ];
    for (path, body, status, param) in cases {
        let r = s.post_json(path, &body);
        assert_eq!(r.status, status, "{path} {body}: {}", r.text());
        let v = r.json();
        let err = &v["error"];
        assert!(
            err["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{v}"
        );
        assert!(err["type"].is_string(), "{v}");
        if let Some(p) = param {
            assert_eq!(err["param"], p, "{path} {body}: {v}");
        }
    }
    // Over the body limit: 413, with the error object.
    let big = format!("{{\"prompt\": \"{}\"}}", "a".repeat(1_500_000));
    let r = s.post_json("/v1/completions", &big);
    assert_eq!(r.status, 413, "{}", r.text());
    assert!(r.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("larger than"));
    // Still serving.
    assert_eq!(s.request("GET", "/health", &[], b"").status, 200);
    let v = completion(&s, "hello there", 5);
    assert_eq!(v["usage"]["completion_tokens"], 5);
    let m = s.request("GET", "/metrics", &[], b"").text();
    assert!(
        m.contains("lfm_requests_total{endpoint=\"/v1/completions\",status=\"400\"}"),
        "{m}"
    );
    assert!(
        m.contains("lfm_requests_total{endpoint=\"/v1/completions\",status=\"413\"} 1"),
        "{m}"
    );
}

#[test]
fn ignore_eos_runs_past_the_end_of_sequence_token_to_max_tokens() {
    let s = Server::start(&["--cpu", "-m", &tiny_lfm2()]);
    // The end-of-sequence token (id 2) pushed to the top: greedy picks it
    // first, which ends the answer at once unless ignore_eos.
    let body = |ignore: bool| {
        json!({"prompt": "Hello", "max_tokens": 5, "temperature": 0,
               "logit_bias": {"2": 100}, "ignore_eos": ignore})
        .to_string()
    };
    let ended = s.post_json("/v1/completions", &body(false));
    assert_eq!(ended.status, 200, "{}", ended.text());
    let v = ended.json();
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 0, "{v}");
    let ran = s.post_json("/v1/completions", &body(true));
    assert_eq!(ran.status, 200, "{}", ran.text());
    let v = ran.json();
    assert_eq!(v["choices"][0]["finish_reason"], "length", "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 5, "{v}");
    // Not with a grammar, whose output ends with that token.
    let r = s.post_json(
        "/v1/completions",
        &json!({"prompt": "Hello", "ignore_eos": true,
                "response_format": {"type": "json_object"}})
        .to_string(),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("ignore_eos"), "{}", r.text());
    // (json_object alone is served: its grammar once lacked the `value` rule.)
    let r = s.post_json(
        "/v1/completions",
        &json!({"prompt": "Hello", "max_tokens": 4,
                "response_format": {"type": "json_object"}})
        .to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let r = s.post_json(
        "/v1/completions",
        &json!({"prompt": "Hello", "ignore_eos": "yes"}).to_string(),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("ignore_eos"), "{}", r.text());
}

/// A model without a tokenizer (token-id prompts) answers with the ids
/// it generated, `token_ids` (vLLM's field), whole and chunk by chunk,
/// equal to `generate --prompt-ids` alone; a model with one gives them when
/// asked (`return_token_ids`).
#[test]
fn token_ids_come_back_from_a_model_without_a_tokenizer() {
    let dir = common::scratch("no-tokenizer");
    for f in ["config.json", "generation_config.json", "model.safetensors"] {
        std::fs::copy(std::path::Path::new(&tiny_lfm2()).join(f), dir.join(f)).unwrap();
    }
    let model = dir.display().to_string();
    let o = common::run(
        env!("CARGO_BIN_EXE_generate"),
        &[
            "--cpu",
            "-m",
            &model,
            "--prompt-ids",
            "1,50,35",
            "--temperature",
            "0",
            "-n",
            "6",
            "--json",
        ],
    );
    assert!(o.status.success(), "{}", common::stderr(&o));
    let alone: Value = serde_json::from_str(common::stdout(&o).trim()).unwrap();
    let want = &alone["generated_ids"];
    assert_eq!(want.as_array().unwrap().len(), 6, "{alone}");

    let s = Server::start(&["--cpu", "-m", &model]);
    let body = |stream: bool| {
        json!({"prompt": [1, 50, 35], "max_tokens": 6, "temperature": 0, "stream": stream})
            .to_string()
    };
    let r = s.post_json("/v1/completions", &body(false));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(&r.json()["choices"][0]["token_ids"], want, "{}", r.text());
    // Streamed: one chunk a token though no text comes with it.
    let r = s.post_json("/v1/completions", &body(true));
    assert_eq!(r.status, 200, "{}", r.text());
    let streamed: Vec<Value> = r
        .events()
        .iter()
        .filter(|e| *e != "[DONE]")
        .flat_map(|e| {
            let v: Value = serde_json::from_str(e).unwrap();
            v["choices"][0]["token_ids"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .collect();
    assert_eq!(&Value::from(streamed), want, "{}", r.text());
    // A text prompt needs the tokenizer it lacks.
    let r = s.post_json("/v1/completions", &json!({"prompt": "Hello"}).to_string());
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("no tokenizer"), "{}", r.text());
    drop(s);

    let s = Server::start(&["--cpu", "-m", &tiny_lfm2()]);
    let ask = |ids: Value| {
        let r = s.post_json(
            "/v1/completions",
            &json!({"prompt": "Hello", "max_tokens": 4, "temperature": 0, "return_token_ids": ids})
                .to_string(),
        );
        (r.status, r.json())
    };
    let (status, v) = ask(json!(true));
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        v["choices"][0]["token_ids"].as_array().unwrap().len(),
        4,
        "{v}"
    );
    let (status, v) = ask(json!(false));
    assert_eq!(status, 200, "{v}");
    assert!(v["choices"][0].get("token_ids").is_none(), "{v}");
    let (status, v) = ask(json!(3));
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["param"], "return_token_ids", "{v}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn an_api_key_is_required_when_set() {
    let s = Server::start(&["--cpu", "-m", &tiny_llama(), "--api-key", "sekrit"]);
    let body = json!({"prompt": "hi", "max_tokens": 2}).to_string();
    let json_ct = ("Content-Type", "application/json");
    let none = s.request("POST", "/v1/completions", &[json_ct], body.as_bytes());
    assert_eq!(none.status, 401);
    assert!(none.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("API key"));
    let wrong = s.request(
        "POST",
        "/v1/completions",
        &[json_ct, ("Authorization", "Bearer sekriT")],
        body.as_bytes(),
    );
    assert_eq!(wrong.status, 401);
    let models = s.request("GET", "/v1/models", &[], b"");
    assert_eq!(models.status, 401);
    let right = s.request(
        "POST",
        "/v1/completions",
        &[json_ct, ("Authorization", "Bearer sekrit")],
        body.as_bytes(),
    );
    assert_eq!(right.status, 200, "{}", right.text());
    assert_eq!(
        s.request("GET", "/health", &[], b"").status,
        200,
        "health stays open"
    );
}

#[test]
fn a_full_queue_answers_429_and_a_hang_up_frees_the_cache() {
    let s = Server::start(&[
        "--cpu",
        "-m",
        &common::smollm2().display().to_string(),
        "--parallel",
        "1",
        "--max-queue",
        "1",
    ]);
    // No end-of-sequence token: it runs until the client hangs up.
    let long = json!({"prompt": "Tell me a very long story about a dragon.", "max_tokens": 2000, "stream": true,
        "temperature": 0, "logit_bias": {"0": -100, "1": -100, "2": -100}}).to_string();
    let ct = [("Content-Type", "application/json")];
    let a = send(s.port, "POST", "/v1/completions", &ct, long.as_bytes());
    s.wait_metric("lfm_running_sequences", 1.0, 60);
    let b = send(s.port, "POST", "/v1/completions", &ct, long.as_bytes());
    s.wait_metric("lfm_queue_depth", 1.0, 60);
    let c = s.post_json("/v1/completions", &long);
    assert_eq!(c.status, 429, "{}", c.text());
    assert_eq!(c.header("retry-after"), Some("1"));
    assert_eq!(c.json()["error"]["type"], "rate_limit_error");
    // The running client reads a little and hangs up; the waiting one too.
    assert!(read_events_then_hang_up(a, 3) >= 3);
    drop(b);
    s.wait_metric("lfm_running_sequences", 0.0, 60);
    s.wait_metric("lfm_queue_depth", 0.0, 60);
    s.wait_metric("lfm_kv_blocks_in_use", 0.0, 60);
    assert!(s.metric("lfm_cancelled_total") >= 2.0);
}

#[test]
fn a_small_cache_preempts_and_every_answer_stays_exact() {
    // 4 MiB of cache hold ~90 SmolLM2 positions: three sequences of ~70
    // positions cannot run together, so some step back and resume.
    let model = common::smollm2().display().to_string();
    let s = Server::start(&["--cpu", "-m", &model, "--kv-memory", "4"]);
    let prompts = [
        "The three primary colours are",
        "A short poem about the sea:",
        "Ten facts about owls. 1.",
    ];
    let port = s.port;
    let handles: Vec<_> = prompts
        .iter()
        .map(|p| {
            post_completion(
                port,
                json!({"prompt": p, "max_tokens": 60, "temperature": 0}),
            )
        })
        .collect();
    for (p, h) in prompts.iter().zip(handles) {
        let got = answer(&h.join().unwrap());
        assert_eq!(got, generate_alone("--cpu", &model, p, 60), "{p:?}");
    }
    assert!(
        s.metric("lfm_preemptions_total") >= 1.0,
        "the cache was never short"
    );
    s.wait_metric("lfm_kv_blocks_in_use", 0.0, 10);
    // A request that cannot fit even alone is refused, not hung.
    let r = s.post_json(
        "/v1/completions",
        &json!({"prompt": "x ".repeat(200), "max_tokens": 4}).to_string(),
    );
    assert_eq!(r.status, 500, "{}", r.text());
    assert!(
        r.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("KV cache"),
        "{}",
        r.text()
    );
}

#[test]
fn sixty_four_streaming_clients_get_whole_answers_and_leak_no_blocks() {
    let model = tiny_lfm2();
    let s = Server::start(&["--cpu", "-m", &model]);
    // Prompts sharing a long prefix (the prefix cache and LFM2's conv
    // snapshots at block ends are exercised), with their expected answers
    // from generate alone.
    let shared =
        "You are a helpful assistant. Answer briefly and politely, and say when you do not know. ";
    let prompts: Vec<String> = (0..6)
        .map(|i| format!("{shared}Question {i}: how many legs has a spider?"))
        .collect();
    let lengths = [3usize, 11, 24];
    let mut expected: HashMap<(usize, usize), (String, String)> = HashMap::new();
    for (i, p) in prompts.iter().enumerate() {
        for &n in &lengths {
            expected.insert((i, n), generate_alone("--cpu", &model, p, n));
        }
    }
    let expected = std::sync::Arc::new(expected);
    let prompts = std::sync::Arc::new(prompts);
    let port = s.port;
    let clients: Vec<_> = (0..64usize)
        .map(|c| {
            let (expected, prompts) = (expected.clone(), prompts.clone());
            std::thread::spawn(move || {
                let mut done = 0;
                let mut cancelled = 0;
                for k in 0..3usize {
                    let pick = (c * 7 + k * 5) % prompts.len();
                    let n = lengths[(c + k) % lengths.len()];
                    let body = json!({"prompt": prompts[pick], "max_tokens": n, "temperature": 0, "stream": true}).to_string();
                    if (c + k) % 5 == 0 {
                        let conn = send(port, "POST", "/v1/completions", &[("Content-Type", "application/json")], body.as_bytes());
                        read_events_then_hang_up(conn, 2);
                        cancelled += 1;
                        continue;
                    }
                    let r = serve_support::request(port, "POST", "/v1/completions", &[("Content-Type", "application/json")], body.as_bytes());
                    let got = answer(&r);
                    assert_eq!(got, expected[&(pick, n)], "client {c} request {k}");
                    done += 1;
                }
                (done, cancelled)
            })
        })
        .collect();
    let (mut done, mut cancelled) = (0, 0);
    for h in clients {
        let (d, c) = h.join().unwrap();
        done += d;
        cancelled += c;
    }
    assert_eq!(done + cancelled, 64 * 3);
    s.wait_metric("lfm_running_sequences", 0.0, 30);
    s.wait_metric("lfm_queue_depth", 0.0, 30);
    s.wait_metric("lfm_kv_blocks_in_use", 0.0, 30);
    let m = s.request("GET", "/metrics", &[], b"").text();
    let ok = m
        .lines()
        .find_map(|l| {
            l.strip_prefix("lfm_requests_total{endpoint=\"/v1/completions\",status=\"200\"} ")
        })
        .unwrap();
    assert_eq!(
        ok.trim().parse::<usize>().unwrap(),
        done + cancelled,
        "every request answered"
    );
}

#[test]
fn sigterm_lets_running_requests_finish_then_exits_0() {
    let s = Server::start(&["--cpu", "-m", &common::smollm2().display().to_string()]);
    let port = s.port;
    let h = std::thread::spawn(move || {
        serve_support::request(
            port,
            "POST",
            "/v1/completions",
            &[("Content-Type", "application/json")],
            json!({"prompt": "Once upon a time", "max_tokens": 40, "temperature": 0,
                "logit_bias": {"0": -100, "1": -100, "2": -100}})
            .to_string()
            .as_bytes(),
        )
    });
    s.wait_metric("lfm_running_sequences", 1.0, 60);
    let status = s.terminate();
    assert!(status.success(), "exit status {status}");
    let r = h.join().unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["usage"]["completion_tokens"], 40, "{}", r.text());
}

/// Some of the server's steps held several sequences.
fn assert_some_steps_batched(s: &Server) {
    let (steps, seqs) = (
        s.metric("lfm_batch_steps_total"),
        s.metric("lfm_batch_step_sequences_total"),
    );
    assert!(
        seqs > steps,
        "{seqs} sequences in {steps} steps: nothing batched"
    );
}

/// Requests of mixed prompt lengths arriving at different times, on the
/// GPU: batched decode steps (several sequences in one submission) give
/// what `generate --gpu` gives each alone.
fn gpu_serves_what_generate_gives_alone(model: &str) {
    // Lavapipe in CI: --gpu insists on an adapter, software or not.
    let s = Server::start(&["--gpu", "-m", model]);
    let prompts: Vec<(String, usize)> = [
        "hello world, this is",
        "the quick brown fox jumps over the lazy dog and runs far away into the woods",
        "a",
        "hello world, this is a test",
        "one two three four five six seven eight nine ten",
    ]
    .iter()
    .enumerate()
    .map(|(i, p)| (p.to_string(), 24 + 5 * i))
    .collect();
    let port = s.port;
    let handles: Vec<_> = prompts
        .iter()
        .enumerate()
        .map(|(i, (p, n))| {
            std::thread::sleep(std::time::Duration::from_millis(10));
            post_completion(
                port,
                json!({"prompt": p, "max_tokens": n, "temperature": 0, "stream": i % 2 == 1}),
            )
        })
        .collect();
    let mut answers = Vec::new();
    for ((p, n), h) in prompts.iter().zip(handles) {
        let got = answer(&h.join().unwrap());
        assert_eq!(got, generate_alone("--gpu", model, p, *n), "{p:?}");
        answers.push(got);
    }
    s.wait_metric("lfm_running_sequences", 0.0, 10);
    // A repeat takes the full blocks (16 positions) before its last prompt
    // token from those the first one left (the prefix cache), and answers
    // the same.
    let (p, n) = &prompts[1];
    let r = s.post_json(
        "/v1/completions",
        &json!({"prompt": p, "max_tokens": n, "temperature": 0}).to_string(),
    );
    let u = &r.json()["usage"];
    assert_eq!(
        u["prompt_tokens_details"]["cached_tokens"].as_u64(),
        u["prompt_tokens"].as_u64().map(|n| (n - 1) / 16 * 16),
        "{u}"
    );
    assert_eq!(answer(&r), answers[1], "a repeat of {p:?}");
    assert_some_steps_batched(&s);
    // The answer may come before the scheduler retires the sequence.
    s.wait_metric("lfm_kv_blocks_in_use", 0.0, 10);
}

/// GPU: a cache of 8 blocks (128 positions) cannot hold three sequences
/// of up to ~65 positions together, so some step back and resume; every answer
/// is what `generate --gpu` gives alone and every block comes back.
fn gpu_preempts_and_stays_exact(model: &str) {
    let s = Server::start(&["--gpu", "-m", model, "--kv-blocks", "8"]);
    let prompts = [
        "one two three four five six seven eight nine ten eleven twelve",
        "the quick brown fox jumps over the lazy dog and runs away",
        "hello world, this is a test of a small cache",
    ];
    let port = s.port;
    let handles: Vec<_> = prompts
        .iter()
        .map(|p| {
            post_completion(
                port,
                json!({"prompt": p, "max_tokens": 50, "temperature": 0}),
            )
        })
        .collect();
    for (p, h) in prompts.iter().zip(handles) {
        let got = answer(&h.join().unwrap());
        assert_eq!(got, generate_alone("--gpu", model, p, 50), "{p:?}");
    }
    assert!(
        s.metric("lfm_preemptions_total") >= 1.0,
        "the cache was never short"
    );
    s.wait_metric("lfm_kv_blocks_in_use", 0.0, 10);
}

/// GPU: two prompts that share a long start (a system prompt) and differ
/// after it: the second takes the shared full blocks from the cache (LFM2's
/// conv state included) and answers what `generate --gpu` gives it alone.
fn gpu_shares_a_system_prompt(model: &str) {
    let s = Server::start(&["--gpu", "-m", model]);
    let system = "You are a careful assistant who answers in one short line. ".repeat(3);
    let mut cached = Vec::new();
    for q in ["what is two plus two?", "name a colour of the sky."] {
        let p = format!("{system}{q}");
        let r = s.post_json(
            "/v1/completions",
            &json!({"prompt": p, "max_tokens": 12, "temperature": 0}).to_string(),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(answer(&r), generate_alone("--gpu", model, &p, 12), "{p:?}");
        cached.push(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64());
    }
    assert_eq!(cached[0], Some(0));
    let second = cached[1].unwrap();
    assert!(
        second >= 16 && second % 16 == 0,
        "the shared start was not reused: {second} tokens cached"
    );
    s.wait_metric("lfm_kv_blocks_in_use", 0.0, 10);
}

#[test]
fn the_gpu_backend_shares_a_system_prompt_llama() {
    gpu_shares_a_system_prompt(&tiny_llama());
}

#[test]
fn the_gpu_backend_shares_a_system_prompt_lfm2() {
    gpu_shares_a_system_prompt(&tiny_lfm2());
}

#[test]
fn the_gpu_backend_preempts_when_its_cache_is_short_llama() {
    gpu_preempts_and_stays_exact(&tiny_llama());
}

#[test]
fn the_gpu_backend_preempts_when_its_cache_is_short_lfm2() {
    gpu_preempts_and_stays_exact(&tiny_lfm2());
}

#[test]
fn the_gpu_backend_serves_what_generate_gives_on_the_gpu() {
    gpu_serves_what_generate_gives_alone(&tiny_llama());
}

#[test]
fn the_gpu_backend_batches_lfm2_as_generate_gives_it_alone() {
    gpu_serves_what_generate_gives_alone(&tiny_lfm2());
}

/// `--batch-products gemm` end to end: concurrent requests, streamed and
/// not, share steps and each is answered whole, and every KV block comes
/// back. Their tokens are not held to `generate`'s here:
/// tests/llm_gpu_batch.rs bounds the logits of that path against each
/// sequence alone.
#[test]
fn the_gpu_backend_serves_with_its_products_on_the_gemm() {
    let model = tiny_lfm2();
    let s = Server::start(&["--gpu", "-m", &model, "--batch-products", "gemm"]);
    let port = s.port;
    let handles: Vec<_> = (0..6)
        .map(|i| {
            std::thread::sleep(std::time::Duration::from_millis(10));
            let body = json!({
                "prompt": format!("request {i}: hello world, this is"),
                "max_tokens": 20 + 3 * i,
                "temperature": 0,
                "ignore_eos": true,
                "stream": i % 2 == 1,
            });
            post_completion(port, body)
        })
        .collect();
    for (i, h) in handles.into_iter().enumerate() {
        let (text, finish) = answer(&h.join().unwrap());
        assert_eq!(finish, "length", "request {i}: {text:?}");
        assert!(!text.is_empty(), "request {i}");
    }
    assert_some_steps_batched(&s);
    s.wait_metric("lfm_kv_blocks_in_use", 0.0, 10);
}
