//! Multi-head latent attention in fp64 (docs/mla.md), in both of its forms:
//!
//! - **absorbed** ([`mla_decode`]): what the kernel computes. Query row `[q_lat | q_pe]` (`kv_lora_rank +
//!   rope_dim`) of head h attends over the cache rows `[c_j | k_pe_j]` with V = `c_j`; that is attention with
//!   one KV head of `kv_lora_rank + rope_dim` columns whose V rows are the K rows with the rope columns set to
//!   zero, so it runs through the same packed, causal, paged reference as paged prefill (bottom-right per
//!   sequence, masked holes, the naive low-precision twin and the arithmetic bound's terms).
//! - **un-absorbed** ([`mha_unabsorbed`]): the model's own multi-head attention: per head `k_j = [c_j W_UK_h |
//!   k_pe_j]`, `v_j = c_j W_UV_h`, `q = [q_nope_h | q_pe_h]`. With `q_lat_h = W_UK_h q_nope_h` ([`absorb_q`])
//!   and `o_h = o_lat_h W_UV_h` ([`unabsorb_o`]) the two are the same function (q·k = q_lat·c + q_pe·k_pe,
//!   and the softmax-weighted sum commutes with W_UV): the reference tests check it.

use super::{paged_prefill, Arith, ErrorTerms, Output, PagedCache, Variants};
use crate::error::{Error, Result};

/// MLA decode in the absorbed form over a paged latent cache (one KV head of `rank + rope` columns).
///
/// - `q`: `[total_q, Hq, rank + rope]`; `cu_seqlens_q`: `[B + 1]` (decode: `0, 1, .., B`); `cache`: the
///   latent cache (`heads_kv` 1, `head_dim` rank + rope), `B = seq_lens.len()`: the scores read `k_cache`'s
///   rows, V is the first `rank` columns of `v_cache`'s (the same slice for a 16-bit cache; an FP8 cache's
///   codes dequantised with the K and the V scale). Query token i of sequence b sees keys `j ≤ seq_len_b −
///   q_len_b + i`.
/// - Returns `out` `[total_q, Hq, rank]`, `lse` `[total_q, Hq]`, and for [`Arith::F64`] the bound's terms
///   (one per element of `out`).
pub fn mla_decode(
    kv_lora_rank: usize,
    heads_q: usize,
    scale: f64,
    ar: Arith,
    cu_seqlens_q: &[i32],
    q: &[f64],
    cache: &PagedCache<'_>,
) -> Result<Output> {
    let row = cache.head_dim;
    if cache.heads_kv != 1 || kv_lora_rank == 0 || kv_lora_rank > row {
        return Err(Error::shape(
            "cache",
            format!("{} heads x {row} columns is not a latent cache of rank {kv_lora_rank}", cache.heads_kv),
        ));
    }
    // V = the latent columns of the same rows: K with the rope columns zeroed, so O's rope columns are 0.
    if cache.v_cache.len() != cache.k_cache.len() {
        return Err(Error::shape("v_cache", "differs in length from k_cache (the same rows, dequantised for V)"));
    }
    let v: Vec<f64> =
        cache.v_cache.iter().enumerate().map(|(i, &x)| if i % row < kv_lora_rank { x } else { 0.0 }).collect();
    let c = PagedCache { v_cache: &v, ..*cache };
    let full = paged_prefill(heads_q, true, scale, &Variants::default(), ar, cu_seqlens_q, q, &c)?;
    let total_q = if heads_q == 0 { 0 } else { q.len() / (heads_q * row) };
    let mut out = Vec::with_capacity(total_q * heads_q * kv_lora_rank);
    let mut terms: Vec<ErrorTerms> = Vec::new();
    for r in 0..total_q * heads_q {
        out.extend_from_slice(&full.out[r * row..][..kv_lora_rank]);
        if !full.terms.is_empty() {
            terms.extend_from_slice(&full.terms[r * row..][..kv_lora_rank]);
        }
    }
    // [Hq, total_q] -> [total_q, Hq]
    let mut lse = vec![0.0; total_q * heads_q];
    for h in 0..heads_q {
        for t in 0..total_q {
            lse[t * heads_q + h] = full.lse[h * total_q + t];
        }
    }
    Ok(Output { out, lse, terms })
}

