// Fused prefill attention for sm_90a (Hopper): the same problem, semantics and outputs as kernels/prefill.cu,
// built from wgmma, TMA and mbarriers with warp specialisation (FlashAttention-3's structure).
//
// Persistent: each CTA runs work tiles (query tile of Br rows, query head, sequence) one after another, as
// fa/hopper/tile_scheduler.cuh assigns them; 1 + kConsumers warpgroups (fa/hopper/traits.cuh:
// Br = 128 with 2 consumers for D 128, 256 and 192 / 128, Br = 192 with 3 for D 64):
//   warpgroup 0, the producer (setmaxnreg.dec to 40, or 24 with 3 consumers): one thread issues TMA loads of
//     each work tile's Q tile and of the K/V tiles into a ring of stages guarded by separate K and V
//     full/empty mbarriers (fa/hopper/pipeline.cuh, producer.cuh);
//   the others, the consumers (setmaxnreg.inc to 232, or 160): 64 query rows each, S = Q Kᵀ by wgmma SS,
//     softcap/ALiBi, mask, online softmax, O += P V by wgmma RS, releasing K after S and V after P V
//     (fa/hopper/mainloop.cuh); finally O /= rowsum (with the sink), LSE, and 16-byte stores through shared
//     memory (fa/hopper/epilogue.cuh).
// KV tiles are visited top down over kv_block_range (causal and window tiles skipped as in the sm_80 kernel);
// causal schedules run the longest query tiles first (fa/hopper/tile_scheduler.cuh).
//
// RoPE on q (p.rope, a run-time switch): each consumer warpgroup rotates its rows of the Q tile in shared
// memory once it has landed, before its first S = Q Kᵀ (fa/hopper/rope_q.cuh).
//
// Supported: fp16/bf16, D 64/128/256 and the pair Dqk 192 / Dv 128 (DeepSeek: Q and K tiles of 192 columns,
// V and O of 128; S = Q Kᵀ over k = 192, O = P V of N = 128, no zero columns), dense and varlen, GQA, causal, LSE, RoPE on q, and every score variant
// (sliding window, softcap, ALiBi, sinks) with the sm_80 kernel's semantics and code (fa/score_mod.cuh); softcap and
// ALiBi are a run-time branch per tile rather than separate kernels (fa/hopper/mainloop.cuh, softmax_step,
// says why). The tensor maps are made by the Rust side (src/prefill/sm90.rs) for the backend that runs the
// kernel.
#include "fa/abi.h"
#include "fa/hopper/epilogue.cuh"
#include "fa/hopper/mainloop.cuh"
#include "fa/hopper/pipeline.cuh"
#include "fa/hopper/producer.cuh"
#include "fa/hopper/rope_q.cuh"
#include "fa/hopper/tile_scheduler.cuh"
#include "fa/hopper/traits.cuh"
#include "fa/intrinsics.cuh"
#include "fa/online_softmax.cuh"
#include "fa/prefill/block_range.cuh"
#include "fa/prefill/seq_info.cuh"
#include "fa/score_mod.cuh"
#include "fa/namespace.cuh"

