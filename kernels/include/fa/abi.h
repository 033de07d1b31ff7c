/* The C ABI between the Rust crate and the kernels: one POD params struct per op, passed by value, and the
 * extern "C" launchers. Rust mirrors this header with bindgen (src/sys.rs); nothing is hand-copied.
 *
 * Conventions (docs/semantics.md is the source of truth):
 *  - pointers are device pointers on the GPU backend and host pointers on the emulator backend;
 *  - strides are int64 and counted in ELEMENTS; the innermost (head_dim) stride is always 1;
 *  - sizes are int32; scales are float; dtype is one of FA_DTYPE_*;
 *  - every launcher returns FA_OK (0) or a negative FA_ERR_*.
 *
 * Launchers are host code, compiled once by the host C++ compiler into the host library (libfa_host.a,
 * together with the emulator). Each validates its parameters, chooses the kernel instantiation and computes
 * grid, block and dynamic shared memory: one launch plan for both backends. What then happens to each
 * launch is the FaExec's mode (below): it runs on the host emulator, or it is recorded for the Rust side to
 * enqueue on the caller's CUDA stream through the driver API (cuLaunchKernel, kernels loaded from the
 * fatbins nvcc built from the same sources). No CUDA runtime is linked.
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
  FA_ERR_TOO_MANY_LAUNCHES = -5, /* a launcher recorded more than FA_MAX_LAUNCHES launches (a bug here) */
};

/* ---------------------------------------------------------------------------------------------------------
 * Score variants (docs/semantics.md, "Score variants"), shared by prefill and decode. Per score, in this
 * order: t = s * scale -> softcap -> ALiBi -> window/causal mask -> softmax with sink. All off is
 * {-1, -1, 0, NULL, 0, NULL}: the kernels then run exactly their plain code path.
 *  - window_left / window_right: key j is visible to query row i iff i + d - left <= j <= i + d + right,
 *    d = Tk - Tq (decode: seq_len - 1); -1 = unbounded. Prefill's `causal` is right = 0 (and wins over
 *    window_right). Decode ignores window_right (no key lies right of the query's own position).
 *  - softcap: c > 0 applies t <- c * tanh(t / c); 0 = off.
 *  - alibi_slopes: fp32, t <- t - m * |i + d - j| with m = alibi_slopes[b * alibi_batch_stride + h]
 *    (h the query head): [Hq] (stride 0) or [B, Hq] (stride >= Hq); NULL = off.
 *  - sinks: fp32 [Hq], the softmax denominator gains exp(sinks[h]) (LSE = log(exp(sink) + sum exp t));
 *    NULL = off. Must be finite. Split-KV decode adds it once, in the merge.
 * ------------------------------------------------------------------------------------------------------- */
typedef struct FaScoreMod {
  int32_t window_left, window_right;
  float softcap;
  const float *alibi_slopes;
  int64_t alibi_batch_stride;
  const float *sinks;
} FaScoreMod;

/* ---------------------------------------------------------------------------------------------------------
 * Prefill: O = softmax(Q Kᵀ · scale) V, fused.
 * Dense:  q [B, Tq, Hq, D], k/v [B, Tk, Hkv, D], o like q, lse [B, Hq, Tq] (natural log) or NULL.
 * Varlen: cu_seqlens_q/k non-NULL (int32, B+1): q [total_q, Hq, D], k/v [total_k, Hkv, D]; batch strides
 *         are ignored (sequence b starts at row cu_seqlens[b]); lse is [Hq, total_q] (lse_batch_stride
 *         ignored, a row's position is cu_seqlens_q[b] + i); seqlen_q/k are the maxima over the batch
 *         (the grid covers seqlen_q rows per sequence); total_q/total_k are the rows of the packed q (= o)
 *         and k (= v) tensors: the kernel clamps cu_seqlens to [0, total] so that bad offsets can never
 *         address memory outside the tensors (a sequence longer than seqlen_q is then only partly written).
 * Causal is bottom-right aligned per sequence: row i sees key j iff j <= i + (Tk - Tq).
 * k and v may be NULL when there are no keys at all (seqlen_k == 0, or varlen total_k == 0): every row is
 * then empty (O = 0, LSE = -inf). scale must be > 0 (the kernel takes the row max of unscaled scores).
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
  int32_t total_q, total_k; /* varlen only */
  int32_t dtype;
  int32_t causal;
  float scale;      /* softmax scale (1/sqrt(D) by default) */
  float scale_log2; /* scale * log2(e): the kernel works in the exp2 domain */
  FaScoreMod score_mod;
} FaPrefillParams;

/* ---------------------------------------------------------------------------------------------------------
 * Paged KV cache: k_cache / v_cache [num_pages, page_size, Hkv, D]; block_table int32 [B, max_pages_per_seq]
 * (row stride block_table_stride); seq_lens int32 [B]. page_size is a power of two, 1..256.
 * Element type (kv_dtype): FA_KV_SAME (0, what zero-initialised callers get) is the op's 16-bit dtype;
 * FA_KV_FP8_E4M3 / FA_KV_FP8_E5M2 store one byte per element (OCP FP8 as CUDA's __nv_fp8_e4m3 / _e5m2;
 * strides then count bytes). An FP8 cache has dequantisation scales: stored value x scale is the value
 * attention uses; k_scale / v_scale fp32, one per tensor (scale_head_stride 0: k_scale[0]) or one per KV head
 * (scale_head_stride 1: k_scale[h], h < Hkv); finite and > 0 (the Rust layer checks). Unused (may be NULL)
 * for 16-bit caches. Append quantises: stored = fp8_rn_satfinite(float(x) / scale) (fp32 division, correctly
 * rounded; round to nearest even; |values| past the largest finite one, infinities included, saturate;
 * NaN -> NaN). FP8 -> 16-bit is exact for both formats.
 * ------------------------------------------------------------------------------------------------------- */
