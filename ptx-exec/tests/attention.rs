//! nvcc's PTX of the attention kernels (prefill, decode) run by the PTX executor against the emulator's run
//! of the same launch. These kernels' arithmetic is not the emulator's instruction for instruction (nvcc
//! contracts a·b + c into fma where the host compiler rounds twice, and CUDA's expf/logf/log2f are not the
//! host's), so the comparison is a bound, not bits (docs/ptx-executor.md).

mod common;

use std::ffi::c_void;

use common::*;
use fused_attn::half;
use fused_attn::sys;

fn to16(dtype: u32, v: f32) -> u16 {
    if dtype == sys::FA_DTYPE_F16 {
        half::f16::from_f32(v).to_bits()
    } else {
        half::bf16::from_f32(v).to_bits()
    }
}

/// A dense prefill case: shapes, dtype, causal, and the score variants (softcap, sliding window).
#[derive(Clone, Copy, Debug)]
struct Prefill {
    b: usize,
    hq: usize,
    hkv: usize,
    tq: usize,
    tk: usize,
    d: usize,
    dtype: u32,
    causal: i32,
    softcap: f32,
    window: (i32, i32),
}

fn prefill_case(c: Prefill, seed: u64) -> (Vec<Buf>, impl Fn(&[*mut c_void]) -> sys::FaPrefillParams) {
    let Prefill { b, hq, hkv, tq, tk, d, dtype, .. } = c;
    let mut rng = Rng(seed);
    let q: Vec<u16> = (0..b * tq * hq * d).map(|_| to16(dtype, rng.f32(-1.0, 1.0))).collect();
    let k: Vec<u16> = (0..b * tk * hkv * d).map(|_| to16(dtype, rng.f32(-1.0, 1.0))).collect();
    let v: Vec<u16> = (0..b * tk * hkv * d).map(|_| to16(dtype, rng.f32(-1.0, 1.0) + 0.5)).collect();
    let bufs = vec![
        Buf::input(c"q", &q),
        Buf::input(c"k", &k),
        Buf::input(c"v", &v),
        Buf::output(c"o", b * tq * hq * d * 2),
        Buf::output(c"lse", b * hq * tq * 4),
    ];
    let scale = 1.0 / (d as f32).sqrt();
    let params = move |p: &[*mut c_void]| sys::FaPrefillParams {
        q: p[0],
        k: p[1],
        v: p[2],
        o: p[3],
        lse: p[4].cast(),
        q_batch_stride: (tq * hq * d) as i64,
        q_row_stride: (hq * d) as i64,
        q_head_stride: d as i64,
        k_batch_stride: (tk * hkv * d) as i64,
        k_row_stride: (hkv * d) as i64,
        k_head_stride: d as i64,
        v_batch_stride: (tk * hkv * d) as i64,
        v_row_stride: (hkv * d) as i64,
        v_head_stride: d as i64,
        o_batch_stride: (tq * hq * d) as i64,
        o_row_stride: (hq * d) as i64,
        o_head_stride: d as i64,
        lse_batch_stride: (hq * tq) as i64,
        lse_head_stride: tq as i64,
        batch: b as i32,
        heads_q: hq as i32,
        heads_kv: hkv as i32,
        seqlen_q: tq as i32,
        seqlen_k: tk as i32,
        head_dim: d as i32,
        dtype: dtype as i32,
        causal: c.causal,
        scale,
        scale_log2: scale * std::f32::consts::LOG2_E,
        score_mod: sys::FaScoreMod {
            window_left: c.window.0,
            window_right: c.window.1,
            softcap: c.softcap,
            ..Default::default()
        },
        ..Default::default()
    };
    (bufs, params)
}

/// The sm_80 prefill kernels (plain and _mod): bf16 and f16, causal with Tq = Tk and Tq < Tk, GQA, ragged
/// tiles, head dims 64 and 128, a sliding window. O bit for bit (the softmax's exp2 is ex2.approx, whose one
/// model both share); the LSE within 4 ulp (its log2f is CUDA's, inlined by nvcc, against the host's).
#[test]
fn prefill_matches_the_emulator_bit_for_bit() {
    let m = fatbin_module("prefill");
    let base = Prefill { b: 1, hq: 2, hkv: 1, tq: 80, tk: 80, d: 64, dtype: sys::FA_DTYPE_BF16, causal: 1, softcap: 0.0, window: (-1, -1) };
    let cases = [
        base,
        Prefill { dtype: sys::FA_DTYPE_F16, causal: 0, ..base },
        Prefill { b: 2, hq: 4, hkv: 2, tq: 33, tk: 97, ..base },
        Prefill { d: 128, tq: 70, tk: 70, ..base },
        Prefill { window: (20, 0), ..base },
        Prefill { softcap: 5.0, causal: 0, ..base },
    ];
    for (i, c) in cases.into_iter().enumerate() {
        let (bufs, params) = prefill_case(c, 42 + i as u64);
        let t = std::time::Instant::now();
        let (_, stats) = assert_same_but(&format!("prefill {c:?}"), m, &bufs, params, sys::fa_prefill, &["lse"]);
        eprintln!("prefill {c:?}: {:?} in the executor, {} warp instructions", t.elapsed(), stats.warp_instructions);
    }
}
