//! `man/` holds one page per binary, generated from the clap definitions.
//! This test fails when a page is missing or stale; `LFM_BLESS=1 cargo test
//! --test man_pages` rewrites them.

use clap::CommandFactory;

fn pages() -> Vec<(String, String)> {
    let mut pages: Vec<(String, String)> = lfm::cli::tools()
        .into_iter()
        .map(|(name, cmd)| (name.to_string(), lfm::cli::man_page(cmd)))
        .collect();
    pages.push((
        "lfm".to_string(),
        lfm::cli::man_page(lfm::cli::Lfm::command()),
    ));
    pages
}

/// One test, so that blessing finishes before the per-binary check runs.
#[test]
fn man_pages_match_the_command_line_and_cover_every_binary() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = root.join("man");
    let bless = std::env::var_os("LFM_BLESS").is_some();
    let mut stale = Vec::new();
    for (name, page) in pages() {
        let path = dir.join(format!("{name}.1"));
        if bless {
            std::fs::write(&path, &page).unwrap();
        } else if std::fs::read_to_string(&path).ok().as_deref() != Some(page.as_str()) {
            stale.push(path.display().to_string());
        }
    }
    assert!(
        stale.is_empty(),
        "stale or missing man pages (run LFM_BLESS=1 cargo test --test man_pages): {stale:?}"
    );
    for entry in std::fs::read_dir(root.join("src/bin")).unwrap() {
        let name = entry
            .unwrap()
            .path()
            .file_stem()
            .unwrap()
            .to_string_lossy()
            .to_string();
        assert!(
            dir.join(format!("{name}.1")).is_file(),
            "no man page for binary {name}"
        );
    }
}
