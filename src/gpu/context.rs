//! Adapter selection, device creation and the pipeline cache.

use super::kernels::{Access, Kernel, Variant};
use super::preprocess::{enable_directives, preprocess};
use crate::error::{Error, Result};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Which graphics API to run on; `None` in [`GpuOptions`] lets wgpu pick.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Backend {
    Vulkan,
    Metal,
    Dx12,
    Gl,
}

impl Backend {
    fn wgpu(self) -> wgpu::Backends {
        match self {
            Backend::Vulkan => wgpu::Backends::VULKAN,
            Backend::Metal => wgpu::Backends::METAL,
            Backend::Dx12 => wgpu::Backends::DX12,
            Backend::Gl => wgpu::Backends::GL,
        }
    }
}

/// How to choose the adapter: parsed once from the command line.
#[derive(Clone, Debug, Default)]
pub struct GpuOptions {
    pub backend: Option<Backend>,
    /// Case-insensitive substring of the adapter name.
    pub adapter: Option<String>,
    /// Ignore subgroups and f16 even when present (tests the portable kernels).
    pub portable: bool,
    /// The user asked for a GPU (`--gpu`): use a software rasteriser if it
    /// is the only adapter, and fail rather than fall back to the CPU.
    pub required: bool,
    /// Treat buffers and storage bindings over this many bytes as over the
    /// adapter's limits (a smaller device than it offers; the browser
    /// page's `maxbuffer=` option, which tests its too-large message).
    pub max_buffer_bytes: Option<u64>,
}

impl GpuOptions {
    /// True when the user named a backend or an adapter or demanded a GPU.
    pub fn is_explicit(&self) -> bool {
        self.backend.is_some() || self.adapter.is_some() || self.required
    }
}

/// What the chosen adapter offers that kernels may use.
#[derive(Clone, Copy, Debug)]
pub struct Capabilities {
    pub subgroups: bool,
    /// Smallest subgroup size the adapter may run a kernel with.
    pub subgroup_min: u32,
    pub f16: bool,
    /// 16x16x16 cooperative matrices (tensor cores) with f16 inputs and an
    /// f32 accumulator, in subgroups of exactly 32 (the prefill GEMM's COOP
    /// variant; `coop_matrix_usable` says what is checked).
    pub coop_matrix: bool,
    /// Largest byte range one storage binding may cover.
    pub max_binding: u64,
    pub max_buffer: u64,
    pub max_workgroup_storage: u32,
    pub max_invocations: u32,
    pub max_storage_buffers: u32,
    /// Timestamp queries inside compute passes ([`super::profile`]).
    pub timestamps: bool,
}

impl Capabilities {
    /// Whether the GEMM's WIDE cooperative-matrix tiles fit the adapter's
    /// workgroup memory (48 KiB; the other COOP kernels need 23 KiB).
    pub fn coop_wide(&self) -> bool {
        self.coop_matrix && self.max_workgroup_storage >= WIDE_STORAGE
    }

    /// The first feature variant `v` needs (by its defines SUBGROUPS, F16,
    /// COOP, WIDE) that the adapter lacks.
    pub fn missing(&self, v: &Variant) -> Option<&'static str> {
        [
            ("SUBGROUPS", self.subgroups, "subgroups"),
            ("F16", self.f16, "f16"),
            ("COOP", self.coop_matrix, "cooperative matrices"),
            ("WIDE", self.coop_wide(), "48 KiB of workgroup memory"),
        ]
        .into_iter()
        .find(|(define, have, _)| !have && v.defines.contains(define))
        .map(|(_, _, feature)| feature)
    }
}

