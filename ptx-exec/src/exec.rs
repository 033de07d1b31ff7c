//! Runs a decoded kernel over a grid. CTAs run one after another; in a CTA each warp runs its 32 lanes in
//! lockstep under an active mask until it waits at a barrier or exits, then the next warp runs. Divergence
//! uses a reconvergence stack (Fung et al.'s SIMT stack, as GPUs before Volta did and as the PTX semantics
//! of our structured code allow): a branch whose lanes disagree pushes both paths with the branch's
//! immediate post-dominator as their reconvergence point, and the warp continues there once both are done.
//! Independent thread scheduling could interleave the two paths differently; for code whose paths do not
//! communicate (no shared-memory handshakes inside a divergent region, which our kernels do not have)
//! the result is the same.

use std::collections::{HashMap, VecDeque};

use crate::decode::*;
use crate::num::{self, Rnd};

/// Generic addresses of the shared and local windows (`cvta`): far above any host address (user space
/// ends at 2^47 on x86-64 and AArch64), so a generic access is classified by its value.
pub const SHARED_WINDOW: u64 = 1 << 60;
pub const LOCAL_WINDOW: u64 = 2 << 60;

/// A launch: what FaKernelLaunch records.
#[derive(Clone, Debug)]
pub struct Launch<'p> {
    pub grid: [u32; 3],
    pub block: u32,
    pub dynamic_shared: u32,
    pub params: &'p [u8],
}

enum Data<'a> {
    Ro(&'a [u8]),
    Rw(&'a mut [u8]),
}

struct Buffer<'a> {
    name: String,
    base: u64,
    data: Data<'a>,
}

/// Global memory: the host buffers a launch registered, addressed by their host addresses (the params
/// carry them). Every access must lie inside one buffer; stores only to writable ones.
#[derive(Default)]
pub struct Global<'a> {
    bufs: Vec<Buffer<'a>>,
}

impl<'a> Global<'a> {
    pub fn new() -> Self {
        Self::default()
    }
    /// A buffer the kernel may read.
    pub fn input(&mut self, name: &str, data: &'a [u8]) -> &mut Self {
        self.bufs.push(Buffer { name: name.into(), base: data.as_ptr() as u64, data: Data::Ro(data) });
        self
    }
    /// A buffer the kernel may read and write.
    pub fn output(&mut self, name: &str, data: &'a mut [u8]) -> &mut Self {
        self.bufs.push(Buffer { name: name.into(), base: data.as_ptr() as u64, data: Data::Rw(data) });
        self
    }
    fn find(&self, addr: u64, size: u64) -> Option<usize> {
        self.bufs.iter().position(|b| {
            let len = match &b.data {
                Data::Ro(d) => d.len(),
                Data::Rw(d) => d.len(),
            } as u64;
            addr >= b.base && addr.checked_add(size).is_some_and(|e| e <= b.base + len)
        })
    }
    fn describe(&self, addr: u64) -> String {
        let mut best: Option<(u64, String)> = None;
        for b in &self.bufs {
            let len = match &b.data {
                Data::Ro(d) => d.len(),
                Data::Rw(d) => d.len(),
            } as u64;
            let dist = if addr < b.base { b.base - addr } else { addr.saturating_sub(b.base + len) };
            let text = if addr < b.base {
                format!("{} bytes before {} ({len} bytes)", b.base - addr, b.name)
            } else if addr >= b.base + len {
                format!(
                    "{}+{}: {} bytes past the end of {} ({len} bytes)",
                    b.name,
                    addr - b.base,
                    addr - b.base - len,
                    b.name
                )
            } else {
                format!("{}+{} ({len} bytes)", b.name, addr - b.base)
            };
            if best.as_ref().is_none_or(|(d, _)| dist < *d) {
                best = Some((dist, text));
            }
        }
        best.map_or("no buffer registered".into(), |b| b.1)
    }
    fn read(&self, addr: u64, out: &mut [u8]) -> Result<(), String> {
        let i = self.find(addr, out.len() as u64).ok_or_else(|| {
            format!("out-of-bounds global load of {} bytes at {addr:#x} ({})", out.len(), self.describe(addr))
        })?;
        let b = &self.bufs[i];
        let off = (addr - b.base) as usize;
        let d: &[u8] = match &b.data {
            Data::Ro(d) => d,
            Data::Rw(d) => d,
        };
        out.copy_from_slice(&d[off..off + out.len()]);
        Ok(())
    }
    fn write(&mut self, addr: u64, v: &[u8]) -> Result<(), String> {
        let i = self.find(addr, v.len() as u64).ok_or_else(|| {
            format!("out-of-bounds global store of {} bytes at {addr:#x} ({})", v.len(), self.describe(addr))
        })?;
        let b = &mut self.bufs[i];
        let off = (addr - b.base) as usize;
        match &mut b.data {
            Data::Ro(_) => {
                Err(format!("global store of {} bytes to read-only buffer {} at {addr:#x}", v.len(), b.name))
            }
            Data::Rw(d) => {
                d[off..off + v.len()].copy_from_slice(v);
                Ok(())
            }
        }
    }
}

/// The approximate instructions' model: one function per instruction, supplied by the caller so that the
/// executor and the emulator share one (docs/ptx-executor.md).
#[derive(Clone, Copy)]
pub struct Approx {
    /// ex2.approx.ftz.f32 (the result for a normal or zero input; the executor flushes subnormals).
    pub ex2_ftz: fn(f32) -> f32,
}

/// A fault: the ISA's undefined behaviour or an access outside what the launch allows.
#[derive(Debug, Clone)]
pub struct ExecError {
    pub kernel: String,
    pub block: [u32; 3],
    pub thread: Option<u32>,
    pub ptx_line: u32,
    /// The `.loc` source position ("kernels/include/fa/intrinsics.cuh:188"), if the PTX has line info.
    pub source: Option<String>,
    pub what: String,
}

impl std::fmt::Display for ExecError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let [x, y, z] = self.block;
        write!(f, "kernel {} block ({x},{y},{z})", self.kernel)?;
        if let Some(t) = self.thread {
            write!(f, " thread {t}")?;
        }
        write!(f, ": {} (PTX line {}", self.what, self.ptx_line)?;
        if let Some(s) = &self.source {
            write!(f, "; source {s}")?;
        }
        write!(f, ")")
    }
}

impl std::error::Error for ExecError {}

/// What a run did.
#[derive(Debug, Default, Clone)]
pub struct Stats {
    /// Warp instructions executed (one per warp per instruction, whatever its active lanes).
    pub warp_instructions: u64,
    pub ctas: u64,
    /// Per instruction of the kernel: whether a warp reached it with any lane live (its guard predicate
    /// evaluated, true or not): the launch's coverage of the PTX.
    pub reached: Vec<bool>,
}

#[derive(Clone, Copy)]
struct Entry {
    pc: u32,
    mask: u32,
    rpc: u32,
}

struct CpCopy {
    dst: u64,
    bytes: Vec<u8>,
}

#[derive(Default)]
struct ThreadCp {
    pending: Vec<CpCopy>,
    groups: VecDeque<Vec<CpCopy>>,
}

#[derive(PartialEq, Eq, Clone, Copy)]
enum WarpState {
    Ready,
    Waiting(u32),
    Done,
}

struct Warp {
    index: u32,
    /// Lanes that exist (the last warp of a block that is not a multiple of 32 has fewer).
    valid: u32,
    exited: u32,
    regs: Vec<u64>,
    init: Vec<u32>,
    stack: Vec<Entry>,
    state: WarpState,
    local: Vec<u8>,
    cp: Vec<ThreadCp>,
}

struct Barrier {
    expected: u32,
    arrived: u32,
    waiting: Vec<usize>,
    /// The join of the arriving warps' vector clocks (what the barrier orders before its completion).
    join: Vec<u32>,
}

struct Cta<'a, 'g> {
    k: &'a Kernel,
    launch: &'a Launch<'a>,
    global: &'a mut Global<'g>,
    approx: Approx,
    ctaid: [u32; 3],
    shared: Vec<u8>,
    /// Per shared byte: how many cp.async copies to it are in flight.
    inflight: Vec<u16>,
    barriers: HashMap<u32, Barrier>,
    /// Race detection (happens-before from barriers only, FastTrack-style, per 2-byte granule of shared
    /// memory): each warp's vector clock, each granule's last write (warp, epoch) and each warp's last read
    /// epoch of it.
    clocks: Vec<Vec<u32>>,
    last_write: Vec<(u16, u32)>,
    last_read: Vec<u32>,
    stats: Stats,
}

