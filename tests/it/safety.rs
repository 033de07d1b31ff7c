//! Issue 46, "safe means safe": what a safe call (or a CUDA graph replay of one) can make a kernel touch, on
//! the emulator, whose region checks fault on any access outside the buffers a launch was given
//! (docs/emulator.md). The compile-time findings (sealed element traits, plans the crate made) are
//! `compile_fail` doctests on the items themselves (src/dtype.rs, src/merge.rs, src/plan.rs).
use fused_attn::decode::{replay_scheduled, DecodeOptions, DecodeWorkspace};
use fused_attn::plan::{DecodePlan, DecodeProblem};
use fused_attn::testkit::cases::decode::{evaluate, DecodeCase, PagedFixture};
use fused_attn::{DType, Emulator, SplitPolicy, Stream, TensorViewMut};
use half::bf16;

/// A CUDA graph captured from a scheduled decode of B0 = 2 sequences and replayed after `prepare` for 4
/// (within the workspace's limit of 16, so `prepare` accepts it): the table then names merge rows 2 and 3 and units of
/// sequences 2 and 3, which the launch (the captured one: o has 2 rows) has no output for. The kernels skip
/// them; the launch writes o's 2 rows only, each its own sequence's attention over its device seq_len (the
/// units of sequences 0 and 1 are the new schedule's, which covers each sequence whole). Before the merge
/// bounded its rows (merge.cu: out_rows), the emulator faulted on the store of row 2 past o.
#[test]
fn graph_replay_after_prepare_for_more_rows_writes_only_its_output() {
    let seed = 0x46_0003;
    let (hq, hkv, d) = (8, 2, 64);
    let case = DecodeCase::new(DType::Bf16, d, (hq, hkv), 16, &[600, 1000], None);
    let f = PagedFixture::<bf16>::new(&case, seed).unwrap();
    let emu = Emulator::new();
    let stream = Stream::Emu(&emu);
    let limits = DecodeProblem { batch: 16, heads_q: hq, heads_kv: hkv, head_dim: d, max_seq_len: 1024 };
    // 64 CTA slots for 4 x 2 (sequence, KV head) pairs: each of the 4 sequences is cut into several units, so the merge has a row per sequence.
    let mut ws = DecodeWorkspace::scheduled_on(&stream, &limits, SplitPolicy::Balanced, 64).unwrap();
    let opts = DecodeOptions::default();
    let schedule = ws.prepare(&stream, &[1000; 4], &opts).unwrap().clone();
    assert!(
        schedule.merge_rows.iter().any(|r| r.out_row >= 2),
        "the table must name rows past the output: {:?}",
        schedule.merge_rows
    );

    // o and lse: the captured call's 2 rows at the front of 16 rows of NaN; the views hold the 2 rows only.
    let (rows, captured) = (16, case.batch());
    let mut o_buf = vec![bf16::NAN; rows * hq * d];
    let mut lse_buf = vec![f32::NAN; rows * hq];
    let cache = f.host_cache().unwrap();
    let q = fused_attn::TensorView::host(&f.q, [captured, hq, d]).unwrap();
    {
        let mut o = TensorViewMut::host(&mut o_buf[..captured * hq * d], [captured, hq, d]).unwrap();
        let mut lse = TensorViewMut::host(&mut lse_buf[..captured * hq], [captured, hq]).unwrap();
        let r = replay_scheduled(&stream, &q, &cache, &mut o, Some(&mut lse), &mut ws, &opts);
        assert!(r.is_ok(), "the replay touched memory outside its buffers: {:?}", r.err());
    }
    assert!(o_buf[captured * hq * d..].iter().all(|x| x.is_nan()), "rows past the output were written");
    assert!(lse_buf[captured * hq..].iter().all(|x| x.is_nan()), "LSE rows past the output were written");
    let plan = DecodePlan::new(&case.problem(), 132, None).unwrap();
    let outcome = evaluate(&f, seed, plan, &o_buf[..captured * hq * d], &lse_buf[..captured * hq]).unwrap();
    assert!(outcome.passed(), "rows 0..2 against the reference: {}", outcome.summary());
}