FA_NAMESPACE_BEGIN
namespace hopper {
namespace {

// One consumer warpgroup's work tile: O and the softmax state from zero, the mainloop when there are KV
// tiles, then the epilogue. Leaves the Q buffer's rows of this warpgroup free (q_empty) for the next tile.
template <class T, class Tr>
FA_DEVICE void consume_tile(const FaPrefillParams &p, unsigned char *smem, const Barriers<Tr::kStages> &bars,
                            const WorkTile &work, const prefill::SeqInfo &seq, int m0, const WindowBounds &window,
                            const prefill::KvBlockRange &range, int c, int work_count,
                            PipelineState<Tr::kStages> &kv, const FaTensorMap *o_map) {
  constexpr int kHeadDimV = Tr::kHeadDimV;
  ConsumerTile ct;
  ct.wg = c;
  ct.warp_row0 = m0 + 64 * c + 16 * (warp_id() % 4);
  ct.tq = seq.tq;
  ct.tk = seq.tk;
  ct.window = window;
  ct.zero_ragged_v = p.cu_seqlens_q != nullptr;
  ct.first_key = m0 + (seq.tk - seq.tq) - window.left;
  ct.tanh_in = ScoreMod::tanh_input(p.scale, p.score_mod.softcap);
  ct.slope_log2 = alibi_slope_log2(p.score_mod, work.batch, work.head);
  mbarrier_wait(bars.q_full(), work_count & 1); // the Q tile landed (or, without KV tiles, the buffer is free)
  const bool has_kv = range.n_end > range.n_begin;
  // RoPE: this warpgroup's rows rotated in place before O is set up (nothing of the mainloop live yet).
  if (has_kv && rope_enabled(p.rope)) rotate_q<T, Tr>(p, smem, c, work.batch, m0, seq);
  WgmmaAcc<kHeadDimV> o;
#pragma unroll
  for (int i = 0; i < kHeadDimV / 2; ++i) o[i] = 0.0f;
  OnlineSoftmax<1> softmax;
  softmax.init();
  if (has_kv) consume<T, Tr>(smem, bars, range, ct, p, o, softmax, kv);
  float lse[2];
  softmax.finalize(fragments(o), lse, softmax_scale_log2(p), sink_logit(p.score_mod, work.head));
  const OutputAt at{seq.o_offset + (int64_t)ct.warp_row0 * p.o_row_stride, seq.lse_offset + ct.warp_row0,
                    seq.tq - ct.warp_row0, o_map, ct.warp_row0, work.head, work.batch};
  store_output<T, Tr>(p, smem, o, lse, c, at);
  sync_warp(); // every lane's reads of the staged rows are done before lane 0 releases them
  if (lane_id() == 0) mbarrier_arrive(bars.q_empty());
}

// Calls f(work, seq, m0, window, range, work_count) for each of this CTA's work tiles (every one has rows;
// the check below only guards the invariant). Each role runs its own copy (setmaxnreg: a role's code must
// lie in its branch).
template <class Tr, class F> FA_DEVICE void for_each_work_tile(const FaPrefillParams &p, F f) {
  const TileScheduler sched = TileScheduler::of(p, Tr::kBr);
  auto run = [&](const WorkTile &work, int work_count) {
    const prefill::SeqInfo seq = prefill::seq_info(p, work.batch, work.head);
    const int m0 = work.m_block * Tr::kBr;
    if (m0 >= seq.tq) return false;
    const WindowBounds window = effective_window(p.score_mod, p.causal != 0, seq.tq, seq.tk);
    const prefill::KvBlockRange range =
        prefill::kv_block_range(m0, Tr::kBr, Tr::kBc, seq.tq, seq.tk, window.left, window.right);
    f(work, seq, m0, window, range, work_count);
    return true;
  };
  int work_count = 0; // with one CTA per tile (ctas = 0) the loop runs at most once
  WorkTile work;
  TileScheduler::Cursor cursor;
  for (int t = TileScheduler::first(); sched.tile(t, work, cursor);) {
    work_count += run(work, work_count);
    if (t > INT32_MAX - TileScheduler::stride()) break; // the next index would overflow (tiles ≤ INT32_MAX)
    t += TileScheduler::stride();
  }
}

template <class T, int kHeadDim, int kBc, int kHeadDimV>
FA_DEVICE void prefill_sm90_kernel(const FaPrefillSm90Params &params) {
  using Tr = PrefillTraits<kHeadDim, kBc, kHeadDimV>;
  const FaPrefillParams &p = params.base;
  unsigned char *smem = dynamic_smem_aligned<unsigned char>();
  const Barriers<Tr::kStages> bars = Barriers<Tr::kStages>::at(smem + Tr::kBarrierOffset);
  if (warp_id() == 0) check_smem_aligned_1024(smem);
  if (thread_idx() == 0) bars.init(Tr::kConsumers);
  sync_threads();

  PipelineState<Tr::kStages> kv; // both sides walk the same KV tiles, work tile after work tile
  if (thread_idx() / kWarpgroupThreads == 0) {
    setmaxnreg_dec<Tr::kProducerRegs>();
    if (thread_idx() != 0) return;
    const bool varlen = p.cu_seqlens_q != nullptr;
    for_each_work_tile<Tr>(p, [&](const WorkTile &work, const prefill::SeqInfo &, int m0, const WindowBounds &,
                                  const prefill::KvBlockRange &range, int work_count) {
      // Varlen maps are [total rows, heads] with a batch of 1: a sequence starts at its cu_seqlens row.
      int q_start = 0, k_start = 0, len;
      if (varlen) { // clamped as seq_info clamps them
        prefill::varlen_bounds(p.cu_seqlens_q, work.batch, p.total_q, q_start, len);
        prefill::varlen_bounds(p.cu_seqlens_k, work.batch, p.total_k, k_start, len);
      }
      const TmaRows at{q_start + m0, k_start, work.head, work.head / (p.heads_q / p.heads_kv),
                       varlen ? 0 : work.batch};
      produce<Tr>(params, smem, bars, at, range.n_begin, range.n_end, work_count, kv);
    });
    producer_drain<Tr>(bars, kv);
  } else {
    setmaxnreg_inc<Tr::kConsumerRegs>();
    const int c = thread_idx() / kWarpgroupThreads - 1;
    const FaTensorMap *o_map = params.o_tma ? &params.o_map : nullptr; // dense: TMA-store epilogue
    for_each_work_tile<Tr>(p, [&](const WorkTile &work, const prefill::SeqInfo &seq, int m0,
                                  const WindowBounds &window, const prefill::KvBlockRange &range, int work_count) {
      consume_tile<T, Tr>(p, smem, bars, work, seq, m0, window, range, c, work_count, kv, o_map);
    });
  }
}

} // namespace
} // namespace hopper
FA_NAMESPACE_END

