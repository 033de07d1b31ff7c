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
 * Rotary position embedding (docs/rope.md), fused into the ops that read Q or K. The kernels rotate by a
 * precomputed fp32 table (the host builds it: src/rope.rs; any frequency scheme, YaRN's attention factor
 * folded in): cos[p * cos_stride + i], sin[p * sin_stride + i] for position p < max_pos and pair i <
 * rotary_dim / 2. Pair i of a head row x is
 *   FA_ROPE_NEOX (rotate-half):  (x[i], x[i + rotary_dim/2])
 *   FA_ROPE_GPTJ (interleaved):  (x[2i], x[2i + 1])
 * and becomes (a, b) -> (fmaf(a, c, -(b * s)), fmaf(b, c, a * s)) in fp32 (c, s the table entries; the fma
 * pins the rounding, so the GPU, the emulator and the Rust model agree bit for bit). Dims >= rotary_dim pass
 * through. rotary_dim is even, 2..head_dim. cos == NULL: no rotation (the kernels run their plain path).
 * positions: int32 device data (append: one per new token; decode: one per sequence, or NULL for each
 * sequence's last position seq_len - 1; prefill and paged prefill: one per query token, or NULL for the
 * bottom-right positions the causal mask uses); a position outside [0, max_pos) is clamped into the table (memory
 * safety; the Rust layer rejects it where it can read it). The table rows and columns no position addresses
 * are never read.
 * ------------------------------------------------------------------------------------------------------- */
enum { FA_ROPE_NEOX = 0, FA_ROPE_GPTJ = 1 };
typedef struct FaRope {
  const float *cos;
  const float *sin;
  int64_t cos_stride, sin_stride; /* row strides, elements */
  const int32_t *positions;
  int32_t max_pos, rotary_dim, style;
} FaRope;

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
  /* V's and O's head dim Dv (v [.., Dv], o [.., Dv]; head_dim is Q's and K's, Dqk); 0 = head_dim. Any
   * supported head dim, narrower or wider than Dqk (DeepSeek: 192 / 128): the kernel of the wider one's width
   * runs with Q/K columns predicated at Dqk and V/O columns at Dv (fa_prefill_tile_policy). fa_prefill_sm90
   * takes Dv == Dqk and the pair 192 / 128 (a kernel of its own: fa_prefill_sm90_tile_policy). */
  int32_t head_dim_v;
  int32_t total_q, total_k; /* varlen only */
  int32_t dtype;
  int32_t causal;
  float scale;      /* softmax scale (1/sqrt(D) by default) */
  float scale_log2; /* scale * log2(e): the kernel works in the exp2 domain */
  FaScoreMod score_mod;
  /* Rotary embedding of q (rope.cos != NULL; the sm_80 kernels only: they run the _mod kernel of the width,
   * and fa_prefill_sm90 refuses it): query row i of sequence b rotated at rope.positions[q_row0_b + i]
   * (q_row0_b = b * seqlen_q dense, cu_seqlens_q[b] varlen: one int32 per query token) or, with positions
   * NULL, at its bottom-right position i + (Tk - Tq) (clamped to 0 when negative), after it is loaded and
   * before the first score (rounded to dtype, never written back). */
  FaRope rope;
  /* RoPE on K too (rope_k != 0, with rope.cos != NULL; the same table, rotary_dim and style): key row j of
   * sequence b rotated at rope_k_positions[k_row0_b + j] (k_row0_b = b * seqlen_k dense, cu_seqlens_k[b]
   * varlen: one int32 per key token) or, with rope_k_positions NULL, at j, as each K tile lands in shared
   * memory (fp32, rounded to dtype; K is never written back). rope_k == 0: K is taken as already rotated. */
  const int32_t *rope_k_positions;
  int32_t rope_k;
} FaPrefillParams;

