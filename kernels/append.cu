// Append: scatter new tokens' K/V rows into their paged-cache slots (vLLM's reshape_and_cache_flash).
// k, v [num_tokens, Hkv, D]; slot_mapping int64 [num_tokens], slot = page * page_size + offset, negative =
// padding (skipped); the cache as in fa/paged_view.cuh. Works the same for one token per sequence (decode)
// and for a whole prompt (prefill into the cache).
//
// One thread per 16-byte chunk of one (token, head) row, for K and V: the copy is a dtype-agnostic move of
// 16-bit elements, so one kernel serves fp16 and bf16. Consecutive threads take consecutive chunks of a row,
// then the next head, so both the reads and the (per-row contiguous) writes coalesce.
//
// FP8 cache (cache.kv_dtype, issue 17): a second kernel quantises instead, one thread per 16 elements (two
// 16-byte reads, one 16-byte write): stored = fp8_rn_satfinite(float(x) / scale) with the KV head's scale
// (abi.h defines it exactly; the GPU and the emulator agree bit for bit: an IEEE division, then the cvt or
// its model in fa/fp8_model.cuh).
//
// RoPE (p.rope, fa/rope.cuh; issue 28): K is rotated on its way in, then rounded or quantised, in one pass.
// A rotation pairs elements up to rotary_dim / 2 apart (NeoX), further than one thread's chunk, so the
// RoPE kernels (separate instantiations: without RoPE the launcher runs the plain kernels above, unchanged)
// give each CTA whole (token, head) rows: every thread loads its chunk of K once from global memory, parks
// it in shared memory as fp32, and after one barrier reads its elements' partners from there. K is read
// once, written once; V moves as in the plain kernels. Any even rotary_dim works (Pythia's 20 of 80, GLM's
// half), for both layouts.
//
// A V head dim of its own (p.head_dim_v, Dv; K's is head_dim, Dqk): the threads cover rows of the wider of
// the two, and a chunk moves K where it lies inside Dqk and V where it lies inside Dv (the launcher resolves
// head_dim_v = 0 to head_dim).
#include "fa/intrinsics.cuh"
#include "fa/paged_view.cuh"
#include "fa/rope.cuh"
#include "fa/namespace.cuh"

