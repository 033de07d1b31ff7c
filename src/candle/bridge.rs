//! The bridge between candle's storage and fused-attn's views, one implementation per candle backend:
//! [`Backing`] turns a candle storage plus [`Layout`] into a [`TensorView`] (CPU: the `Vec` inside
//! `CpuStorage`, read in place; CUDA: a view of the `CudaSlice`, on candle's stream) and wraps a freshly
//! allocated output back into a storage. No data is copied on either side: fused-attn's views take
//! candle's start offset and element strides as they are, so both backends accept exactly the same
//! layouts (unit innermost stride, 16-byte aligned rows, no broadcast dimensions) and reject the rest
//! with a Layout / Alignment error naming the argument.

#[cfg(feature = "candle-cuda")]
use candle_core::{backend::BackendStorage, cuda::CudaDType, cuda_backend::CudaStorageSlice, CudaDevice, CudaStorage};
use candle_core::{CpuStorage, DType, Layout, Storage, WithDType};
#[cfg(feature = "candle-cuda")]
use cudarc::driver::{CudaSlice, CudaStream, CudaView, CudaViewMut, DeviceRepr, ValidAsZeroBits};
#[cfg(feature = "candle-cuda")]
use std::sync::Arc;

use crate::device::Stream;
use crate::dtype::{Fp8E4m3, Fp8E5m2};
use crate::error::Error;
use crate::tensor::{TensorView, TensorViewMut};

/// Element types a view reads or writes in place in a candle storage: candle's own dtypes as they are, and
/// FP8 codes ([`Fp8E4m3`], [`Fp8E5m2`]) in a `U8` storage (as vLLM keeps FP8 caches) or, for E4M3 codes,
/// candle's `F8E4M3`.
pub trait InPlace: Copy + 'static {
    /// The storage dtypes this type is read from, for errors.
    fn expected() -> &'static str;
    fn host(s: &CpuStorage) -> Option<&[Self]>;
    fn host_mut(s: &mut CpuStorage) -> Option<&mut [Self]>;
    #[cfg(feature = "candle-cuda")]
    fn cuda(s: &CudaStorage) -> Option<CudaView<'_, Self>>;
    #[cfg(feature = "candle-cuda")]
    fn cuda_mut(s: &mut CudaStorage) -> Option<CudaViewMut<'_, Self>>;
}

/// Element types of the outputs an op allocates (attention data, fp32 LSE / merge states) and of its
/// inputs: every one is also read in place.
pub trait Elem: InPlace + BackendElem {}
impl<T: InPlace + BackendElem> Elem for T {}

#[cfg(not(feature = "candle-cuda"))]
pub trait BackendElem: WithDType {}
#[cfg(not(feature = "candle-cuda"))]
impl<T: WithDType> BackendElem for T {}
#[cfg(feature = "candle-cuda")]
pub trait BackendElem: WithDType + CudaDType + DeviceRepr + ValidAsZeroBits {}
#[cfg(feature = "candle-cuda")]
impl<T: WithDType + CudaDType + DeviceRepr + ValidAsZeroBits> BackendElem for T {}

macro_rules! in_place {
    ($t:ty, $variant:ident, $name:literal) => {
        impl InPlace for $t {
            fn expected() -> &'static str {
                $name
            }
            fn host(s: &CpuStorage) -> Option<&[Self]> {
                match s {
                    CpuStorage::$variant(v) => Some(v),
                    _ => None,
                }
            }
            fn host_mut(s: &mut CpuStorage) -> Option<&mut [Self]> {
                match s {
                    CpuStorage::$variant(v) => Some(v),
                    _ => None,
                }
            }
            #[cfg(feature = "candle-cuda")]
            fn cuda(s: &CudaStorage) -> Option<CudaView<'_, Self>> {
                match &s.slice {
                    CudaStorageSlice::$variant(v) => Some(v.as_view()),
                    _ => None,
                }
            }
            #[cfg(feature = "candle-cuda")]
            fn cuda_mut(s: &mut CudaStorage) -> Option<CudaViewMut<'_, Self>> {
                match &mut s.slice {
                    CudaStorageSlice::$variant(v) => Some(v.as_view_mut()),
                    _ => None,
                }
            }
        }
    };
}
in_place!(half::f16, F16, "f16");
in_place!(half::bf16, BF16, "bf16");
in_place!(f32, F32, "f32");
in_place!(i32, I32, "i32");
in_place!(u32, U32, "u32");
in_place!(i64, I64, "i64");

