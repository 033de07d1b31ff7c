//! nvcc's own PTX of the shipped kernels (the fatbins' compute_80/89 PTX), run by the PTX executor and
//! compared bit for bit with the emulator's run of the same launch (docs/ptx-executor.md).

mod common;

use std::ffi::c_void;

use common::*;
use fused_attn::half;
use fused_attn::sys;
use fused_attn::sys::selftest as st;

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    as_bytes(v).to_vec()
}

/// Merge of attention states, every states/output dtype pair, with empty states (lse = -inf), a row whose
/// states are all empty, sinks and a row list. The weights are expf(lse_s - lse_max) and the LSE adds
/// logf(sum): nvcc inlines CUDA's expf/logf (an ex2.approx-based sequence, a polynomial) where the emulator
/// calls the host's, so these bitwise cases give every row equal LSEs (weights exp(0) = 1, exp(-inf) = 0 in
/// both); `merge_with_random_lses_stays_within_libm_differences` covers arbitrary LSEs with a bound.
#[test]
fn merge_matches_the_emulator_bit_for_bit() {
    let m = fatbin_module("merge");
    let (states, outer, inner, d) = (3usize, 2usize, 3usize, 64usize);
    for (si, sdt) in [sys::FA_DTYPE_F32, sys::FA_DTYPE_F16, sys::FA_DTYPE_BF16].into_iter().enumerate() {
        for (oi, odt) in [sys::FA_DTYPE_F32, sys::FA_DTYPE_F16, sys::FA_DTYPE_BF16].into_iter().enumerate() {
            for variant in 0..3 {
                let mut rng = Rng(0x1234 + (si * 3 + oi) as u64 * 17 + variant);
                let obytes = if odt == sys::FA_DTYPE_F32 { 4 } else { 2 };
                let vals: Vec<f32> = (0..states * outer * inner * d).map(|_| rng.f32(-2.0, 2.0)).collect();
                let o_states: Vec<u8> = match sdt {
                    x if x == sys::FA_DTYPE_F32 => f32_bytes(&vals),
                    x if x == sys::FA_DTYPE_F16 => {
                        vals.iter().flat_map(|v| half::f16::from_f32(*v).to_bits().to_le_bytes()).collect()
                    }
                    _ => vals.iter().flat_map(|v| half::bf16::from_f32(*v).to_bits().to_le_bytes()).collect(),
                };
                // Equal LSEs per row, or -inf (an empty state): exp(0) = 1 and exp(-inf) = 0 in both.
                let mut lse = vec![0f32; states * outer * inner];
                for (i, l) in lse.iter_mut().enumerate() {
                    let row = i % (outer * inner);
                    *l = if (i + variant as usize) % 4 == 0 || row == 1 { f32::NEG_INFINITY } else { 0.75 };
                }
                let sinks = vec![0.75f32; inner];
                let rows = [
                    sys::FaMergeRow { out_row: 1, first_state: 0, num_states: 2 },
                    sys::FaMergeRow { out_row: -1, first_state: 0, num_states: 0 },
                ];
                let bufs = vec![
                    Buf::new(c"o_states", &o_states, false),
                    Buf::input(c"lse_states", &lse),
                    Buf::output(c"o", outer * inner * d * obytes),
                    Buf::output(c"lse", outer * inner * 4),
                    Buf::input(c"sinks", &sinks),
                    Buf::input(c"row_list", &rows),
                ];
                let params = |p: &[*mut c_void]| sys::FaMergeParams {
                    o_states: p[0],
                    lse_states: p[1].cast(),
                    o: p[2],
                    lse: p[3].cast(),
                    o_state_stride: (outer * inner * d) as i64,
                    o_outer_stride: (inner * d) as i64,
                    o_inner_stride: d as i64,
                    lse_state_stride: (outer * inner) as i64,
                    lse_outer_stride: inner as i64,
                    lse_inner_stride: 1,
                    o_out_outer_stride: (inner * d) as i64,
                    o_out_inner_stride: d as i64,
                    lse_out_outer_stride: inner as i64,
                    lse_out_inner_stride: 1,
                    num_states: states as i32,
                    rows_outer: outer as i32,
                    out_rows: outer as i32,
                    rows_inner: inner as i32,
                    head_dim: d as i32,
                    states_dtype: sdt as i32,
                    out_dtype: odt as i32,
                    sinks: if variant == 1 { p[4].cast() } else { std::ptr::null() },
                    row_list: if variant == 2 { p[5].cast() } else { std::ptr::null() },
                };
                assert_same(&format!("merge {si}->{oi} variant {variant}"), &[m], &bufs, params, sys::fa_merge);
            }
        }
    }
}

