//! The sm_90a prefill kernel at Q·K head dim 192 with V head dim 128 (DeepSeek-V2/V3's prefill; issue 27),
//! on the host emulator with every check active: Q and K tiles of 192 columns (3 swizzle panels), V and O
//! of 128 (2 panels), S = Q Kᵀ over k = 192 and O = P V of N = 128 (kernels/include/fa/hopper/traits.cuh,
//! `PrefillTraits<192, 128, 128>`). Against the fp64 reference and the sm_80 kernel (which serves the pair
//! at width 192 with predicated V columns); the kernel choice and typed errors for the pairs it lacks; the
//! exact TMA traffic (Q and K bytes of 192 columns, V and O of 128, each once per the tiling model) and the
//! pipeline's prefetch slack. NaN in hidden memory (V/O columns past 128 in padded strides, keys outside a
//! window) is in tests/it/poison.rs (`emulated_sm90_prefill_hidden_rows`).
use crate::common;

use std::time::Instant;

use fused_attn::mask::{kv_block_range, Window};
use fused_attn::prefill::{prefill, sm90_serves, PrefillKernel, PrefillOptions, Sm90Tile, SM90_V_HEAD_DIM_PAIRS};
use fused_attn::rope::{RopeConfig, RopeStyle};
use fused_attn::testkit::cases::decode::CaseRope;
use fused_attn::testkit::cases::prefill::{run_emulated, CaseLayout, PrefillCase, PrefillFixture};
use fused_attn::testkit::variants::{CaseAlibi, CaseVariants};
use fused_attn::tile::prefill_sm90_tile_policy;
use fused_attn::{DType, Element, Emulator, ErrorKind, LaunchCounters, Stream, TensorView, TensorViewMut};
use half::{bf16, f16};

const D: usize = 192;
const DV: usize = 128;

/// A dense 192 / 128 case on the sm_90a kernel.
fn dense(dtype: DType, causal: bool, tq: usize, tk: usize, heads: (usize, usize)) -> PrefillCase {
    let c = PrefillCase::dense(dtype, D, causal, tq, tk, heads);
    PrefillCase { head_dim_v: Some(DV), kernel: PrefillKernel::Sm90, ..c }
}

fn varlen(dtype: DType, causal: bool, heads: (usize, usize), seqs: Vec<(usize, usize)>) -> PrefillCase {
    let c = PrefillCase::varlen(dtype, D, causal, heads, seqs);
    PrefillCase { head_dim_v: Some(DV), kernel: PrefillKernel::Sm90, ..c }
}

fn kernel_name(dtype: DType) -> String {
    format!("fa_prefill_sm90_{}_d192_dv128", if dtype == DType::F16 { "f16" } else { "bf16" })
}