/// Reinterprets a slice of one-byte codes. SAFETY (callers): `A` and `B` are both one byte with every bit
/// pattern valid (u8, candle's `F8E4M3` and fused-attn's FP8 code types are `repr(transparent)` over u8).
unsafe fn codes<A, B>(v: &[A]) -> &[B] {
    debug_assert!(std::mem::size_of::<A>() == 1 && std::mem::size_of::<B>() == 1);
    std::slice::from_raw_parts(v.as_ptr().cast(), v.len())
}
/// [`codes`] for a mutable slice (same SAFETY).
unsafe fn codes_mut<A, B>(v: &mut [A]) -> &mut [B] {
    debug_assert!(std::mem::size_of::<A>() == 1 && std::mem::size_of::<B>() == 1);
    std::slice::from_raw_parts_mut(v.as_mut_ptr().cast(), v.len())
}

/// FP8 codes: any format in a `U8` storage; E4M3 codes also in candle's `F8E4M3` (`$e4m3` says whether).
macro_rules! fp8_in_place {
    ($t:ty, $e4m3:literal, $name:literal) => {
        impl InPlace for $t {
            fn expected() -> &'static str {
                $name
            }
            fn host(s: &CpuStorage) -> Option<&[Self]> {
                // SAFETY: one-byte code types (`codes`).
                match s {
                    CpuStorage::U8(v) => Some(unsafe { codes(v) }),
                    CpuStorage::F8E4M3(v) if $e4m3 => Some(unsafe { codes(v) }),
                    _ => None,
                }
            }
            fn host_mut(s: &mut CpuStorage) -> Option<&mut [Self]> {
                // SAFETY: one-byte code types (`codes_mut`).
                match s {
                    CpuStorage::U8(v) => Some(unsafe { codes_mut(v) }),
                    CpuStorage::F8E4M3(v) if $e4m3 => Some(unsafe { codes_mut(v) }),
                    _ => None,
                }
            }
            #[cfg(feature = "candle-cuda")]
            fn cuda(s: &CudaStorage) -> Option<CudaView<'_, Self>> {
                // SAFETY: one-byte code types of the same length (`codes`).
                match &s.slice {
                    CudaStorageSlice::U8(v) => unsafe { v.transmute::<Self>(v.len()) },
                    CudaStorageSlice::F8E4M3(v) if $e4m3 => unsafe { v.transmute::<Self>(v.len()) },
                    _ => None,
                }
            }
            #[cfg(feature = "candle-cuda")]
            fn cuda_mut(s: &mut CudaStorage) -> Option<CudaViewMut<'_, Self>> {
                // SAFETY: one-byte code types of the same length (`codes_mut`).
                match &mut s.slice {
                    CudaStorageSlice::U8(v) => {
                        let len = v.len();
                        unsafe { v.transmute_mut::<Self>(len) }
                    }
                    CudaStorageSlice::F8E4M3(v) if $e4m3 => {
                        let len = v.len();
                        unsafe { v.transmute_mut::<Self>(len) }
                    }
                    _ => None,
                }
            }
        }
    };
}
fp8_in_place!(Fp8E4m3, true, "u8 or f8e4m3 (E4M3 codes)");
fp8_in_place!(Fp8E5m2, false, "u8 (E5M2 codes: candle's f8e4m3 holds E4M3 codes)");

