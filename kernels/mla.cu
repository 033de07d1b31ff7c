// Multi-head latent attention (MLA: DeepSeek-V2/V3, Kimi K2) over a paged latent cache, in the absorbed form
// (docs/mla.md; the ABI in fa/abi.h, FaMlaAppendParams / FaMlaDecodeParams). Each token caches one row of
// kv_lora_rank latent columns (512) and rope_dim rope-key columns (64), shared by all Hq query heads; a query
// head's row is its latent query (q_nope · W_UK, 512) and its rotated q_pe (64); S = q · row over all 576
// columns, and V is the first 512 columns of the same row, so O [.., 512] is still to be multiplied by W_UV.
//
// Decode. A CTA serves 32 packed query rows (row r: token r / Hq, head r % Hq of one sequence; q_len >= 1
// tokens, each at its own causal position) against a split of the sequence's keys, in 16-token tiles: one
// tile is 16 cache rows staged once in shared memory (a 16 x 512 latent tile and a 16 x 64 rope tile,
// both XOR-swizzled), read by S = Q Kᵀ and by O += P V. 8 warps: 2 row groups (16 rows each: the
// m16n8k16 M) x 4 column warps. Column warp c owns output columns [128c, 128c + 128) (a 16 x 128 fp32
// accumulator, 64 registers) and, for S, the same 128 latent columns plus rope k-step c (16 columns): 9
// k-steps with Q in registers (36 registers); the four partial S tiles of a row group are summed through
// shared memory in the same order by every warp (decode's D = 512 exchange, park_scores / sum_scores), so
// each warp holds the whole S bit for bit and runs the same online softmax, and each K byte in shared
// memory is read by one warp per row group. The per-warp math is decode's WarpAttention<T, 512> (fa/decode/
// warp_attention.cuh: the latent columns are a D = 512 tile) plus one rope k-step here.
//
// Pipeline (decode's): page ids one tile ahead, parked as row offsets in a two-slot ring; kStages tiles in
// flight by cp.async; rows past the chunk's end and holes (page id outside the pool) zero-filled and masked
// to -inf before the max (never P = 0 against garbage V). Causal masks per row only in the tiles past the
// CTA's first row's position. A row with no visible key gets O = 0, LSE = -inf.
//
// Split-KV: fp32 partials of each split, merged by merge.cu (fa_merge) in the launcher.
//
// Append: one thread per 16-byte latent chunk or rope pair of a token's row; RoPE (optional) rotates the rope
// key's pairs in fp32 (fa/rope.cuh) before the one rounding.
//
// Instantiations: one decode kernel per 16-bit dtype (2) and one append kernel (a dtype-agnostic move unless
// RoPE, which switches on the dtype at run time). kv_lora_rank (<= 512), rope_dim (<= 64), Hq and q_len are
// run-time values: columns past them are zero-filled and never stored.
#include "fa/attention_state.cuh"
#include "fa/decode/traits.cuh"
#include "fa/decode/warp_attention.cuh"
#include "fa/fp8_tile.cuh"
#include "fa/intrinsics.cuh"
#include "fa/paged_view.cuh"
#include "fa/prefill/seq_info.cuh"
#include "fa/rope.cuh"
#include "fa/namespace.cuh"

