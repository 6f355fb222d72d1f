//! Images in and out: decoding PNG and JPEG into 8-bit RGB the way
//! rapid-layout's loader does, OpenCV's bilinear resize reproduced bit for
//! bit, and drawing labelled boxes with a small built-in bitmap font.

use crate::error::{Error, Result};
use crate::util::atomic_write;
use std::path::Path;

/// The largest decoded image accepted (about 170 megapixels of RGB): a
/// page scanned at 600 dpi needs 100 MiB, and an absurd or hostile header
/// fails cleanly instead of exhausting memory. Everything larger than the
/// model input is downscaled to it.
pub const MAX_DECODE_BYTES: u64 = 512 << 20;

/// An 8-bit RGB image, rows top to bottom, pixels interleaved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rgb8 {
    pub width: usize,
    pub height: usize,
    /// [height, width, 3]
    pub data: Vec<u8>,
}

impl Rgb8 {
    pub fn new(width: usize, height: usize, data: Vec<u8>) -> Rgb8 {
        assert_eq!(
            data.len(),
            width * height * 3,
            "Rgb8: data is not [h, w, 3]"
        );
        Rgb8 {
            width,
            height,
            data,
        }
    }
}

/// Reads a PNG or JPEG file (format from its contents), applies its EXIF
/// orientation and flattens it to RGB as rapid-layout does: gray is
/// replicated; gray+alpha keeps the gray where alpha is non-zero and adds
/// the inverse alpha (saturating); RGBA is blended over white or black,
/// whichever contrasts with the image's mean luminance. 16-bit images are
/// reduced to 8 bits.
/// True when the JPEG file at `path` has its end-of-image marker (FF D9) in
/// its last 4 KiB (some writers pad after it). The marker cannot occur in
/// the entropy-coded data, where every FF byte is followed by 00.
fn jpeg_has_end(path: &Path) -> Result<bool> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let len = f.metadata().map_err(|e| Error::io(path, e))?.len();
    let tail_len = len.min(4096);
    f.seek(SeekFrom::Start(len - tail_len))
        .map_err(|e| Error::io(path, e))?;
    let mut tail = vec![0u8; tail_len as usize];
    f.read_exact(&mut tail).map_err(|e| Error::io(path, e))?;
    Ok(tail.windows(2).any(|w| w == [0xFF, 0xD9]))
}

pub fn load(path: &Path) -> Result<Rgb8> {
    use image::{DynamicImage, ImageDecoder, ImageReader};
    use std::io::{BufRead, BufReader};
    let bad = |what: String| Error::format(path, what);
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let mut input = BufReader::new(file);
    // The format comes from the contents, not the file name.
    let head = input.fill_buf().map_err(|e| Error::io(path, e))?;
    let format = match image::guess_format(head) {
        Ok(f @ (image::ImageFormat::Png | image::ImageFormat::Jpeg)) => f,
        Ok(other) => {
            return Err(bad(format!(
                "a {other:?} image; only PNG and JPEG are supported"
            )))
        }
        Err(_) if head.is_empty() => return Err(bad("the file is empty".into())),
        Err(_) => return Err(bad("not a PNG or JPEG image".into())),
    };
    if format == image::ImageFormat::Jpeg && !jpeg_has_end(path)? {
        // The decoder fills what is missing with grey and says nothing.
        return Err(bad(
            "the JPEG data ends early (no end-of-image marker): a truncated file?".into(),
        ));
    }
    let mut reader = ImageReader::with_format(input, format);
    let mut limits = image::Limits::default();
    limits.max_alloc = Some(MAX_DECODE_BYTES);
    reader.limits(limits);
    let mut decoder = reader.into_decoder().map_err(|e| bad(image_error(e)))?;
    let (w, h) = decoder.dimensions();
    if w == 0 || h == 0 {
        return Err(bad(format!("the image is empty ({w}x{h} pixels)")));
    }
    // The decoders allocate the whole image at once: check its size first.
    if decoder.total_bytes() > MAX_DECODE_BYTES {
        return Err(bad(format!(
            "the image is too large: {w}x{h} pixels need {} MiB decoded, over the {} MiB limit",
            decoder.total_bytes() >> 20,
            MAX_DECODE_BYTES >> 20
        )));
    }
    let orientation = decoder.orientation().map_err(|e| bad(image_error(e)))?;
    let mut img = DynamicImage::from_decoder(decoder).map_err(|e| bad(image_error(e)))?;
    img.apply_orientation(orientation);
    let (width, height) = (img.width() as usize, img.height() as usize);
    let data = match img {
        DynamicImage::ImageRgb8(i) => i.into_raw(),
        DynamicImage::ImageLuma8(i) => gray_to_rgb(i.as_raw()),
        DynamicImage::ImageLumaA8(i) => gray_alpha_to_rgb(i.as_raw()),
        DynamicImage::ImageRgba8(i) => rgba_to_rgb(i.as_raw()),
        DynamicImage::ImageLuma16(_) => gray_to_rgb(img.to_luma8().as_raw()),
        DynamicImage::ImageLumaA16(_) => gray_alpha_to_rgb(img.to_luma_alpha8().as_raw()),
        DynamicImage::ImageRgb16(_) | DynamicImage::ImageRgb32F(_) => img.to_rgb8().into_raw(),
        _ => rgba_to_rgb(img.to_rgba8().as_raw()),
    };
    Ok(Rgb8::new(width, height, data))
}

