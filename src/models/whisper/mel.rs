//! Whisper's front end, exactly as openai-whisper's `log_mel_spectrogram`:
//! 16 kHz mono, STFT with n_fft 400, hop 160, periodic Hann window, centred
//! frames with reflect padding; power spectrum; the model's mel filter bank
//! (80 or 128 x 201); log10 clamped at 1e-10; floor at (global max - 8);
//! (x + 4) / 4. Like `transcribe()`, the signal is first padded with 30 s of
//! zeros, and each 30 s window holds only content frames, zero-filled after.
//!
//! Frames are computed on demand from the samples, so a long file costs its
//! samples and one window of features, not a spectrogram of its full length;
//! a [`Span`] needs only the samples the frames asked of it read, so a
//! stream (`run::transcribe::stream`) holds one window of samples.
//! The FFT runs in f64 (the reference uses f32: ours is the more exact).

use crate::error::{Error, Result};
use crate::formats::npy;
use rayon::prelude::*;
use rustfft::{num_complex::Complex, Fft, FftPlanner};
use std::path::Path;
use std::sync::Arc;

pub const SAMPLE_RATE: usize = 16_000;
pub const N_FFT: usize = 400;
pub const HOP: usize = 160;
/// Frames in one 30 s window.
pub const N_FRAMES: usize = 3000;
/// Samples in one 30 s window (also the zero padding `transcribe()` appends).
pub const N_SAMPLES: usize = N_FRAMES * HOP;
const N_BINS: usize = N_FFT / 2 + 1;

/// A mel filter bank and the FFT plan it goes with.
pub struct MelFilters {
    pub n_mels: usize,
    /// [n_mels, 201]
    weights: Vec<f64>,
    /// Per mel row, the range of bins with a non-zero weight (skipping the
    /// zeros changes nothing but the time).
    support: Vec<(usize, usize)>,
    window: Vec<f64>,
    fft: Arc<dyn Fft<f64>>,
}

impl MelFilters {
    /// The bank `mel_<n_mels>.npy` from `dir` (openai-whisper's
    /// `assets/mel_filters.npz`, unpacked by `scripts/fetch_models.py`).
    pub fn load(dir: &Path, n_mels: usize) -> Result<MelFilters> {
        let path = dir.join(format!("mel_{n_mels}.npy"));
        let a = npy::read(&path)?;
        if a.shape != [n_mels, N_BINS] {
            return Err(Error::format(
                &path,
                format!("shape {:?}, expected [{n_mels}, {N_BINS}]", a.shape),
            ));
        }
        Ok(MelFilters::new(n_mels, &a.data))
    }

    /// The bank computed as faster-whisper's `get_mel_filters` computes it
    /// when a model brings none: librosa's Slaney mel scale and area
    /// normalisation over 0..8 kHz (openai-whisper's mel_80.npy and
    /// mel_128.npy are this bank in f32).
    pub fn slaney(n_mels: usize) -> MelFilters {
        MelFilters::new(n_mels, &slaney_weights(n_mels))
    }

    /// `weights`: [n_mels, 201].
    pub fn new(n_mels: usize, weights: &[f32]) -> MelFilters {
        assert_eq!(weights.len(), n_mels * N_BINS, "mel filters: shape");
        let weights: Vec<f64> = weights.iter().map(|&w| w as f64).collect();
        let support = weights
            .chunks_exact(N_BINS)
            .map(|row| {
                let first = row.iter().position(|&w| w != 0.0).unwrap_or(0);
                let last = row.iter().rposition(|&w| w != 0.0).map_or(0, |i| i + 1);
                (first, last.max(first))
            })
            .collect();
        // torch.hann_window(400), periodic.
        let window = (0..N_FFT)
            .map(|n| 0.5 - 0.5 * (std::f64::consts::TAU * n as f64 / N_FFT as f64).cos())
            .collect();
        MelFilters {
            n_mels,
            weights,
            support,
            window,
            fft: FftPlanner::new().plan_fft_forward(N_FFT),
        }
    }

    /// The features of `samples` (16 kHz mono); nothing is computed yet
    /// except the global maximum the floor depends on.
    pub fn log_mel<'a>(&'a self, samples: &'a [f32]) -> LogMel<'a> {
        let span = Span {
            start: 0,
            data: samples,
            len: samples.len(),
        };
        let max = self.max_raw(span, 0..touching_frames(samples.len()));
        LogMel {
            filters: self,
            samples,
            max: max.max(-10.0),
        }
    }

    /// The largest log10 value of frames `frames` (before the floor), whose
    /// samples `span` holds; -inf for none.
    pub fn max_raw(&self, span: Span, frames: std::ops::Range<usize>) -> f32 {
        frames
            .into_par_iter()
            .with_min_len(64)
            .map_init(
                || self.scratch(),
                |s, t| {
                    self.raw_frame(span, t, s);
                    s.out.iter().copied().fold(f32::NEG_INFINITY, f32::max)
                },
            )
            .reduce(|| f32::NEG_INFINITY, f32::max)
    }