type PipelineKey = (&'static str, String);

/// Most workgroup memory a COOP kernel declares, but for the WIDE GEMM:
/// prefill_attention's f16 key/value tile of 64 x 72, f32 scores of
/// 4 x 16 x 36 and f16 probabilities of 4 x 16 x 40 (the GEMM's: 22.1 KiB).
const COOP_STORAGE: u32 = 4608 * 2 + 2304 * 4 + 2560 * 2;

/// Workgroup memory of the WIDE GEMMs (gemm_norm's), the larger of: WIDE's
/// f16 weight and token tiles of 2304 and 1152 vec4s, its f32 output tile of
/// 128 rows x 32 tokens (half the tile's) and the norm's 64 token scales;
/// BIG's tiles of 2304 vec4s each, output tile of 128 x 16 and 128 scales.
const WIDE_STORAGE: u32 = {
    let wide = (2304 + 1152) * 8 + (4096 + 64) * 4;
    let big = (2304 + 2304) * 8 + (2048 + 128) * 4;
    if wide > big {
        wide
    } else {
        big
    }
};

/// True when the adapter offers what the COOP variants (the GEMM's, prefill
/// attention) are written for: a 16x16x16 cooperative-matrix configuration
/// with f16 A and B and f32 C and result, subgroups that are always 32 wide
/// (the kernels split their threads into subgroups of 32), and room for
/// their tiles.
fn coop_matrix_usable(
    adapter: &wgpu::Adapter,
    info: &wgpu::AdapterInfo,
    limits: &wgpu::Limits,
) -> bool {
    use wgpu::CooperativeScalarType::{F16, F32};
    if !adapter
        .features()
        .contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX)
        || info.subgroup_min_size != 32
        || info.subgroup_max_size != 32
        || limits.max_compute_workgroup_storage_size < COOP_STORAGE
    {
        return false;
    }
    adapter.cooperative_matrix_properties().iter().any(|c| {
        (c.m_size, c.n_size, c.k_size) == (16, 16, 16) && c.ab_type == F16 && c.cr_type == F32
    })
}

/// Whether kernels keep the runtime checks wgpu injects by default: every
/// array index clamped, a counter in every loop, guarded integer division.
/// They are off (`ShaderRuntimeChecks::unchecked`, what native engines
/// compile to): on an H200 the checks cost prefill a third of its speed
/// (LFM2-350M Q4_0 pp512 39k -> 59k tok/s without) and decode 6%; storage
/// buffers stay bounds-checked by the driver where it has robust buffer
/// access, which wgpu turns on. `LFM_SHADER_CHECKS=1` puts them back, e.g.
/// to try a kernel from `LFM_SHADER_DIR`.
fn shader_checks() -> bool {
    std::env::var_os("LFM_SHADER_CHECKS").is_some_and(|v| v != "0")
}

/// Loop iterations one shader invocation may run on Mesa's llvmpipe
/// (lavapipe), all its loops together: past it gallivm ends every loop
/// silently (`LP_MAX_TGSI_LOOP_ITERATIONS`), so the results are wrong.
/// Kernels whose loop counts grow with the input check against it on
/// software adapters.
pub const SOFTWARE_LOOP_LIMIT: usize = 65535;

pub struct Gpu {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub info: wgpu::AdapterInfo,
    pub caps: Capabilities,
    layouts: Mutex<HashMap<&'static str, Arc<(wgpu::BindGroupLayout, wgpu::PipelineLayout)>>>,
    pipelines: Mutex<HashMap<PipelineKey, Arc<wgpu::ComputePipeline>>>,
    /// [`Gpu::partials`]' buffer.
    pub(super) partials: Mutex<Option<wgpu::Buffer>>,
}

/// Keeps the adapter probe quiet on headless machines: without
/// XDG_RUNTIME_DIR (ssh, containers, CI) libwayland, loaded by the Vulkan
/// and EGL drivers, prints "error: XDG_RUNTIME_DIR is invalid or not set"
/// for every probe. A WAYLAND_DISPLAY that is an absolute path needs no
/// runtime directory, and one that does not exist fails silently. The
/// binaries call it first thing in `main`, before any thread starts;
/// [`Gpu::new`] calls it too, for library users (tests among them), once,
/// before its first probe.
pub fn quiet_headless_probe() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // A browser has no environment to set (std's set_var panics there).
        if cfg!(not(target_arch = "wasm32"))
            && std::env::var_os("XDG_RUNTIME_DIR").is_none()
            && std::env::var_os("WAYLAND_DISPLAY").is_none()
        {
            std::env::set_var("WAYLAND_DISPLAY", "/nonexistent/lfm-headless/wayland-0");
        }
    });
}

