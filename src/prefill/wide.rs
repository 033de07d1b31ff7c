//! Prefill past the tiled kernel's head dims (264–512: Gemma 4's global layers) on the decode kernel's
//! streaming path (issue 27).
//!
//! The sm_80 prefill kernel keeps each warp's 16 × D fp32 output in registers, which stops at D = 256 (O
//! alone is 128 registers there). The decode kernel at width 512 splits D over its four warps (128 output
//! columns each, the scores summed through shared memory: kernels/include/fa/decode/traits.cuh), and its
//! short-query path already runs many query rows per sequence with prefill's bottom-right semantics. So a
//! dense or varlen prefill at D > 256 runs there, unchanged in meaning:
//!  - the query rows: varlen's through `cu_seqlens_q` as paged prefill's; dense through the uniform rows of
//!    `FaDecodeParams` (`seqlen_q` rows per sequence placed by per-sequence strides, no copy);
//!  - K/V as a contiguous view of the cache descriptor (`FaPagedCache`, kernels/include/fa/paged_view.cuh):
//!    dense, page b = sequence b (`block_table` NULL, `page_size = Tk`); varlen, the "page" of sequence b is
//!    the row `cu_seqlens_k[b]` (`block_table = seq_lens = cu_seqlens_k`, cumulative lengths);
//!  - one split and the grid `(Hkv · row blocks, 1, B)`, so long prompts are not bound by the 65535 of grid y.
//!
//! Each CTA serves 16 packed (token, query head) rows of one KV head and reads every K/V byte of the keys
//! they see once from L2: per 16 rows the kernel moves 2·D·2 bytes per key through L2 for 4·16·D FLOPs, 16
//! FLOP per byte, so on an H200 (~10 TB/s of L2) it is L2-bound near 160 TFLOPS at best, against ~300+ for
//! the tiled kernel at D = 256: a prediction, not measured (docs/performance.md). RoPE on K is not fused
//! here (Unsupported): rotate K with [`crate::append`] or before the call.

use crate::error::{to_i32, Error, Result};
use crate::launch::Launch;
use crate::plan::decode_rows_per_cta;
use crate::sys;

/// Where the keys of a wide prefill are: dense `[B, Tk, Hkv, D]` or varlen `[total_k, Hkv, D]`.
pub(super) enum Keys {
    Dense,
    Varlen { total_k: usize },
}

/// Runs the prefill `p` (params as the tiled kernel would take them, pointers and strides set) on the decode
/// kernel; `name` is the launch's.
pub(super) fn run(launch: Launch<'_>, name: &str, p: &sys::FaPrefillParams, keys: Keys) -> Result<()> {
    if p.rope_k != 0 {
        return Err(Error::unsupported(
            "rope_k",
            format!("head dim {}: RoPE on K is fused for head dims up to 256 only (rotate K first)", p.head_dim),
        ));
    }
    let group = (p.heads_q / p.heads_kv.max(1)) as usize;
    // The kernel's width is the wider head dim's (a V head dim of its own: Dv columns of V and O).
    let widest = p.head_dim.max(p.head_dim_v) as usize;
    let rows_per_cta = to_i32("rows per CTA", decode_rows_per_cta(widest, p.seqlen_q as usize * group))?;
    // K/V: a view with no row at all (no keys anywhere) reads nothing: every key is a hole of num_pages 0, so
    // any non-null, aligned base stands in for the absent tensors.
    let (k, v) = if p.k.is_null() { (p.q, p.q) } else { (p.k, p.v) };
    let view = |page_size: i32, num_pages: i32| -> Result<sys::FaPagedCache> {
        let page_div = crate::fast_divmod::divisor(page_size as usize)
            .ok_or_else(|| Error::overflow("k (seqlen)", format!("{page_size} keys")))?;
        Ok(sys::FaPagedCache {
            k_cache: k.cast_mut(),
            v_cache: v.cast_mut(),
            k_head_stride: p.k_head_stride,
            v_head_stride: p.v_head_stride,
            page_div,
            num_pages,
            page_size,
            max_pages_per_seq: 1,
            kv_dtype: sys::FA_KV_SAME as i32,
            ..Default::default()
        })
    };
    let common = sys::FaDecodeParams {
        q: p.q,
        o: p.o,
        lse: p.lse,
        batch: p.batch,
        heads_q: p.heads_q,
        heads_kv: p.heads_kv,
        head_dim: p.head_dim,
        head_dim_v: p.head_dim_v,
        num_splits: 1,
        dtype: p.dtype,
        scale: p.scale,
        scale_log2: p.scale_log2,
        score_mod: p.score_mod,
        rope: p.rope,
        causal: p.causal,
        max_seqlen_q: p.seqlen_q,
        rows_per_cta,
        head_blocks_in_x: 1,
        lse_batch_stride: 1,
        ..Default::default()
    };
    let params = match keys {
        Keys::Dense => {
            let cache = sys::FaPagedCache {
                k_page_stride: p.k_batch_stride,
                k_token_stride: p.k_row_stride,
                v_page_stride: p.v_batch_stride,
                v_token_stride: p.v_row_stride,
                ..view(p.seqlen_k.max(1), if p.seqlen_k > 0 { p.batch } else { 0 })?
            };
            sys::FaDecodeParams {
                cache,
                q_batch_stride: p.q_row_stride,
                q_head_stride: p.q_head_stride,
                q_seq_stride: p.q_batch_stride,
                o_batch_stride: p.o_row_stride,
                o_head_stride: p.o_head_stride,
                o_seq_stride: p.o_batch_stride,
                lse_head_stride: p.lse_head_stride,
                lse_seq_stride: p.lse_batch_stride,
                seqlen_q: p.seqlen_q,
                total_q: to_i32("q (rows)", p.batch as usize * p.seqlen_q as usize)?,
                ..common
            }
        }
        Keys::Varlen { total_k } => {
            let cache = sys::FaPagedCache {
                block_table: p.cu_seqlens_k,
                block_table_stride: 1,
                seq_lens: p.cu_seqlens_k,
                seq_lens_cumulative: 1,
                k_page_stride: p.k_row_stride,
                k_token_stride: p.k_row_stride,
                v_page_stride: p.v_row_stride,
                v_token_stride: p.v_row_stride,
                ..view(p.seqlen_k.max(1), to_i32("k (rows)", total_k)?)?
            };
            sys::FaDecodeParams {
                cache,
                q_batch_stride: p.q_row_stride,
                q_head_stride: p.q_head_stride,
                o_batch_stride: p.o_row_stride,
                o_head_stride: p.o_head_stride,
                lse_head_stride: p.lse_head_stride,
                cu_seqlens_q: p.cu_seqlens_q,
                total_q: p.total_q,
                ..common
            }
        }
    };
    launch.run(name, params, sys::fa_decode)
}
