//! Transcript formats, as openai-whisper writes them: plain text (a line per
//! segment), SubRip, WebVTT, and JSON (segments with times and tokens).
//! Text formats are written segment by segment as they are decoded. With
//! word timestamps, subtitles are built from the words as openai-whisper's
//! `SubtitlesWriter` builds them: lines of at most `max_line_width`
//! characters, cues of at most `max_line_count` lines (a new cue after a
//! pause of over 3 s), and optionally one cue per word with that word
//! underlined (karaoke).

use super::words::Word;
use super::{Segment, Transcript};
use std::io::Write;

/// How subtitles are cut when the segments carry words.
#[derive(Clone, Copy, Debug, Default)]
pub struct SubtitleOptions {
    /// Characters per line; with `max_line_count`, cues no longer follow
    /// the segments.
    pub max_line_width: Option<usize>,
    pub max_line_count: Option<usize>,
    /// A cue per word, the word underlined (`<u>...</u>`).
    pub highlight_words: bool,
}

/// The cue being built from words.
#[derive(Default)]
struct Cues {
    line_len: usize,
    line_count: usize,
    words: Vec<Word>,
    /// Start of the last word placed.
    last: Option<f64>,
}

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
    subtitles: SubtitleOptions,
    cues: Cues,
}

impl<W: Write> Writer<W> {
    pub fn new(format: Format, out: W) -> Writer<W> {
        Writer::with_subtitles(format, out, SubtitleOptions::default())
    }

    pub fn with_subtitles(format: Format, out: W, subtitles: SubtitleOptions) -> Writer<W> {
        Writer {
            format,
            out,
            count: 0,
            subtitles,
            cues: Cues {
                line_count: 1,
                ..Cues::default()
            },
        }
    }

    /// One subtitle cue.
    fn cue(&mut self, start: f64, end: f64, text: &str) -> std::io::Result<()> {
        match self.format {
            Format::Srt => writeln!(
                self.out,
                "{}\n{} --> {}\n{text}\n",
                self.count + 1,
                timestamp(start, true, ','),
                timestamp(end, true, ',')
            )?,
            Format::Vtt => {
                if self.count == 0 {
                    writeln!(self.out, "WEBVTT\n")?;
                }
                writeln!(
                    self.out,
                    "{} --> {}\n{text}\n",
                    timestamp(start, false, '.'),
                    timestamp(end, false, '.')
                )?
            }
            Format::Txt | Format::Json => return Ok(()),
        }
        self.count += 1;
        Ok(())
    }

    /// The cue of the words gathered so far (one per word when highlighting).
    fn flush_cue(&mut self) -> std::io::Result<()> {
        let words = std::mem::take(&mut self.cues.words);
        let (Some(first), Some(last)) = (words.first(), words.last()) else {
            return Ok(());
        };
        let text: String = words.iter().map(|w| w.word.as_str()).collect();
        if !self.subtitles.highlight_words {
            return self.cue(first.start, last.end, &text);
        }
        // Times compare as printed, as openai-whisper compares them.
        let shown = |t: f64| timestamp(t, true, ',');
        let mut previous = first.start;
        for (i, w) in words.iter().enumerate() {
            if shown(previous) != shown(w.start) {
                self.cue(previous, w.start, &text)?;
            }
            let marked: String = words
                .iter()
                .enumerate()
                .map(|(j, v)| {
                    if j == i {
                        let body = v.word.trim_start();
                        let lead = &v.word[..v.word.len() - body.len()];
                        format!("{lead}<u>{body}</u>")
                    } else {
                        v.word.clone()
                    }
                })
                .collect();
            self.cue(w.start, w.end, &marked)?;
            previous = w.end;
        }
        Ok(())
    }

    /// openai-whisper's `iterate_subtitles`, one segment's words at a time.
    fn segment_words(&mut self, words: &[Word]) -> std::io::Result<()> {
        let o = self.subtitles;
        let preserve_segments = o.max_line_count.is_none() || o.max_line_width.is_none();
        let max_line_width = o.max_line_width.unwrap_or(1000);
        for (i, w) in words.iter().enumerate() {
            let mut timing = w.clone();
            let last = *self.cues.last.get_or_insert(timing.start);
            let len = timing.word.chars().count();
            let long_pause = !preserve_segments && timing.start - last > 3.0;
            let has_room = self.cues.line_len + len <= max_line_width;
            let seg_break = i == 0 && !self.cues.words.is_empty() && preserve_segments;
            if self.cues.line_len > 0 && has_room && !long_pause && !seg_break {
                self.cues.line_len += len;
            } else {
                timing.word = timing.word.trim().to_string();
                let full = o
                    .max_line_count
                    .is_some_and(|n| long_pause || self.cues.line_count >= n);
                if (!self.cues.words.is_empty() && full) || seg_break {
                    self.flush_cue()?;
                    self.cues.line_count = 1;
                } else if self.cues.line_len > 0 {
                    self.cues.line_count += 1;
                    timing.word = format!("\n{}", timing.word);
                }
                self.cues.line_len = timing.word.trim().chars().count();
            }
            self.cues.last = Some(timing.start);
            self.cues.words.push(timing);
        }
        Ok(())
    }

    pub fn segment(&mut self, seg: &Segment) -> std::io::Result<()> {
        let text = seg.text.trim();
        if let (Some(words), Format::Srt | Format::Vtt) = (&seg.words, self.format) {
            self.segment_words(words)?;
            return self.out.flush();
        }
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
        self.flush_cue()?;
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
            words: None,
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
