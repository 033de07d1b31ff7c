// Self-tests of the sm_90a intrinsics (wgmma, TMA, mbarrier, proxy fences, setmaxnreg) and of the emulator's
// Hopper checks (tests/it/hopper.rs drives them; tests/it/gpu_vs_emulator.rs compares them with a GPU bit for bit).
//
// build.rs compiles this file (like every kernels/*_sm90.cu) for sm_90a only; the Rust side loads its fatbin
// only into a context whose device is compute capability 9.0 (src/runtime/kernels.rs). Each kernel isolates one
// primitive (a wgmma shape and layout, a TMA box), plants one bug the emulator must report next to its
// correct twin, or, for the GEMM, composes them as a warp-specialised kernel does.
#include "fa/intrinsics.cuh"
#include "fa/namespace.cuh"
#include "fa/selftest_abi.h"

FA_NAMESPACE_BEGIN
namespace {

constexpr int kWarpgroup = 128;

struct alignas(16) U32x4 {
  uint32_t x, y, z, w;
};

// Every thread of the block copies 16-byte chunks of `bytes` from global to shared memory.
FA_DEVICE void stage_bytes(unsigned char *dst, const uint8_t *src, int bytes) {
  for (int i = thread_idx(); i < bytes / 16; i += block_dim()) {
    st_shared(reinterpret_cast<U32x4 *>(dst) + i, ld_global(reinterpret_cast<const U32x4 *>(src) + i));
  }
}

// The descriptor `desc` (start address 0) placed at shared window address `address`.
FA_DEVICE uint64_t at(uint64_t desc, uint32_t address) { return desc | (uint64_t)((address & 0x3FFFFu) >> 4); }

// ------------------------------------------------------------------------------------------------ wgmma

template <class T, int N> FA_DEVICE void selftest_wgmma_kernel(const FaSelftestWgmmaParams &p) {
  unsigned char *smem = dynamic_smem_aligned<unsigned char>();
  const int b_offset = (p.a_smem_bytes + 1023) / 1024 * 1024;
  stage_bytes(smem, p.a_smem, p.a_smem_bytes);
  stage_bytes(smem + b_offset, p.b_smem, p.b_smem_bytes);
  fence_proxy_async(); // the stores above are read by wgmma, through the async proxy
  sync_threads();
  const int t = thread_idx();
  WgmmaAcc<N> acc;
#pragma unroll
  for (int i = 0; i < N / 2; ++i) acc[i] = ld_global(p.c + t * (N / 2) + i);
  // Up to 4 k steps, unrolled so that a[s] stays in registers (a run-time index would put it on the stack).
  WgmmaFragA a[4];
  if (p.a_from_regs) {
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      if (s < p.k_steps) {
#pragma unroll
        for (int j = 0; j < 4; ++j) a[s][j] = ld_global(p.a_regs + (s * kWarpgroup + t) * 4 + j);
      }
    }
  }
  const uint32_t a_address = smem_addr(smem), b_address = smem_addr(smem + b_offset);
  wgmma_fence_operand(acc);
  wgmma_fence();
#pragma unroll
  for (int s = 0; s < 4; ++s) {
    if (s >= p.k_steps) break;
    const uint64_t da = at(p.desc_a, a_address + s * p.a_k_step_bytes);
    const uint64_t db = at(p.desc_b, b_address + s * p.b_k_step_bytes);
    const bool accumulate = s > 0 || p.accumulate;
    if (p.a_from_regs) {
      if (p.trans_b) {
        wgmma_rs<T, N, Major::MN>(acc, a[s], db, accumulate);
      } else {
        wgmma_rs<T, N, Major::K>(acc, a[s], db, accumulate);
      }
    } else if (p.trans_a) {
      if (p.trans_b) {
        wgmma_ss<T, N, Major::MN, Major::MN>(acc, da, db, accumulate);
      } else {
        wgmma_ss<T, N, Major::MN, Major::K>(acc, da, db, accumulate);
      }
    } else {
      if (p.trans_b) {
        wgmma_ss<T, N, Major::K, Major::MN>(acc, da, db, accumulate);
      } else {
        wgmma_ss<T, N, Major::K, Major::K>(acc, da, db, accumulate);
      }
    }
  }
  wgmma_commit();
  wgmma_wait<0>();
  wgmma_fence_operand(acc);
#pragma unroll
  for (int i = 0; i < N / 2; ++i) st_global(p.d + t * (N / 2) + i, acc[i]);
}

// -------------------------------------------------------------------------------------------------- TMA

template <int R> FA_DEVICE void load_box(const FaSelftestTmaParams &p, void *dst, uint64_t *bar) {
  int32_t c[R];
#pragma unroll
  for (int d = 0; d < R; ++d) c[d] = p.coords[d];
  tma_load(dst, &p.map, bar, c);
}

