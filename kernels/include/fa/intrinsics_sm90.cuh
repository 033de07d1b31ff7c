// The sm_90a part of the intrinsics layer: Hopper's asynchronous machinery. Included by fa/intrinsics.cuh;
// kernels that use it are sm_90a-only (kernels/*_sm90.cu, which build.rs compiles for 90a alone) and are
// declared with FA_KERNEL_SM90 (params __grid_constant__, so a TMA can read a tensor map inside them).
//
// Under nvcc each is inline PTX; in the host build each forwards to the executor (kernels/emu/warpgroup.cpp,
// mbarrier.cpp, tma.cpp), which completes every asynchronous operation as late as the hardware allows and
// checks its use (docs/emulator.md, "Hopper").
//
//  - wgmma (PTX ISA 9.7.15): warpgroup-wide (all 128 threads of 4 consecutive warps, same operands).
//      wgmma_fence_operand(acc); wgmma_fence(); wgmma_ss<T, N, ...>(acc, desc_a, desc_b, accumulate); ...
//      wgmma_commit(); wgmma_wait<0>(); wgmma_fence_operand(acc);
//    Accumulators are WgmmaAcc<N> (N/2 floats per thread: register i holds row 16·warp + lane/4 +
//    8·((i>>1)&1), column 8·(i>>2) + 2·(lane%4) + (i&1) of the 64 x N tile) and RS A fragments WgmmaFragA
//    (mma.m16n8k16's A layout per warp); access them only through operator[] (the emulator checks that no
//    in-flight wgmma owns them, and that a wgmma_fence separates accesses from the next wgmma).
//    wgmma_fence_operand keeps nvcc from moving register accesses across the asynchronous window.
//  - Shared-memory matrix descriptors: smem_matrix_desc(address, LBO, SBO, swizzle) (PTX ISA 9.7.15.5.1.2.2).
//  - mbarrier: mbarrier_init (one thread, then fence_mbarrier_init, then a barrier), mbarrier_arrive, mbarrier_arrive_expect_tx,
//    mbarrier_wait (try_wait.parity in a loop: returns once the phase with that parity has completed).
//  - TMA: tma_load (box -> shared, completes on an mbarrier with the whole box's bytes; optionally with an
//    L2 eviction priority, l2_evict_first() / l2_evict_last() / l2_evict_normal()), tma_store (shared -> box), tma_store_commit,
//    tma_store_wait<N> (the writes done) and tma_store_wait_read<N> (only the source read: the shared bytes
//    may be reused; CUTLASS's tma_store_wait); fence_proxy_async() after ordinary shared stores that wgmma
//    or a TMA store will read.
//  - setmaxnreg_inc<N>() / setmaxnreg_dec<N>() (warpgroup-wide); named_barrier_arrive(id, n) (bar.arrive).
//  - dynamic_smem_aligned<T>(): the dynamic shared memory, declared 1024-byte aligned (128B-swizzled tiles
//    need their pattern to start on a 1024-byte boundary; the emulator misaligns undeclared allocations);
//    check_smem_aligned_1024(p): by one warp, traps on the GPU if it is not (once per CTA).
#pragma once

#include <type_traits>

FA_NAMESPACE_BEGIN

// Swizzle field of a matrix descriptor (bits 62-63), and the matching tensor-map swizzle.
enum class SmemSwizzle : uint32_t { None = 0, B128 = 1, B64 = 2, B32 = 3 };

// A shared-memory matrix descriptor: start address, leading and stride byte offsets, each encoded as
// (x & 0x3FFFF) >> 4; base offset 0; the swizzle mode.
FA_HOST_DEVICE uint64_t smem_matrix_desc(uint32_t smem_address, uint32_t lbo_bytes, uint32_t sbo_bytes,
                                         SmemSwizzle swizzle) {
  return (uint64_t)((smem_address & 0x3FFFFu) >> 4) | (uint64_t)((lbo_bytes & 0x3FFFFu) >> 4) << 16 |
         (uint64_t)((sbo_bytes & 0x3FFFFu) >> 4) << 32 | (uint64_t)swizzle << 62;
}

