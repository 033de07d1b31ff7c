//! TMA tensor maps (sm_90): one description of a global tensor and the box a TMA copy moves, validated once,
//! then encoded for whichever backend runs the kernel: the driver's `cuTensorMapEncodeTiled` on a GPU, or the
//! emulator's own [`sys::FaEmuTensorMap`]. Either way the kernel receives the 128 bytes of an
//! [`sys::FaTensorMap`] inside its params. An invalid map is a typed error here, before any launch.
//!
//! Only what the kernels use is supported: tiled mode, no interleave, unit element strides, zero fill, and
//! for a swizzled map a box whose inner dimension is exactly one swizzle span (the emulator models that case;
//! the driver also accepts narrower boxes).

use crate::error::{Error, ErrorKind, Result};
use crate::sys;

/// How a TMA box is laid out in shared memory: row-major, then 16-byte chunks XOR-permuted within each
/// group of 8 rows of `S` bytes (`S` = 32, 64 or 128), the pattern wgmma descriptors of the same swizzle read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TmaSwizzle {
    None,
    B32,
    B64,
    B128,
}

impl TmaSwizzle {
    /// The swizzle span in bytes (0 without swizzle).
    pub fn bytes(self) -> u32 {
        match self {
            TmaSwizzle::None => 0,
            TmaSwizzle::B32 => 32,
            TmaSwizzle::B64 => 64,
            TmaSwizzle::B128 => 128,
        }
    }
}

/// A tiled tensor map: `dims` in elements, dimension 0 innermost (contiguous); `strides[i]` the byte stride
/// of dimension `i + 1`; `box_dims` the elements one copy moves per dimension.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorMapSpec {
    pub elem_bytes: u32,
    pub dims: Vec<u64>,
    pub strides: Vec<u64>,
    pub box_dims: Vec<u32>,
    pub swizzle: TmaSwizzle,
}

impl TensorMapSpec {
    /// Bytes of one box in shared memory (out-of-bounds elements included).
    pub fn box_bytes(&self) -> u64 {
        self.box_dims.iter().map(|&b| b as u64).product::<u64>() * self.elem_bytes as u64
    }

    /// Checks every constraint of `cuTensorMapEncodeTiled` the kernels can meet (and the emulator's).
    pub fn validate(&self, base: usize) -> Result<()> {
        let rank = self.dims.len();
        if !(1..=5).contains(&rank) {
            return Err(Error::shape("tensor map", format!("rank {rank}: TMA tensors have 1 to 5 dimensions")));
        }
        if self.box_dims.len() != rank || self.strides.len() != rank - 1 {
            return Err(Error::shape(
                "tensor map",
                format!(
                    "{rank} dims need {rank} box dims and {} strides, got {} and {}",
                    rank - 1,
                    self.box_dims.len(),
                    self.strides.len()
                ),
            ));
        }
        if ![1, 2, 4].contains(&self.elem_bytes) {
            return Err(Error::unsupported("tensor map", format!("{}-byte elements (1, 2 or 4)", self.elem_bytes)));
        }
        if base % 16 != 0 {
            return Err(Error::alignment("tensor map", format!("base address {base:#x} is not 16-byte aligned")));
        }
        for (d, &n) in self.dims.iter().enumerate() {
            if n == 0 || n > 1 << 32 {
                return Err(Error::shape("tensor map", format!("dimension {d} has {n} elements (1..=2^32)")));
            }
        }
        for (i, &s) in self.strides.iter().enumerate() {
            if s % 16 != 0 {
                return Err(Error::alignment(
                    "tensor map",
                    format!("the stride of dimension {} is {s} bytes, not a multiple of 16", i + 1),
                ));
            }
            if s >= 1 << 40 {
                return Err(Error::new(
                    ErrorKind::Overflow,
                    format!("tensor map: the stride of dimension {} is {s} bytes (at most 2^40 - 1)", i + 1),
                ));
            }
        }
        for (d, &b) in self.box_dims.iter().enumerate() {
            if b == 0 || b > 256 {
                return Err(Error::shape("tensor map", format!("box dimension {d} is {b} elements (1..=256)")));
            }
        }
        let inner = self.box_dims[0] as u64 * self.elem_bytes as u64;
        if inner % 16 != 0 {
            return Err(Error::alignment(
                "tensor map",
                format!("the box's inner dimension is {inner} bytes, not a multiple of 16"),
            ));
        }
        let span = self.swizzle.bytes() as u64;
        if span != 0 && inner > span {
            return Err(Error::shape(
                "tensor map",
                format!("the box's inner dimension is {inner} bytes, wider than its {span}-byte swizzle span"),
            ));
        }
        if span != 0 && inner < span {
            return Err(Error::unsupported(
                "tensor map",
                format!(
                    "the box's inner dimension is {inner} bytes, narrower than its {span}-byte swizzle span \
                     (only full-span rows are supported)"
                ),
            ));
        }
        Ok(())
    }

