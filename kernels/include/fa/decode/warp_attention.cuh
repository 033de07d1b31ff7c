// One warp's share of a decode tile, on tensor cores: 16 query rows (the heads of one KV head) against the
// warp's 16 tokens. S = Q Kᵀ (m16n8k16, Q the A operand from registers, K the B operand by ldmatrix), the
// exp2-domain online-softmax update, then O += P V with P taken straight from S's accumulator registers
// (the C fragment of S is the A fragment of P.V) and V by ldmatrix.trans.
//
// Up to D = 256 every warp computes the whole 16 x 16 S of its tokens from its own copy of Q (fragments in
// registers). At D = 512 (Traits::kScoreSplits = 4) each warp holds Q only for its own 128 output columns and
// computes that slice's share of Q Kᵀ (qk / qk_fp8): the four partial S tiles are summed through shared
// memory (exchange_scores), in the same order by every warp, so every warp holds the same S bit for bit and
// runs the same softmax. That keeps Q at 32 registers rather than 128 (the whole-Q kernels need 255 and
// spill with an FP8 cache) and reads each K element from shared memory once rather than once per warp.
//
// Fragment layout (PTX ISA, m16n8k16): accumulator register c of lane l holds row l/4 (+8 for c >= 2),
// column 2*(l%4) + (c&1). So each lane owns two query rows, r0 = l/4 and r1 = r0 + 8, and the four lanes of
// a quad share them: row reductions are two xor-shuffles.
#pragma once

#include "fa/attention_state.cuh"
#include "fa/decode/traits.cuh"
#include "fa/fp8_convert.cuh"
#include "fa/intrinsics.cuh"
#include "fa/namespace.cuh"
#include "fa/score_mod.cuh"

FA_NAMESPACE_BEGIN
namespace decode {

template <class T, int D> struct WarpAttention {
  using Tr = Traits<D>;
  using Tile = SwizzledTile<D>;
  using Fp8Tile = Fp8SwizzledTile<D>;
  static constexpr int kScoreSplits = Tr::kScoreSplits;
  static constexpr int kQkD = D / kScoreSplits;    // Q·K columns this warp sums over (a D split's at 512)
  static constexpr int kKSteps = kQkD / 16;        // QKᵀ k-steps
  static constexpr int kONTiles = Tr::kWarpD / 8;  // n8 tiles of this warp's output columns

  uint32_t q[kKSteps][4]; // Q as m16n8k16 A fragments, loaded once
  float m[2];             // running max of rows r0, r1 (exp2 domain, scale folded in)
  float l[2];             // this lane's share of the running sum of rows r0, r1
  float o[kONTiles][4];   // unnormalised output, 16 rows x kWarpD columns
  // This lane's ldmatrix row addresses within a K / V tile, one per value of (16-column step % 4). The
  // lane's row is 8-aligned plus (lane & 7), so the swizzle XOR only touches the low 3 chunk bits and every
  // other step is the same address + a multiple of 128 bytes (an immediate): no address math per tile.
  int k_lane[4];
  int v_lane[4];

  // token0: this warp's first row in every tile; col0: its first output column (and, with kScoreSplits > 1,
  // the first Q·K column of its share of S).
  FA_DEVICE void init(const unsigned char *q_smem, int token0, int col0, int lane) {
    const int qk_chunk0 = kScoreSplits > 1 ? col0 / 8 : 0;
    m[0] = m[1] = kNegInf;
    l[0] = l[1] = 0.0f;
#pragma unroll
    for (int n = 0; n < kONTiles; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    // ldmatrix.x4: matrix i = lane/8 is rows ((i&1)*8 .. +7), columns 8*(i>>1) .. +7 of the 16x16 step.
    const int q_row = ((lane >> 3) & 1) * 8 + (lane & 7);
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks)
      ldmatrix_x4(q[ks], q_smem + Tile::offset(q_row, qk_chunk0 + ks * 2 + (lane >> 4)));
    // K (B operand of S = Q Kᵀ): matrix i = lane/8 is tokens 8*(i>>1) .. +7, columns 8*(i&1) .. +7, so regs
    // {0,1} are tokens 0-7 (k lo/hi) and regs {2,3} tokens 8-15.
    const int k_row = token0 + (lane >> 4) * 8 + (lane & 7);
    // V (B operand of O += P V, .trans): matrix i is tokens 8*(i&1) .. +7, columns 8*(i>>1) .. +7, so regs
    // {0,1} are the B fragment of the first n8 column tile and regs {2,3} of the second.
    const int v_row = token0 + ((lane >> 3) & 1) * 8 + (lane & 7);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      k_lane[i] = Tile::offset(k_row, qk_chunk0 + 2 * i + ((lane >> 3) & 1));
      v_lane[i] = Tile::offset(v_row, col0 / 8 + 2 * i + (lane >> 4));
    }
  }

