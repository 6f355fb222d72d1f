// gate_act: the gated MLP's activation of the gate, for the kernels that
// finish a GEMM's SwiGLU / GeGLU epilogue (gemm.wgsl, gemm_split_sum.wgsl):
// silu, or with GELU tanh-approximated GELU (Gemma).

#if SWIGLU
fn gate_act(v: f32) -> f32 {
#if GELU
    // tanh through exp of a non-positive argument: no overflow at large |v|.
    let u = 0.7978845608028654 * (v + 0.044715 * v * v * v);
    let e = exp(-2.0 * abs(u));
    let th = (1.0 - e) / (1.0 + e);
    return 0.5 * v * (1.0 + select(th, -th, u < 0.0));
#else
    return v / (1.0 + exp(-v));
#endif
}
#endif
