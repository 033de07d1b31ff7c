//! Hidden memory never matters (docs/semantics.md, "Hidden memory"): every op on the emulator, run once with
//! every byte the mask hides set to zero and once per poison (NaN, +Inf, −Inf; for FP8 caches the NaN and
//! Inf codes of E4M3 / E5M2), must give bitwise the same outputs. Hidden here: keys left of every row's
//! window, cache slots past seq_len, pages no sequence uses (and unused block-table entries pointing at
//! them), a varlen sequence's neighbours (for that sequence's rows), rows and columns in the strides'
//! gaps, rows past the last sequence, empty merge states, the new tokens append skips and the slots it
//! does not write. The windows sit at every tile, page and split edge of the kernels they run.
//!
//! The cases are small (the emulator runs every thread): the whole file takes well under a minute in
//! release. The planted bugs it catches: scripts/mutants/*-window-edge-loads-hidden-row.patch.
use std::sync::Arc;

use crate::common;

use fused_attn::cudarc::driver::{CudaSlice, CudaStream, DeviceRepr};
use fused_attn::paged_prefill::{paged_prefill, PagedPrefillOptions, PagedPrefillWorkspace};
use fused_attn::prefill::{prefill, prefill_varlen, PrefillKernel, PrefillOptions, Window};
use fused_attn::score_mod::ScoreMod;
use fused_attn::{
    append, decode, merge_states, DecodeOptions, DecodeWorkspace, Element, Emulator, Fp8E4m3, Fp8E5m2, Fp8Format,
    KvScales, PagedKvCache, PagedKvCacheMut, Stream, TensorView, TensorViewMut,
};
use half::{bf16, f16};

// ---- helpers -------------------------------------------------------------------------------------------

/// What the hidden memory holds in one run.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Fill {
    Zero,
    Nan,
    PosInf,
    NegInf,
}
const POISONS: [Fill; 3] = [Fill::Nan, Fill::PosInf, Fill::NegInf];

impl Fill {
    fn value<T: Element>(self) -> T {
        T::from_f64(match self {
            Fill::Zero => 0.0,
            Fill::Nan => f64::NAN,
            Fill::PosInf => f64::INFINITY,
            Fill::NegInf => f64::NEG_INFINITY,
        })
    }
    /// The FP8 code of element `i` of hidden memory: the format's non-finite codes in turn (E4M3 has NaN
    /// only: S.1111.111; E5M2 ±Inf S.11111.00 and NaNs S.11111.xx).
    fn fp8_code(self, e5m2: bool, i: usize) -> u8 {
        const E4M3: [u8; 2] = [0x7F, 0xFF];
        const E5M2_NAN: [u8; 6] = [0x7D, 0x7E, 0x7F, 0xFD, 0xFE, 0xFF];
        match (self, e5m2) {
            (Fill::Zero, _) => 0,
            (Fill::Nan, false) | (Fill::PosInf, false) | (Fill::NegInf, false) => E4M3[i % 2],
            (Fill::Nan, true) => E5M2_NAN[i % 6],
            (Fill::PosInf, true) => 0x7C,
            (Fill::NegInf, true) => 0xFC,
        }
    }
}

/// Bit images of output elements (bitwise comparison: a NaN equals only the same NaN).
trait Bits: Copy {
    fn bits(self) -> u32;
}
impl Bits for f16 {
    fn bits(self) -> u32 {
        self.to_bits() as u32
    }
}
impl Bits for bf16 {
    fn bits(self) -> u32 {
        self.to_bits() as u32
    }
}
impl Bits for f32 {
    fn bits(self) -> u32 {
        self.to_bits()
    }
}
impl Bits for u8 {
    fn bits(self) -> u32 {
        self as u32
    }
}
impl Bits for Fp8E4m3 {
    fn bits(self) -> u32 {
        self.0 as u32
    }
}
impl Bits for Fp8E5m2 {
    fn bits(self) -> u32 {
        self.0 as u32
    }
}
fn bits<T: Bits>(xs: &[T]) -> Vec<u32> {
    xs.iter().map(|x| x.bits()).collect()
}

/// Runs `run(fill)` with the hidden memory zero and then with each poison; every run's output bits must
/// equal the zero run's, and the zero run must be NaN-free where `finite` says so (so that a kernel which
/// NaNs everything cannot pass). `run` returns (output bits, indices that must hold finite values).
fn assert_hidden_invisible(label: &str, fills: &[Fill], run: impl Fn(Fill) -> (Vec<u32>, usize)) {
    let (clean, checked) = run(Fill::Zero);
    assert!(checked > 0, "{label}: nothing compared");
    for &fill in fills {
        let (poisoned, _) = run(fill);
        assert_eq!(poisoned.len(), clean.len(), "{label}");
        if let Some(i) = (0..clean.len()).find(|&i| poisoned[i] != clean[i]) {
            let n = (0..clean.len()).filter(|&i| poisoned[i] != clean[i]).count();
            panic!(
                "{label}: hidden memory = {fill:?} changed {n} of {} output words, first at {i}: {:#x} vs {:#x} \
                 with zeros there",
                clean.len(),
                poisoned[i],
                clean[i]
            );
        }
    }
    eprintln!("ok   {label}: {} output words bitwise equal under {fills:?}", clean.len());
}

/// Where a case runs: the emulator (CI) or the first GPU (the GPU bundle: the same cases, the same bitwise
/// check, on the hardware's own memory system and TMA unit).
enum Backend {
    Emu(Emulator),
    Gpu(Arc<CudaStream>),
}