// Register objects of wgmma. On the GPU plain arrays; in emulation every access is reported to the executor.
template <int N> class WgmmaAcc {
public:
  static_assert(N % 8 == 0 && N >= 8 && N <= 256, "wgmma m64nNk16: N is a multiple of 8 up to 256");
  static constexpr int kRegs = N / 2;
#if defined(FA_HOST_BUILD)
  float &operator[](int i) {
    emu::wgmma_register_access(this);
    return r_[i];
  }
#else
  FA_DEVICE float &operator[](int i) { return r_[i]; }
#endif
  // For the intrinsics layer only: the registers, unchecked.
  FA_DEVICE float *raw() { return r_; }

private:
  float r_[N / 2];
};

class WgmmaFragA {
public:
#if defined(FA_HOST_BUILD)
  uint32_t &operator[](int i) {
    emu::wgmma_register_access(this);
    return r_[i];
  }
#else
  FA_DEVICE uint32_t &operator[](int i) { return r_[i]; }
#endif
  FA_DEVICE uint32_t *raw() { return r_; }
  FA_DEVICE const uint32_t *raw() const { return r_; }

private:
  uint32_t r_[4];
};

// Major-ness of a wgmma operand in shared memory (imm-trans-a/b): K-major (0) or M/N-major (1).
enum class Major : int { K = 0, MN = 1 };

// An L2 cache policy for a TMA load (PTX createpolicy; the emulator keeps which one it is, to count the
// bytes loaded under each). evict_first: data read once (a Q tile); evict_last: data many CTAs read again
// (K and V: every query tile of a head reads the same keys), FA3's hints.
struct L2Policy {
  uint64_t bits;
};

#if !defined(FA_EMULATION)
// ------------------------------------------------------------------------------------------------ device
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900

template <class T> FA_DEVICE T *dynamic_smem_aligned() {
  extern __shared__ __align__(1024) unsigned char fa_dynamic_smem_1024[];
  return reinterpret_cast<T *>(fa_dynamic_smem_1024);
}

FA_DEVICE void named_barrier_arrive(int id, int nthreads) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(nthreads) : "memory");
}

FA_DEVICE void mbarrier_init(uint64_t *bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
FA_DEVICE void mbarrier_arrive(uint64_t *bar) {
  asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.shared::cta.b64 state, [%0];\n}" ::"r"(smem_addr(bar))
               : "memory");
}
FA_DEVICE void mbarrier_arrive_expect_tx(uint64_t *bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
}
// Returns once the phase with parity `parity` has completed (acquire).
FA_DEVICE void mbarrier_wait(uint64_t *bar, int parity) {
  uint32_t done;
  do {
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}"
                 : "=r"(done)
                 : "r"(smem_addr(bar)), "r"(parity)
                 : "memory");
  } while (!done);
}

FA_DEVICE void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// After mbarrier_init, by the initialising thread, before the barrier that publishes the barriers: makes
// the initialisation visible to the async proxy, whose TMA complete_tx may be the first to touch them
// (CUTLASS's fence_barrier_init; the CUDA guide's TMA example fences the proxy at the same point: both).
FA_DEVICE void fence_mbarrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n\tfence.proxy.async.shared::cta;" ::: "memory");
}

// The one-time check that the dynamic shared memory really starts on a 1024-byte boundary (the descriptors'
// base offset 0 and the TMA swizzle phase assume it; __align__ on the extern array is a request the
// toolchain has honoured, not a guarantee): a trap, so a violation is a launch error, never wrong numbers.
// Called by all 32 lanes of a warp. The address goes through a shuffle first: ptxas knows the extern
// array's declared alignment and folds a direct test away (no trap in the SASS); it does not see through
// shfl.sync.
FA_DEVICE void check_smem_aligned_1024(const void *smem) {
  uint32_t a;
  asm volatile("shfl.sync.idx.b32 %0, %1, 0, 0x1f, 0xffffffff;" : "=r"(a) : "r"(smem_addr(smem)));
  if ((a & 1023u) != 0) asm volatile("trap;");
}