/// The adapters `instance` offers on `backends`. A browser hands out one,
/// the one `requestAdapter` picks (asked for high performance).
async fn adapters_of(instance: &wgpu::Instance, backends: wgpu::Backends) -> Vec<wgpu::Adapter> {
    #[cfg(not(target_arch = "wasm32"))]
    {
        instance.enumerate_adapters(backends).await
    }
    #[cfg(target_arch = "wasm32")]
    {
        let _ = backends;
        let opts = wgpu::RequestAdapterOptions {
            power_preference: wgpu::PowerPreference::HighPerformance,
            ..Default::default()
        };
        instance.request_adapter(&opts).await.into_iter().collect()
    }
}

impl Gpu {
    /// Opens the best adapter matching `opts`: a discrete GPU before an
    /// integrated one before a software rasteriser.
    pub fn new(opts: &GpuOptions) -> Result<Gpu> {
        quiet_headless_probe();
        // Without an explicit backend, look at the modern APIs first and
        // only then at GL (slower, no subgroups, and noisy to probe).
        let tries = match opts.backend {
            Some(b) => vec![b.wgpu()],
            None => vec![wgpu::Backends::PRIMARY, wgpu::Backends::GL],
        };
        let mut adapters = Vec::new();
        for backends in tries {
            let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
            desc.backends = backends;
            // wgpu would put a dispatch of its own in front of every indirect
            // one, to check its counts (a dependent dispatch each: speak's
            // flow and decoder have a hundred). The only counts the device
            // writes are `gpu::speech::durations`', which bounds them.
            desc.flags
                .remove(wgpu::InstanceFlags::VALIDATION_INDIRECT_CALL);
            let instance = wgpu::Instance::new(desc);
            adapters = super::wait::block_on(adapters_of(&instance, backends));
            if let Some(want) = &opts.adapter {
                let want = want.to_lowercase();
                adapters.retain(|a| a.get_info().name.to_lowercase().contains(&want));
            }
            if !adapters.is_empty() {
                break;
            }
        }
        adapters.sort_by_key(|a| {
            let i = a.get_info();
            let kind = match i.device_type {
                wgpu::DeviceType::DiscreteGpu => 0,
                wgpu::DeviceType::IntegratedGpu => 1,
                wgpu::DeviceType::VirtualGpu => 2,
                wgpu::DeviceType::Other => 3,
                wgpu::DeviceType::Cpu => 4,
            };
            // Vulkan before GL on the same device: storage buffers and subgroups.
            let api = if i.backend == wgpu::Backend::Gl { 1 } else { 0 };
            (kind, api)
        });
        let adapter = adapters.into_iter().next().ok_or_else(|| {
            Error::gpu(match (&opts.backend, &opts.adapter) {
                (None, None) if cfg!(target_arch = "wasm32") => "the browser offers no WebGPU adapter".to_string(),
                (None, None) => "no GPU adapter found (install a Vulkan driver, e.g. Debian's mesa-vulkan-drivers, or use --cpu)".to_string(),
                (backend, adapter) => {
                    let mut want = Vec::new();
                    if let Some(b) = backend {
                        want.push(format!("--backend {}", format!("{b:?}").to_lowercase()));
                    }
                    if let Some(a) = adapter {
                        want.push(format!("--adapter {a:?}"));
                    }
                    format!("no GPU adapter matches {}", want.join(" "))
                }
            })
        })?;
        let info = adapter.get_info();
        let feats = adapter.features();
        let mut limits = adapter.limits();
        if let Some(cap) = opts.max_buffer_bytes {
            limits.max_buffer_size = limits.max_buffer_size.min(cap);
            limits.max_storage_buffer_binding_size =
                limits.max_storage_buffer_binding_size.min(cap);
        }
        if limits.max_storage_buffers_per_shader_stage < 8 {
            return Err(Error::gpu(format!(
                "adapter {} allows only {} storage buffers per shader stage; 8 are needed",
                info.name, limits.max_storage_buffers_per_shader_stage
            )));
        }
        let subgroups = !opts.portable && feats.contains(wgpu::Features::SUBGROUP);
        let f16 = !opts.portable && feats.contains(wgpu::Features::SHADER_F16);
        let mut required = wgpu::Features::empty();
        if subgroups {
            required |= wgpu::Features::SUBGROUP;
        }
        if f16 {
            required |= wgpu::Features::SHADER_F16;
        }
        // LFM_NO_COOP_MATRIX: measure the portable GEMM on the same adapter.
        let coop = !opts.portable
            && std::env::var_os("LFM_NO_COOP_MATRIX").is_none()
            && subgroups
            && f16
            && coop_matrix_usable(&adapter, &info, &limits);
        if coop {
            required |= wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX;
        }
        let timing =
            wgpu::Features::TIMESTAMP_QUERY | wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES;
        let timestamps = feats.contains(timing);
        if timestamps {
            required |= timing;
        }
        // Ask for everything the adapter can give: large models need the full
        // binding and buffer sizes.
        let (device, queue) =
            super::wait::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
                label: Some("lfm"),
                required_features: required,
                required_limits: limits.clone(),
                experimental_features: if coop {
                    // SAFETY: wgpu marks cooperative matrices experimental (its
                    // API may change and may have bugs). Only the GEMM's COOP
                    // variant uses them, and its parity case checks it against
                    // the CPU on every adapter that runs it.
                    unsafe { wgpu::ExperimentalFeatures::enabled() }
                } else {
                    wgpu::ExperimentalFeatures::disabled()
                },
                memory_hints: wgpu::MemoryHints::Performance,
                trace: wgpu::Trace::Off,
            }))
            .map_err(|e| Error::gpu(format!("{}: cannot open device: {e}", info.name)))?;
        let caps = Capabilities {
            subgroups,
            subgroup_min: info.subgroup_min_size,
            f16,
            coop_matrix: coop,
            max_binding: limits.max_storage_buffer_binding_size,
            max_buffer: limits.max_buffer_size,
            max_workgroup_storage: limits.max_compute_workgroup_storage_size,
            max_invocations: limits.max_compute_invocations_per_workgroup,
            max_storage_buffers: limits.max_storage_buffers_per_shader_stage,
            timestamps,
        };
        Ok(Gpu {
            device,
            queue,
            info,
            caps,
            layouts: Mutex::new(HashMap::new()),
            pipelines: Mutex::new(HashMap::new()),
            partials: Mutex::new(None),
        })
    }

    /// A software rasteriser (lavapipe, SwiftShader) rather than a GPU.
    pub fn is_software(&self) -> bool {
        self.info.device_type == wgpu::DeviceType::Cpu
    }

    /// One line for stderr: adapter, backend, driver and the features in use.
    pub fn describe(&self) -> String {
        format!(
            "gpu: {} ({:?}, {} {}){}{}{}",
            self.info.name,
            self.info.backend,
            self.info.driver,
            self.info.driver_info,
            if self.caps.subgroups {
                ", subgroups"
            } else {
                ""
            },
            if self.caps.f16 { ", f16" } else { "" },
            if self.caps.coop_matrix {
                ", cooperative matrices"
            } else {
                ""
            },
        )
    }

    fn layout(&self, k: &'static Kernel) -> Arc<(wgpu::BindGroupLayout, wgpu::PipelineLayout)> {
        let mut layouts = self.layouts.lock().expect("layout cache poisoned");
        layouts
            .entry(k.name)
            .or_insert_with(|| {
                let mut entries = Vec::new();
                if k.params_size > 0 {
                    entries.push(wgpu::BindGroupLayoutEntry {
                        binding: 0,
                        visibility: wgpu::ShaderStages::COMPUTE,
                        ty: wgpu::BindingType::Buffer {
                            ty: wgpu::BufferBindingType::Uniform,
                            has_dynamic_offset: false,
                            min_binding_size: None,
                        },
                        count: None,
                    });
                }
                for (i, b) in k.bindings.iter().enumerate() {
                    entries.push(wgpu::BindGroupLayoutEntry {
                        binding: i as u32 + 1,
                        visibility: wgpu::ShaderStages::COMPUTE,
                        ty: wgpu::BindingType::Buffer {
                            ty: wgpu::BufferBindingType::Storage {
                                read_only: b.access == Access::Read,
                            },
                            has_dynamic_offset: false,
                            min_binding_size: None,
                        },
                        count: None,
                    });
                }
                let bgl = self
                    .device
                    .create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                        label: Some(k.name),
                        entries: &entries,
                    });
                let pl = self
                    .device
                    .create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                        label: Some(k.name),
                        bind_group_layouts: &[Some(&bgl)],
                        immediate_size: 0,
                    });
                Arc::new((bgl, pl))
            })
            .clone()
    }

    /// The pipeline for `k` in `variant`, compiled on first use. A shader the
    /// driver rejects is an error, not a panic.
    pub fn pipeline(
        &self,
        k: &'static Kernel,
        variant: &Variant,
    ) -> Result<Arc<wgpu::ComputePipeline>> {
        let key = (k.name, variant.key());
        if let Some(p) = self
            .pipelines
            .lock()
            .expect("pipeline cache poisoned")
            .get(&key)
        {
            return Ok(p.clone());
        }
        if let Some(feature) = self.caps.missing(variant) {
            return Err(Error::gpu(format!(
                "kernel {} variant {} needs {feature}",
                k.name, key.1
            )));
        }
        let text = k
            .wgsl()
            .map_err(|e| Error::gpu(format!("kernel {}: {e}", k.name)))?;
        let source = enable_directives(variant)
            + &preprocess(&text, &variant.defines)
                .map_err(|e| Error::gpu(format!("kernel {}: {e}", k.name)))?;
        let layout = self.layout(k);
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let desc = wgpu::ShaderModuleDescriptor {
            label: Some(k.name),
            source: wgpu::ShaderSource::Wgsl(source.into()),
        };
        let module = if shader_checks() {
            self.device.create_shader_module(desc)
        } else {
            // SAFETY: the kernels are this crate's own, reviewed and
            // parity-tested (outputs in poisoned buffers, so a stray write
            // fails a test); their loops are bounded by their parameters.
            unsafe {
                self.device
                    .create_shader_module_trusted(desc, wgpu::ShaderRuntimeChecks::unchecked())
            }
        };
        let constants: Vec<(&str, f64)> = variant
            .constants
            .iter()
            .map(|(n, v)| (*n, *v as f64))
            .collect();
        let pipeline = self
            .device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(k.name),
                layout: Some(&layout.1),
                module: &module,
                entry_point: Some(k.entry),
                compilation_options: wgpu::PipelineCompilationOptions {
                    constants: &constants,
                    zero_initialize_workgroup_memory: false,
                },
                cache: None,
            });
        if let Some(err) = super::wait::block_on(scope.pop()) {
            return Err(Error::gpu(format!(
                "kernel {} variant {}: {err}",
                k.name, key.1
            )));
        }
        let pipeline = Arc::new(pipeline);
        self.pipelines
            .lock()
            .expect("pipeline cache poisoned")
            .insert(key, pipeline.clone());
        Ok(pipeline)
    }

    /// Binds `buffers` (in the kernel's declared order) and `params` to `k`,
    /// checking them against the declaration. The result can be recorded into
    /// any number of passes: decode binds once and records every token.
    pub fn bind<P: bytemuck::Pod>(
        &self,
        k: &'static Kernel,
        variant: &Variant,
        buffers: &[&wgpu::Buffer],
        params: &P,
    ) -> Result<Bound> {
        assert_eq!(
            std::mem::size_of::<P>(),
            k.params_size,
            "kernel {}: params struct is {} bytes, declared {}",
            k.name,
            std::mem::size_of::<P>(),
            k.params_size
        );
        let params = if k.params_size > 0 {
            use wgpu::util::DeviceExt;
            Some(
                self.device
                    .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                        label: Some(k.name),
                        contents: bytemuck::bytes_of(params),
                        usage: wgpu::BufferUsages::UNIFORM,
                    }),
            )
        } else {
            None
        };
        self.bind_with_uniform(k, variant, buffers, params.as_ref())
    }

    /// As [`Gpu::bind`], with a caller-owned uniform buffer (so the caller can
    /// rewrite the params between submissions).
    pub fn bind_with_uniform(
        &self,
        k: &'static Kernel,
        variant: &Variant,
        buffers: &[&wgpu::Buffer],
        params: Option<&wgpu::Buffer>,
    ) -> Result<Bound> {
        assert_eq!(
            buffers.len(),
            k.bindings.len(),
            "kernel {}: {} buffers given, declared {:?}",
            k.name,
            buffers.len(),
            k.bindings.iter().map(|b| b.name).collect::<Vec<_>>()
        );
        assert_eq!(
            params.is_some(),
            k.params_size > 0,
            "kernel {}: params presence",
            k.name
        );
        for (b, decl) in buffers.iter().zip(k.bindings) {
            assert!(
                b.usage().contains(wgpu::BufferUsages::STORAGE),
                "kernel {}: buffer for {} is not a storage buffer",
                k.name,
                decl.name
            );
            if b.size() > self.caps.max_binding {
                return Err(Error::gpu(format!(
                    "kernel {}: buffer for {} is {} bytes, over the adapter's {} byte binding limit",
                    k.name,
                    decl.name,
                    b.size(),
                    self.caps.max_binding
                )));
            }
        }
        let pipeline = self.pipeline(k, variant)?;
        let layout = self.layout(k);
        let mut entries = Vec::new();
        if let Some(p) = params {
            entries.push(wgpu::BindGroupEntry {
                binding: 0,
                resource: p.as_entire_binding(),
            });
        }
        for (i, b) in buffers.iter().enumerate() {
            entries.push(wgpu::BindGroupEntry {
                binding: i as u32 + 1,
                resource: b.as_entire_binding(),
            });
        }
        let bind_group = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(k.name),
            layout: &layout.0,
            entries: &entries,
        });
        Ok(Bound {
            name: k.name,
            pipeline,
            bind_group,
            indirect: None,
        })
    }

    /// Records `work` into one command buffer, submits it and waits.
    pub fn run(&self, work: &[(&Bound, [u32; 3])]) -> Result<()> {
        let mut enc = self.device.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            for (b, groups) in work {
                b.record(&mut pass, *groups);
            }
        }
        self.submit_and_wait(enc)
    }

    pub fn submit_and_wait(&self, enc: wgpu::CommandEncoder) -> Result<()> {
        let idx = self.queue.submit([enc.finish()]);
        self.device
            .poll(wgpu::PollType::Wait {
                submission_index: Some(idx),
                timeout: None,
            })
            .map_err(|e| Error::gpu(format!("waiting for the device: {e}")))?;
        Ok(())
    }
}