template <int R> FA_DEVICE void store_box(const FaSelftestTmaParams &p, const void *src) {
  int32_t c[R];
#pragma unroll
  for (int d = 0; d < R; ++d) c[d] = p.coords[d];
  tma_store(&p.map, c, src);
}

FA_DEVICE void selftest_tma_kernel(const FaSelftestTmaParams &p) {
  unsigned char *smem = dynamic_smem_aligned<unsigned char>();
  uint64_t *bar = reinterpret_cast<uint64_t *>(smem + (p.box_bytes + 127) / 128 * 128);
  const int t = thread_idx();
  if (p.mode == FA_SELFTEST_TMA_LOAD) {
    if (t == 0) {
      mbarrier_init(bar, 1);
      fence_mbarrier_init();
    }
    sync_threads();
    if (t == 0) {
      mbarrier_arrive_expect_tx(bar, (uint32_t)p.expect_tx);
      switch (p.rank) {
      case 1: load_box<1>(p, smem, bar); break;
      case 2: load_box<2>(p, smem, bar); break;
      case 3: load_box<3>(p, smem, bar); break;
      case 4: load_box<4>(p, smem, bar); break;
      default: load_box<5>(p, smem, bar); break;
      }
    }
    mbarrier_wait(bar, 0);
    for (int i = t; i < p.box_bytes / 16; i += block_dim()) {
      st_global(reinterpret_cast<U32x4 *>(p.image) + i, ld_shared(reinterpret_cast<const U32x4 *>(smem) + i));
    }
  } else {
    stage_bytes(smem, p.image, p.box_bytes);
    fence_proxy_async();
    sync_threads();
    if (t == 0) {
      switch (p.rank) {
      case 1: store_box<1>(p, smem); break;
      case 2: store_box<2>(p, smem); break;
      case 3: store_box<3>(p, smem); break;
      case 4: store_box<4>(p, smem); break;
      default: store_box<5>(p, smem); break;
      }
      tma_store_commit();
      tma_store_wait<0>();
    }
  }
}

// -------------------------------------------------------------------------------------------- planted bugs

// Shared memory of the bug kernels: three 8 KiB tiles (64 x 64 f16, as a 128B-swizzled TMA box), then the
// mbarriers.
constexpr int kTileBytes = 8192, kBarOffset = 3 * kTileBytes, kBugSmem = kBarOffset + 1024;

// A 64x64 K-major tile with 128B swizzle (rows of 128 bytes, 8-row groups 1024 bytes apart), k16 step kk.
FA_DEVICE uint64_t tile_desc(const unsigned char *tile, int kk) {
  return smem_matrix_desc(smem_addr(tile) + 32 * kk, 16, 1024, SmemSwizzle::B128);
}

// acc (+)= a · bᵀ over k = 64 (four m64n64k16 steps).
FA_DEVICE void tile_gemm(WgmmaAcc<64> &acc, const unsigned char *a, const unsigned char *b, bool accumulate) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    wgmma_ss<half_t, 64, Major::K, Major::K>(acc, tile_desc(a, kk), tile_desc(b, kk), accumulate || kk > 0);
  }
}

FA_DEVICE void tma_tile(const FaSelftestSm90BugParams &p, unsigned char *dst, uint64_t *bar) {
  const int32_t c[2] = {0, 0};
  tma_load(dst, &p.map, bar, c);
}

// Both tiles a and b loaded (the same data) through TMA, completing on bar, which every thread waits for.
FA_DEVICE void load_tiles(const FaSelftestSm90BugParams &p, unsigned char *a, unsigned char *b, uint64_t *bar) {
  if (thread_idx() == 0) {
    mbarrier_init(bar, 1);
    fence_mbarrier_init();
  }
  sync_threads();
  if (thread_idx() == 0) {
    mbarrier_arrive_expect_tx(bar, 2 * kTileBytes);
    tma_tile(p, a, bar);
    tma_tile(p, b, bar);
  }
  mbarrier_wait(bar, 0);
}

FA_DEVICE void store_acc(const FaSelftestSm90BugParams &p, WgmmaAcc<64> &acc) {
#pragma unroll
  for (int i = 0; i < 32; ++i) st_global(p.out + thread_idx() * 32 + i, acc[i]);
}

// The input tile copied into shared memory with ordinary stores (16 bytes per thread per step).
FA_DEVICE void store_tile(const FaSelftestSm90BugParams &p, unsigned char *tile) {
  stage_bytes(tile, reinterpret_cast<const uint8_t *>(p.input), kTileBytes);
}

