//! Issue 46, item 7: a property test of the validation layer. Random arguments for decode, paged prefill, append,
//! merge, dense prefill, MLA decode and mla_append — shapes (0, odd, mismatched), strides (0, negative, overlapping, huge), buffers too short,
//! block tables (ids out of range, repeated, −1, i32::MAX), seq_lens (negative, past the capacity,
//! i32::MAX), slot mappings (repeated, negative, past the pool), head dims, dtypes, split counts and
//! workspaces — run on the emulator, whose region checks fault on any access outside the launch's buffers,
//! half the time with the GPU's table semantics (`TableChecks::GpuMasking`: the kernels then meet the bad
//! entries). Every case must be a typed error naming an argument (not an emulator fault, not a nameless
//! launcher rejection) or a run the emulator finds clean; a panic fails the case. The seed is the suite's
//! (FA_SEED), the case count FA_PROP_CASES (default 400: the CI run); the count is printed.
use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};

use fused_attn::decode::{DecodeOptions, DecodeWorkspace};
use fused_attn::paged_prefill::PagedPrefillProblem;
use fused_attn::plan::DecodeProblem;
use fused_attn::prefill::{prefill, PrefillOptions};
use fused_attn::rope::{Rope, RopeStyle};
use fused_attn::score_mod::{AlibiSlopes, ScoreMod};
use fused_attn::testkit::seed::{case_seed, rng, FixtureRng};
use fused_attn::{
    append, decode, latent_cache, merge_states, mla_append, mla_decode, paged_prefill, Element, Emulator, ErrorKind,
    MlaAppendOptions, MlaDecodeOptions, MlaDims, MlaQueries, PagedKvCache, PagedKvCacheMut, PagedPrefillKernel,
    PagedPrefillOptions, PagedPrefillWorkspace, SplitPolicy, Stream, TableChecks, TensorView, TensorViewMut,
};
use half::{bf16, f16};
use rand::Rng;

/// Cases in a CI run; FA_PROP_CASES runs more (or fewer).
const DEFAULT_CASES: usize = 400;

/// One case's outcome: a clean run, or a typed error of some kind.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Outcome {
    Ran(String),
    Error(String),
}

/// What the property rejects, or the outcome it accepts.
fn judge(op: &str, r: fused_attn::Result<()>) -> Result<Outcome, String> {
    match r {
        Ok(()) => Ok(Outcome::Ran(op.to_string())),
        Err(e) => {
            let msg = e.message();
            // "<argument>: ..." (e.g. "window (right): ..."); a launcher's "<kernel> (emu): ..." names none.
            let named = msg
                .split_once(':')
                .is_some_and(|(head, _)| !head.is_empty() && !head.ends_with("(emu)") && !head.ends_with("(gpu)"));
            if e.kind() == &ErrorKind::Emulator {
                Err(format!("{op}: the emulator caught a fault: {msg}"))
            } else if !named || msg.contains("launcher rejected") || msg.contains("launcher status") {
                Err(format!("{op}: an error that names no argument: {:?} {msg}", e.kind()))
            } else {
                // FA_PROP_VERBOSE=1 tallies errors by the argument they name too.
                let arg = msg.split_once(':').map_or("", |(head, _)| head);
                let verbose = std::env::var("FA_PROP_VERBOSE").is_ok_and(|v| v == "1");
                Ok(Outcome::Error(if verbose {
                    format!("{op} {:?} {arg}", e.kind())
                } else {
                    format!("{op} {:?}", e.kind())
                }))
            }
        }
    }
}

/// Row-major strides of `shape`, then (sometimes) one dimension's stride replaced by an adversarial value.
fn strides<const N: usize>(r: &mut Gen, shape: [usize; N]) -> [i64; N] {
    let mut s = [0i64; N];
    let mut acc = 1i64;
    for d in (0..N).rev() {
        s[d] = acc;
        acc = acc.saturating_mul(shape[d].max(1) as i64);
    }
    if r.chaos() {
        let d = r.range(0..N);
        s[d] = match r.range(0..7) {
            0 => 0,
            1 => -1,
            2 => -s[d].max(1),
            3 => s[d].saturating_mul(2),
            4 => s[d] + 1,
            5 => 1 << 40,
            _ => (s[d] / 2).max(1),
        };
    }
    s
}

