//! The one way every tool writes an output file, so that nothing the user had
//! is lost or turned into something else:
//!
//! - `-` (and `/dev/stdout`) is standard output.
//! - A character device or FIFO (`/dev/null`, a named pipe) is written
//!   through, never replaced; a block device, socket or directory is refused.
//! - A symlink is followed: the file it points to is replaced, the link stays.
//! - A regular file gets a temporary file beside it, renamed over it only
//!   when complete, with the replaced file's permissions. An existing file is
//!   replaced only with `overwrite` (`--force`).
//! - The temporary file is removed on any failure, on drop, and when the
//!   process is stopped by SIGINT, SIGTERM or SIGHUP.
//! - Errors name the user's path, never the temporary file.

use crate::error::{Error, Result};
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// Where the bytes of an [`AtomicFile`] go.
pub enum Sink {
    File(File),
    Stdout(std::io::Stdout),
}

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Sink::File(f) => f.write(buf),
            Sink::Stdout(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Sink::File(f) => f.flush(),
            Sink::Stdout(s) => s.flush(),
        }
    }
}

impl Seek for Sink {
    fn seek(&mut self, pos: SeekFrom) -> std::io::Result<u64> {
        match self {
            Sink::File(f) => f.seek(pos),
            Sink::Stdout(_) => Err(std::io::Error::new(
                std::io::ErrorKind::Unsupported,
                "standard output cannot seek",
            )),
        }
    }
}

/// A file being written; call [`AtomicFile::commit`] to publish it. Dropping
/// it without committing removes the temporary file (a stream written
/// through, stdout or a device, cannot be taken back).
pub struct AtomicFile {
    /// The path as the user gave it (for messages).
    target: PathBuf,
    /// The temporary file and the file it replaces, when writing a regular file.
    temp: Option<(PathBuf, PathBuf)>,
    writer: Option<BufWriter<Sink>>,
}

/// What an output path is, before anything is written.
enum Destination {
    Stdout,
    /// A character device or FIFO: opened and written in place.
    Through,
    /// A regular file (new, or replaced): the real path after symlinks, and
    /// the permissions of the file it replaces.
    Replace(PathBuf, Option<std::fs::Permissions>),
}

/// True for the names of standard output.
pub fn is_stdout(path: &Path) -> bool {
    path == Path::new("-")
        || path == Path::new("/dev/stdout")
        || path == Path::new("/dev/fd/1")
        || path == Path::new("/proc/self/fd/1")
}

/// Checks what `target` is and whether it may be written, without creating
/// anything: tools call it before loading a model, so a bad output path
/// fails at once.
pub fn check(target: &Path, overwrite: bool) -> Result<()> {
    destination(target, overwrite).map(|_| ())
}

fn destination(target: &Path, overwrite: bool) -> Result<Destination> {
    if is_stdout(target) {
        return Ok(Destination::Stdout);
    }
    if target.as_os_str().is_empty() {
        return Err(Error::invalid("the output path is empty"));
    }
    let meta = match std::fs::metadata(target) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            // A new file, or a dangling symlink: create what the link names.
            let real = match std::fs::read_link(target) {
                Ok(to) => target.parent().unwrap_or(Path::new("")).join(to),
                Err(_) => target.to_path_buf(),
            };
            let parent = match real.parent() {
                Some(p) if !p.as_os_str().is_empty() => p,
                _ => Path::new("."),
            };
            if !parent.is_dir() {
                return Err(Error::invalid(format!(
                    "{}: cannot create: the directory {} does not exist",
                    target.display(),
                    parent.display()
                )));
            }
            if real.file_name().is_none() {
                return Err(Error::invalid(format!(
                    "{}: not a file path",
                    target.display()
                )));
            }
            return Ok(Destination::Replace(real, None));
        }
        Err(e) => return Err(Error::io(target, e)),
    };
    let kind = meta.file_type();
    if kind.is_dir() {
        return Err(Error::invalid(format!(
            "{}: is a directory (give a file name)",
            target.display()
        )));
    }
    if kind.is_file() {
        if !overwrite {
            return Err(Error::invalid(format!(
                "{}: already exists (pass --force to overwrite)",
                target.display()
            )));
        }
        // Through a link into /proc or /dev (/dev/stderr, /dev/fd/N) the
        // file is someone's open descriptor: write it in place.
        let real = std::fs::canonicalize(target).map_err(|e| Error::io(target, e))?;
        if target.starts_with("/dev") || target.starts_with("/proc") || real.starts_with("/proc") {
            return Ok(Destination::Through);
        }
        return Ok(Destination::Replace(real, Some(meta.permissions())));
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if kind.is_char_device() || kind.is_fifo() {
            return Ok(Destination::Through);
        }
        if kind.is_block_device() {
            return Err(Error::invalid(format!(
                "{}: is a block device; refusing to write to it",
                target.display()
            )));
        }
    }
    Err(Error::invalid(format!(
        "{}: not a regular file, device or pipe; refusing to write to it",
        target.display()
    )))
}