type R<T> = Result<T, (Option<u32>, String)>;

fn lane_err<T>(lane: u32, what: String) -> R<T> {
    Err((Some(lane), what))
}

fn sx(v: u64, bits: u32) -> i64 {
    if bits >= 64 {
        v as i64
    } else {
        ((v << (64 - bits)) as i64) >> (64 - bits)
    }
}

fn mask_bits(v: u64, bits: u32) -> u64 {
    if bits >= 64 {
        v
    } else {
        v & ((1u64 << bits) - 1)
    }
}

fn f32_of(v: u64) -> f32 {
    f32::from_bits(v as u32)
}

fn bits_of(f: f32) -> u64 {
    f.to_bits() as u64
}

fn sat01(x: f32) -> f32 {
    if x.is_nan() {
        0.0
    } else {
        x.clamp(0.0, 1.0)
    }
}

/// Runs `kernel` over the launch's grid.
pub fn run(kernel: &Kernel, launch: &Launch, global: &mut Global, approx: Approx) -> Result<Stats, ExecError> {
    if launch.params.len() as u64 != kernel.param_bytes {
        return Err(ExecError {
            kernel: kernel.name.clone(),
            block: [0; 3],
            thread: None,
            ptx_line: 0,
            source: None,
            what: format!(
                "the launch passes {} parameter bytes, the kernel declares {}",
                launch.params.len(),
                kernel.param_bytes
            ),
        });
    }
    let mut stats = Stats { reached: vec![false; kernel.insts.len()], ..Default::default() };
    for z in 0..launch.grid[2] {
        for y in 0..launch.grid[1] {
            for x in 0..launch.grid[0] {
                let mut cta = Cta {
                    k: kernel,
                    launch,
                    global: &mut *global,
                    approx,
                    ctaid: [x, y, z],
                    // Poisoned (0xff: NaN in every float type): shared memory starts undefined.
                    shared: vec![0xff; (kernel.dynamic_shared_offset + launch.dynamic_shared as u64) as usize],
                    inflight: vec![0; (kernel.dynamic_shared_offset + launch.dynamic_shared as u64) as usize],
                    barriers: HashMap::new(),
                    clocks: Vec::new(),
                    last_write: Vec::new(),
                    last_read: Vec::new(),
                    stats: Stats { reached: std::mem::take(&mut stats.reached), ..Default::default() },
                };
                cta.run()?;
                stats.warp_instructions += cta.stats.warp_instructions;
                stats.reached = std::mem::take(&mut cta.stats.reached);
                stats.ctas += 1;
            }
        }
    }
    Ok(stats)
}

impl Cta<'_, '_> {
    fn error(&self, warp: u32, lane: Option<u32>, pc: u32, what: String) -> ExecError {
        let ins = self.k.insts.get(pc as usize);
        ExecError {
            kernel: self.k.name.clone(),
            block: self.ctaid,
            thread: lane.map(|l| warp * 32 + l),
            ptx_line: ins.map_or(0, |i| i.line),
            source: ins.and_then(|i| self.k.source_of(i.loc)),
            what,
        }
    }

    fn run(&mut self) -> Result<(), ExecError> {
        let threads = self.launch.block;
        let nwarps = threads.div_ceil(32);
        let nregs = self.k.regs.len();
        let n = nwarps as usize;
        self.clocks = (0..n).map(|w| (0..n).map(|x| (x == w) as u32).collect()).collect();
        let granules = self.shared.len().div_ceil(2);
        self.last_write = vec![(0, 0); granules];
        self.last_read = vec![0; granules * n];
        let mut warps: Vec<Warp> = (0..nwarps)
            .map(|w| {
                let lanes = (threads - w * 32).min(32);
                let valid = if lanes == 32 { u32::MAX } else { (1u32 << lanes) - 1 };
                Warp {
                    index: w,
                    valid,
                    exited: 0,
                    regs: vec![0; nregs * 32],
                    init: vec![0; nregs],
                    stack: vec![Entry { pc: 0, mask: valid, rpc: EXIT }],
                    state: WarpState::Ready,
                    local: vec![0xff; self.k.local_bytes as usize * 32],
                    cp: (0..32).map(|_| ThreadCp::default()).collect(),
                }
            })
            .collect();
        loop {
            let mut progressed = false;
            for wi in 0..warps.len() {
                if warps[wi].state != WarpState::Ready {
                    continue;
                }
                progressed = true;
                self.run_warp(&mut warps, wi)?;
            }
            if warps.iter().all(|w| w.state == WarpState::Done) {
                return Ok(());
            }
            if !progressed {
                let waiting: Vec<String> = warps
                    .iter()
                    .filter_map(|w| match w.state {
                        WarpState::Waiting(id) => {
                            let b = &self.barriers[&id];
                            Some(format!(
                                "warp {} waits at barrier {id} ({} of {} threads arrived)",
                                w.index, b.arrived, b.expected
                            ))
                        }
                        _ => None,
                    })
                    .collect();
                let done: Vec<String> =
                    warps.iter().filter(|w| w.state == WarpState::Done).map(|w| w.index.to_string()).collect();
                return Err(self.error(
                    0,
                    None,
                    0,
                    format!("deadlock: {}; warps exited: [{}]", waiting.join(", "), done.join(", ")),
                ));
            }
        }
    }

    /// Runs warp `wi` until it waits at a barrier or exits.
    fn run_warp(&mut self, warps: &mut [Warp], wi: usize) -> Result<(), ExecError> {
        // A warp that runs this long without reaching a barrier or exiting spins on memory no other warp can
        // change while it runs (warps switch only at barriers here): reported rather than hung.
        let mut budget: u64 = 1 << 26;
        loop {
            budget -= 1;
            if budget == 0 {
                let pc = warps[wi].stack.last().map_or(0, |e| e.pc);
                return Err(self.error(
                    warps[wi].index,
                    None,
                    pc,
                    "2^26 instructions without reaching a barrier or exiting: a spin-wait on memory another warp or CTA writes?".into(),
                ));
            }
            let w = &mut warps[wi];
            let Some(top) = w.stack.last().copied() else {
                self.finish_warp(w).map_err(|(l, e)| self.error(w.index, l, 0, e))?;
                w.state = WarpState::Done;
                return Ok(());
            };
            let live = top.mask & !w.exited;
            if live == 0 || top.pc == top.rpc {
                w.stack.pop();
                if let Some(below) = w.stack.last_mut() {
                    below.mask &= !w.exited;
                }
                continue;
            }
            if top.pc as usize >= self.k.insts.len() {
                return Err(self.error(w.index, None, top.pc, "ran past the end of the kernel".into()));
            }
            self.stats.warp_instructions += 1;
            let pc = top.pc;
            match self.step(w, pc, live) {
                Ok(Some((id, waits))) => {
                    // Arrived at barrier `id` (bar.sync: blocked until it completes; bar.arrive: goes on).
                    let complete = self.barriers.get(&id).is_some_and(|b| b.arrived >= b.expected);
                    if waits {
                        self.barriers.get_mut(&id).unwrap().waiting.push(wi);
                    }
                    if complete {
                        let b = self.barriers.remove(&id).unwrap();
                        for &x in &b.waiting {
                            warps[x].state = WarpState::Ready;
                            let c = &mut self.clocks[x];
                            for (a, j) in c.iter_mut().zip(&b.join) {
                                *a = (*a).max(*j);
                            }
                            c[x] += 1;
                        }
                    } else if waits {
                        warps[wi].state = WarpState::Waiting(id);
                        return Ok(());
                    }
                }
                Ok(None) => {}
                Err((lane, what)) => return Err(self.error(warps[wi].index, lane, pc, what)),
            }
        }
    }

    /// Completes a finished warp's outstanding cp.async copies (they land at thread exit at the latest).
    fn finish_warp(&mut self, w: &mut Warp) -> R<()> {
        for lane in 0..32 {
            let cp = std::mem::take(&mut w.cp[lane]);
            for c in cp.groups.into_iter().flatten().chain(cp.pending) {
                self.land(w.index, c)?;
            }
        }
        Ok(())
    }