    /// log10(max(mel power, 1e-10)) of frame `t` into `s.out`.
    fn raw_frame(&self, span: Span, t: usize, s: &mut Scratch) {
        let start = (t * HOP) as isize - (N_FFT / 2) as isize;
        for (j, c) in s.buf.iter_mut().enumerate() {
            *c = Complex::new(span.sample(start + j as isize) as f64 * self.window[j], 0.0);
        }
        self.fft.process_with_scratch(&mut s.buf, &mut s.fft);
        for (p, c) in s.power.iter_mut().zip(&s.buf) {
            *p = c.norm_sqr();
        }
        for (m, out) in s.out.iter_mut().enumerate() {
            let (lo, hi) = self.support[m];
            let row = &self.weights[m * N_BINS..(m + 1) * N_BINS];
            let e: f64 = (lo..hi).map(|k| row[k] * s.power[k]).sum();
            *out = (e as f32).max(1e-10).log10();
        }
    }

    /// Normalised features of frames `start..start + count` ([n_mels,
    /// count]), whose samples `span` holds, for a signal whose largest raw
    /// value is `max`.
    pub fn frames(&self, span: Span, max: f32, start: usize, count: usize) -> Vec<f32> {
        let n_mels = self.n_mels;
        let floor = max - 8.0;
        let columns: Vec<Vec<f32>> = (start..start + count)
            .into_par_iter()
            .with_min_len(64)
            .map_init(
                || self.scratch(),
                |s, t| {
                    self.raw_frame(span, t, s);
                    s.out.iter().map(|&v| (v.max(floor) + 4.0) / 4.0).collect()
                },
            )
            .collect();
        let mut out = vec![0.0; n_mels * count];
        for (t, col) in columns.iter().enumerate() {
            for (m, v) in col.iter().enumerate() {
                out[m * count + t] = *v;
            }
        }
        out
    }

    fn scratch(&self) -> Scratch {
        Scratch {
            buf: vec![Complex::default(); N_FFT],
            fft: vec![Complex::default(); self.fft.get_inplace_scratch_len()],
            power: vec![0.0; N_BINS],
            out: vec![0.0; self.n_mels],
        }
    }
}

/// [n_mels, 201] weights of the Slaney-scale triangular filters, as
/// faster-whisper's `FeatureExtractor.get_mel_filters(16000, 400, n_mels)`.
pub fn slaney_weights(n_mels: usize) -> Vec<f32> {
    // Hz of each FFT bin.
    let fft_freqs: Vec<f64> = (0..N_BINS)
        .map(|i| i as f64 * SAMPLE_RATE as f64 / N_FFT as f64)
        .collect();
    // Band edges uniformly spaced in mels up to hz_to_mel(8000), then back to Hz:
    // linear below 1 kHz (200/3 Hz per mel), logarithmic above.
    let max_mel = 45.245640471924965;
    let (f_sp, min_log_hz) = (200.0 / 3.0, 1000.0);
    let min_log_mel = min_log_hz / f_sp;
    let logstep = 6.4f64.ln() / 27.0;
    let freqs: Vec<f64> = (0..n_mels + 2)
        .map(|i| {
            let mel = max_mel * i as f64 / (n_mels + 1) as f64;
            if mel >= min_log_mel {
                min_log_hz * (logstep * (mel - min_log_mel)).exp()
            } else {
                f_sp * mel
            }
        })
        .collect();
    let mut w = Vec::with_capacity(n_mels * N_BINS);
    for m in 0..n_mels {
        let enorm = 2.0 / (freqs[m + 2] - freqs[m]);
        for &f in &fft_freqs {
            let lower = (f - freqs[m]) / (freqs[m + 1] - freqs[m]);
            let upper = (freqs[m + 2] - f) / (freqs[m + 2] - freqs[m + 1]);
            w.push((lower.min(upper).max(0.0) * enorm) as f32);
        }
    }
    w
}

struct Scratch {
    buf: Vec<Complex<f64>>,
    fft: Vec<Complex<f64>>,
    power: Vec<f64>,
    out: Vec<f32>,
}

/// Frames whose samples touch a signal of `len` samples: their raw values
/// set the floor. Those past it see only zero padding: their value is
/// log10(1e-10) = -10, and there are always 3000 of them.
pub fn touching_frames(len: usize) -> usize {
    (len + N_FFT / 2).div_ceil(HOP).min(total_frames(len))
}

/// Frames of a signal of `len` samples with its 30 s of zero padding
/// (torch's STFT count, less the last one).
pub fn total_frames(len: usize) -> usize {
    (len + N_SAMPLES) / HOP
}

/// Frames that hold audio: windows are cut from these.
pub fn content_frames(len: usize) -> usize {
    total_frames(len) - N_FRAMES
}

