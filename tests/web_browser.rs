//! The engine in a browser tab: serves `web/` (built by `scripts/web-build`,
//! which `scripts/test` runs first) on a loopback port, drives headless
//! Chromium through chromedriver (Debian's `chromium`, `chromium-driver`;
//! WebGPU on its SwiftShader Vulkan adapter), has the page generate
//! greedily with the tiny LFM2 fixture and embed sentences with the default
//! encoder on WebGPU, and checks the prompt's and the produced token ids,
//! and the vectors, against the native CPU reference; then the same with
//! the tiny LFM2 HF directory through its chat template, greedy and
//! sampled (the engine's sampler, a fixed seed), and the message for a
//! model over the adapter's buffer limits. A screenshot of the page after
//! each run is kept in `target/web-artifacts/`.
//!
//! Like the other GPU tests it fails without its adapter (here: without
//! Chromium, chromedriver or the built page) unless `LFM_SKIP_GPU_TESTS=1`.

use lfm::cli::DeviceChoice;
use lfm::models::{load_llm, LoadOptions};
use lfm::run::chat::{ChatTemplate, Message};
use lfm::run::embed::{cosine, EmbedOptions, Embedder};
use lfm::sampling::{Sampler, SamplingOptions};
use lfm::tensor::Activations;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const CHROMIUM: &str = "/usr/bin/chromium";
/// The default encoder (`embed`'s), fetched by scripts/setup.
const ENCODER: &str = "samples/models/all-minilm-l6-v2";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// Chromium's WebGPU without a GPU: SwiftShader's Vulkan.
const WEBGPU_ARGS: &[&str] = &[
    "--enable-unsafe-webgpu",
    "--enable-features=Vulkan",
    "--use-vulkan=swiftshader",
    "--use-webgpu-adapter=swiftshader",
];

/// Headless, as root (no sandbox), and nothing that reaches for the network.
const CHROMIUM_ARGS: &[&str] = &[
    "--headless=new",
    "--no-sandbox",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
    "--window-size=1100,1300",
];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// What the page needs and this machine may lack; `None` when all is there.
fn missing() -> Option<String> {
    for (path, what) in [
        (CHROMIUM, "chromium (apt-get install chromium)"),
        (
            CHROMEDRIVER,
            "chromedriver (apt-get install chromium-driver)",
        ),
    ] {
        if !Path::new(path).exists() {
            return Some(what.to_string());
        }
    }
    let wasm = root().join("web/pkg/lfm_web_bg.wasm");
    if !wasm.exists() {
        return Some(format!("{} (run scripts/web-build)", wasm.display()));
    }
    None
}

/// Serves `web/` at `/`, the LLM fixtures at `/fixtures/` and
/// `samples/models/` at `/models/` (the speed run's), GET only,
/// one thread per connection, until the test process ends.
fn serve() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let _ = answer(stream);
            });
        }
    });
    port
}

fn answer(mut stream: TcpStream) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 || h == "\r\n" {
            break;
        }
    }
    let path = line.split_whitespace().nth(1).unwrap_or("/");
    let path = path.split('?').next().unwrap_or("/");
    let file = if let Some(rest) = path.strip_prefix("/fixtures/") {
        root().join("samples/fixtures/llm").join(rest)
    } else if let Some(rest) = path.strip_prefix("/models/") {
        root().join("samples/models").join(rest)
    } else if let Some(rest) = path.strip_prefix("/encoder/") {
        root().join(ENCODER).join(rest)
    } else if path == "/" {
        root().join("web/index.html")
    } else {
        root().join("web").join(path.trim_start_matches('/'))
    };
    let body = if path.contains("..") {
        None
    } else {
        std::fs::read(&file).ok()
    };
    let Some(body) = body else {
        return stream.write_all(
            b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        );
    };
    let kind = match file.extension().and_then(|e| e.to_str()) {
        Some("html") => "text/html; charset=utf-8",
        Some("js") => "text/javascript",
        Some("css") => "text/css",
        Some("wasm") => "application/wasm",
        _ => "application/octet-stream",
    };
    write!(
        stream,
        "HTTP/1.1 200 OK\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n",
        body.len()
    )?;
    stream.write_all(&body)
}