impl Backend {
    fn emu() -> Self {
        Backend::Emu(Emulator::new())
    }
    fn gpu(test: &str) -> Option<Self> {
        common::gpu_or_skip(test).map(|ctx| Backend::Gpu(ctx.default_stream()))
    }
    fn stream(&self) -> Stream<'_> {
        match self {
            Backend::Emu(e) => Stream::Emu(e),
            Backend::Gpu(s) => Stream::Gpu(s),
        }
    }
    fn buf<T: DeviceRepr + Copy>(&self, data: Vec<T>) -> Buf<T> {
        match self {
            Backend::Emu(_) => Buf::Host(data),
            Backend::Gpu(s) => Buf::Dev(s.clone_htod(&data).unwrap()),
        }
    }
    /// The prefill kernels a dense case runs: sm_80 on the emulator (sm90_prefill_hidden_rows forces the
    /// other), and on a GPU also `Auto` (the sm_90a kernel on an H100 where it supports the call).
    fn kernels(&self) -> &'static [PrefillKernel] {
        match self {
            Backend::Emu(_) => &[PrefillKernel::Sm80],
            Backend::Gpu(_) => &[PrefillKernel::Sm80, PrefillKernel::Auto],
        }
    }
}

/// A buffer of a case on its backend.
enum Buf<T> {
    Host(Vec<T>),
    Dev(CudaSlice<T>),
}

impl<T: DeviceRepr + Copy + Default> Buf<T> {
    fn view<const N: usize>(&self, shape: [usize; N], strides: Option<[i64; N]>) -> TensorView<'_, T, N> {
        let v = match self {
            Buf::Host(h) => TensorView::host(h, shape),
            Buf::Dev(d) => TensorView::gpu(d.as_view(), shape),
        }
        .unwrap();
        match strides {
            Some(s) => v.with_strides(s).unwrap(),
            None => v,
        }
    }
    /// The first `len` elements (a prefix of a larger allocation, whose tail is hidden memory).
    fn prefix<const N: usize>(&self, len: usize, shape: [usize; N]) -> TensorView<'_, T, N> {
        match self {
            Buf::Host(h) => TensorView::host(&h[..len], shape),
            Buf::Dev(d) => TensorView::gpu(d.slice(0..len), shape),
        }
        .unwrap()
    }
    fn view_mut<const N: usize>(&mut self, shape: [usize; N], strides: Option<[i64; N]>) -> TensorViewMut<'_, T, N> {
        let v = match self {
            Buf::Host(h) => TensorViewMut::host(h, shape),
            Buf::Dev(d) => TensorViewMut::gpu(d.as_view_mut(), shape),
        }
        .unwrap();
        match strides {
            Some(s) => v.with_strides(s).unwrap(),
            None => v,
        }
    }
    fn host(self, be: &Backend) -> Vec<T> {
        match (self, be) {
            (Buf::Host(h), _) => h,
            (Buf::Dev(d), Backend::Gpu(s)) => s.clone_dtoh(&d).unwrap(),
            (Buf::Dev(_), Backend::Emu(_)) => unreachable!("device buffers come from a GPU backend"),
        }
    }
}

/// A small seeded generator (splitmix64): inputs are the same in every run of a case.
struct Rng(u64);
impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed ^ 0x9E37_79B9_7F4A_7C15)
    }
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [lo, hi).
    fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Whether some row of (tq, tk) sees key j under the window / causal mask (bottom-right alignment).
fn key_seen(window: Window, tq: usize, tk: usize, j: usize) -> bool {
    (0..tq).any(|i| window.sees(i, j, tq, tk))
}

/// How many outputs are finite. Outputs are written over NaN-filled buffers in every run (elements the kernel
/// must not touch stay NaN in all of them); a zero run with nothing finite compared nothing.
fn finite_count<T: Element>(xs: &[T]) -> usize {
    xs.iter().filter(|x| x.to_f64().is_finite()).count()
}

/// What a run gives [`assert_hidden_invisible`]: the bits of `checked` then of `rest`, and how many of
/// `checked`'s values are finite.
fn outcome<T: Element + Bits, U: Bits>(checked: &[T], rest: &[U]) -> (Vec<u32>, usize) {
    let mut out = bits(checked);
    out.extend(bits(rest));
    (out, finite_count(checked))
}

// ---- dense and varlen prefill --------------------------------------------------------------------------

#[derive(Debug, Clone, Copy)]
struct Dense {
    batch: usize,
    tq: usize,
    tk: usize,
    heads: (usize, usize),
    d: usize,
    /// V's and O's head dim (issue 27; `d` unless a case gives V its own).
    dv: usize,
    causal: bool,
    window: Option<(i32, i32)>,
    softcap: Option<f32>,
    kernel: PrefillKernel,
}

fn dense(tq: usize, tk: usize, d: usize, window: Option<(i32, i32)>) -> Dense {
    Dense {
        batch: 2,
        tq,
        tk,
        heads: (2, 1),
        d,
        dv: d,
        causal: true,
        window,
        softcap: None,
        kernel: PrefillKernel::Sm80,
    }
}

