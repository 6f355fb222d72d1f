//! NumPy `.npy` arrays (format versions 1-3): little-endian f32 or f64,
//! C order. Enough for small constant tables such as Whisper's mel filters.
//!
//! Layout: `\x93NUMPY`, u8 major, u8 minor, header length (u16 in v1, u32
//! after), an ASCII Python dict literal with `descr`, `fortran_order` and
//! `shape`, then the raw data.

use crate::error::{Error, Result};
use std::path::Path;

/// An array read as f32, with its shape.
#[derive(Clone, Debug, PartialEq)]
pub struct Array {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

pub fn read(path: impl AsRef<Path>) -> Result<Array> {
    let path = path.as_ref();
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    parse(&bytes).map_err(|what| Error::format(path, what))
}

/// Parses the bytes of a `.npy` file; the error says what was wrong.
pub fn parse(bytes: &[u8]) -> std::result::Result<Array, String> {
    let rest = bytes
        .strip_prefix(b"\x93NUMPY")
        .ok_or("not a .npy file (bad magic)")?;
    let (&major, rest) = rest.split_first().ok_or("truncated header")?;
    let (_minor, rest) = rest.split_first().ok_or("truncated header")?;
    let (header_len, rest) = match major {
        1 if rest.len() >= 2 => (u16::from_le_bytes([rest[0], rest[1]]) as usize, &rest[2..]),
        2 | 3 if rest.len() >= 4 => (
            u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize,
            &rest[4..],
        ),
        1..=3 => return Err("truncated header".into()),
        v => return Err(format!("unsupported .npy version {v}")),
    };
    if header_len > rest.len() {
        return Err(format!(
            "header of {header_len} bytes but only {} follow",
            rest.len()
        ));
    }
    let header = std::str::from_utf8(&rest[..header_len]).map_err(|_| "header is not text")?;
    let data = &rest[header_len..];
    let descr = dict_value(header, "descr")?;
    let elem = match descr.trim_matches(|c| c == '\'' || c == '"') {
        "<f4" => 4,
        "<f8" => 8,
        other => return Err(format!("dtype {other} (only <f4 and <f8 are read)")),
    };
    if dict_value(header, "fortran_order")? != "False" {
        return Err("Fortran-ordered arrays are not read".into());
    }
    let shape_text = dict_value(header, "shape")?;
    let shape = shape_text
        .trim_start_matches('(')
        .trim_end_matches(')')
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<usize>()
                .map_err(|_| format!("bad shape {shape_text}"))
        })
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let numel = shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| format!("shape {shape:?} overflows"))?;
    if numel.checked_mul(elem) != Some(data.len()) {
        return Err(format!(
            "shape {shape:?} needs {} data bytes, file has {}",
            numel.saturating_mul(elem),
            data.len()
        ));
    }
    let data = if elem == 4 {
        data.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    } else {
        data.chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().expect("chunk of 8")) as f32)
            .collect()
    };
    Ok(Array { shape, data })
}

/// The text of `'key': value` in a Python dict literal, up to the next
/// top-level comma (a shape tuple keeps its commas).
fn dict_value<'a>(header: &'a str, key: &str) -> std::result::Result<&'a str, String> {
    let pat = format!("'{key}':");
    let start = header
        .find(&pat)
        .ok_or_else(|| format!("header has no {key}"))?
        + pat.len();
    let s = header[start..].trim_start();
    let end = if s.starts_with('(') {
        s.find(')').map(|i| i + 1)
    } else {
        s.find([',', '}'])
    }
    .ok_or_else(|| format!("header: unterminated {key}"))?;
    Ok(s[..end].trim())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn npy(header: &str, data: &[u8]) -> Vec<u8> {
        let mut out = b"\x93NUMPY\x01\x00".to_vec();
        out.extend((header.len() as u16).to_le_bytes());
        out.extend(header.as_bytes());
        out.extend(data);
        out
    }

    #[test]
    fn reads_f32_and_f64() {
        let data: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        let a = parse(&npy(
            "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }\n",
            &data,
        ))
        .unwrap();
        assert_eq!(a.shape, vec![2, 3]);
        assert_eq!(a.data, vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let d: Vec<u8> = [0.5f64].iter().flat_map(|x| x.to_le_bytes()).collect();
        let a = parse(&npy(
            "{'descr': '<f8', 'fortran_order': False, 'shape': (1,), }",
            &d,
        ))
        .unwrap();
        assert_eq!((a.shape, a.data), (vec![1], vec![0.5]));
    }

    #[test]
    fn refuses_bad_files() {
        let h = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
        assert!(parse(b"PK\x03\x04").is_err());
        assert!(parse(&npy(h, &[0; 20])).is_err(), "short data");
        assert!(parse(&npy(&h.replace("<f4", "<i8"), &[0; 48])).is_err());
        assert!(parse(&npy(&h.replace("False", "True"), &[0; 24])).is_err());
        let huge =
            "{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296, 8), }";
        assert!(parse(&npy(huge, &[])).is_err());
        let mut cut = npy(h, &[0; 24]);
        cut.truncate(12);
        assert!(parse(&cut).is_err());
    }
}
