// Self-test kernels for the intrinsics layer and the host emulator (tests/emulator.rs drives them).
//
// The same source builds for the GPU (fatbin) and for the emulator (host build), and the launchers record or
// emulate like the ops' (abi.h, FaExec), so a GPU run can confirm that the emulator's answers are the
// hardware's. Each kernel isolates one piece of
// the vocabulary (fragment layouts, shuffles, cp.async groups, atomics, barriers), plants one bug the
// emulator must report, or, for the GEMM, uses all of it together the way the attention kernels do.
#include "fa/intrinsics.cuh"
#include "fa/namespace.cuh"
#include "fa/selftest_abi.h"

FA_NAMESPACE_BEGIN
namespace {

// 16 bytes moved as one vector access (LD.128 / ST.128 on the GPU).
struct alignas(16) U32x4 {
  uint32_t x, y, z, w;
};

// ------------------------------------------------------------------------------------- single intrinsics

// One warp-wide shared access per iteration, from one source line per kind and width (abi.h).
template <class V> FA_DEVICE uint32_t low_word(const V &v) {
  uint32_t w = 0;
  __builtin_memcpy(&w, &v, sizeof(V) < 4 ? sizeof(V) : 4);
  return w;
}
template <class V> FA_DEVICE uint32_t bank_access(unsigned char *smem, int kind, int offset) {
  V v{};
  if (kind == FA_SELFTEST_BANK_LOAD) v = ld_shared(reinterpret_cast<const V *>(smem + offset));
  if (kind == FA_SELFTEST_BANK_STORE) st_shared(reinterpret_cast<V *>(smem + offset), v);
  return low_word(v);
}
FA_DEVICE void selftest_bank_kernel(const FaSelftestBankParams &p) {
  unsigned char *smem = dynamic_smem<unsigned char>();
  const int lane = lane_id();
  const int offset = ld_global(p.offsets + lane);
  uint32_t word = 0;
  for (int i = 0; i < p.repeat; ++i) {
    if (p.kind == FA_SELFTEST_BANK_LDMATRIX_X4) {
      uint32_t r[4];
      ldmatrix_x4(r, smem + offset);
      word ^= r[0];
    } else if (offset >= 0 && p.kind == FA_SELFTEST_BANK_CP_ASYNC) {
      cp_async_cg_16(smem + offset, p.offsets, false);
    } else if (offset >= 0) {
      switch (p.bytes) {
      case 1: word ^= bank_access<uint8_t>(smem, p.kind, offset); break;
      case 2: word ^= bank_access<uint16_t>(smem, p.kind, offset); break;
      case 4: word ^= bank_access<uint32_t>(smem, p.kind, offset); break;
      case 8: word ^= bank_access<float2>(smem, p.kind, offset); break;
      default: word ^= bank_access<U32x4>(smem, p.kind, offset); break;
      }
    }
    cp_async_commit();
    cp_async_wait<0>();
  }
  st_global(p.out + lane, word);
}

FA_DEVICE void selftest_mma_kernel(const FaSelftestMmaParams &p) {
  const int lane = lane_id();
  uint32_t a[4], b[2];
  float d[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    a[i] = ld_global(p.a + 4 * lane + i);
    d[i] = ld_global(p.c + 4 * lane + i);
  }
  b[0] = ld_global(p.b + 2 * lane);
  b[1] = ld_global(p.b + 2 * lane + 1);
  if (p.dtype == FA_DTYPE_BF16) {
    mma_m16n8k16<bf16_t>(d, a, b);
  } else {
    mma_m16n8k16<half_t>(d, a, b);
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) st_global(p.d + 4 * lane + i, d[i]);
}

FA_DEVICE void selftest_ldmatrix_kernel(const FaSelftestLdmatrixParams &p) {
  U32x4 *smem = dynamic_smem<U32x4>();
  const int lane = lane_id();
  for (int r = lane; r < p.rows; r += kWarpSize) {
    st_shared(smem + r, ld_global(reinterpret_cast<const U32x4 *>(p.rows_data) + r));
  }
  sync_threads();
  const void *row = smem + ld_global(p.row_of_lane + lane);
  uint32_t *out = p.out + 4 * lane;
  const int variant = p.count * 2 + (p.trans ? 1 : 0);
  if (variant == 2) {
    uint32_t r[1];
    ldmatrix_x1(r, row);
    st_global(out, r[0]);
  } else if (variant == 3) {
    uint32_t r[1];
    ldmatrix_x1_trans(r, row);
    st_global(out, r[0]);
  } else if (variant == 4) {
    uint32_t r[2];
    ldmatrix_x2(r, row);
    st_global(out, r[0]);
    st_global(out + 1, r[1]);
  } else if (variant == 5) {
    uint32_t r[2];
    ldmatrix_x2_trans(r, row);
    st_global(out, r[0]);
    st_global(out + 1, r[1]);
  } else if (variant == 8) {
    uint32_t r[4];
    ldmatrix_x4(r, row);
#pragma unroll
    for (int i = 0; i < 4; ++i) st_global(out + i, r[i]);
  } else if (variant == 9) {
    uint32_t r[4];
    ldmatrix_x4_trans(r, row);
#pragma unroll
    for (int i = 0; i < 4; ++i) st_global(out + i, r[i]);
  }
}

FA_DEVICE void selftest_warp_kernel(const FaSelftestWarpParams &p) {
  const int lane = lane_id();
  const uint32_t v = ld_global(p.values + lane);
  const int operand = ld_global(p.operands + lane);
  uint32_t r = 0;
  switch (p.op) {
  case FA_SELFTEST_SHFL_XOR: r = shfl_xor(v, operand); break;
  case FA_SELFTEST_SHFL_IDX: r = shfl_idx(v, operand); break;
  case FA_SELFTEST_BALLOT: r = warp_ballot(v != 0); break;
  case FA_SELFTEST_ANY: r = warp_any(v != 0) ? 1u : 0u; break;
  case FA_SELFTEST_ALL: r = warp_all(v != 0) ? 1u : 0u; break;
  case FA_SELFTEST_EXP2: {
    float x, y;
    __builtin_memcpy(&x, &v, 4);
    y = fast_exp2(x);
    __builtin_memcpy(&r, &y, 4);
    break;
  }
  default: break;
  }
  st_global(p.out + lane, r);
}

constexpr int kCpAsyncThreads = 64;

FA_DEVICE void selftest_cp_async_kernel(const FaSelftestCpAsyncParams &p) {
  U32x4 *smem = dynamic_smem<U32x4>();
  const U32x4 *src = reinterpret_cast<const U32x4 *>(p.src);
  U32x4 *out = reinterpret_cast<U32x4 *>(p.out);
  const int t = thread_idx();
  for (int g = 0; g < p.groups; ++g) {
    const int j = g * kCpAsyncThreads + t;
    // A false predicate must not read the source: pass an address that is not even in a buffer.
    const bool pred = ld_global(p.preds + j) != 0;
    cp_async_cg_16(smem + j, pred ? src + j : nullptr, pred);
    cp_async_commit();
  }
  switch (p.wait_pending) {
  case 0: cp_async_wait<0>(); break;
  case 1: cp_async_wait<1>(); break;
  case 2: cp_async_wait<2>(); break;
  default: cp_async_wait<3>(); break;
  }
  sync_threads();
  for (int g = 0; g < p.read_groups; ++g) {
    const int j = g * kCpAsyncThreads + (t + 32) % kCpAsyncThreads;
    st_global(out + j, ld_shared(smem + j));
  }
}

constexpr int kBlock128 = 128;

FA_DEVICE void selftest_atomic_kernel(const FaSelftestAtomicParams &p) {
  const int i = block_idx().x * block_dim() + thread_idx();
  st_global(p.olds + i, atomic_add(p.counter, 1));
  atomic_add(p.sum, ld_global(p.addends + i));
}

FA_DEVICE void selftest_barrier_kernel(const FaSelftestBarrierParams &p) {
  int *smem = dynamic_smem<int>();
  const int t = thread_idx(), warp = warp_id();
  if (p.mode == FA_SELFTEST_BARRIER_BLOCK) {
    st_shared(smem + t, 7 * t + 1);
    named_barrier_sync(3, kBlock128);
    st_global(p.out + t, ld_shared(smem + (t + 64) % kBlock128));
    return;
  }
  if (p.mode == FA_SELFTEST_BARRIER_MISMATCH) {
    if (warp < 2) named_barrier_sync(1, warp == 0 ? 64 : 96);
    return;
  }
  // Warps 0 and 2 produce, 1 and 3 consume; each pair has its own barrier.
  const int id = warp < 2 ? 1 : 2;
  if (warp % 2 == 0) {
    st_shared(smem + t, 7 * t + 1);
    named_barrier_sync(id, 64);
    st_global(p.out + t, -1);
  } else {
    named_barrier_sync(id, 64);
    const int from = (p.mode == FA_SELFTEST_BARRIER_CROSS && warp == 3) ? t - 96 : t - 32;
    st_global(p.out + t, ld_shared(smem + from));
  }
}

// ------------------------------------------------------------------------------------------ planted bugs

constexpr int kBugElems = 512;

FA_DEVICE void bug_missing_syncthreads_kernel(const FaSelftestBugParams &p) {
  float *smem = dynamic_smem<float>();
  const int t = thread_idx();
  st_shared(smem + t, 2.0f * ld_global(p.input + t));
  if (!p.planted) sync_threads();
  st_global(p.out + t, ld_shared(smem + (t + 32) % kBlock128)); // another warp's element
}

FA_DEVICE void bug_oob_write_kernel(const FaSelftestBugParams &p) {
  const int n = kBugElems + (p.planted ? 1 : 0);
  for (int i = thread_idx(); i < n; i += kBlock128) st_global(p.out + i, ld_global(p.input + (i % kBugElems)));
}

FA_DEVICE void bug_missing_cp_async_wait_kernel(const FaSelftestBugParams &p) {
  U32x4 *smem = dynamic_smem<U32x4>();
  const int t = thread_idx();
  cp_async_cg_16(smem + t, reinterpret_cast<const U32x4 *>(p.input) + t, true);
  cp_async_commit();
  if (!p.planted) cp_async_wait<0>();
  sync_threads();
  st_global(reinterpret_cast<U32x4 *>(p.out) + t, ld_shared(smem + (t + 32) % kBlock128));
}

FA_DEVICE void bug_divergent_barrier_kernel(const FaSelftestBugParams &p) {
  const int t = thread_idx();
  st_global(p.out + t, ld_global(p.input + t));
  if (!p.planted || lane_id() < 16) sync_threads();
  st_global(p.out + t + kBlock128, ld_global(p.input + t + kBlock128));
}

FA_DEVICE void bug_deadlock_kernel(const FaSelftestBugParams &p) {
  const int t = thread_idx();
  // A barrier of 32 threads completes with warp 0 alone; of 64 it waits for a second warp forever.
  if (warp_id() == 0) named_barrier_sync(1, p.planted ? 64 : 32);
  st_global(p.out + t, ld_global(p.input + t));
}

FA_DEVICE void bug_misaligned_kernel(const FaSelftestBugParams &p) {
  const int t = thread_idx();
  if (t >= kBlock128 - 1) return; // the misaligned variant reads 4 bytes further; keep both in bounds
  const char *base = reinterpret_cast<const char *>(p.input) + (p.planted ? 4 : 0);
  st_global(reinterpret_cast<U32x4 *>(p.out) + t, ld_global(reinterpret_cast<const U32x4 *>(base) + t));
}

// Bypasses the checked intrinsics on purpose: only the host's own fault (turned into a report) can see it.
FA_DEVICE void bug_raw_pointer_kernel(const FaSelftestBugParams &p) {
  const int t = thread_idx();
  const float *src = reinterpret_cast<const float *>(p.planted ? (uintptr_t)0 : (uintptr_t)p.input);
  st_global(p.out + t, *static_cast<volatile const float *>(src + t));
}

FA_DEVICE void bug_div_by_zero_kernel(const FaSelftestBugParams &p) {
  const int t = thread_idx();
  const int divisor = p.planted ? (int)ld_global(p.input) - 1 : 1; // input[0] == 1.0
  st_global(p.out + t, ld_global(p.input + t / divisor));
}

FA_DEVICE void bug_store_to_input_kernel(const FaSelftestBugParams &p) {
  const int t = thread_idx();
  float *dst = p.planted ? const_cast<float *>(p.input) : p.out;
  st_global(dst + t, ld_global(p.input + t));
  if (p.planted) st_global(p.out + t, ld_global(p.input + t));
}

FA_DEVICE void bug_shared_oob_kernel(const FaSelftestBugParams &p) {
  float *smem = dynamic_smem<float>(); // 2048 bytes: 512 floats
  const int t = thread_idx();
  const int slot = (p.planted && t == 0) ? 4 * kBlock128 : 4 * t;
  st_shared(smem + slot, ld_global(p.input + t));
  sync_threads();
  st_global(p.out + t, ld_shared(smem + 4 * t));
}

FA_DEVICE void bug_global_as_shared_kernel(const FaSelftestBugParams &p) {
  float *smem = dynamic_smem<float>();
  const int t = thread_idx();
  st_shared(smem + t, ld_global(p.input + t));
  sync_threads();
  st_global(p.out + t, ld_shared(p.planted ? p.input + t : smem + t));
}

// Inter-block signalling: blocks never run at the same time in the emulator, so the wait must be reported.
FA_DEVICE void bug_spin_wait_kernel(const FaSelftestBugParams &p) {
  const int t = thread_idx();
  if (p.planted && t == 0) {
    while (ld_global(p.input) != 2.0f) { // input[0] is 1.0; "another block" would set it
    }
  }
  st_global(p.out + t, ld_global(p.input + t));
}

#if defined(FA_EMULATION)
// Emulator only: a recursive device function needs a stack frame, which the GPU build rejects (build.rs).
// 16 KiB of locals per call; the correct twin recurses 4 deep, the planted bug 1000 deep.
int recurse_with_large_locals(const float *in, int depth, int limit) {
  volatile float locals[4096];
  locals[depth % 4096] = (float)depth;
  if (depth >= limit) return (int)locals[0];
  return recurse_with_large_locals(in, depth + 1, limit) + (int)locals[depth % 4096] - depth;
}

FA_DEVICE void bug_stack_overflow_kernel(const FaSelftestBugParams &p) {
  const int t = thread_idx();
  const int zero = recurse_with_large_locals(p.input, 0, p.planted ? 1000 : 4);
  st_global(p.out + t, ld_global(p.input + t + zero));
}
#endif

// ------------------------------------------------------------------------------------------- tiled GEMM

// 64x64 block tile, 4 warps as 2x2 of 32x32, k tiles of 32 (two mma k-steps) in a two-stage cp.async
// pipeline. Rows are padded by 8 elements (16 bytes) so that the 8 rows one ldmatrix reads fall in
// different bank groups on the GPU.
constexpr int kGemmThreads = 128;
constexpr int kBM = 64, kBN = 64, kBK = 32, kPad = 8;
constexpr int kRowK = kBK + kPad;                // a and n-major b rows: 40 elements = 80 bytes
constexpr int kRowN = kBN + kPad;                // k-major b rows: 72 elements = 144 bytes
constexpr int kATile = kBM * kRowK;              // elements
constexpr int kBTile = kBN * kRowK > kBK * kRowN ? kBN * kRowK : kBK * kRowN;
constexpr int kStage = kATile + kBTile;          // elements per pipeline stage
constexpr int kGemmSmemBytes = 2 * kStage * 2;   // two stages of 16-bit elements

// One stage: a[m0.., k0..] and the matching b tile, 16-byte chunks, rows past m / n zero-filled.
template <class T>
FA_DEVICE void gemm_load_stage(const FaSelftestGemmParams &p, T *stage, int m0, int n0, int k0) {
  const T *a = static_cast<const T *>(p.a);
  const T *b = static_cast<const T *>(p.b);
  T *sa = stage, *sb = stage + kATile;
  const int t = thread_idx();
#pragma unroll
  for (int i = 0; i < 2; ++i) { // 64 rows x 4 chunks = 256 chunks, 2 per thread
    const int c = t + i * kGemmThreads, row = c / 4, col = (c % 4) * 8;
    const bool in = m0 + row < p.m;
    cp_async_cg_16(sa + row * kRowK + col, a + (in ? (int64_t)(m0 + row) * p.k + k0 + col : 0), in);
  }
  if (!p.b_k_major) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int c = t + i * kGemmThreads, row = c / 4, col = (c % 4) * 8;
      const bool in = n0 + row < p.n;
      cp_async_cg_16(sb + row * kRowK + col, b + (in ? (int64_t)(n0 + row) * p.k + k0 + col : 0), in);
    }
  } else {
#pragma unroll
    for (int i = 0; i < 2; ++i) { // 32 k-rows x 8 chunks
      const int c = t + i * kGemmThreads, row = c / 8, col = (c % 8) * 8;
      const bool in = n0 + col < p.n;
      cp_async_cg_16(sb + row * kRowN + col, b + (in ? (int64_t)(k0 + row) * p.n + n0 + col : 0), in);
    }
  }
}

