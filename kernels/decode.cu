// Paged decode: one query token per sequence against its paged K/V, GQA-aware and split-KV
// (flash-decoding). Shapes: q [B, Hq, D], o [B, Hq, D], lse [B, Hq] (natural log) or NULL; the cache as in
// fa/paged_view.cuh. The CTA mapping, tile and pipeline are described in fa/decode/traits.cuh; the per-warp
// math in fa/decode/warp_attention.cuh. The kernel's D is a tile width that serves every head dim
// fa/head_dim.cuh maps to it (p.head_dim <= D): a thread whose 16-byte column chunk lies at or past the head
// dim zero-fills it (Q, K and V alike, never reading global memory), so the padded columns add nothing to
// the scores and give zero output columns, which are not stored. A V head dim Dv of its own (p.head_dim_v;
// DeepSeek's 192 / 128) runs at the width of the wider of the two, K's chunks predicated at Dqk and V's at
// Dv (the zero K columns add nothing to S, the zero V columns give zero O columns): O and the split partials
// are [.., Dv].
//
// Short queries (paged prefill's streaming path, issue 25; fa/abi.h): with cu_seqlens_q a CTA's 16 rows are
// packed (token, query head) rows of a sequence's q_len new tokens, at their own key positions. The KV loop is
// decode's (the same deep cp.async pipeline, 3 CTAs per SM); what changes is the key range (from the first
// row's window start to the last row's causal end) and, in the few tiles at its edges where the rows' ranges
// differ, a per-row mask (WarpAttention::mask_outside); ALiBi distances and RoPE positions are per row.
// Uniform rows (dense prefill past its tiled kernel's head dims, 264-512; fa/abi.h): every sequence owns
// seqlen_q rows placed by per-sequence strides, over a contiguous view of dense or varlen K/V
// (fa/paged_view.cuh), one split; their grid (head_blocks_in_x) is (Hkv * row blocks, 1, B).
//
// Grid (num_splits, Hkv * ceil(max_seqlen_q * G / 16), B). A CTA walks its chunk [begin, end) of the sequence in KV tiles:
//   prologue: Q and tiles 0..kStages-2 in flight (cp.async, 16 bytes per instruction);
//   loop j:   wait for tile j, barrier, issue tile j+kStages-1, compute tile j (S, online softmax, P.V);
//   epilogue: merge the token groups' states through shared memory, normalise, store O/LSE (one split) or
//             the fp32 partial (O, LSE) of this split, which merge.cu combines.
// Page lookups are hoisted out of the load loop: the page id of each row of a tile is fetched one tile ahead
// (one ld_global by the row's thread, its latency hidden behind the current tile's math), turned into the
// row's K/V element offsets by that thread, and parked in a two-slot ring in shared memory; issuing a tile is
// then one shared load + two cp.async per row and thread.
//
// Unused cache slots (past seq_len in the last page, or pages of other sequences) are never read: their rows
// are zero-filled by the cp.async predicate and their scores set to -inf before the max, so P = 0 against
// V = 0. seq_len 0 (or a split past the end) leaves m = -inf, l = 0: O = 0, LSE = -inf by the shared guards.
// A token inside [0, seq_len) whose block-table entry is out of range (kNoPage) is a *hole*: zero-filled like
// the tail, and masked to -inf too (a zero key would score 0 and dilute the softmax). The thread that
// publishes a tile's rows already knows which are holes; its warp's ballot of them is parked per tile in
// shared memory, and a warp masks only when its word is non-zero (one shared load per tile otherwise).
//
// Score variants (fa/score_mod.cuh). A sliding window (left bound w) moves the start: only the tokens
// [max(0, seq_len - 1 - w), seq_len) exist for this kernel (splits are laid out from there), so the pages
// left of the window are never looked up or read. Softcap and ALiBi change every score: the _mod kernels
// (kVariant) map the scores to the exp2 domain with them. A sink joins the single-split epilogue's sum;
// under split-KV the merge adds it (once, not per split).
//
// FP8 cache (kFp8): the cp.async path moves the FP8 rows (16 elements per 16-byte chunk) into swizzled FP8
// stages (fa/decode/traits.cuh, Fp8SwizzledTile), and the warps read them with the same ldmatrix pattern as
// 16-bit tiles, converting in registers on the way to the mma (fa/decode/warp_attention.cuh,
// fa/fp8_convert.cuh): no second trip through shared memory, no extra barrier. The dequantisation scales of
// this CTA's KV head are folded in: k_scale into the score scale (and ScoreMod's), v_scale into the
// epilogue's normalisation (so the split partials carry it too).
//
// RoPE on q (p.rope, fa/rope.cuh): once Q has landed in shared memory (the prologue's first wait), each
// thread rotates whole pairs of it in place (fp32 arithmetic, rounded back to T: the mma's operand type) at
// the sequence's position, and one more barrier publishes them before the warps read their fragments. Q is
// still read from global memory once and never written back; the KV loop does not change. A run-time
// switch, not another instantiation: it costs one uniform branch per CTA when off.
#include "fa/attention_state.cuh"
#include "fa/decode/traits.cuh"
#include "fa/decode/vec8.cuh"
#include "fa/decode/warp_attention.cuh"
#include "fa/fp8_tile.cuh"
#include "fa/head_dim.cuh"
#include "fa/intrinsics.cuh"
#include "fa/paged_view.cuh"
#include "fa/prefill/seq_info.cuh"
#include "fa/rope.cuh"
#include "fa/score_mod.cuh"
#include "fa/split_kv.cuh"
#include "fa/namespace.cuh"