/// Where an op runs: the emulator for CPU tensors, candle's CUDA stream for CUDA tensors.
pub enum Backend {
    Emu,
    #[cfg(feature = "candle-cuda")]
    Gpu(CudaDevice, Arc<CudaStream>),
}

/// How a new output starts: NaN (every element is written by the op, so an unwritten one shows up on the
/// CPU; on CUDA the memory is left uninitialised), or zero (rows the op may leave alone, e.g. varlen rows
/// past `cu_seqlens[B]`).
#[derive(Clone, Copy)]
pub enum Fill {
    Poison,
    Zero,
}

/// A new output buffer on a backend.
pub enum OutBuf<T> {
    Host(Vec<T>),
    #[cfg(feature = "candle-cuda")]
    Gpu(CudaSlice<T>, CudaDevice),
}

impl Backend {
    pub fn stream(&self) -> Stream<'_> {
        match self {
            Backend::Emu => Stream::Emu(super::emulator()),
            #[cfg(feature = "candle-cuda")]
            Backend::Gpu(_, s) => Stream::Gpu(s),
        }
    }

    pub fn alloc<T: Elem>(&self, len: usize, fill: Fill) -> candle_core::Result<OutBuf<T>> {
        Ok(match self {
            Backend::Emu => OutBuf::Host(vec![
                match fill {
                    Fill::Poison => T::from_f64(f64::NAN),
                    Fill::Zero => T::from_f64(0.0),
                };
                len
            ]),
            #[cfg(feature = "candle-cuda")]
            Backend::Gpu(dev, _) => OutBuf::Gpu(
                match fill {
                    // SAFETY: Poison is only asked for outputs the op writes in full before anyone reads
                    // them (stream order on candle's stream).
                    Fill::Poison => unsafe { dev.alloc::<T>(len.max(1))? },
                    Fill::Zero => dev.alloc_zeros::<T>(len.max(1))?,
                },
                dev.clone(),
            ),
        })
    }
}

impl<T: Elem> OutBuf<T> {
    pub fn view<const N: usize>(&mut self, shape: [usize; N]) -> crate::Result<TensorViewMut<'_, T, N>> {
        match self {
            OutBuf::Host(v) => TensorViewMut::host(v, shape),
            #[cfg(feature = "candle-cuda")]
            OutBuf::Gpu(s, _) => TensorViewMut::gpu(s.as_view_mut(), shape),
        }
    }

    pub fn into_storage(self) -> Storage {
        match self {
            OutBuf::Host(v) => Storage::Cpu(T::to_cpu_storage_owned(v)),
            #[cfg(feature = "candle-cuda")]
            OutBuf::Gpu(s, dev) => Storage::Cuda(T::wrap_cuda_slice(s, dev)),
        }
    }
}

/// Shape and i64 strides of a rank-N layout; rank mismatches are Shape errors and broadcast (stride 0)
/// dimensions Layout errors, naming the argument.
pub fn dims<const N: usize>(name: &str, l: &Layout) -> crate::Result<([usize; N], [i64; N])> {
    let shape: [usize; N] =
        l.dims().try_into().map_err(|_| Error::shape(name, format!("expected rank {N}, got shape {:?}", l.dims())))?;
    let mut strides = [0i64; N];
    for (d, (&stride, &size)) in l.stride().iter().zip(&shape).enumerate() {
        if stride == 0 && size > 1 {
            return Err(Error::layout(
                name,
                format!("dimension {d} is broadcast (stride 0): call .contiguous() first"),
            ));
        }
        strides[d] = i64::try_from(stride).map_err(|_| Error::overflow(name, format!("stride {stride}")))?;
    }
    Ok((shape, strides))
}

/// The K and V halves of a `[2, num_pages, page_size, Hkv, D]` cache layout: the element offsets of K and
/// V, and the shape and strides both share.
pub struct KvHalves {
    pub k_offset: usize,
    pub v_offset: usize,
    pub shape: [usize; 4],
    pub strides: [i64; 4],
}

