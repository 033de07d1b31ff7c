//! FP8 dequantisation scales given as tensors the caller owns (issue 30, item 6): `with_scale_tensors` on
//! decode, paged prefill and append. On the emulator host slices stand for the engine's device memory; the
//! GPU paths (cudarc views, raw pointers on a raw stream) are compared with the host-float path by the GPU
//! test at the end, skipped visibly without a GPU.
//!  - Every KV head's own scale at the head counts engines use, Hkv 1, 2, 4, 8, 16 (Hq = 2·Hkv; 8 is
//!    Llama-70B's): K and V scales distinct per head by ≥ 2^(1/4) and permuted; decode and paged prefill against
//!    the fp64 reference over the same cache, and the same outputs judged with every head given its
//!    neighbour's (h ^ 1) scales must fail; append's codes bit for bit the model's with each head's own
//!    scale. The planted mutants scripts/mutants/fp8-scale-of-neighbour-head.patch (decode, paged prefill)
//!    and append-fp8-scale-of-neighbour-head.patch are caught here. At Hkv 1 there is no other head: the
//!    single scale is checked.
//!  - Scale tensors give bit for bit what `KvScales` (host floats) gives for the same values.
//!  - The kernels read the values when they run: values rewritten in place at the same address between two
//!    launches are the ones the second launch uses (what replaying a captured CUDA graph relies on).
//!  - Values the host cannot check (0, < 0, NaN, ±Inf, subnormal, huge): every launch completes inside its
//!    memory (the emulator's bounds checks), and nothing outside the bad KV head's rows changes.
//!  - Bad scale tensors are typed errors.
use crate::common;

use fused_attn::fp8::Fp8Element;
use fused_attn::paged_prefill::PagedPrefillWorkspace;
use fused_attn::reference::{check_decode, check_paged_prefill, Check};
use fused_attn::testkit::cases::kv::quantize;
use fused_attn::testkit::seed::{rng, FixtureRng};
use fused_attn::{
    append, decode, paged_prefill, DecodeOptions, DecodeWorkspace, Emulator, ErrorKind, Fp8E4m3, Fp8E5m2, Fp8Format,
    KvCacheOf, KvScales, PagedKvCache, PagedKvCacheMut, PagedPrefillOptions, Stream, TensorView, TensorViewMut,
};
use half::bf16;
use rand::seq::SliceRandom;
use rand::Rng;

/// The KV head counts engines use (MQA's 1 .. 16).
const HEADS_KV: [usize; 5] = [1, 2, 4, 8, 16];
/// Query heads per KV head.
const GROUP: usize = 2;
const D: usize = 64;
const PAGE: usize = 16;
/// Cached tokens per sequence (new tokens included).
const LENS: [usize; 2] = [150, 61];
/// Paged prefill's new tokens per sequence (the last of its `LENS`).
const Q_LENS: [usize; 2] = [7, 3];
/// Append: tokens written into a fresh cache.
const NEW_TOKENS: usize = 40;
/// The code a fresh cache holds everywhere (append must change exactly the slots it is given).
const FILLER: u8 = 0x5a;

/// A paged FP8 cache of random codes over `LENS`, its per-head scales, q for decode and paged prefill.
struct Setup {
    format: Fp8Format,
    hkv: usize,
    kc: Vec<u8>,
    vc: Vec<u8>,
    table: Vec<i32>,
    seq_lens: Vec<i32>,
    width: usize,
    /// Per KV head, distinct by ≥ 2^(1/4): K 2^(π(h)/4 − 4), V 2^(π(h)/4 − 2), π a random permutation (a
    /// wider spread at 16 heads makes the softmax needlessly sharp).
    k_scale: Vec<f32>,
    v_scale: Vec<f32>,
    q_decode: Vec<bf16>,
    q_prefill: Vec<bf16>,
    cu_seqlens_q: Vec<i32>,
    /// New K / V rows for append, `[NEW_TOKENS, Hkv, D]`, and their slots (distinct, shuffled).
    new_k: Vec<bf16>,
    new_v: Vec<bf16>,
    slots: Vec<i64>,
    seed: u64,
}

