//! The GPU kernels: fatbins nvcc built from kernels/*.cu (embedded by build.rs), loaded into each CUDA
//! context once, lazily, through the driver API, and the launches a launcher recorded (abi.h, `FaExec`)
//! enqueued with `cuLaunchKernel` on the caller's stream. No CUDA runtime is involved.
//!
//! Modules are cached per context by the driver's unique context id (`cuCtxGetId`), so a context created at
//! the address of a destroyed one never sees stale modules; they stay loaded for the life of their context.
//! sm_90a-only fatbins (kernels/*_sm90.cu) hold SASS for compute capability 9.0 alone: they are loaded only
//! into contexts of such a device, and a launch of one of their kernels elsewhere is an `Arch` error.

use std::collections::HashMap;
use std::ffi::{c_void, CStr};
use std::sync::Mutex;

use cudarc::driver::sys::{self, CUcontext, CUfunction, CUmodule, CUresult, CUstream};

use crate::error::{Error, ErrorKind, Result};

/// 64-byte aligned storage for an embedded fatbin (the driver reads its headers in place).
#[repr(C, align(64))]
#[allow(dead_code)] // unused in builds without kernels (no fatbin to embed)
pub(crate) struct Aligned<B: ?Sized>(pub B);

/// An embedded fatbin: its name (the kernels/*.cu stem), its image, whether it is sm_90a-only, the SASS
/// archs it holds (compute capabilities, 80 = sm_80) and its PTX arch (0 for none). Written by build.rs.
pub(crate) type EmbeddedFatbin = (&'static str, &'static [u8], bool, &'static [u32], u32);

include!(concat!(env!("OUT_DIR"), "/fatbins.rs"));

/// Whether this build embeds GPU kernels (the `cuda` feature with nvcc found at build time).
pub fn available() -> bool {
    !FATBINS.is_empty()
}

/// The driver version (e.g. 13000 for CUDA 13.0) the embedded kernels need: their toolkit's major version
/// (CUDA minor-version compatibility covers the rest), or `None` without kernels.
pub fn required_driver_version() -> Option<i32> {
    let major: i32 = env!("FA_CUDA_VERSION").split('.').next()?.parse().ok()?;
    Some(major * 1000)
}

pub(crate) fn no_kernels_error(what: &str) -> Error {
    Error::new(
        ErrorKind::NoKernels,
        format!(
            "{what}: this copy of fused-attn was built without GPU kernels (the `cuda` feature is off, or no \
             nvcc was found at build time: set NVCC or CUDA_HOME, or run scripts/setup, and rebuild)"
        ),
    )
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
        write!(f, "; built for {} with CUDA {}", env!("FA_CUDA_ARCHS"), env!("FA_CUDA_VERSION"))
    }
}

/// What serves a GPU of compute capability `major.minor` in this build: for each embedded fatbin the SASS
/// the driver picks (the highest `sm_XY` of the same major with Y <= minor) or else its PTX (a
/// `compute_XY` at or below the GPU, JIT-compiled), the rule the driver follows. An `Arch` error when a
/// fatbin has neither (a GPU older than every target, or a native build run on another GPU), naming the
/// archs built and how to add one; `NoKernels` in a build without kernels.
pub fn support(major: u32, minor: u32) -> crate::Result<KernelSupport> {
    let archs = env!("FA_CUDA_ARCHS");
    if !available() {
        return Err(no_kernels_error("build_info::support"));
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
    for &(name, _, sm90_only, sass, ptx) in FATBINS {
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
                    "this GPU is sm_{cc}, and fused-attn's {name} kernels were built with no SASS or PTX it can run \
                     (SASS {}{}; built for FA_CUDA_ARCHS={archs}): rebuild fused-attn with its arch added, \
                     FA_CUDA_ARCHS={archs},{cc} (or FA_CUDA_ARCHS=native on a machine with this GPU, or all)",
                    sass.iter().map(|s| format!("sm_{s}")).collect::<Vec<_>>().join(", "),
                    if ptx != 0 { format!(", PTX compute_{ptx}") } else { String::new() },
                ),
            ));
        }
    }
    out.sass.sort();
    Ok(out)
}

