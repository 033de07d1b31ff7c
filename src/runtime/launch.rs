//! The only place raw pointers are taken from views. A `Launch` collects, for one op, the pointers of its
//! arguments (checking backend, context and alignment), keeps cudarc's stream-ordering guards alive until the
//! launch is enqueued, lists the host buffers for the emulator's bounds checks, and finally calls the op's
//! launcher (host code: validation and launch geometry, the same for both backends), which either runs the
//! kernels on the emulator or records them for [`crate::kernels::enqueue`] (driver API, caller's stream).
//! Nothing here allocates device memory or synchronises.

use std::ffi::{c_void, CStr};
use std::sync::Arc;

use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, DeviceSlice, DriverError, SyncOnDrop};

use crate::device::Stream;
use crate::emu::{run_emulated, status_error};
use crate::error::{Error, Result};
use crate::sys;
use crate::tensor::{Mem, MemMut, TensorView, TensorViewMut};

/// An `extern "C"` launcher from abi.h: `int fa_<op>(Params, FaExec *)`.
pub(crate) type Launcher<P> = unsafe extern "C" fn(P, *mut sys::FaExec) -> i32;

pub(crate) struct Launch<'a> {
    stream: Stream<'a>,
    guards: Vec<SyncOnDrop<'a>>,
    regions: Vec<sys::FaEmuRegion>,
    /// A GPU context's sticky error recorded by other code before this launch began (cudarc keeps one,
    /// read and cleared by `check_err`): taken out so that what this launch's guards and kernels record is
    /// told apart, and put back (run's end, or drop) for whoever owns it.
    earlier: Option<DriverError>,
}

impl<'a> Launch<'a> {
    pub fn new(stream: Stream<'a>) -> Self {
        let earlier = match stream {
            Stream::Gpu(s) => s.context().check_err().err(),
            _ => None,
        };
        Launch { stream, guards: Vec::new(), regions: Vec::new(), earlier }
    }

    fn gpu_stream(&self, name: &CStr, view_stream: &Arc<CudaStream>) -> Result<&'a CudaStream> {
        match self.stream {
            Stream::Gpu(s) => {
                // The driver's context, not the Arc: two CudaContext::new(0) (candle's device and an engine's
                // own) share the primary context, and their memory is interchangeable.
                if s.context().cu_ctx() != view_stream.context().cu_ctx() {
                    return Err(Error::backend(&name.to_string_lossy(), "GPU memory of another CUDA context"));
                }
                Ok(s)
            }
            Stream::Raw(_) => Err(Error::backend(
                &name.to_string_lossy(),
                "a cudarc view passed with a raw stream (use Stream::Gpu, or raw device views)",
            )),
            Stream::Emu(_) => Err(Error::backend(&name.to_string_lossy(), "GPU memory passed to an emulator launch")),
        }
    }

    fn device_ptr(&self, name: &CStr, ptr: u64) -> Result<usize> {
        match self.stream {
            Stream::Gpu(_) | Stream::Raw(_) => Ok(ptr as usize),
            Stream::Emu(_) => {
                Err(Error::backend(&name.to_string_lossy(), "device memory passed to an emulator launch"))
            }
        }
    }

    fn host_region(&mut self, name: &'static CStr, base: *const c_void, bytes: usize, writable: bool) -> Result<()> {
        if !matches!(self.stream, Stream::Emu(_)) {
            return Err(Error::backend(&name.to_string_lossy(), "host memory passed to a GPU launch"));
        }
        self.regions.push(sys::FaEmuRegion {
            base,
            bytes: bytes as u64,
            writable: writable as i32,
            name: name.as_ptr(),
        });
        Ok(())
    }

    /// Pointer of a read-only argument whose base must be `align` bytes aligned.
    pub fn input<T, const N: usize>(
        &mut self,
        name: &'static CStr,
        view: &'a TensorView<'_, T, N>,
        align: usize,
    ) -> Result<*const c_void> {
        let ptr = match &view.mem {
            Mem::Gpu(v) => {
                let s = self.gpu_stream(name, v.stream())?;
                let (p, guard) = v.device_ptr(s);
                self.guards.push(guard);
                p as usize
            }
            Mem::Device(d) => self.device_ptr(name, d.ptr)?,
            Mem::Host(h) => {
                self.host_region(name, h.as_ptr().cast(), std::mem::size_of_val(*h), false)?;
                h.as_ptr() as usize
            }
        };
        check_align(name, ptr, align)?;
        Ok(ptr as *const c_void)
    }

    /// Pointer of an argument the kernel writes.
    pub fn output<T, const N: usize>(
        &mut self,
        name: &'static CStr,
        view: &'a mut TensorViewMut<'_, T, N>,
        align: usize,
    ) -> Result<*mut c_void> {
        let ptr = match &mut view.mem {
            MemMut::Gpu(v) => {
                let s = self.gpu_stream(name, v.stream())?;
                let (p, guard) = v.device_ptr_mut(s);
                self.guards.push(guard);
                p as usize
            }
            MemMut::Device(d) => self.device_ptr(name, d.ptr)?,
            MemMut::Host(h) => {
                self.host_region(name, h.as_ptr().cast(), std::mem::size_of_val(*h), true)?;
                h.as_mut_ptr() as usize
            }
        };
        check_align(name, ptr, align)?;
        Ok(ptr as *mut c_void)
    }

    /// Enqueues the op's kernels on the GPU stream, or runs them on the emulator. `params` must hold only
    /// pointers obtained from this `Launch`.
    pub fn run<P>(mut self, kernel: &str, params: P, launcher: Launcher<P>) -> Result<()> {
        match self.stream {
            Stream::Gpu(s) => {
                let ctx = s.context();
                ctx.bind_to_thread()?;
                let exec = record(kernel, params, launcher)?;
                // SAFETY: params hold pointers into views borrowed for this launch (checked for backend,
                // context, extent and alignment), ordered on `s` by the guards dropped below.
                let enqueued = unsafe { crate::kernels::enqueue(ctx.cu_ctx(), s.cu_stream(), launches(&exec)) }
                    .map_err(|e| e.context(kernel));
                // cudarc's stream-ordering guards record events on drop (and on creation, in `input` /
                // `output`); a failure there is recorded in the context, not returned: collect this
                // launch's, then put back what others recorded before it (`earlier`, on drop).
                drop(std::mem::take(&mut self.guards));
                let ours = ctx.check_err();
                drop(self);
                enqueued?;
                ours?;
                Ok(())
            }
            Stream::Raw(r) => {
                let exec = record(kernel, params, launcher)?;
                // SAFETY: raw views carry the caller's contract (TensorView::from_device_ptr) for `r`.
                r.with_context(|| unsafe { crate::kernels::enqueue(r.cu_context(), r.cu_stream(), launches(&exec)) })
                    .map_err(|e| e.context(kernel))
            }
            Stream::Emu(e) => {
                // SAFETY: as above; the emulator additionally confines every access to `regions`.
                let result = run_emulated(kernel, &self.regions, e.take_seed(), |st| unsafe { launcher(params, st) });
                match result {
                    Ok(counters) => {
                        e.record_counters(Some(counters));
                        Ok(())
                    }
                    Err(err) => {
                        e.record_counters(None);
                        Err(err)
                    }
                }
            }
        }
    }
}