/// Elements a buffer for `shape` gets: enough for contiguous with slack, or (sometimes) one too few.
fn buffer_len(r: &mut Gen, shape: &[usize]) -> usize {
    let n = shape.iter().fold(1usize, |a, &x| a.saturating_mul(x)).min(1 << 20);
    if n > 0 && r.chaos() && r.bool(0.3) {
        n - 1
    } else {
        n * if r.bool(0.2) { 2 } else { 1 } + 8
    }
}

fn pick_of<T: Copy>(r: &mut FixtureRng, xs: &[T]) -> T {
    xs[r.random_range(0..xs.len())]
}

fn pick<T: Copy>(r: &mut Gen, xs: &[T]) -> T {
    xs[r.range(0..xs.len())]
}

/// The case's random source and how adversarial it is: `chaos` is the chance that a view gets an
/// adversarial stride or a short buffer (0 for a third of the cases, so the kernels run often).
struct Gen {
    r: FixtureRng,
    chaos: f64,
}

impl Gen {
    fn range<T: rand::distr::uniform::SampleUniform, R: rand::distr::uniform::SampleRange<T>>(
        &mut self,
        range: R,
    ) -> T {
        self.r.random_range(range)
    }
    fn bool(&mut self, p: f64) -> bool {
        self.r.random_bool(p)
    }
    fn chaos(&mut self) -> bool {
        let p = self.chaos;
        self.r.random_bool(p)
    }
}

fn head_dim(r: &mut Gen) -> usize {
    if !r.chaos() {
        pick(r, &[64, 64, 128, 32])
    } else {
        pick(r, &[0, 8, 72, 100, 520])
    }
}

/// A host view of `data` with (maybe adversarial) strides; its construction may be the case's error.
fn view<'a, T, const N: usize>(
    r: &mut Gen,
    data: &'a [T],
    shape: [usize; N],
) -> fused_attn::Result<TensorView<'a, T, N>> {
    let st = strides(r, shape);
    TensorView::host(data, shape).and_then(|v| v.with_strides(st))
}

fn view_mut<'a, T, const N: usize>(
    r: &mut Gen,
    data: &'a mut [T],
    shape: [usize; N],
) -> fused_attn::Result<TensorViewMut<'a, T, N>> {
    let st = strides(r, shape);
    TensorViewMut::host(data, shape).and_then(|v| v.with_strides(st))
}

/// A table entry: mostly in range, sometimes out of it.
fn table_entry(r: &mut Gen, pages: usize) -> i32 {
    if !r.chaos() && pages > 0 {
        r.range(0..pages as i32)
    } else {
        pick(r, &[-1, pages as i32, pages as i32 + 7, i32::MAX, i32::MIN])
    }
}

