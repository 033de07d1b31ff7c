//! Which prefill kernel a call runs, and what the sm_90a kernel (kernels/prefill_sm90.cu) needs from the host:
//! its tile shape ([`Sm90Tile`], the launcher's choice from kernels/include/fa/hopper/traits.cuh) and the TMA tensor maps of
//! q, k and v, encoded for the backend that runs it (src/runtime/tensor_map.rs).
//!
//! [`PrefillKernel::Auto`] takes the sm_90a kernel on a GPU of compute capability 9.0 when it supports the
//! call (head dim 64, 128 or 256, or Q·K head dim 192 with V head dim 128: [`SM90_V_HEAD_DIM_PAIRS`]; a
//! softcap, if any, in [`SM90_SOFTCAP_RANGE`]; tensors TMA can address),
//! and the sm_80 kernel otherwise, silently. Every score variant (window, softcap, ALiBi, sinks) runs on both
//! kernels with the same semantics. On the emulator `Auto` keeps the sm_80 kernel (the emulator has no compute
//! capability to choose by; tests and the runner pick the sm_90a kernel with [`PrefillKernel::Sm90`]).
//! Forcing `Sm90` where it cannot run is a typed error, never a silent fallback: `Arch` on a GPU that is
//! not compute capability 9.0, `Unsupported` for a head dim or variant it lacks, the tensor map's own error
//! (`Alignment`, `Overflow`, `Shape`) for a tensor TMA cannot address.

use std::ffi::c_void;
use std::str::FromStr;

use crate::device::Stream;
use crate::error::{Error, ErrorKind, Result};
use crate::launch::Launch;
use crate::score_mod::ScoreMod;
use crate::sys;
use crate::tensor_map::{TensorMapSpec, TmaSwizzle};
use crate::tile::prefill_sm90_tile_policy;

/// The prefill kernel a call runs ([`super::PrefillOptions::kernel`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum PrefillKernel {
    /// sm_90a on a compute capability 9.0 GPU when it supports the call, else sm_80 (always sm_80 on the
    /// emulator).
    #[default]
    Auto,
    /// The mma.sync kernel (sm_80 and newer).
    Sm80,
    /// The wgmma/TMA kernel (compute capability 9.0 only; runs on the emulator too).
    Sm90,
}

impl PrefillKernel {
    pub fn name(self) -> &'static str {
        match self {
            PrefillKernel::Auto => "auto",
            PrefillKernel::Sm80 => "sm80",
            PrefillKernel::Sm90 => "sm90",
        }
    }
}

impl FromStr for PrefillKernel {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "auto" => Ok(PrefillKernel::Auto),
            "sm80" => Ok(PrefillKernel::Sm80),
            "sm90" => Ok(PrefillKernel::Sm90),
            other => Err(Error::usage(format!("unknown prefill kernel {other:?} (auto, sm80 or sm90)"))),
        }
    }
}

/// Head dims the sm_90a kernel is instantiated for with V of the same head dim (others run the sm_80 kernel).
pub const SM90_HEAD_DIMS: [usize; 3] = [64, 128, 256];

/// (Q·K head dim, V head dim) pairs with a V head dim of its own that the sm_90a kernel has a tile for:
/// DeepSeek-V2/V3's 192 / 128 (Q and K tiles of 192 columns, V and O of 128; kernels/include/fa/hopper/traits.cuh).
/// Every other pair runs on the sm_80 kernel (`Auto`; `Sm90` is an Unsupported error).
pub const SM90_V_HEAD_DIM_PAIRS: [(usize, usize); 1] = [(192, 128)];

/// Whether the sm_90a kernel has a tile for Q·K head dim `head_dim` with V head dim `head_dim_v`: asked of
/// the launcher (`fa_prefill_sm90_tile_policy`), whose instantiations decide; [`SM90_HEAD_DIMS`] and
/// [`SM90_V_HEAD_DIM_PAIRS`] list the same (a unit test holds them to it).
pub fn sm90_serves(head_dim: usize, head_dim_v: usize) -> bool {
    prefill_sm90_tile_policy(head_dim, head_dim_v, true).is_some()
}

