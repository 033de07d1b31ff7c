//! RoPE fused into append (K on its way into the cache, 16-bit and FP8) and decode (q at its position), on
//! the emulator (docs/rope.md):
//!  - exact answers: a one-hot K row rotated at position p is the table's (cos, sin) of p, bit for bit; a
//!    score q(p)·k(p') depends only on p − p' (bit for bit with an exactly representable quarter-turn table
//!    and integer vectors, within the rounding bound with a Llama-3 table);
//!  - sweeps: append's cache equals the Rust model of the kernel (fp32 fma rotation, then rounding or FP8
//!    quantisation) bit for bit, and decode passes against the fp64 reference, for both layouts, partial
//!    rotary, the default, NTK, Llama-3 and YaRN tables, explicit and default positions, split and
//!    scheduled decode, FP8 caches;
//!  - poison: table rows no position addresses and table columns past rotary_dim/2 are NaN in every test,
//!    and so are the cache's unowned slots (the fixtures'), so a read of either shows;
//!  - cost: q and K are read once, never written, with or without RoPE; only the table's few bytes are
//!    added.

use crate::common;

use fused_attn::decode::{DecodeOptions, DecodeWorkspace};
use fused_attn::reference::{check_decode, Check, RopeRef};
use fused_attn::testkit::cases::decode::{decode_on_host, DecodeCase, PagedFixture};
use fused_attn::testkit::cases::kv::KvFormat;
use fused_attn::testkit::rope::PoisonedTable;
use fused_attn::testkit::seed::rng;
use fused_attn::{
    append_with, decode, AppendOptions, DType, Element, Emulator, ErrorKind, Fp8E4m3, Fp8E5m2, Fp8Format, KvCacheOf,
    KvScales, PagedKvCache, PagedKvCacheMut, Rope, RopeConfig, RopeScaling, RopeStyle, SplitPolicy, Stream, TensorView,
    TensorViewMut,
};
use half::{bf16, f16};
use rand::seq::SliceRandom;
use rand::Rng;

/// Two stored values are the same bits (f64 bits of the value: ±0 differ; any NaN equals any NaN).
fn same_value(a: f64, b: f64) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

/// How a case's cache stores: 16-bit, or FP8 with per-head scales.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Store {
    Sixteen,
    Fp8(Fp8Format),
}

/// The cache value the kernel must store for the fp32 value `x` of KV head `h`. (Rounded from f32:
/// `half`'s `bf16::from_f64` is not correctly rounded, e.g. 0xbfe48007 as f64 goes down.)
fn stored<T: Element>(store: Store, x: f32, scale: f32) -> f64 {
    match store {
        Store::Sixteen => T::DTYPE.round(f64::from(x)),
        Store::Fp8(f) => f.decode(f.encode(x / scale)),
    }
}

/// Runs an append (with `rope`) of `k`, `v` (`[n, hkv, d]`) into a NaN cache of `pages` x `ps` slots and
/// returns the K and V caches' stored values.
#[allow(clippy::too_many_arguments)]
fn run_append<T: Element, C: KvCacheOf<T>>(
    stream: &Stream<'_>,
    shape: [usize; 4],
    nan: C,
    scales: Option<&KvScales>,
    k: &[T],
    v: &[T],
    slots: &[i64],
    rope: Option<Rope<'_>>,
) -> Result<(Vec<f64>, Vec<f64>), fused_attn::Error> {
    let [_, _, hkv, d] = shape;
    let n = slots.len();
    let len: usize = shape.iter().product();
    let (mut kc, mut vc) = (vec![nan; len], vec![nan; len]);
    {
        let mut cache = PagedKvCacheMut::new(
            TensorViewMut::host(&mut kc, shape).unwrap(),
            TensorViewMut::host(&mut vc, shape).unwrap(),
        )?;
        if let Some(s) = scales {
            cache = cache.with_scales(s)?;
        }
        let (kv, vv, sv) = (
            TensorView::host(k, [n, hkv, d]).unwrap(),
            TensorView::host(v, [n, hkv, d]).unwrap(),
            TensorView::host(slots, [n]).unwrap(),
        );
        append_with(stream, &kv, &vv, &sv, &mut cache, &AppendOptions { rope })?;
    }
    Ok((kc.iter().map(|x| x.stored_value()).collect(), vc.iter().map(|x| x.stored_value()).collect()))
}

/// One append sweep case.
#[derive(Clone, Copy, Debug)]
struct AppendCase {
    dtype: DType,
    store: Store,
    head_dim: usize,
    rotary_dim: usize,
    heads_kv: usize,
    style: RopeStyle,
    scaling: RopeScaling,
    theta: f64,
}

fn append_cases() -> Vec<AppendCase> {
    use RopeStyle::{Gptj, Neox};
    let yarn = RopeScaling::yarn(4.0, 2048);
    let l3 = RopeScaling::llama31();
    let ntk = RopeScaling::Ntk { factor: 2.0 };
    let lin = RopeScaling::Linear { factor: 2.0 };
    let c = |dtype, store, head_dim, rotary_dim, heads_kv, style, scaling, theta| AppendCase {
        dtype,
        store,
        head_dim,
        rotary_dim,
        heads_kv,
        style,
        scaling,
        theta,
    };
    let (e4, e5) = (Store::Fp8(Fp8Format::E4m3), Store::Fp8(Fp8Format::E5m2));
    vec![
        c(DType::Bf16, Store::Sixteen, 128, 128, 2, Neox, RopeScaling::None, 10000.0),
        c(DType::F16, Store::Sixteen, 128, 128, 2, Gptj, RopeScaling::None, 10000.0),
        c(DType::Bf16, Store::Sixteen, 128, 128, 4, Neox, l3, 500000.0),
        c(DType::F16, Store::Sixteen, 64, 64, 1, Gptj, yarn, 10000.0),
        // Partial rotary: Pythia-2.8b / StableLM (20 of 80), GLM (half), Phi-2 (32 of 80).
        c(DType::Bf16, Store::Sixteen, 80, 20, 2, Neox, RopeScaling::None, 10000.0),
        c(DType::F16, Store::Sixteen, 128, 64, 2, Gptj, ntk, 10000.0),
        c(DType::Bf16, Store::Sixteen, 80, 32, 3, Neox, lin, 10000.0),
        c(DType::Bf16, Store::Sixteen, 256, 256, 1, Neox, yarn, 1000000.0),
        c(DType::Bf16, e4, 128, 128, 2, Neox, l3, 500000.0),
        c(DType::F16, e5, 128, 128, 2, Gptj, RopeScaling::None, 10000.0),
        c(DType::Bf16, e4, 64, 32, 2, Gptj, yarn, 10000.0),
        c(DType::F16, e4, 96, 48, 1, Neox, ntk, 10000.0),
    ]
}

