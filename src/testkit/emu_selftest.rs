//! Safe wrappers over the emulator self-test launchers (`fa_emu_selftest_*`, kernels/selftest.cu), for
//! tests/emulator.rs. Not part of the public API: each function stages its inputs in host buffers, runs the
//! kernel under the emulator with the given scheduling seed, and returns what the kernel wrote (or the
//! emulator's fault as an [`ErrorKind::Emulator`](crate::ErrorKind::Emulator) error).

use std::cell::RefCell;
use std::ffi::CStr;

use crate::counters::LaunchCounters;
use crate::dtype::{DType, Element};
use crate::emu::run_emulated;
use crate::error::{to_i32, Error, Result};
use crate::sys::selftest as sys;

thread_local! {
    static LAST_COUNTERS: RefCell<Option<LaunchCounters>> = const { RefCell::new(None) };
}

/// The cost counters of the last self-test this thread ran (`None` if it failed), for the counters' own
/// tests (tests/it/cost.rs).
pub fn last_counters() -> Option<LaunchCounters> {
    LAST_COUNTERS.with(|c| c.borrow().clone())
}

/// [`run_emulated`], keeping the counters for [`last_counters`].
fn run(
    kernel: &str,
    regions: &[sys::FaEmuRegion],
    seed: u64,
    launch: impl FnOnce(*mut sys::FaExec) -> i32,
) -> Result<()> {
    let result = run_emulated(kernel, regions, seed, launch);
    LAST_COUNTERS.with(|c| *c.borrow_mut() = result.as_ref().ok().cloned());
    result.map(drop)
}

/// A buffer the kernel may read: `name` is how fault messages refer to it ("input+128").
fn region<T>(name: &'static CStr, data: &[T]) -> sys::FaEmuRegion {
    sys::FaEmuRegion {
        base: data.as_ptr().cast(),
        bytes: std::mem::size_of_val(data) as u64,
        writable: 0,
        name: name.as_ptr(),
    }
}

/// A buffer the kernel may read and write.
fn region_mut<T>(name: &'static CStr, data: &mut [T]) -> sys::FaEmuRegion {
    sys::FaEmuRegion { writable: 1, ..region(name, data) }
}

/// Threads per block of the block-sized self-tests (4 warps).
pub const BLOCK_THREADS: usize = 128;
/// Elements of the planted-bug kernels' input and output.
pub const BUG_ELEMS: usize = 512;
/// Threads of the cp.async self-test's block (2 warps); one 16-byte chunk per thread per group.
pub const CP_ASYNC_THREADS: usize = 64;

/// `mma.m16n8k16` on raw fragment registers (lane l: `a[4l..4l+4]`, `b[2l..2l+2]`, `c[4l..4l+4]`).
/// Returns D = A·B + C in the D fragment layout.
pub fn mma(dtype: DType, a: &[u32; 128], b: &[u32; 64], c: &[f32; 128], seed: u64) -> Result<[f32; 128]> {
    let mut d = [f32::NAN; 128];
    let regions = [region(c"a", a), region(c"b", b), region(c"c", c), region_mut(c"d", &mut d)];
    let params =
        sys::FaSelftestMmaParams { a: a.as_ptr(), b: b.as_ptr(), c: c.as_ptr(), d: d.as_mut_ptr(), dtype: dtype.abi() };
    // SAFETY: every pointer in `params` is one of `regions`' live buffers.
    run("selftest_mma", &regions, seed, |s| unsafe { sys::fa_selftest_mma(params, s) })?;
    Ok(d)
}

/// `ldmatrix.x{count}{.trans}` with lane l addressing row `row_of_lane[l]` of `rows` (16 bytes each).
/// Returns the registers, lane l's at `[4l..4l+count]` (the rest 0).
pub fn ldmatrix(rows: &[[u16; 8]], row_of_lane: &[i32; 32], count: u32, trans: bool, seed: u64) -> Result<[u32; 128]> {
    let mut out = [0u32; 128];
    let regions = [region(c"rows_data", rows), region(c"row_of_lane", row_of_lane), region_mut(c"out", &mut out)];
    let params = sys::FaSelftestLdmatrixParams {
        rows_data: rows.as_ptr().cast(),
        row_of_lane: row_of_lane.as_ptr(),
        out: out.as_mut_ptr(),
        rows: to_i32("rows", rows.len())?,
        count: to_i32("count", count as usize)?,
        trans: trans as i32,
    };
    // SAFETY: every pointer in `params` is one of `regions`' live buffers.
    run("selftest_ldmatrix", &regions, seed, |s| unsafe { sys::fa_selftest_ldmatrix(params, s) })?;
    Ok(out)
}

/// The kind of warp-wide shared access the bank-conflict self-test makes (`FA_SELFTEST_BANK_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BankAccess {
    /// `ld_shared` of `bytes` per lane.
    Load,
    /// `st_shared` of `bytes` per lane.
    Store,
    /// A 16-byte cp.async destination (zero-filled).
    CpAsync,
    /// `ldmatrix.x4`: each lane's offset is its row address.
    LdmatrixX4,
}

