//! MLA (multi-head latent attention, docs/mla.md) on the emulator: decode against the fp64 absorbed-form
//! reference (heads 16..128, q_len 1 and 2..4 with causal offsets, pages 1/16/64, splits, both dtypes),
//! hidden memory poisoned with NaN / ±Inf (bitwise the zero-fill result), holes, the cost counters against
//! their model, append bit for bit (with and without RoPE), and bad arguments by error kind. The FP8 latent
//! cache (E4M3, E5M2): the sweep against the reference over the stored (dequantised) cache, the quantisation
//! error against the 16-bit cache bounded, hidden FP8 NaN / Inf codes, the halved cache bytes, append's codes
//! bit for bit the model's.

use fused_attn::fp8::Fp8Element;
use fused_attn::half::{bf16, f16};
use fused_attn::mla::{
    latent_cache, latent_cache_fp8, mla_append, mla_decode, MlaAppendOptions, MlaDecodeOptions, MlaDims, MlaQueries,
};
use fused_attn::reference::{compare_bounded, compare_lse, mla as mla_ref, Arith, PagedCache};
use fused_attn::rope::{rotate_row_f32, Rope, RopeConfig, RopeStyle};
use fused_attn::{
    DecodeWorkspace, Element, Emulator, ErrorKind, Fp8E4m3, Fp8E5m2, Fp8Format, KvCacheOf, KvElement, LaunchCounters,
    Stream, TableChecks, TensorView, TensorViewMut,
};

use crate::common::case_seed;
use fused_attn::testkit::cases::mla::Rng;

#[derive(Clone, Debug)]
struct Case {
    heads_q: usize,
    seq_lens: Vec<usize>,
    /// None: one token per sequence (plain decode); else q_len per sequence.
    q_lens: Option<Vec<usize>>,
    page_size: usize,
    splits: Option<usize>,
    dims: MlaDims,
    /// Pages of the block table that are holes (entry -1) among a sequence's used ones: (sequence, page).
    holes: Vec<(usize, usize)>,
}

impl Case {
    fn new(heads_q: usize, seq_lens: &[usize], page_size: usize) -> Self {
        Case {
            heads_q,
            seq_lens: seq_lens.to_vec(),
            q_lens: None,
            page_size,
            splits: None,
            dims: MlaDims::default(),
            holes: Vec::new(),
        }
    }
    fn q_lens(&self) -> Vec<usize> {
        self.q_lens.clone().unwrap_or_else(|| vec![1; self.seq_lens.len()])
    }
}

/// A case's inputs: the latent cache (hidden slots at a placeholder), its table, q.
struct Inputs {
    cache: Vec<f64>, // [num_pages, page, 1, row]; NaN marks hidden slots (filled per run)
    num_pages: usize,
    table: Vec<i32>,
    width: usize,
    q: Vec<f64>,
    cu: Vec<i32>,
}

fn make_inputs(c: &Case, seed: u64) -> Inputs {
    let mut rng = Rng::new(seed);
    let row = c.dims.row_dim();
    let b = c.seq_lens.len();
    let pages: Vec<usize> = c.seq_lens.iter().map(|&l| l.div_ceil(c.page_size).max(1)).collect();
    let width = pages.iter().copied().max().unwrap_or(1) + 1;
    let num_pages = pages.iter().sum::<usize>() + 2; // two pages no table names
                                                     // Pages handed out in a shuffled order; page 0 is an ordinary page.
    let mut order: Vec<usize> = (0..num_pages).collect();
    for i in (1..order.len()).rev() {
        order.swap(i, rng.below(i + 1));
    }
    let mut table = vec![0i32; b * width];
    let mut next = 0;
    let mut cache = vec![f64::NAN; num_pages * c.page_size * row];
    for s in 0..b {
        for p in 0..width {
            // Columns past the sequence's pages name an unused (poisoned) page: never read.
            table[s * width + p] = if p < pages[s] { order[next + p] as i32 } else { order[num_pages - 1] as i32 };
        }
        for j in 0..c.seq_lens[s] {
            let page = table[s * width + j / c.page_size] as usize;
            let at = (page * c.page_size + j % c.page_size) * row;
            for (e, x) in cache[at..at + row].iter_mut().enumerate() {
                // Offset from zero (outputs are then not ~0); rope columns their own scale.
                *x = if e < c.dims.kv_lora_rank { 0.4 + 0.6 * rng.next() } else { 0.8 * rng.next() };
            }
        }
        next += pages[s];
    }
    for &(s, p) in &c.holes {
        // A hole: the entry is out of range; its page's old rows stay in the pool (poisoned by the run).
        let page = table[s * width + p] as usize;
        cache[page * c.page_size * row..(page + 1) * c.page_size * row].fill(f64::NAN);
        table[s * width + p] = -1;
    }
    let q_lens = c.q_lens();
    let mut cu = vec![0i32];
    for &l in &q_lens {
        cu.push(cu.last().unwrap() + l as i32);
    }
    let total_q = *cu.last().unwrap() as usize;
    let q = (0..total_q * c.heads_q * row).map(|_| 0.1 + 0.9 * rng.next()).collect();
    Inputs { cache, num_pages, table, width, q, cu }
}

struct RunOut<T> {
    o: Vec<T>,
    lse: Vec<f32>,
    counters: LaunchCounters,
}