FA_DEVICE void copy_out(const FaSelftestSm90BugParams &p, const unsigned char *tile) {
  const U32x4 v = ld_shared(reinterpret_cast<const U32x4 *>(tile) + thread_idx());
  st_global(reinterpret_cast<U32x4 *>(p.out) + thread_idx(), v);
}

FA_DEVICE void bug_sm90_kernel(const FaSelftestSm90BugParams &p) {
  const bool bug = p.planted != 0;
  const int t = thread_idx(), warp = warp_id();
  // The alignment bug takes the plain allocation (128-byte alignment declared) for a 128B-swizzled tile.
  unsigned char *smem = (bug && p.bug == FA_SM90_BUG_SMEM_ALIGNMENT_ASSUMED) ? dynamic_smem<unsigned char>()
                                                                            : dynamic_smem_aligned<unsigned char>();
  unsigned char *tile_a = smem, *tile_b = smem + kTileBytes, *tile_c = smem + 2 * kTileBytes;
  uint64_t *bars = reinterpret_cast<uint64_t *>(smem + kBarOffset);
  WgmmaAcc<64> acc;
  switch (p.bug) {
  case FA_SM90_BUG_ACC_READ_IN_FLIGHT:
    load_tiles(p, tile_a, tile_b, bars);
    wgmma_fence();
    tile_gemm(acc, tile_a, tile_b, false);
    wgmma_commit();
    if (bug) st_global(p.out + t, acc[0]); // the wgmma still owns acc
    wgmma_wait<0>();
    wgmma_fence_operand(acc);
    store_acc(p, acc);
    break;
  case FA_SM90_BUG_A_WRITE_IN_FLIGHT: {
    load_tiles(p, tile_a, tile_b, bars);
    WgmmaFragA a;
#pragma unroll
    for (int j = 0; j < 4; ++j) a[j] = (uint32_t)ld_global(p.input + 4 * t + j) * 0x10001u;
    wgmma_fence_operand(a);
    wgmma_fence();
    wgmma_rs<half_t, 64, Major::K>(acc, a, tile_desc(tile_b, 0), false);
    wgmma_commit();
    if (bug) a[0] = 0; // the wgmma may still read it
    wgmma_wait<0>();
    wgmma_fence_operand(acc);
    store_acc(p, acc);
    break;
  }
  case FA_SM90_BUG_SMEM_WRITE_IN_FLIGHT:
    load_tiles(p, tile_a, tile_b, bars);
    wgmma_fence();
    tile_gemm(acc, tile_a, tile_b, false);
    wgmma_commit();
    if (bug) st_shared(reinterpret_cast<uint32_t *>(tile_b) + 4 * t, 0u); // the wgmma still reads tile b
    wgmma_wait<0>();
    wgmma_fence_operand(acc);
    if (!bug) {
      sync_threads();
      st_shared(reinterpret_cast<uint32_t *>(tile_b) + 4 * t, 0u);
    }
    store_acc(p, acc);
    break;
  case FA_SM90_BUG_NO_WGMMA_FENCE:
    load_tiles(p, tile_a, tile_b, bars);
#pragma unroll
    for (int i = 0; i < 32; ++i) acc[i] = 0.0f;
    wgmma_fence_operand(acc);
    if (!bug) wgmma_fence();
    tile_gemm(acc, tile_a, tile_b, true);
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_fence_operand(acc);
    store_acc(p, acc);
    break;
  case FA_SM90_BUG_UNCOMMITTED_AT_EXIT:
  case FA_SM90_BUG_UNWAITED_AT_EXIT:
    load_tiles(p, tile_a, tile_b, bars);
    wgmma_fence();
    tile_gemm(acc, tile_a, tile_b, false);
    if (bug && p.bug == FA_SM90_BUG_UNCOMMITTED_AT_EXIT) return;
    wgmma_commit();
    if (bug) return;
    wgmma_wait<0>();
    wgmma_fence_operand(acc);
    store_acc(p, acc);
    break;
  case FA_SM90_BUG_MBARRIER_DOUBLE_INIT:
    if (warp == 0 && (bug || t == 0)) mbarrier_init(bars, 1);
    sync_threads();
    if (t == 0) mbarrier_arrive(bars);
    mbarrier_wait(bars, 0);
    st_global(p.out + t, (float)t);
    break;
  case FA_SM90_BUG_MBARRIER_UNORDERED_INIT:
    if (t == 0) {
      mbarrier_init(bars, 1);
      fence_mbarrier_init();
    }
    if (!bug) sync_threads();
    if (t == 32) mbarrier_arrive(bars);
    mbarrier_wait(bars, 0);
    st_global(p.out + t, (float)t);
    break;
  case FA_SM90_BUG_MBARRIER_PLAIN_ACCESS:
    if (t == 0) {
      mbarrier_init(bars, 1);
      fence_mbarrier_init();
    }
    sync_threads();
    if (bug && t == 0) st_global(p.out + 128, (float)ld_shared(reinterpret_cast<const uint32_t *>(bars)));
    if (t == 0) mbarrier_arrive(bars);
    mbarrier_wait(bars, 0);
    st_global(p.out + t, (float)t);
    break;
  case FA_SM90_BUG_EXPECT_TX_TOO_FEW:
    if (t == 0) {
      mbarrier_init(bars, 1);
      fence_mbarrier_init();
    }
    sync_threads();
    if (t == 0) {
      mbarrier_arrive_expect_tx(bars, bug ? kTileBytes : 2 * kTileBytes); // two tiles follow
      tma_tile(p, tile_a, bars);
      tma_tile(p, tile_b, bars);
    }
    mbarrier_wait(bars, 0);
    copy_out(p, tile_b);
    break;
  case FA_SM90_BUG_EXPECT_TX_TOO_MANY:
    if (t == 0) {
      mbarrier_init(bars, 1);
      fence_mbarrier_init();
    }
    sync_threads();
    if (t == 0) {
      mbarrier_arrive_expect_tx(bars, bug ? 2 * kTileBytes : kTileBytes); // one tile follows
      tma_tile(p, tile_a, bars);
    }
    mbarrier_wait(bars, 0);
    copy_out(p, tile_a);
    break;
  case FA_SM90_BUG_WAITER_BEHIND:
    if (t == 0) {
      mbarrier_init(bars, 32);
      fence_mbarrier_init();
    }
    sync_threads();
    if (warp == 1) {
      mbarrier_arrive(bars); // phase 0
      if (bug) mbarrier_arrive(bars); // phase 1, before warp 0 observed phase 0
    }
    if (warp < 2) named_barrier_sync(1, 64);
    if (warp == 0) mbarrier_wait(bars, 0);
    st_global(p.out + t, (float)t);
    break;
  case FA_SM90_BUG_TMA_READ_BEFORE_WAIT: {
    if (t == 0) {
      mbarrier_init(bars, 1);
      fence_mbarrier_init();
    }
    sync_threads();
    if (t == 0) {
      mbarrier_arrive_expect_tx(bars, kTileBytes);
      tma_tile(p, tile_a, bars);
    }
    U32x4 v{};
    if (bug) v = ld_shared(reinterpret_cast<const U32x4 *>(tile_a) + t);
    mbarrier_wait(bars, 0);
    if (!bug) v = ld_shared(reinterpret_cast<const U32x4 *>(tile_a) + t);
    st_global(reinterpret_cast<U32x4 *>(p.out) + t, v);
    break;
  }
  case FA_SM90_BUG_TMA_INTO_BUSY_STAGE: {
    // Every thread waits for each phase of `full` (a parity wait must not skip one), so all release the stage.
    uint64_t *full = bars, *empty = bars + 1;
    if (t == 0) {
      mbarrier_init(full, 1);
      mbarrier_init(empty, kWarpgroup);
      fence_mbarrier_init();
    }
    sync_threads();
    if (t == 0) {
      mbarrier_arrive_expect_tx(full, kTileBytes);
      tma_tile(p, tile_a, full);
    }
    mbarrier_wait(full, 0);
    U32x4 first{};
    if (warp == 1) first = ld_shared(reinterpret_cast<const U32x4 *>(tile_a) + t);
    mbarrier_arrive(empty);
    if (t == 0) {
      if (!bug) mbarrier_wait(empty, 0); // the stage is free once its consumers released it
      mbarrier_arrive_expect_tx(full, kTileBytes);
      tma_tile(p, tile_a, full);
    }
    mbarrier_wait(full, 1);
    const U32x4 second = ld_shared(reinterpret_cast<const U32x4 *>(tile_a) + t);
    st_global(reinterpret_cast<U32x4 *>(p.out) + t, warp == 1 ? first : second);
    break;
  }
  case FA_SM90_BUG_EXIT_WITH_TMA_IN_FLIGHT:
    if (t == 0) {
      mbarrier_init(bars, 1);
      fence_mbarrier_init();
    }
    sync_threads();
    if (t == 0) {
      mbarrier_arrive_expect_tx(bars, kTileBytes);
      tma_tile(p, tile_a, bars);
    }
    if (bug) return;
    mbarrier_wait(bars, 0);
    copy_out(p, tile_a);
    break;
  case FA_SM90_BUG_MISSING_PROXY_FENCE:
    store_tile(p, tile_a);
    store_tile(p, tile_b);
    if (!bug) fence_proxy_async(); // ordinary stores, then wgmma (the async proxy) reads them
    sync_threads();
    wgmma_fence();
    tile_gemm(acc, tile_a, tile_b, false);
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_fence_operand(acc);
    store_acc(p, acc);
    break;
  case FA_SM90_BUG_TMA_STORE_NO_FENCE:
  case FA_SM90_BUG_TMA_STORE_SRC_OVERWRITE: {
    store_tile(p, tile_a);
    if (!bug || p.bug != FA_SM90_BUG_TMA_STORE_NO_FENCE) fence_proxy_async();
    sync_threads();
    if (t == 0) {
      const int32_t c[2] = {0, 0};
      tma_store(&p.map, c, tile_a);
      tma_store_commit();
      if (bug && p.bug == FA_SM90_BUG_TMA_STORE_SRC_OVERWRITE) st_shared(reinterpret_cast<uint32_t *>(tile_a), 0u);
      tma_store_wait<0>();
    }
    st_global(p.out + t, (float)t);
    break;
  }
  case FA_SM90_BUG_SMEM_ALIGNMENT_ASSUMED:
    load_tiles(p, tile_a, tile_b, bars);
    copy_out(p, tile_a);
    break;
  case FA_SM90_BUG_BAR_ARRIVE_ORDER: {
    float *cells = reinterpret_cast<float *>(tile_c);
    if (warp == 0) {
      if (bug) named_barrier_arrive(1, 64); // announces data it has not written yet
      st_shared(cells + t, (float)ld_global(p.input + t));
      if (!bug) named_barrier_arrive(1, 64);
    } else if (warp == 1) {
      named_barrier_sync(1, 64);
      st_global(p.out + t, ld_shared(cells + t - 32));
    }
    break;
  }
  case FA_SM90_BUG_MBARRIER_INIT_NO_FENCE:
    if (t == 0) {
      mbarrier_init(bars, 1);
      if (!bug) fence_mbarrier_init();
    }
    sync_threads();
    if (t == 0) {
      mbarrier_arrive_expect_tx(bars, kTileBytes);
      tma_tile(p, tile_a, bars);
    }
    mbarrier_wait(bars, 0);
    copy_out(p, tile_a);
    break;
  case FA_SM90_BUG_WAIT_GROUP_NOT_A_BARRIER: {
    // One stage: tile_a, the wgmma's operand, and tile_c, rows the warps write meanwhile (as the prefill
    // kernel zeroes ragged V rows); thread 0 releases the stage for the warpgroup and refills it.
    uint64_t *full = bars, *empty = bars + 1;
    if (t == 0) {
      mbarrier_init(full, 1);
      mbarrier_init(empty, 1);
      fence_mbarrier_init();
    }
    sync_threads();
    if (t == 0) {
      mbarrier_arrive_expect_tx(full, 2 * kTileBytes);
      tma_tile(p, tile_a, full);
      tma_tile(p, tile_c, full);
    }
    mbarrier_wait(full, 0);
    wgmma_fence();
    tile_gemm(acc, tile_a, tile_a, false);
    wgmma_commit();
    if (warp > 0) st_shared(reinterpret_cast<uint32_t *>(tile_c) + t, 0u);
    wgmma_wait<0>();
    wgmma_fence_operand(acc);
    if (!bug) named_barrier_sync(1, kWarpgroup); // orders warps 1-3's stores before thread 0's release
    if (t == 0) {
      mbarrier_arrive(empty);
      mbarrier_wait(empty, 0);
      mbarrier_arrive_expect_tx(full, 2 * kTileBytes);
      tma_tile(p, tile_a, full);
      tma_tile(p, tile_c, full);
    }
    mbarrier_wait(full, 1);
    store_acc(p, acc);
    break;
  }
  default: break;
  }
}

