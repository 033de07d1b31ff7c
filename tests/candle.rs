//! The candle ops (feature `candle`) on CPU tensors, i.e. fused-attn's kernels on the emulator, against
//! candle's own composition of matmul + softmax under the tolerance rule (`reference::compare`): the
//! composition in f64 is the reference, the same composition in the inputs' dtype is the naive low-precision
//! result. Then the generation example's two attention paths must pick the same tokens.

#[path = "../examples/candle_generate.rs"]
#[allow(dead_code)]
mod generate;

use candle_core::{DType, Device, IndexOp, Tensor, D};
use fused_attn::candle as fa;
use fused_attn::reference::compare;
use fused_attn::DecodeProblem;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

type Result<T> = candle_core::Result<T>;

/// Seeded uniform values in `[lo, hi)`, rounded to `dtype`.
fn random(shape: &[usize], lo: f32, hi: f32, dtype: DType, rng: &mut StdRng) -> Result<Tensor> {
    let n = shape.iter().product();
    let v: Vec<f32> = (0..n).map(|_| rng.random_range(lo..hi)).collect();
    Tensor::from_vec(v, shape, &Device::Cpu)?.to_dtype(dtype)
}

fn values(t: &Tensor) -> Vec<f64> {
    t.to_dtype(DType::F64).and_then(|t| t.flatten_all()).and_then(|t| t.to_vec1()).expect("tensor values")
}

/// candle's attention composition in `dtype`: `q [B, Tq, Hq, D]`, `k [B, Tk, Hkv, D]`, `v [B, Tk, Hkv, Dv]`,
/// bottom-right causal mask, GQA by repeating K/V heads; returns `[B, Tq, Hq, Dv]` in f64.
fn candle_attention(q: &Tensor, k: &Tensor, v: &Tensor, scale: f64, causal: bool, dtype: DType) -> Result<Tensor> {
    let (b, tq, hq, _) = q.dims4()?;
    let (_, tk, hkv, _) = k.dims4()?;
    let heads = |t: &Tensor, n: usize, h: usize| -> Result<Tensor> {
        let d = t.dim(3)?; // each tensor's own head dim (V's may differ)
        let t = t.to_dtype(dtype)?.transpose(1, 2)?; // [B, H, T, D]
        t.unsqueeze(2)?.expand((b, h, hq / h, n, d))?.reshape((b, hq, n, d))
    };
    let (q, k, v) = (heads(q, tq, hq)?, heads(k, tk, hkv)?, heads(v, tk, hkv)?);
    let mut s = (q.matmul(&k.t()?)? * scale)?;
    if causal {
        let mask: Vec<f32> = (0..tq)
            .flat_map(|i| (0..tk).map(move |j| if j + tq <= i + tk { 0.0 } else { f32::NEG_INFINITY }))
            .collect();
        s = s.broadcast_add(&Tensor::from_vec(mask, (tq, tk), &Device::Cpu)?.to_dtype(dtype)?)?;
    }
    let e = s.broadcast_sub(&s.max_keepdim(D::Minus1)?)?.exp()?;
    let p = e.broadcast_div(&e.sum_keepdim(D::Minus1)?)?;
    p.matmul(&v)?.transpose(1, 2)?.to_dtype(DType::F64)
}

/// Holds `ours` to the tolerance rule against candle's composition of the same attention.
fn check(what: &str, ours: &Tensor, reference: &Tensor, naive: &Tensor) {
    let c = compare(&values(ours), &values(reference), &values(naive));
    assert!(c.passed, "{what}: {c:?}");
    assert!(c.max_abs_err > 0.0 || c.naive_max_abs_err == 0.0, "{what}: suspiciously exact: {c:?}");
}

#[test]
fn flash_attn_matches_candle_attention() -> Result<()> {
    let mut rng = StdRng::seed_from_u64(11);
    // (dtype, B, Tq, Tk, Hq, Hkv, D, causal): GQA and MHA, Tq = Tk, chunked (Tq < Tk), Tq > Tk (empty rows).
    let cases = [
        (DType::BF16, 2, 33, 33, 4, 2, 64, true),
        (DType::F16, 2, 33, 33, 4, 2, 64, false),
        (DType::BF16, 1, 5, 40, 4, 1, 128, true),
        (DType::F16, 1, 24, 17, 2, 2, 32, true),
    ];
    for (dtype, b, tq, tk, hq, hkv, d, causal) in cases {
        let what = format!("{dtype:?} B={b} Tq={tq} Tk={tk} Hq={hq} Hkv={hkv} D={d} causal={causal}");
        let q = random(&[b, tq, hq, d], -1.0, 1.0, dtype, &mut rng)?;
        let k = random(&[b, tk, hkv, d], -1.0, 1.0, dtype, &mut rng)?;
        let v = random(&[b, tk, hkv, d], -0.5, 1.5, dtype, &mut rng)?;
        let scale = 1.0 / (d as f64).sqrt();
        let ours = fa::flash_attn(&q, &k, &v, scale as f32, causal)?;
        assert_eq!(ours.dims(), q.dims(), "{what}");
        assert_eq!(ours.dtype(), dtype, "{what}");
        let mut reference = candle_attention(&q, &k, &v, scale, causal, DType::F64)?;
        let mut naive = candle_attention(&q, &k, &v, scale, causal, dtype)?;
        if tq > tk && causal {
            // The first Tq − Tk rows see no key: candle's softmax of an all −inf row is NaN, fused-attn's
            // convention is 0.
            let zero_empty = |t: &Tensor| -> Result<Tensor> {
                let seen = t.narrow(1, tq - tk, tk)?;
                Tensor::cat(&[&Tensor::zeros((b, tq - tk, hq, d), DType::F64, &Device::Cpu)?, &seen], 1)
            };
            (reference, naive) = (zero_empty(&reference)?, zero_empty(&naive)?);
            let empty = values(&ours.narrow(1, 0, tq - tk)?);
            assert!(empty.iter().all(|&x| x == 0.0), "{what}: empty rows must be 0");
        }
        check(&what, &ours, &reference, &naive);
    }
    Ok(())
}

/// A V head dim of its own (DeepSeek-V2/V3's Dqk 192 / Dv 128, and Dv above Dqk): `flash_attn` returns
/// `[B, Tq, Hq, Dv]` (scale 1/√Dqk), and `flash_attn_varlen` `[total_q, Hq, Dv]`, both held to the tolerance
/// rule against candle's own attention composition.
#[test]
fn flash_attn_with_a_v_head_dim_of_its_own_matches_candle_attention() -> Result<()> {
    let mut rng = StdRng::seed_from_u64(27);
    for (dtype, b, tq, tk, hq, hkv, d, dv, causal) in [
        (DType::BF16, 2, 33, 40, 4, 2, 192, 128, true),
        (DType::F16, 1, 17, 17, 2, 1, 192, 128, false),
        (DType::BF16, 1, 9, 30, 2, 2, 64, 128, true),
    ] {
        let what = format!("{dtype:?} B={b} Tq={tq} Tk={tk} Hq={hq} Hkv={hkv} D={d} Dv={dv} causal={causal}");
        let q = random(&[b, tq, hq, d], -1.0, 1.0, dtype, &mut rng)?;
        let k = random(&[b, tk, hkv, d], -1.0, 1.0, dtype, &mut rng)?;
        let v = random(&[b, tk, hkv, dv], -0.5, 1.5, dtype, &mut rng)?;
        let scale = 1.0 / (d as f64).sqrt();
        let ours = fa::flash_attn(&q, &k, &v, scale as f32, causal)?;
        assert_eq!(ours.dims(), &[b, tq, hq, dv], "{what}");
        let reference = candle_attention(&q, &k, &v, scale, causal, DType::F64)?;
        let naive = candle_attention(&q, &k, &v, scale, causal, dtype)?;
        check(&what, &ours, &reference, &naive);
        // The same sequences packed (varlen): each sequence's rows are the dense op's.
        let flat = |t: &Tensor| t.reshape((t.dim(0)? * t.dim(1)?, t.dim(2)?, t.dim(3)?));
        let cu =
            |n: usize| Tensor::from_vec((0..=b as u32).map(|i| i * n as u32).collect::<Vec<_>>(), b + 1, &Device::Cpu);
        let lens = fa::VarlenLengths { seqlens_q: &cu(tq)?, seqlens_k: &cu(tk)?, max_seqlen_q: tq, max_seqlen_k: tk };
        let packed = fa::flash_attn_varlen_with(
            &flat(&q)?,
            &flat(&k)?,
            &flat(&v)?,
            &lens,
            scale as f32,
            causal,
            &Default::default(),
        )?;
        assert_eq!(packed.dims(), &[b * tq, hq, dv], "{what} varlen");
        check(&format!("{what} varlen"), &packed, &flat(&reference)?, &flat(&naive)?);
    }
    Ok(())
}