enum { FA_KV_SAME = 0, FA_KV_FP8_E4M3 = 1, FA_KV_FP8_E5M2 = 2 };
typedef struct FaPagedCache {
  void *k_cache;
  void *v_cache;
  const int32_t *block_table;
  const int32_t *seq_lens;
  int64_t k_page_stride, k_token_stride, k_head_stride;
  int64_t v_page_stride, v_token_stride, v_head_stride;
  int64_t block_table_stride;
  int32_t num_pages, page_size, log2_page_size, max_pages_per_seq;
  int32_t kv_dtype;          /* FA_KV_* */
  int32_t scale_head_stride; /* FP8: 0 = one scale per tensor, 1 = one per KV head */
  const float *k_scale;      /* FP8: dequantisation scales (see above) */
  const float *v_scale;
} FaPagedCache;

/* Append: write new tokens' K/V ([num_tokens, Hkv, D], head_dim a multiple of 8) into cache slots.
 * slot_mapping int64 [num_tokens]: slot = page * page_size + offset; a negative slot is padding and is
 * skipped, and so is a slot >= num_pages * page_size (device data: clamped, not checked by the host).
 * Slots must be distinct (two tokens writing one slot race). A 16-bit cache gets a dtype-agnostic copy; an FP8
 * cache (cache.kv_dtype) the quantised values (head_dim then a multiple of 16). */
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
 * Only the tokens [w, seq_len) are read, w = max(0, seq_len - 1 - window_left) (0 without a window).
 * Split-KV: with num_splits > 1, split s covers tokens [w + s*split_tokens, w + (s+1)*split_tokens) of each
 * sequence (the last split runs to seq_len); split_tokens is a multiple of 64 (every KV tile divides it). Partials go
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
  FaScoreMod score_mod;
} FaDecodeParams;

/* Paged prefill: packed new query tokens of each sequence over the paged cache (chunked prefill, prefix
 * caching, speculative verification). q [total_q, Hq, D] (sequence b owns rows cu_seqlens_q[b] ..
 * cu_seqlens_q[b+1], int32 [B+1]), o like q, lse [Hq, total_q] (natural log; row stride 1, head stride
 * lse_head_stride) or NULL. seq_lens[b] counts the cached tokens *including* the q_len_b new ones; with
 * causal, row i of b sees key j iff j <= i + (seq_len_b - q_len_b) (bottom-right), then the score variants
 * (window bounds on token positions as for prefill; causal wins over window_right).
 * head_dim: a multiple of 8 in 32..256; the kernel runs at the smallest instantiated width >= head_dim
 * (32, 64, 96, 128, 256) with the columns past head_dim zero-filled and never stored.
 * max_seqlen_q: the largest q_len (the grid covers max_seqlen_q * Hq / Hkv packed rows per KV head).
 * Split-KV: with num_splits > 1, split s covers keys [s*split_tokens, (s+1)*split_tokens) (the last split
 * runs to seq_len; split_tokens a multiple of 64) and writes fp32 partials partial_o [num_splits, total_q,
 * Hq, head_dim] / partial_lse [num_splits, total_q, Hq] (contiguous), which the launcher merges into o / lse
 * with the merge kernel on the same stream (the sinks enter there, once).
 * cu_seqlens_q, seq_lens and block_table are device data: cu_seqlens_q is clamped to [0, total_q], seq_lens
 * and page ids as for decode. */
typedef struct FaPagedPrefillParams {
  const void *q;
  void *o;
  float *lse;
  const int32_t *cu_seqlens_q;
  float *partial_o;
  float *partial_lse;
  int64_t q_row_stride, q_head_stride;
  int64_t o_row_stride, o_head_stride;
  int64_t lse_head_stride;
  FaPagedCache cache;
  int32_t batch, heads_q, heads_kv, head_dim;
  int32_t total_q, max_seqlen_q;
  int32_t num_splits, split_tokens;
  int32_t dtype;
  int32_t causal;
  float scale;
  float scale_log2;
  FaScoreMod score_mod;
} FaPagedPrefillParams;

/* Merge of attention states: num_states partial results (o_s, lse_s) of the same rows, each the attention of
 * the rows over a disjoint part of the keys, combined into the attention over all of them:
 *   lse = log(sum_s exp(lse_s)),  o = sum_s exp(lse_s - lse) o_s     (natural log; empty: lse_s = -inf).
 * Rows are two-level, (n, h) with n < rows_outer, h < rows_inner, so that both [N, H, D] outputs with any
 * strides (decode's o [B, Hq, D]) and plain [rows, D] (rows_inner = 1) are addressed without copies:
 *   o_s[n, h, :]   at o_states + s*o_state_stride + n*o_outer_stride + h*o_inner_stride (elements)
 *   lse_s[n, h]    at lse_states + s*lse_state_stride + n*lse_outer_stride + h*lse_inner_stride
 *   o[n, h, :]     at o + n*o_out_outer_stride + h*o_out_inner_stride;  lse[n, h] likewise, or lse NULL.
 * head_dim is a multiple of 8 and every row start 16-byte aligned. A row whose states are all empty gets
 * o = 0, lse = -inf; the o_s of an empty state is never read (it may hold garbage). With sinks, the sink
 * joins as one more state with o = 0: lse = log(exp(sink) + sum_s exp(lse_s)) (an all-empty row: o = 0,
 * lse = sink).
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
  const float *sinks; /* fp32 [rows_inner] or NULL: row (n, h)'s denominator gains exp(sinks[h]) */
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