/// One warp makes `repeat` identical shared accesses of `kind`, lane l at byte offset `offsets[l]` of
/// `smem_bytes` of shared memory (`< 0`: the lane skips it); the counters ([`last_counters`]) hold their
/// requests and wavefronts.
pub fn bank_access(kind: BankAccess, bytes: u32, offsets: &[i32; 32], repeat: u32, smem_bytes: u32) -> Result<()> {
    let mut out = [0u32; 32];
    let regions = [region(c"offsets", offsets), region_mut(c"out", &mut out)];
    let params = sys::FaSelftestBankParams {
        offsets: offsets.as_ptr(),
        out: out.as_mut_ptr(),
        kind: match kind {
            BankAccess::Load => sys::FA_SELFTEST_BANK_LOAD,
            BankAccess::Store => sys::FA_SELFTEST_BANK_STORE,
            BankAccess::CpAsync => sys::FA_SELFTEST_BANK_CP_ASYNC,
            BankAccess::LdmatrixX4 => sys::FA_SELFTEST_BANK_LDMATRIX_X4,
        } as i32,
        bytes: to_i32("bytes", bytes as usize)?,
        repeat: to_i32("repeat", repeat as usize)?,
        smem_bytes: to_i32("smem_bytes", smem_bytes as usize)?,
    };
    // SAFETY: every pointer in `params` is one of `regions`' live buffers.
    run("selftest_bank", &regions, 1, |s| unsafe { sys::fa_selftest_bank(params, s) })
}

/// A warp shuffle or vote, lane by lane.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WarpOp {
    /// `out[l] = shfl_xor(values[l], operands[l])`
    ShflXor,
    /// `out[l] = shfl_idx(values[l], operands[l])`
    ShflIdx,
    /// `out[l] = warp_ballot(values[l] != 0)`
    Ballot,
    /// `out[l] = warp_any(values[l] != 0)`
    Any,
    /// `out[l] = warp_all(values[l] != 0)`
    All,
    /// `out[l] = fast_exp2(f32::from_bits(values[l])).to_bits()`
    Exp2,
}

pub fn warp_op(op: WarpOp, values: &[u32; 32], operands: &[i32; 32], seed: u64) -> Result<[u32; 32]> {
    let mut out = [0u32; 32];
    let regions = [region(c"values", values), region(c"operands", operands), region_mut(c"out", &mut out)];
    let op = match op {
        WarpOp::ShflXor => sys::FA_SELFTEST_SHFL_XOR,
        WarpOp::ShflIdx => sys::FA_SELFTEST_SHFL_IDX,
        WarpOp::Ballot => sys::FA_SELFTEST_BALLOT,
        WarpOp::Any => sys::FA_SELFTEST_ANY,
        WarpOp::All => sys::FA_SELFTEST_ALL,
        WarpOp::Exp2 => sys::FA_SELFTEST_EXP2,
    } as i32;
    let params =
        sys::FaSelftestWarpParams { values: values.as_ptr(), operands: operands.as_ptr(), out: out.as_mut_ptr(), op };
    // SAFETY: every pointer in `params` is one of `regions`' live buffers.
    run("selftest_warp", &regions, seed, |s| unsafe { sys::fa_selftest_warp(params, s) })?;
    Ok(out)
}

/// Out-of-kernel marker for the chunks the cp.async self-test does not write.
pub const UNTOUCHED: u8 = 0xA5;

/// cp.async groups: `src.len() / 64` groups of one 16-byte chunk per thread, predicated by `preds`, then
/// `cp_async_wait<wait_pending>` and a read-back of the first `read_groups` groups (every other chunk
/// stays [`UNTOUCHED`]).
pub fn cp_async(
    src: &[[u8; 16]],
    preds: &[bool],
    wait_pending: u32,
    read_groups: u32,
    seed: u64,
) -> Result<Vec<[u8; 16]>> {
    if src.len() % CP_ASYNC_THREADS != 0 || preds.len() != src.len() {
        return Err(Error::shape(
            "src",
            "cp_async needs a whole number of 64-chunk groups and one predicate per chunk",
        ));
    }
    let preds: Vec<u8> = preds.iter().map(|&p| p as u8).collect();
    let mut out = vec![[UNTOUCHED; 16]; src.len()];
    let regions = [region(c"src", src), region(c"preds", &preds), region_mut(c"out", &mut out)];
    let params = sys::FaSelftestCpAsyncParams {
        src: src.as_ptr().cast(),
        preds: preds.as_ptr(),
        out: out.as_mut_ptr().cast(),
        groups: to_i32("groups", src.len() / CP_ASYNC_THREADS)?,
        wait_pending: to_i32("wait_pending", wait_pending as usize)?,
        read_groups: to_i32("read_groups", read_groups as usize)?,
    };
    // SAFETY: every pointer in `params` is one of `regions`' live buffers.
    run("selftest_cp_async", &regions, seed, |s| unsafe { sys::fa_selftest_cp_async(params, s) })?;
    Ok(out)
}