/// q as a strided slice of a packed QKV projection (no copy on either side) gives bitwise the same result
/// as a contiguous q.
#[test]
fn strided_views_are_read_in_place() -> Result<()> {
    let mut rng = StdRng::seed_from_u64(12);
    let (b, t, hq, hkv, d) = (1, 20, 4, 2, 64);
    let qkv = random(&[b, t, hq + 2 * hkv, d], -1.0, 1.0, DType::BF16, &mut rng)?;
    let (q, k, v) = (qkv.narrow(2, 0, hq)?, qkv.narrow(2, hq, hkv)?, qkv.narrow(2, hq + hkv, hkv)?);
    assert!(!q.is_contiguous());
    let strided = fa::flash_attn(&q, &k, &v, 0.125, true)?;
    let dense = fa::flash_attn(&q.contiguous()?, &k.contiguous()?, &v.contiguous()?, 0.125, true)?;
    assert_eq!(values(&strided), values(&dense));
    Ok(())
}

#[test]
fn flash_attn_varlen_matches_candle_attention_per_sequence() -> Result<()> {
    let mut rng = StdRng::seed_from_u64(13);
    let (hq, hkv, d) = (4, 2, 64);
    let lens_q = [7usize, 0, 19];
    let lens_k = [7usize, 3, 30];
    let cu = |lens: &[usize]| -> Vec<u32> {
        std::iter::once(0)
            .chain(lens.iter().scan(0u32, |s, &l| {
                *s += l as u32;
                Some(*s)
            }))
            .collect()
    };
    let (cu_q, cu_k) = (cu(&lens_q), cu(&lens_k));
    let (total_q, total_k) = (cu_q[3] as usize, cu_k[3] as usize);
    for dtype in [DType::BF16, DType::F16] {
        let q = random(&[total_q, hq, d], -1.0, 1.0, dtype, &mut rng)?;
        let k = random(&[total_k, hkv, d], -1.0, 1.0, dtype, &mut rng)?;
        let v = random(&[total_k, hkv, d], -0.5, 1.5, dtype, &mut rng)?;
        // seqlens as candle-flash-attn takes them (U32).
        let seqlens_q = Tensor::new(cu_q.as_slice(), &Device::Cpu)?;
        let seqlens_k = Tensor::new(cu_k.as_slice(), &Device::Cpu)?;
        let ours = fa::flash_attn_varlen(&q, &k, &v, &seqlens_q, &seqlens_k, 19, 30, 0.125, true)?;
        assert_eq!(ours.dims(), q.dims());
        let (mut reference, mut naive) = (Vec::new(), Vec::new());
        for s in (0..3).filter(|&s| lens_q[s] > 0) {
            let seq = |t: &Tensor, cu: &[u32], len: usize| t.narrow(0, cu[s] as usize, len)?.unsqueeze(0);
            let (qs, ks, vs) = (seq(&q, &cu_q, lens_q[s])?, seq(&k, &cu_k, lens_k[s])?, seq(&v, &cu_k, lens_k[s])?);
            reference.push(candle_attention(&qs, &ks, &vs, 0.125, true, DType::F64)?.squeeze(0)?);
            naive.push(candle_attention(&qs, &ks, &vs, 0.125, true, dtype)?.squeeze(0)?);
        }
        check(&format!("varlen {dtype:?}"), &ours, &Tensor::cat(&reference, 0)?, &Tensor::cat(&naive, 0)?);
    }
    Ok(())
}

/// flash_attn_rope: q rotated in the kernel, at the bottom-right positions or at explicit ones, matches
/// candle's attention over q rotated on the host by the same table (the Rust model of the kernel's rotation,
/// rounded to the dtype); the same output judged against the unrotated q fails. Varlen through
/// flash_attn_varlen_rope alike (bottom-right positions per sequence). With a [`fa::KeyRope`] k is rotated
/// too (key j at j, or at explicit positions), dense and varlen: candle's attention over q and k rotated on
/// the host, and judged against the unrotated k it fails.
#[test]
fn flash_attn_rope_matches_candle_attention_over_rotated_q() -> Result<()> {
    let mut rng = StdRng::seed_from_u64(28);
    let (b, tq, tk, hq, hkv, d, rd, max_pos) = (2, 24, 40, 4, 2, 64, 32, 128);
    let cfg = fused_attn::RopeConfig {
        theta: 10000.0,
        rotary_dim: rd,
        style: fused_attn::RopeStyle::Gptj,
        scaling: fused_attn::RopeScaling::None,
    };
    let rope = fa::CandleRope::new(&cfg, max_pos, &Device::Cpu)?;
    let table = fused_attn::reference::RopeRef::from_table(&cfg.table(max_pos)?, rd, cfg.style);
    let dtype = DType::BF16;
    let scale = 1.0 / (d as f64).sqrt();
    let q = random(&[b, tq, hq, d], -1.0, 1.0, dtype, &mut rng)?;
    let k = random(&[b, tk, hkv, d], -1.0, 1.0, dtype, &mut rng)?;
    let v = random(&[b, tk, hkv, d], -0.5, 1.5, dtype, &mut rng)?;
    let rotated_rows = |x: &Tensor, heads: usize, positions: &[i64]| -> Result<Tensor> {
        let mut f = values(x);
        table.rotate_lowp(&mut f, d, heads, positions, fused_attn::DType::Bf16);
        Tensor::from_vec(f, x.dims(), &Device::Cpu)?.to_dtype(dtype)
    };
    let rotated = |q: &Tensor, positions: &[i64]| rotated_rows(q, hq, positions);
    let judge = |what: &str, ours: &Tensor, q: &Tensor, q_rot: &Tensor| -> Result<()> {
        let attend = |q: &Tensor, dt| candle_attention(q, &k, &v, scale, true, dt);
        check(what, ours, &attend(q_rot, DType::F64)?, &attend(q_rot, dtype)?);
        let unrotated = compare(&values(ours), &values(&attend(q, DType::F64)?), &values(&attend(q, dtype)?));
        assert!(!unrotated.passed, "{what}: passes against the unrotated q too");
        Ok(())
    };
    let bottom_right: Vec<i64> = (0..b * tq).map(|t| (t % tq + tk - tq) as i64).collect();
    let ours = fa::flash_attn_rope(&q, &k, &v, scale as f32, true, &fa::Variants::default(), &rope, None, None)?;
    judge("dense, bottom-right positions", &ours, &q, &rotated(&q, &bottom_right)?)?;
    let positions: Vec<i32> = (0..b * tq).map(|_| rng.random_range(0..max_pos as i32)).collect();
    let pt = Tensor::new(positions.as_slice(), &Device::Cpu)?;
    let ours = fa::flash_attn_rope(&q, &k, &v, scale as f32, true, &fa::Variants::default(), &rope, Some(&pt), None)?;
    let explicit: Vec<i64> = positions.iter().map(|&p| i64::from(p)).collect();
    judge("dense, explicit positions", &ours, &q, &rotated(&q, &explicit)?)?;
    // Varlen: the same two sequences packed.
    let (seqlens_q, seqlens_k) = (
        Tensor::new(&[0u32, tq as u32, 2 * tq as u32], &Device::Cpu)?,
        Tensor::new(&[0u32, tk as u32, 2 * tk as u32], &Device::Cpu)?,
    );
    let lens = fa::VarlenLengths { seqlens_q: &seqlens_q, seqlens_k: &seqlens_k, max_seqlen_q: tq, max_seqlen_k: tk };
    let pack = |t: &Tensor, n: usize, h: usize| t.reshape((b * n, h, d));
    let ours = fa::flash_attn_varlen_rope(
        &pack(&q, tq, hq)?,
        &pack(&k, tk, hkv)?,
        &pack(&v, tk, hkv)?,
        &lens,
        scale as f32,
        true,
        &fa::Variants::default(),
        &rope,
        None,
        None,
    )?;
    judge("varlen, bottom-right positions", &ours.reshape((b, tq, hq, d))?, &q, &rotated(&q, &bottom_right)?)?;

    // K rotated in the kernel too: key j of each sequence at j, or at explicit positions.
    let judge_qk = |what: &str, ours: &Tensor, q_rot: &Tensor, k_rot: &Tensor| -> Result<()> {
        let attend = |k: &Tensor, dt| candle_attention(q_rot, k, &v, scale, true, dt);
        check(what, ours, &attend(k_rot, DType::F64)?, &attend(k_rot, dtype)?);
        let unrotated = compare(&values(ours), &values(&attend(&k, DType::F64)?), &values(&attend(&k, dtype)?));
        assert!(!unrotated.passed, "{what}: passes against the unrotated k too");
        Ok(())
    };
    let key_default: Vec<i64> = (0..b * tk).map(|t| (t % tk) as i64).collect();
    let keys = fa::KeyRope::default();
    let ours = fa::flash_attn_rope(&q, &k, &v, scale as f32, true, &fa::Variants::default(), &rope, None, Some(&keys))?;
    let (q_br, k_default) = (rotated(&q, &bottom_right)?, rotated_rows(&k, hkv, &key_default)?);
    judge_qk("dense q and k, default positions", &ours, &q_br, &k_default)?;
    let k_positions: Vec<i32> = (0..b * tk).map(|_| rng.random_range(0..max_pos as i32)).collect();
    let keys = fa::KeyRope { positions: Some(Tensor::new(k_positions.as_slice(), &Device::Cpu)?) };
    let ours =
        fa::flash_attn_rope(&q, &k, &v, scale as f32, true, &fa::Variants::default(), &rope, Some(&pt), Some(&keys))?;
    let k_explicit: Vec<i64> = k_positions.iter().map(|&p| i64::from(p)).collect();
    judge_qk(
        "dense q and k, explicit positions",
        &ours,
        &rotated(&q, &explicit)?,
        &rotated_rows(&k, hkv, &k_explicit)?,
    )?;
    let ours = fa::flash_attn_varlen_rope(
        &pack(&q, tq, hq)?,
        &pack(&k, tk, hkv)?,
        &pack(&v, tk, hkv)?,
        &lens,
        scale as f32,
        true,
        &fa::Variants::default(),
        &rope,
        None,
        Some(&fa::KeyRope::default()),
    )?;
    judge_qk("varlen q and k, default positions", &ours.reshape((b, tq, hq, d))?, &q_br, &k_default)?;
    Ok(())
}