/// Dense prefill over strided buffers: K/V rows past Tk (the gap before the next batch), columns past D
/// (the gap before the next head or row; V's past Dv) and keys no row sees are hidden.
fn run_dense<T: Element + Bits>(be: &Backend, c: &Dense, fill: Fill, seed: u64) -> (Vec<u32>, usize) {
    let (hq, hkv) = c.heads;
    let (pad_rows, pad_cols) = (5, 8);
    let dp = c.d.max(c.dv) + pad_cols;
    let window = Window::new(c.window, c.causal);
    let mut rng = Rng::new(seed);
    let q_len = c.batch * c.tq * hq * dp;
    let k_rows = c.tk + pad_rows;
    let kv_len = c.batch * k_rows * hkv * dp;
    let mut q = vec![fill.value::<T>(); q_len];
    let (mut k, mut v) = (vec![fill.value::<T>(); kv_len], vec![fill.value::<T>(); kv_len]);
    for (i, x) in q.iter_mut().enumerate() {
        if i % dp < c.d {
            *x = T::from_f64(rng.uniform(-1.0, 1.5));
        }
    }
    let mut hidden_keys = 0;
    for b in 0..c.batch {
        for j in 0..c.tk {
            let seen = key_seen(window, c.tq, c.tk, j);
            hidden_keys += usize::from(!seen);
            for h in 0..hkv {
                for col in 0..c.d.max(c.dv) {
                    let at = ((b * k_rows + j) * hkv + h) * dp + col;
                    if col < c.d {
                        k[at] = if seen { T::from_f64(rng.uniform(-1.0, 1.0)) } else { fill.value() };
                    }
                    if col < c.dv {
                        v[at] = if seen { T::from_f64(rng.uniform(-0.5, 1.0)) } else { fill.value() };
                    }
                }
            }
        }
    }
    if c.window.is_some_and(|(l, _)| l >= 0) && c.tk > c.tq + c.window.unwrap().0 as usize {
        assert!(hidden_keys > 0, "{c:?}: the window hides no key");
    }
    let q_st = [(c.tq * hq * dp) as i64, (hq * dp) as i64, dp as i64, 1];
    let kv_st = [(k_rows * hkv * dp) as i64, (hkv * dp) as i64, dp as i64, 1];
    let (q, k, v) = (be.buf(q), be.buf(k), be.buf(v));
    let mut o = be.buf(vec![T::nan(); q_len]);
    let mut lse = be.buf(vec![f32::NAN; c.batch * hq * c.tq]);
    let opts = PrefillOptions {
        causal: c.causal,
        score_mod: ScoreMod { window: c.window, softcap: c.softcap, ..Default::default() },
        kernel: c.kernel,
        ..Default::default()
    };
    prefill(
        &be.stream(),
        &q.view([c.batch, c.tq, hq, c.d], Some(q_st)),
        &k.view([c.batch, c.tk, hkv, c.d], Some(kv_st)),
        &v.view([c.batch, c.tk, hkv, c.dv], Some(kv_st)),
        &mut o.view_mut([c.batch, c.tq, hq, c.dv], Some(q_st)),
        Some(&mut lse.view_mut([c.batch, hq, c.tq], None)),
        &opts,
    )
    .unwrap_or_else(|e| panic!("{c:?}: {e}"));
    let (o, lse) = (o.host(be), lse.host(be));
    outcome(&o, &lse)
}

fn check_dense<T: Element + Bits>(be: &Backend, c: Dense, seed: u64) {
    for &kernel in be.kernels() {
        let c = Dense { kernel, ..c };
        let label = format!("{} {c:?}", T::DTYPE.name());
        assert_hidden_invisible(&label, &POISONS, |fill| run_dense::<T>(be, &c, fill, seed));
    }
}

/// The window's left edge at every position of the bottom KV tile of the sm_80 kernels (Bc = 64 at D 32,
/// 64 and plain 128; 32 at D 96, 160, 192, 256 and the 128 _mod kernel): first visible key δ − left at a
/// tile's last key, its first, its second and mid-tile, in chunked prefill (Tq < Tk, where keys left of
/// every row's window exist), over strided batches; then every tile width, including head dims below
/// their width (40 runs at 64, 136 at 160: predicated columns); then one query tile whose one KV tile is
/// cut by both window bounds (top tile = bottom tile), not causal, with softcap (the variant score path
/// runs before the mask).
fn dense_prefill_window_edges(be: &Backend) {
    let mut i = 0;
    for (d, bc) in [(64usize, 64usize), (128, 32), (96, 32)] {
        for first in [bc - 1, bc, bc + 1, 2 * bc + bc / 2] {
            let (tq, tk) = (40, 200);
            let left = (tk - tq - first) as i32;
            check_dense::<bf16>(be, dense(tq, tk, d, Some((left, 0))), common::case_seed(i));
            i += 1;
        }
    }
    // (264 and 512: the decode kernel's streaming path, issue 27: 16-key tiles, keys left of the window of
    // each 16-row CTA masked per row.)
    for d in [32, 40, 136, 160, 192, 256, 264, 512] {
        check_dense::<f16>(be, dense(24, 150, d, Some((70, 0))), common::case_seed(i));
        i += 1;
    }
    let mut c = dense(8, 90, 64, Some((3, 4)));
    c.causal = false;
    c.softcap = Some(20.0);
    check_dense::<bf16>(be, c, common::case_seed(i));
}