    fn land(&mut self, warp: u32, c: CpCopy) -> R<()> {
        let off = (c.dst) as usize;
        self.shared[off..off + c.bytes.len()].copy_from_slice(&c.bytes);
        for x in &mut self.inflight[off..off + c.bytes.len()] {
            *x -= 1;
        }
        self.track(warp, off, c.bytes.len(), true, "cp.async landing")
    }

    /// Race detection on a shared access by `warp` (all its lanes are ordered by program order): a write
    /// must follow every other warp's last write and reads of those bytes, a read every other warp's last
    /// write, in happens-before (barriers only).
    fn track(&mut self, warp: u32, off: usize, size: usize, write: bool, what: &str) -> R<()> {
        let n = self.clocks.len();
        let me = warp as usize;
        let now = self.clocks[me][me];
        for g in off / 2..(off + size).div_ceil(2) {
            let (ww, we) = self.last_write[g];
            if we != 0 && ww as usize != me && we > self.clocks[me][ww as usize] {
                return Err((
                    None,
                    format!(
                        "data race on shared memory at shared+{}: warp {me}'s {what} {} bytes that warp {ww} wrote, with no barrier ordering the two accesses",
                        2 * g,
                        if write { "writes" } else { "reads" }
                    ),
                ));
            }
            if write {
                for q in 0..n {
                    let re = self.last_read[g * n + q];
                    if q != me && re != 0 && re > self.clocks[me][q] {
                        return Err((
                            None,
                            format!(
                                "data race on shared memory at shared+{}: warp {me}'s {what} writes bytes that warp {q} read, with no barrier ordering the two accesses",
                                2 * g
                            ),
                        ));
                    }
                }
                self.last_write[g] = (me as u16, now);
            } else {
                self.last_read[g * n + me] = now;
            }
        }
        Ok(())
    }

    fn get(&self, w: &Warp, s: Src, lane: u32) -> R<u64> {
        match s {
            Src::Reg(r) | Src::NotReg(r) => {
                if w.init[r as usize] >> lane & 1 == 0 {
                    return lane_err(
                        lane,
                        format!("reads register {} before any write to it", self.k.regs[r as usize].name),
                    );
                }
                let v = w.regs[r as usize * 32 + lane as usize];
                Ok(if matches!(s, Src::NotReg(_)) { (v & 1) ^ 1 } else { v })
            }
            Src::Imm(v) => Ok(v),
            Src::Sreg(sr) => {
                let tid = w.index * 32 + lane;
                let dims = [self.launch.block, 1, 1];
                Ok(match sr {
                    Sreg::Tid(d) => [tid, 0, 0][d as usize] as u64,
                    Sreg::Ntid(d) => dims[d as usize] as u64,
                    Sreg::Ctaid(d) => self.ctaid[d as usize] as u64,
                    Sreg::Nctaid(d) => self.launch.grid[d as usize] as u64,
                    Sreg::Laneid => lane as u64,
                    Sreg::Warpid => w.index as u64,
                    Sreg::LanemaskLt => ((1u64 << lane) - 1) as u32 as u64,
                    Sreg::LanemaskLe => ((1u64 << (lane + 1)) - 1) as u32 as u64,
                    Sreg::LanemaskEq => 1u64 << lane,
                    Sreg::LanemaskGe => (!((1u64 << lane) - 1)) as u32 as u64,
                    Sreg::LanemaskGt => (!((1u64 << (lane + 1)) - 1)) as u32 as u64,
                })
            }
        }
    }

    fn set(&self, w: &mut Warp, r: u32, lane: u32, v: u64) {
        let bits = self.k.regs[r as usize].bits;
        w.regs[r as usize * 32 + lane as usize] = mask_bits(v, bits);
        w.init[r as usize] |= 1 << lane;
    }

    fn addr(&self, w: &Warp, a: Addr, lane: u32) -> R<u64> {
        let base = match a.base {
            Some(r) => self.get(w, Src::Reg(r), lane)?,
            None => 0,
        };
        Ok(base.wrapping_add(a.off as u64))
    }

    /// Resolves an address in `space` to (state space, offset or global address).
    fn resolve(&self, space: Space, addr: u64) -> (Space, u64) {
        match space {
            Space::Generic => {
                if (SHARED_WINDOW..SHARED_WINDOW + (1 << 32)).contains(&addr) {
                    (Space::Shared, addr - SHARED_WINDOW)
                } else if (LOCAL_WINDOW..LOCAL_WINDOW + (1 << 32)).contains(&addr) {
                    (Space::Local, addr - LOCAL_WINDOW)
                } else {
                    (Space::Global, addr)
                }
            }
            Space::Shared => (Space::Shared, addr & 0xffff_ffff),
            s => (s, addr),
        }
    }

    fn check_shared(&self, off: u64, size: u64, what: &str, lane: u32) -> R<usize> {
        let len = self.shared.len() as u64;
        if off.checked_add(size).is_none_or(|e| e > len) {
            return lane_err(
                lane,
                format!("out-of-bounds shared {what} of {size} bytes at shared+{off}: the block has {len} bytes of shared memory"),
            );
        }
        if off % size.min(16) != 0 {
            return lane_err(lane, format!("misaligned shared {what} of {size} bytes at shared+{off}"));
        }
        let o = off as usize;
        if self.inflight[o..o + size as usize].iter().any(|&c| c > 0) {
            return lane_err(
                lane,
                format!(
                    "shared {what} of {size} bytes at shared+{off} while a cp.async to those bytes is in flight (not completed by a cp.async.wait_group)"
                ),
            );
        }
        Ok(o)
    }

    fn load(&mut self, w: &Warp, space: Space, addr: u64, out: &mut [u8], lane: u32) -> R<()> {
        let size = out.len() as u64;
        let (sp, a) = self.resolve(space, addr);
        match sp {
            Space::Global | Space::Const => {
                if a % size != 0 {
                    return lane_err(lane, format!("misaligned global load of {size} bytes at {a:#x}"));
                }
                self.global.read(a, out).map_err(|e| (Some(lane), e))
            }
            Space::Shared => {
                let o = self.check_shared(a, size, "load", lane)?;
                self.track(w.index, o, size as usize, false, "load").map_err(|(_, e)| (Some(lane), e))?;
                out.copy_from_slice(&self.shared[o..o + size as usize]);
                Ok(())
            }
            Space::Param => {
                let p = self.launch.params;
                if a.checked_add(size).is_none_or(|e| e > p.len() as u64) {
                    return lane_err(
                        lane,
                        format!("parameter load of {size} bytes at param+{a}, past its {} bytes", p.len()),
                    );
                }
                out.copy_from_slice(&p[a as usize..(a + size) as usize]);
                Ok(())
            }
            Space::Local => {
                let lb = self.k.local_bytes;
                if a.checked_add(size).is_none_or(|e| e > lb) || a % size != 0 {
                    return lane_err(lane, format!("local load of {size} bytes at local+{a} (frame {lb} bytes)"));
                }
                let base = lane as usize * lb as usize + a as usize;
                out.copy_from_slice(&w.local[base..base + size as usize]);
                Ok(())
            }
            Space::Generic => unreachable!(),
        }
    }

    fn store(&mut self, w: &mut Warp, space: Space, addr: u64, v: &[u8], lane: u32) -> R<()> {
        let size = v.len() as u64;
        let (sp, a) = self.resolve(space, addr);
        match sp {
            Space::Global => {
                if a % size != 0 {
                    return lane_err(lane, format!("misaligned global store of {size} bytes at {a:#x}"));
                }
                self.global.write(a, v).map_err(|e| (Some(lane), e))
            }
            Space::Shared => {
                let o = self.check_shared(a, size, "store", lane)?;
                self.track(w.index, o, v.len(), true, "store").map_err(|(_, e)| (Some(lane), e))?;
                self.shared[o..o + v.len()].copy_from_slice(v);
                Ok(())
            }
            Space::Local => {
                let lb = self.k.local_bytes;
                if a.checked_add(size).is_none_or(|e| e > lb) || a % size != 0 {
                    return lane_err(lane, format!("local store of {size} bytes at local+{a} (frame {lb} bytes)"));
                }
                let base = lane as usize * lb as usize + a as usize;
                w.local[base..base + v.len()].copy_from_slice(v);
                Ok(())
            }
            s => lane_err(lane, format!("store to the {s:?} state space")),
        }
    }