fn mma_case(dtype: u32, seed: u64, finite: bool) -> Vec<Buf> {
    let mut rng = Rng(seed);
    let half_bits = |rng: &mut Rng| -> u32 {
        let v = rng.f32(-4.0, 4.0);
        if !finite && rng.next() % 13 == 0 {
            return 0x7fff; // a NaN element
        }
        if dtype == sys::FA_DTYPE_F16 {
            half::f16::from_f32(v).to_bits() as u32
        } else {
            half::bf16::from_f32(v).to_bits() as u32
        }
    };
    let a: Vec<u32> = (0..128).map(|_| half_bits(&mut rng) | half_bits(&mut rng) << 16).collect();
    let b: Vec<u32> = (0..64).map(|_| half_bits(&mut rng) | half_bits(&mut rng) << 16).collect();
    let c: Vec<f32> = (0..128).map(|_| rng.f32(-100.0, 100.0)).collect();
    vec![Buf::input(c"a", &a), Buf::input(c"b", &b), Buf::input(c"c", &c), Buf::output(c"d", 128 * 4)]
}

fn mma_params(dtype: u32) -> impl Fn(&[*mut c_void]) -> st::FaSelftestMmaParams {
    move |p| st::FaSelftestMmaParams {
        a: p[0].cast(),
        b: p[1].cast(),
        c: p[2].cast(),
        d: p[3].cast(),
        dtype: dtype as i32,
    }
}

/// mma.sync m16n8k16 through the self-test kernel: nvcc's PTX of the intrinsic against the emulator's twin.
#[test]
fn selftest_mma_matches_the_emulator() {
    let m = fatbin_module("selftest");
    for dtype in [sys::FA_DTYPE_F16, sys::FA_DTYPE_BF16] {
        for seed in 1..4 {
            let bufs = mma_case(dtype, seed, seed != 3);
            assert_same(&format!("mma dtype {dtype} seed {seed}"), &[m], &bufs, mma_params(dtype), st::fa_selftest_mma);
        }
    }
}

/// ldmatrix .x1/.x2/.x4 with and without .trans, lanes addressing random rows.
#[test]
fn selftest_ldmatrix_matches_the_emulator() {
    let m = fatbin_module("selftest");
    let mut rng = Rng(99);
    let rows = 40usize;
    let data: Vec<u16> = (0..rows * 8).map(|_| rng.next() as u16).collect();
    for count in [1, 2, 4] {
        for trans in [false, true] {
            let row_of_lane: Vec<i32> = (0..32).map(|_| (rng.next() % rows as u64) as i32).collect();
            let bufs = vec![
                Buf::input(c"rows_data", &data),
                Buf::input(c"row_of_lane", &row_of_lane),
                Buf::output(c"out", 512),
            ];
            let params = |p: &[*mut c_void]| st::FaSelftestLdmatrixParams {
                rows_data: p[0].cast(),
                row_of_lane: p[1].cast(),
                out: p[2].cast(),
                rows: rows as i32,
                count,
                trans: trans as i32,
            };
            assert_same(&format!("ldmatrix x{count} trans {trans}"), &[m], &bufs, params, st::fa_selftest_ldmatrix);
        }
    }
}

/// shfl.sync (bfly, idx) for every operand, vote.sync ballot/any/all, and ex2.approx.ftz on special values.
#[test]
fn selftest_warp_ops_match_the_emulator() {
    let m = fatbin_module("selftest");
    let mut rng = Rng(7);
    let ops = [
        st::FA_SELFTEST_SHFL_XOR,
        st::FA_SELFTEST_SHFL_IDX,
        st::FA_SELFTEST_BALLOT,
        st::FA_SELFTEST_ANY,
        st::FA_SELFTEST_ALL,
        st::FA_SELFTEST_EXP2,
    ];
    for op in ops {
        for round in 0..4 {
            let mut values: Vec<u32> = (0..32).map(|_| rng.next() as u32 & if round == 1 { 1 } else { !0 }).collect();
            if op == st::FA_SELFTEST_EXP2 {
                let special = [0.0f32, -0.0, 1.0, -1.0, 0.5, 127.9, 128.0, -126.0, -150.0, f32::INFINITY];
                for (i, s) in special.iter().enumerate() {
                    values[i] = s.to_bits();
                }
                values[10] = f32::NEG_INFINITY.to_bits();
                values[11] = 1; // subnormal
                values[12] = f32::NAN.to_bits();
                for v in &mut values[13..] {
                    *v = rng.f32(-30.0, 30.0).to_bits();
                }
            }
            // Lane masks and source lanes in 0..32: past that the emulator's shfl_xor keeps the lane's own
            // value where shfl.sync.bfly uses the mask's low 5 bits (`shfl_xor_masks_past_31_use_their_low_bits`).
            let operands: Vec<i32> = (0..32).map(|l| (l * (round + 3) + round) % 32).collect();
            // Not 0xff: a ballot of every lane writes exactly that.
            let bufs = vec![
                Buf::input(c"values", &values),
                Buf::input(c"operands", &operands),
                Buf::new(c"out", &[0x5a; 128], true),
            ];
            let params = |p: &[*mut c_void]| st::FaSelftestWarpParams {
                values: p[0].cast(),
                operands: p[1].cast(),
                out: p[2].cast(),
                op: op as i32,
            };
            assert_same(&format!("warp op {op} round {round}"), &[m], &bufs, params, st::fa_selftest_warp);
        }
    }
}

