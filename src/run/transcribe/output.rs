//! Transcript formats, as openai-whisper writes them: plain text (a line per
//! segment), SubRip, WebVTT, and JSON (segments with times and tokens).
//! Text formats are written segment by segment as they are decoded.

use super::{Segment, Transcript};
use std::io::Write;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// One line of text per segment.
    Txt,
    /// SubRip subtitles.
    Srt,
    /// WebVTT subtitles.
    Vtt,
    /// Everything: language, segments with times, tokens with log probabilities.
    Json,
}

/// `[hh:]mm:ss<marker>mmm`, hours always or only when non-zero.
pub fn timestamp(seconds: f64, always_hours: bool, marker: char) -> String {
    let ms = (seconds.max(0.0) * 1000.0).round() as u64;
    let (h, m, s, ms) = (ms / 3_600_000, ms / 60_000 % 60, ms / 1000 % 60, ms % 1000);
    if always_hours || h > 0 {
        format!("{h:02}:{m:02}:{s:02}{marker}{ms:03}")
    } else {
        format!("{m:02}:{s:02}{marker}{ms:03}")
    }
}

/// Writes a transcript in `format` to `out` as it grows.
pub struct Writer<W: Write> {
    format: Format,
    out: W,
    count: usize,
}

impl<W: Write> Writer<W> {
    pub fn new(format: Format, out: W) -> Writer<W> {
        Writer {
            format,
            out,
            count: 0,
        }
    }

    pub fn segment(&mut self, seg: &Segment) -> std::io::Result<()> {
        let text = seg.text.trim();
        match self.format {
            Format::Txt => writeln!(self.out, "{text}")?,
            Format::Srt => writeln!(
                self.out,
                "{}\n{} --> {}\n{}\n",
                self.count + 1,
                timestamp(seg.start, true, ','),
                timestamp(seg.end, true, ','),
                text.replace("-->", "->")
            )?,
            Format::Vtt => {
                if self.count == 0 {
                    writeln!(self.out, "WEBVTT\n")?;
                }
                writeln!(
                    self.out,
                    "{} --> {}\n{}\n",
                    timestamp(seg.start, false, '.'),
                    timestamp(seg.end, false, '.'),
                    text.replace("-->", "->")
                )?
            }
            Format::Json => return Ok(()),
        }
        self.count += 1;
        self.out.flush()
    }

    /// Writes what comes after the last segment and hands back the output.
    pub fn finish(mut self, transcript: &Transcript) -> std::io::Result<W> {
        match self.format {
            Format::Json => {
                serde_json::to_writer_pretty(&mut self.out, transcript)?;
                writeln!(self.out)?;
            }
            Format::Vtt if self.count == 0 => writeln!(self.out, "WEBVTT\n")?,
            _ => {}
        }
        self.out.flush()?;
        Ok(self.out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(start: f64, end: f64, text: &str) -> Segment {
        Segment {
            id: 0,
            seek: 0,
            start,
            end,
            text: text.into(),
            tokens: Vec::new(),
            temperature: 0.0,
            avg_logprob: -0.1,
            compression_ratio: 1.0,
            no_speech_prob: 0.0,
        }
    }

    fn render(format: Format) -> String {
        let t = Transcript {
            text: " Hello. --> there".into(),
            language: "en".into(),
            language_probability: None,
            duration: 3725.0,
            segments: vec![
                seg(0.0, 1.5, " Hello."),
                seg(3723.456, 3725.0, " --> there"),
            ],
        };
        let mut w = Writer::new(format, Vec::new());
        for s in &t.segments {
            w.segment(s).unwrap();
        }
        String::from_utf8(w.finish(&t).unwrap()).unwrap()
    }

    #[test]
    fn formats_match_openai_whisper() {
        assert_eq!(render(Format::Txt), "Hello.\n--> there\n");
        assert_eq!(
            render(Format::Srt),
            "1\n00:00:00,000 --> 00:00:01,500\nHello.\n\n2\n01:02:03,456 --> 01:02:05,000\n-> there\n\n"
        );
        assert_eq!(
            render(Format::Vtt),
            "WEBVTT\n\n00:00.000 --> 00:01.500\nHello.\n\n01:02:03.456 --> 01:02:05.000\n-> there\n\n"
        );
        let j: serde_json::Value = serde_json::from_str(&render(Format::Json)).unwrap();
        assert_eq!(j["segments"][1]["start"], 3723.456);
        assert_eq!(j["language"], "en");
    }
}
