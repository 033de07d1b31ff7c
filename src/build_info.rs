//! Facts about how this copy of the crate was built (set by build.rs).

/// `ptxas -v` output for every kernel, with a per-kernel summary (target/<profile>/ptxas-report.txt).
pub const PTXAS_REPORT: &str = env!("FA_PTXAS_REPORT");
/// The static GPU kernel library that was linked in.
pub const GPU_LIBRARY: &str = env!("FA_GPU_LIB");
/// The SASS architectures compiled (FA_CUDA_ARCHS at build time, e.g. "80,86,89,90a").
pub const CUDA_ARCHS: &str = env!("FA_CUDA_ARCHS");