/// `q_lat[t, h, :] = W_UK[h] · q_nope[t, h, :]`: `w_uk` `[Hq, rank, d_nope]`, `q_nope` `[T, Hq, d_nope]` →
/// `[T, Hq, rank]`.
pub fn absorb_q(w_uk: &[f64], q_nope: &[f64], heads_q: usize, rank: usize, d_nope: usize) -> Vec<f64> {
    let t_n = q_nope.len() / (heads_q * d_nope);
    let mut out = vec![0.0; t_n * heads_q * rank];
    for t in 0..t_n {
        for h in 0..heads_q {
            let qn = &q_nope[(t * heads_q + h) * d_nope..][..d_nope];
            for r in 0..rank {
                let w = &w_uk[(h * rank + r) * d_nope..][..d_nope];
                out[(t * heads_q + h) * rank + r] = w.iter().zip(qn).map(|(a, b)| a * b).sum();
            }
        }
    }
    out
}

/// `o[t, h, :] = o_lat[t, h, :] · W_UV[h]`: `o_lat` `[T, Hq, rank]`, `w_uv` `[Hq, rank, d_v]` → `[T, Hq, d_v]`.
pub fn unabsorb_o(w_uv: &[f64], o_lat: &[f64], heads_q: usize, rank: usize, d_v: usize) -> Vec<f64> {
    let t_n = o_lat.len() / (heads_q * rank);
    let mut out = vec![0.0; t_n * heads_q * d_v];
    for t in 0..t_n {
        for h in 0..heads_q {
            let ol = &o_lat[(t * heads_q + h) * rank..][..rank];
            for (r, &x) in ol.iter().enumerate() {
                let w = &w_uv[(h * rank + r) * d_v..][..d_v];
                for (o, &wv) in out[(t * heads_q + h) * d_v..][..d_v].iter_mut().zip(w) {
                    *o += x * wv;
                }
            }
        }
    }
    out
}