FA_NAMESPACE_BEGIN
namespace decode {
// File-local: kernels and launch helpers are reached only through this file's extern "C" launcher. (The GPU
// and emulator builds never share a symbol in any case: fa/namespace.cuh.)
namespace {


// Element (row, column j) of a swizzled 16-bit shared tile, and scalar conversions of its bits.
template <class T, int D> FA_DEVICE uint16_t *q_element(unsigned char *tile, int row, int j) {
  return reinterpret_cast<uint16_t *>(tile + SwizzledTile<D>::offset(row, j / 8)) + j % 8;
}
template <class T> FA_DEVICE float half_to_float(uint16_t bits) {
  float lo, hi;
  unpack2<T>((uint32_t)bits, lo, hi);
  return lo;
}
template <class T> FA_DEVICE uint16_t float_to_half(float x) { return (uint16_t)(pack2<T>(x, 0.0f) & 0xffffu); }

// Rotates the first `rows` Q rows of the swizzled tile q_smem in place, row r at table row table_row(r), then
// a barrier: the warps read them after it. Thread i takes pair i of every row; rows are packed token-major
// (consecutive rows share a token, and decode's all do), so (cos, sin) is loaded once per token, not per row.
// Both elements of a pair are the thread's own, so the in-place update needs no barrier of its own.
template <class T, int D, class TableRow>
FA_DEVICE void rotate_q_tile(const FaRope &r, unsigned char *q_smem, int rows, TableRow table_row) {
  const int half = r.rotary_dim / 2;
  for (int i = thread_idx(); i < half; i += Traits<D>::kThreads) {
    const int ja = r.style == FA_ROPE_GPTJ ? 2 * i : i;
    const int jb = r.style == FA_ROPE_GPTJ ? 2 * i + 1 : i + half;
    float c = 1.0f, sn = 0.0f;
    int loaded = -1;
    for (int row = 0; row < rows; ++row) {
      const int row_t = table_row(row);
      if (row_t != loaded) {
        rope_cos_sin(r, row_t, i, c, sn);
        loaded = row_t;
      }
      uint16_t *a = q_element<T, D>(q_smem, row, ja);
      uint16_t *b = q_element<T, D>(q_smem, row, jb);
      const float xa = half_to_float<T>(ld_shared(a));
      const float xb = half_to_float<T>(ld_shared(b));
      st_shared(a, float_to_half<T>(rope_rotate(xa, xb, c, sn, true)));
      st_shared(b, float_to_half<T>(rope_rotate(xb, xa, c, sn, false)));
    }
  }
  sync_threads();
}

// One CTA's piece of work: sequence b, grid row block head_block (KV head and block of its packed query rows),
// split `split` of num_splits, each split_tokens long; scheduled with num_splits > 1, its query token i's partial
// is state `state` + i * num_splits of the workspace ([state, Hq, D]; the uniform grid's states are
// [split, total_q] instead).
struct Unit {
  int b, head_block, split, num_splits, split_tokens, state;
};

// The query rows one CTA serves: 16 packed rows of one sequence and KV head (packed row r: token r / G of
// query head kv_head * G + r % G), their key positions, and the keys they see together.
struct QueryRows {
  int group, kv_head;
  int q_start, q_len; // the sequence's flat rows: decode's one (row b), its cu_seqlens_q range, or b * seqlen_q ..
  int addr0;          // the address row of its token 0: q_start, or 0 with uniform rows (their seq strides place b)
  int packed0, rows;  // the CTA's first packed row, and how many of its kRows exist
  int pos_base;       // key position of token 0: seq_len - q_len (row i of the sequence sits at pos_base + i)
  FA_DEVICE int token(int r) const { return (packed0 + r) / group; }
  FA_DEVICE int head(int r) const { return kv_head * group + (packed0 + r) % group; }
  FA_DEVICE int position(int r) const { return pos_base + token(r); }
};

// How far right of its own position a row sees: 0 with causal (decode's single row always), else the window's
// right bound, else unbounded (INT32_MAX: past every key). One definition for the CTA's key range and the
// per-row masks.
// kWide: the widths that take uniform rows (traits.cuh, kServesWidePrefill; the others never read seqlen_q).
template <bool kWide> FA_DEVICE int64_t right_bound(const FaDecodeParams &p) {
  const bool causal = (p.cu_seqlens_q == nullptr && !(kWide && p.seqlen_q > 0)) || p.causal != 0;
  return causal ? 0 : (p.score_mod.window_right >= 0 ? p.score_mod.window_right : (int64_t)INT32_MAX);
}

// Packed row blocks per KV head of CTAs of `rows` rows: ceil(max_seqlen_q * G / rows) (decode: ceil(G / rows)).
// kWide: uniform rows possible (the host's answer for every launch; a kernel's for its width).
template <bool kWide = true> FA_HOST_DEVICE int64_t row_blocks(const FaDecodeParams &p, int rows) {
  const int64_t max_q = p.cu_seqlens_q != nullptr || (kWide && p.seqlen_q > 0) ? p.max_seqlen_q : 1;
  return (max_q * (p.heads_q / p.heads_kv) + rows - 1) / rows;
}
template <bool kWide = true> FA_HOST_DEVICE int64_t row_blocks(const FaDecodeParams &p) {
  return row_blocks<kWide>(p, p.rows_per_cta);
}

// Row groups of the launch (traits.cuh): rows_per_cta / 16, checked by the launcher to be a power of two <=
// kMaxRowGroups; a compile-time 1 where the width has a single row group.
template <int D> FA_DEVICE int row_groups(const FaDecodeParams &p) {
  return Traits<D>::kMaxRowGroups == 1 ? 1 : p.rows_per_cta / Traits<D>::kRows;
}
// Whether the launch runs wide CTAs (8 warps, traits.cuh): more rows per CTA than a narrow CTA serves.
template <int D> FA_HOST_DEVICE bool wide_launch(const FaDecodeParams &p) {
  return Traits<D>::kWideFactor > 1 && p.rows_per_cta > Traits<D>::kNarrowRows;
}

template <class T, int D, bool kVariant, bool kFp8> FA_DEVICE void decode_unit(const FaDecodeParams &p, const Unit &u) {
  using Tr = Traits<D, kFp8>;
  constexpr bool kWide = Tr::kServesWidePrefill; // uniform rows and contiguous views (compiled in here only)
  using Tile = SwizzledTile<D>;
  constexpr int kTileTokens = Tr::kTileTokens;
  constexpr int kStages = Tr::kStages;

  unsigned char *smem = dynamic_smem<unsigned char>();
  unsigned char *q_smem = smem + Tr::kQOffset;
  unsigned char *stages = smem + Tr::kStageOffset;
  RowOffsets *row_ring = reinterpret_cast<RowOffsets *>(smem + Tr::kRowRingOffset);
  float *stats = reinterpret_cast<float *>(smem + Tr::kStatsOffset);
  uint32_t *holes = reinterpret_cast<uint32_t *>(smem + Tr::kHoleOffset); // [kHoleSlots][kHoleWords]
  float *o_partial = reinterpret_cast<float *>(stages); // epilogue only, after the last tile
  float *exchange = reinterpret_cast<float *>(smem + Tr::kExchangeOffset); // partial S (kScoreSplits > 1)
  // Per row r < kCtaRows: key position, q row, query head (-1: no such row), partial state (traits.cuh); then the
  // keys every row sees, [shared_keys[0], shared_keys[1]].
  int *row_pos = reinterpret_cast<int *>(smem + Tr::kRowInfoOffset);
  int *row_q = row_pos + Tr::kCtaRows;
  int *row_head = row_q + Tr::kCtaRows;
  int *row_state = row_head + Tr::kCtaRows;
  int *shared_keys = row_state + Tr::kCtaRows;

  const int tid = thread_idx();
  const int lane = lane_id();
  const int warp = warp_id();
  // Rows per CTA of the launch (the grid's packing of a sequence's rows into CTAs), and its threads.
  const int launch_rows = row_groups<D>(p) * Tr::kRows;
  const int launch_threads = wide_launch<D>(p) ? Tr::kWideThreads : Tr::kThreads;

  // Which sequence, KV head, query rows and chunk of the context this CTA serves.
  const int split = u.split;
  const int b = u.b;
  const bool short_queries = p.cu_seqlens_q != nullptr;
  QueryRows qr;
  qr.group = p.heads_q / p.heads_kv;
  const int head_blocks = (int)row_blocks<kWide>(p, launch_rows);
  qr.kv_head = u.head_block / head_blocks;
  qr.packed0 = (u.head_block % head_blocks) * launch_rows;
  qr.q_start = b;
  qr.q_len = 1;
  if (short_queries) prefill::varlen_bounds(p.cu_seqlens_q, b, p.total_q, qr.q_start, qr.q_len);
  const bool uniform_rows = kWide && !short_queries && p.seqlen_q > 0; // dense prefill's rows (abi.h)
  if (uniform_rows) {
    qr.q_start = b * p.seqlen_q;
    qr.q_len = p.seqlen_q;
  }
  qr.addr0 = uniform_rows ? 0 : qr.q_start;
  const int packed_rows = qr.q_len * qr.group;
  if (qr.packed0 >= packed_rows) return; // past this sequence's rows (uniform across the CTA)
  qr.rows = packed_rows - qr.packed0 < launch_rows ? packed_rows - qr.packed0 : launch_rows;
  // This CTA's row groups: the fewest (a power of two) that hold its own rows, so a CTA with fewer rows than
  // the launch's keeps every warp of a narrow CTA on its rows, and a row's summation order depends on its
  // sequence's rows alone, never on the batch's longest (nor on whether the launch is wide). The warp's slot
  // among the kMaxRowGroups of its D split (its (m, l) and O in the epilogue; a wide CTA's warps 4-7 take
  // slots kTokenGroups and up) is a row group (the 16 rows it serves) and a token group (the 16-token chunks
  // of every tile it computes: token_group + i * token_groups, i < chunks). Up to kTokenGroups row groups
  // share the tile's chunks out; more (wide CTAs only) take one token group each, every chunk; slots past
  // groups_r * token_groups (a wide launch's CTA with few rows) have no rows.
  const int groups_wanted = qr.rows > 4 * Tr::kRows ? 8 : qr.rows > 2 * Tr::kRows ? 4 : (qr.rows > Tr::kRows ? 2 : 1);
  const int groups_r = groups_wanted < Tr::kMaxRowGroups ? groups_wanted : Tr::kMaxRowGroups;
  const int slot = warp % Tr::kTokenGroups + (Tr::kWideFactor > 1 ? (warp / Tr::kWarps) * Tr::kTokenGroups : 0);
  const int d_split = (Tr::kWideFactor > 1 ? warp % Tr::kWarps : warp) / Tr::kTokenGroups;
  const int token_groups = groups_r < Tr::kTokenGroups ? Tr::kTokenGroups / groups_r : 1;
  const int chunks = Tr::kTokenGroups / token_groups; // per warp and tile
  const int row_group = slot / token_groups;
  const int token_group = slot % token_groups;
  const int cta_rows = groups_r * Tr::kRows;
  const int kv_head = qr.kv_head;
  // Token i's partial state: uniform grid [split, total_q]; scheduled partial_base + i * num_splits + split
  // (consecutive per row for the merge), and a unit the workspace cannot hold is not computed (the Rust layer
  // never makes one; this guards memory).
  const int64_t state0 = p.work == nullptr ? (int64_t)split * (short_queries ? p.total_q : p.batch) + qr.q_start
                                           : (int64_t)u.state;
  const int state_stride = p.work == nullptr ? 1 : u.num_splits;
  if (p.work != nullptr && u.num_splits > 1 && state0 + (int64_t)(qr.q_len - 1) * state_stride >= p.num_partials) return;

  const PagedView cache{p.cache};
  const bool windowed = p.score_mod.window_left >= 0;
  // Without a window, the first kStages tiles' page ids are fetched speculatively from the split's nominal
  // start, before seq_len is known, so those loads and the seq_len load are in flight together (any table
  // column below the capacity is readable); ids of tokens past the end are dropped once `end` is known.
  // With one, the start depends on seq_len: they are fetched after it.
  int first_pages[kStages];
  if (!windowed) {
#pragma unroll
    for (int x = 0; x < kStages; ++x) {
      const int64_t token = (int64_t)split * u.split_tokens + x * kTileTokens + tid;
      first_pages[x] = (tid < kTileTokens && token < cache.capacity()) ? cache.page_of<kWide>(b, (int)token) : kNoPage;
    }
  }
  const int seq_len = cache.seq_len<kWide>(b);
  qr.pos_base = seq_len - qr.q_len;
  // The keys the CTA's rows see together, [window_begin, span_end): from its first row's window start
  // (position - w; decode: seq_len - 1 - w) to its last row's position + 1 (causal; + right bound without
  // causal, unbounded: seq_len). Decode's single row: [seq_len - 1 - w, seq_len). Splits are laid out from it.
  const int64_t right = right_bound<kWide>(p);
  const int64_t first_pos = qr.position(0);
  const int64_t last_pos = qr.position(qr.rows - 1);
  const int window_begin = windowed && first_pos - p.score_mod.window_left > 0 ? (int)(first_pos - p.score_mod.window_left) : 0;
  // (window_begin <= span_end: positions are < seq_len and window_begin is clamped at 0 as span_end is.)
  const int span_end = last_pos + right + 1 < seq_len ? (int)(last_pos + right + 1 > 0 ? last_pos + right + 1 : 0) : seq_len;
  // Rows see different keys only at the span's edges: keys below the last row's window start, or past the
  // first row's right bound, are masked per row (never in decode, whose rows share one position). Parked in
  // shared memory with the per-row facts; the first barrier below publishes them.
  if (tid < Tr::kCtaRows) {
    const bool exists = tid < qr.rows;
    st_shared(row_pos + tid, qr.position(tid));
    st_shared(row_q + tid, qr.addr0 + qr.token(tid));
    st_shared(row_head + tid, exists ? qr.head(tid) : -1);
    st_shared(row_state + tid, (int)(state0 + (int64_t)qr.token(tid) * state_stride));
  }
  if (tid == 0) {
    const int64_t lo = windowed ? last_pos - p.score_mod.window_left : 0;
    const int64_t hi = first_pos + right;
    st_shared(shared_keys, lo < 0 ? 0 : (int)lo);
    st_shared(shared_keys + 1, hi > seq_len ? seq_len : (int)hi);
  }
  const int64_t split_begin = window_begin + (int64_t)split * u.split_tokens;
  const int begin = split_begin < span_end ? (int)split_begin : span_end;
  // The last split runs to the end, so a sequence longer than the plan assumed is still covered in full.
  const int end = (split == u.num_splits - 1 || span_end - begin <= u.split_tokens) ? span_end : begin + u.split_tokens;
  const int num_tiles = (end - begin + kTileTokens - 1) / kTileTokens;

  // This thread's cp.async assignment: one 16-byte column chunk of kLoadsPerThread rows of every tile; a
  // chunk past the head dim (K and Q: head_dim; V: head_dim_v) is zero-filled in every row.
  const int chunk = tid % Tr::kChunksPerRow;
  const int row0 = tid / Tr::kChunksPerRow;
  const bool chunk_in_range = chunk * 8 < p.head_dim;
  const int col = chunk_in_range ? chunk * 8 : 0; // a zero-filled chunk's (unread) addresses stay inside the row
  const T *k_base = static_cast<const T *>(p.cache.k_cache) + kv_head * p.cache.k_head_stride + col;
  const T *v_head = static_cast<const T *>(p.cache.v_cache) + kv_head * p.cache.v_head_stride;
  // FP8: one byte per element, 16-element chunks (FP8 rows are whole 16-byte chunks: head_dim % 16 == 0,
  // checked by the launcher), zero-filled past the head dim like the 16-bit ones.
  // Two chunks per thread (Traits::fp8_copy_chunk).
  const int row8 = tid / Tr::kFp8ThreadsPerRow;
  const int chunk8[2] = {Tr::fp8_copy_chunk(tid, 0), Tr::fp8_copy_chunk(tid, 1)};
  const bool chunk8_in_range[2] = {chunk8[0] * 16 < p.head_dim, chunk8[1] * 16 < p.head_dim};
  const uint8_t *k8_head = static_cast<const uint8_t *>(p.cache.k_cache) + kv_head * p.cache.k_head_stride;
  const uint8_t *v8_head = static_cast<const uint8_t *>(p.cache.v_cache) + kv_head * p.cache.v_head_stride;

  // Page of row `tid` of tile x (threads < kTileTokens), or kNoPage past the chunk's end.
  auto tile_page = [&](int x) -> int {
    const int token = begin + x * kTileTokens + tid;
    return (tid < kTileTokens && token < end) ? cache.page_of<kWide>(b, token) : kNoPage;
  };
  if (windowed) {
#pragma unroll
    for (int x = 0; x < kStages; ++x) first_pages[x] = tile_page(x);
  }
  // Thread `row` turns its row's page into element offsets in K and V, once per row rather than once per
  // copying thread (kChunksPerRow threads copy each row), and parks them in the ring slot of tile x.
  // The warps holding rows also ballot the tile's holes (rows before `end` without a page) into their word of
  // hole slot x % kHoleSlots, read back when tile x is computed.
  auto publish_row = [&](int x, int page) {
    const int token = begin + x * kTileTokens + tid;
    if (tid < kTileTokens) {
      st_shared(row_ring + (x & 1) * kTileTokens + tid, cache.row_offsets(page, token));
    }
    if (warp < Tr::kHoleWords) {
      const uint32_t bits = warp_ballot(tid < kTileTokens && page == kNoPage && token < end);
      if (lane == 0) st_shared(holes + (x % Tr::kHoleSlots) * Tr::kHoleWords + warp, bits);
    }
  };
  // Issues tile x into stage x % kStages (rows without data are zero-filled, never read) and commits one
  // group, empty past the last tile so that the wait counts stay uniform.
  // Only a narrow CTA's threads copy (a wide CTA's warps 4-7 compute only; the split keeps its unrolled shape).
  auto issue_tile = [&](int x) {
    if (Tr::kWideFactor > 1 && tid >= Tr::kThreads) {
      // no copies: the empty group keeps the wait counts uniform
    } else if (kFp8 && x < num_tiles) {
      unsigned char *k_dst = stages + (x % kStages) * Tr::kFp8StageBytes;
      unsigned char *v_dst = k_dst + Tr::kFp8TileBytes;
      const RowOffsets *ring = row_ring + (x & 1) * kTileTokens;
#pragma unroll
      for (int i = 0; i < Tr::kFp8LoadsPerThread; ++i) {
        const int row = row8 + i * Tr::kFp8RowsPerPass;
        const RowOffsets off = ld_shared(ring + row);
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const bool valid = off.k >= 0 && chunk8_in_range[e];
          const int col = chunk8_in_range[e] ? chunk8[e] * 16 : 0;
          cp_async_cg_16(k_dst + Fp8SwizzledTile<D>::offset(row, chunk8[e]), k8_head + col + (valid ? off.k : 0), valid);
          // V against its own head dim (as the 16-bit path).
          const bool valid_v = off.k >= 0 && chunk8[e] * 16 < p.head_dim_v;
          cp_async_cg_16(v_dst + Fp8SwizzledTile<D>::offset(row, chunk8[e]),
                         v8_head + (valid_v ? off.v + chunk8[e] * 16 : 0), valid_v);
        }
      }
    } else if (x < num_tiles) {
      unsigned char *k_dst = stages + (x % kStages) * Tr::kStageBytes;
      unsigned char *v_dst = k_dst + Tr::kTileBytes;
      const RowOffsets *ring = row_ring + (x & 1) * kTileTokens;
#pragma unroll
      for (int i = 0; i < Tr::kLoadsPerThread; ++i) {
        const int row = row0 + i * Tr::kRowsPerPass;
        const RowOffsets off = ld_shared(ring + row);
        const bool valid = off.k >= 0 && chunk_in_range;
        // V's chunk against its own head dim: a compare with the kernel parameter, no pointer or predicate of
        // its own set up before the loop (the D = 256 kernels run at the 168-register bound; ptxas report).
        const bool valid_v = off.k >= 0 && chunk * 8 < p.head_dim_v;
        cp_async_cg_16(k_dst + Tile::offset(row, chunk), valid ? k_base + off.k : k_base, valid);
        cp_async_cg_16(v_dst + Tile::offset(row, chunk), valid_v ? v_head + off.v + chunk * 8 : v_head, valid_v);
      }
    }
    cp_async_commit();
  };

