//! The tile policy the Rust side reads (`fused_attn::tile::tile_policy`, the launchers' `fa_tile_policy`) is
//! what the launchers launch: every (op, dtype, head dim, variant, cache format) a launcher accepts runs on
//! the emulator, and the kernel it launched must be the policy's width and variant, with the policy's
//! threads, shared memory and CTAs. A launcher that picks another kernel or shape than the policy says (a
//! new width added to one list and not the other, a traits change the policy does not read) fails here.

use fused_attn::head_dim::{
    DECODE_HEAD_DIMS, HEAD_DIMS, PAGED_PREFILL_HEAD_DIMS, PAGED_PREFILL_TILED_MAX_HEAD_DIM, PREFILL_HEAD_DIMS,
    PREFILL_TILED_MAX_HEAD_DIM,
};
use fused_attn::prefill::PrefillKernel;
use fused_attn::testkit::cases::decode::{run_case_emulated as run_decode, DecodeCase};
use fused_attn::testkit::cases::kv::KvFormat;
use fused_attn::testkit::cases::paged_prefill::{case as paged_case, run_case_emulated as run_paged};
use fused_attn::testkit::cases::prefill::{run_emulated, PrefillCase, PrefillFixture};
use fused_attn::tile::{tile_policy, KernelOp, TilePolicy};
use fused_attn::{DType, Emulator, Fp8Format, KernelCounters, ScaleKind};
use half::{bf16, f16};

const SEED: u64 = 0x711e_9011;
const DTYPES: [DType; 2] = [DType::F16, DType::Bf16];

fn dt(dtype: DType) -> &'static str {
    match dtype {
        DType::F16 => "f16",
        DType::Bf16 => "bf16",
    }
}

/// The one kernel the last emulated call launched (split-KV would add a merge; every case here has one split).
fn launched(emu: &Emulator) -> KernelCounters {
    let c = emu.last_launch_counters().expect("the call launched");
    assert_eq!(c.kernels.len(), 1, "one kernel expected:\n{c}");
    c.kernels[0].clone()
}

/// Every dtype with every head dim of an op's range.
fn dtypes_and_head_dims(dims: &'static [usize]) -> impl Iterator<Item = (DType, usize)> {
    DTYPES.into_iter().flat_map(move |dtype| dims.iter().map(move |&d| (dtype, d)))
}

fn assert_shape(k: &KernelCounters, kernel: &str, p: &TilePolicy, blocks: usize, what: &str) {
    assert_shape_threads(k, kernel, p, p.threads, blocks, what);
}

fn assert_shape_threads(k: &KernelCounters, kernel: &str, p: &TilePolicy, threads: usize, blocks: usize, what: &str) {
    assert_eq!(k.kernel, kernel, "{what}: {p:?}");
    assert_eq!((k.block_threads, k.smem_bytes), (threads as u64, p.smem_bytes as u64), "{what}: {kernel}");
    assert_eq!(k.blocks, blocks as u64, "{what}: {kernel}");
}