/// One case: random K/V rows with distinct random slots (some padding, one past the cache) and random
/// positions; the cache must equal the model (K rotated in fp32 with the kernels' fma formula, then
/// rounded / quantised; V as plain append), bit for bit, everywhere (unwritten slots stay NaN).
fn check_append_case<T: Element>(stream: &Stream<'_>, c: &AppendCase, seed: u64) -> Result<String, String> {
    let mut r = rng(seed);
    let (pages, ps, hkv, d) = (5, 8, c.heads_kv, c.head_dim);
    let n = 29;
    let num_slots = pages * ps;
    let mut free: Vec<i64> = (0..num_slots as i64).collect();
    free.shuffle(&mut r);
    let slots: Vec<i64> = (0..n)
        .map(|t| match t % 9 {
            4 => -1,
            7 if t == 7 => num_slots as i64 + 2, // past the cache: skipped
            _ => free[t],
        })
        .collect();
    let max_pos = 6000;
    let positions: Vec<i32> = (0..n).map(|_| r.random_range(0..max_pos as i32)).collect();
    let mut k: Vec<T> = (0..n * hkv * d).map(|_| T::from_f64(r.random_range(-3.0..3.0))).collect();
    let mut v: Vec<T> = (0..n * hkv * d).map(|_| T::from_f64(r.random_range(-3.0..3.0))).collect();
    // Rows that are not stored (padding, the slot past the cache) are NaN, and so are their positions'
    // table rows (not in `used`): neither may reach a stored row.
    let stored_row = |t: usize| slots[t] >= 0 && slots[t] < num_slots as i64;
    for t in (0..n).filter(|&t| !stored_row(t)) {
        k[t * hkv * d..][..hkv * d].fill(T::nan());
        v[t * hkv * d..][..hkv * d].fill(T::nan());
    }
    let cfg = RopeConfig { theta: c.theta, rotary_dim: c.rotary_dim, style: c.style, scaling: c.scaling };
    let used: Vec<i64> = (0..n).filter(|&t| stored_row(t)).map(|t| i64::from(positions[t])).collect();
    let table = PoisonedTable::new(&cfg, max_pos, &used).unwrap();
    let (cos, sin) = table.views().unwrap();
    let pos_view = TensorView::host(&positions, [n]).unwrap();
    let rope = Rope { cos: &cos, sin: &sin, rotary_dim: c.rotary_dim, style: c.style, positions: Some(&pos_view) };
    let k_scale: Vec<f32> = (0..hkv).map(|h| 2f32.powi(h as i32 - 3)).collect();
    let v_scale: Vec<f32> = (0..hkv).map(|h| 2f32.powf(0.5 * h as f32 - 2.0)).collect();
    let shape = [pages, ps, hkv, d];
    let (kc, vc) = match c.store {
        Store::Sixteen => run_append::<T, T>(stream, shape, T::nan(), None, &k, &v, &slots, Some(rope)),
        Store::Fp8(f) => {
            let scales = KvScales::per_head(stream, &k_scale, &v_scale).unwrap();
            match f {
                Fp8Format::E4m3 => {
                    run_append::<T, Fp8E4m3>(stream, shape, Fp8E4m3(0x7f), Some(&scales), &k, &v, &slots, Some(rope))
                }
                Fp8Format::E5m2 => {
                    run_append::<T, Fp8E5m2>(stream, shape, Fp8E5m2(0x7f), Some(&scales), &k, &v, &slots, Some(rope))
                }
            }
        }
    }
    .map_err(|e| format!("append failed: {e}"))?;
    // The model.
    let reference = RopeRef::from_view(&rope).unwrap();
    let ks = |h: usize| if c.store == Store::Sixteen { 1.0 } else { k_scale[h] };
    let mut want_k = vec![f64::NAN; num_slots * hkv * d];
    let mut want_v = want_k.clone();
    for t in 0..n {
        let s = slots[t];
        if s < 0 || s >= num_slots as i64 {
            continue;
        }
        for (h, &v_scale_h) in v_scale.iter().enumerate() {
            let row = (t * hkv + h) * d;
            let mut x: Vec<f32> = k[row..row + d].iter().map(|e| e.to_f64() as f32).collect();
            fused_attn::rope::rotate_row_f32(&mut x, c.rotary_dim, c.style, |i| {
                reference.cos_sin(i64::from(positions[t]), i)
            });
            let at = (s as usize * hkv + h) * d;
            for j in 0..d {
                want_k[at + j] = stored::<T>(c.store, x[j], ks(h));
                let vscale = if c.store == Store::Sixteen { 1.0 } else { v_scale_h };
                want_v[at + j] = stored::<T>(c.store, v[row + j].to_f64() as f32, vscale);
            }
        }
    }
    let bad_k = (0..kc.len()).find(|&i| !same_value(kc[i], want_k[i]));
    let bad_v = (0..vc.len()).find(|&i| !same_value(vc[i], want_v[i]));
    match (bad_k, bad_v) {
        (None, None) => Ok(format!("{} K/V values equal the model", kc.len())),
        (Some(i), _) => Err(format!("k_cache[{i}] (dim {}) = {} want {}", i % d, kc[i], want_k[i])),
        (_, Some(i)) => Err(format!("v_cache[{i}] = {} want {}", vc[i], want_v[i])),
    }
}