/// Runs `case` on the sm_90a kernel (which must be `fa_prefill_sm90_*_d192_dv128`) and on the sm_80 kernel,
/// with the same inputs: both within the tolerance rule of the fp64 reference, and the two outputs within
/// that tolerance of each other (NaN exactly where the other is: the poisoned strides neither writes).
/// Returns the summary and the sm_90a launch's counters.
fn check<T: Element>(emu: &Emulator, i: usize, case: &PrefillCase) -> Result<(String, LaunchCounters), String> {
    let seed = common::case_seed(i);
    let f = PrefillFixture::<T>::new(case, seed).map_err(|e| e.to_string())?;
    let out = run_emulated(emu, &f).map_err(|e| format!("{e} (case seed {seed:#x})"))?;
    let counters = emu.last_launch_counters().ok_or("no counters")?;
    let want = kernel_name(case.dtype);
    if counters.kernels.len() != 1 || counters.kernels[0].kernel != want {
        return Err(format!(
            "ran {:?} instead of {want}",
            counters.kernels.iter().map(|k| &k.kernel).collect::<Vec<_>>()
        ));
    }
    let outcome = f.evaluate(&out).map_err(|e| e.to_string())?;
    if !outcome.passed() {
        return Err(format!("sm90: {} (case seed {seed:#x})", outcome.summary()));
    }
    let mut f80 = f;
    f80.case.kernel = PrefillKernel::Sm80;
    let out80 = run_emulated(emu, &f80).map_err(|e| format!("sm80: {e} (case seed {seed:#x})"))?;
    let k80 = &emu.last_launch_counters().ok_or("no counters")?.kernels[0].kernel;
    if k80.contains("sm90") {
        return Err(format!("the sm80 run ran {k80}"));
    }
    let outcome80 = f80.evaluate(&out80).map_err(|e| e.to_string())?;
    if !outcome80.passed() {
        return Err(format!("sm80: {} (case seed {seed:#x})", outcome80.summary()));
    }
    let tol = outcome.out.tolerance.max(outcome80.out.tolerance);
    let mut max_diff = 0.0f64;
    for (j, (a, b)) in out.o.iter().zip(&out80.o).enumerate() {
        let (a, b) = (a.to_f64(), b.to_f64());
        if a.is_nan() != b.is_nan() {
            return Err(format!("o[{j}]: sm90 {a}, sm80 {b} (one wrote it, the other did not; seed {seed:#x})"));
        }
        if !a.is_nan() {
            max_diff = max_diff.max((a - b).abs());
        }
    }
    if max_diff > tol {
        return Err(format!("max|sm90 - sm80| {max_diff:.3e} > tolerance {tol:.3e} (case seed {seed:#x})"));
    }
    Ok((format!("{}; max|sm90 - sm80| {max_diff:.3e}", outcome.summary()), counters))
}

/// SMs of the emulated GPU: few, so that the persistent CTAs each run several work tiles.
const SWEEP_SMS: usize = 3;

fn run_cases(name: &str, cases: &[PrefillCase]) {
    let emu = Emulator::new().with_multiprocessors(SWEEP_SMS);
    let next = std::sync::atomic::AtomicUsize::new(0);
    let failures = std::sync::Mutex::new(Vec::new());
    let start = Instant::now();
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get());
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(c) = cases.get(i) else { break };
                if !common::case_selected(i) {
                    continue;
                }
                let r = match c.dtype {
                    DType::F16 => check::<f16>(&emu, i, c),
                    DType::Bf16 => check::<bf16>(&emu, i, c),
                };
                match r {
                    Ok((msg, _)) => eprintln!("ok   [{i}] {}: {msg}", c.label()),
                    Err(msg) => {
                        let msg = format!("[{i}] {}: {msg}", c.label());
                        eprintln!("FAIL {msg}");
                        failures.lock().unwrap().push(msg);
                    }
                }
            });
        }
    });
    let failures = failures.into_inner().unwrap();
    eprintln!("{name}: {} cases in {:.1} s", cases.len(), start.elapsed().as_secs_f64());
    assert!(failures.is_empty(), "{} of {} cases failed:\n{}", failures.len(), cases.len(), failures.join("\n"));
}

