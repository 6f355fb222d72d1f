//! One tensor type over every weight format, and the linear products over it.
//!
//! A [`Tensor`] is a name, an element type, a shape and its bytes. The shape
//! is outermost-first (PyTorch order): a linear weight is `[out, in]` and each
//! of its rows is one contiguous run of blocks. GGUF stores ggml's `ne`
//! (innermost first), which the reader reverses into this order. The bytes
//! are either a range of a memory-mapped file or owned; cloning shares them.
//!
//! [`matvec`] and [`matmul`] compute `y = W x` for any weight type. Each
//! output is the dot product of the dequantised weight row with the input,
//! summed in f32, equal to the reference "dequantise, then `cpu::dot`" up to
//! the order (and fusing) of the f32 operations: [`matvec`] uses the
//! per-type kernels of `quant::fast` (F32 weights go through `cpu::dot`
//! itself, so an F32 matvec equals `cpu::matmul` bit for bit), [`matmul`]
//! dequantises tiles of weight rows and dots them with
//! `quant::fast::dot_tile`.

use crate::error::{Error, Result};
use crate::quant::{self, GgmlType};
use crate::util::par;
use rayon::prelude::*;
use std::sync::Arc;

/// The bytes a format reader shares with its tensors: a memory-mapped file,
/// or bytes already in memory (a browser tab has no files to map).
pub type SharedBytes = Arc<dyn AsRef<[u8]> + Send + Sync>;

#[derive(Clone)]
pub struct Tensor {
    pub name: String,
    pub dtype: GgmlType,
    /// Outermost first; the last dimension is the row length.
    pub shape: Vec<usize>,
    storage: Storage,
}

#[derive(Clone)]
enum Storage {
    Mapped {
        map: SharedBytes,
        offset: usize,
        len: usize,
    },
    Owned(Arc<Vec<u8>>),
    /// Owned bytes with the rows repacked eight at a time for the int8
    /// decode products ([`Tensor::repacked_rows8`], layout in
    /// `quant::fast::rows8`).
    Rows8(Arc<Vec<u8>>),
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tensor")
            .field("name", &self.name)
            .field("dtype", &self.dtype)
            .field("shape", &self.shape)
            .field("bytes", &self.bytes().len())
            .field("mapped", &matches!(self.storage, Storage::Mapped { .. }))
            .field("rows8", &self.is_rows8())
            .finish()
    }
}

/// The byte size of a tensor of `dtype` and `shape`, or why there is none.
/// Refuses shapes whose dimensions, ignoring zeros, multiply past `usize`
/// (so every row count and row size of an accepted tensor is computable).
pub fn tensor_bytes(dtype: GgmlType, shape: &[usize]) -> std::result::Result<usize, String> {
    shape
        .iter()
        .try_fold(dtype.block_bytes(), |acc, &d| acc.checked_mul(d.max(1)))
        .ok_or_else(|| format!("shape {shape:?} overflows"))?;
    let row_len = shape.last().copied().unwrap_or(1);
    let row_bytes = dtype.row_bytes(row_len).ok_or_else(|| {
        format!(
            "row length {row_len} is not a multiple of the {dtype} block size {}",
            dtype.block_size()
        )
    })?;
    let rows: usize = shape[..shape.len().saturating_sub(1)].iter().product();
    Ok(rows * row_bytes)
}

impl Tensor {
    /// A tensor over `len` bytes at `offset` of a mapped file. The caller (a
    /// format reader) has checked the range and the size.
    pub(crate) fn mapped(
        name: String,
        dtype: GgmlType,
        shape: Vec<usize>,
        map: SharedBytes,
        offset: usize,
        len: usize,
    ) -> Tensor {
        debug_assert!(
            offset + len <= (*map).as_ref().len(),
            "{name}: range past the mapping"
        );
        debug_assert_eq!(tensor_bytes(dtype, &shape), Ok(len), "{name}: size");
        Tensor {
            name,
            dtype,
            shape,
            storage: Storage::Mapped { map, offset, len },
        }
    }