/// A kernel with its buffers bound, ready to record.
pub struct Bound {
    pub name: &'static str,
    pipeline: Arc<wgpu::ComputePipeline>,
    bind_group: wgpu::BindGroup,
    /// Where the workgroup counts are when the device writes them (a
    /// buffer of `INDIRECT` usage and the offset of the three u32s).
    indirect: Option<(wgpu::Buffer, u64)>,
}

impl Bound {
    /// This kernel launched with the workgroup counts at `offset` in `args`,
    /// which an earlier dispatch writes: `record`'s counts are then ignored.
    pub fn indirect(mut self, args: &wgpu::Buffer, offset: u64) -> Bound {
        self.indirect = Some((args.clone(), offset));
        self
    }

    pub fn record(&self, pass: &mut wgpu::ComputePass<'_>, groups: [u32; 3]) {
        pass.set_pipeline(&self.pipeline);
        pass.set_bind_group(0, &self.bind_group, &[]);
        if let Some((args, offset)) = &self.indirect {
            pass.dispatch_workgroups_indirect(args, *offset);
            return;
        }
        debug_assert!(
            groups.iter().all(|&g| g > 0),
            "kernel {}: empty dispatch",
            self.name
        );
        pass.dispatch_workgroups(groups[0], groups[1], groups[2]);
    }
}
