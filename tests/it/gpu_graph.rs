//! "No hidden synchronisation or allocation on the launch path": a split-KV decode (decode + merge kernels)
//! and a prefill are captured into one CUDA graph on a new stream, in GLOBAL capture mode, where any
//! stream or context synchronisation (and any other capture-unsafe call) invalidates the capture. The
//! graph must then hold exactly the three kernels: no memset, memcpy, alloc/free or event node. Replays
//! are compared bit for bit with direct launches on the same inputs, also after q is rewritten in place
//! between replays (a replay reads the buffers' current contents, not a snapshot taken at capture), and after
//! seq_lens change within the plan's capacity (the workspace pins one decode plan, so the captured grid and
//! split geometry stay valid, as a decode loop replaying one graph per step needs).
//!
//! Its own test binary, with one test: it switches off cudarc's event tracking for its context (below),
//! and GLOBAL capture mode would also fail unrelated CUDA calls of tests running concurrently in-process.
use crate::common;

use cudarc::driver::sys::{self, CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaGraph, CudaSlice, CudaStream};
use fused_attn::prefill::{prefill, PrefillOptions};
use fused_attn::testkit::cases::decode::{run_case_gpu, DecodeCase, PagedFixture};
use fused_attn::testkit::cases::prefill::{CaseLayout, PrefillCase};
use fused_attn::testkit::cases::prefill::{Place, PrefillFixture, PrefillOutputs};
use fused_attn::{
    decode, DType, DecodeOptions, DecodeWorkspace, PagedKvCache, Result, Stream, TensorView, TensorViewMut,
};
use half::bf16;
use std::sync::Arc;

const SEED: u64 = 0x6a9f_0c4e;
const KERNEL_NODE: u32 = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_KERNEL as u32;

fn decode_case() -> DecodeCase {
    let seq_lens = vec![0, 1, 17, 300, 1000];
    DecodeCase::new(DType::Bf16, 128, (8, 2), 16, &seq_lens, Some(2))
}

fn prefill_case() -> PrefillCase {
    let (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim) = (1, 129, 129, 4, 2, 128);
    let (causal, varlen, layout, with_lse) = (true, None, CaseLayout::Contiguous, true);
    PrefillCase {
        batch,
        varlen,
        layout,
        with_lse,
        ..PrefillCase::dense(DType::Bf16, head_dim, causal, seqlen_q, seqlen_k, (heads_q, heads_kv))
    }
}

/// Device inputs of both ops (in the fixtures' layouts) and the decode workspace.
struct Inputs {
    cache: [CudaSlice<bf16>; 2],
    table: CudaSlice<i32>,
    lens: CudaSlice<i32>,
    dq: CudaSlice<bf16>,
    pbufs: Vec<CudaSlice<bf16>>,
    ws: DecodeWorkspace,
}

/// One set of outputs: decode o / lse, prefill o / lse buffers.
struct Outputs(CudaSlice<bf16>, CudaSlice<f32>, CudaSlice<bf16>, CudaSlice<f32>);

/// Outputs read back: typed, and as bits for exact comparison (NaN poison included).
struct Readback(Vec<bf16>, Vec<f32>, Vec<bf16>, Vec<f32>);

impl Readback {
    fn bits(&self) -> [Vec<u32>; 4] {
        let h = |v: &[bf16]| v.iter().map(|x| x.to_bits() as u32).collect();
        let f = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect();
        [h(&self.0), f(&self.1), h(&self.2), f(&self.3)]
    }
}

impl Outputs {
    fn new(cu: &Arc<CudaStream>, dec: &PagedFixture<bf16>, pre: &PrefillFixture<bf16>) -> Self {
        let rows = dec.case.batch() * dec.case.heads_q;
        let (o_len, lse_len) = (rows * dec.case.head_dim, rows);
        let z = |n| cu.alloc_zeros(n).unwrap();
        let mut o =
            Outputs(z(o_len), cu.alloc_zeros(lse_len).unwrap(), z(pre.o_len), cu.alloc_zeros(pre.lse_len).unwrap());
        o.poison(cu);
        o
    }
    fn poison(&mut self, cu: &Arc<CudaStream>) {
        cu.memcpy_htod(&vec![bf16::NAN; self.0.len()], &mut self.0).unwrap();
        cu.memcpy_htod(&vec![f32::NAN; self.1.len()], &mut self.1).unwrap();
        cu.memcpy_htod(&vec![bf16::NAN; self.2.len()], &mut self.2).unwrap();
        cu.memcpy_htod(&vec![f32::NAN; self.3.len()], &mut self.3).unwrap();
    }
    fn read(&self, cu: &Arc<CudaStream>) -> Readback {
        let r = Readback(
            cu.clone_dtoh(&self.0).unwrap(),
            cu.clone_dtoh(&self.1).unwrap(),
            cu.clone_dtoh(&self.2).unwrap(),
            cu.clone_dtoh(&self.3).unwrap(),
        );
        cu.synchronize().unwrap();
        r
    }
}

