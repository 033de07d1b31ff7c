// Host SIMT executor: the contract between fa/intrinsics.cuh (host branch) and kernels/emu/*.cpp.
// Every function below is called from inside a kernel running on a fiber (one fiber per CUDA thread) and
// acts on the calling fiber's thread/warp/block. Faults never return: they record a message naming kernel,
// block, thread and address, and unwind the launch, which then returns FA_ERR_EMULATOR.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <functional>

#include "fa/abi.h"

namespace fa {
namespace emu {

struct Dim3 {
  int x = 1, y = 1, z = 1;
};

// Runs `body` once per CUDA thread of `grid` x `block` threads, block by block, with `smem_bytes` of
// dynamic shared memory per block. Returns FA_OK or FA_ERR_EMULATOR (ctx->message filled).
int launch(const char *kernel_name, Dim3 grid, int block, int smem_bytes, FaEmuLaunch *ctx,
           const std::function<void()> &body);

int thread_idx();
int block_dim();
Dim3 block_idx();
Dim3 grid_dim();

void named_barrier_sync(int id, int nthreads);
void sync_warp();

enum class ShflMode { Xor, Idx };
uint32_t shfl(uint32_t v, ShflMode mode, int arg);
uint32_t ballot(bool p);

unsigned char *dynamic_smem();
// The kernel source location of a shared-memory access (the intrinsics pass their caller's): the emulator
// groups the lanes' accesses from one location into warp instructions to count bank conflicts.
struct SharedSite {
  const char *file;
  int line;
};
void shared_load(void *dst, const void *smem, size_t bytes, SharedSite site);
void shared_store(void *smem, const void *src, size_t bytes, SharedSite site);

// ldmatrix .x{count}, optionally .trans; `row` is this lane's row address; r receives `count` registers.
void ldmatrix(uint32_t *r, int count, bool trans, const void *row);

enum class MmaType { F16, Bf16 };
void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], MmaType type);

void cp_async(void *smem, const void *gmem, int bytes, bool pred, SharedSite site);
void cp_async_commit();
void cp_async_wait(int pending);

void global_load(void *dst, const void *gmem, size_t bytes);
void global_store(void *gmem, const void *src, size_t bytes);
float atomic_add_f32(float *p, float v);
int atomic_add_i32(int *p, int v);

float exp2_approx(float x);

// ------------------------------------------------------------------------------------------------ sm_90
// Hopper's asynchronous machinery (kernels/emu/warpgroup.cpp, mbarrier.cpp, tma.cpp; docs/emulator.md).

// The block's dynamic shared memory with `alignment` (128 or 1024) declared; shared window address of p.
unsigned char *dynamic_smem_aligned(int alignment);
uint32_t shared_address(const void *smem);
void named_barrier_arrive(int id, int nthreads);

// wgmma (warpgroup-wide, .sync.aligned). `d` is this thread's N/2 accumulator floats; `a_regs` its 4 A
// fragment registers (RS) or null (SS: A from desc_a). Completes at the wgmma_wait that covers its group.
void wgmma_fence();
void wgmma_mma(float *d, int n, const uint32_t *a_regs, uint64_t desc_a, uint64_t desc_b, MmaType type,
               bool trans_a, bool trans_b, bool accumulate);
void wgmma_commit();
void wgmma_wait(int pending);
// A thread accessing a register object (accumulator or A fragment) the intrinsics layer hands out.
void wgmma_register_access(const void *object);
// setmaxnreg.inc / .dec (warpgroup-wide).
void setmaxnreg(bool inc, int regs);

// mbarrier (8 bytes of shared memory) and the async proxy.
void mbarrier_init(void *bar, int count);
void mbarrier_arrive(void *bar);
void mbarrier_arrive_expect_tx(void *bar, uint32_t bytes);
void mbarrier_wait(void *bar, int parity);
void fence_proxy_async();
// fence.mbarrier_init: the calling warp's barrier initialisations become visible to the async proxy.
void fence_mbarrier_init();
// The one-time device check that the dynamic shared memory is 1024-byte aligned (a trap on the GPU).
void check_smem_aligned_1024(const void *smem);

// TMA (cp.async.bulk.tensor, tiled): `map` is an FaTensorMap holding an FaEmuTensorMap (abi.h).
// l2_policy: 0 (none), kL2EvictFirst, kL2EvictLast (the bytes loaded under each are counted) or
// kL2EvictNormal.
enum : uint64_t { kL2EvictFirst = 1, kL2EvictLast = 2, kL2EvictNormal = 3 };
void tma_load(void *smem_dst, const void *map, void *bar, const int32_t *coords, int rank, uint64_t l2_policy = 0);
void tma_store(const void *map, const int32_t *coords, int rank, const void *smem_src);
void tma_store_commit();
void tma_store_wait(int pending);

// Emulator-only: turns shared-memory race detection off (or back on) for the launches this OS thread
// starts while the object lives. Every other check stays on. Only the self-tests use it, to show that a
// racy kernel's result then depends on the scheduling seed.
class ScopedRaceDetection {
public:
  explicit ScopedRaceDetection(bool enabled);
  ~ScopedRaceDetection();
  ScopedRaceDetection(const ScopedRaceDetection &) = delete;
  ScopedRaceDetection &operator=(const ScopedRaceDetection &) = delete;

private:
  bool previous_;
};

} // namespace emu
} // namespace fa