/// The samples frames `start..start + count` read, as a range of the
/// unpadded signal of `len` samples (what a [`Span`] must hold for them).
pub fn samples_for(start: usize, count: usize, len: usize) -> std::ops::Range<usize> {
    if count == 0 {
        return 0..0;
    }
    let lo = (start * HOP).saturating_sub(N_FFT / 2);
    let hi = ((start + count - 1) * HOP + N_FFT / 2).min(len);
    // Frames near the start reflect samples 1..=N_FFT/2.
    let lo = if start * HOP < N_FFT / 2 { 0 } else { lo };
    lo.min(hi)..hi
}

/// Samples `start..start + data.len()` of a signal `len` samples long: the
/// part of it some frames read.
#[derive(Clone, Copy, Debug)]
pub struct Span<'a> {
    pub start: usize,
    pub data: &'a [f32],
    pub len: usize,
}

impl Span<'_> {
    /// The padded signal at `i`, reflected at both ends as torch does.
    fn sample(&self, i: isize) -> f32 {
        let n = (self.len + N_SAMPLES) as isize;
        let i = if i < 0 {
            -i
        } else if i >= n {
            2 * (n - 1) - i
        } else {
            i
        } as usize;
        if i >= self.len {
            return 0.0;
        }
        self.data[i - self.start]
    }
}

/// The encoder input for a window of `size` content frames ([n_mels,
/// size]), zero-filled to 3000 ([n_mels, 3000]), as `pad_or_trim` does.
pub fn pad_window(n_mels: usize, got: &[f32], size: usize) -> Vec<f32> {
    assert!(size <= N_FRAMES, "window longer than 30 s");
    let mut out = vec![0.0; n_mels * N_FRAMES];
    for m in 0..n_mels {
        out[m * N_FRAMES..m * N_FRAMES + size].copy_from_slice(&got[m * size..(m + 1) * size]);
    }
    out
}

/// The log-mel features of one signal in memory, computed frame by frame
/// on request.
pub struct LogMel<'a> {
    filters: &'a MelFilters,
    samples: &'a [f32],
    /// Largest log10 value over every frame (before the floor).
    max: f32,
}

impl LogMel<'_> {
    /// Frames of the padded signal (torch's STFT count, less the last one).
    pub fn total_frames(&self) -> usize {
        total_frames(self.samples.len())
    }

    /// Frames that hold audio: windows are cut from these.
    pub fn content_frames(&self) -> usize {
        content_frames(self.samples.len())
    }

    /// Samples of the signal.
    pub fn signal_len(&self) -> usize {
        self.samples.len()
    }

    /// Normalised features of frames `start..start + count`: [n_mels, count].
    pub fn frames(&self, start: usize, count: usize) -> Vec<f32> {
        let span = Span {
            start: 0,
            data: self.samples,
            len: self.samples.len(),
        };
        self.filters.frames(span, self.max, start, count)
    }

    /// The encoder input for the window at frame `seek`: `size` content
    /// frames, zero-filled to 3000 ([n_mels, 3000]), as `pad_or_trim` does.
    pub fn window(&self, seek: usize, size: usize) -> Vec<f32> {
        assert!(size <= N_FRAMES, "window longer than 30 s");
        pad_window(self.filters.n_mels, &self.frames(seek, size), size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A triangular bank over a few bins, enough to test the plumbing.
    fn toy_filters() -> MelFilters {
        let mut w = vec![0.0f32; 2 * N_BINS];
        w[10] = 1.0;
        w[N_BINS + 50] = 0.5;
        w[N_BINS + 51] = 0.5;
        MelFilters::new(2, &w)
    }

    #[test]
    fn frame_counts_follow_the_padded_stft() {
        let f = toy_filters();
        let x = vec![0.1f32; 16_000 + 17];
        let mel = f.log_mel(&x);
        assert_eq!(mel.content_frames(), 100);
        assert_eq!(mel.total_frames(), 3100);
    }

    #[test]
    fn a_pure_tone_lands_in_its_bin_and_silence_sits_at_the_floor() {
        let f = toy_filters();
        // Bin 10 of a 400-point FFT at 16 kHz is 400 Hz.
        let x: Vec<f32> = (0..32_000)
            .map(|n| (std::f32::consts::TAU * 400.0 * n as f32 / 16_000.0).sin())
            .collect();
        let mel = f.log_mel(&x);
        let fr = mel.frames(50, 1);
        assert!(
            fr[0] > fr[1] + 1.0,
            "tone bin {} vs off bin {}",
            fr[0],
            fr[1]
        );
        // A window starting past the audio holds only the floor, and its
        // zero-filled tail is exactly zero.
        let w = mel.window(mel.content_frames() - 5, 5);
        assert_eq!(w.len(), 2 * N_FRAMES);
        assert!(w[5..N_FRAMES].iter().all(|&v| v == 0.0));
        let silent = f.log_mel(&[0.0; 1000]);
        let s = silent.frames(0, 3);
        assert!(s.iter().all(|&v| v == (-10.0 + 4.0) / 4.0), "{s:?}");
    }
}
