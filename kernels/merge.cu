// Merge of attention states (FlashInfer's merge_states / flash-decoding's reduction): k partial results
// (o_s, lse_s) of the same rows over disjoint key sets combine into the result over all keys,
//   lse = lse_max + log(sum_s w_s),  w_s = exp(lse_s - lse_max),  o = sum_s w_s o_s / sum_s w_s.
// The split-KV decode uses it on its fp32 workspace; it is also a public op (cascade / ring attention).
// Layout and addressing: FaMergeParams in abi.h.
//
// One thread per (row, 8 columns): 16-byte loads and stores, the k LSEs of its row read through the
// read-only path (the row's D/8 threads read the same ones: L1 hits). The summation order is fixed
// (s = 0, 1, ...), so results are bitwise reproducible. Empty states (lse = -inf) weigh 0 and their o_s is
// not even read, so garbage there never leaks; all-empty rows give o = 0, lse = -inf (attention_state.cuh).
// Sinks (attention sinks, fa/score_mod.cuh): a row's sink joins as one more state with o = 0 — it raises
// lse_max if larger and adds its weight to the sum only, so a row of empty states gives o = 0, lse = sink.
#include "fa/attention_state.cuh"
#include "fa/decode/vec8.cuh"
#include "fa/intrinsics.cuh"
#include "fa/namespace.cuh"

FA_NAMESPACE_BEGIN
namespace merge {
namespace {

constexpr int kThreads = 128;
constexpr int kUnroll = 8; // states per batch of loads

template <class S, class O> FA_DEVICE void merge_states_kernel(const FaMergeParams &p) {
  const int chunks = p.head_dim / 8;
  const int64_t item = (int64_t)block_idx().x * kThreads + thread_idx();
  if (item >= (int64_t)p.rows_outer * p.rows_inner * chunks) return;
  const int c = (int)(item % chunks);
  const int64_t row = item / chunks;
  int64_t n = row / p.rows_inner;
  const int64_t h = row % p.rows_inner;

  // A row list names each outer row's output row and its run of states (a scheduled split-KV merges only
  // the sequences it split, each over its own number of states); else row n's states are s = 0 .. k-1.
  // The entries are device data: an out_row outside the launch's output rows, or a first state outside
  // the states, is skipped (a CUDA graph replayed after a `prepare` for more rows than it was captured
  // with: docs/semantics.md, "Safety"), and a run is clamped to the states there are.
  int64_t first_lse = n * p.lse_outer_stride, first_o = n * p.o_outer_stride;
  int num_states = p.num_states;
  if (p.row_list != nullptr) {
    const FaMergeRow *entry = p.row_list + n;
    const int out_row = ld_global_nc(&entry->out_row);
    if (out_row < 0 || out_row >= p.out_rows) return; // padding, or a row this launch has no output for
    const int first_state = ld_global_nc(&entry->first_state);
    const int entry_states = ld_global_nc(&entry->num_states);
    if (first_state < 0 || first_state > p.num_states) return;
    const int room = p.num_states - first_state;
    n = out_row;
    num_states = entry_states < 0 ? 0 : (entry_states < room ? entry_states : room);
    first_lse = (int64_t)first_state * p.lse_state_stride;
    first_o = (int64_t)first_state * p.o_state_stride;
  } else if (n >= p.out_rows) {
    return;
  }
  const float *lse_row = p.lse_states + first_lse + h * p.lse_inner_stride;
  const S *o_row = static_cast<const S *>(p.o_states) + first_o + h * p.o_inner_stride + c * 8;
  // States are visited kUnroll at a time so that many independent loads are in flight (split-KV merges
  // tens of states per row, and a serial chain of L2 round trips would dominate); the accumulation order
  // stays s = 0, 1, ... .
  float lse_max = kNegInf;
  for (int s0 = 0; s0 < num_states; s0 += kUnroll) {
    float l[kUnroll];
#pragma unroll
    for (int i = 0; i < kUnroll; ++i)
      l[i] = s0 + i < num_states ? ld_global_nc(lse_row + (s0 + i) * p.lse_state_stride) : kNegInf;
#pragma unroll
    for (int i = 0; i < kUnroll; ++i) lse_max = fmaxf(lse_max, l[i]);
  }
  const float sink = p.sinks != nullptr ? ld_global_nc(p.sinks + h) : kNegInf;
  lse_max = fmaxf(lse_max, sink);

  float sum = p.sinks != nullptr ? expf(sink - lse_max) : 0.0f;
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  if (lse_max != kNegInf) {
    for (int s0 = 0; s0 < num_states; s0 += kUnroll) {
      float w[kUnroll];
      float x[kUnroll][8];
#pragma unroll
      for (int i = 0; i < kUnroll; ++i)
        w[i] = s0 + i < num_states ? merge_weight(ld_global_nc(lse_row + (s0 + i) * p.lse_state_stride), lse_max)
                                     : 0.0f;
#pragma unroll
      for (int i = 0; i < kUnroll; ++i) // empty (or negligible) states: their o_s is not read
        if (w[i] != 0.0f) Vec8<S>::load(o_row + (s0 + i) * p.o_state_stride, x[i]);
#pragma unroll
      for (int i = 0; i < kUnroll; ++i) {
        if (w[i] == 0.0f) continue;
        sum += w[i];
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[j] += w[i] * x[i][j];
      }
    }
  }
  const float inv = inv_sum_or_zero(sum);
#pragma unroll
  for (int i = 0; i < 8; ++i) acc[i] *= inv;
  Vec8<O>::store(static_cast<O *>(p.o) + n * p.o_out_outer_stride + h * p.o_out_inner_stride + c * 8, acc);
  if (p.lse != nullptr && c == 0)
    st_global(p.lse + n * p.lse_out_outer_stride + h * p.lse_out_inner_stride,
              merged_lse(lse_max, sum));
}

} // namespace
} // namespace merge
FA_NAMESPACE_END