fn decode_case<T: Element>(r: &mut Gen, emu: &Emulator) -> fused_attn::Result<()> {
    let stream = Stream::Emu(emu);
    let (b, hkv, g) = (r.range(0..4), pick(r, &[1, 2]), pick(r, &[1, 2, 3]));
    let hq = if !r.chaos() { hkv * g } else { r.range(0..6) };
    let d = head_dim(r);
    let (pages, ps) = (r.range(1..6), if r.chaos() { 0 } else { pick(r, &[1, 3, 16]) });
    let width = if r.chaos() { 0 } else { r.range(1..4) };
    let capacity = (width * ps) as i32;
    let max_seq_len = if !r.chaos() { capacity.max(0) as usize } else { pick(r, &[0, 1, 1 << 31, usize::MAX]) };
    let table: Vec<i32> = (0..b * width).map(|_| table_entry(r, pages)).collect();
    let lens: Vec<i32> = (0..b)
        .map(|_| if !r.chaos() { r.range(0..=capacity.max(0)) } else { pick(r, &[-1, capacity + 1, i32::MAX]) })
        .collect();
    let kc: Vec<T> = vec![T::from_f64(0.5); buffer_len(r, &[pages, ps, hkv, d])];
    let vc = kc.clone();
    let q: Vec<T> = vec![T::from_f64(0.25); buffer_len(r, &[b, hq, d])];
    let mut o: Vec<T> = vec![T::nan(); buffer_len(r, &[b, hq, d])];
    let mut lse = vec![f32::NAN; buffer_len(r, &[b, hq])];
    let cache = PagedKvCache::new(
        view(r, &kc, [pages, ps, hkv, d])?,
        view(r, &vc, [pages, ps, hkv, d])?,
        view(r, &table, [b, width])?,
        view(r, &lens, [b])?,
        max_seq_len,
    )?;
    // Score variants and RoPE, sometimes, with values in range or not (lengths, strides, NaN, bounds).
    let value = |r: &mut Gen| if r.chaos() { pick(r, &[f32::NAN, f32::INFINITY, -3.0]) } else { 0.25 };
    let slopes: Vec<f32> = (0..buffer_len(r, &[b, hq])).map(|_| value(r)).collect();
    let sinks: Vec<f32> = (0..buffer_len(r, &[hq])).map(|_| value(r)).collect();
    let slope_len = if r.chaos() { r.range(0..8) } else { hq };
    let per_head = view(r, &slopes, [slope_len])?;
    let per_seq = view(r, &slopes, [b, slope_len])?;
    let sink_len = if r.chaos() { r.range(0..8) } else { hq };
    let sink_view = view(r, &sinks, [sink_len])?;
    let window = |r: &mut Gen| if r.chaos() { pick(r, &[-7, i32::MAX, i32::MIN]) } else { pick(r, &[-1, 0, 5, 100]) };
    let score_mod = ScoreMod {
        window: r.bool(0.3).then(|| (window(r), window(r))),
        softcap: r.bool(0.2).then(|| if r.chaos() { pick(r, &[0.0, -1.0, f32::NAN]) } else { 30.0 }),
        alibi_slopes: match r.range(0..5) {
            0 => Some(AlibiSlopes::PerHead(&per_head)),
            1 => Some(AlibiSlopes::PerSequence(&per_seq)),
            _ => None,
        },
        sinks: r.bool(0.2).then_some(&sink_view),
    };
    let rd = if r.chaos() { pick(r, &[0, 3, d + 2]) } else { pick(r, &[2, 32, d]) };
    let first_pos = if r.chaos() { 0 } else { 1 };
    let max_pos = r.range(first_pos..40);
    let cols = if r.chaos() { rd / 4 } else { rd / 2 + 1 };
    let table: Vec<f32> = vec![0.5; buffer_len(r, &[max_pos, cols])];
    let positions: Vec<i32> = (0..b)
        .map(|_| if r.chaos() { pick(r, &[-1, max_pos as i32, i32::MAX]) } else { r.range(0..max_pos.max(1) as i32) })
        .collect();
    let (cos, sin) = (view(r, &table, [max_pos, cols])?, view(r, &table, [max_pos, cols])?);
    let pos = view(r, &positions, [b])?;
    let rope = r.bool(0.2).then(|| Rope {
        cos: &cos,
        sin: &sin,
        positions: r.bool(0.5).then_some(&pos),
        rotary_dim: rd,
        style: pick(r, &[RopeStyle::Neox, RopeStyle::Gptj]),
    });
    let opts = DecodeOptions {
        num_splits: pick(r, &[None, None, Some(0), Some(1), Some(3), Some(70_000)]),
        score_mod,
        rope,
        ..Default::default()
    };
    let limits = DecodeProblem { batch: b.max(1), heads_q: hq, heads_kv: hkv, head_dim: d, max_seq_len };
    let kind = r.range(0..4);
    let opts = if kind == 0 || r.chaos() { opts } else { DecodeOptions { num_splits: None, ..opts } };
    let mut ws = match kind {
        0 => DecodeWorkspace::new(&stream, r.range(0..4096), r.range(0..64))?,
        1 => DecodeWorkspace::for_limits(&stream, &limits, pick(r, &[None, Some(2), Some(5)]))?,
        2 => DecodeWorkspace::scheduled_on(&stream, &limits, SplitPolicy::Balanced, r.range(1..64))?,
        _ => DecodeWorkspace::with_capacity(&stream, b, hq, d, pick(r, &[1, 4]))?,
    };
    let qv = view(r, &q, [b, hq, d])?;
    let mut ov = view_mut(r, &mut o, [b, hq, d])?;
    let mut lv = view_mut(r, &mut lse, [b, hq])?;
    let with_lse = r.bool(0.7);
    decode(&stream, &qv, &cache, &mut ov, with_lse.then_some(&mut lv), &mut ws, &opts).map(|_| ())
}

