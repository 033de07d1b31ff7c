//! The emulator's Hopper (sm_90a) machinery against scalar models written from the PTX ISA: wgmma fragment
//! layouts and shared-memory descriptors (every swizzle, K- and MN-major, SS and RS, N from 16 to 256), TMA
//! boxes (ranks 1-5, out-of-bounds fill, swizzles, stores), every Hopper misuse check as a planted bug next
//! to its correct twin, and a warp-specialised TMA + mbarrier + wgmma GEMM against fp64.
//! tests/it/gpu_vs_emulator.rs runs the same kernels on a GPU and compares bit for bit.

use fused_attn::tensor_map::{TensorMapSpec, TmaSwizzle};
use fused_attn::testkit::emu_selftest::{self as st, Sm90Bug, WsGemmBug};
use fused_attn::{DType, Element, ErrorKind};
use half::{bf16, f16};
use rand::Rng;

use crate::common::hopper_model as model;

use model::*;

const SEED: u64 = 0x4e0_9e4a;

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

/// Every layout pair of A and B (K/MN-major x no/32/64/128-byte swizzle), SS and RS, f16 and bf16: the
/// emulator's D equals the scalar model's bit for bit. N = 64 for all of them; N in {16, 128, 176, 256}
/// with a rotating subset of layouts.
#[test]
fn wgmma_matches_the_ptx_model_for_every_layout() {
    let mut rng = fused_attn::testkit::seed::rng(fused_attn::testkit::seed::base_seed() ^ SEED);
    let mut cases = 0;
    for WgmmaSweepCase { dtype, n, a_sw, b_sw, rs, accumulate } in wgmma_sweep() {
        let s = wgmma_setup(&mut rng, dtype, n, a_sw, b_sw, rs, true);
        let got = st::wgmma(&s.case(dtype, n, accumulate), SEED ^ cases).unwrap_or_else(|e| {
            panic!("{dtype:?} n={n} A {a_sw:?} B {b_sw:?} rs={rs}: {e}");
        });
        let want = s.reference(dtype, n, accumulate);
        assert_eq!(bits(&got), bits(&want), "{dtype:?} n={n} A {a_sw:?} B {b_sw:?} rs={rs}");
        cases += 1;
    }
    assert!(cases >= 150, "{cases} cases");
}

/// Non-exact data: the emulator adds the 16 products of each k step in k order, rounding each time.
#[test]
fn wgmma_accumulates_in_k_order() {
    let mut rng = fused_attn::testkit::seed::rng(fused_attn::testkit::seed::base_seed() ^ SEED ^ 1);
    for dtype in [DType::F16, DType::Bf16] {
        let s = wgmma_setup(&mut rng, dtype, 64, (false, 128), (true, 64), false, false);
        let got = st::wgmma(&s.case(dtype, 64, true), SEED).unwrap();
        assert_eq!(bits(&got), bits(&s.reference(dtype, 64, true)), "{dtype:?}");
    }
}

/// A descriptor whose swizzled tile does not start at its pattern boundary, or lies outside shared memory,
/// is reported with the descriptor's addresses.
#[test]
fn wgmma_descriptor_errors_are_reported() {
    let mut rng = fused_attn::testkit::seed::rng(fused_attn::testkit::seed::base_seed() ^ SEED ^ 2);
    let s = wgmma_setup(&mut rng, DType::F16, 64, (false, 128), (false, 128), false, true);
    let mut case = s.case(DType::F16, 64, false);
    case.desc_b += 128 >> 4; // one 128-byte row into the 1024-byte pattern
    let e = st::wgmma(&case, SEED).unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Emulator, "{e}");
    assert!(
        e.message().contains("B descriptor starts at shared window address") && e.message().contains("1024"),
        "{e}"
    );
    let mut case = s.case(DType::F16, 64, false);
    case.desc_b |= 2u64 << 49; // base offset
    assert!(st::wgmma(&case, SEED).unwrap_err().message().contains("base offset 2"));
    let mut case = s.case(DType::F16, 64, false);
    case.desc_b += (196 * 1024) >> 4; // past the end of shared memory, on a pattern boundary
    let e = st::wgmma(&case, SEED).unwrap_err();
    assert!(
        e.message().contains("B operand's element (0, 0) lies at shared window address")
            && e.message().contains("outside the block's"),
        "{e}"
    );
}

