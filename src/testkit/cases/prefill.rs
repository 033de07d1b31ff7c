//! The prefill sweep and performance shapes (shared by tests/it/prefill.rs, the runner's `report` / `run --op
//! prefill` and the benches), and the harness that runs one case: seeded inputs laid out as the case says,
//! outputs poisoned with NaN (padding included), one launch on the emulator or a GPU, and the verdict
//! against the fp64 reference under the tolerance rule of docs/semantics.md. On a GPU, [`time_case_gpu`] also
//! times a case with CUDA events over input sets rotated past L2.
//!
//! Tolerance: max|ours − ref64| ≤ 2 · max|naive − ref64| + 1e-5, naive a plain same-dtype implementation.
//! LSE: within [`lse_tolerance`] of the reference, −inf exactly where the reference row is empty. NaN never
//! passes, and every element outside the logical o / lse tensors must still be NaN after the launch.

use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::{CudaSlice, CudaStream};

use crate::dtype::{DType, Element};
use crate::emu::Emulator;
use crate::error::{Error, Result};
use crate::prefill::{prefill, prefill_varlen, PrefillKernel, PrefillOptions, Sm90Steps};
use crate::reference::{self, Arith, Comparison};
use crate::score_mod::{AlibiSlopes, ScoreMod};
use crate::tensor::{Mem, MemMut, TensorView, TensorViewMut};
use crate::testkit::cases::decode::{upload_rope, CaseRope, GpuRope, RopeViews};
use crate::testkit::cases::with_dtype;
use crate::testkit::timing::{prefill_flops, time_launches, Runs, Timing};
use crate::testkit::variants::{CaseAlibi, CaseVariants};
use crate::Stream;
use rand::Rng;

/// How a sweep case lays out its tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CaseLayout {
    /// Every tensor contiguous.
    Contiguous,
    /// q, k, v are slices of one packed `[B, T, Hq + 2·Hkv, D]` QKV tensor (needs Tq == Tk, dense) and o has
    /// padded rows: no tensor is contiguous.
    PackedQkv,
    /// Every tensor has padded head and row strides (works with Tq != Tk and varlen).
    Padded,
}

/// One configuration of the correctness sweep (shared by tests/it/prefill.rs and the runner's `report`).
#[derive(Debug, Clone, PartialEq)]
pub struct PrefillCase {
    pub dtype: DType,
    /// Dense: batch and lengths; varlen: ignored in favour of `varlen`.
    pub batch: usize,
    pub seqlen_q: usize,
    pub seqlen_k: usize,
    pub heads_q: usize,
    pub heads_kv: usize,
    /// Q's and K's head dim (Dqk).
    pub head_dim: usize,
    /// V's and O's head dim (Dv) when the case gives V one of its own (issue 27; not with
    /// [`CaseLayout::PackedQkv`]); `None`: `head_dim` ([`PrefillCase::dv`]), whatever `head_dim` is set to.
    pub head_dim_v: Option<usize>,
    pub causal: bool,
    /// Varlen: per-sequence (q rows, keys); `None` for a dense case.
    pub varlen: Option<Vec<(usize, usize)>>,
    pub layout: CaseLayout,
    /// Whether the case asks for the LSE output.
    pub with_lse: bool,
    /// Score variants (sliding window, softcap, ALiBi, sinks).
    pub variants: CaseVariants,
    /// The kernel the case runs (`Auto` unless a test or `--kernel` forces one).
    pub kernel: PrefillKernel,
    /// The sm_90a kernel's tuning steps (all on unless an A/B row turns one off).
    pub sm90_steps: Sm90Steps,
    /// Rotary embedding of q (and of k with `rope_k`), fused (`PrefillOptions::rope` and `rope_k`;
    /// [`CaseRope`]: explicit positions drawn from the seed, one per query and one per key token, or the
    /// default ones: query row i at i + Tk − Tq, key j at j). `None`: q and k are taken as already rotated.
    pub rope: Option<CaseRope>,
    /// With `rope`: k rotated too (`PrefillOptions::rope_k`, the sm_80 kernel only); false: q alone, k taken
    /// as already rotated (what the sm_90a kernel fuses).
    pub rope_k: bool,
}

impl PrefillCase {
    /// A dense, contiguous case with LSE and no variants (batch 1; set the fields for more).
    pub fn dense(dtype: DType, d: usize, causal: bool, tq: usize, tk: usize, heads: (usize, usize)) -> Self {
        Self {
            dtype,
            batch: 1,
            seqlen_q: tq,
            seqlen_k: tk,
            heads_q: heads.0,
            heads_kv: heads.1,
            head_dim: d,
            head_dim_v: None,
            causal,
            varlen: None,
            layout: CaseLayout::Contiguous,
            with_lse: true,
            variants: CaseVariants::default(),
            kernel: PrefillKernel::Auto,
            sm90_steps: Sm90Steps::default(),
            rope: None,
            rope_k: false,
        }
    }
    /// A varlen case of `seqs` (q_len, k_len) per sequence, otherwise like [`PrefillCase::dense`]: batch
    /// `seqs.len()`, and the longest sequences as `seqlen_q` / `seqlen_k` (the bounds the grid covers).
    pub fn varlen(dtype: DType, d: usize, causal: bool, heads: (usize, usize), seqs: Vec<(usize, usize)>) -> Self {
        let tq = seqs.iter().map(|s| s.0).max().unwrap_or(0);
        let tk = seqs.iter().map(|s| s.1).max().unwrap_or(0);
        Self { batch: seqs.len(), varlen: Some(seqs), ..Self::dense(dtype, d, causal, tq, tk, heads) }
    }
    /// V's and O's head dim: `head_dim_v`, else `head_dim`.
    pub fn dv(&self) -> usize {
        self.head_dim_v.unwrap_or(self.head_dim)
    }
    /// Short description for test output and report rows.
    pub fn label(&self) -> String {
        let shape = match &self.varlen {
            Some(seqs) => format!("varlen{seqs:?}"),
            None => format!("B={} Tq={} Tk={}", self.batch, self.seqlen_q, self.seqlen_k),
        };
        let variants = self.variants.label();
        let rope =
            self.rope.map_or(String::new(), |r| format!(" {} {}", r.label(), if self.rope_k { "q+k" } else { "q" }));
        let dv = if self.dv() == self.head_dim { String::new() } else { format!("/{}", self.dv()) };
        format!(
            "{}{}{}{} D={}{} {} Hq={} Hkv={} {}{:?}{}{}{}{}",
            if self.kernel == PrefillKernel::Auto { "" } else { self.kernel.name() },
            self.sm90_steps.label(),
            if self.kernel == PrefillKernel::Auto { "" } else { " " },
            self.dtype.name(),
            self.head_dim,
            dv,
            shape,
            self.heads_q,
            self.heads_kv,
            if self.causal { "causal " } else { "" },
            self.layout,
            if self.with_lse { "" } else { " no-lse" },
            if variants.is_empty() { "" } else { " " },
            variants,
            rope,
        )
    }
    /// Query rows times keys times heads: the work the case represents (for sorting / budgeting).
    pub fn score_count(&self) -> usize {
        let rows_keys: usize = match &self.varlen {
            Some(seqs) => seqs.iter().map(|&(q, k)| q * k).sum(),
            None => self.batch * self.seqlen_q * self.seqlen_k,
        };
        rows_keys * self.heads_q
    }
}

/// The sequence lengths the sweep draws from (docs/semantics.md: tile edges ±1, 1, and one long sequence).
pub const SWEEP_SEQLENS: [usize; 10] = [1, 17, 63, 64, 65, 127, 128, 129, 255, 1000];

/// The correctness sweep. `full == false`: the emulation subset — every dtype × causal × (Tq, Tk) pair of
/// [`SWEEP_SEQLENS`] below 1000 at D = 128, a rotating selection of pairs (Tq ≠ Tk both ways) at D 64 and
/// 256, three 1000-long cases, D 32/96, GQA 1:1/4:1/8:1/MQA, varlen batches with zero-length sequences,
/// non-contiguous layouts, with and without LSE — sized to emulate in well under a minute on two cores.
/// `full == true`: the GPU sweep — every (Tq, Tk) pair of [`SWEEP_SEQLENS`] for every dtype × D {64, 128,
/// 256} × causal, plus the same structural cases (about 1.3k cases; also emulates in ~75 s on two cores).
pub fn sweep_cases(full: bool) -> Vec<PrefillCase> {
    let dtypes = [DType::F16, DType::Bf16];
    let mut cases = Vec::new();
    // (Tq, Tk) pairs of the emulation subset: both tile edges, Tq != Tk both ways, 1 and 1000.
    let pairs: [(usize, usize); 12] = [
        (1, 1),
        (17, 17),
        (63, 64),
        (64, 63),
        (65, 127),
        (127, 65),
        (128, 128),
        (129, 255),
        (255, 129),
        (1, 255),
        (255, 1),
        (17, 129),
    ];
    let mut slot = 0;
    for d in [64, 128, 256] {
        for dtype in dtypes {
            for causal in [false, true] {
                if full || d == 128 {
                    // Every (Tq, Tk) pair (in emulation: without the 1000-long ones, which come below).
                    for &tq in &SWEEP_SEQLENS {
                        for &tk in &SWEEP_SEQLENS {
                            if full || (tq != 1000 && tk != 1000) {
                                cases.push(PrefillCase::dense(dtype, d, causal, tq, tk, (2, 1)));
                            }
                        }
                    }
                } else {
                    // Four pairs per (D, dtype, causal), rotating, so each pair meets both D and both
                    // causal settings.
                    for _ in 0..4 {
                        let (tq, tk) = pairs[slot % pairs.len()];
                        slot += 1;
                        cases.push(PrefillCase::dense(dtype, d, causal, tq, tk, (2, 1)));
                    }
                }
            }
        }
    }
    // Long sequences (1000 rows / keys): a few in emulation, all pairs above on the GPU.
    if !full {
        cases.push(PrefillCase::dense(DType::Bf16, 128, true, 1000, 1000, (1, 1)));
        cases.push(PrefillCase::dense(DType::F16, 64, false, 1000, 255, (1, 1)));
        cases.push(PrefillCase::dense(DType::Bf16, 256, true, 129, 1000, (1, 1)));
    }
    // D 32 and 96 (cheap extras).
    for (i, d) in [32, 96].into_iter().enumerate() {
        for causal in [false, true] {
            let dtype = dtypes[i];
            for (tq, tk) in [(65, 65), (127, 200)] {
                cases.push(PrefillCase::dense(dtype, d, causal, tq, tk, (2, 2)));
            }
        }
    }
    // GQA ratios 1:1, 4:1, 8:1 and MQA (Hkv = 1).
    for (i, heads) in [(2, 2), (4, 1), (8, 1), (16, 2), (3, 1)].into_iter().enumerate() {
        let dtype = dtypes[i % 2];
        cases.push(PrefillCase::dense(dtype, 128, i % 2 == 0, 65, 129, heads));
        cases.push(PrefillCase::dense(dtype, 64, i % 2 == 1, 129, 65, heads));
    }
    // Batches, non-contiguous layouts, no LSE.
    for (i, d) in [64, 128, 256].into_iter().enumerate() {
        let dtype = dtypes[i % 2];
        let mut c = PrefillCase::dense(dtype, d, true, 100, 100, (4, 2));
        c.batch = 2;
        c.layout = CaseLayout::PackedQkv;
        cases.push(c);
        let mut c = PrefillCase::dense(dtype, d, i != 1, 70, 150, (2, 1));
        c.batch = 3;
        c.layout = CaseLayout::Padded;
        c.with_lse = i != 2;
        cases.push(c);
        let mut c = PrefillCase::dense(dtype, d, false, 150, 70, (2, 2));
        c.batch = 2;
        c.with_lse = false;
        cases.push(c);
    }
    // Varlen: zero-length query and key sequences, Tq != Tk per sequence, ragged everywhere.
    let seqs = [
        vec![(17, 17), (0, 40), (65, 0), (100, 129), (1, 1), (64, 200)],
        vec![(129, 63), (0, 0), (33, 33), (200, 100)],
    ];
    for (i, d) in [64, 128, 256].into_iter().enumerate() {
        for causal in [false, true] {
            let dtype = dtypes[(i + causal as usize) % 2];
            let mut c = PrefillCase::dense(dtype, d, causal, 0, 0, (4, 2));
            let s = seqs[(i + causal as usize) % 2].clone();
            c.batch = s.len();
            c.seqlen_q = s.iter().map(|x| x.0).max().unwrap_or(0);
            c.seqlen_k = s.iter().map(|x| x.1).max().unwrap_or(0);
            c.varlen = Some(s);
            c.layout = if causal { CaseLayout::Padded } else { CaseLayout::Contiguous };
            cases.push(c);
        }
    }
    cases
}

