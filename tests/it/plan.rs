//! The split-KV plan through the public API: what the emulator backend plans for the performance
//! shapes, forced splits, and workspace sizing (too small is a typed error, never an allocation).
use fused_attn::decode::{DecodeOptions, DecodeWorkspace, EMULATOR_SM_COUNT};
use fused_attn::plan::{DecodePlan, DecodeProblem, SPLIT_GRANULE};
use fused_attn::testkit::cases::decode::perf_cases;
use fused_attn::{Emulator, Stream};

#[test]
fn perf_shapes_plan_as_intended() {
    let emu = Emulator::new();
    let stream = Stream::Emu(&emu);
    let ws = DecodeWorkspace::new(&stream, 0, 0).unwrap();
    assert_eq!(ws.sm_count(), EMULATOR_SM_COUNT);
    let cases = perf_cases();
    // B = 64 x 8 KV heads fills the GPU: no split.
    let big = ws.plan(&cases[0].problem(), &DecodeOptions::default()).unwrap();
    assert_eq!(big.num_splits(), 1);
    assert_eq!(big.grid(), [1, 8, 64]);
    // B = 1 at 32k: split so that ~2 CTAs per SM are busy, chunks a multiple of the granule.
    let long = ws.plan(&cases[1].problem(), &DecodeOptions::default()).unwrap();
    assert!(long.num_splits() * 8 >= EMULATOR_SM_COUNT, "{long:?}");
    assert!(long.num_splits() * 8 <= 2 * EMULATOR_SM_COUNT, "{long:?}");
    assert_eq!(long.split_tokens() % SPLIT_GRANULE, 0);
}

#[test]
fn forced_and_planned_splits_size_the_workspace() {
    let emu = Emulator::new();
    let stream = Stream::Emu(&emu);
    let problem = DecodeProblem { batch: 3, heads_q: 16, heads_kv: 4, head_dim: 128, max_seq_len: 5000 };
    let forced = DecodePlan::new(&problem, EMULATOR_SM_COUNT, Some(7)).unwrap();
    assert_eq!((forced.num_splits(), forced.split_tokens()), (7, 768));
    assert_eq!(forced.partial_o_len(), 7 * 3 * 16 * 128);
    assert_eq!(forced.partial_lse_len(), 7 * 3 * 16);
    let ws = DecodeWorkspace::with_capacity(&stream, 3, 16, 128, 7).unwrap();
    assert_eq!(
        ws.plan(&problem, &DecodeOptions { scale: None, num_splits: Some(7), ..Default::default() }).unwrap(),
        forced
    );
    let planned = ws.plan(&problem, &DecodeOptions::default()).unwrap();
    assert!(planned.num_splits() > 1 && planned.num_splits() <= 5000 / 256, "{planned:?}");
}