/// 192 / 128 on the sm_90a kernel: dense with Tq = Tk, Tq < Tk (chunked prefill), Tq > Tk (the first rows
/// see nothing), lengths across the 128-row and 128-key tile edges, batches with padded strides (NaN in
/// every V and O column past 128 and every gap), GQA and MQA, varlen with empty sequences and a sequence
/// without keys, causal and not, LSE on and off, both dtypes; every score variant (window edges, softcap,
/// ALiBi per head and per sequence, sinks) alone and together; RoPE on q with explicit and default
/// positions (64 rotary dims, as DeepSeek's q carries).
#[test]
fn emulated_sm90_v_head_dim_sweep() {
    let rope =
        |explicit_positions| CaseRope { config: RopeConfig::new(10000.0, 64, RopeStyle::Neox), explicit_positions };
    let mut cases = vec![
        dense(DType::Bf16, true, 200, 200, (2, 1)),
        dense(DType::F16, false, 70, 300, (4, 2)),
        dense(DType::Bf16, true, 300, 129, (2, 2)),
        dense(DType::F16, false, 129, 128, (3, 1)),
        dense(DType::Bf16, false, 1, 257, (2, 1)),
        varlen(DType::Bf16, true, (4, 2), vec![(130, 140), (0, 3), (20, 129), (5, 0)]),
        varlen(DType::F16, false, (2, 1), vec![(17, 33), (0, 0), (129, 257)]),
    ];
    (cases[3].batch, cases[3].layout) = (2, CaseLayout::Padded);
    cases[1].with_lse = false;
    cases[5].layout = CaseLayout::Padded;
    let variants = [
        (
            DType::Bf16,
            true,
            CaseVariants { window: Some((90, 0)), sinks: true, alibi: CaseAlibi::PerHead, ..Default::default() },
        ),
        (
            DType::F16,
            false,
            CaseVariants {
                window: Some((40, 20)),
                softcap: Some(5.0),
                alibi: CaseAlibi::PerSequence,
                ..Default::default()
            },
        ),
        (DType::Bf16, false, CaseVariants { softcap: Some(30.0), ..Default::default() }),
        (
            DType::F16,
            true,
            CaseVariants { window: Some((0, 0)), softcap: Some(10.0), sinks: true, ..Default::default() },
        ),
    ];
    for (i, (dtype, causal, v)) in variants.into_iter().enumerate() {
        let mut c =
            dense(dtype, causal, [200, 150, 129, 90][i], [260, 150, 300, 90][i], [(4, 2), (2, 1), (2, 2), (3, 1)][i]);
        (c.batch, c.layout, c.variants, c.with_lse) = (2, CaseLayout::Padded, v, i != 2);
        cases.push(c);
    }
    let mut all = varlen(DType::F16, true, (4, 1), vec![(130, 140), (0, 3), (20, 129)]);
    all.layout = CaseLayout::Padded;
    all.variants = CaseVariants { window: Some((60, 0)), softcap: Some(3.0), alibi: CaseAlibi::PerHead, sinks: true };
    cases.push(all);
    let mut r = dense(DType::Bf16, true, 100, 160, (2, 1));
    (r.rope, r.layout) = (Some(rope(true)), CaseLayout::Padded);
    cases.push(r);
    let mut r = varlen(DType::F16, false, (2, 2), vec![(40, 70), (0, 5), (129, 129)]);
    r.rope = Some(rope(false));
    cases.push(r);
    run_cases("emulated_sm90_v_head_dim_sweep", &cases);
}