// TMA: `map` points at an FaTensorMap inside the kernel's __grid_constant__ params; coordinates are
// elements, dimension 0 first.
template <int R>
FA_DEVICE void tma_load(void *smem_dst, const FaTensorMap *map, uint64_t *bar, const int32_t (&c)[R]) {
  static_assert(R >= 1 && R <= 5, "TMA tensors have 1 to 5 dimensions");
  const uint32_t dst = smem_addr(smem_dst), mb = smem_addr(bar);
  const uint64_t m = reinterpret_cast<uint64_t>(map);
  if constexpr (R == 1) {
    asm volatile("cp.async.bulk.tensor.1d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3}], [%2];"
                 ::"r"(dst), "l"(m), "r"(mb), "r"(c[0]) : "memory");
  } else if constexpr (R == 2) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], "
                 "[%2];" ::"r"(dst), "l"(m), "r"(mb), "r"(c[0]), "r"(c[1]) : "memory");
  } else if constexpr (R == 3) {
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, "
                 "%5}], [%2];" ::"r"(dst), "l"(m), "r"(mb), "r"(c[0]), "r"(c[1]), "r"(c[2]) : "memory");
  } else if constexpr (R == 4) {
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, "
                 "%5, %6}], [%2];" ::"r"(dst), "l"(m), "r"(mb), "r"(c[0]), "r"(c[1]), "r"(c[2]), "r"(c[3])
                 : "memory");
  } else {
    asm volatile("cp.async.bulk.tensor.5d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, "
                 "%5, %6, %7}], [%2];" ::"r"(dst), "l"(m), "r"(mb), "r"(c[0]), "r"(c[1]), "r"(c[2]), "r"(c[3]),
                 "r"(c[4]) : "memory");
  }
}

template <int R> FA_DEVICE void tma_store(const FaTensorMap *map, const int32_t (&c)[R], const void *smem_src) {
  static_assert(R >= 1 && R <= 5, "TMA tensors have 1 to 5 dimensions");
  const uint32_t src = smem_addr(smem_src);
  const uint64_t m = reinterpret_cast<uint64_t>(map);
  if constexpr (R == 1) {
    asm volatile("cp.async.bulk.tensor.1d.global.shared::cta.bulk_group [%0, {%2}], [%1];" ::"l"(m), "r"(src),
                 "r"(c[0]) : "memory");
  } else if constexpr (R == 2) {
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];" ::"l"(m), "r"(src),
                 "r"(c[0]), "r"(c[1]) : "memory");
  } else if constexpr (R == 3) {
    asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];" ::"l"(m),
                 "r"(src), "r"(c[0]), "r"(c[1]), "r"(c[2]) : "memory");
  } else if constexpr (R == 4) {
    asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];" ::"l"(m),
                 "r"(src), "r"(c[0]), "r"(c[1]), "r"(c[2]), "r"(c[3]) : "memory");
  } else {
    asm volatile("cp.async.bulk.tensor.5d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5, %6}], [%1];" ::"l"(m),
                 "r"(src), "r"(c[0]), "r"(c[1]), "r"(c[2]), "r"(c[3]), "r"(c[4]) : "memory");
  }
}
FA_DEVICE void tma_store_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
// Until at most `pending` committed bulk groups of this thread are incomplete (their writes done).
template <int pending> FA_DEVICE void tma_store_wait() {
  asm volatile("cp.async.bulk.wait_group %0;" ::"n"(pending) : "memory");
}
// Until at most `pending` committed bulk groups of this thread still read their shared source (their
// global writes may still be under way: they complete without the thread, even after it exits).
template <int pending> FA_DEVICE void tma_store_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(pending) : "memory");
}

FA_DEVICE L2Policy l2_evict_first() {
  L2Policy p;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p.bits));
  return p;
}
FA_DEVICE L2Policy l2_evict_last() {
  L2Policy p;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(p.bits));
  return p;
}
FA_DEVICE L2Policy l2_evict_normal() {
  L2Policy p;
  asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(p.bits));
  return p;
}
// A 4-D TMA load (the prefill kernel's maps) with an L2 cache policy.
FA_DEVICE void tma_load(void *smem_dst, const FaTensorMap *map, uint64_t *bar, const int32_t (&c)[4], L2Policy policy) {
  const uint32_t dst = smem_addr(smem_dst), mb = smem_addr(bar);
  const uint64_t m = reinterpret_cast<uint64_t>(map);
  asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], "
               "[%1, {%3, %4, %5, %6}], [%2], %7;" ::"r"(dst), "l"(m), "r"(mb), "r"(c[0]), "r"(c[1]), "r"(c[2]),
               "r"(c[3]), "l"(policy.bits) : "memory");
}

#endif // sm_90

#if !defined(__CUDA_ARCH__) || defined(__CUDA_ARCH_FEAT_SM90_ALL)
#include "fa/wgmma_sm90_asm.inc"