/// The un-absorbed (model) form of one sequence's MLA, in fp64: `q_nope` `[T, Hq, d_nope]`, `q_pe` `[T, Hq,
/// rope]`, the latent rows `c` `[S, rank]` and `k_pe` `[S, rope]`, `w_uk` `[Hq, rank, d_nope]`, `w_uv` `[Hq,
/// rank, d_v]`. Query token i sees keys `j ≤ S − T + i`. Returns `o` `[T, Hq, d_v]` and `lse` `[T, Hq]`.
#[allow(clippy::too_many_arguments)]
pub fn mha_unabsorbed(
    heads_q: usize,
    (rank, rope, d_nope, d_v): (usize, usize, usize, usize),
    scale: f64,
    q_nope: &[f64],
    q_pe: &[f64],
    c: &[f64],
    k_pe: &[f64],
    w_uk: &[f64],
    w_uv: &[f64],
) -> (Vec<f64>, Vec<f64>) {
    let tq = q_nope.len() / (heads_q * d_nope);
    let s = c.len() / rank;
    let mut o = vec![0.0; tq * heads_q * d_v];
    let mut lse = vec![f64::NEG_INFINITY; tq * heads_q];
    for h in 0..heads_q {
        // Per-head keys and values: k_nope_j = W_UK[h]ᵀ c_j (d_nope), v_j = W_UV[h]ᵀ c_j (d_v).
        let proj = |w: &[f64], d: usize, j: usize| -> Vec<f64> {
            (0..d).map(|e| (0..rank).map(|r| c[j * rank + r] * w[(h * rank + r) * d + e]).sum()).collect()
        };
        let k_nope: Vec<Vec<f64>> = (0..s).map(|j| proj(w_uk, d_nope, j)).collect();
        let v: Vec<Vec<f64>> = (0..s).map(|j| proj(w_uv, d_v, j)).collect();
        for i in 0..tq {
            let visible = (s + i + 1).saturating_sub(tq).min(s);
            if visible == 0 {
                continue;
            }
            let qn = &q_nope[(i * heads_q + h) * d_nope..][..d_nope];
            let qp = &q_pe[(i * heads_q + h) * rope..][..rope];
            let scores: Vec<f64> = (0..visible)
                .map(|j| {
                    let nope: f64 = qn.iter().zip(&k_nope[j]).map(|(a, b)| a * b).sum();
                    let pe: f64 = qp.iter().zip(&k_pe[j * rope..][..rope]).map(|(a, b)| a * b).sum();
                    (nope + pe) * scale
                })
                .collect();
            let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let sum: f64 = scores.iter().map(|x| (x - m).exp()).sum();
            let out = &mut o[(i * heads_q + h) * d_v..][..d_v];
            for (j, x) in scores.iter().enumerate() {
                let w = (x - m).exp() / sum;
                for (oe, ve) in out.iter_mut().zip(&v[j]) {
                    *oe += w * ve;
                }
            }
            lse[i * heads_q + h] = m + sum.ln();
        }
    }
    (o, lse)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deterministic pseudo-random stream in [-1, 1).
    fn values(n: usize, seed: u64) -> Vec<f64> {
        let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 11) as f64 / (1u64 << 52) as f64 - 1.0
            })
            .collect()
    }

    /// The absorbed form (through the paged reference, pages shuffled) equals the model's multi-head form on
    /// small dims, for one and several query tokens (causal offsets).
    #[test]
    fn absorbed_equals_unabsorbed() {
        let (hq, rank, rope, d_nope, d_v) = (4, 16, 8, 12, 10);
        let row = rank + rope;
        for (case, (s, tq, page)) in
            [(9usize, 1usize, 4usize), (13, 3, 1), (7, 2, 16), (2, 4, 2)].into_iter().enumerate()
        {
            let seed = 100 + case as u64;
            let c = values(s * rank, seed);
            let k_pe = values(s * rope, seed + 1);
            let q_nope = values(tq * hq * d_nope, seed + 2);
            let q_pe = values(tq * hq * rope, seed + 3);
            let w_uk = values(hq * rank * d_nope, seed + 4);
            let w_uv = values(hq * rank * d_v, seed + 5);
            let scale = 1.0 / ((d_nope + rope) as f64).sqrt();
            let (o_mha, lse_mha) =
                mha_unabsorbed(hq, (rank, rope, d_nope, d_v), scale, &q_nope, &q_pe, &c, &k_pe, &w_uk, &w_uv);

            // The latent cache, its pages in reverse order; q = [W_UK q_nope | q_pe].
            let pages = s.div_ceil(page);
            let mut cache = vec![f64::NAN; pages * page * row];
            let table: Vec<i32> = (0..pages).map(|p| (pages - 1 - p) as i32).collect();
            for j in 0..s {
                let at = ((table[j / page] as usize) * page + j % page) * row;
                cache[at..at + rank].copy_from_slice(&c[j * rank..][..rank]);
                cache[at + rank..at + row].copy_from_slice(&k_pe[j * rope..][..rope]);
            }
            // NaN in the unused slots of the last page: hidden, never read.
            let q_lat = absorb_q(&w_uk, &q_nope, hq, rank, d_nope);
            let mut q = Vec::with_capacity(tq * hq * row);
            for r in 0..tq * hq {
                q.extend_from_slice(&q_lat[r * rank..][..rank]);
                q.extend_from_slice(&q_pe[r * rope..][..rope]);
            }
            let seq_lens = [s as i32];
            let pc = PagedCache {
                k_cache: &cache,
                v_cache: &cache,
                num_pages: pages,
                page_size: page,
                heads_kv: 1,
                head_dim: row,
                head_dim_v: row,
                block_table: &table,
                max_pages_per_seq: pages,
                seq_lens: &seq_lens,
            };
            let abs = mla_decode(rank, hq, scale, Arith::F64, &[0, tq as i32], &q, &pc).unwrap();
            let o_abs = unabsorb_o(&w_uv, &abs.out, hq, rank, d_v);
            let err = o_abs.iter().zip(&o_mha).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
            assert!(err < 1e-12, "case {case}: max |absorbed - unabsorbed| = {err:e}");
            for (a, b) in abs.lse.iter().zip(&lse_mha) {
                assert!((a - b).abs() < 1e-12 || (a.is_infinite() && a == b), "case {case}: lse {a} vs {b}");
            }
            // Causal offsets really bite: token 0 of a multi-token case sees fewer keys than the last.
            if tq > 1 {
                assert_ne!(abs.lse[0], abs.lse[(tq - 1) * hq]);
            }
        }
    }
}