// The register-pool bugs: 3 warpgroups, a producer and two consumers, as a warp-specialised kernel has them.
constexpr int kWsThreads = 3 * kWarpgroup;

FA_DEVICE void bug_setmaxnreg_kernel(const FaSelftestSm90BugParams &p) {
  const int wg = thread_idx() / kWarpgroup;
  if (p.bug == FA_SM90_BUG_SETMAXNREG_EXHAUSTED) {
    if (wg == 0) {
      if (!p.planted) setmaxnreg_dec<40>();
    } else {
      setmaxnreg_inc<232>();
    }
  } else if (wg == 1) {
    if (p.planted) {
      setmaxnreg_inc<160>(); // below the 168 per thread the warpgroup starts with
    } else {
      setmaxnreg_dec<160>();
    }
  }
  st_global(p.out + thread_idx(), (float)thread_idx());
}

// ------------------------------------------------------------------------------ warp-specialised GEMM

// Block tile 128 x 128, k tiles of 64 (one 128-byte swizzle row of 16-bit elements), a ring of 4 stages.
constexpr int kWsBM = 128, kWsBN = 128, kWsBK = 64, kWsStages = 4;
constexpr int kWsATile = kWsBM * kWsBK * 2, kWsBTile = kWsBN * kWsBK * 2, kWsStage = kWsATile + kWsBTile;
constexpr int kWsSmem = kWsStages * kWsStage + 1024; // + the full and empty mbarriers