/// No window: the rows past Tk of each batch (the stride gap) and the padded columns of a ragged top tile.
fn dense_prefill_strided_gaps(be: &Backend) {
    check_dense::<bf16>(be, dense(70, 70, 64, None), common::case_seed(20));
    let mut c = dense(33, 100, 128, None);
    c.causal = false;
    check_dense::<f16>(be, c, common::case_seed(21));
    // The streaming path's dense view (issue 27): page b = batch b, its rows past Tk are the stride gap.
    let mut c = dense(21, 45, 384, None);
    c.causal = false;
    check_dense::<bf16>(be, c, common::case_seed(22));
    // A V head dim of its own (issue 27): V's columns past Dv (below Dqk, or past it) are hidden too, with a
    // window edge and without.
    for (i, (d, dv, window)) in
        [(192, 128, None), (256, 128, Some((40, 0))), (64, 128, None), (128, 64, Some((30, 0)))].into_iter().enumerate()
    {
        let c = Dense { dv, ..dense(33, 90, d, window) };
        check_dense::<f16>(be, c, common::case_seed(23 + i));
    }
}

/// Varlen: three sequences packed back to back; poisoning everything but sequence 1 (its neighbours' rows
/// of Q, K and V, the keys it does not see, and the buffer's rows past the last sequence) must not change
/// sequence 1's output bits.
fn run_varlen<T: Element + Bits>(
    be: &Backend,
    window: Option<(i32, i32)>,
    d: usize,
    kernel: PrefillKernel,
    fill: Fill,
) -> (Vec<u32>, usize) {
    let (hq, hkv) = (2usize, 1usize);
    let seqs = [(37usize, 70usize), (50, 133), (20, 65)];
    let pad = 9; // rows past the last sequence
    let mut cu_q = vec![0i32];
    let mut cu_k = vec![0i32];
    for &(tq, tk) in &seqs {
        cu_q.push(cu_q.last().unwrap() + tq as i32);
        cu_k.push(cu_k.last().unwrap() + tk as i32);
    }
    let (total_q, total_k) = (cu_q[3] as usize, cu_k[3] as usize);
    let mine_q = cu_q[1] as usize..cu_q[2] as usize;
    let mine_k = cu_k[1] as usize..cu_k[2] as usize;
    let (tq1, tk1) = seqs[1];
    let w = Window::new(window, true);
    let mut rng = Rng::new(0x5EED);
    let mut q = vec![fill.value::<T>(); (total_q + pad) * hq * d];
    let mut k = vec![fill.value::<T>(); (total_k + pad) * hkv * d];
    let mut v = k.clone();
    for r in mine_q.clone() {
        for x in &mut q[r * hq * d..(r + 1) * hq * d] {
            *x = T::from_f64(rng.uniform(-1.0, 1.5));
        }
    }
    for r in mine_k.clone() {
        if !key_seen(w, tq1, tk1, r - mine_k.start) {
            continue;
        }
        for i in r * hkv * d..(r + 1) * hkv * d {
            k[i] = T::from_f64(rng.uniform(-1.0, 1.0));
            v[i] = T::from_f64(rng.uniform(-0.5, 1.0));
        }
    }
    let (q, k, v) = (be.buf(q), be.buf(k), be.buf(v));
    let (cu_q, cu_k) = (be.buf(cu_q), be.buf(cu_k));
    let mut o = be.buf(vec![T::nan(); total_q * hq * d]);
    let mut lse = be.buf(vec![f32::NAN; hq * total_q]);
    let opts = PrefillOptions {
        causal: true,
        score_mod: ScoreMod { window, ..Default::default() },
        kernel,
        ..Default::default()
    };
    prefill_varlen(
        &be.stream(),
        &q.prefix(total_q * hq * d, [total_q, hq, d]),
        &k.prefix(total_k * hkv * d, [total_k, hkv, d]),
        &v.prefix(total_k * hkv * d, [total_k, hkv, d]),
        &cu_q.view([4], None),
        &cu_k.view([4], None),
        70,
        133,
        &mut o.view_mut([total_q, hq, d], None),
        Some(&mut lse.view_mut([hq, total_q], None)),
        &opts,
    )
    .unwrap();
    let (o, lse) = (o.host(be), lse.host(be));
    // Sequence 1's rows only: its neighbours' outputs are NaN by construction.
    let mine_o = &o[mine_q.start * hq * d..mine_q.end * hq * d];
    let mut out = bits(mine_o);
    for h in 0..hq {
        out.extend(bits(&lse[h * total_q + mine_q.start..h * total_q + mine_q.end]));
    }
    (out, finite_count(mine_o))
}

fn varlen_prefill_neighbours(be: &Backend) {
    for &kernel in be.kernels() {
        // (320: the streaming path's varlen view, issue 27: sequence b's keys from row cu_seqlens_k[b].)
        for (window, d) in [(None, 64usize), (Some((45, 0)), 96), (Some((31, 0)), 256), (Some((29, 0)), 320)] {
            let label = format!("varlen {kernel:?} window={window:?} d={d}");
            assert_hidden_invisible(&label, &POISONS, |fill| run_varlen::<bf16>(be, window, d, kernel, fill));
        }
    }
}

/// The sm_90a kernel (TMA boxes bring in whole tiles: the next sequence's rows in varlen, keys left of the
/// window in its bottom tile), forced: slow to emulate, so one case of each.
fn sm90_prefill_hidden_rows(be: &Backend) {
    let mut c = dense(40, 250, 64, Some((63, 0)));
    c.kernel = PrefillKernel::Sm90;
    c.batch = 1;
    assert_hidden_invisible("sm90 dense window", &[Fill::Nan, Fill::NegInf], |fill| run_dense::<bf16>(be, &c, fill, 7));
    assert_hidden_invisible("sm90 varlen window", &[Fill::Nan], |fill| {
        run_varlen::<bf16>(be, Some((50, 0)), 64, PrefillKernel::Sm90, fill)
    });
    // Q·K head dim 192 with V head dim 128 (issue 27): V's columns 128..200 of its padded rows (the TMA box
    // of V is 2 panels of 64, of its own tensor map), the keys left of the window in the bottom tile, the
    // rows past Tk before the next batch.
    let c = Dense { dv: 128, batch: 1, kernel: PrefillKernel::Sm90, ..dense(40, 300, 192, Some((70, 0))) };
    assert_hidden_invisible("sm90 192/128 dense window", &[Fill::Nan, Fill::PosInf], |fill| {
        run_dense::<f16>(be, &c, fill, 8)
    });
}