/// Past the tiled kernels' head dims (issue 27) prefill and paged prefill launch the decode kernel of the
/// head dim's decode width, with decode's policy (its threads and shared memory): one CTA per 16 packed rows
/// of a KV head (`head_blocks_in_x`: grid (Hkv · row blocks, 1, B)).
#[test]
fn wide_prefills_launch_the_decode_policy_kernel() {
    let emu = Emulator::new();
    let wide: Vec<usize> = PREFILL_HEAD_DIMS.into_iter().filter(|&d| d > PREFILL_TILED_MAX_HEAD_DIM).collect();
    assert_eq!((wide.len(), wide[0], wide[wide.len() - 1]), (32, 264, 512));
    for (i, &d) in wide.iter().enumerate() {
        let dtype = if i % 2 == 0 { DType::Bf16 } else { DType::F16 };
        let variant = i % 3 == 0;
        assert_eq!(tile_policy(KernelOp::Prefill, d, variant, None), None, "D {d}: no tiled policy");
        let p = tile_policy(KernelOp::Decode, d, variant, None).unwrap();
        // 2 query heads per KV head, 17 rows: 34 packed rows, three 16-row blocks per KV head, 2 KV heads.
        let mut case = PrefillCase::dense(dtype, d, true, 17, 20, (4, 2));
        (case.kernel, case.with_lse) = (PrefillKernel::Auto, false);
        case.variants.softcap = variant.then_some(30.0);
        match dtype {
            DType::F16 => drop(run_emulated(&emu, &PrefillFixture::<f16>::new(&case, SEED).unwrap()).unwrap()),
            DType::Bf16 => drop(run_emulated(&emu, &PrefillFixture::<bf16>::new(&case, SEED).unwrap()).unwrap()),
        }
        let name = format!("fa_paged_decode_{}_d{}{}", dt(dtype), p.width, if variant { "_mod" } else { "" });
        assert_shape(&launched(&emu), &name, &p, 3 * 2, &case.label());
        let mut case = paged_case(d, (2, 1), 16, &[(20, 30)]);
        (case.dtype, case.num_splits) = (dtype, Some(1));
        case.variants.softcap = variant.then_some(30.0);
        match dtype {
            DType::F16 => drop(run_paged::<f16>(&emu, &case, SEED).unwrap()),
            DType::Bf16 => drop(run_paged::<bf16>(&emu, &case, SEED).unwrap()),
        }
        assert_shape(&launched(&emu), &name, &p, 3, &case.label());
    }
}

#[test]
fn prefill_launches_the_policy_kernel_for_every_head_dim() {
    let emu = Emulator::new();
    for (dtype, d) in dtypes_and_head_dims(&PREFILL_HEAD_DIMS).filter(|&(_, d)| d <= PREFILL_TILED_MAX_HEAD_DIM) {
        for variant in [false, true] {
            let p = tile_policy(KernelOp::Prefill, d, variant, None).unwrap();
            // block_m + 1 query rows: two query tiles, the second one ragged.
            let mut case = PrefillCase::dense(dtype, d, false, p.block_m + 1, 8, (1, 1));
            case.kernel = PrefillKernel::Sm80;
            case.with_lse = false;
            case.variants.softcap = variant.then_some(30.0);
            match dtype {
                DType::F16 => drop(run_emulated(&emu, &PrefillFixture::<f16>::new(&case, SEED).unwrap()).unwrap()),
                DType::Bf16 => drop(run_emulated(&emu, &PrefillFixture::<bf16>::new(&case, SEED).unwrap()).unwrap()),
            }
            let name = format!("fa_prefill_{}_d{}{}", dt(dtype), p.width, if variant { "_mod" } else { "" });
            assert_shape(&launched(&emu), &name, &p, 2, &case.label());
        }
    }
}

/// A V head dim of its own (issue 27): every (Dqk, Dv) pair of tiled head dims with Dv != Dqk at one
/// Dqk per width (and the widths' neighbours) launches `fa_prefill_tile_policy`'s kernel: the wider dim's
/// width, or 160 where that is 128.
#[test]
fn prefill_launches_the_policy_kernel_for_v_head_dims_of_their_own() {
    let emu = Emulator::new();
    let dims = [32, 64, 96, 104, 128, 136, 160, 192, 200, 256];
    for (i, (d, dv)) in
        dims.iter().flat_map(|&d| dims.iter().map(move |&dv| (d, dv))).filter(|(d, dv)| d != dv).enumerate()
    {
        let (dtype, variant) = (DTYPES[i % 2], i % 3 == 0);
        let p = fused_attn::tile::prefill_tile_policy(d, dv, variant).unwrap();
        let w = tile_policy(KernelOp::Prefill, d.max(dv), variant, None).unwrap().width;
        assert_eq!(p.width, if w == 128 { 160 } else { w }, "{d}/{dv}");
        let mut case =
            PrefillCase { head_dim_v: Some(dv), ..PrefillCase::dense(dtype, d, false, p.block_m + 1, 8, (1, 1)) };
        (case.kernel, case.with_lse) = (PrefillKernel::Sm80, false);
        case.variants.softcap = variant.then_some(30.0);
        match dtype {
            DType::F16 => drop(run_emulated(&emu, &PrefillFixture::<f16>::new(&case, SEED).unwrap()).unwrap()),
            DType::Bf16 => drop(run_emulated(&emu, &PrefillFixture::<bf16>::new(&case, SEED).unwrap()).unwrap()),
        }
        let name = format!("fa_prefill_{}_d{}{}", dt(dtype), p.width, if variant { "_mod" } else { "" });
        assert_shape(&launched(&emu), &name, &p, 2, &case.label());
    }
}