pub fn kv_halves(l: &Layout) -> crate::Result<KvHalves> {
    let (shape, strides) = dims::<5>("kv_cache", l)?;
    if shape[0] != 2 {
        return Err(Error::shape(
            "kv_cache",
            format!("expected [2, num_pages, page_size, Hkv, D] (K then V), got {shape:?}"),
        ));
    }
    let k_offset = l.start_offset();
    Ok(KvHalves {
        k_offset,
        v_offset: k_offset + l.stride()[0],
        shape: [shape[1], shape[2], shape[3], shape[4]],
        strides: [strides[1], strides[2], strides[3], strides[4]],
    })
}

/// A candle backend's storage as fused-attn views.
pub trait Backing: Sized {
    /// This backend's storage inside `s`, or a Backend error naming the argument.
    fn of<'s>(s: &'s Storage, name: &str) -> crate::Result<&'s Self>;
    fn backend(&self) -> Backend;
    fn dtype(&self) -> DType;
    /// A view of `shape` with `strides` starting `offset` elements into the storage.
    fn view_at<T: InPlace, const N: usize>(
        &self,
        name: &str,
        offset: usize,
        shape: [usize; N],
        strides: [i64; N],
    ) -> candle_core::Result<TensorView<'_, T, N>>;
    /// An int32 index tensor (I32, or U32 read as int32 as candle-flash-attn's seqlens are): no copy.
    fn index_view_at<const N: usize>(
        &self,
        name: &str,
        offset: usize,
        shape: [usize; N],
        strides: [i64; N],
    ) -> candle_core::Result<TensorView<'_, i32, N>>;
    /// An output buffer of this backend as a storage of this backend.
    fn from_out<T: Elem>(out: OutBuf<T>) -> crate::Result<Self>;
    /// Runs `f` on writable views of the K and V halves of a paged cache storage.
    fn with_kv_mut<T: InPlace, R>(
        &mut self,
        halves: &KvHalves,
        f: impl FnOnce(TensorViewMut<'_, T, 4>, TensorViewMut<'_, T, 4>) -> candle_core::Result<R>,
    ) -> candle_core::Result<R>;
    /// Runs `f` on a writable view of the whole storage of a 4-D tensor with layout `l`.
    fn with_view_mut<T: InPlace, R>(
        &mut self,
        name: &str,
        l: &Layout,
        f: impl FnOnce(TensorViewMut<'_, T, 4>) -> candle_core::Result<R>,
    ) -> candle_core::Result<R>;
    /// Runs `f` on the storage of another tensor `t` of this backend, writable: an in-place candle op on
    /// `t`, so its write lock is held while `f` runs. For an op that writes two tensors (a V cache beside
    /// the K cache it writes in place); `t` must not share storage with the op's own tensors (a second
    /// lock of the same storage would never be granted: the caller checks, [`same_storage`]).
    fn with_tensor_mut<R>(
        t: &candle_core::Tensor,
        f: impl FnOnce(&mut Self, &Layout) -> candle_core::Result<R>,
    ) -> candle_core::Result<R>;

    /// [`Backing::view_at`] with the tensor's own layout.
    fn view<T: InPlace, const N: usize>(&self, name: &str, l: &Layout) -> candle_core::Result<TensorView<'_, T, N>> {
        let (shape, strides) = dims(name, l)?;
        self.view_at(name, l.start_offset(), shape, strides)
    }
    /// [`Backing::index_view_at`] with the tensor's own layout.
    fn index_view<const N: usize>(&self, name: &str, l: &Layout) -> candle_core::Result<TensorView<'_, i32, N>> {
        let (shape, strides) = dims(name, l)?;
        self.index_view_at(name, l.start_offset(), shape, strides)
    }
}