FA_NAMESPACE_BEGIN
namespace mla {
namespace {

// kFp8: the cache holds FP8 codes (E4M3 or E5M2, chosen at run time from cache.kv_dtype); Q, O and the math
// stay 16-bit. An FP8 tile is the same 16 tokens in half the bytes (9 KB), so the FP8 kernels keep twice the
// stages in the same stage area (decode's rule, fa/decode/traits.cuh "Stages per format"): the same shared
// memory and occupancy, twice the tokens in flight, as many bytes in flight.
template <bool kFp8 = false> struct MlaTraits {
  static constexpr int kLatent = FA_MLA_MAX_LATENT_DIM; // staged latent columns (kv_lora_rank <= this)
  static constexpr int kRope = FA_MLA_MAX_ROPE_DIM;     // staged rope columns
  static constexpr int kThreads = 256;
  static constexpr int kWarps = 8;
  static constexpr int kColWarps = 4;                  // column warps per row group
  static constexpr int kRowGroups = kWarps / kColWarps; // 16-row groups per CTA
  static constexpr int kRows = FA_DECODE_ROWS;          // rows per row group (mma M)
  static constexpr int kCtaRows = FA_MLA_ROWS;
  static_assert(kCtaRows == kRowGroups * kRows, "FA_MLA_ROWS");
  static constexpr int kWarpCols = kLatent / kColWarps; // 128 output columns per warp
  static_assert(kWarpCols == decode::Traits<512>::kWarpD, "WarpAttention<T, 512>'s column split");
  static constexpr int kRopeChunkPairs = kRope / 16; // rope k-steps: one per column warp
  static_assert(kRopeChunkPairs == kColWarps, "one rope k-step per column warp");
  // 16 tokens per tile (one P.V k-step). A 16-bit tile is 16 x 576 x 2 = 18 KB; 3 stages keep two tiles in
  // flight while one is computed and, with Q (36 KB), stay under the 99 KB per-block limit of sm_86/89. FP8:
  // 9 KB tiles, 6 stages.
  static constexpr int kTileTokens = 16;
  static constexpr int kElemBytes = kFp8 ? 1 : 2;      // cache element bytes
  static constexpr int kStages = kFp8 ? 6 : 3;
  static constexpr int kChunkCols = 16 / kElemBytes;   // cache columns per 16-byte chunk
  static constexpr int kChunks = (kLatent + kRope) / kChunkCols; // 16-byte chunks per cache row (72; FP8 36)
  static constexpr int kLatentChunks = kLatent / kChunkCols;
  static constexpr int kQChunks = (kLatent + kRope) / 8;         // Q is 16-bit: 72 chunks per row
  static constexpr int kQLatentChunks = kLatent / 8;
  static constexpr int kLatentTileBytes = kTileTokens * kLatent * kElemBytes;
  static constexpr int kRopeTileBytes = kTileTokens * kRope * kElemBytes;
  static constexpr int kStageBytes = kLatentTileBytes + kRopeTileBytes;
  // Shared memory (bytes): Q's latent tile, Q's rope tile, the stages, the row-offset ring, hole words.
  static constexpr int kQLatentOffset = 0;
  static constexpr int kQRopeOffset = kCtaRows * kLatent * 2;
  static constexpr int kStageOffset = kQRopeOffset + kCtaRows * kRope * 2;
  static constexpr int kRingOffset = kStageOffset + kStages * kStageBytes;
  static constexpr int kRingBytes = 2 * kTileTokens * 8; // int64 element offset per row, two tiles
  static constexpr int kHoleSlots = kStages + 1;         // a tile's word lives from its publish to its compute
  static constexpr int kHoleOffset = kRingOffset + kRingBytes;
  static constexpr int kSmemBytes = kHoleOffset + kHoleSlots * 4;
  // The S exchange (per row group: 4 warps x 32 lanes x 8 fp32) overlays Q's latent tile, which no warp reads
  // once its fragments are in registers (before the loop's first barrier).
  static constexpr int kExchangeFloats = kColWarps * 32 * 8;
  static_assert(kRowGroups * kExchangeFloats * 4 <= kQRopeOffset, "the exchange fits in Q's latent tile");
  static_assert(kSmemBytes <= 99 * 1024, "fits the smallest per-block limit among the targets (sm_86/89/120)");
  static_assert(FA_SPLIT_GRANULE % kTileTokens == 0, "a KV tile divides a split");
};

using Tr = MlaTraits<false>; // what both formats share (rows, warps, Q, the exchange)
using LatentTile = decode::SwizzledTile<Tr::kLatent>;
using RopeTile = decode::SwizzledTile<Tr::kRope>;
using Fp8LatentTile = decode::Fp8SwizzledTile<Tr::kLatent>;
using Fp8RopeTile = decode::Fp8SwizzledTile<Tr::kRope>;

// Byte offset in a staged row pair (latent tile, rope tile) of 16-byte chunk c (< kChunks) of row `row`.
template <bool kFp8> FA_DEVICE int staged_chunk(int row, int c) {
  using TrF = MlaTraits<kFp8>;
  if constexpr (kFp8) {
    return c < TrF::kLatentChunks ? Fp8LatentTile::offset(row, c)
                                  : TrF::kLatentTileBytes + Fp8RopeTile::offset(row, c - TrF::kLatentChunks);
  } else {
    return c < TrF::kLatentChunks ? LatentTile::offset(row, c)
                                  : TrF::kLatentTileBytes + RopeTile::offset(row, c - TrF::kLatentChunks);
  }
}
// The source column of chunk c (of kChunkCols columns; latent chunks first) in a global row [latent | rope]
// (kv_lora_rank latent columns), and whether it exists (columns past kv_lora_rank or rope_dim are
// zero-filled, never read).
template <int kChunkCols> FA_DEVICE bool chunk_source(const FaMlaDecodeParams &p, int c, int &col) {
  constexpr int kLatentChunks = Tr::kLatent / kChunkCols;
  const bool latent = c < kLatentChunks;
  const int j = latent ? c * kChunkCols : (c - kLatentChunks) * kChunkCols;
  const bool valid = j < (latent ? p.kv_lora_rank : p.rope_dim);
  col = valid ? (latent ? j : p.kv_lora_rank + j) : 0;
  return valid;
}

// The S exchange of a row group is decode's (WarpAttention<T, 512>::park_scores / sum_scores, kScoreSplits =
// kColWarps = 4), with mla's own barrier between the halves so that a row group without rows can skip the
// math and still pass it: each column warp parks its partial S, then after the CTA barrier every warp sums
// the four in column-warp order, so all four hold the same S bit for bit.
static_assert(decode::Traits<Tr::kLatent>::kScoreSplits == Tr::kColWarps, "decode's exchange sums the column warps");

// The rope k-step of an FP8 tile: this warp's 16 rope columns (FP8 chunk col_warp of each token's rope row)
// as the B fragments of the two n8 token tiles. Lane (g, t) loads codes 4t..4t+3 of tokens g and g + 8 (one
// 32-bit load each: the 8 tokens of a quarter-warp hit 8 different 16-byte bank groups, Fp8SwizzledTile<64>);
// converted, they are the B fragment with its k rows permuted as WarpAttention::qk_fp8's (rows 2t, 2t+1 <-
// columns 4t, 4t+1; rows 2t+8, 2t+9 <- 4t+2, 4t+3), which q_pe's A fragment matches (loaded permuted).
template <class T, Fp8Format F>
FA_DEVICE void rope_step_fp8(float (&s)[2][4], const uint32_t (&q_pe)[4], const unsigned char *k_pe_lane) {
#pragma unroll
  for (int n = 0; n < 2; ++n) {
    uint32_t b[2];
    fp8x4_to<T, F>(ld_shared(reinterpret_cast<const uint32_t *>(k_pe_lane + n * 8 * Tr::kRope)), b[0], b[1]);
    mma_m16n8k16<T>(s[n], q_pe, b);
  }
}

template <class T, bool kFp8> FA_DEVICE void mla_decode_kernel(const FaMlaDecodeParams &p) {
  using TrF = MlaTraits<kFp8>;
  using Att = decode::WarpAttention<T, Tr::kLatent>;
  unsigned char *smem = dynamic_smem<unsigned char>();
  unsigned char *q_latent = smem + TrF::kQLatentOffset;
  unsigned char *q_rope = smem + TrF::kQRopeOffset;
  unsigned char *stages = smem + TrF::kStageOffset;
  int64_t *ring = reinterpret_cast<int64_t *>(smem + TrF::kRingOffset);
  uint32_t *holes = reinterpret_cast<uint32_t *>(smem + TrF::kHoleOffset);

  const int tid = thread_idx();
  const int lane = lane_id();
  const int warp = warp_id();
  const int row_group = warp / Tr::kColWarps;
  const int col_warp = warp % Tr::kColWarps;
  const Dim3 bid = block_idx();
  const int split = bid.x, b = bid.z;
  const int packed0 = bid.y * Tr::kCtaRows;

  int q_start = b, q_len = 1;
  if (p.cu_seqlens_q != nullptr) prefill::varlen_bounds(p.cu_seqlens_q, b, p.total_q, q_start, q_len);
  // 64-bit: q_len comes from the device cu_seqlens_q (bounded only by total_q), so q_len * Hq may pass int.
  const int64_t packed_rows = (int64_t)q_len * p.heads_q;
  if (packed0 >= packed_rows) return; // past this sequence's rows (uniform across the CTA)
  const int rows = packed_rows - packed0 < Tr::kCtaRows ? (int)(packed_rows - packed0) : Tr::kCtaRows;

  const PagedView cache{p.cache};
  const int seq_len = cache.seq_len(b);
  const int pos_base = seq_len - q_len; // key position of the sequence's token 0
  // The keys the CTA's rows see together: [0, last row's position + 1), clamped into [0, seq_len].
  const int first_pos = pos_base + packed0 / p.heads_q;
  const int last_pos = pos_base + (packed0 + rows - 1) / p.heads_q;
  const int span_end = last_pos + 1 < 0 ? 0 : (last_pos + 1 > seq_len ? seq_len : last_pos + 1);
  const int64_t split_begin = (int64_t)split * p.split_tokens;
  const int begin = split_begin < span_end ? (int)split_begin : span_end;
  const int end = (split == p.num_splits - 1 || span_end - begin <= p.split_tokens) ? span_end : begin + p.split_tokens;
  const int num_tiles = (end - begin + TrF::kTileTokens - 1) / TrF::kTileTokens;

  // The cache rows as bytes (element offsets times kElemBytes: FP8 strides count bytes).
  const unsigned char *latent_rows = static_cast<const unsigned char *>(p.cache.k_cache);
  auto tile_page = [&](int x) -> int {
    const int token = begin + x * TrF::kTileTokens + tid;
    return (tid < TrF::kTileTokens && token < end) ? cache.page_of(b, token) : kNoPage;
  };
  // Thread `row` < 16 parks its row's element offset (or -1) in ring slot x & 1; warp 0 ballots the tile's
  // holes (rows before `end` without a page) into hole slot x % kHoleSlots.
  auto publish_row = [&](int x, int page) {
    const int token = begin + x * TrF::kTileTokens + tid;
    if (tid < TrF::kTileTokens) {
      const RowOffsets off = cache.row_offsets(page, token);
      st_shared(ring + (x & 1) * TrF::kTileTokens + tid, page == kNoPage ? (int64_t)-1 : off.k);
    }
    if (warp == 0) {
      const uint32_t bits = warp_ballot(tid < TrF::kTileTokens && page == kNoPage && token < end);
      if (lane == 0) st_shared(holes + x % TrF::kHoleSlots, bits);
    }
  };
  // Issues tile x into stage x % kStages (16 rows x kChunks chunks over 256 threads) and commits one group,
  // empty past the last tile.
  auto issue_tile = [&](int x) {
    if (x < num_tiles) {
      unsigned char *dst = stages + (x % TrF::kStages) * TrF::kStageBytes;
      const int64_t *offs = ring + (x & 1) * TrF::kTileTokens;
      for (int i = tid; i < TrF::kTileTokens * TrF::kChunks; i += TrF::kThreads) {
        const int row = i / TrF::kChunks, c = i % TrF::kChunks;
        int col;
        const bool exists = chunk_source<TrF::kChunkCols>(p, c, col);
        const int64_t off = ld_shared(offs + row);
        const bool valid = exists && off >= 0;
        cp_async_cg_16(dst + staged_chunk<kFp8>(row, c), latent_rows + (valid ? (off + col) * TrF::kElemBytes : 0), valid);
      }
    }
    cp_async_commit();
  };

  // Q rows of this CTA (rows >= `rows` zero-filled), in the first group.
  const T *q = static_cast<const T *>(p.q);
  for (int i = tid; i < Tr::kCtaRows * Tr::kQChunks; i += Tr::kThreads) {
    const int r = i / Tr::kQChunks, c = i % Tr::kQChunks;
    int col;
    const bool valid = chunk_source<8>(p, c, col) && r < rows;
    const int packed = packed0 + r;
    const int64_t at = valid ? (int64_t)(q_start + packed / p.heads_q) * p.q_row_stride +
                                   (int64_t)(packed % p.heads_q) * p.q_head_stride + col
                             : 0;
    unsigned char *dst = c < Tr::kQLatentChunks ? q_latent + LatentTile::offset(r, c)
                                                : q_rope + RopeTile::offset(r, c - Tr::kQLatentChunks);
    cp_async_cg_16(dst, q + at, valid);
  }
  int first_pages[TrF::kStages];
#pragma unroll
  for (int x = 0; x < TrF::kStages; ++x) first_pages[x] = tile_page(x);
#pragma unroll
  for (int x = 0; x < TrF::kStages - 1; ++x) {
    publish_row(x, first_pages[x]);
    sync_threads();
    issue_tile(x);
  }
  publish_row(TrF::kStages - 1, first_pages[TrF::kStages - 1]);
  cp_async_wait<TrF::kStages - 2>();
  sync_threads();

  // Fragments: this warp's 16 rows, its 128 latent columns (WarpAttention<T, 512>), and its rope k-step.
  const int row_base = row_group * Tr::kRows;
  const int col0 = col_warp * Tr::kWarpCols;
  const int g = lane >> 2, t = lane & 3;
  Att att;
  uint32_t q_pe[4];
  int k_pe_lane;
  if constexpr (kFp8) {
    att.init_fp8(q_latent + row_base * Tr::kLatent * 2, 0, col0, lane);
    // q_pe's A fragment with its k rows permuted as rope_step_fp8's B (init_fp8's rule): row g (+ 8),
    // columns 4t..4t+3 of the warp's rope k-step, one 8-byte load per row.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float2 pair = ld_shared(reinterpret_cast<const float2 *>(
          q_rope + RopeTile::offset(row_base + g + 8 * r, 2 * col_warp + (t >> 1)) + 8 * (t & 1)));
      __builtin_memcpy(&q_pe[r], &pair.x, 4);
      __builtin_memcpy(&q_pe[r + 2], &pair.y, 4);
    }
    k_pe_lane = TrF::kLatentTileBytes + Fp8RopeTile::offset(g, col_warp) + 4 * t; // token g + 8: + 8 rows
  } else {
    att.init(q_latent + row_base * Tr::kLatent * 2, 0, col0, lane);
    ldmatrix_x4(q_pe, q_rope + RopeTile::offset(row_base + ((lane >> 3) & 1) * 8 + (lane & 7), 2 * col_warp + (lane >> 4)));
    k_pe_lane = TrF::kLatentTileBytes + RopeTile::offset((lane >> 4) * 8 + (lane & 7), 2 * col_warp + ((lane >> 3) & 1));
  }
  // FP8: the format (uniform per launch) and the dequantisation scales, loaded when the kernel runs: k_scale
  // folded into the score scale, v_scale into the output normalisation (one KV head: element 0).
  const bool e5m2 = kFp8 && p.cache.kv_dtype == FA_KV_FP8_E5M2;
  const float scale_log2 = kFp8 ? p.scale_log2 * kv_scale(p.cache.k_scale, 0, 0) : p.scale_log2;
  const float v_scale = kFp8 ? kv_scale(p.cache.v_scale, 0, 0) : 1.0f;
  float *exchange = reinterpret_cast<float *>(q_latent) + row_group * Tr::kExchangeFloats;
  // A row group with no rows (a CTA of 16 or fewer: Hq 16 at q_len 1) skips the math, not the copies and
  // barriers (uniform across its 4 warps, so their exchange stays consistent).
  const bool warp_has_rows = row_base < rows;
  // Key positions of this lane's two rows (lane / 4 and + 8 of the warp's row group): they see keys <= them.
  int64_t lo[2] = {INT64_MIN, INT64_MIN}, hi[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) hi[r] = pos_base + (packed0 + row_base + g + 8 * r) / p.heads_q;

  for (int j = 0; j < num_tiles; ++j) {
    cp_async_wait<TrF::kStages - 2>(); // tile j has landed (this thread's copies) ...
    sync_threads();                    // ... everyone's; and everyone is done with tile j-1's stage.
    const int x = j + TrF::kStages - 1;
    issue_tile(x);
    const int next_page = tile_page(x + 1); // consumed after the math, so its latency is hidden

    // This warp's share of S (its 128 latent columns and its rope k-step), parked for its row group.
    const unsigned char *tile = stages + (j % TrF::kStages) * TrF::kStageBytes;
    const int key0 = begin + j * TrF::kTileTokens;
    float s[2][4];
    if (warp_has_rows) {
      if constexpr (kFp8) {
        if (e5m2) {
          att.template qk_fp8<Fp8Format::E5M2>(s, tile);
          rope_step_fp8<T, Fp8Format::E5M2>(s, q_pe, tile + k_pe_lane);
        } else {
          att.template qk_fp8<Fp8Format::E4M3>(s, tile);
          rope_step_fp8<T, Fp8Format::E4M3>(s, q_pe, tile + k_pe_lane);
        }
      } else {
        att.qk(s, tile);
        uint32_t k[4];
        ldmatrix_x4(k, tile + k_pe_lane);
        const uint32_t k_lo[2] = {k[0], k[1]};
        const uint32_t k_hi[2] = {k[2], k[3]};
        mma_m16n8k16<T>(s[0], q_pe, k_lo);
        mma_m16n8k16<T>(s[1], q_pe, k_hi);
      }
      Att::park_scores(s, exchange, col_warp, lane);
    }
    sync_threads(); // every warp passes it (the math is skipped by whole row groups, never the barrier)
    if (warp_has_rows) {
      Att::sum_scores(s, exchange, lane);
      Att::scale(s, scale_log2);
      if (j == num_tiles - 1) Att::mask_tail(s, key0, end, lane);
      if (key0 + TrF::kTileTokens - 1 > first_pos) Att::mask_outside(s, key0, lo, hi, lane); // causal, per row
      const uint32_t hole_bits = ld_shared(holes + j % TrF::kHoleSlots);
      if (hole_bits != 0u) Att::mask_rows(s, hole_bits, lane);
      uint32_t pa[4];
      att.softmax_update(s, pa);
      if constexpr (kFp8) {
        if (e5m2) {
          att.template accumulate_pv_fp8<Fp8Format::E5M2>(pa, tile); // V: the same latent tile
        } else {
          att.template accumulate_pv_fp8<Fp8Format::E4M3>(pa, tile);
        }
      } else {
        att.accumulate_pv(pa, tile); // V: the same latent tile
      }
    }

    publish_row(x + 1, next_page);
  }
  cp_async_wait<0>();

  // Epilogue: every column warp of a row group holds the same (m, l) (the same S): each normalises and stores
  // its own 128 columns (those < kv_lora_rank) of its rows that exist; column warp 0 stores the LSE.
  // Column order: 16-bit, tile n holds columns col0 + 8n + 2t, + 1; FP8 (accumulate_pv_fp8's even / odd
  // tiles), tiles n (even) and n + 1 hold columns col0 + 8n + 4t + {0, 2} and {1, 3}: 4 consecutive columns.
  att.reduce_sums();
  const int64_t state_rows = (int64_t)split * p.total_q; // this split's partial rows
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = row_base + g + 8 * r;
    if (row >= rows) continue;
    const int packed = packed0 + row;
    const int64_t q_row = q_start + packed / p.heads_q;
    const int head = packed % p.heads_q;
    const float inv = inv_sum_or_zero(att.l[r]) * v_scale;
    const float lse = lse_from_state(att.m[r], att.l[r]);
    if (p.num_splits == 1) {
      T *o = static_cast<T *>(p.o) + q_row * p.o_row_stride + head * p.o_head_stride;
      if constexpr (kFp8) {
#pragma unroll
        for (int n = 0; n < Att::kONTiles; n += 2) {
          const int col = col0 + 8 * n + 4 * t;
          if (col < p.kv_lora_rank) {
            const uint32_t w[2] = {pack2<T>(att.o[n][2 * r] * inv, att.o[n + 1][2 * r] * inv),
                                   pack2<T>(att.o[n][2 * r + 1] * inv, att.o[n + 1][2 * r + 1] * inv)};
            float2 bits; // one 8-byte store of the four 16-bit values
            __builtin_memcpy(&bits, w, 8);
            st_global(reinterpret_cast<float2 *>(o + col), bits);
          }
        }
      } else {
#pragma unroll
        for (int n = 0; n < Att::kONTiles; ++n) {
          const int col = col0 + 8 * n + 2 * t;
          if (col < p.kv_lora_rank)
            st_global(reinterpret_cast<uint32_t *>(o + col), pack2<T>(att.o[n][2 * r] * inv, att.o[n][2 * r + 1] * inv));
        }
      }
      if (p.lse != nullptr && col_warp == 0 && t == 0) st_global(p.lse + q_row * p.lse_row_stride + head, lse);
    } else {
      const int64_t state = (state_rows + q_row) * p.heads_q + head;
      float *o = p.partial_o + state * p.kv_lora_rank;
      if constexpr (kFp8) {
#pragma unroll
        for (int n = 0; n < Att::kONTiles; n += 2) {
          const int col = col0 + 8 * n + 4 * t;
          if (col < p.kv_lora_rank)
            st_global(reinterpret_cast<float4 *>(o + col), make_float4(att.o[n][2 * r] * inv, att.o[n + 1][2 * r] * inv,
                                                                       att.o[n][2 * r + 1] * inv, att.o[n + 1][2 * r + 1] * inv));
        }
      } else {
#pragma unroll
        for (int n = 0; n < Att::kONTiles; ++n) {
          const int col = col0 + 8 * n + 2 * t;
          if (col < p.kv_lora_rank)
            st_global(reinterpret_cast<float2 *>(o + col), make_float2(att.o[n][2 * r] * inv, att.o[n][2 * r + 1] * inv));
        }
      }
      if (col_warp == 0 && t == 0) st_global(p.partial_lse + state, lse);
    }
  }
}

