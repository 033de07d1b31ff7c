//! Typed tensor views: memory (a cudarc view or a raw device pointer on the GPU backend, a host slice on the
//! emulator backend) plus a shape and i64 element strides. Construction checks that every element the shape and strides address
//! lies inside the memory (so no launch can read or write outside it); ops check layout and alignment with
//! the argument's name through [`TensorView::check_rows`].

use std::marker::PhantomData;

use cudarc::driver::{CudaView, CudaViewMut};

use crate::error::{Error, Result};

/// Device memory the caller owns by raw pointer (an engine's own allocator, DLPack, a pool): `len` elements
/// at `ptr`. Nothing tracks its lifetime or stream ordering; [`TensorView::from_device_ptr`] states the
/// contract.
#[derive(Debug)]
pub(crate) struct DevicePtr<T> {
    pub(crate) ptr: u64,
    pub(crate) len: usize,
    _marker: PhantomData<fn() -> T>,
}

impl<T> Clone for DevicePtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for DevicePtr<T> {}

/// Read-only memory behind a view (crate-internal: views are made by their constructors).
pub(crate) enum Mem<'a, T> {
    Gpu(CudaView<'a, T>),
    Device(DevicePtr<T>),
    Host(&'a [T]),
}

/// Writable memory behind a view.
pub(crate) enum MemMut<'a, T> {
    Gpu(CudaViewMut<'a, T>),
    Device(DevicePtr<T>),
    Host(&'a mut [T]),
}

/// Another handle on the same memory (no copy): a cudarc view is re-sliced whole, a raw pointer or host slice
/// copied.
impl<T> Clone for Mem<'_, T> {
    fn clone(&self) -> Self {
        match self {
            Mem::Gpu(v) => Mem::Gpu(v.slice(..)),
            Mem::Device(d) => Mem::Device(*d),
            Mem::Host(s) => Mem::Host(s),
        }
    }
}

impl<T> Mem<'_, T> {
    fn len(&self) -> usize {
        match self {
            Mem::Gpu(v) => v.len(),
            Mem::Device(d) => d.len,
            Mem::Host(s) => s.len(),
        }
    }
}

impl<T> MemMut<'_, T> {
    fn len(&self) -> usize {
        match self {
            MemMut::Gpu(v) => v.len(),
            MemMut::Device(d) => d.len,
            MemMut::Host(s) => s.len(),
        }
    }
}

/// A read-only N-dimensional view; the last dimension is the innermost. Cloning it makes another view of the
/// same memory (nothing is copied).
pub struct TensorView<'a, T, const N: usize> {
    pub(crate) mem: Mem<'a, T>,
    shape: [usize; N],
    strides: [i64; N],
}

impl<T, const N: usize> Clone for TensorView<'_, T, N> {
    fn clone(&self) -> Self {
        Self { mem: self.mem.clone(), shape: self.shape, strides: self.strides }
    }
}

/// A writable N-dimensional view.
pub struct TensorViewMut<'a, T, const N: usize> {
    pub(crate) mem: MemMut<'a, T>,
    shape: [usize; N],
    strides: [i64; N],
}

/// Row-major strides of a contiguous tensor, checked for overflow.
pub fn contiguous_strides<const N: usize>(shape: [usize; N]) -> Result<[i64; N]> {
    let mut strides = [0i64; N];
    let mut acc: i64 = 1;
    for d in (0..N).rev() {
        strides[d] = acc;
        let dim = i64::try_from(shape[d]).map_err(|_| Error::overflow("shape", format!("{shape:?}")))?;
        acc = acc.checked_mul(dim.max(1)).ok_or_else(|| Error::overflow("shape", format!("{shape:?}")))?;
    }
    Ok(strides)
}