// ---- paged: a cache whose every unseen byte is poisoned -----------------------------------------------

/// One paged case: sequences (q_len, seq_len), page size, head dim, window, forced splits.
#[derive(Debug, Clone)]
struct Paged {
    seqs: Vec<(usize, usize)>,
    page_size: usize,
    heads: (usize, usize),
    d: usize,
    window: Option<(i32, i32)>,
    splits: Option<usize>,
}

fn paged(
    seqs: &[(usize, usize)],
    page_size: usize,
    d: usize,
    window: Option<(i32, i32)>,
    splits: Option<usize>,
) -> Paged {
    Paged { seqs: seqs.to_vec(), page_size, heads: (4, 2), d, window, splits }
}

/// The cache of a paged case: pages handed out shuffled, two spare pages no sequence uses (every unused
/// block-table entry names one), every slot no query row sees filled with `hidden(i)` (i: the element
/// index), the rest `value(rng, is_v)`. K/V tokens have 16 padding elements (a strided gap).
struct PagedCache<C> {
    k: Buf<C>,
    v: Buf<C>,
    table: Buf<i32>,
    lens: Buf<i32>,
    batch: usize,
    width: usize,
    shape: [usize; 4],
    strides: [i64; 4],
    max_len: usize,
}

fn build_cache<C: DeviceRepr + Copy + Default>(
    be: &Backend,
    c: &Paged,
    q_lens: &[usize],
    mut value: impl FnMut(&mut Rng, bool) -> C,
    hidden: impl Fn(usize) -> C,
) -> PagedCache<C> {
    let ps = c.page_size;
    let (_, hkv) = c.heads;
    let dp = c.d + 16;
    let pages_of = |len: usize| len.div_ceil(ps);
    let used: usize = c.seqs.iter().map(|&(_, l)| pages_of(l)).sum();
    let num_pages = used + 2;
    let width = c.seqs.iter().map(|&(_, l)| pages_of(l)).max().unwrap() + 1;
    let mut rng = Rng::new(0xCAC4E);
    let mut order: Vec<usize> = (0..used).collect();
    for i in (1..order.len()).rev() {
        order.swap(i, (rng.next() % (i as u64 + 1)) as usize);
    }
    let mut table = vec![used as i32; c.seqs.len() * width];
    let mut next = 0;
    let len = num_pages * ps * hkv * dp;
    let mut k: Vec<C> = (0..len).map(&hidden).collect();
    let mut v: Vec<C> = (0..len).map(&hidden).collect();
    let w = Window::new(c.window, true);
    for (b, &(_, seq_len)) in c.seqs.iter().enumerate() {
        for p in 0..pages_of(seq_len) {
            table[b * width + p] = order[next] as i32;
            next += 1;
        }
        for t in (0..seq_len).filter(|&t| key_seen(w, q_lens[b], seq_len, t)) {
            let page = table[b * width + t / ps] as usize;
            for h in 0..hkv {
                let at = ((page * ps + t % ps) * hkv + h) * dp;
                for col in 0..c.d {
                    k[at + col] = value(&mut rng, false);
                    v[at + col] = value(&mut rng, true);
                }
            }
        }
    }
    PagedCache {
        k: be.buf(k),
        v: be.buf(v),
        table: be.buf(table),
        lens: be.buf(c.seqs.iter().map(|&(_, l)| l as i32).collect()),
        batch: c.seqs.len(),
        width,
        shape: [num_pages, ps, hkv, c.d],
        strides: [(ps * hkv * dp) as i64, (hkv * dp) as i64, dp as i64, 1],
        max_len: c.seqs.iter().map(|&(_, l)| l).max().unwrap(),
    }
}

impl<C: DeviceRepr + Copy + Default> PagedCache<C> {
    fn view(&self) -> PagedKvCache<'_, C> {
        PagedKvCache::new(
            self.k.view(self.shape, Some(self.strides)),
            self.v.view(self.shape, Some(self.strides)),
            self.table.view([self.batch, self.width], None),
            self.lens.view([self.batch], None),
            self.max_len,
        )
        .unwrap()
    }
}