  // Q rows of this CTA (rows >= qr.rows zero-filled); the first kQAreaRows travel in the first group (a wide
  // FP8 CTA's others are loaded after the warps have taken the first ones: below).
  const T *q = static_cast<const T *>(p.q) + col;
  auto q_offset = [&](int r) -> int64_t {
    return (kWide ? (int64_t)b * p.q_seq_stride : 0) + (int64_t)(qr.addr0 + qr.token(r)) * p.q_batch_stride +
           (int64_t)qr.head(r) * p.q_head_stride;
  };
  constexpr int kQAreaRows = Tr::kQAreaRows;
  const int q_rows0 = cta_rows < kQAreaRows ? cta_rows : kQAreaRows;
  for (int r = Tr::kWideFactor == 1 || tid < Tr::kThreads ? row0 : q_rows0; r < q_rows0; r += Tr::kRowsPerPass) {
    const bool valid = r < qr.rows && chunk_in_range;
    cp_async_cg_16(q_smem + Tile::offset(r, chunk), q + (valid ? q_offset(r) : 0), valid);
  }
#pragma unroll
  for (int x = 0; x < kStages; ++x)
    if (begin + x * kTileTokens + tid >= end) first_pages[x] = kNoPage;
#pragma unroll
  for (int x = 0; x < kStages - 1; ++x) {
    publish_row(x, first_pages[x]);
    sync_threads();
    issue_tile(x);
  }
  publish_row(kStages - 1, first_pages[kStages - 1]);
  cp_async_wait<kStages - 2>();
  sync_threads();