/// cp.async with commit/wait groups and zero-fill (src-size 0 for a false predicate).
#[test]
fn selftest_cp_async_matches_the_emulator() {
    let m = fatbin_module("selftest");
    let mut rng = Rng(3);
    for (groups, wait, read) in [(1, 0, 1), (3, 1, 2), (4, 0, 4), (2, 1, 1)] {
        let n = groups * 64;
        let src: Vec<u8> = (0..n * 16).map(|_| rng.next() as u8).collect();
        let preds: Vec<u8> = (0..n).map(|_| (rng.next() % 3 != 0) as u8).collect();
        let bufs = vec![Buf::new(c"src", &src, false), Buf::new(c"preds", &preds, false), {
            Buf::new(c"out", &vec![0xa5; n * 16], true)
        }];
        let params = |p: &[*mut c_void]| st::FaSelftestCpAsyncParams {
            src: p[0].cast(),
            preds: p[1].cast(),
            out: p[2].cast(),
            groups: groups as i32,
            wait_pending: wait,
            read_groups: read,
        };
        assert_same(&format!("cp.async {groups} groups wait {wait}"), &[m], &bufs, params, st::fa_selftest_cp_async);
    }
}

/// A GEMM's inputs: a [m][k], b [n][k] (or [k][n] when the params say k-major: the same bytes).
pub fn gemm_case(dtype: u32, m: usize, n: usize, k: usize, seed: u64) -> Vec<Buf> {
    let mut rng = Rng(seed);
    let mut conv = |len: usize| -> Vec<u16> {
        (0..len)
            .map(|_| {
                let v = rng.f32(-1.0, 1.0);
                if dtype == sys::FA_DTYPE_F16 {
                    half::f16::from_f32(v).to_bits()
                } else {
                    half::bf16::from_f32(v).to_bits()
                }
            })
            .collect()
    };
    let a = conv(m * k);
    let b = conv(n * k);
    vec![Buf::input(c"a", &a), Buf::input(c"b", &b), Buf::output(c"c", m * n * 4)]
}

pub fn gemm_params(
    dtype: u32,
    m: usize,
    n: usize,
    k: usize,
    b_k_major: bool,
) -> impl Fn(&[*mut c_void]) -> st::FaSelftestGemmParams {
    move |p| st::FaSelftestGemmParams {
        a: p[0],
        b: p[1],
        c: p[2].cast(),
        m: m as i32,
        n: n as i32,
        k: k as i32,
        dtype: dtype as i32,
        b_k_major: b_k_major as i32,
        bug: st::FA_SELFTEST_GEMM_CORRECT as i32,
    }
}

/// The tiled GEMM self-test (cp.async double buffering, ldmatrix with and without .trans, mma.sync, bar.sync):
/// the intrinsics composed the way the attention kernels compose them.
#[test]
fn selftest_gemm_matches_the_emulator() {
    let module = fatbin_module("selftest");
    for dtype in [sys::FA_DTYPE_F16, sys::FA_DTYPE_BF16] {
        for b_k_major in [false, true] {
            let (m, n, k) = (64, 64, 96);
            let bufs = gemm_case(dtype, m, n, k, 5);
            let (_, stats) = assert_same(
                &format!("gemm dtype {dtype} b_k_major {b_k_major}"),
                &[module],
                &bufs,
                gemm_params(dtype, m, n, k, b_k_major),
                st::fa_selftest_gemm,
            );
            assert!(stats.warp_instructions > 0);
        }
    }
}