// One kernel per (states dtype, output dtype); 128 threads (kThreads), 4 CTAs per SM.
#define FA_MERGE_KERNEL(name, S, O) FA_KERNEL(name, 128, 4, FaMergeParams, (fa::merge::merge_states_kernel<S, O>))
FA_MERGE_KERNEL(fa_merge_states_f32_f32, float, float)
FA_MERGE_KERNEL(fa_merge_states_f32_f16, float, fa::half_t)
FA_MERGE_KERNEL(fa_merge_states_f32_bf16, float, fa::bf16_t)
FA_MERGE_KERNEL(fa_merge_states_f16_f32, fa::half_t, float)
FA_MERGE_KERNEL(fa_merge_states_f16_f16, fa::half_t, fa::half_t)
FA_MERGE_KERNEL(fa_merge_states_f16_bf16, fa::half_t, fa::bf16_t)
FA_MERGE_KERNEL(fa_merge_states_bf16_f32, fa::bf16_t, float)
FA_MERGE_KERNEL(fa_merge_states_bf16_f16, fa::bf16_t, fa::half_t)
FA_MERGE_KERNEL(fa_merge_states_bf16_bf16, fa::bf16_t, fa::bf16_t)

#if defined(FA_HOST_BUILD)
namespace fa {
namespace merge {
namespace {

static_assert(kThreads == 128, "FA_MERGE_KERNEL's launch bounds");

int launch_merge(void (*kernel)(FaMergeParams), const char *name, const FaMergeParams &p, FaExec *exec) {
  const int64_t items = (int64_t)p.rows_outer * p.rows_inner * (p.head_dim / 8);
  const int64_t blocks = (items + kThreads - 1) / kThreads;
  if (blocks > 0x7fffffff) return FA_ERR_INVALID;
  return launch(name, kernel, Dim3{(int)blocks, 1, 1}, kThreads, 0, exec, p);
}

// Index of a dtype among the kernels' (f32, f16, bf16), or -1.
int dtype_index(int dtype) {
  switch (dtype) {
  case FA_DTYPE_F32: return 0;
  case FA_DTYPE_F16: return 1;
  case FA_DTYPE_BF16: return 2;
  default: return -1;
  }
}

#define FA_MERGE_ENTRY(kernel) {kernel, #kernel}
struct Entry {
  void (*kernel)(FaMergeParams);
  const char *name;
};
const Entry kKernels[3][3] = {
    {FA_MERGE_ENTRY(fa_merge_states_f32_f32), FA_MERGE_ENTRY(fa_merge_states_f32_f16),
     FA_MERGE_ENTRY(fa_merge_states_f32_bf16)},
    {FA_MERGE_ENTRY(fa_merge_states_f16_f32), FA_MERGE_ENTRY(fa_merge_states_f16_f16),
     FA_MERGE_ENTRY(fa_merge_states_f16_bf16)},
    {FA_MERGE_ENTRY(fa_merge_states_bf16_f32), FA_MERGE_ENTRY(fa_merge_states_bf16_f16),
     FA_MERGE_ENTRY(fa_merge_states_bf16_bf16)},
};
#undef FA_MERGE_ENTRY

} // namespace
} // namespace merge
} // namespace fa

extern "C" int fa_merge(FaMergeParams p, FaExec *exec) {
  using namespace fa::merge;
  if (p.num_states < 0 || p.rows_outer < 0 || p.rows_inner < 0 || p.out_rows < 0 || p.head_dim <= 0 ||
      p.head_dim % 8 != 0)
    return FA_ERR_INVALID;
  // 16-byte row accesses: aligned bases and element strides that keep every row start aligned.
  const int s_bytes = p.states_dtype == FA_DTYPE_F32 ? 4 : 2;
  const int o_bytes = p.out_dtype == FA_DTYPE_F32 ? 4 : 2;
  if (((uintptr_t)p.o & 15u) != 0 || ((uintptr_t)p.lse & 3u) != 0) return FA_ERR_INVALID;
  if (p.num_states > 0 && (((uintptr_t)p.o_states & 15u) != 0 || ((uintptr_t)p.lse_states & 3u) != 0))
    return FA_ERR_INVALID;
  const int64_t s_strides[] = {p.o_state_stride, p.o_outer_stride, p.o_inner_stride};
  for (int64_t s : s_strides)
    if (s < 0 || (s * s_bytes) % 16 != 0) return FA_ERR_INVALID;
  const int64_t o_strides[] = {p.o_out_outer_stride, p.o_out_inner_stride};
  for (int64_t s : o_strides)
    if (s < 0 || (s * o_bytes) % 16 != 0) return FA_ERR_INVALID;
  if ((int64_t)p.rows_outer * p.rows_inner == 0) return FA_OK;
  if (p.o == nullptr || (p.num_states > 0 && (p.o_states == nullptr || p.lse_states == nullptr))) return FA_ERR_INVALID;
  if (((uintptr_t)p.sinks & 3u) != 0) return FA_ERR_INVALID;
  const int si = dtype_index(p.states_dtype);
  const int oi = dtype_index(p.out_dtype);
  if (si < 0 || oi < 0) return FA_ERR_UNSUPPORTED;
  return launch_merge(kKernels[si][oi].kernel, kKernels[si][oi].name, p, exec);
}
#endif // FA_HOST_BUILD
