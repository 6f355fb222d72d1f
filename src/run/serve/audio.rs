//! `POST /v1/audio/transcriptions` (Whisper, multipart upload) and
//! `POST /v1/audio/speech` (a Piper voice, WAV out).

use super::api::bad;
use super::http::{read_json, ApiError, AppState};
use super::Worker;
use crate::device::DeviceChoice;
use crate::models::vits::{Scales, Synthesizer, Vits};
use crate::models::whisper::gpu::GpuBackend;
use crate::models::whisper::mel::SAMPLE_RATE;
use crate::models::whisper::WhisperFiles;
use crate::run::audio;
use crate::run::phonemes::{self, PhonemeIdMap};
use crate::run::transcribe::output::{Format, Writer};
use crate::run::transcribe::{self, Backend, CpuBackend, Options, Transcript};
use crate::run::wav::{self, PcmSink, WavFile};
use crate::util::rng::Rng;
use axum::body::Body;
use axum::extract::{FromRequest, Multipart, Request, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Whisper's files and, when on the GPU, the network there.
pub struct Asr {
    files: WhisperFiles,
    gpu: Option<GpuBackend>,
}

impl Asr {
    pub fn load(dir: &Path, device: &DeviceChoice) -> crate::Result<Asr> {
        let files = WhisperFiles::load(dir, None)?;
        // Requests decode with the default search (greedy, then best-of
        // sampling on fallback).
        let seqs = Options::default().max_sequences();
        let (gpu, _) = device.build(
            || Ok(None),
            |g| Ok(Some(GpuBackend::new(g, &files.model, seqs, 1)?)),
        )?;
        Ok(Asr { files, gpu })
    }

    fn transcribe(&mut self, samples: &[f32], opts: &Options) -> crate::Result<Transcript> {
        let mut cpu = CpuBackend::new(&self.files.model);
        let backend: &mut dyn Backend = match &mut self.gpu {
            Some(g) => g,
            None => &mut cpu,
        };
        transcribe::transcribe(&self.files, backend, samples, opts, &mut |_, _| Ok(()))
    }
}

/// A voice, its phoneme table and its synthesiser.
pub struct Voice {
    synth: Synthesizer,
    ids: PhonemeIdMap,
}

impl Voice {
    pub fn load(path: &Path, device: &DeviceChoice) -> crate::Result<Voice> {
        let vits = Vits::open(path)?;
        let ids = PhonemeIdMap::from_config(&vits.config.path, &vits.config.json)?;
        Ok(Voice {
            synth: Synthesizer::new(vits, device)?,
            ids,
        })
    }
}

#[derive(Default)]
pub struct AudioServices {
    pub asr: Option<(String, Worker<Asr>)>,
    pub voice: Option<(String, Worker<Voice>)>,
}

/// Fields of a transcription upload.
#[derive(Default)]
struct Upload {
    file: Option<(String, Vec<u8>)>,
    language: Option<String>,
    prompt: Option<String>,
    format: Option<String>,
    temperature: Option<f32>,
}

pub async fn transcriptions(
    State(s): State<Arc<AppState>>,
    req: Request,
) -> Result<Response, ApiError> {
    let Some((_, worker)) = &s.audio.asr else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "no speech recognition model is loaded (start serve with --asr-model)",
        ));
    };
    let mut form = Multipart::from_request(req, &s).await.map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            format!("the body is not multipart/form-data: {}", e.body_text()),
        )
    })?;
    let mut up = Upload::default();
    let mut total = 0usize;
    loop {
        let field = match form.next_field().await {
            Ok(Some(f)) => f,
            Ok(None) => break,
            Err(e) => return Err(multipart_error(&s, e)),
        };
        let name = field.name().unwrap_or("").to_string();
        let filename = field.file_name().unwrap_or("upload").to_string();
        let bytes = field.bytes().await.map_err(|e| multipart_error(&s, e))?;
        total += bytes.len();
        if total > s.max_body {
            return Err(too_large(&s));
        }
        let text = || String::from_utf8_lossy(&bytes).trim().to_string();
        match name.as_str() {
            "file" => up.file = Some((filename, bytes.to_vec())),
            "language" => up.language = Some(text()).filter(|l| !l.is_empty()),
            "prompt" => up.prompt = Some(text()).filter(|p| !p.is_empty()),
            "response_format" => up.format = Some(text()),
            "temperature" => {
                let t: f32 = text()
                    .parse()
                    .map_err(|_| bad("temperature", "temperature is not a number"))?;
                if !(0.0..=1.0).contains(&t) {
                    return Err(bad("temperature", "temperature must be between 0 and 1").into());
                }
                up.temperature = Some(t);
            }
            // model, timestamp_granularities[] and the like: accepted, unused.
            _ => {}
        }
    }
    let Some((filename, bytes)) = up.file else {
        return Err(bad("file", "the upload has no file field").into());
    };
    let format = up.format.as_deref().unwrap_or("json").to_string();
    if !["json", "text", "srt", "vtt", "verbose_json"].contains(&format.as_str()) {
        return Err(bad(
            "response_format",
            format!("unknown response_format {format:?} (json, text, srt, vtt, verbose_json)"),
        )
        .into());
    }
    let mut opts = Options {
        language: up.language,
        initial_prompt: up.prompt,
        ..Options::default()
    };
    if let Some(t) = up.temperature {
        // A temperature given starts there and falls back upward, as
        // openai-whisper does when asked for one.
        opts.temperatures = std::iter::successors(Some(t), |&x| Some(x + 0.2))
            .take_while(|&x| x <= 1.0 + 1e-6)
            .collect();
    }
    let label = PathBuf::from(filename);
    let t = worker
        .run(move |asr: &mut Asr| -> crate::Result<Transcript> {
            let audio = audio::decode_bytes(&label, bytes, SAMPLE_RATE as u32)?;
            asr.transcribe(&audio.samples, &opts)
        })
        .await??;
    let text_of = |f: Format| -> Result<String, ApiError> {
        let mut w = Writer::new(f, Vec::new());
        for seg in &t.segments {
            w.segment(seg)
                .map_err(|e| ApiError::internal(e.to_string()))?;
        }
        let out = w
            .finish(&t)
            .map_err(|e| ApiError::internal(e.to_string()))?;
        Ok(String::from_utf8_lossy(&out).into_owned())
    };
    let plain =
        |body: String, mime: &'static str| ([(header::CONTENT_TYPE, mime)], body).into_response();
    Ok(match format.as_str() {
        "text" => plain(format!("{}\n", t.text.trim()), "text/plain; charset=utf-8"),
        "srt" => plain(text_of(Format::Srt)?, "application/x-subrip"),
        "vtt" => plain(text_of(Format::Vtt)?, "text/vtt"),
        "verbose_json" => axum::Json(json!({
            "task": "transcribe",
            "language": t.language,
            "duration": t.duration,
            "text": t.text.trim(),
            "segments": t.segments.iter().map(|s| json!({
                "id": s.id, "seek": s.seek, "start": s.start, "end": s.end,
                "text": s.text, "tokens": s.tokens.iter().map(|t| t.id).collect::<Vec<_>>(),
                "temperature": s.temperature, "avg_logprob": s.avg_logprob,
                "compression_ratio": s.compression_ratio, "no_speech_prob": s.no_speech_prob,
            })).collect::<Vec<_>>(),
        }))
        .into_response(),
        _ => axum::Json(json!({"text": t.text.trim()})).into_response(),
    })
}