/// What the atomics self-test leaves behind.
#[derive(Debug, Clone)]
pub struct AtomicResult {
    pub counter: i32,
    /// The value `atomic_add(counter, 1)` returned to each thread.
    pub olds: Vec<i32>,
    pub sum: f32,
}

/// `addends.len() / 128` blocks of 128 threads; each thread increments one counter and adds its addend to
/// one float, both atomically.
pub fn atomics(addends: &[f32], seed: u64) -> Result<AtomicResult> {
    if addends.is_empty() || addends.len() % BLOCK_THREADS != 0 {
        return Err(Error::shape("addends", "atomics needs a whole number of 128-thread blocks"));
    }
    let mut counter = [0i32];
    let mut sum = [0f32];
    let mut olds = vec![-1i32; addends.len()];
    let regions = [
        region_mut(c"counter", &mut counter),
        region_mut(c"olds", &mut olds),
        region_mut(c"sum", &mut sum),
        region(c"addends", addends),
    ];
    let params = sys::FaSelftestAtomicParams {
        counter: counter.as_mut_ptr(),
        olds: olds.as_mut_ptr(),
        sum: sum.as_mut_ptr(),
        addends: addends.as_ptr(),
        blocks: to_i32("blocks", addends.len() / BLOCK_THREADS)?,
    };
    // SAFETY: every pointer in `params` is one of `regions`' live buffers.
    run("selftest_atomic", &regions, seed, |s| unsafe { sys::fa_selftest_atomic(params, s) })?;
    Ok(AtomicResult { counter: counter[0], olds, sum: sum[0] })
}

/// Named-barrier scenarios (see `FA_SELFTEST_BARRIER_*` in abi.h).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BarrierMode {
    /// Warp 0 → warp 1 through barrier 1, warp 2 → warp 3 through barrier 2.
    Pairs,
    /// As `Pairs`, but warp 3 reads warp 0's data, which barrier 2 does not order: a race.
    Cross,
    /// All warps through barrier 3 (128 threads), then each reads another warp's data.
    Block,
    /// Warps 0 and 1 wait at barrier 1 with different thread counts.
    Mismatch,
}

/// Returns what each thread stored (`-1` for producers).
pub fn barriers(mode: BarrierMode, seed: u64) -> Result<Vec<i32>> {
    let mut out = vec![i32::MIN; BLOCK_THREADS];
    let regions = [region_mut(c"out", &mut out)];
    let mode = match mode {
        BarrierMode::Pairs => sys::FA_SELFTEST_BARRIER_PAIRS,
        BarrierMode::Cross => sys::FA_SELFTEST_BARRIER_CROSS,
        BarrierMode::Block => sys::FA_SELFTEST_BARRIER_BLOCK,
        BarrierMode::Mismatch => sys::FA_SELFTEST_BARRIER_MISMATCH,
    } as i32;
    let params = sys::FaSelftestBarrierParams { out: out.as_mut_ptr(), mode };
    // SAFETY: every pointer in `params` is one of `regions`' live buffers.
    run("selftest_barrier", &regions, seed, |s| unsafe { sys::fa_selftest_barrier(params, s) })?;
    Ok(out)
}

/// The planted bugs (see `FA_SELFTEST_BUG_*` in abi.h).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bug {
    MissingSyncthreads,
    OobWrite,
    MissingCpAsyncWait,
    DivergentBarrier,
    Deadlock,
    Misaligned16,
    StackOverflow,
    RawPointer,
    DivByZero,
    StoreToInput,
    SharedOob,
    GlobalAsShared,
    SpinWait,
}

impl Bug {
    pub const ALL: [Bug; 13] = [
        Bug::MissingSyncthreads,
        Bug::OobWrite,
        Bug::MissingCpAsyncWait,
        Bug::DivergentBarrier,
        Bug::Deadlock,
        Bug::Misaligned16,
        Bug::StackOverflow,
        Bug::RawPointer,
        Bug::DivByZero,
        Bug::StoreToInput,
        Bug::SharedOob,
        Bug::GlobalAsShared,
        Bug::SpinWait,
    ];

    /// The kernel's tag of this bug (`FA_SELFTEST_BUG_*`, the params' `bug` field).
    pub fn abi(self) -> i32 {
        (match self {
            Bug::MissingSyncthreads => sys::FA_SELFTEST_BUG_MISSING_SYNCTHREADS,
            Bug::OobWrite => sys::FA_SELFTEST_BUG_OOB_WRITE,
            Bug::MissingCpAsyncWait => sys::FA_SELFTEST_BUG_MISSING_CP_ASYNC_WAIT,
            Bug::DivergentBarrier => sys::FA_SELFTEST_BUG_DIVERGENT_BARRIER,
            Bug::Deadlock => sys::FA_SELFTEST_BUG_DEADLOCK,
            Bug::Misaligned16 => sys::FA_SELFTEST_BUG_MISALIGNED_16,
            Bug::StackOverflow => sys::FA_SELFTEST_BUG_STACK_OVERFLOW,
            Bug::RawPointer => sys::FA_SELFTEST_BUG_RAW_POINTER,
            Bug::DivByZero => sys::FA_SELFTEST_BUG_DIV_BY_ZERO,
            Bug::StoreToInput => sys::FA_SELFTEST_BUG_STORE_TO_INPUT,
            Bug::SharedOob => sys::FA_SELFTEST_BUG_SHARED_OOB,
            Bug::GlobalAsShared => sys::FA_SELFTEST_BUG_GLOBAL_AS_SHARED,
            Bug::SpinWait => sys::FA_SELFTEST_BUG_SPIN_WAIT,
        }) as i32
    }
}