template <class T> FA_DEVICE void selftest_gemm_kernel(const FaSelftestGemmParams &p) {
  T *smem = dynamic_smem<T>();
  const int lane = lane_id(), warp = warp_id();
  const int m0 = block_idx().y * kBM, n0 = block_idx().x * kBN;
  const int wm = (warp / 2) * 32, wn = (warp % 2) * 32;
  float acc[2][4][4];
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int ni = 0; ni < 4; ++ni)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[mi][ni][i] = 0.0f;

  const int k_tiles = p.k / kBK;
  gemm_load_stage(p, smem, m0, n0, 0);
  cp_async_commit();
  for (int kt = 0; kt < k_tiles; ++kt) {
    if (kt + 1 < k_tiles) gemm_load_stage(p, smem + ((kt + 1) % 2) * kStage, m0, n0, (kt + 1) * kBK);
    cp_async_commit(); // possibly empty: keeps "all but the newest group" meaning "this tile"
    if (p.bug != FA_SELFTEST_GEMM_NO_WAIT) cp_async_wait<1>();
    sync_threads(); // every thread's copies of this tile have landed
    const T *sa = smem + (kt % 2) * kStage, *sb = sa + kATile;
#pragma unroll
    for (int ks = 0; ks < kBK; ks += 16) {
      // A 16x16 fragments: lanes 0-15 address rows 0-15 at column ks, lanes 16-31 the same rows at ks + 8,
      // so matrices 0..3 are (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15):
      // exactly registers a0..a3 of the mma A fragment.
      uint32_t af[2][4];
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) {
        ldmatrix_x4(af[mi], sa + (wm + mi * 16 + lane % 16) * kRowK + ks + (lane / 16) * 8);
      }
      // B fragments for two n8 tiles per ldmatrix.x4: matrices (tile 0, k 0-7), (tile 0, k 8-15),
      // (tile 1, k 0-7), (tile 1, k 8-15) = b0, b1 of tile 0 and b0, b1 of tile 1. An n-major tile holds
      // B's columns as rows (plain ldmatrix); a k-major one holds its rows (ldmatrix.trans).
      uint32_t bf[4][2];
#pragma unroll
      for (int nj = 0; nj < 2; ++nj) {
        uint32_t r[4];
        const int tile_n = wn + nj * 16 + (lane / 16) * 8, k_half = ((lane / 8) % 2) * 8;
        if (!p.b_k_major) {
          ldmatrix_x4(r, sb + (tile_n + lane % 8) * kRowK + ks + k_half);
        } else {
          ldmatrix_x4_trans(r, sb + (ks + k_half + lane % 8) * kRowN + tile_n);
        }
        bf[2 * nj][0] = r[0];
        bf[2 * nj][1] = r[1];
        bf[2 * nj + 1][0] = r[2];
        bf[2 * nj + 1][1] = r[3];
      }
#pragma unroll
      for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int ni = 0; ni < 4; ++ni) mma_m16n8k16<T>(acc[mi][ni], af[mi], bf[ni]);
    }
    // The next iteration's cp.async refills the stage just read: everyone must be done reading it.
    if (p.bug != FA_SELFTEST_GEMM_NO_TRAILING_BARRIER) sync_threads();
  }

  // C fragment: lane holds rows g and g + 8, columns 2t and 2t + 1 of each 16x8 tile.
  const int g = lane / 4, t2 = (lane % 4) * 2;
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int ni = 0; ni < 4; ++ni)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = m0 + wm + mi * 16 + g + 8 * h, col = n0 + wn + ni * 8 + t2;
        if (row < p.m && col < p.n) {
          st_global(p.c + (int64_t)row * p.n + col, acc[mi][ni][2 * h]);
          st_global(p.c + (int64_t)row * p.n + col + 1, acc[mi][ni][2 * h + 1]);
        }
      }
}