/// shfl.sync.bfly with a lane mask past 31 (`__shfl_xor_sync` passes it through unchanged): the ISA takes its
/// low five bits (bval = b[4:0]), so lane l reads lane l ^ (mask & 31). The emulator's twin keeps the lane's
/// own value there instead (docs/emulator.md, "Shuffles"): a divergence the executor found. No kernel passes
/// such a mask; this pins what the shipped PTX does.
#[test]
fn shfl_xor_masks_past_31_use_their_low_bits() {
    let m = fatbin_module("selftest");
    let values: Vec<u32> = (0..32).map(|l| 1000 + l).collect();
    let operands: Vec<i32> = (0..32).map(|l| [33, 63, -1, 40][l % 4]).collect();
    let bufs = vec![Buf::input(c"values", &values), Buf::input(c"operands", &operands), Buf::output(c"out", 128)];
    let params = |p: &[*mut c_void]| st::FaSelftestWarpParams {
        values: p[0].cast(),
        operands: p[1].cast(),
        out: p[2].cast(),
        op: st::FA_SELFTEST_SHFL_XOR as i32,
    };
    let (ptx, _) = run_ptx(&[m], &bufs, &params, st::fa_selftest_warp).unwrap();
    let want: Vec<u32> = (0..32).map(|l| 1000 + (l as u32 ^ (operands[l] as u32 & 31))).collect();
    assert_eq!(ptx[2].u32s(), want);
}

/// Paged append (fa_paged_append*): 16-bit and FP8 caches (E4M3, E5M2: the compute_89 PTX's hardware
/// cvt.rn.satfinite against the emulator's FP8 model), with and without RoPE on K (NeoX and GPT-J), a
/// padding slot (-1) and K/V of different head dims.
#[test]
fn append_matches_the_emulator_bit_for_bit() {
    let m = fatbin_module("append");
    let (tokens, heads, page_size, pages) = (6usize, 2usize, 4usize, 4usize);
    for (case, (dtype, kv_dtype, rope, dqk, dv)) in [
        (sys::FA_DTYPE_BF16, sys::FA_KV_SAME, None, 64usize, 64usize),
        (sys::FA_DTYPE_F16, sys::FA_KV_SAME, Some(sys::FA_ROPE_NEOX), 64, 32),
        (sys::FA_DTYPE_BF16, sys::FA_KV_SAME, Some(sys::FA_ROPE_GPTJ), 128, 128),
        (sys::FA_DTYPE_F16, sys::FA_KV_FP8_E4M3, None, 64, 64),
        (sys::FA_DTYPE_BF16, sys::FA_KV_FP8_E5M2, Some(sys::FA_ROPE_NEOX), 64, 64),
        (sys::FA_DTYPE_BF16, sys::FA_KV_FP8_E4M3, Some(sys::FA_ROPE_GPTJ), 128, 64),
    ]
    .into_iter()
    .enumerate()
    {
        let mut rng = Rng(0xa11 + case as u64);
        let fp8 = kv_dtype != sys::FA_KV_SAME;
        let elem = if fp8 { 1 } else { 2 };
        let to16 = |v: f32| {
            if dtype == sys::FA_DTYPE_F16 {
                half::f16::from_f32(v).to_bits()
            } else {
                half::bf16::from_f32(v).to_bits()
            }
        };
        // Values past E4M3's 448 too (saturation), and some exact ties.
        let k: Vec<u16> = (0..tokens * heads * dqk)
            .map(|i| to16(rng.f32(-3.0, 3.0) * if i % 17 == 0 { 300.0 } else { 1.0 }))
            .collect();
        let v: Vec<u16> = (0..tokens * heads * dv).map(|_| to16(rng.f32(-3.0, 3.0))).collect();
        let slots: Vec<i64> = vec![3, 0, -1, 9, 14, 5];
        let rot = dqk / 2;
        let cos: Vec<f32> = (0..16 * rot / 2).map(|_| rng.f32(-1.0, 1.0)).collect();
        let sin: Vec<f32> = (0..16 * rot / 2).map(|_| rng.f32(-1.0, 1.0)).collect();
        let positions: Vec<i32> = vec![3, 0, 7, 15, 2, 9];
        let scales = [0.37f32, 1.9];
        let bufs = vec![
            Buf::input(c"k", &k),
            Buf::input(c"v", &v),
            Buf::input(c"slot_mapping", &slots),
            Buf::output(c"k_cache", pages * page_size * heads * dqk * elem),
            Buf::output(c"v_cache", pages * page_size * heads * dv * elem),
            Buf::input(c"cos", &cos),
            Buf::input(c"sin", &sin),
            Buf::input(c"positions", &positions),
            Buf::input(c"k_scale", &scales[..1]),
            Buf::input(c"v_scale", &scales[1..]),
        ];
        let mut div: sys::FaDivisor = Default::default();
        // SAFETY: writes one FaDivisor.
        assert_eq!(unsafe { sys::fa_host_divisor(page_size as i32, &mut div) }, 0);
        let params = |p: &[*mut c_void]| sys::FaAppendParams {
            k: p[0],
            v: p[1],
            slot_mapping: p[2].cast(),
            k_token_stride: (heads * dqk) as i64,
            k_head_stride: dqk as i64,
            v_token_stride: (heads * dv) as i64,
            v_head_stride: dv as i64,
            cache: sys::FaPagedCache {
                k_cache: p[3],
                v_cache: p[4],
                block_table: std::ptr::null(),
                seq_lens: std::ptr::null(),
                k_page_stride: (page_size * heads * dqk) as i64,
                k_token_stride: (heads * dqk) as i64,
                k_head_stride: dqk as i64,
                v_page_stride: (page_size * heads * dv) as i64,
                v_token_stride: (heads * dv) as i64,
                v_head_stride: dv as i64,
                block_table_stride: 0,
                page_div: div,
                num_pages: pages as i32,
                page_size: page_size as i32,
                max_pages_per_seq: 0,
                kv_dtype: kv_dtype as i32,
                scale_head_stride: 0,
                k_scale: if fp8 { p[8].cast() } else { std::ptr::null() },
                v_scale: if fp8 { p[9].cast() } else { std::ptr::null() },
                seq_lens_cumulative: 0,
            },
            num_tokens: tokens as i32,
            heads_kv: heads as i32,
            head_dim: dqk as i32,
            dtype: dtype as i32,
            rope: match rope {
                None => Default::default(),
                Some(style) => sys::FaRope {
                    cos: p[5].cast(),
                    sin: p[6].cast(),
                    cos_stride: (rot / 2) as i64,
                    sin_stride: (rot / 2) as i64,
                    positions: p[7].cast(),
                    max_pos: 16,
                    rotary_dim: rot as i32,
                    style: style as i32,
                },
            },
            head_dim_v: dv as i32,
        };
        assert_same(&format!("append case {case}"), &[m], &bufs, params, sys::fa_append);
    }
}