#[test]
fn append_rope_sweep_matches_the_model_bit_for_bit() {
    let emu = Emulator::new().with_table_checks(fused_attn::TableChecks::GpuMasking);
    let stream = Stream::Emu(&emu);
    let mut failed = Vec::new();
    for (i, c) in append_cases().iter().enumerate() {
        let seed = common::case_seed(28_000 + i);
        let res = match c.dtype {
            DType::Bf16 => check_append_case::<bf16>(&stream, c, seed),
            DType::F16 => check_append_case::<f16>(&stream, c, seed),
        };
        eprintln!("case {i} {c:?} (seed {seed:#x}): {res:?}");
        if res.is_err() {
            failed.push(i);
        }
    }
    assert_none_failed(&failed, "append_rope_sweep_matches_the_model_bit_for_bit");
}

/// A one-hot K row e_j rotated at position p holds exactly the table's entries of p: for j the first of
/// pair i, (cos, sin) at (j, partner); for the second, (−sin, cos) at (partner, j); dims past rotary_dim
/// are copied. Both layouts, partial rotary, one token per (j, position).
#[test]
fn append_rotates_one_hot_rows_to_the_table_entries() {
    let emu = Emulator::new();
    let stream = Stream::Emu(&emu);
    for (style, d, rd) in
        [(RopeStyle::Neox, 64, 64), (RopeStyle::Gptj, 64, 64), (RopeStyle::Neox, 80, 20), (RopeStyle::Gptj, 48, 16)]
    {
        let cfg = RopeConfig::new(10000.0, rd, style);
        let n = d; // token j carries e_j
        let positions: Vec<i32> = (0..n as i32).map(|j| 3 + 97 * j).collect();
        let max_pos = 8000;
        let used: Vec<i64> = positions.iter().map(|&p| i64::from(p)).collect();
        let table = PoisonedTable::new(&cfg, max_pos, &used).unwrap();
        let (cos, sin) = table.views().unwrap();
        let pos_view = TensorView::host(&positions, [n]).unwrap();
        let rope = Rope { cos: &cos, sin: &sin, rotary_dim: rd, style, positions: Some(&pos_view) };
        let mut k = vec![bf16::ZERO; n * d];
        for j in 0..n {
            k[j * d + j] = bf16::ONE;
        }
        let slots: Vec<i64> = (0..n as i64).collect();
        let (kc, _) =
            run_append::<bf16, bf16>(&stream, [n, 1, 1, d], bf16::NAN, None, &k, &k, &slots, Some(rope)).unwrap();
        let full = cfg.table(max_pos).unwrap();
        for j in 0..n {
            let row = &kc[j * d..][..d];
            let mut want = vec![0.0f64; d];
            if j < rd {
                let (i, partner, first) = style.pair(j, rd);
                let (c, s) = full.at(positions[j] as usize, i);
                let (c, s) = (bf16::from_f32(c).to_f64(), bf16::from_f32(s).to_f64());
                if first {
                    (want[j], want[partner]) = (c, s);
                } else {
                    (want[j], want[partner]) = (c, -s);
                }
            } else {
                want[j] = 1.0;
            }
            for e in 0..d {
                assert!(
                    same_value(row[e], want[e]) || (row[e] == 0.0 && want[e] == 0.0),
                    "{style:?} rd {rd}: token {j} dim {e}: {} want {}",
                    row[e],
                    want[e]
                );
            }
        }
    }
}

/// Decode with RoPE on q over a fixture's cache (its K taken as already rotated), against the fp64
/// reference rotating from the same table: the check of the sweep below.
fn check_decode_rope<T: Element>(
    stream: &Stream<'_>,
    case: &DecodeCase,
    cfg: &RopeConfig,
    explicit: bool,
    scheduled: bool,
    seed: u64,
) -> Result<String, String> {
    let f = PagedFixture::<T>::new(case, seed).unwrap();
    let (b, hq, d) = (case.batch(), case.heads_q, case.head_dim);
    let max_pos = 5000;
    let mut r = rng(seed ^ 0x5eed);
    let positions: Vec<i32> = (0..b).map(|_| r.random_range(0..max_pos as i32)).collect();
    let used: Vec<i64> = if explicit {
        positions.iter().map(|&p| i64::from(p)).collect()
    } else {
        f.seq_lens.iter().map(|&n| i64::from(n) - 1).collect()
    };
    let table = PoisonedTable::new(cfg, max_pos, &used).unwrap();
    let (cos, sin) = table.views().unwrap();
    let pos_view = TensorView::host(&positions, [b]).unwrap();
    let rope = Rope {
        cos: &cos,
        sin: &sin,
        rotary_dim: cfg.rotary_dim,
        style: cfg.style,
        positions: explicit.then_some(&pos_view),
    };
    let cache = f.host_cache().unwrap();
    let mut o = vec![T::nan(); b * hq * d];
    let mut lse = vec![f32::NAN; b * hq];
    let mut ws = if scheduled {
        DecodeWorkspace::scheduled_on(stream, &case.problem(), SplitPolicy::Balanced, 24).unwrap()
    } else {
        DecodeWorkspace::with_capacity(stream, b, hq, d, 8).unwrap()
    };
    let opts = DecodeOptions {
        num_splits: if scheduled { None } else { case.num_splits },
        rope: Some(rope),
        ..Default::default()
    };
    let q = TensorView::host(&f.q, [b, hq, d]).unwrap();
    decode(
        stream,
        &q,
        &cache,
        &mut TensorViewMut::host(&mut o, [b, hq, d]).unwrap(),
        Some(&mut TensorViewMut::host(&mut lse, [b, hq]).unwrap()),
        &mut ws,
        &opts,
    )
    .map_err(|e| format!("decode failed: {e}"))?;
    let (ov, lv) = (TensorView::host(&o, [b, hq, d]).unwrap(), TensorView::host(&lse, [b, hq]).unwrap());
    let with = check_decode(&q, &cache, &ov, Some(&lv), &opts).unwrap();
    // The check can fail: the same output judged as if q had not been rotated must not pass.
    let without = check_decode(&q, &cache, &ov, Some(&lv), &DecodeOptions { rope: None, ..opts }).unwrap();
    with_and_without(with, without)
}