    /// A tensor over owned bytes, checked against the type and shape.
    pub fn from_bytes(
        name: impl Into<String>,
        dtype: GgmlType,
        shape: Vec<usize>,
        bytes: Vec<u8>,
    ) -> Result<Tensor> {
        let name = name.into();
        let want = tensor_bytes(dtype, &shape)
            .map_err(|e| Error::invalid(format!("tensor '{name}': {e}")))?;
        if bytes.len() != want {
            return Err(Error::invalid(format!(
                "tensor '{name}': {dtype} {shape:?} needs {want} bytes, got {}",
                bytes.len()
            )));
        }
        Ok(Tensor {
            name,
            dtype,
            shape,
            storage: Storage::Owned(Arc::new(bytes)),
        })
    }

    /// An F32 tensor owning `data` (`data.len()` must be the shape's product).
    pub fn from_f32(name: impl Into<String>, shape: Vec<usize>, data: Vec<f32>) -> Tensor {
        let name = name.into();
        assert_eq!(
            shape.iter().product::<usize>(),
            data.len(),
            "Tensor::from_f32 '{name}': shape {shape:?} does not hold {} values",
            data.len()
        );
        let bytes = bytemuck::cast_slice::<f32, u8>(&data).to_vec();
        Tensor {
            name,
            dtype: GgmlType::F32,
            shape,
            storage: Storage::Owned(Arc::new(bytes)),
        }
    }

    /// Quantises f32 `data` of `shape` row by row into `dtype` (as ggml's
    /// reference quantisers do). Fails when the row length is not a multiple
    /// of the block size.
    pub fn quantize_f32(
        name: impl Into<String>,
        shape: Vec<usize>,
        data: &[f32],
        dtype: GgmlType,
    ) -> Result<Tensor> {
        let name = name.into();
        let numel: usize = shape.iter().product();
        assert_eq!(
            numel,
            data.len(),
            "Tensor::quantize_f32 '{name}': shape {shape:?} does not hold {} values",
            data.len()
        );
        let size = tensor_bytes(dtype, &shape).map_err(|e| {
            Error::invalid(format!("tensor '{name}': cannot store as {dtype}: {e}"))
        })?;
        let row_len = shape.last().copied().unwrap_or(1);
        let mut bytes = vec![0u8; size];
        if numel > 0 {
            let row_bytes = size / (numel / row_len);
            bytes
                .par_chunks_mut(row_bytes)
                .zip(data.par_chunks(row_len))
                .for_each(|(dst, src)| quant::quantize_row(dtype, src, dst));
        }
        Ok(Tensor {
            name,
            dtype,
            shape,
            storage: Storage::Owned(Arc::new(bytes)),
        })
    }

    /// This tensor converted to `dtype` (dequantised to f32, then quantised),
    /// keeping the name and shape. Converting to the same type shares the bytes.
    pub fn to_dtype(&self, dtype: GgmlType) -> Result<Tensor> {
        if dtype == self.dtype {
            return Ok(self.clone());
        }
        Tensor::quantize_f32(self.name.clone(), self.shape.clone(), &self.to_f32(), dtype)
    }

    /// The stored bytes: the rows in order, except in a tensor repacked by
    /// [`Tensor::repacked_rows8`] ([`Tensor::is_rows8`]), whose rows only
    /// this module's products and row accessors read.
    pub fn bytes(&self) -> &[u8] {
        match &self.storage {
            Storage::Mapped { map, offset, len } => &(**map).as_ref()[*offset..*offset + *len],
            Storage::Owned(v) | Storage::Rows8(v) => v,
        }
    }

    /// Whether the rows are repacked eight at a time.
    pub fn is_rows8(&self) -> bool {
        matches!(self.storage, Storage::Rows8(_))
    }

