//! Broken checkpoints: each must give an `Err` whose one-line message names
//! the file and says what is wrong, never a panic.

use lfm::formats::gguf::GgufFile;
use lfm::formats::hf::open_checkpoint;
use lfm::formats::safetensors::Safetensors;
use lfm::formats::TensorSource;
use std::path::{Path, PathBuf};

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("lfm-bad-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Writes `bytes` and returns the error `open` gives for them, checking that
/// it is one line starting with the file's path.
fn open_err<T>(
    dir: &Path,
    name: &str,
    bytes: &[u8],
    open: impl Fn(&Path) -> lfm::Result<T>,
) -> String {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    let e = match open(&path) {
        Ok(_) => panic!("{name}: opened without error"),
        Err(e) => e.to_string(),
    };
    assert!(
        e.starts_with(&path.display().to_string()),
        "{name}: error does not name the file: {e}"
    );
    assert!(!e.contains('\n'), "{name}: error is not one line: {e}");
    e
}

/// A GGUF file assembled field by field, so a test can put any value in any
/// field.
#[derive(Clone)]
struct Raw(Vec<u8>);

impl Raw {
    fn header(version: u32, n_tensors: u64, n_kv: u64) -> Raw {
        let mut r = Raw(b"GGUF".to_vec());
        r.u32(version).u64(n_tensors).u64(n_kv);
        r
    }
    fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn str(&mut self, s: &str) -> &mut Self {
        self.u64(s.len() as u64);
        self.0.extend_from_slice(s.as_bytes());
        self
    }
    fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.0.extend_from_slice(b);
        self
    }
    /// A string key/value.
    fn kv_str(&mut self, k: &str, v: &str) -> &mut Self {
        self.str(k).u32(8).str(v)
    }
    /// A tensor info: name, ne (innermost first), type, offset.
    fn tensor(&mut self, name: &str, ne: &[u64], ty: u32, offset: u64) -> &mut Self {
        self.str(name).u32(ne.len() as u32);
        for &d in ne {
            self.u64(d);
        }
        self.u32(ty).u64(offset)
    }
    /// Pads to 32 and appends `n` data bytes.
    fn data(&mut self, n: usize) -> &mut Self {
        let pad = self.0.len().next_multiple_of(32) - self.0.len();
        self.0.extend(std::iter::repeat_n(0u8, pad + n));
        self
    }
}

/// One F32 tensor of 4 values with one metadata string: a valid file.
fn valid() -> Raw {
    let mut r = Raw::header(3, 1, 1);
    r.kv_str("general.architecture", "llama")
        .tensor("w", &[4], 0, 0)
        .data(16);
    r
}

fn gguf_err(dir: &Path, name: &str, bytes: &[u8]) -> String {
    open_err(dir, name, bytes, |p| GgufFile::open(p))
}