// ----------------------------------------------------------------------------------------- microbenchmark

FA_DEVICE void selftest_bench_kernel(const FaSelftestBenchParams &p) {
  U32x4 *smem = dynamic_smem<U32x4>();
  const int t = thread_idx(), lane = lane_id();
  uint32_t v = (uint32_t)t;
  if (p.op == FA_SELFTEST_BENCH_SHFL) {
    for (int i = 0; i < p.iters; ++i) v = shfl_xor(v, 1) + 1u;
  } else if (p.op == FA_SELFTEST_BENCH_LDMATRIX) {
    st_shared(smem + t, U32x4{v, v + 1, v + 2, v + 3});
    sync_threads();
    for (int i = 0; i < p.iters; ++i) {
      uint32_t r[4];
      ldmatrix_x4(r, smem + warp_id() * 32 + (lane + i) % 32);
      v ^= r[0] + r[1] + r[2] + r[3];
    }
  } else if (p.op == FA_SELFTEST_BENCH_MMA) {
    float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const uint32_t a[4] = {0x3c003c00u, 0x3c003c00u, 0x3c003c00u, 0x3c003c00u}, b[2] = {0x3c003c00u, 0x3c003c00u};
    for (int i = 0; i < p.iters; ++i) mma_m16n8k16<half_t>(d, a, b);
    v = (uint32_t)d[0];
  } else if (p.op == FA_SELFTEST_BENCH_SYNCTHREADS) {
    for (int i = 0; i < p.iters; ++i) sync_threads();
  } else if (p.op == FA_SELFTEST_BENCH_SHARED_STORE_LOAD) {
    uint32_t *s = reinterpret_cast<uint32_t *>(smem);
    for (int i = 0; i < p.iters; ++i) {
      st_shared(s + t, v);
      v = ld_shared(s + t) + 1u;
    }
  }
  st_global(p.out + block_idx().x * kBlock128 + t, v);
}