/// The softcaps the sm_90a kernel takes (every one a model uses): its per-score division is inline and exact
/// on this range only (kernels/include/fa/score_mod.cuh, `softcap_inline_division_ok`, which this mirrors).
pub const SM90_SOFTCAP_RANGE: std::ops::RangeInclusive<f32> = f32::from_bits(63 << 23)..=f32::from_bits(191 << 23); // 2^-64..=2^64

/// The sm_90a kernel's tile for one call: the launcher's choice ([`crate::tile::prefill_sm90_tile_policy`],
/// kernels/include/fa/hopper/traits.cuh, which says why).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sm90Tile {
    /// Query rows per CTA: 64 per consumer warpgroup, two (D 128, 256, 192 / 128) or three (D 64).
    pub block_m: usize,
    /// Keys per KV tile.
    pub block_n: usize,
}

impl Sm90Tile {
    /// The tile of a call with head dim `head_dim`; `masked`: causal or with a sliding window, which keep
    /// D 128 at 128 × 128 (FA3's choice; unmasked D 128 runs 128 × 176). `None` for a head dim the kernel
    /// does not have ([`SM90_HEAD_DIMS`]).
    pub fn for_call(head_dim: usize, masked: bool) -> Option<Self> {
        Self::for_pair(head_dim, head_dim, masked)
    }

    /// The tile of a call with Q·K head dim `head_dim` and V head dim `head_dim_v` (192 / 128: 128 × 128,
    /// masked or not). `None` for a pair the kernel does not have ([`sm90_serves`]).
    pub fn for_pair(head_dim: usize, head_dim_v: usize, masked: bool) -> Option<Self> {
        let p = prefill_sm90_tile_policy(head_dim, head_dim_v, masked)?;
        Some(Self { block_m: p.block_m, block_n: p.block_n })
    }
}

/// A/B switches of the sm_90a kernel's tuning steps (docs/hopper.md, "Predictions, step by step"), to time
/// each step on a GPU in one run (`fused-attn report` on an H100/H200 does). Every setting computes the
/// same attention; the default has every step on. Ignored by the sm_80 kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Sm90Steps {
    /// The persistent grid (SM count × occupancy CTAs walking the work tiles); off: one CTA per tile.
    pub persistent: bool,
    /// FA3's 128 × 176 tile for D 128 without a mask; off: 128 × 128 as causal calls.
    pub wide_tile: bool,
    /// The TMA-store epilogue of dense calls; off: 16-byte stores as varlen.
    pub tma_store: bool,
    /// L2 cache hints on the TMA loads (Q evict_first, K and V evict_last); off: evict_normal.
    pub l2_hints: bool,
}

impl Default for Sm90Steps {
    fn default() -> Self {
        Self { persistent: true, wide_tile: true, tma_store: true, l2_hints: true }
    }
}

impl Sm90Steps {
    /// The steps that are off, as `-no-persistent-no-wide-tile-no-tma-store-no-l2-hints` (empty with all
    /// on): a kernel-name suffix for labels.
    pub fn label(&self) -> String {
        let mut s = String::new();
        let steps = [
            (self.persistent, "persistent"),
            (self.wide_tile, "wide-tile"),
            (self.tma_store, "tma-store"),
            (self.l2_hints, "l2-hints"),
        ];
        for (on, name) in steps {
            if !on {
                s.push_str("-no-");
                s.push_str(name);
            }
        }
        s
    }
}

pub use crate::emu::EMULATED_SMS;

/// CTAs of the sm_90a kernel one SM holds: one (every instantiation takes more than half of the 227 KiB of
/// shared memory, or all 64 K registers: fa/hopper/traits.cuh).
pub const SM90_OCCUPANCY: usize = 1;

/// The persistent grid for `tiles` work tiles on a GPU of `sms` SMs: every CTA resident at once (SM count
/// x occupancy), or one per tile when there are fewer (fa/hopper/tile_scheduler.cuh).
pub fn persistent_ctas(tiles: usize, sms: usize) -> usize {
    tiles.min(sms * SM90_OCCUPANCY).max(1)
}