/// A bug planted in the device branch of the intrinsics (`planted_module`): the emulator runs the host
/// branch, so its result is the correct one (as the rest of the suite sees it: unchanged); the shipped
/// PTX with the bug must differ from it, and the same launch on the unplanted PTX must not.
fn assert_planted_bug_caught<P: Copy>(
    bug: &str,
    planted: &ptx_exec::Module,
    correct: &ptx_exec::Module,
    bufs: &[Buf],
    params: impl Fn(&[*mut c_void]) -> P,
    launcher: Launcher<P>,
) {
    let emu = run_emulator(bufs, &params, launcher, 1).unwrap();
    let (good, _) = run_ptx(&[correct], bufs, &params, launcher).unwrap();
    assert!(differences(&emu, &good, true, 1).is_empty(), "{bug}: the unplanted PTX already differs");
    let (bad, _) = run_ptx(&[planted], bufs, &params, launcher).unwrap_or_else(|e| panic!("{bug}: {e}"));
    let diff = differences(&emu, &bad, true, 3);
    assert!(!diff.is_empty(), "{bug}: planted in the device intrinsics, not caught by the PTX executor");
    eprintln!("{bug}: caught: {}", diff.join("; "));
}

/// Two A-fragment registers of mma.sync swapped in the asm string: the GEMM self-test's result changes.
#[test]
fn planted_mma_a_fragment_swap_is_caught() {
    let planted = planted_module("selftest", "compute_89", "{%4,%5,%6,%7}", "{%4,%6,%5,%7}");
    for dtype in [sys::FA_DTYPE_F16, sys::FA_DTYPE_BF16] {
        let (m, n, k) = (32, 32, 32);
        assert_planted_bug_caught(
            "mma A registers a1/a2 swapped",
            &planted,
            fatbin_module("selftest"),
            &gemm_case(dtype, m, n, k, 9),
            gemm_params(dtype, m, n, k, false),
            st::fa_selftest_gemm,
        );
    }
}

/// ldmatrix.x4.trans without .trans (the GEMM's loads of a k-major B): caught.
#[test]
fn planted_ldmatrix_trans_dropped_is_caught() {
    let planted = planted_module(
        "selftest",
        "compute_89",
        "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16",
        "ldmatrix.sync.aligned.m8n8.x4.shared.b16",
    );
    let (m, n, k) = (32, 32, 32);
    assert_planted_bug_caught(
        "ldmatrix .x4 without .trans",
        &planted,
        fatbin_module("selftest"),
        &gemm_case(sys::FA_DTYPE_F16, m, n, k, 11),
        gemm_params(sys::FA_DTYPE_F16, m, n, k, true),
        st::fa_selftest_gemm,
    );
}