// FP8 conversions (abi.h FaSelftestFp8Params): one item per thread, through exactly the intrinsics the FP8
// cache kernels use.
FA_DEVICE void selftest_fp8_kernel(const FaSelftestFp8Params &p) {
  const int i = block_idx().x * kBlock128 + thread_idx();
  if (i >= p.n) return;
  const bool e5m2 = p.kv_dtype == FA_KV_FP8_E5M2;
  if (p.encode) {
    const float lo = ld_global(p.values + 2 * i), hi = ld_global(p.values + 2 * i + 1);
    st_global(p.codes_out + i, e5m2 ? float2_to_fp8x2<Fp8Format::E5M2>(lo, hi)
                                    : float2_to_fp8x2<Fp8Format::E4M3>(lo, hi));
  } else {
    const uint16_t codes = ld_global(p.codes + i);
    st_global(p.halves + i, e5m2 ? fp8x2_to_half2<Fp8Format::E5M2>(codes) : fp8x2_to_half2<Fp8Format::E4M3>(codes));
  }
}

} // namespace
FA_NAMESPACE_END

// ------------------------------------------------------------------------------------------------- kernels

FA_KERNEL(fa_selftest_mma_kernel, 32, 1, FaSelftestMmaParams, fa::selftest_mma_kernel)
FA_KERNEL(fa_selftest_ldmatrix_kernel, 32, 1, FaSelftestLdmatrixParams, fa::selftest_ldmatrix_kernel)
FA_KERNEL(fa_selftest_warp_kernel, 32, 1, FaSelftestWarpParams, fa::selftest_warp_kernel)
FA_KERNEL(fa_selftest_bank_kernel, 32, 1, FaSelftestBankParams, fa::selftest_bank_kernel)
FA_KERNEL(fa_selftest_cp_async_kernel, fa::kCpAsyncThreads, 1, FaSelftestCpAsyncParams, fa::selftest_cp_async_kernel)
FA_KERNEL(fa_selftest_atomic_kernel, fa::kBlock128, 1, FaSelftestAtomicParams, fa::selftest_atomic_kernel)
FA_KERNEL(fa_selftest_barrier_kernel, fa::kBlock128, 1, FaSelftestBarrierParams, fa::selftest_barrier_kernel)
FA_KERNEL(fa_bug_missing_syncthreads, fa::kBlock128, 1, FaSelftestBugParams, fa::bug_missing_syncthreads_kernel)
FA_KERNEL(fa_bug_oob_write, fa::kBlock128, 1, FaSelftestBugParams, fa::bug_oob_write_kernel)
FA_KERNEL(fa_bug_missing_cp_async_wait, fa::kBlock128, 1, FaSelftestBugParams, fa::bug_missing_cp_async_wait_kernel)
FA_KERNEL(fa_bug_divergent_barrier, fa::kBlock128, 1, FaSelftestBugParams, fa::bug_divergent_barrier_kernel)
FA_KERNEL(fa_bug_deadlock, fa::kBlock128, 1, FaSelftestBugParams, fa::bug_deadlock_kernel)
FA_KERNEL(fa_bug_misaligned, fa::kBlock128, 1, FaSelftestBugParams, fa::bug_misaligned_kernel)
FA_KERNEL(fa_bug_raw_pointer, fa::kBlock128, 1, FaSelftestBugParams, fa::bug_raw_pointer_kernel)
FA_KERNEL(fa_bug_div_by_zero, fa::kBlock128, 1, FaSelftestBugParams, fa::bug_div_by_zero_kernel)
FA_KERNEL(fa_bug_store_to_input, fa::kBlock128, 1, FaSelftestBugParams, fa::bug_store_to_input_kernel)
FA_KERNEL(fa_bug_shared_oob, fa::kBlock128, 1, FaSelftestBugParams, fa::bug_shared_oob_kernel)
FA_KERNEL(fa_bug_global_as_shared, fa::kBlock128, 1, FaSelftestBugParams, fa::bug_global_as_shared_kernel)
FA_KERNEL(fa_bug_spin_wait, fa::kBlock128, 1, FaSelftestBugParams, fa::bug_spin_wait_kernel)
#if defined(FA_HOST_BUILD) // needs a stack frame, which the GPU build rejects
FA_KERNEL(fa_bug_stack_overflow, fa::kBlock128, 1, FaSelftestBugParams, fa::bug_stack_overflow_kernel)
#endif
FA_KERNEL(fa_selftest_fp8_kernel, fa::kBlock128, 1, FaSelftestFp8Params, fa::selftest_fp8_kernel)
FA_KERNEL(fa_selftest_bench_kernel, fa::kBlock128, 1, FaSelftestBenchParams, fa::selftest_bench_kernel)
FA_KERNEL(fa_selftest_gemm_f16, fa::kGemmThreads, 1, FaSelftestGemmParams, fa::selftest_gemm_kernel<fa::half_t>)
FA_KERNEL(fa_selftest_gemm_bf16, fa::kGemmThreads, 1, FaSelftestGemmParams, fa::selftest_gemm_kernel<fa::bf16_t>)