/// Paged prefill (q_lens from the case) or decode (one row per sequence) over `cache`, 16-bit queries;
/// returns the output bits (O then LSE) and O's finite count.
fn run_paged<T: Element + Bits, C: fused_attn::KvCacheOf<T> + DeviceRepr + Copy + Default>(
    be: &Backend,
    c: &Paged,
    cache: &PagedKvCache<'_, C>,
    is_decode: bool,
) -> (Vec<u32>, usize) {
    let stream = be.stream();
    let (hq, _) = c.heads;
    let b = c.seqs.len();
    let q_lens: Vec<usize> = c.seqs.iter().map(|&(q, _)| if is_decode { 1 } else { q }).collect();
    let total_q: usize = q_lens.iter().sum();
    let mut rng = Rng::new(0x9);
    let q = be.buf((0..total_q * hq * c.d).map(|_| T::from_f64(rng.uniform(-1.0, 1.5))).collect::<Vec<T>>());
    let mut o = be.buf(vec![T::nan(); total_q * hq * c.d]);
    let score_mod = ScoreMod { window: c.window, ..Default::default() };
    let lse = if is_decode {
        let mut lse = be.buf(vec![f32::NAN; b * hq]);
        let mut ws = DecodeWorkspace::with_capacity(&stream, b, hq, c.d, 8).unwrap();
        let opts = DecodeOptions { num_splits: c.splits, score_mod, ..Default::default() };
        let plan = decode(
            &stream,
            &q.view([b, hq, c.d], None),
            cache,
            &mut o.view_mut([b, hq, c.d], None),
            Some(&mut lse.view_mut([b, hq], None)),
            &mut ws,
            &opts,
        )
        .unwrap_or_else(|e| panic!("{c:?}: {e}"));
        // A forced split count is capped by the splits the window's span holds (no split of only hidden
        // keys, docs/scheduling.md); a forced split still splits.
        assert!(
            c.splits.is_none_or(|s| plan.num_splits() <= s && (s == 1 || plan.num_splits() > 1)),
            "{c:?}: {plan:?}"
        );
        lse
    } else {
        let mut cu = vec![0i32];
        for &q in &q_lens {
            cu.push(cu.last().unwrap() + q as i32);
        }
        let cu = be.buf(cu);
        let mut lse = be.buf(vec![f32::NAN; hq * total_q]);
        let mut ws = PagedPrefillWorkspace::with_capacity(&stream, total_q, hq, c.d, 8).unwrap();
        let opts = PagedPrefillOptions { num_splits: c.splits, score_mod, ..Default::default() };
        let plan = paged_prefill(
            &stream,
            &q.view([total_q, hq, c.d], None),
            &cu.view([b + 1], None),
            *q_lens.iter().max().unwrap(),
            cache,
            &mut o.view_mut([total_q, hq, c.d], None),
            Some(&mut lse.view_mut([hq, total_q], None)),
            Some(&mut ws),
            &opts,
        )
        .unwrap_or_else(|e| panic!("{c:?}: {e}"));
        // A forced split count is capped by the splits the window's span holds (no split of only hidden
        // keys, docs/scheduling.md); a forced split still splits.
        assert!(
            c.splits.is_none_or(|s| plan.num_splits() <= s && (s == 1 || plan.num_splits() > 1)),
            "{c:?}: {plan:?}"
        );
        lse
    };
    let (o, lse) = (o.host(be), lse.host(be));
    outcome(&o, &lse)
}

/// A 16-bit cache of case `c` with `fill` in its hidden slots, then the op.
fn run_paged16<T: Element + Bits>(be: &Backend, c: &Paged, fill: Fill, is_decode: bool) -> (Vec<u32>, usize) {
    let q_lens: Vec<usize> = c.seqs.iter().map(|&(q, _)| if is_decode { 1 } else { q }).collect();
    let cache = build_cache(
        be,
        c,
        &q_lens,
        |rng, is_v| T::from_f64(if is_v { rng.uniform(-0.5, 1.0) } else { rng.uniform(-1.0, 1.0) }),
        |_| fill.value::<T>(),
    );
    run_paged::<T, T>(be, c, &cache.view(), is_decode)
}

/// Paged prefill: chunked prefill (q_len < seq_len) and speculative verification (q_len 3-5 over a long
/// context) with the window's first visible key on a KV tile's edge (Bc = 32 at D 64 and 96, 16 at D 128
/// and 256), a page's edge (page sizes 1, 16, 256) and a split's edge, unsplit and with forced splits.
fn paged_prefill_window_edges(be: &Backend) {
    let cases = [
        // a chunk of 40 over 200 tokens: first visible key 63, 64, 65 (tile and page-16 edges)
        paged(&[(40, 200), (5, 90)], 16, 64, Some((97, 0)), Some(1)),
        paged(&[(40, 200), (5, 90)], 16, 64, Some((96, 0)), Some(1)),
        paged(&[(40, 200), (5, 90)], 16, 64, Some((95, 0)), Some(2)),
        // spec verify: 4 rows over 300 tokens, window 47 (first key 249), D 128 (Bc 16), page size 1
        paged(&[(4, 300), (3, 33)], 1, 128, Some((47, 0)), Some(1)),
        // page size 256: the window starts inside the one page; three splits cut the visible range
        paged(&[(6, 260), (30, 120)], 256, 96, Some((70, 0)), Some(3)),
        // D 256 (Bc 16), two splits
        paged(&[(8, 320)], 16, 256, Some((159, 0)), Some(2)),
        // no window: only slots past seq_len, spare pages and unused table entries are hidden
        paged(&[(33, 77), (1, 1), (17, 150)], 16, 64, None, None),
        // D 320 and 512: the streaming kernel at any query length (issue 27), split and not
        paged(&[(40, 200), (5, 90)], 16, 320, Some((96, 0)), Some(1)),
        paged(&[(20, 300)], 12, 512, Some((150, 0)), Some(2)),
    ];
    for c in cases {
        let label = format!("paged prefill {c:?}");
        assert_hidden_invisible(&label, &POISONS, |fill| run_paged16::<bf16>(be, &c, fill, false));
    }
    let c = paged(&[(12, 100)], 32, 128, Some((40, 0)), Some(1));
    assert_hidden_invisible("paged prefill f16", &[Fill::Nan], |fill| run_paged16::<f16>(be, &c, fill, false));
}