/* What one emulated kernel launch did, counted by the executor as it runs (docs/emulator.md, "Cost
 * counters"). Warp-level instructions count once per warp, not per lane; bytes are the sizes of the accesses
 * the kernel made through the intrinsics. Global traffic is attributed to the region (index into
 * FaEmuLaunch.regions) that contains the access: the first one in list order that allows it. */
enum { FA_EMU_MAX_REGIONS = 32, FA_EMU_MAX_KERNELS = 8 };
typedef struct FaEmuCounters {
  char kernel[64]; /* the kernel's name, NUL-terminated (truncated) */
  uint64_t blocks; /* CTAs run */
  uint64_t global_bytes_read[FA_EMU_MAX_REGIONS];    /* loads, cp.async sources (predicate true), atomics */
  uint64_t global_bytes_written[FA_EMU_MAX_REGIONS]; /* stores, atomics */
  uint64_t mma;              /* mma.m16n8k16 warp instructions */
  uint64_t ldmatrix;         /* ldmatrix warp instructions (any .x, .trans or not) */
  uint64_t shuffles;         /* shfl warp instructions */
  uint64_t exp2;             /* fast_exp2 (ex2.approx) calls, one per lane that calls it */
  uint64_t barriers;         /* completed bar.sync: one per barrier a block (or its named subset) passes */
  uint64_t barrier_arrivals; /* warps arriving at a bar.sync (barriers x participating warps) */
  uint64_t shared_bytes_read;    /* ld_shared, plus 16 bytes per ldmatrix row */
  uint64_t shared_bytes_written; /* st_shared, plus cp.async landings (zero-fills included) */
  uint64_t cp_async_bytes;       /* cp.async copies issued with a true predicate (global -> shared) */
  uint64_t cp_async_zfill_bytes; /* cp.async copies issued with a false predicate (zero-fill, no read) */
  uint64_t wgmma;           /* wgmma.mma_async warpgroup instructions (m64nNk16: 2048 N FLOPs each) */
  uint64_t tma_load_bytes;  /* TMA loads issued: whole boxes, out-of-bounds elements included */
  uint64_t tma_store_bytes; /* TMA stores completed: whole boxes (only in-bounds bytes reach global memory) */
  /* Bank conflicts (kernels/emu/bank_conflicts.cpp): warp-wide shared accesses (ld/st, cp.async destinations,
   * ldmatrix), the wavefronts they take on 32 banks x 4 bytes, and the wavefronts they would take without
   * conflicts (one per 128-byte phase with an active lane); accesses past the per-step buffer go uncounted. */
  uint64_t shared_requests;
  uint64_t shared_wavefronts;
  uint64_t shared_ideal_wavefronts;
  uint64_t shared_uncounted;
} FaEmuCounters;

typedef struct FaEmuLaunch {
  const FaEmuRegion *regions;
  int32_t num_regions; /* at most FA_EMU_MAX_REGIONS */
  uint64_t seed; /* warp scheduling order between barriers */
  char message[1024]; /* out: the fault, naming kernel, block, thread and address */
  /* out: one entry per kernel launched on this context, in launch order (a launcher may run several, e.g.
   * split-KV decode runs the decode kernel then the merge kernel). The caller zeroes num_kernels. */
  FaEmuCounters kernels[FA_EMU_MAX_KERNELS];
  int32_t num_kernels;
} FaEmuLaunch;

/* ---------------------------------------------------------------------------------------------------------
 * Execution of a launcher's kernel launches.
 *   FA_EXEC_EMULATE: each launch runs to completion on the host emulator; `emu` lists the buffers it may
 *                    touch and receives the fault message.
 *   FA_EXEC_RECORD:  each launch is appended to `launches` (kernel name, geometry and the bytes of its one
 *                    by-value parameter); the caller enqueues them in order. A launcher records at most
 *                    FA_MAX_LAUNCHES (split-KV decode: the decode kernel, then the merge kernel).
 * Kernel names are the extern "C" symbols of the kernels in the fatbins (fa_prefill_bf16_d128, ...).
 * ------------------------------------------------------------------------------------------------------- */
enum { FA_EXEC_EMULATE = 0, FA_EXEC_RECORD = 1 };
enum { FA_MAX_LAUNCHES = 4, FA_MAX_PARAMS_BYTES = 1024 };

typedef struct FaKernelLaunch {
  const char *kernel; /* static NUL-terminated symbol name */
  int32_t grid[3];
  int32_t block;
  int32_t smem_bytes;
  int32_t params_bytes;
  uint64_t params[FA_MAX_PARAMS_BYTES / 8]; /* 8-byte aligned copy of the params struct */
} FaKernelLaunch;

typedef struct FaExec {
  int32_t mode;
  FaEmuLaunch *emu;
  int32_t num_launches;
  FaKernelLaunch launches[FA_MAX_LAUNCHES];
} FaExec;

/* ---------------------------------------------------------------------------------------------------------
 * Launchers (kernels/<op>.cu, host build).
 * ------------------------------------------------------------------------------------------------------- */