impl Setup {
    fn new(hkv: usize, format: Fp8Format, seed: u64) -> Self {
        let mut rng = rng(seed);
        let width = LENS.iter().max().unwrap().div_ceil(PAGE);
        let cells = LENS.len() * width * PAGE * hkv * D;
        let codes = |rng: &mut FixtureRng| -> Vec<u8> {
            (0..cells).map(|_| format.encode(rng.random_range(-1.0f32..1.0))).collect()
        };
        let (kc, vc) = (codes(&mut rng), codes(&mut rng));
        let mut perm: Vec<usize> = (0..hkv).collect();
        perm.shuffle(&mut rng);
        let k_scale = perm.iter().map(|&p| 2f32.powf(p as f32 / 4.0 - 4.0)).collect();
        let v_scale = perm.iter().map(|&p| 2f32.powf(p as f32 / 4.0 - 2.0)).collect();
        let hq = GROUP * hkv;
        let mut random = |n: usize, lo: f32, hi: f32| -> Vec<bf16> {
            (0..n).map(|_| bf16::from_f32(rng.random_range(lo..hi))).collect()
        };
        let q_decode = random(LENS.len() * hq * D, -0.5, 0.5);
        let total_q: usize = Q_LENS.iter().sum();
        let q_prefill = random(total_q * hq * D, -0.5, 0.5);
        let (new_k, new_v) = (random(NEW_TOKENS * hkv * D, -1.0, 1.0), random(NEW_TOKENS * hkv * D, -0.5, 1.5));
        let mut slots: Vec<i64> = (0..(LENS.len() * width * PAGE) as i64).collect();
        slots.shuffle(&mut rng);
        slots.truncate(NEW_TOKENS);
        let cu_seqlens_q = [0]
            .into_iter()
            .chain(Q_LENS.iter().scan(0, |acc, &n| {
                *acc += n as i32;
                Some(*acc)
            }))
            .collect();
        Self {
            format,
            hkv,
            kc,
            vc,
            table: (0..(LENS.len() * width) as i32).collect(),
            seq_lens: LENS.iter().map(|&n| n as i32).collect(),
            width,
            k_scale,
            v_scale,
            q_decode,
            q_prefill,
            cu_seqlens_q,
            new_k,
            new_v,
            slots,
            seed,
        }
    }

    fn hq(&self) -> usize {
        GROUP * self.hkv
    }
    fn shape(&self) -> [usize; 4] {
        [LENS.len() * self.width, PAGE, self.hkv, D]
    }
    fn label(&self) -> String {
        format!("Hkv {} Hq {} {:?} (seed {:#x})", self.hkv, self.hq(), self.format, self.seed)
    }
    /// Every head given its neighbour's (h ^ 1) scales: the bug a per-head indexing slip makes.
    fn neighbours(s: &[f32]) -> Vec<f32> {
        (0..s.len()).map(|h| s[(h ^ 1).min(s.len() - 1)]).collect()
    }

    /// The codes as `C`.
    fn codes<C: Fp8Element>(&self) -> (Vec<C>, Vec<C>) {
        (self.kc.iter().map(|&c| C::from_code(c)).collect(), self.vc.iter().map(|&c| C::from_code(c)).collect())
    }

    /// The cache over `k`, `v` with the scales `(k_scale, v_scale)` attached as tensors.
    fn cache<'a, C>(&'a self, (k, v): (&'a [C], &'a [C]), (ks, vs): (&'a [f32], &'a [f32])) -> PagedKvCache<'a, C> {
        self.cache_without_scales(k, v)
            .with_scale_tensors(TensorView::host(ks, [ks.len()]).unwrap(), TensorView::host(vs, [vs.len()]).unwrap())
            .unwrap()
    }
    fn cache_without_scales<'a, C>(&'a self, k: &'a [C], v: &'a [C]) -> PagedKvCache<'a, C> {
        let b = LENS.len();
        PagedKvCache::new(
            TensorView::host(k, self.shape()).unwrap(),
            TensorView::host(v, self.shape()).unwrap(),
            TensorView::host(&self.table, [b, self.width]).unwrap(),
            TensorView::host(&self.seq_lens, [b]).unwrap(),
            *LENS.iter().max().unwrap(),
        )
        .unwrap()
    }
}

/// How append's cache gets its scales: tensors (K's, V's), or host floats.
#[derive(Clone, Copy)]
enum Scales<'a> {
    Tensors(&'a [f32], &'a [f32]),
    Host(&'a KvScales),
}

/// One op's outputs: o as bits, and the LSE (decode, paged prefill) or the cache's codes (append).
#[derive(Debug, PartialEq)]
struct Outputs {
    o: Vec<u16>,
    lse_or_codes: Vec<u32>,
}

/// The three ops, each run on a cache whose scales the caller attaches.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Op {
    Decode,
    PagedPrefill,
    Append,
}

const OPS: [Op; 3] = [Op::Decode, Op::PagedPrefill, Op::Append];

fn bits16(v: &[bf16]) -> Vec<u16> {
    v.iter().map(|x| x.to_bits()).collect()
}