/// Runs one planted-bug kernel over `input` (512 floats); `planted == false` runs its correct twin.
/// `race_detection == false` turns the emulator's race detector off. Returns the output (NaN where the
/// kernel wrote nothing).
pub fn planted_bug(bug: Bug, planted: bool, race_detection: bool, input: &[f32], seed: u64) -> Result<Vec<f32>> {
    if input.len() != BUG_ELEMS {
        return Err(Error::shape("input", format!("the planted-bug kernels take {BUG_ELEMS} floats")));
    }
    // Spare capacity after `out` keeps an out-of-bounds write from landing in another listed buffer.
    let mut out = Vec::with_capacity(2 * BUG_ELEMS);
    out.resize(BUG_ELEMS, f32::NAN);
    let regions = [region(c"input", input), region_mut(c"out", &mut out)];
    let bug = bug.abi();
    let params = sys::FaSelftestBugParams {
        input: input.as_ptr(),
        out: out.as_mut_ptr(),
        bug,
        planted: planted as i32,
        race_detection: race_detection as i32,
    };
    // SAFETY: every pointer in `params` is one of `regions`' live buffers.
    run("selftest_bug", &regions, seed, |s| unsafe { sys::fa_selftest_bug(params, s) })?;
    Ok(out)
}

/// Pipeline bugs the GEMM can plant (see `FA_SELFTEST_GEMM_*` in abi.h).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GemmBug {
    None,
    /// The next stage's cp.async overwrites a tile other warps may still be reading.
    NoTrailingBarrier,
    /// Computes on a stage whose cp.async was never waited for.
    NoWait,
}

/// Shape of the self-test GEMM: `a` is `[m][k]`, `b` is `[n][k]` (or `[k][n]` when `b_k_major`), c is `[m][n]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GemmShape {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub b_k_major: bool,
}

/// The tiled mma GEMM (ldmatrix + mma + cp.async double buffering): returns c = a·b in fp32.
pub fn gemm<T: Element>(a: &[T], b: &[T], shape: GemmShape, bug: GemmBug, seed: u64) -> Result<Vec<f32>> {
    let GemmShape { m, n, k, b_k_major } = shape;
    if a.len() != m * k || b.len() != n * k {
        return Err(Error::shape("a/b", format!("expected {m}x{k} and {n}x{k} elements")));
    }
    let mut c = vec![f32::NAN; m * n];
    let regions = [region(c"a", a), region(c"b", b), region_mut(c"c", &mut c)];
    let params = sys::FaSelftestGemmParams {
        a: a.as_ptr().cast(),
        b: b.as_ptr().cast(),
        c: c.as_mut_ptr(),
        m: to_i32("m", m)?,
        n: to_i32("n", n)?,
        k: to_i32("k", k)?,
        dtype: T::DTYPE.abi(),
        b_k_major: b_k_major as i32,
        bug: match bug {
            GemmBug::None => sys::FA_SELFTEST_GEMM_CORRECT,
            GemmBug::NoTrailingBarrier => sys::FA_SELFTEST_GEMM_NO_TRAILING_BARRIER,
            GemmBug::NoWait => sys::FA_SELFTEST_GEMM_NO_WAIT,
        } as i32,
    };
    // SAFETY: every pointer in `params` is one of `regions`' live buffers.
    run("selftest_gemm", &regions, seed, |s| unsafe { sys::fa_selftest_gemm(params, s) })?;
    Ok(c)
}

/// Operations the microbenchmark repeats (see `FA_SELFTEST_BENCH_*` in abi.h).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BenchOp {
    Shfl,
    Ldmatrix,
    Mma,
    SyncThreads,
    SharedStoreLoad,
}

/// `blocks` blocks of 4 warps, each warp executing `iters` of `op`.
pub fn bench(op: BenchOp, iters: usize, blocks: usize, seed: u64) -> Result<()> {
    let mut out = vec![0u32; blocks * BLOCK_THREADS];
    let regions = [region_mut(c"out", &mut out)];
    let params = sys::FaSelftestBenchParams {
        out: out.as_mut_ptr(),
        op: match op {
            BenchOp::Shfl => sys::FA_SELFTEST_BENCH_SHFL,
            BenchOp::Ldmatrix => sys::FA_SELFTEST_BENCH_LDMATRIX,
            BenchOp::Mma => sys::FA_SELFTEST_BENCH_MMA,
            BenchOp::SyncThreads => sys::FA_SELFTEST_BENCH_SYNCTHREADS,
            BenchOp::SharedStoreLoad => sys::FA_SELFTEST_BENCH_SHARED_STORE_LOAD,
        } as i32,
        iters: to_i32("iters", iters)?,
        blocks: to_i32("blocks", blocks)?,
    };
    // SAFETY: every pointer in `params` is one of `regions`' live buffers.
    run("selftest_bench", &regions, seed, |s| unsafe { sys::fa_selftest_bench(params, s) })
}