  // RoPE: each q row rotated at its own position (explicit per q row, or its key position; decode: seq_len - 1).
  // Rows [row0_q, row0_q + rows) of the CTA, held at Q area rows 0 ..
  auto rotate_q = [&](int row0_q, int rows) {
    rotate_q_tile<T, D>(p.rope, q_smem, rows, [&](int r) {
      const int row = qr.q_start + qr.token(row0_q + r);
      return rope_row(p.rope, p.rope.positions != nullptr ? (int64_t)ld_global_nc(p.rope.positions + row)
                                                          : (int64_t)qr.position(row0_q + r));
    });
  };
  if (rope_enabled(p.rope)) rotate_q(0, qr.rows < kQAreaRows ? qr.rows : kQAreaRows);

  const int warp_token0 = token_group * Tr::kWarpTokens; // this warp's first chunk's rows within a tile
  const int col0 = d_split * Tr::kWarpD;
  // This warp's rows: [row_base, row_base + 16) of the CTA's (its Q rows, row facts, and epilogue rows); a
  // row group with none (the CTA's last rows) skips the math, not the copies and barriers.
  const int row_base = row_group * Tr::kRows;
  const bool warp_has_rows = row_base < qr.rows;
  const unsigned char *q_rows = q_smem + row_base * D * 2; // 16-row steps keep the swizzle phase
  // Chunk i of this warp (token_group + i * token_groups) lies this many bytes past chunk 0 in a K/V tile.
  const int chunk_stride = token_groups * Tr::kWarpTokens * D * (kFp8 ? 1 : 2);
  WarpAttention<T, D> att;
  auto init = [&](const unsigned char *rows) {
    if constexpr (kFp8) {
      att.init_fp8(rows, warp_token0, col0, lane);
    } else {
      att.init(rows, warp_token0, col0, lane);
    }
  };
  if constexpr (kQAreaRows == Tr::kCtaRows) {
    init(q_rows);
  } else {
    // A wide FP8 CTA's Q (16 KB) is twice the last FP8 stage (traits.cuh, kQAreaRows): the warps of the
    // first half of the rows (and those without rows) take their fragments, then the second half replaces
    // it (plain 16-byte loads: the cp.async group counts stay the pipeline's) and its warps take theirs.
    const bool first_half = row_base < kQAreaRows || !warp_has_rows;
    if (first_half) init(q_smem + (row_base < kQAreaRows ? row_base : 0) * D * 2);
    if (cta_rows > kQAreaRows) { // uniform across the CTA
      sync_threads();
      for (int r = tid < Tr::kThreads ? kQAreaRows + row0 : cta_rows; r < cta_rows; r += Tr::kRowsPerPass) {
        const bool valid = r < qr.rows && chunk_in_range;
        const uint4 v = valid ? ld_global_nc(reinterpret_cast<const uint4 *>(q + q_offset(r))) : uint4{0u, 0u, 0u, 0u};
        st_shared(reinterpret_cast<uint4 *>(q_smem + Tile::offset(r - kQAreaRows, chunk)), v);
      }
      sync_threads();
      if (rope_enabled(p.rope) && qr.rows > kQAreaRows) rotate_q(kQAreaRows, qr.rows - kQAreaRows);
      if (!first_half) init(q_smem + (row_base - kQAreaRows) * D * 2);
    }
  }
  const bool e5m2 = kFp8 && p.cache.kv_dtype == FA_KV_FP8_E5M2;
  // kVariant: softcap and ALiBi (slopes of this lane's two rows lane/4 (+ 8); their distances are from each
  // row's own position, read per tile from row_pos).
  // FP8: this KV head's dequantisation scales, folded into the score scale and the output normalisation.
  const float k_scale = kFp8 ? kv_scale(p.cache.k_scale, p.cache.scale_head_stride, kv_head) : 1.0f;
  const float v_scale = kFp8 ? kv_scale(p.cache.v_scale, p.cache.scale_head_stride, kv_head) : 1.0f;
  const float scale_log2 = kFp8 ? p.scale_log2 * k_scale : p.scale_log2;
  [[maybe_unused]] ScoreMod mod;
  [[maybe_unused]] float slopes[2] = {0.0f, 0.0f};
  if constexpr (kVariant) {
    mod = ScoreMod::make(kFp8 ? p.scale * k_scale : p.scale, scale_log2, p.score_mod.softcap);
#pragma unroll
    for (int r = 0; r < 2; ++r)
      if (row_base + (lane >> 2) + 8 * r < qr.rows)
        slopes[r] = alibi_slope_log2(p.score_mod, b, qr.head(row_base + (lane >> 2) + 8 * r));
  }