/// The kernel choice: `Sm90` runs 192 / 128 on its own kernel (causal or not, windowed: 128 x 128 all);
/// `Auto` on the emulator and `Sm80` run the sm_80 kernel of width 192. Pairs the sm_90a kernel has no
/// tile for (192 / 192, 128 / 64, 256 / 128, 64 / 128) and RoPE on K are `Unsupported` when forced and run
/// on the sm_80 kernel under `Auto`.
#[test]
fn v_head_dim_kernel_choice_and_typed_errors() {
    assert_eq!(SM90_V_HEAD_DIM_PAIRS, [(D, DV)]);
    let run = |(d, dv): (usize, usize), opts: PrefillOptions| -> fused_attn::Result<String> {
        let emu = Emulator::new();
        let (t, h) = (40, 2);
        let qk = vec![bf16::ONE; t * h * d];
        let v = vec![bf16::ONE; t * h * dv];
        let mut o = vec![bf16::ZERO; t * h * dv];
        prefill(
            &Stream::Emu(&emu),
            &TensorView::host(&qk, [1, t, h, d])?,
            &TensorView::host(&qk, [1, t, h, d])?,
            &TensorView::host(&v, [1, t, h, dv])?,
            &mut TensorViewMut::host(&mut o, [1, t, h, dv])?,
            None,
            &opts,
        )?;
        assert!(o.iter().all(|x| *x == bf16::ONE), "{d}/{dv}: the mean of ones");
        Ok(emu.last_launch_counters().unwrap().kernels[0].kernel.clone())
    };
    let with = |kernel| PrefillOptions { kernel, ..Default::default() };
    let sm90 = "fa_prefill_sm90_bf16_d192_dv128";
    assert_eq!(run((D, DV), with(PrefillKernel::Sm90)).unwrap(), sm90);
    let causal = PrefillOptions { causal: true, ..with(PrefillKernel::Sm90) };
    assert_eq!(run((D, DV), causal).unwrap(), sm90);
    let window = fused_attn::score_mod::ScoreMod { window: Some((5, 5)), ..Default::default() };
    assert_eq!(run((D, DV), PrefillOptions { score_mod: window, ..with(PrefillKernel::Sm90) }).unwrap(), sm90);
    assert_eq!(run((D, DV), with(PrefillKernel::Auto)).unwrap(), "fa_prefill_bf16_d192");
    assert_eq!(run((D, DV), with(PrefillKernel::Sm80)).unwrap(), "fa_prefill_bf16_d192");
    for masked in [false, true] {
        assert_eq!(Sm90Tile::for_pair(D, DV, masked), Some(Sm90Tile { block_m: 128, block_n: 128 }));
    }
    for (pair, sm80) in [
        ((192, 192), "fa_prefill_bf16_d192"),
        ((128, 64), "fa_prefill_bf16_d160"),
        ((256, 128), "fa_prefill_bf16_d256"),
        ((64, 128), "fa_prefill_bf16_d160"),
    ] {
        assert!(!sm90_serves(pair.0, pair.1) && prefill_sm90_tile_policy(pair.0, pair.1, false).is_none());
        let e = run(pair, with(PrefillKernel::Sm90)).unwrap_err();
        assert_eq!(e.kind(), &ErrorKind::Unsupported, "{pair:?}: {e}");
        assert!(e.to_string().contains("sm90"), "{pair:?}: {e}");
        assert_eq!(run(pair, with(PrefillKernel::Auto)).unwrap(), sm80, "{pair:?}");
    }
}