/* ---------------------------------------------------------------------------------------------------------
 * Division by a runtime constant d (1 <= d < 2^31) without a divide instruction (fa/fast_divmod.cuh, which
 * proves it exact): shift = ceil(log2 d), mul = ceil(2^(32 + shift) / d) - 2^32 and mul64 = ceil(2^(64 +
 * shift) / d) - 2^64 (each fits its type); then n / d = (umulhi(n, mul) + n) >> shift for every 0 <= n < 2^31,
 * and (umul64hi(n, mul64) + n) >> shift for every 0 <= n < 2^63. Computed by the host (src/fast_divmod.rs);
 * the launchers re-check them against d.
 * ------------------------------------------------------------------------------------------------------- */
typedef struct FaDivisor {
  uint64_t mul64;
  uint32_t mul;
  int32_t shift;
} FaDivisor;

/* ---------------------------------------------------------------------------------------------------------
 * Paged KV cache: k_cache / v_cache [num_pages, page_size, Hkv, D]; block_table int32 [B, max_pages_per_seq]
 * (row stride block_table_stride); seq_lens int32 [B]. page_size: any value >= 1 (the Rust layer allows up
 * to its MAX_TOKENS, the longest sequence), with page_div its FaDivisor; max_pages_per_seq * page_size fits
 * int32 (token indices).
 * Element type (kv_dtype): FA_KV_SAME (0, what zero-initialised callers get) is the op's 16-bit dtype;
 * FA_KV_FP8_E4M3 / FA_KV_FP8_E5M2 store one byte per element (OCP FP8 as CUDA's __nv_fp8_e4m3 / _e5m2;
 * strides then count bytes). An FP8 cache has dequantisation scales: stored value x scale is the value
 * attention uses; k_scale / v_scale fp32, one per tensor (scale_head_stride 0: k_scale[0]) or one per KV head
 * (scale_head_stride 1: k_scale[h], h < Hkv): device data, loaded when the kernel runs (never folded into
 * these params, so a captured graph sees values rewritten in place). Meant finite and > 0 (the Rust layer
 * checks scales given as host floats); any other value only makes its KV head's outputs unspecified, since no
 * index or bound depends on a scale. Unused (may be NULL) for 16-bit caches. Append quantises: stored = fp8_rn_satfinite(float(x) / scale) (fp32 division, correctly
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
  FaDivisor page_div; /* page_size as a divisor: token -> page and slot -> page without a divide */
  int32_t num_pages, page_size, max_pages_per_seq;
  int32_t kv_dtype;          /* FA_KV_* */
  int32_t scale_head_stride; /* FP8: 0 = one scale per tensor, 1 = one per KV head */
  const float *k_scale;      /* FP8: dequantisation scales (see above) */
  const float *v_scale;
  /* Contiguous views (read by decode only: dense and varlen prefill past the tiled kernels' head dims run on
   * it), one page per sequence (max_pages_per_seq 1, page_size >= every sequence's length):
   *  - dense: block_table and seq_lens NULL: sequence b is page b (b < num_pages = B), page_size keys long;
   *  - varlen: block_table = seq_lens = cu_seqlens_k (int32 [B + 1], block_table_stride 1) and
   *    seq_lens_cumulative = 1: sequence b is "page" cu_seqlens_k[b] (a row index: k_page_stride =
   *    k_token_stride, num_pages = total_k), cu_seqlens_k[b + 1] - cu_seqlens_k[b] keys long (both ends
   *    clamped into [0, num_pages] first). */
  int32_t seq_lens_cumulative;
} FaPagedCache;

/* Append: write new tokens' K/V ([num_tokens, Hkv, D], head_dim a multiple of 8) into cache slots.
 * slot_mapping int64 [num_tokens]: slot = page * page_size + offset; a negative slot is padding and is
 * skipped, and so is a slot >= num_pages * page_size (device data: clamped, not checked by the host).
 * Slots must be distinct (two tokens writing one slot race). A 16-bit cache gets a dtype-agnostic copy; an FP8
 * cache (cache.kv_dtype) the quantised values (head_dim then a multiple of 16).
 * rope (cos != NULL): K row t is rotated at position rope.positions[t] on its way in (in fp32, then rounded
 * to the cache's 16-bit dtype or quantised as above, in one pass); V is never rotated. */
