//! Cost counters of emulated launches: what each kernel did, counted by the host executor as it ran
//! (kernels/emu/, `FaEmuCounters` in abi.h). Not a timing model: they count the instructions and bytes the
//! kernel issued through the intrinsics layer, so a test can check that a kernel moves the bytes and does
//! the work its design promises (tests/it/cost.rs; what each counter counts: docs/emulator.md, "Cost counters").
//!
//! One op call (one `fa_emu_*` launcher) may launch several kernels, e.g. split-KV decode runs the decode
//! kernel then the merge kernel: [`LaunchCounters`] keeps one [`KernelCounters`] per kernel, in launch order.
//! [`Emulator::last_launch_counters`](crate::Emulator::last_launch_counters) returns them for the calling
//! thread's last op.

use std::cmp::max;
use std::ffi::CStr;
use std::fmt;

use crate::sys;

/// Global-memory traffic of one buffer the launch listed (one `FaEmuRegion`), in bytes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BufferTraffic {
    /// The argument's name ("q", "k_cache", "partial_o", ...).
    pub name: String,
    /// The buffer's size as listed (the whole view the op was given).
    pub size: u64,
    /// Bytes loaded: `ld_global`, cp.async sources whose predicate is true, atomics (4 each).
    pub read: u64,
    /// Bytes stored: `st_global`, atomics (4 each).
    pub written: u64,
    /// Load instructions (`ld_global`, one per lane, any width): the requests behind `read`'s bytes, not
    /// counting cp.async and atomics. Vectorised loads show here as fewer requests for the same bytes.
    pub loads: u64,
}

