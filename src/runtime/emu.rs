//! The emulator backend's Rust side: a handle whose launches run the kernel sources on the host SIMT
//! executor (kernels/emu/), the one place a launch's status and fault message become an `Error`, and
//! where each launch's cost counters ([`crate::counters`]) are kept.

use std::collections::HashMap;
use std::ffi::CStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::thread::ThreadId;

use crate::counters::LaunchCounters;
use crate::error::{Error, ErrorKind, Result};
use crate::sys;

/// Host emulator backend. Each launch runs to completion on the calling thread. Warp scheduling between
/// barriers is varied by a seed that advances per launch, so runs are reproducible for a given starting
/// seed yet successive launches explore different interleavings.
///
/// Engines test their own block tables, lengths and slot mappings here, so by default the emulator reads
/// them before each launch and rejects bad ones with a typed error naming the entry ([`TableChecks`]);
/// [`Emulator::with_table_checks`] keeps the GPU's masking semantics instead.
#[derive(Debug)]
pub struct Emulator {
    next_seed: AtomicU64,
    table_checks: TableChecks,
    /// Per OS thread: the counters of the last op that thread ran here (one emulator may serve many
    /// threads, as in the runner's parallel `report`).
    last_counters: Mutex<HashMap<ThreadId, LaunchCounters>>,
    /// The SMs of the GPU it stands for, where a kernel sizes its grid by them (the sm_90a prefill's
    /// persistent grid): an H100's 132 unless set.
    multiprocessors: usize,
}

/// SMs an emulator stands for unless told otherwise ([`Emulator::with_multiprocessors`]): an H100 SXM's
/// 132 (the persistent sm_90a grid is sized from it).
pub const EMULATED_SMS: usize = 132;

impl Default for Emulator {
    fn default() -> Self {
        Self::with_seed(0x5eed_fa11)
    }
}

impl Emulator {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn with_seed(seed: u64) -> Self {
        Self {
            next_seed: AtomicU64::new(seed),
            table_checks: TableChecks::Strict,
            last_counters: Mutex::new(HashMap::new()),
            multiprocessors: EMULATED_SMS,
        }
    }

    /// The same emulator with `checks` for the engine-owned tables of every later launch.
    pub fn with_table_checks(mut self, checks: TableChecks) -> Self {
        self.table_checks = checks;
        self
    }

    pub fn table_checks(&self) -> TableChecks {
        self.table_checks
    }

    /// The same emulator standing for a GPU of `sms` SMs (at least 1): a persistent kernel then runs on
    /// that many CTAs (tests use a few, so that every CTA walks several work tiles).
    pub fn with_multiprocessors(mut self, sms: usize) -> Self {
        self.multiprocessors = sms.max(1);
        self
    }

    pub fn multiprocessors(&self) -> usize {
        self.multiprocessors
    }
    pub(crate) fn take_seed(&self) -> u64 {
        self.next_seed.fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed)
    }

    /// The cost counters of the last op the calling thread ran on this emulator: one entry per kernel the
    /// op launched (split-KV decode: the decode kernel, then the merge kernel). `None` before the thread's
    /// first op, or when its last op failed. An op that launches nothing (an empty batch) leaves the
    /// previous op's counters in place.
    pub fn last_launch_counters(&self) -> Option<LaunchCounters> {
        self.counters_map().get(&std::thread::current().id()).cloned()
    }

    /// Records (or, for a failed op, forgets) the calling thread's last op's counters.
    pub(crate) fn record_counters(&self, counters: Option<LaunchCounters>) {
        let id = std::thread::current().id();
        let mut map = self.counters_map();
        match counters {
            Some(c) => map.insert(id, c),
            None => map.remove(&id),
        };
    }

    fn counters_map(&self) -> std::sync::MutexGuard<'_, HashMap<ThreadId, LaunchCounters>> {
        // A panic while the lock was held cannot leave the map half-updated (single insert/remove/get).
        self.last_counters.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// What the emulator does with engine-owned table data that the GPU kernels would mask (docs/semantics.md,
/// "Bad tables"). The GPU backend never reads that data on the host (it lives in device memory), so it always
/// masks; the emulator has it in host memory and checks it for free.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TableChecks {
    /// Before each launch, as [`crate::PagedKvCache::validate`] (decode, paged prefill: every `seq_lens[b]`
    /// in `0..=max_seq_len`, every block-table id inside `seq_len` in the pool) and
    /// [`crate::paged::validate_slot_mapping`] (append: slots inside the pool, none repeated): a bad entry
    /// is an `OutOfBounds` or `Shape` error naming it, and nothing runs.
    #[default]
    Strict,
    /// The GPU's semantics: lengths clamped into the table's capacity, tokens of out-of-pool pages masked,
    /// out-of-pool slots skipped (duplicate slots race, as on the GPU). For engines whose tables rely on it.
    GpuMasking,
}

/// Runs one op on the emulator: `launch` receives an FaExec in emulate mode (its FaEmuLaunch lists
/// `regions`, the only memory the kernels may touch) and calls an `fa_*` launcher. Returns the cost
/// counters of every kernel the launcher ran.
pub(crate) fn run_emulated(
    kernel: &str,
    regions: &[sys::FaEmuRegion],
    seed: u64,
    launch: impl FnOnce(*mut sys::FaExec) -> i32,
) -> Result<LaunchCounters> {
    // Boxed: the context carries FA_EMU_MAX_KERNELS counter records (~5 KB).
    let mut ctx = Box::new(sys::FaEmuLaunch {
        regions: regions.as_ptr(),
        num_regions: crate::error::to_i32("regions", regions.len())?,
        seed,
        ..Default::default()
    });
    // SAFETY: FaExec is plain old data; all-zero is a valid value, then filled in.
    let mut exec: Box<sys::FaExec> = Box::new(unsafe { std::mem::zeroed() });
    exec.mode = sys::FA_EXEC_EMULATE as i32;
    exec.emu = &mut *ctx;
    let status = launch(&mut *exec);
    if status == 0 {
        return Ok(LaunchCounters::from_abi(&ctx, regions));
    }
    // SAFETY: the executor writes a NUL-terminated message into the zero-initialised buffer.
    let msg = unsafe { CStr::from_ptr(ctx.message.as_ptr()) }.to_string_lossy().into_owned();
    // The launch seed reproduces the interleaving that led to the fault.
    let msg = if msg.is_empty() { msg } else { format!("{msg} [emulator seed {seed:#x}]") };
    Err(status_error(kernel, "emu", status, Some(msg)))
}

/// The error for a launcher's non-zero status.
pub(crate) fn status_error(kernel: &str, backend: &str, status: i32, detail: Option<String>) -> Error {
    let detail = detail.filter(|m| !m.is_empty());
    let kind = match status {
        s if s == sys::FA_ERR_INVALID => ErrorKind::Shape,
        s if s == sys::FA_ERR_UNSUPPORTED => ErrorKind::Unsupported,
        s if s == sys::FA_ERR_EMULATOR => ErrorKind::Emulator,
        _ => ErrorKind::Backend,
    };
    let what = detail.unwrap_or_else(|| match kind {
        ErrorKind::Shape => "launcher rejected its parameters".to_string(),
        ErrorKind::Unsupported => "no kernel for this configuration".to_string(),
        _ => format!("launcher status {status}"),
    });
    Error::new(kind, format!("{kernel} ({backend}): {what}"))
}