/// TMA loads of ranks 1-5, boxes partly or wholly out of bounds, every swizzle: the shared image equals the
/// model's, and the mbarrier completes on the whole box's bytes (out-of-bounds elements included).
#[test]
fn tma_loads_match_the_model() {
    let mut rng = fused_attn::testkit::seed::rng(fused_attn::testkit::seed::base_seed() ^ SEED ^ 3);
    for (s, coords) in tma_cases() {
        let tensor = tensor_bytes(&mut rng, tensor_len(&s));
        let got = st::tma_load(&s, &tensor, &coords, s.box_bytes() as u32, SEED).unwrap();
        let want =
            tma_box_image(&tensor, s.elem_bytes as usize, &s.dims, &s.strides, &s.box_dims, &coords, s.swizzle.bytes());
        assert_eq!(got, want, "{s:?} at {coords:?}");
        assert_eq!(st::last_counters().unwrap().total().tma_load_bytes, s.box_bytes());
    }
}

/// TMA stores write exactly the in-bounds elements of the box.
#[test]
fn tma_stores_match_the_model() {
    let mut rng = fused_attn::testkit::seed::rng(fused_attn::testkit::seed::base_seed() ^ SEED ^ 4);
    for (s, coords) in tma_cases() {
        let before = tensor_bytes(&mut rng, tensor_len(&s));
        let image = tensor_bytes(&mut rng, s.box_bytes() as usize);
        let mut tensor = before.clone();
        st::tma_store(&s, &mut tensor, &coords, &image, SEED).unwrap();
        // Model: box element L (row-major over the box) goes to its tensor element when in bounds; its bytes
        // are at the swizzled offset L·e of the image.
        let mut want = before.clone();
        let e = s.elem_bytes as usize;
        let total: usize = s.box_dims.iter().map(|&b| b as usize).product();
        for linear in 0..total {
            let (mut rem, mut dst, mut inside) = (linear, 0usize, true);
            for (d, (&c, &b)) in coords.iter().zip(&s.box_dims).enumerate() {
                let g = c as i64 + (rem % b as usize) as i64;
                rem /= b as usize;
                inside &= g >= 0 && g < s.dims[d] as i64;
                dst += g.max(0) as usize * if d == 0 { e } else { s.strides[d - 1] as usize };
            }
            if inside {
                let (o, sw) = (linear * e, s.swizzle.bytes() as usize);
                let o = if sw == 0 { o } else { o ^ (((o >> 7) & (sw / 16 - 1)) << 4) };
                want[dst..dst + e].copy_from_slice(&image[o..o + e]);
            }
        }
        assert_eq!(tensor, want, "{s:?} at {coords:?}");
    }
}

