// Append: scatter new tokens' K/V rows into their paged-cache slots (vLLM's reshape_and_cache_flash).
// k, v [num_tokens, Hkv, D]; slot_mapping int64 [num_tokens], slot = page * page_size + offset, negative =
// padding (skipped); the cache as in fa/paged_view.cuh. Works the same for one token per sequence (decode)
// and for a whole prompt (prefill into the cache).
//
// One thread per 16-byte chunk of one (token, head) row, for K and V: the copy is a dtype-agnostic move of
// 16-bit elements, so one kernel serves fp16 and bf16. Consecutive threads take consecutive chunks of a row,
// then the next head, so both the reads and the (per-row contiguous) writes coalesce.
#include "fa/intrinsics.cuh"
#include "fa/paged_view.cuh"
#include "fa/namespace.cuh"

FA_NAMESPACE_BEGIN
namespace append {
namespace {

constexpr int kThreads = 256;

FA_DEVICE void paged_append_kernel(const FaAppendParams &p) {
  const int chunks = p.head_dim / 8;
  const int64_t per_token = (int64_t)p.heads_kv * chunks;
  const int64_t item = (int64_t)block_idx().x * kThreads + thread_idx();
  if (item >= p.num_tokens * per_token) return;
  const int64_t token = item / per_token;
  const int h = (int)(item % per_token) / chunks;
  const int c = (int)(item % per_token) % chunks;

  const int64_t slot = ld_global_nc(p.slot_mapping + token);
  const int64_t num_slots = (int64_t)p.cache.num_pages << p.cache.log2_page_size;
  if (slot < 0 || slot >= num_slots) return; // padding; or out of range (device data the host cannot check)
  const int64_t page = slot >> p.cache.log2_page_size;
  const int64_t offset = slot & (p.cache.page_size - 1);

  const uint16_t *k = static_cast<const uint16_t *>(p.k) + token * p.k_token_stride + h * p.k_head_stride + c * 8;
  const uint16_t *v = static_cast<const uint16_t *>(p.v) + token * p.v_token_stride + h * p.v_head_stride + c * 8;
  uint16_t *k_dst = static_cast<uint16_t *>(p.cache.k_cache) + page * p.cache.k_page_stride +
                    offset * p.cache.k_token_stride + h * p.cache.k_head_stride + c * 8;
  uint16_t *v_dst = static_cast<uint16_t *>(p.cache.v_cache) + page * p.cache.v_page_stride +
                    offset * p.cache.v_token_stride + h * p.cache.v_head_stride + c * 8;
  st_global(reinterpret_cast<Vec16 *>(k_dst), ld_global_nc(reinterpret_cast<const Vec16 *>(k)));
  st_global(reinterpret_cast<Vec16 *>(v_dst), ld_global_nc(reinterpret_cast<const Vec16 *>(v)));
}

} // namespace
} // namespace append
FA_NAMESPACE_END

// One kernel for both 16-bit dtypes (a move of 16-bit elements); 256 threads (kThreads), 4 CTAs per SM.
FA_KERNEL(fa_paged_append, 256, 4, FaAppendParams, fa::append::paged_append_kernel)

#if defined(FA_HOST_BUILD)
static_assert(fa::append::kThreads == 256, "fa_paged_append's launch bounds");

extern "C" int fa_append(FaAppendParams p, FaExec *exec) {
  using namespace fa::append;
  const FaPagedCache &c = p.cache;
  if (p.num_tokens < 0 || p.heads_kv <= 0 || p.head_dim <= 0 || p.head_dim % 8 != 0) return FA_ERR_INVALID;
  if (c.page_size < 1 || c.page_size > 256 || c.page_size != (1 << c.log2_page_size) || c.num_pages < 0)
    return FA_ERR_INVALID;
  if (p.dtype != FA_DTYPE_F16 && p.dtype != FA_DTYPE_BF16) return FA_ERR_UNSUPPORTED;
  const int64_t items = (int64_t)p.num_tokens * p.heads_kv * (p.head_dim / 8);
  if (items == 0) return FA_OK;
  // Memory safety: every pointer dereferenced, 16-byte aligned rows (bases and element strides).
  const void *ptrs[] = {p.k, p.v, c.k_cache, c.v_cache};
  for (const void *ptr : ptrs)
    if (ptr == nullptr || ((uintptr_t)ptr & 15u) != 0) return FA_ERR_INVALID;
  if (p.slot_mapping == nullptr || ((uintptr_t)p.slot_mapping & 7u) != 0) return FA_ERR_INVALID;
  const int64_t strides[] = {p.k_token_stride, p.k_head_stride, p.v_token_stride, p.v_head_stride,
                             c.k_page_stride, c.k_token_stride, c.k_head_stride, c.v_page_stride,
                             c.v_token_stride, c.v_head_stride};
  for (int64_t s : strides)
    if (s < 0 || s % 8 != 0) return FA_ERR_INVALID;
  const int64_t blocks = (items + kThreads - 1) / kThreads;
  if (blocks > 0x7fffffff) return FA_ERR_INVALID;
  return FA_LAUNCH(fa_paged_append, fa::Dim3{(int)blocks, 1, 1}, kThreads, 0, exec, p);
}
#endif // FA_HOST_BUILD