fn prefill_view<'a>(bufs: &'a [CudaSlice<bf16>], p: &Place) -> Result<TensorView<'a, bf16, 4>> {
    TensorView::gpu(bufs[p.buf].slice(p.offset..), p.shape)?.with_strides(p.strides)
}

/// Enqueues the decode then the prefill on `cu` into `out`; returns the decode's split count.
fn enqueue(
    cu: &Arc<CudaStream>,
    (dec, pre): (&PagedFixture<bf16>, &PrefillFixture<bf16>),
    inp: &mut Inputs,
    out: &mut Outputs,
) -> Result<usize> {
    let stream = Stream::Gpu(cu);
    let (c, (b, hq, d)) = (&dec.case, (dec.case.batch(), dec.case.heads_q, dec.case.head_dim));
    let cache = PagedKvCache::new(
        TensorView::gpu(inp.cache[0].as_view(), dec.cache_shape())?,
        TensorView::gpu(inp.cache[1].as_view(), dec.cache_shape())?,
        TensorView::gpu(inp.table.as_view(), [b, dec.width])?,
        TensorView::gpu(inp.lens.as_view(), [b])?,
        c.max_seq_len(),
    )?;
    let plan = decode(
        &stream,
        &TensorView::gpu(inp.dq.as_view(), [b, hq, d])?,
        &cache,
        &mut TensorViewMut::gpu(out.0.as_view_mut(), [b, hq, d])?,
        Some(&mut TensorViewMut::gpu(out.1.as_view_mut(), [b, hq])?),
        &mut inp.ws,
        &DecodeOptions { scale: None, num_splits: c.num_splits, ..Default::default() },
    )?;
    let p = &pre.case;
    let bufs = &inp.pbufs;
    prefill(
        &stream,
        &prefill_view(bufs, &pre.q)?,
        &prefill_view(bufs, &pre.k)?,
        &prefill_view(bufs, &pre.v)?,
        &mut TensorViewMut::gpu(out.2.slice_mut(pre.o.offset..), pre.o.shape)?.with_strides(pre.o.strides)?,
        Some(
            &mut TensorViewMut::gpu(out.3.as_view_mut(), [p.batch, p.heads_q, p.seqlen_q])?
                .with_strides(pre.lse_strides)?,
        ),
        &PrefillOptions { causal: p.causal, scale: None, ..Default::default() },
    )?;
    Ok(plan.num_splits())
}

/// The CUgraphNodeType of every node of `graph` (read as u32: no enum value is assumed).
fn node_types(graph: &CudaGraph) -> Vec<u32> {
    let mut n = 0usize;
    // SAFETY: the graph is alive (owned by `graph`); the first call only counts, the second fills `n` slots.
    unsafe { sys::cuGraphGetNodes(graph.cu_graph(), std::ptr::null_mut(), &mut n) }.result().unwrap();
    let mut nodes = vec![std::ptr::null_mut(); n];
    unsafe { sys::cuGraphGetNodes(graph.cu_graph(), nodes.as_mut_ptr(), &mut n) }.result().unwrap();
    let node_type = |node| {
        let mut t = u32::MAX;
        // SAFETY: `node` belongs to the live graph; CUgraphNodeType is a u32-sized C enum.
        unsafe { sys::cuGraphNodeGetType(node, (&mut t as *mut u32).cast()) }.result().unwrap();
        t
    };
    nodes.into_iter().map(node_type).collect()
}

fn assert_same(what: &str, want: &Readback, got: &Readback) {
    for (i, (w, g)) in want.bits().iter().zip(got.bits().iter()).enumerate() {
        let name = ["decode o", "decode lse", "prefill o", "prefill lse"][i];
        assert_eq!(w.len(), g.len(), "{what}: {name} length");
        if let Some(j) = (0..w.len()).find(|&j| w[j] != g[j]) {
            panic!("{what}: {name} element {j} differs from the direct launch ({:#x} vs {:#x})", g[j], w[j]);
        }
    }
}