typedef struct FaAppendParams {
  const void *k;
  const void *v;
  const int64_t *slot_mapping;
  int64_t k_token_stride, k_head_stride;
  int64_t v_token_stride, v_head_stride;
  FaPagedCache cache;
  int32_t num_tokens, heads_kv, head_dim;
  int32_t dtype;
  FaRope rope;
  /* V's head dim Dv (v [num_tokens, Hkv, Dv], v_cache [.., Dv]; head_dim is K's, Dqk); 0 = head_dim. A
   * multiple of 8 (16 for an FP8 cache), narrower or wider than Dqk. */
  int32_t head_dim_v;
} FaAppendParams;

/* Decode: one query token per sequence over the paged cache.
 * q [B, Hq, D], o [B, Hq, D], lse [B, Hq] (natural log) or NULL. head_dim: decode's range (FA_DECODE_MAX_HEAD_DIM).
 * Short queries (paged prefill's streaming path, docs/scheduling.md): with cu_seqlens_q != NULL sequence b owns
 * the q/o rows cu_seqlens_q[b] .. cu_seqlens_q[b+1] (clamped to [0, total_q]; q_len_b <= max_seqlen_q) and
 * the semantics are paged prefill's (below): row i sits at key position seq_len_b - q_len_b + i, sees the keys
 * up to it with causal (else to seq_len_b - 1, or to position + window_right), from position - window_left on;
 * ALiBi distances are from that position; rope.positions (if any) has one entry per q row. A CTA serves
 * rows_per_cta packed rows (token r / G, query head kv_head * G + r % G) of one KV head, reading each K/V byte
 * once for all of them: 16, 32, 64 or 128, at most the width's fa_tile_policy block_m (128 at width 64, 64 at
 * 128, 16 above); more than its narrow_rows runs wide CTAs of 2 * threads threads (decode/traits.cuh).
 * With cu_seqlens_q == NULL: one row
 * per sequence (row b, total_q = B, max_seqlen_q = 1, causal). lse[row, h] is at row * lse_batch_stride +
 * h * lse_head_stride. Partials (split-KV) are [num_splits, total_q, Hq, D] / [num_splits, total_q, Hq].
 * A CTA reads only the keys [w, e) its rows see: w = max(0, p0 - window_left) (0 without a window), p0 the
 * position of its first row (decode: seq_len - 1), e = seq_len (short causal queries: its last row's position + 1).
 * Split-KV: with num_splits > 1, split s covers tokens [w + s*split_tokens, w + (s+1)*split_tokens) of that
 * range (the last split runs to e); split_tokens is a multiple of 64 (every KV tile divides it). Partials go
 * to the fp32 workspace partial_o [num_splits, B, Hq, D] / partial_lse [num_splits, B, Hq] (contiguous) and
 * the launcher then runs the merge kernel on the same stream. With num_splits == 1 the kernel writes o / lse
 * directly and the workspace may be NULL.
 * seq_lens / block_table are device data the host cannot check without a sync: the kernel clamps a length
 * into [0, max_pages_per_seq * page_size] and reads the rows of an out-of-range page id as zeros. */
/* A scheduled decode's unit of work (src/schedule.rs): sequence b, CTA row block head_block (as the uniform
 * grid's y, with n = ceil(max packed rows / rows_per_cta) blocks per KV head: KV head head_block / n, row
 * block head_block % n), split `split` of
 * num_splits, each split_tokens long (laid out from the window's start; the last runs to seq_len, as in the
 * uniform grid). With num_splits == 1 the unit writes o / lse; else the fp32 partial of state
 * partial_base + i * num_splits + split for its query token i (decode: i = 0): partial_o [num_partials, Hq, D] /
 * partial_lse [num_partials, Hq], so a row's states are consecutive for the merge. */
typedef struct FaDecodeWork {
  int32_t b, head_block, split, num_splits, split_tokens, partial_base;
} FaDecodeWork;

/* One output row of a merge over a row list: states first_state .. first_state + num_states - 1 of row
 * out_row (out_row < 0: a padding entry, skipped). */