/// Runs a self-test launcher (`sys::fa_selftest_*`) on a GPU stream, through the same record-and-enqueue
/// path as the ops (tests/it/gpu_vs_emulator.rs compares its results with the emulator's).
///
/// # Safety
/// `params` must hold device addresses of live allocations of `stream`'s context, of the sizes the
/// launcher's contract (abi.h) requires.
pub unsafe fn launch_gpu<P>(
    stream: &std::sync::Arc<cudarc::driver::CudaStream>,
    kernel: &str,
    params: P,
    launcher: unsafe extern "C" fn(P, *mut sys::FaExec) -> i32,
) -> Result<()> {
    crate::launch::Launch::new(crate::device::Stream::Gpu(stream)).run(kernel, params, launcher)
}

/// The host build's fp32 -> 16-bit conversion (the emulator's and the launchers' only one) of `values`.
pub fn float_to_16(dtype: DType, values: &[f32]) -> Vec<u16> {
    let mut out = vec![0u16; values.len()];
    // SAFETY: both buffers hold values.len() elements.
    unsafe { sys::fa_host_float_to_16(values.as_ptr(), out.as_mut_ptr(), values.len() as i64, dtype_code(dtype)) };
    out
}

/// The host build's 16-bit -> fp32 conversion of `bits`.
pub fn float_from_16(dtype: DType, bits: &[u16]) -> Vec<f32> {
    let mut out = vec![0f32; bits.len()];
    // SAFETY: both buffers hold bits.len() elements.
    unsafe { sys::fa_host_16_to_float(bits.as_ptr(), out.as_mut_ptr(), bits.len() as i64, dtype_code(dtype)) };
    out
}

fn dtype_code(dtype: DType) -> i32 {
    match dtype {
        DType::F16 => sys::FA_DTYPE_F16 as i32,
        DType::Bf16 => sys::FA_DTYPE_BF16 as i32,
    }
}

// ------------------------------------------------------------------------------------------ sm_90 (Hopper)
// Wrappers over kernels/selftest_sm90.cu (tests/it/hopper.rs); abi.h documents each kernel.

use crate::tensor_map::{TensorMapSpec, TmaSwizzle};

/// One wgmma self-test: the shared-memory images of A and B (laid out by the caller's model of the
/// canonical layouts), descriptors with start address 0, and the accumulator's initial fragments.
#[derive(Debug, Clone)]
pub struct WgmmaCase<'a> {
    pub dtype: DType,
    /// 16, 64, 128, 176 or 256.
    pub n: usize,
    pub a_smem: &'a [u8],
    pub b_smem: &'a [u8],
    /// RS: A fragments, `[k_steps][128][4]` registers; `None`: A from shared memory.
    pub a_regs: Option<&'a [u32]>,
    /// `[128][n/2]`: thread t's accumulator registers.
    pub c: &'a [f32],
    pub desc_a: u64,
    pub desc_b: u64,
    pub a_k_step_bytes: u32,
    pub b_k_step_bytes: u32,
    pub k_steps: usize,
    pub trans_a: bool,
    pub trans_b: bool,
    pub accumulate: bool,
}

impl WgmmaCase<'_> {
    /// The params for buffers at the case's host addresses (`d` receives the result).
    pub fn params(&self, d: *mut f32) -> Result<sys::FaSelftestWgmmaParams> {
        Ok(sys::FaSelftestWgmmaParams {
            a_smem: self.a_smem.as_ptr(),
            b_smem: self.b_smem.as_ptr(),
            a_regs: self.a_regs.map_or(std::ptr::null(), |r| r.as_ptr()),
            c: self.c.as_ptr(),
            d,
            desc_a: self.desc_a,
            desc_b: self.desc_b,
            a_k_step_bytes: self.a_k_step_bytes,
            b_k_step_bytes: self.b_k_step_bytes,
            a_smem_bytes: to_i32("a_smem", self.a_smem.len())?,
            b_smem_bytes: to_i32("b_smem", self.b_smem.len())?,
            n: to_i32("n", self.n)?,
            k_steps: to_i32("k_steps", self.k_steps)?,
            dtype: self.dtype.abi(),
            a_from_regs: self.a_regs.is_some() as i32,
            trans_a: self.trans_a as i32,
            trans_b: self.trans_b as i32,
            accumulate: self.accumulate as i32,
        })
    }
}

/// Runs a wgmma case on the emulator; returns D as `[128][n/2]` fragment registers.
pub fn wgmma(case: &WgmmaCase, seed: u64) -> Result<Vec<f32>> {
    let mut d = vec![f32::NAN; 128 * case.n / 2];
    let empty = [0u32; 0];
    let regions = [
        region(c"a_smem", case.a_smem),
        region(c"b_smem", case.b_smem),
        region(c"a_regs", case.a_regs.unwrap_or(&empty)),
        region(c"c", case.c),
        region_mut(c"d", &mut d),
    ];
    let params = case.params(d.as_mut_ptr())?;
    // SAFETY: every pointer in `params` is one of `regions`' live buffers (a_regs null or listed).
    run("selftest_wgmma", &regions, seed, |s| unsafe { sys::fa_selftest_wgmma(params, s) })?;
    Ok(d)
}