impl Setup {
    /// Runs decode (2 splits) over `cache`; o and LSE NaN-poisoned first.
    fn decode<C: KvCacheOf<bf16>>(
        &self,
        stream: &Stream<'_>,
        cache: &PagedKvCache<'_, C>,
    ) -> fused_attn::Result<(Vec<bf16>, Vec<f32>)> {
        let (b, hq) = (LENS.len(), self.hq());
        let mut o = vec![bf16::NAN; b * hq * D];
        let mut lse = vec![f32::NAN; b * hq];
        let mut ws = DecodeWorkspace::with_capacity(stream, b, hq, D, 4)?;
        decode(
            stream,
            &TensorView::host(&self.q_decode, [b, hq, D])?,
            cache,
            &mut TensorViewMut::host(&mut o, [b, hq, D])?,
            Some(&mut TensorViewMut::host(&mut lse, [b, hq])?),
            &mut ws,
            &Self::decode_opts(),
        )?;
        Ok((o, lse))
    }
    fn decode_opts() -> DecodeOptions<'static> {
        DecodeOptions { num_splits: Some(2), ..Default::default() }
    }

    /// Runs paged prefill (2 splits) of the `Q_LENS` newest tokens over `cache`.
    fn paged_prefill<C: KvCacheOf<bf16>>(
        &self,
        stream: &Stream<'_>,
        cache: &PagedKvCache<'_, C>,
    ) -> fused_attn::Result<(Vec<bf16>, Vec<f32>)> {
        let (total_q, hq) = (Q_LENS.iter().sum::<usize>(), self.hq());
        let mut o = vec![bf16::NAN; total_q * hq * D];
        let mut lse = vec![f32::NAN; hq * total_q];
        let mut ws = PagedPrefillWorkspace::with_capacity(stream, total_q, hq, D, 4)?;
        paged_prefill(
            stream,
            &TensorView::host(&self.q_prefill, [total_q, hq, D])?,
            &TensorView::host(&self.cu_seqlens_q, [LENS.len() + 1])?,
            *Q_LENS.iter().max().unwrap(),
            cache,
            &mut TensorViewMut::host(&mut o, [total_q, hq, D])?,
            Some(&mut TensorViewMut::host(&mut lse, [hq, total_q])?),
            Some(&mut ws),
            &Self::prefill_opts(),
        )?;
        Ok((o, lse))
    }
    fn prefill_opts() -> PagedPrefillOptions<'static> {
        PagedPrefillOptions { num_splits: Some(2), ..Default::default() }
    }

    /// Appends the new rows into a fresh cache (every code `FILLER`) with `scales` attached; returns the
    /// cache's K then V codes.
    fn append<C: KvCacheOf<bf16> + Fp8Element>(
        &self,
        stream: &Stream<'_>,
        scales: Scales<'_>,
    ) -> fused_attn::Result<Vec<u8>> {
        let cells = self.kc.len();
        let (mut k_cache, mut v_cache) = (vec![C::from_code(FILLER); cells], vec![C::from_code(FILLER); cells]);
        {
            let pages = PagedKvCacheMut::new(
                TensorViewMut::host(&mut k_cache, self.shape())?,
                TensorViewMut::host(&mut v_cache, self.shape())?,
            )?;
            let mut pages = match scales {
                Scales::Tensors(k, v) => {
                    pages.with_scale_tensors(TensorView::host(k, [k.len()])?, TensorView::host(v, [v.len()])?)?
                }
                Scales::Host(h) => pages.with_scales(h)?,
            };
            let rows = [NEW_TOKENS, self.hkv, D];
            append(
                stream,
                &TensorView::host(&self.new_k, rows)?,
                &TensorView::host(&self.new_v, rows)?,
                &TensorView::host(&self.slots, [NEW_TOKENS])?,
                &mut pages,
            )?;
        }
        Ok(k_cache.iter().chain(&v_cache).map(|c| c.code()).collect())
    }

    /// What append must write with scales `(k_scale, v_scale)` (the Rust model, slot by slot).
    fn append_model(&self, (ks, vs): (&[f32], &[f32])) -> Vec<u8> {
        let (cells, row) = (self.kc.len(), self.hkv * D);
        let mut out = vec![FILLER; 2 * cells];
        for (half, (x, s)) in [(&self.new_k, ks), (&self.new_v, vs)].into_iter().enumerate() {
            let codes = quantize(x, self.hkv, D, self.format, s);
            for (t, &slot) in self.slots.iter().enumerate() {
                let at = half * cells + slot as usize * row;
                out[at..at + row].copy_from_slice(&codes[t * row..(t + 1) * row]);
            }
        }
        out
    }

    /// `op` over this setup's cache (codes `C`) with the scales `attach` gives the cache, as bits.
    fn run<C: KvCacheOf<bf16> + Fp8Element>(
        &self,
        stream: &Stream<'_>,
        op: Op,
        scales: (&[f32], &[f32]),
    ) -> fused_attn::Result<Outputs> {
        let codes = self.codes::<C>();
        let f32_bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect();
        let (ks, vs) = scales;
        Ok(match op {
            Op::Decode => {
                let (o, lse) = self.decode(stream, &self.cache((&codes.0, &codes.1), scales))?;
                Outputs { o: bits16(&o), lse_or_codes: f32_bits(lse) }
            }
            Op::PagedPrefill => {
                let (o, lse) = self.paged_prefill(stream, &self.cache((&codes.0, &codes.1), scales))?;
                Outputs { o: bits16(&o), lse_or_codes: f32_bits(lse) }
            }
            Op::Append => {
                let codes = self.append::<C>(stream, Scales::Tensors(ks, vs))?;
                Outputs { o: vec![], lse_or_codes: codes.into_iter().map(u32::from).collect() }
            }
        })
    }
}