// Append: one thread per item of a token's row, items [0, kv_lora_rank / 8) the latent's 16-byte chunks and
// [kv_lora_rank / 8, + rope_dim / 2) the rope key's element pairs (pair i: rotated pair i of fa/rope.cuh when
// i < rotary_dim / 2; elements 2i, 2i + 1 copied when 2i >= rotary_dim; nothing otherwise, those elements
// being some rotated pair's).
constexpr int kAppendThreads = 256;

template <class T> FA_DEVICE void rope_pair_store(const FaMlaAppendParams &p, const uint16_t *src, uint16_t *dst, int t, int i) {
  const FaRope &r = p.rope;
  const int half = r.rotary_dim / 2;
  const int ja = r.style == FA_ROPE_GPTJ ? 2 * i : i;
  const int jb = r.style == FA_ROPE_GPTJ ? 2 * i + 1 : i + half;
  float c, sn;
  rope_cos_sin(r, rope_row(r, (int64_t)ld_global_nc(r.positions + t)), i, c, sn);
  float xa, xb, unused;
  unpack2<T>((uint32_t)ld_global_nc(src + ja), xa, unused);
  unpack2<T>((uint32_t)ld_global_nc(src + jb), xb, unused);
  st_global(dst + ja, (uint16_t)(pack2<T>(rope_rotate(xa, xb, c, sn, true), 0.0f) & 0xffffu));
  st_global(dst + jb, (uint16_t)(pack2<T>(rope_rotate(xb, xa, c, sn, false), 0.0f) & 0xffffu));
}