  // FP8 tiles (the _fp8 kernels): K and V stay FP8 in shared memory (Fp8SwizzledTile) and are converted in
  // registers after an ldmatrix of the codes. One ldmatrix.x4 moves 16 tokens x 32 FP8 columns, the same
  // 512 bytes per instruction as the 16-bit path, so the shared traffic per global byte is the 16-bit path's.
  // Matrix i (lanes 8i..8i+7) is tokens 8*(i&1) .. +7 of 16-byte chunk (i>>1) of the pair: the same row
  // addresses serve K and V.
  //  - K, plain ldmatrix: lane (g = lane/4, t = lane%4) receives codes 4t..4t+3 of its matrix's row g, i.e.
  //    token g, columns 4t..4t+3 of a 16-column k-step. Converted, those are the B fragment of that k-step
  //    with its k rows permuted (rows 2t, 2t+1 <- columns 4t, 4t+1; rows 2t+8, 2t+9 <- 4t+2, 4t+3). Q·Kᵀ
  //    sums over k in any order, so Q's A fragment is loaded with the same permutation (init_fp8) and S is
  //    unchanged, tokens in their natural places.
  //  - V, ldmatrix.trans: the 16-bit element at column g of rows 2t, 2t+1 is the code pair (2g, 2g+1) of
  //    tokens 2t and 2t+1. Its even codes (bytes 0, 2) are the B fragment half of output column 2g, its odd
  //    codes (bytes 1, 3) that of column 2g+1: one byte permute per register pair gives two n8 tiles, the
  //    even and the odd columns of the chunk. So o[4s + 2h + e] holds columns 16*(c + h) + 2j + e of the
  //    chunk pair c = col0/16 + 2s (j the tile column), and park_o puts them back in order.
  // This lane's ldmatrix row address in an FP8 tile for chunk pair cp (chunks 2cp, 2cp+1), cp % 4; as with
  // k_lane, the pairs 4 apart are 128 bytes apart. v_chunk: the offsets of this warp's V chunk pairs.
  // (cp must be a compile-time index after unrolling: a run-time index into fp8_lane would put this
  // struct, accumulators included, in local memory. The V pairs, which start at a run-time column, are
  // resolved once in init_fp8 with selects: v_chunk.)
  int fp8_lane[4];
  int v_chunk[kONTiles / 4];
  FA_DEVICE int fp8_chunk(int cp) const { return fp8_lane[cp % 4] + (cp / 4) * 128; }
  FA_DEVICE int fp8_chunk_at(int cp) const { // cp >= 0 known only at run time
    const int i = cp & 3;
    int lane_off = fp8_lane[0];
    lane_off = i == 1 ? fp8_lane[1] : lane_off;
    lane_off = i == 2 ? fp8_lane[2] : lane_off;
    lane_off = i == 3 ? fp8_lane[3] : lane_off;
    return lane_off + (cp >> 2) * 128;
  }