    /// This matrix with its rows repacked eight at a time for the int8
    /// decode products (`quant::fast::rows8`: a SIMD lane per row), where
    /// its type has that layout and its rows come in whole groups; else
    /// itself. The repacked copy is owned: the source's bytes are no longer
    /// read. Prefill's products and the row accessors gather its rows back.
    pub fn repacked_rows8(&self) -> Tensor {
        use quant::fast::rows8;
        let whole = self.shape.len() == 2
            && self.rows().is_multiple_of(rows8::ROWS)
            && self.row_len().is_multiple_of(32);
        if !rows8::supports(self.dtype) || !whole || self.is_rows8() {
            return self.clone();
        }
        let nb = self.row_len() / 32;
        Tensor {
            name: self.name.clone(),
            dtype: self.dtype,
            shape: self.shape.clone(),
            storage: Storage::Rows8(Arc::new(rows8::repack(
                self.dtype,
                self.bytes(),
                self.rows(),
                nb,
            ))),
        }
    }

    /// Rows `r0..r0 + out.len() / row_len()` dequantised into `out`.
    fn rows_to_f32(&self, r0: usize, out: &mut [f32]) {
        let (n, rb) = (self.row_len(), self.row_bytes());
        if n == 0 {
            return;
        }
        if !self.is_rows8() {
            let bytes = &self.bytes()[r0 * rb..][..out.len() / n * rb];
            for (row, src) in out.chunks_exact_mut(n).zip(bytes.chunks_exact(rb)) {
                quant::dequantize_row(self.dtype, src, row);
            }
            return;
        }
        for (i, row) in out.chunks_exact_mut(n).enumerate() {
            quant::fast::rows8::dequantize_row(self.dtype, self.bytes(), n / 32, r0 + i, row);
        }
    }

    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Product of all dimensions but the last.
    pub fn rows(&self) -> usize {
        self.shape[..self.shape.len().saturating_sub(1)]
            .iter()
            .product()
    }

    /// The last dimension (1 for a scalar).
    pub fn row_len(&self) -> usize {
        self.shape.last().copied().unwrap_or(1)
    }

    /// Bytes per row.
    pub fn row_bytes(&self) -> usize {
        self.dtype
            .row_bytes(self.row_len())
            .expect("tensor rows are whole blocks (checked at construction)")
    }

    /// The bytes of row `r` (not of a repacked matrix: see
    /// [`Tensor::row_to_f32`]).
    pub fn row(&self, r: usize) -> &[u8] {
        assert!(
            !self.is_rows8(),
            "tensor '{}': a repacked matrix has no row slices",
            self.name
        );
        assert!(
            r < self.rows(),
            "tensor '{}': row {r} of {}",
            self.name,
            self.rows()
        );
        let rb = self.row_bytes();
        &self.bytes()[r * rb..(r + 1) * rb]
    }

    /// Rows `start..start + count` of a matrix as a tensor of their own
    /// (a fused projection split into its parts), sharing a mapping.
    pub fn row_range(&self, name: impl Into<String>, start: usize, count: usize) -> Result<Tensor> {
        let name = name.into();
        if self.shape.len() != 2 || start + count > self.rows() {
            return Err(Error::invalid(format!(
                "tensor '{}' {:?}: no rows {start}..{} to split off as '{name}'",
                self.name,
                self.shape,
                start + count
            )));
        }
        let rb = self.row_bytes();
        let shape = vec![count, self.row_len()];
        Ok(match &self.storage {
            Storage::Mapped { map, offset, .. } => Tensor {
                name,
                dtype: self.dtype,
                shape,
                storage: Storage::Mapped {
                    map: map.clone(),
                    offset: offset + start * rb,
                    len: count * rb,
                },
            },
            Storage::Owned(v) => Tensor {
                name,
                dtype: self.dtype,
                shape,
                storage: Storage::Owned(Arc::new(v[start * rb..(start + count) * rb].to_vec())),
            },
            Storage::Rows8(_) => {
                return Err(Error::invalid(format!(
                    "tensor '{}': rows of a repacked matrix are not split off",
                    self.name
                )))
            }
        })
    }

    /// Dequantises row `r` into `out` (`row_len()` values), e.g. one
    /// embedding from a quantised token table.
    pub fn row_to_f32(&self, r: usize, out: &mut [f32]) {
        assert!(
            r < self.rows(),
            "tensor '{}': row {r} of {}",
            self.name,
            self.rows()
        );
        self.rows_to_f32(r, out);
    }

