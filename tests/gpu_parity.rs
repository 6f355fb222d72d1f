//! Every registered GPU kernel against its CPU twin, in every variant the
//! adapter can run. In CI this runs on Mesa lavapipe.

mod parity;

use parity::Case;

fn cases() -> Vec<&'static Case> {
    [
        parity::basic::CASES,
        parity::dense::CASES,
        parity::llm::CASES,
        parity::vision::CASES,
        parity::speech::CASES,
        parity::whisper::CASES,
    ]
    .into_iter()
    .flatten()
    .collect()
}

#[test]
fn every_registered_kernel_has_a_parity_case() {
    let cases = cases();
    let missing: Vec<_> = lfm::gpu::kernels::all()
        .filter(|k| !cases.iter().any(|c| c.kernel == k.name))
        .map(|k| k.name)
        .collect();
    assert!(
        missing.is_empty(),
        "kernels without a parity case: {missing:?}"
    );
    let unknown: Vec<_> = cases
        .iter()
        .filter(|c| !lfm::gpu::kernels::all().any(|k| k.name == c.kernel))
        .map(|c| c.kernel)
        .collect();
    assert!(
        unknown.is_empty(),
        "parity cases for unregistered kernels: {unknown:?}"
    );
}

#[test]
fn every_kernel_variant_compiles() {
    let Some(gpu) = parity::gpu() else { return };
    for k in lfm::gpu::kernels::all() {
        for v in parity::runnable_variants(gpu, k) {
            gpu.pipeline(k, &v).unwrap_or_else(|e| panic!("{e}"));
        }
    }
}

#[test]
fn kernels_match_cpu() {
    let Some(gpu) = parity::gpu() else { return };
    for case in cases() {
        let k = lfm::gpu::kernels::all()
            .find(|k| k.name == case.kernel)
            .expect("registered");
        for v in parity::runnable_variants(gpu, k) {
            eprintln!("parity: {} [{}]", k.name, v.key());
            (case.run)(gpu, &v);
        }
    }
}

#[test]
fn long_attention_is_refused_on_software_adapters_and_right_elsewhere() {
    let Some(gpu) = parity::gpu() else { return };
    parity::dense::long_attention_is_refused_on_software_adapters_and_right_elsewhere(gpu);
}