// FP8 cache (cache.kv_dtype): one thread per 16-column chunk of a token's row (kv_lora_rank / 16 latent
// chunks, then rope_dim / 16 rope chunks), quantised with the cache's one scale (k_scale[0]) as the paged
// append does: stored = fp8_rn_satfinite(float(x) / scale). A rope chunk's elements are rotated in fp32 first
// (each element reads its pair partner, which may lie in another chunk: NeoX pairs i, i + rotary_dim / 2),
// then quantised: rotate and quantise in one pass, no 16-bit rounding between.
template <class T> FA_DEVICE float load_elem(const uint16_t *src) {
  float x, unused;
  unpack2<T>((uint32_t)ld_global_nc(src), x, unused);
  return x;
}

template <Fp8Format F> FA_DEVICE Vec16 quantize16_f32(const float (&x)[16], float scale) {
  uint32_t codes[4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
    codes[i] = (uint32_t)float2_to_fp8x2<F>(div_rn(x[4 * i], scale), div_rn(x[4 * i + 1], scale)) |
               (uint32_t)float2_to_fp8x2<F>(div_rn(x[4 * i + 2], scale), div_rn(x[4 * i + 3], scale)) << 16;
  return Vec16{codes[0], codes[1], codes[2], codes[3]};
}

template <class T> FA_DEVICE void mla_append_fp8_chunk(const FaMlaAppendParams &p, int64_t t, int c, unsigned char *row) {
  const int col = 16 * c;
  float x[16];
  if (col < p.kv_lora_rank) {
    const uint16_t *src = static_cast<const uint16_t *>(p.latent) + t * p.latent_token_stride + col;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const Vec16 w = ld_global_nc(reinterpret_cast<const Vec16 *>(src) + h);
      unpack2<T>(w.x, x[8 * h], x[8 * h + 1]);
      unpack2<T>(w.y, x[8 * h + 2], x[8 * h + 3]);
      unpack2<T>(w.z, x[8 * h + 4], x[8 * h + 5]);
      unpack2<T>(w.w, x[8 * h + 6], x[8 * h + 7]);
    }
  } else {
    const uint16_t *k_pe = static_cast<const uint16_t *>(p.k_pe) + t * p.k_pe_token_stride;
    const FaRope &r = p.rope;
    const bool rotate = rope_enabled(r);
    const int pos_row = rotate ? rope_row(r, (int64_t)ld_global_nc(r.positions + t)) : 0;
#pragma unroll
    for (int e = 0; e < 16; ++e) {
      const int j = col - p.kv_lora_rank + e;
      x[e] = load_elem<T>(k_pe + j);
      if (rotate && j < r.rotary_dim) {
        const RopePair pr = rope_pair(j, r.rotary_dim, r.style);
        float cs, sn;
        rope_cos_sin(r, pos_row, pr.index, cs, sn);
        x[e] = rope_rotate(x[e], load_elem<T>(k_pe + pr.partner), cs, sn, pr.first);
      }
    }
  }
  const float scale = kv_scale(p.cache.k_scale, 0, 0);
  const Vec16 q = p.cache.kv_dtype == FA_KV_FP8_E5M2 ? quantize16_f32<Fp8Format::E5M2>(x, scale)
                                                     : quantize16_f32<Fp8Format::E4M3>(x, scale);
  st_global(reinterpret_cast<Vec16 *>(row + col), q);
}