/// The MLA decode of case `c` over the latent cache `lc` on `emu` (NaN-poisoned outputs), with its counters.
fn decode_into<T: Element, C: KvCacheOf<T>>(
    emu: &Emulator,
    c: &Case,
    inp: &Inputs,
    q: &[T],
    lc: &fused_attn::PagedKvCache<'_, C>,
    scale: f32,
) -> fused_attn::Result<RunOut<T>> {
    let stream = Stream::Emu(emu);
    let (b, total_q) = (c.seq_lens.len(), *inp.cu.last().unwrap() as usize);
    let cu_v = TensorView::host(&inp.cu, [b + 1])?;
    let mut o = vec![T::nan(); total_q * c.heads_q * c.dims.kv_lora_rank];
    let mut lse = vec![f32::NAN; total_q * c.heads_q];
    let mut ws = DecodeWorkspace::with_capacity(&stream, total_q, c.heads_q, c.dims.kv_lora_rank, 64)?;
    let mut opts = MlaDecodeOptions::new(scale);
    opts.dims = c.dims;
    opts.num_splits = c.splits;
    let max_q = c.q_lens().into_iter().max().unwrap_or(1);
    if c.q_lens.is_some() {
        opts.queries = Some(MlaQueries { cu_seqlens_q: &cu_v, max_seqlen_q: max_q });
    }
    mla_decode(
        &stream,
        &TensorView::host(q, [total_q, c.heads_q, c.dims.row_dim()])?,
        lc,
        &mut TensorViewMut::host(&mut o, [total_q, c.heads_q, c.dims.kv_lora_rank])?,
        Some(&mut TensorViewMut::host(&mut lse, [total_q, c.heads_q])?),
        &mut ws,
        &opts,
    )?;
    Ok(RunOut { o, lse, counters: emu.last_launch_counters().expect("counters") })
}

/// Runs a case's MLA decode with hidden memory (NaN placeholders of the cache) set to `hidden`.
fn run<T: Element + KvElement>(c: &Case, inp: &Inputs, hidden: f32, scale: f32) -> fused_attn::Result<RunOut<T>> {
    let emu = Emulator::new().with_table_checks(TableChecks::GpuMasking);
    let row = c.dims.row_dim();
    let cache: Vec<T> =
        inp.cache.iter().map(|&x| T::from_f64(if x.is_nan() { f64::from(hidden) } else { x })).collect();
    let q: Vec<T> = inp.q.iter().map(|&x| T::from_f64(x)).collect();
    let lens: Vec<i32> = c.seq_lens.iter().map(|&l| l as i32).collect();
    let b = c.seq_lens.len();
    let max_len = c.seq_lens.iter().copied().max().unwrap_or(0);
    let cache_v = TensorView::host(&cache, [inp.num_pages, c.page_size, 1, row])?;
    let table_v = TensorView::host(&inp.table, [b, inp.width])?;
    let lens_v = TensorView::host(&lens, [b])?;
    let lc = latent_cache(cache_v, table_v, lens_v, max_len)?;
    decode_into(&emu, c, inp, &q, &lc, scale)
}

/// Checks a run against the fp64 absorbed reference and its naive twin (tolerance rule + arithmetic bound).
fn check<T: Element + KvElement>(name: &str, c: &Case, inp: &Inputs, out: &RunOut<T>, scale: f32) {
    // The cache as the kernel sees it (hidden slots are never read by the reference either).
    let cache: Vec<f64> = inp.cache.iter().map(|&x| if x.is_nan() { x } else { T::from_f64(x).to_f64() }).collect();
    check_over(name, c, inp, &cache, &cache, out, scale);
}

/// The fp64 reference (F64) over the cache values `k_cache` (scores) and `v_cache` (V), and `out`'s rel-L2
/// error against it.
fn reference_over<T: Element>(
    c: &Case,
    inp: &Inputs,
    k_cache: &[f64],
    v_cache: &[f64],
    scale: f32,
    ar: Arith,
) -> Vec<f64> {
    let lens: Vec<i32> = c.seq_lens.iter().map(|&l| l as i32).collect();
    let pc = PagedCache {
        k_cache,
        v_cache,
        num_pages: inp.num_pages,
        page_size: c.page_size,
        heads_kv: 1,
        head_dim: c.dims.row_dim(),
        head_dim_v: c.dims.row_dim(),
        block_table: &inp.table,
        max_pages_per_seq: inp.width,
        seq_lens: &lens,
    };
    let q: Vec<f64> = inp.q.iter().map(|&x| T::from_f64(x).to_f64()).collect();
    mla_ref::mla_decode(c.dims.kv_lora_rank, c.heads_q, f64::from(scale), ar, &inp.cu, &q, &pc).unwrap().out
}

/// [`check`] over given cache values: `k_cache` what the scores read, `v_cache` what V reads (FP8: the codes
/// times the K and the V scale).
#[allow(clippy::too_many_arguments)]
fn check_over<T: Element + KvElement>(
    name: &str,
    c: &Case,
    inp: &Inputs,
    k_cache: &[f64],
    v_cache: &[f64],
    out: &RunOut<T>,
    scale: f32,
) {
    let row = c.dims.row_dim();
    let cache = k_cache;
    let q: Vec<f64> = inp.q.iter().map(|&x| T::from_f64(x).to_f64()).collect();
    let lens: Vec<i32> = c.seq_lens.iter().map(|&l| l as i32).collect();
    let pc = PagedCache {
        k_cache: cache,
        v_cache,
        num_pages: inp.num_pages,
        page_size: c.page_size,
        heads_kv: 1,
        head_dim: row,
        head_dim_v: row,
        block_table: &inp.table,
        max_pages_per_seq: inp.width,
        seq_lens: &lens,
    };
    let s = f64::from(scale);
    let r64 = mla_ref::mla_decode(c.dims.kv_lora_rank, c.heads_q, s, Arith::F64, &inp.cu, &q, &pc).unwrap();
    let naive =
        mla_ref::mla_decode(c.dims.kv_lora_rank, c.heads_q, s, Arith::Lowp(T::DTYPE), &inp.cu, &q, &pc).unwrap();
    let ours: Vec<f64> = out.o.iter().map(|x| x.to_f64()).collect();
    let bound = r64.out_bound(Some(T::DTYPE), Some(T::DTYPE));
    let cmp = compare_bounded(&ours, &r64.out, &naive.out, &bound);
    let lse: Vec<f64> = out.lse.iter().map(|&x| f64::from(x)).collect();
    let tol = 1e-3
        + 16.0 * f64::from(f32::EPSILON) * r64.lse.iter().filter(|x| x.is_finite()).fold(0.0f64, |a, x| a.max(x.abs()));
    let lse_cmp = compare_lse(&lse, &r64.lse, tol);
    assert!(
        cmp.passed && lse_cmp.passed,
        "{name} {c:?}: o max err {:.3e} (tol {:.3e}, bound ratio {:.2}, rel-L2 {:.2e}); lse max err {:.3e} (tol {tol:.1e})",
        cmp.max_abs_err,
        cmp.tolerance,
        cmp.bound_ratio,
        cmp.rel_l2_err,
        lse_cmp.max_abs_err
    );
}