/// Decode: slots past seq_len, spare pages behind unused table entries, keys left of the window, with and
/// without forced splits, page sizes 1 and 256, every decode width (64, 128, 256, 512; 80 runs at 128, 264
/// at 512).
fn decode_hidden_slots(be: &Backend) {
    let cases = [
        paged(&[(1, 100), (1, 1), (1, 47)], 16, 64, None, Some(1)),
        paged(&[(1, 300), (1, 129)], 16, 128, Some((100, 0)), Some(3)),
        paged(&[(1, 70), (1, 5)], 1, 80, Some((31, 0)), Some(2)),
        paged(&[(1, 270)], 256, 256, Some((64, 0)), Some(2)),
        paged(&[(1, 270), (1, 3)], 16, 512, Some((64, 0)), Some(2)),
        paged(&[(1, 90), (1, 17)], 1, 264, None, Some(1)),
    ];
    for c in cases {
        let label = format!("decode {c:?}");
        assert_hidden_invisible(&label, &POISONS, |fill| run_paged16::<bf16>(be, &c, fill, true));
    }
}

/// FP8 caches hold their format's NaN / Inf codes in every hidden slot (E4M3: 0x7F / 0xFF; E5M2: ±Inf and
/// the NaNs): decode and paged prefill, split and not.
fn run_fp8<F>(be: &Backend, c: &Paged, fill: Fill, e5m2: bool, wrap: fn(u8) -> F, is_decode: bool) -> (Vec<u32>, usize)
where
    F: fused_attn::KvCacheOf<bf16> + DeviceRepr + Copy + Default,
{
    let (_, hkv) = c.heads;
    let q_lens: Vec<usize> = c.seqs.iter().map(|&(q, _)| if is_decode { 1 } else { q }).collect();
    let format = if e5m2 { Fp8Format::E5m2 } else { Fp8Format::E4m3 };
    let cache = build_cache(
        be,
        c,
        &q_lens,
        |rng, is_v| wrap(format.encode(if is_v { rng.uniform(-0.5, 1.0) } else { rng.uniform(-1.0, 1.0) } as f32)),
        |i| wrap(fill.fp8_code(e5m2, i)),
    );
    let scales = KvScales::per_head(&be.stream(), &vec![0.5; hkv], &vec![0.25; hkv]).unwrap();
    let view = cache.view().with_scales(&scales).unwrap();
    run_paged::<bf16, F>(be, c, &view, is_decode)
}

fn fp8_caches_hidden_codes(be: &Backend) {
    let dec = paged(&[(1, 150), (1, 33)], 16, 128, Some((60, 0)), Some(2));
    let dec512 = paged(&[(1, 150), (1, 33)], 8, 512, Some((60, 0)), Some(2));
    let pre = paged(&[(20, 170), (3, 64)], 16, 64, Some((64, 0)), Some(1));
    let pre_split = paged(&[(4, 200)], 1, 128, Some((80, 0)), Some(2));
    for (c, is_decode) in [(&dec, true), (&dec512, true), (&pre, false), (&pre_split, false)] {
        assert_hidden_invisible(&format!("fp8 e4m3 decode={is_decode} {c:?}"), &[Fill::Nan], |fill| {
            run_fp8::<Fp8E4m3>(be, c, fill, false, Fp8E4m3, is_decode)
        });
        assert_hidden_invisible(&format!("fp8 e5m2 decode={is_decode} {c:?}"), &POISONS, |fill| {
            run_fp8::<Fp8E5m2>(be, c, fill, true, Fp8E5m2, is_decode)
        });
    }
}

// ---- merge and append ----------------------------------------------------------------------------------

/// Merge: a state with LSE −inf (empty: a split with no key) may hold anything in its O; so may the gaps of
/// strided states. Row 5 has every state empty: O = 0, LSE = −inf either way.
fn merge_ignores_empty_states(be: &Backend) {
    let (k, n, h, d, dp) = (4usize, 3usize, 2usize, 64usize, 72usize);
    let run = |fill: Fill| {
        let mut rng = Rng::new(0x11);
        let mut o_states = vec![fill.value::<bf16>().to_f32(); k * n * h * dp];
        let mut lse = vec![0.0f32; k * n * h];
        for s in 0..k {
            for r in 0..n * h {
                let empty = (s + r) % 3 == 0 || r == 5;
                lse[s * n * h + r] = if empty { f32::NEG_INFINITY } else { rng.uniform(-2.0, 2.0) as f32 };
                if !empty {
                    for c in 0..d {
                        o_states[(s * n * h + r) * dp + c] = rng.uniform(-1.0, 1.0) as f32;
                    }
                }
            }
        }
        let (o_states, lse) = (be.buf(o_states), be.buf(lse));
        let mut o = be.buf(vec![bf16::NAN; n * h * d]);
        let mut lse_out = be.buf(vec![f32::NAN; n * h]);
        let st = [(n * h * dp) as i64, (h * dp) as i64, dp as i64, 1];
        merge_states(
            &be.stream(),
            &o_states.view([k, n, h, d], Some(st)),
            &lse.view([k, n, h], None),
            &mut o.view_mut([n, h, d], None),
            Some(&mut lse_out.view_mut([n, h], None)),
        )
        .unwrap();
        let (o, lse_out) = (o.host(be), lse_out.host(be));
        outcome(&o, &lse_out)
    };
    assert_hidden_invisible("merge", &POISONS, run);
}