/// Whether two tensors share one storage (the same allocation: `t.narrow(..)` and `t` do).
pub fn same_storage(a: &candle_core::Tensor, b: &candle_core::Tensor) -> bool {
    // The address of the storage inside its lock is stable; the read guards are taken one at a time.
    let at = |t: &candle_core::Tensor| &*t.storage_and_layout().0 as *const Storage;
    std::ptr::eq(at(a), at(b))
}

/// An in-place candle op that runs a closure once on the storage of backend `S` and keeps its result
/// ([`Backing::with_tensor_mut`]); on another backend it is a Backend error.
struct StorageMut<'f, S, R> {
    f: std::cell::RefCell<Option<Box<StorageFn<'f, S, R>>>>,
    out: std::cell::RefCell<Option<R>>,
}

type StorageFn<'f, S, R> = dyn FnOnce(&mut S, &Layout) -> candle_core::Result<R> + 'f;

impl<'f, S, R> StorageMut<'f, S, R> {
    fn new(f: impl FnOnce(&mut S, &Layout) -> candle_core::Result<R> + 'f) -> Self {
        Self { f: std::cell::RefCell::new(Some(Box::new(f))), out: std::cell::RefCell::new(None) }
    }
    fn run(&self, s: &mut S, l: &Layout) -> candle_core::Result<()> {
        let f = self.f.borrow_mut().take().ok_or_else(|| Error::backend("v_cache", "the op ran twice"))?;
        *self.out.borrow_mut() = Some(f(s, l)?);
        Ok(())
    }
    fn result(self) -> candle_core::Result<R> {
        Ok(self.out.into_inner().ok_or_else(|| Error::backend("v_cache", "the op did not run"))?)
    }
}

impl<R> candle_core::InplaceOp1 for StorageMut<'_, CpuStorage, R> {
    fn name(&self) -> &'static str {
        "fused-attn-second-output"
    }
    fn cpu_fwd(&self, s: &mut CpuStorage, l: &Layout) -> candle_core::Result<()> {
        self.run(s, l)
    }
}

#[cfg(feature = "candle-cuda")]
impl<R> candle_core::InplaceOp1 for StorageMut<'_, CudaStorage, R> {
    fn name(&self) -> &'static str {
        "fused-attn-second-output"
    }
    fn cpu_fwd(&self, _: &mut CpuStorage, _: &Layout) -> candle_core::Result<()> {
        Err(Error::backend("v_cache", "on the CPU, not on the CUDA device like the op's first argument").into())
    }
    fn cuda_fwd(&self, s: &mut CudaStorage, l: &Layout) -> candle_core::Result<()> {
        self.run(s, l)
    }
}

fn past_end(name: &str, offset: usize, len: usize) -> Error {
    Error::out_of_bounds(name, format!("start offset {offset} is past the storage's {len} elements"))
}

fn wrong_dtype<T: InPlace>(name: &str, got: DType) -> Error {
    Error::unsupported(name, format!("dtype {got:?}, expected {}", T::expected()))
}

fn not_int32(name: &str, dtype: DType) -> candle_core::Error {
    Error::unsupported(name, format!("dtype {dtype:?} (expected i32, or u32 read as i32)")).into()
}