#[test]
fn sm90_prefill_launches_the_policy_tile() {
    let emu = Emulator::new();
    for (dtype, d) in dtypes_and_head_dims(&HEAD_DIMS) {
        for masked in [false, true] {
            let mut case = PrefillCase::dense(dtype, d, masked, 1, 8, (1, 1));
            case.kernel = PrefillKernel::Sm90;
            let result = match dtype {
                DType::F16 => PrefillFixture::<f16>::new(&case, SEED).and_then(|f| run_emulated(&emu, &f).map(drop)),
                DType::Bf16 => PrefillFixture::<bf16>::new(&case, SEED).and_then(|f| run_emulated(&emu, &f).map(drop)),
            };
            let Some(p) = tile_policy(KernelOp::PrefillSm90, d, masked, None) else {
                assert!(result.is_err(), "D {d}: no sm_90a policy, but the call ran");
                continue;
            };
            result.unwrap();
            let wide = if p.block_n == 176 { "_bc176" } else { "" };
            let name = format!("fa_prefill_sm90_{}_d{}{wide}", dt(dtype), p.width);
            assert_shape(&launched(&emu), &name, &p, 1, &case.label());
        }
    }
    // A V head dim of its own (issue 27): 192 / 128 launches its kernel with fa_prefill_sm90_tile_policy's shape.
    for (dtype, masked) in [(DType::F16, false), (DType::Bf16, true)] {
        let p = fused_attn::tile::prefill_sm90_tile_policy(192, 128, masked).unwrap();
        let mut case = PrefillCase::dense(dtype, 192, masked, 1, 8, (1, 1));
        (case.kernel, case.head_dim_v) = (PrefillKernel::Sm90, Some(128));
        match dtype {
            DType::F16 => drop(run_emulated(&emu, &PrefillFixture::<f16>::new(&case, SEED).unwrap()).unwrap()),
            DType::Bf16 => drop(run_emulated(&emu, &PrefillFixture::<bf16>::new(&case, SEED).unwrap()).unwrap()),
        }
        let name = format!("fa_prefill_sm90_{}_d192_dv128", dt(dtype));
        assert_shape(&launched(&emu), &name, &p, 1, &case.label());
    }
}

/// The cache formats of the paged ops: 16-bit, and FP8 (head dims that are multiples of 16).
fn formats(d: usize) -> Vec<(KvFormat, Option<Fp8Format>)> {
    let mut f = vec![(KvFormat::Sixteen, None)];
    if d % 16 == 0 {
        f.push((KvFormat::Fp8 { format: Fp8Format::E4m3, scales: ScaleKind::PerHead }, Some(Fp8Format::E4m3)));
    }
    f
}

/// Every dtype, head dim (of the op's range), cache format (with its FP8 format) and variant flag of a paged op.
fn paged_configs(dims: &'static [usize]) -> impl Iterator<Item = (DType, usize, (KvFormat, Option<Fp8Format>), bool)> {
    dtypes_and_head_dims(dims).flat_map(|(dtype, d)| {
        formats(d).into_iter().flat_map(move |f| [false, true].map(|variant| (dtype, d, f, variant)))
    })
}

