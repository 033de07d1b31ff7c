//! Where a launch runs: the caller's CUDA stream (a cudarc stream, or a raw `CUstream` of any CUDA stack),
//! or the host emulator. Probing for a GPU never panics (cudarc panics when libcuda is missing, so the
//! driver library is probed first).

use std::sync::Arc;

use cudarc::driver::sys::{self, CUcontext, CUresult, CUstream};
use cudarc::driver::{CudaContext, CudaStream};

use crate::emu::Emulator;
use crate::error::{Error, ErrorKind, Result};

/// The backend of one launch. Ops enqueue on it and return; nothing synchronises the host.
#[derive(Clone, Copy)]
pub enum Stream<'a> {
    /// The caller's cudarc stream on a GPU; views must be cudarc views of its context, or raw device views
    /// ([`crate::TensorView::from_device_ptr`]). (An `Arc` so that reusable objects such as the decode
    /// workspace can allocate on the caller's stream.)
    Gpu(&'a Arc<CudaStream>),
    /// A raw driver-API stream of another CUDA stack (an engine's own allocator and streams): views must be
    /// raw device views. See [`RawStream::new`] for the contract.
    Raw(RawStream),
    /// The host SIMT executor running the same kernel sources; views must be host slices. Launches run
    /// to completion before returning.
    Emu(&'a Emulator),
}

impl Stream<'_> {
    pub fn backend_name(&self) -> &'static str {
        match self {
            Stream::Gpu(_) | Stream::Raw(_) => "gpu",
            Stream::Emu(_) => "emu",
        }
    }
}

/// A raw `CUstream` and the context it belongs to.
#[derive(Clone, Copy, Debug)]
pub struct RawStream {
    stream: CUstream,
    ctx: CUcontext,
}

// SAFETY: driver handles are identifiers usable from any thread (the driver API is thread-safe).
unsafe impl Send for RawStream {}
unsafe impl Sync for RawStream {}

impl RawStream {
    /// Wraps a driver-API stream. Launches on it push its context for the duration of the call and pop it
    /// again, so the calling thread's current context is left as it was.
    ///
    /// # Safety
    /// `stream` must be a valid stream handle (not the legacy null stream) and stay valid, with its context,
    /// for as long as this value (and every launch enqueued through it) is in use.
    pub unsafe fn new(stream: CUstream) -> Result<Self> {
        if stream.is_null() {
            return Err(Error::new(
                ErrorKind::Usage,
                "RawStream::new: the null (legacy default) stream is not supported",
            ));
        }
        let mut ctx: CUcontext = std::ptr::null_mut();
        // SAFETY: `stream` is valid by the caller's contract; writes one handle.
        let r = unsafe { sys::cuStreamGetCtx(stream, &mut ctx) };
        if r != CUresult::CUDA_SUCCESS {
            return Err(Error::from(cudarc::driver::DriverError(r)).context("RawStream::new (cuStreamGetCtx)"));
        }
        Ok(Self { stream, ctx })
    }
    /// A value over handles that are only compared, never used (unit tests of the checks that compare them).
    #[cfg(test)]
    pub(crate) fn from_raw_parts_for_tests(stream: CUstream, ctx: CUcontext) -> Self {
        Self { stream, ctx }
    }
    pub fn cu_stream(&self) -> CUstream {
        self.stream
    }
    pub fn cu_context(&self) -> CUcontext {
        self.ctx
    }

    /// Runs `f` with this stream's context current on the calling thread (pushed, then popped).
    pub(crate) fn with_context<R>(&self, f: impl FnOnce() -> Result<R>) -> Result<R> {
        // SAFETY: the context is valid by RawStream::new's contract.
        let r = unsafe { sys::cuCtxPushCurrent_v2(self.ctx) };
        if r != CUresult::CUDA_SUCCESS {
            return Err(Error::from(cudarc::driver::DriverError(r)).context("cuCtxPushCurrent"));
        }
        let out = f();
        let mut popped: CUcontext = std::ptr::null_mut();
        // SAFETY: pops what was pushed above.
        let r = unsafe { sys::cuCtxPopCurrent_v2(&mut popped) };
        let out = out?;
        if r != CUresult::CUDA_SUCCESS {
            return Err(Error::from(cudarc::driver::DriverError(r)).context("cuCtxPopCurrent"));
        }
        Ok(out)
    }