/// An image's (width, height) from its header, without decoding it.
pub fn dimensions(path: &Path) -> Result<(usize, usize)> {
    let (w, h) = image::ImageReader::open(path)
        .map_err(|e| Error::io(path, e))?
        .with_guessed_format()
        .map_err(|e| Error::io(path, e))?
        .into_dimensions()
        .map_err(|e| Error::format(path, image_error(e)))?;
    Ok((w as usize, h as usize))
}

fn image_error(e: image::ImageError) -> String {
    match e {
        image::ImageError::Limits(_) => format!(
            "the image is too large to decode within {} MiB ({e})",
            MAX_DECODE_BYTES >> 20
        ),
        image::ImageError::Unsupported(u) => format!("unsupported image: {u}"),
        other => format!("cannot decode the image: {other}"),
    }
}

fn gray_to_rgb(g: &[u8]) -> Vec<u8> {
    g.iter().flat_map(|&v| [v, v, v]).collect()
}

/// rapid-layout: `(gray & alpha mask) + (255 - alpha)`, saturating.
fn gray_alpha_to_rgb(la: &[u8]) -> Vec<u8> {
    la.chunks_exact(2)
        .flat_map(|p| {
            let kept = if p[1] != 0 { p[0] } else { 0 };
            let v = kept.saturating_add(255 - p[1]);
            [v, v, v]
        })
        .collect()
}

/// rapid-layout: blend over white when the visible pixels are dark on
/// average (luminance < 128), over black otherwise; white when nothing is
/// visible. Same f32 arithmetic and truncation as its NumPy code.
fn rgba_to_rgb(rgba: &[u8]) -> Vec<u8> {
    let (mut sum, mut count) = (0f64, 0usize);
    for p in rgba.chunks_exact(4).filter(|p| p[3] > 0) {
        sum += 0.299 * p[0] as f64 + 0.587 * p[1] as f64 + 0.114 * p[2] as f64;
        count += 1;
    }
    let bg: f32 = if count == 0 || sum / (count as f64) < 128.0 {
        255.0
    } else {
        0.0
    };
    rgba.chunks_exact(4)
        .flat_map(|p| {
            let a = p[3] as f32 / 255.0;
            let blend = |c: u8| (c as f32 * a + bg * (1.0 - a)) as u8;
            [blend(p[0]), blend(p[1]), blend(p[2])]
        })
        .collect()
}