/// The score-variant sweep (docs/semantics.md, "Score variants"): every variant alone — a window's left
/// bound, right bound, both, with causal; softcap; ALiBi per head and per sequence; sinks — and the
/// combinations models use: gpt-oss (causal window + sinks), Gemma 2 (causal window + softcap), and all of
/// them at once; dense (Tq = Tk and Tq ≠ Tk) and varlen (empty sequences), head dims 32 to 256, both
/// dtypes. Windows are shorter than the sequences, so tiles are skipped on both sides. Sized to emulate in
/// about a minute on two cores.
pub fn variant_sweep_cases() -> Vec<PrefillCase> {
    use crate::testkit::variants::{CaseAlibi, CaseVariants as V};
    let none = V::default();
    let variants: [(bool, V); 12] = [
        (false, V { window: Some((48, -1)), ..none }),
        (true, V { window: Some((70, 0)), ..none }),
        (false, V { window: Some((-1, 9)), ..none }),
        (false, V { window: Some((30, 25)), ..none }),
        (false, V { softcap: Some(2.0), ..none }),
        (true, V { alibi: CaseAlibi::PerHead, ..none }),
        (false, V { alibi: CaseAlibi::PerSequence, ..none }),
        (false, V { sinks: true, ..none }),
        (true, V { window: Some((64, 0)), sinks: true, ..none }),
        (true, V { window: Some((80, 0)), softcap: Some(3.0), ..none }),
        (false, V { window: Some((40, 10)), softcap: Some(4.0), alibi: CaseAlibi::PerHead, sinks: true }),
        (true, V { softcap: Some(1.5), alibi: CaseAlibi::PerSequence, sinks: true, ..none }),
    ];
    let dims = [128, 64, 256, 32, 96];
    let mut cases = Vec::new();
    for (i, &(causal, v)) in variants.iter().enumerate() {
        let dtype = if i % 2 == 0 { DType::Bf16 } else { DType::F16 };
        let d = dims[i % dims.len()];
        let (tq, tk) = [(150, 150), (100, 190), (190, 100)][i % 3];
        let mut dense = PrefillCase::dense(dtype, d, causal, tq, tk, [(2, 1), (4, 2), (2, 2)][i % 3]);
        dense.variants = v;
        dense.batch = 1 + i % 2;
        cases.push(dense);
        let other = if dtype == DType::Bf16 { DType::F16 } else { DType::Bf16 };
        let mut varlen = PrefillCase::dense(other, dims[(i + 2) % dims.len()], causal, 0, 0, (4, 2));
        let seqs = vec![(120, 130), (0, 9), (33, 0), (70, 200)];
        (varlen.batch, varlen.seqlen_q, varlen.seqlen_k) = (seqs.len(), 120, 200);
        varlen.varlen = Some(seqs);
        varlen.layout = if i % 2 == 0 { CaseLayout::Padded } else { CaseLayout::Contiguous };
        varlen.variants = v;
        cases.push(varlen);
    }
    cases
}

/// The head dims the head-dim sweeps give more than one case: each kernel width's odd members (widths
/// 64 to 256, fa/head_dim.cuh) and the model dims (Phi-2 80, 112, 160, 192, 224).
pub const HEAD_DIM_SWEEP_DIMS: [usize; 10] = [40, 72, 80, 112, 136, 160, 192, 200, 224, 248];

/// The head-dim sweep (issue 12): every supported head dim that is not a kernel width runs at a width
/// above it with predicated columns, so every one gets a small case, and [`HEAD_DIM_SWEEP_DIMS`] get
/// dense (Tq = Tk and both ways unequal, across tile edges), causal, GQA/MQA, varlen (empty sequences) and
/// variant cases, both dtypes. All Contiguous or Padded: the inputs' last row ends exactly at the end of
/// its buffer ([`PrefillFixture`] allocates no slack), so a read of a column past D is out of bounds in the
/// emulator (or reads the next head: a wrong answer). Sized to emulate in a few seconds on two cores.
pub fn head_dim_sweep_cases() -> Vec<PrefillCase> {
    use crate::testkit::variants::{CaseAlibi, CaseVariants as V};
    let dtypes = [DType::Bf16, DType::F16];
    let mut cases = Vec::new();
    for (i, &d) in HEAD_DIM_SWEEP_DIMS.iter().enumerate() {
        let dtype = dtypes[i % 2];
        let (tq, tk) = [(65, 65), (33, 97), (97, 33), (1, 64), (129, 17)][i % 5];
        let heads = [(2, 1), (4, 4), (3, 1), (4, 2), (8, 1)][i % 5];
        cases.push(PrefillCase::dense(dtype, d, i % 2 == 0, tq, tk, heads));
        let mut c = PrefillCase::dense(dtypes[(i + 1) % 2], d, i % 2 == 1, 40, 70, (2, 1));
        c.batch = 2;
        c.layout = CaseLayout::Padded;
        c.with_lse = i % 3 != 0;
        cases.push(c);
        let seqs = vec![(17, 33), (0, 5), (40, 0), (30, 70)];
        let mut v = PrefillCase::dense(dtype, d, i % 3 == 0, 40, 70, (4, 2));
        (v.batch, v.varlen) = (seqs.len(), Some(seqs));
        v.layout = if i % 2 == 0 { CaseLayout::Contiguous } else { CaseLayout::Padded };
        cases.push(v);
    }
    // Variants at a few of them: the _mod kernels' loads and stores are the plain ones'.
    let variants = [
        V { window: Some((20, 0)), sinks: true, ..Default::default() },
        V { softcap: Some(3.0), alibi: CaseAlibi::PerHead, ..Default::default() },
        V { window: Some((30, 5)), ..Default::default() },
    ];
    for (i, (d, v)) in [80, 160, 248].into_iter().zip(variants).enumerate() {
        let mut c = PrefillCase::dense(dtypes[i % 2], d, i != 2, 70, 90, (4, 2));
        c.variants = v;
        cases.push(c);
    }
    // Every other supported dim, once.
    for (i, d) in crate::head_dim::PREFILL_HEAD_DIMS.into_iter().enumerate() {
        let width = crate::head_dim::prefill_width(d).unwrap_or(d);
        if d != width && !HEAD_DIM_SWEEP_DIMS.contains(&d) {
            cases.push(PrefillCase::dense(dtypes[i % 2], d, i % 2 == 0, 17, 40, (2, 1)));
        }
    }
    cases
}