/// Builds a paged cache of `lens` tokens per sequence (pages in shuffled order, page size 16) through
/// `paged_append`; returns the cache, block table, seq_lens and each sequence's contiguous K and V.
struct Paged {
    kv_cache: Tensor,
    block_table: Tensor,
    seq_lens: Tensor,
    kv: Vec<(Tensor, Tensor)>,
}

fn paged(lens: &[usize], hkv: usize, d: usize, dtype: DType, rng: &mut StdRng) -> Result<Paged> {
    let page = 16;
    let per_seq = lens.iter().max().copied().unwrap_or(1).div_ceil(page).max(1);
    let num_pages = lens.len() * per_seq + 1;
    // Pages handed out in shuffled order; one page nobody owns.
    let mut order: Vec<usize> = (0..num_pages).collect();
    order.shuffle(rng);
    let phys = |s: usize, p: usize| order[s * per_seq + p];
    let kv_cache = Tensor::zeros((2, num_pages, page, hkv, d), dtype, &Device::Cpu)?;
    let mut kv = Vec::new();
    for (s, &n) in lens.iter().enumerate() {
        let k = random(&[n, hkv, d], -1.0, 1.0, dtype, rng)?;
        let v = random(&[n, hkv, d], -0.5, 1.5, dtype, rng)?;
        let slots: Vec<i64> = (0..n).map(|t| (phys(s, t / page) * page + t % page) as i64).collect();
        fa::paged_append(&k, &v, &Tensor::from_vec(slots, n, &Device::Cpu)?, &kv_cache)?;
        kv.push((k, v));
    }
    let table: Vec<i32> = (0..lens.len()).flat_map(|s| (0..per_seq).map(move |p| phys(s, p) as i32)).collect();
    let seq_lens: Vec<i32> = lens.iter().map(|&n| n as i32).collect();
    Ok(Paged {
        kv_cache,
        block_table: Tensor::from_vec(table, (lens.len(), per_seq), &Device::Cpu)?,
        seq_lens: Tensor::from_vec(seq_lens, lens.len(), &Device::Cpu)?,
        kv,
    })
}

#[test]
fn paged_append_writes_exactly_the_slots() -> Result<()> {
    let mut rng = StdRng::seed_from_u64(14);
    let c = paged(&[37, 5], 2, 64, DType::BF16, &mut rng)?;
    let table = c.block_table.to_vec2::<i32>()?;
    let mut owner = std::collections::HashMap::new();
    for (s, (k, _)) in c.kv.iter().enumerate() {
        for t in 0..k.dim(0)? {
            owner.insert((table[s][t / 16] as usize, t % 16), (s, t));
        }
    }
    let num_pages = c.kv_cache.dim(1)?;
    for page in 0..num_pages {
        for slot in 0..16 {
            let (k_row, v_row) = (values(&c.kv_cache.i((0, page, slot))?), values(&c.kv_cache.i((1, page, slot))?));
            match owner.get(&(page, slot)) {
                Some(&(s, t)) => {
                    assert_eq!(k_row, values(&c.kv[s].0.i(t)?), "K of seq {s} token {t}");
                    assert_eq!(v_row, values(&c.kv[s].1.i(t)?), "V of seq {s} token {t}");
                }
                None => assert!(k_row.iter().chain(&v_row).all(|&x| x == 0.0), "page {page} slot {slot} written"),
            }
        }
    }
    Ok(())
}

#[test]
fn paged_decode_matches_candle_attention() -> Result<()> {
    let mut rng = StdRng::seed_from_u64(15);
    for (dtype, hq, hkv, d, lens) in
        [(DType::BF16, 4, 2, 64, vec![1usize, 16, 17, 300]), (DType::F16, 8, 1, 128, vec![45, 0, 9])]
    {
        let c = paged(&lens, hkv, d, dtype, &mut rng)?;
        let b = lens.len();
        let q = random(&[b, hq, d], -1.0, 1.0, dtype, &mut rng)?;
        let max_seq_len = *lens.iter().max().unwrap_or(&0);
        let limits = DecodeProblem { batch: b, heads_q: hq, heads_kv: hkv, head_dim: d, max_seq_len };
        let scale = 1.0 / (d as f64).sqrt();
        // A forced split exercises the split-KV partials in the workspace and the merge kernel too.
        for splits in [None, Some(3)] {
            let mut ws = fa::decode_workspace(&Device::Cpu, &limits, splits)?;
            let (o, lse) = fa::paged_decode_with_lse(
                &q,
                &c.kv_cache,
                &c.block_table,
                &c.seq_lens,
                max_seq_len,
                scale as f32,
                &mut ws,
            )?;
            assert_eq!((o.dims(), lse.dims()), (q.dims(), &[b, hq][..]));
            let (mut reference, mut naive) = (Vec::new(), Vec::new());
            for (s, (k, v)) in c.kv.iter().enumerate() {
                let qs = q.i(s)?.unsqueeze(0)?.unsqueeze(0)?;
                if lens[s] == 0 {
                    let zero = Tensor::zeros((hq, d), DType::F64, &Device::Cpu)?;
                    reference.push(zero.clone());
                    naive.push(zero);
                    let l = values(&lse.i(s)?);
                    assert!(l.iter().all(|&x| x == f64::NEG_INFINITY), "empty sequence: lse {l:?}");
                    continue;
                }
                let (k, v) = (k.unsqueeze(0)?, v.unsqueeze(0)?);
                reference.push(candle_attention(&qs, &k, &v, scale, false, DType::F64)?.squeeze(0)?.squeeze(0)?);
                naive.push(candle_attention(&qs, &k, &v, scale, false, dtype)?.squeeze(0)?.squeeze(0)?);
            }
            let what = format!("decode {dtype:?} Hq={hq} Hkv={hkv} D={d} lens={lens:?} splits={splits:?}");
            check(&what, &o, &Tensor::stack(&reference, 0)?, &Tensor::stack(&naive, 0)?);
        }
    }
    Ok(())
}

/// candle's LSE merge in `dtype`: `o_states [k, N, H, D]`, `lse_states [k, N, H]`.
fn candle_merge(o: &Tensor, lse: &Tensor, dtype: DType) -> Result<(Tensor, Tensor)> {
    let (o, lse) = (o.to_dtype(dtype)?, lse.to_dtype(dtype)?);
    let m = lse.max_keepdim(0)?;
    let total = (lse.broadcast_sub(&m)?.exp()?.sum_keepdim(0)?.log()? + &m)?;
    let w = lse.broadcast_sub(&total)?.exp()?.unsqueeze(D::Minus1)?;
    Ok((o.broadcast_mul(&w)?.sum(0)?.to_dtype(DType::F64)?, total.squeeze(0)?.to_dtype(DType::F64)?))
}

#[test]
fn merge_states_matches_candle_logsumexp() -> Result<()> {
    let mut rng = StdRng::seed_from_u64(16);
    for dtype in [DType::F32, DType::BF16, DType::F16] {
        let (k, n, h, d) = (3, 5, 4, 64);
        let o = random(&[k, n, h, d], -1.0, 1.0, dtype, &mut rng)?;
        let lse = random(&[k, n, h], -3.0, 3.0, DType::F32, &mut rng)?;
        let (ours, ours_lse) = fa::merge_states(&o, &lse)?;
        assert_eq!((ours.dims(), ours.dtype(), ours_lse.dims()), (&[n, h, d][..], dtype, &[n, h][..]));
        let (reference, reference_lse) = candle_merge(&o, &lse, DType::F64)?;
        let (naive, _) = candle_merge(&o, &lse, if dtype == DType::F32 { DType::F32 } else { dtype })?;
        check(&format!("merge {dtype:?}"), &ours, &reference, &naive);
        let c = fused_attn::reference::compare_lse(&values(&ours_lse), &values(&reference_lse), 1e-5);
        assert!(c.passed, "merge lse {dtype:?}: {c:?}");
    }
    Ok(())
}