/// Runs `$body` with `$C` the code type of `$format`.
macro_rules! with_codes {
    ($format:expr, |$C:ident| $body:expr) => {
        match $format {
            Fp8Format::E4m3 => {
                type $C = Fp8E4m3;
                $body
            }
            Fp8Format::E5m2 => {
                type $C = Fp8E5m2;
                $body
            }
        }
    };
}

/// The fp64 reference's verdicts on `op`'s output over the setup's cache: with the scales it ran with, and
/// with every head given its neighbour's.
fn judge<C: KvCacheOf<bf16> + Fp8Element>(s: &Setup, stream: &Stream<'_>, op: Op) -> (Check, Check) {
    let codes = s.codes::<C>();
    let own = (&s.k_scale[..], &s.v_scale[..]);
    let (nk, nv) = (Setup::neighbours(&s.k_scale), Setup::neighbours(&s.v_scale));
    let cache = s.cache((&codes.0, &codes.1), own);
    let wrong = s.cache((&codes.0, &codes.1), (&nk, &nv));
    let (b, hq) = (LENS.len(), s.hq());
    match op {
        Op::Decode => {
            let (o, lse) = s.decode(stream, &cache).unwrap();
            let q = TensorView::host(&s.q_decode, [b, hq, D]).unwrap();
            let (o, lse) = (TensorView::host(&o, [b, hq, D]).unwrap(), TensorView::host(&lse, [b, hq]).unwrap());
            let check = |c| check_decode(&q, c, &o, Some(&lse), &Setup::decode_opts()).unwrap();
            (check(&cache), check(&wrong))
        }
        Op::PagedPrefill => {
            let (o, lse) = s.paged_prefill(stream, &cache).unwrap();
            let total_q = Q_LENS.iter().sum();
            let q = TensorView::host(&s.q_prefill, [total_q, hq, D]).unwrap();
            let cu = TensorView::host(&s.cu_seqlens_q, [b + 1]).unwrap();
            let o = TensorView::host(&o, [total_q, hq, D]).unwrap();
            let lse = TensorView::host(&lse, [hq, total_q]).unwrap();
            let check = |c| check_paged_prefill(&q, &cu, c, &o, Some(&lse), &Setup::prefill_opts()).unwrap();
            (check(&cache), check(&wrong))
        }
        Op::Append => unreachable!("append is checked bit for bit"),
    }
}

/// Decode and paged prefill: each KV head's own scales, at every head count (see the module docs). Every
/// head count runs; the failures are listed together.
fn every_kv_head_reads_its_own_scale(op: Op, salt: usize) {
    let emu = Emulator::new();
    let stream = Stream::Emu(&emu);
    let mut failures = Vec::new();
    for (i, hkv) in HEADS_KV.into_iter().enumerate() {
        let format = [Fp8Format::E4m3, Fp8Format::E5m2][i % 2];
        let s = Setup::new(hkv, format, common::case_seed(salt + i));
        let (right, neighbours) = with_codes!(format, |C| judge::<C>(&s, &stream, op));
        eprintln!("{op:?} {}: own scales {right}; neighbour's scales {neighbours}", s.label());
        if !right.passed() {
            failures.push(format!("{}: {right}", s.label()));
        }
        if hkv > 1 && neighbours.passed() {
            failures.push(format!("{}: a neighbour's scales would pass too: {neighbours}", s.label()));
        }
    }
    assert!(failures.is_empty(), "{op:?}:\n{}", failures.join("\n"));
}

#[test]
fn decode_reads_every_kv_heads_own_scale_tensor() {
    every_kv_head_reads_its_own_scale(Op::Decode, 30_600);
}

#[test]
fn paged_prefill_reads_every_kv_heads_own_scale_tensor() {
    every_kv_head_reads_its_own_scale(Op::PagedPrefill, 30_610);
}