/// The halves of a packed bf16x2 exchanged (pack2<bf16_t>: __floats2bfloat162_rn(hi, lo)): the merge
/// kernel's bf16 stores come out with neighbouring columns swapped.
#[test]
fn planted_bf16x2_halves_swapped_is_caught() {
    let planted =
        planted_module("merge", "compute_80", "__floats2bfloat162_rn(lo, hi)", "__floats2bfloat162_rn(hi, lo)");
    let (outer, inner, d) = (1usize, 2usize, 16usize);
    let mut rng = Rng(21);
    let vals: Vec<f32> = (0..outer * inner * d).map(|_| rng.f32(-2.0, 2.0)).collect();
    let lse = vec![0.5f32; outer * inner];
    let bufs = vec![
        Buf::input(c"o_states", &vals),
        Buf::input(c"lse_states", &lse),
        Buf::output(c"o", outer * inner * d * 2),
        Buf::output(c"lse", outer * inner * 4),
    ];
    let params = |p: &[*mut c_void]| sys::FaMergeParams {
        o_states: p[0],
        lse_states: p[1].cast(),
        o: p[2],
        lse: p[3].cast(),
        o_state_stride: (outer * inner * d) as i64,
        o_outer_stride: (inner * d) as i64,
        o_inner_stride: d as i64,
        lse_state_stride: (outer * inner) as i64,
        lse_outer_stride: inner as i64,
        lse_inner_stride: 1,
        o_out_outer_stride: (inner * d) as i64,
        o_out_inner_stride: d as i64,
        lse_out_outer_stride: inner as i64,
        lse_out_inner_stride: 1,
        num_states: 1,
        rows_outer: outer as i32,
        out_rows: outer as i32,
        rows_inner: inner as i32,
        head_dim: d as i32,
        states_dtype: sys::FA_DTYPE_F32 as i32,
        out_dtype: sys::FA_DTYPE_BF16 as i32,
        sinks: std::ptr::null(),
        row_list: std::ptr::null(),
    };
    assert_planted_bug_caught("bf16x2 halves swapped", &planted, fatbin_module("merge"), &bufs, params, sys::fa_merge);
}

/// Merge with arbitrary LSEs (f32 states and output): CUDA's expf/logf against the host's differ in the last
/// bits, and a weighted sum with cancellation can magnify that, so this is a bound: every output within
/// 1e-5 of the emulator's (values are O(1)), every LSE within 2 ulp.
#[test]
fn merge_with_random_lses_stays_within_libm_differences() {
    let m = fatbin_module("merge");
    let (states, rows, d) = (5usize, 6usize, 32usize);
    let mut rng = Rng(77);
    let o: Vec<f32> = (0..states * rows * d).map(|_| rng.f32(-2.0, 2.0)).collect();
    let lse: Vec<f32> = (0..states * rows).map(|_| rng.f32(-6.0, 6.0)).collect();
    let bufs = vec![
        Buf::input(c"o_states", &o),
        Buf::input(c"lse_states", &lse),
        Buf::output(c"o", rows * d * 4),
        Buf::output(c"lse", rows * 4),
    ];
    let params = |p: &[*mut c_void]| sys::FaMergeParams {
        o_states: p[0],
        lse_states: p[1].cast(),
        o: p[2],
        lse: p[3].cast(),
        o_state_stride: (rows * d) as i64,
        o_outer_stride: d as i64,
        o_inner_stride: 0,
        lse_state_stride: rows as i64,
        lse_outer_stride: 1,
        lse_inner_stride: 0,
        o_out_outer_stride: d as i64,
        o_out_inner_stride: 0,
        lse_out_outer_stride: 1,
        lse_out_inner_stride: 0,
        num_states: states as i32,
        rows_outer: rows as i32,
        out_rows: rows as i32,
        rows_inner: 1,
        head_dim: d as i32,
        states_dtype: sys::FA_DTYPE_F32 as i32,
        out_dtype: sys::FA_DTYPE_F32 as i32,
        sinks: std::ptr::null(),
        row_list: std::ptr::null(),
    };
    let emu = run_emulator(&bufs, &params, sys::fa_merge, 1).unwrap();
    let (ptx, _) = run_ptx(&[m], &bufs, &params, sys::fa_merge).unwrap();
    let f = |b: &Buf| b.u32s().into_iter().map(f32::from_bits).collect::<Vec<_>>();
    let (eo, po) = (f(&emu[2]), f(&ptx[2]));
    let worst = eo.iter().zip(&po).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(worst <= 1e-5, "merge outputs differ by {worst}");
    for (a, b) in emu[3].u32s().iter().zip(ptx[3].u32s()) {
        assert!((*a as i64 - b as i64).abs() <= 2, "LSE {:e} vs {:e}", f32::from_bits(*a), f32::from_bits(b));
    }
    let bitwise = eo.iter().zip(&po).filter(|(a, b)| a.to_bits() == b.to_bits()).count();
    eprintln!("merge, random LSEs: {bitwise} of {} outputs bitwise equal, max |diff| {worst:e}", eo.len());
}