FA_NAMESPACE_BEGIN
namespace append {
namespace {

constexpr int kThreads = 256;

// The cache slot of new token `token`, or -1 when its row is skipped: padding (a negative slot) or a slot past
// the cache (device data the host cannot check).
FA_DEVICE int64_t cache_slot(const FaAppendParams &p, int64_t token) {
  const int64_t slot = ld_global_nc(p.slot_mapping + token);
  const int64_t num_slots = (int64_t)p.cache.num_pages * p.cache.page_size;
  return slot < num_slots ? slot : -1;
}

// Elements per (token, head) row the threads cover: the wider of K's and V's head dims.
FA_HOST_DEVICE int row_width(const FaAppendParams &p) {
  return p.head_dim > p.head_dim_v ? p.head_dim : p.head_dim_v;
}

// The chunk this thread moves in the plain kernels: one thread per kElems-element chunk of a (token, head)
// row, consecutive threads on consecutive chunks of a row, then the next head (coalesced reads and writes).
struct Chunk {
  int64_t token;
  int h, c;
};
template <int kElems> FA_DEVICE bool flat_chunk(const FaAppendParams &p, Chunk &ch) {
  const int chunks = row_width(p) / kElems;
  const int64_t per_token = (int64_t)p.heads_kv * chunks;
  const int64_t item = (int64_t)block_idx().x * kThreads + thread_idx();
  if (item >= p.num_tokens * per_token) return false;
  ch = Chunk{item / per_token, (int)(item % per_token) / chunks, (int)(item % per_token) % chunks};
  return true;
}

// Where column `col` of head h of cache slot `slot` lies in the K and V caches, for elements E (uint16_t:
// a 16-bit cache; uint8_t: FP8, whose strides count bytes).
template <class E> struct KvPtrs {
  E *k, *v;
};
template <class E> FA_DEVICE KvPtrs<E> cache_at(const FaPagedCache &c, int64_t slot, int h, int col) {
  const int64_t page = fast_div(c.page_div, slot); // slot < num_pages * page_size < 2^62
  const int64_t offset = slot - page * c.page_size;
  E *k = static_cast<E *>(c.k_cache) + page * c.k_page_stride + offset * c.k_token_stride + h * c.k_head_stride;
  E *v = static_cast<E *>(c.v_cache) + page * c.v_page_stride + offset * c.v_token_stride + h * c.v_head_stride;
  return KvPtrs<E>{k + col, v + col};
}

FA_DEVICE void paged_append_kernel(const FaAppendParams &p) {
  Chunk ch;
  if (!flat_chunk<8>(p, ch)) return;
  const int64_t slot = cache_slot(p, ch.token);
  if (slot < 0) return;
  const int col = ch.c * 8;
  const uint16_t *k = static_cast<const uint16_t *>(p.k) + ch.token * p.k_token_stride + ch.h * p.k_head_stride + col;
  const uint16_t *v = static_cast<const uint16_t *>(p.v) + ch.token * p.v_token_stride + ch.h * p.v_head_stride + col;
  const KvPtrs<uint16_t> dst = cache_at<uint16_t>(p.cache, slot, ch.h, col);
  if (col < p.head_dim) st_global(reinterpret_cast<Vec16 *>(dst.k), ld_global_nc(reinterpret_cast<const Vec16 *>(k)));
  if (col < p.head_dim_v) st_global(reinterpret_cast<Vec16 *>(dst.v), ld_global_nc(reinterpret_cast<const Vec16 *>(v)));
}

// 16 elements of T -> 16 FP8 codes of format F: x / scale in fp32, then round to nearest even, saturating.
template <class T, Fp8Format F> FA_DEVICE Vec16 quantize16(const Vec16 &a, const Vec16 &b, float scale) {
  const uint32_t w[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
  uint32_t codes[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float x0, x1, x2, x3;
    unpack2<T>(w[2 * i], x0, x1);
    unpack2<T>(w[2 * i + 1], x2, x3);
    codes[i] = (uint32_t)float2_to_fp8x2<F>(div_rn(x0, scale), div_rn(x1, scale)) |
               (uint32_t)float2_to_fp8x2<F>(div_rn(x2, scale), div_rn(x3, scale)) << 16;
  }
  return Vec16{codes[0], codes[1], codes[2], codes[3]};
}

template <class T, Fp8Format F> FA_DEVICE Vec16 quantize16(const T *src, float scale) {
  const Vec16 *s = reinterpret_cast<const Vec16 *>(src);
  return quantize16<T, F>(ld_global_nc(s), ld_global_nc(s + 1), scale);
}

FA_DEVICE void paged_append_fp8_kernel(const FaAppendParams &p) {
  Chunk ch;
  if (!flat_chunk<16>(p, ch)) return;
  const int64_t slot = cache_slot(p, ch.token);
  if (slot < 0) return;
  const int h = ch.h;
  const int64_t k_at = ch.token * p.k_token_stride + h * p.k_head_stride + ch.c * 16;
  const int64_t v_at = ch.token * p.v_token_stride + h * p.v_head_stride + ch.c * 16;
  const KvPtrs<uint8_t> dst = cache_at<uint8_t>(p.cache, slot, h, ch.c * 16);
  const float ks = ld_global_nc(p.cache.k_scale + (int64_t)h * p.cache.scale_head_stride);
  const float vs = ld_global_nc(p.cache.v_scale + (int64_t)h * p.cache.scale_head_stride);
  const bool e5m2 = p.cache.kv_dtype == FA_KV_FP8_E5M2;
  // K inside Dqk, V inside Dv (a V head dim of its own: the chunk may lie past one of them).
  if (ch.c * 16 < p.head_dim) {
    Vec16 kq;
    if (p.dtype == FA_DTYPE_BF16) {
      const bf16_t *k = static_cast<const bf16_t *>(p.k) + k_at;
      kq = e5m2 ? quantize16<bf16_t, Fp8Format::E5M2>(k, ks) : quantize16<bf16_t, Fp8Format::E4M3>(k, ks);
    } else {
      const half_t *k = static_cast<const half_t *>(p.k) + k_at;
      kq = e5m2 ? quantize16<half_t, Fp8Format::E5M2>(k, ks) : quantize16<half_t, Fp8Format::E4M3>(k, ks);
    }
    st_global(reinterpret_cast<Vec16 *>(dst.k), kq);
  }
  if (ch.c * 16 < p.head_dim_v) {
    Vec16 vq;
    if (p.dtype == FA_DTYPE_BF16) {
      const bf16_t *v = static_cast<const bf16_t *>(p.v) + v_at;
      vq = e5m2 ? quantize16<bf16_t, Fp8Format::E5M2>(v, vs) : quantize16<bf16_t, Fp8Format::E4M3>(v, vs);
    } else {
      const half_t *v = static_cast<const half_t *>(p.v) + v_at;
      vq = e5m2 ? quantize16<half_t, Fp8Format::E5M2>(v, vs) : quantize16<half_t, Fp8Format::E4M3>(v, vs);
    }
    st_global(reinterpret_cast<Vec16 *>(dst.v), vq);
  }
}

// ---- RoPE kernels -------------------------------------------------------------------------------------
// kElems elements per thread (8: a 16-bit chunk; 16: an FP8 chunk), kThreads / (head_dim / kElems) whole
// rows per CTA (the threads past them idle through the barrier). Shared memory: one fp32 K row per CTA row,
// kThreads * kElems floats in all (the launcher's rope_smem_bytes).

// Where this thread's chunk lies: CTA row `row` (< rows_per_block, else idle), global row `item` (token *
// Hkv + head), chunk c of the head row.
struct RopeChunk {
  bool active;
  int row, h, c;
  int64_t token;
};
template <int kElems> FA_DEVICE RopeChunk rope_chunk(const FaAppendParams &p) {
  const int chunks = row_width(p) / kElems;
  const int rows_per_block = kThreads / chunks;
  const int tid = thread_idx();
  const int row = tid / chunks;
  const int64_t item = (int64_t)block_idx().x * rows_per_block + row;
  RopeChunk r{row < rows_per_block && item < (int64_t)p.num_tokens * p.heads_kv, row, 0, tid % chunks, 0};
  if (r.active) {
    r.token = item / p.heads_kv;
    r.h = (int)(item % p.heads_kv);
  }
  return r;
}

// Rotates x[at .. at + 8) (columns j0 ..) from the 16-byte-aligned table runs cos_run / sin_run (their
// pairs' entries: 8 NeoX, 4 GPT-J), the partners read from the fp32 row k_row.
template <bool kGptj, int kElems>
FA_DEVICE void rotate_group_vectorised(const float *cos_run, const float *sin_run, const float *k_row, int j0, int half,
                                       float (&x)[kElems], int at) {
  constexpr int kRuns = kGptj ? 1 : 2; // 16-byte loads per table
  float cs[4 * kRuns], sn[4 * kRuns];
#pragma unroll
  for (int v = 0; v < kRuns; ++v) {
    const Vec16 cw = ld_global_nc(reinterpret_cast<const Vec16 *>(cos_run) + v);
    const Vec16 sw = ld_global_nc(reinterpret_cast<const Vec16 *>(sin_run) + v);
    const uint32_t cb[4] = {cw.x, cw.y, cw.z, cw.w}, sb[4] = {sw.x, sw.y, sw.z, sw.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      __builtin_memcpy(&cs[4 * v + i], &cb[i], 4);
      __builtin_memcpy(&sn[4 * v + i], &sb[i], 4);
    }
  }
  const bool first_half = j0 < half; // NeoX: the group's elements are all first (a) or all second (b)
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    const int k = kGptj ? e >> 1 : e;
    const bool first = kGptj ? (e & 1) == 0 : first_half;
    const int partner = kGptj ? (j0 + e) ^ 1 : (first_half ? j0 + e + half : j0 + e - half);
    x[at + e] = rope_rotate(x[at + e], ld_shared(k_row + partner), cs[k], sn[k], first);
  }
}

// Rotates this thread's kElems K values x (columns c * kElems ..) in place; their whole row, as fp32, is in
// shared memory at k_row (the partners); elements at or past rotary_dim pass through. Eight elements at a
// time, whose (cos, sin) are a contiguous run of table columns when the eight lie inside one half of the
// rotated dims (NeoX: columns j or j - rotary_dim/2; GPT-J: j / 2, four columns): then both runs are read
// with 16-byte loads (2 + 2 NeoX, 1 + 1 GPT-J, instead of 8 + 8 scalar ones) if they are 16-byte aligned.
// Otherwise (a group across rotary_dim/2 or rotary_dim, e.g. partial rotary 20 of 80, or an unaligned table
// view) each rotated element reads its pair's entries as scalars. The values, and so the rotation, are the
// same either way.
template <int kElems>
FA_DEVICE void rope_rotate_chunk(const FaRope &r, int64_t pos, const float *k_row, int c, float (&x)[kElems]) {
  static_assert(kElems % 8 == 0, "whole groups of eight");
  const int row = rope_row(r, pos);
  const bool gptj = r.style == FA_ROPE_GPTJ;
  const int half = r.rotary_dim >> 1;
#pragma unroll
  for (int g = 0; g < kElems / 8; ++g) {
    const int j0 = c * kElems + 8 * g;
    if (j0 >= r.rotary_dim) break; // this group and the ones after it pass through
    const int idx0 = gptj ? j0 >> 1 : (j0 < half ? j0 : j0 - half);
    const float *cos_run = r.cos + (int64_t)row * r.cos_stride + idx0;
    const float *sin_run = r.sin + (int64_t)row * r.sin_stride + idx0;
    const bool one_half = j0 + 8 <= r.rotary_dim && (gptj || (j0 < half) == (j0 + 8 <= half));
    if (one_half && (((uintptr_t)cos_run | (uintptr_t)sin_run) & 15u) == 0) {
      // The layout as a template argument: every table index below is a compile-time constant, so the runs
      // stay in registers (a run-time choice of index put them in local memory).
      if (gptj) {
        rotate_group_vectorised<true>(cos_run, sin_run, k_row, j0, half, x, 8 * g);
      } else {
        rotate_group_vectorised<false>(cos_run, sin_run, k_row, j0, half, x, 8 * g);
      }
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const int j = j0 + e;
        if (j < r.rotary_dim) {
          const RopePair pr = rope_pair(j, r.rotary_dim, r.style);
          float cs, sn;
          rope_cos_sin(r, row, pr.index, cs, sn);
          x[8 * g + e] = rope_rotate(x[8 * g + e], ld_shared(k_row + pr.partner), cs, sn, pr.first);
        }
      }
    }
  }
}

template <class T> FA_DEVICE void unpack8(const Vec16 &w, float (&x)[8]) {
  unpack2<T>(w.x, x[0], x[1]);
  unpack2<T>(w.y, x[2], x[3]);
  unpack2<T>(w.z, x[4], x[5]);
  unpack2<T>(w.w, x[6], x[7]);
}

// 16-bit cache: K rotated in fp32 and rounded to T (words wholly past rotary_dim keep their input bits), V
// copied.
template <class T> FA_DEVICE void paged_append_rope_16(const FaAppendParams &p) {
  float *k_rows = dynamic_smem<float>();
  const RopeChunk ch = rope_chunk<8>(p);
  float *k_row = k_rows + ch.row * row_width(p);
  int64_t slot = -1;
  Vec16 kw{0, 0, 0, 0};
  float x[8];
  if (ch.active) slot = cache_slot(p, ch.token);
  const bool has_k = ch.c * 8 < p.head_dim, has_v = ch.c * 8 < p.head_dim_v; // (a V head dim of its own)
  if (slot >= 0 && has_k) {
    const uint16_t *k = static_cast<const uint16_t *>(p.k) + ch.token * p.k_token_stride + ch.h * p.k_head_stride + ch.c * 8;
    kw = ld_global_nc(reinterpret_cast<const Vec16 *>(k));
    unpack8<T>(kw, x);
#pragma unroll
    for (int e = 0; e < 8; ++e) st_shared(k_row + ch.c * 8 + e, x[e]);
  }
  sync_threads();
  if (slot < 0) return;
  const KvPtrs<uint16_t> dst = cache_at<uint16_t>(p.cache, slot, ch.h, ch.c * 8);
  if (has_k) {
    const int64_t pos = ld_global_nc(p.rope.positions + ch.token);
    rope_rotate_chunk<8>(p.rope, pos, k_row, ch.c, x);
    uint32_t w[4] = {kw.x, kw.y, kw.z, kw.w};
#pragma unroll
    for (int i = 0; i < 4; ++i)
      if (ch.c * 8 + 2 * i < p.rope.rotary_dim) w[i] = pack2<T>(x[2 * i], x[2 * i + 1]);
    st_global(reinterpret_cast<Vec16 *>(dst.k), Vec16{w[0], w[1], w[2], w[3]});
  }
  if (has_v) {
    const uint16_t *v = static_cast<const uint16_t *>(p.v) + ch.token * p.v_token_stride + ch.h * p.v_head_stride + ch.c * 8;
    st_global(reinterpret_cast<Vec16 *>(dst.v), ld_global_nc(reinterpret_cast<const Vec16 *>(v)));
  }
}

FA_DEVICE void paged_append_rope_kernel(const FaAppendParams &p) {
  if (p.dtype == FA_DTYPE_BF16) {
    paged_append_rope_16<bf16_t>(p);
  } else {
    paged_append_rope_16<half_t>(p);
  }
}

// 16 fp32 values -> 16 FP8 codes: x / scale, round to nearest even, saturating (as quantize16).
template <Fp8Format F> FA_DEVICE Vec16 quantize16_f32(const float (&x)[16], float scale) {
  uint32_t codes[4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
    codes[i] = (uint32_t)float2_to_fp8x2<F>(div_rn(x[4 * i], scale), div_rn(x[4 * i + 1], scale)) |
               (uint32_t)float2_to_fp8x2<F>(div_rn(x[4 * i + 2], scale), div_rn(x[4 * i + 3], scale)) << 16;
  return Vec16{codes[0], codes[1], codes[2], codes[3]};
}

// FP8 cache: K rotated in fp32, then quantised with its head's scale (no intermediate 16-bit rounding); V
// quantised as in the plain kernel.
template <class T> FA_DEVICE void paged_append_fp8_rope_t(const FaAppendParams &p) {
  float *k_rows = dynamic_smem<float>();
  const RopeChunk ch = rope_chunk<16>(p);
  float *k_row = k_rows + ch.row * row_width(p);
  int64_t slot = -1;
  float x[16];
  if (ch.active) slot = cache_slot(p, ch.token);
  const bool has_k = ch.c * 16 < p.head_dim, has_v = ch.c * 16 < p.head_dim_v; // (a V head dim of its own)
  if (slot >= 0 && has_k) {
    const Vec16 *k = reinterpret_cast<const Vec16 *>(static_cast<const T *>(p.k) + ch.token * p.k_token_stride +
                                                     ch.h * p.k_head_stride + ch.c * 16);
    const Vec16 a = ld_global_nc(k), b = ld_global_nc(k + 1);
    float lo[8], hi[8];
    unpack8<T>(a, lo);
    unpack8<T>(b, hi);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      x[e] = lo[e];
      x[8 + e] = hi[e];
    }
#pragma unroll
    for (int e = 0; e < 16; ++e) st_shared(k_row + ch.c * 16 + e, x[e]);
  }
  sync_threads();
  if (slot < 0) return;
  const bool e5m2 = p.cache.kv_dtype == FA_KV_FP8_E5M2;
  const KvPtrs<uint8_t> dst = cache_at<uint8_t>(p.cache, slot, ch.h, ch.c * 16);
  if (has_k) {
    const int64_t pos = ld_global_nc(p.rope.positions + ch.token);
    rope_rotate_chunk<16>(p.rope, pos, k_row, ch.c, x);
    const float ks = ld_global_nc(p.cache.k_scale + (int64_t)ch.h * p.cache.scale_head_stride);
    const Vec16 kq = e5m2 ? quantize16_f32<Fp8Format::E5M2>(x, ks) : quantize16_f32<Fp8Format::E4M3>(x, ks);
    st_global(reinterpret_cast<Vec16 *>(dst.k), kq);
  }
  if (has_v) {
    const float vs = ld_global_nc(p.cache.v_scale + (int64_t)ch.h * p.cache.scale_head_stride);
    const T *v = static_cast<const T *>(p.v) + ch.token * p.v_token_stride + ch.h * p.v_head_stride + ch.c * 16;
    const Vec16 vq = e5m2 ? quantize16<T, Fp8Format::E5M2>(v, vs) : quantize16<T, Fp8Format::E4M3>(v, vs);
    st_global(reinterpret_cast<Vec16 *>(dst.v), vq);
  }
}

FA_DEVICE void paged_append_fp8_rope_kernel(const FaAppendParams &p) {
  if (p.dtype == FA_DTYPE_BF16) {
    paged_append_fp8_rope_t<bf16_t>(p);
  } else {
    paged_append_fp8_rope_t<half_t>(p);
  }
}

} // namespace
} // namespace append
FA_NAMESPACE_END