impl Backing for CpuStorage {
    fn of<'s>(s: &'s Storage, name: &str) -> crate::Result<&'s Self> {
        match s {
            Storage::Cpu(c) => Ok(c),
            _ => Err(Error::backend(name, "not on the CPU like the op's first argument")),
        }
    }
    fn backend(&self) -> Backend {
        Backend::Emu
    }
    fn from_out<T: Elem>(out: OutBuf<T>) -> crate::Result<Self> {
        match out {
            OutBuf::Host(v) => Ok(T::to_cpu_storage_owned(v)),
            #[cfg(feature = "candle-cuda")]
            OutBuf::Gpu(..) => Err(Error::backend("output", "a CUDA buffer for a CPU op")),
        }
    }
    fn dtype(&self) -> DType {
        candle_core::backend::BackendStorage::dtype(self)
    }
    fn view_at<T: InPlace, const N: usize>(
        &self,
        name: &str,
        offset: usize,
        shape: [usize; N],
        strides: [i64; N],
    ) -> candle_core::Result<TensorView<'_, T, N>> {
        let data = T::host(self).ok_or_else(|| wrong_dtype::<T>(name, Backing::dtype(self)))?;
        let data = data.get(offset..).ok_or_else(|| past_end(name, offset, data.len()))?;
        Ok(TensorView::host(data, shape)?.with_strides(strides)?)
    }
    fn index_view_at<const N: usize>(
        &self,
        name: &str,
        offset: usize,
        shape: [usize; N],
        strides: [i64; N],
    ) -> candle_core::Result<TensorView<'_, i32, N>> {
        let data: &[i32] = match self {
            CpuStorage::I32(v) => v,
            // SAFETY: u32 and i32 have the same size and alignment and every bit pattern is valid for both.
            CpuStorage::U32(v) => unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<i32>(), v.len()) },
            other => return Err(not_int32(name, Backing::dtype(other))),
        };
        let data = data.get(offset..).ok_or_else(|| past_end(name, offset, data.len()))?;
        Ok(TensorView::host(data, shape)?.with_strides(strides)?)
    }
    fn with_kv_mut<T: InPlace, R>(
        &mut self,
        h: &KvHalves,
        f: impl FnOnce(TensorViewMut<'_, T, 4>, TensorViewMut<'_, T, 4>) -> candle_core::Result<R>,
    ) -> candle_core::Result<R> {
        let dtype = Backing::dtype(self);
        let data = T::host_mut(self).ok_or_else(|| wrong_dtype::<T>("kv_cache", dtype))?;
        let len = data.len();
        let data = data.get_mut(h.k_offset..).ok_or_else(|| past_end("kv_cache", h.k_offset, len))?;
        if h.v_offset - h.k_offset > data.len() {
            return Err(past_end("kv_cache", h.v_offset, len).into());
        }
        let (k, v) = data.split_at_mut(h.v_offset - h.k_offset);
        f(
            TensorViewMut::host(k, h.shape)?.with_strides(h.strides)?,
            TensorViewMut::host(v, h.shape)?.with_strides(h.strides)?,
        )
    }
    fn with_view_mut<T: InPlace, R>(
        &mut self,
        name: &str,
        l: &Layout,
        f: impl FnOnce(TensorViewMut<'_, T, 4>) -> candle_core::Result<R>,
    ) -> candle_core::Result<R> {
        let (shape, strides) = dims::<4>(name, l)?;
        let dtype = Backing::dtype(self);
        let data = T::host_mut(self).ok_or_else(|| wrong_dtype::<T>(name, dtype))?;
        let len = data.len();
        let data = data.get_mut(l.start_offset()..).ok_or_else(|| past_end(name, l.start_offset(), len))?;
        f(TensorViewMut::host(data, shape)?.with_strides(strides)?)
    }
    fn with_tensor_mut<R>(
        t: &candle_core::Tensor,
        f: impl FnOnce(&mut Self, &Layout) -> candle_core::Result<R>,
    ) -> candle_core::Result<R> {
        let op = StorageMut::new(f);
        t.inplace_op1(&op)?;
        op.result()
    }
}