/// Append quantises each KV head's rows with that head's own scales: the cache's codes bit for bit the
/// model's, which differ from the model's with the neighbours' scales (so a slip is seen).
#[test]
fn append_quantises_with_every_kv_heads_own_scale_tensor() {
    let emu = Emulator::new();
    let stream = Stream::Emu(&emu);
    let mut failures = Vec::new();
    for (i, hkv) in HEADS_KV.into_iter().enumerate() {
        let format = [Fp8Format::E4m3, Fp8Format::E5m2][i % 2];
        let s = Setup::new(hkv, format, common::case_seed(30_620 + i));
        let own = (&s.k_scale[..], &s.v_scale[..]);
        let got: Vec<u8> = with_codes!(format, |C| s.run::<C>(&stream, Op::Append, own))
            .unwrap()
            .lse_or_codes
            .into_iter()
            .map(|c| c as u8)
            .collect();
        let want = s.append_model(own);
        if let Some(i) = got.iter().zip(&want).position(|(a, b)| a != b) {
            failures.push(format!("{}: code {i} is {:#04x}, the model's {:#04x}", s.label(), got[i], want[i]));
        }
        if hkv > 1 {
            let (nk, nv) = (Setup::neighbours(&s.k_scale), Setup::neighbours(&s.v_scale));
            assert_ne!(
                want,
                s.append_model((&nk, &nv)),
                "append {}: neighbours' scales give the same codes",
                s.label()
            );
        }
    }
    assert!(failures.is_empty(), "append:\n{}", failures.join("\n"));
}

/// The same values as host floats (`KvScales`, `with_scales`) and as tensors (`with_scale_tensors`): bit
/// for bit the same outputs, per tensor and per head, in every op.
#[test]
fn scale_tensors_match_host_scales_bit_for_bit() {
    let emu = Emulator::new();
    let stream = Stream::Emu(&emu);
    for (i, format) in [Fp8Format::E4m3, Fp8Format::E5m2].into_iter().enumerate() {
        let s = Setup::new(4, format, common::case_seed(30_630 + i));
        for per_head in [false, true] {
            let n = if per_head { s.hkv } else { 1 };
            let (ks, vs) = (&s.k_scale[..n], &s.v_scale[..n]);
            let host = KvScales::per_head(&stream, ks, vs).unwrap();
            for op in OPS {
                let what = format!("{op:?} {} per-head {per_head}", s.label());
                let tensors = with_codes!(format, |C| s.run::<C>(&stream, op, (ks, vs))).unwrap();
                let floats = with_codes!(format, |C| {
                    let codes = s.codes::<C>();
                    let f32_bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect();
                    match op {
                        Op::Decode => {
                            let (o, l) = s
                                .decode(
                                    &stream,
                                    &s.cache_without_scales(&codes.0, &codes.1).with_scales(&host).unwrap(),
                                )
                                .unwrap();
                            Outputs { o: bits16(&o), lse_or_codes: f32_bits(l) }
                        }
                        Op::PagedPrefill => {
                            let cache = s.cache_without_scales(&codes.0, &codes.1).with_scales(&host).unwrap();
                            let (o, l) = s.paged_prefill(&stream, &cache).unwrap();
                            Outputs { o: bits16(&o), lse_or_codes: f32_bits(l) }
                        }
                        Op::Append => {
                            let c = s.append::<C>(&stream, Scales::Host(&host)).unwrap();
                            Outputs { o: vec![], lse_or_codes: c.into_iter().map(u32::from).collect() }
                        }
                    }
                });
                assert!(tensors.o.iter().all(|&b| !bf16::from_bits(b).is_nan()), "{what}: NaN left in o");
                assert!(tensors == floats, "{what}: scale tensors and KvScales differ");
            }
        }
    }
}

/// The kernels read the scales when they run: the same buffer, rewritten in place between two launches
/// (the address unchanged, as a captured CUDA graph replays it), gives the second launch exactly what a
/// launch with the new values gives, and differs from the first.
#[test]
fn scales_rewritten_in_place_between_launches_are_the_ones_used() {
    let emu = Emulator::new();
    let stream = Stream::Emu(&emu);
    let s = Setup::new(4, Fp8Format::E4m3, common::case_seed(30_640));
    let hkv = s.hkv;
    // One engine-owned buffer [k..., v...]; the second values are the first permuted and doubled.
    let first: Vec<f32> = s.k_scale.iter().chain(&s.v_scale).copied().collect();
    let second: Vec<f32> = (0..2 * hkv).map(|i| 2.0 * first[(i + 1) % (2 * hkv)]).collect();
    let mut buffer = first.clone();
    let address = buffer.as_ptr();
    for op in OPS {
        buffer.copy_from_slice(&first);
        let before = s.run::<Fp8E4m3>(&stream, op, (&buffer[..hkv], &buffer[hkv..])).unwrap();
        buffer.copy_from_slice(&second);
        assert_eq!(buffer.as_ptr(), address);
        let after = s.run::<Fp8E4m3>(&stream, op, (&buffer[..hkv], &buffer[hkv..])).unwrap();
        let fresh = second.clone();
        let want = s.run::<Fp8E4m3>(&stream, op, (&fresh[..hkv], &fresh[hkv..])).unwrap();
        assert!(after == want, "{op:?}: the launch after the rewrite did not use the new values");
        assert!(after != before, "{op:?}: new values changed nothing");
    }
}