    /// The emulator's encoding, for a tensor at host address `base`.
    pub fn encode_emulator(&self, base: *const std::ffi::c_void) -> Result<sys::FaTensorMap> {
        self.validate(base as usize)?;
        let mut m = sys::FaEmuTensorMap {
            magic: sys::FA_EMU_TENSOR_MAP_MAGIC,
            rank: self.dims.len() as u32,
            elem_bytes: self.elem_bytes,
            swizzle_bytes: self.swizzle.bytes(),
            base,
            ..Default::default()
        };
        m.strides[0] = self.elem_bytes as u64;
        for d in 0..self.dims.len() {
            m.dims[d] = self.dims[d];
            m.box_[d] = self.box_dims[d];
            if d > 0 {
                m.strides[d] = self.strides[d - 1];
            }
        }
        let mut out = sys::FaTensorMap::default();
        const _: () = assert!(std::mem::size_of::<sys::FaEmuTensorMap>() <= std::mem::size_of::<sys::FaTensorMap>());
        // SAFETY: FaEmuTensorMap is plain old data no larger than the 128 bytes of FaTensorMap.
        unsafe {
            std::ptr::copy_nonoverlapping(
                (&m as *const sys::FaEmuTensorMap).cast::<u8>(),
                out.opaque.as_mut_ptr().cast::<u8>(),
                std::mem::size_of::<sys::FaEmuTensorMap>(),
            )
        };
        Ok(out)
    }

    /// The driver's encoding (`cuTensorMapEncodeTiled`), for a tensor at device address `base`.
    pub fn encode_gpu(&self, base: u64) -> Result<sys::FaTensorMap> {
        use cudarc::driver::sys as cu;
        self.validate(base as usize)?;
        if !crate::device::driver_present() {
            return Err(Error::new(ErrorKind::NoDriver, "tensor map: no CUDA driver to encode it"));
        }
        let rank = self.dims.len();
        let data_type = match self.elem_bytes {
            1 => cu::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_UINT8,
            2 => cu::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_UINT16,
            _ => cu::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_UINT32,
        };
        let swizzle = match self.swizzle {
            TmaSwizzle::None => cu::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_NONE,
            TmaSwizzle::B32 => cu::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_32B,
            TmaSwizzle::B64 => cu::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_64B,
            TmaSwizzle::B128 => cu::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
        };
        let element_strides = [1u32; 5];
        // SAFETY: CUtensorMap is plain old data; all-zero is a valid value for the driver to overwrite.
        let mut map: cu::CUtensorMap = unsafe { std::mem::zeroed() };
        // SAFETY: every array holds at least `rank` (strides: rank - 1) entries; the driver only writes `map`.
        let r = unsafe {
            cu::cuTensorMapEncodeTiled(
                &mut map,
                data_type,
                rank as u32,
                base as *mut std::ffi::c_void,
                self.dims.as_ptr(),
                self.strides.as_ptr(),
                self.box_dims.as_ptr(),
                element_strides.as_ptr(),
                cu::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
                swizzle,
                cu::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                cu::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
            )
        };
        if r != cu::CUresult::CUDA_SUCCESS {
            return Err(Error::from(cudarc::driver::DriverError(r)).context("cuTensorMapEncodeTiled"));
        }
        Ok(sys::FaTensorMap { opaque: map.opaque })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> TensorMapSpec {
        TensorMapSpec {
            elem_bytes: 2,
            dims: vec![64, 100],
            strides: vec![128],
            box_dims: vec![64, 32],
            swizzle: TmaSwizzle::B128,
        }
    }

    #[test]
    fn valid_map_encodes_for_the_emulator() {
        let data = vec![0u64; 64 * 100 / 4];
        let map = spec().encode_emulator(data.as_ptr().cast()).unwrap();
        assert_eq!(map.opaque[0] as u32, sys::FA_EMU_TENSOR_MAP_MAGIC);
        assert_eq!(spec().box_bytes(), 64 * 32 * 2);
    }

    #[test]
    fn invalid_maps_are_typed_errors() {
        let kind = |s: TensorMapSpec, base: usize| s.validate(base).unwrap_err().kind().clone();
        assert_eq!(kind(spec(), 8), ErrorKind::Alignment);
        assert_eq!(kind(TensorMapSpec { strides: vec![120], ..spec() }, 0), ErrorKind::Alignment);
        assert_eq!(kind(TensorMapSpec { strides: vec![1 << 40], ..spec() }, 0), ErrorKind::Overflow);
        assert_eq!(kind(TensorMapSpec { box_dims: vec![64, 257], ..spec() }, 0), ErrorKind::Shape);
        assert_eq!(kind(TensorMapSpec { box_dims: vec![128, 32], ..spec() }, 0), ErrorKind::Shape);
        assert_eq!(kind(TensorMapSpec { box_dims: vec![32, 32], ..spec() }, 0), ErrorKind::Unsupported);
        assert_eq!(
            kind(TensorMapSpec { box_dims: vec![4, 32], swizzle: TmaSwizzle::None, ..spec() }, 0),
            ErrorKind::Alignment
        );
        assert_eq!(
            kind(TensorMapSpec { dims: vec![1; 6], strides: vec![16; 5], box_dims: vec![1; 6], ..spec() }, 0),
            ErrorKind::Shape
        );
        assert_eq!(kind(TensorMapSpec { dims: vec![64, 0], ..spec() }, 0), ErrorKind::Shape);
        assert_eq!(kind(TensorMapSpec { elem_bytes: 3, ..spec() }, 0), ErrorKind::Unsupported);
    }
}