FA_DEVICE void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
FA_DEVICE void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int pending> FA_DEVICE void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(pending) : "memory");
}
// Pins the accumulator's registers at this point of the program (nvcc must not move accesses across it).
template <int N> FA_DEVICE void wgmma_fence_operand(WgmmaAcc<N> &acc) {
#pragma unroll
  for (int i = 0; i < N / 2; ++i) asm volatile("" : "+f"(acc.raw()[i])::"memory");
}
FA_DEVICE void wgmma_fence_operand(WgmmaFragA &a) {
#pragma unroll
  for (int i = 0; i < 4; ++i) asm volatile("" : "+r"(a.raw()[i])::"memory");
}

#define FA_WGMMA_DISPATCH(FORM, ...)                                                                                  \
  if constexpr (N == 8) FORM##_N8(__VA_ARGS__);                                                                       \
  else if constexpr (N == 16) FORM##_N16(__VA_ARGS__);                                                                \
  else if constexpr (N == 32) FORM##_N32(__VA_ARGS__);                                                                \
  else if constexpr (N == 64) FORM##_N64(__VA_ARGS__);                                                                \
  else if constexpr (N == 128) FORM##_N128(__VA_ARGS__);                                                              \
  else if constexpr (N == 176) FORM##_N176(__VA_ARGS__);                                                              \
  else FORM##_N256(__VA_ARGS__)

// D (+)= A · B, A and B from shared memory. T: half_t or bf16_t.
template <class T, int N, Major A, Major B>
FA_DEVICE void wgmma_ss(WgmmaAcc<N> &acc, uint64_t desc_a, uint64_t desc_b, bool accumulate) {
  static_assert(N == 8 || N == 16 || N == 32 || N == 64 || N == 128 || N == 176 || N == 256,
                "add N to tools/gen_wgmma_asm.py");
  float *d = acc.raw();
  const int scale_d = accumulate ? 1 : 0;
  if constexpr (std::is_same_v<T, bf16_t>) {
    FA_WGMMA_DISPATCH(FA_WGMMA_SS, "bf16", d, desc_a, desc_b, scale_d, (int)A, (int)B);
  } else {
    FA_WGMMA_DISPATCH(FA_WGMMA_SS, "f16", d, desc_a, desc_b, scale_d, (int)A, (int)B);
  }
}

// D (+)= A · B, A from registers (K-major by definition), B from shared memory.
template <class T, int N, Major B>
FA_DEVICE void wgmma_rs(WgmmaAcc<N> &acc, const WgmmaFragA &a, uint64_t desc_b, bool accumulate) {
  static_assert(N == 8 || N == 16 || N == 32 || N == 64 || N == 128 || N == 176 || N == 256,
                "add N to tools/gen_wgmma_asm.py");
  float *d = acc.raw();
  const uint32_t *r = a.raw();
  const int scale_d = accumulate ? 1 : 0;
  if constexpr (std::is_same_v<T, bf16_t>) {
    FA_WGMMA_DISPATCH(FA_WGMMA_RS, "bf16", d, r, desc_b, scale_d, (int)B);
  } else {
    FA_WGMMA_DISPATCH(FA_WGMMA_RS, "f16", d, r, desc_b, scale_d, (int)B);
  }
}
#undef FA_WGMMA_DISPATCH

template <int regs> FA_DEVICE void setmaxnreg_inc() {
  static_assert(regs >= 24 && regs <= 256 && regs % 8 == 0, "setmaxnreg: 24..256 in steps of 8");
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(regs));
}
template <int regs> FA_DEVICE void setmaxnreg_dec() {
  static_assert(regs >= 24 && regs <= 256 && regs % 8 == 0, "setmaxnreg: 24..256 in steps of 8");
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(regs));
}
#endif // sm_90a

#else
// ------------------------------------------------------------------------------------------------ host

template <class T> FA_DEVICE T *dynamic_smem_aligned() { return reinterpret_cast<T *>(emu::dynamic_smem_aligned(1024)); }
FA_DEVICE uint32_t smem_addr(const void *p) { return emu::shared_address(p); }
FA_DEVICE void named_barrier_arrive(int id, int nthreads) { emu::named_barrier_arrive(id, nthreads); }