// ------------------------------------------------------------------------------------------------ launchers
#if defined(FA_HOST_BUILD)
using namespace fa;

extern "C" int fa_selftest_mma(FaSelftestMmaParams p, FaExec *exec) {
  if (p.dtype != FA_DTYPE_F16 && p.dtype != FA_DTYPE_BF16) return FA_ERR_INVALID;
  return FA_LAUNCH(fa_selftest_mma_kernel, Dim3{}, kWarpSize, 0, exec, p);
}

extern "C" int fa_selftest_fp8(FaSelftestFp8Params p, FaExec *exec) {
  if (p.n < 0 || (p.kv_dtype != FA_KV_FP8_E4M3 && p.kv_dtype != FA_KV_FP8_E5M2)) return FA_ERR_INVALID;
  if (p.encode ? (p.values == nullptr || p.codes_out == nullptr) : (p.codes == nullptr || p.halves == nullptr))
    return FA_ERR_INVALID;
  if (p.n == 0) return FA_OK;
  return FA_LAUNCH(fa_selftest_fp8_kernel, Dim3{(p.n + kBlock128 - 1) / kBlock128, 1, 1}, kBlock128, 0, exec, p);
}

extern "C" int fa_selftest_ldmatrix(FaSelftestLdmatrixParams p, FaExec *exec) {
  if (p.rows < 1 || p.rows > 64 || (p.count != 1 && p.count != 2 && p.count != 4)) return FA_ERR_INVALID;
  return FA_LAUNCH(fa_selftest_ldmatrix_kernel, Dim3{}, kWarpSize, p.rows * 16, exec, p);
}