#[test]
fn paged_prefill_launches_the_policy_kernel_for_every_head_dim() {
    let emu = Emulator::new();
    for (dtype, d, (kv, fp8), variant) in
        paged_configs(&PAGED_PREFILL_HEAD_DIMS).filter(|&(_, d, _, _)| d <= PAGED_PREFILL_TILED_MAX_HEAD_DIM)
    {
        let p = tile_policy(KernelOp::PagedPrefill, d, variant, fp8).unwrap();
        // G = 2 and block_m / 2 + 1 new tokens: two row blocks of packed rows.
        let mut case = paged_case(d, (2, 1), 16, &[(p.block_m / 2 + 1, p.block_m / 2 + 9)]);
        (case.dtype, case.kv, case.num_splits) = (dtype, kv, Some(1));
        case.variants.softcap = variant.then_some(30.0);
        match dtype {
            DType::F16 => drop(run_paged::<f16>(&emu, &case, SEED).unwrap()),
            DType::Bf16 => drop(run_paged::<bf16>(&emu, &case, SEED).unwrap()),
        }
        let suffix = match (fp8, variant) {
            (Some(_), _) => "_fp8_mod", // the FP8 kernel serves every variant
            (None, true) => "_mod",
            (None, false) => "",
        };
        let name = format!("fa_paged_prefill_{}_d{}{suffix}", dt(dtype), p.width);
        assert_shape(&launched(&emu), &name, &p, 2, &case.label());
    }
}

#[test]
fn decode_launches_the_policy_kernel_for_every_head_dim() {
    let emu = Emulator::new();
    for (dtype, d, (kv, fp8), variant) in paged_configs(&DECODE_HEAD_DIMS) {
        let p = tile_policy(KernelOp::Decode, d, variant, fp8).unwrap();
        // block_m + 1 query heads of one KV head: two CTAs of query-head rows, wide (8 warps) where block_m is
        // more than a narrow CTA's rows (widths 64 and 128).
        let mut case = DecodeCase::new(dtype, d, (p.block_m + 1, 1), 16, &[40], Some(1));
        case.kv = kv;
        case.variants.softcap = variant.then_some(30.0);
        match dtype {
            DType::F16 => drop(run_decode::<f16>(&emu, &case, SEED).unwrap()),
            DType::Bf16 => drop(run_decode::<bf16>(&emu, &case, SEED).unwrap()),
        }
        let name = format!(
            "fa_paged_decode_{}_d{}{}{}",
            dt(dtype),
            p.width,
            if fp8.is_some() { "_fp8" } else { "" },
            if variant { "_mod" } else { "" }
        );
        assert_eq!(p.threads_for(p.block_m), if p.width <= 128 { 256 } else { 128 }, "{}", case.label());
        assert_shape_threads(&launched(&emu), &name, &p, p.threads_for(p.block_m), 2, &case.label());
    }
}

/// Decode's bytes in flight per SM (issue 30, item 3; the model beside fa/decode/traits.cuh's stages): after
/// each barrier a CTA has (stages - 1) K+V stages in flight, times the CTAs an SM holds (shared memory and the
/// register cap, per arch; narrow CTAs of 16 rows and, where the width has them, wide ones of its most rows).
/// For every width and cache format on sm_80/86/89/90 that covers the H200's bandwidth-delay product per SM
/// (4.8 TB/s x ~0.7 us / 132 SMs ~ 26 KB), FP8 keeps at least the 16-bit bytes in flight (twice the tokens)
/// at the same occupancy, and neither format's shared memory costs a CTA.
#[test]
fn decode_keeps_the_bandwidth_delay_product_in_flight() {
    use fused_attn::schedule::decode_ctas_per_sm;
    const BDP_PER_SM: usize = 26 * 1024;
    for d in [64, 128, 256, 512] {
        let policy = |fp8: Option<Fp8Format>| tile_policy(KernelOp::Decode, d, false, fp8).unwrap();
        for rows in [16, policy(None).block_m] {
            for cc in [(8, 0), (8, 6), (8, 9), (9, 0)] {
                let ctas = decode_ctas_per_sm(cc, d, rows);
                let in_flight = |fp8: Option<Fp8Format>| {
                    let p = policy(fp8);
                    let stage = 2 * p.block_n * d * if fp8.is_some() { 1 } else { 2 };
                    (p.stages - 1) * stage * ctas
                };
                let (b16, b8) = (in_flight(None), in_flight(Some(Fp8Format::E4m3)));
                let what = format!("D {d} rows {rows} sm_{}{}: {ctas} CTAs/SM, 16-bit {b16} B, FP8 {b8} B", cc.0, cc.1);
                assert!(b16 >= BDP_PER_SM && b8 >= BDP_PER_SM, "{what}");
                assert!(b8 >= b16, "{what}");
                // decode_ctas_per_sm reads the 16-bit policy: the FP8 kernels' shared memory fits as many.
                let fp8_ctas = fused_attn::schedule::ctas_per_sm_of(cc, &policy(Some(Fp8Format::E5m2)), rows);
                assert!(fp8_ctas >= ctas, "{what}: FP8 shared memory holds {fp8_ctas}");
            }
        }
    }
}