// fa_prefill_sm90_<dtype>_d<D>[_bc<Bc> | _dv<Dv>]: the suffix names the wider of two tiles of one head dim, or
// V's head dim when it is not D's.
#define FA_PREFILL_SM90_KERNEL(name, T, D, BC, DV)                                                           \
  FA_KERNEL_SM90(name, (fa::hopper::PrefillTraits<D, BC, DV>::kThreads),                                    \
                 (fa::hopper::PrefillTraits<D, BC, DV>::kMinCtasPerSm), FaPrefillSm90Params,                \
                 (fa::hopper::prefill_sm90_kernel<T, D, BC, DV>))
#define FA_PREFILL_SM90_TILE_KERNELS(D, BC, DV, SUFFIX)                                                      \
  FA_PREFILL_SM90_KERNEL(fa_prefill_sm90_f16_d##D##SUFFIX, fa::half_t, D, BC, DV)                            \
  FA_PREFILL_SM90_KERNEL(fa_prefill_sm90_bf16_d##D##SUFFIX, fa::bf16_t, D, BC, DV)
FA_PREFILL_SM90_TILES(FA_PREFILL_SM90_TILE_KERNELS)
#undef FA_PREFILL_SM90_TILE_KERNELS
#undef FA_PREFILL_SM90_KERNEL

#if defined(FA_HOST_BUILD)
#include "fa/tile_policy.h"

namespace fa {
namespace hopper {
namespace {

template <int kHeadDim, int kBc, int kHeadDimV>
int launch_prefill_sm90(void (*kernel)(FaPrefillSm90Params), const char *name, const FaPrefillSm90Params &p,
                        FaExec *exec) {
  using Tr = PrefillTraits<kHeadDim, kBc, kHeadDimV>;
  if (p.block_m != Tr::kBr) return FA_ERR_INVALID; // maps made for another tile
  if (p.o_tma && p.base.cu_seqlens_q != nullptr) return FA_ERR_INVALID; // a varlen box crosses sequences
  const int64_t m_blocks = p.base.seqlen_q / Tr::kBr + (p.base.seqlen_q % Tr::kBr != 0);
  const int64_t tiles = m_blocks * p.base.heads_q * p.base.batch;
  if (tiles == 0) return FA_OK;
  if (tiles > INT32_MAX || p.ctas < 0) return FA_ERR_INVALID;
  const int ctas = p.ctas > 0 && p.ctas < tiles ? p.ctas : (int)tiles;
  return launch(name, kernel, Dim3{ctas, 1, 1}, Tr::kThreads, Tr::kSmemBytes, exec, p);
}

// V's head dim of a call (FaPrefillParams::head_dim_v, 0 = head_dim).
int head_dim_v_of(const FaPrefillParams &p) { return p.head_dim_v != 0 ? p.head_dim_v : p.head_dim; }

// By head dims and the maps' Bc (a tile the kernels do not have is FA_ERR_INVALID), one case per instantiated
// tile (FA_PREFILL_SM90_TILES).
#define FA_PREFILL_SM90_CASE(D, BC, DV, SUFFIX)                                                              \
  if (p.base.head_dim == D && dv == DV && p.block_n == BC)                                                   \
    return p.base.dtype == FA_DTYPE_F16                                                                      \
               ? launch_prefill_sm90<D, BC, DV>(FA_KERNEL_REF(fa_prefill_sm90_f16_d##D##SUFFIX), p, exec)      \
               : launch_prefill_sm90<D, BC, DV>(FA_KERNEL_REF(fa_prefill_sm90_bf16_d##D##SUFFIX), p, exec);
int dispatch_sm90(const FaPrefillSm90Params &p, FaExec *exec) {
  const int dv = head_dim_v_of(p.base);
  if (prefill_sm90_block_n(p.base.head_dim, dv, true) == 0) return FA_ERR_UNSUPPORTED;
  if (p.base.dtype != FA_DTYPE_F16 && p.base.dtype != FA_DTYPE_BF16) return FA_ERR_UNSUPPORTED;
  FA_PREFILL_SM90_TILES(FA_PREFILL_SM90_CASE)
  return FA_ERR_INVALID; // maps made for a tile no kernel has
}
#undef FA_PREFILL_SM90_CASE

} // namespace

// The tile a call of these head dims (masked: causal or windowed) runs, and its launch shape (abi.h,
// fa_tile_policy and fa_prefill_sm90_tile_policy); the Rust side makes the tensor maps for it.
int tile_policy(int head_dim, int head_dim_v, bool masked, FaTilePolicy *out) {
  const int block_n = prefill_sm90_block_n(head_dim, head_dim_v, masked);
#define FA_PREFILL_SM90_POLICY(D, BC, DV, SUFFIX)                                                            \
  if (head_dim == D && head_dim_v == DV && block_n == BC) {                                                  \
    using Tr = PrefillTraits<D, BC, DV>;                                                                     \
    *out = FaTilePolicy{D, Tr::kBr, Tr::kBc, Tr::kStages, Tr::kThreads, Tr::kSmemBytes, Tr::kMinCtasPerSm, 0};  \
    return FA_OK;                                                                                            \
  }
  FA_PREFILL_SM90_TILES(FA_PREFILL_SM90_POLICY)
#undef FA_PREFILL_SM90_POLICY
  return FA_ERR_UNSUPPORTED;
}

} // namespace hopper
} // namespace fa

// The sm_80 launcher's checks (fa_prefill validates the same FaPrefillParams: pointers, alignment, strides,
// sizes, score variants, the RoPE table) via a dry run in record mode, then this kernel's own: the tile of the
// maps, a softcap its inline division is exact for (fa/score_mod.cuh), RoPE on q alone.
extern "C" int fa_prefill_sm90(FaPrefillSm90Params p, FaExec *exec) {
  if (!fa::softcap_inline_division_ok(p.base.score_mod.softcap)) return FA_ERR_UNSUPPORTED;
  // RoPE on K is fused in the sm_80 kernels only (fa/hopper/rope_q.cuh says why; docs/rope.md).
  if (p.base.rope_k != 0) return FA_ERR_UNSUPPORTED;
  // A V head dim of its own: 192 / 128 alone (its kernel's tile); other pairs run on the sm_80 kernel
  // (docs/head-dims.md).
  const int dv = fa::hopper::head_dim_v_of(p.base);
  if (dv != p.base.head_dim && fa::hopper::prefill_sm90_block_n(p.base.head_dim, dv, true) == 0)
    return FA_ERR_UNSUPPORTED;
  FaExec dry{};
  dry.mode = FA_EXEC_RECORD;
  const int status = fa_prefill(p.base, &dry);
  if (status != FA_OK) return status;
  return fa::hopper::dispatch_sm90(p, exec);
}
#endif // FA_HOST_BUILD
