//! The host-emulator backend's launch helper. A `fa_emu_*` launcher takes an `FaEmuLaunch` as its stream:
//! the buffers the kernel may touch (every global access is checked against them), the scheduling seed,
//! and a message buffer the emulator fills when it detects a fault. [`run_emulated`] builds that context,
//! calls the launcher and turns its status into a [`Result`]; [`region`] / [`region_mut`] describe buffers.

use std::ffi::CStr;

use crate::error::{to_i32, Error, ErrorKind, Result};
use crate::sys;

/// A buffer the kernel may read: `name` is how fault messages refer to it ("q+128").
pub(crate) fn region<T>(name: &'static CStr, data: &[T]) -> sys::FaEmuRegion {
    sys::FaEmuRegion {
        base: data.as_ptr().cast(),
        bytes: std::mem::size_of_val(data) as u64,
        writable: 0,
        name: name.as_ptr(),
    }
}

/// A buffer the kernel may read and write.
pub(crate) fn region_mut<T>(name: &'static CStr, data: &mut [T]) -> sys::FaEmuRegion {
    sys::FaEmuRegion { writable: 1, ..region(name, data) }
}

/// Runs one emulated launch: `launch` receives the stream handle to pass to a `fa_emu_*` launcher and
/// returns its status. A fault becomes an [`ErrorKind::Emulator`] error whose message names kernel, block,
/// thread and address, plus the seed that reproduces it.
///
/// The caller guarantees that `regions` describe live buffers for the duration of the call; the emulator
/// never touches memory outside them.
pub(crate) fn run_emulated(
    kernel: &str,
    regions: &[sys::FaEmuRegion],
    seed: u64,
    launch: impl FnOnce(sys::FaStream) -> i32,
) -> Result<()> {
    let mut ctx = sys::FaEmuLaunch {
        regions: regions.as_ptr(),
        num_regions: to_i32("regions", regions.len())?,
        seed,
        message: [0; 1024],
    };
    let status = launch((&mut ctx as *mut sys::FaEmuLaunch).cast());
    let message = || {
        let bytes: Vec<u8> = ctx.message.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
        String::from_utf8_lossy(&bytes).into_owned()
    };
    match status {
        s if s == sys::FA_OK => Ok(()),
        s if s == sys::FA_ERR_EMULATOR => {
            let msg = message();
            let msg = if msg.is_empty() { format!("kernel {kernel}: emulator fault") } else { msg };
            Err(Error::new(ErrorKind::Emulator, format!("{msg} [emulator seed {seed}]")))
        }
        s if s == sys::FA_ERR_UNSUPPORTED => {
            Err(Error::unsupported(kernel, "no kernel instantiated for this configuration"))
        }
        s if s == sys::FA_ERR_INVALID => Err(Error::shape(kernel, "the launcher rejected its parameters")),
        s => Err(Error::new(ErrorKind::Emulator, format!("kernel {kernel}: unexpected launcher status {s}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_to_error_kinds() {
        assert!(run_emulated("k", &[], 0, |_| sys::FA_OK).is_ok());
        let e = run_emulated("k", &[], 7, |_| sys::FA_ERR_EMULATOR).unwrap_err();
        assert_eq!(e.kind(), &ErrorKind::Emulator);
        assert!(e.message().contains("kernel k") && e.message().contains("seed 7"), "{e}");
        let e = run_emulated("k", &[], 0, |_| sys::FA_ERR_UNSUPPORTED).unwrap_err();
        assert_eq!(e.kind(), &ErrorKind::Unsupported);
    }

    #[test]
    fn the_launcher_sees_the_regions_and_its_message_comes_back() {
        let data = [1u32, 2, 3];
        let regions = [region(c"data", &data)];
        let err = run_emulated("k", &regions, 3, |stream| {
            // SAFETY: run_emulated passes a pointer to its live FaEmuLaunch.
            let ctx = unsafe { &mut *stream.cast::<sys::FaEmuLaunch>() };
            assert_eq!(ctx.num_regions, 1);
            // SAFETY: regions points at `regions`, which outlives the call.
            let r = unsafe { &*ctx.regions };
            assert_eq!(r.bytes, 12);
            assert_eq!(r.writable, 0);
            for (dst, src) in ctx.message.iter_mut().zip(b"kernel k block (0,0,0) thread 5: boom\0") {
                *dst = *src as std::os::raw::c_char;
            }
            sys::FA_ERR_EMULATOR
        })
        .unwrap_err();
        assert_eq!(err.message(), "kernel k block (0,0,0) thread 5: boom [emulator seed 3]");
    }
}