const DEEPSEEK_SCALE: f32 = 0.072_168_78; // 1/sqrt(192)

fn sweep_case(i: usize, c: &Case) {
    if !crate::common::case_selected(i) {
        return;
    }
    let seed = case_seed(9000 + i);
    let inp = make_inputs(c, seed);
    let scale = if i % 3 == 2 { 0.25 } else { DEEPSEEK_SCALE };
    if i % 2 == 0 {
        let out = run::<bf16>(c, &inp, f32::NAN, scale).unwrap();
        check(&format!("case {i} (seed {seed:#x}) bf16"), c, &inp, &out, scale);
    } else {
        let out = run::<f16>(c, &inp, f32::NAN, scale).unwrap();
        check(&format!("case {i} (seed {seed:#x}) f16"), c, &inp, &out, scale);
    }
}

/// Heads 16/32/64/128, pages 1/16/64, one token and 2..4 (MTP / spec-verify), planned and forced splits.
#[test]
fn decode_sweep_matches_reference() {
    let mut cases = Vec::new();
    cases.push(Case::new(16, &[1, 37, 200], 16));
    cases.push(Case::new(32, &[130, 5], 1));
    cases.push(Case { splits: Some(3), ..Case::new(64, &[333], 64) });
    cases.push(Case::new(128, &[70, 0], 16));
    cases.push(Case { q_lens: Some(vec![2, 4, 1]), ..Case::new(16, &[50, 77, 3], 16) });
    cases.push(Case { q_lens: Some(vec![3]), splits: Some(2), ..Case::new(128, &[150], 64) });
    cases.push(Case { q_lens: Some(vec![4, 2]), ..Case::new(32, &[2, 90], 1) }); // q_len > seq_len: empty rows
    cases.push(Case { splits: Some(4), ..Case::new(16, &[1100], 16) });
    cases.push(Case { holes: vec![(0, 1), (1, 0)], ..Case::new(16, &[70, 40], 16) });
    cases.push(Case {
        dims: MlaDims { kv_lora_rank: 256, rope_dim: 32 },
        q_lens: Some(vec![2]),
        ..Case::new(16, &[45], 16)
    });
    for (i, c) in cases.iter().enumerate() {
        sweep_case(i, c);
    }
}

/// A long context split over many CTAs (the planner's choice), the merge over 512 columns.
#[test]
fn decode_long_context_planned_splits() {
    let c = Case::new(16, &[3000], 64);
    sweep_case(100, &c);
}

/// Hidden memory (slots past seq_len, unused pages, table columns past a sequence, holes' pages) never
/// reaches an output: NaN, +Inf and -Inf there give bitwise the zero-fill result.
#[test]
fn hidden_memory_is_never_read() {
    let c = Case { q_lens: Some(vec![2, 1]), splits: Some(2), holes: vec![(1, 2)], ..Case::new(16, &[67, 100], 16) };
    let inp = make_inputs(&c, case_seed(9500));
    let zero = run::<bf16>(&c, &inp, 0.0, DEEPSEEK_SCALE).unwrap();
    check("poison zero", &c, &inp, &zero, DEEPSEEK_SCALE);
    for v in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let p = run::<bf16>(&c, &inp, v, DEEPSEEK_SCALE).unwrap();
        let same = zero.o.iter().zip(&p.o).all(|(a, b)| a.to_bits() == b.to_bits())
            && zero.lse.iter().zip(&p.lse).all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "hidden value {v} changed an output bit");
    }
}