impl Drop for Launch<'_> {
    fn drop(&mut self) {
        if let (Stream::Gpu(s), Some(e)) = (self.stream, self.earlier.take()) {
            s.context().record_err::<()>(Err(e));
        }
    }
}

/// Runs `launcher` in record mode: validation and launch geometry, no execution.
fn record<P>(kernel: &str, params: P, launcher: Launcher<P>) -> Result<Box<sys::FaExec>> {
    // SAFETY: FaExec is plain old data; all-zero is a valid (empty) value.
    let mut exec: Box<sys::FaExec> = Box::new(unsafe { std::mem::zeroed() });
    exec.mode = sys::FA_EXEC_RECORD as i32;
    // SAFETY: in record mode the launcher only validates and writes into `exec`.
    let status = unsafe { launcher(params, &mut *exec) };
    if status != 0 {
        return Err(status_error(kernel, "gpu", status, None));
    }
    Ok(exec)
}

fn launches(exec: &sys::FaExec) -> &[sys::FaKernelLaunch] {
    &exec.launches[..exec.num_launches.clamp(0, exec.launches.len() as i32) as usize]
}

/// The softmax scale of a call: `scale` or 1/sqrt(D). Prefill and decode both need it finite and positive
/// (their kernels take the row max of unscaled scores and fold the scale in afterwards).
pub(crate) fn softmax_scale(scale: Option<f32>, head_dim: usize) -> Result<f32> {
    let scale = scale.unwrap_or(1.0 / (head_dim as f32).sqrt());
    if !(scale.is_finite() && scale > 0.0) {
        return Err(Error::unsupported("scale", format!("{scale} (must be finite and positive)")));
    }
    Ok(scale)
}

fn check_align(name: &CStr, ptr: usize, align: usize) -> Result<()> {
    if align > 1 && ptr % align != 0 {
        return Err(Error::alignment(&name.to_string_lossy(), format!("address {ptr:#x} is not {align}-byte aligned")));
    }
    Ok(())
}