    /// Number of SMs of this stream's device (the split-KV planner uses it).
    pub fn sm_count(&self) -> Result<usize> {
        self.with_context(|| {
            let mut dev: sys::CUdevice = 0;
            let mut n: i32 = 0;
            // SAFETY: the stream's context is current; each call writes one integer.
            let r = unsafe { sys::cuCtxGetDevice(&mut dev) };
            if r != CUresult::CUDA_SUCCESS {
                return Err(Error::from(cudarc::driver::DriverError(r)));
            }
            let a = sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT;
            // SAFETY: as above.
            let r = unsafe { sys::cuDeviceGetAttribute(&mut n, a, dev) };
            if r != CUresult::CUDA_SUCCESS {
                return Err(Error::from(cudarc::driver::DriverError(r)));
            }
            Ok(n.max(1) as usize)
        })
    }
}

/// True when a CUDA driver library can be loaded (checked without touching cudarc's panicking loader). Probed
/// with libloading rather than cudarc's `is_culib_present`, which exists only in cudarc's dynamic-loading mode:
/// candle's `cuda` feature switches cudarc to dynamic-linking.
pub fn driver_present() -> bool {
    let names: &[&str] = if cfg!(windows) { &["nvcuda.dll"] } else { &["libcuda.so.1", "libcuda.so"] };
    // SAFETY: only attempts to dlopen the driver library by name; loads nothing else.
    names.iter().any(|&name| unsafe { libloading::Library::new(name) }.is_ok())
}

/// A context on GPU `ordinal` with fused-attn's kernels loaded, or a typed error: NoDriver when libcuda is
/// absent, NoDevice when the driver reports no such GPU, Arch when its compute capability is below sm_80,
/// when this build has neither SASS nor usable PTX for it (the message names the archs built and how to add
/// it; [`kernel_support`] says what serves a GPU), or when the driver is older than the toolkit the kernels
/// were built with, NoKernels when this build has no GPU kernels. (Contexts made elsewhere work too: kernels load on their first launch, or through
/// [`load_kernels`], which is worth calling before capturing a CUDA graph.)
pub fn cuda_context(ordinal: usize) -> Result<Arc<CudaContext>> {
    if !driver_present() {
        return Err(Error::new(ErrorKind::NoDriver, "no CUDA driver (libcuda.so) could be loaded"));
    }
    check_driver_version()?;
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
    load_kernels(&ctx)?;
    Ok(ctx)
}

/// What runs on `ctx`'s GPU: its arch and the SASS (or JIT-compiled PTX) of this build that serves it
/// ([`crate::build_info::support`]; its `Display` is one line for a log), or the `Arch` error that
/// [`cuda_context`] would give, naming the archs built and how to add the GPU's.
pub fn kernel_support(ctx: &CudaContext) -> Result<crate::kernels::KernelSupport> {
    let (major, minor) = ctx.compute_capability()?;
    crate::kernels::support(major as u32, minor as u32)
}

/// Loads the embedded kernels into `ctx` now (otherwise the first launch in a context does it).
pub fn load_kernels(ctx: &Arc<CudaContext>) -> Result<()> {
    ctx.bind_to_thread()?;
    crate::kernels::ensure_loaded(ctx.cu_ctx())
}

/// NoKernels without GPU kernels; Arch when the driver is older than the CUDA major version the kernels were
/// built with (it could not load them), saying what to do.
pub fn check_driver_version() -> Result<()> {
    let Some(need) = crate::kernels::required_driver_version() else {
        return Err(crate::kernels::no_kernels_error("cuda_context"));
    };
    let mut have: i32 = 0;
    // SAFETY: writes one integer; the driver library is present (checked by the callers).
    let r = unsafe { sys::cuDriverGetVersion(&mut have) };
    if r != CUresult::CUDA_SUCCESS {
        return Err(Error::from(cudarc::driver::DriverError(r)).context("cuDriverGetVersion"));
    }
    if have < need {
        return Err(Error::new(
            ErrorKind::Arch,
            format!(
                "the CUDA driver supports CUDA {}.{}, but the kernels were built with CUDA {} (they need a \
                 CUDA {}.x driver): update the driver, or rebuild fused-attn with a CUDA {}.x toolkit (NVCC=...)",
                have / 1000,
                (have % 1000) / 10,
                env!("FA_CUDA_VERSION"),
                need / 1000,
                have / 1000
            ),
        ));
    }
    Ok(())
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
                assert!(
                    matches!(
                        e.kind(),
                        ErrorKind::NoDriver | ErrorKind::NoDevice | ErrorKind::Arch | ErrorKind::NoKernels
                    ),
                    "{e}"
                );
                assert_eq!(driver_present(), e.kind() != &ErrorKind::NoDriver, "{e}");
                assert!(first_gpu().is_none());
            }
        }
        let e = cuda_context(1 << 20).unwrap_err();
        assert!(matches!(e.kind(), ErrorKind::NoDriver | ErrorKind::NoDevice), "{e}");
    }
}
