//! Audio output: 16-bit PCM WAV, written as samples arrive so a long text
//! starts playing before it is all synthesised. Files go through hound
//! (which fills in the lengths at the end); a pipe cannot seek back, so a
//! stream gets the header streaming writers use (ffmpeg, sox): RIFF and data
//! lengths set to 0xFFFFFFFF, meaning "until the end of the stream".

use std::io::{Seek, Write};

/// Piper's float -> int16 scale.
const MAX_WAV_VALUE: f32 = 32767.0;

/// Float samples to 16-bit PCM the way Piper does: scaled so the loudest
/// sample is full scale (when `normalize`), then clipped.
pub fn to_pcm16(samples: &[f32], normalize: bool) -> Vec<i16> {
    let peak = samples.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    // Divided (not multiplied by 1 / peak) so the peak maps to exactly 1.
    let div = if normalize && peak > 1e-8 { peak } else { 1.0 };
    samples
        .iter()
        .map(|v| (v / div * MAX_WAV_VALUE).clamp(-MAX_WAV_VALUE, MAX_WAV_VALUE) as i16)
        .collect()
}

/// Where 16-bit mono samples go.
pub trait PcmSink {
    fn write(&mut self, samples: &[i16]) -> std::io::Result<()>;
    /// Writes what is buffered and completes the file.
    fn finish(self: Box<Self>) -> std::io::Result<()>;
}

fn hound_err(e: hound::Error) -> std::io::Error {
    match e {
        hound::Error::IoError(e) => e,
        other => std::io::Error::other(other.to_string()),
    }
}

/// A seekable WAV file through hound.
pub struct WavFile<W: Write + Seek> {
    writer: hound::WavWriter<W>,
}

impl<W: Write + Seek> WavFile<W> {
    pub fn new(out: W, sample_rate: u32) -> std::io::Result<Self> {
        let spec = hound::WavSpec {
            channels: 1,
            sample_rate,
            bits_per_sample: 16,
            sample_format: hound::SampleFormat::Int,
        };
        Ok(WavFile {
            writer: hound::WavWriter::new(out, spec).map_err(hound_err)?,
        })
    }
}

impl<W: Write + Seek> PcmSink for WavFile<W> {
    fn write(&mut self, samples: &[i16]) -> std::io::Result<()> {
        let mut w = self.writer.get_i16_writer(samples.len() as u32);
        for &s in samples {
            w.write_sample(s);
        }
        w.flush().map_err(hound_err)?;
        self.writer.flush().map_err(hound_err)
    }

    fn finish(self: Box<Self>) -> std::io::Result<()> {
        self.writer.finalize().map_err(hound_err)
    }
}

/// A WAV stream on a pipe: header first, then samples, flushed per write.
pub struct WavStream<W: Write> {
    out: W,
}

impl<W: Write> WavStream<W> {
    pub fn new(mut out: W, sample_rate: u32) -> std::io::Result<Self> {
        out.write_all(&stream_header(sample_rate))?;
        Ok(WavStream { out })
    }
}

impl<W: Write> PcmSink for WavStream<W> {
    fn write(&mut self, samples: &[i16]) -> std::io::Result<()> {
        let bytes: Vec<u8> = samples.iter().flat_map(|s| s.to_le_bytes()).collect();
        self.out.write_all(&bytes)?;
        self.out.flush()
    }

    fn finish(mut self: Box<Self>) -> std::io::Result<()> {
        self.out.flush()
    }
}

/// Raw 16-bit little-endian samples, no header (Piper's --output-raw).
pub struct RawStream<W: Write> {
    out: W,
}

impl<W: Write> RawStream<W> {
    pub fn new(out: W) -> Self {
        RawStream { out }
    }
}

impl<W: Write> PcmSink for RawStream<W> {
    fn write(&mut self, samples: &[i16]) -> std::io::Result<()> {
        let bytes: Vec<u8> = samples.iter().flat_map(|s| s.to_le_bytes()).collect();
        self.out.write_all(&bytes)?;
        self.out.flush()
    }

    fn finish(mut self: Box<Self>) -> std::io::Result<()> {
        self.out.flush()
    }
}

/// A 44-byte PCM16 mono header with unknown (maximal) lengths.
pub fn stream_header(sample_rate: u32) -> [u8; 44] {
    let mut h = [0u8; 44];
    let unknown = u32::MAX.to_le_bytes();
    h[0..4].copy_from_slice(b"RIFF");
    h[4..8].copy_from_slice(&unknown);
    h[8..16].copy_from_slice(b"WAVEfmt ");
    h[16..20].copy_from_slice(&16u32.to_le_bytes());
    h[20..22].copy_from_slice(&1u16.to_le_bytes()); // PCM
    h[22..24].copy_from_slice(&1u16.to_le_bytes()); // mono
    h[24..28].copy_from_slice(&sample_rate.to_le_bytes());
    h[28..32].copy_from_slice(&(sample_rate * 2).to_le_bytes()); // bytes per second
    h[32..34].copy_from_slice(&2u16.to_le_bytes()); // block align
    h[34..36].copy_from_slice(&16u16.to_le_bytes()); // bits per sample
    h[36..40].copy_from_slice(b"data");
    h[40..44].copy_from_slice(&unknown);
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pcm16_is_normalised_and_clipped() {
        assert_eq!(to_pcm16(&[0.5, -0.25], true), [32767, -16383]);
        assert_eq!(to_pcm16(&[0.5, -2.0], false), [16383, -32767]);
        assert_eq!(to_pcm16(&[0.0, 0.0], true), [0, 0]);
    }

    #[test]
    fn file_and_stream_carry_the_same_samples() {
        let samples: Vec<i16> = (0..1000).map(|i| (i * 37 % 2000 - 1000) as i16).collect();
        let mut file = std::io::Cursor::new(Vec::new());
        let mut sink: Box<dyn PcmSink> = Box::new(WavFile::new(&mut file, 22050).unwrap());
        sink.write(&samples[..400]).unwrap();
        sink.write(&samples[400..]).unwrap();
        sink.finish().unwrap();
        let bytes = file.into_inner();
        let r = hound::WavReader::new(&bytes[..]).unwrap();
        assert_eq!(r.spec().sample_rate, 22050);
        let read: Vec<i16> = r.into_samples().map(|s| s.unwrap()).collect();
        assert_eq!(read, samples);

        let mut stream = Vec::new();
        let mut sink: Box<dyn PcmSink> = Box::new(WavStream::new(&mut stream, 22050).unwrap());
        sink.write(&samples).unwrap();
        sink.finish().unwrap();
        // Same format block as hound's, then the raw samples.
        assert_eq!(&stream[..40], &stream_header(22050)[..40]);
        assert_eq!(&stream[12..36], &bytes[12..36]);
        assert_eq!(&stream[44..], &bytes[44..]);
    }
}