/// Each Hopper check: the planted bug is reported (kind Emulator, a message naming the kernel, block,
/// thread and what is involved) and its correct twin passes on several scheduling seeds.
#[test]
fn every_hopper_check_catches_its_planted_bug_and_passes_its_twin() {
    let mut rng = fused_attn::testkit::seed::rng(fused_attn::testkit::seed::base_seed() ^ SEED ^ 5);
    let input: Vec<u16> = exact_values(&mut rng, DType::F16, st::SM90_BUG_INPUT);
    for bug in Sm90Bug::ALL {
        for seed in [SEED, SEED ^ 0x77, 3] {
            let mut data = input.clone();
            st::sm90_bug(bug, false, &mut data, seed)
                .unwrap_or_else(|e| panic!("correct twin of {bug:?} (seed {seed:#x}): {e}"));
        }
        let mut data = input.clone();
        let e = st::sm90_bug(bug, true, &mut data, SEED).expect_err(&format!("{bug:?} was not reported"));
        let m = e.message().to_string();
        assert_eq!(e.kind(), &ErrorKind::Emulator, "{bug:?}: {e}");
        let kernel = if matches!(bug, Sm90Bug::SetmaxnregExhausted | Sm90Bug::SetmaxnregMisuse) {
            "kernel fa_bug_sm90_setmaxnreg block (0,0,0) thread "
        } else {
            "kernel fa_bug_sm90 block (0,0,0) thread "
        };
        assert!(m.contains(kernel), "{bug:?}: {m}");
        let expect: &[&str] = match bug {
            Sm90Bug::AccReadInFlight => &["accesses accumulator registers", "group 0 of warpgroup 0", "in flight"],
            Sm90Bug::AWriteInFlight => &["accesses A-fragment registers", "in flight"],
            Sm90Bug::SmemWriteInFlight => {
                &["writes shared memory", "wgmma.mma_async.m64n64k16 of group 0 of warpgroup 0", "still reads it"]
            }
            Sm90Bug::NoWgmmaFence => &["without a wgmma_fence"],
            Sm90Bug::UncommittedAtExit => &["exits with 4 wgmma.mma_async", "4 never committed"],
            Sm90Bug::UnwaitedAtExit => &["exits with 4 wgmma.mma_async", "4 committed and never waited for"],
            Sm90Bug::MbarrierDoubleInit => &["initialised a second time", "shared+24576", "did it first"],
            Sm90Bug::MbarrierUnorderedInit => &["shared+24576", "initialis"],
            Sm90Bug::MbarrierPlainAccess => &["shared load of 4 bytes", "mbarrier object at shared+24576"],
            Sm90Bug::ExpectTxTooFew => {
                &["completed phase 0", "8192 bytes declared by expect_tx", "TMA load of 8192 bytes to shared+8192"]
            }
            Sm90Bug::ExpectTxTooMany => &[
                "deadlock",
                "mbarrier_wait(shared+24576, parity 0) for phase 0",
                "8192 transaction bytes outstanding (expect_tx declared 16384, TMA loads landed 8192)",
            ],
            Sm90Bug::WaiterBehind => &[
                "mbarrier at shared+24576 with parity 0, which now means phase 2",
                "last phase it observed there was -1",
            ],
            Sm90Bug::TmaReadBeforeWait => &["TMA load", "shared+"],
            // The refill races with the read, or leaves the other waiters two phases behind.
            Sm90Bug::TmaIntoBusyStage => &["missing empty-barrier wait?"],
            Sm90Bug::ExitWithTmaInFlight => {
                &["exits with a TMA load in flight", "8192 bytes to shared+0", "mbarrier at shared+24576"]
            }
            Sm90Bug::MissingProxyFence => &["wgmma.mma_async operand read", "ordinary stores", "fence_proxy_async"],
            Sm90Bug::TmaStoreNoFence => &["TMA store (cp.async.bulk.tensor) source read", "fence_proxy_async"],
            Sm90Bug::TmaStoreSrcOverwrite => {
                &["writes shared memory at", "the TMA store of thread 0 (bulk group 0) still reads it"]
            }
            Sm90Bug::SetmaxnregExhausted => &[
                "deadlock",
                "setmaxnreg.inc 232 for 8192 more registers",
                "pool of 64512 (168 per thread at launch x 384 threads)",
            ],
            Sm90Bug::SetmaxnregMisuse => &["setmaxnreg.inc 160 in warpgroup 1, which holds 168 registers per thread"],
            Sm90Bug::SmemAlignmentAssumed => {
                &["TMA load destination at shared window address", "not 1024-byte aligned"]
            }
            Sm90Bug::BarArriveOrder => &["data race", "warp 0", "warp 1"],
            Sm90Bug::MbarrierInitNoFence => {
                &["TMA load completing on the mbarrier at shared+24576", "was never fenced", "fence_mbarrier_init"]
            }
            // Thread 0 (warp 0) refills the rows warps 1-3 wrote before the wait: only a barrier orders them.
            Sm90Bug::WaitGroupNotABarrier => &["data race", "warp 0's TMA load writes bytes that warp", "also wrote"],
        };
        for needle in expect {
            assert!(m.contains(needle), "{bug:?}: no {needle:?} in: {m}");
        }
    }
}

