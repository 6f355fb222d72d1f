//! Shared flows over the models: audio in, transcription.

pub mod audio;
pub mod transcribe;