/// Bad input is a candle error whose message starts with fused-attn's error kind and the argument.
#[test]
fn errors_keep_the_kind_and_the_argument() -> Result<()> {
    let mut rng = StdRng::seed_from_u64(17);
    let q = random(&[1, 8, 2, 64], -1.0, 1.0, DType::BF16, &mut rng)?;
    let err = |r: Result<Tensor>| r.err().map(|e| e.to_string()).unwrap_or_default();
    let msg = err(fa::flash_attn(&q.to_dtype(DType::F32)?, &q, &q, 0.1, false));
    assert!(msg.starts_with("Unsupported error: q: dtype F32"), "{msg}");
    let q100 = random(&[1, 8, 2, 100], -1.0, 1.0, DType::BF16, &mut rng)?;
    let msg = err(fa::flash_attn(&q100, &q100, &q100, 0.1, false));
    assert!(msg.starts_with("Unsupported error: q: head dim 100"), "{msg}");
    let msg = err(fa::flash_attn(&q, &q.to_dtype(DType::F16)?, &q, 0.1, false));
    assert!(msg.starts_with("Unsupported error: k: dtype F16"), "{msg}");
    let k3 = random(&[1, 8, 3, 64], -1.0, 1.0, DType::BF16, &mut rng)?;
    let msg = err(fa::flash_attn(&q, &k3, &k3, 0.1, false));
    assert!(msg.starts_with("Shape error: q: 2 query heads"), "{msg}");
    let transposed = q.transpose(2, 3)?.contiguous()?.transpose(2, 3)?;
    let msg = err(fa::flash_attn(&transposed, &q, &q, 0.1, false));
    assert!(msg.starts_with("Layout error: q: innermost stride"), "{msg}");
    let broadcast = q.narrow(2, 0, 1)?.broadcast_as((1, 8, 2, 64))?;
    let msg = err(fa::flash_attn(&broadcast, &q, &q, 0.1, false));
    assert!(msg.starts_with("Layout error: q: dimension 2 is broadcast"), "{msg}");
    let msg = err(fa::flash_attn(&q.squeeze(0)?, &q, &q, 0.1, false));
    assert!(msg.starts_with("Shape error: q: expected rank 4"), "{msg}");

    let c = paged(&[20], 2, 64, DType::BF16, &mut rng)?;
    let qd = random(&[1, 4, 64], -1.0, 1.0, DType::BF16, &mut rng)?;
    let limits = DecodeProblem { batch: 1, heads_q: 4, heads_kv: 2, head_dim: 64, max_seq_len: 32 };
    let mut ws = fa::decode_workspace(&Device::Cpu, &limits, None)?;
    let msg = err(fa::paged_decode(&qd, &c.kv_cache.i(0)?, &c.block_table, &c.seq_lens, 20, 0.1, &mut ws));
    assert!(msg.starts_with("Shape error: kv_cache: expected rank 5"), "{msg}");
    let msg = err(fa::paged_decode(&qd, &c.kv_cache, &c.block_table, &c.seq_lens, 100, 0.1, &mut ws));
    assert!(msg.starts_with("Shape error: block_table: too narrow"), "{msg}");
    let lens_f32 = c.seq_lens.to_dtype(DType::F32)?;
    let msg = err(fa::paged_decode(&qd, &c.kv_cache, &c.block_table, &lens_f32, 20, 0.1, &mut ws));
    assert!(msg.starts_with("Unsupported error: seq_lens: dtype F32"), "{msg}");
    let k = random(&[2, 2, 64], -1.0, 1.0, DType::BF16, &mut rng)?;
    let slots = Tensor::new(&[0i64, 1], &Device::Cpu)?;
    let e = fa::paged_append(&k, &k, &slots, &c.kv_cache.to_dtype(DType::F16)?).err().map(|e| e.to_string());
    assert!(e.as_deref().unwrap_or("").starts_with("Unsupported error: kv_cache: dtype F16"), "{e:?}");
    Ok(())
}

/// The example's two attention paths (fused-attn: varlen prefill + paged append + paged decode, RoPE fused
/// into the decode steps' append and decode; candle's plain attention with candle-side RoPE) generate
/// identical tokens for 32 decode steps on the 2-layer model, with logits that agree closely; a deliberately
/// wrong softmax scale, or RoPE θ, on the fused path is caught.
#[test]
fn generation_paths_pick_identical_tokens() -> Result<()> {
    let model = generate::Model::random(generate::Config::small(), 1, &Device::Cpu)?;
    let prompts = generate::prompts(&model.cfg, 1);
    let steps = 32;
    let (fused, reference) = generate::run_both(&model, &prompts, steps, DType::F16, 1)?;
    assert_eq!(fused.tokens, reference.tokens);
    assert!(fused.tokens.iter().all(|t| t.len() == steps + 1));
    let diffs = generate::logit_diffs(&fused, &reference);
    let worst = diffs.iter().copied().fold(0.0f32, f32::max);
    assert!(diffs.iter().all(|d| d.is_finite()) && worst < 0.05, "max logit differences {diffs:?}");

    // Same run with the scale off by 10 %: the comparison must see it.
    let max_seq_len = prompts.iter().map(|p| p.len()).max().unwrap_or(0) + 4;
    let cfg = model.cfg;
    let mut wrong = generate::FusedPath::new(&cfg, prompts.len(), max_seq_len, DType::F16, 1, &Device::Cpu)?;
    wrong.softmax_scale *= 1.1;
    let wrong = generate::generate(&model, &prompts, 2, &mut wrong, DType::F16)?;
    let wrong_diff = generate::logit_diffs(&wrong, &reference).into_iter().fold(0.0f32, f32::max);
    assert!(wrong_diff > 10.0 * worst.max(1e-3), "a 10 % scale error gave logit differences of only {wrong_diff}");

    // The fused path rotates q and k in the kernels, the prompts' (flash_attn_varlen_rope with k,
    // paged_append_rope) and the decode steps' (paged_append_rope, paged_decode_rope): a table of another θ
    // there must be seen too.
    let mut other_theta = cfg;
    other_theta.rope_theta *= 2.0;
    let mut wrong = generate::FusedPath::new(&other_theta, prompts.len(), max_seq_len, DType::F16, 1, &Device::Cpu)?;
    let wrong = generate::generate(&model, &prompts, 2, &mut wrong, DType::F16)?;
    let wrong_diff = generate::logit_diffs(&wrong, &reference).into_iter().fold(0.0f32, f32::max);
    assert!(wrong_diff > 10.0 * worst.max(1e-3), "a wrong RoPE θ gave logit differences of only {wrong_diff}");
    Ok(())
}

/// Weights saved to safetensors and loaded back give the same model (the example's `--save` / `--weights`).
#[test]
fn safetensors_round_trip() -> Result<()> {
    let model = generate::Model::random(generate::Config::small(), 3, &Device::Cpu)?;
    let path = std::env::temp_dir().join(format!("fused-attn-candle-{}.safetensors", std::process::id()));
    let path = path.to_string_lossy().into_owned();
    model.save(&path)?;
    let loaded = generate::Model::load(&path, 64, &Device::Cpu)?;
    let _ = std::fs::remove_file(&path);
    let c = loaded.cfg;
    assert_eq!((c.vocab, c.d_model, c.heads, c.kv_heads, c.layers, c.ffn), (256, 128, 4, 2, 2, 256));
    let prompts = generate::prompts(&model.cfg, 3);
    let mut a = generate::ReferencePath::new(&model.cfg, prompts.len());
    let mut b = generate::ReferencePath::new(&c, prompts.len());
    let ra = generate::generate(&model, &prompts, 2, &mut a, DType::F16)?;
    let rb = generate::generate(&loaded, &prompts, 2, &mut b, DType::F16)?;
    assert_eq!(ra.logits, rb.logits);
    Ok(())
}