FA_DEVICE void mla_append_kernel(const FaMlaAppendParams &p) {
  if (p.cache.kv_dtype != FA_KV_SAME) { // FP8: one thread per 16-column chunk
    const int per_token = (p.kv_lora_rank + p.rope_dim) / 16;
    const int64_t item = (int64_t)block_idx().x * kAppendThreads + thread_idx();
    if (item >= (int64_t)p.num_tokens * per_token) return;
    const int64_t t = item / per_token;
    const int c = (int)(item % per_token);
    const int64_t slot = ld_global_nc(p.slot_mapping + t);
    if (slot < 0 || slot >= (int64_t)p.cache.num_pages * p.cache.page_size) return; // padding, or past the pool
    const int64_t page = fast_div(p.cache.page_div, slot);
    unsigned char *row = static_cast<unsigned char *>(p.cache.k_cache) + page * p.cache.k_page_stride +
                         (slot - page * p.cache.page_size) * p.cache.k_token_stride;
    if (p.dtype == FA_DTYPE_BF16) {
      mla_append_fp8_chunk<bf16_t>(p, t, c, row);
    } else {
      mla_append_fp8_chunk<half_t>(p, t, c, row);
    }
    return;
  }
  const int latent_items = p.kv_lora_rank / 8;
  const int per_token = latent_items + p.rope_dim / 2;
  const int64_t item = (int64_t)block_idx().x * kAppendThreads + thread_idx();
  if (item >= (int64_t)p.num_tokens * per_token) return;
  const int64_t t = item / per_token;
  const int i = (int)(item % per_token);
  const int64_t slot = ld_global_nc(p.slot_mapping + t);
  const int64_t num_slots = (int64_t)p.cache.num_pages * p.cache.page_size;
  if (slot < 0 || slot >= num_slots) return; // padding, or past the pool (device data)
  const int64_t page = fast_div(p.cache.page_div, slot);
  const int64_t offset = slot - page * p.cache.page_size;
  uint16_t *row = static_cast<uint16_t *>(p.cache.k_cache) + page * p.cache.k_page_stride + offset * p.cache.k_token_stride;
  if (i < latent_items) {
    const Vec16 *src = reinterpret_cast<const Vec16 *>(static_cast<const uint16_t *>(p.latent) + t * p.latent_token_stride + i * 8);
    st_global(reinterpret_cast<Vec16 *>(row + i * 8), ld_global_nc(src));
    return;
  }
  const int pair = i - latent_items;
  const uint16_t *k_pe = static_cast<const uint16_t *>(p.k_pe) + t * p.k_pe_token_stride;
  uint16_t *dst = row + p.kv_lora_rank;
  const bool rotate = rope_enabled(p.rope);
  if (rotate && pair < p.rope.rotary_dim / 2) {
    if (p.dtype == FA_DTYPE_BF16) {
      rope_pair_store<bf16_t>(p, k_pe, dst, (int)t, pair);
    } else {
      rope_pair_store<half_t>(p, k_pe, dst, (int)t, pair);
    }
  } else if (!rotate || 2 * pair >= p.rope.rotary_dim) {
    st_global(reinterpret_cast<uint32_t *>(dst + 2 * pair), ld_global_nc(reinterpret_cast<const uint32_t *>(k_pe + 2 * pair)));
  }
}

} // namespace
} // namespace mla
FA_NAMESPACE_END