// Producer: one thread keeps the ring full; the stage of k tile kt is kt % stages, used for the
// (kt / stages)-th time: its empty barrier must have completed that many phases (the first wait, with
// parity 1, passes at once: the phase before the first counts as completed).
template <class T> FA_DEVICE void ws_produce(const FaSelftestWsGemmParams &p, unsigned char *smem, uint64_t *full,
                                             uint64_t *empty, int k_tiles) {
  const int m0 = block_idx().y * kWsBM, n0 = block_idx().x * kWsBN;
  for (int kt = 0; kt < k_tiles; ++kt) {
    const int s = kt % kWsStages, use = kt / kWsStages;
    if (p.bug != FA_SELFTEST_WS_GEMM_NO_EMPTY_WAIT) mbarrier_wait(&empty[s], (use & 1) ^ 1);
    unsigned char *stage = smem + s * kWsStage;
    mbarrier_arrive_expect_tx(&full[s], p.bug == FA_SELFTEST_WS_GEMM_SHORT_TX ? kWsATile : kWsStage);
    const int32_t ca[2] = {kt * kWsBK, m0};
    tma_load(stage, &p.a_map, &full[s], ca);
    if (!p.b_mn_major) {
      const int32_t cb[2] = {kt * kWsBK, n0};
      tma_load(stage + kWsATile, &p.b_map, &full[s], cb);
    } else {
      // b [k][n]: two boxes of 64 n x 64 k, side by side 8 KiB apart (the MN-major operand's LBO).
      const int32_t cb0[2] = {n0, kt * kWsBK}, cb1[2] = {n0 + 64, kt * kWsBK};
      tma_load(stage + kWsATile, &p.b_map, &full[s], cb0);
      tma_load(stage + kWsATile + kWsBTile / 2, &p.b_map, &full[s], cb1);
    }
  }
}