/// Scale values the host cannot check (device data): for each bad value in KV head 1's K or V scale, and
/// in a per-tensor scale, every op returns Ok with the emulator's bounds, race and barrier checks passing;
/// per head, every output of the other KV heads (their query heads' o and LSE; append's codes outside head
/// 1's rows) is bit for bit what valid scales give.
#[test]
fn bad_scale_values_stay_inside_their_kv_head() {
    let emu = Emulator::new();
    let stream = Stream::Emu(&emu);
    let s = Setup::new(4, Fp8Format::E4m3, common::case_seed(30_650));
    let (hkv, bad_head) = (s.hkv, 1);
    let good: Vec<Outputs> =
        OPS.iter().map(|&op| s.run::<Fp8E4m3>(&stream, op, (&s.k_scale, &s.v_scale)).unwrap()).collect();
    // Whether element i of an op's output belongs to KV head `bad_head`.
    let in_bad_head = |op: Op, lse: bool, i: usize| -> bool {
        let q_head = |i: usize| i % s.hq();
        match (op, lse) {
            (Op::Decode, false) | (Op::PagedPrefill, false) => q_head(i / D) / GROUP == bad_head,
            (Op::Decode, true) => q_head(i) / GROUP == bad_head,
            // [Hq, total_q]
            (Op::PagedPrefill, true) => i / Q_LENS.iter().sum::<usize>() / GROUP == bad_head,
            (Op::Append, _) => (i / D) % hkv == bad_head,
        }
    };
    let bad_values = [0.0, -0.0, -1.0, f32::NAN, f32::INFINITY, f32::NEG_INFINITY, f32::from_bits(1), f32::MAX];
    for value in bad_values {
        for is_k in [true, false] {
            let (mut ks, mut vs) = (s.k_scale.clone(), s.v_scale.clone());
            let target = if is_k { &mut ks } else { &mut vs };
            target[bad_head] = value;
            for (op, good) in OPS.iter().zip(&good) {
                let what = format!("{op:?}, KV head {bad_head}'s {} scale {value:e}", if is_k { "K" } else { "V" });
                let got = s.run::<Fp8E4m3>(&stream, *op, (&ks, &vs)).unwrap_or_else(|e| panic!("{what}: {e}"));
                let other = |lse: bool, a: &[u32], b: &[u32]| {
                    a.iter().zip(b).enumerate().find(|(i, (x, y))| !in_bad_head(*op, lse, *i) && x != y).map(|(i, _)| i)
                };
                let o: (Vec<u32>, Vec<u32>) =
                    (got.o.iter().map(|&x| x.into()).collect(), good.o.iter().map(|&x| x.into()).collect());
                assert_eq!(other(false, &o.0, &o.1), None, "{what}: another KV head's o changed");
                assert_eq!(
                    other(true, &got.lse_or_codes, &good.lse_or_codes),
                    None,
                    "{what}: another KV head's LSE / codes changed"
                );
            }
        }
        // Per tensor: memory-safe, whatever the rows hold.
        for op in OPS {
            s.run::<Fp8E4m3>(&stream, op, (&[value], &[0.5]))
                .unwrap_or_else(|e| panic!("{op:?} per-tensor K scale {value:e}: {e}"));
        }
    }
}

