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

pub use crate::kernels::{support, KernelSupport};

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