/// A TMA load of the box at `coords` from `tensor` (described by `spec`), declaring `expect_tx` bytes on
/// its mbarrier; returns the box's shared-memory image.
pub fn tma_load(spec: &TensorMapSpec, tensor: &[u8], coords: &[i32], expect_tx: u32, seed: u64) -> Result<Vec<u8>> {
    let map = spec.encode_emulator(tensor.as_ptr().cast())?;
    let mut image = vec![0xA5u8; spec.box_bytes() as usize];
    let regions = [region(c"tensor", tensor), region_mut(c"image", &mut image)];
    let params = tma_params(map, image.as_mut_ptr(), coords, spec, expect_tx, sys::FA_SELFTEST_TMA_LOAD)?;
    // SAFETY: the map's base and `image` are `regions`' live buffers.
    run("selftest_tma", &regions, seed, |s| unsafe { sys::fa_selftest_tma(params, s) })?;
    Ok(image)
}

/// A TMA store of `image` (a box's shared-memory image) to the box at `coords` of `tensor`.
pub fn tma_store(spec: &TensorMapSpec, tensor: &mut [u8], coords: &[i32], image: &[u8], seed: u64) -> Result<()> {
    let map = spec.encode_emulator(tensor.as_ptr().cast())?;
    let mut staged = image.to_vec();
    let regions = [region_mut(c"tensor", tensor), region(c"image", &staged)];
    let params = tma_params(map, staged.as_mut_ptr(), coords, spec, 0, sys::FA_SELFTEST_TMA_STORE)?;
    // SAFETY: the map's base and `staged` are `regions`' live buffers.
    run("selftest_tma", &regions, seed, |s| unsafe { sys::fa_selftest_tma(params, s) })
}

/// The params of a TMA self-test launch (`image` a host or device address).
pub fn tma_params(
    map: sys::FaTensorMap,
    image: *mut u8,
    coords: &[i32],
    spec: &TensorMapSpec,
    expect_tx: u32,
    mode: u32,
) -> Result<sys::FaSelftestTmaParams> {
    if coords.len() != spec.dims.len() {
        return Err(Error::shape("coords", format!("{} coordinates for a rank-{} map", coords.len(), spec.dims.len())));
    }
    let mut c = [0i32; 5];
    c[..coords.len()].copy_from_slice(coords);
    Ok(sys::FaSelftestTmaParams {
        map,
        image,
        coords: c,
        rank: coords.len() as i32,
        box_bytes: to_i32("box bytes", spec.box_bytes() as usize)?,
        expect_tx: to_i32("expect_tx", expect_tx as usize)?,
        mode: mode as i32,
    })
}

/// The planted Hopper bugs (see `FA_SM90_BUG_*` in abi.h), in ABI order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sm90Bug {
    AccReadInFlight,
    AWriteInFlight,
    SmemWriteInFlight,
    NoWgmmaFence,
    UncommittedAtExit,
    UnwaitedAtExit,
    MbarrierDoubleInit,
    MbarrierUnorderedInit,
    MbarrierPlainAccess,
    ExpectTxTooFew,
    ExpectTxTooMany,
    WaiterBehind,
    TmaReadBeforeWait,
    TmaIntoBusyStage,
    ExitWithTmaInFlight,
    MissingProxyFence,
    TmaStoreNoFence,
    TmaStoreSrcOverwrite,
    SetmaxnregExhausted,
    SetmaxnregMisuse,
    SmemAlignmentAssumed,
    BarArriveOrder,
    MbarrierInitNoFence,
    WaitGroupNotABarrier,
}

impl Sm90Bug {
    pub const ALL: [Sm90Bug; 24] = [
        Sm90Bug::AccReadInFlight,
        Sm90Bug::AWriteInFlight,
        Sm90Bug::SmemWriteInFlight,
        Sm90Bug::NoWgmmaFence,
        Sm90Bug::UncommittedAtExit,
        Sm90Bug::UnwaitedAtExit,
        Sm90Bug::MbarrierDoubleInit,
        Sm90Bug::MbarrierUnorderedInit,
        Sm90Bug::MbarrierPlainAccess,
        Sm90Bug::ExpectTxTooFew,
        Sm90Bug::ExpectTxTooMany,
        Sm90Bug::WaiterBehind,
        Sm90Bug::TmaReadBeforeWait,
        Sm90Bug::TmaIntoBusyStage,
        Sm90Bug::ExitWithTmaInFlight,
        Sm90Bug::MissingProxyFence,
        Sm90Bug::TmaStoreNoFence,
        Sm90Bug::TmaStoreSrcOverwrite,
        Sm90Bug::SetmaxnregExhausted,
        Sm90Bug::SetmaxnregMisuse,
        Sm90Bug::SmemAlignmentAssumed,
        Sm90Bug::BarArriveOrder,
        Sm90Bug::MbarrierInitNoFence,
        Sm90Bug::WaitGroupNotABarrier,
    ];
    /// The `FA_SM90_BUG_*` value.
    pub fn abi(self) -> i32 {
        self as i32
    }
}