typedef struct FaMergeRow {
  int32_t out_row, first_state, num_states;
} FaMergeRow;

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
  /* Scheduled launch (work != NULL; num_splits, split_tokens unused): grid (num_ctas, 1, 1), CTA x runs the
   * units work[work_indptr[x] .. work_indptr[x+1]) in turn (a CTA with none exits), then the merge kernel
   * combines merge_rows[0 .. num_merge_rows) (its padding entries skipped); num_partials bounds the states. */
  const FaDecodeWork *work;
  const int32_t *work_indptr; /* [num_ctas + 1], non-decreasing, work_indptr[num_ctas] <= num_work */
  const FaMergeRow *merge_rows;
  int32_t num_ctas, num_work, num_merge_rows, num_partials;
  /* Rotary embedding of q (cos != NULL): each query row rotated at rope.positions[row] (row = b without
   * cu_seqlens_q), or at its key position (seq_len_b - 1 for decode) when positions is NULL, after it is read
   * and before the first score (never written back). */
  FaRope rope;
  /* Query rows (see above): NULL = one per sequence. */
  const int32_t *cu_seqlens_q;
  int64_t lse_head_stride; /* decode: 1 */
  int32_t total_q, max_seqlen_q;
  int32_t causal; /* only read with cu_seqlens_q or seqlen_q */
  int32_t rows_per_cta; /* packed rows per CTA (see above): 16 * 2^k <= the width's block_m */
  /* Uniform query rows (dense prefill past the tiled kernel's head dims; cu_seqlens_q NULL, seqlen_q > 0):
   * sequence b owns seqlen_q rows with the short queries' semantics (causal from `causal`); its row i is flat
   * row b * seqlen_q + i (the row rope.positions is indexed by) and lives at q + b * q_seq_stride +
   * i * q_batch_stride + h * q_head_stride, o likewise, lse at b * lse_seq_stride + i * lse_batch_stride +
   * h * lse_head_stride. One split, no work list; total_q = B * seqlen_q, max_seqlen_q = seqlen_q. The seq
   * strides are unused otherwise. */
  int64_t q_seq_stride, o_seq_stride, lse_seq_stride;
  int32_t seqlen_q;
  /* 1: the grid is (Hkv * row blocks, 1, B), so long prefills' row blocks are bound by 2^31 - 1, not
   * 65535 (one split, no work list); 0: (num_splits, Hkv * row blocks, B). */
  int32_t head_blocks_in_x;
  /* V's and O's head dim Dv (v_cache [.., Dv], o [.., Dv], partials [.., Dv]; head_dim is Q's and K's,
   * Dqk); 0 = head_dim. DeepSeek's 192 / 128: the kernel of decode_width(max(Dqk, Dv)) runs with K columns
   * predicated at Dqk and V / O columns at Dv (no other instantiation). */
  int32_t head_dim_v;
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
 * Split-KV: with num_splits > 1, split s of a CTA covers keys [k0 + s*split_tokens, k0 + (s+1)*split_tokens),
 * k0 the first key its rows see (a window's left edge; 0 without one), rounded down to the KV tile (the last
 * split runs to seq_len; split_tokens a multiple of 64) and writes fp32 partials partial_o [num_splits, total_q,
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
  /* Rotary embedding of q (rope.cos != NULL; runs the _mod kernel of the width): query token t of sequence b
   * rotated at rope.positions[cu_seqlens_q[b] + t] (one int32 per packed query token) or, with positions
   * NULL, at its bottom-right position t + (seq_len_b - q_len_b). The cache's K must have been rotated by
   * the same table (append with rope). */
  FaRope rope;
  /* V's and O's head dim Dv (v_cache [.., Dv], o [.., Dv], partials [.., Dv]; head_dim is Q's and K's,
   * Dqk); 0 = head_dim. The kernel of paged_prefill_width(max(Dqk, Dv)) runs with K columns predicated at
   * Dqk and V / O columns at Dv. */
  int32_t head_dim_v;
} FaPagedPrefillParams;

