//! File formats: readers (and writers) for model and data files.

pub mod ct2;
pub mod npy;