fn append_case<T: Element>(r: &mut Gen, emu: &Emulator) -> fused_attn::Result<()> {
    let stream = Stream::Emu(emu);
    let (n, hkv, d) = (r.range(0..5), pick(r, &[1, 2]), head_dim(r));
    let (pages, ps) = (r.range(0..5), pick(r, &[1, 4, 16, 0]));
    let pool = (pages * ps) as i64;
    let slots: Vec<i64> = (0..n)
        .map(|_| if !r.chaos() && pool > 0 { r.range(0..pool) } else { pick(r, &[-1, pool, i64::MAX, i64::MIN]) })
        .collect();
    let k: Vec<T> = vec![T::from_f64(1.0); buffer_len(r, &[n, hkv, d])];
    let v = k.clone();
    let mut kc: Vec<T> = vec![T::nan(); buffer_len(r, &[pages, ps, hkv, d])];
    let mut vc: Vec<T> = vec![T::nan(); buffer_len(r, &[pages, ps, hkv, d])];
    let kv = view(r, &k, [n, hkv, d])?;
    let vv = view(r, &v, [n, hkv, d])?;
    let sv = view(r, &slots, [n])?;
    let mut cache =
        PagedKvCacheMut::new(view_mut(r, &mut kc, [pages, ps, hkv, d])?, view_mut(r, &mut vc, [pages, ps, hkv, d])?)?;
    append(&stream, &kv, &vv, &sv, &mut cache)
}

fn paged_prefill_case<T: Element>(r: &mut Gen, emu: &Emulator) -> fused_attn::Result<()> {
    let stream = Stream::Emu(emu);
    let (b, hkv, g) = (r.range(0..4), pick(r, &[1, 2]), pick(r, &[1, 2, 4]));
    let hq = if !r.chaos() { hkv * g } else { r.range(0..6) };
    let d = head_dim(r);
    let (pages, ps) = (r.range(1..6), if r.chaos() { 0 } else { pick(r, &[1, 3, 16]) });
    let width = if r.chaos() { 0 } else { r.range(1..4) };
    let capacity = (width * ps) as i32;
    let max_seq_len = if !r.chaos() { capacity.max(0) as usize } else { pick(r, &[0, 1, 1 << 31, usize::MAX]) };
    let table: Vec<i32> = (0..b * width).map(|_| table_entry(r, pages)).collect();
    let lens: Vec<i32> = (0..b)
        .map(|_| if !r.chaos() { r.range(0..=capacity.max(0)) } else { pick(r, &[-1, capacity + 1, i32::MAX]) })
        .collect();
    // cu_seqlens_q: each sequence's new tokens (at most its length, usually), sometimes decreasing or past
    // the packed rows.
    let mut cu = vec![0i32];
    for &len in &lens {
        let q_len = if !r.chaos() { r.range(0..=len.clamp(0, 5)) } else { pick(r, &[-3, 7, i32::MAX / 2]) };
        cu.push(cu.last().copied().unwrap_or(0).saturating_add(q_len));
    }
    let total_q = if !r.chaos() { cu.last().copied().unwrap_or(0).max(0) as usize } else { r.range(0..12) };
    let max_seqlen_q = if !r.chaos() {
        cu.windows(2).map(|w| (w[1] - w[0]).max(0)).max().unwrap_or(0) as usize
    } else {
        r.range(0..9)
    };
    let kc: Vec<T> = vec![T::from_f64(0.5); buffer_len(r, &[pages, ps, hkv, d])];
    let vc = kc.clone();
    let q: Vec<T> = vec![T::from_f64(0.25); buffer_len(r, &[total_q, hq, d])];
    let mut o: Vec<T> = vec![T::nan(); buffer_len(r, &[total_q, hq, d])];
    let mut lse = vec![f32::NAN; buffer_len(r, &[hq, total_q])];
    let cache = PagedKvCache::new(
        view(r, &kc, [pages, ps, hkv, d])?,
        view(r, &vc, [pages, ps, hkv, d])?,
        view(r, &table, [b, width])?,
        view(r, &lens, [b])?,
        max_seq_len,
    )?;
    let num_splits =
        if r.chaos() { pick(r, &[Some(0), Some(70_000)]) } else { pick(r, &[None, None, Some(1), Some(3)]) };
    let kernel = pick(r, &[PagedPrefillKernel::Auto, PagedPrefillKernel::Tiled, PagedPrefillKernel::Streaming]);
    let opts = PagedPrefillOptions { num_splits, kernel, causal: r.bool(0.8), ..Default::default() };
    let limits = PagedPrefillProblem {
        batch: b.max(1),
        heads_q: hq,
        heads_kv: hkv,
        head_dim: d,
        total_q: total_q.max(1),
        max_seqlen_q: max_seqlen_q.max(1),
        max_seq_len,
    };
    let kind = r.range(0..3);
    let mut ws = match kind {
        0 => None,
        1 => Some(PagedPrefillWorkspace::with_capacity(&stream, total_q, hq, d, pick(r, &[1, 4]))?),
        _ => Some(PagedPrefillWorkspace::scheduled_on(&stream, &limits, SplitPolicy::Balanced, r.range(1..64))?),
    };
    let opts = if kind == 2 && !r.chaos() { PagedPrefillOptions { num_splits: None, ..opts } } else { opts };
    let qv = view(r, &q, [total_q, hq, d])?;
    let cv = view(r, &cu, [b + 1])?;
    let mut ov = view_mut(r, &mut o, [total_q, hq, d])?;
    let mut lv = view_mut(r, &mut lse, [hq, total_q])?;
    let with_lse = r.bool(0.7);
    paged_prefill(&stream, &qv, &cv, max_seqlen_q, &cache, &mut ov, with_lse.then_some(&mut lv), ws.as_mut(), &opts)
        .map(|_| ())
}

