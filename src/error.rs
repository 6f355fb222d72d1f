//! The library's error type. Binaries wrap it in `anyhow` and print it as one
//! line; every variant that comes from a file names the file.

use std::path::{Path, PathBuf};

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file could not be opened or read at all.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file was read but its contents are wrong: bad magic, a field out of
    /// range, an offset past the end, an unknown type id...
    #[error("{}: {what}", path.display())]
    Format { path: PathBuf, what: String },
    /// The file is valid but describes something this engine does not run.
    #[error("{}: unsupported: {what}", path.display())]
    Unsupported { path: PathBuf, what: String },
    /// A request that cannot be served (prompt longer than the context,
    /// unknown option value, ...).
    #[error("{0}")]
    Invalid(String),
    /// No usable GPU, a shader the driver rejected, out of device memory.
    #[error("gpu: {0}")]
    Gpu(String),
}

impl Error {
    pub fn io(path: impl AsRef<Path>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.as_ref().to_path_buf(),
            source,
        }
    }

    pub fn format(path: impl AsRef<Path>, what: impl Into<String>) -> Self {
        Error::Format {
            path: path.as_ref().to_path_buf(),
            what: what.into(),
        }
    }

    pub fn unsupported(path: impl AsRef<Path>, what: impl Into<String>) -> Self {
        Error::Unsupported {
            path: path.as_ref().to_path_buf(),
            what: what.into(),
        }
    }

    pub fn invalid(what: impl Into<String>) -> Self {
        Error::Invalid(what.into())
    }

    pub fn gpu(what: impl Into<String>) -> Self {
        Error::Gpu(what.into())
    }
}