    fn lanes(mask: u32) -> impl Iterator<Item = u32> {
        (0..32).filter(move |l| mask >> l & 1 == 1)
    }

    /// Requires the whole warp (every lane not exited) active: `.aligned` instructions and barriers.
    fn require_converged(&self, w: &Warp, active: u32, what: &str) -> R<()> {
        let all = w.valid & !w.exited;
        if active != all || w.exited != 0 {
            return Err((
                None,
                format!(
                    "divergent warp {}: {what} executed by lanes {active:#010x} of {all:#010x}{}",
                    w.index,
                    if w.exited != 0 { format!(" (lanes {:#010x} have exited)", w.exited) } else { String::new() }
                ),
            ));
        }
        Ok(())
    }

    /// Checks a `.sync` collective's member mask against the lanes executing it.
    fn check_membermask(&self, w: &Warp, mask: Src, active: u32, what: &str) -> R<u32> {
        let first = Self::lanes(active).next().unwrap_or(0);
        let m = self.get(w, mask, first)? as u32;
        for l in Self::lanes(active) {
            if self.get(w, mask, l)? as u32 != m {
                return lane_err(l, format!("{what}: lanes give different member masks"));
            }
        }
        if active & !m != 0 || m & !active != 0 {
            return Err((
                None,
                format!("{what} with member mask {m:#010x} executed by lanes {active:#010x} of warp {}", w.index),
            ));
        }
        Ok(m)
    }

    /// Executes the instruction at `pc` for the `live` lanes; returns a barrier id when the warp arrived at
    /// a blocking barrier. Advances the warp's pc (or its stack on a branch).
    fn step(&mut self, w: &mut Warp, pc: u32, live: u32) -> R<Option<(u32, bool)>> {
        let ins = &self.k.insts[pc as usize];
        self.stats.reached[pc as usize] = true;
        let mut active = live;
        if let Some(g) = ins.guard {
            let mut m = 0;
            for l in Self::lanes(live) {
                if self.get(w, g, l)? & 1 == 1 {
                    m |= 1 << l;
                }
            }
            active = m;
        }
        let advance = |w: &mut Warp| w.stack.last_mut().unwrap().pc = pc + 1;
        match &ins.op {
            Op::Bra { target } => {
                if active == live {
                    w.stack.last_mut().unwrap().pc = *target;
                } else if active == 0 {
                    advance(w);
                } else {
                    let rp = self.k.reconverge.get(&pc).copied().unwrap_or(EXIT);
                    w.stack.last_mut().unwrap().pc = rp;
                    w.stack.push(Entry { pc: pc + 1, mask: live & !active, rpc: rp });
                    w.stack.push(Entry { pc: *target, mask: active, rpc: rp });
                }
                return Ok(None);
            }
            Op::Exit => {
                for l in Self::lanes(active) {
                    let cp = std::mem::take(&mut w.cp[l as usize]);
                    for c in cp.groups.into_iter().flatten().chain(cp.pending) {
                        self.land(w.index, c)?;
                    }
                }
                w.exited |= active;
                for e in &mut w.stack {
                    e.mask &= !active;
                }
                advance(w);
                return Ok(None);
            }
            Op::Bar { id, count, arrive } => {
                if active == 0 {
                    advance(w);
                    return Ok(None);
                }
                self.require_converged(w, active, "bar.sync")?;
                let first = Self::lanes(active).next().unwrap();
                let id = self.get(w, *id, first)? as u32;
                let expected = match count {
                    Some(c) => self.get(w, *c, first)? as u32,
                    None => self.launch.block.next_multiple_of(32),
                };
                if id >= 16 || expected % 32 != 0 || expected == 0 {
                    return Err((None, format!("barrier {id} with thread count {expected}")));
                }
                let nwarps = self.clocks.len();
                let b = self.barriers.entry(id).or_insert(Barrier {
                    expected,
                    arrived: 0,
                    waiting: Vec::new(),
                    join: vec![0; nwarps],
                });
                if b.expected != expected {
                    return Err((
                        None,
                        format!(
                            "barrier {id}: warp {} arrives with a thread count of {expected} while the warps already there gave {}",
                            w.index, b.expected
                        ),
                    ));
                }
                b.arrived += 32;
                for (j, c) in b.join.iter_mut().zip(&self.clocks[w.index as usize]) {
                    *j = (*j).max(*c);
                }
                advance(w);
                if *arrive {
                    // What the warp does after arriving is not ordered before the waiters' continuation.
                    self.clocks[w.index as usize][w.index as usize] += 1;
                }
                return Ok(Some((id, !*arrive)));
            }
            _ => {}
        }
        advance(w);
        if active == 0 {
            return Ok(None);
        }
        self.exec(w, &ins.op, active)?;
        Ok(None)
    }

