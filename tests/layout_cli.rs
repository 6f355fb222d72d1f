//! `ocr-layout` from the outside: JSON output, drawing, batches, and bad
//! input (clear one-line errors, exit status 1 or 2, no panic). The model
//! runs on the CPU here; tests/layout_parity.rs covers the GPU.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn page() -> PathBuf {
    root().join("samples/fixtures/layout/page-mime-02.png")
}

fn model() -> PathBuf {
    let p = root().join("samples/models/layout-cdla/layout_cdla.onnx");
    assert!(p.exists(), "{} is missing: run scripts/setup", p.display());
    p
}

/// A fresh directory for one test.
fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("lfm-layout-cli-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn ocr_layout(args: &[&dyn AsRef<std::ffi::OsStr>], stdin: Option<&str>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ocr-layout"));
    cmd.arg("--model").arg(model()).arg("--no-text");
    for a in args {
        cmd.arg(a);
    }
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    if let Some(text) = stdin {
        child
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
    }
    child.wait_with_output().unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Bad input: exit status 1, an error line naming `what`, no panic.
#[track_caller]
fn assert_clean_failure(o: &Output, what: &str) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(1), "stderr: {err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(
        err.lines()
            .any(|l| l.starts_with("error: ") && l.contains(what)),
        "no error line mentioning {what:?}: {err}"
    );
}

