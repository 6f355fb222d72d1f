//! A long recording in bounded memory: `StreamedMel` decodes the file twice
//! piece by piece (its length and the features' global maximum, then the
//! windows) and holds one window of samples, never the whole signal, while
//! its features stay bit-identical to those of the signal loaded whole.

mod common;

use lfm::models::whisper::mel::{MelFilters, N_FFT, N_FRAMES, N_SAMPLES};
use lfm::run::audio::{Input, STREAM_PIECE};
use lfm::run::transcribe::stream::StreamedMel;
use lfm::run::transcribe::Features;

/// `seconds` of 22.05 kHz stereo 16-bit noise and tones (resampled and
/// mixed down on reading), with one loud burst near the end: the floor of
/// every frame depends on it, so the first pass must see the whole file.
fn write_long_wav(path: &std::path::Path, seconds: usize) {
    let rate = 22_050u32;
    let spec = hound::WavSpec {
        channels: 2,
        sample_rate: rate,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    let mut w = hound::WavWriter::create(path, spec).unwrap();
    let mut state = 0x2545_f491_u32;
    let n = seconds * rate as usize;
    for i in 0..n {
        state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        let noise = (state >> 16) as f32 / 65_536.0 - 0.5;
        let t = i as f32 / rate as f32;
        let tone = (std::f32::consts::TAU * (200.0 + 30.0 * (t % 7.0)) * t).sin();
        let loud = if (n - n / 20..n - n / 20 + 2_000).contains(&i) {
            8.0
        } else {
            1.0
        };
        let v = ((0.02 * noise + 0.05 * tone) * loud).clamp(-1.0, 1.0);
        w.write_sample((v * 32_000.0) as i16).unwrap();
        w.write_sample((-v * 16_000.0) as i16).unwrap();
    }
    w.finalize().unwrap();
}

#[test]
fn a_long_file_streams_in_one_window_of_samples_with_the_same_features() {
    let dir = common::scratch("transcribe-stream");
    let path = dir.join("long.wav");
    write_long_wav(&path, 8 * 60);
    let filters = MelFilters::slaney(80);
    let input = Input::open(&path).unwrap();
    let mut streamed = StreamedMel::open(&filters, &input).unwrap();

    let whole = input.load(16_000).unwrap();
    let mut mel = filters.log_mel(&whole.samples);
    assert_eq!(streamed.signal_len(), whole.samples.len());
    assert_eq!(streamed.info().source_rate, 22_050);

    // Windows as transcription cuts them: some advance to a timestamp
    // inside the window (less than 30 s), others by the whole window.
    let content = lfm::models::whisper::mel::content_frames(whole.samples.len());
    let (mut seek, mut windows) = (0, 0);
    while seek < content {
        let size = N_FRAMES.min(content - seek);
        let got = streamed.frames(seek, size).unwrap();
        let want = Features::frames(&mut mel, seek, size).unwrap();
        assert_eq!(got.len(), want.len());
        assert!(
            got.iter()
                .zip(&want)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "window at frame {seek}: streamed features differ from the whole signal's"
        );
        assert!(streamed.held() <= N_SAMPLES + N_FFT + STREAM_PIECE);
        seek += if windows % 2 == 0 { 2_345 } else { size };
        windows += 1;
    }
    // One window of samples and one decoded piece, against 8 minutes.
    let bound = N_SAMPLES + N_FFT + STREAM_PIECE;
    eprintln!(
        "{windows} windows; peak {} samples held of {}",
        streamed.peak_held(),
        whole.samples.len()
    );
    assert!(windows > 16, "{windows} windows");
    assert!(
        streamed.peak_held() <= bound,
        "held {} samples at once (bound {bound})",
        streamed.peak_held()
    );
    assert!(whole.samples.len() > 15 * bound);

    // A stream reads forward only: going back is an error naming the file.
    let e = streamed.frames(0, 10).unwrap_err().to_string();
    assert!(e.contains("long.wav"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_file_that_is_not_audio_fails_before_any_window() {
    let dir = common::scratch("transcribe-stream-bad");
    let path = dir.join("notes.wav");
    std::fs::write(&path, b"this is text, not a recording\n").unwrap();
    let filters = MelFilters::slaney(80);
    let input = Input::open(&path).unwrap();
    let e = StreamedMel::open(&filters, &input)
        .err()
        .expect("not audio")
        .to_string();
    assert!(e.contains("notes.wav"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}