/// An output judged with RoPE (`with`) and as if q had not been rotated (`without`): the first must pass and
/// the second fail, else the check could not tell a rotated q from an unrotated one.
pub(crate) fn with_and_without(with: Check, without: Check) -> Result<String, String> {
    if !with.passed() {
        return Err(format!("{with}"));
    }
    if without.passed() {
        return Err(format!("passes without RoPE too: {without}"));
    }
    Ok(format!("{with}"))
}

#[test]
fn decode_rope_sweep_against_the_reference() {
    let emu = Emulator::new();
    let stream = Stream::Emu(&emu);
    let dc = |dtype, head_dim, heads_q, heads_kv, page_size, num_splits| {
        DecodeCase::new(dtype, head_dim, (heads_q, heads_kv), page_size, &[0, 1, 17, 300, 1000], num_splits)
    };
    let cfg = |theta, rd, style, scaling| RopeConfig { theta, rotary_dim: rd, style, scaling };
    use RopeStyle::{Gptj, Neox};
    let cases = [
        (dc(DType::Bf16, 128, 8, 2, 16, Some(1)), cfg(10000.0, 128, Neox, RopeScaling::None), false, false),
        (dc(DType::F16, 128, 8, 2, 16, Some(2)), cfg(10000.0, 128, Gptj, RopeScaling::None), true, false),
        (dc(DType::Bf16, 128, 16, 2, 8, None), cfg(500000.0, 128, Neox, RopeScaling::llama31()), true, false),
        (dc(DType::F16, 64, 4, 4, 64, Some(7)), cfg(10000.0, 64, Gptj, RopeScaling::yarn(4.0, 2048)), false, false),
        (dc(DType::Bf16, 80, 20, 1, 16, Some(2)), cfg(10000.0, 20, Neox, RopeScaling::None), false, false),
        (
            dc(DType::F16, 256, 8, 2, 16, Some(1)),
            cfg(10000.0, 128, Gptj, RopeScaling::Ntk { factor: 4.0 }),
            true,
            false,
        ),
        (dc(DType::Bf16, 96, 8, 1, 1, None), cfg(10000.0, 48, Neox, RopeScaling::Linear { factor: 2.0 }), true, true),
        (dc(DType::Bf16, 128, 8, 2, 16, None), cfg(500000.0, 128, Neox, RopeScaling::llama31()), false, true),
        // MQA 64:1 and 71:1: wide CTAs (8 warps) rotate 64 / 128 rows.
        (dc(DType::Bf16, 128, 64, 1, 16, Some(2)), cfg(10000.0, 128, Neox, RopeScaling::None), true, false),
        (dc(DType::F16, 64, 71, 1, 16, None), cfg(10000.0, 64, Gptj, RopeScaling::None), false, true),
    ];
    let mut failed = Vec::new();
    for (i, (case, cfg, explicit, scheduled)) in cases.iter().enumerate() {
        let seed = common::case_seed(28_100 + i);
        let res = match case.dtype {
            DType::Bf16 => check_decode_rope::<bf16>(&stream, case, cfg, *explicit, *scheduled, seed),
            DType::F16 => check_decode_rope::<f16>(&stream, case, cfg, *explicit, *scheduled, seed),
        };
        eprintln!(
            "case {i} {} rd {} {:?} {:?} explicit {explicit} scheduled {scheduled} (seed {seed:#x}): {res:?}",
            case.label(),
            cfg.rotary_dim,
            cfg.style,
            cfg.scaling
        );
        if res.is_err() {
            failed.push(i);
        }
    }
    assert_none_failed(&failed, "decode_rope_sweep_against_the_reference");
}

/// A one-token cache whose K was appended with RoPE at position `pk`, and a decode of `q` at position
/// `pq`: the LSE (= the one score · scale) per head. `table` is `[max_pos, rd/2]` cos then sin.
#[allow(clippy::too_many_arguments)]
fn one_key_score(
    stream: &Stream<'_>,
    cos: &[f32],
    sin: &[f32],
    max_pos: usize,
    rd: usize,
    style: RopeStyle,
    q: &[bf16],
    k: &[bf16],
    pk: i32,
    pq: i32,
) -> Vec<f32> {
    let d = k.len();
    let hq = q.len() / d;
    let (cv, sv) =
        (TensorView::host(cos, [max_pos, rd / 2]).unwrap(), TensorView::host(sin, [max_pos, rd / 2]).unwrap());
    let pkv = [pk];
    let pk_view = TensorView::host(&pkv, [1]).unwrap();
    let rope_k = Rope { cos: &cv, sin: &sv, rotary_dim: rd, style, positions: Some(&pk_view) };
    let v = vec![bf16::ONE; d];
    let (kc, vc) = run_append::<bf16, bf16>(stream, [1, 1, 1, d], bf16::NAN, None, k, &v, &[0], Some(rope_k)).unwrap();
    let (kc, vc): (Vec<bf16>, Vec<bf16>) =
        (kc.iter().map(|&x| bf16::from_f64(x)).collect(), vc.iter().map(|&x| bf16::from_f64(x)).collect());
    let (table, lens) = ([0i32], [1i32]);
    let cache = PagedKvCache::new(
        TensorView::host(&kc, [1, 1, 1, d]).unwrap(),
        TensorView::host(&vc, [1, 1, 1, d]).unwrap(),
        TensorView::host(&table, [1, 1]).unwrap(),
        TensorView::host(&lens, [1]).unwrap(),
        1,
    )
    .unwrap();
    let pqv = [pq];
    let pq_view = TensorView::host(&pqv, [1]).unwrap();
    let rope_q = Rope { positions: Some(&pq_view), ..rope_k };
    let mut o = vec![bf16::NAN; hq * d];
    let mut lse = vec![f32::NAN; hq];
    let mut ws = DecodeWorkspace::with_capacity(stream, 1, hq, d, 1).unwrap();
    decode(
        stream,
        &TensorView::host(q, [1, hq, d]).unwrap(),
        &cache,
        &mut TensorViewMut::host(&mut o, [1, hq, d]).unwrap(),
        Some(&mut TensorViewMut::host(&mut lse, [1, hq]).unwrap()),
        &mut ws,
        &DecodeOptions { num_splits: Some(1), scale: Some(1.0), rope: Some(rope_q), ..Default::default() },
    )
    .unwrap();
    lse
}