/// Past an op's own range (abi.h's FA_<OP>_MAX_HEAD_DIM: 512 for every op since issue 27) its launcher has no
/// kernel and no policy, and the op's own entry point refuses the call with an error naming its range
/// (decode's: tests/it/decode.rs); past the tiled kernels' 256 only those have no policy.
#[test]
fn ops_refuse_head_dims_past_their_own_range() {
    let emu = Emulator::new();
    assert_eq!(PREFILL_HEAD_DIMS, HEAD_DIMS);
    assert_eq!(PAGED_PREFILL_HEAD_DIMS, HEAD_DIMS);
    for d in HEAD_DIMS.into_iter().filter(|&d| d > PREFILL_TILED_MAX_HEAD_DIM) {
        assert_eq!(tile_policy(KernelOp::Prefill, d, false, None), None, "D {d}");
        assert_eq!(tile_policy(KernelOp::PagedPrefill, d, true, None), None, "D {d}");
        assert!(tile_policy(KernelOp::Decode, d, false, None).is_some(), "D {d}");
    }
    for d in [520, 1024] {
        for op in [KernelOp::Prefill, KernelOp::PagedPrefill, KernelOp::Decode] {
            assert_eq!(tile_policy(op, d, false, None), None, "{op:?} D {d}");
        }
    }
    let case = PrefillCase::dense(DType::Bf16, 520, false, 3, 8, (1, 1));
    let e = PrefillFixture::<bf16>::new(&case, SEED).and_then(|f| run_emulated(&emu, &f).map(drop)).unwrap_err();
    assert_eq!(*e.kind(), fused_attn::ErrorKind::Unsupported);
    assert!(e.message().contains("prefill supports multiples of 8 from 32 to 512"), "{}", e.message());
    let mut case = paged_case(520, (2, 1), 16, &[(3, 20)]);
    case.num_splits = Some(1);
    let e = run_paged::<bf16>(&emu, &case, SEED).map(drop).unwrap_err();
    assert_eq!(*e.kind(), fused_attn::ErrorKind::Unsupported);
    assert!(e.message().contains("paged prefill supports multiples of 8 from 32 to 512"), "{}", e.message());
    // RoPE on K inside dense prefill stops at the tiled kernel (issue 27; rotate K first above it).
    let mut case = PrefillCase::dense(DType::Bf16, 264, false, 3, 8, (1, 1));
    case.rope = Some(fused_attn::testkit::cases::decode::CaseRope {
        config: fused_attn::RopeConfig::new(1e4, 264, fused_attn::RopeStyle::Neox),
        explicit_positions: false,
    });
    case.rope_k = true;
    let e = PrefillFixture::<bf16>::new(&case, SEED).and_then(|f| run_emulated(&emu, &f).map(drop)).unwrap_err();
    assert_eq!(*e.kind(), fused_attn::ErrorKind::Unsupported, "{e}");
    assert!(e.message().contains("rotate K first"), "{}", e.message());
}