  FA_DEVICE void init_fp8(const unsigned char *q_smem, int token0, int col0, int lane) {
    m[0] = m[1] = kNegInf;
    l[0] = l[1] = 0.0f;
#pragma unroll
    for (int n = 0; n < kONTiles; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    // Q's A fragment with k rows permuted as K's: a0/a2 = row g, columns 4t..4t+1 / 4t+2..4t+3 of the k-step
    // (one 8-byte load), a1/a3 the same of row g + 8.
    const int g = lane >> 2, t = lane & 3;
    const int qk_chunk0 = kScoreSplits > 1 ? col0 / 8 : 0; // 16-bit Q chunks
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const float2 pair = ld_shared(reinterpret_cast<const float2 *>(
            q_smem + Tile::offset(g + 8 * r, qk_chunk0 + 2 * ks + (t >> 1)) + 8 * (t & 1)));
        __builtin_memcpy(&q[ks][r], &pair.x, 4);
        __builtin_memcpy(&q[ks][r + 2], &pair.y, 4);
      }
    }
    const int row = token0 + ((lane >> 3) & 1) * 8 + (lane & 7);
#pragma unroll
    for (int i = 0; i < 4; ++i) fp8_lane[i] = 2 * i < Fp8Tile::kChunks ? Fp8Tile::offset(row, 2 * i + (lane >> 4)) : 0;
    // This warp's V columns start at chunk pair col0 / 32 (kWarpD / 32 pairs per warp: 2, or 4 at D = 512).
#pragma unroll
    for (int sp = 0; sp < kONTiles / 4; ++sp) v_chunk[sp] = fp8_chunk_at(col0 / 32 + sp);
    // K: this warp's share of Q·K starts at FP8 chunk col0 / 16, a multiple of 8 (the XOR leaves it alone),
    // so col0 bytes further in every row.
    if (kScoreSplits > 1) {
#pragma unroll
      for (int i = 0; i < 4; ++i) fp8_lane[i] += col0;
    }
  }

  // qk() on an FP8 K tile of format F.
  template <Fp8Format F> FA_DEVICE void qk_fp8(float (&s)[2][4], const unsigned char *k_tile) const {
#pragma unroll
    for (int n = 0; n < 2; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
    for (int kp = 0; kp < kKSteps / 2; ++kp) {
      uint32_t k[4];
      ldmatrix_x4(k, k_tile + fp8_chunk(kp));
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int n = 0; n < 2; ++n) {
          uint32_t b[2];
          fp8x4_to<T, F>(k[2 * h + n], b[0], b[1]);
          mma_m16n8k16<T>(s[n], q[2 * kp + h], b);
        }
      }
    }
  }

  // scores() on an FP8 K tile of format F.
  template <Fp8Format F> FA_DEVICE void scores_fp8(float (&s)[2][4], const unsigned char *k_tile, float scale_log2) const {
    qk_fp8<F>(s, k_tile);
    scale(s, scale_log2);
  }

  template <Fp8Format F>
  FA_DEVICE void scores_mod_fp8(float (&s)[2][4], const unsigned char *k_tile, const ScoreMod &mod,
                                const float (&slope_log2)[2], const int (&dist0)[2], int lane) const {
    scores_fp8<F>(s, k_tile, 1.0f);
    apply_mod(s, mod, slope_log2, dist0, lane);
  }

  // accumulate_pv() on an FP8 V tile of format F.
  template <Fp8Format F> FA_DEVICE void accumulate_pv_fp8(const uint32_t (&p)[4], const unsigned char *v_tile) {
#pragma unroll
    for (int sp = 0; sp < kONTiles / 4; ++sp) {
      uint32_t v[4];
      ldmatrix_x4_trans(v, v_tile + v_chunk[sp]);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          uint32_t b[2];
          fp8x4_to<T, F>(byte_perm(v[2 * h], v[2 * h + 1], e == 0 ? 0x6420u : 0x7531u), b[0], b[1]);
          mma_m16n8k16<T>(o[4 * sp + 2 * h + e], p, b);
        }
      }
    }
  }

  // Stores this warp's O (16 rows x kWarpD columns, fp32) to rows[r * stride + column], columns in order.
  template <bool kFp8> FA_DEVICE void park_o(float *rows, int stride, int col0, int lane) const {
    const int g = lane >> 2, t = lane & 3;
    if constexpr (kFp8) {
#pragma unroll
      for (int n = 0; n < kONTiles; n += 2) { // n: the even tile, n + 1 the odd one, of chunk col0/16 + n/2
        const int col = col0 + 8 * n + 4 * t;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          st_shared(reinterpret_cast<float4 *>(rows + (g + 8 * r) * stride + col),
                    make_float4(o[n][2 * r], o[n + 1][2 * r], o[n][2 * r + 1], o[n + 1][2 * r + 1]));
        }
      }
    } else {
#pragma unroll
      for (int n = 0; n < kONTiles; ++n) {
        const int col = col0 + 8 * n + 2 * t;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          st_shared(reinterpret_cast<float2 *>(rows + (g + 8 * r) * stride + col), make_float2(o[n][2 * r], o[n][2 * r + 1]));
        }
      }
    }
  }

  // Q Kᵀ over this warp's kQkD columns for its 16 tokens, unscaled: s[n][c] is row r0/r1 (c < 2 / c >= 2),
  // token token0 + 8n + 2*(lane%4) + (c&1).
  FA_DEVICE void qk(float (&s)[2][4], const unsigned char *k_tile) const {
#pragma unroll
    for (int n = 0; n < 2; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
      uint32_t k[4];
      ldmatrix_x4(k, k_tile + k_lane[ks % 4] + (ks / 4) * 128);
      const uint32_t k_lo[2] = {k[0], k[1]};
      const uint32_t k_hi[2] = {k[2], k[3]};
      mma_m16n8k16<T>(s[0], q[ks], k_lo);
      mma_m16n8k16<T>(s[1], q[ks], k_hi);
    }
  }

  FA_DEVICE static void scale(float (&s)[2][4], float scale_log2) {
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
      for (int c = 0; c < 4; ++c) s[n][c] *= scale_log2;
  }

  // Scores of this warp's 16 tokens in the exp2 domain (kScoreSplits == 1: the warp's qk is all of S).
  FA_DEVICE void scores(float (&s)[2][4], const unsigned char *k_tile, float scale_log2) const {
    qk(s, k_tile);
    scale(s, scale_log2);
  }

  // kScoreSplits > 1: turns this warp's partial S (qk over its columns) into the whole S, the same in every
  // warp of the token group: each warp parks its 8 values per lane in `exchange` ([split][half][lane] of
  // float4: each quarter-warp stores and loads 128 contiguous bytes, conflict-free), a CTA barrier, then
  // every warp sums the kScoreSplits partials in split order. The caller's next tile barrier orders these
  // loads before the next tile's stores, so one buffer suffices. The two halves are callable on their own
  // (MLA decode, kernels/mla.cu, puts its own barrier between them).
  FA_DEVICE static void park_scores(const float (&s)[2][4], float *exchange, int split, int lane) {
    float4 *slot = reinterpret_cast<float4 *>(exchange);
#pragma unroll
    for (int n = 0; n < 2; ++n) st_shared(slot + (split * 2 + n) * 32 + lane, make_float4(s[n][0], s[n][1], s[n][2], s[n][3]));
  }
  FA_DEVICE static void sum_scores(float (&s)[2][4], const float *exchange, int lane) {
    const float4 *slot = reinterpret_cast<const float4 *>(exchange);
#pragma unroll
    for (int n = 0; n < 2; ++n) {
      float4 sum = ld_shared(slot + n * 32 + lane);
#pragma unroll
      for (int w = 1; w < kScoreSplits; ++w) {
        const float4 v = ld_shared(slot + (w * 2 + n) * 32 + lane);
        sum.x += v.x;
        sum.y += v.y;
        sum.z += v.z;
        sum.w += v.w;
      }
      s[n][0] = sum.x;
      s[n][1] = sum.y;
      s[n][2] = sum.z;
      s[n][3] = sum.w;
    }
  }
  FA_DEVICE static void exchange_scores(float (&s)[2][4], float *exchange, int split, int lane) {
    park_scores(s, exchange, split, lane);
    sync_threads();
    sum_scores(s, exchange, lane);
  }

  // scores() with softcap and ALiBi (fa/score_mod.cuh), straight to the exp2 domain: slope_log2[r] is row r's
  // slope, dist0[r] the distance of the warp's first token from row r's query position (decode: seq_len - 1
  // for both), so token token0 + i lies at dist0[r] - i (negative only past what the row sees, where the
  // masks follow).
  FA_DEVICE void scores_mod(float (&s)[2][4], const unsigned char *k_tile, const ScoreMod &mod,
                            const float (&slope_log2)[2], const int (&dist0)[2], int lane) const {
    scores(s, k_tile, 1.0f);
    apply_mod(s, mod, slope_log2, dist0, lane);
  }

  FA_DEVICE static void apply_mod(float (&s)[2][4], const ScoreMod &mod, const float (&slope_log2)[2],
                                  const int (&dist0)[2], int lane) {
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int dist = dist0[c >> 1] - (8 * n + 2 * (lane & 3) + (c & 1));
        s[n][c] = mod.apply(s[n][c], slope_log2[c >> 1], dist < 0 ? -dist : dist);
      }
  }

  // Masks tokens at or past `end` (only the last tile of a chunk can hold any) to -inf, before the max.
  FA_DEVICE static void mask_tail(float (&s)[2][4], int first_token, int end, int lane) {
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
      for (int c = 0; c < 4; ++c)
        if (first_token + 8 * n + 2 * (lane & 3) + (c & 1) >= end) s[n][c] = kNegInf;
  }

  // Masks token first_token + i of this lane's row r (lane / 4 + 8r) to -inf unless lo[r] <= it <= hi[r]: the
  // keys short queries' rows do not share (fa/abi.h: their window starts and causal ends differ).
  FA_DEVICE static void mask_outside(float (&s)[2][4], int first_token, const int64_t (&lo)[2],
                                     const int64_t (&hi)[2], int lane) {
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int token = first_token + 8 * n + 2 * (lane & 3) + (c & 1);
        if (token < lo[c >> 1] || token > hi[c >> 1]) s[n][c] = kNegInf;
      }
  }

  // Masks the tokens whose bit is set in `bits` (bit i = this warp's token i of the tile) to -inf, before the
  // max: rows of the tile that lie inside the sequence but have no page (an out-of-range block-table entry).
  FA_DEVICE static void mask_rows(float (&s)[2][4], uint32_t bits, int lane) {
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
      for (int c = 0; c < 4; ++c)
        if ((bits >> (8 * n + 2 * (lane & 3) + (c & 1))) & 1u) s[n][c] = kNegInf;
  }

  // Online-softmax update with this tile's scores; returns P (in place of s) as the A fragment of P.V.
  FA_DEVICE void softmax_update(float (&s)[2][4], uint32_t (&p)[4]) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = fmaxf(fmaxf(s[0][2 * r], s[0][2 * r + 1]), fmaxf(s[1][2 * r], s[1][2 * r + 1]));
      mx = fmaxf(mx, shfl_xor(mx, 1));
      mx = fmaxf(mx, shfl_xor(mx, 2));
      const float m_new = fmaxf(m[r], mx);
      // A row that has seen only masked tokens keeps m = -inf: subtract 0 instead (exp2(-inf) = 0, no NaN).
      const float m_sub = max_for_exp(m_new);
      const float correction = fast_exp2(m[r] - m_sub);
      m[r] = m_new;
      float sum = 0.0f;