/// Relative position: q(p)·k(p') depends only on p − p'. Exactly, with a table of quarter turns (pair i
/// turns by (i + 1)·π/2 per position: cos, sin in {0, ±1}, so rotation permutes and negates) and integer
/// vectors (every product and sum exact in fp32): the scores of (p, p') and (p + s, p' + s) are the same
/// bits. And with a real Llama-3 table and random vectors, within the rounding of rotated q and k to bf16.
#[test]
fn scores_depend_only_on_the_relative_position() {
    let emu = Emulator::new();
    let stream = Stream::Emu(&emu);
    let (d, rd, hq) = (64, 48, 4);
    let mut r = rng(common::case_seed(28_200));
    for style in [RopeStyle::Neox, RopeStyle::Gptj] {
        // Quarter turns, exactly.
        let max_pos = 64;
        let half = rd / 2;
        let quarter = [(1.0f32, 0.0f32), (0.0, 1.0), (-1.0, 0.0), (0.0, -1.0)];
        let (mut cos, mut sin) = (vec![0f32; max_pos * half], vec![0f32; max_pos * half]);
        for p in 0..max_pos {
            for i in 0..half {
                (cos[p * half + i], sin[p * half + i]) = quarter[(p * (i + 1)) % 4];
            }
        }
        let q: Vec<bf16> = (0..hq * d).map(|_| bf16::from_f32(r.random_range(-4i32..=4) as f32)).collect();
        let k: Vec<bf16> = (0..d).map(|_| bf16::from_f32(r.random_range(-4i32..=4) as f32)).collect();
        let base = one_key_score(&stream, &cos, &sin, max_pos, rd, style, &q, &k, 5, 12);
        for shift in [1, 2, 3, 17, 40] {
            let shifted = one_key_score(&stream, &cos, &sin, max_pos, rd, style, &q, &k, 5 + shift, 12 + shift);
            assert_eq!(
                base.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                shifted.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                "{style:?} shift {shift}: {base:?} vs {shifted:?}"
            );
        }
        // And the rotation is not the identity: another distance gives another score.
        let other = one_key_score(&stream, &cos, &sin, max_pos, rd, style, &q, &k, 5, 13);
        assert_ne!(base, other, "{style:?}: distance 7 and 8 score alike");

        // Llama 3.1's table: within the bf16 rounding of the rotated vectors (2 · 2^-8 relative per term).
        let cfg = RopeConfig { theta: 500000.0, rotary_dim: rd, style, scaling: RopeScaling::llama31() };
        let max_pos = 20000;
        let t = cfg.table(max_pos).unwrap();
        let q: Vec<bf16> = (0..hq * d).map(|_| bf16::from_f32(r.random_range(-1.0f32..1.0))).collect();
        let k: Vec<bf16> = (0..d).map(|_| bf16::from_f32(r.random_range(-1.0f32..1.0))).collect();
        let base = one_key_score(&stream, &t.cos, &t.sin, max_pos, rd, style, &q, &k, 100, 350);
        for shift in [1000, 9000, 19000] {
            let shifted = one_key_score(&stream, &t.cos, &t.sin, max_pos, rd, style, &q, &k, 100 + shift, 350 + shift);
            for h in 0..hq {
                // Rotated components are bounded by |a| + |b| of their pair; each of the two scores is off by
                // at most 2u per rotated element times its pair's |q|·|k| sums (u = 2^-8, bf16), plus u·|q k|
                // per passed-through element's two roundings (none: they are not rounded).
                let (qa, ka) = (|j: usize| q[h * d + j].to_f64().abs(), |j: usize| k[j].to_f64().abs());
                let pairs: f64 = (0..rd)
                    .map(|j| {
                        let (_, partner, _) = style.pair(j, rd);
                        (qa(j) + qa(partner)) * (ka(j) + ka(partner))
                    })
                    .sum();
                let bound = 2.0 * 2.05 * pairs / 256.0 + 1e-4;
                let err = f64::from((base[h] - shifted[h]).abs());
                assert!(
                    err <= bound,
                    "{style:?} shift {shift} head {h}: {} vs {} (bound {bound:.2e})",
                    base[h],
                    shifted[h]
                );
            }
        }
    }
}