  for (int j = 0; j < num_tiles; ++j) {
    cp_async_wait<kStages - 2>(); // tile j has landed (this thread's copies) ...
    sync_threads();               // ... everyone's; and everyone is done with tile j-1's stage.
    const int x = j + kStages - 1;
    issue_tile(x);
    const int next_page = tile_page(x + 1); // consumed after the math, so its latency is hidden

    const unsigned char *k_tile0 = stages + (j % kStages) * (kFp8 ? Tr::kFp8StageBytes : Tr::kStageBytes);
    const unsigned char *v_tile0 = k_tile0 + (kFp8 ? Tr::kFp8TileBytes : Tr::kTileBytes);
    // The warp's chunk i of the tile: S, masks, the online softmax and P.V for its rows.
    auto compute_chunk = [&](int i) {
      const unsigned char *k_tile = k_tile0 + i * chunk_stride;
      const unsigned char *v_tile = v_tile0 + i * chunk_stride;
      // The chunk's first token, and its distance from each of the lane's rows' positions.
      const int chunk_token0 = warp_token0 + i * token_groups * Tr::kWarpTokens;
      const int key0 = begin + j * kTileTokens + chunk_token0;
      [[maybe_unused]] int dist0[2];
      if constexpr (kVariant) {
        dist0[0] = ld_shared(row_pos + row_base + (lane >> 2)) - key0;
        dist0[1] = ld_shared(row_pos + row_base + (lane >> 2) + 8) - key0;
      }
      float s[2][4];
      if constexpr (Tr::kScoreSplits > 1) {
        // D = 512: this warp's share of Q Kᵀ, summed with the other D splits' shares (one more barrier).
        if constexpr (kFp8) {
          if (e5m2) {
            att.template qk_fp8<Fp8Format::E5M2>(s, k_tile);
          } else {
            att.template qk_fp8<Fp8Format::E4M3>(s, k_tile);
          }
        } else {
          att.qk(s, k_tile);
        }
        att.exchange_scores(s, exchange, d_split, lane);
        if constexpr (kVariant) {
          att.apply_mod(s, mod, slopes, dist0, lane);
        } else {
          att.scale(s, scale_log2);
        }
      } else if constexpr (kFp8 && kVariant) {
        if (e5m2) {
          att.template scores_mod_fp8<Fp8Format::E5M2>(s, k_tile, mod, slopes, dist0, lane);
        } else {
          att.template scores_mod_fp8<Fp8Format::E4M3>(s, k_tile, mod, slopes, dist0, lane);
        }
      } else if constexpr (kFp8) {
        if (e5m2) {
          att.template scores_fp8<Fp8Format::E5M2>(s, k_tile, scale_log2);
        } else {
          att.template scores_fp8<Fp8Format::E4M3>(s, k_tile, scale_log2);
        }
      } else if constexpr (kVariant) {
        att.scores_mod(s, k_tile, mod, slopes, dist0, lane);
      } else {
        att.scores(s, k_tile, scale_log2);
      }
      if (j == num_tiles - 1) att.mask_tail(s, key0, end, lane);
      // Keys some of the CTA's rows do not see (short queries only: decode's rows share their keys).
      if (key0 < ld_shared(shared_keys) ||
          (key0 + Tr::kWarpTokens < end ? key0 + Tr::kWarpTokens : end) - 1 > ld_shared(shared_keys + 1)) {
        int64_t lo[2], hi[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int64_t pos = ld_shared(row_pos + row_base + (lane >> 2) + 8 * r);
          lo[r] = p.score_mod.window_left >= 0 ? pos - p.score_mod.window_left : INT64_MIN;
          hi[r] = pos + right_bound<kWide>(p);
        }
        att.mask_outside(s, key0, lo, hi, lane);
      }
      const uint32_t hole_bits = ld_shared(holes + (j % Tr::kHoleSlots) * Tr::kHoleWords + chunk_token0 / 32);
      if (hole_bits != 0u) att.mask_rows(s, hole_bits >> (chunk_token0 % 32), lane);
      uint32_t pa[4];
      att.softmax_update(s, pa);
      if constexpr (kFp8) {
        if (e5m2) {
          att.template accumulate_pv_fp8<Fp8Format::E5M2>(pa, v_tile);
        } else {
          att.template accumulate_pv_fp8<Fp8Format::E4M3>(pa, v_tile);
        }
      } else {
        att.accumulate_pv(pa, v_tile);
      }
    };
    // The warp's chunks, one after the other (one unless the CTA serves several row groups: then a run-time
    // count, not unrolled, so the body's code is there once).
    if constexpr (Tr::kMaxRowGroups == 1) {
      compute_chunk(0);
    } else if (warp_has_rows) {
#pragma unroll 1
      for (int i = 0; i < chunks; ++i) compute_chunk(i);
    }

    publish_row(x + 1, next_page);
  }
  cp_async_wait<0>();
  sync_threads(); // the stages are free for the epilogue partials

