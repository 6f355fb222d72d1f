//! A `serve` process on a free loopback port for the tests, and a minimal
//! HTTP/1.1 client over a plain socket (so a test sees status lines,
//! headers and every byte of a stream as a client would).
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub struct Server {
    child: Child,
    pub port: u16,
    /// What the server printed on stderr after it started listening.
    pub log: Arc<Mutex<String>>,
}

impl Server {
    /// Starts `serve ARGS --port 0` and waits until it listens.
    pub fn start(args: &[&str]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_serve"))
            .args(args)
            .args(["--port", "0"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("serve starts");
        let mut err = BufReader::new(child.stderr.take().expect("piped"));
        let mut seen = String::new();
        let port = loop {
            let mut line = String::new();
            if err.read_line(&mut line).unwrap_or(0) == 0 {
                let status = child.wait().expect("serve exits");
                panic!("serve exited ({status}) before listening:\n{seen}");
            }
            seen.push_str(&line);
            if let Some(rest) = line.trim().strip_prefix("serve: listening on http://") {
                let port = rest.rsplit(':').next().expect("host:port");
                break port.parse().expect("a port number");
            }
        };
        let log = Arc::new(Mutex::new(String::new()));
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in err.lines().map_while(Result::ok) {
                let mut l = sink.lock().unwrap();
                l.push_str(&line);
                l.push('\n');
            }
        });
        Server { child, port, log }
    }

    pub fn request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Reply {
        request(self.port, method, path, headers, body)
    }

    pub fn post_json(&self, path: &str, body: &str) -> Reply {
        self.request(
            "POST",
            path,
            &[("Content-Type", "application/json")],
            body.as_bytes(),
        )
    }

    /// One number from `/metrics`.
    pub fn metric(&self, name: &str) -> f64 {
        let m = self.request("GET", "/metrics", &[], b"");
        assert_eq!(m.status, 200);
        m.text()
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no metric {name} in:\n{}", m.text()))
            .trim()
            .parse()
            .expect("a number")
    }

    /// Waits until `cond` holds for the metrics (the scheduler publishes
    /// after each step), failing after `secs`.
    pub fn wait_metric(&self, name: &str, want: f64, secs: u64) {
        let end = Instant::now() + Duration::from_secs(secs);
        loop {
            let v = self.metric(name);
            if v == want {
                return;
            }
            assert!(
                Instant::now() < end,
                "{name} is {v}, not {want}, after {secs} s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Sends SIGTERM and returns the exit status.
    pub fn terminate(mut self) -> std::process::ExitStatus {
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        let end = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(s) = self.child.try_wait().expect("wait") {
                return s;
            }
            assert!(
                Instant::now() < end,
                "serve did not stop within 60 s of SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The `data:` payloads of a server-sent event stream.
    pub fn events(&self) -> Vec<String> {
        self.text()
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .map(str::to_string)
            .collect()
    }
}

fn head(method: &str, path: &str, headers: &[(&str, &str)], len: usize) -> String {
    let mut h = format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Length: {len}\r\n");
    for (k, v) in headers {
        h.push_str(&format!("{k}: {v}\r\n"));
    }
    h.push_str("\r\n");
    h
}

/// Opens a connection and sends a request, leaving the answer unread.
pub fn send(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> TcpStream {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(300))).unwrap();
    s.write_all(head(method, path, headers, body.len()).as_bytes())
        .unwrap();
    // A server that refuses early may close before the body is through.
    let _ = s.write_all(body);
    s
}

pub fn request(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Reply {
    let mut s = send(port, method, path, headers, body);
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    parse(&raw)
}

fn parse(raw: &[u8]) -> Reply {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no HTTP head in {:?}", String::from_utf8_lossy(raw)));
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|c| c.parse().ok())
        .expect("a status line");
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let mut body = raw[split + 4..].to_vec();
    let chunked = headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
    if chunked {
        body = dechunk(&body);
    }
    Reply {
        status,
        headers,
        body,
    }
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let Some(eol) = b.windows(2).position(|w| w == b"\r\n") else {
            return out;
        };
        let size =
            usize::from_str_radix(String::from_utf8_lossy(&b[..eol]).trim(), 16).unwrap_or(0);
        if size == 0 || b.len() < eol + 2 + size {
            return out;
        }
        out.extend_from_slice(&b[eol + 2..eol + 2 + size]);
        b = &b[(eol + 4 + size).min(b.len())..];
    }
}

/// Reads from a streamed answer until `n` events have arrived, then hangs
/// up (a client that goes away mid-stream).
pub fn read_events_then_hang_up(mut s: TcpStream, n: usize) -> usize {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let got = s.read(&mut chunk).unwrap_or(0);
        if got == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..got]);
        let seen = String::from_utf8_lossy(&buf).matches("data: ").count();
        if seen >= n {
            return seen;
        }
    }
    String::from_utf8_lossy(&buf).matches("data: ").count()
}