/// The head dims past the tiled kernel's (264–512: Gemma 4's global layers at 512), which prefill runs on the
/// decode kernel's streaming path (issue 27): each of 264, 320, 384, 448 and 512 dense (Tq = Tk, chunked
/// Tq < Tk and Tq > Tk, across the 16-row CTA and 16-key tile edges), batched with padded strides, varlen
/// with empty sequences (no keys at all, no rows), GQA/MQA, causal and not, every variant (window edges,
/// sinks, softcap, ALiBi per head and per sequence), with and without LSE, both dtypes. All on tight buffers
/// (a column or row past the data is out of bounds in the emulator).
pub fn wide_head_dim_cases() -> Vec<PrefillCase> {
    use crate::testkit::variants::{CaseAlibi, CaseVariants as V};
    let dtypes = [DType::Bf16, DType::F16];
    let mut cases = Vec::new();
    for (i, d) in [264, 320, 384, 448, 512].into_iter().enumerate() {
        let dtype = dtypes[i % 2];
        let (tq, tk) = [(33, 33), (17, 70), (40, 23), (1, 50), (49, 49)][i];
        let heads = [(2, 1), (4, 4), (3, 1), (4, 2), (8, 1)][i];
        cases.push(PrefillCase::dense(dtype, d, i % 2 == 0, tq, tk, heads));
        let mut c = PrefillCase::dense(dtypes[(i + 1) % 2], d, i % 2 == 1, 20, 37, (2, 1));
        (c.batch, c.layout, c.with_lse) = (2, CaseLayout::Padded, i % 3 != 0);
        cases.push(c);
        let seqs = [vec![(9, 20), (0, 5), (18, 0), (15, 31)], vec![(0, 0), (5, 5), (20, 3)]][i % 2].clone();
        let mut v = PrefillCase::varlen(dtype, d, i % 3 == 0, (4, 2), seqs);
        v.layout = if i % 2 == 0 { CaseLayout::Contiguous } else { CaseLayout::Padded };
        cases.push(v);
    }
    let variants = [
        V { window: Some((12, 0)), sinks: true, ..Default::default() },
        V { softcap: Some(3.0), alibi: CaseAlibi::PerHead, ..Default::default() },
        V { window: Some((9, 4)), alibi: CaseAlibi::PerSequence, ..Default::default() },
        V { window: Some((0, 0)), softcap: Some(10.0), sinks: true, ..Default::default() },
    ];
    for (i, (d, v)) in [512, 384, 512, 264].into_iter().zip(variants).enumerate() {
        let mut c = PrefillCase::dense(dtypes[i % 2], d, i != 2, 30, 45, (4, 2));
        (c.batch, c.variants) = (2, v);
        cases.push(c);
    }
    let mut v = PrefillCase::varlen(DType::Bf16, 512, true, (2, 1), vec![(7, 40), (25, 25), (0, 3)]);
    v.variants = V { window: Some((10, 0)), sinks: true, alibi: CaseAlibi::PerHead, ..Default::default() };
    cases.push(v);
    // No keys at all (the views with no rows: every key a hole, no K/V byte read): dense Tk = 0 with sinks,
    // varlen with total_k = 0.
    let mut none = PrefillCase::dense(DType::F16, 320, false, 5, 0, (2, 1));
    none.variants.sinks = true;
    cases.push(none);
    cases.push(PrefillCase::varlen(DType::Bf16, 448, true, (2, 2), vec![(3, 0), (0, 0), (4, 0)]));
    cases
}

/// The (Dqk, Dv) pairs the V-head-dim sweep runs (issue 27): DeepSeek-V2/V3's 192/128, and pairs of every
/// kind the sm_80 kernel serves: Dv below Dqk at a width with predicated columns (96/64 at 96, 256/128 at
/// 256), at 128 (128/64 runs at 160: the 128 kernels have none), and Dv above Dqk (64/128, 160/192).
pub const V_HEAD_DIM_PAIRS: [(usize, usize); 6] = [(192, 128), (128, 64), (96, 64), (256, 128), (64, 128), (160, 192)];

/// The V-head-dim sweep (issue 27): each pair of [`V_HEAD_DIM_PAIRS`] dense (Tq = Tk, Tq < Tk, Tq > Tk,
/// across tile edges), batched with padded strides (NaN in every V and O column past Dv and every gap),
/// varlen with empty sequences, GQA/MQA, causal and not, with and without LSE, both dtypes; variants (window
/// edges, sinks, softcap, ALiBi) at 192/128 and others; RoPE on q and k at 192/128. Every buffer tight: a V
/// column read past Dv is out of bounds in the emulator (or NaN poison), an O column stored past Dv a stray
/// write.
pub fn v_head_dim_cases() -> Vec<PrefillCase> {
    use crate::testkit::variants::{CaseAlibi, CaseVariants as V};
    let dtypes = [DType::Bf16, DType::F16];
    let mut cases = Vec::new();
    let with_dv = |c: PrefillCase, dv: usize| PrefillCase { head_dim_v: Some(dv), ..c };
    for (i, (d, dv)) in V_HEAD_DIM_PAIRS.into_iter().enumerate() {
        let dtype = dtypes[i % 2];
        let (tq, tk) = [(65, 65), (33, 97), (97, 33), (1, 64), (129, 17), (40, 40)][i];
        let heads = [(2, 1), (4, 4), (3, 1), (4, 2), (8, 1), (2, 2)][i];
        cases.push(with_dv(PrefillCase::dense(dtype, d, i % 2 == 0, tq, tk, heads), dv));
        let mut c = with_dv(PrefillCase::dense(dtypes[(i + 1) % 2], d, i % 2 == 1, 40, 70, (2, 1)), dv);
        (c.batch, c.layout, c.with_lse) = (2, CaseLayout::Padded, i % 3 != 0);
        cases.push(c);
        let seqs = [vec![(17, 33), (0, 5), (40, 0), (30, 70)], vec![(0, 0), (5, 5), (20, 3)]][i % 2].clone();
        let mut v = with_dv(PrefillCase::varlen(dtype, d, i % 3 == 0, (4, 2), seqs), dv);
        v.layout = if i % 2 == 0 { CaseLayout::Padded } else { CaseLayout::Contiguous };
        cases.push(v);
    }
    let variants = [
        V { window: Some((20, 0)), sinks: true, ..Default::default() },
        V { softcap: Some(3.0), alibi: CaseAlibi::PerHead, ..Default::default() },
        V { window: Some((30, 5)), alibi: CaseAlibi::PerSequence, ..Default::default() },
        V { window: Some((0, 0)), softcap: Some(10.0), sinks: true, ..Default::default() },
    ];
    for (i, ((d, dv), v)) in [(192, 128), (192, 128), (128, 64), (64, 128)].into_iter().zip(variants).enumerate() {
        let mut c = with_dv(PrefillCase::dense(dtypes[i % 2], d, i != 2, 70, 90, (4, 2)), dv);
        (c.batch, c.variants, c.layout) = (2, v, CaseLayout::Padded);
        cases.push(c);
    }
    let mut v = with_dv(PrefillCase::varlen(DType::Bf16, 192, true, (2, 1), vec![(7, 40), (25, 25), (0, 3)]), 128);
    v.variants = V { window: Some((10, 0)), sinks: true, alibi: CaseAlibi::PerHead, ..Default::default() };
    cases.push(v);
    // Past 256 (the decode kernel's streaming path at width 512, V's columns predicated at Dv): dense with
    // padded strides (NaN past Dv), varlen, Dv below and above Dqk, with variants.
    let mut w = with_dv(PrefillCase::dense(DType::Bf16, 320, true, 40, 50, (4, 2)), 128);
    (w.batch, w.layout, w.variants) =
        (2, CaseLayout::Padded, V { window: Some((20, 0)), sinks: true, ..Default::default() });
    cases.push(w);
    let mut w = with_dv(PrefillCase::varlen(DType::F16, 128, false, (2, 1), vec![(9, 30), (0, 4), (17, 17)]), 264);
    w.layout = CaseLayout::Padded;
    cases.push(w);
    // DeepSeek's q/k carry 64 rotary dims (here rotated in the kernel, q and k).
    let config = crate::rope::RopeConfig::new(10000.0, 64, crate::rope::RopeStyle::Neox);
    let mut r = with_dv(PrefillCase::dense(DType::Bf16, 192, true, 50, 70, (2, 1)), 128);
    (r.rope, r.rope_k) = (Some(CaseRope { config, explicit_positions: true }), true);
    cases.push(r);
    cases
}

/// The standard FlashAttention shape family for throughput: fp16 and bf16, D ∈ {64, 128, 256} with
/// Hq·D = 2048 (Hkv = Hq), B·T = 16k for T ∈ {512, …, 16k}, causal and not (72 cases); plus a GQA shape
/// (bf16, D = 128, Hq = 32, Hkv = 8, B = 4, T = 4096, causal and not).
pub fn perf_cases() -> Vec<PrefillCase> {
    let mut cases = Vec::new();
    for dtype in [DType::Bf16, DType::F16] {
        for d in [64, 128, 256] {
            for causal in [false, true] {
                for t in [512, 1024, 2048, 4096, 8192, 16384] {
                    let heads = 2048 / d;
                    let mut c = PrefillCase::dense(dtype, d, causal, t, t, (heads, heads));
                    c.batch = 16384 / t;
                    cases.push(c);
                }
            }
        }
    }
    for causal in [false, true] {
        let mut c = PrefillCase::dense(DType::Bf16, 128, causal, 4096, 4096, (32, 8));
        c.batch = 4;
        cases.push(c);
    }
    cases
}

// ---------------------------------------------------------------------------------------------- fixture

/// LSE tolerance (absolute, natural log): the kernel's LSE is fp32 from fp32 scores, ~1e-6 off in practice;
/// a wrong mask or a missed tile moves it by far more. Large scores add their fp32 rounding: see
/// [`lse_tolerance`].
pub const LSE_ATOL: f64 = 1e-4;

/// The LSE tolerance of a result: [`LSE_ATOL`] plus 16u · max |LSE| (u = 2^-24), the fp32 rounding of the
/// score, the max and the final `(m + log2 l) · ln 2` when the scores are large (scale 3, |q|, |k| ~ 8).
pub fn lse_tolerance(reference_lse: &[f64]) -> f64 {
    let max = reference_lse.iter().filter(|x| x.is_finite()).fold(0.0f64, |a, x| a.max(x.abs()));
    LSE_ATOL + 16.0 * max / (1u64 << 24) as f64
}

/// Where a logical tensor lives in its buffer: buffer index, element offset of index 0, shape and strides
/// `[B, T, H, D]` (a varlen tensor has B = 1 and T = the packed total).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Place {
    pub buf: usize,
    pub offset: usize,
    pub shape: [usize; 4],
    pub strides: [i64; 4],
}

impl Place {
    /// Element index of `idx` in the buffer.
    pub fn at(&self, idx: [usize; 4]) -> usize {
        self.offset + (0..4).map(|i| idx[i] as i64 * self.strides[i]).sum::<i64>() as usize
    }
    /// Buffer length that holds the view (largest offset + 1).
    pub fn end(&self) -> usize {
        if self.shape.contains(&0) {
            return self.offset;
        }
        self.at(self.shape.map(|s| s - 1)) + 1
    }
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
    /// The view without the batch dimension (varlen calls).
    fn dims3(&self) -> ([usize; 3], [i64; 3]) {
        ([self.shape[1], self.shape[2], self.shape[3]], [self.strides[1], self.strides[2], self.strides[3]])
    }
}

/// Contiguous strides with `pad` extra elements after every row of each dimension above the innermost
/// (pad a multiple of 8 keeps 16-byte alignment).
fn padded_strides<const N: usize>(shape: [usize; N], pad: usize) -> [i64; N] {
    let mut st = [0i64; N];
    let mut acc = 1i64;
    for d in (0..N).rev() {
        st[d] = acc;
        acc = acc * shape[d].max(1) as i64 + if d + 1 < N && d > 0 { pad as i64 } else { 0 };
        if d == N - 1 {
            acc += pad as i64;
        }
    }
    st
}