/// Cost counters against the model: each CTA (a sequence's block of 32 packed rows, a split) reads exactly
/// the cache rows its rows see, once (576 x 2 bytes each), and its q rows once; no split writes only o/LSE.
#[test]
fn cost_counters_match_the_model() {
    for (c, name) in [
        (Case::new(128, &[100, 37], 16), "Hq 128, one token"),
        (Case::new(16, &[300], 16), "Hq 16, one token"),
        (Case { q_lens: Some(vec![3]), ..Case::new(16, &[80], 1) }, "Hq 16, q_len 3"),
        (Case { splits: Some(3), ..Case::new(64, &[200], 64) }, "Hq 64, 3 splits"),
    ] {
        let inp = make_inputs(&c, case_seed(9600));
        let out = run::<bf16>(&c, &inp, f32::NAN, DEEPSEEK_SCALE).unwrap();
        let row_bytes = (c.dims.row_dim() * 2) as u64;
        let (mut cache_bytes, mut q_bytes) = (0u64, 0u64);
        let splits = c.splits.unwrap_or(1) as u64;
        let max_len = c.seq_lens.iter().copied().max().unwrap_or(0) as u64;
        for (s, (&len, &ql)) in c.seq_lens.iter().zip(&c.q_lens()).enumerate() {
            let _ = s;
            let rows = ql * c.heads_q;
            for r0 in (0..rows).step_by(32) {
                let last = (r0 + 32).min(rows) - 1;
                let last_pos = len as i64 - ql as i64 + (last / c.heads_q) as i64;
                let span = (last_pos + 1).clamp(0, len as i64) as u64;
                cache_bytes += span * row_bytes;
                q_bytes += ((r0 + 32).min(rows) - r0) as u64 * row_bytes * splits;
            }
        }
        let k = out.counters.kernel("mla_decode").expect("mla_decode kernel");
        assert_eq!(k.read_of("k_cache"), cache_bytes, "{name}: cache bytes");
        assert_eq!(k.read_of("v_cache"), 0, "{name}: V is the K rows, never read again");
        assert_eq!(k.read_of("q"), q_bytes, "{name}: q bytes");
        let total_q = c.q_lens().iter().sum::<usize>() as u64;
        let o_bytes = total_q * c.heads_q as u64 * c.dims.kv_lora_rank as u64 * 2;
        if splits == 1 {
            assert_eq!(k.written_of("o"), o_bytes, "{name}: o bytes");
            assert_eq!(out.counters.kernels.len(), 1, "{name}: no merge");
        } else {
            assert_eq!(k.written_of("partial_o"), splits * o_bytes * 2, "{name}: fp32 partials");
            assert!(out.counters.kernel("merge_states").is_some(), "{name}: merged");
        }
        // Tensor work: per 16-token tile and busy row group (16 of the CTA's rows; an empty one skips the math),
        // 4 column warps x (9 QK k-steps x 2 n-tiles + 16 PV n-tiles).
        let group_tiles: u64 = c
            .seq_lens
            .iter()
            .zip(&c.q_lens())
            .map(|(&len, &ql)| {
                let rows = ql * c.heads_q;
                (0..rows)
                    .step_by(32)
                    .map(|r0| {
                        let last = (r0 + 32).min(rows) - 1;
                        let groups = ((last - r0) / 16 + 1) as u64;
                        let span = (len as i64 - ql as i64 + (last / c.heads_q) as i64 + 1).clamp(0, len as i64) as u64;
                        let per_split = max_len.div_ceil(splits).div_ceil(64) * 64; // the planner's split_tokens
                        let tiles: u64 = if splits == 1 {
                            span.div_ceil(16)
                        } else {
                            (0..splits).map(|sp| span.saturating_sub(sp * per_split).min(per_split).div_ceil(16)).sum()
                        };
                        groups * tiles
                    })
                    .sum::<u64>()
            })
            .sum();
        eprintln!(
            "{name}: shared bytes read+written per global cache byte {:.2}",
            (k.shared_bytes_read + k.shared_bytes_written) as f64 / cache_bytes as f64
        );
        assert_eq!(k.mma, group_tiles * 4 * (9 * 2 + 16), "{name}: mma");
    }
}

/// Append writes [latent | k_pe] into the slot's row bit for bit, skips padding, leaves every other byte.
#[test]
fn append_writes_rows_bitwise() {
    let emu = Emulator::new();
    let stream = Stream::Emu(&emu);
    let dims = MlaDims::default();
    let (pages, page, n) = (5, 4, 6);
    let row = dims.row_dim();
    let mut rng = Rng::new(case_seed(9700));
    let latent: Vec<bf16> = (0..n * 512).map(|_| bf16::from_f64(rng.next())).collect();
    let k_pe: Vec<bf16> = (0..n * 64).map(|_| bf16::from_f64(rng.next())).collect();
    let slots: Vec<i64> = vec![3, 17, -1, 0, 8, 19];
    for style in [None, Some(RopeStyle::Gptj), Some(RopeStyle::Neox)] {
        let with_rope = style.is_some();
        let style = style.unwrap_or_default();
        let poison = bf16::from_bits(0x7fc1);
        let mut cache = vec![poison; pages * page * row];
        let positions: Vec<i32> = (0..n as i32).map(|t| 5 + 7 * t).collect();
        let table = RopeConfig::new(10000.0, 64, style).table(64).unwrap();
        let cos_v = TensorView::host(&table.cos, [64, 32]).unwrap();
        let sin_v = TensorView::host(&table.sin, [64, 32]).unwrap();
        let pos_v = TensorView::host(&positions, [n]).unwrap();
        let rope = Rope { cos: &cos_v, sin: &sin_v, positions: Some(&pos_v), rotary_dim: 64, style };
        let opts = MlaAppendOptions { dims, rope: with_rope.then_some(rope), scale: None };
        mla_append(
            &stream,
            &TensorView::host(&latent, [n, 512]).unwrap(),
            &TensorView::host(&k_pe, [n, 64]).unwrap(),
            &TensorView::host(&slots, [n]).unwrap(),
            &mut TensorViewMut::host(&mut cache, [pages, page, 1, row]).unwrap(),
            &opts,
        )
        .unwrap();
        let mut written = vec![false; pages * page];
        for t in 0..n {
            if slots[t] < 0 {
                continue;
            }
            let at = slots[t] as usize * row;
            written[slots[t] as usize] = true;
            assert_eq!(&cache[at..at + 512], &latent[t * 512..][..512], "latent of token {t}");
            let mut pe: Vec<f32> = k_pe[t * 64..][..64].iter().map(|x| x.to_f32()).collect();
            if with_rope {
                let p = positions[t] as usize;
                rotate_row_f32(&mut pe, 64, style, |i| table.at(p, i));
            }
            let want: Vec<bf16> = pe.iter().map(|&x| bf16::from_f32(x)).collect();
            assert_eq!(&cache[at + 512..at + row], &want[..], "rope key of token {t} (rope {with_rope})");
        }
        for (s, w) in written.iter().enumerate() {
            if !w {
                assert!(cache[s * row..(s + 1) * row].iter().all(|x| x.to_bits() == 0x7fc1), "slot {s} was touched");
            }
        }
    }
}