/// Score variants through the candle ops: a causal window with softcap, ALiBi and sinks on
/// `flash_attn_with` and `paged_decode_with` (CPU tensors, the emulator), each checked with one call against
/// the fp64 reference given the same variants (`reference::check_prefill` / `check_decode` over host views
/// of the same data); the plain op's output fails that check, so the variants are not lost on the way.
#[test]
fn score_variants_pass_through_the_candle_ops() -> Result<()> {
    use fused_attn::prefill::PrefillOptions;
    use fused_attn::reference::{check_decode, check_prefill};
    use fused_attn::{AlibiSlopes, DecodeOptions, PagedKvCache, ScoreMod, TensorView};
    use half::bf16;
    let host = |t: &Tensor| t.flatten_all().and_then(|t| t.to_vec1::<bf16>());
    fn view(v: &[bf16], shape: [usize; 4]) -> TensorView<'_, bf16, 4> {
        TensorView::host(v, shape).unwrap()
    }
    let mut rng = StdRng::seed_from_u64(21);
    let (b, t, hq, hkv, d) = (2, 40, 4, 2, 64);
    let dtype = DType::BF16;
    let (q, k, v) = (
        random(&[b, t, hq, d], -1.0, 1.0, dtype, &mut rng)?,
        random(&[b, t, hkv, d], -1.0, 1.0, dtype, &mut rng)?,
        random(&[b, t, hkv, d], -0.5, 1.5, dtype, &mut rng)?,
    );
    let slopes: Vec<f32> = (0..hq).map(|h| 0.5f32.powi(h as i32 + 1)).collect();
    let sinks: Vec<f32> = (0..hq).map(|h| 0.3 * h as f32 - 0.4).collect();
    let (window, softcap, scale) = (Some((12, 0)), Some(20.0), 1.0 / (d as f32).sqrt());
    let variants = fa::Variants {
        window,
        softcap,
        alibi_slopes: Some(Tensor::from_vec(slopes.clone(), hq, &Device::Cpu)?),
        sinks: Some(Tensor::from_vec(sinks.clone(), hq, &Device::Cpu)?),
    };
    let (slopes_v, sinks_v) = (TensorView::host(&slopes, [hq]).unwrap(), TensorView::host(&sinks, [hq]).unwrap());
    let score_mod =
        ScoreMod { window, softcap, alibi_slopes: Some(AlibiSlopes::PerHead(&slopes_v)), sinks: Some(&sinks_v) };

    let (qh, kh, vh) = (host(&q)?, host(&k)?, host(&v)?);
    let opts = PrefillOptions { causal: true, scale: Some(scale), score_mod, ..Default::default() };
    let prefill_check = |o: &Tensor| {
        let oh = host(o).unwrap();
        check_prefill(
            &view(&qh, [b, t, hq, d]),
            &view(&kh, [b, t, hkv, d]),
            &view(&vh, [b, t, hkv, d]),
            &view(&oh, [b, t, hq, d]),
            None,
            &opts,
        )
        .unwrap()
    };
    let with = prefill_check(&fa::flash_attn_with(&q, &k, &v, scale, true, &variants)?);
    assert!(with.passed(), "flash_attn_with: {with}");
    let plain = prefill_check(&fa::flash_attn(&q, &k, &v, scale, true)?);
    assert!(!plain.passed(), "the plain op passes the variants' check: {plain}");

    let lens = [1usize, 30, 77];
    let c = paged(&lens, hkv, d, dtype, &mut rng)?;
    let q1 = random(&[lens.len(), hq, d], -1.0, 1.0, dtype, &mut rng)?;
    let max_seq_len = 77;
    let limits = DecodeProblem { batch: lens.len(), heads_q: hq, heads_kv: hkv, head_dim: d, max_seq_len };
    let mut ws = fa::decode_workspace(&Device::Cpu, &limits, Some(2))?;
    let (o, _) =
        fa::paged_decode_with(&q1, &c.kv_cache, &c.block_table, &c.seq_lens, max_seq_len, scale, &variants, &mut ws)?;
    let (plain, _) =
        fa::paged_decode_with_lse(&q1, &c.kv_cache, &c.block_table, &c.seq_lens, max_seq_len, scale, &mut ws)?;
    let kv = host(&c.kv_cache)?;
    let pages = c.kv_cache.dims()[1..].to_vec();
    let shape = [pages[0], pages[1], pages[2], pages[3]];
    let (table, seq_lens) = (c.block_table.flatten_all()?.to_vec1::<i32>()?, c.seq_lens.to_vec1::<i32>()?);
    let cache = PagedKvCache::new(
        view(&kv[..kv.len() / 2], shape),
        view(&kv[kv.len() / 2..], shape),
        TensorView::host(&table, [lens.len(), c.block_table.dims()[1]]).unwrap(),
        TensorView::host(&seq_lens, [lens.len()]).unwrap(),
        max_seq_len,
    )
    .unwrap();
    let q1h = host(&q1)?;
    let opts = DecodeOptions { scale: Some(scale), num_splits: None, score_mod, rope: None };
    let decode_check = |o: &Tensor| {
        let oh = host(o).unwrap();
        let shape = [lens.len(), hq, d];
        check_decode(
            &TensorView::host(&q1h, shape).unwrap(),
            &cache,
            &TensorView::host(&oh, shape).unwrap(),
            None,
            &opts,
        )
        .unwrap()
    };
    let with = decode_check(&o);
    assert!(with.passed(), "paged_decode_with: {with}");
    assert!(!decode_check(&plain).passed(), "the plain decode passes the variants' check");
    Ok(())
}

