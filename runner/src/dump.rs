//! `run --dump DIR`: every input and output of the run as .npy (C order, little-endian), so an outside tool
//! can check the result independently. fp16 tensors are float16; bf16 tensors are float32 holding exactly
//! the bf16 values; lse float32; integer tables int32. Layouts (docs/semantics.md):
//! - prefill: q [B, Tq, Hq, D], k / v [B, Tk, Hkv, D], out [B, Tq, Hq, D], lse [B, Hq, Tq]; with RoPE the
//!   table (rope_cos / rope_sin) and rope_positions [B, Tq], rope_k_positions [B, Tk] (q and k unrotated);
//! - decode: q [B, Hq, D], k_cache / v_cache [num_pages, page_size, Hkv, D] (NaN in slots no sequence
//!   owns), block_table [B, max_pages_per_seq], seq_lens [B], k / v [B, max(seq_lens), Hkv, D] (the
//!   cache gathered through the block table, zero past each seq_len), out [B, Hq, D], lse [B, Hq].
//!   With a V head dim of its own (--head-dim-v Dv), v_cache, v and out have Dv columns (q, k_cache and k
//!   D), here and for paged-prefill and append;
//!   An FP8 cache (--kv-dtype fp8_*): k_cache / v_cache and k / v are float32 holding the stored FP8 values
//!   (before scaling; NaN in unowned slots), and k_scale.npy / v_scale.npy float32 [1] or [Hkv] the
//!   dequantisation scales: the values attention used are k_cache * k_scale[h] (v likewise);
//! - paged-prefill: q [B, Tq, Hq, D], out [B, Tq, Hq, D], lse [B, Hq, Tq], and the cache, block_table,
//!   seq_lens, k and v as for decode (seq_lens include the Tq new tokens); an FP8 cache as for decode;
//! - append: k [N, Hkv, D] / v [N, Hkv, Dv] (unrotated), slot_mapping [N] int64, rope_positions [N] and the table with
//!   RoPE, k_cache / v_cache [num_pages, page_size, Hkv, D] after the append (NaN in unwritten slots; FP8 as
//!   float32 stored values, with k_scale / v_scale);
//! - mla-decode: q [total_q, Hq, rank + rope], latent_cache [num_pages, page_size, 1, rank + rope] (FP8:
//!   float32 stored values with latent_scale [1]), block_table, seq_lens, cu_seqlens_q [B + 1], out
//!   [total_q, Hq, rank], lse [total_q, Hq].

use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};

use fused_attn::testkit::cases::append::{AppendFixture, AppendOutputs};
use fused_attn::testkit::cases::decode::DecodeRun;
use fused_attn::testkit::cases::kv::PagedHost;
use fused_attn::testkit::cases::mla::MlaRun;
use fused_attn::testkit::cases::paged_prefill::PagedPrefillRun;
use fused_attn::testkit::cases::prefill::{PrefillFixture, PrefillOutputs};
use fused_attn::testkit::rope::PoisonedTable;
use fused_attn::{DType, Element, Error, Result};

use npyz::WriterBuilder;

/// Element encodings the dumps use: float16 as '<f2', bf16 exactly widened to '<f4', and the integer tables.
enum NpyData<'a> {
    F16(Vec<fused_attn::half::f16>),
    F32(Vec<f32>),
    I32(&'a [i32]),
    I64(&'a [i64]),
}

/// Writes `data` as a C-order little-endian .npy of `shape` (format 1.0, header padded to 64 bytes).
fn write_npy<T: npyz::AutoSerialize + Copy>(path: &Path, shape: &[usize], data: &[T]) -> std::io::Result<()> {
    let shape: Vec<u64> = shape.iter().map(|&d| d as u64).collect();
    let file = BufWriter::new(File::create(path)?);
    let mut w = npyz::WriteOptions::new().default_dtype().shape(&shape).writer(file).begin_nd()?;
    w.extend(data.iter().copied())?;
    w.finish()
}

pub struct Dump {
    dir: PathBuf,
}

/// Values of a 16-bit tensor in its .npy encoding.
fn encode(dtype: DType, vals: impl Iterator<Item = f64>) -> NpyData<'static> {
    match dtype {
        DType::F16 => NpyData::F16(vals.map(fused_attn::half::f16::from_f64).collect()),
        DType::Bf16 => NpyData::F32(vals.map(|x| x as f32).collect()),
    }
}

