//! `--prompt-cache FILE`: the state of a sequence after a prompt, saved so
//! that a later run whose prompt starts the same way loads it instead of
//! prefilling that part again (llama.cpp's option of the same name).
//!
//! The file, little-endian:
//!
//! ```text
//! magic "LFMPCACH", version u32 (1), model fingerprint u64
//! tokens: count u32, ids [u32]
//! state: pos u64, layers u32, per layer kind u8 (0 kv, 1 conv),
//!        then kv: floats u64, k [f32], v [f32]; conv: floats u64, [f32]
//! checksum u64 (FNV-1a of everything before it)
//! ```
//!
//! The fingerprint ties the file to the model (its config and the size and
//! first and last MiB of every weight file), so a cache made by another
//! model is refused rather than read as garbage, as is a file that is
//! truncated, damaged or of another version.

use crate::error::{Error, Result};
use crate::models::llm::{LayerState, LlmConfig, SeqState};
use std::path::Path;

const MAGIC: &[u8; 8] = b"LFMPCACH";
const VERSION: u32 = 1;

/// A cached prompt: its tokens and the state after them.
pub struct PromptCache {
    pub tokens: Vec<u32>,
    pub state: SeqState,
}

/// FNV-1a, 64 bits: a stable hash with no dependency.
struct Fnv(u64);

impl Fnv {
    fn new() -> Fnv {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
    fn bytes(&mut self, b: &[u8]) {
        for &x in b {
            self.0 ^= x as u64;
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }
}

/// What a cache is tied to: the config and the weight files (size, first
/// and last MiB each; for a directory its files, sorted by name).
pub fn model_fingerprint(model: &Path, cfg: &LlmConfig) -> Result<u64> {
    let mut h = Fnv::new();
    h.bytes(format!("{cfg:?}").as_bytes());
    let mut files = Vec::new();
    if model.is_dir() {
        let rd = std::fs::read_dir(model).map_err(|e| Error::io(model, e))?;
        for e in rd {
            let p = e.map_err(|e| Error::io(model, e))?.path();
            let ext = p.extension().and_then(|e| e.to_str()).unwrap_or("");
            if matches!(ext, "safetensors" | "gguf" | "json") {
                files.push(p);
            }
        }
        files.sort();
    } else {
        files.push(model.to_path_buf());
    }
    const SPAN: u64 = 1 << 20;
    for f in files {
        use std::io::{Read, Seek, SeekFrom};
        let mut file = std::fs::File::open(&f).map_err(|e| Error::io(&f, e))?;
        let len = file.metadata().map_err(|e| Error::io(&f, e))?.len();
        h.bytes(f.file_name().unwrap_or_default().as_encoded_bytes());
        h.bytes(&len.to_le_bytes());
        let mut buf = vec![0u8; SPAN.min(len) as usize];
        file.read_exact(&mut buf).map_err(|e| Error::io(&f, e))?;
        h.bytes(&buf);
        if len > SPAN {
            file.seek(SeekFrom::Start(len - SPAN.min(len - SPAN)))
                .map_err(|e| Error::io(&f, e))?;
            let mut tail = vec![0u8; SPAN.min(len - SPAN) as usize];
            file.read_exact(&mut tail).map_err(|e| Error::io(&f, e))?;
            h.bytes(&tail);
        }
    }
    Ok(h.0)
}

impl PromptCache {
    /// The file's bytes.
    pub fn encode(&self, fingerprint: u64) -> Vec<u8> {
        let floats: usize = self
            .state
            .layers
            .iter()
            .map(|l| match l {
                LayerState::Kv { k, v } => k.len() + v.len(),
                LayerState::Conv(c) => c.len(),
            })
            .sum();
        let mut b = Vec::with_capacity(64 + 4 * self.tokens.len() + 4 * floats);
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&VERSION.to_le_bytes());
        b.extend_from_slice(&fingerprint.to_le_bytes());
        b.extend_from_slice(&(self.tokens.len() as u32).to_le_bytes());
        for t in &self.tokens {
            b.extend_from_slice(&t.to_le_bytes());
        }
        b.extend_from_slice(&(self.state.pos as u64).to_le_bytes());
        b.extend_from_slice(&(self.state.layers.len() as u32).to_le_bytes());
        let put = |b: &mut Vec<u8>, v: &[f32]| b.extend_from_slice(bytemuck::cast_slice(v));
        for l in &self.state.layers {
            match l {
                LayerState::Kv { k, v } => {
                    b.push(0);
                    b.extend_from_slice(&(k.len() as u64).to_le_bytes());
                    put(&mut b, k);
                    put(&mut b, v);
                }
                LayerState::Conv(c) => {
                    b.push(1);
                    b.extend_from_slice(&(c.len() as u64).to_le_bytes());
                    put(&mut b, c);
                }
            }
        }
        let mut h = Fnv::new();
        h.bytes(&b);
        b.extend_from_slice(&h.0.to_le_bytes());
        b
    }

    /// Reads a cache file; an error names the file and what is wrong with
    /// it (not a cache, another version, another model, damaged), and the
    /// state is checked against `cfg`.
    pub fn read(path: &Path, fingerprint: u64, cfg: &LlmConfig) -> Result<PromptCache> {
        let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        let bad = |what: &str| Error::format(path, format!("prompt cache: {what}"));
        if bytes.len() < MAGIC.len() + 12 || &bytes[..8] != MAGIC {
            return Err(bad("not an lfm prompt cache"));
        }
        let version = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
        if version != VERSION {
            return Err(bad(&format!(
                "version {version}, this build reads version {VERSION}"
            )));
        }
        if bytes.len() < 28 {
            return Err(bad("truncated"));
        }
        let (body, sum) = bytes.split_at(bytes.len() - 8);
        let mut h = Fnv::new();
        h.bytes(body);
        if h.0 != u64::from_le_bytes(sum.try_into().expect("8 bytes")) {
            return Err(bad("damaged or truncated (checksum mismatch)"));
        }
        let fp = u64::from_le_bytes(body[12..20].try_into().expect("8 bytes"));
        if fp != fingerprint {
            return Err(bad(
                "made with another model (delete it or pass another --prompt-cache path)",
            ));
        }
        let mut r = Reader {
            b: body,
            at: 20,
            bad: &bad,
        };
        let n = r.u32()? as usize;
        let tokens = r.u32s(n)?;
        let pos = r.u64()? as usize;
        let layers = r.u32()? as usize;
        if layers != cfg.layers.len() {
            return Err(bad(&format!(
                "{layers} layers, the model has {}",
                cfg.layers.len()
            )));
        }
        let mut out = Vec::with_capacity(layers);
        for _ in 0..layers {
            let kind = r.u8()?;
            let len = r.u64()? as usize;
            out.push(match kind {
                0 => LayerState::Kv {
                    k: r.f32s(len)?,
                    v: r.f32s(len)?,
                },
                1 => LayerState::Conv(r.f32s(len)?),
                k => return Err(bad(&format!("unknown layer kind {k}"))),
            });
        }
        if r.at != body.len() {
            return Err(bad("trailing bytes"));
        }
        let state = SeqState { pos, layers: out };
        state
            .check(cfg, &path.display().to_string())
            .map_err(|e| bad(&e.to_string()))?;
        if tokens.len() != pos {
            return Err(bad(&format!("{} tokens for {pos} positions", tokens.len())));
        }
        Ok(PromptCache { tokens, state })
    }
}

/// Reads fields, checking every length against what is left of the file
/// before allocating.
struct Reader<'a> {
    b: &'a [u8],
    at: usize,
    bad: &'a dyn Fn(&str) -> Error,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8]> {
        if n > self.b.len() - self.at {
            return Err((self.bad)("truncated"));
        }
        let s = &self.b[self.at..self.at + n];
        self.at += n;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4")))
    }
    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8")))
    }
    fn u32s(&mut self, n: usize) -> Result<Vec<u32>> {
        let bytes = self.take(n.checked_mul(4).ok_or_else(|| (self.bad)("truncated"))?)?;
        Ok(bytemuck::pod_collect_to_vec(bytes))
    }
    fn f32s(&mut self, n: usize) -> Result<Vec<f32>> {
        let bytes = self.take(n.checked_mul(4).ok_or_else(|| (self.bad)("truncated"))?)?;
        Ok(bytemuck::pod_collect_to_vec(bytes))
    }
}

