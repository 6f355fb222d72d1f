//! The file reads model loaders make, over the file system natively and,
//! in a browser tab (which has none), over the files the page handed over
//! with [`add_file`], at paths of its choosing (`/encoder/config.json`).

use crate::tensor::SharedBytes;
use std::io;
use std::path::Path;

#[cfg(target_arch = "wasm32")]
thread_local! {
    static FILES: std::cell::RefCell<std::collections::HashMap<std::path::PathBuf, std::sync::Arc<Vec<u8>>>> =
        Default::default();
}

/// Makes `bytes` the file at `path` (a browser tab's files).
#[cfg(target_arch = "wasm32")]
pub fn add_file(path: impl AsRef<Path>, bytes: Vec<u8>) {
    FILES.with(|f| {
        f.borrow_mut()
            .insert(path.as_ref().to_path_buf(), std::sync::Arc::new(bytes))
    });
}

/// Forgets every file under `dir`.
#[cfg(target_arch = "wasm32")]
pub fn remove_dir(dir: impl AsRef<Path>) {
    FILES.with(|f| f.borrow_mut().retain(|p, _| !p.starts_with(dir.as_ref())));
}

#[cfg(target_arch = "wasm32")]
fn file(path: &Path) -> io::Result<std::sync::Arc<Vec<u8>>> {
    FILES
        .with(|f| f.borrow().get(path).cloned())
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                "no such file among those the page gave",
            )
        })
}

pub fn read(path: &Path) -> io::Result<Vec<u8>> {
    #[cfg(not(target_arch = "wasm32"))]
    return std::fs::read(path);
    #[cfg(target_arch = "wasm32")]
    return file(path).map(|b| b.to_vec());
}

pub fn read_to_string(path: &Path) -> io::Result<String> {
    String::from_utf8(read(path)?).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            "stream did not contain valid UTF-8",
        )
    })
}

/// The whole file, shared read-only: memory-mapped natively.
pub fn map(path: &Path) -> io::Result<SharedBytes> {
    #[cfg(not(target_arch = "wasm32"))]
    {
        let file = std::fs::File::open(path)?;
        // SAFETY: the map is read-only and lives as long as every tensor
        // that borrows it; like every mmap reader (llama.cpp, safetensors),
        // we rely on the file not being truncated underneath us.
        let map = unsafe { memmap2::Mmap::map(&file) }?;
        Ok(std::sync::Arc::new(map))
    }
    #[cfg(target_arch = "wasm32")]
    {
        Ok(file(path)?)
    }
}

pub fn is_file(path: &Path) -> bool {
    #[cfg(not(target_arch = "wasm32"))]
    return path.is_file();
    #[cfg(target_arch = "wasm32")]
    return file(path).is_ok();
}

pub fn is_dir(path: &Path) -> bool {
    #[cfg(not(target_arch = "wasm32"))]
    return path.is_dir();
    #[cfg(target_arch = "wasm32")]
    return FILES.with(|f| f.borrow().keys().any(|p| p != path && p.starts_with(path)));
}

pub fn exists(path: &Path) -> bool {
    is_file(path) || is_dir(path)
}