extern "C" int fa_selftest_bank(FaSelftestBankParams p, FaExec *exec) {
  const bool sized = p.bytes == 1 || p.bytes == 2 || p.bytes == 4 || p.bytes == 8 || p.bytes == 16;
  if (p.kind < FA_SELFTEST_BANK_LOAD || p.kind > FA_SELFTEST_BANK_LDMATRIX_X4 || !sized || p.repeat < 1 ||
      p.repeat > 8 || p.smem_bytes < 16 || p.smem_bytes > 65536 || p.offsets == nullptr || p.out == nullptr)
    return FA_ERR_INVALID;
  if (p.kind >= FA_SELFTEST_BANK_CP_ASYNC && p.bytes != 16) return FA_ERR_INVALID;
  return FA_LAUNCH(fa_selftest_bank_kernel, Dim3{}, kWarpSize, p.smem_bytes, exec, p);
}

extern "C" int fa_selftest_warp(FaSelftestWarpParams p, FaExec *exec) {
  if (p.op < FA_SELFTEST_SHFL_XOR || p.op > FA_SELFTEST_EXP2) return FA_ERR_INVALID;
  return FA_LAUNCH(fa_selftest_warp_kernel, Dim3{}, kWarpSize, 0, exec, p);
}

extern "C" int fa_selftest_cp_async(FaSelftestCpAsyncParams p, FaExec *exec) {
  if (p.groups < 1 || p.groups > 4 || p.wait_pending < 0 || p.wait_pending > 3 || p.read_groups < 0 ||
      p.read_groups > p.groups) {
    return FA_ERR_INVALID;
  }
  return FA_LAUNCH(fa_selftest_cp_async_kernel, Dim3{}, kCpAsyncThreads,
                p.groups * kCpAsyncThreads * 16, exec, p);
}