/// Elements of the Hopper bug kernels' f16 input tile (64 x 64) and output floats.
pub const SM90_BUG_INPUT: usize = 64 * 64;
pub const SM90_BUG_OUT: usize = 384 * 64;

/// The tensor map of the bug kernels' input: 64 x 64 16-bit elements, one 128B-swizzled box.
pub fn sm90_bug_map_spec() -> TensorMapSpec {
    TensorMapSpec {
        elem_bytes: 2,
        dims: vec![64, 64],
        strides: vec![128],
        box_dims: vec![64, 64],
        swizzle: TmaSwizzle::B128,
    }
}

/// Runs a Hopper planted-bug kernel (`planted == false`: its correct twin) over `input` (the TMA-store
/// bugs write a tile back into it). Returns the output floats (NaN where nothing was written).
pub fn sm90_bug(bug: Sm90Bug, planted: bool, input: &mut [u16], seed: u64) -> Result<Vec<f32>> {
    if input.len() != SM90_BUG_INPUT {
        return Err(Error::shape("input", format!("the Hopper bug kernels take {SM90_BUG_INPUT} 16-bit elements")));
    }
    let map = sm90_bug_map_spec().encode_emulator(input.as_ptr().cast())?;
    let mut out = vec![f32::NAN; SM90_BUG_OUT];
    let params = sys::FaSelftestSm90BugParams {
        map,
        input: input.as_ptr(),
        out: out.as_mut_ptr(),
        bug: bug.abi(),
        planted: planted as i32,
    };
    let regions = [region_mut(c"input", input), region_mut(c"out", &mut out)];
    // SAFETY: `input` (the map's base) and `out` are `regions`' live buffers.
    run("selftest_sm90_bug", &regions, seed, |s| unsafe { sys::fa_selftest_sm90_bug(params, s) })?;
    Ok(out)
}

/// Pipeline bugs the warp-specialised GEMM can plant (see `FA_SELFTEST_WS_GEMM_*` in abi.h).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WsGemmBug {
    None,
    NoEmptyWait,
    EarlyRelease,
    ShortTx,
}

/// Tensor maps of the warp-specialised GEMM: A `[m][k]` in boxes of 128 rows x 64 k; B `[n][k]` in boxes of
/// 128 rows x 64 k, or (MN-major) B `[k][n]` in boxes of 64 k rows x 64 n.
pub fn ws_gemm_map_specs(m: usize, n: usize, k: usize, b_mn_major: bool) -> (TensorMapSpec, TensorMapSpec) {
    let two = |rows: usize, cols: usize, box_cols: u32, box_rows: u32| TensorMapSpec {
        elem_bytes: 2,
        dims: vec![cols as u64, rows as u64],
        strides: vec![2 * cols as u64],
        box_dims: vec![box_cols, box_rows],
        swizzle: TmaSwizzle::B128,
    };
    let a = two(m, k, 64, 128);
    let b = if b_mn_major { two(k, n, 64, 64) } else { two(n, k, 64, 128) };
    (a, b)
}

/// The params of a warp-specialised GEMM launch (maps already encoded for the backend).
pub fn ws_gemm_params(
    a_map: sys::FaTensorMap,
    b_map: sys::FaTensorMap,
    c: *mut f32,
    (m, n, k): (usize, usize, usize),
    dtype: DType,
    b_mn_major: bool,
    bug: WsGemmBug,
) -> Result<sys::FaSelftestWsGemmParams> {
    Ok(sys::FaSelftestWsGemmParams {
        a_map,
        b_map,
        c,
        m: to_i32("m", m)?,
        n: to_i32("n", n)?,
        k: to_i32("k", k)?,
        dtype: dtype.abi(),
        b_mn_major: b_mn_major as i32,
        bug: match bug {
            WsGemmBug::None => sys::FA_SELFTEST_WS_GEMM_CORRECT,
            WsGemmBug::NoEmptyWait => sys::FA_SELFTEST_WS_GEMM_NO_EMPTY_WAIT,
            WsGemmBug::EarlyRelease => sys::FA_SELFTEST_WS_GEMM_EARLY_RELEASE,
            WsGemmBug::ShortTx => sys::FA_SELFTEST_WS_GEMM_SHORT_TX,
        } as i32,
    })
}