    fn exec(&mut self, w: &mut Warp, op: &Op, active: u32) -> R<()> {
        match op {
            Op::Mov { d, a } => {
                for l in Self::lanes(active) {
                    let v = self.get(w, *a, l)?;
                    self.set(w, *d, l, v);
                }
            }
            Op::Pack { d, parts, part_bits } => {
                for l in Self::lanes(active) {
                    let mut v = 0u64;
                    for (i, p) in parts.iter().enumerate() {
                        v |= mask_bits(self.get(w, *p, l)?, *part_bits) << (i as u32 * part_bits);
                    }
                    self.set(w, *d, l, v);
                }
            }
            Op::Unpack { ds, a, part_bits } => {
                for l in Self::lanes(active) {
                    let v = self.get(w, *a, l)?;
                    for (i, d) in ds.iter().enumerate() {
                        if let Some(d) = d {
                            self.set(w, *d, l, mask_bits(v >> (i as u32 * part_bits), *part_bits));
                        }
                    }
                }
            }
            Op::Int { op, ty, d, a, b } => {
                for l in Self::lanes(active) {
                    let (x, y) = (self.get(w, *a, l)?, self.get(w, *b, l)?);
                    let v = int_op(*op, *ty, x, y).map_err(|e| (Some(l), e))?;
                    self.set(w, *d, l, v);
                }
            }
            Op::Mad { hi, wide, ty, d, a, b, c } => {
                for l in Self::lanes(active) {
                    let (x, y, z) = (self.get(w, *a, l)?, self.get(w, *b, l)?, self.get(w, *c, l)?);
                    let p = if *wide {
                        int_op(IntOp::MulWide, *ty, x, y)
                    } else if *hi {
                        int_op(IntOp::MulHi, *ty, x, y)
                    } else {
                        int_op(IntOp::MulLo, *ty, x, y)
                    }
                    .map_err(|e| (Some(l), e))?;
                    let bits = if *wide { ty.bits() * 2 } else { ty.bits() };
                    self.set(w, *d, l, mask_bits(p.wrapping_add(z), bits));
                }
            }
            Op::Un { op, ty, d, a } => {
                let bits = ty.bits();
                for l in Self::lanes(active) {
                    let x = mask_bits(self.get(w, *a, l)?, bits);
                    let v = match op {
                        UnOp::Neg => (x as i64).wrapping_neg() as u64,
                        UnOp::Not => !x,
                        UnOp::Abs => sx(x, bits).unsigned_abs(),
                        UnOp::Popc => x.count_ones() as u64,
                        UnOp::Clz => (x.leading_zeros() - (64 - bits)) as u64,
                        UnOp::Brev => x.reverse_bits() >> (64 - bits),
                        UnOp::Cnot => (x == 0) as u64,
                    };
                    self.set(w, *d, l, mask_bits(v, bits));
                }
            }
            Op::Float { op, rnd, ftz, sat, d, a, b, .. } => {
                for l in Self::lanes(active) {
                    let (mut x, mut y) = (f32_of(self.get(w, *a, l)?), f32_of(self.get(w, *b, l)?));
                    if *ftz {
                        x = num::ftz(x);
                        y = num::ftz(y);
                    }
                    let mut r = match op {
                        FOp::Add => num::add_f32(x, y, *rnd),
                        FOp::Sub => num::add_f32(x, -y, *rnd),
                        FOp::Mul => num::mul_f32(x, y, *rnd),
                        FOp::Div => num::div_f32(x, y, *rnd),
                        FOp::Min => fminmax(x, y, false),
                        FOp::Max => fminmax(x, y, true),
                    };
                    if *ftz {
                        r = num::ftz(r);
                    }
                    if *sat {
                        r = sat01(r);
                    }
                    self.set(w, *d, l, bits_of(r));
                }
            }
            Op::Fma { rnd, ftz, sat, d, a, b, c, .. } => {
                for l in Self::lanes(active) {
                    let mut v = [0f32; 3];
                    for (i, s) in [a, b, c].into_iter().enumerate() {
                        v[i] = f32_of(self.get(w, *s, l)?);
                        if *ftz {
                            v[i] = num::ftz(v[i]);
                        }
                    }
                    let mut r = num::fma_f32(v[0], v[1], v[2], *rnd);
                    if *ftz {
                        r = num::ftz(r);
                    }
                    if *sat {
                        r = sat01(r);
                    }
                    self.set(w, *d, l, bits_of(r));
                }
            }
            Op::FUnary { op, ftz, d, a, .. } => {
                for l in Self::lanes(active) {
                    let mut x = f32_of(self.get(w, *a, l)?);
                    if *ftz {
                        x = num::ftz(x);
                    }
                    let r = match op {
                        // neg/abs flip or clear the sign bit (NaN stays NaN, not canonicalised).
                        FUn::Neg => -x,
                        FUn::Abs => x.abs(),
                        FUn::Ex2Approx => {
                            if !*ftz {
                                return lane_err(l, "ex2.approx.f32 without .ftz is not modelled".into());
                            }
                            num::ftz((self.approx.ex2_ftz)(x))
                        }
                        FUn::RcpRn => num::div_f32(1.0, x, Rnd::Rn),
                        FUn::SqrtRn => num::fix_nan((x as f64).sqrt() as f32),
                        FUn::RcpApprox | FUn::Lg2Approx | FUn::TanhApprox => {
                            return lane_err(l, format!("{op:?} has no shared model yet"));
                        }
                    };
                    let r = if *ftz { num::ftz(r) } else { r };
                    self.set(w, *d, l, bits_of(r));
                }
            }
            Op::Setp { cmp, ty, d, d2, a, b, combine } => {
                for l in Self::lanes(active) {
                    let (x, y) = (self.get(w, *a, l)?, self.get(w, *b, l)?);
                    let t = compare(*cmp, *ty, x, y);
                    let (mut p, mut q) = (t, !t);
                    if let Some((op, c)) = combine {
                        let cv = self.get(w, *c, l)? & 1 == 1;
                        p = bool_apply(*op, p, cv);
                        q = bool_apply(*op, q, cv);
                    }
                    self.set(w, *d, l, p as u64);
                    if let Some(d2) = d2 {
                        self.set(w, *d2, l, q as u64);
                    }
                }
            }
            Op::Logic { op, d, a, b } => {
                for l in Self::lanes(active) {
                    let x = self.get(w, *a, l)? & 1 == 1;
                    let v = match op {
                        None => !x,
                        Some(o) => bool_apply(*o, x, self.get(w, *b, l)? & 1 == 1),
                    };
                    self.set(w, *d, l, v as u64);
                }
            }
            Op::Selp { d, a, b, p, .. } => {
                for l in Self::lanes(active) {
                    let v = if self.get(w, *p, l)? & 1 == 1 { self.get(w, *a, l)? } else { self.get(w, *b, l)? };
                    self.set(w, *d, l, v);
                }
            }
            Op::Cvt { dty, sty, rnd, irnd, ftz, sat, d, a } => {
                for l in Self::lanes(active) {
                    let x = self.get(w, *a, l)?;
                    let v = cvt(*dty, *sty, *rnd, *irnd, *ftz, *sat, x).map_err(|e| (Some(l), e))?;
                    self.set(w, *d, l, v);
                }
            }
            Op::CvtPack { to, relu, d, hi, lo } => {
                for l in Self::lanes(active) {
                    let mut h = f32_of(self.get(w, *hi, l)?);
                    let mut o = f32_of(self.get(w, *lo, l)?);
                    if *relu {
                        h = if h.is_nan() { h } else { h.max(0.0) };
                        o = if o.is_nan() { o } else { o.max(0.0) };
                    }
                    let v = match to {
                        PackTo::F16x2 => {
                            (num::f32_to_f16(h, Rnd::Rn) as u64) << 16 | num::f32_to_f16(o, Rnd::Rn) as u64
                        }
                        PackTo::Bf16x2 => {
                            (num::f32_to_bf16(h, Rnd::Rn) as u64) << 16 | num::f32_to_bf16(o, Rnd::Rn) as u64
                        }
                        PackTo::Fp8(f) => (num::f32_to_fp8(h, *f) as u64) << 8 | num::f32_to_fp8(o, *f) as u64,
                    };
                    self.set(w, *d, l, v);
                }
            }
            Op::CvtFp8ToF16x2 { f, d, a } => {
                for l in Self::lanes(active) {
                    let x = self.get(w, *a, l)?;
                    let lo = num::fp8_to_f16(x as u8, *f) as u64;
                    let hi = num::fp8_to_f16((x >> 8) as u8, *f) as u64;
                    self.set(w, *d, l, hi << 16 | lo);
                }
            }
            Op::Ld { space, ty, ds, addr } => {
                let size = ty.bytes() as usize;
                let n = ds.len();
                if size * n > 32 {
                    return lane_err(0, format!("a load of {} bytes", size * n));
                }
                for l in Self::lanes(active) {
                    let a = self.addr(w, *addr, l)?;
                    let mut storage = [0u8; 32];
                    let buf = &mut storage[..size * n];
                    self.load(w, *space, a, buf, l)?;
                    for (i, d) in ds.iter().enumerate() {
                        let mut b8 = [0u8; 8];
                        b8[..size].copy_from_slice(&buf[i * size..(i + 1) * size]);
                        let raw = u64::from_le_bytes(b8);
                        let v = if ty.signed() { sx(raw, ty.bits()) as u64 } else { raw };
                        if let Some(d) = d {
                            self.set(w, *d, l, v);
                        }
                    }
                }
            }
            Op::St { space, ty, srcs, addr } => {
                let size = ty.bytes() as usize;
                if size * srcs.len() > 32 {
                    return lane_err(0, format!("a store of {} bytes", size * srcs.len()));
                }
                for l in Self::lanes(active) {
                    let a = self.addr(w, *addr, l)?;
                    let mut storage = [0u8; 32];
                    for (i, s) in srcs.iter().enumerate() {
                        storage[i * size..(i + 1) * size].copy_from_slice(&self.get(w, *s, l)?.to_le_bytes()[..size]);
                    }
                    self.store(w, *space, a, &storage[..size * srcs.len()], l)?;
                }
            }
            Op::Atom { space, op, ty, d, addr, b, c } => {
                let size = ty.bytes() as usize;
                for l in Self::lanes(active) {
                    let a = self.addr(w, *addr, l)?;
                    let mut buf = vec![0u8; size];
                    self.load(w, *space, a, &mut buf, l)?;
                    let mut b8 = [0u8; 8];
                    b8[..size].copy_from_slice(&buf);
                    let old = u64::from_le_bytes(b8);
                    let y = self.get(w, *b, l)?;
                    let new = match (op, ty) {
                        (AtomOp::Add, Ty::F32) => {
                            bits_of(num::ftz(num::add_f32(num::ftz(f32_of(old)), num::ftz(f32_of(y)), Rnd::Rn)))
                        }
                        (AtomOp::Add, _) => old.wrapping_add(y),
                        (AtomOp::Exch, _) => y,
                        (AtomOp::And, _) => old & y,
                        (AtomOp::Or, _) => old | y,
                        (AtomOp::Xor, _) => old ^ y,
                        (AtomOp::Min, t) if t.signed() => sx(old, t.bits()).min(sx(y, t.bits())) as u64,
                        (AtomOp::Max, t) if t.signed() => sx(old, t.bits()).max(sx(y, t.bits())) as u64,
                        (AtomOp::Min, t) => mask_bits(old, t.bits()).min(mask_bits(y, t.bits())),
                        (AtomOp::Max, t) => mask_bits(old, t.bits()).max(mask_bits(y, t.bits())),
                        (AtomOp::Cas, t) => {
                            let cv = self.get(w, c.unwrap(), l)?;
                            if mask_bits(old, t.bits()) == mask_bits(y, t.bits()) {
                                cv
                            } else {
                                old
                            }
                        }
                    };
                    self.store(w, *space, a, &new.to_le_bytes()[..size], l)?;
                    if let Some(d) = d {
                        self.set(w, *d, l, old);
                    }
                }
            }
            Op::Cvta { to, space, d, a } => {
                for l in Self::lanes(active) {
                    let x = self.get(w, *a, l)?;
                    let v = match (space, to) {
                        (Space::Global, _) => x,
                        (Space::Shared, false) => SHARED_WINDOW + (x & 0xffff_ffff),
                        (Space::Local, false) => LOCAL_WINDOW + (x & 0xffff_ffff),
                        (Space::Shared, true) | (Space::Local, true) => {
                            let base = if *space == Space::Shared { SHARED_WINDOW } else { LOCAL_WINDOW };
                            if !(base..base + (1 << 32)).contains(&x) {
                                return lane_err(
                                    l,
                                    format!("cvta.to.{space:?} of generic address {x:#x}, which is not in that window"),
                                );
                            }
                            x - base
                        }
                        _ => return lane_err(l, format!("cvta for {space:?}")),
                    };
                    self.set(w, *d, l, v);
                }
            }
            Op::Shfl { mode, d, p, a, b, c, mask } => {
                let m = self.check_membermask(w, *mask, active, "shfl.sync")?;
                let mut vals = [0u64; 32];
                for l in Self::lanes(active) {
                    vals[l as usize] = self.get(w, *a, l)?;
                }
                let mut out = [(0u64, false); 32];
                for l in Self::lanes(active) {
                    let bval = self.get(w, *b, l)? as u32 & 31;
                    let cv = self.get(w, *c, l)? as u32;
                    let cval = cv & 31;
                    let segmask = (cv >> 8) & 31;
                    let max_lane = (l & segmask) | (cval & !segmask);
                    let min_lane = l & segmask;
                    let (j, pval) = match mode {
                        ShflMode::Up => {
                            let j = l as i32 - bval as i32;
                            (j, j >= max_lane as i32)
                        }
                        ShflMode::Down => {
                            let j = l + bval;
                            (j as i32, j <= max_lane)
                        }
                        ShflMode::Bfly => {
                            let j = l ^ bval;
                            (j as i32, j <= max_lane)
                        }
                        ShflMode::Idx => {
                            let j = min_lane | (bval & !segmask);
                            (j as i32, j <= max_lane)
                        }
                    };
                    let j = if pval { j as u32 } else { l };
                    if m >> j & 1 == 0 {
                        return lane_err(
                            l,
                            format!("shfl.sync reads lane {j}, which is not in the member mask {m:#010x}"),
                        );
                    }
                    out[l as usize] = (vals[j as usize], pval);
                }
                for l in Self::lanes(active) {
                    self.set(w, *d, l, out[l as usize].0);
                    if let Some(p) = p {
                        self.set(w, *p, l, out[l as usize].1 as u64);
                    }
                }
            }
            Op::Vote { mode, d, a, mask } => {
                self.check_membermask(w, *mask, active, "vote.sync")?;
                let mut ballot = 0u32;
                for l in Self::lanes(active) {
                    if self.get(w, *a, l)? & 1 == 1 {
                        ballot |= 1 << l;
                    }
                }
                let v = match mode {
                    VoteMode::Ballot => ballot as u64,
                    VoteMode::Any => (ballot != 0) as u64,
                    VoteMode::All => (ballot == active) as u64,
                    VoteMode::Uni => (ballot == 0 || ballot == active) as u64,
                };
                for l in Self::lanes(active) {
                    self.set(w, *d, l, v);
                }
            }
            Op::Ldmatrix { n, trans, ds, addr } => {
                self.require_converged(w, active, "ldmatrix.sync.aligned")?;
                // Matrix i's row r comes from the address lane 8i + r gives (the PTX ISA, ldmatrix).
                let mut m = vec![[[0u16; 8]; 8]; *n as usize];
                for (i, mat) in m.iter_mut().enumerate() {
                    for (r, row) in mat.iter_mut().enumerate() {
                        let lane = (i * 8 + r) as u32;
                        let a = self.addr(w, *addr, lane)?;
                        let (_, off) = self.resolve(Space::Shared, a);
                        if off % 16 != 0 {
                            return lane_err(lane, format!("ldmatrix row address shared+{off} is not 16-byte aligned"));
                        }
                        let o = self.check_shared(off, 16, "ldmatrix row read", lane)?;
                        self.track(w.index, o, 16, false, "ldmatrix").map_err(|(_, e)| (Some(lane), e))?;
                        for (c, e) in row.iter_mut().enumerate() {
                            *e = u16::from_le_bytes([self.shared[o + 2 * c], self.shared[o + 2 * c + 1]]);
                        }
                    }
                }
                for l in Self::lanes(active) {
                    let (g, t) = ((l / 4) as usize, (l % 4) as usize);
                    for (i, d) in ds.iter().enumerate() {
                        let (e0, e1) = if *trans {
                            (m[i][2 * t][g], m[i][2 * t + 1][g])
                        } else {
                            (m[i][g][2 * t], m[i][g][2 * t + 1])
                        };
                        self.set(w, *d, l, (e1 as u64) << 16 | e0 as u64);
                    }
                }
            }
            Op::Mma { bf16, d, a, b, c } => {
                self.require_converged(w, active, "mma.sync.aligned")?;
                self.mma(w, *bf16, d, a, b, c)?;
            }
            Op::CpAsync { dst, src, size, src_size } => {
                for l in Self::lanes(active) {
                    let da = self.addr(w, *dst, l)?;
                    let (_, doff) = self.resolve(Space::Shared, da);
                    let sa = self.addr(w, *src, l)?;
                    let n = match src_size {
                        Some(s) => self.get(w, *s, l)? as u32,
                        None => *size,
                    };
                    if n > *size {
                        return lane_err(l, format!("cp.async src-size {n} larger than its cp-size {size}"));
                    }
                    if doff % *size as u64 != 0 {
                        return lane_err(l, format!("misaligned cp.async destination shared+{doff} ({size} bytes)"));
                    }
                    let len = self.shared.len() as u64;
                    if doff + *size as u64 > len {
                        return lane_err(
                            l,
                            format!("out-of-bounds cp.async destination shared+{doff}: the block has {len} bytes"),
                        );
                    }
                    let mut bytes = vec![0u8; *size as usize];
                    if n > 0 {
                        if sa % *size as u64 != 0 {
                            return lane_err(l, format!("misaligned cp.async source {sa:#x} ({size} bytes)"));
                        }
                        self.global
                            .read(sa, &mut bytes[..n as usize])
                            .map_err(|e| (Some(l), format!("cp.async: {e}")))?;
                    }
                    for x in &mut self.inflight[doff as usize..(doff + *size as u64) as usize] {
                        *x += 1;
                    }
                    w.cp[l as usize].pending.push(CpCopy { dst: doff, bytes });
                }
            }
            Op::CpAsyncCommit => {
                for l in Self::lanes(active) {
                    let cp = &mut w.cp[l as usize];
                    let g = std::mem::take(&mut cp.pending);
                    cp.groups.push_back(g);
                }
            }
            Op::CpAsyncWait { n } => {
                for l in Self::lanes(active) {
                    let mut done = Vec::new();
                    let cp = &mut w.cp[l as usize];
                    while cp.groups.len() > *n as usize {
                        done.extend(cp.groups.pop_front().unwrap());
                    }
                    for c in done {
                        self.land(w.index, c)?;
                    }
                }
            }
            Op::Prmt { d, a, b, c } => {
                for l in Self::lanes(active) {
                    let x = (self.get(w, *b, l)? as u32 as u64) << 32 | self.get(w, *a, l)? as u32 as u64;
                    let s = self.get(w, *c, l)? as u32;
                    let mut r = 0u64;
                    for i in 0..4 {
                        let sel = (s >> (4 * i)) & 0xf;
                        let mut byte = (x >> ((sel & 7) * 8)) & 0xff;
                        if sel & 8 != 0 {
                            byte = if byte & 0x80 != 0 { 0xff } else { 0 };
                        }
                        r |= byte << (8 * i);
                    }
                    self.set(w, *d, l, r);
                }
            }
            Op::Lop3 { d, a, b, c, lut } => {
                for l in Self::lanes(active) {
                    let (x, y, z) = (self.get(w, *a, l)?, self.get(w, *b, l)?, self.get(w, *c, l)?);
                    let mut r = 0u64;
                    for bit in 0..32 {
                        let idx = ((x >> bit) & 1) << 2 | ((y >> bit) & 1) << 1 | ((z >> bit) & 1);
                        r |= ((*lut as u64 >> idx) & 1) << bit;
                    }
                    self.set(w, *d, l, r);
                }
            }
            Op::Bfe { ty, d, a, b, c } => {
                let bits = ty.bits();
                for l in Self::lanes(active) {
                    let x = mask_bits(self.get(w, *a, l)?, bits);
                    let pos = (self.get(w, *b, l)? & 0xff) as u32;
                    let len = (self.get(w, *c, l)? & 0xff) as u32;
                    let msb = (pos + len).min(bits) as i64 - 1;
                    let sbit = if ty.signed() && len > 0 { (x >> msb.clamp(0, bits as i64 - 1)) & 1 } else { 0 };
                    let mut r = 0u64;
                    for i in 0..bits {
                        let bit = if i < len && pos + i < bits {
                            (x >> (pos + i)) & 1
                        } else if ty.signed() {
                            sbit
                        } else {
                            0
                        };
                        r |= bit << i;
                    }
                    self.set(w, *d, l, r);
                }
            }
            Op::Bfi { ty, d, a, b, c, e } => {
                let bits = ty.bits();
                for l in Self::lanes(active) {
                    let (x, y) = (self.get(w, *a, l)?, self.get(w, *b, l)?);
                    let pos = (self.get(w, *c, l)? & 0xff) as u32;
                    let len = (self.get(w, *e, l)? & 0xff) as u32;
                    let mut r = mask_bits(y, bits);
                    for i in 0..len {
                        if pos + i >= bits {
                            break;
                        }
                        r = (r & !(1 << (pos + i))) | (((x >> i) & 1) << (pos + i));
                    }
                    self.set(w, *d, l, r);
                }
            }
            Op::HalfX2 { op, fma, bf16, d, a, b, c } => {
                for l in Self::lanes(active) {
                    let (x, y, z) = (self.get(w, *a, l)?, self.get(w, *b, l)?, self.get(w, *c, l)?);
                    let mut r = 0u64;
                    for h in 0..2 {
                        let part = |v: u64| {
                            let bits = (v >> (16 * h)) as u16;
                            if *bf16 {
                                num::bf16_to_f32(bits)
                            } else {
                                num::f16_to_f32(bits)
                            }
                        };
                        let (p, q, s) = (part(x) as f64, part(y) as f64, part(z) as f64);
                        // The exact result as an f64 pair (16-bit products are exact), then one rounding.
                        let (hi, lo) = match (op, fma) {
                            (_, true) => num::two_sum(p * q, s),
                            (FOp::Mul, _) => (p * q, 0.0),
                            (FOp::Sub, _) => num::two_sum(p, -q),
                            _ => num::two_sum(p, q),
                        };
                        let v = num::round_to_16(hi, lo, *bf16);
                        r |= (v as u64) << (16 * h);
                    }
                    self.set(w, *d, l, r);
                }
            }
            Op::WarpSync { mask } => {
                // Lanes of a warp run in lockstep here, so the only thing to check is the ISA's condition:
                // every lane executing it is in the member mask and every member executes it.
                self.check_membermask(w, *mask, active, "bar.warp.sync")?;
            }
            Op::Nop => {}
            Op::Bra { .. } | Op::Exit | Op::Bar { .. } => unreachable!(),
        }
        Ok(())
    }