/// SMs of the device behind `stream` (the emulator's [`crate::Emulator::multiprocessors`]).
fn multiprocessors(stream: &Stream<'_>) -> Result<usize> {
    let n = match stream {
        Stream::Emu(e) => return Ok(e.multiprocessors()),
        Stream::Gpu(s) => {
            s.context().bind_to_thread()?;
            crate::kernels::multiprocessor_count()?
        }
        Stream::Raw(r) => r.with_context(crate::kernels::multiprocessor_count)?,
    };
    Ok(n.max(1) as usize)
}

/// The kernel a call runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Choice {
    Sm80,
    Sm90(Sm90Tile),
}

/// Why the sm_90a kernel cannot run a call of these head dims and variants (`None`: it can).
fn unsupported_reason(head_dim: usize, head_dim_v: usize, score_mod: &ScoreMod) -> Option<String> {
    if head_dim != head_dim_v && !sm90_serves(head_dim, head_dim_v) {
        return Some(format!(
            "V head dim {head_dim_v} with Q·K head dim {head_dim} (the sm90 kernel has the pairs \
             {SM90_V_HEAD_DIM_PAIRS:?}; the sm80 kernel runs the others)"
        ));
    }
    if !sm90_serves(head_dim, head_dim_v) {
        return Some(format!("head dim {head_dim} (the sm90 kernel has {SM90_HEAD_DIMS:?})"));
    }
    if let Some(c) = score_mod.softcap.filter(|c| *c > 0.0 && !SM90_SOFTCAP_RANGE.contains(c)) {
        return Some(format!("softcap {c} (the sm90 kernel takes softcaps in 2^-64..=2^64)"));
    }
    None
}

/// Compute capability (10 · major + minor) of a GPU stream's device; `None` on the emulator.
fn compute_capability(stream: &Stream<'_>) -> Result<Option<i32>> {
    match stream {
        Stream::Emu(_) => Ok(None),
        Stream::Gpu(s) => {
            s.context().bind_to_thread()?;
            crate::kernels::compute_capability().map(Some)
        }
        Stream::Raw(r) => r.with_context(crate::kernels::compute_capability).map(Some),
    }
}

/// The kernel `kernel` resolves to for this call, before the tensor maps are checked (see [`maps`]).
pub(crate) fn choose(
    stream: &Stream<'_>,
    kernel: PrefillKernel,
    (head_dim, head_dim_v): (usize, usize),
    causal: bool,
    score_mod: &ScoreMod,
    steps: Sm90Steps,
) -> Result<Choice> {
    let masked = causal || score_mod.window.is_some() || !steps.wide_tile;
    let tile = || Sm90Tile::for_pair(head_dim, head_dim_v, masked);
    match kernel {
        PrefillKernel::Sm80 => Ok(Choice::Sm80),
        PrefillKernel::Auto => {
            let cc = compute_capability(stream)?;
            match (cc, tile()) {
                (Some(90), Some(t)) if unsupported_reason(head_dim, head_dim_v, score_mod).is_none() => {
                    Ok(Choice::Sm90(t))
                }
                _ => Ok(Choice::Sm80),
            }
        }
        PrefillKernel::Sm90 => {
            if let Some(cc) = compute_capability(stream)? {
                if cc != 90 {
                    return Err(Error::new(
                        ErrorKind::Arch,
                        format!("prefill kernel sm90: this GPU is sm_{cc}; the sm_90a kernel runs on compute capability 9.0 only"),
                    ));
                }
            }
            if let Some(why) = unsupported_reason(head_dim, head_dim_v, score_mod) {
                return Err(Error::unsupported("prefill kernel sm90", why));
            }
            let t = tile().expect("a supported head dim"); // ok: unsupported_reason checked it
            Ok(Choice::Sm90(t))
        }
    }
}