/// Elements per independently seeded chunk of a tensor's random values (so large fixtures fill in parallel
/// and the data does not depend on the thread count).
const FILL_CHUNK: usize = 1 << 18;

/// `n` values `mean + U(-1, 1) · spread` in the element type, logical order, chunk c of tensor `tag` seeded
/// from (seed, tag, c).
fn random_values<T: Element>(n: usize, mean: f64, spread: f64, seed: u64, tag: u64) -> Vec<T> {
    let mut out = vec![T::default(); n];
    let fill = |c: usize, chunk: &mut [T]| {
        let mut rng = crate::testkit::seed::rng(crate::testkit::seed::case_seed(
            seed ^ tag.wrapping_mul(0xd1b5_4a32_d192_ed03),
            c as u64,
        ));
        for x in chunk {
            *x = T::from_f64(mean + rng.random_range(-1.0..1.0) * spread);
        }
    };
    let threads = std::thread::available_parallelism().map_or(1, |p| p.get()).min(n.div_ceil(FILL_CHUNK)).max(1);
    if threads == 1 {
        out.chunks_mut(FILL_CHUNK).enumerate().for_each(|(c, ch)| fill(c, ch));
    } else {
        let chunks: Vec<(usize, &mut [T])> = out.chunks_mut(FILL_CHUNK).enumerate().collect();
        let per = chunks.len().div_ceil(threads);
        let mut groups: Vec<Vec<(usize, &mut [T])>> = Vec::new();
        let mut it = chunks.into_iter().peekable();
        while it.peek().is_some() {
            groups.push(it.by_ref().take(per).collect());
        }
        std::thread::scope(|s| {
            for g in groups {
                s.spawn(move || g.into_iter().for_each(|(c, ch)| fill(c, ch)));
            }
        });
    }
    out
}

/// One case's host data: the input buffers (q, k, v may share one), where each tensor lives in them, the
/// output layouts, and cu_seqlens for a varlen case. Values: q = 0.2 + U(-1.7, 1.7), k = U(-1.7, 1.7)
/// (scores of either sign), v = 0.7 + U(-1.7, 1.7) (so O is not ~ 0); everything outside the tensors NaN.
#[derive(Debug, Clone)]
pub struct PrefillFixture<T> {
    pub case: PrefillCase,
    pub inputs: PrefillInputs,
    pub seed: u64,
    pub bufs: Vec<Vec<T>>,
    pub q: Place,
    pub k: Place,
    pub v: Place,
    /// In its own buffer of `o_len` elements.
    pub o: Place,
    pub o_len: usize,
    /// LSE buffer length (0 when there are no rows) and strides of the `[B, Hq, Tq]` LSE (varlen: B = 1,
    /// Tq = total_q).
    pub lse_len: usize,
    pub lse_strides: [i64; 3],
    pub cu_q: Vec<i32>,
    pub cu_k: Vec<i32>,
    /// ALiBi slopes (`[Hq]` or `[B, Hq]`) and sinks (`[Hq]`) of the case's variants (empty when unused).
    pub alibi_slopes: Vec<f32>,
    pub sinks: Vec<f32>,
    /// The case's RoPE table (poisoned outside the rows its positions address) and its explicit positions,
    /// one per query token and one per key token in packed order (`b·Tq + i` dense, `cu_seqlens_q[b] + i`
    /// varlen; keys alike); empty when the case uses the default ones or has no RoPE.
    pub rope_table: Option<crate::testkit::rope::PoisonedTable>,
    pub rope_q_positions: Vec<i32>,
    pub rope_k_positions: Vec<i32>,
}

/// How a case's values are drawn, beyond its shape and layout ([`PrefillCase`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PrefillInputs {
    /// The softmax scale passed to the kernel; `None`: its default 1/sqrt(D).
    pub scale: Option<f32>,
    /// Half-width `m` of the uniform draws: q = 0.2·m/1.7 + U(-m, m), k = U(-m, m), v = 0.7·m/1.7 + U(-m, m);
    /// 1.7 by default. Large values with a large scale make the softmax sharp.
    pub magnitude: f64,
}

impl Default for PrefillInputs {
    fn default() -> Self {
        Self { scale: None, magnitude: 1.7 }
    }
}

impl<T: Element> PrefillFixture<T> {
    /// Builds the case's inputs from `seed` with the default [`PrefillInputs`]. Errors: a packed-QKV layout
    /// with Tq ≠ Tk, or sizes whose element counts overflow.
    pub fn new(case: &PrefillCase, seed: u64) -> Result<Self> {
        Self::with_inputs(case, &PrefillInputs::default(), seed)
    }

    /// [`PrefillFixture::new`] with values drawn as `inputs` says.
    pub fn with_inputs(case: &PrefillCase, inputs: &PrefillInputs, seed: u64) -> Result<Self> {
        let (hq, hkv, d, dv) = (case.heads_q, case.heads_kv, case.head_dim, case.dv());
        let (b, tq, tk, cu_q, cu_k) = match &case.varlen {
            Some(seqs) => {
                let (mut cq, mut ck) = (vec![0i32], vec![0i32]);
                let (mut sq, mut sk) = (0usize, 0usize);
                for &(a, c) in seqs {
                    sq += a;
                    sk += c;
                    cq.push(crate::error::to_i32("cu_seqlens_q", sq)?);
                    ck.push(crate::error::to_i32("cu_seqlens_k", sk)?);
                }
                (1, sq, sk, cq, ck)
            }
            None => (case.batch, case.seqlen_q, case.seqlen_k, vec![], vec![]),
        };
        for (name, shape) in [("q", [b, tq, hq, d]), ("k", [b, tk, hkv, d])] {
            let n = shape.iter().try_fold(1usize, |a, &x| a.checked_mul(x));
            if n.and_then(|n| n.checked_mul(4)).is_none_or(|n| n > isize::MAX as usize) {
                return Err(Error::overflow(name, format!("shape {shape:?} is too large")));
            }
        }
        let (q_shape, k_shape) = ([b, tq, hq, d], [b, tk, hkv, d]);
        let (v_shape, o_shape) = ([b, tk, hkv, dv], [b, tq, hq, dv]);
        let (q, k, v, o) = match case.layout {
            CaseLayout::Contiguous | CaseLayout::Padded => {
                let pad = if case.layout == CaseLayout::Padded { 8 } else { 0 };
                let mk = |shape: [usize; 4], buf: usize, pad: usize| Place {
                    buf,
                    offset: pad,
                    shape,
                    strides: padded_strides(shape, pad),
                };
                (mk(q_shape, 0, pad), mk(k_shape, 1, 2 * pad), mk(v_shape, 2, 3 * pad), mk(o_shape, 0, pad))
            }
            CaseLayout::PackedQkv => {
                if tq != tk {
                    return Err(Error::shape("q", format!("packed QKV needs Tq == Tk, got {tq} and {tk}")));
                }
                if dv != d {
                    return Err(Error::shape("v", format!("packed QKV needs one head dim, got {d} and {dv}")));
                }
                let hh = hq + 2 * hkv;
                let st = [(tq * hh * d) as i64, (hh * d) as i64, d as i64, 1];
                let q = Place { buf: 0, offset: 0, shape: q_shape, strides: st };
                let k = Place { buf: 0, offset: hq * d, shape: k_shape, strides: st };
                let v = Place { buf: 0, offset: (hq + hkv) * d, shape: k_shape, strides: st };
                let o = Place { buf: 0, offset: 0, shape: q_shape, strides: padded_strides(q_shape, 16) };
                (q, k, v, o)
            }
        };
        let n_bufs = if case.layout == CaseLayout::PackedQkv { 1 } else { 3 };
        let mut bufs: Vec<Vec<T>> = (0..n_bufs)
            .map(|i| {
                // No slack: the last row of the last head ends the allocation, so that a kernel reading a
                // column past D (or a row past the end) is out of bounds in the emulator.
                // (An empty tensor still gets a real, aligned allocation.)
                let len = [q, k, v].iter().filter(|p| p.buf == i).map(|p| p.end()).max().unwrap_or(0).max(8);
                // Padding and gaps hold the poison (FA_POISON, NaN by default: crate::poison).
                vec![crate::testkit::poison::hidden::<T>(); len]
            })
            .collect();
        let m = inputs.magnitude;
        for (tag, (place, mean)) in [(q, 0.2 * m / 1.7), (k, 0.0), (v, 0.7 * m / 1.7)].into_iter().enumerate() {
            let vals = random_values::<T>(place.numel(), mean, m, seed, tag as u64);
            let buf = &mut bufs[place.buf];
            if place.strides == padded_strides(place.shape, 0) {
                buf[place.offset..place.offset + vals.len()].copy_from_slice(&vals);
            } else {
                let [nb, nt, nh, nd] = place.shape;
                let mut it = vals.into_iter();
                for ib in 0..nb {
                    for itk in 0..nt {
                        for ih in 0..nh {
                            let row = place.at([ib, itk, ih, 0]);
                            for (x, val) in buf[row..row + nd].iter_mut().zip(it.by_ref()) {
                                *x = val;
                            }
                        }
                    }
                }
            }
        }
        let o_len = o.end() + 8;
        let lse_strides = padded_strides([b, hq, tq], if case.layout == CaseLayout::Padded { 4 } else { 0 });
        let lse_len = if tq == 0 || b == 0 || hq == 0 {
            0
        } else {
            ((b - 1) as i64 * lse_strides[0] + (hq - 1) as i64 * lse_strides[1] + tq as i64) as usize + 4
        };
        let batch = case.varlen.as_ref().map_or(case.batch, |s| s.len());
        // RoPE: explicit positions drawn after everything else (the other inputs do not depend on them); the
        // table covers the longest sequence's default positions.
        let (mut rope_q_positions, mut rope_k_positions) = (vec![], vec![]);
        if case.rope.is_some_and(|r| r.explicit_positions) {
            let mut rng = crate::testkit::seed::rng(seed ^ 0x6f9e_2800);
            let mut draw =
                |n: usize| -> Vec<i32> { (0..n).map(|_| rng.random_range(0..CaseRope::MAX_POS as i32)).collect() };
            rope_q_positions = draw(b * tq);
            rope_k_positions = draw(b * tk);
        }
        Ok(Self {
            alibi_slopes: case.variants.slopes(batch, hq),
            sinks: case.variants.sinks(hq, seed),
            case: case.clone(),
            inputs: *inputs,
            seed,
            bufs,
            q,
            k,
            v,
            o,
            o_len,
            lse_len,
            lse_strides,
            rope_table: case
                .rope
                .map(|r| {
                    let (q, k) = rope_token_positions(case, &rope_q_positions, &rope_k_positions);
                    // The rows k's positions address stay poisoned when only q rotates.
                    let used: Vec<i64> = q.into_iter().chain(k.into_iter().filter(|_| case.rope_k)).collect();
                    let max_pos = CaseRope::MAX_POS.max(tq.max(tk) + 1);
                    crate::testkit::rope::PoisonedTable::new(&r.config, max_pos, &used)
                })
                .transpose()?,
            rope_q_positions,
            rope_k_positions,
            cu_q,
            cu_k,
        })
    }