    /// mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32, fragments per the PTX ISA's
    /// "Matrix Fragments for mma.m16n8k16 with floating point type": groupID = lane >> 2,
    /// threadID_in_group = lane % 4.
    ///   A (16x16): register i holds elements 2i, 2i+1; element j: row g + 8·((j / 2) % 2), column
    ///     2t + (j % 2) + 8·(j >= 4).
    ///   B (16x8): element j: row 2t + (j % 2) + 8·(j >= 2), column g.
    ///   C, D (16x8): element j: row g + 8·(j >= 2), column 2t + (j % 2).
    /// The ISA leaves the order and precision of the accumulation unspecified; modelled as exact products
    /// added to C one k at a time in k order, each sum rounded to nearest fp32 (the emulator's model; a
    /// bit-for-bit comparison needs the same one, and it is kept explicit here).
    fn mma(&mut self, w: &mut Warp, bf16: bool, d: &[u32; 4], a: &[Src; 4], b: &[Src; 2], c: &[Src; 4]) -> R<()> {
        let mut am = [[0f32; 16]; 16];
        let mut bm = [[0f32; 8]; 16];
        let mut cm = [[0f32; 8]; 16];
        let cv = |h: u16| if bf16 { num::bf16_to_f32(h) } else { num::f16_to_f32(h) };
        for l in 0..32u32 {
            let (g, t) = ((l >> 2) as usize, (l % 4) as usize);
            for (i, s) in a.iter().enumerate() {
                let v = self.get(w, *s, l)?;
                for half in 0..2 {
                    let j = 2 * i + half;
                    let row = g + 8 * ((j / 2) % 2);
                    let col = 2 * t + (j % 2) + if j >= 4 { 8 } else { 0 };
                    am[row][col] = cv((v >> (16 * half)) as u16);
                }
            }
            for (i, s) in b.iter().enumerate() {
                let v = self.get(w, *s, l)?;
                for half in 0..2 {
                    let j = 2 * i + half;
                    let row = 2 * t + (j % 2) + if j >= 2 { 8 } else { 0 };
                    bm[row][g] = cv((v >> (16 * half)) as u16);
                }
            }
            for (j, s) in c.iter().enumerate() {
                let v = self.get(w, *s, l)?;
                let row = g + if j >= 2 { 8 } else { 0 };
                cm[row][2 * t + (j % 2)] = f32_of(v);
            }
        }
        for l in 0..32u32 {
            let (g, t) = ((l >> 2) as usize, (l % 4) as usize);
            for (j, dr) in d.iter().enumerate() {
                let row = g + if j >= 2 { 8 } else { 0 };
                let col = 2 * t + (j % 2);
                let mut acc = cm[row][col];
                for (k, bk) in bm.iter().enumerate() {
                    let p = am[row][k] as f64 * bk[col] as f64; // exact
                    acc = num::round_f32(acc as f64 + p, 0.0, Rnd::Rn);
                    // The f64 sum of an fp32 and an exact 16-bit product is exact unless their exponents
                    // differ by more than 29 bits, where rounding the f64 sum is still correct for RN
                    // (double rounding is innocuous: 53 >= 2·24 + 2).
                }
                self.set(w, *dr, l, bits_of(num::fix_nan(acc)));
            }
        }
        Ok(())
    }
}