/// One operand as the kernel's 4-D tensor map sees it: (D, rows, heads, batch) and the element strides of
/// rows, heads and batch (D: Dqk for q and k, Dv for v and o; every box is 64 columns, the kernel loads or
/// stores D/64 of them).
pub(crate) struct Operand {
    pub ptr: *const c_void,
    pub head_dim: usize,
    pub rows: usize,
    pub heads: usize,
    pub batch: usize,
    /// Element strides of (row, head, batch).
    pub strides: [i64; 3],
}

impl Operand {
    fn spec(&self, elem_bytes: usize, box_rows: usize) -> Result<TensorMapSpec> {
        let bytes = |name: &str, s: i64| -> Result<u64> {
            u64::try_from(s * elem_bytes as i64).map_err(|_| Error::shape(name, format!("negative stride {s}")))
        };
        // A dimension of extent 1 is never stepped over: any valid stride serves (a varlen map's batch, a
        // single head's stride of a view that does not set it).
        let stride = |name: &str, s: i64, extent: usize| -> Result<u64> {
            if extent <= 1 {
                Ok(16)
            } else {
                bytes(name, s)
            }
        };
        Ok(TensorMapSpec {
            elem_bytes: elem_bytes as u32,
            dims: vec![self.head_dim as u64, self.rows as u64, self.heads as u64, self.batch as u64],
            strides: vec![
                stride("row", self.strides[0], self.rows)?,
                stride("head", self.strides[1], self.heads)?,
                stride("batch", self.strides[2], self.batch)?,
            ],
            box_dims: vec![64, box_rows as u32, 1, 1],
            swizzle: TmaSwizzle::B128,
        })
    }

    fn encode(&self, stream: &Stream<'_>, elem_bytes: usize, box_rows: usize) -> Result<sys::FaTensorMap> {
        let spec = self.spec(elem_bytes, box_rows)?;
        match stream {
            Stream::Emu(_) => spec.encode_emulator(self.ptr),
            Stream::Gpu(_) | Stream::Raw(_) => spec.encode_gpu(self.ptr as u64),
        }
    }
}

/// The operands of one call as the kernel's tensor maps see them.
pub(crate) struct Operands {
    pub elem_bytes: usize,
    pub q: Operand,
    /// k and v; `None` without keys (zeroed maps, which the kernel never reads).
    pub kv: Option<(Operand, Operand)>,
    /// o, for the TMA-store epilogue (dense calls); `None` (varlen): 16-byte stores.
    pub o: Option<Operand>,
}

/// The tensor maps of q, k and v for `tile`.
fn maps(stream: &Stream<'_>, tile: Sm90Tile, ops: &Operands) -> Result<[sys::FaTensorMap; 3]> {
    let name = |e: Error, what: &str| e.context(&format!("prefill kernel sm90: the {what} tensor map"));
    let q_map = ops.q.encode(stream, ops.elem_bytes, tile.block_m).map_err(|e| name(e, "q"))?;
    let (k_map, v_map) = match &ops.kv {
        Some((k, v)) => (
            k.encode(stream, ops.elem_bytes, tile.block_n).map_err(|e| name(e, "k"))?,
            v.encode(stream, ops.elem_bytes, tile.block_n).map_err(|e| name(e, "v"))?,
        ),
        None => (sys::FaTensorMap::default(), sys::FaTensorMap::default()),
    };
    Ok([q_map, k_map, v_map])
}

/// Rows of the TMA-store epilogue's box: one warp's rows (fa/hopper/epilogue.cuh).
const O_BOX_ROWS: usize = 16;