/// OpenCV's `cv2.resize(..., interpolation=INTER_LINEAR)` on 8-bit images,
/// reproduced exactly: half-pixel centres, coefficients rounded to 11-bit
/// fixed point, a horizontal pass into 32-bit sums, then the vertical pass
/// as OpenCV's SIMD code computes it (each sum shifted right by 4, a 16-bit
/// high multiply per row, the two added and rounded with `(v + 2) >> 2`).
/// That vertical rounding is what OpenCV's x86 and ARM builds run for every
/// row whose width * channels is a multiple of 16, as for every model input
/// here; checked against OpenCV 5.0 by the layout fixture.
///
/// src: [h, w, channels] -> [dh, dw, channels].
pub fn resize_linear(
    src: &[u8],
    w: usize,
    h: usize,
    channels: usize,
    dw: usize,
    dh: usize,
) -> Vec<u8> {
    assert_eq!(
        src.len(),
        w * h * channels,
        "resize_linear: src is not [h, w, c]"
    );
    assert!(
        w > 0 && h > 0 && dw > 0 && dh > 0,
        "resize_linear: empty image"
    );
    let (xofs, xalpha) = linear_coefficients(w, dw, true);
    let (yofs, ybeta) = linear_coefficients(h, dh, false);
    let row_len = dw * channels;
    // Horizontal pass of one source row: sums scaled by 2^11.
    let hresize = |sy: usize, out: &mut [i32]| {
        let row = &src[sy * w * channels..(sy + 1) * w * channels];
        for dx in 0..dw {
            // Clamped along x: never negative, at most w - 1.
            let sx = xofs[dx] as usize;
            let sx1 = (sx + 1).min(w - 1);
            let [a0, a1] = xalpha[dx];
            for c in 0..channels {
                out[dx * channels + c] =
                    row[sx * channels + c] as i32 * a0 + row[sx1 * channels + c] as i32 * a1;
            }
        }
    };
    let mut out = vec![0u8; dh * row_len];
    let (mut r0, mut r1) = (vec![0i32; row_len], vec![0i32; row_len]);
    let mut cached: [Option<usize>; 2] = [None, None];
    for dy in 0..dh {
        let sy0 = yofs[dy].clamp(0, h as isize - 1) as usize;
        let sy1 = (yofs[dy] + 1).clamp(0, h as isize - 1) as usize;
        // Rows advance monotonically: reuse what the previous output row had.
        if cached[0] != Some(sy0) {
            if cached[1] == Some(sy0) {
                std::mem::swap(&mut r0, &mut r1);
                cached[1] = None;
            } else {
                hresize(sy0, &mut r0);
            }
            cached[0] = Some(sy0);
        }
        if cached[1] != Some(sy1) {
            hresize(sy1, &mut r1);
            cached[1] = Some(sy1);
        }
        let [b0, b1] = ybeta[dy];
        let fix = |v: i32| (v >> 4).clamp(i16::MIN as i32, i16::MAX as i32);
        for (i, o) in out[dy * row_len..(dy + 1) * row_len].iter_mut().enumerate() {
            let m0 = (fix(r0[i]) * b0) >> 16;
            let m1 = (fix(r1[i]) * b1) >> 16;
            let sum = (m0 + m1).clamp(i16::MIN as i32, i16::MAX as i32);
            *o = ((sum + 2) >> 2).clamp(0, 255) as u8;
        }
    }
    out
}

/// OpenCV's source offsets and fixed-point weights for one axis of a
/// linear resize. Along x the edges are clamped (weight 1 on the edge
/// pixel); along y only the row indices are clamped, the weights are not.
fn linear_coefficients(n: usize, dn: usize, clamp: bool) -> (Vec<isize>, Vec<[i32; 2]>) {
    let scale = 1.0 / (dn as f64 / n as f64);
    let fixed = |v: f32| (v * 2048.0).round_ties_even() as i32;
    (0..dn)
        .map(|d| {
            let f = ((d as f64 + 0.5) * scale - 0.5) as f32;
            let mut s = f.floor() as isize;
            let mut f = f - s as f32;
            if clamp && s < 0 {
                (s, f) = (0, 0.0);
            }
            if clamp && s >= n as isize - 1 {
                (s, f) = (n as isize - 1, 0.0);
            }
            (s, [fixed(1.0 - f), fixed(f)])
        })
        .unzip()
}