fn records(o: &Output) -> Vec<serde_json::Value> {
    String::from_utf8(o.stdout.clone())
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn finds_regions_and_draws_them() {
    let dir = scratch("draw");
    let out = dir.join("boxes.png");
    let o = ocr_layout(&[&"--cpu", &page(), &"--draw", &out], None);
    assert!(o.status.success(), "{}", stderr(&o));
    let recs = records(&o);
    assert_eq!(recs.len(), 1);
    let r = &recs[0];
    assert_eq!(
        (r["width"].as_u64(), r["height"].as_u64()),
        (Some(847), Some(1096))
    );
    let boxes = r["boxes"].as_array().unwrap();
    // The gold has 15 regions: text, titles, header, footer, a reference.
    assert_eq!(boxes.len(), 15, "{r}");
    for class in ["text", "title", "header", "footer", "reference"] {
        assert!(boxes.iter().any(|b| b["class"] == class), "no {class}: {r}");
    }
    for b in boxes {
        let (x0, y0, x1, y1) = (
            b["x0"].as_f64().unwrap(),
            b["y0"].as_f64().unwrap(),
            b["x1"].as_f64().unwrap(),
            b["y1"].as_f64().unwrap(),
        );
        assert!(
            0.0 <= x0 && x0 < x1 && x1 <= 847.0 && 0.0 <= y0 && y0 < y1 && y1 <= 1096.0,
            "{b}"
        );
        assert!(b["score"].as_f64().unwrap() > 0.5);
    }
    // The drawing: the page, same size, with coloured pixels on it.
    let drawn = lfm::run::image::load(&out).unwrap();
    let original = lfm::run::image::load(&page()).unwrap();
    assert_eq!((drawn.width, drawn.height), (847, 1096));
    let coloured = drawn
        .data
        .chunks_exact(3)
        .filter(|p| p[0] != p[1] || p[1] != p[2])
        .count();
    assert!(coloured > 5000, "only {coloured} coloured pixels");
    assert_ne!(drawn.data, original.data);

    // An existing drawing is kept unless --force.
    let o = ocr_layout(
        &[&"--cpu", &page(), &"--draw", &out, &"--threshold", &"0.9"],
        None,
    );
    assert_clean_failure(&o, "already exists");
    assert_eq!(lfm::run::image::load(&out).unwrap(), drawn);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn batches_from_a_directory_and_from_stdin() {
    let dir = scratch("batch");
    let pages = dir.join("pages");
    std::fs::create_dir_all(&pages).unwrap();
    std::fs::copy(page(), pages.join("a.png")).unwrap();
    std::fs::write(pages.join("b.png"), b"not a png at all").unwrap();
    std::fs::write(pages.join("notes.txt"), b"ignored: not an image name").unwrap();
    let drawings = dir.join("drawn");
    // A high threshold keeps this quick to check: only the surest regions.
    let o = ocr_layout(
        &[
            &"--cpu",
            &"--threshold",
            &"0.95",
            &pages,
            &"--draw",
            &drawings,
        ],
        None,
    );
    // b.png is reported and skipped; a.png is still processed.
    assert_clean_failure(&o, "b.png");
    let recs = records(&o);
    assert_eq!(recs.len(), 1);
    assert!(recs[0]["image"].as_str().unwrap().ends_with("a.png"));
    let n = recs[0]["boxes"].as_array().unwrap().len();
    assert!((1..15).contains(&n), "{n} boxes above 0.95");
    assert!(drawings.join("a.layout.png").exists());
    assert!(
        stderr(&o).contains("1 of 2 image(s) failed"),
        "{}",
        stderr(&o)
    );

    // The same page listed twice on stdin.
    let list = format!(
        "{}\n\n{}\n",
        page().display(),
        pages.join("a.png").display()
    );
    let o = ocr_layout(&[&"--cpu", &"--threshold", &"0.95"], Some(&list));
    assert!(o.status.success(), "{}", stderr(&o));
    let recs = records(&o);
    assert_eq!(recs.len(), 2);
    assert_eq!(recs[0]["boxes"], recs[1]["boxes"]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// CRC-32 (IEEE), for writing PNG chunks by hand.
fn crc32(bytes: &[u8]) -> u32 {
    let mut c = 0xffff_ffffu32;
    for &b in bytes {
        c ^= b as u32;
        for _ in 0..8 {
            c = if c & 1 != 0 {
                0xedb8_8320 ^ (c >> 1)
            } else {
                c >> 1
            };
        }
    }
    !c
}

fn chunk(out: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
    let mut body = kind.to_vec();
    body.extend_from_slice(data);
    out.extend((data.len() as u32).to_be_bytes());
    out.extend(&body);
    out.extend(crc32(&body).to_be_bytes());
}

/// A PNG file with these dimensions whose pixel data is a few bytes of an
/// unfinished zlib stream: decoders read the header, then fail (or would
/// allocate the whole image first).
fn png_header_only(path: &Path, width: u32, height: u32) {
    let mut ihdr = Vec::new();
    ihdr.extend(width.to_be_bytes());
    ihdr.extend(height.to_be_bytes());
    ihdr.extend([8, 2, 0, 0, 0]); // 8-bit RGB
    let mut f = b"\x89PNG\r\n\x1a\n".to_vec();
    chunk(&mut f, b"IHDR", &ihdr);
    chunk(&mut f, b"IDAT", &[0x78, 0x9c, 0x00]);
    chunk(&mut f, b"IEND", &[]);
    std::fs::write(path, f).unwrap();
}

#[test]
fn bad_images_are_clear_errors() {
    let dir = scratch("bad-images");
    let text = dir.join("page.png");
    std::fs::write(&text, "just text, not an image").unwrap();
    assert_clean_failure(
        &ocr_layout(&[&"--cpu", &text], None),
        "page.png: not a PNG or JPEG image",
    );

    let missing = dir.join("missing.png");
    assert_clean_failure(&ocr_layout(&[&"--cpu", &missing], None), "missing.png");

    let empty = dir.join("empty.png");
    png_header_only(&empty, 0, 0);
    assert_clean_failure(&ocr_layout(&[&"--cpu", &empty], None), "empty.png");

    // 100k x 100k RGB would need 28 GiB: refused before any allocation.
    let huge = dir.join("huge.png");
    png_header_only(&huge, 100_000, 100_000);
    assert_clean_failure(&ocr_layout(&[&"--cpu", &huge], None), "too large");

    let truncated = dir.join("truncated.png");
    let bytes = std::fs::read(page()).unwrap();
    std::fs::write(&truncated, &bytes[..bytes.len() / 3]).unwrap();
    assert_clean_failure(&ocr_layout(&[&"--cpu", &truncated], None), "truncated.png");

    let nothing = dir.join("nothing");
    std::fs::create_dir_all(&nothing).unwrap();
    assert_clean_failure(
        &ocr_layout(&[&"--cpu", &nothing], None),
        "no PNG, JPEG or PDF files",
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_models_are_clear_errors() {
    let dir = scratch("bad-models");
    let run = |model: &Path| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_ocr-layout"));
        cmd.args(["--cpu", "--model"]).arg(model).arg(page());
        cmd.output().unwrap()
    };
    assert_clean_failure(&run(&page()), "not an ONNX model");
    let truncated = dir.join("cut.onnx");
    std::fs::write(&truncated, &std::fs::read(model()).unwrap()[..100_000]).unwrap();
    assert_clean_failure(&run(&truncated), "cut.onnx: damaged ONNX file: ModelProto");
    assert_clean_failure(&run(&dir.join("none.onnx")), "no such model file");
    // A real ONNX model of another kind: the Piper voice, when fetched.
    let voice = root().join("samples/models/piper-joe/en_US-joe-medium.onnx");
    if voice.exists() {
        assert_clean_failure(&run(&voice), "unsupported");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_command_lines_exit_2() {
    for args in [
        &["--threshold", "2"][..],
        &["--iou", "x"],
        &["--cpu", "--adapter", "foo"],
    ] {
        let o = Command::new(env!("CARGO_BIN_EXE_ocr-layout"))
            .args(args)
            .arg(page())
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
    }
}