/// One HTTP/1.1 request to chromedriver; the JSON answer. A connection
/// chromedriver resets (seen once in a fresh clone's first run, while
/// Chromium was starting) is tried again, up to three times: every request
/// here is safe to repeat (a poll, a navigation, a session whose first
/// attempt never answered).
fn webdriver(port: u16, method: &str, path: &str, body: Option<&Value>) -> Value {
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let mut tries = 0;
    loop {
        match webdriver_once(port, method, path, &body) {
            Ok(v) => return v,
            Err(e) if tries < 3 => {
                eprintln!("chromedriver {method} {path}: {e}; trying again");
                tries += 1;
                std::thread::sleep(Duration::from_millis(500));
            }
            Err(e) => panic!("chromedriver {method} {path}: {e}"),
        }
    }
}

fn webdriver_once(port: u16, method: &str, path: &str, body: &str) -> std::io::Result<Value> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    // chromedriver keeps the connection open: read the head, then exactly
    // Content-Length bytes.
    let mut r = BufReader::new(s);
    let mut len = 0;
    loop {
        let mut h = String::new();
        if r.read_line(&mut h)? == 0 || h == "\r\n" {
            break;
        }
        if let Some((name, value)) = h.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                len = value.trim().parse().expect("a Content-Length");
            }
        }
    }
    let mut raw = vec![0; len];
    r.read_exact(&mut raw)?;
    let json = String::from_utf8_lossy(&raw);
    Ok(serde_json::from_str(&json).unwrap_or_else(|e| panic!("chromedriver {path}: {e}: {json}")))
}

struct Driver {
    child: Child,
    port: u16,
    session: String,
    /// Chromium's version, as chromedriver reports it.
    browser_version: String,
}