int fa_prefill(FaPrefillParams params, FaExec *exec);
int fa_append(FaAppendParams params, FaExec *exec);
int fa_decode(FaDecodeParams params, FaExec *exec);
int fa_merge(FaMergeParams params, FaExec *exec);
int fa_paged_prefill(FaPagedPrefillParams params, FaExec *exec);

/* ---------------------------------------------------------------------------------------------------------
 * Self-tests of the intrinsics layer and the host emulator (kernels/selftest.cu, tests/emulator.rs). Every
 * launcher (fa_selftest_*) runs through an FaExec like the ops, so the same kernels can run on a GPU and be
 * compared with the emulator. All are single-warp or single-block unless stated.
 * ------------------------------------------------------------------------------------------------------- */

/* mma.m16n8k16 on raw fragment registers: lane l's registers are a[4l..4l+3], b[2l..2l+1], c/d[4l..4l+3],
 * so only the test's model of the PTX fragment tables decides which matrix element each one holds.
 * d = A·B + C. One warp. */
typedef struct FaSelftestMmaParams {
  const uint32_t *a; /* [32][4] */
  const uint32_t *b; /* [32][2] */
  const float *c;    /* [32][4] */
  float *d;          /* [32][4] */
  int32_t dtype;     /* FA_DTYPE_F16 or FA_DTYPE_BF16 */
} FaSelftestMmaParams;

/* ldmatrix: `rows` 16-byte rows are staged into shared memory; lane l then passes the address of row
 * row_of_lane[l] to ldmatrix .x{count}{.trans}; out[4l + i] = register i of lane l (others untouched).
 * One warp. */
typedef struct FaSelftestLdmatrixParams {
  const uint16_t *rows_data;  /* [rows][8] */
  const int32_t *row_of_lane; /* [32], each in [0, rows) */
  uint32_t *out;              /* [32][4] */
  int32_t rows;               /* 1..64 */
  int32_t count;              /* 1, 2 or 4 */
  int32_t trans;
} FaSelftestLdmatrixParams;

/* Warp shuffles and votes: out[l] = shfl_xor(values[l], operands[l]), shfl_idx(values[l], operands[l]), or
 * warp_ballot / warp_any / warp_all of (values[l] != 0); EXP2: the bits of fast_exp2 of the float whose
 * bits are values[l]. One warp. */
enum {
  FA_SELFTEST_SHFL_XOR = 0,
  FA_SELFTEST_SHFL_IDX = 1,
  FA_SELFTEST_BALLOT = 2,
  FA_SELFTEST_ANY = 3,
  FA_SELFTEST_ALL = 4,
  FA_SELFTEST_EXP2 = 5,
};
typedef struct FaSelftestWarpParams {
  const uint32_t *values;  /* [32] */
  const int32_t *operands; /* [32] */
  uint32_t *out;           /* [32] */
  int32_t op;              /* FA_SELFTEST_SHFL_XOR .. FA_SELFTEST_ALL */
} FaSelftestWarpParams;

/* cp.async groups and zero-fill, one block of 64 threads: for each group g < groups, thread t copies 16-byte
 * chunk j = 64g + t of src to shared chunk j (predicate preds[j]; false zero-fills) and commits. Then
 * cp_async_wait<wait_pending>, sync_threads, and thread t copies shared chunk 64g + (t + 32) % 64 (another
 * warp's) to the same chunk of out for every g < read_groups. */
typedef struct FaSelftestCpAsyncParams {
  const uint8_t *src;   /* [groups * 64][16] */
  const uint8_t *preds; /* [groups * 64] */
  uint8_t *out;         /* [groups * 64][16] */
  int32_t groups;       /* 1..4 */
  int32_t wait_pending; /* 0..3 */
  int32_t read_groups;  /* 0..groups */
} FaSelftestCpAsyncParams;

/* Bank conflicts (the emulator's shared_wavefronts counters): one warp makes `repeat` warp-wide shared accesses
 * of one kind, each from one source location, lane l at byte offset offsets[l] of its shared memory
 * (offsets[l] < 0: lane l skips the access). LOAD / STORE: `bytes` (1, 2, 4, 8, 16) per lane; CP_ASYNC: a
 * 16-byte cp.async destination (zero-filled); LDMATRIX_X4: the lanes' row addresses (every lane, bytes 16).
 * Nothing else touches shared memory. out[l] receives a word of what lane l loaded. */
enum {
  FA_SELFTEST_BANK_LOAD = 0,
  FA_SELFTEST_BANK_STORE = 1,
  FA_SELFTEST_BANK_CP_ASYNC = 2,
  FA_SELFTEST_BANK_LDMATRIX_X4 = 3,
};
typedef struct FaSelftestBankParams {
  const int32_t *offsets; /* [32], multiples of `bytes`, below smem_bytes */
  uint32_t *out;          /* [32] */
  int32_t kind;           /* FA_SELFTEST_BANK_* */
  int32_t bytes;
  int32_t repeat;     /* 1..8 */
  int32_t smem_bytes; /* 16..65536 */
} FaSelftestBankParams;

/* Atomics over `blocks` blocks of 128 threads: global thread i stores atomic_add(counter, 1) to olds[i] and
 * adds addends[i] to *sum. */
typedef struct FaSelftestAtomicParams {
  int32_t *counter;
  int32_t *olds;          /* [blocks * 128] */
  float *sum;
  const float *addends;   /* [blocks * 128] */
  int32_t blocks;
} FaSelftestAtomicParams;