struct ContextKernels {
    ctx_id: u64,
    modules: Vec<CUmodule>,
    /// sm_90a-only fatbins not loaded because the device is not compute capability 9.0 (name, sm_XY).
    skipped: Vec<(&'static str, i32)>,
    /// kernel name -> (function, dynamic shared memory limit set on it so far)
    functions: HashMap<String, (CUfunction, i32)>,
}

// SAFETY: CUDA driver handles are plain identifiers usable from any thread.
unsafe impl Send for ContextKernels {}

static CACHE: Mutex<Vec<ContextKernels>> = Mutex::new(Vec::new());

fn check(r: CUresult) -> Result<()> {
    if r == CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(Error::from(cudarc::driver::DriverError(r)))
    }
}

/// Unique id of `ctx` (stable for the process lifetime, never reused).
fn context_id(ctx: CUcontext) -> Result<u64> {
    let mut id: std::ffi::c_ulonglong = 0;
    // SAFETY: writes one integer; `ctx` is a live context handle supplied by the caller.
    check(unsafe { sys::cuCtxGetId(ctx, &mut id) })?;
    Ok(id)
}

/// Loads every embedded module into `ctx` (which must be current on this thread) unless already loaded.
pub(crate) fn ensure_loaded(ctx: CUcontext) -> Result<()> {
    if !available() {
        return Err(no_kernels_error("loading kernels"));
    }
    let id = context_id(ctx)?;
    let mut cache = CACHE.lock().map_err(|_| Error::new(ErrorKind::Cuda, "kernel cache poisoned"))?;
    if cache.iter().any(|c| c.ctx_id == id) {
        return Ok(());
    }
    let cc = compute_capability()?;
    // A GPU no fatbin has SASS or usable PTX for: say which archs were built and how to add one, instead of
    // the driver's CUDA_ERROR_NO_BINARY_FOR_GPU.
    support(cc as u32 / 10, cc as u32 % 10)?;
    let mut modules = Vec::with_capacity(FATBINS.len());
    let mut skipped = Vec::new();
    for &(name, image, sm90_only, ..) in FATBINS {
        if sm90_only && cc != 90 {
            skipped.push((name, cc));
            continue;
        }
        let mut module: CUmodule = std::ptr::null_mut();
        // SAFETY: `image` is a complete fatbin, 64-byte aligned and 'static.
        let r = unsafe { sys::cuModuleLoadData(&mut module, image.as_ptr() as *const c_void) };
        if r != CUresult::CUDA_SUCCESS {
            let e = Error::from(cudarc::driver::DriverError(r));
            return Err(e.context(&format!("loading the {name} kernels")));
        }
        modules.push(module);
    }
    cache.push(ContextKernels { ctx_id: id, modules, skipped, functions: HashMap::new() });
    Ok(())
}

/// 10 · major + minor of the current context's device.
pub(crate) fn compute_capability() -> Result<i32> {
    let mut dev: sys::CUdevice = 0;
    // SAFETY: writes one integer; a context is current (ensure_loaded's contract).
    check(unsafe { sys::cuCtxGetDevice(&mut dev) })?;
    let attr = |a| -> Result<i32> {
        let mut v = 0;
        // SAFETY: writes one integer for a valid device.
        check(unsafe { sys::cuDeviceGetAttribute(&mut v, a, dev) })?;
        Ok(v)
    };
    use sys::CUdevice_attribute::{
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR as MAJOR, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR as MINOR,
    };
    Ok(10 * attr(MAJOR)? + attr(MINOR)?)
}