// One decode kernel per 16-bit dtype (256 threads; launch bounds for one CTA per SM: the 16 x 128 fp32
// accumulator and Q's 36 registers per thread leave no room for the 128-register cap of two), one append kernel.
// FP8 caches: one more kernel per 16-bit dtype, the format (E4M3 / E5M2) a run-time switch inside it (as
// decode's _fp8 kernels): 4 decode instantiations, not 6.
#define FA_MLA_DECODE_KERNEL(name, T, kFp8)                                                                  \
  FA_KERNEL(name, fa::mla::Tr::kThreads, 1, FaMlaDecodeParams, (fa::mla::mla_decode_kernel<T, kFp8>))
FA_MLA_DECODE_KERNEL(fa_mla_decode_f16, fa::half_t, false)
FA_MLA_DECODE_KERNEL(fa_mla_decode_bf16, fa::bf16_t, false)
FA_MLA_DECODE_KERNEL(fa_mla_decode_fp8_f16, fa::half_t, true)
FA_MLA_DECODE_KERNEL(fa_mla_decode_fp8_bf16, fa::bf16_t, true)
FA_KERNEL(fa_mla_append_rows, 256, 1, FaMlaAppendParams, (fa::mla::mla_append_kernel))

#if defined(FA_HOST_BUILD)
#include "fa/split_kv.cuh"