fn mla_dims(r: &mut Gen) -> MlaDims {
    if !r.chaos() {
        MlaDims { kv_lora_rank: pick(r, &[64, 128, 512]), rope_dim: pick(r, &[0, 16, 64]) }
    } else {
        MlaDims { kv_lora_rank: pick(r, &[0, 12, 520]), rope_dim: pick(r, &[8, 70]) }
    }
}

fn mla_decode_case<T: Element>(r: &mut Gen, emu: &Emulator) -> fused_attn::Result<()> {
    let stream = Stream::Emu(emu);
    let dims = mla_dims(r);
    let row = dims.kv_lora_rank + dims.rope_dim;
    let (b, hq) = (r.range(0..4), pick(r, &[1, 8, 16]));
    let (pages, ps) = (r.range(1..5), if r.chaos() { 0 } else { pick(r, &[1, 16, 64]) });
    let width = if r.chaos() { 0 } else { r.range(1..3) };
    let capacity = (width * ps) as i32;
    let max_seq_len = if !r.chaos() { capacity.max(0) as usize } else { pick(r, &[0, 1 << 31, usize::MAX]) };
    let table: Vec<i32> = (0..b * width).map(|_| table_entry(r, pages)).collect();
    let lens: Vec<i32> = (0..b)
        .map(|_| if !r.chaos() { r.range(0..=capacity.max(0)) } else { pick(r, &[-1, capacity + 1, i32::MAX]) })
        .collect();
    // One query token per sequence, or packed tokens through cu_seqlens_q.
    let packed = r.bool(0.4);
    let mut cu = vec![0i32];
    for &len in &lens {
        let q_len = if !r.chaos() { r.range(0..=len.clamp(0, 3)) } else { pick(r, &[-2, 5, i32::MAX / 2]) };
        cu.push(cu.last().copied().unwrap_or(0).saturating_add(q_len));
    }
    let total_q = if !packed {
        b
    } else if !r.chaos() {
        cu.last().copied().unwrap_or(0).max(0) as usize
    } else {
        r.range(0..8)
    };
    let max_seqlen_q = if !r.chaos() {
        cu.windows(2).map(|w| (w[1] - w[0]).max(0)).max().unwrap_or(0) as usize
    } else {
        r.range(0..5)
    };
    let latent: Vec<T> = vec![T::from_f64(0.5); buffer_len(r, &[pages, ps, 1, row])];
    let q: Vec<T> = vec![T::from_f64(0.25); buffer_len(r, &[total_q, hq, row])];
    let mut o: Vec<T> = vec![T::nan(); buffer_len(r, &[total_q, hq, dims.kv_lora_rank])];
    let mut lse = vec![f32::NAN; buffer_len(r, &[total_q, hq])];
    let cache = latent_cache(
        view(r, &latent, [pages, ps, 1, row])?,
        view(r, &table, [b, width])?,
        view(r, &lens, [b])?,
        max_seq_len,
    )?;
    let cu_view = view(r, &cu, [b + 1])?;
    let queries = packed.then_some(MlaQueries { cu_seqlens_q: &cu_view, max_seqlen_q });
    let num_splits =
        if r.chaos() { pick(r, &[Some(0), Some(70_000)]) } else { pick(r, &[None, None, Some(1), Some(3)]) };
    let opts = MlaDecodeOptions { scale: if r.chaos() { f32::NAN } else { 0.1 }, dims, num_splits, queries };
    let mut ws = match r.range(0..2) {
        0 => DecodeWorkspace::new(&stream, r.range(0..1 << 16), r.range(0..256))?,
        _ => DecodeWorkspace::with_capacity(&stream, total_q, hq, dims.kv_lora_rank, pick(r, &[1, 4]))?,
    };
    let qv = view(r, &q, [total_q, hq, row])?;
    let mut ov = view_mut(r, &mut o, [total_q, hq, dims.kv_lora_rank])?;
    let mut lv = view_mut(r, &mut lse, [total_q, hq])?;
    let with_lse = r.bool(0.7);
    mla_decode(&stream, &qv, &cache, &mut ov, with_lse.then_some(&mut lv), &mut ws, &opts).map(|_| ())
}