/// The exact traffic of the 192 / 128 kernel against its tiling model: per work tile (128 query rows of one
/// query head) the KV tiles of `kv_block_range` (128 keys each), each K tile read once at 192 columns and
/// each V tile at 128 (only the rows below Tk: the TMA unit zero-fills the rest without a read), Q once
/// (its rows below Tq, 192 columns; not at all for a tile whose rows see no key), O written once (128
/// columns), LSE once; TMA boxes of whole tiles: Q
/// tiles of 128 x 192 under evict_first, and one 16-row O box per 64-column panel of each warp with rows
/// (two, not three). Dense, causal and not, GQA, a window, Tq > Tk.
#[test]
fn emulated_sm90_v_head_dim_traffic_follows_the_tiling_model() {
    let emu = Emulator::new().with_multiprocessors(SWEEP_SMS);
    let tile = Sm90Tile::for_pair(D, DV, true).unwrap();
    let (br, bc) = (tile.block_m, tile.block_n);
    let shapes = [
        (false, 200, 333, (4, 2), None),
        (true, 300, 300, (2, 1), None),
        (true, 150, 400, (2, 2), Some((100, 0))),
        (false, 260, 129, (3, 1), Some((30, 40))),
        (true, 300, 129, (2, 1), None),
    ];
    let mut failures = Vec::new();
    for (i, &(causal, tq, tk, heads, window)) in shapes.iter().enumerate() {
        let mut case = dense(if i % 2 == 0 { DType::Bf16 } else { DType::F16 }, causal, tq, tk, heads);
        case.batch = 2;
        case.variants.window = window;
        let r = match case.dtype {
            DType::F16 => check::<f16>(&emu, 40 + i, &case),
            DType::Bf16 => check::<bf16>(&emu, 40 + i, &case),
        };
        let (_, counters) = r.unwrap_or_else(|e| panic!("{}: {e}", case.label()));
        let k = &counters.kernels[0];
        let t = counters.total();
        let w = Window::new(window, causal);
        // Per query head: the keys its work tiles load, and the query tiles (and their rows below Tq) that load
        // Q at all (a tile no row of which sees a key, Tq > Tk causal, loads nothing).
        let (mut keys, mut q_tiles, mut q_rows) = (0usize, 0usize, 0usize);
        for m in 0..tq.div_ceil(br) {
            let r = kv_block_range(m * br, br, bc, tq, tk, w);
            keys += (r.n_begin..r.n_end).map(|n| tk.min((n + 1) * bc) - n * bc).sum::<usize>();
            if r.n_end > r.n_begin {
                q_tiles += 1;
                q_rows += br.min(tq - m * br);
            }
        }
        let (hq, b) = (heads.0, case.batch);
        let warps_with_rows = tq.div_ceil(16);
        for (what, measured, expected) in [
            ("q read", k.read_of("q"), b * hq * q_rows * D * 2),
            ("k read", k.read_of("k"), b * hq * keys * D * 2),
            ("v read", k.read_of("v"), b * hq * keys * DV * 2),
            ("o written", k.written_of("o"), b * hq * tq * DV * 2),
            ("lse written", k.written_of("lse"), b * hq * tq * 4),
            ("Q boxes (evict_first)", t.tma_load_bytes_evict_first, b * hq * q_tiles * br * D * 2),
            ("O boxes", t.tma_store_bytes, b * hq * warps_with_rows * 16 * DV * 2),
        ] {
            if measured as usize != expected {
                failures.push(format!("{}: {what} {measured}, model {expected}", case.label()));
            }
        }
        let reads = ["q", "k", "v"].iter().map(|x| k.read_of(x)).sum::<u64>();
        assert_eq!(k.global_bytes_read(), reads, "{}: reads nothing else", case.label());
        assert_eq!(t.tma_load_bytes_evict_first + t.tma_load_bytes_evict_last, t.tma_load_bytes, "{}", case.label());
    }
    assert!(failures.is_empty(), "{} mismatches:\n{}", failures.len(), failures.join("\n"));
}

/// Prefetch slack of the 192 / 128 pipeline (2 stages of K 192 + V 128 columns, tests/it/prefill_sm90.rs
/// says how it is counted): one CTA, one query tile, six KV tiles: every K and V load after a stream's first
/// issued while the previous tile may still be in use (10 of 10), none two ahead (two stages cannot hold
/// more), both dtypes, causal and not.
#[test]
fn emulated_sm90_v_head_dim_loads_prefetch_every_tile() {
    let emu = Emulator::new();
    let tile = Sm90Tile::for_pair(D, DV, false).unwrap();
    assert_eq!(prefill_sm90_tile_policy(D, DV, false).unwrap().stages, 2);
    for (i, (dtype, causal)) in [(DType::F16, false), (DType::Bf16, true)].into_iter().enumerate() {
        let case = dense(dtype, causal, tile.block_m, 6 * tile.block_n, (1, 1));
        let r = match dtype {
            DType::F16 => check::<f16>(&emu, 50 + i, &case),
            DType::Bf16 => check::<bf16>(&emu, 50 + i, &case),
        };
        let k = r.unwrap_or_else(|e| panic!("{}: {e}", case.label())).1.total();
        assert_eq!(k.blocks, 1, "{}", case.label());
        let got = (k.tma_tiles_prefetched, k.tma_tiles_late, k.tma_tiles_two_ahead);
        assert_eq!(got, (10, 0, 0), "{}: (prefetched, late, two ahead)", case.label());
    }
}

