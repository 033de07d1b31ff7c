//! The caller's-stream contract on streams other than the default one. `ctx.new_stream()` streams are
//! CU_STREAM_NON_BLOCKING: they do not synchronise implicitly with the legacy default stream, so a launch
//! that escaped to stream 0 (or to any private stream) would really race with the caller's work.
//!
//! Each run parks its stream behind a gate (a host function that blocks the stream until the test opens
//! it) and enqueues behind it the copies that produce q and the NaN-poisoned outputs, then the op. The op
//! must return while the gate is still closed (else the launch path waited for the stream), and a kernel
//! that escaped the gated stream would run at once on the zero placeholders, its outputs then overwritten
//! by the poison: nothing but a launch ordered on the caller's stream can match, bit for bit, the same
//! case run by the library harness on `ctx.default_stream()` (which also judges it against fp64).
use crate::common;

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use cudarc::driver::{result, CudaSlice, CudaStream, DeviceRepr};
use fused_attn::prefill::{prefill, PrefillOptions};
use fused_attn::testkit::cases::decode::{run_case_gpu, DecodeCase, PagedFixture};
use fused_attn::testkit::cases::kv::GpuPaged;
use fused_attn::testkit::cases::prefill::PrefillCase;
use fused_attn::testkit::cases::prefill::{run_gpu, PrefillFixture, PrefillOutputs};
use fused_attn::{decode, DType, DecodeOptions, DecodeWorkspace, Stream, TensorView, TensorViewMut};
use half::bf16;

const SEED: u64 = 0x5eed_57e4;
/// How long a gate waits before giving up (so a launch path that synchronised fails instead of hanging).
const HOLD_LIMIT: Duration = Duration::from_secs(20);

struct Gate {
    open: Mutex<bool>,
    cv: Condvar,
    timed_out: AtomicBool,
}

/// A closed gate on a stream; dropping it opens the gate (also when an assertion fails first).
struct Held(Arc<Gate>);

unsafe extern "C" fn hold(arg: *mut c_void) {
    // Owns the reference `Held::close` leaked. No CUDA call (not allowed in a host function) and no panic
    // across the FFI boundary: a poisoned lock just lets the stream go.
    let gate = unsafe { Arc::from_raw(arg as *const Gate) };
    let timed_out = match gate.open.lock() {
        Ok(open) => gate.cv.wait_timeout_while(open, HOLD_LIMIT, |open| !*open).is_ok_and(|(_, w)| w.timed_out()),
        Err(_) => false,
    };
    gate.timed_out.store(timed_out, Ordering::SeqCst);
}

impl Held {
    fn close(cu: &CudaStream) -> Self {
        let gate = Arc::new(Gate { open: Mutex::new(false), cv: Condvar::new(), timed_out: AtomicBool::new(false) });
        let arg = Arc::into_raw(gate.clone()) as *mut c_void;
        cu.context().bind_to_thread().unwrap();
        // SAFETY: `hold` takes ownership of `arg` when it runs and makes no CUDA call; a failed enqueue
        // hands it back here.
        if let Err(e) = unsafe { result::stream::launch_host_function(cu.cu_stream(), hold, arg) } {
            drop(unsafe { Arc::from_raw(arg as *const Gate) });
            panic!("cuLaunchHostFunc: {e:?}");
        }
        Held(gate)
    }
    /// False once the gate gave up waiting: something on the host waited for the held stream.
    fn still_closed(&self) -> bool {
        !self.0.timed_out.load(Ordering::SeqCst)
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Ok(mut open) = self.0.open.lock() {
            *open = true;
        }
        self.0.cv.notify_all();
    }
}

/// Where concurrent runs wait for each other while held (a count of arrivals; it gives up after
/// [`HOLD_LIMIT`] rather than hang when the other run failed).
#[derive(Default)]
struct Latch(Mutex<usize>, Condvar);

impl Latch {
    fn arrive_and_wait(&self, n: usize) {
        let mut arrived = self.0.lock().unwrap();
        *arrived += 1;
        self.1.notify_all();
        drop(self.1.wait_timeout_while(arrived, HOLD_LIMIT, |a| *a < n).unwrap());
    }
}

/// `host` staged on the device, and a zeroed placeholder of its size that a copy behind the gate fills.
fn staged<T: DeviceRepr + cudarc::driver::ValidAsZeroBits>(cu: &Arc<CudaStream>, host: &[T]) -> [CudaSlice<T>; 2] {
    [cu.clone_htod(host).unwrap(), cu.alloc_zeros(host.len()).unwrap()]
}