namespace fa {
namespace mla {
namespace {

// The latent cache as both readers take it: one KV head, 16-bit, rows of kv_lora_rank + rope_dim columns.
bool valid_dims(int kv_lora_rank, int rope_dim) {
  return kv_lora_rank >= 8 && kv_lora_rank <= Tr::kLatent && kv_lora_rank % 8 == 0 && rope_dim >= 0 &&
         rope_dim <= Tr::kRope && rope_dim % 8 == 0;
}

// An FP8 latent cache: both parts whole 16-column chunks (16 codes per cp.async / quantised store).
bool valid_fp8_dims(const FaPagedCache &c, int kv_lora_rank, int rope_dim) {
  return c.kv_dtype == FA_KV_SAME || (kv_lora_rank % 16 == 0 && rope_dim % 16 == 0);
}

bool valid_decode(const FaMlaDecodeParams &p) {
  if (p.batch < 0 || p.heads_q <= 0 || !valid_dims(p.kv_lora_rank, p.rope_dim)) return false;
  if (p.dtype != FA_DTYPE_F16 && p.dtype != FA_DTYPE_BF16) return false;
  if (!valid_fp8_dims(p.cache, p.kv_lora_rank, p.rope_dim)) return false;
  if (!valid_paged_cache_for_read(p.cache, p.kv_lora_rank + p.rope_dim, p.batch)) return false;
  if (p.num_splits < 1 || p.total_q < 0 || p.max_seqlen_q < 1) return false;
  if (p.cu_seqlens_q == nullptr && (p.total_q != p.batch || p.max_seqlen_q != 1)) return false;
  if (((uintptr_t)p.cu_seqlens_q & 3u) != 0) return false;
  if (p.batch > 0 && (p.q == nullptr || p.o == nullptr)) return false;
  if (p.num_splits > 1 && (p.split_tokens <= 0 || p.split_tokens % FA_SPLIT_GRANULE != 0 || p.partial_o == nullptr ||
                           p.partial_lse == nullptr))
    return false;
  if (((uintptr_t)p.q & 15u) != 0 || ((uintptr_t)p.o & 15u) != 0 || ((uintptr_t)p.partial_o & 15u) != 0) return false;
  const int64_t strides[] = {p.q_row_stride, p.q_head_stride, p.o_row_stride, p.o_head_stride};
  for (int64_t s : strides)
    if (s < 0 || s % 8 != 0) return false;
  if (((uintptr_t)p.lse & 3u) != 0 || ((uintptr_t)p.partial_lse & 3u) != 0 || p.lse_row_stride < 0) return false;
  const int64_t row_blocks = ((int64_t)p.max_seqlen_q * p.heads_q + Tr::kCtaRows - 1) / Tr::kCtaRows;
  return row_blocks <= 65535 && p.batch <= 65535 && p.num_splits <= 65535;
}

int merge_partials(const FaMlaDecodeParams &p, FaExec *exec) {
  FaMergeParams m = {};
  m.o_states = p.partial_o;
  m.lse_states = p.partial_lse;
  m.o = p.o;
  m.lse = p.lse;
  m.o_state_stride = (int64_t)p.total_q * p.heads_q * p.kv_lora_rank;
  m.o_outer_stride = (int64_t)p.heads_q * p.kv_lora_rank;
  m.o_inner_stride = p.kv_lora_rank;
  m.lse_state_stride = (int64_t)p.total_q * p.heads_q;
  m.lse_outer_stride = p.heads_q;
  m.lse_inner_stride = 1;
  m.o_out_outer_stride = p.o_row_stride;
  m.o_out_inner_stride = p.o_head_stride;
  m.lse_out_outer_stride = p.lse_row_stride;
  m.lse_out_inner_stride = 1;
  m.num_states = p.num_splits;
  m.rows_outer = p.total_q;
  m.out_rows = p.total_q;
  m.rows_inner = p.heads_q;
  m.head_dim = p.kv_lora_rank;
  m.states_dtype = FA_DTYPE_F32;
  m.out_dtype = p.dtype;
  return fa_merge(m, exec);
}

} // namespace
} // namespace mla
} // namespace fa