/// Number of elements the view spans (largest addressed offset + 1), 0 for an empty shape.
fn extent<const N: usize>(shape: [usize; N], strides: [i64; N]) -> Result<usize> {
    // Strides are checked first, empty views included: a kernel given an empty view still validates its
    // strides, and its rejection would not name the argument.
    if let Some(d) = (0..N).find(|&d| strides[d] < 0) {
        return Err(Error::layout("view", format!("negative stride {} in dimension {d}", strides[d])));
    }
    if shape.contains(&0) {
        return Ok(0);
    }
    let mut last: i64 = 0;
    for d in 0..N {
        let dim = i64::try_from(shape[d] - 1).map_err(|_| Error::overflow("view", format!("shape {shape:?}")))?;
        last = dim
            .checked_mul(strides[d])
            .and_then(|x| x.checked_add(last))
            .ok_or_else(|| Error::overflow("view", format!("shape {shape:?} with strides {strides:?}")))?;
    }
    usize::try_from(last)
        .ok()
        .and_then(|x| x.checked_add(1))
        .ok_or_else(|| Error::overflow("view", format!("shape {shape:?} with strides {strides:?}")))
}

fn check_fits<const N: usize>(len: usize, shape: [usize; N], strides: [i64; N]) -> Result<()> {
    let need = extent(shape, strides)?;
    if need > len {
        return Err(Error::out_of_bounds(
            "view",
            format!("shape {shape:?} with strides {strides:?} spans {need} elements, memory holds {len}"),
        ));
    }
    Ok(())
}

/// The elements of a `shape`/`strides` layout over `data` (offset 0) in logical (row-major) order.
pub(crate) fn logical_elements<E: Copy, const N: usize>(data: &[E], shape: [usize; N], strides: [i64; N]) -> Vec<E> {
    let count: usize = shape.iter().product();
    let mut out = Vec::with_capacity(count);
    for flat in 0..count {
        let (mut rem, mut at) = (flat, 0i64);
        for d in (0..N).rev() {
            at += (rem % shape[d]) as i64 * strides[d];
            rem /= shape[d];
        }
        out.push(data[at as usize]);
    }
    out
}

/// Rejects layouts whose elements would overlap (a zero or too-small stride), as an output must not:
/// dimensions of extent > 1, ordered by stride, must each step past everything inside them.
pub(crate) fn check_disjoint<const N: usize>(name: &str, shape: [usize; N], strides: [i64; N]) -> Result<()> {
    let mut dims: Vec<(i64, usize)> = (0..N).filter(|&d| shape[d] > 1).map(|d| (strides[d], shape[d])).collect();
    dims.sort();
    let mut span: i64 = 1;
    for (stride, size) in dims {
        if stride < span {
            return Err(Error::layout(name, format!("rows overlap (strides {strides:?} for shape {shape:?})")));
        }
        span = stride.saturating_mul(size as i64 - 1).saturating_add(span);
    }
    Ok(())
}

