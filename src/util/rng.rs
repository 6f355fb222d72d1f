//! A seeded pseudo-random generator (xoshiro256**, seeded by SplitMix64).
//! Sampling, noise in speech synthesis and test inputs all draw from it, so the
//! same seed gives the same output on every machine and every release.

#[derive(Clone, Debug)]
pub struct Rng {
    s: [u64; 4],
}

impl Rng {
    pub fn new(seed: u64) -> Self {
        let mut sm = seed;
        let mut next = || {
            sm = sm.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = sm;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        Rng {
            s: [next(), next(), next(), next()],
        }
    }

    pub fn next_u64(&mut self) -> u64 {
        let result = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        result
    }

    /// Uniform in [0, 1) with 24 bits of precision.
    pub fn next_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 * (1.0 / (1u64 << 24) as f32)
    }

    /// Uniform in [lo, hi).
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * self.next_f32()
    }

    /// Standard normal (Box-Muller).
    pub fn normal(&mut self) -> f32 {
        let a = self.next_u64();
        box_muller(a, self.next_u64())
    }

    /// `n` standard normals, the values `n` calls of [`Rng::normal`] give:
    /// the generator's outputs are drawn in order, and the transform (a log
    /// and a cosine in f64, most of a draw's time) runs on every core.
    pub fn normals(&mut self, n: usize) -> Vec<f32> {
        use rayon::prelude::*;
        let bits: Vec<u64> = (0..2 * n).map(|_| self.next_u64()).collect();
        let mut out = vec![0.0f32; n];
        out.par_chunks_mut(CHUNK)
            .zip(bits.par_chunks(2 * CHUNK))
            .for_each(|(out, bits)| {
                for (v, pair) in out.iter_mut().zip(bits.chunks_exact(2)) {
                    *v = box_muller(pair[0], pair[1]);
                }
            });
        out
    }

    /// `n` values uniform in [lo, hi).
    pub fn vec(&mut self, n: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..n).map(|_| self.uniform(lo, hi)).collect()
    }
}

/// Normals a task of [`Rng::normals`] transforms.
const CHUNK: usize = 4096;

/// One standard normal from two of the generator's outputs (the first
/// gives the radius, the second the angle).
fn box_muller(a: u64, b: u64) -> f32 {
    let u1 = ((a >> 11) as f64 + 0.5) * (1.0 / (1u64 << 53) as f64);
    let u2 = (b >> 11) as f64 * (1.0 / (1u64 << 53) as f64);
    ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
}

#[cfg(test)]
mod tests {
    use super::Rng;

    #[test]
    fn same_seed_same_stream() {
        let a: Vec<u64> = {
            let mut r = Rng::new(7);
            (0..8).map(|_| r.next_u64()).collect()
        };
        let mut r = Rng::new(7);
        assert!(a.iter().all(|&x| x == r.next_u64()));
        assert_ne!(Rng::new(8).next_u64(), a[0]);
    }

    #[test]
    fn normals_are_the_normal_draws_in_order() {
        for n in [0, 1, 5, 4096, 4097, 10_000] {
            let mut a = Rng::new(n as u64);
            let mut b = a.clone();
            let want: Vec<u32> = (0..n).map(|_| a.normal().to_bits()).collect();
            let got: Vec<u32> = b.normals(n).iter().map(|v| v.to_bits()).collect();
            assert_eq!(got, want, "n = {n}");
            assert_eq!(a.next_u64(), b.next_u64(), "n = {n}: the streams part");
        }
    }

    #[test]
    fn floats_in_range() {
        let mut r = Rng::new(1);
        for _ in 0..10_000 {
            let x = r.next_f32();
            assert!((0.0..1.0).contains(&x));
        }
    }
}
