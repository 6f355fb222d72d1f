//! `ocr-layout` reading text, from the outside: a page image as JSON with
//! its drawing, a real PDF page as Markdown, and bad documents (empty,
//! damaged, encrypted, a page range past the end, a text model that is not
//! one, an image too large to decode) as clear errors while the rest of the
//! batch is still read, and a page without text. CPU only.

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
    let encrypted = common::repo().join("samples/fixtures/ocr/encrypted.pdf");
    // The good image is still read (layout only, to keep this cheap).
    let o = ocr_layout(&[&empty, &damaged, &encrypted, &page(), &"--no-text"]);
    common::assert_clean_failure(&o, &["empty.pdf"]);
    let err = common::stderr(&o);
    assert!(err.contains("3 of 4 input(s) or page(s) failed"), "{err}");
    assert!(err.contains("empty.pdf: empty file"), "{err}");
    assert!(err.contains("damaged.pdf: not a readable PDF"), "{err}");
    assert!(
        err.contains("encrypted.pdf: the PDF is encrypted (password-protected)"),
        "{err}"
    );
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

#[test]
fn a_page_without_text_reads_as_no_lines() {
    // As RapidOCR, which returns no result for it: no lines, exit 0.
    let dir = common::scratch("ocr-blank");
    let blank = dir.join("blank.png");
    image::RgbImage::from_pixel(300, 200, image::Rgb([255, 255, 255]))
        .save(&blank)
        .unwrap();
    let o = ocr_layout(&[&blank]);
    assert!(o.status.success(), "{}", common::stderr(&o));
    let r: serde_json::Value = serde_json::from_str(common::stdout(&o).trim()).unwrap();
    assert_eq!(r["lines"].as_array().unwrap().len(), 0, "{r}");
    assert_eq!(r["text"], "", "{r}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A PNG of a `w` x `h` RGB image whose pixel data stops after one row
/// (a decoder that trusts the header would allocate the whole image).
fn png_header(w: u32, h: u32) -> Vec<u8> {
    use std::io::Write;
    let chunk = |png: &mut Vec<u8>, kind: &[u8], data: &[u8]| {
        let mut body = kind.to_vec();
        body.extend_from_slice(data);
        let mut crc = flate2::Crc::new();
        crc.update(&body);
        png.extend_from_slice(&(data.len() as u32).to_be_bytes());
        png.extend_from_slice(&body);
        png.extend_from_slice(&crc.sum().to_be_bytes());
    };
    let mut ihdr = w.to_be_bytes().to_vec();
    ihdr.extend_from_slice(&h.to_be_bytes());
    ihdr.extend_from_slice(&[8, 2, 0, 0, 0]);
    let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
    z.write_all(&vec![0u8; 1 + 3 * w as usize]).unwrap();
    let idat = z.finish().unwrap();
    let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
    chunk(&mut png, b"IHDR", &ihdr);
    chunk(&mut png, b"IDAT", &idat);
    chunk(&mut png, b"IEND", &[]);
    png
}

#[test]
fn a_20000_pixel_square_image_is_refused_before_decoding() {
    // 1.2 GB of pixels: refused from its header (bounded memory), named,
    // and the other image of the batch is still read.
    let dir = common::scratch("ocr-huge");
    let huge = dir.join("huge.png");
    std::fs::write(&huge, png_header(20000, 20000)).unwrap();
    let o = ocr_layout(&[&huge, &page(), &"--no-text"]);
    common::assert_clean_failure(&o, &["huge.png"]);
    let err = common::stderr(&o);
    assert!(
        err.contains("the image is too large: 20000x20000 pixels"),
        "{err}"
    );
    assert!(err.contains("1 of 2 image(s) failed"), "{err}");
    assert_eq!(common::stdout(&o).lines().count(), 1);
    let _ = std::fs::remove_dir_all(&dir);
}
