/* The C ABI between the Rust crate and the kernels: one POD params struct per op, passed by value, and the
 * extern "C" launchers. Rust mirrors this header with bindgen (src/sys.rs); nothing is hand-copied.
 *
 * Conventions (../../../shared/CONVENTIONS.md is the source of truth):
 *  - pointers are device pointers on the GPU backend and host pointers on the emulator backend;
 *  - strides are int64 and counted in ELEMENTS; the innermost (head_dim) stride is always 1;
 *  - sizes are int32; scales are float; dtype is one of FA_DTYPE_*;
 *  - every launcher returns FA_OK (0), a positive CUDA error code (GPU backend), or a negative FA_ERR_*.
 *
 * Every launcher exists twice with the same signature: fa_gpu_<op> (nvcc build, `stream` is a cudaStream_t /
 * CUstream) and fa_emu_<op> (host build, `stream` points to an FaEmuLaunch).
 */
#ifndef FA_ABI_H
#define FA_ABI_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum {
  FA_DTYPE_F16 = 0,
  FA_DTYPE_BF16 = 1,
};

enum {
  FA_OK = 0,
  FA_ERR_INVALID = -1,     /* params violate a precondition the Rust layer should have checked */
  FA_ERR_UNSUPPORTED = -2, /* no kernel instantiated for this head_dim / dtype / page size */
  FA_ERR_EMULATOR = -3,    /* the emulator detected a fault; FaEmuLaunch.message says which */
  FA_ERR_NO_ARCH = -4,     /* the GPU library has no code for this device's architecture */
};

/* Opaque stream handle: cudaStream_t on the GPU backend, FaEmuLaunch* on the emulator backend. */
typedef void *FaStream;

/* ---------------------------------------------------------------------------------------------------------
 * Prefill: O = softmax(Q Kᵀ · scale) V, fused.
 * Dense:  q [B, Tq, Hq, D], k/v [B, Tk, Hkv, D], o like q, lse [B, Hq, Tq] (natural log) or NULL.
 * Varlen: cu_seqlens_q/k non-NULL (int32, B+1): q [total_q, Hq, D], k/v [total_k, Hkv, D]; batch strides
 *         are ignored (sequence b starts at row cu_seqlens[b]); lse is [Hq, total_q] (lse_batch_stride
 *         ignored, a row's position is cu_seqlens_q[b] + i); seqlen_q/k are the maxima over the batch.
 * Causal is bottom-right aligned per sequence: row i sees key j iff j <= i + (Tk - Tq).
 * ------------------------------------------------------------------------------------------------------- */
typedef struct FaPrefillParams {
  const void *q;
  const void *k;
  const void *v;
  void *o;
  float *lse;
  const int32_t *cu_seqlens_q;
  const int32_t *cu_seqlens_k;
  int64_t q_batch_stride, q_row_stride, q_head_stride;
  int64_t k_batch_stride, k_row_stride, k_head_stride;
  int64_t v_batch_stride, v_row_stride, v_head_stride;
  int64_t o_batch_stride, o_row_stride, o_head_stride;
  int64_t lse_batch_stride, lse_head_stride; /* lse row stride is 1 */
  int32_t batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim;
  int32_t dtype;
  int32_t causal;
  float scale;      /* softmax scale (1/sqrt(D) by default) */
  float scale_log2; /* scale * log2(e): the kernel works in the exp2 domain */
} FaPrefillParams;

/* ---------------------------------------------------------------------------------------------------------
 * Paged KV cache: k_cache / v_cache [num_pages, page_size, Hkv, D]; block_table int32 [B, max_pages_per_seq]
 * (row stride block_table_stride); seq_lens int32 [B]. page_size is a power of two, 1..256.
 * ------------------------------------------------------------------------------------------------------- */
typedef struct FaPagedCache {
  void *k_cache;
  void *v_cache;
  const int32_t *block_table;
  const int32_t *seq_lens;
  int64_t k_page_stride, k_token_stride, k_head_stride;
  int64_t v_page_stride, v_token_stride, v_head_stride;
  int64_t block_table_stride;
  int32_t num_pages, page_size, log2_page_size, max_pages_per_seq;
} FaPagedCache;

/* Append: write new tokens' K/V ([num_tokens, Hkv, D], head_dim a multiple of 8) into cache slots.
 * slot_mapping int64 [num_tokens]: slot = page * page_size + offset; a negative slot is padding and is
 * skipped, and so is a slot >= num_pages * page_size (device data: clamped, not checked by the host).
 * Slots must be distinct (two tokens writing one slot race). The copy is dtype-agnostic (16-bit elements). */
typedef struct FaAppendParams {
  const void *k;
  const void *v;
  const int64_t *slot_mapping;
  int64_t k_token_stride, k_head_stride;
  int64_t v_token_stride, v_head_stride;
  FaPagedCache cache;
  int32_t num_tokens, heads_kv, head_dim;
  int32_t dtype;
} FaAppendParams;

