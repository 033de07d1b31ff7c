//! The crate's one error type. Every public entry point returns `Result<_, Error>`; bad input is never a
//! panic. Each variant is a *kind* tests can match on; the message names the offending argument.

use std::fmt;

/// What went wrong, coarse enough to match on, precise enough (through the message) to act on.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// Shapes of arguments disagree with each other or with the problem (e.g. K has the wrong head count).
    Shape,
    /// A valid request this crate does not implement (head dim 100, page size 0, an unknown dtype).
    Unsupported,
    /// Strides are wrong for the kernel: non-unit last stride, negative strides, overlapping output.
    Layout,
    /// A pointer or row start is not aligned as the kernel's vector loads require.
    Alignment,
    /// A size or stride computation overflows the integer type the kernel uses.
    Overflow,
    /// A buffer is too small for the shape and strides that describe it.
    OutOfBounds,
    /// No CUDA driver library (libcuda) could be loaded.
    NoDriver,
    /// A driver is present but no usable GPU (or the requested ordinal does not exist).
    NoDevice,
    /// The kernels were not built for this device's architecture, or the driver is too old for them.
    Arch,
    /// This build has no GPU kernels (the `cuda` feature is off, or no nvcc was found when it was built).
    NoKernels,
    /// The GPU ran out of memory (`CUDA_ERROR_OUT_OF_MEMORY`).
    OutOfMemory,
    /// A kernel accessed an illegal address (`CUDA_ERROR_ILLEGAL_ADDRESS`); the context is unusable after it.
    IllegalAddress,
    /// A kernel launch failed or was refused (`CUDA_ERROR_LAUNCH_FAILED`, `_LAUNCH_OUT_OF_RESOURCES`,
    /// `_LAUNCH_TIMEOUT`, `_INVALID_VALUE` at launch, ...).
    LaunchFailed,
    /// Any other CUDA driver failure; [`Error::cuda_result`] has the code.
    Cuda,
    /// The host emulator detected a fault in a kernel (out of bounds, race, deadlock, divergence).
    Emulator,
    /// Arguments belong to different backends (a GPU view passed to an emulator launch, or vice versa).
    Backend,
    /// Invalid command-line input or an I/O failure in the runner and tools.
    Usage,
}

/// An error with its kind and a message naming the argument or call that caused it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    kind: ErrorKind,
    message: String,
    cuda: Option<cudarc::driver::sys::CUresult>,
}

/// One constructor per argument-error kind, named after it: `Error::shape("q", msg)` is a
/// [`ErrorKind::Shape`] error with the message "q: msg".
macro_rules! arg_errors {
    ($($name:ident => $kind:ident,)*) => {$(
        pub fn $name(arg: &str, msg: impl fmt::Display) -> Self {
            Self::new(ErrorKind::$kind, format!("{arg}: {msg}"))
        }
    )*};
}

impl Error {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self { kind, message: message.into(), cuda: None }
    }
    pub fn kind(&self) -> &ErrorKind {
        &self.kind
    }
    /// The CUDA driver's result code, when a driver call failed.
    pub fn cuda_result(&self) -> Option<cudarc::driver::sys::CUresult> {
        self.cuda
    }
    /// The same error with `what` (the operation that failed) in front of its message.
    pub fn context(mut self, what: &str) -> Self {
        self.message = format!("{what}: {}", self.message);
        self
    }
    pub fn message(&self) -> &str {
        &self.message
    }
    arg_errors! {
        shape => Shape,
        unsupported => Unsupported,
        layout => Layout,
        alignment => Alignment,
        overflow => Overflow,
        out_of_bounds => OutOfBounds,
        backend => Backend,
    }
    pub fn usage(msg: impl fmt::Display) -> Self {
        Self::new(ErrorKind::Usage, msg.to_string())
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?} error: {}", self.kind, self.message)
    }
}

impl std::error::Error for Error {}

impl From<cudarc::driver::DriverError> for Error {
    fn from(e: cudarc::driver::DriverError) -> Self {
        use cudarc::driver::sys::CUresult as R;
        let kind = match e.0 {
            R::CUDA_ERROR_OUT_OF_MEMORY => ErrorKind::OutOfMemory,
            R::CUDA_ERROR_ILLEGAL_ADDRESS => ErrorKind::IllegalAddress,
            R::CUDA_ERROR_LAUNCH_FAILED
            | R::CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES
            | R::CUDA_ERROR_LAUNCH_TIMEOUT
            | R::CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING
            | R::CUDA_ERROR_INVALID_VALUE => ErrorKind::LaunchFailed,
            R::CUDA_ERROR_NO_BINARY_FOR_GPU
            | R::CUDA_ERROR_INVALID_PTX
            | R::CUDA_ERROR_UNSUPPORTED_PTX_VERSION
            | R::CUDA_ERROR_INVALID_IMAGE
            | R::CUDA_ERROR_INVALID_SOURCE => ErrorKind::Arch,
            _ => ErrorKind::Cuda,
        };
        Error { kind, message: format!("CUDA driver: {e}"), cuda: Some(e.0) }
    }
}

/// Checked conversions: sizes cross the FFI boundary as i32/i64, never by a silent `as`.
pub(crate) fn to_i32(arg: &str, v: usize) -> Result<i32, Error> {
    i32::try_from(v).map_err(|_| Error::overflow(arg, format!("{v} does not fit in i32")))
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