/// Streaming multiprocessors of the current context's device.
pub(crate) fn multiprocessor_count() -> Result<i32> {
    let mut dev: sys::CUdevice = 0;
    // SAFETY: writes one integer; a context is current (ensure_loaded's contract).
    check(unsafe { sys::cuCtxGetDevice(&mut dev) })?;
    let mut v = 0;
    // SAFETY: writes one integer for a valid device.
    check(unsafe {
        sys::cuDeviceGetAttribute(&mut v, sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev)
    })?;
    Ok(v)
}

/// The function `name` in `ctx` (current on this thread), with its dynamic shared memory limit raised to
/// at least `smem_bytes` (a per-function attribute, needed above 48 KiB; host-side, legal during capture).
fn function(ctx: CUcontext, name: &CStr, smem_bytes: i32) -> Result<CUfunction> {
    ensure_loaded(ctx)?;
    let id = context_id(ctx)?;
    let mut cache = CACHE.lock().map_err(|_| Error::new(ErrorKind::Cuda, "kernel cache poisoned"))?;
    let entry = cache
        .iter_mut()
        .find(|c| c.ctx_id == id)
        .ok_or_else(|| Error::new(ErrorKind::Cuda, "kernel cache lost a context"))?;
    let key = name.to_string_lossy();
    if !entry.functions.contains_key(key.as_ref()) {
        let mut found = None;
        for &module in &entry.modules {
            let mut f: CUfunction = std::ptr::null_mut();
            // SAFETY: `module` is loaded in this context; `name` is NUL-terminated.
            let r = unsafe { sys::cuModuleGetFunction(&mut f, module, name.as_ptr()) };
            match r {
                CUresult::CUDA_SUCCESS => {
                    found = Some(f);
                    break;
                }
                CUresult::CUDA_ERROR_NOT_FOUND => continue,
                other => check(other)?,
            }
        }
        let f = found.ok_or_else(|| match entry.skipped.first() {
            Some((fatbin, cc)) => Error::new(
                ErrorKind::Arch,
                format!(
                    "kernel {key} is not among the kernels loaded for this sm_{cc} GPU: the sm_90a-only kernels \
                     ({fatbin}) run on compute capability 9.0 alone"
                ),
            ),
            None => Error::new(ErrorKind::Unsupported, format!("kernel {key} is not in this build")),
        })?;
        entry.functions.insert(key.to_string(), (f, 48 * 1024));
    }
    let (f, limit) =
        entry.functions.get_mut(key.as_ref()).ok_or_else(|| Error::new(ErrorKind::Cuda, "kernel cache"))?;
    if smem_bytes > *limit {
        // SAFETY: `f` is a function of this context.
        check(unsafe {
            sys::cuFuncSetAttribute(
                *f,
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                smem_bytes,
            )
        })?;
        *limit = smem_bytes;
    }
    Ok(*f)
}

/// Enqueues recorded launches, in order, on `stream` of context `ctx` (current on this thread).
///
/// # Safety
/// Every pointer inside the launches' params must be valid device memory of `ctx` for the kernels' accesses
/// until they complete on `stream`.
pub(crate) unsafe fn enqueue(ctx: CUcontext, stream: CUstream, launches: &[crate::sys::FaKernelLaunch]) -> Result<()> {
    if !available() {
        return Err(no_kernels_error("GPU launch"));
    }
    for l in launches {
        // SAFETY: launchers store a static NUL-terminated name.
        let name = unsafe { CStr::from_ptr(l.kernel) };
        let f = function(ctx, name, l.smem_bytes)?;
        let mut params = l.params;
        let mut args = [params.as_mut_ptr() as *mut c_void];
        // SAFETY: the kernel takes exactly one by-value parameter whose bytes the launcher copied into
        // `params` (params_bytes <= its size); cuLaunchKernel copies them before returning.
        let r = unsafe {
            sys::cuLaunchKernel(
                f,
                l.grid[0] as u32,
                l.grid[1] as u32,
                l.grid[2] as u32,
                l.block as u32,
                1,
                1,
                l.smem_bytes as u32,
                stream,
                args.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        check(r).map_err(|e| e.context(&format!("launching {}", name.to_string_lossy())))?;
    }
    Ok(())
}