fn assert_bits<T: Copy, U: PartialEq + std::fmt::Debug>(what: &str, a: &[T], b: &[T], bits: fn(T) -> U) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    if let Some(i) = (0..a.len()).find(|&i| bits(a[i]) != bits(b[i])) {
        panic!("{what}: element {i} differs ({:?} vs {:?})", bits(a[i]), bits(b[i]));
    }
}

/// Split-KV decode of `f` on `cu` (uploads, workspace, ops and readback all on `cu`), gated as above. With
/// `together`, every run waits there while held, so concurrent runs are released at the same moment.
fn decode_gated(cu: &Arc<CudaStream>, f: &PagedFixture<bf16>, together: Option<&Latch>) -> (Vec<bf16>, Vec<f32>) {
    let c = &f.case;
    let (b, hq, d) = (c.batch(), c.heads_q, c.head_dim);
    let stream = Stream::Gpu(cu);
    let opts = DecodeOptions { scale: None, num_splits: c.num_splits, ..Default::default() };
    let inputs = GpuPaged::<bf16, bf16>::upload(cu, &f.host()).unwrap();
    let [q_src, mut q] = staged(cu, &f.q);
    let [o_nan, mut o] = staged(cu, &vec![bf16::NAN; b * hq * d]);
    let [lse_nan, mut lse] = staged(cu, &vec![f32::NAN; b * hq]);
    let plan = DecodeWorkspace::new(&stream, 0, 0).unwrap().plan(&c.problem(), &opts).unwrap();
    let mut ws = DecodeWorkspace::for_plan(&stream, &plan).unwrap();
    cu.synchronize().unwrap();

    let gate = Held::close(cu);
    cu.memcpy_dtod(&q_src, &mut q).unwrap();
    cu.memcpy_dtod(&o_nan, &mut o).unwrap();
    cu.memcpy_dtod(&lse_nan, &mut lse).unwrap();
    let cache = inputs.cache(c.max_seq_len()).unwrap();
    let mut o_view = TensorViewMut::gpu(o.as_view_mut(), [b, hq, d]).unwrap();
    let mut lse_view = TensorViewMut::gpu(lse.as_view_mut(), [b, hq]).unwrap();
    let q_view = TensorView::gpu(q.as_view(), [b, hq, d]).unwrap();
    let used = decode(&stream, &q_view, &cache, &mut o_view, Some(&mut lse_view), &mut ws, &opts).unwrap();
    assert!(used.num_splits() > 1, "{}: not split ({used:?})", c.label());
    assert!(gate.still_closed(), "{}: decode returned only once its stream drained (it synchronised)", c.label());
    if let Some(latch) = together {
        latch.arrive_and_wait(2);
    }
    drop(gate);
    (cu.clone_dtoh(&o).unwrap(), cu.clone_dtoh(&lse).unwrap())
}

/// Prefill of a contiguous fixture on `cu`, gated as above; every input buffer is filled behind the gate.
fn prefill_gated(cu: &Arc<CudaStream>, f: &PrefillFixture<bf16>) -> PrefillOutputs<bf16> {
    let c = &f.case;
    assert!(c.varlen.is_none() && c.with_lse);
    let mut bufs: Vec<[CudaSlice<bf16>; 2]> = f.bufs.iter().map(|b| staged(cu, b)).collect();
    let [o_nan, mut o] = staged(cu, &vec![bf16::NAN; f.o_len]);
    let [lse_nan, mut lse] = staged(cu, &vec![f32::NAN; f.lse_len]);
    cu.synchronize().unwrap();

    let gate = Held::close(cu);
    for [src, dst] in &mut bufs {
        cu.memcpy_dtod(&*src, dst).unwrap();
    }
    cu.memcpy_dtod(&o_nan, &mut o).unwrap();
    cu.memcpy_dtod(&lse_nan, &mut lse).unwrap();
    let view = |p: &fused_attn::testkit::cases::prefill::Place| {
        TensorView::gpu(bufs[p.buf][1].slice(p.offset..), p.shape).unwrap().with_strides(p.strides).unwrap()
    };
    let mut o_view =
        TensorViewMut::gpu(o.slice_mut(f.o.offset..), f.o.shape).unwrap().with_strides(f.o.strides).unwrap();
    let mut lse_view = TensorViewMut::gpu(lse.as_view_mut(), [c.batch, c.heads_q, c.seqlen_q])
        .unwrap()
        .with_strides(f.lse_strides)
        .unwrap();
    let opts = PrefillOptions { causal: c.causal, scale: None, ..Default::default() };
    prefill(&Stream::Gpu(cu), &view(&f.q), &view(&f.k), &view(&f.v), &mut o_view, Some(&mut lse_view), &opts).unwrap();
    assert!(gate.still_closed(), "{}: prefill returned only once its stream drained (it synchronised)", c.label());
    drop(gate);
    PrefillOutputs { o: cu.clone_dtoh(&o).unwrap(), lse: Some(cu.clone_dtoh(&lse).unwrap()), launch_secs: 0.0 }
}