/* ---------------------------------------------------------------------------------------------------------
 * Multi-head latent attention (MLA: DeepSeek-V2/V3, Kimi K2; docs/mla.md), the absorbed form over a paged
 * latent cache. The cache is an FaPagedCache of one KV head whose rows are [kv_lora_rank latent | rope_dim
 * rope key] (k_cache [num_pages, page_size, 1, kv_lora_rank + rope_dim]; v_cache is not read: V is the first
 * kv_lora_rank columns of the same rows). kv_lora_rank: a multiple of 8 up to FA_MLA_MAX_LATENT_DIM (512:
 * DeepSeek's); rope_dim: a multiple of 8 up to FA_MLA_MAX_ROPE_DIM (64). 16-bit caches only (kv_dtype
 * FA_KV_SAME).
 *
 * Append: latent [num_tokens, kv_lora_rank] and k_pe [num_tokens, rope_dim] (row strides, unit column
 * stride) written into the row of slot slot_mapping[t] (negative: padding, skipped; past the pool: skipped).
 * rope (cos != NULL): k_pe rotated at rope.positions[t] (rotary_dim <= rope_dim, fp32, rounded to dtype)
 * on its way in; the latent is never rotated.
 *
 * Decode: q [total_q, Hq, kv_lora_rank + rope_dim] (latent part first: q_nope already multiplied by W_UK,
 * then q_pe rotated), o [total_q, Hq, kv_lora_rank] (still to be multiplied by W_UV), lse [total_q, Hq]
 * (natural log; row stride lse_row_stride, head stride 1) or NULL. cu_seqlens_q (int32 [B+1], clamped to
 * [0, total_q]; q_len_b <= max_seqlen_q) gives sequence b its q rows, which sit at key positions
 * seq_len_b - q_len_b + i and see the keys up to their own (causal, bottom-right: speculative / MTP
 * verification); NULL: one row per sequence (row b, total_q = B, max_seqlen_q = 1). scale: the caller's
 * (DeepSeek: 1/sqrt(192)), finite and > 0. A CTA serves FA_MLA_ROWS packed rows (token r / Hq, head r % Hq)
 * of one sequence and split: grid (num_splits, ceil(max_seqlen_q * Hq / FA_MLA_ROWS), B). Split-KV as decode:
 * split s covers keys [s * split_tokens, (s + 1) * split_tokens) (the last runs to the end; split_tokens a
 * multiple of FA_SPLIT_GRANULE), fp32 partials partial_o [num_splits, total_q, Hq, kv_lora_rank] /
 * partial_lse [num_splits, total_q, Hq], merged by the launcher with fa_merge on the same stream.
 * ------------------------------------------------------------------------------------------------------- */
#define FA_MLA_MAX_LATENT_DIM 512
#define FA_MLA_MAX_ROPE_DIM 64
#define FA_MLA_ROWS 32
typedef struct FaMlaAppendParams {
  const void *latent;
  const void *k_pe;
  const int64_t *slot_mapping;
  int64_t latent_token_stride, k_pe_token_stride;
  FaPagedCache cache;
  int32_t num_tokens, kv_lora_rank, rope_dim;
  int32_t dtype;
  FaRope rope;
} FaMlaAppendParams;