/// Writes `img` as PNG, or JPEG when the path ends in .jpg/.jpeg, through a
/// temporary file so an existing file is never left half-written.
pub fn save(path: &Path, img: &Rgb8, overwrite: bool) -> Result<()> {
    use image::ImageEncoder;
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    let mut bytes = Vec::new();
    let (w, h) = (img.width as u32, img.height as u32);
    let encoded = match ext.as_deref() {
        Some("jpg" | "jpeg") => image::codecs::jpeg::JpegEncoder::new_with_quality(&mut bytes, 90)
            .write_image(&img.data, w, h, image::ExtendedColorType::Rgb8),
        _ => image::codecs::png::PngEncoder::new(&mut bytes).write_image(
            &img.data,
            w,
            h,
            image::ExtendedColorType::Rgb8,
        ),
    };
    encoded.map_err(|e| Error::format(path, format!("cannot encode the image: {e}")))?;
    atomic_write::write_atomic(path, &bytes, overwrite)
}

/// Fills the rectangle [x0, x1) x [y0, y1), clipped to the image.
pub fn fill_rect(img: &mut Rgb8, x0: i64, y0: i64, x1: i64, y1: i64, color: [u8; 3]) {
    let (x0, x1) = (x0.max(0) as usize, (x1.max(0) as usize).min(img.width));
    let (y0, y1) = (y0.max(0) as usize, (y1.max(0) as usize).min(img.height));
    for y in y0..y1 {
        for x in x0..x1 {
            img.data[(y * img.width + x) * 3..][..3].copy_from_slice(&color);
        }
    }
}

/// Outlines [x0, x1) x [y0, y1) with lines `thickness` pixels wide, inside
/// the rectangle.
pub fn draw_rect(
    img: &mut Rgb8,
    x0: i64,
    y0: i64,
    x1: i64,
    y1: i64,
    thickness: i64,
    color: [u8; 3],
) {
    let t = thickness.max(1);
    fill_rect(img, x0, y0, x1, (y0 + t).min(y1), color);
    fill_rect(img, x0, (y1 - t).max(y0), x1, y1, color);
    fill_rect(img, x0, y0, (x0 + t).min(x1), y1, color);
    fill_rect(img, (x1 - t).max(x0), y0, x1, y1, color);
}

/// Glyph cells of the built-in font: 5x7 pixels plus one column and one
/// row of spacing.
pub const GLYPH_W: i64 = 6;
pub const GLYPH_H: i64 = 8;

/// Size in pixels of `text` drawn at `scale`.
pub fn text_size(text: &str, scale: i64) -> (i64, i64) {
    (
        text.chars().count() as i64 * GLYPH_W * scale,
        GLYPH_H * scale,
    )
}

/// Draws `text` with its top-left corner at (x, y), each font pixel a
/// `scale` x `scale` square. Upper case is drawn as lower case; characters
/// the font lacks are drawn as '?'.
pub fn draw_text(img: &mut Rgb8, x: i64, y: i64, text: &str, scale: i64, color: [u8; 3]) {
    for (i, ch) in text.chars().enumerate() {
        let rows = glyph(ch.to_ascii_lowercase());
        let gx = x + i as i64 * GLYPH_W * scale;
        for (r, bits) in rows.iter().enumerate() {
            for c in 0..5 {
                if bits & (0b10000 >> c) != 0 {
                    let (px, py) = (gx + c * scale, y + r as i64 * scale);
                    fill_rect(img, px, py, px + scale, py + scale, color);
                }
            }
        }
    }
}