macro_rules! view_common {
    ($ty:ident, $mem:ident) => {
        impl<'a, T, const N: usize> $ty<'a, T, N> {
            /// A contiguous view of `mem`.
            pub(crate) fn new(mem: $mem<'a, T>, shape: [usize; N]) -> Result<Self> {
                let strides = contiguous_strides(shape)?;
                check_fits(mem.len(), shape, strides)?;
                Ok(Self { mem, shape, strides })
            }
            /// The same memory with explicit element strides (any non-negative strides, e.g. a slice of a
            /// packed QKV tensor). Fails if the view would address memory outside the buffer.
            pub fn with_strides(mut self, strides: [i64; N]) -> Result<Self> {
                check_fits(self.mem.len(), self.shape, strides)?;
                self.strides = strides;
                Ok(self)
            }
            pub fn shape(&self) -> [usize; N] {
                self.shape
            }
            pub fn strides(&self) -> [i64; N] {
                self.strides
            }
            /// The strides a launch passes: those of dimensions of extent <= 1 address nothing (only index
            /// 0 is used) and go as 0, so a launcher's stride rules (non-negative, 16-byte rows) never reject
            /// what the Rust checks, which look at dimensions of extent > 1 only, accepted.
            pub(crate) fn launch_strides(&self) -> [i64; N] {
                let mut s = self.strides;
                for d in 0..N {
                    if self.shape[d] <= 1 {
                        s[d] = 0;
                    }
                }
                s
            }
            pub fn dim(&self, d: usize) -> usize {
                self.shape[d]
            }
            pub fn is_gpu(&self) -> bool {
                !matches!(self.mem, $mem::Host(_))
            }
            /// Layout check an op applies to each argument, naming it: unit innermost stride, and when
            /// `align_bytes` > 1 every other stride a multiple of `align_bytes` (so every row start is as
            /// aligned as the base pointer, which the launch checks).
            pub fn check_rows(&self, name: &str, align_bytes: usize) -> Result<()> {
                if N > 0 && self.shape[N - 1] > 1 && self.strides[N - 1] != 1 {
                    return Err(Error::layout(
                        name,
                        format!("innermost stride must be 1, got {} (strides {:?})", self.strides[N - 1], self.strides),
                    ));
                }
                let elem = std::mem::size_of::<T>() as i64;
                for d in 0..N.saturating_sub(1) {
                    if align_bytes > 1 && self.shape[d] > 1 && (self.strides[d] * elem) % align_bytes as i64 != 0 {
                        return Err(Error::alignment(
                            name,
                            format!(
                                "stride {} of dimension {d} is not a multiple of {align_bytes} bytes",
                                self.strides[d]
                            ),
                        ));
                    }
                }
                Ok(())
            }
            /// Layout check for outputs: no two elements share an address (rows ordered by stride must each step past everything inside them).
            pub fn check_disjoint(&self, name: &str) -> Result<()> {
                check_disjoint(name, self.shape, self.strides)
            }
            /// Expect an exact shape (used by ops to report mismatches by name).
            pub fn expect_shape(&self, name: &str, want: [usize; N]) -> Result<()> {
                if self.shape != want {
                    return Err(Error::shape(name, format!("expected shape {want:?}, got {:?}", self.shape)));
                }
                Ok(())
            }
        }
    };
}

view_common!(TensorView, Mem);
view_common!(TensorViewMut, MemMut);

impl<'a, T, const N: usize> TensorView<'a, T, N> {
    /// A contiguous view of GPU memory (`slice.as_view()` or `slice.slice(a..b)`).
    pub fn gpu(view: CudaView<'a, T>, shape: [usize; N]) -> Result<Self> {
        Self::new(Mem::Gpu(view), shape)
    }
    /// A contiguous view of host memory, for the emulator backend.
    pub fn host(data: &'a [T], shape: [usize; N]) -> Result<Self> {
        Self::new(Mem::Host(data), shape)
    }
    /// A contiguous view of `len` elements of device memory at `ptr` (a `CUdeviceptr`), for callers whose
    /// memory is not a cudarc slice. Use [`with_strides`](Self::with_strides) for other layouts; the extent
    /// checks still apply against `len`.
    ///
    /// # Safety
    /// `ptr .. ptr + len * size_of::<T>()` must be device memory of the context of the stream the view is
    /// launched on, readable by kernels on that stream from the launch until the work completes, and not
    /// written by anyone else meanwhile. Stream ordering against other streams is the caller's business.
    pub unsafe fn from_device_ptr(ptr: u64, len: usize, shape: [usize; N]) -> Result<Self> {
        Self::new(Mem::Device(DevicePtr { ptr, len, _marker: PhantomData }), shape)
    }
}

impl<T> TensorView<'_, T, 1> {
    /// Checks an index vector (slot mapping, positions): `len` elements (else a `Shape` error "length …
    /// {why_len()}"), contiguous when it has more than one (else `Layout`).
    pub(crate) fn check_index_vector(&self, name: &str, len: usize, why_len: impl FnOnce() -> String) -> Result<()> {
        if self.shape() != [len] {
            return Err(Error::shape(name, format!("length {} {}", self.dim(0), why_len())));
        }
        if len > 1 && self.strides()[0] != 1 {
            return Err(Error::layout(name, "must be contiguous"));
        }
        Ok(())
    }
}