extern "C" int fa_mla_decode(FaMlaDecodeParams p, FaExec *exec) {
  using namespace fa::mla;
  if (!valid_decode(p)) return FA_ERR_INVALID;
  if (p.batch == 0) return FA_OK;
  const fa::Dim3 grid{p.num_splits, (int)(((int64_t)p.max_seqlen_q * p.heads_q + Tr::kCtaRows - 1) / Tr::kCtaRows), p.batch};
  const bool fp8 = p.cache.kv_dtype != FA_KV_SAME;
  const int smem = fp8 ? MlaTraits<true>::kSmemBytes : Tr::kSmemBytes;
  int status;
  if (fp8) {
    status = p.dtype == FA_DTYPE_F16
                 ? fa::launch("fa_mla_decode_fp8_f16", fa_mla_decode_fp8_f16, grid, Tr::kThreads, smem, exec, p)
                 : fa::launch("fa_mla_decode_fp8_bf16", fa_mla_decode_fp8_bf16, grid, Tr::kThreads, smem, exec, p);
  } else {
    status = p.dtype == FA_DTYPE_F16
                 ? fa::launch("fa_mla_decode_f16", fa_mla_decode_f16, grid, Tr::kThreads, smem, exec, p)
                 : fa::launch("fa_mla_decode_bf16", fa_mla_decode_bf16, grid, Tr::kThreads, smem, exec, p);
  }
  if (status != FA_OK || p.num_splits == 1) return status;
  return merge_partials(p, exec);
}

extern "C" int fa_mla_append(FaMlaAppendParams p, FaExec *exec) {
  using namespace fa::mla;
  if (p.num_tokens < 0 || !valid_dims(p.kv_lora_rank, p.rope_dim)) return FA_ERR_INVALID;
  if (p.dtype != FA_DTYPE_F16 && p.dtype != FA_DTYPE_BF16) return FA_ERR_INVALID;
  const bool fp8 = p.cache.kv_dtype != FA_KV_SAME;
  if (!fa::valid_cache_format(p.cache, p.kv_lora_rank + p.rope_dim) || !valid_fp8_dims(p.cache, p.kv_lora_rank, p.rope_dim) ||
      !fa::valid_divisor(p.cache.page_div, p.cache.page_size) || p.cache.num_pages < 1)
    return FA_ERR_INVALID;
  if (!fa::valid_rope(p.rope, p.rope_dim) || (p.rope.cos != nullptr && p.rope.positions == nullptr)) return FA_ERR_INVALID;
  if (p.num_tokens == 0) return FA_OK;
  const void *ptrs[] = {p.latent, p.cache.k_cache};
  for (const void *ptr : ptrs)
    if (ptr == nullptr || ((uintptr_t)ptr & 15u) != 0) return FA_ERR_INVALID;
  if (p.k_pe == nullptr || ((uintptr_t)p.k_pe & 3u) != 0 || p.slot_mapping == nullptr) return FA_ERR_INVALID;
  const int64_t strides16[] = {p.latent_token_stride, p.cache.k_page_stride, p.cache.k_token_stride};
  for (int64_t s : strides16)
    if (s < 0 || s % 8 != 0) return FA_ERR_INVALID;
  if (!fa::valid_cache_strides(p.cache)) return FA_ERR_INVALID; // FP8: whole 16-byte units of codes
  if (p.k_pe_token_stride < 0 || p.k_pe_token_stride % 2 != 0) return FA_ERR_INVALID;
  const int64_t items =
      (int64_t)p.num_tokens * (fp8 ? (p.kv_lora_rank + p.rope_dim) / 16 : p.kv_lora_rank / 8 + p.rope_dim / 2);
  const int64_t blocks = (items + kAppendThreads - 1) / kAppendThreads;
  if (blocks > 0x7fffffff) return FA_ERR_INVALID;
  return fa::launch("fa_mla_append_rows", fa_mla_append_rows, fa::Dim3{(int)blocks, 1, 1}, kAppendThreads, 0, exec, p);
}
#endif // FA_HOST_BUILD