typedef struct FaMlaDecodeParams {
  const void *q;
  void *o;
  float *lse;
  float *partial_o;
  float *partial_lse;
  const int32_t *cu_seqlens_q;
  int64_t q_row_stride, q_head_stride;
  int64_t o_row_stride, o_head_stride;
  int64_t lse_row_stride;
  FaPagedCache cache;
  int32_t batch, heads_q, kv_lora_rank, rope_dim;
  int32_t total_q, max_seqlen_q;
  int32_t num_splits, split_tokens;
  int32_t dtype;
  float scale;
  float scale_log2;
} FaMlaDecodeParams;

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
  /* Row list (or NULL): outer row n < rows_outer merges row_list[n].num_states states of output row
   * row_list[n].out_row, state s at index row_list[n].first_state + s (o_outer_stride / lse_outer_stride
   * unused; num_states bounds every count), written at out_row's output position. */
  const FaMergeRow *row_list;
  /* Rows of o / lse (the launch's own, not a table's): an outer row (or a row list's out_row) at or past it
   * is skipped, and a row list's states are clamped into [0, num_states). The table is device data (a CUDA
   * graph replays it after a later prepare), so the kernel bounds it rather than trust it. */
  int32_t out_rows;
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
  uint64_t block_threads, smem_bytes; /* the launch's threads per CTA and dynamic shared memory */
  /* Balance: per-CTA global bytes read and mma, over the CTAs that stored any global byte ("active": a CTA
   * of a fixed-size grid that finds no work exits without storing). */
  uint64_t active_blocks;
  uint64_t max_block_bytes_read, active_bytes_read;
  uint64_t max_block_mma, active_mma;
  uint64_t global_bytes_read[FA_EMU_MAX_REGIONS];    /* loads, cp.async sources (predicate true), atomics */
  uint64_t global_bytes_written[FA_EMU_MAX_REGIONS]; /* stores, atomics */
  uint64_t global_loads[FA_EMU_MAX_REGIONS]; /* load instructions (ld_global, one per lane): the requests */
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
  uint64_t tma_load_bytes_evict_first; /* of tma_load_bytes: loaded with an L2 evict_first policy */
  uint64_t tma_load_bytes_evict_last;  /* of tma_load_bytes: loaded with an L2 evict_last policy */
  /* Bank conflicts (kernels/emu/bank_conflicts.cpp): warp-wide shared accesses (ld/st, cp.async destinations,
   * ldmatrix), the wavefronts they take on 32 banks x 4 bytes, and the wavefronts they would take without
   * conflicts (one per 128-byte phase with an active lane); accesses past the per-step buffer go uncounted. */
  uint64_t shared_requests;
  uint64_t shared_wavefronts;
  uint64_t shared_ideal_wavefronts;
  uint64_t shared_uncounted;
  /* Prefetch slack of TMA tile streams (one stream per tensor map a block loads through; a tile is the boxes
   * of one outer coordinate, panels together). When the first box of tile w+1 of a stream is issued, the
   * executor asks whether the issuing thread is ordered after (happens-before, the race detector's vector
   * clocks) the completion of any wgmma that read tile w of that stream: if so the load waited for the
   * consumer to finish tile w (late), else it was issued while tile w could still be in use (prefetched). */
  uint64_t tma_tiles_prefetched;
  uint64_t tma_tiles_late;
  /* Of the tiles with two before them in their stream, those whose issuer is ordered after no completed wgmma
   * read of tile w nor of tile w-1: issued while both could still be in use (two tiles of slack, what a
   * three-stage ring that frees each stage as soon as it is read gives). */
  uint64_t tma_tiles_two_ahead;
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
 * Head dims and tile policy: what the launchers choose, read by the Rust side instead of mirrored there (its
 * grids, workspaces, schedules and cost models). Each launcher and its policy read the same kernel traits,
 * so the two cannot drift.
 *   FA_MIN_HEAD_DIM .. FA_MAX_HEAD_DIM, multiples of FA_HEAD_DIM_STEP: the head dims some op takes; each op
 *   takes every such dim up to its own maximum, FA_<OP>_MAX_HEAD_DIM (its widest kernel: fa/head_dim.cuh
 *   checks the two agree), and its launcher and fa_tile_policy answer FA_ERR_UNSUPPORTED above it.
 *   FA_DECODE_ROWS: the rows of one decode row group (the mma M dimension); a CTA serves 1, 2, 4 or 8 groups
 *   (FaDecodeParams::rows_per_cta), up to the policy's block_m.
 *   FA_SPLIT_GRANULE: split-KV decode and paged prefill take split_tokens in multiples of it.
 * fa_tile_policy(op, head_dim, variant, kv_dtype, out): the kernel a call of that class runs and its launch
 * shape (the same for fp16 and bf16); FA_ERR_UNSUPPORTED when no kernel serves it. `variant` is, per op:
 *   FA_OP_PREFILL, FA_OP_PAGED_PREFILL, FA_OP_DECODE: the score-variant (_mod) kernel;
 *   FA_OP_PREFILL_SM90: a masked call (causal or windowed), which keeps D 128 at 128 x 128.
 * kv_dtype (FA_KV_*): the cache's element type (paged prefill and decode; FA_KV_SAME elsewhere).
 * ------------------------------------------------------------------------------------------------------- */