impl<'a, T, const N: usize> TensorViewMut<'a, T, N> {
    /// A contiguous writable view of GPU memory (`slice.as_view_mut()`).
    pub fn gpu(view: CudaViewMut<'a, T>, shape: [usize; N]) -> Result<Self> {
        Self::new(MemMut::Gpu(view), shape)
    }
    /// A contiguous writable view of host memory, for the emulator backend.
    pub fn host(data: &'a mut [T], shape: [usize; N]) -> Result<Self> {
        Self::new(MemMut::Host(data), shape)
    }
    /// A contiguous writable view of `len` elements of device memory at `ptr` (see
    /// [`TensorView::from_device_ptr`]).
    ///
    /// # Safety
    /// As for [`TensorView::from_device_ptr`], and no one else reads or writes the memory until the
    /// launch's work completes.
    pub unsafe fn from_device_ptr(ptr: u64, len: usize, shape: [usize; N]) -> Result<Self> {
        Self::new(MemMut::Device(DevicePtr { ptr, len, _marker: PhantomData }), shape)
    }
    /// A read-only view of the same memory, shape and strides.
    pub fn as_view(&self) -> TensorView<'_, T, N> {
        let mem = match &self.mem {
            MemMut::Gpu(v) => Mem::Gpu(v.as_view()),
            MemMut::Device(d) => Mem::Device(*d),
            MemMut::Host(s) => Mem::Host(s),
        };
        TensorView { mem, shape: self.shape, strides: self.strides }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    #[test]
    fn contiguous_and_strided_extents() {
        let data = vec![0u16; 24];
        let v = TensorView::host(&data, [2, 3, 4]).unwrap();
        assert_eq!(v.strides(), [12, 4, 1]);
        // A [2,3,2] slice with the parent's strides fits; one with a too-large stride does not.
        let s = TensorView::host(&data, [2, 3, 2]).unwrap().with_strides([12, 4, 1]).unwrap();
        assert_eq!(s.shape(), [2, 3, 2]);
        let e = TensorView::host(&data, [2, 3, 2]).unwrap().with_strides([16, 4, 1]).err().unwrap();
        assert_eq!(e.kind(), &ErrorKind::OutOfBounds);
    }

    #[test]
    fn too_small_buffer_and_overflow_are_errors() {
        let data = vec![0u16; 5];
        assert_eq!(TensorView::host(&data, [2, 3]).err().unwrap().kind(), &ErrorKind::OutOfBounds);
        let e = TensorView::host(&data, [usize::MAX, 2]).err().unwrap();
        assert_eq!(e.kind(), &ErrorKind::Overflow);
        let v = TensorView::host(&data, [1, 1]).unwrap();
        assert_eq!(v.with_strides([-1, 1]).err().unwrap().kind(), &ErrorKind::Layout);
    }

    #[test]
    fn overlapping_output_layouts_are_layout_errors() {
        assert!(check_disjoint("o", [2, 4, 64], [256, 64, 1]).is_ok());
        assert!(check_disjoint("o", [2, 4, 64], [64 * 8, 128, 1]).is_ok());
        assert!(check_disjoint("o", [1, 1, 64], [0, 0, 1]).is_ok());
        for strides in [[256, 0, 1], [256, 32, 1], [64, 64, 1]] {
            let e = check_disjoint("o", [2, 4, 64], strides).unwrap_err();
            assert_eq!(e.kind(), &ErrorKind::Layout, "{strides:?}");
            assert!(e.message().starts_with("o:"));
        }
    }

    #[test]
    fn empty_shapes_span_nothing() {
        let data: Vec<u16> = vec![];
        assert!(TensorView::host(&data, [0, 8]).is_ok());
    }

    #[test]
    fn row_checks_name_the_argument() {
        let data = vec![0u16; 64];
        let v = TensorView::host(&data, [4, 8]).unwrap().with_strides([1, 4]).unwrap();
        let e = v.check_rows("q", 16).unwrap_err();
        assert_eq!(e.kind(), &ErrorKind::Layout);
        assert!(e.message().starts_with("q:"));
        let v = TensorView::host(&data, [4, 4]).unwrap().with_strides([12, 1]).unwrap();
        assert_eq!(v.check_rows("k", 16).unwrap_err().kind(), &ErrorKind::Alignment);
        assert!(TensorView::host(&data, [4, 8]).unwrap().check_rows("k", 16).is_ok());
    }
}