/// Bad arguments fail by kind, naming the argument.
#[test]
fn bad_arguments_are_typed_errors() {
    let emu = Emulator::new();
    let stream = Stream::Emu(&emu);
    let cache = vec![bf16::ZERO; 2 * 16 * 576];
    let table = vec![0i32, 1];
    let lens = vec![5i32];
    let q = vec![bf16::ONE; 16 * 576];
    let mut o = vec![bf16::ZERO; 16 * 512];
    let mut ws = DecodeWorkspace::with_capacity(&stream, 1, 16, 512, 4).unwrap();
    let lc = latent_cache(
        TensorView::host(&cache, [2, 16, 1, 576]).unwrap(),
        TensorView::host(&table, [1, 2]).unwrap(),
        TensorView::host(&lens, [1]).unwrap(),
        32,
    )
    .unwrap();
    let qv = TensorView::host(&q, [1, 16, 576]).unwrap();
    let mut call = |opts: MlaDecodeOptions, o_shape: [usize; 3]| {
        let mut ov = TensorViewMut::host(&mut o[..o_shape.iter().product::<usize>()], o_shape).unwrap();
        mla_decode(&stream, &qv, &lc, &mut ov, None, &mut ws, &opts).map(|_| ()).unwrap_err()
    };
    assert_eq!(call(MlaDecodeOptions::new(0.0), [1, 16, 512]).kind(), &ErrorKind::Unsupported);
    assert_eq!(call(MlaDecodeOptions::new(f32::NAN), [1, 16, 512]).kind(), &ErrorKind::Unsupported);
    let e = call(MlaDecodeOptions::new(0.1), [1, 16, 256]);
    assert_eq!(e.kind(), &ErrorKind::Shape);
    assert!(e.message().starts_with("o"), "{}", e.message());
    let mut bad = MlaDecodeOptions::new(0.1);
    bad.dims = MlaDims { kv_lora_rank: 520, rope_dim: 56 };
    assert_eq!(call(bad, [1, 16, 512]).kind(), &ErrorKind::Unsupported);
    bad.dims = MlaDims { kv_lora_rank: 448, rope_dim: 64 };
    assert_eq!(call(bad, [1, 16, 448]).kind(), &ErrorKind::Shape); // the cache's rows are 576 != 512
                                                                   // A cache of two KV heads is not a latent cache.
    let two = vec![bf16::ZERO; 2 * 16 * 2 * 288];
    let lc2 = latent_cache(
        TensorView::host(&two, [2, 16, 2, 288]).unwrap(),
        TensorView::host(&table, [1, 2]).unwrap(),
        TensorView::host(&lens, [1]).unwrap(),
        32,
    )
    .unwrap();
    let mut ov = TensorViewMut::host(&mut o, [1, 16, 512]).unwrap();
    let e = mla_decode(&stream, &qv, &lc2, &mut ov, None, &mut ws, &MlaDecodeOptions::new(0.1)).unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Shape);
    // A workspace too small for a forced split count.
    let mut small = DecodeWorkspace::with_capacity(&stream, 1, 16, 512, 1).unwrap();
    let mut opts = MlaDecodeOptions::new(0.1);
    opts.num_splits = Some(2);
    let e = mla_decode(&stream, &qv, &lc, &mut ov, None, &mut small, &opts).unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::OutOfBounds);
}

// ---- FP8 latent cache -----------------------------------------------------------------------------------

/// The dequantisation scales of an FP8 run: one per tensor (K: the scores, V: the output); the append and
/// `latent_cache_fp8` use one for both, a cache may attach two.
#[derive(Clone, Copy, Debug)]
struct Fp8Scales {
    k: f32,
    v: f32,
}

/// An FP8 case's cache: the codes (the model's quantisation of the 16-bit values, hidden slots
/// `hidden_code`) and the stored values as the scores and V read them (hidden slots NaN).
fn quantise<T: Element, C: Fp8Element>(inp: &Inputs, s: Fp8Scales, hidden_code: u8) -> (Vec<C>, Vec<f64>, Vec<f64>) {
    let f = C::FORMAT;
    let codes: Vec<u8> = inp
        .cache
        .iter()
        .map(|&x| if x.is_nan() { hidden_code } else { f.encode(T::from_f64(x).to_f64() as f32 / s.k) })
        .collect();
    let deq = |scale: f32| -> Vec<f64> {
        codes
            .iter()
            .zip(&inp.cache)
            .map(|(&c, &x)| if x.is_nan() { f64::NAN } else { f.decode(c) * f64::from(scale) })
            .collect()
    };
    let (k, v) = (deq(s.k), deq(s.v));
    (codes.into_iter().map(C::from_code).collect(), k, v)
}

/// Runs a case's MLA decode over an FP8 latent cache of codes `cache`.
fn run_fp8<T: Element, C: KvCacheOf<T> + Fp8Element>(
    c: &Case,
    inp: &Inputs,
    cache: &[C],
    s: Fp8Scales,
    scale: f32,
) -> fused_attn::Result<RunOut<T>> {
    let emu = Emulator::new().with_table_checks(TableChecks::GpuMasking);
    let row = c.dims.row_dim();
    let q: Vec<T> = inp.q.iter().map(|&x| T::from_f64(x)).collect();
    let lens: Vec<i32> = c.seq_lens.iter().map(|&l| l as i32).collect();
    let b = c.seq_lens.len();
    let max_len = c.seq_lens.iter().copied().max().unwrap_or(0);
    let (ks, vs) = (vec![s.k], vec![s.v]);
    let cache_v = TensorView::host(cache, [inp.num_pages, c.page_size, 1, row])?;
    let table_v = TensorView::host(&inp.table, [b, inp.width])?;
    let lens_v = TensorView::host(&lens, [b])?;
    let lc = if s.k.to_bits() == s.v.to_bits() {
        latent_cache_fp8(cache_v, table_v, lens_v, max_len, TensorView::host(&ks, [1])?)?
    } else {
        latent_cache(cache_v, table_v, lens_v, max_len)?
            .with_scale_tensors(TensorView::host(&ks, [1])?, TensorView::host(&vs, [1])?)?
    };
    decode_into(&emu, c, inp, &q, &lc, scale)
}