#define FA_MIN_HEAD_DIM 32
#define FA_MAX_HEAD_DIM 512
#define FA_HEAD_DIM_STEP 8
/* Dense/varlen prefill and paged prefill run their tiled kernels up to FA_*_TILED_MAX_HEAD_DIM and the decode
 * kernel's streaming path above (FaDecodeParams' uniform rows and contiguous cache views; paged prefill's
 * short-query path), whose fa_tile_policy is FA_OP_DECODE's: fa_tile_policy(FA_OP_PREFILL / _PAGED_PREFILL)
 * answers for the tiled kernels only. */
#define FA_PREFILL_MAX_HEAD_DIM 512
#define FA_PAGED_PREFILL_MAX_HEAD_DIM 512
#define FA_PREFILL_TILED_MAX_HEAD_DIM 256       /* the sm_80 prefill kernel */
#define FA_PAGED_PREFILL_TILED_MAX_HEAD_DIM 256 /* the tiled paged prefill kernel */
#define FA_DECODE_MAX_HEAD_DIM 512        /* paged decode */
#define FA_DECODE_ROWS 16
#define FA_SPLIT_GRANULE 64 /* split-KV: split_tokens is a multiple of this (every KV tile divides it) */
enum { FA_OP_PREFILL = 0, FA_OP_PREFILL_SM90 = 1, FA_OP_PAGED_PREFILL = 2, FA_OP_DECODE = 3 };

typedef struct FaTilePolicy {
  int32_t width;       /* the instantiated head-dim width serving the call (>= head_dim; columns past it zero) */
  int32_t block_m;     /* rows per CTA: query rows (prefill), packed query rows (paged prefill), the most packed rows (decode) */
  int32_t block_n;     /* keys per KV tile */
  int32_t stages;      /* K/V tiles in flight (shared-memory buffers) */
  int32_t threads;     /* threads per CTA */
  int32_t smem_bytes;  /* dynamic shared memory per CTA */
  int32_t min_ctas_per_sm; /* the CTAs per SM the kernel's launch bounds are built for */
  int32_t lean;        /* prefill's register-lean KV loop (K/V bases and row sums parked in shared memory) */
  int32_t score_splits; /* decode: warps summing one S tile, each Q.K over width / score_splits columns; else 0 */
  int32_t narrow_rows; /* decode: the most rows per CTA of `threads` threads; a launch of more (up to block_m)
                          runs wide CTAs of 2 * threads (decode/traits.cuh); else 0 */
} FaTilePolicy;

int fa_tile_policy(int32_t op, int32_t head_dim, int32_t variant, int32_t kv_dtype, FaTilePolicy *out);
/* FA_OP_PREFILL's policy for a Q.K head dim and a V head dim (FaPrefillParams::head_dim_v): the kernel of the
 * wider one's width, or the next one with predicated columns (Dv != Dqk at 128 runs at 160). */
int fa_prefill_tile_policy(int32_t head_dim, int32_t head_dim_v, int32_t variant, FaTilePolicy *out);
/* FA_OP_PREFILL_SM90's policy for a Q.K head dim and a V head dim (masked: causal or windowed): D 64, 128, 256
 * with Dv = D, and Dqk 192 / Dv 128; FA_ERR_UNSUPPORTED for any other pair. width is the Q.K head dim. */
int fa_prefill_sm90_tile_policy(int32_t head_dim, int32_t head_dim_v, int32_t masked, FaTilePolicy *out);

/* ---------------------------------------------------------------------------------------------------------
 * Launchers (kernels/<op>.cu, host build).
 * ------------------------------------------------------------------------------------------------------- */
int fa_prefill(FaPrefillParams params, FaExec *exec);
int fa_append(FaAppendParams params, FaExec *exec);
int fa_decode(FaDecodeParams params, FaExec *exec);
int fa_merge(FaMergeParams params, FaExec *exec);
int fa_paged_prefill(FaPagedPrefillParams params, FaExec *exec);
int fa_mla_append(FaMlaAppendParams params, FaExec *exec);
int fa_mla_decode(FaMlaDecodeParams params, FaExec *exec);