/// Bad scale tensors, each a typed error naming the argument.
#[test]
fn bad_scale_tensors_are_typed_errors() {
    let s = Setup::new(4, Fp8Format::E4m3, common::case_seed(30_660));
    let codes = s.codes::<Fp8E4m3>();
    let attach = |k: &[f32], v: &[f32]| {
        s.cache_without_scales(&codes.0, &codes.1)
            .with_scale_tensors(TensorView::host(k, [k.len()]).unwrap(), TensorView::host(v, [v.len()]).unwrap())
            .err()
            .map(|e| (e.kind().clone(), e.message().split(':').next().unwrap_or("").to_string()))
    };
    let shape = |name: &str| Some((ErrorKind::Shape, name.to_string()));
    let sc = [0.5f32; 8];
    assert_eq!(attach(&sc[..3], &sc[..3]), shape("k_scale"), "3 scales for 4 KV heads");
    assert_eq!(attach(&sc[..8], &sc[..8]), shape("k_scale"), "8 scales for 4 KV heads");
    assert_eq!(attach(&sc[..0], &sc[..0]), shape("k_scale"), "no scales");
    assert_eq!(attach(&sc[..4], &sc[..1]), shape("v_scale"), "per-head K, per-tensor V");
    assert_eq!(attach(&sc[..1], &sc[..4]), shape("v_scale"), "per-tensor K, per-head V");
    assert_eq!(attach(&sc[..4], &sc[..4]), None);
    assert_eq!(attach(&sc[..1], &sc[..1]), None);
    // Strided (every other float): not contiguous.
    let strided = TensorView::host(&sc, [4]).unwrap().with_strides([2]).unwrap();
    let e = s
        .cache_without_scales(&codes.0, &codes.1)
        .with_scale_tensors(strided.clone(), TensorView::host(&sc[..4], [4]).unwrap())
        .err()
        .unwrap();
    assert_eq!((e.kind(), e.message().starts_with("k_scale")), (&ErrorKind::Layout, true), "{e}");
    // Device memory for a cache of host pages (no GPU touched: the check is on the host).
    // SAFETY: never launched (the error comes first).
    let device = unsafe { TensorView::<f32, 1>::from_device_ptr(0x1000, 4, [4]) }.unwrap();
    let e = s.cache_without_scales(&codes.0, &codes.1).with_scale_tensors(device.clone(), device).err().unwrap();
    assert_eq!((e.kind(), e.message().starts_with("k_scale")), (&ErrorKind::Backend, true), "{e}");
    // The same rules for append's writable pages.
    let (mut kc, mut vc) = (codes.0.clone(), codes.1.clone());
    let pages = PagedKvCacheMut::new(
        TensorViewMut::host(&mut kc, s.shape()).unwrap(),
        TensorViewMut::host(&mut vc, s.shape()).unwrap(),
    )
    .unwrap();
    let e = pages
        .with_scale_tensors(TensorView::host(&sc[..2], [2]).unwrap(), TensorView::host(&sc[..2], [2]).unwrap())
        .err()
        .unwrap();
    assert_eq!((e.kind(), e.message().starts_with("k_scale")), (&ErrorKind::Shape, true), "{e}");
    // Scale tensors on a 16-bit cache: the op refuses them.
    let sixteen = vec![bf16::ZERO; s.kc.len()];
    let emu = Emulator::new();
    let cache = s.cache((&sixteen, &sixteen), (&sc[..4], &sc[..4]));
    let e = s.decode(&Stream::Emu(&emu), &cache).unwrap_err();
    assert_eq!((e.kind(), e.message().starts_with("k_scale")), (&ErrorKind::Unsupported, true), "{e}");
}

