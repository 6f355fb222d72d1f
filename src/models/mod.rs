//! One module per architecture: config -> weights -> CPU forward (+ GPU plan).

pub mod whisper;