// Consumer warpgroup c (0 or 1): rows 64c..64c+63 of the block tile, all 128 columns. B's major-ness is a
// template parameter: a run-time choice between two wgmma forms inside the k loop makes ptxas move
// accumulator registers between them and serialise the wgmma pipeline (C7519).
template <class T, bool kBMnMajor> FA_DEVICE void ws_consume(const FaSelftestWsGemmParams &p, unsigned char *smem, uint64_t *full,
                                             uint64_t *empty, int k_tiles, int c) {
  WgmmaAcc<kWsBN> acc;
  const bool leader = thread_idx() % kWarpgroup == 0;
  for (int kt = 0; kt < k_tiles; ++kt) {
    const int s = kt % kWsStages, use = kt / kWsStages;
    mbarrier_wait(&full[s], use & 1);
    unsigned char *stage = smem + s * kWsStage;
    const uint32_t a_address = smem_addr(stage + c * 64 * 128), b_address = smem_addr(stage + kWsATile);
    wgmma_fence_operand(acc);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kWsBK / 16; ++kk) {
      // A: 64 rows of 128 bytes, K-major, 128B swizzle: a k16 step is 32 bytes along the row.
      const uint64_t da = smem_matrix_desc(a_address + 32 * kk, 16, 1024, SmemSwizzle::B128);
      const bool accumulate = kt > 0 || kk > 0;
      if constexpr (!kBMnMajor) {
        const uint64_t db = smem_matrix_desc(b_address + 32 * kk, 16, 1024, SmemSwizzle::B128);
        wgmma_ss<T, kWsBN, Major::K, Major::K>(acc, da, db, accumulate);
      } else {
        // N-major, 128B swizzle: 64 n per 128-byte row (LBO 8 KiB to the next 64 n), 8 k rows per 1024 bytes
        // (SBO); a k16 step is two 8-row groups.
        const uint64_t db = smem_matrix_desc(b_address + 2048 * kk, kWsBTile / 2, 1024, SmemSwizzle::B128);
        wgmma_ss<T, kWsBN, Major::K, Major::MN>(acc, da, db, accumulate);
      }
    }
    wgmma_commit();
    if (p.bug == FA_SELFTEST_WS_GEMM_EARLY_RELEASE) {
      if (leader) mbarrier_arrive(&empty[s]); // the wgmma may still be reading the stage
      wgmma_wait<0>();
    } else {
      wgmma_wait<0>();
      if (leader) mbarrier_arrive(&empty[s]);
    }
    wgmma_fence_operand(acc);
  }
  // D fragment: register i holds row 16·warp + lane/4 + 8·((i>>1)&1), column 8·(i>>2) + 2·(lane%4) + (i&1).
  const int lane = lane_id(), w = warp_id() % 4;
  const int row0 = block_idx().y * kWsBM + 64 * c + 16 * w + lane / 4, col0 = block_idx().x * kWsBN + 2 * (lane % 4);