  // Epilogue 1: each warp parks its state in its slot: (m, l) per row from the D-split-0 warps, O columns
  // from all (a row group's slots are consecutive: row_group * token_groups + token group).
  att.reduce_sums();
  const int r0 = lane >> 2;
  if (d_split == 0 && (lane & 3) == 0) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float *st = stats + (slot * Tr::kRows + r0 + 8 * r) * 2;
      st_shared(st, att.m[r]);
      st_shared(st + 1, att.l[r]);
    }
  }
  att.template park_o<kFp8>(o_partial + slot * Tr::kRows * Tr::kOStride, Tr::kOStride, col0, lane);
  sync_threads();

  // Epilogue 2: combine each row's token groups (the same guarded merge as merge.cu, in the exp2 domain),
  // with the sink as one more (value-free) state when there is one and this CTA writes o itself, normalise,
  // and store 8 columns per item with 16-byte stores (none past the head dim). CTA row r is row r % 16 of
  // row group r / 16, whose states are slots (r / 16) * token_groups + g, g < token_groups.
  const int head_chunks = p.head_dim_v / 8; // O's columns: V's head dim
  const bool add_sink = p.score_mod.sinks != nullptr && u.num_splits == 1;
  for (int item = tid; item < cta_rows * Tr::kChunksPerRow; item += launch_threads) {
    const int r = item / Tr::kChunksPerRow;
    const int c = item % Tr::kChunksPerRow;
    const int head = ld_shared(row_head + r);
    if (c >= head_chunks || head < 0) continue; // past V's head dim, or a row the CTA does not have
    // (slot * 16 + row within the group) of the row group's first slot: r % 16 + (r / 16) * token_groups * 16.
    const int state_row = Tr::kMaxRowGroups == 1 ? r : r % Tr::kRows + (r / Tr::kRows) * token_groups * Tr::kRows;
    float m_max = kNegInf;
#pragma unroll
    for (int g = 0; g < Tr::kTokenGroups; ++g)
      if (g < token_groups) m_max = fmaxf(m_max, ld_shared(stats + (g * Tr::kRows + state_row) * 2));
    const float sink = add_sink ? sink_logit(p.score_mod, head) : kNegInf;
    const bool no_key = m_max == kNegInf;
    if (add_sink) m_max = fmaxf(m_max, sink * kLog2e);
    const float m_sub = max_for_exp(m_max);
    float sum = add_sink ? fast_exp2(sink * kLog2e - m_sub) : 0.0f;
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
#pragma unroll
    for (int g = 0; g < Tr::kTokenGroups; ++g) {
      if (g >= token_groups) break;
      const float w = fast_exp2(ld_shared(stats + (g * Tr::kRows + state_row) * 2) - m_sub);
      sum += w * ld_shared(stats + (g * Tr::kRows + state_row) * 2 + 1);
      const float *src = o_partial + (g * Tr::kRows + state_row) * Tr::kOStride + c * 8;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float4 v = ld_shared(reinterpret_cast<const float4 *>(src + 4 * h));
        acc[4 * h] += w * v.x;
        acc[4 * h + 1] += w * v.y;
        acc[4 * h + 2] += w * v.z;
        acc[4 * h + 3] += w * v.w;
      }
    }
    const float inv = kFp8 ? inv_sum_or_zero(sum) * v_scale : inv_sum_or_zero(sum);
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[i] *= inv;
    const float lse = add_sink && no_key ? sink : lse_from_state(m_max, sum); // no key: exactly the sink
    if (u.num_splits == 1) {
      const int64_t q_row = ld_shared(row_q + r);
      const int64_t o_seq = kWide ? b * p.o_seq_stride : 0; // uniform rows' sequence offsets (else 0)
      const int64_t lse_seq = kWide ? b * p.lse_seq_stride : 0;
      Vec8<T>::store(static_cast<T *>(p.o) + o_seq + q_row * p.o_batch_stride + head * p.o_head_stride + c * 8, acc);
      if (p.lse != nullptr && c == 0) st_global(p.lse + lse_seq + q_row * p.lse_batch_stride + head * p.lse_head_stride, lse);
    } else {
      const int64_t row = (int64_t)ld_shared(row_state + r) * p.heads_q + head;
      Vec8<float>::store(p.partial_o + row * p.head_dim_v + c * 8, acc);
      if (c == 0) st_global(p.partial_lse + row, lse);
    }
  }
}

