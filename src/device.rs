//! Where a launch runs: the caller's CUDA stream, or the host emulator. Probing for a GPU never panics
//! (cudarc panics when libcuda is missing, so the driver library is probed first).

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream};

use crate::emu::Emulator;
use crate::error::{Error, ErrorKind, Result};

/// The backend of one launch. Ops enqueue on it and return; nothing synchronises the host.
#[derive(Clone, Copy)]
pub enum Stream<'a> {
    /// The caller's stream on a GPU; device views must be cudarc views of that context. (An `Arc` so
    /// that reusable objects such as the decode workspace can allocate on the caller's stream.)
    Gpu(&'a Arc<CudaStream>),
    /// The host SIMT executor running the same kernel sources; views must be host slices. Launches run
    /// to completion before returning.
    Emu(&'a Emulator),
}

impl Stream<'_> {
    pub fn backend_name(&self) -> &'static str {
        match self {
            Stream::Gpu(_) => "gpu",
            Stream::Emu(_) => "emu",
        }
    }
}

/// True when a CUDA driver library can be loaded (checked without touching cudarc's panicking loader).
pub fn driver_present() -> bool {
    // SAFETY: only attempts to dlopen the driver library by name; loads nothing else.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// A context on GPU `ordinal`, or a typed error: NoDriver when libcuda is absent, NoDevice when the
/// driver reports no such GPU, Arch when its compute capability is below sm_80.
pub fn cuda_context(ordinal: usize) -> Result<Arc<CudaContext>> {
    if !driver_present() {
        return Err(Error::new(ErrorKind::NoDriver, "no CUDA driver (libcuda.so) could be loaded"));
    }
    let count = CudaContext::device_count()
        .map_err(|e| Error::new(ErrorKind::NoDevice, format!("CUDA driver reports no usable GPU: {e}")))?;
    if ordinal >= count.max(0) as usize {
        return Err(Error::new(ErrorKind::NoDevice, format!("GPU ordinal {ordinal} requested, {count} present")));
    }
    let ctx = CudaContext::new(ordinal)
        .map_err(|e| Error::new(ErrorKind::NoDevice, format!("cannot create a context on GPU {ordinal}: {e}")))?;
    let (major, minor) = ctx.compute_capability()?;
    if major < 8 {
        return Err(Error::new(
            ErrorKind::Arch,
            format!("GPU {ordinal} is sm_{major}{minor}; fused-attn kernels need sm_80 or newer"),
        ));
    }
    Ok(ctx)
}

/// The first GPU if there is a usable one, else `None` (the reason is dropped: use [`cuda_context`] to see it).
pub fn first_gpu() -> Option<Arc<CudaContext>> {
    cuda_context(0).ok()
}

/// Number of streaming multiprocessors (the split-KV planner and grids use it).
pub fn sm_count(ctx: &CudaContext) -> Result<usize> {
    let n = ctx.attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
    Ok(n.max(1) as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without a driver (CI) the probe is a typed error, not cudarc's panic; with a GPU it is a context.
    #[test]
    fn probing_never_panics_and_says_why() {
        match cuda_context(0) {
            Ok(ctx) => assert!(ctx.compute_capability().is_ok_and(|(major, _)| major >= 8)),
            Err(e) => {
                assert!(matches!(e.kind(), ErrorKind::NoDriver | ErrorKind::NoDevice | ErrorKind::Arch), "{e}");
                assert_eq!(driver_present(), e.kind() != &ErrorKind::NoDriver, "{e}");
                assert!(first_gpu().is_none());
            }
        }
        let e = cuda_context(1 << 20).unwrap_err();
        assert!(matches!(e.kind(), ErrorKind::NoDriver | ErrorKind::NoDevice), "{e}");
    }
}