/// A 5x7 bitmap per character (rows top to bottom, bit 4 leftmost): enough
/// for class names, scores and percentages.
fn glyph(c: char) -> [u8; 7] {
    match c {
        'a' => [
            0b00000, 0b00000, 0b01110, 0b00001, 0b01111, 0b10001, 0b01111,
        ],
        'b' => [
            0b10000, 0b10000, 0b10110, 0b11001, 0b10001, 0b10001, 0b11110,
        ],
        'c' => [
            0b00000, 0b00000, 0b01110, 0b10000, 0b10000, 0b10001, 0b01110,
        ],
        'd' => [
            0b00001, 0b00001, 0b01101, 0b10011, 0b10001, 0b10001, 0b01111,
        ],
        'e' => [
            0b00000, 0b00000, 0b01110, 0b10001, 0b11111, 0b10000, 0b01110,
        ],
        'f' => [
            0b00110, 0b01001, 0b01000, 0b11100, 0b01000, 0b01000, 0b01000,
        ],
        'g' => [
            0b00000, 0b01111, 0b10001, 0b10001, 0b01111, 0b00001, 0b01110,
        ],
        'h' => [
            0b10000, 0b10000, 0b10110, 0b11001, 0b10001, 0b10001, 0b10001,
        ],
        'i' => [
            0b00100, 0b00000, 0b01100, 0b00100, 0b00100, 0b00100, 0b01110,
        ],
        'j' => [
            0b00010, 0b00000, 0b00110, 0b00010, 0b00010, 0b10010, 0b01100,
        ],
        'k' => [
            0b10000, 0b10000, 0b10010, 0b10100, 0b11000, 0b10100, 0b10010,
        ],
        'l' => [
            0b01100, 0b00100, 0b00100, 0b00100, 0b00100, 0b00100, 0b01110,
        ],
        'm' => [
            0b00000, 0b00000, 0b11010, 0b10101, 0b10101, 0b10001, 0b10001,
        ],
        'n' => [
            0b00000, 0b00000, 0b10110, 0b11001, 0b10001, 0b10001, 0b10001,
        ],
        'o' => [
            0b00000, 0b00000, 0b01110, 0b10001, 0b10001, 0b10001, 0b01110,
        ],
        'p' => [
            0b00000, 0b00000, 0b11110, 0b10001, 0b11110, 0b10000, 0b10000,
        ],
        'q' => [
            0b00000, 0b00000, 0b01101, 0b10011, 0b01111, 0b00001, 0b00001,
        ],
        'r' => [
            0b00000, 0b00000, 0b10110, 0b11001, 0b10000, 0b10000, 0b10000,
        ],
        's' => [
            0b00000, 0b00000, 0b01110, 0b10000, 0b01110, 0b00001, 0b11110,
        ],
        't' => [
            0b01000, 0b01000, 0b11100, 0b01000, 0b01000, 0b01001, 0b00110,
        ],
        'u' => [
            0b00000, 0b00000, 0b10001, 0b10001, 0b10001, 0b10011, 0b01101,
        ],
        'v' => [
            0b00000, 0b00000, 0b10001, 0b10001, 0b10001, 0b01010, 0b00100,
        ],
        'w' => [
            0b00000, 0b00000, 0b10001, 0b10001, 0b10101, 0b10101, 0b01010,
        ],
        'x' => [
            0b00000, 0b00000, 0b10001, 0b01010, 0b00100, 0b01010, 0b10001,
        ],
        'y' => [
            0b00000, 0b00000, 0b10001, 0b10001, 0b01111, 0b00001, 0b01110,
        ],
        'z' => [
            0b00000, 0b00000, 0b11111, 0b00010, 0b00100, 0b01000, 0b11111,
        ],
        '0' => [
            0b01110, 0b10001, 0b10011, 0b10101, 0b11001, 0b10001, 0b01110,
        ],
        '1' => [
            0b00100, 0b01100, 0b00100, 0b00100, 0b00100, 0b00100, 0b01110,
        ],
        '2' => [
            0b01110, 0b10001, 0b00001, 0b00010, 0b00100, 0b01000, 0b11111,
        ],
        '3' => [
            0b11111, 0b00010, 0b00100, 0b00010, 0b00001, 0b10001, 0b01110,
        ],
        '4' => [
            0b00010, 0b00110, 0b01010, 0b10010, 0b11111, 0b00010, 0b00010,
        ],
        '5' => [
            0b11111, 0b10000, 0b11110, 0b00001, 0b00001, 0b10001, 0b01110,
        ],
        '6' => [
            0b00110, 0b01000, 0b10000, 0b11110, 0b10001, 0b10001, 0b01110,
        ],
        '7' => [
            0b11111, 0b00001, 0b00010, 0b00100, 0b01000, 0b01000, 0b01000,
        ],
        '8' => [
            0b01110, 0b10001, 0b10001, 0b01110, 0b10001, 0b10001, 0b01110,
        ],
        '9' => [
            0b01110, 0b10001, 0b10001, 0b01111, 0b00001, 0b00010, 0b01100,
        ],
        '.' => [
            0b00000, 0b00000, 0b00000, 0b00000, 0b00000, 0b01100, 0b01100,
        ],
        '_' => [
            0b00000, 0b00000, 0b00000, 0b00000, 0b00000, 0b00000, 0b11111,
        ],
        '-' => [
            0b00000, 0b00000, 0b00000, 0b11111, 0b00000, 0b00000, 0b00000,
        ],
        '%' => [
            0b11000, 0b11001, 0b00010, 0b00100, 0b01000, 0b10011, 0b00011,
        ],
        ' ' => [0; 7],
        _ => [
            0b01110, 0b10001, 0b00001, 0b00010, 0b00100, 0b00000, 0b00100,
        ],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resize_identity_and_constant() {
        let src: Vec<u8> = (0..5 * 4 * 3).map(|v| (v * 7 % 256) as u8).collect();
        assert_eq!(
            resize_linear(&src, 5, 4, 3, 5, 4),
            src,
            "same size is a copy"
        );
        let flat = vec![200u8; 7 * 9 * 3];
        assert!(resize_linear(&flat, 7, 9, 3, 16, 5)
            .iter()
            .all(|&v| v == 200));
    }

    #[test]
    fn resize_matches_opencv() {
        // A 4x3 gray ramp resized to 8x16 by cv2.resize (OpenCV 5.0,
        // INTER_LINEAR): the first and last rows and a middle one.
        let src: Vec<u8> = (0..12).map(|v| (v * 20) as u8).collect();
        let got = resize_linear(&src, 4, 3, 1, 16, 8);
        assert_eq!(
            &got[..16],
            &[0, 0, 2, 7, 12, 17, 22, 27, 32, 37, 42, 47, 52, 57, 60, 60]
        );
        assert_eq!(
            &got[16 * 3..16 * 4],
            &[65, 65, 67, 72, 77, 82, 87, 92, 97, 102, 107, 112, 117, 122, 125, 125]
        );
        assert_eq!(
            &got[16 * 7..],
            &[160, 160, 162, 167, 172, 177, 182, 187, 192, 197, 202, 207, 212, 217, 220, 220]
        );
    }

    #[test]
    fn alpha_flattening() {
        assert_eq!(
            gray_alpha_to_rgb(&[100, 255, 100, 0, 100, 128]),
            [100, 100, 100, 255, 255, 255, 227, 227, 227]
        );
        // Dark visible pixels: blended over white.
        assert_eq!(
            rgba_to_rgb(&[0, 0, 0, 255, 0, 0, 0, 0]),
            [0, 0, 0, 255, 255, 255]
        );
        // Bright visible pixels: over black.
        assert_eq!(
            rgba_to_rgb(&[250, 250, 250, 128, 9, 9, 9, 0]),
            [125, 125, 125, 0, 0, 0]
        );
    }

    #[test]
    fn drawing_stays_inside_the_image() {
        let mut img = Rgb8::new(20, 10, vec![255; 600]);
        // Partly or wholly outside: clipped, no panic.
        draw_rect(&mut img, -5, -5, 30, 30, 2, [7, 7, 7]);
        draw_rect(&mut img, 50, 50, 60, 60, 2, [7, 7, 7]);
        draw_text(&mut img, 15, 8, "title 0.9%", 3, [9, 9, 9]);
        draw_rect(&mut img, 0, 0, 30, 30, 2, [1, 2, 3]);
        assert_eq!(&img.data[..3], &[1, 2, 3]);
        assert_eq!(
            &img.data[(2 * 20 + 2) * 3..][..3],
            &[255, 255, 255],
            "inside the outline"
        );
        assert_eq!(text_size("ab", 2), (24, 16));
    }
}