#pragma unroll
  for (int i = 0; i < kWsBN / 2; ++i) {
    const int row = row0 + 8 * ((i >> 1) & 1), col = col0 + 8 * (i >> 2) + (i & 1);
    if (row < p.m && col < p.n) st_global(p.c + (int64_t)row * p.n + col, acc[i]);
  }
}

template <class T> FA_DEVICE void selftest_ws_gemm_kernel(const FaSelftestWsGemmParams &p) {
  unsigned char *smem = dynamic_smem_aligned<unsigned char>();
  uint64_t *full = reinterpret_cast<uint64_t *>(smem + kWsStages * kWsStage), *empty = full + kWsStages;
  const int t = thread_idx(), wg = t / kWarpgroup;
  const int k_tiles = (p.k + kWsBK - 1) / kWsBK;
  if (t == 0) {
    for (int s = 0; s < kWsStages; ++s) {
      mbarrier_init(&full[s], 1);  // the producer's arrive.expect_tx (plus the copies' bytes)
      mbarrier_init(&empty[s], 2); // one arrive per consumer warpgroup
    }
    fence_mbarrier_init(); // before the sync: the TMA unit is the first to signal `full`
  }
  sync_threads();
  if (wg == 0) {
    setmaxnreg_dec<40>();
    if (t == 0) ws_produce<T>(p, smem, full, empty, k_tiles);
  } else {
    setmaxnreg_inc<232>();
    if (p.b_mn_major) {
      ws_consume<T, true>(p, smem, full, empty, k_tiles, wg - 1);
    } else {
      ws_consume<T, false>(p, smem, full, empty, k_tiles, wg - 1);
    }
  }
}

} // namespace
FA_NAMESPACE_END

// ------------------------------------------------------------------------------------------------- kernels