fn fminmax(x: f32, y: f32, max: bool) -> f32 {
    match (x.is_nan(), y.is_nan()) {
        (true, true) => f32::from_bits(num::CANONICAL_NAN_F32),
        (true, false) => y,
        (false, true) => x,
        _ => {
            if x == y {
                // -0 < +0 for min and max.
                if max {
                    if x.is_sign_negative() {
                        y
                    } else {
                        x
                    }
                } else if x.is_sign_negative() {
                    x
                } else {
                    y
                }
            } else if (x > y) == max {
                x
            } else {
                y
            }
        }
    }
}

fn bool_apply(op: BoolOp, a: bool, b: bool) -> bool {
    match op {
        BoolOp::And => a & b,
        BoolOp::Or => a | b,
        BoolOp::Xor => a ^ b,
    }
}

fn compare(cmp: Cmp, ty: Ty, x: u64, y: u64) -> bool {
    if ty.float() {
        let (a, b) = (f32_of(x), f32_of(y));
        let nan = a.is_nan() || b.is_nan();
        return match cmp {
            Cmp::Eq => !nan && a == b,
            Cmp::Ne => !nan && a != b,
            Cmp::Lt => !nan && a < b,
            Cmp::Le => !nan && a <= b,
            Cmp::Gt => !nan && a > b,
            Cmp::Ge => !nan && a >= b,
            Cmp::Equ => nan || a == b,
            Cmp::Neu => nan || a != b,
            Cmp::Ltu => nan || a < b,
            Cmp::Leu => nan || a <= b,
            Cmp::Gtu => nan || a > b,
            Cmp::Geu => nan || a >= b,
            Cmp::Num => !nan,
            Cmp::Nan => nan,
            Cmp::Lo | Cmp::Ls | Cmp::Hi | Cmp::Hs => false,
        };
    }
    let bits = ty.bits();
    let (ua, ub) = (mask_bits(x, bits), mask_bits(y, bits));
    let (sa, sb) = (sx(x, bits), sx(y, bits));
    let s = ty.signed();
    match cmp {
        Cmp::Eq => ua == ub,
        Cmp::Ne => ua != ub,
        Cmp::Lt => {
            if s {
                sa < sb
            } else {
                ua < ub
            }
        }
        Cmp::Le => {
            if s {
                sa <= sb
            } else {
                ua <= ub
            }
        }
        Cmp::Gt => {
            if s {
                sa > sb
            } else {
                ua > ub
            }
        }
        Cmp::Ge => {
            if s {
                sa >= sb
            } else {
                ua >= ub
            }
        }
        Cmp::Lo => ua < ub,
        Cmp::Ls => ua <= ub,
        Cmp::Hi => ua > ub,
        Cmp::Hs => ua >= ub,
        _ => false,
    }
}

