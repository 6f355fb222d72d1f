//! CPU matrix-vector speed per weight type: the reference `quant::dot_row`
//! against the fast `quant::fast::RowDot` on one thread (f32 inputs, and
//! inputs rounded to 8 bits where the type has an integer kernel, over the
//! rows as stored and repacked eight at a time as `generate --cpu` decodes,
//! and to 16 bits, as its vocabulary projection does, Q8_0 repacked too),
//! the full `tensor::matvec` on every thread, `tensor::matmul` of 32
//! input rows (a prefill chunk), and the same 32 rows with int8 inputs over
//! the repacked rows (`tensor::matvec_rows`, a batch's decode). Prints a
//! markdown table.
//!
//!     cargo run --release --example quant_matvec [ROWS COLS]
//!
//! Default shape 1536 x 576 (a SmolLM2-135M FFN matrix). Timings are the
//! median of repeated runs; GB/s counts the weight bytes read.

use lfm::quant::{dot_row, fast::RowDot, GgmlType};
use lfm::tensor::{matmul, matvec, matvec_rows, Activations, Tensor};
use lfm::util::rng::Rng;
use std::hint::black_box;
use std::time::Instant;

fn median_secs(mut f: impl FnMut()) -> f64 {
    f();
    let mut times: Vec<f64> = (0..15)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .collect();
    times.sort_by(|a, b| a.partial_cmp(b).unwrap());
    times[times.len() / 2]
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().unwrap())
        .collect();
    let (n, k) = match args[..] {
        [n, k] => (n, k),
        _ => (1536, 576),
    };
    let data = Rng::new(1).vec(n * k, -1.0, 1.0);
    let x = Rng::new(2).vec(k, -1.0, 1.0);
    const M: usize = 32;
    let xm = Rng::new(3).vec(M * k, -1.0, 1.0);
    println!(
        "matvec [{n}, {k}] x [{k}], {} threads",
        rayon::current_num_threads()
    );
    println!();
    println!(
        "| type | reference 1 thread | fast 1 thread | speed-up | int8 input 1 thread | \
         int8 repacked 1 thread | int16 input 1 thread | int16 repacked 1 thread | matvec all threads | matmul {M} rows all threads | \
         int8 repacked {M} rows all threads |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for t in GgmlType::ALL {
        let Ok(w) = Tensor::quantize_f32("w", vec![n, k], &data, t) else {
            continue;
        };
        let bytes = w.bytes().len() as f64;
        let rb = w.row_bytes();
        let rows = |f: &dyn Fn(&[u8]) -> f32| {
            let mut s = 0.0;
            for r in w.bytes().chunks_exact(rb) {
                s += f(r);
            }
            black_box(s);
        };
        let reference = median_secs(|| rows(&|r| dot_row(t, r, &x)));
        let dot = RowDot::new(t, &x);
        let fast = median_secs(|| rows(&|r| dot.dot(r)));
        let int8 = RowDot::new_int8(t, &x);
        let mut yr = vec![0.0f32; n];
        let int8 = median_secs(|| int8.dot_rows(w.bytes(), &mut yr));
        // The same int8 products over the rows repacked eight at a time,
        // as `generate --cpu` decodes its layers (where the type has it).
        let packed = w.repacked_rows8();
        let int8_rows8 = packed.is_rows8().then(|| {
            let dot = RowDot::new_int8(t, &x);
            median_secs(|| dot.dot_rows8(packed.bytes(), &mut yr))
        });
        let int16 = RowDot::new_int16(t, &x);
        let int16_rows8 = (packed.is_rows8() && t == GgmlType::Q8_0)
            .then(|| median_secs(|| int16.dot_rows8(packed.bytes(), &mut yr)));
        let int16 = median_secs(|| int16.dot_rows(w.bytes(), &mut yr));
        let mut y = vec![0.0f32; n];
        let full = median_secs(|| matvec(&w, black_box(&x), &mut y));
        let mut ym = vec![0.0f32; M * n];
        let mm = median_secs(|| matmul(&w, black_box(&xm), M, &mut ym));
        // The same M rows with int8 inputs over the repacked rows (a
        // batch's decode products in `serve --cpu`).
        let mm8 = packed.is_rows8().then(|| {
            median_secs(|| matvec_rows(&packed, black_box(&xm), M, &mut ym, Activations::Int8))
        });
        let gflops = |s: f64| {
            format!(
                "{:.1} us ({:.1} GFLOP/s)",
                s * 1e6,
                2.0 * (M * n * k) as f64 / s / 1e9
            )
        };
        let show = |s: f64| format!("{:.1} us ({:.1} GB/s)", s * 1e6, bytes / s / 1e9);
        println!(
            "| {t} | {} | {} | {:.1}x | {} | {} | {} | {} | {} | {} | {} |",
            show(reference),
            show(fast),
            reference / fast,
            show(int8),
            int8_rows8.map_or("-".into(), show),
            show(int16),
            int16_rows8.map_or("-".into(), show),
            show(full),
            gflops(mm),
            mm8.map_or("-".into(), gflops),
        );
    }
}