/// The warp-specialised TMA + mbarrier + wgmma GEMM on the emulator: c = a · bᵀ (a `[m][k]`, b `[n][k]`) or,
/// with `b_mn_major`, c = a · b (b `[k][n]`); fp32 c `[m][n]`.
pub fn ws_gemm<T: Element>(
    a: &[T],
    b: &[T],
    (m, n, k): (usize, usize, usize),
    b_mn_major: bool,
    bug: WsGemmBug,
    seed: u64,
) -> Result<Vec<f32>> {
    if a.len() != m * k || b.len() != n * k {
        return Err(Error::shape("a/b", format!("expected {m}x{k} and {n}x{k} elements")));
    }
    let (sa, sb) = ws_gemm_map_specs(m, n, k, b_mn_major);
    let (a_map, b_map) = (sa.encode_emulator(a.as_ptr().cast())?, sb.encode_emulator(b.as_ptr().cast())?);
    let mut c = vec![f32::NAN; m * n];
    let params = ws_gemm_params(a_map, b_map, c.as_mut_ptr(), (m, n, k), T::DTYPE, b_mn_major, bug)?;
    let regions = [region(c"a", a), region(c"b", b), region_mut(c"c", &mut c)];
    // SAFETY: the maps' bases and `c` are `regions`' live buffers.
    run("selftest_ws_gemm", &regions, seed, |s| unsafe { sys::fa_selftest_ws_gemm(params, s) })?;
    Ok(c)
}

/// The host build's FP8 scalar model (kernels/include/fa/fp8_model.cuh): codes -> fp16 bits.
pub fn fp8_to_half_host(format: crate::fp8::Fp8Format, codes: &[u8]) -> Vec<u16> {
    let mut out = vec![0u16; codes.len()];
    // SAFETY: both buffers hold codes.len() elements.
    unsafe { sys::fa_host_fp8_to_half(codes.as_ptr(), out.as_mut_ptr(), codes.len() as i64, format.abi()) };
    out
}

/// The decode kernels' in-register FP8 conversion (fa/fp8_convert.cuh) as the host build runs it: codes
/// (a multiple of 4) -> fp16 or bf16 bits.
pub fn fp8_to_16_fast_host(format: crate::fp8::Fp8Format, dtype: DType, codes: &[u8]) -> Vec<u16> {
    assert!(codes.len() % 4 == 0, "whole groups of four codes");
    let mut out = vec![0u16; codes.len()];
    // SAFETY: both buffers hold codes.len() elements.
    unsafe {
        sys::fa_host_fp8_to_16_fast(codes.as_ptr(), out.as_mut_ptr(), codes.len() as i64, format.abi(), dtype.abi())
    };
    out
}

/// The host build's FP8 scalar model: fp32 -> codes (round to nearest even, satfinite).
pub fn float_to_fp8_host(format: crate::fp8::Fp8Format, values: &[f32]) -> Vec<u8> {
    let mut out = vec![0u8; values.len()];
    // SAFETY: both buffers hold values.len() elements.
    unsafe { sys::fa_host_float_to_fp8(values.as_ptr(), out.as_mut_ptr(), values.len() as i64, format.abi()) };
    out
}

/// The FP8 self-test kernel's parameters (abi.h FaSelftestFp8Params) over the given buffers: decode when
/// `values` is empty (`codes` -> `halves`), else encode (`values` pairs -> `codes_out`).
pub fn fp8_params(
    format: crate::fp8::Fp8Format,
    codes: *const u16,
    values: *const f32,
    halves: *mut u32,
    codes_out: *mut u16,
    n: usize,
    encode: bool,
) -> Result<sys::FaSelftestFp8Params> {
    Ok(sys::FaSelftestFp8Params {
        codes,
        values,
        halves,
        codes_out,
        n: to_i32("n", n)?,
        kv_dtype: format.abi(),
        encode: i32::from(encode),
    })
}

/// FP8 -> fp16 through the intrinsics layer on the emulator, one code pair (low byte first) per item:
/// returns the packed fp16 pairs.
pub fn fp8_decode_emulated(format: crate::fp8::Fp8Format, pairs: &[u16], seed: u64) -> Result<Vec<u32>> {
    let mut halves = vec![0u32; pairs.len()];
    let regions = [region(c"codes", pairs), region_mut(c"halves", &mut halves)];
    let params = fp8_params(
        format,
        pairs.as_ptr(),
        std::ptr::null(),
        halves.as_mut_ptr(),
        std::ptr::null_mut(),
        pairs.len(),
        false,
    )?;
    // SAFETY: every pointer in `params` is one of `regions`' live buffers (or unused and NULL).
    run("selftest_fp8", &regions, seed, |s| unsafe { sys::fa_selftest_fp8(params, s) })?;
    Ok(halves)
}

/// fp32 pairs -> FP8 code pairs through the intrinsics layer on the emulator (`values.len()` even).
pub fn fp8_encode_emulated(format: crate::fp8::Fp8Format, values: &[f32], seed: u64) -> Result<Vec<u16>> {
    let n = values.len() / 2;
    let mut codes = vec![0u16; n];
    let regions = [region(c"values", values), region_mut(c"codes_out", &mut codes)];
    let params =
        fp8_params(format, std::ptr::null(), values.as_ptr(), std::ptr::null_mut(), codes.as_mut_ptr(), n, true)?;
    // SAFETY: as above.
    run("selftest_fp8", &regions, seed, |s| unsafe { sys::fa_selftest_fp8(params, s) })?;
    Ok(codes)
}