/// FP8 caches through the candle ops (CPU tensors, the emulator): bf16 K/V appended into a cache of FP8
/// codes (`U8` in either format, or candle's `F8E4M3`), per-tensor and per-head scales, and decoded from it.
/// The codes written are exactly `encode(f32(x) / scale)`, slot by slot, and nothing else is written; the
/// decode passes the fp64 reference over that cache and its scales (`reference::check_decode`), and fails it
/// when the reference is given other scales, so the scales reach the kernel. Then the errors: FP8 codes
/// without `fp8`, E5M2 codes in an `F8E4M3` tensor, a 16-bit cache with `fp8`.
#[test]
fn fp8_caches_pass_through_the_candle_ops() -> Result<()> {
    use fused_attn::fp8::Fp8Element;
    use fused_attn::reference::check_decode;
    use fused_attn::{DecodeOptions, Fp8E4m3, Fp8E5m2, Fp8Format, KvScales, PagedKvCache, TensorView};
    use half::bf16;

    let mut rng = StdRng::seed_from_u64(23);
    let (hq, hkv, d, page) = (4, 2, 64, 16);
    let lens = [1usize, 37, 70];
    let (b, per_seq) = (lens.len(), 5);
    let num_pages = b * per_seq + 1;
    let max_seq_len = 70;
    let scale = 1.0 / (d as f32).sqrt();
    let emu = fused_attn::Stream::Emu(fa::emulator());
    for (format, storage, per_head) in [
        (Fp8Format::E4m3, DType::F8E4M3, false),
        (Fp8Format::E5m2, DType::U8, true),
        (Fp8Format::E4m3, DType::U8, true),
    ] {
        let what = format!("{format:?} in {storage:?}, per-head scales {per_head}");
        let (k_scales, v_scales): (Vec<f32>, Vec<f32>) =
            if per_head { (vec![0.004, 0.011], vec![0.02, 0.0075]) } else { (vec![0.006], vec![0.013]) };
        let fp8 = if per_head {
            fa::Fp8Kv::per_head(&Device::Cpu, format, &k_scales, &v_scales)?
        } else {
            fa::Fp8Kv::per_tensor(&Device::Cpu, format, k_scales[0], v_scales[0])?
        };
        let opts = fa::PagedOptions { fp8: Some(&fp8), ..Default::default() };
        // Pages in shuffled order, one nobody owns; the cache starts as code 0x5a everywhere.
        let mut order: Vec<usize> = (0..num_pages).collect();
        order.shuffle(&mut rng);
        let filler = 0x5au8;
        let cache_shape = (2, num_pages, page, hkv, d);
        let cells = 2 * num_pages * page * hkv * d;
        let kv_cache = match storage {
            DType::U8 => Tensor::from_vec(vec![filler; cells], cache_shape, &Device::Cpu)?,
            // candle converts by value: the filler's value is exact in E4M3.
            _ => Tensor::from_vec(vec![Fp8Format::E4m3.decode(filler) as f32; cells], cache_shape, &Device::Cpu)?
                .to_dtype(storage)?,
        };
        let mut expected = vec![filler; cells];
        let slot_offset = |kv: usize, slot: usize, h: usize| ((kv * num_pages * page + slot) * hkv + h) * d;
        for (s, &n) in lens.iter().enumerate() {
            let k = random(&[n, hkv, d], -1.0, 1.0, DType::BF16, &mut rng)?;
            let v = random(&[n, hkv, d], -0.5, 1.5, DType::BF16, &mut rng)?;
            let slots: Vec<i64> = (0..n).map(|t| (order[s * per_seq + t / page] * page + t % page) as i64).collect();
            fa::paged_append_opts(&k, &v, &Tensor::from_vec(slots.clone(), n, &Device::Cpu)?, &kv_cache, &opts)?;
            for (kv, (x, scales)) in [(&k, &k_scales), (&v, &v_scales)].into_iter().enumerate() {
                let x = x.flatten_all()?.to_vec1::<bf16>()?;
                for (t, &slot) in slots.iter().enumerate() {
                    for h in 0..hkv {
                        let sc = scales[if per_head { h } else { 0 }];
                        for i in 0..d {
                            expected[slot_offset(kv, slot as usize, h) + i] =
                                format.encode(x[(t * hkv + h) * d + i].to_f32() / sc);
                        }
                    }
                }
            }
        }
        let codes: Vec<u8> = match storage {
            DType::U8 => kv_cache.flatten_all()?.to_vec1::<u8>()?,
            // By value, exact: no code the append writes is NaN (it saturates), and -0 stays -0.
            _ => kv_cache
                .to_dtype(DType::F32)?
                .flatten_all()?
                .to_vec1::<f32>()?
                .into_iter()
                .map(|x| Fp8Format::E4m3.encode(x))
                .collect(),
        };
        assert_eq!(codes.len(), expected.len());
        let wrong = codes.iter().zip(&expected).position(|(a, b)| a != b);
        assert_eq!(wrong, None, "{what}: first wrong code (got {:?})", wrong.map(|i| (codes[i], expected[i])));

        let table: Vec<i32> =
            (0..b).flat_map(|s| (0..per_seq).map(|p| order[s * per_seq + p] as i32).collect::<Vec<_>>()).collect();
        let seq_lens: Vec<i32> = lens.iter().map(|&n| n as i32).collect();
        let q = random(&[b, hq, d], -1.0, 1.0, DType::BF16, &mut rng)?;
        let limits = DecodeProblem { batch: b, heads_q: hq, heads_kv: hkv, head_dim: d, max_seq_len };
        let mut ws = fa::decode_workspace(&Device::Cpu, &limits, Some(2))?;
        let block_table = Tensor::from_vec(table.clone(), (b, per_seq), &Device::Cpu)?;
        let seq_lens_t = Tensor::from_vec(seq_lens.clone(), b, &Device::Cpu)?;
        let (o, lse) =
            fa::paged_decode_opts(&q, &kv_cache, &block_table, &seq_lens_t, max_seq_len, scale, &opts, &mut ws)?;

        // The reference over host views of the same codes, with the given (or other) scales.
        fn judge<C: Fp8Element>(
            codes: &[u8],
            shape: [usize; 4],
            scales: &KvScales,
            views: (&[i32], &[i32], usize, usize),
            (q, o, lse): (&[bf16], &[bf16], &[f32]),
            scale: f32,
        ) -> fused_attn::reference::Check {
            let (table, seq_lens, per_seq, max_seq_len) = views;
            let codes: Vec<C> = codes.iter().map(|&c| C::from_code(c)).collect();
            let (k, v) = codes.split_at(codes.len() / 2);
            let b = seq_lens.len();
            let cache = PagedKvCache::new(
                TensorView::host(k, shape).unwrap(),
                TensorView::host(v, shape).unwrap(),
                TensorView::host(table, [b, per_seq]).unwrap(),
                TensorView::host(seq_lens, [b]).unwrap(),
                max_seq_len,
            )
            .unwrap()
            .with_scales(scales)
            .unwrap();
            let [hq, d] = [o.len() / b / shape[3], shape[3]];
            let opts = DecodeOptions { scale: Some(scale), ..Default::default() };
            check_decode(
                &TensorView::host(q, [b, hq, d]).unwrap(),
                &cache,
                &TensorView::host(o, [b, hq, d]).unwrap(),
                Some(&TensorView::host(lse, [b, hq]).unwrap()),
                &opts,
            )
            .unwrap()
        }
        let (qh, oh, lseh) = (
            q.flatten_all()?.to_vec1::<bf16>()?,
            o.flatten_all()?.to_vec1::<bf16>()?,
            lse.flatten_all()?.to_vec1::<f32>()?,
        );
        let shape = [num_pages, page, hkv, d];
        let views = (&table[..], &seq_lens[..], per_seq, max_seq_len);
        let run = |scales: &KvScales| match format {
            Fp8Format::E4m3 => judge::<Fp8E4m3>(&codes, shape, scales, views, (&qh, &oh, &lseh), scale),
            Fp8Format::E5m2 => judge::<Fp8E5m2>(&codes, shape, scales, views, (&qh, &oh, &lseh), scale),
        };
        let right = run(&KvScales::per_head(&emu, &k_scales, &v_scales)?);
        assert!(right.passed(), "{what}: {right}");
        let doubled: Vec<f32> = v_scales.iter().map(|s| 2.0 * s).collect();
        let other = KvScales::per_head(&emu, &vec![k_scales[0]; hkv], &vec![doubled[0]; hkv])?;
        assert!(!run(&other).passed(), "{what}: the decode also passes against other V scales");
    }

    // Errors: what is missing or mismatched, named.
    let err = |r: Result<()>| r.err().map(|e| e.to_string()).unwrap_or_default();
    let k = random(&[2, hkv, d], -1.0, 1.0, DType::BF16, &mut rng)?;
    let slots = Tensor::new(&[0i64, 1], &Device::Cpu)?;
    let u8_cache = Tensor::zeros((2, 2, page, hkv, d), DType::U8, &Device::Cpu)?;
    let msg = err(fa::paged_append(&k, &k, &slots, &u8_cache));
    assert!(msg.starts_with("Unsupported error: kv_cache: dtype U8 holds FP8 codes"), "{msg}");
    let e5m2 = fa::Fp8Kv::per_tensor(&Device::Cpu, Fp8Format::E5m2, 0.01, 0.01)?;
    let opts = fa::PagedOptions { fp8: Some(&e5m2), ..Default::default() };
    let e4m3_cache = u8_cache.to_dtype(DType::F8E4M3)?;
    let msg = err(fa::paged_append_opts(&k, &k, &slots, &e4m3_cache, &opts));
    assert!(msg.starts_with("Unsupported error: kv_cache: dtype F8E4M3, expected u8 (E5M2 codes"), "{msg}");
    let bf16_cache = u8_cache.to_dtype(DType::BF16)?;
    let msg = err(fa::paged_append_opts(&k, &k, &slots, &bf16_cache, &opts));
    assert!(msg.starts_with("Unsupported error: kv_cache: dtype BF16, expected u8"), "{msg}");
    let bad = fa::Fp8Kv::per_tensor(&Device::Cpu, Fp8Format::E4m3, 0.0, 1.0).err().map(|e| e.to_string());
    assert!(bad.as_deref().unwrap_or("").starts_with("Unsupported error: k_scale"), "{bad:?}");
    Ok(())
}

/// FP8 scales an engine keeps as candle tensors (`Fp8Kv::from_tensors`: f32 `[]`, `[1]` or `[Hkv]`): append
/// and decode give bit for bit what the host-float constructors give for the same values; values written
/// into the same tensors in place (`slice_set`) between two calls are the ones the second call uses (the ops
/// read them when they run); bad scale tensors are typed errors naming them.
#[test]
fn fp8_scale_tensors_through_the_candle_ops() -> Result<()> {
    use fused_attn::Fp8Format;

    let mut rng = StdRng::seed_from_u64(29);
    let (hq, hkv, d, page, b, per_seq, n) = (4, 2, 64, 16, 2, 3, 40);
    let (num_pages, max_seq_len) = (b * per_seq, per_seq * page);
    let dev = Device::Cpu;
    let block_table = Tensor::from_vec((0..num_pages as i32).collect::<Vec<_>>(), (b, per_seq), &dev)?;
    let seq_lens = Tensor::from_vec(vec![n as i32; b], b, &dev)?;
    let slots: Vec<i64> = (0..b).flat_map(|s| (0..n).map(move |t| (s * per_seq * page + t) as i64)).collect();
    let slots = Tensor::from_vec(slots, b * n, &dev)?;
    let k = random(&[b * n, hkv, d], -1.0, 1.0, DType::BF16, &mut rng)?;
    let v = random(&[b * n, hkv, d], -0.5, 1.5, DType::BF16, &mut rng)?;
    let q = random(&[b, hq, d], -1.0, 1.0, DType::BF16, &mut rng)?;
    let limits = DecodeProblem { batch: b, heads_q: hq, heads_kv: hkv, head_dim: d, max_seq_len };
    // Append into a fresh U8 cache, then decode from it: the codes, o and the LSE as bits.
    let run = |fp8: &fa::Fp8Kv| -> Result<(Vec<u8>, Vec<u16>, Vec<u32>)> {
        let cache = Tensor::zeros((2, num_pages, page, hkv, d), DType::U8, &dev)?;
        let opts = fa::PagedOptions { fp8: Some(fp8), ..Default::default() };
        fa::paged_append_opts(&k, &v, &slots, &cache, &opts)?;
        let mut ws = fa::decode_workspace(&dev, &limits, Some(2))?;
        let (o, lse) = fa::paged_decode_opts(&q, &cache, &block_table, &seq_lens, max_seq_len, 0.125, &opts, &mut ws)?;
        let o: Vec<u16> = o.flatten_all()?.to_vec1::<half::bf16>()?.iter().map(|x| x.to_bits()).collect();
        assert!(o.iter().all(|&x| !half::bf16::from_bits(x).is_nan()), "NaN left in o");
        let lse = lse.flatten_all()?.to_vec1::<f32>()?.iter().map(|x| x.to_bits()).collect();
        Ok((cache.flatten_all()?.to_vec1::<u8>()?, o, lse))
    };
    let e4m3 = Fp8Format::E4m3;
    // Per tensor, as 0-d tensors (vLLM's layer.k_scale) and as [1].
    let host = run(&fa::Fp8Kv::per_tensor(&dev, e4m3, 0.01, 0.02)?)?;
    let scalar = fa::Fp8Kv::from_tensors(e4m3, &Tensor::new(0.01f32, &dev)?, &Tensor::new(0.02f32, &dev)?)?;
    assert!(run(&scalar)? == host, "0-d scale tensors differ from per_tensor");
    let one = fa::Fp8Kv::from_tensors(e4m3, &Tensor::new(&[0.01f32], &dev)?, &Tensor::new(&[0.02f32], &dev)?)?;
    assert!(run(&one)? == host, "[1] scale tensors differ from per_tensor");
    // Per KV head, then rewritten in place.
    let (ks, vs) = (Tensor::new(&[0.01f32, 0.017], &dev)?, Tensor::new(&[0.02f32, 0.013], &dev)?);
    let fp8 = fa::Fp8Kv::from_tensors(e4m3, &ks, &vs)?;
    let before = run(&fp8)?;
    assert!(before == run(&fa::Fp8Kv::per_head(&dev, e4m3, &[0.01, 0.017], &[0.02, 0.013])?)?, "[Hkv] tensors");
    ks.slice_set(&Tensor::new(&[0.006f32, 0.03], &dev)?, 0, 0)?;
    vs.slice_set(&Tensor::new(&[0.011f32, 0.025], &dev)?, 0, 0)?;
    let after = run(&fp8)?;
    assert!(after == run(&fa::Fp8Kv::per_head(&dev, e4m3, &[0.006, 0.03], &[0.011, 0.025])?)?, "rewritten scales");
    assert!(after != before, "rewriting the scale tensors changed nothing");

    // Errors, named.
    let msg = |r: Result<fa::Fp8Kv>| r.err().map(|e| e.to_string()).unwrap_or_default();
    let f16 = Tensor::new(&[0.01f32, 0.02], &dev)?.to_dtype(DType::F16)?;
    assert!(msg(fa::Fp8Kv::from_tensors(e4m3, &f16, &vs)).starts_with("Unsupported error: k_scale: dtype F16"));
    let matrix = Tensor::new(&[[0.01f32], [0.02]], &dev)?;
    assert!(msg(fa::Fp8Kv::from_tensors(e4m3, &ks, &matrix)).starts_with("Shape error: v_scale: shape [2, 1]"));
    let single = Tensor::new(&[0.02f32], &dev)?;
    assert!(msg(fa::Fp8Kv::from_tensors(e4m3, &ks, &single)).starts_with("Shape error: v_scale"));
    let three = Tensor::new(&[0.01f32, 0.02, 0.03], &dev)?;
    let wrong_count = fa::Fp8Kv::from_tensors(e4m3, &three, &three)?;
    let e = run(&wrong_count).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(e.starts_with("Shape error: k_scale: length 3 for a cache of 2 KV heads"), "{e}");
    Ok(())
}