    /// All elements as f32.
    pub fn to_f32(&self) -> Vec<f32> {
        let mut out = vec![0.0f32; self.numel()];
        let n = self.row_len();
        if n == 0 || out.is_empty() {
            return out;
        }
        out.par_chunks_mut(n)
            .enumerate()
            .for_each(|(r, dst)| self.rows_to_f32(r, dst));
        out
    }
}

/// How the matrix-vector products treat their input.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Activations {
    /// f32, as the reference does: results differ from it only in the
    /// order of f32 operations.
    #[default]
    F32,
    /// Rounded to 8-bit levels in blocks of 32 for Q4_0, Q4_1 and Q8_0
    /// weights (llama.cpp's CPU convention; `quant::fast::int8`), f32 for
    /// the other types.
    Int8,
    /// Rounded to 16-bit levels in blocks of 32 for Q8_0 weights (f32 for
    /// the other types): 2^-16 of each block's largest value per element,
    /// close enough to f32 for the vocabulary projection, where 8 bits
    /// changed SmolLM2's greedy tokens, at integer speed. The matrix
    /// product ([`matmul`]) has no such path and stays f32.
    Int16,
}

impl Activations {
    fn row_dot<'a>(self, t: GgmlType, x: &'a [f32]) -> quant::fast::RowDot<'a> {
        match self {
            Activations::F32 => quant::fast::RowDot::new(t, x),
            Activations::Int8 => quant::fast::RowDot::new_int8(t, x),
            Activations::Int16 => quant::fast::RowDot::new_int16(t, x),
        }
    }
}

/// w: [n, k] (any type), x: `[k]` -> y: `[n]`; y = W x. Rows in parallel.
pub fn matvec(w: &Tensor, x: &[f32], y: &mut [f32]) {
    matvec_with(w, x, y, Activations::F32)
}

/// Rows a worker takes at a time: about 16 KiB of weights, so
/// a decode product splits into enough pieces that two threads finish
/// together, while claiming one costs little beside reading it.
fn rows_per_chunk(row_bytes: usize) -> usize {
    // Whole groups of eight, for repacked matrices.
    ((16 << 10) / row_bytes.max(1)).max(4).next_multiple_of(8)
}

/// [`matvec`] with the input treated as `act` says.
pub fn matvec_with(w: &Tensor, x: &[f32], y: &mut [f32], act: Activations) {
    matvec_same_input(&[w], x, &mut [y], act)
}

/// `ys[i] = ws[i] x` for several matrices with the same input, in one
/// parallel step over all their rows (decode's q/k/v and gate/up, where
/// each product alone is short).
pub fn matvec_same_input(ws: &[&Tensor], x: &[f32], ys: &mut [&mut [f32]], act: Activations) {
    assert_eq!(
        ws.len(),
        ys.len(),
        "matvec_same_input: one output per matrix"
    );
    for (w, y) in ws.iter().zip(ys.iter()) {
        assert_eq!(
            x.len(),
            w.row_len(),
            "matvec '{}': x is not [{}]",
            w.name,
            w.row_len()
        );
        assert_eq!(
            y.len(),
            w.rows(),
            "matvec '{}': y is not [{}]",
            w.name,
            w.rows()
        );
    }
    // One prepared input (int8: one quantisation) per weight type.
    let mut dots: Vec<quant::fast::RowDot> = Vec::new();
    let mut dot_of = Vec::with_capacity(ws.len());
    for (i, w) in ws.iter().enumerate() {
        match ws[..i].iter().position(|v| v.dtype == w.dtype) {
            Some(j) => dot_of.push(dot_of[j]),
            None => {
                dot_of.push(dots.len());
                dots.push(act.row_dot(w.dtype, x));
            }
        }
    }
    let chunk = ws.iter().map(|w| rows_per_chunk(w.row_bytes())).min();
    par::for_each_chunk_mut(ys, chunk.unwrap_or(1), |m, r0, out| {
        let rb = ws[m].row_bytes();
        let rows = &ws[m].bytes()[r0 * rb..(r0 + out.len()) * rb];
        if ws[m].is_rows8() {
            dots[dot_of[m]].dot_rows8(rows, out);
        } else {
            dots[dot_of[m]].dot_rows(rows, out);
        }
    });
}