/// The longest common prefix of two token lists.
pub fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::llm::LayerKind;

    fn cfg() -> LlmConfig {
        LlmConfig {
            hidden: 4,
            heads: 1,
            kv_heads: 1,
            head_dim: 2,
            vocab: 10,
            context: 16,
            conv_kernel: 3,
            layers: vec![LayerKind::Attention, LayerKind::Conv],
            ..Default::default()
        }
    }

    #[test]
    fn a_cache_round_trips_and_damage_is_refused() {
        let dir = std::env::temp_dir().join(format!("lfm-pcache-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("c.bin");
        let pc = PromptCache {
            tokens: vec![1, 2, 3],
            state: SeqState {
                pos: 3,
                layers: vec![
                    LayerState::Kv {
                        k: vec![0.5; 6],
                        v: vec![-1.0; 6],
                    },
                    LayerState::Conv(vec![2.0; 8]),
                ],
            },
        };
        let bytes = pc.encode(42);
        std::fs::write(&path, &bytes).unwrap();
        let back = PromptCache::read(&path, 42, &cfg()).unwrap();
        assert_eq!((back.tokens, back.state), (pc.tokens, pc.state));
        let err = |b: &[u8], fp: u64| {
            std::fs::write(&path, b).unwrap();
            PromptCache::read(&path, fp, &cfg())
                .err()
                .unwrap()
                .to_string()
        };
        assert!(err(&bytes, 7).contains("another model"));
        let mut flipped = bytes.clone();
        flipped[40] ^= 1;
        assert!(err(&flipped, 42).contains("checksum"));
        assert!(err(&bytes[..30], 42).contains("checksum"));
        assert!(err(b"hello", 42).contains("not an lfm prompt cache"));
        let mut v2 = bytes.clone();
        v2[8] = 2;
        assert!(err(&v2, 42).contains("version 2"));
        for e in [err(&bytes, 7), err(b"x", 42)] {
            assert!(e.contains("c.bin"), "{e}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