    /// The position of every query token and every key token (packed order) the case rotates them at:
    /// its explicit ones, or the defaults (query row i at i + Tk − Tq, key j at j, per sequence).
    pub fn rope_positions(&self) -> (Vec<i64>, Vec<i64>) {
        rope_token_positions(&self.case, &self.rope_q_positions, &self.rope_k_positions)
    }

    /// Rotates `x` (rows of D values; `heads` rows per token, from token `first` on) as the kernel rotates
    /// q or k (fp32 from the table, rounded to the dtype) at `positions[first + row / heads]`. Nothing
    /// without RoPE.
    fn rotate(&self, x: &mut [f64], heads: usize, positions: &[i64]) {
        if let (Some(r), Some(t)) = (&self.case.rope, &self.rope_table) {
            let table = t.reference(r.config.rotary_dim, r.config.style);
            table.rotate_lowp(x, self.case.head_dim, heads, positions, self.case.dtype);
        }
    }

    /// A tensor's values in logical `[B, T, H, D]` order, as f64 (exact).
    pub fn logical(&self, place: &Place) -> Vec<f64> {
        gather(&self.bufs[place.buf], place)
    }

    /// Index of LSE element (b, h, t) in the LSE buffer.
    pub fn lse_at(&self, b: usize, h: usize, t: usize) -> usize {
        (b as i64 * self.lse_strides[0] + h as i64 * self.lse_strides[1] + t as i64) as usize
    }

    /// The kernel's output o in logical `[B, Tq, Hq, D]` order (varlen: `[total_q, Hq, D]`).
    pub fn logical_o(&self, out: &PrefillOutputs<T>) -> Vec<f64> {
        gather(&out.o, &self.o)
    }

    /// The kernel's LSE in logical `[B, Hq, Tq]` order (varlen: `[Hq, total_q]`), if the case asked for it.
    pub fn logical_lse(&self, out: &PrefillOutputs<T>) -> Option<Vec<f32>> {
        let lse = out.lse.as_ref()?;
        let [nb, tq, hq, _] = self.q.shape;
        let mut v = Vec::with_capacity(nb * hq * tq);
        for b in 0..nb {
            for h in 0..hq {
                v.extend((0..tq).map(|t| lse[self.lse_at(b, h, t)]));
            }
        }
        Some(v)
    }

    /// The kernel's scale (fp32) as the reference uses it.
    pub fn scale(&self) -> f64 {
        f64::from(self.inputs.scale.unwrap_or((1.0 / (self.case.head_dim as f64).sqrt()) as f32))
    }

    /// Compares one launch's raw outputs with the fp64 reference (and the naive same-dtype one) under the
    /// tolerance rule, and checks that nothing outside the logical o / lse was written.
    pub fn evaluate(&self, out: &PrefillOutputs<T>) -> Result<CaseOutcome> {
        let c = &self.case;
        let (hq, hkv, d, dv) = (c.heads_q, c.heads_kv, c.head_dim, c.dv());
        let scale = self.scale();
        let (mut qv, mut kv, vv) = (self.logical(&self.q), self.logical(&self.k), self.logical(&self.v));
        // RoPE: the reference attends over q and k rotated as the kernel rotates them.
        let (q_pos, k_pos) = self.rope_positions();
        self.rotate(&mut qv, hq, &q_pos);
        if c.rope_k {
            self.rotate(&mut kv, hkv, &k_pos);
        }
        let (slopes, sinks) = self.variant_values();
        let var = c.variants.reference(&slopes, &sinks);
        let (exact, naive) = match &c.varlen {
            None => {
                let mut p = reference::Problem::new(c.batch, hq, hkv, c.seqlen_q, c.seqlen_k, d, c.causal);
                (p.scale, p.head_dim_v) = (scale, dv);
                let exact = reference::dense(&p, &var, Arith::F64, &qv, &kv, &vv)?;
                (exact, reference::dense(&p, &var, Arith::Lowp(c.dtype), &qv, &kv, &vv)?.out)
            }
            Some(_) => {
                let (cq, ck) = (&self.cu_q[..], &self.cu_k[..]);
                let dims = (d, dv);
                let exact = reference::varlen(hq, hkv, dims, c.causal, scale, &var, Arith::F64, cq, ck, &qv, &kv, &vv)?;
                let lowp = Arith::Lowp(c.dtype);
                let naive = reference::varlen(hq, hkv, dims, c.causal, scale, &var, lowp, cq, ck, &qv, &kv, &vv)?.out;
                (exact, naive)
            }
        };
        let ours = self.logical_o(out);
        let nan_o = ours.iter().filter(|x| x.is_nan()).count();
        let bound = exact.out_bound(Some(c.dtype), Some(c.dtype));
        let out_cmp = reference::compare_bounded(&ours, &exact.out, &naive, &bound);
        let lse_cmp = self.logical_lse(out).map(|l| {
            let l: Vec<f64> = l.iter().map(|&x| x as f64).collect();
            reference::compare_lse(&l, &exact.lse, lse_tolerance(&exact.lse))
        });
        let rows = self.q.shape[0] * self.q.shape[1] * hq;
        Ok(CaseOutcome {
            seed: self.seed,
            out: out_cmp,
            lse: lse_cmp,
            nan_o,
            stray_o: self.stray_o(out),
            stray_lse: self.stray_lse(out),
            rows_checked: rows,
            rows_total: rows,
            launch_secs: out.launch_secs,
        })
    }

    /// Like [`evaluate`](Self::evaluate) for shapes too large for a full fp64 reference: `samples` (query
    /// row, head) pairs drawn from the seed are compared (each against the reference of its own visible
    /// keys, the same tolerance rule over the sampled rows), and all of o must be free of NaN. Dense only.
    pub fn evaluate_sampled(&self, out: &PrefillOutputs<T>, samples: usize) -> Result<CaseOutcome> {
        let c = &self.case;
        if c.varlen.is_some() {
            return Err(Error::unsupported("case", "sampled evaluation of a varlen case"));
        }
        let (hq, hkv, d, dv) = (c.heads_q, c.heads_kv, c.head_dim, c.dv());
        let (b, tq, tk) = (c.batch, c.seqlen_q, c.seqlen_k);
        let rows = b * tq * hq;
        let group = hq / hkv.max(1);
        let mut rng = crate::testkit::seed::rng(self.seed ^ 0x5a3d_1e5a);
        let picks: Vec<(usize, usize, usize)> = if rows == 0 {
            vec![]
        } else {
            (0..samples).map(|_| (rng.random_range(0..b), rng.random_range(0..tq), rng.random_range(0..hq))).collect()
        };
        let scale = self.scale();
        let lse = out.lse.as_deref();
        let (slopes, sinks) = self.variant_values();
        let var = c.variants.reference(&slopes, &sinks);
        let (q_pos, k_pos) = self.rope_positions();
        // Per sampled row: ours, reference, naive, bound (D values each), our LSE, the reference LSE.
        type SampledRow = (Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>, f64, f64);
        let results: Vec<Result<SampledRow>> = parallel_map(&picks, |&(ib, it, ih)| {
            let (lo, hi) = var.visible_range(c.causal, tq, tk, it);
            let kh = ih / group.max(1);
            let mut qrow = gather(
                &self.bufs[self.q.buf],
                &Place { offset: self.q.at([ib, it, ih, 0]), shape: [1, 1, 1, d], ..self.q },
            );
            self.rotate(&mut qrow, 1, &q_pos[ib * tq + it..][..1]);
            // Only this row's KV head and visible keys are gathered; the rest of the sequence stays 0 (never read).
            let sub = |p: &Place, d: usize| {
                let mut rows = vec![0.0; tk * d];
                let seen = gather(
                    &self.bufs[p.buf],
                    &Place { offset: p.at([ib, lo, kh, 0]), shape: [1, hi - lo, 1, d], ..*p },
                );
                rows[lo * d..hi * d].copy_from_slice(&seen);
                rows
            };
            let (mut krows, vrows) = (sub(&self.k, d), sub(&self.v, dv));
            if c.rope_k {
                self.rotate(&mut krows[lo * d..hi * d], 1, &k_pos[ib * tk + lo..ib * tk + hi]);
            }
            let mut p = reference::Problem::new(b, group, 1, tq, tk, d, c.causal);
            (p.scale, p.head_dim_v) = (scale, dv);
            // Head ih of the full problem is head ih % group of this one-KV-head view (same slope and sink
            // through a per-row variant view).
            let (row_slopes, row_sinks);
            let mut row_var = var;
            if var.alibi.is_some() {
                row_slopes = vec![var_slope(&slopes, ib, ih, hq); group];
                row_var.alibi = Some(&row_slopes);
            }
            if var.sinks.is_some() {
                row_sinks = vec![sinks[ih]; group];
                row_var.sinks = Some(&row_sinks);
            }
            let at_row = (ib, it, ih % group);
            let exact = reference::dense_row(&p, &row_var, Arith::F64, &qrow, &krows, &vrows, at_row)?;
            let naive = reference::dense_row(&p, &row_var, Arith::Lowp(c.dtype), &qrow, &krows, &vrows, at_row)?.out;
            let at = self.o.at([ib, it, ih, 0]);
            let ours: Vec<f64> = out.o[at..at + dv].iter().map(|x| x.to_f64()).collect();
            let our_lse = lse.map_or(f64::NAN, |l| l[self.lse_at(ib, ih, it)] as f64);
            let bound = exact.out_bound(Some(c.dtype), Some(c.dtype));
            Ok((ours, exact.out, naive, bound, our_lse, exact.lse[0]))
        });
        let (mut ours, mut exact, mut naive, mut bound, mut ol, mut el) =
            (vec![], vec![], vec![], vec![], vec![], vec![]);
        for r in results {
            let (o, e, n, bd, l, x) = r?;
            ours.extend(o);
            exact.extend(e);
            naive.extend(n);
            bound.extend(bd);
            ol.push(l);
            el.push(x);
        }
        let nan_o = gather(&out.o, &self.o).iter().filter(|x| x.is_nan()).count();
        Ok(CaseOutcome {
            seed: self.seed,
            out: reference::compare_bounded(&ours, &exact, &naive, &bound),
            lse: lse.map(|_| reference::compare_lse(&ol, &el, lse_tolerance(&el))),
            nan_o,
            stray_o: 0,
            stray_lse: 0,
            rows_checked: picks.len(),
            rows_total: rows,
            launch_secs: out.launch_secs,
        })
    }