/// Runs the chosen kernel. A tensor TMA cannot address (a map error) sends `Auto` to the sm_80 kernel and
/// is the error itself for a forced `Sm90`; an O no map can address is stored with 16-byte stores instead.
pub(crate) fn run(
    launch: Launch<'_>,
    label: &str,
    stream: &Stream<'_>,
    opts: &super::PrefillOptions<'_>,
    choice: Choice,
    params: sys::FaPrefillParams,
    ops: &Operands,
) -> Result<()> {
    let Choice::Sm90(tile) = choice else { return launch.run(label, params, sys::fa_prefill) };
    let steps = opts.sm90_steps;
    match maps(stream, tile, ops) {
        Ok([q_map, k_map, v_map]) => {
            let o = ops.o.as_ref().filter(|_| steps.tma_store);
            let o_map = o.and_then(|o| o.encode(stream, ops.elem_bytes, O_BOX_ROWS).ok());
            let m_blocks = (params.seqlen_q.max(0) as usize).div_ceil(tile.block_m);
            let tiles = m_blocks * params.heads_q.max(0) as usize * params.batch.max(0) as usize;
            let ctas = if steps.persistent { persistent_ctas(tiles, multiprocessors(stream)?) } else { 0 };
            let p = sys::FaPrefillSm90Params {
                q_map,
                k_map,
                v_map,
                o_map: o_map.unwrap_or_default(),
                base: params,
                block_m: tile.block_m as i32,
                block_n: tile.block_n as i32,
                ctas: i32::try_from(ctas).unwrap_or(i32::MAX),
                o_tma: o_map.is_some() as i32,
                l2_hints: steps.l2_hints as i32,
            };
            launch.run(label, p, sys::fa_prefill_sm90)
        }
        Err(_) if opts.kernel == PrefillKernel::Auto => launch.run(label, params, sys::fa_prefill),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiles_and_names() {
        for masked in [false, true] {
            assert_eq!(Sm90Tile::for_call(64, masked), Some(Sm90Tile { block_m: 192, block_n: 128 }));
            assert_eq!(Sm90Tile::for_call(256, masked), Some(Sm90Tile { block_m: 128, block_n: 64 }));
            assert_eq!(Sm90Tile::for_call(96, masked), None);
        }
        assert_eq!(Sm90Tile::for_call(128, true), Some(Sm90Tile { block_m: 128, block_n: 128 }));
        assert_eq!(Sm90Tile::for_call(128, false), Some(Sm90Tile { block_m: 128, block_n: 176 }));
        for k in [PrefillKernel::Auto, PrefillKernel::Sm80, PrefillKernel::Sm90] {
            assert_eq!(k.name().parse::<PrefillKernel>().unwrap(), k);
        }
        assert_eq!("sm100".parse::<PrefillKernel>().unwrap_err().kind(), &ErrorKind::Usage);
    }

    /// A 16k-token non-causal prefill (B 1, 16 heads; D 128: 128 query tiles per head) launches one CTA per
    /// SM on an H100 (132) or H200 (132), not 2048, at every head dim; a call with fewer tiles than SMs one
    /// per tile.
    #[test]
    fn persistent_grid_is_the_resident_ctas() {
        let tile = Sm90Tile::for_call(128, false).unwrap();
        let tiles = (16384usize).div_ceil(tile.block_m) * 16;
        assert_eq!(tiles, 2048);
        for d in SM90_HEAD_DIMS {
            let tiles = (16384usize).div_ceil(Sm90Tile::for_call(d, false).unwrap().block_m) * 16;
            assert!(tiles > 132 * SM90_OCCUPANCY, "D {d}: {tiles} tiles");
            assert_eq!(persistent_ctas(tiles, 132), 132, "D {d}");
        }
        assert_eq!(persistent_ctas(tiles, 132), 132);
        assert_eq!(persistent_ctas(tiles, 114), 114); // H100 PCIe
        assert_eq!(persistent_ctas(40, 132), 40);
        assert_eq!(persistent_ctas(0, 132), 1);
    }

    #[test]
    fn choice_on_the_emulator() {
        let emu = crate::emu::Emulator::new();
        let s = Stream::Emu(&emu);
        let none = ScoreMod::default();
        assert_eq!(
            choose(&s, PrefillKernel::Auto, (128, 128), false, &none, Sm90Steps::default()).unwrap(),
            Choice::Sm80
        );
        assert_eq!(
            choose(&s, PrefillKernel::Sm80, (128, 128), false, &none, Sm90Steps::default()).unwrap(),
            Choice::Sm80
        );
        assert!(matches!(
            choose(&s, PrefillKernel::Sm90, (64, 64), false, &none, Sm90Steps::default()).unwrap(),
            Choice::Sm90(_)
        ));
        // D 128: 128 x 176 unmasked, 128 x 128 causal or windowed.
        let window = ScoreMod { window: Some((100, 100)), ..none };
        for (causal, sm, block_n) in [(false, &none, 176), (true, &none, 128), (false, &window, 128)] {
            let c = choose(&s, PrefillKernel::Sm90, (128, 128), causal, sm, Sm90Steps::default()).unwrap();
            assert_eq!(c, Choice::Sm90(Sm90Tile { block_m: 128, block_n }), "causal {causal}, {sm:?}");
        }
        let e = choose(&s, PrefillKernel::Sm90, (96, 96), false, &none, Sm90Steps::default()).unwrap_err();
        assert_eq!(e.kind(), &ErrorKind::Unsupported, "{e}");
        // A V head dim of its own: 192 / 128 runs 128 x 128 masked or not; other pairs (and 192 alone) are
        // Unsupported when forced and sm_80 under Auto.
        for (causal, steps) in
            [(false, Sm90Steps::default()), (true, Sm90Steps { wide_tile: false, ..Default::default() })]
        {
            let c = choose(&s, PrefillKernel::Sm90, (192, 128), causal, &none, steps).unwrap();
            assert_eq!(c, Choice::Sm90(Sm90Tile { block_m: 128, block_n: 128 }));
        }
        for pair in [(192, 192), (128, 64), (256, 128), (64, 128), (192, 64)] {
            let e = choose(&s, PrefillKernel::Sm90, pair, false, &none, Sm90Steps::default()).unwrap_err();
            assert_eq!(e.kind(), &ErrorKind::Unsupported, "{pair:?}: {e}");
            assert_eq!(
                choose(&s, PrefillKernel::Auto, pair, false, &none, Sm90Steps::default()).unwrap(),
                Choice::Sm80
            );
            assert!(!sm90_serves(pair.0, pair.1) && Sm90Tile::for_pair(pair.0, pair.1, false).is_none(), "{pair:?}");
        }
        assert!(sm90_serves(192, 128) && sm90_serves(128, 128) && !sm90_serves(192, 192));
        // The listed head dims and pairs are exactly the launcher's (every pair of supported head dims).
        for d in (crate::head_dim::MIN_HEAD_DIM..=crate::head_dim::MAX_HEAD_DIM).step_by(8) {
            for dv in (crate::head_dim::MIN_HEAD_DIM..=crate::head_dim::MAX_HEAD_DIM).step_by(8) {
                let listed =
                    if d == dv { SM90_HEAD_DIMS.contains(&d) } else { SM90_V_HEAD_DIM_PAIRS.contains(&(d, dv)) };
                assert_eq!(sm90_serves(d, dv), listed, "({d}, {dv})");
            }
        }
        // Every variant runs on the sm90 kernel; a softcap outside its range is Unsupported when forced and
        // sm_80 under Auto.
        let cap = ScoreMod { softcap: Some(30.0), window: Some((10, 0)), ..none };
        assert!(matches!(
            choose(&s, PrefillKernel::Sm90, (128, 128), false, &cap, Sm90Steps::default()).unwrap(),
            Choice::Sm90(_)
        ));
        for c in [1e-30, 1e30] {
            let far = ScoreMod { softcap: Some(c), ..none };
            let e = choose(&s, PrefillKernel::Sm90, (128, 128), false, &far, Sm90Steps::default()).unwrap_err();
            assert_eq!(e.kind(), &ErrorKind::Unsupported, "{e}");
            assert_eq!(
                choose(&s, PrefillKernel::Auto, (128, 128), false, &far, Sm90Steps::default()).unwrap(),
                Choice::Sm80
            );
        }
        assert!(SM90_SOFTCAP_RANGE.contains(&2f32.powi(-64)) && SM90_SOFTCAP_RANGE.contains(&2f32.powi(64)));
        assert!(!SM90_SOFTCAP_RANGE.contains(&(2f32.powi(64) * (1.0 + f32::EPSILON))));
        assert!(!SM90_SOFTCAP_RANGE.contains(&(2f32.powi(-64) * (1.0 - f32::EPSILON))));
    }
}