fn mla_append_case<T: Element>(r: &mut Gen, emu: &Emulator) -> fused_attn::Result<()> {
    let stream = Stream::Emu(emu);
    let dims = mla_dims(r);
    let row = dims.kv_lora_rank + dims.rope_dim;
    let (n, pages, ps) = (r.range(0..5), r.range(0..4), if r.chaos() { 0 } else { pick(r, &[1, 16]) });
    let pool = (pages * ps) as i64;
    let slots: Vec<i64> = (0..n)
        .map(|_| if !r.chaos() && pool > 0 { r.range(0..pool) } else { pick(r, &[-1, pool, i64::MAX]) })
        .collect();
    let latent: Vec<T> = vec![T::from_f64(1.0); buffer_len(r, &[n, dims.kv_lora_rank])];
    let k_pe: Vec<T> = vec![T::from_f64(0.5); buffer_len(r, &[n, dims.rope_dim])];
    let mut cache: Vec<T> = vec![T::nan(); buffer_len(r, &[pages, ps, 1, row])];
    let lv = view(r, &latent, [n, dims.kv_lora_rank])?;
    let kv = view(r, &k_pe, [n, dims.rope_dim])?;
    let sv = view(r, &slots, [n])?;
    let mut cv = view_mut(r, &mut cache, [pages, ps, 1, row])?;
    mla_append(&stream, &lv, &kv, &sv, &mut cv, &MlaAppendOptions { dims, rope: None, scale: None })
}

fn merge_case(r: &mut Gen, emu: &Emulator) -> fused_attn::Result<()> {
    let stream = Stream::Emu(emu);
    let (k, n, h, d) = (r.range(0..4), r.range(0..4), r.range(0..3), head_dim(r));
    let states: Vec<f32> = vec![0.5; buffer_len(r, &[k, n, h, d])];
    let lses: Vec<f32> = (0..buffer_len(r, &[k, n, h]))
        .map(|_| pick(r, &[0.0, -1.5, f32::NEG_INFINITY, f32::INFINITY, f32::NAN, 3.0]))
        .collect();
    let mut o: Vec<bf16> = vec![bf16::NAN; buffer_len(r, &[n, h, d])];
    let mut lse = vec![f32::NAN; buffer_len(r, &[n, h])];
    let sv = view(r, &states, [k, n, h, d])?;
    let lv = view(r, &lses, [k, n, h])?;
    let mut ov = view_mut(r, &mut o, [n, h, d])?;
    let mut lo = view_mut(r, &mut lse, [n, h])?;
    merge_states::<f32, bf16>(&stream, &sv, &lv, &mut ov, r.bool(0.5).then_some(&mut lo))
}