/// MLA decode as a candle op: against candle's attention composition over the gathered latent rows (K = the
/// 576-column rows, V = their first 512 columns, one KV head shared by every query head), bf16 and f16, a
/// 16-bit cache and an E4M3 one (its codes stored as U8 and as candle's F8E4M3; one scale as K's and V's).
#[test]
fn mla_decode_matches_candle_attention() -> Result<()> {
    use fused_attn::mla::MlaDims;
    use fused_attn::{DecodeWorkspace, Fp8Format};

    let mut rng = StdRng::seed_from_u64(29);
    let (page, rank, rope) = (16, 512, 64);
    let row = rank + rope;
    let lens = [5usize, 70];
    let per_seq = 5;
    let num_pages = lens.len() * per_seq;
    let max_seq_len = 70;
    let scale = 1.0 / 192f64.sqrt();
    let emu = fused_attn::Stream::Emu(fa::emulator());
    for (dtype, hq, storage) in [
        (DType::BF16, 16, None),
        (DType::F16, 32, None),
        (DType::BF16, 16, Some(DType::U8)),
        (DType::F16, 16, Some(DType::F8E4M3)),
    ] {
        let what = format!("mla {dtype:?} Hq={hq} cache {storage:?}");
        // Sequence s owns pages s * per_seq .. in shuffled order (the table says which).
        let mut table: Vec<u32> = Vec::new();
        for s in 0..lens.len() {
            let mut ids: Vec<u32> = (0..per_seq).map(|p| (s * per_seq + p) as u32).collect();
            ids.shuffle(&mut rng);
            table.extend(ids);
        }
        let values16 = random(&[num_pages, page, 1, row], -1.0, 1.0, dtype, &mut rng)?;
        let fp8_scale = 1.0f32 / 256.0 * 1.1;
        let fp8 =
            storage.map(|_| fa::Fp8Kv::per_tensor(&Device::Cpu, Fp8Format::E4m3, fp8_scale, fp8_scale)).transpose()?;
        // The cache the op reads, and the values it stands for (FP8: the codes' values times the scale).
        let (cache, stored) = match storage {
            None => (values16.clone(), values16.to_dtype(DType::F64)?),
            Some(st) => {
                let codes: Vec<u8> =
                    values(&values16).iter().map(|&x| Fp8Format::E4m3.encode(x as f32 / fp8_scale)).collect();
                let stored: Vec<f64> =
                    codes.iter().map(|&c| Fp8Format::E4m3.decode(c) * f64::from(fp8_scale)).collect();
                let cache = match st {
                    DType::U8 => Tensor::from_vec(codes, (num_pages, page, 1, row), &Device::Cpu)?,
                    _ => Tensor::from_vec(
                        codes.iter().map(|&c| Fp8Format::E4m3.decode(c) as f32).collect::<Vec<_>>(),
                        (num_pages, page, 1, row),
                        &Device::Cpu,
                    )?
                    .to_dtype(st)?,
                };
                (cache, Tensor::from_vec(stored, (num_pages, page, 1, row), &Device::Cpu)?)
            }
        };
        let b = lens.len();
        let q = random(&[b, hq, row], -1.0, 1.0, dtype, &mut rng)?;
        let table_t = Tensor::from_vec(table.clone(), (b, per_seq), &Device::Cpu)?;
        let lens_t = Tensor::from_vec(lens.iter().map(|&l| l as u32).collect::<Vec<_>>(), b, &Device::Cpu)?;
        let mut ws = DecodeWorkspace::with_capacity(&emu, b, hq, rank, 8)?;
        let (o, lse) = fa::mla_decode(
            &q,
            &cache,
            &table_t,
            &lens_t,
            max_seq_len,
            scale as f32,
            MlaDims::default(),
            fp8.as_ref(),
            &mut ws,
        )?;
        assert_eq!((o.dims(), lse.dims()), (&[b, hq, rank][..], &[b, hq][..]), "{what}");
        let (mut reference, mut naive) = (Vec::new(), Vec::new());
        for (s, &n) in lens.iter().enumerate() {
            let rows: Vec<Tensor> =
                (0..n).map(|j| stored.i((table[s * per_seq + j / page] as usize, j % page))).collect::<Result<_>>()?;
            let k = Tensor::stack(&rows, 0)?.unsqueeze(0)?; // [1, n, 1, row]
            let v = k.narrow(3, 0, rank)?;
            // V padded to the row's width so candle's composition takes one head dim; its rope columns are 0.
            let v = Tensor::cat(&[v.clone(), Tensor::zeros((1, n, 1, rope), DType::F64, &Device::Cpu)?], 3)?;
            let qs = q.i(s)?.unsqueeze(0)?.unsqueeze(0)?; // [1, 1, Hq, row]
            for (dt, out) in [(DType::F64, &mut reference), (dtype, &mut naive)] {
                let a = candle_attention(&qs, &k, &v, scale, false, dt)?.squeeze(0)?.squeeze(0)?;
                out.push(a.narrow(1, 0, rank)?);
            }
        }
        check(&what, &o, &Tensor::stack(&reference, 0)?, &Tensor::stack(&naive, 0)?);
        assert!(values(&lse).iter().all(|x| x.is_finite()), "{what}: lse");
    }
    Ok(())
}