fn rel_l2(ours: &[f64], want: &[f64]) -> f64 {
    let (mut num, mut den) = (0.0, 0.0);
    for (a, b) in ours.iter().zip(want) {
        num += (a - b) * (a - b);
        den += b * b;
    }
    (num / den.max(f64::MIN_POSITIVE)).sqrt()
}

/// A scale that spreads the cache's values (|x| <= 1) over the format's range without saturating
/// (not a power of two: the division and the folding into the scores are exercised).
fn fp8_scale(f: Fp8Format) -> f32 {
    match f {
        Fp8Format::E4m3 => 0.003_7,   // |x| / scale <= 270 < 448
        Fp8Format::E5m2 => 0.000_123, // <= 8130 < 57344
    }
}

/// One FP8 case: the kernel against the fp64 reference over the stored (dequantised) cache (tolerance rule
/// and bound), and, when K and V share the scale, the quantisation error against the reference over the
/// 16-bit cache bounded (E4M3's 3 mantissa bits: a code is within 2^-4 of its value, E5M2's within 2^-3;
/// softmax-weighted sums of many rows average it down, a one-token sequence does not: measured 0.6-1.7e-2):
/// a wrong scale, a dropped token or a column permutation would show here even if kernel and reference
/// agreed.
fn fp8_case<T: Element + KvElement, C: KvCacheOf<T> + Fp8Element>(
    name: &str,
    c: &Case,
    seed: u64,
    s: Fp8Scales,
    scale: f32,
) {
    let inp = make_inputs(c, seed);
    let (codes, k, v) = quantise::<T, C>(&inp, s, Fp8Format::NAN_CODE);
    let out = run_fp8::<T, C>(c, &inp, &codes, s, scale).unwrap();
    check_over(name, c, &inp, &k, &v, &out, scale);
    if s.k.to_bits() == s.v.to_bits() {
        let sixteen: Vec<f64> =
            inp.cache.iter().map(|&x| if x.is_nan() { x } else { T::from_f64(x).to_f64() }).collect();
        let r16 = reference_over::<T>(c, &inp, &sixteen, &sixteen, scale, Arith::F64);
        let ours: Vec<f64> = out.o.iter().map(|x| x.to_f64()).collect();
        let err = rel_l2(&ours, &r16);
        let limit = match C::FORMAT {
            Fp8Format::E4m3 => 0.03,
            Fp8Format::E5m2 => 0.06,
        };
        eprintln!("{name}: quantisation rel-L2 error against the 16-bit cache {err:.2e} (limit {limit})");
        assert!(err < limit, "{name} {c:?}: quantisation error {err:.3e} >= {limit}");
    }
}

/// The FP8 sweep: both formats, both dtypes, heads 16..128, pages 1/16/64, q_len 1 and 2..4, splits,
/// holes, 256 + 32 dims, and K / V scales that differ (each read where it belongs).
#[test]
fn fp8_decode_sweep_matches_reference() {
    let cases: Vec<(Case, Fp8Format)> = vec![
        (Case::new(16, &[1, 37, 200], 16), Fp8Format::E4m3),
        (Case::new(128, &[70, 0], 16), Fp8Format::E5m2),
        (Case { q_lens: Some(vec![2, 4, 1]), splits: Some(2), ..Case::new(32, &[50, 77, 3], 1) }, Fp8Format::E4m3),
        (Case { splits: Some(3), ..Case::new(64, &[333], 64) }, Fp8Format::E5m2),
        (
            Case {
                dims: MlaDims { kv_lora_rank: 256, rope_dim: 32 },
                q_lens: Some(vec![2, 3]),
                holes: vec![(1, 1)],
                ..Case::new(16, &[45, 60], 16)
            },
            Fp8Format::E4m3,
        ),
        (Case { q_lens: Some(vec![3]), ..Case::new(128, &[90], 64) }, Fp8Format::E4m3),
    ];
    for (i, (c, f)) in cases.iter().enumerate() {
        if !crate::common::case_selected(i) {
            continue;
        }
        let seed = case_seed(9800 + i);
        let k = fp8_scale(*f);
        // Case 3 and 5: a V scale other than K's (the kernel must read each where it belongs).
        let s = if i % 2 == 1 && i > 1 { Fp8Scales { k, v: k * 1.7 } } else { Fp8Scales { k, v: k } };
        let scale = if i % 3 == 2 { 0.25 } else { DEEPSEEK_SCALE };
        let name = format!("fp8 case {i} (seed {seed:#x}) {f:?} {s:?}");
        match (f, i % 2 == 0) {
            (Fp8Format::E4m3, true) => fp8_case::<bf16, Fp8E4m3>(&name, c, seed, s, scale),
            (Fp8Format::E4m3, false) => fp8_case::<f16, Fp8E4m3>(&name, c, seed, s, scale),
            (Fp8Format::E5m2, true) => fp8_case::<bf16, Fp8E5m2>(&name, c, seed, s, scale),
            (Fp8Format::E5m2, false) => fp8_case::<f16, Fp8E5m2>(&name, c, seed, s, scale),
        }
    }
}