    /// Elements of the o buffer outside the logical tensor that are no longer NaN.
    fn stray_o(&self, out: &PrefillOutputs<T>) -> usize {
        let mut written = vec![false; out.o.len()];
        let [nb, tq, hq, d] = self.o.shape;
        for b in 0..nb {
            for t in 0..tq {
                for h in 0..hq {
                    let at = self.o.at([b, t, h, 0]);
                    written[at..at + d].iter_mut().for_each(|w| *w = true);
                }
            }
        }
        out.o.iter().zip(&written).filter(|(v, w)| !**w && !v.to_f64().is_nan()).count()
    }

    fn stray_lse(&self, out: &PrefillOutputs<T>) -> usize {
        let Some(lse) = &out.lse else { return 0 };
        let mut written = vec![false; lse.len()];
        let [nb, tq, hq, _] = self.q.shape;
        for b in 0..nb {
            for h in 0..hq {
                for t in 0..tq {
                    written[self.lse_at(b, h, t)] = true;
                }
            }
        }
        lse.iter().zip(&written).filter(|(v, w)| !**w && !v.is_nan()).count()
    }

    /// The ALiBi slopes and sinks as the reference takes them (f64).
    pub fn variant_values(&self) -> (Vec<f64>, Vec<f64>) {
        let wide = |x: &[f32]| x.iter().map(|&v| f64::from(v)).collect::<Vec<f64>>();
        (wide(&self.alibi_slopes), wide(&self.sinks))
    }

    /// Prefill FLOPs of the case (docs/semantics.md; per sequence for varlen).
    pub fn flops(&self) -> f64 {
        let c = &self.case;
        // 2·Tq·Tk·Dqk for Q Kᵀ and 2·Tq·Tk·Dv for P V: the formula's D is their mean (both multiples of 8).
        let d = (c.head_dim + c.dv()) / 2;
        match &c.varlen {
            None => prefill_flops(c.batch, c.heads_q, c.seqlen_q, c.seqlen_k, d, c.causal),
            Some(seqs) => seqs.iter().map(|&(q, k)| prefill_flops(1, c.heads_q, q, k, d, c.causal)).sum(),
        }
    }
}

fn gather<T: Element>(buf: &[T], p: &Place) -> Vec<f64> {
    let [nb, nt, nh, nd] = p.shape;
    let mut v = Vec::with_capacity(p.numel());
    for b in 0..nb {
        for t in 0..nt {
            for h in 0..nh {
                let at = p.at([b, t, h, 0]);
                v.extend(buf[at..at + nd].iter().map(|x| x.to_f64()));
            }
        }
    }
    v
}

/// The slope of head h of sequence b in a slopes array of `[Hq]` or `[B·Hq]`.
fn var_slope(slopes: &[f64], b: usize, h: usize, hq: usize) -> f64 {
    if slopes.len() == hq {
        slopes[h]
    } else {
        slopes[b * hq + h]
    }
}

/// `f` over `items` on all cores, results in order.
fn parallel_map<I: Sync, R: Send>(items: &[I], f: impl Fn(&I) -> R + Sync) -> Vec<R> {
    let threads = std::thread::available_parallelism().map_or(1, |p| p.get()).clamp(1, items.len().max(1));
    let per = items.len().div_ceil(threads).max(1);
    std::thread::scope(|s| {
        let handles: Vec<_> = items.chunks(per).map(|ch| s.spawn(|| ch.iter().map(&f).collect::<Vec<R>>())).collect();
        handles.into_iter().flat_map(|h| h.join().unwrap_or_default()).collect()
    })
}

/// Raw outputs of one launch: the o buffer (`o_len` elements), the LSE buffer (`lse_len`, when the case asks
/// for it), and the host wall-clock time of the launch (the emulation time on the emulator).
#[derive(Debug, Clone)]
pub struct PrefillOutputs<T> {
    pub o: Vec<T>,
    pub lse: Option<Vec<f32>>,
    pub launch_secs: f64,
}

/// The verdict on one case.
#[derive(Debug, Clone)]
pub struct CaseOutcome {
    pub seed: u64,
    /// O against the fp64 reference under the tolerance rule.
    pub out: Comparison,
    /// LSE against the reference (within [`lse_tolerance`]; −inf must match exactly), when the case has an LSE.
    pub lse: Option<Comparison>,
    /// NaN elements in the logical o.
    pub nan_o: usize,
    /// Elements outside the logical o / lse (padding, gaps) that were written (no longer NaN).
    pub stray_o: usize,
    pub stray_lse: usize,
    /// (query row, head) pairs compared, of all of them (fewer for a sampled evaluation).
    pub rows_checked: usize,
    pub rows_total: usize,
    pub launch_secs: f64,
}

impl CaseOutcome {
    pub fn passed(&self) -> bool {
        self.out.passed
            && self.lse.as_ref().is_none_or(|l| l.passed)
            && self.nan_o == 0
            && self.stray_o + self.stray_lse == 0
    }
    pub fn sampled(&self) -> bool {
        self.rows_checked < self.rows_total
    }
    /// One line: errors, tolerance, and what failed.
    pub fn summary(&self) -> String {
        let mut s = format!(
            "max|o-ref| {:.3e} (naive {:.3e}, tolerance {:.3e}; err/bound {:.2}), rel-L2 {:.3e}",
            self.out.max_abs_err,
            self.out.naive_max_abs_err,
            self.out.tolerance,
            self.out.bound_ratio,
            self.out.rel_l2_err
        );
        if let Some(l) = &self.lse {
            s += &format!(", max|lse-ref| {:.3e}", l.max_abs_err);
        }
        if self.sampled() {
            s += &format!(", {} of {} rows sampled", self.rows_checked, self.rows_total);
        }
        if self.nan_o > 0 {
            s += &format!(", {} NaN in o", self.nan_o);
        }
        if self.stray_o + self.stray_lse > 0 {
            s += &format!(
                ", wrote outside the output tensors: {} o elements, {} lse elements",
                self.stray_o, self.stray_lse
            );
        }
        s
    }
}

// ---------------------------------------------------------------------------------------------- running

/// The views of one launch, dense or varlen.
enum CaseViews<'a, T> {
    Dense {
        q: TensorView<'a, T, 4>,
        k: TensorView<'a, T, 4>,
        v: TensorView<'a, T, 4>,
        o: TensorViewMut<'a, T, 4>,
        lse: Option<TensorViewMut<'a, f32, 3>>,
    },
    Varlen {
        q: TensorView<'a, T, 3>,
        k: TensorView<'a, T, 3>,
        v: TensorView<'a, T, 3>,
        cu_q: TensorView<'a, i32, 1>,
        cu_k: TensorView<'a, i32, 1>,
        o: TensorViewMut<'a, T, 3>,
        lse: Option<TensorViewMut<'a, f32, 2>>,
    },
}

impl<'a, T: Element> CaseViews<'a, T> {
    /// The views of `f`'s case over its memory, on either backend: `input(p)` is the memory of input place
    /// `p` from its offset on, `o` the output's from `f.o.offset`, `lse` the LSE's, `cu()` cu_seqlens q and k.
    fn new(
        f: &PrefillFixture<T>,
        input: impl Fn(&Place) -> Mem<'a, T>,
        o: MemMut<'a, T>,
        lse: MemMut<'a, f32>,
        cu: impl FnOnce() -> [Mem<'a, i32>; 2],
    ) -> Result<Self> {
        let c = &f.case;
        Ok(match &c.varlen {
            None => {
                let v4 = |p: &Place| TensorView::new(input(p), p.shape)?.with_strides(p.strides);
                let lse = match c.with_lse {
                    true => {
                        Some(TensorViewMut::new(lse, [c.batch, c.heads_q, c.seqlen_q])?.with_strides(f.lse_strides)?)
                    }
                    false => None,
                };
                let o = TensorViewMut::new(o, f.o.shape)?.with_strides(f.o.strides)?;
                CaseViews::Dense { q: v4(&f.q)?, k: v4(&f.k)?, v: v4(&f.v)?, o, lse }
            }
            Some(_) => {
                let v3 = |p: &Place| {
                    let (s, st) = p.dims3();
                    TensorView::new(input(p), s)?.with_strides(st)
                };
                let (os, ost) = f.o.dims3();
                let lse = match c.with_lse {
                    true => {
                        Some(TensorViewMut::new(lse, [c.heads_q, f.q.shape[1]])?.with_strides([f.lse_strides[1], 1])?)
                    }
                    false => None,
                };
                let [cu_q, cu_k] = cu();
                CaseViews::Varlen {
                    q: v3(&f.q)?,
                    k: v3(&f.k)?,
                    v: v3(&f.v)?,
                    cu_q: TensorView::new(cu_q, [f.cu_q.len()])?,
                    cu_k: TensorView::new(cu_k, [f.cu_k.len()])?,
                    o: TensorViewMut::new(o, os)?.with_strides(ost)?,
                    lse,
                }
            }
        })
    }
}

/// The views of a case's ALiBi slopes and sinks, on the launch's backend.
#[derive(Default)]
pub(crate) struct VariantViews<'a> {
    pub heads: Option<TensorView<'a, f32, 1>>,
    pub per_sequence: Option<TensorView<'a, f32, 2>>,
    pub sinks: Option<TensorView<'a, f32, 1>>,
}

