//! PDF pages as images, rendered by poppler's `pdftoppm` (Debian
//! `poppler-utils`, installed by scripts/setup): the page count from
//! `pdfinfo`, one page at a time at a chosen resolution.

use crate::error::{Error, Result};
use crate::run::image::{self, Rgb8};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Whether `path` names a PDF by its extension.
pub fn is_pdf_name(path: &Path) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| e.eq_ignore_ascii_case("pdf"))
}

/// The last line poppler wrote to stderr: its reason (an encrypted file
/// says "Incorrect password", a damaged one "Couldn't read xref table").
fn reason(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let line = text
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("no reason given");
    line.trim()
        .trim_start_matches("Command Line Error: ")
        .trim_start_matches("Syntax Error: ")
        .to_string()
}

fn tool(name: &str) -> Command {
    Command::new(name)
}

fn spawn_error(name: &str, e: std::io::Error) -> Error {
    Error::invalid(format!(
        "cannot run {name} ({e}): install poppler-utils (scripts/setup does)"
    ))
}

/// The number of pages of the PDF at `path`.
pub fn page_count(path: &Path) -> Result<usize> {
    let meta = std::fs::metadata(path).map_err(|e| Error::io(path, e))?;
    if meta.len() == 0 {
        return Err(Error::format(path, "empty file, not a PDF"));
    }
    let out = tool("pdfinfo")
        .arg(path)
        .output()
        .map_err(|e| spawn_error("pdfinfo", e))?;
    if !out.status.success() {
        let why = reason(&out.stderr);
        // poppler's word for a document that needs a user password.
        if why.contains("Incorrect password") {
            return Err(Error::format(
                path,
                "the PDF is encrypted (password-protected): decrypt it first, e.g. qpdf --decrypt",
            ));
        }
        return Err(Error::format(path, format!("not a readable PDF: {why}")));
    }
    let info = String::from_utf8_lossy(&out.stdout);
    let pages = info
        .lines()
        .find_map(|l| l.strip_prefix("Pages:"))
        .and_then(|v| v.trim().parse::<usize>().ok())
        .ok_or_else(|| Error::format(path, "pdfinfo gives no page count"))?;
    if pages == 0 {
        return Err(Error::format(path, "the PDF has no pages"));
    }
    Ok(pages)
}

/// Page `page` (from 1) of the PDF at `path`, rendered at `dpi`.
pub fn render_page(path: &Path, page: usize, dpi: u32) -> Result<Rgb8> {
    let dir = std::env::temp_dir().join(format!("lfm-pdf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
    let prefix: PathBuf = dir.join(format!("page-{page}"));
    let out = tool("pdftoppm")
        .args([
            "-r",
            &dpi.to_string(),
            "-f",
            &page.to_string(),
            "-l",
            &page.to_string(),
        ])
        .args(["-png", "-singlefile"])
        .arg(path)
        .arg(&prefix)
        .output()
        .map_err(|e| spawn_error("pdftoppm", e))?;
    let png = prefix.with_extension("png");
    let result = if out.status.success() && png.is_file() {
        image::load(&png).map_err(|e| Error::format(path, format!("page {page}: {e}")))
    } else {
        Err(Error::format(
            path,
            format!("page {page} could not be rendered: {}", reason(&out.stderr)),
        ))
    };
    let _ = std::fs::remove_file(&png);
    result
}

/// Parses a page list such as "1-3,7" (pages from 1, ranges inclusive).
pub fn parse_pages(spec: &str) -> std::result::Result<Vec<(usize, usize)>, String> {
    let mut out = Vec::new();
    for part in spec.split(',') {
        let part = part.trim();
        let (a, b) = match part.split_once('-') {
            Some((a, b)) => (a.trim(), b.trim()),
            None => (part, part),
        };
        let num = |s: &str| -> std::result::Result<usize, String> {
            match s.parse::<usize>() {
                Ok(n) if n > 0 => Ok(n),
                _ => Err(format!("'{part}' is not a page or range of pages (from 1)")),
            }
        };
        let (a, b) = (num(a)?, num(b)?);
        if a > b {
            return Err(format!("'{part}' runs backwards"));
        }
        out.push((a, b));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_lists() {
        assert_eq!(parse_pages("1-3,7").unwrap(), [(1, 3), (7, 7)]);
        assert!(parse_pages("0").is_err());
        assert!(parse_pages("3-1").is_err());
        assert!(parse_pages("a").is_err());
    }
}