/* Named barriers, one block of 4 warps. PAIRS: warp 0 hands data to warp 1 through shared memory ordered by
 * barrier 1 (64 threads), warp 2 to warp 3 by barrier 2; out[t] = what consumer thread t read (producers:
 * -1). CROSS: as PAIRS, but warp 3 reads warp 0's data, which barrier 2 does not order (a race).
 * BLOCK: all four warps pass barrier 3 with 128 threads, then read another warp's data. MISMATCH: warps 0
 * and 1 wait at barrier 1 with different thread counts. */
enum {
  FA_SELFTEST_BARRIER_PAIRS = 0,
  FA_SELFTEST_BARRIER_CROSS = 1,
  FA_SELFTEST_BARRIER_BLOCK = 2,
  FA_SELFTEST_BARRIER_MISMATCH = 3,
};
typedef struct FaSelftestBarrierParams {
  int32_t *out; /* [128] */
  int32_t mode; /* FA_SELFTEST_BARRIER_* */
} FaSelftestBarrierParams;

/* Planted bugs, one block of 128 threads over input/out [512] floats. planted = 0 runs the correct twin of the
 * kernel (out = f(in)); planted = 1 runs it with the bug, which the emulator must report:
 *  MISSING_SYNCTHREADS   shared memory written by one warp, read by another with no barrier between;
 *  OOB_WRITE             thread 0 also writes out[512], one past the end;
 *  MISSING_CP_ASYNC_WAIT shared memory read after cp.async + commit + barrier, but without a wait;
 *  DIVERGENT_BARRIER     only lanes 0-15 of each warp call sync_threads;
 *  DEADLOCK              warp 0 waits at barrier 1 for 64 threads; no other warp ever arrives;
 *  MISALIGNED_16         16-byte global loads from an address 4 bytes past a 16-byte boundary;
 *  STACK_OVERFLOW        deep recursion with large locals (emulator only: the GPU library returns
 *                        FA_ERR_UNSUPPORTED, as its build rejects kernels with a stack frame);
 *  RAW_POINTER           a null pointer dereferenced directly, bypassing the checked intrinsics;
 *  DIV_BY_ZERO           an integer division by zero (garbage on the GPU, a host trap in emulation);
 *  STORE_TO_INPUT        a global store into the read-only input buffer;
 *  SHARED_OOB            a shared store one element past the block's 2048 bytes of shared memory;
 *  GLOBAL_AS_SHARED      ld_shared through a global pointer (works on the GPU by generic addressing, but
 *                        breaks the intrinsics contract the emulator relies on);
 *  SPIN_WAIT             thread 0 spins on a flag that "another block" would set (never, here).
 * race_detection = 0 turns the emulator's race detector off (the GPU ignores it). */
enum {
  FA_SELFTEST_BUG_MISSING_SYNCTHREADS = 0,
  FA_SELFTEST_BUG_OOB_WRITE = 1,
  FA_SELFTEST_BUG_MISSING_CP_ASYNC_WAIT = 2,
  FA_SELFTEST_BUG_DIVERGENT_BARRIER = 3,
  FA_SELFTEST_BUG_DEADLOCK = 4,
  FA_SELFTEST_BUG_MISALIGNED_16 = 5,
  FA_SELFTEST_BUG_STACK_OVERFLOW = 6,
  FA_SELFTEST_BUG_RAW_POINTER = 7,
  FA_SELFTEST_BUG_DIV_BY_ZERO = 8,
  FA_SELFTEST_BUG_STORE_TO_INPUT = 9,
  FA_SELFTEST_BUG_SHARED_OOB = 10,
  FA_SELFTEST_BUG_GLOBAL_AS_SHARED = 11,
  FA_SELFTEST_BUG_SPIN_WAIT = 12,
};
typedef struct FaSelftestBugParams {
  const float *input; /* [512] */
  float *out;      /* [512] */
  int32_t bug;     /* FA_SELFTEST_BUG_* */
  int32_t planted;
  int32_t race_detection;
} FaSelftestBugParams;

/* A known-good tiled GEMM: c = a · b in fp32 from fp16/bf16 inputs, with 64x64 block tiles, 4 warps of 32x32,
 * k tiles of 32 double-buffered through cp.async, fragments loaded with ldmatrix (.trans for k-major b).
 * a [m][k] row-major; b [n][k] row-major (b_k_major = 0) or [k][n] (b_k_major = 1); c [m][n].
 * m >= 1, n a multiple of 8, k a multiple of 32; ragged m/n tiles are zero-filled by predicated cp.async.
 * bug: FA_SELFTEST_GEMM_* plants a pipeline bug (the emulator must report it). */
enum {
  FA_SELFTEST_GEMM_CORRECT = 0,
  FA_SELFTEST_GEMM_NO_TRAILING_BARRIER = 1, /* the next stage's cp.async overwrites a tile others still read */
  FA_SELFTEST_GEMM_NO_WAIT = 2,             /* computes on a stage whose cp.async was never waited for */
};
typedef struct FaSelftestGemmParams {
  const void *a;
  const void *b;
  float *c;
  int32_t m, n, k;
  int32_t dtype;     /* FA_DTYPE_F16 or FA_DTYPE_BF16 */
  int32_t b_k_major;
  int32_t bug;       /* FA_SELFTEST_GEMM_* */
} FaSelftestGemmParams;

/* Microbenchmark: `blocks` blocks of 4 warps, each warp executing `iters` of one operation; out [blocks*128]
 * keeps the results live. */