/* ---------------------------------------------------------------------------------------------------------
 * sm_90a: tensor maps and the Hopper prefill's params (kernels/prefill_sm90.cu).
 * ------------------------------------------------------------------------------------------------------- */

/* A TMA tensor map: 128 bytes, 128-byte aligned (CUDA 13's CUtensorMap is alignas(128); the TMA unit reads
 * it in place), passed inside a kernel's params (FA_KERNEL_SM90 makes them __grid_constant__). On the GPU
 * it holds the driver's CUtensorMap (cuTensorMapEncodeTiled); on the emulator an FaEmuTensorMap. The Rust side makes
 * both, after one validation (src/runtime/tensor_map.rs). */
typedef struct FaTensorMap {
  uint64_t opaque[16];
} __attribute__((aligned(128))) FaTensorMap;

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

/* Prefill on sm_90a (kernels/prefill_sm90.cu): the same problem as FaPrefillParams (base), plus TMA tensor
 * maps of q, k and v, which the Rust side encodes (src/prefill/sm90.rs) for the backend that runs it. Each
 * map is 4-D, dimension 0 innermost: (D, rows, heads, batch) with byte strides (row, head, batch); varlen
 * maps have rows = total and a batch of 1; D is base.head_dim for q and k, the V head dim (base.head_dim_v,
 * 0 = head_dim) for v and o. Box: 64 elements (one 128-byte swizzle span) x the kernel's
 * rows per tile (block_m for q, block_n for k and v) x 1 x 1, 128B swizzle. Rows past a dense sequence's
 * end are zero-filled by the TMA unit; in varlen a box may cover the next sequence's rows, which the kernel
 * masks (scores) and zeroes (V rows) so that nothing of a neighbour reaches the softmax or O.
 * block_m / block_n: the tile the maps were made for (the launcher checks they match its kernel).
 * o_tma: 1 when o_map (box 64 x 16 rows x 1 x 1, 128B swizzle, o's strides; dense calls only: a varlen box
 * would write into the next sequence) is valid: the epilogue stores O by TMA (fa/hopper/epilogue.cuh); 0:
 * 16-byte stores.
 * l2_hints: 1 = Q tiles loaded evict_first and K/V evict_last in L2 (FA3's hints), 0 = every load
 * evict_normal.
 * ctas: the persistent grid (CTAs resident at once: SM count x occupancy, src/prefill/sm90.rs); the launch
 * has min(ctas, work tiles) CTAs, each walking the tiles ctas apart (fa/hopper/tile_scheduler.cuh); 0 = one
 * CTA per tile. */
typedef struct FaPrefillSm90Params {
  FaTensorMap q_map;
  FaTensorMap k_map;
  FaTensorMap v_map;
  FaTensorMap o_map; /* read only with o_tma */
  FaPrefillParams base;
  int32_t block_m, block_n;
  int32_t ctas;
  int32_t o_tma;
  int32_t l2_hints;
} FaPrefillSm90Params;

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
/* The model of ex2.approx.ftz.f32 (kernels/emu/math.cpp): the one the emulator's fast_exp2 computes and the
 * PTX executor (ptx-exec) runs for every ex2.approx.ftz.f32 of nvcc's PTX, so that both share one model. */
float fa_host_ex2_approx_ftz(float x);
/* The kernels' division by a page size (fa/fast_divmod.cuh), as the host build runs it: fa_host_divisor
 * writes d's FaDivisor (what the launchers check a cache's page_div against; returns FA_ERR_INVALID for d
 * outside 1 .. 2^31 - 1); fa_host_divmod divides n[i] by d through `div` into quot[i], rem[i]: the 32-bit
 * form (wide = 0, token indices: 0 <= n < 2^31) or the 64-bit one (wide = 1, append's slots: 0 <= n < 2^63). */
int fa_host_divisor(int32_t d, FaDivisor *out);
void fa_host_divmod(FaDivisor div, int32_t d, const int64_t *n, int64_t *quot, int64_t *rem, int64_t count,
                    int32_t wide);

#ifdef __cplusplus
}
#endif

#endif /* FA_ABI_H */