/// [`matvec_with`] of `m` inputs at once: x: [m, k] -> y: [m, n], each row
/// bit for bit what `matvec_with` gives it (the same dot of each weight row
/// with each input), while every weight row is read once for all `m`
/// (checking drafted tokens computes them as decode steps would).
pub fn matvec_rows(w: &Tensor, x: &[f32], m: usize, y: &mut [f32], act: Activations) {
    matvec_rows_same_input(&[w], x, m, &mut [y], act)
}

/// [`matvec_rows`] of several matrices with the same inputs (decode's
/// q/k/v and gate/up): each input prepared (int8: quantised) once per
/// weight type, not once per matrix.
pub fn matvec_rows_same_input(
    ws: &[&Tensor],
    x: &[f32],
    m: usize,
    ys: &mut [&mut [f32]],
    act: Activations,
) {
    assert_eq!(ws.len(), ys.len(), "matvec_rows: one output per matrix");
    for (w, y) in ws.iter().zip(ys.iter()) {
        let (n, k) = (w.rows(), w.row_len());
        assert_eq!(
            x.len(),
            m * k,
            "matvec_rows '{}': x is not [{m}, {k}]",
            w.name
        );
        assert_eq!(
            y.len(),
            m * n,
            "matvec_rows '{}': y is not [{m}, {n}]",
            w.name
        );
    }
    if m == 1 {
        return matvec_same_input(ws, x, ys, act);
    }
    if m == 0 {
        return;
    }
    let mut prepared: Vec<(GgmlType, quant::fast::ManyDots)> = Vec::new();
    for (w, y) in ws.iter().zip(ys.iter_mut()) {
        let i = match prepared.iter().position(|(t, _)| *t == w.dtype) {
            Some(i) => i,
            None => {
                // Prepared in parallel: quantising many rows is not
                // small beside their products.
                let dots = par::map_chunks(x, w.row_len(), |xi| act.row_dot(w.dtype, xi));
                prepared.push((w.dtype, quant::fast::ManyDots::new(dots)));
                prepared.len() - 1
            }
        };
        rows_times(w, &prepared[i].1, y);
    }
}

/// Every row of `w` dotted with each of `dots`' m inputs into y: [m, n].
fn rows_times(w: &Tensor, dots: &quant::fast::ManyDots, y: &mut [f32]) {
    let (n, m) = (w.rows(), dots.len());
    if n == 0 {
        return;
    }
    let rb = w.row_bytes();
    let bytes = w.bytes();
    // Computed transposed ([n, m], one weight row per m outputs), then
    // transposed into y.
    let mut yt = vec![0.0f32; n * m];
    // Repacked rows go at least two groups at a time (the many-input
    // kernels' 512-bit copy takes groups in pairs).
    let rows = match w.is_rows8() {
        true => rows_per_chunk(rb * m).max(16),
        false => rows_per_chunk(rb * m),
    };
    par::for_each_chunk_mut(&mut [&mut yt], rows * m, |_, start, out| {
        let r0 = start / m;
        if w.is_rows8() {
            let rows = &bytes[r0 * rb..(r0 + out.len() / m) * rb];
            return dots.dot_rows8(rows, out);
        }
        for (i, o) in out.chunks_exact_mut(m).enumerate() {
            let row = &bytes[(r0 + i) * rb..(r0 + i + 1) * rb];
            dots.dot_row(row, o);
        }
    });
    // The transposition in tiles of 64 columns, in parallel: a tile's
    // [64, m] block of yt stays in L1 and each row of y gets whole lines.
    const TILE: usize = 64;
    let y_parts = par::DisjointMut::new(y);
    par::for_each_index(n.div_ceil(TILE), |t| {
        let (j0, cols) = (t * TILE, TILE.min(n - t * TILE));
        let block = &yt[j0 * m..(j0 + cols) * m];
        for i in 0..m {
            // SAFETY: tile t alone writes columns j0..j0 + cols.
            let dst = unsafe { y_parts.part(i * n + j0, cols) };
            for (d, col) in dst.iter_mut().zip(block.chunks_exact(m)) {
                *d = col[i];
            }
        }
    });
}