/// Hidden FP8 codes (slots past seq_len, unused pages, holes' pages) as NaN, +-Inf (E5M2), the largest
/// finite and 0xff give bitwise the zero-code result.
#[test]
fn fp8_hidden_codes_are_never_read() {
    let c = Case { q_lens: Some(vec![2, 1]), splits: Some(2), holes: vec![(1, 2)], ..Case::new(16, &[67, 100], 16) };
    let inp = make_inputs(&c, case_seed(9900));
    for f in [Fp8Format::E4m3, Fp8Format::E5m2] {
        let k = fp8_scale(f);
        let s = Fp8Scales { k, v: k };
        let run_with = |code: u8| -> RunOut<bf16> {
            if f == Fp8Format::E4m3 {
                let (codes, _, _) = quantise::<bf16, Fp8E4m3>(&inp, s, code);
                run_fp8::<bf16, Fp8E4m3>(&c, &inp, &codes, s, DEEPSEEK_SCALE).unwrap()
            } else {
                let (codes, _, _) = quantise::<bf16, Fp8E5m2>(&inp, s, code);
                run_fp8::<bf16, Fp8E5m2>(&c, &inp, &codes, s, DEEPSEEK_SCALE).unwrap()
            }
        };
        let zero = run_with(0);
        for code in [0x7f, 0xff, 0x7c, 0xfc, 0x7e] {
            let p = run_with(code);
            let same = zero.o.iter().zip(&p.o).all(|(a, b)| a.to_bits() == b.to_bits())
                && zero.lse.iter().zip(&p.lse).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "{f:?}: hidden code {code:#04x} changed an output bit");
        }
        assert!(zero.o.iter().all(|x| x.to_f64().is_finite()));
    }
}

/// The FP8 cache's cost: the same rows read once per CTA at one byte per element (half the 16-bit bytes,
/// exactly), the same tensor work, q and o unchanged.
#[test]
fn fp8_cache_bytes_halve() {
    for c in
        [Case::new(128, &[100, 37], 16), Case { q_lens: Some(vec![3]), splits: Some(2), ..Case::new(16, &[300], 16) }]
    {
        let inp = make_inputs(&c, case_seed(9950));
        let sixteen = run::<bf16>(&c, &inp, f32::NAN, DEEPSEEK_SCALE).unwrap();
        let k = fp8_scale(Fp8Format::E4m3);
        let s = Fp8Scales { k, v: k };
        let (codes, _, _) = quantise::<bf16, Fp8E4m3>(&inp, s, Fp8Format::NAN_CODE);
        let fp8 = run_fp8::<bf16, Fp8E4m3>(&c, &inp, &codes, s, DEEPSEEK_SCALE).unwrap();
        let (a, b) = (sixteen.counters.kernel("mla_decode").unwrap(), fp8.counters.kernel("mla_decode").unwrap());
        assert!(a.read_of("k_cache") > 0);
        assert_eq!(2 * b.read_of("k_cache"), a.read_of("k_cache"), "{c:?}: cache bytes halve");
        assert_eq!(b.read_of("v_cache"), 0, "V is the K rows, never read again");
        assert_eq!(b.read_of("q"), a.read_of("q"));
        assert_eq!(b.written_of("o") + b.written_of("partial_o"), a.written_of("o") + a.written_of("partial_o"));
        assert_eq!(b.mma, a.mma, "{c:?}: the same tensor work");
        eprintln!(
            "{c:?}: shared bytes per global cache byte: 16-bit {:.2}, FP8 {:.2}",
            (a.shared_bytes_read + a.shared_bytes_written) as f64 / a.read_of("k_cache") as f64,
            (b.shared_bytes_read + b.shared_bytes_written) as f64 / b.read_of("k_cache") as f64
        );
    }
}