impl AtomicFile {
    /// Opens `target` for writing (see the module notes); refuses an existing
    /// regular file unless `overwrite` is set.
    pub fn create(target: &Path, overwrite: bool) -> Result<Self> {
        let (sink, temp) = match destination(target, overwrite)? {
            Destination::Stdout => (Sink::Stdout(std::io::stdout()), None),
            Destination::Through => {
                let file = OpenOptions::new()
                    .write(true)
                    .open(target)
                    .map_err(|e| Error::io(target, e))?;
                (Sink::File(file), None)
            }
            Destination::Replace(real, permissions) => {
                let name = real.file_name().expect("destination() checked the name");
                let mut temp_name = std::ffi::OsString::from(".");
                temp_name.push(name);
                temp_name.push(format!(".tmp{}", std::process::id()));
                let temp = real.with_file_name(temp_name);
                // A stale temporary file of a killed run with our pid: ours to remove.
                let _ = std::fs::remove_file(&temp);
                let file = OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(&temp)
                    .map_err(|e| Error::io(target, e))?;
                cleanup::register(&temp);
                if let Some(p) = permissions {
                    if let Err(e) = file.set_permissions(p) {
                        let _ = std::fs::remove_file(&temp);
                        return Err(Error::io(target, e));
                    }
                }
                (Sink::File(file), Some((temp, real)))
            }
        };
        Ok(AtomicFile {
            target: target.to_path_buf(),
            temp,
            writer: Some(BufWriter::with_capacity(1 << 16, sink)),
        })
    }

    /// The path as the user gave it.
    pub fn path(&self) -> &Path {
        &self.target
    }

    /// True when the bytes go to a temporary file (which can seek), false
    /// for a stream written through (stdout, a FIFO, a device).
    pub fn is_file(&self) -> bool {
        self.temp.is_some()
    }

    pub fn writer(&mut self) -> &mut BufWriter<Sink> {
        self.writer.as_mut().expect("AtomicFile used after commit")
    }

    /// Flushes, syncs and renames over the target; on failure the temporary
    /// file is removed and the error names the target.
    pub fn commit(mut self) -> Result<()> {
        let writer = self.writer.take().expect("AtomicFile committed twice");
        let result = self.publish(writer);
        if result.is_err() {
            self.remove_temp();
        }
        if let Some((temp, _)) = &self.temp {
            cleanup::unregister(temp);
        }
        result
    }

    fn publish(&self, writer: BufWriter<Sink>) -> Result<()> {
        let sink = writer
            .into_inner()
            .map_err(|e| Error::io(&self.target, e.into_error()))?;
        match (sink, &self.temp) {
            (Sink::File(file), Some((temp, real))) => {
                file.sync_all().map_err(|e| Error::io(&self.target, e))?;
                // Closed before the rename (a browser's File closes nothing).
                #[cfg_attr(target_arch = "wasm32", allow(clippy::drop_non_drop))]
                drop(file);
                std::fs::rename(temp, real).map_err(|e| Error::io(&self.target, e))
            }
            (mut sink, _) => sink.flush().map_err(|e| Error::io(&self.target, e)),
        }
    }