extern "C" int fa_selftest_atomic(FaSelftestAtomicParams p, FaExec *exec) {
  if (p.blocks < 1) return FA_ERR_INVALID;
  return FA_LAUNCH(fa_selftest_atomic_kernel, Dim3{p.blocks, 1, 1}, kBlock128, 0, exec, p);
}

extern "C" int fa_selftest_barrier(FaSelftestBarrierParams p, FaExec *exec) {
  if (p.mode < FA_SELFTEST_BARRIER_PAIRS || p.mode > FA_SELFTEST_BARRIER_MISMATCH) return FA_ERR_INVALID;
  return FA_LAUNCH(fa_selftest_barrier_kernel, Dim3{}, kBlock128, kBlock128 * 4, exec, p);
}

extern "C" int fa_selftest_bug(FaSelftestBugParams p, FaExec *exec) {
  // On hardware a planted bug is a real fault: a hang (deadlock, spin wait) or a sticky error that kills the
  // context for every later launch. Only the correct twins run on the GPU.
  if (recording_for_gpu(exec) && p.planted) return FA_ERR_UNSUPPORTED;
  emu::ScopedRaceDetection race_detection(p.race_detection != 0);
  const int smem = kBlock128 * 16;
  switch (p.bug) {
  case FA_SELFTEST_BUG_MISSING_SYNCTHREADS:
    return FA_LAUNCH(fa_bug_missing_syncthreads, Dim3{}, kBlock128, smem, exec, p);
  case FA_SELFTEST_BUG_OOB_WRITE:
    return FA_LAUNCH(fa_bug_oob_write, Dim3{}, kBlock128, smem, exec, p);
  case FA_SELFTEST_BUG_MISSING_CP_ASYNC_WAIT:
    return FA_LAUNCH(fa_bug_missing_cp_async_wait, Dim3{}, kBlock128, smem, exec, p);
  case FA_SELFTEST_BUG_DIVERGENT_BARRIER:
    return FA_LAUNCH(fa_bug_divergent_barrier, Dim3{}, kBlock128, smem, exec, p);
  case FA_SELFTEST_BUG_DEADLOCK:
    return FA_LAUNCH(fa_bug_deadlock, Dim3{}, kBlock128, smem, exec, p);
  case FA_SELFTEST_BUG_MISALIGNED_16:
    return FA_LAUNCH(fa_bug_misaligned, Dim3{}, kBlock128, smem, exec, p);
  case FA_SELFTEST_BUG_RAW_POINTER:
    return FA_LAUNCH(fa_bug_raw_pointer, Dim3{}, kBlock128, smem, exec, p);
  case FA_SELFTEST_BUG_DIV_BY_ZERO:
    return FA_LAUNCH(fa_bug_div_by_zero, Dim3{}, kBlock128, smem, exec, p);
  case FA_SELFTEST_BUG_STORE_TO_INPUT:
    return FA_LAUNCH(fa_bug_store_to_input, Dim3{}, kBlock128, smem, exec, p);
  case FA_SELFTEST_BUG_SHARED_OOB:
    return FA_LAUNCH(fa_bug_shared_oob, Dim3{}, kBlock128, smem, exec, p);
  case FA_SELFTEST_BUG_GLOBAL_AS_SHARED:
    return FA_LAUNCH(fa_bug_global_as_shared, Dim3{}, kBlock128, smem, exec, p);
  case FA_SELFTEST_BUG_SPIN_WAIT:
    return FA_LAUNCH(fa_bug_spin_wait, Dim3{}, kBlock128, smem, exec, p);
  case FA_SELFTEST_BUG_STACK_OVERFLOW:
    if (recording_for_gpu(exec)) return FA_ERR_UNSUPPORTED; // emulator-only kernel (no fatbin entry)
    return FA_LAUNCH(fa_bug_stack_overflow, Dim3{}, kBlock128, smem, exec, p);
  default: return FA_ERR_INVALID;
  }
}