/* Decode: one query token per sequence over the paged cache.
 * q [B, Hq, D], o [B, Hq, D], lse [B, Hq] (natural log) or NULL. head_dim 64, 128 or 256.
 * Split-KV: with num_splits > 1, split s covers tokens [s*split_tokens, (s+1)*split_tokens) of each sequence
 * (the last split runs to seq_len); split_tokens is a multiple of 64 (every KV tile divides it). Partials go
 * to the fp32 workspace partial_o [num_splits, B, Hq, D] / partial_lse [num_splits, B, Hq] (contiguous) and
 * the launcher then runs the merge kernel on the same stream. With num_splits == 1 the kernel writes o / lse
 * directly and the workspace may be NULL.
 * seq_lens / block_table are device data the host cannot check without a sync: the kernel clamps a length
 * into [0, max_pages_per_seq * page_size] and reads the rows of an out-of-range page id as zeros. */
typedef struct FaDecodeParams {
  const void *q;
  void *o;
  float *lse;
  float *partial_o;
  float *partial_lse;
  int64_t q_batch_stride, q_head_stride;
  int64_t o_batch_stride, o_head_stride;
  int64_t lse_batch_stride; /* lse head stride is 1 */
  FaPagedCache cache;
  int32_t batch, heads_q, heads_kv, head_dim;
  int32_t num_splits, split_tokens;
  int32_t dtype;
  float scale;
  float scale_log2;
} FaDecodeParams;

/* Merge of attention states: num_states partial results (o_s, lse_s) of the same rows, each the attention of
 * the rows over a disjoint part of the keys, combined into the attention over all of them:
 *   lse = log(sum_s exp(lse_s)),  o = sum_s exp(lse_s - lse) o_s     (natural log; empty: lse_s = -inf).
 * Rows are two-level, (n, h) with n < rows_outer, h < rows_inner, so that both [N, H, D] outputs with any
 * strides (decode's o [B, Hq, D]) and plain [rows, D] (rows_inner = 1) are addressed without copies:
 *   o_s[n, h, :]   at o_states + s*o_state_stride + n*o_outer_stride + h*o_inner_stride (elements)
 *   lse_s[n, h]    at lse_states + s*lse_state_stride + n*lse_outer_stride + h*lse_inner_stride
 *   o[n, h, :]     at o + n*o_out_outer_stride + h*o_out_inner_stride;  lse[n, h] likewise, or lse NULL.
 * head_dim is a multiple of 8 and every row start 16-byte aligned. A row whose states are all empty gets
 * o = 0, lse = -inf; the o_s of an empty state is never read (it may hold garbage).
 * states_dtype / out_dtype: FA_DTYPE_F16, FA_DTYPE_BF16 or FA_DTYPE_F32 (split-KV writes fp32 partials). */
enum { FA_DTYPE_F32 = 2 };
typedef struct FaMergeParams {
  const void *o_states;
  const float *lse_states;
  void *o;
  float *lse;
  int64_t o_state_stride, o_outer_stride, o_inner_stride;
  int64_t lse_state_stride, lse_outer_stride, lse_inner_stride;
  int64_t o_out_outer_stride, o_out_inner_stride;
  int64_t lse_out_outer_stride, lse_out_inner_stride;
  int32_t num_states, rows_outer, rows_inner, head_dim;
  int32_t states_dtype, out_dtype;
} FaMergeParams;

/* ---------------------------------------------------------------------------------------------------------
 * Emulator launch context (what `stream` points to for fa_emu_*). The Rust side lists every buffer the
 * launch may touch; the emulator checks every global access against them.
 * ------------------------------------------------------------------------------------------------------- */
typedef struct FaEmuRegion {
  const void *base;
  uint64_t bytes;
  int32_t writable;
  const char *name; /* argument name, for fault messages */
} FaEmuRegion;

typedef struct FaEmuLaunch {
  const FaEmuRegion *regions;
  int32_t num_regions;
  uint64_t seed; /* warp scheduling order between barriers */
  char message[1024]; /* out: the fault, naming kernel, block, thread and address */
} FaEmuLaunch;

/* ---------------------------------------------------------------------------------------------------------
 * Launchers. `FA_LAUNCHER(op)` expands to fa_gpu_op or fa_emu_op in the kernel sources.
 * ------------------------------------------------------------------------------------------------------- */
#define FA_DECLARE_LAUNCHERS(prefix)                                                                         \
  int prefix##prefill(FaPrefillParams params, FaStream stream);                                              \
  int prefix##append(FaAppendParams params, FaStream stream);                                                \
  int prefix##decode(FaDecodeParams params, FaStream stream);                                                \
  int prefix##merge(FaMergeParams params, FaStream stream);

FA_DECLARE_LAUNCHERS(fa_gpu_)
FA_DECLARE_LAUNCHERS(fa_emu_)

/* GPU backend only: the message for a positive status, and the device-code architectures compiled in. */
const char *fa_gpu_error_string(int status);

#ifdef __cplusplus
}
#endif

#endif /* FA_ABI_H */