/// The emulator's planted-bug kernels (kernels/selftest.cu, `fa_bug_*`), from the fatbin's PTX: each
/// undefined behaviour the executor checks is reported with the kernel, block, thread and PTX line, and each
/// correct twin runs clean and equal to the emulator. Not here: STACK_OVERFLOW and RAW_POINTER (host-fiber faults with no PTX
/// counterpart), GLOBAL_AS_SHARED (breaks the intrinsics' rule that ld_shared takes shared memory, but its
/// PTX is a generic `ld` of a global address, which the GPU defines: nothing to report at the PTX level).
#[test]
fn planted_bug_kernels_are_reported_with_kernel_thread_and_line() {
    let m = fatbin_module("selftest");
    // input[0] == 1.0: the division-by-zero kernel divides by input[0] - 1.
    let input: Vec<f32> = (0..512).map(|i| if i == 0 { 1.0 } else { i as f32 * 0.25 }).collect();
    let cases: [(u32, &str); 10] = [
        (st::FA_SELFTEST_BUG_MISSING_SYNCTHREADS, "data race on shared memory"),
        (st::FA_SELFTEST_BUG_OOB_WRITE, "out-of-bounds global store of 4 bytes"),
        (st::FA_SELFTEST_BUG_MISSING_CP_ASYNC_WAIT, "cp.async to those bytes is in flight"),
        (st::FA_SELFTEST_BUG_DIVERGENT_BARRIER, "divergent warp"),
        (st::FA_SELFTEST_BUG_DEADLOCK, "deadlock"),
        (st::FA_SELFTEST_BUG_MISALIGNED_16, "misaligned global load of 16 bytes"),
        (st::FA_SELFTEST_BUG_DIV_BY_ZERO, "integer division by zero"),
        (st::FA_SELFTEST_BUG_STORE_TO_INPUT, "read-only buffer input"),
        (st::FA_SELFTEST_BUG_SHARED_OOB, "out-of-bounds shared store"),
        (st::FA_SELFTEST_BUG_SPIN_WAIT, "spin-wait"),
    ];
    for (bug, want) in cases {
        for planted in [true, false] {
            // Room after `out` so that an out-of-bounds store lands in no other buffer.
            let bufs = vec![Buf::input(c"input", &input), Buf::output(c"out", 512 * 4)];
            let params = |p: &[*mut c_void]| st::FaSelftestBugParams {
                input: p[0].cast(),
                out: p[1].cast(),
                bug: bug as i32,
                planted: planted as i32,
                race_detection: 1,
            };
            // The launcher records only the correct twins (a planted bug would be a real fault on a GPU): the
            // twin's launch, with the planted flag set in its params bytes, is the planted kernel's.
            let twin = |p: &[*mut c_void]| st::FaSelftestBugParams { planted: 0, ..params(p) };
            let mut ptx = bufs.clone();
            let mut launches = record(&ptx, &twin, st::fa_selftest_bug).unwrap();
            let flag = std::mem::offset_of!(st::FaSelftestBugParams, planted);
            launches[0].params[flag..flag + 4].copy_from_slice(&(planted as i32).to_le_bytes());
            let got = execute(&[m], &mut ptx, &launches).map(|s| (ptx, s));
            if planted {
                let e = got.err().unwrap_or_else(|| panic!("bug {bug}: not reported"));
                eprintln!("bug {bug}: {e}");
                assert!(e.contains(want), "bug {bug}: {e}");
                assert!(e.contains("kernel fa_bug_") && e.contains("PTX line"), "bug {bug}: {e}");
            } else {
                let (ptx, _) = got.unwrap_or_else(|e| panic!("bug {bug}'s correct twin: {e}"));
                let emu = run_emulator(&bufs, &params, st::fa_selftest_bug, 1).unwrap();
                let diff = differences(&emu, &ptx, true, 4);
                assert!(diff.is_empty(), "bug {bug}'s twin: {diff:?}");
            }
        }
    }
}

