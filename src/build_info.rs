//! Facts about how this copy of the crate was built (set by build.rs).

/// Path of this build's `ptxas -v` output for every kernel, with a per-kernel summary (in the build script's
/// OUT_DIR; a kernel build copies it to `target/<profile>/ptxas-report.txt`); says why when no GPU kernels
/// were built.
pub const PTXAS_REPORT: &str = env!("FA_PTXAS_REPORT");
/// Directory of the fatbins embedded in the crate (`<op>.fatbin`, one per kernels/*.cu), for SASS checks.
pub const FATBIN_DIR: &str = env!("FA_FATBIN_DIR");
/// The GPU targets the kernels were built for, sorted ("80,86,89,90a,100,120", the fat list a build machine
/// without a GPU uses; FA_CUDA_ARCHS, CUDA_COMPUTE_CAP or the build machine's GPUs otherwise: docs/build.md);
/// empty without kernels. Which SASS and PTX each fatbin holds for them: [`support`], and the header of
/// [`PTXAS_REPORT`] (build.rs, `gencode_flags`).
pub const CUDA_ARCHS: &str = env!("FA_CUDA_ARCHS");
/// The CUDA toolkit version the kernels were built with ("13.0"); empty without kernels.
pub const CUDA_VERSION: &str = env!("FA_CUDA_VERSION");

/// Whether this build has GPU kernels (the `cuda` feature, with nvcc found at build time).
pub fn has_gpu_kernels() -> bool {
    crate::kernels::available()
}

/// Whether the embedded fatbin at `path` holds sm_90a-only kernels (kernels/*_sm90.cu: SASS for 90a alone,
/// no PTX).
pub fn is_sm90_only(path: &std::path::Path) -> bool {
    path.file_stem().is_some_and(|s| s.to_string_lossy().ends_with("_sm90"))
}

/// Paths of the embedded fatbins.
pub fn fatbins() -> Vec<std::path::PathBuf> {
    crate::kernels::FATBINS
        .iter()
        .map(|(name, ..)| std::path::Path::new(FATBIN_DIR).join(format!("{name}.fatbin")))
        .collect()
}

/// How this build's kernels run on a GPU of one compute capability ([`support`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelSupport {
    /// The GPU's compute capability, 10 · major + minor.
    pub compute_capability: u32,
    /// The SASS the driver runs there, per arch ("sm_80", "sm_89"), with the fatbins that use it.
    pub sass: Vec<(String, Vec<&'static str>)>,
    /// PTX the driver JIT-compiles at the first load in a process ("compute_80"), with its fatbins: a
    /// GPU newer than every SASS of the build (slow first load; correct, but not the code the tests checked).
    pub jit: Vec<(String, Vec<&'static str>)>,
    /// Whether the sm_90a kernels (the warp-specialised wgmma/TMA prefill) run there: 9.0 with them built.
    pub hopper_kernels: bool,
}

impl std::fmt::Display for KernelSupport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let list = |v: &[(String, Vec<&str>)]| v.iter().map(|(a, _)| a.as_str()).collect::<Vec<_>>().join(" + ");
        let cc = self.compute_capability;
        write!(f, "sm_{cc}: ")?;
        if !self.sass.is_empty() {
            write!(f, "SASS {}", list(&self.sass))?;
        }
        if !self.jit.is_empty() {
            let sep = if self.sass.is_empty() { "" } else { ", " };
            write!(f, "{sep}PTX {} JIT-compiled by the driver", list(&self.jit))?;
        }
        if self.hopper_kernels {
            write!(f, " (with the sm_90a kernels)")?;
        }
        write!(f, "; built for {CUDA_ARCHS} with CUDA {CUDA_VERSION}")
    }
}

/// What serves a GPU of compute capability `major.minor` in this build: for each embedded fatbin the SASS
/// the driver picks (the highest `sm_XY` of the same major with Y <= minor) or else its PTX (a
/// `compute_XY` at or below the GPU, JIT-compiled), the rule the driver follows. An `Arch` error when a
/// fatbin has neither (a GPU older than every target, or a native build run on another GPU), naming the
/// archs built and how to add one; `NoKernels` in a build without kernels.
pub fn support(major: u32, minor: u32) -> crate::Result<KernelSupport> {
    use crate::error::{Error, ErrorKind};
    if !has_gpu_kernels() {
        return Err(crate::kernels::no_kernels_error("build_info::support"));
    }
    let cc = 10 * major + minor;
    let mut out = KernelSupport { compute_capability: cc, sass: Vec::new(), jit: Vec::new(), hopper_kernels: false };
    let add = |list: &mut Vec<(String, Vec<&'static str>)>, arch: String, name: &'static str| match list
        .iter_mut()
        .find(|(a, _)| *a == arch)
    {
        Some((_, names)) => names.push(name),
        None => list.push((arch, vec![name])),
    };
    for &(name, _, sm90_only, sass, ptx) in crate::kernels::FATBINS {
        if sm90_only {
            out.hopper_kernels |= cc == 90;
            continue; // optional: the launchers fall back to the sm_80-class kernels elsewhere
        }
        if let Some(&s) = sass.iter().filter(|&&s| s / 10 == cc / 10 && s <= cc).max() {
            add(&mut out.sass, format!("sm_{s}"), name);
        } else if ptx != 0 && ptx <= cc {
            add(&mut out.jit, format!("compute_{ptx}"), name);
        } else {
            return Err(Error::new(
                ErrorKind::Arch,
                format!(
                    "this GPU is sm_{cc}, and fused-attn's {name} kernels were built with no SASS or PTX it can                      run (SASS {}{}; built for FA_CUDA_ARCHS={CUDA_ARCHS}): rebuild fused-attn with its arch added,                      FA_CUDA_ARCHS={CUDA_ARCHS},{cc} (or FA_CUDA_ARCHS=native on a machine with this GPU, or all)",
                    sass.iter().map(|s| format!("sm_{s}")).collect::<Vec<_>>().join(", "),
                    if ptx != 0 { format!(", PTX compute_{ptx}") } else { String::new() },
                ),
            ));
        }
    }
    out.sass.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use crate::error::ErrorKind;

    /// Built without GPU kernels (`--no-default-features`), every GPU entry says so by kind; with them, the
    /// embedded fatbins are there and the toolkit version is known. (scripts/test runs this both ways: the
    /// main build, and the packaged crate's emulator-only build.)
    #[test]
    fn gpu_kernels_are_present_exactly_when_built() {
        let built = super::has_gpu_kernels();
        assert_eq!(
            built,
            cfg!(feature = "cuda"),
            "feature cuda = {} but kernels built = {built}",
            cfg!(feature = "cuda")
        );
        if built {
            assert!(super::CUDA_VERSION.starts_with(char::is_numeric));
            assert!(!super::CUDA_ARCHS.is_empty());
        } else {
            let e = super::support(9, 0).unwrap_err();
            assert_eq!(*e.kind(), ErrorKind::NoKernels, "{e}");
            let e = crate::device::cuda_context(0).unwrap_err();
            assert!(matches!(e.kind(), ErrorKind::NoKernels | ErrorKind::NoDriver), "{e}");
        }
    }
}