/// FP8 append: every code of a written row is the model's quantisation of the value (the latent, and the
/// rope key rotated in fp32 first: no 16-bit rounding between), padding skipped, other slots untouched.
#[test]
fn fp8_append_quantises_rows_as_the_model() {
    fn one<C: KvCacheOf<bf16> + Fp8Element>() {
        let emu = Emulator::new();
        let stream = Stream::Emu(&emu);
        let dims = MlaDims::default();
        let (pages, page, n) = (5, 4, 6);
        let row = dims.row_dim();
        let mut rng = Rng::new(case_seed(9970));
        let latent: Vec<bf16> = (0..n * 512).map(|_| bf16::from_f64(rng.next())).collect();
        let k_pe: Vec<bf16> = (0..n * 64).map(|_| bf16::from_f64(2.0 * rng.next())).collect();
        let slots: Vec<i64> = vec![3, 17, -1, 0, 8, 19];
        let scale_value = fp8_scale(C::FORMAT);
        let scale = vec![scale_value];
        let scale_v = TensorView::host(&scale, [1]).unwrap();
        for style in [None, Some(RopeStyle::Gptj), Some(RopeStyle::Neox)] {
            let with_rope = style.is_some();
            let style = style.unwrap_or_default();
            let poison = C::from_code(0x7f);
            let mut cache = vec![poison; pages * page * row];
            let positions: Vec<i32> = (0..n as i32).map(|t| 5 + 7 * t).collect();
            let table = RopeConfig::new(10000.0, 64, style).table(64).unwrap();
            let cos_v = TensorView::host(&table.cos, [64, 32]).unwrap();
            let sin_v = TensorView::host(&table.sin, [64, 32]).unwrap();
            let pos_v = TensorView::host(&positions, [n]).unwrap();
            let rope = Rope { cos: &cos_v, sin: &sin_v, positions: Some(&pos_v), rotary_dim: 64, style };
            let opts = MlaAppendOptions { dims, rope: with_rope.then_some(rope), scale: Some(&scale_v) };
            mla_append(
                &stream,
                &TensorView::host(&latent, [n, 512]).unwrap(),
                &TensorView::host(&k_pe, [n, 64]).unwrap(),
                &TensorView::host(&slots, [n]).unwrap(),
                &mut TensorViewMut::host(&mut cache, [pages, page, 1, row]).unwrap(),
                &opts,
            )
            .unwrap();
            let f = C::FORMAT;
            let mut written = vec![false; pages * page];
            for t in 0..n {
                if slots[t] < 0 {
                    continue;
                }
                let at = slots[t] as usize * row;
                written[slots[t] as usize] = true;
                let want: Vec<u8> =
                    latent[t * 512..][..512].iter().map(|x| f.encode(x.to_f32() / scale_value)).collect();
                let got: Vec<u8> = cache[at..at + 512].iter().map(|x| x.code()).collect();
                assert_eq!(got, want, "{f:?}: latent of token {t}");
                let mut pe: Vec<f32> = k_pe[t * 64..][..64].iter().map(|x| x.to_f32()).collect();
                if with_rope {
                    let p = positions[t] as usize;
                    rotate_row_f32(&mut pe, 64, style, |i| table.at(p, i));
                }
                let want: Vec<u8> = pe.iter().map(|&x| f.encode(x / scale_value)).collect();
                let got: Vec<u8> = cache[at + 512..at + row].iter().map(|x| x.code()).collect();
                assert_eq!(got, want, "{f:?}: rope key of token {t} (rope {with_rope})");
            }
            for (s, w) in written.iter().enumerate() {
                if !w {
                    assert!(cache[s * row..(s + 1) * row].iter().all(|x| x.code() == 0x7f), "slot {s} was touched");
                }
            }
        }
        // A 16-bit cache refuses a scale; an FP8 cache needs one; FP8 needs 16-column parts.
        let mut cache = vec![C::from_code(0); pages * page * row];
        let call = |opts: &MlaAppendOptions<'_>, cache: &mut [C], dims: MlaDims| {
            let r = dims.row_dim();
            mla_append(
                &stream,
                &TensorView::host(&latent[..n * dims.kv_lora_rank], [n, dims.kv_lora_rank]).unwrap(),
                &TensorView::host(&k_pe[..n * dims.rope_dim], [n, dims.rope_dim]).unwrap(),
                &TensorView::host(&slots, [n]).unwrap(),
                &mut TensorViewMut::host(&mut cache[..pages * page * r], [pages, page, 1, r]).unwrap(),
                opts,
            )
            .unwrap_err()
        };
        let e = call(&MlaAppendOptions { dims, ..Default::default() }, &mut cache, dims);
        assert_eq!(e.kind(), &ErrorKind::Shape, "{}", e.message());
        let odd = MlaDims { kv_lora_rank: 504, rope_dim: 64 };
        let e = call(&MlaAppendOptions { dims: odd, rope: None, scale: Some(&scale_v) }, &mut cache, odd);
        assert_eq!(e.kind(), &ErrorKind::Unsupported, "{}", e.message());
        let mut sixteen = vec![bf16::ZERO; pages * page * row];
        let e = mla_append(
            &stream,
            &TensorView::host(&latent, [n, 512]).unwrap(),
            &TensorView::host(&k_pe, [n, 64]).unwrap(),
            &TensorView::host(&slots, [n]).unwrap(),
            &mut TensorViewMut::host(&mut sixteen, [pages, page, 1, row]).unwrap(),
            &MlaAppendOptions { dims, rope: None, scale: Some(&scale_v) },
        )
        .unwrap_err();
        assert_eq!(e.kind(), &ErrorKind::Unsupported, "{}", e.message());
    }
    one::<Fp8E4m3>();
    one::<Fp8E5m2>();
}

/// Append then decode: the appended FP8 cache decodes to what the sweep's model-quantised cache decodes to
/// (the same codes), against the reference over the stored values.
#[test]
fn fp8_append_then_decode() {
    let c = Case::new(32, &[40, 23], 16);
    let inp = make_inputs(&c, case_seed(9990));
    let k = fp8_scale(Fp8Format::E5m2);
    let s = Fp8Scales { k, v: k };
    let (model, kd, vd) = quantise::<f16, Fp8E5m2>(&inp, s, 0);
    // Append every visible row (latent, rope key) into a zeroed pool at the same slots.
    let emu = Emulator::new();
    let stream = Stream::Emu(&emu);
    let row = c.dims.row_dim();
    let mut slots = Vec::new();
    let (mut latent, mut k_pe) = (Vec::new(), Vec::new());
    for (b, &len) in c.seq_lens.iter().enumerate() {
        for j in 0..len {
            let page = inp.table[b * inp.width + j / c.page_size] as usize;
            let slot = page * c.page_size + j % c.page_size;
            slots.push(slot as i64);
            let x = &inp.cache[slot * row..(slot + 1) * row];
            latent.extend(x[..512].iter().map(|&v| f16::from_f64(v)));
            k_pe.extend(x[512..].iter().map(|&v| f16::from_f64(v)));
        }
    }
    let n = slots.len();
    let mut cache = vec![Fp8E5m2(0); inp.num_pages * c.page_size * row];
    let scale = vec![k];
    let scale_v = TensorView::host(&scale, [1]).unwrap();
    mla_append(
        &stream,
        &TensorView::host(&latent, [n, 512]).unwrap(),
        &TensorView::host(&k_pe, [n, 64]).unwrap(),
        &TensorView::host(&slots, [n]).unwrap(),
        &mut TensorViewMut::host(&mut cache, [inp.num_pages, c.page_size, 1, row]).unwrap(),
        &MlaAppendOptions { scale: Some(&scale_v), ..Default::default() },
    )
    .unwrap();
    assert!(cache.iter().zip(&model).all(|(a, b)| a.0 == b.0), "appended codes differ from the model's");
    let out = run_fp8::<f16, Fp8E5m2>(&c, &inp, &cache, s, DEEPSEEK_SCALE).unwrap();
    check_over("fp8 append -> decode", &c, &inp, &kd, &vd, &out, DEEPSEEK_SCALE);
}