    fn remove_temp(&self) {
        if let Some((temp, _)) = &self.temp {
            let _ = std::fs::remove_file(temp);
        }
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
            self.remove_temp();
            if let Some((temp, _)) = &self.temp {
                cleanup::unregister(temp);
            }
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

/// Refuses an output path whose extension names another format than the one
/// written (`speak -o out.mp3` writes WAV): `expected` lists the extensions
/// of the format (lower case); an extension no tool knows passes.
pub fn check_extension(path: &Path, expected: &[&str], format: &str) -> Result<()> {
    const KNOWN: &[&str] = &[
        "wav",
        "mp3",
        "flac",
        "ogg",
        "opus",
        "m4a",
        "aac",
        "aiff",
        "raw",
        "pcm",
        "json",
        "jsonl",
        "npy",
        "npz",
        "tsv",
        "csv",
        "txt",
        "srt",
        "vtt",
        "svg",
        "png",
        "jpg",
        "jpeg",
        "webp",
        "gif",
        "pdf",
        "gguf",
        "safetensors",
        "bin",
        "md",
        "html",
    ];
    if is_stdout(path) {
        return Ok(());
    }
    let Some(ext) = path.extension().and_then(|e| e.to_str()) else {
        return Ok(());
    };
    let ext = ext.to_ascii_lowercase();
    if expected.contains(&ext.as_str()) || !KNOWN.contains(&ext.as_str()) {
        return Ok(());
    }
    Err(Error::invalid(format!(
        "{}: this writes {format}, not .{ext} (use a .{} name)",
        path.display(),
        expected[0]
    )))
}

/// Temporary files to remove when a signal stops the process. The handler
/// may only make async-signal-safe calls, so the paths are kept as C strings
/// in a fixed table of atomic pointers; a path that finds no free slot is
/// still removed on drop, just not on a signal.
#[cfg(unix)]
mod cleanup {
    use std::ffi::{c_char, CString};
    use std::os::unix::ffi::OsStrExt;
    use std::path::Path;
    use std::sync::atomic::{AtomicPtr, Ordering};
    use std::sync::Once;

    const SLOTS: usize = 64;
    static PATHS: [AtomicPtr<c_char>; SLOTS] =
        [const { AtomicPtr::new(std::ptr::null_mut()) }; SLOTS];
    static INSTALL: Once = Once::new();

    extern "C" fn on_signal(sig: libc::c_int) {
        for slot in &PATHS {
            let p = slot.load(Ordering::SeqCst);
            if !p.is_null() {
                // SAFETY: `p` came from CString::into_raw and is never freed.
                unsafe { libc::unlink(p) };
            }
        }
        // SAFETY: restoring the default action and re-raising ends the
        // process with the signal's status, as if no handler had run.
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
            libc::raise(sig);
        }
    }

    pub fn register(path: &Path) {
        INSTALL.call_once(|| {
            for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
                // SAFETY: installs a handler that only calls unlink, signal
                // and raise, which are async-signal-safe.
                unsafe {
                    let old = libc::signal(sig, on_signal as *const () as libc::sighandler_t);
                    // Keep a signal the parent told us to ignore (nohup) ignored.
                    if old == libc::SIG_IGN {
                        libc::signal(sig, libc::SIG_IGN);
                    }
                }
            }
        });
        let Ok(c) = CString::new(path.as_os_str().as_bytes()) else {
            return;
        };
        // Never freed: a handler on another thread may be reading it. A few
        // bytes per output file.
        let raw = c.into_raw();
        for slot in &PATHS {
            if slot
                .compare_exchange(
                    std::ptr::null_mut(),
                    raw,
                    Ordering::SeqCst,
                    Ordering::SeqCst,
                )
                .is_ok()
            {
                return;
            }
        }
    }

    pub fn unregister(path: &Path) {
        let bytes = path.as_os_str().as_bytes();
        for slot in &PATHS {
            let p = slot.load(Ordering::SeqCst);
            // SAFETY: non-null slots hold CStrings that are never freed.
            if !p.is_null() && unsafe { std::ffi::CStr::from_ptr(p) }.to_bytes() == bytes {
                slot.store(std::ptr::null_mut(), Ordering::SeqCst);
                return;
            }
        }
    }
}

#[cfg(not(unix))]
mod cleanup {
    pub fn register(_: &std::path::Path) {}
    pub fn unregister(_: &std::path::Path) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("lfm-atomic-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn refuses_existing_and_keeps_it_on_drop() {
        let dir = scratch("drop");
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

    #[cfg(unix)]
    #[test]
    fn keeps_mode_follows_links_and_refuses_directories() {
        use std::os::unix::fs::PermissionsExt;
        let dir = scratch("links");
        let real = dir.join("real.txt");
        std::fs::write(&real, b"old").unwrap();
        std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o600)).unwrap();
        let link = dir.join("link.txt");
        std::os::unix::fs::symlink("real.txt", &link).unwrap();
        write_atomic(&link, b"new", true).unwrap();
        assert!(std::fs::symlink_metadata(&link).unwrap().is_symlink());
        assert_eq!(std::fs::read(&real).unwrap(), b"new");
        let mode = std::fs::metadata(&real).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);

        let e = write_atomic(&dir, b"x", true).unwrap_err().to_string();
        assert!(e.contains("is a directory"), "{e}");
        write_atomic(Path::new("/dev/null"), b"x", false).unwrap();
        use std::os::unix::fs::FileTypeExt;
        assert!(std::fs::metadata("/dev/null")
            .unwrap()
            .file_type()
            .is_char_device());
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 2);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn extensions() {
        assert!(check_extension(Path::new("a.wav"), &["wav"], "WAV").is_ok());
        assert!(check_extension(Path::new("a.WAV"), &["wav"], "WAV").is_ok());
        assert!(check_extension(Path::new("a.out"), &["wav"], "WAV").is_ok());
        assert!(check_extension(Path::new("-"), &["wav"], "WAV").is_ok());
        let e = check_extension(Path::new("a.mp3"), &["wav"], "WAV").unwrap_err();
        assert!(e.to_string().contains("a.mp3"), "{e}");
    }
}