#[cfg(feature = "candle-cuda")]
impl Backing for CudaStorage {
    fn of<'s>(s: &'s Storage, name: &str) -> crate::Result<&'s Self> {
        match s {
            Storage::Cuda(c) => Ok(c),
            _ => Err(Error::backend(name, "not on a CUDA device like the op's first argument")),
        }
    }
    fn backend(&self) -> Backend {
        let dev = self.device().clone();
        let stream = dev.cuda_stream();
        Backend::Gpu(dev, stream)
    }
    fn from_out<T: Elem>(out: OutBuf<T>) -> crate::Result<Self> {
        match out {
            OutBuf::Gpu(s, dev) => Ok(T::wrap_cuda_slice(s, dev)),
            OutBuf::Host(_) => Err(Error::backend("output", "a host buffer for a CUDA op")),
        }
    }
    fn dtype(&self) -> DType {
        BackendStorage::dtype(self)
    }
    fn view_at<T: InPlace, const N: usize>(
        &self,
        name: &str,
        offset: usize,
        shape: [usize; N],
        strides: [i64; N],
    ) -> candle_core::Result<TensorView<'_, T, N>> {
        let s = T::cuda(self).ok_or_else(|| wrong_dtype::<T>(name, BackendStorage::dtype(self)))?;
        let view = s.try_slice(offset..).ok_or_else(|| past_end(name, offset, s.len()))?;
        Ok(TensorView::gpu(view, shape)?.with_strides(strides)?)
    }
    fn index_view_at<const N: usize>(
        &self,
        name: &str,
        offset: usize,
        shape: [usize; N],
        strides: [i64; N],
    ) -> candle_core::Result<TensorView<'_, i32, N>> {
        let whole = match BackendStorage::dtype(self) {
            DType::I32 => self.as_cuda_slice::<i32>()?.as_view(),
            DType::U32 => {
                let s = self.as_cuda_slice::<u32>()?;
                // SAFETY: u32 and i32 have the same size and alignment and every bit pattern is valid for both.
                unsafe { s.transmute::<i32>(s.len()) }.ok_or_else(|| past_end(name, 0, s.len()))?
            }
            other => return Err(not_int32(name, other)),
        };
        let len = whole.len();
        let view = whole.try_slice(offset..).ok_or_else(|| past_end(name, offset, len))?;
        Ok(TensorView::gpu(view, shape)?.with_strides(strides)?)
    }
    fn with_kv_mut<T: InPlace, R>(
        &mut self,
        h: &KvHalves,
        f: impl FnOnce(TensorViewMut<'_, T, 4>, TensorViewMut<'_, T, 4>) -> candle_core::Result<R>,
    ) -> candle_core::Result<R> {
        let dtype = BackendStorage::dtype(self);
        let mut s = T::cuda_mut(self).ok_or_else(|| wrong_dtype::<T>("kv_cache", dtype))?;
        let len = s.len();
        let mut rest = s.try_slice_mut(h.k_offset..).ok_or_else(|| past_end("kv_cache", h.k_offset, len))?;
        let (k, v) =
            rest.try_split_at_mut(h.v_offset - h.k_offset).ok_or_else(|| past_end("kv_cache", h.v_offset, len))?;
        f(
            TensorViewMut::gpu(k, h.shape)?.with_strides(h.strides)?,
            TensorViewMut::gpu(v, h.shape)?.with_strides(h.strides)?,
        )
    }
    fn with_view_mut<T: InPlace, R>(
        &mut self,
        name: &str,
        l: &Layout,
        f: impl FnOnce(TensorViewMut<'_, T, 4>) -> candle_core::Result<R>,
    ) -> candle_core::Result<R> {
        let (shape, strides) = dims::<4>(name, l)?;
        let dtype = BackendStorage::dtype(self);
        let mut s = T::cuda_mut(self).ok_or_else(|| wrong_dtype::<T>(name, dtype))?;
        let len = s.len();
        let view = s.try_slice_mut(l.start_offset()..).ok_or_else(|| past_end(name, l.start_offset(), len))?;
        f(TensorViewMut::gpu(view, shape)?.with_strides(strides)?)
    }
    fn with_tensor_mut<R>(
        t: &candle_core::Tensor,
        f: impl FnOnce(&mut Self, &Layout) -> candle_core::Result<R>,
    ) -> candle_core::Result<R> {
        let op = StorageMut::new(f);
        t.inplace_op1(&op)?;
        op.result()
    }
}