// Uniform grid (work == NULL): CTA (split, head block, sequence), its partial state split * B + b. Scheduled
// (fa/abi.h, FaDecodeWork; src/schedule.rs): CTA x runs its units in turn. A unit the launch's shape cannot
// hold is skipped (the Rust layer never makes one; this guards memory).
template <class T, int D, bool kVariant, bool kFp8> FA_DEVICE void paged_decode_kernel(const FaDecodeParams &p) {
  const Dim3 bid = block_idx();
  if (p.work == nullptr) {
    // head_blocks_in_x (one split; the wide widths only): grid (Hkv * row blocks, 1, B), the row blocks not
    // bound by 65535.
    const bool in_x = Traits<D>::kServesWidePrefill && p.head_blocks_in_x;
    decode_unit<T, D, kVariant, kFp8>(p, in_x ? Unit{bid.z, bid.x, 0, 1, p.split_tokens, 0}
                                              : Unit{bid.z, bid.y, bid.x, p.num_splits, p.split_tokens, 0});
    return;
  }
  // The CTA's range is device data too: compared unsigned, a negative start is past every unit (the CTA
  // runs none) and the units read stay in [0, num_work). (A clamp to 0 instead costs a register: a spill at
  // D = 256 with FP8 and variants under the 168-register cap.)
  const unsigned first = (unsigned)ld_global_nc(p.work_indptr + bid.x);
  const unsigned last = (unsigned)ld_global_nc(p.work_indptr + bid.x + 1);
  for (unsigned i = first; i < last && i < (unsigned)p.num_work; ++i) {
    const FaDecodeWork *w = p.work + i;
    const Unit u{ld_global_nc(&w->b),         ld_global_nc(&w->head_block),   ld_global_nc(&w->split),
                 ld_global_nc(&w->num_splits), ld_global_nc(&w->split_tokens), ld_global_nc(&w->partial_base)};
    const bool split_ok = u.num_splits == 1 || (u.split_tokens > 0 && u.split_tokens % kSplitGranule == 0 &&
                                                u.state >= 0 && u.state + u.split < p.num_partials);
    // The head-block count is formed here, per unit, not before the loop: a 64-bit value live across every
    // decode_unit is what ptxas spilled in the D 256 FP8 _mod kernel (sm_100, at the 168-register cap).
    const int64_t head_block_count = p.heads_kv * row_blocks<Traits<D>::kServesWidePrefill>(p);
    if (u.b < 0 || u.b >= p.batch || u.head_block < 0 || u.head_block >= head_block_count || u.split < 0 ||
        u.split >= u.num_splits || !split_ok)
      continue;
    sync_threads(); // the previous unit's epilogue is done with the shared memory this one's prologue fills
    decode_unit<T, D, kVariant, kFp8>(p, Unit{u.b, u.head_block, u.split, u.num_splits, u.split_tokens,
                                             u.state + u.split});
  }
}

} // namespace
} // namespace decode
FA_NAMESPACE_END

// One kernel per (dtype, tile width (fa/head_dim.cuh), softcap/ALiBi, cache dtype): 128 threads (256 in a wide
// launch), at most 168 registers a thread, so 3 narrow CTAs per SM (255 and 2 at D = 512: traits.cuh).
#define FA_DECODE_KERNEL(name, T, D, kMod, kFp8)                                                             \
  FA_KERNEL_MAX_REGISTERS(name, fa::decode::Traits<D>::kMaxRegisters, FaDecodeParams,                        \
                          (fa::decode::paged_decode_kernel<T, D, kMod, kFp8>))