/// On a GPU (skipped visibly without one; not yet run on one): the scales as cudarc tensors (decode and
/// paged prefill on a cudarc stream) and as raw device pointers on a raw stream (paged prefill without a
/// workspace), bit for bit what `KvScales` gives on the cudarc stream. (Append reads its scales through the
/// same `FaPagedCache` fields: the emulated tests above cover it.)
#[test]
fn gpu_scale_tensors_on_every_stream_kind_match_host_scales() {
    use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
    use fused_attn::RawStream;
    let Some(ctx) = common::gpu_or_skip("fp8_scales::gpu_scale_tensors_on_every_stream_kind_match_host_scales") else {
        return;
    };
    let cu = ctx.new_stream().unwrap();
    let gpu = Stream::Gpu(&cu);
    let s = Setup::new(8, Fp8Format::E4m3, common::case_seed(30_670));
    let (b, hq, total_q) = (LENS.len(), s.hq(), Q_LENS.iter().sum::<usize>());
    let ptr = |x: &CudaSlice<f32>, cu: &CudaStream| x.device_ptr(cu).0;
    let codes = s.codes::<Fp8E4m3>();
    let (kc, vc) = (cu.clone_htod(&codes.0).unwrap(), cu.clone_htod(&codes.1).unwrap());
    let (table, lens) = (cu.clone_htod(&s.table).unwrap(), cu.clone_htod(&s.seq_lens).unwrap());
    let (qd, qp, cuq) = (
        cu.clone_htod(&s.q_decode).unwrap(),
        cu.clone_htod(&s.q_prefill).unwrap(),
        cu.clone_htod(&s.cu_seqlens_q).unwrap(),
    );
    let (ks, vs) = (cu.clone_htod(&s.k_scale).unwrap(), cu.clone_htod(&s.v_scale).unwrap());
    let host = KvScales::per_head(&gpu, &s.k_scale, &s.v_scale).unwrap();
    let views = || {
        PagedKvCache::new(
            TensorView::gpu(kc.as_view(), s.shape()).unwrap(),
            TensorView::gpu(vc.as_view(), s.shape()).unwrap(),
            TensorView::gpu(table.as_view(), [b, s.width]).unwrap(),
            TensorView::gpu(lens.as_view(), [b]).unwrap(),
            *LENS.iter().max().unwrap(),
        )
        .unwrap()
    };
    let with_tensors = || {
        views()
            .with_scale_tensors(
                TensorView::gpu(ks.as_view(), [s.hkv]).unwrap(),
                TensorView::gpu(vs.as_view(), [s.hkv]).unwrap(),
            )
            .unwrap()
    };
    let read = |o: &CudaSlice<bf16>| -> Vec<u16> {
        let h = cu.clone_dtoh(o).unwrap();
        cu.synchronize().unwrap();
        assert!(h.iter().all(|x| x.is_finite()), "NaN left in o");
        bits16(&h)
    };
    // Decode on the cudarc stream: KvScales, then scale tensors.
    let decode_gpu = |cache: &PagedKvCache<'_, Fp8E4m3>| {
        let mut o = cu.clone_htod(&vec![bf16::NAN; b * hq * D]).unwrap();
        let mut ws = DecodeWorkspace::with_capacity(&gpu, b, hq, D, 4).unwrap();
        let q = TensorView::gpu(qd.as_view(), [b, hq, D]).unwrap();
        let mut ov = TensorViewMut::gpu(o.as_view_mut(), [b, hq, D]).unwrap();
        decode(&gpu, &q, cache, &mut ov, None, &mut ws, &Setup::decode_opts()).unwrap();
        read(&o)
    };
    assert_eq!(decode_gpu(&views().with_scales(&host).unwrap()), decode_gpu(&with_tensors()), "decode");
    // Paged prefill (one split: a raw stream has no workspace) on the cudarc stream, both ways, then raw.
    let opts = PagedPrefillOptions { num_splits: Some(1), ..Default::default() };
    let prefill_on = |stream: &Stream<'_>,
                      cache: &PagedKvCache<'_, Fp8E4m3>,
                      q: TensorView<'_, bf16, 3>,
                      cuq: TensorView<'_, i32, 1>| {
        let o = cu.clone_htod(&vec![bf16::NAN; total_q * hq * D]).unwrap();
        // SAFETY: `o` outlives the work (read back and synchronised below).
        let mut ov = unsafe {
            TensorViewMut::<bf16, 3>::from_device_ptr(o.device_ptr(&cu).0, total_q * hq * D, [total_q, hq, D])
        }
        .unwrap();
        paged_prefill(stream, &q, &cuq, *Q_LENS.iter().max().unwrap(), cache, &mut ov, None, None, &opts).unwrap();
        read(&o)
    };
    let qv = || TensorView::gpu(qp.as_view(), [total_q, hq, D]).unwrap();
    let cuv = || TensorView::gpu(cuq.as_view(), [b + 1]).unwrap();
    let want = prefill_on(&gpu, &views().with_scales(&host).unwrap(), qv(), cuv());
    assert_eq!(prefill_on(&gpu, &with_tensors(), qv(), cuv()), want, "paged prefill, cudarc scale tensors");
    // SAFETY: the stream and every buffer outlive the work (synchronised in `read`).
    unsafe {
        let raw = Stream::Raw(RawStream::new(cu.cu_stream()).unwrap());
        let dev = |p: u64, n: usize| TensorView::<Fp8E4m3, 4>::from_device_ptr(p, n, s.shape()).unwrap();
        let cache = PagedKvCache::new(
            dev(kc.device_ptr(&cu).0, codes.0.len()),
            dev(vc.device_ptr(&cu).0, codes.1.len()),
            TensorView::from_device_ptr(table.device_ptr(&cu).0, s.table.len(), [b, s.width]).unwrap(),
            TensorView::from_device_ptr(lens.device_ptr(&cu).0, b, [b]).unwrap(),
            *LENS.iter().max().unwrap(),
        )
        .unwrap()
        .with_scale_tensors(
            TensorView::from_device_ptr(ptr(&ks, &cu), s.hkv, [s.hkv]).unwrap(),
            TensorView::from_device_ptr(ptr(&vs, &cu), s.hkv, [s.hkv]).unwrap(),
        )
        .unwrap();
        let q = TensorView::from_device_ptr(qp.device_ptr(&cu).0, s.q_prefill.len(), [total_q, hq, D]).unwrap();
        let cuq = TensorView::from_device_ptr(cuq.device_ptr(&cu).0, b + 1, [b + 1]).unwrap();
        assert_eq!(prefill_on(&raw, &cache, q, cuq), want, "paged prefill, raw stream and pointers");
    }
}