#[test]
fn gguf_valid_base_opens() {
    let dir = temp_dir("gguf-ok");
    let path = dir.join("ok.gguf");
    std::fs::write(&path, &valid().0).unwrap();
    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.tensor("w").unwrap().to_f32(), [0.0; 4]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn gguf_header_errors() {
    let d = temp_dir("gguf-header");
    let mut bad_magic = valid();
    bad_magic.0[..4].copy_from_slice(b"GGML");
    let e = gguf_err(&d, "magic.gguf", &bad_magic.0);
    assert!(e.contains("not a GGUF file"), "{e}");

    let e = gguf_err(&d, "short.gguf", b"GGUF\x03\0\0\0");
    assert!(e.contains("8 bytes is too short"), "{e}");

    let e = gguf_err(&d, "empty.gguf", b"");
    assert!(e.contains("0 bytes is too short"), "{e}");

    for (v, want) in [
        (1u32, "unsupported: GGUF version 1"),
        (7, "unsupported: GGUF version 7"),
        (3u32.swap_bytes(), "unsupported: big-endian GGUF"),
    ] {
        let mut r = valid();
        r.0[4..8].copy_from_slice(&v.to_le_bytes());
        let e = gguf_err(&d, &format!("v{v}.gguf"), &r.0);
        assert!(e.contains(want), "{e}");
    }

    let mut r = Raw::header(3, u64::MAX, 0);
    r.data(64);
    let e = gguf_err(&d, "tensor-count.gguf", &r.0);
    assert!(
        e.contains("tensor count at byte 8 is 18446744073709551615, more than the"),
        "{e}"
    );

    let mut r = Raw::header(3, 0, 1 << 40);
    r.data(64);
    let e = gguf_err(&d, "kv-count.gguf", &r.0);
    assert!(
        e.contains("metadata count at byte 16 is 1099511627776"),
        "{e}"
    );
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn gguf_truncated_anywhere_is_an_error() {
    let d = temp_dir("gguf-trunc");
    let full = valid().0;
    // Every cut inside the header, tensor infos and data.
    for cut in 24..full.len() {
        let e = gguf_err(&d, "cut.gguf", &full[..cut]);
        assert!(
            e.contains("truncated")
                || e.contains("runs past the end")
                || e.contains("more than the"),
            "cut at {cut}: {e}"
        );
    }
    let mut r = Raw::header(3, 0, 1);
    r.kv_str("general.architecture", "llama");
    // Cut two bytes into the value type that follows the 20-byte key.
    let e = gguf_err(&d, "cut.gguf", &r.0[..54]);
    assert!(
        e.contains("truncated: metadata 'general.architecture' at byte 52 needs 4 bytes, 2 left"),
        "{e}"
    );
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn gguf_metadata_errors() {
    let d = temp_dir("gguf-meta");
    let mut r = Raw::header(3, 0, 1);
    r.u64(u64::MAX / 2).data(64);
    let e = gguf_err(&d, "keylen.gguf", &r.0);
    assert!(
        e.contains("length of metadata key #0 at byte 24 is 9223372036854775807"),
        "{e}"
    );

    let mut r = Raw::header(3, 0, 1);
    r.str("k").u32(8).u64(1 << 50).data(8);
    let e = gguf_err(&d, "strlen.gguf", &r.0);
    assert!(
        e.contains("length of metadata 'k' at byte 37 is 1125899906842624"),
        "{e}"
    );

    let mut r = Raw::header(3, 0, 1);
    r.str("k").u32(99).data(8);
    let e = gguf_err(&d, "vtype.gguf", &r.0);
    assert!(
        e.contains("metadata 'k' at byte 33: unknown value type 99"),
        "{e}"
    );

    let mut r = Raw::header(3, 0, 1);
    r.str("k").u32(9).u32(6).u64(u64::MAX / 4).data(8);
    let e = gguf_err(&d, "arrlen.gguf", &r.0);
    assert!(
        e.contains("element count of metadata 'k'") && e.contains("more than the"),
        "{e}"
    );

    let mut r = Raw::header(3, 0, 1);
    r.str("k").u32(9).u32(77).u64(1).data(8);
    let e = gguf_err(&d, "arrtype.gguf", &r.0);
    assert!(
        e.contains("element type of metadata 'k'") && e.contains("unknown value type 77"),
        "{e}"
    );

    // Arrays of arrays nested past the limit.
    let mut r = Raw::header(3, 0, 1);
    r.str("k");
    r.u32(9);
    for _ in 0..20 {
        r.u32(9).u64(1);
    }
    r.data(64);
    let e = gguf_err(&d, "nested.gguf", &r.0);
    assert!(e.contains("arrays nested more than 8 deep"), "{e}");

    let mut r = Raw::header(3, 0, 1);
    r.str("k").u32(7).bytes(&[2]).data(8);
    let e = gguf_err(&d, "bool.gguf", &r.0);
    assert!(e.contains("bool value 2 is not 0 or 1"), "{e}");

    let mut r = Raw::header(3, 0, 1);
    r.u64(2).bytes(&[0xff, 0xfe]).u32(4).u32(1).data(8);
    let e = gguf_err(&d, "utf8.gguf", &r.0);
    assert!(
        e.contains("metadata key #0 at byte 32 is not valid UTF-8"),
        "{e}"
    );

    let mut r = Raw::header(3, 0, 2);
    r.kv_str("a", "x").kv_str("a", "y").data(8);
    let e = gguf_err(&d, "dupkey.gguf", &r.0);
    assert!(e.contains("metadata key 'a' appears twice"), "{e}");

    for (name, value) in [("zero", 0u32), ("three", 3)] {
        let mut r = Raw::header(3, 0, 1);
        r.str("general.alignment").u32(4).u32(value).data(8);
        let e = gguf_err(&d, &format!("align-{name}.gguf"), &r.0);
        assert!(
            e.contains("general.alignment must be a u32 power of two"),
            "{e}"
        );
    }
    let mut r = Raw::header(3, 0, 1);
    r.kv_str("general.alignment", "32").data(8);
    let e = gguf_err(&d, "align-str.gguf", &r.0);
    assert!(
        e.contains("general.alignment must be a u32 power of two, got string"),
        "{e}"
    );
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn gguf_tensor_info_errors() {
    let d = temp_dir("gguf-tensor");
    let one = |name: &str, ne: &[u64], ty: u32, offset: u64, data: usize| {
        let mut r = Raw::header(3, 1, 0);
        r.tensor(name, ne, ty, offset).data(data);
        r.0
    };
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "zero-dim",
            one("w", &[4, 0], 0, 0, 64),
            "tensor 'w' has a zero dimension: ne = [4, 0]",
        ),
        (
            "no-dims",
            one("w", &[], 0, 0, 64),
            "tensor 'w' has 0 dimensions (1 to 4 allowed)",
        ),
        (
            "five-dims",
            one("w", &[1; 5], 0, 0, 64),
            "tensor 'w' has 5 dimensions",
        ),
        (
            "unknown-type",
            one("w", &[4], 99, 0, 64),
            "tensor 'w' has unknown type id 99",
        ),
        (
            "iq2",
            one("w", &[256], 16, 0, 64),
            "unsupported: tensor 'w' has type iq2_xxs",
        ),
        (
            "overflow",
            one("w", &[1 << 40, 1 << 40, 1 << 40], 0, 0, 64),
            "overflows",
        ),
        (
            "huge-dim",
            one("w", &[u64::MAX], 0, 0, 64),
            "absurd dimension",
        ),
        (
            "partial-block",
            one("w", &[33], 2, 0, 64),
            "row length 33 is not a multiple of the q4_0 block size 32",
        ),
        (
            "past-end",
            one("w", &[4], 0, 32, 40),
            "tensor 'w' data (16 bytes at offset 32) runs past the end of the file",
        ),
        (
            "offset-huge",
            one("w", &[4], 0, u64::MAX - 31, 64),
            "runs past the end of the file",
        ),
        (
            "misaligned",
            one("w", &[4], 0, 8, 64),
            "tensor 'w' offset 8 is not a multiple of the alignment 32",
        ),
        (
            "too-big",
            one("w", &[1 << 20, 1 << 20], 0, 0, 64),
            "runs past the end of the file",
        ),
    ];
    for (name, bytes, want) in cases {
        let e = gguf_err(&d, &format!("{name}.gguf"), &bytes);
        assert!(e.contains(want), "{name}: {e}");
    }
    let mut r = Raw::header(3, 2, 0);
    r.tensor("w", &[4], 0, 0).tensor("w", &[4], 0, 32).data(64);
    let e = gguf_err(&d, "dup.gguf", &r.0);
    assert!(e.contains("tensor 'w' appears twice"), "{e}");
    std::fs::remove_dir_all(&d).unwrap();
}

/// A safetensors file from a header string and `data` zero bytes.
fn st(header: &str, data: usize) -> Vec<u8> {
    let mut b = (header.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(header.as_bytes());
    b.extend(std::iter::repeat_n(0u8, data));
    b
}

fn st_err(dir: &Path, name: &str, bytes: &[u8]) -> String {
    open_err(dir, name, bytes, |p| Safetensors::open(p))
}

#[test]
fn safetensors_header_errors() {
    let d = temp_dir("st");
    let ok = r#"{"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}}"#;
    let path = d.join("ok.safetensors");
    std::fs::write(&path, st(ok, 16)).unwrap();
    assert_eq!(
        Safetensors::open(&path)
            .unwrap()
            .tensor("w")
            .unwrap()
            .numel(),
        4
    );

    let mut huge = st(ok, 16);
    huge[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("short", b"\x05\0\0".to_vec(), "3 bytes is too short"),
        (
            "header-len",
            huge,
            "header length 18446744073709551615 is more than",
        ),
        ("not-json", st("{\"w\": ", 0), "header is not a JSON object"),
        ("array", st("[1, 2]", 0), "header is not a JSON object"),
        (
            "size-lie",
            st(
                r#"{"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,12]}}"#,
                16,
            ),
            "tensor 'w': F32 [2, 2] is 16 bytes but data_offsets [0, 12] span 12",
        ),
        (
            "past-end",
            st(
                r#"{"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}}"#,
                8,
            ),
            "tensor 'w': data_offsets [0, 16] lie outside the 8 data bytes",
        ),
        (
            "reversed",
            st(
                r#"{"w":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}}"#,
                8,
            ),
            "data_offsets [8, 4] lie outside",
        ),
        (
            "huge-offset",
            st(
                r#"{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,18446744073709551615]}}"#,
                8,
            ),
            "lie outside",
        ),
        (
            "overflow",
            st(
                r#"{"w":{"dtype":"F32","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,8]}}"#,
                8,
            ),
            "tensor 'w': shape [4294967296, 4294967296, 4294967296] overflows",
        ),
        (
            "empty-but-huge",
            st(
                r#"{"w":{"dtype":"F32","shape":[0,4611686018427387904],"data_offsets":[0,0]}}"#,
                0,
            ),
            "tensor 'w': shape [0, 4611686018427387904] overflows",
        ),
        (
            "neg-shape",
            st(
                r#"{"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}"#,
                4,
            ),
            "tensor 'w': shape holds something other than non-negative integers",
        ),
        (
            "no-dtype",
            st(r#"{"w":{"shape":[1],"data_offsets":[0,4]}}"#, 4),
            "tensor 'w': missing or non-string dtype",
        ),
        (
            "bad-offsets",
            st(r#"{"w":{"dtype":"F32","shape":[1],"data_offsets":[0]}}"#, 4),
            "data_offsets is not two non-negative integers",
        ),
        (
            "metadata",
            st(r#"{"__metadata__":{"format":1}}"#, 0),
            "__metadata__ value of 'format' is not a string",
        ),
    ];
    for (name, bytes, want) in cases {
        let e = st_err(&d, &format!("{name}.safetensors"), &bytes);
        assert!(e.contains(want), "{name}: {e}");
    }
    // Shorter than the header length: an empty file (mapped, then refused).
    for (name, bytes) in [("empty", &b""[..]), ("four-bytes", &b"\x01\0\0\0"[..])] {
        let e = st_err(&d, &format!("{name}.safetensors"), bytes);
        assert!(
            e.contains(&format!(
                "{} bytes is too short for a safetensors file",
                bytes.len()
            )),
            "{name}: {e}"
        );
    }
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn sharded_index_errors() {
    let d = temp_dir("index");
    let idx = d.join("model.safetensors.index.json");
    let msg = || open_checkpoint(&d).err().unwrap().to_string();
    std::fs::write(&idx, "{").unwrap();
    let e = msg();
    assert!(
        e.starts_with(&idx.display().to_string()) && e.contains("not JSON"),
        "{e}"
    );
    std::fs::write(&idx, r#"{"metadata": {}}"#).unwrap();
    assert!(msg().contains("no \"weight_map\" object"));
    std::fs::write(&idx, r#"{"weight_map": {"w": "model-1.safetensors"}}"#).unwrap();
    let e = msg();
    assert!(
        e.starts_with(&d.join("model-1.safetensors").display().to_string()),
        "a missing shard is named: {e}"
    );
    std::fs::remove_dir_all(&d).unwrap();
}