impl Dump {
    pub fn new(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::usage(format!("--dump: cannot create {}: {e}", dir.display())))?;
        Ok(Self { dir: dir.to_path_buf() })
    }

    fn write(&self, name: &str, shape: &[usize], data: NpyData<'_>) -> Result<()> {
        let path = self.dir.join(format!("{name}.npy"));
        match data {
            NpyData::F16(d) => write_npy(&path, shape, &d),
            NpyData::F32(d) => write_npy(&path, shape, &d),
            NpyData::I32(d) => write_npy(&path, shape, d),
            NpyData::I64(d) => write_npy(&path, shape, d),
        }
        .map_err(|e| Error::usage(format!("--dump: cannot write {}: {e}", path.display())))
    }

    pub fn prefill<T: Element>(&self, f: &PrefillFixture<T>, out: &PrefillOutputs<T>) -> Result<()> {
        let dt = T::DTYPE;
        for (name, place) in [("q", &f.q), ("k", &f.k), ("v", &f.v)] {
            self.write(name, &place.shape, encode(dt, f.logical(place).into_iter()))?;
        }
        self.write("out", &f.o.shape, encode(dt, f.logical_o(out).into_iter()))?;
        let [b, tq, hq, _] = f.q.shape;
        let lse = f.logical_lse(out).unwrap_or_else(|| vec![f32::NAN; b * hq * tq]);
        self.variants(&f.alibi_slopes, &f.sinks, b, hq)?;
        // RoPE on q and k: each query row's and each key's position (q and k are written unrotated).
        if f.rope_table.is_some() {
            let (qp, kp) = f.rope_positions();
            let narrow = |p: Vec<i64>| p.into_iter().map(|x| x as i32).collect::<Vec<i32>>();
            self.rope(f.rope_table.as_ref(), &narrow(qp), &[b, tq])?;
            if f.case.rope_k {
                let tk = f.k.shape[1];
                self.write("rope_k_positions", &[b, tk], NpyData::I32(&narrow(kp)))?;
            }
        }
        self.write("lse", &[b, hq, tq], NpyData::F32(lse))
    }

    /// alibi_slopes.npy ([Hq], or [B, Hq] per sequence) and sinks.npy ([Hq]) float32, when the case has them.
    fn variants(&self, slopes: &[f32], sinks: &[f32], batch: usize, heads_q: usize) -> Result<()> {
        if !slopes.is_empty() {
            let shape = if slopes.len() == heads_q { vec![heads_q] } else { vec![batch, heads_q] };
            self.write("alibi_slopes", &shape, NpyData::F32(slopes.to_vec()))?;
        }
        if !sinks.is_empty() {
            self.write("sinks", &[heads_q], NpyData::F32(sinks.to_vec()))?;
        }
        Ok(())
    }

    /// RoPE (`--rope-theta`): the table the kernel read (NaN in the rows no position addresses and in the
    /// 3 columns past rotary_dim/2) and each rotated row's position, shaped `positions_shape` (q is written
    /// unrotated).
    fn rope(&self, table: Option<&PoisonedTable>, positions: &[i32], positions_shape: &[usize]) -> Result<()> {
        let Some(t) = table else { return Ok(()) };
        self.write("rope_cos", &t.shape(), NpyData::F32(t.cos.clone()))?;
        self.write("rope_sin", &t.shape(), NpyData::F32(t.sin.clone()))?;
        self.write("rope_positions", positions_shape, NpyData::I32(positions))
    }

    /// `--op append`: the unrotated inputs k / v `[N, Hkv, D]`, slot_mapping `[N]` (int64), with RoPE the
    /// table and rope_positions `[N]` (each token's position), the FP8 scales, and the caches after the
    /// append, k_cache / v_cache `[num_pages, page_size, Hkv, D]` (stored values: 16-bit in their encoding,
    /// FP8 as float32 before scaling; NaN in every slot no new token owns).
    pub fn append<T: Element>(&self, f: &AppendFixture<T>, out: &AppendOutputs) -> Result<()> {
        let dt = T::DTYPE;
        let (n, hkv, d, dv) = (f.slots.len(), f.case.heads_kv, f.case.head_dim, f.case.dv());
        let vals = |x: &[T]| x.iter().map(|v| v.to_f64()).collect::<Vec<_>>();
        self.write("k", &[n, hkv, d], encode(dt, vals(&f.k).into_iter()))?;
        self.write("v", &[n, hkv, dv], encode(dt, vals(&f.v).into_iter()))?;
        self.write("slot_mapping", &[n], NpyData::I64(&f.slots))?;
        if f.rope_table.is_some() {
            self.rope(f.rope_table.as_ref(), &f.positions, &[n])?;
        }
        let cache = |x: &[f64]| match f.case.kv.fp8() {
            Some(_) => NpyData::F32(x.iter().map(|&v| v as f32).collect()),
            None => encode(dt, x.iter().copied()),
        };
        self.write("k_cache", &f.cache_shape, cache(&out.k_cache))?;
        self.write("v_cache", &f.v_cache_shape, cache(&out.v_cache))?;
        if !f.k_scales.is_empty() {
            self.write("k_scale", &[f.k_scales.len()], NpyData::F32(f.k_scales.clone()))?;
            self.write("v_scale", &[f.v_scales.len()], NpyData::F32(f.v_scales.clone()))?;
        }
        Ok(())
    }

    pub fn decode<T: Element>(&self, r: &DecodeRun<T>) -> Result<()> {
        let f = &r.fixture;
        let c = &f.case;
        let dt = T::DTYPE;
        let (b, hq, d) = (c.batch(), c.heads_q, c.head_dim);
        let vals = |x: &[T]| x.iter().map(|v| v.to_f64()).collect::<Vec<_>>();
        self.write("q", &[b, hq, d], encode(dt, vals(&f.q).into_iter()))?;
        self.paged_cache(&f.host())?;
        self.write("out", &[b, hq, c.dv()], encode(dt, vals(&r.o).into_iter()))?;
        self.variants(&f.alibi_slopes, &f.sinks, b, hq)?;
        let pos: Vec<i32> = match &c.rope {
            Some(r) if r.explicit_positions => f.rope_positions.clone(),
            _ => f.seq_lens.iter().map(|&n| (n - 1).max(0)).collect(),
        };
        self.rope(f.rope_table.as_ref(), &pos, &[b])?;
        self.write("lse", &[b, hq], NpyData::F32(r.lse.clone()))
    }

    /// MLA decode: q `[total_q, Hq, rank + rope]`, latent_cache `[num_pages, page_size, 1, rank + rope]`
    /// (16-bit values in their encoding, or an FP8 cache's stored values as float32 with latent_scale `[1]`:
    /// the values attention used are latent_cache * latent_scale; NaN in slots no sequence owns),
    /// block_table `[B, max_pages_per_seq]`, seq_lens `[B]`, cu_seqlens_q `[B + 1]`, out `[total_q, Hq,
    /// rank]`, lse `[total_q, Hq]`; softmax scale 1/sqrt(192).
    pub fn mla<T: Element>(&self, r: &MlaRun<T>) -> Result<()> {
        let f = &r.fixture;
        let c = &f.case;
        let dt = T::DTYPE;
        let (tq, hq, row, rank) = (c.total_q(), c.heads_q, c.dims.row_dim(), c.dims.kv_lora_rank);
        let vals = |x: &[T]| x.iter().map(|v| v.to_f64()).collect::<Vec<_>>();
        self.write("q", &[tq, hq, row], encode(dt, vals(&f.q).into_iter()))?;
        let shape = [f.num_pages, c.page_size, 1, row];
        match c.fp8 {
            None => self.write("latent_cache", &shape, encode(dt, vals(&f.cache16).into_iter()))?,
            Some(format) => {
                let stored: Vec<f32> = f.codes.iter().map(|&x| format.decode(x) as f32).collect();
                self.write("latent_cache", &shape, NpyData::F32(stored))?;
                self.write("latent_scale", &[1], NpyData::F32(vec![f.fp8_scale]))?;
            }
        }
        self.write("block_table", &[c.batch(), f.width], NpyData::I32(&f.table))?;
        self.write("seq_lens", &[c.batch()], NpyData::I32(&f.lens))?;
        self.write("cu_seqlens_q", &[c.batch() + 1], NpyData::I32(&f.cu))?;
        self.write("out", &[tq, hq, rank], encode(dt, vals(&r.o).into_iter()))?;
        self.write("lse", &[tq, hq], NpyData::F32(r.lse.clone()))
    }

    /// A paged cache's files: k_cache / v_cache as stored (16-bit values in their encoding, or an FP8
    /// cache's stored values as float32 with k_scale / v_scale), block_table, seq_lens, and k / v
    /// `[B, max(seq_lens), Hkv, D]` (v of Dv columns) gathered through the table (zero past each seq_len).
    fn paged_cache<T: Element>(&self, c: &PagedHost<'_, T>) -> Result<()> {
        let [_, ps, hkv, d] = c.shape;
        let dv = c.v_shape[3];
        let (kc, vc) = match c.fp8 {
            Some(f) => {
                self.write("k_scale", &[f.k_scale.len()], NpyData::F32(f.k_scale.clone()))?;
                self.write("v_scale", &[f.v_scale.len()], NpyData::F32(f.v_scale.clone()))?;
                f.stored()
            }
            None => {
                let vals = |x: &[T]| x.iter().map(|v| v.to_f64()).collect::<Vec<_>>();
                (vals(c.k_cache), vals(c.v_cache))
            }
        };
        let encoded = |x: Vec<f64>| match c.fp8 {
            None => encode(T::DTYPE, x.into_iter()),
            Some(_) => NpyData::F32(x.into_iter().map(|v| v as f32).collect()),
        };
        let b = c.seq_lens.len();
        let t = c.seq_lens.iter().map(|&n| n.max(0) as usize).max().unwrap_or(0);
        let (row, v_row) = (hkv * d, hkv * dv);
        let (mut k, mut v) = (vec![0.0; b * t * row], vec![0.0; b * t * v_row]);
        for i in 0..b {
            for j in 0..c.seq_lens[i] as usize {
                let slot = c.block_table[i * c.width + j / ps] as usize * ps + j % ps;
                let to = i * t + j;
                k[to * row..][..row].copy_from_slice(&kc[slot * row..][..row]);
                v[to * v_row..][..v_row].copy_from_slice(&vc[slot * v_row..][..v_row]);
            }
        }
        self.write("k_cache", &c.shape, encoded(kc))?;
        self.write("v_cache", &c.v_shape, encoded(vc))?;
        self.write("block_table", &[b, c.width], NpyData::I32(c.block_table))?;
        self.write("seq_lens", &[b], NpyData::I32(c.seq_lens))?;
        self.write("k", &[b, t, hkv, d], encoded(k))?;
        self.write("v", &[b, t, hkv, dv], encoded(v))
    }

    /// The runner's paged prefill: every sequence has the same Tq (the packed [B·Tq, Hq, D] is [B, Tq, Hq, D]).
    pub fn paged_prefill<T: Element>(&self, r: &PagedPrefillRun<T>) -> Result<()> {
        let f = &r.fixture;
        let c = &f.case;
        let dt = T::DTYPE;
        let (b, tq, hq, d) = (c.batch(), c.max_seqlen_q(), c.heads_q, c.head_dim);
        if c.total_q() != b * tq {
            return Err(Error::usage("--dump: paged-prefill dumps need the same Tq for every sequence"));
        }
        let vals = |x: &[T]| x.iter().map(|v| v.to_f64()).collect::<Vec<_>>();
        self.write("q", &[b, tq, hq, d], encode(dt, vals(&f.q).into_iter()))?;
        self.write("out", &[b, tq, hq, c.dv()], encode(dt, vals(&r.o).into_iter()))?;
        // lse [Hq, total_q] -> [B, Hq, Tq].
        let mut lse = vec![0f32; b * hq * tq];
        for i in 0..b {
            for h in 0..hq {
                for t in 0..tq {
                    lse[(i * hq + h) * tq + t] = r.lse[h * b * tq + i * tq + t];
                }
            }
        }
        self.write("lse", &[b, hq, tq], NpyData::F32(lse))?;
        self.paged_cache(&f.host())?;
        self.variants(&f.alibi_slopes, &f.sinks, b, hq)?;
        // Each query token's position [B, Tq]: explicit, or its place in the cache (seq_len − Tq + t).
        let pos: Vec<i32> = match &c.rope {
            Some(r) if r.explicit_positions => f.rope_positions.clone(),
            _ => f.seq_lens.iter().flat_map(|&n| (0..tq as i32).map(move |t| n - tq as i32 + t)).collect(),
        };
        self.rope(f.rope_table.as_ref(), &pos, &[b, tq])
    }
}