#[test]
fn gpu_graph_capture_replays_decode_and_prefill() {
    let Some(ctx) = common::gpu_or_skip("gpu_graph::gpu_graph_capture_replays_decode_and_prefill") else { return };
    // With event tracking on, every use of a slice waits on / records cudarc events recorded outside the
    // capture, which capture refuses (cudarc's own graph test does the same). It applies to slices created
    // afterwards on this CudaContext object, so it comes first; ordering is ours: everything is on `cu`.
    unsafe { ctx.disable_event_tracking() };
    let cu = ctx.new_stream().unwrap();
    let (dec, pre) =
        (PagedFixture::<bf16>::new(&decode_case(), SEED).unwrap(), PrefillFixture::new(&prefill_case(), SEED).unwrap());
    let fx = (&dec, &pre);
    let probe = DecodeWorkspace::new(&Stream::Gpu(&cu), 0, 0).unwrap();
    let plan = probe
        .plan(&dec.case.problem(), &DecodeOptions { scale: None, num_splits: Some(2), ..Default::default() })
        .unwrap();
    let mut inp = Inputs {
        cache: [cu.clone_htod(&dec.k_cache).unwrap(), cu.clone_htod(&dec.v_cache).unwrap()],
        table: cu.clone_htod(&dec.block_table).unwrap(),
        lens: cu.clone_htod(&dec.seq_lens).unwrap(),
        dq: cu.clone_htod(&dec.q).unwrap(),
        pbufs: pre.bufs.iter().map(|b| cu.clone_htod(b).unwrap()).collect(),
        // Created BEFORE the capture: allocation is not capturable launch work (a plain cuMemAlloc is
        // refused under capture; a stream-ordered one would become a graph-owned alloc node), so the
        // workspace lives outside the graph and decode only uses the one it is given.
        ws: DecodeWorkspace::for_plan(&Stream::Gpu(&cu), &plan).unwrap(),
    };
    let (mut direct, mut graphed) = (Outputs::new(&cu, &dec, &pre), Outputs::new(&cu, &dec, &pre));

    // Direct launch first: the reference, and any one-time per-kernel setup (the dynamic shared memory
    // attribute, lazy module loading) happens before the capture.
    assert_eq!(enqueue(&cu, fx, &mut inp, &mut direct).unwrap(), 2, "the decode must split (decode + merge)");
    let first = direct.read(&cu);
    // The direct results are the library's own: the harness runs agree bitwise and pass the fp64 check.
    let judged = run_case_gpu::<bf16>(&cu, &decode_case(), SEED).unwrap();
    assert!(judged.outcome.passed(), "{}", judged.outcome.summary());
    assert_same("harness decode", &first, &Readback(judged.o, judged.lse, first.2.clone(), first.3.clone()));
    let outcome = pre.evaluate(&PrefillOutputs { o: first.2.clone(), lse: Some(first.3.clone()), launch_secs: 0.0 });
    let outcome = outcome.unwrap();
    assert!(outcome.passed(), "{}", outcome.summary());

    cu.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL).unwrap();
    let captured = enqueue(&cu, fx, &mut inp, &mut graphed);
    // Ended before anything is judged, so a failed launch leaves no stream capturing.
    let graph = cu.end_capture(CUgraphInstantiate_flags(0));
    assert_eq!(captured.expect("launching under capture"), 2);
    let graph = graph.expect("capture invalidated: the launch path synchronised or made a capture-unsafe call");
    let graph = graph.expect("nothing was captured");
    assert_eq!(node_types(&graph), [KERNEL_NODE; 3], "decode, merge and prefill kernels, nothing else");
    graph.upload().unwrap();
    for replay in 1..=2 {
        graphed.poison(&cu);
        graph.launch().unwrap();
        assert_same(&format!("replay {replay}"), &first, &graphed.read(&cu));
    }

    // New q for both ops, written in place into the captured buffers (prefill's q has a buffer of its own).
    assert!(pre.q.buf != pre.k.buf && pre.q.buf != pre.v.buf);
    cu.memcpy_htod(&PagedFixture::<bf16>::new(&decode_case(), SEED + 1).unwrap().q, &mut inp.dq).unwrap();
    let pre2 = PrefillFixture::<bf16>::new(&prefill_case(), SEED + 1).unwrap();
    cu.memcpy_htod(&pre2.bufs[pre.q.buf], &mut inp.pbufs[pre.q.buf]).unwrap();
    direct.poison(&cu);
    enqueue(&cu, fx, &mut inp, &mut direct).unwrap();
    let second = direct.read(&cu);
    let ([d1, _, p1, _], [d2, _, p2, _]) = (first.bits(), second.bits());
    assert!(d1 != d2 && p1 != p2, "the new q must change both outputs");
    graphed.poison(&cu);
    graph.launch().unwrap();
    assert_same("replay after rewriting q", &second, &graphed.read(&cu));

    // New seq_lens (within the plan's max_seq_len; every token still has data in its pages).
    let new_lens = vec![5, 0, 16, 299, 700];
    assert!(new_lens.iter().zip(&dec.seq_lens).all(|(n, o)| n <= o) && new_lens != dec.seq_lens);
    cu.memcpy_htod(&new_lens, &mut inp.lens).unwrap();
    direct.poison(&cu);
    enqueue(&cu, fx, &mut inp, &mut direct).unwrap();
    let third = direct.read(&cu);
    assert!(third.bits()[0] != second.bits()[0], "the new seq_lens must change the decode output");
    graphed.poison(&cu);
    graph.launch().unwrap();
    assert_same("replay after changing seq_lens", &third, &graphed.read(&cu));
}