enum {
  FA_SELFTEST_BENCH_SHFL = 0,
  FA_SELFTEST_BENCH_LDMATRIX = 1,
  FA_SELFTEST_BENCH_MMA = 2,
  FA_SELFTEST_BENCH_SYNCTHREADS = 3,
  FA_SELFTEST_BENCH_SHARED_STORE_LOAD = 4,
};
typedef struct FaSelftestBenchParams {
  uint32_t *out;
  int32_t op;
  int32_t iters;
  int32_t blocks;
} FaSelftestBenchParams;

/* FP8 conversions of the intrinsics layer, one thread per item (the hardware cvt on sm_89+, the scalar model
 * of fa/fp8_model.cuh elsewhere): encode == 0: halves[i] = the two fp16 (packed, low = first) of the two
 * codes codes[i] (low byte = first); encode != 0: codes_out[i] = the two codes of values[2i], values[2i+1].
 * kv_dtype: FA_KV_FP8_E4M3 or FA_KV_FP8_E5M2. Any number of blocks of 128 threads. */
typedef struct FaSelftestFp8Params {
  const uint16_t *codes; /* [n] (decode) */
  const float *values;   /* [2n] (encode) */
  uint32_t *halves;      /* [n] (decode) */
  uint16_t *codes_out;   /* [n] (encode) */
  int32_t n;
  int32_t kv_dtype;
  int32_t encode;
} FaSelftestFp8Params;

int fa_selftest_mma(FaSelftestMmaParams params, FaExec *exec);
int fa_selftest_fp8(FaSelftestFp8Params params, FaExec *exec);
int fa_selftest_ldmatrix(FaSelftestLdmatrixParams params, FaExec *exec);
int fa_selftest_warp(FaSelftestWarpParams params, FaExec *exec);
int fa_selftest_cp_async(FaSelftestCpAsyncParams params, FaExec *exec);
int fa_selftest_bank(FaSelftestBankParams params, FaExec *exec);
int fa_selftest_atomic(FaSelftestAtomicParams params, FaExec *exec);
int fa_selftest_barrier(FaSelftestBarrierParams params, FaExec *exec);
int fa_selftest_bug(FaSelftestBugParams params, FaExec *exec);
int fa_selftest_gemm(FaSelftestGemmParams params, FaExec *exec);
int fa_selftest_bench(FaSelftestBenchParams params, FaExec *exec);

/* ---------------------------------------------------------------------------------------------------------
 * sm_90a: tensor maps and the Hopper self-tests (kernels/selftest_sm90.cu, tests/hopper.rs).
 * ------------------------------------------------------------------------------------------------------- */

/* A TMA tensor map: 128 bytes, 64-byte aligned, passed inside a kernel's params (FA_KERNEL_SM90 makes them
 * __grid_constant__). On the GPU it holds the driver's CUtensorMap (cuTensorMapEncodeTiled); on the emulator
 * an FaEmuTensorMap. The Rust side makes both, after one validation (src/tensor_map.rs). */
typedef struct FaTensorMap {
  uint64_t opaque[16];
} __attribute__((aligned(64))) FaTensorMap;

/* The emulator's tensor map: a tiled, non-interleaved map with unit element strides and zero fill. */
enum { FA_EMU_TENSOR_MAP_MAGIC = 0x70616d74 /* "tmap" */ };
typedef struct FaEmuTensorMap {
  uint32_t magic;
  uint32_t rank;          /* 1..5 */
  uint32_t elem_bytes;    /* 1, 2 or 4 */
  uint32_t swizzle_bytes; /* 0, 32, 64 or 128 */
  const void *base;       /* 16-byte aligned */
  uint64_t dims[5];       /* elements, dimension 0 innermost */
  uint64_t strides[5];    /* bytes; strides[0] = elem_bytes, the others multiples of 16 */
  uint32_t box[5];        /* 1..256 elements each */
} FaEmuTensorMap;

/* wgmma.mma_async m64nNk16 (f16/bf16 -> f32), one warpgroup of 128 threads. The test lays out the shared
 * images of A and B itself (a_smem, b_smem: its own model of the canonical layouts), and the kernel copies
 * them with ordinary stores to 1024-byte aligned offsets (A at 0, B at a_smem_bytes rounded up to 1024),
 * fences the proxy and synchronises. It then runs k_steps wgmmas into the accumulator c (thread t holds
 * c[t][0..n/2), raw fragment registers): step s uses desc_a / desc_b (start address 0: the kernel adds the
 * tile's shared address) advanced by s * a_k_step_bytes / b_k_step_bytes, and, for RS, A registers
 * a_regs[s][t][0..4). The first step accumulates iff `accumulate`, the others always. d = the result. */
typedef struct FaSelftestWgmmaParams {
  const uint8_t *a_smem;
  const uint8_t *b_smem;
  const uint32_t *a_regs; /* RS only: [k_steps][128][4] */
  const float *c;         /* [128][n/2] */
  float *d;               /* [128][n/2] */
  uint64_t desc_a, desc_b;
  uint32_t a_k_step_bytes, b_k_step_bytes;
  int32_t a_smem_bytes, b_smem_bytes; /* multiples of 16 */
  int32_t n;                          /* 8, 16, 32, 64, 128, 176 or 256 */
  int32_t k_steps;                    /* 1..4 */
  int32_t dtype;                      /* FA_DTYPE_F16 or FA_DTYPE_BF16 */
  int32_t a_from_regs, trans_a, trans_b, accumulate;
} FaSelftestWgmmaParams;