/// Varlen at 192 / 128: the top KV tile of a sequence is one TMA box of 128 rows, reading the next
/// sequence's rows and here the rows past the last sequence (no sequence owns them), and V's rows are
/// padded past its 128 columns (a row stride of 136 per head). The kernel masks those scores and zeroes
/// those V rows (its 2 panels) before P·V, and never reads V's padding: the outputs with NaN and with zeros
/// in the hidden memory are bit for bit the same, finite in O's 128 columns, and O's padding is never
/// written. Causal and not, GQA 2:1, both dtypes.
#[test]
fn emulated_sm90_v_head_dim_varlen_hidden_rows_never_reach_the_output() {
    fn run<T: Element>(causal: bool, fill: f64) -> Vec<u64> {
        let (hq, hkv, vs) = (4usize, 2usize, DV + 8);
        let cu_q = [0i32, 20, 150];
        let cu_k = [0i32, 17, 160];
        let (total_q, total_k) = (150usize, 200usize); // k/v rows 160..200 belong to no sequence
        let mut rng = 0x5eed_1920_u64;
        let mut val = || {
            rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            T::from_f64(((rng >> 40) as f64 / (1u64 << 24) as f64) - 0.4)
        };
        let q: Vec<T> = (0..total_q * hq * D).map(|_| val()).collect();
        let mut k: Vec<T> = (0..total_k * hkv * D).map(|_| val()).collect();
        let mut v: Vec<T> = (0..total_k * hkv * vs).map(|_| val()).collect();
        for (i, x) in k.iter_mut().enumerate() {
            if i / (hkv * D) >= 160 {
                *x = T::from_f64(fill);
            }
        }
        for (i, x) in v.iter_mut().enumerate() {
            if i / (hkv * vs) >= 160 || i % vs >= DV {
                *x = T::from_f64(fill);
            }
        }
        let emu = Emulator::new().with_multiprocessors(2);
        let mut o = vec![T::nan(); total_q * hq * vs];
        let mut lse = vec![f32::NAN; hq * total_q];
        let v_st = [(hkv * vs) as i64, vs as i64, 1];
        let o_st = [(hq * vs) as i64, vs as i64, 1];
        let opts = PrefillOptions { causal, kernel: PrefillKernel::Sm90, ..Default::default() };
        fused_attn::prefill::prefill_varlen(
            &Stream::Emu(&emu),
            &TensorView::host(&q, [total_q, hq, D]).unwrap(),
            &TensorView::host(&k, [total_k, hkv, D]).unwrap(),
            &TensorView::host(&v[..(total_k - 1) * hkv * vs + (hkv - 1) * vs + DV], [total_k, hkv, DV])
                .unwrap()
                .with_strides(v_st)
                .unwrap(),
            &TensorView::host(&cu_q, [3]).unwrap(),
            &TensorView::host(&cu_k, [3]).unwrap(),
            130,
            143,
            &mut TensorViewMut::host(&mut o, [total_q, hq, DV]).unwrap().with_strides(o_st).unwrap(),
            Some(&mut TensorViewMut::host(&mut lse, [hq, total_q]).unwrap()),
            &opts,
        )
        .unwrap();
        let kernel = &emu.last_launch_counters().unwrap().kernels[0].kernel;
        assert!(kernel.starts_with("fa_prefill_sm90") && kernel.ends_with("_d192_dv128"), "{kernel}");
        for (i, x) in o.iter().enumerate() {
            let written = i % vs < DV;
            assert_eq!(x.to_f64().is_finite(), written, "o[{i}] (column {}; fill {fill})", i % vs);
        }
        // Causal, sequence 0 (20 rows, 17 keys): its first 3 rows see no key (LSE −inf, O 0).
        for (i, x) in lse.iter().enumerate() {
            let empty = causal && i % total_q < 3;
            assert!(if empty { *x == f32::NEG_INFINITY } else { x.is_finite() }, "lse[{i}] {x} (fill {fill})");
        }
        o.iter().map(|x| x.to_f64().to_bits()).chain(lse.iter().map(|x| u64::from(x.to_bits()))).collect()
    }
    for causal in [false, true] {
        assert!(run::<bf16>(causal, f64::NAN) == run::<bf16>(causal, 0.0), "bf16 causal {causal}");
        assert!(run::<f16>(causal, f64::NAN) == run::<f16>(causal, 0.0), "f16 causal {causal}");
    }
}