fn decode_case(heads: (usize, usize), seq_lens: Vec<usize>, splits: usize) -> DecodeCase {
    let (heads_q, heads_kv) = heads;
    DecodeCase::new(DType::Bf16, 128, (heads_q, heads_kv), 16, &seq_lens, Some(splits))
}

/// (a) Causal GQA bf16 D=128 prefill on a new stream: correct, and bitwise the default stream's result.
#[test]
fn gpu_streams_prefill_on_new_stream() {
    let Some(ctx) = common::gpu_or_skip("gpu_streams::gpu_streams_prefill_on_new_stream") else { return };
    let case = PrefillCase { batch: 2, ..PrefillCase::dense(DType::Bf16, 128, true, 129, 200, (8, 2)) };
    let f = PrefillFixture::<bf16>::new(&case, SEED).unwrap();
    let on_default = run_gpu(&ctx.default_stream(), &f).unwrap();
    let on_new = prefill_gated(&ctx.new_stream().unwrap(), &f);
    let outcome = f.evaluate(&on_new).unwrap();
    assert!(outcome.passed(), "{}: {}", case.label(), outcome.summary());
    assert_bits("prefill o", &on_new.o, &on_default.o, bf16::to_bits);
    assert_bits("prefill lse", on_new.lse.as_deref().unwrap(), on_default.lse.as_deref().unwrap(), f32::to_bits);
}

/// (b) Split-KV decode (decode + merge kernels, 2 splits) on a new stream: bitwise the default stream's
/// result, which the harness judged against fp64.
#[test]
fn gpu_streams_split_decode_on_new_stream() {
    let Some(ctx) = common::gpu_or_skip("gpu_streams::gpu_streams_split_decode_on_new_stream") else { return };
    let case = decode_case((8, 2), vec![0, 1, 17, 300, 1000], 2);
    let reference = run_case_gpu::<bf16>(&ctx.default_stream(), &case, SEED).unwrap();
    assert!(reference.outcome.passed(), "{}: {}", case.label(), reference.outcome.summary());
    let (o, lse) = decode_gated(&ctx.new_stream().unwrap(), &reference.fixture, None);
    assert_bits("decode o", &o, &reference.o, bf16::to_bits);
    assert_bits("decode lse", &lse, &reference.lse, f32::to_bits);
}

/// (c) Two independent split decodes on two new streams, from two threads, each with its own workspace,
/// both held until both are enqueued and then released together: both match their default-stream runs.
#[test]
fn gpu_streams_concurrent_decodes_on_two_streams() {
    let Some(ctx) = common::gpu_or_skip("gpu_streams::gpu_streams_concurrent_decodes_on_two_streams") else { return };
    let cases = [decode_case((8, 2), vec![0, 17, 1000, 4097], 2), decode_case((16, 2), vec![5, 700, 64], 3)];
    let refs: Vec<_> = cases
        .iter()
        .enumerate()
        .map(|(i, c)| run_case_gpu::<bf16>(&ctx.default_stream(), c, SEED + i as u64).unwrap())
        .collect();
    let streams = [ctx.new_stream().unwrap(), ctx.new_stream().unwrap()];
    let together = Latch::default();
    let results: Vec<_> = std::thread::scope(|s| {
        let runs: Vec<_> = (0..2)
            .map(|i| {
                let (cu, f, together) = (&streams[i], &refs[i].fixture, &together);
                s.spawn(move || decode_gated(cu, f, Some(together)))
            })
            .collect();
        runs.into_iter().map(|r| r.join().unwrap()).collect()
    });
    for ((r, (o, lse)), c) in refs.iter().zip(&results).zip(&cases) {
        assert!(r.outcome.passed(), "{}: {}", c.label(), r.outcome.summary());
        assert_bits(&format!("{} o", c.label()), o, &r.o, bf16::to_bits);
        assert_bits(&format!("{} lse", c.label()), lse, &r.lse, f32::to_bits);
    }
}
