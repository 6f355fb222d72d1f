//! Audio in: WAV of any common sample format (hound), FLAC, MP3, Ogg Vorbis
//! and the WAV codecs hound lacks (symphonia), from a file or from stdin
//! (`-`); mixed down to mono and resampled to the rate a model wants with
//! rubato's FFT resampler. Decoding streams packet by packet into the
//! resampler: [`load`] holds the output samples and little else, [`stream`]
//! hands them on in pieces from a decoding thread, so a recording of hours
//! costs a few seconds of samples (stdin is read whole first, as the
//! decoders need to seek; its bytes, not samples).

use crate::error::{Error, Result};
use rubato::audioadapter_buffers::direct::InterleavedSlice;
use rubato::{Fft, FixedSync, Indexing, Resampler};
use std::fs::File;
use std::io::{BufReader, Cursor, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Source sample rates outside this range are refused: a header claiming
/// 1 Hz would be upsampled 16000-fold (minutes and gigabytes for nothing),
/// one claiming gigahertz resamples to nothing. 2 kHz is below any speech
/// codec's rate, 768 kHz the highest rate audio interfaces record at.
pub const SOURCE_RATES: std::ops::RangeInclusive<u32> = 2_000..=768_000;

/// Channels a WAV file may declare: what WAVE_FORMAT_EXTENSIBLE's 32-bit
/// speaker mask can place (22.2 sound has 24). Past it symphonia's mask
/// arithmetic overflows (a shift by the channel count; 65535 channels
/// multiplied into a u16), which panics where overflow checks are on.
pub const MAX_CHANNELS: u16 = 32;

/// The largest sample magnitude accepted (float audio is nominally within
/// -1..1): a million is 120 dB over full scale, and far below where the
/// resampler's FFT sums overflow.
pub const MAX_SAMPLE: f32 = 1e6;

/// Mono samples at the requested rate, and what the input was.
#[derive(Debug)]
pub struct Audio {
    pub samples: Vec<f32>,
    pub rate: u32,
    pub source_rate: u32,
    pub source_channels: u16,
    /// What was read past, one line each naming the file (a truncated
    /// file, damaged packets), as ffmpeg warns; the tools print them.
    pub warnings: Vec<String>,
}

impl Audio {
    pub fn seconds(&self) -> f64 {
        self.samples.len() as f64 / self.rate as f64
    }
}

/// What a decoded input was, without its samples.
#[derive(Debug)]
pub struct Info {
    /// Samples at `rate`.
    pub len: usize,
    pub rate: u32,
    pub source_rate: u32,
    pub source_channels: u16,
    /// As [`Audio::warnings`].
    pub warnings: Vec<String>,
}

impl Info {
    fn with_samples(self, samples: Vec<f32>) -> Audio {
        debug_assert_eq!(samples.len(), self.len);
        Audio {
            samples,
            rate: self.rate,
            source_rate: self.source_rate,
            source_channels: self.source_channels,
            warnings: self.warnings,
        }
    }
}

/// Where decoded mono samples go, piece by piece.
type Emit<'a> = &'a mut dyn FnMut(&[f32]) -> Result<()>;

/// Frames per resampler call.
const CHUNK: usize = 1024;

/// Mono resampling fed in pieces: rubato's synchronous FFT resampler (the
/// ratio is fixed), its start-up delay trimmed, its output cut to
/// ceil(n_in * ratio) frames as `Resampler::process_all` does.
struct MonoSink {
    label: PathBuf,
    rate_in: u32,
    rate_out: u32,
    resampler: Option<Fft<f32>>,
    pending: Vec<f32>,
    chunk_out: Vec<f32>,
    to_trim: usize,
    n_in: usize,
    /// Output not handed on yet.
    out: Vec<f32>,
    /// Output handed on.
    emitted: usize,
}

impl MonoSink {
    fn new(label: &Path, rate_in: u32, rate_out: u32) -> Result<MonoSink> {
        check_rate(label, rate_in)?;
        let resampler = if rate_in == rate_out {
            None
        } else {
            let r = Fft::<f32>::new(
                rate_in as usize,
                rate_out as usize,
                CHUNK,
                1,
                FixedSync::Input,
            )
            .map_err(|e| {
                Error::invalid(format!(
                    "cannot resample {rate_in} Hz to {rate_out} Hz: {e}"
                ))
            })?;
            Some(r)
        };
        let (to_trim, chunk_out) = match &resampler {
            Some(r) => (r.output_delay(), vec![0.0; r.output_frames_max()]),
            None => (0, Vec::new()),
        };
        Ok(MonoSink {
            label: label.to_path_buf(),
            rate_in,
            rate_out,
            resampler,
            pending: Vec::new(),
            chunk_out,
            to_trim,
            n_in: 0,
            out: Vec::new(),
            emitted: 0,
        })
    }

    /// A NaN, infinite or absurdly large sample (a damaged float WAV) is an
    /// error: the resampler's FFT would spread it over the whole chunk, or
    /// overflow to infinity and fail ("Imaginary part of first value was
    /// non-zero", a panic in rubato). Float audio is nominally within -1..1;
    /// [`MAX_SAMPLE`] is 120 dB above that.
    fn check_finite(&self, new: &[f32]) -> Result<()> {
        match new.iter().position(|v| v.is_nan() || v.abs() > MAX_SAMPLE) {
            None => Ok(()),
            Some(i) => Err(Error::format(
                &self.label,
                format!(
                    "sample {} (at {:.3} s) is {} (damaged audio data)",
                    self.n_in + i,
                    (self.n_in + i) as f64 / self.rate_in as f64,
                    new[i]
                ),
            )),
        }
    }

    /// Hands the output so far to `emit`.
    fn flush(&mut self, emit: Emit) -> Result<()> {
        if !self.out.is_empty() {
            emit(&self.out)?;
            self.emitted += self.out.len();
            self.out.clear();
        }
        Ok(())
    }

    fn push(&mut self, mono: impl IntoIterator<Item = f32>, emit: Emit) -> Result<()> {
        if self.resampler.is_none() {
            let before = self.out.len();
            self.out.extend(mono);
            self.check_finite(&self.out[before..])?;
            self.n_in += self.out.len() - before;
            return self.flush(emit);
        }
        let before = self.pending.len();
        self.pending.extend(mono);
        self.check_finite(&self.pending[before..])?;
        self.n_in += self.pending.len() - before;
        let r = self.resampler.as_mut().expect("checked above");
        let need = r.input_frames_next();
        let mut used = 0;
        while self.pending.len() - used >= need {
            let input = &self.pending[used..used + need];
            Self::run(
                r,
                &mut self.chunk_out,
                &mut self.out,
                &mut self.to_trim,
                input,
                None,
            )?;
            used += need;
        }
        self.pending.drain(..used);
        self.flush(emit)
    }

    fn run(
        r: &mut Fft<f32>,
        chunk_out: &mut [f32],
        out: &mut Vec<f32>,
        to_trim: &mut usize,
        input: &[f32],
        partial: Option<usize>,
    ) -> Result<()> {
        let frames_in = input.len().max(1);
        let padded;
        let input = if input.is_empty() {
            padded = [0.0f32];
            &padded[..]
        } else {
            input
        };
        let adapter_in = InterleavedSlice::new(input, 1, frames_in).expect("mono slice");
        let n_out = chunk_out.len();
        let mut adapter_out = InterleavedSlice::new_mut(chunk_out, 1, n_out).expect("mono slice");
        let indexing = partial.map(|n| Indexing::new().partial_len(n));
        let (_, produced) = r
            .process_into_buffer(&adapter_in, &mut adapter_out, indexing.as_ref())
            .map_err(|e| Error::invalid(format!("resampling failed: {e}")))?;
        let skip = (*to_trim).min(produced);
        *to_trim -= skip;
        out.extend_from_slice(&chunk_out[skip..produced]);
        Ok(())
    }

    /// Flushes the resampler; returns the samples emitted in all.
    fn finish(mut self, emit: Emit) -> Result<usize> {
        let Some(r) = &mut self.resampler else {
            self.flush(emit)?;
            return Ok(self.emitted);
        };
        let expected =
            (self.n_in as f64 * self.rate_out as f64 / self.rate_in as f64).ceil() as usize;
        if !self.pending.is_empty() {
            let n = self.pending.len();
            Self::run(
                r,
                &mut self.chunk_out,
                &mut self.out,
                &mut self.to_trim,
                &self.pending,
                Some(n),
            )?;
        }
        // Flush the filter's delay with silence.
        while self.emitted + self.out.len() < expected {
            Self::run(
                r,
                &mut self.chunk_out,
                &mut self.out,
                &mut self.to_trim,
                &[],
                Some(0),
            )?;
        }
        self.out.truncate(expected.saturating_sub(self.emitted));
        self.flush(emit)?;
        Ok(self.emitted)
    }
}

/// Decodes an audio file held in memory (an upload) as mono at `rate` Hz;
/// `label` names it in errors.
pub fn decode_bytes(label: &Path, bytes: Vec<u8>, rate: u32) -> Result<Audio> {
    Input {
        label: label.to_path_buf(),
        bytes: Some(bytes.into()),
    }
    .load(rate)
}

/// Reads `path` (`-` for stdin) as mono at `rate` Hz.
pub fn load(path: &Path, rate: u32) -> Result<Audio> {
    Input::open(path)?.load(rate)
}

/// Starts decoding `path` (`-` for stdin) as mono at `rate` Hz, piece by piece.
pub fn stream(path: &Path, rate: u32) -> Result<Stream> {
    Input::open(path)?.stream(rate)
}

/// An input that can be decoded more than once: a file, or stdin's bytes.
#[derive(Clone, Debug)]
pub struct Input {
    label: PathBuf,
    bytes: Option<Arc<[u8]>>,
}

impl Input {
    /// `path`, or stdin's bytes (read now) for `-`.
    pub fn open(path: &Path) -> Result<Input> {
        if path.as_os_str() == "-" {
            let mut bytes = Vec::new();
            std::io::stdin()
                .read_to_end(&mut bytes)
                .map_err(|e| Error::io("<stdin>", e))?;
            return Ok(Input {
                label: PathBuf::from("<stdin>"),
                bytes: Some(bytes.into()),
            });
        }
        let meta = std::fs::metadata(path).map_err(|e| Error::io(path, e))?;
        if meta.is_dir() {
            return Err(Error::invalid(format!(
                "{}: is a directory, not an audio file",
                path.display()
            )));
        }
        Ok(Input {
            label: path.to_path_buf(),
            bytes: None,
        })
    }

    /// What errors name: the path, or `<stdin>`.
    pub fn label(&self) -> &Path {
        &self.label
    }

    fn decode(&self, rate: u32, emit: Emit) -> Result<Info> {
        let info = match &self.bytes {
            Some(b) => decode(&self.label, Cursor::new(b.clone()), rate, emit)?,
            None => {
                let file = File::open(&self.label).map_err(|e| Error::io(&self.label, e))?;
                decode(&self.label, file, rate, emit)?
            }
        };
        if info.len == 0 {
            return Err(Error::format(
                &self.label,
                "no audio samples (empty recording)",
            ));
        }
        Ok(info)
    }

    /// Decodes the whole input into memory.
    pub fn load(&self, rate: u32) -> Result<Audio> {
        let mut samples = Vec::new();
        let info = self.decode(rate, &mut |piece| {
            samples.extend_from_slice(piece);
            Ok(())
        })?;
        Ok(info.with_samples(samples))
    }

    /// Starts decoding on a thread of its own, piece by piece.
    pub fn stream(&self, rate: u32) -> Result<Stream> {
        let input = self.clone();
        let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<f32>>(STREAM_AHEAD);
        let worker = std::thread::Builder::new()
            .name("audio-decode".into())
            .spawn(move || {
                let mut piece = Vec::with_capacity(STREAM_PIECE);
                let gone = || Error::invalid("audio stream: the reader stopped");
                let info = input.decode(rate, &mut |mut new| {
                    while !new.is_empty() {
                        let take = new.len().min(STREAM_PIECE - piece.len());
                        piece.extend_from_slice(&new[..take]);
                        new = &new[take..];
                        if piece.len() == STREAM_PIECE {
                            let full =
                                std::mem::replace(&mut piece, Vec::with_capacity(STREAM_PIECE));
                            tx.send(full).map_err(|_| gone())?;
                        }
                    }
                    Ok(())
                })?;
                if !piece.is_empty() {
                    tx.send(piece).map_err(|_| gone())?;
                }
                Ok(info)
            })
            .map_err(|e| Error::invalid(format!("cannot start an audio decoding thread: {e}")))?;
        Ok(Stream {
            rx,
            worker: Some(worker),
            info: None,
        })
    }
}

/// Something both decoders can read from (a file, or stdin's bytes).
trait Source: symphonia::core::io::MediaSource + 'static {}
impl<T: symphonia::core::io::MediaSource + 'static> Source for T {}

/// Samples a [`Stream`] hands on at once (1 s at 16 kHz).
pub const STREAM_PIECE: usize = 16_000;
/// Pieces decoded ahead of the reader.
const STREAM_AHEAD: usize = 2;

/// Mono samples of one input at a fixed rate, decoded on a thread of their
/// own and handed on in pieces of at most [`STREAM_PIECE`] samples, at most
/// `STREAM_AHEAD` pieces ahead of the reader: memory stays bounded
/// whatever the recording's length.
pub struct Stream {
    rx: std::sync::mpsc::Receiver<Vec<f32>>,
    worker: Option<std::thread::JoinHandle<Result<Info>>>,
    info: Option<Info>,
}

impl Stream {
    /// The next piece; None at the end of the audio, or an error from
    /// decoding (naming the file).
    pub fn next_piece(&mut self) -> Result<Option<Vec<f32>>> {
        if let Ok(piece) = self.rx.recv() {
            return Ok(Some(piece));
        }
        // The decoder is done: its result says whether it went well.
        if let Some(w) = self.worker.take() {
            let info = w
                .join()
                .map_err(|_| Error::invalid("the audio decoding thread panicked"))??;
            self.info = Some(info);
        }
        Ok(None)
    }

    /// What the input was, once [`Stream::next_piece`] has said it ended.
    pub fn take_info(&mut self) -> Result<Info> {
        self.info
            .take()
            .ok_or_else(|| Error::invalid("audio stream: asked what it was before its end"))
    }
}

fn decode<S: Source>(label: &Path, mut src: S, rate: u32, emit: Emit) -> Result<Info> {
    let mut magic = [0u8; 12];
    let n = read_up_to(&mut src, &mut magic).map_err(|e| Error::io(label, e))?;
    if n == 0 {
        return Err(Error::format(label, "empty file (no audio)"));
    }
    src.rewind().map_err(|e| Error::io(label, e))?;
    let is_wav = n == 12 && &magic[..4] == b"RIFF" && &magic[8..] == b"WAVE";
    if is_wav {
        let mut head = vec![0u8; 1 << 16];
        let n = read_up_to(&mut src, &mut head).map_err(|e| Error::io(label, e))?;
        head.truncate(n);
        let format = match src.byte_len() {
            Some(len) => patch_wav_sizes(&mut head, len),
            None => None,
        };
        // Before hound and symphonia, whose header arithmetic overflows on
        // absurd rates and channel counts.
        if let Some(f) = format {
            f.check(label)?;
        }
        let reader = BufReader::new(Cursor::new(head).chain(&mut src));
        let mut emitted = 0usize;
        let wav = decode_wav(label, reader, rate, &mut |piece| {
            emitted += piece.len();
            emit(piece)
        });
        match wav {
            Ok(a) => return Ok(a),
            // hound reads PCM and float; other WAV codecs (ADPCM, A-law,
            // mu-law) may still be read by symphonia. hound refuses those
            // at the header: once samples went out, a retry would repeat them.
            Err(wav_err) if emitted == 0 => {
                src.rewind().map_err(|e| Error::io(label, e))?;
                return decode_other(label, src, rate, None, emit).map_err(|_| wav_err);
            }
            Err(wav_err) => return Err(wav_err),
        }
    }
    // Only what starts as one of the formats we read goes to symphonia:
    // its probe otherwise scans for a marker anywhere in the file, and its
    // riff reader, reached that way, overflows on headers we never checked.
    let flac = magic.starts_with(b"fLaC");
    let ogg = magic.starts_with(b"OggS");
    let mp3 = magic.starts_with(b"ID3") || (magic[0] == 0xFF && magic[1] & 0xE0 == 0xE0);
    if !(flac || ogg || mp3) {
        return Err(Error::format(
            label,
            "not a recognised audio file (WAV, FLAC, MP3, Ogg Vorbis)",
        ));
    }
    if ogg {
        // symphonia's Ogg reader seeks to the last page for the duration
        // and refuses a file whose last page is cut ("unexpected end of
        // file"): read it as a stream, as ffmpeg does, which decodes what
        // is there and reports the cut page.
        let stream = symphonia::core::io::ReadOnlySource::new(src);
        return decode_other(label, stream, rate, None, emit);
    }
    let layout = if mp3 {
        MpegLayout::read(&mut src).map_err(|e| Error::io(label, e))?
    } else {
        None
    };
    decode_other(label, src, rate, layout, emit)
}

/// What an MPEG audio file's reader does not tell: a file cut inside a
/// frame ends, for symphonia, like one that ends between frames. Without a
/// Xing/Info/VBRI tag announcing the length, a cut shows as a valid frame
/// header in the bytes after the last whole frame.
struct MpegLayout {
    /// Where the first frame starts (after an ID3v2 tag).
    frames_at: u64,
    /// The first frame is a Xing, Info or VBRI tag (not decoded, so not
    /// counted; the tag announces the length instead).
    tagged: bool,
    len: u64,
    /// The file's last bytes (up to TAIL).
    tail: Vec<u8>,
}

impl MpegLayout {
    /// More than the longest MPEG audio frame (1729 bytes: layer II at
    /// 384 kbit/s and 32 kHz, padded).
    const TAIL: u64 = 8192;

    fn read(src: &mut impl Source) -> std::io::Result<Option<MpegLayout>> {
        use std::io::SeekFrom;
        let Some(len) = src.byte_len() else {
            return Ok(None);
        };
        let mut id3 = [0u8; 10];
        let n = read_up_to(src, &mut id3)?;
        let mut frames_at = 0u64;
        if n == 10 && id3.starts_with(b"ID3") {
            // A syncsafe size (7 bits a byte), then a footer if flagged.
            let size = id3[6..10]
                .iter()
                .fold(0u64, |acc, &b| (acc << 7) | u64::from(b & 0x7F));
            frames_at = 10 + size + if id3[5] & 0x10 != 0 { 10 } else { 0 };
        }
        let mut first = [0u8; 64];
        src.seek(SeekFrom::Start(frames_at.min(len)))?;
        let n = read_up_to(src, &mut first)?;
        let tagged = first[..n]
            .windows(4)
            .any(|w| w == b"Xing" || w == b"Info" || w == b"VBRI");
        let from = len.saturating_sub(Self::TAIL);
        src.seek(SeekFrom::Start(from))?;
        let mut tail = vec![0u8; (len - from) as usize];
        let n = read_up_to(src, &mut tail)?;
        tail.truncate(n);
        src.rewind()?;
        Ok(Some(MpegLayout {
            frames_at,
            tagged,
            len,
            tail,
        }))
    }

    /// True when the bytes after `consumed` bytes of whole frames start
    /// with a valid frame header: a frame the file ends inside.
    fn ends_inside_a_frame(&self, consumed: u64) -> bool {
        let rest = self.len.saturating_sub(self.frames_at + consumed);
        if self.tagged || rest < 4 || rest > self.tail.len() as u64 {
            return false;
        }
        let at = self.tail.len() - rest as usize;
        let h = u32::from_be_bytes(self.tail[at..at + 4].try_into().expect("4 bytes"));
        let sync = h >> 21 == 0x7FF;
        let version = (h >> 19) & 3; // 1 is reserved
        let layer = (h >> 17) & 3; // 0 is reserved
        let bitrate = (h >> 12) & 0xF; // 0 (free) and 15 are not read
        let sample_rate = (h >> 10) & 3; // 3 is reserved
        sync && version != 1 && layer != 0 && !matches!(bitrate, 0 | 15) && sample_rate != 3
    }
}

/// Streaming writers that cannot seek back leave placeholder sizes in a WAV
/// header (0, 0x7FFFFFFF, 0xFFFFFFFF, 0xFFFFFFF0). As ffmpeg (and so
/// faster-whisper) does, a data chunk whose size is 0 or runs past the end
/// of the file is read to the end of the file: its size is rewritten in
/// `head` (the file's first bytes) from the file's length `file_len`.
/// Returns what the fmt chunk says, when it is in `head`.
fn patch_wav_sizes(head: &mut [u8], file_len: u64) -> Option<WavFormat> {
    let u32_at = |h: &[u8], at: usize| u32::from_le_bytes([h[at], h[at + 1], h[at + 2], h[at + 3]]);
    let mut block_align = 1u64;
    let mut rate = None;
    let mut pos = 12usize;
    while pos + 8 <= head.len() {
        let size = u32_at(head, pos + 4) as u64;
        match &head[pos..pos + 4] {
            b"fmt " if pos + 8 + 14 <= head.len() => {
                let at = pos + 8 + 12;
                block_align = u16::from_le_bytes([head[at], head[at + 1]]).max(1) as u64;
                let tag = u16::from_le_bytes([head[pos + 8], head[pos + 9]]);
                let channels = u16::from_le_bytes([head[pos + 10], head[pos + 11]]);
                // WAVE_FORMAT_EXTENSIBLE: the speaker mask after cbSize and
                // the valid-bits field.
                let mask = (tag == 0xFFFE && size >= 40 && pos + 8 + 24 <= head.len())
                    .then(|| u32_at(head, pos + 8 + 20));
                rate = Some(WavFormat {
                    rate: u32_at(head, pos + 8 + 4),
                    channels,
                    mask,
                });
            }
            b"data" => {
                let available = file_len.saturating_sub(pos as u64 + 8);
                if size == 0 || size > available {
                    let whole = available.min(u32::MAX as u64) / block_align * block_align;
                    head[pos + 4..pos + 8].copy_from_slice(&(whole as u32).to_le_bytes());
                    let riff = (file_len - 8).min(u32::MAX as u64) as u32;
                    head[4..8].copy_from_slice(&riff.to_le_bytes());
                }
                return rate;
            }
            _ => {}
        }
        pos += 8 + (size + (size & 1)) as usize;
    }
    rate
}

/// What a WAV file's fmt chunk declares.
#[derive(Clone, Copy, Debug)]
struct WavFormat {
    rate: u32,
    channels: u16,
    /// The speaker mask of a WAVE_FORMAT_EXTENSIBLE header.
    mask: Option<u32>,
}

impl WavFormat {
    /// Refuses what the decoders cannot take without overflowing: a rate
    /// outside [`SOURCE_RATES`], more than [`MAX_CHANNELS`] channels, or an
    /// extensible speaker mask with fewer speakers than channels whose
    /// repair in symphonia shifts past 32 bits (mask with its top bit set).
    fn check(&self, label: &Path) -> Result<()> {
        check_rate(label, self.rate)?;
        let bad = |what: String| Err(Error::format(label, what));
        if !(1..=MAX_CHANNELS).contains(&self.channels) {
            return bad(format!(
                "a WAV header with {} channels is implausible (1 to {MAX_CHANNELS})",
                self.channels
            ));
        }
        if let Some(mask) = self.mask {
            let missing = self.channels as i64 - mask.count_ones() as i64;
            if missing > 0 && (mask & 0x8000_0000 != 0 || missing >= 32) {
                return bad(format!(
                    "the WAV speaker mask {mask:#010x} does not fit its {} channels",
                    self.channels
                ));
            }
        }
        Ok(())
    }
}

/// Refuses a source rate outside [`SOURCE_RATES`], naming the file.
fn check_rate(label: &Path, rate: u32) -> Result<()> {
    if SOURCE_RATES.contains(&rate) {
        return Ok(());
    }
    Err(Error::format(
        label,
        format!(
            "a sample rate of {rate} Hz is implausible (expected {} to {} Hz): a damaged header?",
            SOURCE_RATES.start(),
            SOURCE_RATES.end()
        ),
    ))
}

fn read_up_to(src: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match src.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

fn decode_wav(label: &Path, src: impl Read, rate: u32, emit: Emit) -> Result<Info> {
    let bad = |e: hound::Error| Error::format(label, format!("not a readable WAV file: {e}"));
    let reader = hound::WavReader::new(src).map_err(bad)?;
    let spec = reader.spec();
    let channels = spec.channels as usize;
    if channels == 0 || spec.sample_rate == 0 {
        return Err(Error::format(
            label,
            "WAV header has no channels or a zero sample rate",
        ));
    }
    let mut sink = MonoSink::new(label, spec.sample_rate, rate)?;
    let mut frame = Vec::with_capacity(channels);
    let mut block = Vec::with_capacity(4096);
    let mut push = |v: f32, sink: &mut MonoSink| -> Result<()> {
        frame.push(v);
        if frame.len() == channels {
            block.push(frame.iter().sum::<f32>() / channels as f32);
            frame.clear();
            if block.len() == 4096 {
                sink.push(block.drain(..), &mut *emit)?;
            }
        }
        Ok(())
    };
    match spec.sample_format {
        hound::SampleFormat::Float => {
            for s in reader.into_samples::<f32>() {
                push(s.map_err(bad)?, &mut sink)?;
            }
        }
        hound::SampleFormat::Int => {
            let scale = 1.0 / (1u64 << (spec.bits_per_sample.clamp(1, 32) - 1)) as f32;
            for s in reader.into_samples::<i32>() {
                push(s.map_err(bad)? as f32 * scale, &mut sink)?;
            }
        }
    }
    sink.push(block, &mut *emit)?;
    Ok(Info {
        len: sink.finish(emit)?,
        rate,
        source_rate: spec.sample_rate,
        source_channels: spec.channels,
        warnings: Vec::new(),
    })
}

fn decode_other<S: Source>(
    label: &Path,
    src: S,
    rate: u32,
    mpeg: Option<MpegLayout>,
    emit: Emit,
) -> Result<Info> {
    use symphonia::core::codecs::audio::AudioDecoderOptions;
    use symphonia::core::errors::Error as SymError;
    use symphonia::core::formats::probe::Hint;
    use symphonia::core::formats::{FormatOptions, TrackType};
    use symphonia::core::io::MediaSourceStream;
    use symphonia::core::meta::MetadataOptions;

    let not_audio = |e: SymError| match e {
        SymError::IoError(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Error::format(
            label,
            "the file ends before its first audio (a truncated file?)",
        ),
        e => Error::format(
            label,
            format!("not a recognised audio file (WAV, FLAC, MP3, Ogg Vorbis): {e}"),
        ),
    };
    let mss = MediaSourceStream::new(Box::new(src), Default::default());
    let mut hint = Hint::new();
    if let Some(ext) = label.extension().and_then(|e| e.to_str()) {
        hint.with_extension(ext);
    }
    let mut format = symphonia::default::get_probe()
        .probe(
            &hint,
            mss,
            FormatOptions::default(),
            MetadataOptions::default(),
        )
        .map_err(not_audio)?;
    let track = format
        .default_track(TrackType::Audio)
        .ok_or_else(|| Error::format(label, "no audio track"))?;
    let track_id = track.id;
    let expected_frames = track.num_frames;
    let params = track
        .codec_params
        .as_ref()
        .and_then(|p| p.audio())
        .ok_or_else(|| Error::format(label, "no audio track"))?;
    let mut decoder = symphonia::default::get_codecs()
        .make_audio_decoder(params, &AudioDecoderOptions::default())
        .map_err(|e| Error::unsupported(label, format!("audio codec: {e}")))?;
    let mut sink: Option<MonoSink> = None;
    let (mut source_rate, mut source_channels) = (0u32, 0u16);
    let mut interleaved: Vec<f32> = Vec::new();
    let (mut frames, mut cut_short, mut corrupt) = (0u64, false, 0usize);
    // Bytes of the track's packets (MPEG: whole frames, headers included).
    let mut consumed = 0u64;
    loop {
        let packet = match format.next_packet() {
            Ok(Some(p)) => p,
            Ok(None) => break,
            Err(SymError::IoError(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                cut_short = true;
                break;
            }
            Err(e) => return Err(Error::format(label, format!("cannot read audio: {e}"))),
        };
        if packet.track_id != track_id {
            continue;
        }
        consumed += packet.data.len() as u64;
        let buf = match decoder.decode(&packet) {
            Ok(b) => b,
            // A corrupt packet is skipped, as players do, and reported.
            Err(SymError::DecodeError(_)) => {
                corrupt += 1;
                continue;
            }
            Err(e) => return Err(Error::format(label, format!("cannot decode audio: {e}"))),
        };
        let (r, ch) = (buf.spec().rate(), buf.spec().channels().count());
        if ch == 0 || r == 0 {
            return Err(Error::format(
                label,
                "audio with no channels or a zero sample rate",
            ));
        }
        if sink.is_none() {
            sink = Some(MonoSink::new(label, r, rate)?);
            (source_rate, source_channels) = (r, ch as u16);
        } else if (r, ch as u16) != (source_rate, source_channels) {
            return Err(Error::unsupported(
                label,
                "the sample rate or channel count changes mid-stream",
            ));
        }
        frames += buf.frames() as u64;
        interleaved.resize(buf.samples_interleaved(), 0.0);
        buf.copy_to_slice_interleaved(&mut interleaved);
        let sink = sink.as_mut().expect("created above");
        sink.push(
            interleaved
                .chunks_exact(ch)
                .map(|f| f.iter().sum::<f32>() / ch as f32),
            &mut *emit,
        )?;
    }
    cut_short |= mpeg.is_some_and(|m| m.ends_inside_a_frame(consumed));
    let seconds = |n: u64| n as f64 / source_rate.max(1) as f64;
    let mut warnings = Vec::new();
    match expected_frames {
        Some(total) if frames < total && source_rate > 0 => warnings.push(format!(
            "warning: {}: the audio ends early (a truncated file?): read {:.2} s of the {:.2} s its header announces",
            label.display(),
            seconds(frames),
            seconds(total)
        )),
        _ if cut_short => warnings.push(format!(
            "warning: {}: the file ends in the middle of a packet (a truncated file?); read {:.2} s",
            label.display(),
            seconds(frames)
        )),
        _ => {}
    }
    if corrupt > 0 {
        warnings.push(format!(
            "warning: {}: skipped {corrupt} damaged packet(s)",
            label.display()
        ));
    }
    let len = match sink {
        Some(s) => s.finish(emit)?,
        None => 0,
    };
    Ok(Info {
        len,
        rate,
        source_rate,
        source_channels,
        warnings,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tone(rate: u32, hz: f32, seconds: f32) -> Vec<f32> {
        (0..(rate as f32 * seconds) as usize)
            .map(|n| (std::f32::consts::TAU * hz * n as f32 / rate as f32).sin() * 0.5)
            .collect()
    }

    #[test]
    fn resampling_keeps_length_and_the_tone() {
        let x = tone(48_000, 440.0, 1.0);
        let mut sink = MonoSink::new(Path::new("tone"), 48_000, 16_000).unwrap();
        // Uneven pieces, as packets come.
        let mut y = Vec::new();
        let mut emit = |p: &[f32]| {
            y.extend_from_slice(p);
            Ok(())
        };
        for piece in x.chunks(777) {
            sink.push(piece.iter().copied(), &mut emit).unwrap();
        }
        assert_eq!(sink.finish(&mut emit).unwrap(), 16_000);
        assert_eq!(y.len(), 16_000);
        let want = tone(16_000, 440.0, 1.0);
        // Away from the edges the resampled tone is the tone sampled at 16 kHz.
        let err: f32 = y[1000..15_000]
            .iter()
            .zip(&want[1000..15_000])
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        assert!(err < 1e-3, "max error {err}");
    }

    #[test]
    fn reads_stereo_24_bit_wav_at_44100() {
        let dir = std::env::temp_dir().join(format!("lfm-audio-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("stereo.wav");
        let spec = hound::WavSpec {
            channels: 2,
            sample_rate: 44_100,
            bits_per_sample: 24,
            sample_format: hound::SampleFormat::Int,
        };
        let mut w = hound::WavWriter::create(&path, spec).unwrap();
        let x = tone(44_100, 300.0, 0.5);
        for v in &x {
            let s = (v * 8_388_607.0) as i32;
            w.write_sample(s).unwrap();
            w.write_sample(-s / 2).unwrap();
        }
        w.finalize().unwrap();
        let a = load(&path, 16_000).unwrap();
        assert_eq!((a.source_rate, a.source_channels), (44_100, 2));
        assert_eq!(a.samples.len(), 8000);
        let peak = a.samples[1000..7000]
            .iter()
            .fold(0.0f32, |m, v| m.max(v.abs()));
        assert!(
            (peak - 0.125).abs() < 0.01,
            "mono mix of 0.5 and -0.25: peak {peak}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn refuses_non_audio_and_empty_files() {
        let dir = std::env::temp_dir().join(format!("lfm-audio-bad-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (name, bytes) in [
            ("empty.wav", &b""[..]),
            (
                "text.wav",
                &b"this is not audio at all, just some text\n"[..],
            ),
            ("trunc.wav", &b"RIFF\x24\x00\x00\x00WAVEfmt "[..]),
        ] {
            let p = dir.join(name);
            std::fs::write(&p, bytes).unwrap();
            let e = load(&p, 16_000).unwrap_err().to_string();
            assert!(e.contains(name), "{e}");
        }
        let p = dir.join("silent.wav");
        let spec = hound::WavSpec {
            channels: 1,
            sample_rate: 16_000,
            bits_per_sample: 16,
            sample_format: hound::SampleFormat::Int,
        };
        hound::WavWriter::create(&p, spec)
            .unwrap()
            .finalize()
            .unwrap();
        let e = load(&p, 16_000).unwrap_err().to_string();
        assert!(e.contains("no audio samples"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