/* TMA, one block of 128 threads. LOAD: thread 0 initialises an mbarrier, declares expect_tx bytes and loads
 * the box at `coords` through `map` into 1024-byte aligned shared memory; every thread waits for the phase
 * and the block copies the box's shared image (box_bytes) to `image`. STORE: the block stores `image` into
 * shared memory, fences the proxy, synchronises, and thread 0 stores the box to the tensor at `coords`
 * (then commits and waits). */
enum { FA_SELFTEST_TMA_LOAD = 0, FA_SELFTEST_TMA_STORE = 1 };
typedef struct FaSelftestTmaParams {
  FaTensorMap map;
  uint8_t *image; /* [box_bytes]: LOAD writes it, STORE reads it */
  int32_t coords[5];
  int32_t rank;
  int32_t box_bytes; /* a multiple of 16 */
  int32_t expect_tx; /* LOAD: the bytes thread 0 declares */
  int32_t mode;      /* FA_SELFTEST_TMA_* */
} FaSelftestTmaParams;

/* Planted Hopper bugs, each with a correct twin (planted = 0), one block of 128 threads (SETMAXNREG_*: 384),
 * over a 64x64 f16 tensor `input` (map: a 2-D map of it, box 64x64, 128B swizzle; the TMA-store bugs store
 * a tile back into it, so it must be writable) and out [384 * 64] floats:
 *  ACC_READ_IN_FLIGHT      the accumulator is read before the wgmma_wait that completes its wgmma;
 *  A_WRITE_IN_FLIGHT       an RS wgmma's A-fragment registers are rewritten while it is in flight;
 *  SMEM_WRITE_IN_FLIGHT    the B tile is overwritten with ordinary stores while a wgmma reads it;
 *  NO_WGMMA_FENCE          the accumulator is zeroed and then used by a wgmma without wgmma_fence;
 *  UNCOMMITTED_AT_EXIT     a wgmma is issued and never committed;
 *  UNWAITED_AT_EXIT        a wgmma group is committed and never waited for;
 *  MBARRIER_DOUBLE_INIT    every lane of warp 0 initialises the mbarrier;
 *  MBARRIER_UNORDERED_INIT warp 0 initialises the mbarrier, warp 1 arrives on it with no barrier between;
 *  MBARRIER_PLAIN_ACCESS   the mbarrier's word is read with ld_shared;
 *  EXPECT_TX_TOO_FEW       expect_tx declares half the bytes of two TMA loads;
 *  EXPECT_TX_TOO_MANY      expect_tx declares twice the bytes of the TMA load (a deadlock);
 *  WAITER_BEHIND           warp 1 arrives twice (two phases) before warp 0 waits for the first;
 *  TMA_READ_BEFORE_WAIT    the TMA destination is read before the mbarrier wait;
 *  TMA_INTO_BUSY_STAGE     a second TMA load refills a stage warp 1 is still reading (no empty barrier);
 *  EXIT_WITH_TMA_IN_FLIGHT a TMA load is issued and never waited for;
 *  MISSING_PROXY_FENCE     a wgmma reads a tile written with ordinary stores and no fence.proxy.async;
 *  TMA_STORE_NO_FENCE      a TMA store reads a tile written with ordinary stores and no fence.proxy.async;
 *  TMA_STORE_SRC_OVERWRITE the TMA store's source is overwritten before tma_store_wait;
 *  SETMAXNREG_EXHAUSTED    3 warpgroups: the consumers' setmaxnreg.inc 232 needs the registers the
 *                          producer's setmaxnreg.dec 40 returns, which the bug leaves out (a deadlock);
 *  SETMAXNREG_MISUSE       setmaxnreg.inc 160 in a warpgroup holding 168 registers per thread (twin: .dec);
 *  SMEM_ALIGNMENT_ASSUMED  a 128B-swizzled TMA tile in dynamic_smem() (only 128-byte alignment declared);
 *  BAR_ARRIVE_ORDER        named_barrier_arrive before the producer warp's stores (twin: after). */
enum {
  FA_SM90_BUG_ACC_READ_IN_FLIGHT = 0,
  FA_SM90_BUG_A_WRITE_IN_FLIGHT = 1,
  FA_SM90_BUG_SMEM_WRITE_IN_FLIGHT = 2,
  FA_SM90_BUG_NO_WGMMA_FENCE = 3,
  FA_SM90_BUG_UNCOMMITTED_AT_EXIT = 4,
  FA_SM90_BUG_UNWAITED_AT_EXIT = 5,
  FA_SM90_BUG_MBARRIER_DOUBLE_INIT = 6,
  FA_SM90_BUG_MBARRIER_UNORDERED_INIT = 7,
  FA_SM90_BUG_MBARRIER_PLAIN_ACCESS = 8,
  FA_SM90_BUG_EXPECT_TX_TOO_FEW = 9,
  FA_SM90_BUG_EXPECT_TX_TOO_MANY = 10,
  FA_SM90_BUG_WAITER_BEHIND = 11,
  FA_SM90_BUG_TMA_READ_BEFORE_WAIT = 12,
  FA_SM90_BUG_TMA_INTO_BUSY_STAGE = 13,
  FA_SM90_BUG_EXIT_WITH_TMA_IN_FLIGHT = 14,
  FA_SM90_BUG_MISSING_PROXY_FENCE = 15,
  FA_SM90_BUG_TMA_STORE_NO_FENCE = 16,
  FA_SM90_BUG_TMA_STORE_SRC_OVERWRITE = 17,
  FA_SM90_BUG_SETMAXNREG_EXHAUSTED = 18,
  FA_SM90_BUG_SETMAXNREG_MISUSE = 19,
  FA_SM90_BUG_SMEM_ALIGNMENT_ASSUMED = 20,
  FA_SM90_BUG_BAR_ARRIVE_ORDER = 21,
  FA_SM90_BUG_COUNT = 22,
};
typedef struct FaSelftestSm90BugParams {
  FaTensorMap map;
  const uint16_t *input; /* [64][64] f16 */
  float *out;            /* [384 * 64] */
  int32_t bug;
  int32_t planted;
} FaSelftestSm90BugParams;