/// The end-to-end path: prompt K/V appended with RoPE into an FP8 (and a 16-bit) cache at each token's
/// position, then decode with RoPE on q at seq_len − 1: against the reference over the appended cache (q
/// rotated by the reference). Poisoned table rows and the fixture's NaN slots must not leak.
#[test]
fn append_then_decode_with_rope_fp8_and_16_bit() {
    let emu = Emulator::new().with_table_checks(fused_attn::TableChecks::GpuMasking);
    let stream = Stream::Emu(&emu);
    // G = 4, and MQA-like G = 64: a wide CTA (8 warps), whose FP8 Q arrives in two halves, each rotated.
    for (i, heads) in [(8, 2), (128, 2)].into_iter().enumerate() {
        let seed = common::case_seed(28_300 + i);
        let case = DecodeCase::new(DType::Bf16, 128, heads, 16, &[0, 1, 40, 333], Some(2));
        let f = PagedFixture::<bf16>::new(&case, seed).unwrap();
        let (b, hq, d, hkv) = (case.batch(), case.heads_q, case.head_dim, case.heads_kv);
        let row = hkv * d;
        let (mut k, mut v, mut slots, mut pos) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for bi in 0..b {
            for t in 0..case.seq_lens[bi] {
                let s = f.slot(bi, t);
                k.extend_from_slice(&f.k_cache[s * row..][..row]);
                v.extend_from_slice(&f.v_cache[s * row..][..row]);
                slots.push(s as i64);
                pos.push(t as i32);
            }
        }
        let cfg =
            RopeConfig { theta: 500000.0, rotary_dim: 128, style: RopeStyle::Neox, scaling: RopeScaling::llama31() };
        let max_pos = 4096;
        let used: Vec<i64> = (0..333).collect();
        let table = PoisonedTable::new(&cfg, max_pos, &used).unwrap();
        let (cos, sin) = table.views().unwrap();
        let n = slots.len();
        let pos_view = TensorView::host(&pos, [n]).unwrap();
        let rope_k = Rope { cos: &cos, sin: &sin, rotary_dim: 128, style: RopeStyle::Neox, positions: Some(&pos_view) };
        let rope_q = Rope { positions: None, ..rope_k };
        let k_scale = [0.05f32, 0.02];
        let v_scale = [0.01f32, 0.03];
        let scales = KvScales::per_head(&stream, &k_scale, &v_scale).unwrap();
        macro_rules! round_trip {
            ($ty:ty, $nan:expr, $scales:expr) => {{
                let (kc, vc) =
                    run_append::<bf16, $ty>(&stream, f.cache_shape(), $nan, $scales, &k, &v, &slots, Some(rope_k))
                        .unwrap();
                let to = |x: &[f64]| -> Vec<$ty> { x.iter().map(|&x| <$ty as Element2>::from_value(x)).collect() };
                let (kc, vc) = (to(&kc), to(&vc));
                let mut cache = PagedKvCache::new(
                    TensorView::host(&kc, f.cache_shape()).unwrap(),
                    TensorView::host(&vc, f.cache_shape()).unwrap(),
                    TensorView::host(&f.block_table, [b, f.width]).unwrap(),
                    TensorView::host(&f.seq_lens, [b]).unwrap(),
                    case.max_seq_len(),
                )
                .unwrap();
                if let Some(s) = $scales {
                    cache = cache.with_scales(s).unwrap();
                }
                let mut ws = DecodeWorkspace::with_capacity(&stream, b, hq, d, 2).unwrap();
                let opts = DecodeOptions { num_splits: Some(2), rope: Some(rope_q), ..Default::default() };
                let q = TensorView::host(&f.q, [b, hq, d]).unwrap();
                let (o, lse, _) = decode_on_host(&stream, &q, &cache, &mut ws, &opts).unwrap();
                let (ov, lv) = (TensorView::host(&o, [b, hq, d]).unwrap(), TensorView::host(&lse, [b, hq]).unwrap());
                check_decode(&q, &cache, &ov, Some(&lv), &opts).unwrap()
            }};
        }
        let sixteen = round_trip!(bf16, bf16::NAN, None::<&KvScales>);
        let e4m3 = round_trip!(Fp8E4m3, Fp8E4m3(0x7f), Some(&scales));
        let e5m2 = round_trip!(Fp8E5m2, Fp8E5m2(0x7f), Some(&scales));
        eprintln!("heads {heads:?}: 16-bit {sixteen}\nE4M3 {e4m3}\nE5M2 {e5m2}");
        let rerun = common::rerun("rope", "append_then_decode_with_rope_fp8_and_16_bit", None);
        assert!(sixteen.passed() && e4m3.passed() && e5m2.passed(), "heads {heads:?}: {rerun}");
    }
}

/// Stored values back into cache elements (the tests' round trip through `run_append`'s f64 output).
trait Element2: Sized {
    fn from_value(x: f64) -> Self;
}
impl Element2 for bf16 {
    fn from_value(x: f64) -> Self {
        bf16::from_f64(x)
    }
}
impl Element2 for Fp8E4m3 {
    fn from_value(x: f64) -> Self {
        Fp8E4m3(if x.is_nan() { 0x7f } else { Fp8Format::E4m3.encode(x as f32) })
    }
}
impl Element2 for Fp8E5m2 {
    fn from_value(x: f64) -> Self {
        Fp8E5m2(if x.is_nan() { 0x7f } else { Fp8Format::E5m2.encode(x as f32) })
    }
}

