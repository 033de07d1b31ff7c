// Where one (sequence, head) of a prefill problem lives: its lengths and the element offsets of its first
// row in q, k, v, o and lse, for both layouts of FaPrefillParams (dense [B, T, H, D] with batch strides,
// or varlen packed [total, H, D] with cu_seqlens). GQA: query head h reads KV head h / (Hq / Hkv).
#pragma once

#include "fa/abi.h"
#include "fa/intrinsics.cuh"
#include "fa/namespace.cuh"

FA_NAMESPACE_BEGIN
namespace prefill {

struct SeqInfo {
  int tq, tk;                                 // query rows and keys of this sequence
  int64_t q_offset, k_offset, v_offset, o_offset; // elements to row 0 of this sequence and head
  int64_t lse_offset;                         // elements to this row 0's LSE (rows are contiguous)
};

// Varlen bounds of sequence b, clamped to [0, total] so that corrupt cu_seqlens stay inside the tensor.
FA_DEVICE void varlen_bounds(const int32_t *cu, int b, int total, int &start, int &len) {
  int lo = ld_global(cu + b);
  int hi = ld_global(cu + b + 1);
  lo = lo < 0 ? 0 : (lo > total ? total : lo);
  hi = hi < lo ? lo : (hi > total ? total : hi);
  start = lo;
  len = hi - lo;
}

FA_DEVICE SeqInfo seq_info(const FaPrefillParams &p, int b, int h) {
  const int h_kv = h / (p.heads_q / p.heads_kv);
  SeqInfo s;
  if (p.cu_seqlens_q != nullptr) {
    int q_start, k_start;
    varlen_bounds(p.cu_seqlens_q, b, p.total_q, q_start, s.tq);
    varlen_bounds(p.cu_seqlens_k, b, p.total_k, k_start, s.tk);
    s.q_offset = q_start * p.q_row_stride + h * p.q_head_stride;
    s.o_offset = q_start * p.o_row_stride + h * p.o_head_stride;
    s.k_offset = k_start * p.k_row_stride + h_kv * p.k_head_stride;
    s.v_offset = k_start * p.v_row_stride + h_kv * p.v_head_stride;
    s.lse_offset = h * p.lse_head_stride + q_start;
  } else {
    s.tq = p.seqlen_q;
    s.tk = p.seqlen_k;
    s.q_offset = b * p.q_batch_stride + h * p.q_head_stride;
    s.o_offset = b * p.o_batch_stride + h * p.o_head_stride;
    s.k_offset = b * p.k_batch_stride + h_kv * p.k_head_stride;
    s.v_offset = b * p.v_batch_stride + h_kv * p.v_head_stride;
    s.lse_offset = b * p.lse_batch_stride + h * p.lse_head_stride;
  }
  return s;
}

} // namespace prefill
FA_NAMESPACE_END