impl Driver {
    /// chromedriver and a Chromium with [`CHROMIUM_ARGS`] and `extra_args`.
    fn start(profile: &Path, extra_args: &[&str]) -> Driver {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver");
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "chromedriver did not listen");
            std::thread::sleep(Duration::from_millis(100));
        }
        let mut args: Vec<String> = CHROMIUM_ARGS.iter().map(|a| a.to_string()).collect();
        args.extend(extra_args.iter().map(|a| a.to_string()));
        args.push(format!("--user-data-dir={}", profile.display()));
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": CHROMIUM, "args": args},
        }}});
        let answer = webdriver(port, "POST", "/session", Some(&caps));
        let session = answer["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session: {answer}"))
            .to_string();
        let browser_version = answer["value"]["capabilities"]["browserVersion"]
            .as_str()
            .unwrap_or("unknown")
            .to_string();
        Driver {
            child,
            port,
            session,
            browser_version,
        }
    }

    fn call(&self, method: &str, what: &str, body: Option<&Value>) -> Value {
        let path = format!("/session/{}/{what}", self.session);
        webdriver(self.port, method, &path, body)["value"].clone()
    }

    /// Opens `url` and waits (up to `limit`) for the page's `lfmResult`.
    fn run_page(&self, url: &str, limit: Duration) -> Value {
        self.call("POST", "url", Some(&json!({ "url": url })));
        let deadline = Instant::now() + limit;
        loop {
            let v = self.call(
                "POST",
                "execute/sync",
                Some(&json!({"script": "return window.lfmResult || null", "args": []})),
            );
            if !v.is_null() {
                return v;
            }
            assert!(
                Instant::now() < deadline,
                "no result from {url} in {limit:?}"
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// Runs another generation on the page's loaded model (its
    /// `lfmGenerate`, the form changed by `query`) and waits for the result.
    fn generate_again(&self, query: &str, limit: Duration) -> Value {
        self.call(
            "POST",
            "execute/sync",
            Some(&json!({"script": "window.lfmGenerate(arguments[0])", "args": [query]})),
        );
        let deadline = Instant::now() + limit;
        loop {
            let v = self.call(
                "POST",
                "execute/sync",
                Some(&json!({"script": "return window.lfmResult || null", "args": []})),
            );
            if !v.is_null() {
                return v;
            }
            assert!(
                Instant::now() < deadline,
                "no result from {query} in {limit:?}"
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// Picks `files` in the page's file input `#id` (WebDriver's send keys:
    /// one path a line for an input that takes several).
    fn pick_files(&self, id: &str, files: &[PathBuf]) {
        let el = self.call(
            "POST",
            "element",
            Some(&json!({"using": "css selector", "value": format!("#{id}")})),
        );
        let el = el
            .as_object()
            .and_then(|o| o.values().next())
            .and_then(Value::as_str)
            .unwrap_or_else(|| panic!("no #{id}: {el}"))
            .to_string();
        let text: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
        let answer = self.call(
            "POST",
            &format!("element/{el}/value"),
            Some(&json!({ "text": text.join("\n") })),
        );
        assert!(answer.is_null(), "send keys to #{id}: {answer}");
    }

    /// Waits (up to `limit`) until the element `#id`'s text contains `want`
    /// or the page reports an error; returns the text.
    fn wait_for_text(&self, id: &str, want: &str, limit: Duration) -> String {
        let deadline = Instant::now() + limit;
        loop {
            let v = self.call(
                "POST",
                "execute/sync",
                Some(&json!({
                    "script": "return [document.getElementById(arguments[0]).textContent, (window.lfmResult || {}).error || null]",
                    "args": [id]
                })),
            );
            let text = v[0].as_str().unwrap_or("").to_string();
            if text.contains(want) {
                return text;
            }
            if let Some(e) = v[1].as_str() {
                panic!("the page failed while #{id} waited for {want:?}: {e}");
            }
            assert!(
                Instant::now() < deadline,
                "#{id} is {text:?} after {limit:?}"
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    fn screenshot(&self, to: &Path) {
        let b64 = self.call("GET", "screenshot", None);
        let png = base64_decode(b64.as_str().expect("a base64 screenshot"));
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        lfm::util::atomic_write::write_atomic(to, &png, true).expect("write the screenshot");
        eprintln!("screenshot: {}", to.display());
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = webdriver(
            self.port,
            "DELETE",
            &format!("/session/{}", self.session),
            None,
        );
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn base64_decode(s: &str) -> Vec<u8> {
    let val = |c: u8| -> u32 {
        match c {
            b'A'..=b'Z' => (c - b'A') as u32,
            b'a'..=b'z' => (c - b'a' + 26) as u32,
            b'0'..=b'9' => (c - b'0' + 52) as u32,
            b'+' => 62,
            b'/' => 63,
            _ => panic!("not base64: {c}"),
        }
    };
    let bytes: Vec<u8> = s.bytes().filter(|&c| c != b'=' && c != b'\n').collect();
    let mut out = Vec::with_capacity(bytes.len() * 3 / 4);
    for chunk in bytes.chunks(4) {
        let mut acc = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            acc |= val(c) << (18 - 6 * i);
        }
        let n = chunk.len() - 1;
        out.extend_from_slice(&acc.to_be_bytes()[1..1 + n]);
    }
    out
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an id list: {v}"))
        .iter()
        .map(|x| x.as_u64().expect("an id") as u32)
        .collect()
}

/// The CPU reference's greedy run: prompt ids, then up to `max` produced
/// tokens (the last may be an end of sequence), as the page generates.
fn cpu_greedy(model: &Path, prompt: &str, max: usize) -> (Vec<u32>, Vec<u32>) {
    let mut m = load_llm(
        model,
        &LoadOptions {
            device: DeviceChoice::Cpu,
            weight_type: None,
            cpu_activations: Activations::F32,
        },
    )
    .unwrap();
    let tok = m.tokenizer.take().expect("the fixture has a tokenizer");
    let prompt_ids = tok.encode(prompt, true).unwrap();
    let logits = m.model.forward(&prompt_ids, false).unwrap();
    let mut produced = vec![lfm::sampling::argmax(&logits) as u32];
    while produced.len() < max && !tok.eos_ids.contains(produced.last().unwrap()) {
        produced.push(m.model.step_greedy(*produced.last().unwrap()).unwrap());
    }
    (prompt_ids, produced)
}

/// The CPU reference of a run as `generate` makes it on an HF directory:
/// the prompt through the model's chat template, generation_config.json's
/// sampling settings with `temperature`/`seed` replaced when given, the
/// first token drawn after the prefill, then one step each; up to `max`
/// produced tokens (the last may be an end of sequence), as the page does.
fn cpu_chat_run(
    dir: &Path,
    prompt: &str,
    max: usize,
    sampling: Option<(f32, u64)>,
) -> (String, Vec<u32>, Vec<u32>) {
    let mut m = load_llm(
        dir,
        &LoadOptions {
            device: DeviceChoice::Cpu,
            weight_type: None,
            cpu_activations: Activations::F32,
        },
    )
    .unwrap();
    let tok = m.tokenizer.take().expect("the fixture has a tokenizer");
    let template = ChatTemplate::new(
        tok.chat_template
            .as_ref()
            .expect("the fixture has a chat template"),
        tok.bos_token.as_deref(),
        tok.eos_token.as_deref(),
    );
    let text = template
        .render(&[Message::new("user", prompt)], true)
        .unwrap();
    let prompt_ids = tok.encode(&text, false).unwrap();
    let mut opts: SamplingOptions = m.sampling_defaults.clone();
    if let Some((t, seed)) = sampling {
        opts.temperature = t;
        opts.seed = seed;
    }
    let mut sampler = Sampler::new(opts);
    let logits = m.model.forward(&prompt_ids, false).unwrap();
    let mut history = prompt_ids.clone();
    let mut produced = vec![sampler.sample(&logits, &history)];
    history.push(produced[0]);
    while produced.len() < max && !tok.eos_ids.contains(produced.last().unwrap()) {
        let next = m
            .model
            .step_sample(*produced.last().unwrap(), &mut sampler, &history)
            .unwrap();
        produced.push(next);
        history.push(next);
    }
    (text, prompt_ids, produced)
}

/// False (skip) only when something is missing and LFM_SKIP_GPU_TESTS is
/// set; panics when something is missing otherwise.
fn ready() -> bool {
    let Some(what) = missing() else {
        return true;
    };
    if std::env::var_os("LFM_SKIP_GPU_TESTS").is_some() {
        eprintln!("SKIPPING the browser test (LFM_SKIP_GPU_TESTS set): no {what}");
        return false;
    }
    panic!("the browser test needs {what}; set LFM_SKIP_GPU_TESTS=1 to skip it");
}

/// Page (WebGPU) and CPU embeddings differ by f32 summation order through
/// six layers (measured on SwiftShader: below 2e-7 per element of the unit
/// vectors); a wrong op (a missed residual, a wrong pooling) moves elements
/// by 1e-2 and more. 1e-5 leaves room for other adapters' exp and fused
/// multiply-adds.
const EMBED_TOL: f32 = 1e-5;

const SENTENCES: [&str; 3] = [
    "A cat sits on the mat.",
    "A kitten is resting on a rug.",
    "The stock market fell sharply today.",
];

/// `%`-escapes a query parameter's value.
fn escape(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[test]
fn page_generates_and_embeds_on_webgpu_as_the_cpu_reference_does() {
    if !ready() {
        return;
    }
    let port = serve();
    let profile = std::env::temp_dir().join(format!("lfm-web-profile-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&profile);
    let driver = Driver::start(&profile, WEBGPU_ARGS);

    let (prompt, max) = ("The capital of France is", 24);
    let url = format!(
        "http://127.0.0.1:{port}/?model=/fixtures/tiny-lfm2.f32.gguf&max={max}&prompt={}\
         &temperature=0&raw=1&encoder=/encoder/&sentences={}&run=1",
        escape(prompt),
        escape(&serde_json::to_string(&SENTENCES).unwrap())
    );
    let got = driver.run_page(&url, Duration::from_secs(240));
    driver.screenshot(&root().join("target/web-artifacts/generate.png"));
    eprintln!("page: {got}");
    assert!(got.get("error").is_none(), "the page failed: {got}");
    assert!(
        got["adapter"]
            .as_str()
            .unwrap_or("")
            .contains("BrowserWebGpu"),
        "not on the browser's WebGPU: {got}"
    );

    let (want_prompt, want) = cpu_greedy(
        &root().join("samples/fixtures/llm/tiny-lfm2.f32.gguf"),
        prompt,
        max,
    );
    assert_eq!(ids(&got["promptIds"]), want_prompt, "prompt ids");
    assert_eq!(
        ids(&got["ids"]),
        want,
        "greedy ids: page (WebGPU) vs CPU reference"
    );

    let cpu = Embedder::load(&root().join(ENCODER), None).unwrap();
    let want = cpu.embed(&SENTENCES, &EmbedOptions::default()).unwrap();
    let dim = want.len() / SENTENCES.len();
    let rows = got["embedding"]["vectors"]
        .as_array()
        .unwrap_or_else(|| panic!("no vectors: {got}"));
    assert_eq!(rows.len(), SENTENCES.len());
    for (i, (row, want)) in rows.iter().zip(want.chunks(dim)).enumerate() {
        let row: Vec<f32> = row
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap() as f32)
            .collect();
        assert_eq!(row.len(), dim, "sentence {i}: dimensions");
        let worst = row
            .iter()
            .zip(want)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        eprintln!(
            "sentence {i}: max |page - cpu| {worst:.2e}, cosine {}",
            cosine(&row, want)
        );
        assert!(
            worst <= EMBED_TOL,
            "sentence {i}: max |page - cpu| = {worst}"
        );
    }
    drop(driver);
    let _ = std::fs::remove_dir_all(&profile);
}

#[test]
fn page_says_what_is_wrong_with_a_file_that_is_not_a_model() {
    if !ready() {
        return;
    }
    let port = serve();
    let profile = std::env::temp_dir().join(format!("lfm-web-profile-bad-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&profile);
    let driver = Driver::start(&profile, WEBGPU_ARGS);
    // The fixtures' README is a file, but not a GGUF.
    let url = format!("http://127.0.0.1:{port}/?model=/fixtures/README.md&run=1");
    let got = driver.run_page(&url, Duration::from_secs(120));
    driver.screenshot(&root().join("target/web-artifacts/not-a-model.png"));
    let err = got["error"]
        .as_str()
        .unwrap_or_else(|| panic!("no error: {got}"));
    assert!(
        err.contains("README.md") && err.contains("not a GGUF file"),
        "{err}"
    );
    drop(driver);
    let _ = std::fs::remove_dir_all(&profile);
}

#[test]
fn page_says_so_when_the_browser_offers_no_webgpu() {
    if !ready() {
        return;
    }
    let port = serve();
    let profile = std::env::temp_dir().join(format!("lfm-web-profile-off-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&profile);
    let driver = Driver::start(&profile, &["--disable-features=WebGPU"]);
    let got = driver.run_page(
        &format!("http://127.0.0.1:{port}/"),
        Duration::from_secs(60),
    );
    driver.screenshot(&root().join("target/web-artifacts/no-webgpu.png"));
    let err = got["error"]
        .as_str()
        .unwrap_or_else(|| panic!("no error: {got}"));
    assert!(err.contains("WebGPU"), "{err}");
    drop(driver);
    let _ = std::fs::remove_dir_all(&profile);
}

#[test]
fn page_runs_an_hf_directory_with_its_chat_template_and_sampler_as_the_cpu_reference_does() {
    if !ready() {
        return;
    }
    let port = serve();
    let profile = std::env::temp_dir().join(format!("lfm-web-profile-hf-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&profile);
    let driver = Driver::start(&profile, WEBGPU_ARGS);
    let dir = root().join("samples/fixtures/llm/tiny-lfm2");
    let (prompt, max) = ("Name a colour.", 12);
    let base = format!(
        "http://127.0.0.1:{port}/?model=/fixtures/tiny-lfm2/&max={max}&prompt={}&run=1",
        escape(prompt)
    );

    // The directory's own defaults: generation_config.json says do_sample
    // false (greedy), and the tokenizer carries a chat template.
    let got = driver.run_page(&base, Duration::from_secs(180));
    driver.screenshot(&root().join("target/web-artifacts/hf-dir-greedy.png"));
    eprintln!("page (greedy): {got}");
    assert!(got.get("error").is_none(), "the page failed: {got}");
    assert!(
        got["model"]
            .as_str()
            .unwrap_or("")
            .contains("tiny-lfm2: Lfm2"),
        "{got}"
    );
    let (text, want_prompt, want_greedy) = cpu_chat_run(&dir, prompt, max, None);
    assert!(text.contains("<|im_start|>user"), "{text}");
    assert_eq!(
        got["promptText"].as_str(),
        Some(text.as_str()),
        "templated prompt"
    );
    assert_eq!(ids(&got["promptIds"]), want_prompt, "prompt ids");
    assert_eq!(
        ids(&got["ids"]),
        want_greedy,
        "greedy ids: page (WebGPU, HF directory) vs CPU reference"
    );

    // Sampled: temperature 1 with the directory's top-k/top-p/min-p, seed 7.
    let got = driver.generate_again("temperature=1&seed=7", Duration::from_secs(120));
    driver.screenshot(&root().join("target/web-artifacts/hf-dir-sampled.png"));
    eprintln!("page (sampled): {got}");
    assert!(got.get("error").is_none(), "the page failed: {got}");
    let (_, _, want) = cpu_chat_run(&dir, prompt, max, Some((1.0, 7)));
    assert_ne!(want, want_greedy, "the sampled run must differ from greedy");
    assert_eq!(
        ids(&got["ids"]),
        want,
        "sampled ids (seed 7): page (WebGPU) vs CPU reference"
    );

    // The same directory picked as files (the page's file input, as a user
    // picks them), then generated greedily from the form.
    let got = driver.run_page(
        &format!(
            "http://127.0.0.1:{port}/?max={max}&prompt={}",
            escape(prompt)
        ),
        Duration::from_secs(120),
    );
    assert!(got.get("error").is_none(), "the page failed: {got}");
    let files: Vec<PathBuf> = [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    .iter()
    .map(|f| dir.join(f))
    .collect();
    driver.pick_files("model-file", &files);
    let shown = driver.wait_for_text("model", "loaded in", Duration::from_secs(120));
    assert!(
        shown.contains("Lfm2") && shown.contains("chat template"),
        "{shown}"
    );
    let got = driver.generate_again("", Duration::from_secs(120));
    driver.screenshot(&root().join("target/web-artifacts/hf-dir-picked.png"));
    assert!(got.get("error").is_none(), "the page failed: {got}");
    assert_eq!(
        ids(&got["promptIds"]),
        want_prompt,
        "picked files: prompt ids"
    );
    assert_eq!(ids(&got["ids"]), want_greedy, "picked files: greedy ids");
    // And as a directory (the input with webkitdirectory), on the same page.
    driver.pick_files("model-dir", std::slice::from_ref(&dir));
    let shown = driver.wait_for_text("model", "tiny-lfm2: Lfm2", Duration::from_secs(120));
    assert!(shown.contains("loaded in"), "{shown}");

    // A device that allows buffers and bindings of 1 KiB: a row of the
    // feed-forward's down matrix does not fit. The page says so (and does
    // not hang).
    let got = driver.run_page(&format!("{base}&maxbuffer=1024"), Duration::from_secs(120));
    driver.screenshot(&root().join("target/web-artifacts/too-large.png"));
    let err = got["error"]
        .as_str()
        .unwrap_or_else(|| panic!("no error: {got}"));
    assert!(
        err.contains("tiny-lfm2 does not fit this WebGPU adapter (buffers up to 1024 bytes")
            && err.contains("exceeds the adapter's 1024 byte binding limit"),
        "{err}"
    );

    // An HF directory that holds no language model (the encoder's): the
    // message names the directory's file, not the tab's in-memory path.
    let got = driver.run_page(
        &format!("http://127.0.0.1:{port}/?model=/encoder/&run=1"),
        Duration::from_secs(120),
    );
    let err = got["error"]
        .as_str()
        .unwrap_or_else(|| panic!("no error: {got}"));
    eprintln!("not an LLM directory: {err}");
    assert!(
        err.contains("encoder/config.json: unsupported: model_type 'bert'")
            && !err.contains("/model/"),
        "{err}"
    );
    drop(driver);
    let _ = std::fs::remove_dir_all(&profile);
}

/// The page's own speed (not run by default; `LFM_WEB_BENCH` names the
/// models, paths under the server's `/fixtures/` or `/models/`, comma
/// separated; `LFM_WEB_BENCH_MAX` the tokens to produce, default 16): the
/// load, prefill and decode rates the page shows, with the browser and the
/// adapter, printed and written to `target/web-artifacts/bench.json`. BENCHMARKS.md, "In a
/// browser tab", has the command.
#[test]
#[ignore]
fn page_speed() {
    let Ok(models) = std::env::var("LFM_WEB_BENCH") else {
        eprintln!("page_speed: set LFM_WEB_BENCH=/fixtures/tiny-lfm2.f32.gguf,...");
        return;
    };
    assert!(ready());
    let max: usize = std::env::var("LFM_WEB_BENCH_MAX")
        .ok()
        .map(|m| m.parse().expect("LFM_WEB_BENCH_MAX: a number"))
        .unwrap_or(16);
    let port = serve();
    let profile =
        std::env::temp_dir().join(format!("lfm-web-profile-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&profile);
    let driver = Driver::start(&profile, WEBGPU_ARGS);
    let mut rows = Vec::new();
    for model in models.split(',') {
        // Greedy on the raw prompt: the same work on every model.
        let url = format!(
            "http://127.0.0.1:{port}/?model={model}&max={max}&prompt={}&temperature=0&raw=1&run=1",
            escape("The capital of France is")
        );
        let t0 = Instant::now();
        let got = driver.run_page(&url, Duration::from_secs(3600));
        let name = model
            .trim_end_matches('/')
            .rsplit('/')
            .next()
            .unwrap_or(model);
        driver.screenshot(&root().join(format!("target/web-artifacts/bench-{name}.png")));
        assert!(
            got.get("error").is_none(),
            "{model}: the page failed: {got}"
        );
        let row = json!({
            "model": model,
            "browser": format!("Chromium {}", driver.browser_version),
            "adapter": got["adapter"],
            "loaded": got["model"],
            "prompt_tokens": got["promptIds"].as_array().map(|a| a.len()),
            "prefill_seconds": got["prefillSeconds"],
            "prefill_tok_per_s": got["prefillTokS"],
            "generated_tokens": got["ids"].as_array().map(|a| a.len()),
            "decode_seconds": got["decodeSeconds"],
            "decode_tok_per_s": got["decodeTokS"],
            "page_seconds": t0.elapsed().as_secs_f64(),
        });
        eprintln!("{row:#}");
        rows.push(row);
    }
    let out = root().join("target/web-artifacts/bench.json");
    lfm::util::atomic_write::write_atomic(
        &out,
        serde_json::to_string_pretty(&rows).unwrap().as_bytes(),
        true,
    )
    .expect("write bench.json");
    drop(driver);
    let _ = std::fs::remove_dir_all(&profile);
}
