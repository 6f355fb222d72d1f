//! The kernel registry: every WGSL kernel is declared exactly once, here or in
//! a domain module listed in [`all`]. A declaration names the source file, the
//! storage bindings in order and the size of its uniform params struct;
//! [`crate::gpu::Gpu::bind`] checks every dispatch against it.
//!
//! Binding convention (all kernels): `@group(0) @binding(0)` is the uniform
//! params struct when `params_size > 0`; storage buffers follow at bindings
//! 1, 2, ... in declaration order.

/// How a kernel uses one storage binding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    Read,
    ReadWrite,
}

#[derive(Clone, Copy, Debug)]
pub struct Binding {
    pub name: &'static str,
    pub access: Access,
}

impl Binding {
    pub const fn read(name: &'static str) -> Binding {
        Binding {
            name,
            access: Access::Read,
        }
    }
    pub const fn write(name: &'static str) -> Binding {
        Binding {
            name,
            access: Access::ReadWrite,
        }
    }
}

/// One kernel: a WGSL source with one entry point.
#[derive(Debug)]
pub struct Kernel {
    /// Same name as the CPU twin in `crate::cpu` and the parity case.
    pub name: &'static str,
    pub source: &'static str,
    /// The files under `shaders/` that `source` concatenates, in order.
    pub files: &'static [&'static str],
    pub entry: &'static str,
    pub bindings: &'static [Binding],
    pub params_size: usize,
    /// Variants a parity test must cover (every combination of defines the
    /// engine dispatches). The first is the portable one.
    pub variants: &'static [&'static [&'static str]],
}

impl Kernel {
    /// The WGSL source: the built-in copy, or, when `LFM_SHADER_DIR` names a
    /// folder, the same files read from there at pipeline creation (for
    /// trying kernel changes without rebuilding).
    pub fn wgsl(&self) -> std::io::Result<std::borrow::Cow<'static, str>> {
        let Some(dir) = std::env::var_os("LFM_SHADER_DIR") else {
            return Ok(self.source.into());
        };
        let mut text = String::new();
        for f in self.files {
            let path = std::path::Path::new(&dir).join(f);
            let part = std::fs::read_to_string(&path)
                .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
            text += &part;
            if self.files.len() > 1 {
                text.push('\n');
            }
        }
        Ok(text.into())
    }
}

/// A compiled form of a kernel: preprocessor defines (features such as
/// `SUBGROUPS`, `F16`, or a weight format) and WGSL `override` constants
/// (workgroup size, tile sizes).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Variant {
    pub defines: Vec<&'static str>,
    pub constants: Vec<(&'static str, u32)>,
}

impl Variant {
    pub fn new(defines: &[&'static str]) -> Variant {
        let mut defines = defines.to_vec();
        defines.sort_unstable();
        defines.dedup();
        Variant {
            defines,
            constants: Vec::new(),
        }
    }

    pub fn with(mut self, name: &'static str, value: u32) -> Variant {
        self.constants.retain(|(n, _)| *n != name);
        self.constants.push((name, value));
        self.constants.sort_unstable();
        self
    }

    /// Stable text form, used as the pipeline cache key and in messages.
    pub fn key(&self) -> String {
        let mut s = self.defines.join("+");
        for (n, v) in &self.constants {
            s.push_str(&format!(",{n}={v}"));
        }
        if s.is_empty() {
            s.push_str("default");
        }
        s
    }
}

/// Every registered kernel, from every domain.
pub fn all() -> impl Iterator<Item = &'static Kernel> {
    [
        super::ops::KERNELS,
        super::dense::KERNELS,
        super::llm_ops::KERNELS,
        super::vision::KERNELS,
        super::speech::KERNELS,
        super::whisper::KERNELS,
    ]
    .into_iter()
    .flatten()
    .copied()
}

/// Declares a kernel whose source is `shaders/<file>`, or several files
/// concatenated in order (a shared function library first, then the kernel).
#[macro_export]
macro_rules! kernel {
    ($ident:ident, $name:literal, [$($file:literal),+ $(,)?], [$($b:expr),* $(,)?], $params:ty, [$($v:expr),* $(,)?]) => {
        pub static $ident: $crate::gpu::Kernel = $crate::gpu::Kernel {
            name: $name,
            source: concat!($(include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/shaders/", $file)), "\n"),+),
            files: &[$($file),+],
            entry: "main",
            bindings: &[$($b),*],
            params_size: std::mem::size_of::<$params>(),
            variants: &[$($v),*],
        };
    };
    ($ident:ident, $name:literal, $file:literal, [$($b:expr),* $(,)?], $params:ty, [$($v:expr),* $(,)?]) => {
        pub static $ident: $crate::gpu::Kernel = $crate::gpu::Kernel {
            name: $name,
            source: include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/shaders/", $file)),
            files: &[$file],
            entry: "main",
            bindings: &[$($b),*],
            params_size: std::mem::size_of::<$params>(),
            variants: &[$($v),*],
        };
    };
}