#define FA_WGMMA_SELFTEST(T, TN, N)                                                                                 \
  FA_KERNEL_SM90(fa_selftest_wgmma_##TN##_n##N, 128, 1, FaSelftestWgmmaParams, (fa::selftest_wgmma_kernel<fa::T, N>))
FA_WGMMA_SELFTEST(half_t, f16, 16)
FA_WGMMA_SELFTEST(half_t, f16, 64)
FA_WGMMA_SELFTEST(half_t, f16, 128)
FA_WGMMA_SELFTEST(half_t, f16, 176)
FA_WGMMA_SELFTEST(half_t, f16, 256)
FA_WGMMA_SELFTEST(bf16_t, bf16, 16)
FA_WGMMA_SELFTEST(bf16_t, bf16, 64)
FA_WGMMA_SELFTEST(bf16_t, bf16, 128)
FA_WGMMA_SELFTEST(bf16_t, bf16, 176)
FA_WGMMA_SELFTEST(bf16_t, bf16, 256)
#undef FA_WGMMA_SELFTEST
FA_KERNEL_SM90(fa_selftest_tma_kernel, 128, 1, FaSelftestTmaParams, fa::selftest_tma_kernel)
FA_KERNEL_SM90(fa_bug_sm90, 128, 1, FaSelftestSm90BugParams, fa::bug_sm90_kernel)
FA_KERNEL_SM90(fa_bug_sm90_setmaxnreg, fa::kWsThreads, 1, FaSelftestSm90BugParams, fa::bug_setmaxnreg_kernel)
FA_KERNEL_SM90(fa_selftest_ws_gemm_f16, fa::kWsThreads, 1, FaSelftestWsGemmParams, fa::selftest_ws_gemm_kernel<fa::half_t>)
FA_KERNEL_SM90(fa_selftest_ws_gemm_bf16, fa::kWsThreads, 1, FaSelftestWsGemmParams, fa::selftest_ws_gemm_kernel<fa::bf16_t>)

// ------------------------------------------------------------------------------------------------ launchers
#if defined(FA_HOST_BUILD)
using namespace fa;

extern "C" int fa_selftest_wgmma(FaSelftestWgmmaParams p, FaExec *exec) {
  if (p.k_steps < 1 || p.k_steps > 4 || p.a_smem_bytes < 0 || p.b_smem_bytes < 16 || p.a_smem_bytes % 16 != 0 ||
      p.b_smem_bytes % 16 != 0 || (p.a_from_regs && p.trans_a)) {
    return FA_ERR_INVALID;
  }
  const int smem = (p.a_smem_bytes + 1023) / 1024 * 1024 + p.b_smem_bytes;
  const bool bf16 = p.dtype == FA_DTYPE_BF16;
  if (!bf16 && p.dtype != FA_DTYPE_F16) return FA_ERR_INVALID;
  switch (p.n) {
  case 16: return bf16 ? FA_LAUNCH(fa_selftest_wgmma_bf16_n16, Dim3{}, 128, smem, exec, p)
                       : FA_LAUNCH(fa_selftest_wgmma_f16_n16, Dim3{}, 128, smem, exec, p);
  case 64: return bf16 ? FA_LAUNCH(fa_selftest_wgmma_bf16_n64, Dim3{}, 128, smem, exec, p)
                       : FA_LAUNCH(fa_selftest_wgmma_f16_n64, Dim3{}, 128, smem, exec, p);
  case 128: return bf16 ? FA_LAUNCH(fa_selftest_wgmma_bf16_n128, Dim3{}, 128, smem, exec, p)
                        : FA_LAUNCH(fa_selftest_wgmma_f16_n128, Dim3{}, 128, smem, exec, p);
  case 176: return bf16 ? FA_LAUNCH(fa_selftest_wgmma_bf16_n176, Dim3{}, 128, smem, exec, p)
                        : FA_LAUNCH(fa_selftest_wgmma_f16_n176, Dim3{}, 128, smem, exec, p);
  case 256: return bf16 ? FA_LAUNCH(fa_selftest_wgmma_bf16_n256, Dim3{}, 128, smem, exec, p)
                        : FA_LAUNCH(fa_selftest_wgmma_f16_n256, Dim3{}, 128, smem, exec, p);
  default: return FA_ERR_UNSUPPORTED;
  }
}

extern "C" int fa_selftest_tma(FaSelftestTmaParams p, FaExec *exec) {
  if (p.rank < 1 || p.rank > 5 || p.box_bytes < 16 || p.box_bytes % 16 != 0 || p.box_bytes > 64 * 1024 ||
      (p.mode != FA_SELFTEST_TMA_LOAD && p.mode != FA_SELFTEST_TMA_STORE)) {
    return FA_ERR_INVALID;
  }
  return FA_LAUNCH(fa_selftest_tma_kernel, Dim3{}, 128, (p.box_bytes + 127) / 128 * 128 + 128, exec, p);
}

extern "C" int fa_selftest_sm90_bug(FaSelftestSm90BugParams p, FaExec *exec) {
  // As fa_selftest_bug: a planted bug is a hang or a sticky fault on hardware; only the twins run there.
  if (recording_for_gpu(exec) && p.planted) return FA_ERR_UNSUPPORTED;
  if (p.bug < 0 || p.bug >= FA_SM90_BUG_COUNT) return FA_ERR_INVALID;
  if (p.bug == FA_SM90_BUG_SETMAXNREG_EXHAUSTED || p.bug == FA_SM90_BUG_SETMAXNREG_MISUSE) {
    return FA_LAUNCH(fa_bug_sm90_setmaxnreg, Dim3{}, kWsThreads, 0, exec, p);
  }
  return FA_LAUNCH(fa_bug_sm90, Dim3{}, 128, kBugSmem, exec, p);
}

extern "C" int fa_selftest_ws_gemm(FaSelftestWsGemmParams p, FaExec *exec) {
  if (p.m < 1 || p.n < 1 || p.k < 1 || p.bug < FA_SELFTEST_WS_GEMM_CORRECT || p.bug > FA_SELFTEST_WS_GEMM_SHORT_TX) {
    return FA_ERR_INVALID;
  }
  if (recording_for_gpu(exec) && p.bug != FA_SELFTEST_WS_GEMM_CORRECT) return FA_ERR_UNSUPPORTED;
  const Dim3 grid{(p.n + kWsBN - 1) / kWsBN, (p.m + kWsBM - 1) / kWsBM, 1};
  if (p.dtype == FA_DTYPE_F16) return FA_LAUNCH(fa_selftest_ws_gemm_f16, grid, kWsThreads, kWsSmem, exec, p);
  if (p.dtype == FA_DTYPE_BF16) return FA_LAUNCH(fa_selftest_ws_gemm_bf16, grid, kWsThreads, kWsSmem, exec, p);
  return FA_ERR_INVALID;
}
#endif // FA_HOST_BUILD
