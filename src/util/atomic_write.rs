//! Write an output file so that nothing the user had is lost: the bytes go to
//! a temporary file beside the target, which is renamed over it only when
//! complete. A failed write (full disk, killed process) leaves the old file.

use crate::error::{Error, Result};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// A file being written; call [`AtomicFile::commit`] to publish it. Dropping
/// it without committing removes the temporary file.
pub struct AtomicFile {
    target: PathBuf,
    temp: PathBuf,
    writer: Option<BufWriter<File>>,
}

impl AtomicFile {
    /// Refuses an existing `target` unless `overwrite` is set.
    pub fn create(target: &Path, overwrite: bool) -> Result<Self> {
        if !overwrite && target.exists() {
            return Err(Error::invalid(format!(
                "{}: already exists (pass --force to overwrite)",
                target.display()
            )));
        }
        let name = target
            .file_name()
            .ok_or_else(|| Error::invalid(format!("{}: not a file path", target.display())))?;
        let mut temp_name = std::ffi::OsString::from(".");
        temp_name.push(name);
        temp_name.push(format!(".tmp{}", std::process::id()));
        let temp = target.with_file_name(temp_name);
        let file = File::create(&temp).map_err(|e| Error::io(&temp, e))?;
        Ok(AtomicFile {
            target: target.to_path_buf(),
            temp,
            writer: Some(BufWriter::new(file)),
        })
    }

    pub fn writer(&mut self) -> &mut BufWriter<File> {
        self.writer.as_mut().expect("AtomicFile used after commit")
    }

    /// Flushes, syncs and renames over the target.
    pub fn commit(mut self) -> Result<()> {
        let writer = self.writer.take().expect("AtomicFile committed twice");
        let file = writer
            .into_inner()
            .map_err(|e| Error::io(&self.temp, e.into_error()))?;
        file.sync_all().map_err(|e| Error::io(&self.temp, e))?;
        std::fs::rename(&self.temp, &self.target).map_err(|e| Error::io(&self.target, e))
    }
}

impl Write for AtomicFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.writer().write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.writer().flush()
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        if self.writer.take().is_some() {
            let _ = std::fs::remove_file(&self.temp);
        }
    }
}

/// Writes `bytes` to `target` atomically.
pub fn write_atomic(target: &Path, bytes: &[u8], overwrite: bool) -> Result<()> {
    let mut f = AtomicFile::create(target, overwrite)?;
    f.writer()
        .write_all(bytes)
        .map_err(|e| Error::io(target, e))?;
    f.commit()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_existing_and_keeps_it_on_drop() {
        let dir = std::env::temp_dir().join(format!("lfm-atomic-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let target = dir.join("out.bin");
        std::fs::write(&target, b"old").unwrap();
        assert!(AtomicFile::create(&target, false).is_err());
        {
            let mut f = AtomicFile::create(&target, true).unwrap();
            f.write_all(b"partial").unwrap();
            // dropped without commit: the old file must survive
        }
        assert_eq!(std::fs::read(&target).unwrap(), b"old");
        write_atomic(&target, b"new", true).unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"new");
        assert_eq!(
            std::fs::read_dir(&dir).unwrap().count(),
            1,
            "temporary file left behind"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