impl<'a> VariantViews<'a> {
    /// Views of `slopes` / `sinks` (laid out as [`CaseVariants::slopes`] / [`CaseVariants::sinks`] make
    /// them) through `view`, which wraps a prefix of a buffer in a 1-D view.
    pub(crate) fn new(
        v: &CaseVariants,
        batch: usize,
        heads_q: usize,
        view: impl Fn(bool, usize) -> Result<TensorView<'a, f32, 1>>,
    ) -> Result<Self> {
        let mut out = Self::default();
        match v.alibi {
            CaseAlibi::None => {}
            CaseAlibi::PerHead => out.heads = Some(view(false, heads_q)?),
            CaseAlibi::PerSequence => {
                let flat = view(false, batch * heads_q)?;
                out.per_sequence = Some(match flat.mem {
                    crate::tensor::Mem::Host(h) => TensorView::host(h, [batch, heads_q])?,
                    crate::tensor::Mem::Gpu(g) => TensorView::gpu(g, [batch, heads_q])?,
                    crate::tensor::Mem::Device(_) => return Err(Error::usage("device-pointer slopes in a case")),
                });
            }
        }
        if v.sinks {
            out.sinks = Some(view(true, heads_q)?);
        }
        Ok(out)
    }

    /// The call's score variants.
    pub(crate) fn score_mod(&'a self, v: &CaseVariants) -> ScoreMod<'a> {
        ScoreMod {
            window: v.window,
            softcap: v.softcap,
            alibi_slopes: match (&self.heads, &self.per_sequence) {
                (Some(h), _) => Some(AlibiSlopes::PerHead(h)),
                (None, Some(b)) => Some(AlibiSlopes::PerSequence(b)),
                (None, None) => None,
            },
            sinks: self.sinks.as_ref(),
        }
    }
}

/// The views of a case's RoPE table and positions on one backend: q's (as decode's) and the keys'.
struct PrefillRopeViews<'a> {
    q: RopeViews<'a>,
    k_positions: TensorView<'a, i32, 1>,
}

impl<'a> PrefillRopeViews<'a> {
    /// The fixture's table and explicit positions as host views (`None` without RoPE).
    fn host<T>(f: &'a PrefillFixture<T>) -> Result<Option<Self>> {
        let Some(q) = RopeViews::host(f.rope_table.as_ref(), &f.rope_q_positions, f.case.rope)? else {
            return Ok(None);
        };
        let k_positions = TensorView::host(&f.rope_k_positions, [f.rope_k_positions.len()])?;
        Ok(Some(Self { q, k_positions }))
    }

    /// Views of a table and positions uploaded by [`upload_rope`] (q's) and of the keys' positions.
    fn gpu<T>(
        f: &PrefillFixture<T>,
        uploaded: Option<&'a GpuRope>,
        k_positions: &'a CudaSlice<i32>,
    ) -> Result<Option<Self>> {
        let Some(q) = RopeViews::gpu(uploaded, f.rope_table.as_ref(), f.rope_q_positions.len(), f.case.rope)? else {
            return Ok(None);
        };
        let n = f.rope_k_positions.len();
        Ok(Some(Self { q, k_positions: TensorView::gpu(k_positions.slice(0..n), [n])? }))
    }

    /// The call's RoPE on q and on k.
    fn options(&'a self) -> (crate::rope::Rope<'a>, crate::rope::RopeKeys<'a>) {
        let explicit = self.q.case.explicit_positions;
        (self.q.rope(), crate::rope::RopeKeys { positions: explicit.then_some(&self.k_positions) })
    }
}

fn launch_views<T: Element>(
    stream: &Stream<'_>,
    f: &PrefillFixture<T>,
    views: CaseViews<'_, T>,
    variants: &VariantViews<'_>,
    rope: Option<&PrefillRopeViews<'_>>,
) -> Result<()> {
    let c = &f.case;
    let rope = rope.map(PrefillRopeViews::options);
    let opts = PrefillOptions {
        causal: c.causal,
        scale: f.inputs.scale,
        score_mod: variants.score_mod(&c.variants),
        kernel: c.kernel,
        sm90_steps: c.sm90_steps,
        rope: rope.map(|r| r.0),
        rope_k: rope.filter(|_| c.rope_k).map(|r| r.1),
    };
    match views {
        CaseViews::Dense { q, k, v, mut o, mut lse } => prefill(stream, &q, &k, &v, &mut o, lse.as_mut(), &opts),
        CaseViews::Varlen { q, k, v, cu_q, cu_k, mut o, mut lse } => {
            prefill_varlen(stream, &q, &k, &v, &cu_q, &cu_k, c.seqlen_q, c.seqlen_k, &mut o, lse.as_mut(), &opts)
        }
    }
}

/// The batch size of a case (varlen: its sequence count).
/// The rotation position of every query and key token of `case` (packed order): `explicit_q` /
/// `explicit_k` when the case draws them, else query row i of a sequence at i + Tk − Tq and key j at j.
fn rope_token_positions(case: &PrefillCase, explicit_q: &[i32], explicit_k: &[i32]) -> (Vec<i64>, Vec<i64>) {
    let seqs: Vec<(usize, usize)> = match &case.varlen {
        Some(s) => s.clone(),
        None => vec![(case.seqlen_q, case.seqlen_k); case.batch],
    };
    let wide = |p: &[i32]| p.iter().map(|&x| i64::from(x)).collect::<Vec<i64>>();
    let q = match case.rope {
        Some(r) if r.explicit_positions => wide(explicit_q),
        _ => seqs.iter().flat_map(|&(tq, tk)| (0..tq).map(move |i| (i + tk) as i64 - tq as i64)).collect(),
    };
    let k = match case.rope {
        Some(r) if r.explicit_positions => wide(explicit_k),
        _ => seqs.iter().flat_map(|&(_, tk)| 0..tk as i64).collect(),
    };
    (q, k)
}

fn case_batch(c: &PrefillCase) -> usize {
    c.varlen.as_ref().map_or(c.batch, |s| s.len())
}

/// Runs the fixture's case once on the emulator, outputs poisoned with NaN.
pub fn run_emulated<T: Element>(emu: &Emulator, f: &PrefillFixture<T>) -> Result<PrefillOutputs<T>> {
    let c = &f.case;
    let mut o_buf = vec![T::nan(); f.o_len];
    let mut lse_buf = vec![f32::NAN; f.lse_len];
    let stream = Stream::Emu(emu);
    let start = Instant::now();
    {
        let o_slice = &mut o_buf[f.o.offset..];
        let views = CaseViews::new(
            f,
            |p| Mem::Host(&f.bufs[p.buf][p.offset..]),
            MemMut::Host(o_slice),
            MemMut::Host(&mut lse_buf[..]),
            || [Mem::Host(&f.cu_q), Mem::Host(&f.cu_k)],
        )?;
        let variants = VariantViews::new(&c.variants, case_batch(c), c.heads_q, |sinks, n| {
            TensorView::host(&(if sinks { &f.sinks } else { &f.alibi_slopes })[..n], [n])
        })?;
        let rope = PrefillRopeViews::host(f)?;
        launch_views(&stream, f, views, &variants, rope.as_ref())?;
    }
    let launch_secs = start.elapsed().as_secs_f64();
    Ok(PrefillOutputs { o: o_buf, lse: c.with_lse.then_some(lse_buf), launch_secs })
}

/// Device copies of a fixture: `sets` copies of every buffer (inputs identical, addresses distinct, each
/// set `stride` elements apart, a multiple of 8 so every set stays 16-byte aligned), outputs poisoned.
struct GpuSets<T: Element> {
    bufs: Vec<(CudaSlice<T>, usize)>,
    o: CudaSlice<T>,
    o_stride: usize,
    lse: CudaSlice<f32>,
    lse_stride: usize,
    cu_q: CudaSlice<i32>,
    cu_k: CudaSlice<i32>,
    slopes: CudaSlice<f32>,
    sinks: CudaSlice<f32>,
    /// The RoPE table and q positions, and the key positions (one spare element).
    rope: Option<GpuRope>,
    rope_k_positions: CudaSlice<i32>,
    sets: usize,
}

fn round8(n: usize) -> usize {
    n.div_ceil(8) * 8
}

impl<T: Element> GpuSets<T> {
    fn upload(cu: &Arc<CudaStream>, f: &PrefillFixture<T>, sets: usize) -> Result<Self> {
        let sets = sets.max(1);
        let mut bufs = Vec::new();
        for b in &f.bufs {
            let stride = round8(b.len());
            let mut dev = cu.alloc_zeros::<T>(stride * sets)?;
            let src = cu.clone_htod(b)?;
            for s in 0..sets {
                cu.memcpy_dtod(&src, &mut dev.slice_mut(s * stride..s * stride + b.len()))?;
            }
            bufs.push((dev, stride));
        }
        let (o_stride, lse_stride) = (round8(f.o_len), round8(f.lse_len.max(1)));
        Ok(Self {
            bufs,
            o: cu.clone_htod(&vec![T::nan(); o_stride * sets])?,
            o_stride,
            lse: cu.clone_htod(&vec![f32::NAN; lse_stride * sets])?,
            lse_stride,
            cu_q: cu.clone_htod(&f.cu_q.iter().copied().chain([0]).collect::<Vec<_>>())?,
            cu_k: cu.clone_htod(&f.cu_k.iter().copied().chain([0]).collect::<Vec<_>>())?,
            slopes: cu.clone_htod(&f.alibi_slopes.iter().copied().chain([0.0]).collect::<Vec<_>>())?,
            sinks: cu.clone_htod(&f.sinks.iter().copied().chain([0.0]).collect::<Vec<_>>())?,
            rope: upload_rope(cu, f.rope_table.as_ref(), &f.rope_q_positions)?,
            rope_k_positions: cu.clone_htod(&f.rope_k_positions.iter().copied().chain([0]).collect::<Vec<_>>())?,
            sets,
        })
    }