#define FA_DECODE_16BIT_KERNELS(dt, T, D)                                                                    \
  FA_DECODE_KERNEL(fa_paged_decode_##dt##_d##D, T, D, false, false)                                          \
  FA_DECODE_KERNEL(fa_paged_decode_##dt##_d##D##_mod, T, D, true, false)
// _fp8: an FP8 cache (either format, chosen at run time) under 16-bit queries and outputs.
#define FA_DECODE_FP8_KERNELS(dt, T, D)                                                                      \
  FA_DECODE_KERNEL(fa_paged_decode_##dt##_d##D##_fp8, T, D, false, true)                                     \
  FA_DECODE_KERNEL(fa_paged_decode_##dt##_d##D##_fp8_mod, T, D, true, true)
// nvcc builds the 16-bit-cache kernels from this file and the FP8-cache ones from kernels/decode_fp8.cu (this
// file with FA_DECODE_FP8_JOB): only those need the compute_89 front end and sm_89 SASS of the hardware FP8
// conversion (build.rs: code_changes_at). The host build (launchers, emulator) has them all.
#if defined(FA_HOST_BUILD)
#define FA_DECODE_KERNELS(dt, T, D) FA_DECODE_16BIT_KERNELS(dt, T, D) FA_DECODE_FP8_KERNELS(dt, T, D)
#elif defined(FA_DECODE_FP8_JOB)
#define FA_DECODE_KERNELS(dt, T, D) FA_DECODE_FP8_KERNELS(dt, T, D)
#else
#define FA_DECODE_KERNELS(dt, T, D) FA_DECODE_16BIT_KERNELS(dt, T, D)
#endif
#define FA_DECODE_WIDTH_KERNELS(D) FA_DECODE_KERNELS(f16, fa::half_t, D) FA_DECODE_KERNELS(bf16, fa::bf16_t, D)
FA_DECODE_WIDTHS(FA_DECODE_WIDTH_KERNELS)
#undef FA_DECODE_WIDTH_KERNELS

#if defined(FA_HOST_BUILD)
#include "fa/tile_policy.h"

namespace fa {
namespace decode {
namespace {

template <int D, bool kFp8>
int launch_decode(void (*kernel)(FaDecodeParams), const char *name, const FaDecodeParams &p, FaExec *exec) {
  using Tr = Traits<D, kFp8>;
  static_assert(Tr::kThreads == 128, "the copy split and the narrow CTA");
  if (p.rows_per_cta > Tr::kCtaRows) return FA_ERR_INVALID; // more row groups than the width has warp slots
  // Uniform rows and contiguous views: compiled into the widths that serve prefill past 256 only.
  const bool view = p.cache.block_table == nullptr || p.cache.seq_lens == nullptr || p.cache.seq_lens_cumulative != 0;
  if (!Tr::kServesWidePrefill && p.batch > 0 && (p.seqlen_q > 0 || p.head_blocks_in_x || view)) return FA_ERR_INVALID;
  const int head_blocks = (int)(p.heads_kv * row_blocks(p)); // valid_params bounds it
  const Dim3 grid = p.work != nullptr     ? Dim3{p.num_ctas, 1, 1}
                    : p.head_blocks_in_x ? Dim3{head_blocks, 1, p.batch}
                                         : Dim3{p.num_splits, head_blocks, p.batch};
  return launch(name, kernel, grid, wide_launch<D>(p) ? Tr::kWideThreads : Tr::kThreads, Tr::kSmemBytes, exec, p);
}

// One case per instantiated width (FA_DECODE_WIDTHS): the kernel of the call's dtype, cache format and
// variant.
#define FA_DECODE_DTYPE_CASE(dt, D)                                                                          \
  if (fp8)                                                                                                   \
    return mod ? launch_decode<D, true>(FA_KERNEL_REF(fa_paged_decode_##dt##_d##D##_fp8_mod), p, exec)         \
               : launch_decode<D, true>(FA_KERNEL_REF(fa_paged_decode_##dt##_d##D##_fp8), p, exec);            \
  return mod ? launch_decode<D, false>(FA_KERNEL_REF(fa_paged_decode_##dt##_d##D##_mod), p, exec)              \
             : launch_decode<D, false>(FA_KERNEL_REF(fa_paged_decode_##dt##_d##D), p, exec);
#define FA_DECODE_CASE(D)                                                                                    \
  case D:                                                                                                    \
    if (p.dtype == FA_DTYPE_F16) {                                                                           \
      FA_DECODE_DTYPE_CASE(f16, D)                                                                           \
    }                                                                                                        \
    FA_DECODE_DTYPE_CASE(bf16, D)
int dispatch(const FaDecodeParams &p, FaExec *exec) {
  if (!head_dim_supported(p.head_dim) || !head_dim_supported(p.head_dim_v)) return FA_ERR_UNSUPPORTED;
  if (p.dtype != FA_DTYPE_F16 && p.dtype != FA_DTYPE_BF16) return FA_ERR_UNSUPPORTED;
  const bool mod = needs_score_mod(p.score_mod);
  const bool fp8 = p.cache.kv_dtype != FA_KV_SAME;
  // The width of the wider head dim: K columns past Dqk and V columns past Dv are zero-filled.
  const int widest = p.head_dim > p.head_dim_v ? p.head_dim : p.head_dim_v;
  switch (decode_width(widest)) { FA_DECODE_WIDTHS(FA_DECODE_CASE) }
  return FA_ERR_UNSUPPORTED;
}
#undef FA_DECODE_DTYPE_CASE
#undef FA_DECODE_CASE

// Preconditions the Rust layer checks; re-checked here so a bad call fails instead of faulting.
inline bool valid_params(const FaDecodeParams &p) {
  if (p.batch < 0 || p.heads_kv <= 0 || p.heads_q <= 0 || p.heads_q % p.heads_kv != 0) return false;
  if (!valid_paged_cache_for_read(p.cache, p.head_dim, p.batch, /*contiguous=*/true)) return false;
  if (p.head_dim_v <= 0 || p.head_dim_v % 8 != 0 || !valid_cache_format(p.cache, p.head_dim_v)) return false;
  if (p.num_splits < 1) return false;
  // Memory safety: every pointer the kernel dereferences (lse is optional).
  if (p.batch > 0 && (p.q == nullptr || p.o == nullptr)) return false;
  if (p.num_splits > 1 && (p.split_tokens <= 0 || p.split_tokens % kSplitGranule != 0 || p.partial_o == nullptr ||
                           p.partial_lse == nullptr))
    return false;
  // 16-byte cp.async / stores of every row: aligned bases and element strides (multiples of 8 16-bit elements).
  const void *ptrs[] = {p.q, p.o, p.partial_o};
  for (const void *ptr : ptrs)
    if (((uintptr_t)ptr & 15u) != 0) return false;
  const int64_t strides[] = {p.q_batch_stride, p.q_head_stride, p.o_batch_stride, p.o_head_stride};
  for (int64_t s : strides)
    if (s < 0 || s % 8 != 0) return false;
  if (((uintptr_t)p.lse & 3u) != 0 || ((uintptr_t)p.partial_lse & 3u) != 0 || p.lse_batch_stride < 0) return false;
  if (!valid_score_mod(p.score_mod, p.heads_q)) return false;
  if (!valid_rope(p.rope, p.head_dim)) return false;
  if (p.work != nullptr) {
    if (p.work_indptr == nullptr || p.num_ctas < 1 || p.num_work < 0 || p.num_partials < 0 || p.num_merge_rows < 0)
      return false;
    if ((p.num_partials > 0 || p.num_merge_rows > 0) &&
        (p.partial_o == nullptr || p.partial_lse == nullptr || p.merge_rows == nullptr))
      return false;
  }
  // Short queries (cu_seqlens_q): the rows, their LSE layout.
  if (p.cu_seqlens_q != nullptr &&
      (p.total_q < 0 || p.max_seqlen_q < 1 || ((uintptr_t)p.cu_seqlens_q & 3u) != 0 || p.lse_head_stride < 0))
    return false;
  // Uniform rows: one split, no work list or cu_seqlens_q, flat rows B * seqlen_q. Row blocks in x: one split.
  if (p.seqlen_q < 0 || (p.head_blocks_in_x != 0 && (p.head_blocks_in_x != 1 || p.work != nullptr || p.num_splits != 1)))
    return false;
  if (p.seqlen_q > 0 && (p.cu_seqlens_q != nullptr || p.work != nullptr || p.num_splits != 1 ||
                         p.max_seqlen_q != p.seqlen_q || (int64_t)p.total_q != (int64_t)p.batch * p.seqlen_q))
    return false;
  // Rows per CTA: 16, 32, 64 or 128 (a power-of-two count of row groups; the width's bound is dispatch()'s).
  if (p.rows_per_cta != FA_DECODE_ROWS && p.rows_per_cta != 2 * FA_DECODE_ROWS && p.rows_per_cta != 4 * FA_DECODE_ROWS &&
      p.rows_per_cta != 8 * FA_DECODE_ROWS)
    return false;
  const int64_t head_blocks = (int64_t)p.heads_kv * row_blocks(p);
  if (p.head_blocks_in_x) return head_blocks <= INT32_MAX && p.batch <= 65535; // grid (head blocks, 1, B)
  return head_blocks <= 65535 && p.batch <= 65535 && p.num_splits <= 65535;
}

} // namespace

// The kernel dispatch() runs for a head dim and cache format, and its launch shape (abi.h, fa_tile_policy):
// the kernels of a width and format (variant or not) have the same shape; FP8 has twice the stages in the
// same stage area (traits.cuh).
template <int D, bool kFp8> FaTilePolicy policy_of() {
  using Tr = Traits<D, kFp8>;
  return FaTilePolicy{D, Tr::kCtaRows, Tr::kTileTokens, Tr::kStages, Tr::kThreads, Tr::kSmemBytes, Tr::kMinCtasPerSm, 0,
                      Tr::kScoreSplits, Tr::kNarrowRows};
}
int tile_policy(int head_dim, bool fp8, FaTilePolicy *out) {
  if (!head_dim_supported(head_dim)) return FA_ERR_UNSUPPORTED;
#define FA_DECODE_POLICY(D)                                                                                  \
  case D:                                                                                                    \
    *out = fp8 ? policy_of<D, true>() : policy_of<D, false>();                                               \
    return FA_OK;
  switch (decode_width(head_dim)) { FA_DECODE_WIDTHS(FA_DECODE_POLICY) }
#undef FA_DECODE_POLICY
  return FA_ERR_UNSUPPORTED;
}

} // namespace decode
} // namespace fa


extern "C" int fa_decode(FaDecodeParams p, FaExec *exec) {
  using namespace fa::decode;
  if (p.head_dim_v == 0) p.head_dim_v = p.head_dim; // V and O as wide as Q and K (the kernel reads it as given)
  if (!valid_params(p)) return FA_ERR_INVALID;
  if (p.batch == 0) return FA_OK;
  const int status = dispatch(p, exec);
  if (p.work != nullptr) {
    // Scheduled: merge the sequences the schedule split, each over its own states [num_partials, Hq, D].
    if (status != FA_OK || p.num_merge_rows == 0) return status;
    return fa::merge_split_kv_rows(p, p.merge_rows, p.num_merge_rows, p.num_partials,
                                   p.cu_seqlens_q != nullptr ? p.total_q : p.batch, p.o_batch_stride,
                                   p.lse_batch_stride, p.lse_head_stride, exec);
  }
  if (status != FA_OK || p.num_splits == 1) return status;

  // Split-KV: combine the partials into o / lse, rows = sequences (decode) or q rows (short queries).
  return fa::merge_split_kv_partials(p, p.cu_seqlens_q != nullptr ? p.total_q : p.batch, p.o_batch_stride,
                                     p.lse_batch_stride, p.lse_head_stride, exec);
}
#endif // FA_HOST_BUILD
