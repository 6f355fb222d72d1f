//! `ocr-layout` reading text, from the outside: a page image as JSON with
//! its drawing, a real PDF page as Markdown, and bad documents (empty,
//! damaged, a page range past the end, a text model that is not one) as
//! clear errors while the rest of the batch is still read. CPU only.

mod common;

use std::path::PathBuf;
use std::process::{Command, Output};

fn ocr_layout(args: &[&dyn AsRef<std::ffi::OsStr>]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ocr-layout"));
    cmd.arg("--cpu")
        .arg("--model")
        .arg(common::model("layout-cdla/layout_cdla.onnx"))
        .arg("--text-models")
        .arg(common::model("ppocr-v4"));
    for a in args {
        cmd.arg(a);
    }
    cmd.output().unwrap()
}

fn page() -> PathBuf {
    common::repo().join("samples/fixtures/ocr/page.png")
}

/// A real PDF from Debian's shared-mime-info (installed by scripts/setup).
fn spec_pdf() -> PathBuf {
    let p = PathBuf::from("/usr/share/doc/shared-mime-info/shared-mime-info-spec.pdf");
    assert!(p.exists(), "{} is missing: run scripts/setup", p.display());
    p
}

#[test]
fn reads_a_page_image_into_regions_lines_and_a_drawing() {
    let dir = common::scratch("ocr-draw");
    let drawing = dir.join("page.png");
    let o = ocr_layout(&[&page(), &"--draw", &drawing]);
    assert!(o.status.success(), "{}", common::stderr(&o));
    let out = common::stdout(&o);
    let r: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let lines = r["lines"].as_array().unwrap();
    assert_eq!(lines.len(), 18, "{r}");
    assert_eq!(lines[0]["text"], "2 ASN.1 structure handling");
    let boxes = r["boxes"].as_array().unwrap();
    // Every line belongs to a region, and the regions' text is the lines'.
    for l in lines {
        let k = l["region"].as_u64().unwrap() as usize;
        assert!(boxes[k]["text"]
            .as_str()
            .unwrap()
            .contains(l["text"].as_str().unwrap()));
        assert_eq!(l["box"].as_array().unwrap().len(), 4);
    }
    // Reading order: the title first, the syntax paragraph before the code.
    let text = r["text"].as_str().unwrap();
    assert!(text.starts_with("2 ASN.1 structure handling\n\n"), "{text}");
    let para = text.find("The parser is case sensitive").unwrap();
    assert!(para < text.find("definitions_name").unwrap(), "{text}");
    let drawn = lfm::run::image::load(&drawing).unwrap();
    let original = lfm::run::image::load(&page()).unwrap();
    assert_eq!(
        (drawn.width, drawn.height),
        (original.width, original.height)
    );
    // Line boxes in their own colour.
    assert!(drawn.data.chunks_exact(3).any(|p| p == [220, 20, 60]));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn reads_a_pdf_page_as_markdown() {
    let o = ocr_layout(&[&spec_pdf(), &"--pages", &"1", &"--dpi", &"72", &"-f", &"md"]);
    assert!(o.status.success(), "{}", common::stderr(&o));
    let md = common::stdout(&o);
    assert!(md.contains("Shared MIME-info Database"), "{md}");
    assert!(md.contains("## "), "no heading: {md}");
    assert!(md.contains("Introduction"), "{md}");
}

#[test]
fn bad_documents_fail_alone() {
    let dir = common::scratch("ocr-bad");
    let empty = dir.join("empty.pdf");
    std::fs::write(&empty, b"").unwrap();
    let damaged = dir.join("damaged.pdf");
    let bytes = std::fs::read(spec_pdf()).unwrap();
    std::fs::write(&damaged, &bytes[..4000]).unwrap();
    // The good image is still read (layout only, to keep this cheap).
    let o = ocr_layout(&[&empty, &damaged, &page(), &"--no-text"]);
    common::assert_clean_failure(&o, &["empty.pdf"]);
    let err = common::stderr(&o);
    assert!(err.contains("2 of 3 input(s) or page(s) failed"), "{err}");
    assert!(err.contains("empty.pdf: empty file"), "{err}");
    assert!(err.contains("damaged.pdf: not a readable PDF"), "{err}");
    assert_eq!(common::stdout(&o).lines().count(), 1);

    let o = ocr_layout(&[&spec_pdf(), &"--pages", &"16-20", &"--no-text"]);
    common::assert_clean_failure(&o, &["16-20"]);
    assert!(common::stderr(&o).contains("pages 16-20 requested, the document has 17 page(s)"));

    let o = ocr_layout(&[&page(), &"--pages", &"3-1"]);
    common::assert_usage_failure(&o, &["runs backwards"]);

    // A text model that is not one: the file is named.
    let models = dir.join("models");
    std::fs::create_dir_all(&models).unwrap();
    for f in [
        "ch_PP-OCRv4_rec_infer.onnx",
        "ch_ppocr_mobile_v2.0_cls_infer.onnx",
    ] {
        std::fs::copy(common::model(&format!("ppocr-v4/{f}")), models.join(f)).unwrap();
    }
    std::fs::copy(
        common::model("layout-cdla/layout_cdla.onnx"),
        models.join("ch_PP-OCRv4_det_infer.onnx"),
    )
    .unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ocr-layout"));
    let o = cmd
        .arg("--cpu")
        .arg("--text-models")
        .arg(&models)
        .arg("--model")
        .arg(common::model("layout-cdla/layout_cdla.onnx"))
        .arg(page())
        .output()
        .unwrap();
    common::assert_clean_failure(&o, &["ch_PP-OCRv4_det_infer.onnx"]);
    let _ = std::fs::remove_dir_all(&dir);
}