fn prefill_case<T: Element>(r: &mut Gen, emu: &Emulator) -> fused_attn::Result<()> {
    let stream = Stream::Emu(emu);
    let (b, tq, tk, hkv, g) = (r.range(0..3), r.range(0..40), r.range(0..40), pick(r, &[1, 2]), pick(r, &[1, 2]));
    let hq = if r.bool(0.9) { hkv * g } else { 3 };
    let d = head_dim(r);
    let q: Vec<T> = vec![T::from_f64(0.25); buffer_len(r, &[b, tq, hq, d])];
    let k: Vec<T> = vec![T::from_f64(0.5); buffer_len(r, &[b, tk, hkv, d])];
    let mut o: Vec<T> = vec![T::nan(); buffer_len(r, &[b, tq, hq, d])];
    let mut lse = vec![f32::NAN; buffer_len(r, &[b, hq, tq])];
    let qv = view(r, &q, [b, tq, hq, d])?;
    let kv = view(r, &k, [b, tk, hkv, d])?;
    let vv = view(r, &k, [b, tk, hkv, d])?;
    let mut ov = view_mut(r, &mut o, [b, tq, hq, d])?;
    let mut lv = view_mut(r, &mut lse, [b, hq, tq])?;
    let opts = PrefillOptions { causal: r.bool(0.5), ..Default::default() };
    prefill(&stream, &qv, &kv, &vv, &mut ov, r.bool(0.5).then_some(&mut lv), &opts)
}

#[test]
fn every_case_is_a_named_error_or_a_clean_run() {
    let cases = std::env::var("FA_PROP_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(DEFAULT_CASES);
    let base = fused_attn::testkit::seed::base_seed();
    let mut tally: BTreeMap<Outcome, usize> = BTreeMap::new();
    let mut failures = Vec::new();
    for i in 0..cases {
        let seed = case_seed(base, 0x46_0000 + i as u64);
        let mut r = rng(seed);
        let chaos = pick_of(&mut r, &[0.0, 0.05, 0.3]);
        let mut r = Gen { r, chaos };
        let checks = if r.bool(0.5) { TableChecks::Strict } else { TableChecks::GpuMasking };
        let emu = Emulator::new().with_table_checks(checks);
        let op = pick(
            &mut r,
            &["decode", "decode_f16", "append", "merge", "prefill", "paged_prefill", "mla_decode", "mla_append"],
        );
        let run = catch_unwind(AssertUnwindSafe(|| match op {
            "decode" => decode_case::<bf16>(&mut r, &emu),
            "decode_f16" => decode_case::<f16>(&mut r, &emu),
            "append" => append_case::<bf16>(&mut r, &emu),
            "merge" => merge_case(&mut r, &emu),
            "paged_prefill" => paged_prefill_case::<bf16>(&mut r, &emu),
            "mla_decode" => mla_decode_case::<bf16>(&mut r, &emu),
            "mla_append" => mla_append_case::<f16>(&mut r, &emu),
            _ => prefill_case::<bf16>(&mut r, &emu),
        }));
        match run {
            Err(_) => failures.push(format!("case {i} (seed {seed:#x}, {op}, {checks:?}): panicked")),
            Ok(res) => match judge(op, res) {
                Ok(outcome) => *tally.entry(outcome).or_default() += 1,
                Err(why) => failures.push(format!("case {i} (seed {seed:#x}, {checks:?}): {why}")),
            },
        }
    }
    println!("validation property: {cases} cases tried (base seed {base:#x}): {} failed", failures.len());
    for (outcome, count) in &tally {
        println!("  {count:5}  {outcome:?}");
    }
    assert!(failures.is_empty(), "{} of {cases} cases broke the property:\n{}", failures.len(), failures.join("\n"));
}