thread_local! {
    /// [`matmul`]'s buffers for one panel: dequantised rows, the packed
    /// panel and its product, kept between calls.
    static PANEL_SCRATCH: std::cell::RefCell<[Vec<f32>; 3]> = Default::default();
}

/// w: [n, k] (any type), x: [m, k] -> y: [m, n]; y = x W^T. Panels of
/// [`quant::fast::PANEL`] weight rows are dequantised once, packed, and
/// multiplied with every input row ([`quant::fast::panel_product`]), a
/// panel per piece of work.
pub fn matmul(w: &Tensor, x: &[f32], m: usize, y: &mut [f32]) {
    let (n, k) = (w.rows(), w.row_len());
    assert_eq!(x.len(), m * k, "matmul '{}': x is not [{m}, {k}]", w.name);
    assert_eq!(y.len(), m * n, "matmul '{}': y is not [{m}, {n}]", w.name);
    if m == 1 {
        return matvec(w, x, y);
    }
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        return y.fill(0.0);
    }
    use quant::fast::PANEL;
    let y_parts = par::DisjointMut::new(y);
    par::for_each_index(n.div_ceil(PANEL), |p| {
        PANEL_SCRATCH.with(|s| {
            let [rows, panel, out] = &mut *s.borrow_mut();
            rows.resize(PANEL * k, 0.0);
            panel.resize(PANEL * k, 0.0);
            out.resize(PANEL * m, 0.0);
            let (t0, nr) = (p * PANEL, PANEL.min(n - p * PANEL));
            w.rows_to_f32(t0, &mut rows[..nr * k]);
            quant::fast::pack_panel(&rows[..nr * k], k, panel);
            quant::fast::panel_product(x, k, panel, &mut out[..m * PANEL]);
            for (i, o) in out.chunks_exact(PANEL).take(m).enumerate() {
                // SAFETY: panel p alone writes columns t0..t0 + nr.
                let dst = unsafe { y_parts.part(i * n + t0, nr) };
                dst.copy_from_slice(&o[..nr]);
            }
        })
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::util::rng::Rng;

    fn weights(dtype: GgmlType, n: usize, k: usize, seed: u64) -> Tensor {
        let data = Rng::new(seed).vec(n * k, -1.0, 1.0);
        Tensor::quantize_f32("w", vec![n, k], &data, dtype).unwrap()
    }

    #[test]
    fn matvec_rows_equals_one_matvec_per_row() {
        for (dtype, act) in [
            (GgmlType::Q4_0, Activations::Int8),
            (GgmlType::Q8_0, Activations::F32),
            (GgmlType::F32, Activations::F32),
        ] {
            let w = weights(dtype, 37, 64, 5);
            let x = Rng::new(6).vec(3 * 64, -2.0, 2.0);
            let mut y = vec![f32::NAN; 3 * 37];
            matvec_rows(&w, &x, 3, &mut y, act);
            for i in 0..3 {
                let mut want = vec![0.0; 37];
                matvec_with(&w, &x[i * 64..(i + 1) * 64], &mut want, act);
                assert_eq!(&y[i * 37..(i + 1) * 37], &want[..], "{dtype:?} row {i}");
            }
        }
    }

    /// A matrix repacked for the int8 decode (`quant::fast::rows8`) gives
    /// every product and accessor what its source gives: the same values
    /// and f32 products bit for bit, int8 and int16 products
    /// within rounding of the row kernels' (another summation order) and,
    /// a batch of inputs, each input's own bits. Matrices without whole groups stay as they are.
    #[test]
    fn repacked_matrices_read_as_their_sources() {
        for dtype in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0] {
            let (n, k) = (48, 96);
            let w = weights(dtype, n, k, 11);
            let p = w.repacked_rows8();
            assert!(p.is_rows8() && p.bytes().len() == w.bytes().len());
            assert!(!weights(dtype, 37, k, 1).repacked_rows8().is_rows8());
            assert_eq!(p.to_f32(), w.to_f32(), "{dtype:?} values");
            let (mut a, mut b) = (vec![0.0; k], vec![0.0; k]);
            w.row_to_f32(13, &mut a);
            p.row_to_f32(13, &mut b);
            assert_eq!(a, b, "{dtype:?} row");
            let x = Rng::new(12).vec(3 * k, -2.0, 2.0);
            let (mut ya, mut yb) = (vec![0.0; 3 * n], vec![0.0; 3 * n]);
            matmul(&w, &x, 3, &mut ya);
            matmul(&p, &x, 3, &mut yb);
            assert_eq!(ya, yb, "{dtype:?} matmul");
            matvec(&w, &x[..k], &mut ya[..n]);
            matvec(&p, &x[..k], &mut yb[..n]);
            assert_eq!(ya[..n], yb[..n], "{dtype:?} f32 matvec");
            let scale = w.to_f32().iter().map(|v| v.abs() * 2.0).sum::<f32>() / n as f32;
            // 16-bit inputs (the vocabulary projection) likewise.
            for act in [Activations::Int8, Activations::Int16] {
                matvec_with(&w, &x[..k], &mut ya[..n], act);
                matvec_with(&p, &x[..k], &mut yb[..n], act);
                for (a, b) in ya[..n].iter().zip(&yb[..n]) {
                    assert!(
                        (a - b).abs() <= 1e-5 * scale,
                        "{dtype:?} {act:?}: {a} vs {b}"
                    );
                }
                // Three inputs, and nine (the int8 kernels' tiles of four
                // whole and short).
                let x9 = Rng::new(13).vec(9 * k, -2.0, 2.0);
                for xm in [&x, &x9] {
                    let m = xm.len() / k;
                    let mut ym = vec![f32::NAN; m * n];
                    matvec_rows(&p, xm, m, &mut ym, act);
                    for i in 0..m {
                        let mut want = vec![0.0; n];
                        matvec_with(&p, &xm[i * k..(i + 1) * k], &mut want, act);
                        assert_eq!(
                            &ym[i * n..(i + 1) * n],
                            &want[..],
                            "{dtype:?} {act:?} input {i} of {m}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn matvec_same_input_equals_one_matvec_per_matrix() {
        // Different formats and row counts, sharing one input.
        let ws = [
            weights(GgmlType::Q4_1, 7, 64, 1),
            weights(GgmlType::Q8_0, 33, 64, 2),
            weights(GgmlType::F32, 1, 64, 3),
        ];
        let x = Rng::new(4).vec(64, -2.0, 2.0);
        for act in [Activations::F32, Activations::Int8] {
            let mut got: Vec<Vec<f32>> = ws.iter().map(|w| vec![f32::NAN; w.rows()]).collect();
            let mut outs: Vec<&mut [f32]> = got.iter_mut().map(|v| v.as_mut_slice()).collect();
            matvec_same_input(&[&ws[0], &ws[1], &ws[2]], &x, &mut outs, act);
            for (w, g) in ws.iter().zip(&got) {
                let mut want = vec![0.0; w.rows()];
                matvec_with(w, &x, &mut want, act);
                assert_eq!(g, &want, "{:?} {act:?}", w.dtype);
            }
        }
    }

    #[test]
    fn shape_accessors() {
        let t = Tensor::from_f32("t", vec![2, 3, 4], (0..24).map(|i| i as f32).collect());
        assert_eq!(
            (t.numel(), t.rows(), t.row_len(), t.row_bytes()),
            (24, 6, 4, 16)
        );
        assert_eq!(
            t.row(5),
            bytemuck::cast_slice::<f32, u8>(&[20.0, 21.0, 22.0, 23.0])
        );
        let mut r = [0.0; 4];
        t.row_to_f32(1, &mut r);
        assert_eq!(r, [4.0, 5.0, 6.0, 7.0]);
        assert_eq!(t.to_f32(), (0..24).map(|i| i as f32).collect::<Vec<_>>());
        let s = Tensor::from_f32("s", vec![], vec![2.5]);
        assert_eq!((s.numel(), s.rows(), s.row_len()), (1, 1, 1));
    }

    #[test]
    fn from_bytes_checks_the_size() {
        let e = Tensor::from_bytes("w", GgmlType::Q4_0, vec![2, 32], vec![0; 35]).unwrap_err();
        assert!(e.to_string().contains("needs 36 bytes, got 35"), "{e}");
        let e = Tensor::from_bytes("w", GgmlType::Q4_0, vec![2, 31], vec![0; 36]).unwrap_err();
        assert!(e.to_string().contains("not a multiple"), "{e}");
        assert!(Tensor::from_bytes("w", GgmlType::Q4_0, vec![2, 32], vec![0; 36]).is_ok());
    }

    #[test]
    fn matvec_and_matmul_match_dequantised_cpu_matmul() {
        let (n, k, m) = (37, 256, 5);
        let x = Rng::new(9).vec(m * k, -1.0, 1.0);
        for dtype in GgmlType::ALL {
            let w = weights(dtype, n, k, 3);
            let wf = w.to_f32();
            let mut want = vec![0.0; m * n];
            crate::cpu::matmul(&x, &wf, None, m, k, n, &mut want);
            let mut got = vec![f32::NAN; m * n];
            matmul(&w, &x, m, &mut got);
            let mut got1 = vec![f32::NAN; n];
            matvec(&w, &x[..k], &mut got1);
            for j in 0..n {
                // Only the summation order differs: a few ulps of the sum of |w x|.
                let bound = 1e-5 * (k as f32);
                assert!((got1[j] - want[j]).abs() <= bound, "{dtype} matvec row {j}");
                for i in 0..m {
                    let (g, e) = (got[i * n + j], want[i * n + j]);
                    assert!(
                        (g - e).abs() <= bound,
                        "{dtype} matmul [{i},{j}]: {g} vs {e}"
                    );
                }
            }
        }
    }

    #[test]
    fn f32_weights_match_cpu_matmul() {
        let (n, k, m) = (33, 132, 3);
        let wf = Rng::new(1).vec(n * k, -1.0, 1.0);
        let x = Rng::new(2).vec(m * k, -1.0, 1.0);
        let w = Tensor::from_f32("w", vec![n, k], wf.clone());
        let mut want = vec![0.0; m * n];
        crate::cpu::matmul(&x, &wf, None, m, k, n, &mut want);
        let mut got = vec![0.0; m * n];
        matmul(&w, &x, m, &mut got);
        for (g, e) in got.iter().zip(&want) {
            // Different summation order and fused multiply-adds.
            assert!((g - e).abs() <= 1e-6 * k as f32, "{g} vs {e}");
        }
        // matvec goes through cpu::dot itself.
        let mut got1 = vec![0.0; n];
        matvec(&w, &x[..k], &mut got1);
        assert_eq!(got1[..], want[..n]);
    }

    #[test]
    fn to_dtype_requantises() {
        let w = weights(GgmlType::F32, 4, 64, 5);
        let q = w.to_dtype(GgmlType::Q8_0).unwrap();
        assert_eq!(
            (q.dtype, q.shape.clone(), q.bytes().len()),
            (GgmlType::Q8_0, vec![4, 64], 4 * 68)
        );
        let back = q.to_f32();
        for (a, b) in back.iter().zip(w.to_f32()) {
            assert!((a - b).abs() < 1.0 / 127.0, "{a} vs {b}");
        }
        assert!(
            w.to_dtype(GgmlType::Q4_K).is_err(),
            "64 is not a multiple of 256"
        );
    }
}