extern "C" int fa_selftest_gemm(FaSelftestGemmParams p, FaExec *exec) {
  if (p.m < 1 || p.n < 8 || p.n % 8 != 0 || p.k < kBK || p.k % kBK != 0) return FA_ERR_INVALID;
  if (p.bug < FA_SELFTEST_GEMM_CORRECT || p.bug > FA_SELFTEST_GEMM_NO_WAIT) return FA_ERR_INVALID;
  const Dim3 grid{(p.n + kBN - 1) / kBN, (p.m + kBM - 1) / kBM, 1};
  if (p.dtype == FA_DTYPE_F16) {
    return FA_LAUNCH(fa_selftest_gemm_f16, grid, kGemmThreads, kGemmSmemBytes, exec, p);
  }
  if (p.dtype == FA_DTYPE_BF16) {
    return FA_LAUNCH(fa_selftest_gemm_bf16, grid, kGemmThreads, kGemmSmemBytes, exec, p);
  }
  return FA_ERR_INVALID;
}

extern "C" int fa_selftest_bench(FaSelftestBenchParams p, FaExec *exec) {
  if (p.blocks < 1 || p.iters < 0 || p.op < FA_SELFTEST_BENCH_SHFL || p.op > FA_SELFTEST_BENCH_SHARED_STORE_LOAD) {
    return FA_ERR_INVALID;
  }
  return FA_LAUNCH(fa_selftest_bench_kernel, Dim3{p.blocks, 1, 1}, kBlock128, kBlock128 * 16, exec, p);
}
#endif // FA_HOST_BUILD