/// The FP8 conversions of the intrinsics through the compute_89 PTX (the hardware `cvt.rn.f16x2.e4m3x2` /
/// `.e5m2x2` and `cvt.rn.satfinite.e4m3x2.f32` / `.e5m2x2`, modelled here from the ISA) against the emulator's
/// scalar model (fa/fp8_model.cuh): every pair of codes decoded, and encodes of random values, ties,
/// saturating magnitudes, infinities, NaN and subnormals.
#[test]
fn selftest_fp8_conversions_match_the_emulator() {
    let m = fatbin_module("selftest");
    let mut rng = Rng(8);
    for kv in [sys::FA_KV_FP8_E4M3, sys::FA_KV_FP8_E5M2] {
        let codes: Vec<u16> = (0..=u16::MAX).collect();
        let n = codes.len();
        let mut values: Vec<f32> =
            (0..2 * n).map(|_| rng.f32(-600.0, 600.0) * 2f32.powi((rng.next() % 40) as i32 - 30)).collect();
        let special = [
            0.0,
            -0.0,
            448.0,
            464.0,
            480.0,
            57344.0,
            61440.0,
            1e9,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            1e-40,
            0.0009765625,
            0.001953125 * 1.5,
        ];
        values[..special.len()].copy_from_slice(&special);
        for encode in [0, 1] {
            let bufs = vec![
                Buf::input(c"codes", &codes),
                Buf::input(c"values", &values),
                Buf::output(c"halves", n * 4),
                Buf::output(c"codes_out", n * 2),
            ];
            let params = |p: &[*mut c_void]| st::FaSelftestFp8Params {
                codes: p[0].cast(),
                values: p[1].cast(),
                halves: p[2].cast(),
                codes_out: p[3].cast(),
                n: n as i32,
                kv_dtype: kv as i32,
                encode,
            };
            assert_same(&format!("fp8 kv {kv} encode {encode}"), &[m], &bufs, params, st::fa_selftest_fp8);
        }
    }
}

/// Named barriers (pairs of warps, crossing pairs, the whole block at barrier 3), and two warps arriving at
/// one barrier with different thread counts (reported).
#[test]
fn selftest_named_barriers_match_the_emulator() {
    let m = fatbin_module("selftest");
    for mode in [st::FA_SELFTEST_BARRIER_PAIRS, st::FA_SELFTEST_BARRIER_BLOCK] {
        let bufs = vec![Buf::output(c"out", 128 * 4)];
        let params = |p: &[*mut c_void]| st::FaSelftestBarrierParams { out: p[0].cast(), mode: mode as i32 };
        assert_same(&format!("barrier mode {mode}"), &[m], &bufs, params, st::fa_selftest_barrier);
    }
    let bufs = vec![Buf::output(c"out", 128 * 4)];
    let params = |p: &[*mut c_void]| st::FaSelftestBarrierParams {
        out: p[0].cast(),
        mode: st::FA_SELFTEST_BARRIER_MISMATCH as i32,
    };
    let e = run_ptx(&[m], &bufs, &params, st::fa_selftest_barrier).err().expect("a count mismatch is reported");
    assert!(e.contains("arrives with a thread count of"), "{e}");
    // CROSS: a warp outside a named barrier's pair reads what the pair wrote: a race (the emulator's too).
    let params = |p: &[*mut c_void]| st::FaSelftestBarrierParams {
        out: p[0].cast(),
        mode: st::FA_SELFTEST_BARRIER_CROSS as i32,
    };
    let e = run_ptx(&[m], &bufs, &params, st::fa_selftest_barrier).err().expect("the race is reported");
    assert!(e.contains("data race on shared memory"), "{e}");
}

/// The GEMM self-test's planted pipeline bugs (in the kernel source, so in both builds): the next stage's
/// cp.async overwriting a tile other warps may still read (no trailing barrier), and computing on a stage
/// whose cp.async was never waited for. Both reported from the PTX.
#[test]
fn gemm_pipeline_bugs_are_reported() {
    let m = fatbin_module("selftest");
    let (mm, n, k) = (64, 64, 96);
    for (bug, want) in [
        // The overwriting cp.async is issued while another warp still reads the tile: in flight at the read.
        (st::FA_SELFTEST_GEMM_NO_TRAILING_BARRIER, "cp.async to those bytes is in flight"),
        (st::FA_SELFTEST_GEMM_NO_WAIT, "cp.async to those bytes is in flight"),
    ] {
        let bufs = gemm_case(sys::FA_DTYPE_F16, mm, n, k, 4);
        let base = gemm_params(sys::FA_DTYPE_F16, mm, n, k, false);
        let params = |p: &[*mut c_void]| st::FaSelftestGemmParams { bug: bug as i32, ..base(p) };
        let e = run_ptx(&[m], &bufs, &params, st::fa_selftest_gemm).err().unwrap_or_else(|| panic!("bug {bug} missed"));
        eprintln!("gemm bug {bug}: {e}");
        assert!(e.contains(want), "gemm bug {bug}: {e}");
    }
}