#pragma unroll
      for (int n = 0; n < 2; ++n) {
        s[n][2 * r] = fast_exp2(s[n][2 * r] - m_sub);
        s[n][2 * r + 1] = fast_exp2(s[n][2 * r + 1] - m_sub);
        sum += s[n][2 * r] + s[n][2 * r + 1];
      }
      l[r] = l[r] * correction + sum;
#pragma unroll
      for (int n = 0; n < kONTiles; ++n) {
        o[n][2 * r] *= correction;
        o[n][2 * r + 1] *= correction;
      }
    }
    // A fragment: a0 = (r0, k 2q..2q+1), a1 = (r1, same k), a2 = (r0, k+8), a3 = (r1, k+8); tokens 0-7 of
    // the k-step are S's n-tile 0 and tokens 8-15 its n-tile 1.
    p[0] = pack2<T>(s[0][0], s[0][1]);
    p[1] = pack2<T>(s[0][2], s[0][3]);
    p[2] = pack2<T>(s[1][0], s[1][1]);
    p[3] = pack2<T>(s[1][2], s[1][3]);
  }

  // O[:, col0 .. col0 + kWarpD) += P V over the warp's 16 tokens. Tokens past the end have P = 0 and
  // zero-filled V rows, so nothing from an unused cache slot reaches O (0 * NaN cannot occur).
  FA_DEVICE void accumulate_pv(const uint32_t (&p)[4], const unsigned char *v_tile) {
#pragma unroll
    for (int j = 0; j < kONTiles / 2; ++j) {
      uint32_t v[4];
      ldmatrix_x4_trans(v, v_tile + v_lane[j % 4] + (j / 4) * 128);
      const uint32_t v_lo[2] = {v[0], v[1]};
      const uint32_t v_hi[2] = {v[2], v[3]};
      mma_m16n8k16<T>(o[2 * j], p, v_lo);
      mma_m16n8k16<T>(o[2 * j + 1], p, v_hi);
    }
  }

  // Completes the row sums (each lane summed only its own columns).
  FA_DEVICE void reduce_sums() {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      l[r] += shfl_xor(l[r], 1);
      l[r] += shfl_xor(l[r], 2);
    }
  }
};

} // namespace decode
FA_NAMESPACE_END
