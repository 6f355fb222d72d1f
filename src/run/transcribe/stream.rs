//! Features of a recording too long to hold: the audio is decoded twice,
//! piece by piece, never whole. The first pass finds the length and the
//! global maximum the log-mel floor depends on (openai-whisper and
//! faster-whisper floor every frame at the maximum of the whole file less
//! 8); the second hands out windows as transcription moves forward, keeping
//! only the samples the current window's frames read. A 3-hour file at
//! 16 kHz f32 would be 691 MB; this holds one window (30 s, 1.9 MB) and a
//! piece of decoded audio. The features are bit-identical to [`LogMel`]'s
//! of the whole signal.

use super::Features;
use crate::error::{Error, Result};
use crate::models::whisper::mel::{self, LogMel, MelFilters, Span, SAMPLE_RATE};
use crate::run::audio::{Info, Input, Stream};

impl Features for LogMel<'_> {
    fn signal_len(&self) -> usize {
        LogMel::signal_len(self)
    }

    fn frames(&mut self, start: usize, count: usize) -> Result<Vec<f32>> {
        Ok(LogMel::frames(self, start, count))
    }
}

/// The log-mel features of an input read as a stream.
pub struct StreamedMel<'f> {
    filters: &'f MelFilters,
    input: Input,
    stream: Stream,
    info: Info,
    max: f32,
    /// Samples `start..start + buf.len()` of the signal.
    buf: Vec<f32>,
    start: usize,
    /// The most samples `buf` held.
    peak: usize,
}

impl<'f> StreamedMel<'f> {
    /// Reads `input` once for its length and maximum, then starts reading
    /// it again for the frames.
    pub fn open(filters: &'f MelFilters, input: &Input) -> Result<StreamedMel<'f>> {
        let mut first = input.stream(SAMPLE_RATE as u32)?;
        let (mut buf, mut start, mut next) = (Vec::new(), 0usize, 0usize);
        let mut max = f32::NEG_INFINITY;
        let mut peak = 0;
        while let Some(piece) = first.next_piece()? {
            buf.extend_from_slice(&piece);
            peak = peak.max(buf.len());
            let received = start + buf.len();
            // Frames whose last sample (t * HOP + N_FFT / 2 - 1) arrived.
            let ready = match received.checked_sub(mel::N_FFT / 2) {
                Some(r) => r / mel::HOP + 1,
                None => 0,
            };
            if ready > next {
                let span = Span {
                    start,
                    data: &buf,
                    len: received,
                };
                max = max.max(filters.max_raw(span, next..ready));
                next = ready;
                let keep = mel::samples_for(next, 1, usize::MAX).start;
                let drop = keep.saturating_sub(start).min(buf.len());
                buf.drain(..drop);
                start += drop;
            }
        }
        let info = first.take_info()?;
        let len = info.len;
        let span = Span {
            start,
            data: &buf,
            len,
        };
        max = max.max(filters.max_raw(span, next..mel::touching_frames(len).max(next)));
        Ok(StreamedMel {
            filters,
            input: input.clone(),
            stream: input.stream(SAMPLE_RATE as u32)?,
            info,
            max: max.max(-10.0),
            buf: Vec::new(),
            start: 0,
            peak,
        })
    }

    /// What the input was (its length, rates, decoding warnings).
    pub fn info(&self) -> &Info {
        &self.info
    }

    /// Samples held now.
    pub fn held(&self) -> usize {
        self.buf.len()
    }

    /// The most samples held at once, in either pass.
    pub fn peak_held(&self) -> usize {
        self.peak
    }

    /// Drops the samples before `from`.
    fn drop_before(&mut self, from: usize) {
        let drop = from.saturating_sub(self.start).min(self.buf.len());
        self.buf.drain(..drop);
        self.start += drop;
    }
}

impl Features for StreamedMel<'_> {
    fn signal_len(&self) -> usize {
        self.info.len
    }

    fn frames(&mut self, start: usize, count: usize) -> Result<Vec<f32>> {
        let len = self.info.len;
        let need = mel::samples_for(start, count, len);
        if need.start < self.start {
            return Err(Error::invalid(format!(
                "{}: frames from {start} asked after frames past them (a stream reads forward only)",
                self.input.label().display()
            )));
        }
        self.drop_before(need.start);
        while self.start + self.buf.len() < need.end {
            let Some(piece) = self.stream.next_piece()? else {
                return Err(Error::format(
                    self.input.label(),
                    "the audio changed while it was read (shorter on the second reading)",
                ));
            };
            self.buf.extend_from_slice(&piece);
            self.drop_before(need.start);
            self.peak = self.peak.max(self.buf.len());
        }
        let span = Span {
            start: self.start,
            data: &self.buf,
            len,
        };
        Ok(self.filters.frames(span, self.max, start, count))
    }
}