fn too_large(s: &AppState) -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "invalid_request_error",
        format!("the request body is larger than {} bytes", s.max_body),
    )
}

fn multipart_error(s: &AppState, e: axum::extract::multipart::MultipartError) -> ApiError {
    if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
        return too_large(s);
    }
    ApiError::new(
        StatusCode::BAD_REQUEST,
        "invalid_request_error",
        format!("reading the upload: {}", e.body_text()),
    )
}

#[derive(serde::Deserialize)]
struct SpeechRequest {
    input: String,
    #[serde(default)]
    response_format: Option<String>,
    /// Playback speed; 1 is the voice's own pace.
    #[serde(default)]
    speed: Option<f32>,
}

/// Seconds of silence between sentences (piper's and `speak`'s default).
const SENTENCE_PAUSE: f32 = 0.2;

/// Most characters one speech request may carry (OpenAI's limit).
const MAX_SPEECH_CHARS: usize = 4096;

pub async fn speech(State(s): State<Arc<AppState>>, body: Body) -> Result<Response, ApiError> {
    let r: SpeechRequest = read_json(&s, body).await?;
    let Some((_, worker)) = &s.audio.voice else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "no voice is loaded (start serve with --voice)",
        ));
    };
    if r.input.trim().is_empty() {
        return Err(bad("input", "input is empty").into());
    }
    if r.input.chars().count() > MAX_SPEECH_CHARS {
        return Err(bad(
            "input",
            format!("input is longer than {MAX_SPEECH_CHARS} characters"),
        )
        .into());
    }
    match r.response_format.as_deref() {
        None | Some("wav") => {}
        Some(other) => {
            return Err(bad(
                "response_format",
                format!("response_format {other:?} is not supported (wav)"),
            )
            .into())
        }
    }
    let speed = r.speed.unwrap_or(1.0);
    if !(0.25..=4.0).contains(&speed) {
        return Err(bad("speed", "speed must be between 0.25 and 4").into());
    }
    let text = r.input;
    let wav_bytes = worker
        .run(move |v: &mut Voice| -> crate::Result<Vec<u8>> {
            let cfg = &v.synth.vits().config;
            let scales = Scales {
                noise_scale: cfg.noise_scale,
                length_scale: cfg.length_scale / speed,
                noise_w: cfg.noise_w,
            };
            let rate = cfg.sample_rate;
            // As `speak` reads text: long sentences cut into bounded passes,
            // a pause between sentences but not between pieces of one.
            let sentences = phonemes::text_to_ids(&text, &cfg.espeak_voice, &v.ids)?;
            let mut rng = Rng::new(0);
            let mut out = std::io::Cursor::new(Vec::new());
            {
                let io = |e| crate::Error::io("<wav>", e);
                let mut sink: Box<dyn PcmSink + '_> =
                    Box::new(WavFile::new(&mut out, rate).map_err(io)?);
                let gap = vec![0i16; (SENTENCE_PAUSE * rate as f32).round() as usize];
                let speaker = v.synth.vits().speaker_offsets(cfg.default_speaker)?;
                let mut first = true;
                v.synth.speak(
                    sentences.into_iter().map(Ok),
                    speaker.as_ref(),
                    &scales,
                    &mut rng,
                    &mut |s, audio, _| {
                        if !first && !s.continues {
                            sink.write(&gap).map_err(io)?;
                        }
                        first = false;
                        sink.write(&wav::to_pcm16(&audio, true)).map_err(io)?;
                        Ok(())
                    },
                )?;
                sink.finish().map_err(io)?;
            }
            Ok(out.into_inner())
        })
        .await??;
    Ok(([(header::CONTENT_TYPE, "audio/wav")], wav_bytes).into_response())
}
