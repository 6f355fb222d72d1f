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
    // LFM_PARITY_ONLY=a,b runs only those kernels' cases (while working on them).
    let only = std::env::var("LFM_PARITY_ONLY").ok();
    let wanted = |name: &str| {
        only.as_ref()
            .is_none_or(|o| o.split(',').any(|n| n == name))
    };
    for case in cases().into_iter().filter(|c| wanted(c.kernel)) {
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

/// Every variant of every kernel, including those this adapter cannot run
/// (in CI: the subgroup, f16 and cooperative-matrix ones, which lavapipe
/// lacks), parses, validates and translates to SPIR-V with naga, the
/// compiler wgpu itself uses. Needs no adapter.
#[test]
fn every_kernel_variant_is_valid_wgsl() {
    use lfm::gpu::preprocess::{enable_directives, preprocess};
    use wgpu::naga;
    let mut checked = 0;
    for k in lfm::gpu::kernels::all() {
        for defines in k.variants {
            let v = lfm::gpu::Variant::new(defines);
            let what = format!("{} [{}]", k.name, v.key());
            let source = enable_directives(&v)
                + &preprocess(k.source, &v.defines).unwrap_or_else(|e| panic!("{what}: {e}"));
            let module = naga::front::wgsl::parse_str(&source)
                .unwrap_or_else(|e| panic!("{what}: {}", e.emit_to_string(&source)));
            let info = naga::valid::Validator::new(
                naga::valid::ValidationFlags::all(),
                naga::valid::Capabilities::all(),
            )
            .validate(&module)
            .unwrap_or_else(|e| panic!("{what}: {}", e.emit_to_string(&source)));
            let constants = v
                .constants
                .iter()
                .map(|(n, c)| (n.to_string(), *c as f64))
                .collect();
            let (module, info) = naga::back::pipeline_constants::process_overrides(
                &module,
                &info,
                Some((naga::ShaderStage::Compute, k.entry)),
                &constants,
            )
            .unwrap_or_else(|e| panic!("{what}: {e}"));
            let options = naga::back::spv::Options {
                lang_version: (1, 3),
                ..Default::default()
            };
            naga::back::spv::write_vec(&module, &info, &options, None)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            checked += 1;
        }
    }
    assert!(checked > 100, "only {checked} variants checked");
}

/// WebGPU guarantees 8 storage buffers a shader stage (the context refuses
/// adapters with fewer): no kernel may declare more.
#[test]
fn every_kernel_fits_eight_storage_buffers() {
    let over: Vec<_> = lfm::gpu::kernels::all()
        .filter(|k| k.bindings.len() > 8)
        .map(|k| format!("{} ({})", k.name, k.bindings.len()))
        .collect();
    assert!(over.is_empty(), "kernels over 8 storage buffers: {over:?}");
}