/// Cost: with RoPE, append reads each valid K row once and writes the cache exactly as without (V alike);
/// decode reads q once, as without; neither writes its inputs; the only new traffic is the table (and the
/// positions), a few bytes per row.
#[test]
fn rope_reads_q_and_k_once_and_writes_them_nowhere() {
    let emu = Emulator::new();
    let stream = Stream::Emu(&emu);
    let (n, hkv, d, rd) = (24, 2, 128, 128);
    let k: Vec<bf16> = (0..n * hkv * d).map(|i| bf16::from_f32((i % 13) as f32 * 0.1)).collect();
    let v = k.clone();
    let slots: Vec<i64> = (0..n as i64).map(|t| if t % 5 == 3 { -1 } else { t }).collect();
    let valid = slots.iter().filter(|&&s| s >= 0).count() as u64;
    let positions: Vec<i32> = (0..n as i32).collect();
    let t = RopeConfig::new(10000.0, rd, RopeStyle::Neox).table(64).unwrap();
    let (cos, sin) = (TensorView::host(&t.cos, [64, rd / 2]).unwrap(), TensorView::host(&t.sin, [64, rd / 2]).unwrap());
    let pv = TensorView::host(&positions, [n]).unwrap();
    let rope = Rope { cos: &cos, sin: &sin, rotary_dim: rd, style: RopeStyle::Neox, positions: Some(&pv) };
    let mut traffic = Vec::new();
    for r in [None, Some(rope)] {
        run_append::<bf16, bf16>(&stream, [4, 8, hkv, d], bf16::NAN, None, &k, &v, &slots, r).unwrap();
        let c = emu.last_launch_counters().unwrap().kernels[0].clone();
        traffic.push((
            c.read_of("k"),
            c.written_of("k"),
            c.written_of("k_cache"),
            c.read_of("v"),
            c.written_of("v_cache"),
        ));
        assert_eq!(c.read_of("v"), valid * (hkv * d * 2) as u64, "V not read exactly once");
        eprintln!(
            "append rope={}: {} k bytes read, table {} + {} bytes, positions {}",
            r.is_some(),
            c.read_of("k"),
            c.read_of("rope_cos"),
            c.read_of("rope_sin"),
            c.read_of("rope_positions")
        );
    }
    let row_bytes = (hkv * d * 2) as u64;
    assert_eq!(traffic[0], traffic[1], "append traffic differs with RoPE");
    assert_eq!(traffic[1].0, valid * row_bytes, "K not read exactly once");

    // Decode: q read once (B·Hq·D·2 bytes), with and without RoPE.
    let case = DecodeCase::new(DType::Bf16, d, (8, 2), 16, &[5, 60], Some(1));
    let f = PagedFixture::<bf16>::new(&case, 7).unwrap();
    let cache = PagedKvCache::new(
        TensorView::host(&f.k_cache, f.cache_shape()).unwrap(),
        TensorView::host(&f.v_cache, f.cache_shape()).unwrap(),
        TensorView::host(&f.block_table, [2, f.width]).unwrap(),
        TensorView::host(&f.seq_lens, [2]).unwrap(),
        60,
    )
    .unwrap();
    let rope_q = Rope { positions: None, ..rope };
    let mut reads = Vec::new();
    for r in [None, Some(rope_q)] {
        let mut o = vec![bf16::NAN; 2 * 8 * d];
        let mut ws = DecodeWorkspace::with_capacity(&stream, 2, 8, d, 1).unwrap();
        decode(
            &stream,
            &TensorView::host(&f.q, [2, 8, d]).unwrap(),
            &cache,
            &mut TensorViewMut::host(&mut o, [2, 8, d]).unwrap(),
            None,
            &mut ws,
            &DecodeOptions { num_splits: Some(1), rope: r, ..Default::default() },
        )
        .unwrap();
        let c = emu.last_launch_counters().unwrap().kernels[0].clone();
        let table = c.read_of("rope_cos") + c.read_of("rope_sin");
        eprintln!(
            "decode rope={}: q {} bytes read, table {table} bytes, total {} read",
            r.is_some(),
            c.read_of("q"),
            c.global_bytes_read()
        );
        reads.push((
            c.read_of("q"),
            c.written_of("q"),
            c.read_of("k_cache"),
            c.read_of("v_cache"),
            c.written_of("o"),
            table,
        ));
    }
    assert_eq!(reads[0].0, (2 * 8 * d * 2) as u64, "q not read exactly once");
    assert_eq!(
        (reads[0].0, reads[0].1, reads[0].2, reads[0].3, reads[0].4),
        (reads[1].0, reads[1].1, reads[1].2, reads[1].3, reads[1].4),
        "decode traffic differs with RoPE"
    );
    // The table: per CTA (one per KV head and sequence here) rd/2 (cos, sin) pairs, shared by its query rows.
    assert_eq!((reads[0].5, reads[1].5), (0, (2 * 2 * (rd / 2) * 2 * 4) as u64));
}

/// Bad RoPE arguments are typed errors naming the argument.
#[test]
fn bad_rope_inputs_are_typed_errors() {
    let emu = Emulator::new();
    let stream = Stream::Emu(&emu);
    let (n, d) = (4, 64);
    let k = vec![bf16::ONE; n * d];
    let slots: Vec<i64> = (0..n as i64).collect();
    let t = RopeConfig::new(10000.0, 64, RopeStyle::Neox).table(16).unwrap();
    let (cos, sin) = (TensorView::host(&t.cos, [16, 32]).unwrap(), TensorView::host(&t.sin, [16, 32]).unwrap());
    let good = [0i32, 1, 2, 3];
    let far = [0i32, 1, 16, 3];
    let (gv, fv, short) = (
        TensorView::host(&good, [4]).unwrap(),
        TensorView::host(&far, [4]).unwrap(),
        TensorView::host(&good[..3], [3]).unwrap(),
    );
    let rope = Rope { cos: &cos, sin: &sin, rotary_dim: 64, style: RopeStyle::Neox, positions: Some(&gv) };
    let run = |r: Rope<'_>| {
        run_append::<bf16, bf16>(&stream, [1, 4, 1, d], bf16::NAN, None, &k, &k, &slots, Some(r)).map(|_| ())
    };
    assert!(run(rope).is_ok());
    let kind = |r: Rope<'_>| {
        let e = run(r).unwrap_err();
        (e.kind().clone(), e.message().split(':').next().unwrap_or("").to_string())
    };
    assert_eq!(kind(Rope { positions: Some(&fv), ..rope }).0, ErrorKind::OutOfBounds);
    assert_eq!(kind(Rope { positions: Some(&short), ..rope }).0, ErrorKind::Shape);
    assert_eq!(kind(Rope { positions: None, ..rope }).0, ErrorKind::Usage);
    assert_eq!(kind(Rope { rotary_dim: 66, ..rope }).0, ErrorKind::Unsupported);
    assert_eq!(kind(Rope { rotary_dim: 7, ..rope }).0, ErrorKind::Unsupported);
    let narrow = TensorView::host(&t.cos, [16, 16]).unwrap();
    assert_eq!(kind(Rope { cos: &narrow, ..rope }).0, ErrorKind::Shape);
    assert!(RopeConfig {
        scaling: RopeScaling::Linear { factor: 0.0 },
        ..RopeConfig::new(10000.0, 64, RopeStyle::Neox)
    }
    .table(4)
    .is_err());
}