// One kernel for both 16-bit dtypes (a move of 16-bit elements); 256 threads (kThreads), 4 CTAs per SM.
FA_KERNEL(fa_paged_append, 256, 4, FaAppendParams, fa::append::paged_append_kernel)
// Quantising append into an FP8 cache: either 16-bit source dtype, either format (run-time branches).
FA_KERNEL(fa_paged_append_fp8, 256, 4, FaAppendParams, fa::append::paged_append_fp8_kernel)
// The RoPE appends (p.rope.cos != NULL): whole rows per CTA, K parked in shared memory (fp32) for its pairs.
FA_KERNEL(fa_paged_append_rope, 256, 4, FaAppendParams, fa::append::paged_append_rope_kernel)
FA_KERNEL(fa_paged_append_fp8_rope, 256, 4, FaAppendParams, fa::append::paged_append_fp8_rope_kernel)

#if defined(FA_HOST_BUILD)
static_assert(fa::append::kThreads == 256, "fa_paged_append's launch bounds");

extern "C" int fa_append(FaAppendParams p, FaExec *exec) {
  using namespace fa::append;
  const FaPagedCache &c = p.cache;
  if (p.head_dim_v == 0) p.head_dim_v = p.head_dim; // V as wide as K
  if (p.num_tokens < 0 || p.heads_kv <= 0 || p.head_dim <= 0 || p.head_dim % 8 != 0) return FA_ERR_INVALID;
  if (p.head_dim_v <= 0 || p.head_dim_v % 8 != 0) return FA_ERR_INVALID;
  if (!fa::valid_divisor(c.page_div, c.page_size) || c.num_pages < 0) return FA_ERR_INVALID;
  if (p.dtype != FA_DTYPE_F16 && p.dtype != FA_DTYPE_BF16) return FA_ERR_UNSUPPORTED;
  if (!fa::valid_cache_format(c, p.head_dim) || !fa::valid_cache_format(c, p.head_dim_v)) return FA_ERR_INVALID;
  const bool fp8 = c.kv_dtype != FA_KV_SAME;
  const int width = row_width(p); // each row's chunks: the wider head dim's
  const int64_t items = (int64_t)p.num_tokens * p.heads_kv * (width / (fp8 ? 16 : 8));
  if (items == 0) return FA_OK;
  // Memory safety: every pointer dereferenced, 16-byte aligned rows (bases and element strides).
  const void *ptrs[] = {p.k, p.v, c.k_cache, c.v_cache};
  for (const void *ptr : ptrs)
    if (ptr == nullptr || ((uintptr_t)ptr & 15u) != 0) return FA_ERR_INVALID;
  if (p.slot_mapping == nullptr || ((uintptr_t)p.slot_mapping & 7u) != 0) return FA_ERR_INVALID;
  const int64_t strides[] = {p.k_token_stride, p.k_head_stride, p.v_token_stride, p.v_head_stride};
  for (int64_t s : strides)
    if (s < 0 || s % 8 != 0) return FA_ERR_INVALID;
  if (!fa::valid_cache_strides(c)) return FA_ERR_INVALID;
  if (!fa::valid_rope(p.rope, p.head_dim)) return FA_ERR_INVALID;
  if (p.rope.cos != nullptr) {
    if (p.rope.positions == nullptr || width / (fp8 ? 16 : 8) > kThreads) return FA_ERR_INVALID;
    // Whole rows per CTA; one fp32 row of shared memory per row (K's columns used).
    const int64_t rows_per_block = kThreads / (width / (fp8 ? 16 : 8));
    const int64_t rope_blocks = ((int64_t)p.num_tokens * p.heads_kv + rows_per_block - 1) / rows_per_block;
    if (rope_blocks > 0x7fffffff) return FA_ERR_INVALID;
    const int smem = (int)(rows_per_block * width * sizeof(float));
    if (fp8) return FA_LAUNCH(fa_paged_append_fp8_rope, fa::Dim3{(int)rope_blocks, 1, 1}, kThreads, smem, exec, p);
    return FA_LAUNCH(fa_paged_append_rope, fa::Dim3{(int)rope_blocks, 1, 1}, kThreads, smem, exec, p);
  }
  const int64_t blocks = (items + kThreads - 1) / kThreads;
  if (blocks > 0x7fffffff) return FA_ERR_INVALID;
  if (fp8) return FA_LAUNCH(fa_paged_append_fp8, fa::Dim3{(int)blocks, 1, 1}, kThreads, 0, exec, p);
  return FA_LAUNCH(fa_paged_append, fa::Dim3{(int)blocks, 1, 1}, kThreads, 0, exec, p);
}
#endif // FA_HOST_BUILD