FA_DEVICE void mbarrier_init(uint64_t *bar, int count) { emu::mbarrier_init(bar, count); }
FA_DEVICE void mbarrier_arrive(uint64_t *bar) { emu::mbarrier_arrive(bar); }
FA_DEVICE void mbarrier_arrive_expect_tx(uint64_t *bar, uint32_t bytes) { emu::mbarrier_arrive_expect_tx(bar, bytes); }
FA_DEVICE void mbarrier_wait(uint64_t *bar, int parity) { emu::mbarrier_wait(bar, parity); }
FA_DEVICE void fence_proxy_async() { emu::fence_proxy_async(); }
FA_DEVICE void fence_mbarrier_init() { emu::fence_mbarrier_init(); }
FA_DEVICE void check_smem_aligned_1024(const void *smem) { emu::check_smem_aligned_1024(smem); }

template <int R>
FA_DEVICE void tma_load(void *smem_dst, const FaTensorMap *map, uint64_t *bar, const int32_t (&c)[R]) {
  emu::tma_load(smem_dst, map, bar, c, R);
}
template <int R> FA_DEVICE void tma_store(const FaTensorMap *map, const int32_t (&c)[R], const void *smem_src) {
  emu::tma_store(map, c, R, smem_src);
}
FA_DEVICE void tma_store_commit() { emu::tma_store_commit(); }
template <int pending> FA_DEVICE void tma_store_wait() { emu::tma_store_wait(pending); }
// The emulator completes the writes with the read (a stronger wait than the hardware's).
template <int pending> FA_DEVICE void tma_store_wait_read() { emu::tma_store_wait(pending); }
FA_DEVICE L2Policy l2_evict_first() { return L2Policy{emu::kL2EvictFirst}; }
FA_DEVICE L2Policy l2_evict_last() { return L2Policy{emu::kL2EvictLast}; }
FA_DEVICE L2Policy l2_evict_normal() { return L2Policy{emu::kL2EvictNormal}; }
FA_DEVICE void tma_load(void *smem_dst, const FaTensorMap *map, uint64_t *bar, const int32_t (&c)[4], L2Policy policy) {
  emu::tma_load(smem_dst, map, bar, c, 4, policy.bits);
}

FA_DEVICE void wgmma_fence() { emu::wgmma_fence(); }
FA_DEVICE void wgmma_commit() { emu::wgmma_commit(); }
template <int pending> FA_DEVICE void wgmma_wait() { emu::wgmma_wait(pending); }
template <int N> FA_DEVICE void wgmma_fence_operand(WgmmaAcc<N> &) {}
FA_DEVICE void wgmma_fence_operand(WgmmaFragA &) {}

template <class T, int N, Major A, Major B>
FA_DEVICE void wgmma_ss(WgmmaAcc<N> &acc, uint64_t desc_a, uint64_t desc_b, bool accumulate) {
  emu::wgmma_mma(acc.raw(), N, nullptr, desc_a, desc_b,
                 std::is_same_v<T, bf16_t> ? emu::MmaType::Bf16 : emu::MmaType::F16, A == Major::MN,
                 B == Major::MN, accumulate);
}
template <class T, int N, Major B>
FA_DEVICE void wgmma_rs(WgmmaAcc<N> &acc, const WgmmaFragA &a, uint64_t desc_b, bool accumulate) {
  emu::wgmma_mma(acc.raw(), N, a.raw(), 0, desc_b, std::is_same_v<T, bf16_t> ? emu::MmaType::Bf16 : emu::MmaType::F16,
                 false, B == Major::MN, accumulate);
}

template <int regs> FA_DEVICE void setmaxnreg_inc() { emu::setmaxnreg(true, regs); }
template <int regs> FA_DEVICE void setmaxnreg_dec() { emu::setmaxnreg(false, regs); }
#endif

FA_NAMESPACE_END

// A kernel using TMA: as FA_KERNEL, with the params __grid_constant__ (a tensor map inside them is read in
// place by the TMA unit, so the kernel must not copy them to local memory).
#if defined(FA_HOST_BUILD)
#define FA_KERNEL_SM90(name, max_threads, min_blocks, Params, body) FA_KERNEL(name, max_threads, min_blocks, Params, body)
#else
#define FA_KERNEL_SM90(name, max_threads, min_blocks, Params, body)                                                  \
  extern "C" __global__ void __launch_bounds__(max_threads, min_blocks) name(const __grid_constant__ Params p) {      \
    body(p);                                                                                                          \
  }
#endif