/// The testkit harness (what the runner's `run --op decode --rope-theta …` and the GPU bundle use) with RoPE
/// cases: 16-bit and FP8 caches, default and explicit positions, a partial-rotary YaRN table.
#[test]
fn decode_harness_runs_rope_cases() {
    use fused_attn::testkit::cases::decode::{check_case_emulated, CaseRope};
    let emu = Emulator::new();
    let yarn =
        RopeConfig { theta: 10000.0, rotary_dim: 64, style: RopeStyle::Gptj, scaling: RopeScaling::yarn(8.0, 4096) };
    let l3 = RopeConfig { theta: 500000.0, rotary_dim: 128, style: RopeStyle::Neox, scaling: RopeScaling::llama31() };
    for (i, (config, explicit)) in [(yarn, true), (l3, false)].into_iter().enumerate() {
        let case = DecodeCase {
            rope: Some(CaseRope { config, explicit_positions: explicit }),
            ..DecodeCase::new(DType::Bf16, 128, (16, 4), 16, &[0, 3, 129, 700], Some(3))
        };
        let seed = common::case_seed(28_400 + i);
        let o = check_case_emulated(&emu, &case, seed).unwrap();
        eprintln!("{}: {}", case.label(), o.summary());
        assert!(o.passed(), "{}: {}", case.label(), o.summary());
        let kv = KvFormat::Fp8 { format: Fp8Format::E4m3, scales: fused_attn::ScaleKind::PerHead };
        let fp8 = DecodeCase { kv, ..case.clone() };
        let o = check_case_emulated(&emu, &fp8, seed).unwrap();
        eprintln!("{}: {}", fp8.label(), o.summary());
        assert!(o.passed(), "{}: {}", fp8.label(), o.summary());
    }
}

/// Fails naming the cases in `failed` (each printed its result) and the command that reruns `test`.
fn assert_none_failed(failed: &[usize], test: &str) {
    assert!(failed.is_empty(), "cases {failed:?} failed; {}", common::rerun("rope", test, None));
}

/// Append reads the table with 16-byte loads: per 8-element group of a rotated K row, 2 loads of cos and 2 of
/// sin (NeoX: 8 pairs) or 1 + 1 (GPT-J: 4 pairs), where scalar loads took 8 + 8. A table view that is not 16-byte aligned takes the scalar path (one cos and one sin load per
/// rotated element), and the cache is the same bits either way.
#[test]
fn append_reads_the_table_with_vector_loads() {
    let emu = Emulator::new();
    let stream = Stream::Emu(&emu);
    let (n, hkv, d, rd, max_pos) = (12, 2, 128, 128, 32);
    let k: Vec<bf16> = (0..n * hkv * d).map(|i| bf16::from_f32(((i * 7) % 23) as f32 * 0.05 - 0.5)).collect();
    let slots: Vec<i64> = (0..n as i64).map(|t| if t % 4 == 1 { -1 } else { t }).collect();
    let rows = (slots.iter().filter(|&&s| s >= 0).count() * hkv) as u64;
    let positions: Vec<i32> = (0..n as i32).map(|t| 2 * t + 1).collect();
    let pv = TensorView::host(&positions, [n]).unwrap();
    for style in [RopeStyle::Neox, RopeStyle::Gptj] {
        let t = RopeConfig::new(10000.0, rd, style).table(max_pos).unwrap();
        // The table twice: at a 16-byte aligned offset, and one float past it (unaligned).
        let mut buf = vec![0.0f32; 2 * t.cos.len() + 8];
        let aligned = buf.as_ptr().align_offset(16);
        let mut caches = Vec::new();
        let mut loads = Vec::new();
        for off in [aligned, aligned + 1] {
            let len = t.cos.len();
            buf[off..off + len].copy_from_slice(&t.cos);
            let mut sin_buf = vec![0.0f32; len + 8];
            let s_off = sin_buf.as_ptr().align_offset(16) + (off - aligned);
            sin_buf[s_off..s_off + len].copy_from_slice(&t.sin);
            let cos = TensorView::host(&buf[off..off + len], [max_pos, rd / 2]).unwrap();
            let sin = TensorView::host(&sin_buf[s_off..s_off + len], [max_pos, rd / 2]).unwrap();
            let rope = Rope { cos: &cos, sin: &sin, rotary_dim: rd, style, positions: Some(&pv) };
            caches.push(
                run_append::<bf16, bf16>(&stream, [2, 8, hkv, d], bf16::NAN, None, &k, &k, &slots, Some(rope)).unwrap(),
            );
            let c = emu.last_launch_counters().unwrap().kernels[0].clone();
            eprintln!(
                "{style:?} table offset {}: cos {} loads / {} bytes, sin {} loads / {} bytes",
                off - aligned,
                c.loads_of("rope_cos"),
                c.read_of("rope_cos"),
                c.loads_of("rope_sin"),
                c.read_of("rope_sin")
            );
            loads.push([c.loads_of("rope_cos"), c.read_of("rope_cos"), c.loads_of("rope_sin"), c.read_of("rope_sin")]);
        }
        assert!(caches[0].0.iter().zip(&caches[1].0).all(|(a, b)| same_value(*a, *b)), "the paths differ");
        let groups = rows * (rd / 8) as u64;
        let per_group = if style == RopeStyle::Neox { 2 } else { 1 };
        // NeoX: the same 32 bytes per group in 2 requests instead of 8; GPT-J: its 4 pairs' 16 bytes once,
        // where each of the 8 elements read its pair's entry (32 bytes).
        let bytes = groups * per_group * 16;
        assert_eq!(loads[0], [groups * per_group, bytes, groups * per_group, bytes], "vectorised");
        assert_eq!(loads[1], [groups * 8, groups * 32, groups * 8, groups * 32], "scalar fallback");
    }
}