fn ws_case<T: Element>(m: usize, n: usize, k: usize, b_mn_major: bool, seed: u64) {
    let mut rng = fused_attn::testkit::seed::rng(fused_attn::testkit::seed::base_seed() ^ seed);
    let a: Vec<T> = (0..m * k).map(|_| T::from_f64(rng.random_range(-1.0..1.0))).collect();
    let b: Vec<T> = (0..n * k).map(|_| T::from_f64(rng.random_range(-1.0..1.0))).collect();
    let c = st::ws_gemm(&a, &b, (m, n, k), b_mn_major, WsGemmBug::None, seed).unwrap();
    let bv = |kk: usize, j: usize| if b_mn_major { b[kk * n + j] } else { b[j * k + kk] }.to_f64();
    for i in 0..m {
        for j in 0..n {
            let (mut exact, mut magnitude) = (0f64, 0f64);
            for kk in 0..k {
                let p = a[i * k + kk].to_f64() * bv(kk, j);
                exact += p;
                magnitude += p.abs();
            }
            let got = c[i * n + j] as f64;
            let bound = k as f64 * 2f64.powi(-24) * magnitude + 1e-30;
            assert!(
                (got - exact).abs() <= bound,
                "c[{i}][{j}] = {got}, fp64 {exact} (bound {bound:e}); {m}x{n}x{k} mn={b_mn_major}"
            );
        }
    }
    let counters = st::last_counters().unwrap().total();
    let (blocks, k_tiles) = (m.div_ceil(128) * n.div_ceil(128), k.div_ceil(64));
    assert_eq!(counters.wgmma as usize, blocks * k_tiles * 2 * 4, "2 consumer warpgroups x 4 k16 steps per k tile");
    assert_eq!(counters.tma_load_bytes as usize, blocks * k_tiles * 32768, "A and B tiles of 16 KiB per k tile");
}

/// The warp-specialised GEMM (producer warpgroup: setmaxnreg.dec, TMA into a 4-stage ring of full/empty
/// mbarriers; two consumer warpgroups: setmaxnreg.inc, wgmma SS, stage release) against fp64, with every
/// misuse check active, for K- and MN-major B, f16 and bf16, ragged edges (TMA zero fill).
#[test]
fn warp_specialised_gemm_matches_fp64() {
    ws_case::<f16>(256, 128, 320, false, SEED);
    ws_case::<bf16>(200, 136, 200, true, SEED ^ 9);
    ws_case::<f16>(72, 256, 96, true, SEED ^ 10);
}

/// The GEMM's planted pipeline bugs are reported.
#[test]
fn warp_specialised_gemm_pipeline_bugs_are_reported() {
    let (m, n, k) = (128, 128, 512);
    let a = vec![f16::from_f32(0.5); m * k];
    let b = vec![f16::from_f32(0.25); n * k];
    for (bug, needles) in [
        (WsGemmBug::NoEmptyWait, &["TMA load"][..]),
        // Reported as the refill racing with the wgmma's reads, or as a write to bytes the wgmma still reads.
        (WsGemmBug::EarlyRelease, &["TMA load writes"][..]),
        (WsGemmBug::ShortTx, &["expect_tx declared fewer bytes than the copies bring"][..]),
    ] {
        for seed in [SEED, 11, 12] {
            let e = st::ws_gemm(&a, &b, (m, n, k), false, bug, seed).expect_err(&format!("{bug:?} not reported"));
            assert_eq!(e.kind(), &ErrorKind::Emulator, "{bug:?}: {e}");
            assert!(e.message().contains("kernel fa_selftest_ws_gemm_f16 block (0,0,0) thread "), "{bug:?}: {e}");
            for needle in needles {
                assert!(e.message().contains(needle), "{bug:?} (seed {seed}): no {needle:?} in {e}");
            }
        }
    }
}

/// Tensor maps the kernels cannot use are typed errors before any launch.
#[test]
fn invalid_tensor_maps_are_refused_before_launch() {
    let tensor = vec![0u8; 4096];
    let bad = TensorMapSpec {
        elem_bytes: 2,
        dims: vec![64, 16],
        strides: vec![100],
        box_dims: vec![64, 16],
        swizzle: TmaSwizzle::B128,
    };
    let e = st::tma_load(&bad, &tensor, &[0, 0], 2048, SEED).unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Alignment, "{e}");
    assert!(st::last_counters().is_none(), "nothing may have launched");
}