/* A warp-specialised GEMM, c = a · bᵀ (b_mn_major = 0: b [n][k]) or a · b (b_mn_major = 1: b [k][n]), fp32
 * out, f16/bf16 in. Block tile 128 x 128, k tiles of 64, 3 warpgroups: warpgroup 0 produces (setmaxnreg.dec
 * 40; one thread issues TMA loads of A and B tiles into a 4-stage ring of full/empty mbarriers), warpgroups 1
 * and 2 consume (setmaxnreg.inc 232; each 64 rows with wgmma m64n128k16 SS from 128B-swizzled tiles, then
 * releases the stage). a_map: a [m][k] (box 64 x 128 rows); b_map: b with box 64 x 128 (K-major: 64 k x 128
 * n rows; MN-major: 64 n x 64 k, loaded twice per stage). m, n multiples of 128 are not required (TMA zero
 * fills). bug: FA_SELFTEST_WS_GEMM_* plants a pipeline bug. */
enum {
  FA_SELFTEST_WS_GEMM_CORRECT = 0,
  FA_SELFTEST_WS_GEMM_NO_EMPTY_WAIT = 1, /* the producer refills stages without waiting for their release */
  FA_SELFTEST_WS_GEMM_EARLY_RELEASE = 2, /* consumers release a stage before their wgmma on it completed */
  FA_SELFTEST_WS_GEMM_SHORT_TX = 3,      /* expect_tx declares the A tile only */
};
typedef struct FaSelftestWsGemmParams {
  FaTensorMap a_map;
  FaTensorMap b_map;
  float *c; /* [m][n] */
  int32_t m, n, k;
  int32_t dtype;
  int32_t b_mn_major;
  int32_t bug;
} FaSelftestWsGemmParams;

/* Prefill on sm_90a (kernels/prefill_sm90.cu): the same problem as FaPrefillParams (base), plus TMA tensor
 * maps of q, k and v, which the Rust side encodes (src/prefill/sm90.rs) for the backend that runs it. Each
 * map is 4-D, dimension 0 innermost: (D, rows, heads, batch) with byte strides (row, head, batch); varlen
 * maps have rows = total and a batch of 1. Box: 64 elements (one 128-byte swizzle span) x the kernel's
 * rows per tile (block_m for q, block_n for k and v) x 1 x 1, 128B swizzle. Rows past a dense sequence's
 * end are zero-filled by the TMA unit; in varlen a box may cover the next sequence's rows, which the kernel
 * masks (scores) and zeroes (V rows) so that nothing of a neighbour reaches the softmax or O.
 * block_m / block_n: the tile the maps were made for (the launcher checks they match its kernel). */
typedef struct FaPrefillSm90Params {
  FaTensorMap q_map;
  FaTensorMap k_map;
  FaTensorMap v_map;
  FaPrefillParams base;
  int32_t block_m, block_n;
} FaPrefillSm90Params;

int fa_selftest_wgmma(FaSelftestWgmmaParams params, FaExec *exec);
int fa_selftest_tma(FaSelftestTmaParams params, FaExec *exec);
int fa_selftest_sm90_bug(FaSelftestSm90BugParams params, FaExec *exec);
int fa_selftest_ws_gemm(FaSelftestWsGemmParams params, FaExec *exec);
int fa_prefill_sm90(FaPrefillSm90Params params, FaExec *exec);

/* The host build's fp32 <-> 16-bit conversions (kernels/include/fa/emu/host_types.h: round to nearest even,
 * overflow to inf, every NaN to 0x7fff, as CUDA), exposed so tests can compare them with an independent
 * implementation. dtype: FA_DTYPE_F16 or FA_DTYPE_BF16. */
void fa_host_float_to_16(const float *in, uint16_t *out, int64_t n, int32_t dtype);
void fa_host_16_to_float(const uint16_t *in, float *out, int64_t n, int32_t dtype);
/* The FP8 scalar model (fa/fp8_model.cuh), likewise: codes -> fp16 bits (exact) and fp32 -> codes (round to
 * nearest even, satfinite). kv_dtype: FA_KV_FP8_E4M3 or FA_KV_FP8_E5M2. */
void fa_host_fp8_to_half(const uint8_t *in, uint16_t *out, int64_t n, int32_t kv_dtype);
void fa_host_float_to_fp8(const float *in, uint8_t *out, int64_t n, int32_t kv_dtype);
/* The decode kernels' in-register FP8 -> 16-bit conversion (fa/fp8_convert.cuh: byte permute, shift,
 * power-of-two multiply), as the host build runs it (and the GPU below sm_89, and for bf16 everywhere):
 * codes -> fp16 (dtype FA_DTYPE_F16) or bf16 bits, n a multiple of 4. */
void fa_host_fp8_to_16_fast(const uint8_t *in, uint16_t *out, int64_t n, int32_t kv_dtype, int32_t dtype);

#ifdef __cplusplus
}
#endif

#endif /* FA_ABI_H */