fn int_op(op: IntOp, ty: Ty, x: u64, y: u64) -> Result<u64, String> {
    let bits = ty.bits();
    let s = ty.signed();
    let (ux, uy) = (mask_bits(x, bits), mask_bits(y, bits));
    let (ix, iy) = (sx(x, bits), sx(y, bits));
    Ok(mask_bits(
        match op {
            IntOp::Add => ux.wrapping_add(uy),
            IntOp::Sub => ux.wrapping_sub(uy),
            IntOp::MulLo => ux.wrapping_mul(uy),
            IntOp::MulHi => {
                if s {
                    ((ix as i128 * iy as i128) >> bits) as u64
                } else {
                    ((ux as u128 * uy as u128) >> bits) as u64
                }
            }
            IntOp::MulWide => {
                let p = if s { (ix as i128 * iy as i128) as u64 } else { (ux as u128 * uy as u128) as u64 };
                return Ok(mask_bits(p, bits * 2));
            }
            IntOp::Div | IntOp::Rem => {
                if uy == 0 {
                    return Err("integer division by zero".into());
                }
                match (op, s) {
                    (IntOp::Div, true) => ix.wrapping_div(iy) as u64,
                    (IntOp::Rem, true) => ix.wrapping_rem(iy) as u64,
                    (IntOp::Div, false) => ux / uy,
                    _ => ux % uy,
                }
            }
            IntOp::Min => {
                if s {
                    ix.min(iy) as u64
                } else {
                    ux.min(uy)
                }
            }
            IntOp::Max => {
                if s {
                    ix.max(iy) as u64
                } else {
                    ux.max(uy)
                }
            }
            IntOp::And => ux & uy,
            IntOp::Or => ux | uy,
            IntOp::Xor => ux ^ uy,
            IntOp::Shl => {
                let n = y as u32;
                if n >= bits {
                    0
                } else {
                    ux << n
                }
            }
            IntOp::Shr => {
                let n = (y as u32).min(bits);
                if s {
                    (ix >> n.min(63)) as u64
                } else if n >= bits {
                    0
                } else {
                    ux >> n
                }
            }
        },
        bits,
    ))
}

fn float_value(ty: Ty, x: u64) -> Option<f64> {
    Some(match ty {
        Ty::F32 => f32_of(x) as f64,
        Ty::F64 => f64::from_bits(x),
        Ty::F16 => num::f16_to_f32(x as u16) as f64,
        Ty::Bf16 => num::bf16_to_f32(x as u16) as f64,
        _ => return None,
    })
}

fn cvt(dty: Ty, sty: Ty, rnd: Option<Rnd>, irnd: Option<IntRnd>, ftz: bool, sat: bool, x: u64) -> Result<u64, String> {
    let sbits = sty.bits();
    if !sty.float() && !dty.float() {
        // Integer to integer: the source as its type, then truncated (or saturated) to the destination.
        let v: i128 = if sty.signed() { sx(x, sbits) as i128 } else { mask_bits(x, sbits) as i128 };
        let db = dty.bits();
        let v = if sat {
            let (lo, hi) =
                if dty.signed() { (-(1i128 << (db - 1)), (1i128 << (db - 1)) - 1) } else { (0, (1i128 << db) - 1) };
            v.clamp(lo, hi)
        } else {
            v
        };
        // Sign-extend a signed destination into a wider register.
        let out = mask_bits(v as u64, db);
        return Ok(if dty.signed() { sx(out, db) as u64 } else { out });
    }
    if sty.float() && dty.float() {
        let mut v = float_value(sty, x).ok_or("cvt source type")?;
        if ftz && sty == Ty::F32 {
            v = num::ftz(v as f32) as f64;
        }
        if let Some(ir) = irnd {
            v = match ir {
                IntRnd::Rni => v.round_ties_even(),
                IntRnd::Rzi => v.trunc(),
                IntRnd::Rmi => v.floor(),
                IntRnd::Rpi => v.ceil(),
            };
        }
        let out = match dty {
            Ty::F32 => {
                let mut f = if sty == Ty::F64 { num::round_f32(v, 0.0, rnd.unwrap_or(Rnd::Rn)) } else { v as f32 };
                if ftz {
                    f = num::ftz(f);
                }
                if sat {
                    f = sat01(f);
                }
                bits_of(num::fix_nan(f))
            }
            Ty::F64 => v.to_bits(),
            Ty::F16 => num::f32_to_f16(v as f32, rnd.unwrap_or(Rnd::Rn)) as u64,
            Ty::Bf16 => num::f32_to_bf16(v as f32, rnd.unwrap_or(Rnd::Rn)) as u64,
            _ => return Err(format!("cvt to {dty:?}")),
        };
        return Ok(out);
    }
    if !sty.float() {
        // Integer to float.
        let v: i128 = if sty.signed() { sx(x, sbits) as i128 } else { mask_bits(x, sbits) as i128 };
        let hi = v as f64;
        let lo = (v - hi as i128) as f64;
        let mode = rnd.unwrap_or(Rnd::Rn);
        return Ok(match dty {
            Ty::F32 => bits_of(num::round_f32(hi, lo, mode)),
            Ty::F64 => hi.to_bits(),
            Ty::F16 => num::f32_to_f16(num::round_f32(hi, lo, Rnd::Rn), mode) as u64,
            _ => return Err(format!("cvt to {dty:?}")),
        });
    }
    // Float to integer: round as irnd says (default .rzi is not implied: PTX requires one), saturate, NaN -> 0.
    let mut v = float_value(sty, x).ok_or("cvt source type")?;
    if ftz && sty == Ty::F32 {
        v = num::ftz(v as f32) as f64;
    }
    if v.is_nan() {
        return Ok(0);
    }
    let r = match irnd.ok_or("float-to-integer cvt without an integer rounding")? {
        IntRnd::Rni => v.round_ties_even(),
        IntRnd::Rzi => v.trunc(),
        IntRnd::Rmi => v.floor(),
        IntRnd::Rpi => v.ceil(),
    };
    let db = dty.bits();
    let (lo, hi) = if dty.signed() {
        (-(2f64.powi(db as i32 - 1)), 2f64.powi(db as i32 - 1) - 1.0)
    } else {
        (0.0, 2f64.powi(db as i32) - 1.0)
    };
    let c = r.clamp(lo, hi);
    let out = if dty.signed() { c as i64 as u64 } else { c as u64 };
    Ok(mask_bits(out, db))
}