/// Append: the new tokens whose slot is negative (padding) and the tokens' padding columns are never read,
/// and every cache slot append does not write keeps its bytes (its poison) exactly.
fn append_touches_only_its_slots(be: &Backend) {
    let (pages, ps, hkv, d, dp) = (4usize, 16usize, 2usize, 64usize, 80usize);
    let slots: Vec<i64> = vec![3, -1, 17, 18, -5, 63, 40];
    let tokens = slots.len();
    let run = |fill: Fill| {
        let mut rng = Rng::new(0x21);
        let mut k = vec![fill.value::<bf16>(); tokens * hkv * dp];
        let mut v = k.clone();
        for t in (0..tokens).filter(|&t| slots[t] >= 0) {
            for i in 0..hkv {
                for c in 0..d {
                    k[(t * hkv + i) * dp + c] = bf16::from_f64(rng.uniform(-1.0, 1.0));
                    v[(t * hkv + i) * dp + c] = bf16::from_f64(rng.uniform(-1.0, 1.0));
                }
            }
        }
        let len = pages * ps * hkv * d;
        let mut kc = be.buf(vec![bf16::NAN; len]);
        let mut vc = be.buf(vec![bf16::NEG_INFINITY; len]);
        let st = [(hkv * dp) as i64, dp as i64, 1];
        let (k, v, slot_buf) = (be.buf(k), be.buf(v), be.buf(slots.clone()));
        {
            let mut cache =
                PagedKvCacheMut::new(kc.view_mut([pages, ps, hkv, d], None), vc.view_mut([pages, ps, hkv, d], None))
                    .unwrap();
            append(
                &be.stream(),
                &k.view([tokens, hkv, d], Some(st)),
                &v.view([tokens, hkv, d], Some(st)),
                &slot_buf.view([tokens], None),
                &mut cache,
            )
            .unwrap();
        }
        let (kc, vc) = (kc.host(be), vc.host(be));
        let token = hkv * d;
        for s in (0..pages * ps).filter(|&s| !slots.contains(&(s as i64))) {
            assert!(kc[s * token..(s + 1) * token].iter().all(|x| x.is_nan()), "slot {s} of K written");
            assert!(vc[s * token..(s + 1) * token].iter().all(|&x| x == bf16::NEG_INFINITY), "slot {s} of V written");
        }
        outcome(&kc, &vc)
    };
    assert_hidden_invisible("append bf16", &POISONS, run);
}

/// The harness itself: a poison a kernel legitimately reads (a key every row sees) must reach the output,
/// so a fill that never lands cannot pass the tests above.
fn harness_detects_a_visible_poison(be: &Backend) {
    let (tq, tk, d) = (16usize, 64usize, 64usize);
    let mut qv = vec![bf16::from_f64(0.5); tq * d];
    qv[3] = bf16::from_f64(-0.25);
    let mut vv = vec![bf16::from_f64(0.3); tk * d];
    vv[0] = bf16::NAN; // key 0: seen by every row without a window
    let (q, k, v) = (be.buf(qv), be.buf(vec![bf16::from_f64(0.1); tk * d]), be.buf(vv));
    let mut o = be.buf(vec![bf16::ZERO; tq * d]);
    prefill(
        &be.stream(),
        &q.view([1, tq, 1, d], None),
        &k.view([1, tk, 1, d], None),
        &v.view([1, tk, 1, d], None),
        &mut o.view_mut([1, tq, 1, d], None),
        None,
        &PrefillOptions::default(),
    )
    .unwrap();
    assert!(o.host(be).iter().any(|x| x.is_nan()), "a visible NaN value must reach the output");
}

// ---- the tests: each on the emulator (CI) and on a GPU (the bundle; skipped without one) ---------------

/// The GPU twins run it through `Auto` (the sm_90a kernel on an H100) instead of forcing it.
#[test]
fn emulated_sm90_prefill_hidden_rows() {
    sm90_prefill_hidden_rows(&Backend::emu());
}

macro_rules! on_both {
    ($($body:ident => $emu:ident, $gpu:ident;)*) => {$(
        #[test]
        fn $emu() {
            $body(&Backend::emu());
        }
        #[test]
        fn $gpu() {
            if let Some(be) = Backend::gpu(stringify!($gpu)) {
                $body(&be);
            }
        }
    )*};
}

on_both! {
    dense_prefill_window_edges => emulated_dense_prefill_window_edges, gpu_dense_prefill_window_edges;
    dense_prefill_strided_gaps => emulated_dense_prefill_strided_gaps, gpu_dense_prefill_strided_gaps;
    varlen_prefill_neighbours => emulated_varlen_prefill_neighbours, gpu_varlen_prefill_neighbours;
    paged_prefill_window_edges => emulated_paged_prefill_window_edges, gpu_paged_prefill_window_edges;
    decode_hidden_slots => emulated_decode_hidden_slots, gpu_decode_hidden_slots;
    fp8_caches_hidden_codes => emulated_fp8_caches_hidden_codes, gpu_fp8_caches_hidden_codes;
    merge_ignores_empty_states => emulated_merge_ignores_empty_states, gpu_merge_ignores_empty_states;
    append_touches_only_its_slots => emulated_append_touches_only_its_slots, gpu_append_touches_only_its_slots;
    harness_detects_a_visible_poison => emulated_harness_detects_a_visible_poison, gpu_harness_detects_a_visible_poison;
}