/// Paged ops over a K cache and a V cache of their own widths (DeepSeek's Dqk 192 / Dv 128, and Dv above
/// Dqk): `paged_append_kv` writes K rows of Dqk into `k_cache [pages, 16, Hkv, Dqk]` and V rows of Dv into
/// `v_cache [pages, 16, Hkv, Dv]` (exactly the slots; the others keep their NaN), `paged_decode_kv` reads
/// them into `o [B, Hq, Dv]` (split and not), held to the tolerance rule against candle's own attention
/// composition over each sequence's contiguous K and V; an FP8 (E4M3) pair of caches round-trips; a V
/// cache that shares storage with the K cache (two halves of one tensor) is a Usage error naming v_cache.
#[test]
fn paged_ops_with_a_v_head_dim_of_their_own_match_candle_attention() -> Result<()> {
    let mut rng = StdRng::seed_from_u64(2727);
    let page = 16;
    for (dtype, hq, hkv, d, dv, lens) in
        [(DType::BF16, 8, 2, 192, 128, vec![1usize, 17, 300]), (DType::F16, 4, 1, 64, 128, vec![45, 0, 9])]
    {
        let b = lens.len();
        let per_seq = lens.iter().max().copied().unwrap_or(1).div_ceil(page);
        let num_pages = b * per_seq + 1;
        let mut order: Vec<usize> = (0..num_pages).collect();
        order.shuffle(&mut rng);
        let phys = |s: usize, p: usize| order[s * per_seq + p];
        let nan = |dims: (usize, usize, usize, usize)| Tensor::ones(dims, dtype, &Device::Cpu)? * f64::NAN;
        let (k_cache, v_cache) = (nan((num_pages, page, hkv, d))?, nan((num_pages, page, hkv, dv))?);
        let mut kv = Vec::new();
        for (s, &n) in lens.iter().enumerate() {
            let k = random(&[n, hkv, d], -1.0, 1.0, dtype, &mut rng)?;
            let v = random(&[n, hkv, dv], -0.5, 1.5, dtype, &mut rng)?;
            let slots: Vec<i64> = (0..n).map(|t| (phys(s, t / page) * page + t % page) as i64).collect();
            let slots = Tensor::from_vec(slots, n, &Device::Cpu)?;
            fa::paged_append_kv(&k, &v, &slots, &k_cache, &v_cache, &Default::default())?;
            kv.push((k, v));
        }
        // Exactly the slots: each token's rows where the table puts them, NaN in every other slot.
        let mut written = 0;
        for page_id in 0..num_pages {
            for slot in 0..page {
                let owner = lens.iter().enumerate().find_map(|(s, &n)| {
                    (0..n).find(|&t| phys(s, t / page) == page_id && t % page == slot).map(|t| (s, t))
                });
                let (kr, vr) = (values(&k_cache.i((page_id, slot))?), values(&v_cache.i((page_id, slot))?));
                assert_eq!((kr.len(), vr.len()), (hkv * d, hkv * dv));
                match owner {
                    Some((s, t)) => {
                        assert_eq!((kr, vr), (values(&kv[s].0.i(t)?), values(&kv[s].1.i(t)?)), "seq {s} token {t}");
                        written += 1;
                    }
                    None => assert!(kr.iter().chain(&vr).all(|x| x.is_nan()), "page {page_id} slot {slot} written"),
                }
            }
        }
        assert_eq!(written, lens.iter().sum::<usize>());
        let table: Vec<i32> = (0..b).flat_map(|s| (0..per_seq).map(move |p| phys(s, p) as i32)).collect();
        let block_table = Tensor::from_vec(table, (b, per_seq), &Device::Cpu)?;
        let seq_lens = Tensor::from_vec(lens.iter().map(|&n| n as i32).collect::<Vec<_>>(), b, &Device::Cpu)?;
        let q = random(&[b, hq, d], -1.0, 1.0, dtype, &mut rng)?;
        let max_seq_len = *lens.iter().max().unwrap_or(&0);
        let limits = DecodeProblem { batch: b, heads_q: hq, heads_kv: hkv, head_dim: d.max(dv), max_seq_len };
        let scale = 1.0 / (d as f64).sqrt();
        for splits in [None, Some(3)] {
            let mut ws = fa::decode_workspace(&Device::Cpu, &limits, splits)?;
            let (o, lse) = fa::paged_decode_kv(
                &q,
                &k_cache,
                &v_cache,
                &block_table,
                &seq_lens,
                max_seq_len,
                scale as f32,
                &Default::default(),
                &mut ws,
            )?;
            assert_eq!((o.dims(), lse.dims()), (&[b, hq, dv][..], &[b, hq][..]));
            let (mut reference, mut naive) = (Vec::new(), Vec::new());
            for (s, (k, v)) in kv.iter().enumerate() {
                if lens[s] == 0 {
                    let zero = Tensor::zeros((hq, dv), DType::F64, &Device::Cpu)?;
                    reference.push(zero.clone());
                    naive.push(zero);
                    assert!(values(&o.i(s)?).iter().all(|&x| x == 0.0), "empty sequence: o = 0");
                    continue;
                }
                let (qs, k, v) = (q.i(s)?.unsqueeze(0)?.unsqueeze(0)?, k.unsqueeze(0)?, v.unsqueeze(0)?);
                reference.push(candle_attention(&qs, &k, &v, scale, false, DType::F64)?.squeeze(0)?.squeeze(0)?);
                naive.push(candle_attention(&qs, &k, &v, scale, false, dtype)?.squeeze(0)?.squeeze(0)?);
            }
            let what = format!("decode {dtype:?} Hq={hq} Hkv={hkv} {d}/{dv} lens={lens:?} splits={splits:?}");
            check(&what, &o, &Tensor::stack(&reference, 0)?, &Tensor::stack(&naive, 0)?);
        }
    }
    // FP8 codes (E4M3, per-tensor scales) in a K and a V cache of their own: the append quantises, the
    // decode dequantises, within the tolerance rule of the stored values against candle's composition.
    let (hq, hkv, d, dv, n) = (4, 2, 192, 128, 40);
    let fp8 = fa::Fp8Kv::per_tensor(&Device::Cpu, fused_attn::Fp8Format::E4m3, 0.004, 0.004)?;
    let opts = fa::PagedOptions { fp8: Some(&fp8), ..Default::default() };
    let (k_cache, v_cache) = (
        Tensor::zeros((3, page, hkv, d), DType::U8, &Device::Cpu)?,
        Tensor::zeros((3, page, hkv, dv), DType::U8, &Device::Cpu)?,
    );
    let k = random(&[n, hkv, d], -1.0, 1.0, DType::BF16, &mut rng)?;
    let v = random(&[n, hkv, dv], -0.5, 1.5, DType::BF16, &mut rng)?;
    let slots = Tensor::from_vec((0..n as i64).collect::<Vec<_>>(), n, &Device::Cpu)?;
    fa::paged_append_kv(&k, &v, &slots, &k_cache, &v_cache, &opts)?;
    let (table, lens) =
        (Tensor::from_vec(vec![0i32, 1, 2], (1, 3), &Device::Cpu)?, Tensor::new(&[n as i32], &Device::Cpu)?);
    let q = random(&[1, hq, d], -1.0, 1.0, DType::BF16, &mut rng)?;
    let limits = DecodeProblem { batch: 1, heads_q: hq, heads_kv: hkv, head_dim: d, max_seq_len: n };
    let mut ws = fa::decode_workspace(&Device::Cpu, &limits, None)?;
    let scale = 1.0 / (d as f64).sqrt();
    let (o, _) = fa::paged_decode_kv(&q, &k_cache, &v_cache, &table, &lens, n, scale as f32, &opts, &mut ws)?;
    assert_eq!(o.dims(), &[1, hq, dv]);
    // The stored values, dequantised: codes decoded times the scale.
    let stored = |c: &Tensor, dims: (usize, usize, usize)| -> Result<Tensor> {
        let codes: Vec<u8> = c.flatten_all()?.to_vec1()?;
        let vals: Vec<f64> = codes.iter().map(|&x| fused_attn::Fp8Format::E4m3.decode(x) * 0.004).collect();
        Tensor::from_vec(vals[..dims.0 * dims.1 * dims.2].to_vec(), dims, &Device::Cpu)?.to_dtype(DType::BF16)
    };
    let (ks, vs) = (stored(&k_cache, (n, hkv, d))?.unsqueeze(0)?, stored(&v_cache, (n, hkv, dv))?.unsqueeze(0)?);
    let qs = q.unsqueeze(0)?;
    let reference = candle_attention(&qs, &ks, &vs, scale, false, DType::F64)?.squeeze(0)?;
    let naive = candle_attention(&qs, &ks, &vs, scale, false, DType::BF16)?.squeeze(0)?;
    check("fp8 e4m3 decode 192/128", &o, &reference, &naive);
    // FP8 codes read as 16-bit data: Unsupported, naming the tensor that holds them.
    let k16 = Tensor::zeros((3, page, hkv, d), DType::BF16, &Device::Cpu)?;
    let no_fp8 = fa::PagedOptions::default();
    let e = fa::paged_decode_kv(&q, &k16, &v_cache, &table, &lens, n, scale as f32, &no_fp8, &mut ws).unwrap_err();
    assert!(e.to_string().starts_with("Unsupported error: v_cache: dtype U8 holds FP8 codes"), "{e}");
    // Two halves of one tensor are not two caches.
    let joint = Tensor::zeros((2, 3, page, hkv, d), DType::BF16, &Device::Cpu)?;
    let (kh, vh) = (joint.i(0)?, joint.i(1)?);
    let e = fa::paged_append_kv(&k.to_dtype(DType::BF16)?, &k, &slots, &kh, &vh, &Default::default()).unwrap_err();
    let msg = e.to_string();
    assert!(msg.starts_with("Usage error: v_cache") && msg.contains("shares its storage with k_cache"), "{msg}");
    Ok(())
}