    /// Enqueues the case on input/output set `set`.
    fn launch(&mut self, cu: &Arc<CudaStream>, f: &PrefillFixture<T>, set: usize) -> Result<()> {
        let c = &f.case;
        let set = set % self.sets;
        let stream = Stream::Gpu(cu);
        let bufs = &self.bufs;
        let base = |p: &Place| bufs[p.buf].1 * set + p.offset;
        let o_slice = self.o.slice_mut(self.o_stride * set + f.o.offset..self.o_stride * (set + 1));
        let lse_slice = self.lse.slice_mut(self.lse_stride * set..self.lse_stride * set + f.lse_len);
        let cu_len = [f.cu_q.len(), f.cu_k.len()];
        let views = CaseViews::new(
            f,
            |p| Mem::Gpu(bufs[p.buf].0.slice(base(p)..)),
            MemMut::Gpu(o_slice),
            MemMut::Gpu(lse_slice),
            || [Mem::Gpu(self.cu_q.slice(0..cu_len[0])), Mem::Gpu(self.cu_k.slice(0..cu_len[1]))],
        )?;
        let variants = VariantViews::new(&c.variants, case_batch(c), c.heads_q, |sinks, n| {
            TensorView::gpu((if sinks { &self.sinks } else { &self.slopes }).slice(0..n), [n])
        })?;
        let rope = PrefillRopeViews::gpu(f, self.rope.as_ref(), &self.rope_k_positions)?;
        launch_views(&stream, f, views, &variants, rope.as_ref())
    }

    /// Raw outputs of set `set` (synchronises the stream).
    fn outputs(
        &self,
        cu: &Arc<CudaStream>,
        f: &PrefillFixture<T>,
        set: usize,
        launch_secs: f64,
    ) -> Result<PrefillOutputs<T>> {
        let o = cu.clone_dtoh(&self.o.slice(self.o_stride * set..self.o_stride * set + f.o_len))?;
        let lse = cu.clone_dtoh(&self.lse.slice(self.lse_stride * set..self.lse_stride * set + f.lse_len))?;
        cu.synchronize()?;
        Ok(PrefillOutputs { o, lse: f.case.with_lse.then_some(lse), launch_secs })
    }
}

/// Runs the fixture's case once on the GPU behind `cu` (outputs poisoned with NaN) and reads the outputs
/// back. Launches from several threads may share `cu`: each call synchronises it before reading back.
pub fn run_gpu<T: Element>(cu: &Arc<CudaStream>, f: &PrefillFixture<T>) -> Result<PrefillOutputs<T>> {
    let mut g = GpuSets::upload(cu, f, 1)?;
    let start = Instant::now();
    g.launch(cu, f, 0)?;
    cu.synchronize()?;
    let secs = start.elapsed().as_secs_f64();
    g.outputs(cu, f, 0, secs)
}

/// Builds `case` from `seed`, runs it on the emulator and judges it against the fp64 reference.
pub fn check_case_emulated(emu: &Emulator, case: &PrefillCase, seed: u64) -> Result<CaseOutcome> {
    with_dtype!(case.dtype, T => check_emulated::<T>(emu, case, &PrefillInputs::default(), seed))
}

fn check_emulated<T: Element>(
    emu: &Emulator,
    case: &PrefillCase,
    inputs: &PrefillInputs,
    seed: u64,
) -> Result<CaseOutcome> {
    let f = PrefillFixture::<T>::with_inputs(case, inputs, seed)?;
    f.evaluate(&run_emulated(emu, &f)?)
}

/// [`check_case_emulated`] with values drawn as `inputs` says (custom scale, large magnitudes).
pub fn check_inputs_emulated(
    emu: &Emulator,
    case: &PrefillCase,
    inputs: &PrefillInputs,
    seed: u64,
) -> Result<CaseOutcome> {
    with_dtype!(case.dtype, T => check_emulated::<T>(emu, case, inputs, seed))
}

/// Builds `case` from `seed`, runs it on the GPU behind `cu` and judges it against the fp64 reference.
pub fn check_case_gpu(cu: &Arc<CudaStream>, case: &PrefillCase, seed: u64) -> Result<CaseOutcome> {
    with_dtype!(case.dtype, T => check_gpu::<T>(cu, case, seed))
}

fn check_gpu<T: Element>(cu: &Arc<CudaStream>, case: &PrefillCase, seed: u64) -> Result<CaseOutcome> {
    let f = PrefillFixture::<T>::new(case, seed)?;
    f.evaluate(&run_gpu(cu, &f)?)
}

/// Bytes of device memory the timed launches rotate through at least (inputs and outputs of all sets):
/// twice the L2 of a 50 MB-class GPU, with margin.
pub const ROTATE_BYTES: usize = 256 << 20;
/// At most this many input sets.
pub const MAX_SETS: usize = 4096;
/// Rows a timed case compares against the reference (its shapes are too large for a full check).
pub const TIMED_SAMPLE_ROWS: usize = 32;

/// GPU timing of one case.
#[derive(Debug, Clone)]
pub struct PrefillTiming {
    pub timing: Timing,
    pub flops: f64,
    pub tflops: f64,
    /// Input/output sets the launches rotated through, and their total bytes.
    pub sets: usize,
    pub rotated_bytes: usize,
    /// The timed output (set 0) against the reference on [`TIMED_SAMPLE_ROWS`] sampled rows, and free of NaN.
    pub outcome: CaseOutcome,
}

/// Times `case` on `cu`: CUDA events around each launch, `warmup` untimed launches, median of `iters`;
/// consecutive launches use different copies of the inputs and outputs (at least [`ROTATE_BYTES`] in all,
/// at most [`MAX_SETS`] copies) so they stream from memory rather than hit L2. The output is then checked
/// on sampled rows.
pub fn time_case_gpu(cu: &Arc<CudaStream>, case: &PrefillCase, seed: u64, runs: Runs) -> Result<PrefillTiming> {
    with_dtype!(case.dtype, T => time_fixture(cu, &PrefillFixture::<T>::new(case, seed)?, runs))
}

/// [`time_case_gpu`] of a fixture.
fn time_fixture<T: Element>(cu: &Arc<CudaStream>, f: &PrefillFixture<T>, runs: Runs) -> Result<PrefillTiming> {
    let set_bytes =
        (f.bufs.iter().map(|b| round8(b.len())).sum::<usize>() + round8(f.o_len)) * 2 + round8(f.lse_len.max(1)) * 4;
    let sets = ROTATE_BYTES.div_ceil(set_bytes.max(1)).clamp(1, MAX_SETS);
    let mut g = GpuSets::upload(cu, f, sets)?;
    let timing = time_launches(cu, runs, |i| g.launch(cu, f, i))?;
    let out = g.outputs(cu, f, 0, timing.median_ms * 1e-3)?;
    let outcome = f.evaluate_sampled(&out, TIMED_SAMPLE_ROWS)?;
    let flops = f.flops();
    Ok(PrefillTiming {
        timing,
        flops,
        tflops: flops / (timing.median_ms * 1e-3) / 1e12,
        sets,
        rotated_bytes: sets * set_bytes,
        outcome,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::{bf16, f16};

    #[test]
    fn sweep_covers_the_required_axes() {
        let cases = sweep_cases(false);
        for d in [32, 64, 96, 128, 256] {
            assert!(cases.iter().any(|c| c.head_dim == d), "D={d}");
        }
        for &(hq, hkv) in &[(2, 2), (4, 1), (8, 1)] {
            assert!(cases.iter().any(|c| c.heads_q == hq && c.heads_kv == hkv));
        }
        assert!(cases.iter().any(|c| c.seqlen_q > c.seqlen_k && c.causal));
        assert!(cases.iter().any(|c| c.seqlen_q < c.seqlen_k && c.causal));
        assert!(cases.iter().any(|c| c.varlen.as_ref().is_some_and(|s| s.iter().any(|x| x.0 == 0))));
        assert!(cases.iter().any(|c| c.varlen.as_ref().is_some_and(|s| s.iter().any(|x| x.1 == 0 && x.0 > 0))));
        assert!(cases.iter().any(|c| c.layout == CaseLayout::PackedQkv));
        for &t in &SWEEP_SEQLENS {
            assert!(cases.iter().any(|c| c.seqlen_q == t || c.seqlen_k == t), "T={t}");
        }
        assert!(sweep_cases(true).len() > cases.len());
    }

    #[test]
    fn perf_cases_are_the_fa_family() {
        let cases = perf_cases();
        assert_eq!(cases.len(), 74);
        for c in &cases[..72] {
            assert_eq!(c.heads_q * c.head_dim, 2048);
            assert_eq!(c.batch * c.seqlen_q, 16384);
            assert_eq!((c.heads_q, c.seqlen_q), (c.heads_kv, c.seqlen_k));
        }
        assert!(cases.iter().any(|c| c.heads_q != c.heads_kv));
    }

    #[test]
    fn fixture_values_poison_and_sampled_evaluation() {
        let mut case = sweep_cases(false).into_iter().find(|c| c.layout == CaseLayout::Padded).unwrap();
        case.dtype = DType::Bf16;
        let f = PrefillFixture::<bf16>::new(&case, 7).unwrap();
        // Every logical element is finite and everything else in the buffers is NaN.
        let finite: usize = f.bufs.iter().flatten().filter(|x| x.to_f64().is_finite()).count();
        assert_eq!(finite, f.q.numel() + f.k.numel() + f.v.numel());
        assert!(f.logical(&f.v).iter().sum::<f64>() / f.v.numel() as f64 > 0.5);
        // The same seed gives the same data; another seed does not.
        assert_eq!(f.logical(&f.q), PrefillFixture::<bf16>::new(&case, 7).unwrap().logical(&f.q));
        assert_ne!(f.logical(&f.q), PrefillFixture::<bf16>::new(&case, 8).unwrap().logical(&f.q));

        // Sampled and full evaluation agree on a correct run and on a corrupted one.
        let mut case = sweep_cases(false)[0].clone();
        (case.batch, case.seqlen_q, case.seqlen_k, case.heads_q, case.heads_kv, case.causal) = (2, 70, 90, 4, 2, true);
        let f = PrefillFixture::<f16>::new(&case, 3).unwrap();
        let mut out = run_emulated(&Emulator::new(), &f).unwrap();
        let full = f.evaluate(&out).unwrap();
        let sampled = f.evaluate_sampled(&out, 40).unwrap();
        assert!(full.passed() && sampled.passed(), "{} / {}", full.summary(), sampled.summary());
        assert!(sampled.sampled() && !full.sampled());
        assert!(sampled.out.max_abs_err <= full.out.max_abs_err);
        for x in out.o.iter_mut().step_by(3) {
            *x = f16::from_f32(x.to_f32() + 0.25);
        }
        assert!(!f.evaluate(&out).unwrap().passed());
        assert!(!f.evaluate_sampled(&out, 40).unwrap().passed());
        out.o[f.o.at([1, 5, 2, 7])] = f16::NAN;
        let s = f.evaluate_sampled(&out, 1).unwrap();
        assert_eq!(s.nan_o, 1);
        assert!(!s.passed());
    }
}