/// Declares [`KernelCounters`] from one list of the executor's scalar counters, each a field of the same name in
/// `FaEmuCounters` (copied by `from_abi`), combined over the kernels of one op by `sum` or `max`
/// (`accumulate`), and listed in this order by [`KernelCounters::values`].
macro_rules! kernel_counters {
    ($( $(#[$doc:meta])* $field:ident: $combine:ident, )*) => {
        /// What one kernel launch did. Warp-level instructions count once per warp; bytes are access sizes.
        #[derive(Debug, Clone, PartialEq, Eq, Default)]
        pub struct KernelCounters {
            /// The kernel's symbol: `fa_<family>_<instantiation>` ("fa_prefill_bf16_d128",
            /// "fa_paged_decode_f16_d64", "fa_merge_states_f32_bf16", "fa_paged_append", ...).
            pub kernel: String,
            /// The launch's threads per CTA and dynamic shared memory (bytes): its geometry, as the launcher
            /// chose it.
            pub block_threads: u64,
            pub smem_bytes: u64,
            /// Global traffic per buffer, in the launch's buffer order (every listed buffer, touched or not).
            pub buffers: Vec<BufferTraffic>,
            $( $(#[$doc])* pub $field: u64, )*
        }

        impl KernelCounters {
            /// How many entries [`KernelCounters::values`] has: the two global totals, the scalar counters and
            /// "kernels".
            const NUM_VALUES: usize = 3 + [$(stringify!($field)),*].len();

            /// Every scalar counter by name, global totals first: the flat view a JSON writer serialises
            /// (per-buffer traffic is in [`KernelCounters::buffers`]; means are sums over `active_blocks`).
            pub fn values(&self) -> [(&'static str, u64); Self::NUM_VALUES] {
                [
                    ("global_bytes_read", self.global_bytes_read()),
                    ("global_bytes_written", self.global_bytes_written()),
                    $( (stringify!($field), self.$field), )*
                    ("kernels", 1),
                ]
            }

            /// Adds `other`'s counts to these; buffers are matched by name (kernels of one op share its
            /// buffers).
            fn accumulate(&mut self, other: &KernelCounters) {
                $( self.$field = $combine(self.$field, other.$field); )*
                for b in &other.buffers {
                    match self.buffers.iter_mut().find(|x| x.name == b.name) {
                        Some(x) => {
                            x.read += b.read;
                            x.written += b.written;
                            x.loads += b.loads;
                        }
                        None => self.buffers.push(b.clone()),
                    }
                }
            }

            /// The counters the executor wrote for one kernel; `regions` is the launch's buffer list.
            fn from_abi(c: &sys::FaEmuCounters, regions: &[sys::FaEmuRegion]) -> Self {
                // SAFETY: the executor NUL-terminates the kernel name within its array (snprintf).
                let kernel = unsafe { CStr::from_ptr(c.kernel.as_ptr()) }.to_string_lossy().into_owned();
                let buffers = regions
                    .iter()
                    .enumerate()
                    .map(|(i, r)| BufferTraffic {
                        name: if r.name.is_null() {
                            "(unnamed)".to_string()
                        } else {
                            // SAFETY: region names are 'static C strings (crate::launch,
                            // crate::testkit::emu_selftest).
                            unsafe { CStr::from_ptr(r.name) }.to_string_lossy().into_owned()
                        },
                        size: r.bytes,
                        read: c.global_bytes_read.get(i).copied().unwrap_or(0),
                        written: c.global_bytes_written.get(i).copied().unwrap_or(0),
                        loads: c.global_loads.get(i).copied().unwrap_or(0),
                    })
                    .collect();
                Self {
                    kernel,
                    block_threads: c.block_threads,
                    smem_bytes: c.smem_bytes,
                    buffers,
                    $( $field: c.$field, )*
                }
            }
        }
    };
}

/// How `accumulate` combines a counter that adds up over the kernels of one op.
fn sum(a: u64, b: u64) -> u64 {
    a + b
}

kernel_counters! {
    /// `mma.m16n8k16` warp instructions.
    mma: sum,
    /// Completed `bar.sync` barriers: one each time a block (or a named barrier's set of warps) passes one.
    barriers: sum,
    /// `fast_exp2` calls, one per lane that calls it.
    exp2: sum,
    /// `ldmatrix` warp instructions (any width, transposed or not).
    ldmatrix: sum,
    /// `shfl` warp instructions.
    shuffles: sum,
    /// Warp arrivals at barriers (each completed barrier times the warps taking part).
    barrier_arrivals: sum,
    /// Shared bytes loaded: `ld_shared`, plus 16 bytes per `ldmatrix` row (128 per matrix).
    shared_bytes_read: sum,
    /// Shared bytes stored: `st_shared`, plus every cp.async landing (zero-fills included).
    shared_bytes_written: sum,
    /// cp.async bytes issued with a true predicate (each also counted as a global read of its source).
    cp_async_bytes: sum,
    /// cp.async bytes issued with a false predicate: the destination is zero-filled, nothing is read.
    cp_async_zfill_bytes: sum,
    /// `wgmma.mma_async` warpgroup instructions (one per warpgroup; m64nNk16 is 2048·N FLOPs).
    wgmma: sum,
    /// TMA loads issued, whole boxes (out-of-bounds elements included; the in-bounds bytes are also global
    /// reads of their buffer).
    tma_load_bytes: sum,
    /// TMA stores completed, whole boxes (the in-bounds bytes are also global writes of their buffer).
    tma_store_bytes: sum,
    /// Of `tma_load_bytes`, loaded with an L2 evict_first policy (data read once: Q tiles).
    tma_load_bytes_evict_first: sum,
    /// Of `tma_load_bytes`, loaded with an L2 evict_last policy (data other CTAs read again: K and V).
    tma_load_bytes_evict_last: sum,
    /// Warp-wide shared-memory instructions: `ld_shared` / `st_shared` (one per source location and lane
    /// occurrence between two collectives), cp.async destinations, `ldmatrix`.
    shared_requests: sum,
    /// Wavefronts those instructions take on 32 banks × 4 bytes (phases of 128 bytes; in each, the most
    /// distinct words one bank holds).
    shared_wavefronts: sum,
    /// The wavefronts they would take without bank conflicts (one per phase with an active lane):
    /// `shared_wavefronts - shared_ideal_wavefronts` is what the conflicts cost.
    shared_ideal_wavefronts: sum,
    /// Lane accesses left out of the three counts above (a warp made more than the emulator's per-step
    /// buffer holds between two collectives); 0 means the counts are complete.
    shared_uncounted: sum,
    /// TMA tiles (every tile of a tensor-map stream but its first) whose load was issued while the previous
    /// tile of the stream could still be in use: the issuer is not ordered after any wgmma read of it
    /// completing (prefetch slack; abi.h FaEmuCounters).
    tma_tiles_prefetched: sum,
    /// TMA tiles whose load waited for a wgmma read of the previous tile to complete (no prefetch).
    tma_tiles_late: sum,
    /// Of the TMA tiles with two before them in their stream, those issued while both could still be in
    /// use: the issuer is ordered after no completed wgmma read of either (two tiles of slack: a three-stage
    /// ring freeing each stage as soon as it is read).
    tma_tiles_two_ahead: sum,
    /// CTAs run.
    blocks: sum,
    /// CTAs that stored any global byte: those that had work (a fixed-size grid's spare CTAs exit without
    /// storing). The balance counters below are over these.
    active_blocks: sum,
    /// The most global bytes one active CTA read (mean: [`Self::mean_block_bytes_read`]).
    max_block_bytes_read: max,
    /// The global bytes all active CTAs read.
    active_bytes_read: sum,
    /// The most mma (and wgmma) instructions one active CTA issued.
    max_block_mma: max,
    /// The mma (and wgmma) instructions all active CTAs issued.
    active_mma: sum,
}

impl KernelCounters {
    /// Whether this is a kernel of `family` ("prefill", "paged_decode", "merge_states", "selftest_mma", ...):
    /// its symbol is `fa_<family>` or `fa_<family>_<instantiation>`.
    pub fn is(&self, family: &str) -> bool {
        self.kernel
            .strip_prefix("fa_")
            .and_then(|r| r.strip_prefix(family))
            .is_some_and(|r| r.is_empty() || r.starts_with('_'))
    }

    /// Global bytes read, over all buffers.
    pub fn global_bytes_read(&self) -> u64 {
        self.buffers.iter().map(|b| b.read).sum()
    }
    /// Global bytes written, over all buffers.
    pub fn global_bytes_written(&self) -> u64 {
        self.buffers.iter().map(|b| b.written).sum()
    }
    /// The traffic of the buffer named `name`, if the launch listed one.
    pub fn buffer(&self, name: &str) -> Option<&BufferTraffic> {
        self.buffers.iter().find(|b| b.name == name)
    }
    /// Bytes read from the buffer named `name` (0 if the launch did not list it).
    pub fn read_of(&self, name: &str) -> u64 {
        self.buffer(name).map_or(0, |b| b.read)
    }
    /// Bytes written to the buffer named `name` (0 if the launch did not list it).
    pub fn written_of(&self, name: &str) -> u64 {
        self.buffer(name).map_or(0, |b| b.written)
    }
    /// Load instructions (per lane) from the buffer named `name` (0 if the launch did not list it).
    pub fn loads_of(&self, name: &str) -> u64 {
        self.buffer(name).map_or(0, |b| b.loads)
    }

    /// Mean global bytes read per active CTA (0 with none).
    pub fn mean_block_bytes_read(&self) -> f64 {
        self.active_bytes_read as f64 / self.active_blocks.max(1) as f64
    }
    /// Mean mma per active CTA (0 with none).
    pub fn mean_block_mma(&self) -> f64 {
        self.active_mma as f64 / self.active_blocks.max(1) as f64
    }
    /// The longest CTA's global reads over the mean's: 1 is perfect balance (1 with no active CTA).
    pub fn read_imbalance(&self) -> f64 {
        if self.active_blocks == 0 {
            return 1.0;
        }
        self.max_block_bytes_read as f64 / self.mean_block_bytes_read().max(1.0)
    }
}

/// Every kernel one op call launched on the emulator, in launch order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LaunchCounters {
    pub kernels: Vec<KernelCounters>,
}

impl LaunchCounters {
    /// The first kernel named `name`.
    pub fn kernel(&self, family: &str) -> Option<&KernelCounters> {
        self.kernels.iter().find(|k| k.is(family))
    }

    /// All kernels summed (named "decode+merge" style), e.g. an op's whole global traffic.
    pub fn total(&self) -> KernelCounters {
        let mut t = KernelCounters::default();
        for k in &self.kernels {
            t.accumulate(k);
        }
        t.kernel = self.kernels.iter().map(|k| k.kernel.as_str()).collect::<Vec<_>>().join("+");
        t
    }

    /// [`KernelCounters::values`] of the total, with "kernels" the number of kernel launches: what a JSON
    /// writer puts in a `"counters"` object.
    pub fn values(&self) -> [(&'static str, u64); KernelCounters::NUM_VALUES] {
        let mut v = self.total().values();
        if let Some(k) = v.iter_mut().find(|(name, _)| *name == "kernels") {
            k.1 = self.kernels.len() as u64;
        }
        v
    }

    /// Reads the counters the executor left in `ctx` (after the launcher returned).
    pub(crate) fn from_abi(ctx: &sys::FaEmuLaunch, regions: &[sys::FaEmuRegion]) -> Self {
        let n = usize::try_from(ctx.num_kernels).unwrap_or(0).min(ctx.kernels.len());
        Self { kernels: ctx.kernels[..n].iter().map(|c| KernelCounters::from_abi(c, regions)).collect() }
    }
}

impl fmt::Display for KernelCounters {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} blocks ({} active, per-CTA read max {} B / mean {:.0} B); global read {} B, written {} B",
            self.kernel,
            self.blocks,
            self.active_blocks,
            self.max_block_bytes_read,
            self.mean_block_bytes_read(),
            self.global_bytes_read(),
            self.global_bytes_written()
        )?;
        let touched: Vec<String> = self
            .buffers
            .iter()
            .filter(|b| b.read > 0 || b.written > 0)
            .map(|b| match (b.read, b.written) {
                (r, 0) => format!("{} r {r}", b.name),
                (0, w) => format!("{} w {w}", b.name),
                (r, w) => format!("{} r {r} w {w}", b.name),
            })
            .collect();
        if !touched.is_empty() {
            write!(f, " ({})", touched.join(", "))?;
        }
        write!(
            f,
            "; mma {}, ldmatrix {}, shfl {}, exp2 {}, barriers {} ({} warp arrivals); shared read {} B, \
             written {} B; cp.async {} B (+{} B zero-fill)",
            self.mma,
            self.ldmatrix,
            self.shuffles,
            self.exp2,
            self.barriers,
            self.barrier_arrivals,
            self.shared_bytes_read,
            self.shared_bytes_written,
            self.cp_async_bytes,
            self.cp_async_zfill_bytes
        )?;
        write!(
            f,
            "; shared {} requests, {} wavefronts (ideal {})",
            self.shared_requests, self.shared_wavefronts, self.shared_ideal_wavefronts
        )?;
        if self.shared_uncounted > 0 {
            write!(f, " (+{} lane accesses uncounted)", self.shared_uncounted)?;
        }
        if self.wgmma > 0 || self.tma_load_bytes > 0 || self.tma_store_bytes > 0 {
            write!(
                f,
                "; wgmma {}, TMA loads {} B, stores {} B",
                self.wgmma, self.tma_load_bytes, self.tma_store_bytes
            )?;
        }
        Ok(())
    }
}

impl fmt::Display for LaunchCounters {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.kernels.is_empty() {
            return write!(f, "(no kernel launched)");
        }
        for (i, k) in self.kernels.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{k}")?;
        }
        Ok(())
    }
}
