// The intrinsics layer: the whole vocabulary through which device code reaches the hardware. Kernels
// contain no raw asm and no <<<>>>; they call these. Under nvcc each is inline PTX or a CUDA intrinsic;
// under the host compiler (FA_EMULATION) each forwards to the host SIMT executor (fa/emu/runtime.h), which
// gives the same results lane for lane (fragment layouts per the PTX ISA tables) and checks every access.
//
// Two builds of every kernels/*.cu: nvcc compiles the device code into fatbins (no host code, no CUDA
// runtime); the host compiler compiles everything as host C++ (FA_HOST_BUILD: kernels for the emulator,
// plus the launchers, which exist only there). FA_KERNEL declares a kernel for both; FA_LAUNCH launches one.
//
// Rules for kernel code (the emulator can only check what goes through here):
//  - all shared memory is dynamic (fa::dynamic_smem), and is read/written only with ld_shared/st_shared,
//    ldmatrix and cp_async;
//  - global memory is read/written only with ld_global/st_global/cp_async/atomic_add;
//  - blockDim is one-dimensional and a multiple of 32; warp collectives are full-warp (all 32 lanes).
#pragma once

#include <stdint.h>

#include "fa/abi.h"

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#define FA_DEVICE __device__ __forceinline__
#define FA_HOST_DEVICE __host__ __device__ __forceinline__
#define FA_GLOBAL __global__
#define FA_LAUNCH_BOUNDS(threads, min_blocks) __launch_bounds__(threads, min_blocks)
#define FA_MAX_REGISTERS(n) __maxnreg__(n)
#else
#ifndef FA_EMULATION
#define FA_EMULATION 1
#endif
#define FA_HOST_BUILD 1
// Our own host definitions of the CUDA vector and 16-bit types: the host library needs no CUDA headers.
#include "fa/emu/host_types.h"
#define FA_DEVICE inline
#define FA_HOST_DEVICE inline
#define FA_GLOBAL
#define FA_LAUNCH_BOUNDS(threads, min_blocks)
#define FA_MAX_REGISTERS(n)
#include "fa/emu/runtime.h"
#endif

// A kernel: an extern "C" function of one by-value params struct that runs `body(p)` (a device function).
// Under nvcc it is the __global__ entry point the driver API finds in the fatbin by this exact name; in the
// host build it is the function the emulator runs for every thread. Use at global scope.
#define FA_KERNEL(name, max_threads, min_blocks, Params, body)                                               \
  extern "C" FA_GLOBAL void FA_LAUNCH_BOUNDS(max_threads, min_blocks) name(const Params p) { body(p); }
// A kernel whose launches differ in block size (decode's narrow and wide CTAs): a register cap per thread
// instead of launch bounds (nvcc allows one or the other), the same budget for every block size it runs.
#define FA_KERNEL_MAX_REGISTERS(name, max_registers, Params, body)                                           \
  extern "C" FA_GLOBAL void FA_MAX_REGISTERS(max_registers) name(const Params p) { body(p); }
// A launcher's reference to a kernel: the function and its symbol name (`kernel, "kernel"`), for a name
// pasted together in a macro (fa_prefill_##dt##_d##D).
#define FA_KERNEL_REF(kernel) kernel, #kernel
#include "fa/namespace.cuh"
#include "fa/fp8_model.cuh"

FA_NAMESPACE_BEGIN

#if defined(FA_HOST_BUILD)
using half_t = emu::Half;
using bf16_t = emu::Bf16;
#else
using half_t = __half;
using bf16_t = __nv_bfloat16;
#endif

struct Dim3 {
  int x = 1, y = 1, z = 1;
};

constexpr int kWarpSize = 32;

#if !defined(FA_EMULATION)
// ------------------------------------------------------------------------------------------------ device

FA_DEVICE int thread_idx() { return (int)threadIdx.x; }
FA_DEVICE int block_dim() { return (int)blockDim.x; }
FA_DEVICE Dim3 block_idx() { return Dim3{(int)blockIdx.x, (int)blockIdx.y, (int)blockIdx.z}; }
FA_DEVICE Dim3 grid_dim() { return Dim3{(int)gridDim.x, (int)gridDim.y, (int)gridDim.z}; }
FA_DEVICE int lane_id() { return (int)threadIdx.x & 31; }
FA_DEVICE int warp_id() { return (int)threadIdx.x >> 5; }

// Barriers. named_barrier_sync(id, n): bar.sync among n threads (a multiple of 32); id 0 is __syncthreads'.
FA_DEVICE void sync_threads() { __syncthreads(); }
FA_DEVICE void sync_warp() { __syncwarp(); }
FA_DEVICE void named_barrier_sync(int id, int nthreads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(nthreads) : "memory");
}

// Warp collectives over the full warp.
template <class T> FA_DEVICE T shfl_xor(T v, int lane_mask) { return __shfl_xor_sync(0xffffffffu, v, lane_mask); }
template <class T> FA_DEVICE T shfl_idx(T v, int src_lane) { return __shfl_sync(0xffffffffu, v, src_lane); }
FA_DEVICE bool warp_any(bool p) { return __any_sync(0xffffffffu, p); }
FA_DEVICE bool warp_all(bool p) { return __all_sync(0xffffffffu, p); }
FA_DEVICE uint32_t warp_ballot(bool p) { return __ballot_sync(0xffffffffu, p); }

// Shared memory: the block's dynamic allocation (16-byte aligned base) and typed accesses.
template <class T> FA_DEVICE T *dynamic_smem() {
  extern __shared__ __align__(128) unsigned char fa_dynamic_smem[];
  return reinterpret_cast<T *>(fa_dynamic_smem);
}
template <class T> FA_DEVICE T ld_shared(const T *p) { return *p; }
template <class T> FA_DEVICE void st_shared(T *p, T v) { *p = v; }

FA_DEVICE uint32_t smem_addr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }
// p with `bytes` XORed into its shared-memory address (swizzled addressing, fa/swizzle.cuh). Done on the
// 32-bit shared address, so that the result stays a known shared-memory pointer and costs one LOP3.
template <class T> FA_DEVICE const T *xor_smem_bytes(const T *p, uint32_t bytes) {
  return static_cast<const T *>(__cvta_shared_to_generic(smem_addr(p) ^ bytes));
}
// thread_idx(), read again from the special register (volatile asm: not reused from an earlier read).
FA_DEVICE int thread_idx_reread() {
  int t;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(t));
  return t;
}

// ldmatrix: lane l supplies the address of one 16-byte row (lanes 0-7: matrix 0, 8-15: matrix 1, ...);
// register i of every lane receives matrix i, row lane/4, columns 2*(lane%4)..+1 (.trans: transposed).
FA_DEVICE void ldmatrix_x1(uint32_t (&r)[1], const void *row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];" : "=r"(r[0]) : "r"(smem_addr(row)));
}
FA_DEVICE void ldmatrix_x2(uint32_t (&r)[2], const void *row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(smem_addr(row)));
}
FA_DEVICE void ldmatrix_x4(uint32_t (&r)[4], const void *row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(row)));
}
FA_DEVICE void ldmatrix_x1_trans(uint32_t (&r)[1], const void *row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];" : "=r"(r[0]) : "r"(smem_addr(row)));
}
FA_DEVICE void ldmatrix_x2_trans(uint32_t (&r)[2], const void *row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(smem_addr(row)));
}
FA_DEVICE void ldmatrix_x4_trans(uint32_t (&r)[4], const void *row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(row)));
}

// mma.sync m16n8k16, row.col, fp32 accumulate in place: d += a · b. T is half_t or bf16_t.
// a: 4 regs (A 16x16 row-major fragment), b: 2 regs (B 16x8 column fragment), d: 4 floats (C/D 16x8).
template <class T> FA_DEVICE void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]);
template <> FA_DEVICE void mma_m16n8k16<half_t>(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
template <> FA_DEVICE void mma_m16n8k16<bf16_t>(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// cp.async: 16 bytes global -> shared, completing only at cp_async_wait. pred == false zero-fills the
// destination without reading the source (src-size 0), which is how ragged tile edges are predicated.
// cg caches in L2 only (streamed K/V tiles); ca also in L1.
FA_DEVICE void cp_async_cg_16(void *smem, const void *gmem, bool pred) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_addr(smem)), "l"(gmem),
               "r"(pred ? 16 : 0)
               : "memory");
}
FA_DEVICE void cp_async_ca_16(void *smem, const void *gmem, bool pred) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;" ::"r"(smem_addr(smem)), "l"(gmem),
               "r"(pred ? 16 : 0)
               : "memory");
}
FA_DEVICE void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
// Wait until at most `pending` of this thread's committed groups are still in flight.
template <int pending> FA_DEVICE void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(pending) : "memory");
}

// Global memory. ld_global_nc reads through the non-coherent (read-only) path: only for data no thread of
// the launch writes.
template <class T> FA_DEVICE T ld_global(const T *p) { return *p; }
template <class T> FA_DEVICE T ld_global_nc(const T *p) { return __ldg(p); }
template <class T> FA_DEVICE void st_global(T *p, T v) { *p = v; }
FA_DEVICE float atomic_add(float *p, float v) { return atomicAdd(p, v); }
FA_DEVICE int atomic_add(int *p, int v) { return atomicAdd(p, v); }

// Math. exp2 with ex2.approx.ftz: softmax runs in the exp2 domain with the scale folded into one FFMA.
FA_DEVICE float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

#else
// ------------------------------------------------------------------------------------------------ host
// Each forwards to the executor in fa/emu/runtime.h (implemented in kernels/emu/).

FA_DEVICE int thread_idx() { return emu::thread_idx(); }
FA_DEVICE int block_dim() { return emu::block_dim(); }
FA_DEVICE Dim3 block_idx() {
  emu::Dim3 b = emu::block_idx();
  return Dim3{b.x, b.y, b.z};
}
FA_DEVICE Dim3 grid_dim() {
  emu::Dim3 g = emu::grid_dim();
  return Dim3{g.x, g.y, g.z};
}
FA_DEVICE int thread_idx_reread() { return emu::thread_idx(); }
FA_DEVICE int lane_id() { return emu::thread_idx() & 31; }
FA_DEVICE int warp_id() { return emu::thread_idx() >> 5; }

FA_DEVICE void sync_threads() { emu::named_barrier_sync(0, emu::block_dim()); }
FA_DEVICE void sync_warp() { emu::sync_warp(); }
FA_DEVICE void named_barrier_sync(int id, int nthreads) { emu::named_barrier_sync(id, nthreads); }

template <class T> FA_DEVICE T shfl_xor(T v, int lane_mask) {
  static_assert(sizeof(T) == 4, "shuffles move 32-bit values");
  uint32_t bits, out;
  __builtin_memcpy(&bits, &v, 4);
  out = emu::shfl(bits, emu::ShflMode::Xor, lane_mask);
  T r;
  __builtin_memcpy(&r, &out, 4);
  return r;
}
template <class T> FA_DEVICE T shfl_idx(T v, int src_lane) {
  static_assert(sizeof(T) == 4, "shuffles move 32-bit values");
  uint32_t bits, out;
  __builtin_memcpy(&bits, &v, 4);
  out = emu::shfl(bits, emu::ShflMode::Idx, src_lane);
  T r;
  __builtin_memcpy(&r, &out, 4);
  return r;
}
FA_DEVICE uint32_t warp_ballot(bool p) { return emu::ballot(p); }
FA_DEVICE bool warp_any(bool p) { return emu::ballot(p) != 0u; }
FA_DEVICE bool warp_all(bool p) { return emu::ballot(p) == 0xffffffffu; }

template <class T> FA_DEVICE T *dynamic_smem() { return reinterpret_cast<T *>(emu::dynamic_smem()); }
// The shared accesses carry their caller's source location (default arguments are evaluated at the call
// site): the emulator's bank-conflict counters take the lanes' accesses from one location as one warp
// instruction (kernels/emu/bank_conflicts.cpp).
#define FA_SHARED_SITE_PARAMS const char *site_file = __builtin_FILE(), int site_line = __builtin_LINE()
#define FA_SHARED_SITE emu::SharedSite{site_file, site_line}
template <class T> FA_DEVICE T ld_shared(const T *p, FA_SHARED_SITE_PARAMS) {
  T v;
  emu::shared_load(&v, p, sizeof(T), FA_SHARED_SITE);
  return v;
}
template <class T> FA_DEVICE void st_shared(T *p, T v, FA_SHARED_SITE_PARAMS) {
  emu::shared_store(p, &v, sizeof(T), FA_SHARED_SITE);
}
// Host addresses of shared memory agree with the shared window's modulo 1024 (emu/shared_memory.cpp).
template <class T> FA_DEVICE const T *xor_smem_bytes(const T *p, uint32_t bytes) {
  return reinterpret_cast<const T *>(reinterpret_cast<uintptr_t>(p) ^ bytes);
}

FA_DEVICE void ldmatrix_x1(uint32_t (&r)[1], const void *row) { emu::ldmatrix(r, 1, false, row); }
FA_DEVICE void ldmatrix_x2(uint32_t (&r)[2], const void *row) { emu::ldmatrix(r, 2, false, row); }
FA_DEVICE void ldmatrix_x4(uint32_t (&r)[4], const void *row) { emu::ldmatrix(r, 4, false, row); }
FA_DEVICE void ldmatrix_x1_trans(uint32_t (&r)[1], const void *row) { emu::ldmatrix(r, 1, true, row); }
FA_DEVICE void ldmatrix_x2_trans(uint32_t (&r)[2], const void *row) { emu::ldmatrix(r, 2, true, row); }
FA_DEVICE void ldmatrix_x4_trans(uint32_t (&r)[4], const void *row) { emu::ldmatrix(r, 4, true, row); }

template <class T> FA_DEVICE void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]);
template <> FA_DEVICE void mma_m16n8k16<half_t>(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  emu::mma_m16n8k16(d, a, b, emu::MmaType::F16);
}
template <> FA_DEVICE void mma_m16n8k16<bf16_t>(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  emu::mma_m16n8k16(d, a, b, emu::MmaType::Bf16);
}

FA_DEVICE void cp_async_cg_16(void *smem, const void *gmem, bool pred, FA_SHARED_SITE_PARAMS) {
  emu::cp_async(smem, gmem, 16, pred, FA_SHARED_SITE);
}
FA_DEVICE void cp_async_ca_16(void *smem, const void *gmem, bool pred, FA_SHARED_SITE_PARAMS) {
  emu::cp_async(smem, gmem, 16, pred, FA_SHARED_SITE);
}
FA_DEVICE void cp_async_commit() { emu::cp_async_commit(); }
template <int pending> FA_DEVICE void cp_async_wait() { emu::cp_async_wait(pending); }

template <class T> FA_DEVICE T ld_global(const T *p) {
  T v;
  emu::global_load(&v, p, sizeof(T));
  return v;
}
template <class T> FA_DEVICE T ld_global_nc(const T *p) { return ld_global(p); }
template <class T> FA_DEVICE void st_global(T *p, T v) { emu::global_store(p, &v, sizeof(T)); }
FA_DEVICE float atomic_add(float *p, float v) { return emu::atomic_add_f32(p, v); }
FA_DEVICE int atomic_add(int *p, int v) { return emu::atomic_add_i32(p, v); }

FA_DEVICE float fast_exp2(float x) { return emu::exp2_approx(x); }

// Launch: emulate now, or record for the driver API (FaExec, abi.h). Never synchronises anything.
int record_launch(FaExec *exec, const char *name, Dim3 grid, int block, int smem_bytes, const void *params,
                  size_t params_bytes);
template <class P>
inline int launch(const char *name, void (*kernel)(P), Dim3 grid, int block, int smem_bytes, FaExec *exec, P p) {
  static_assert(sizeof(P) <= FA_MAX_PARAMS_BYTES, "kernel parameters larger than an FaKernelLaunch holds");
  if (exec == nullptr) return FA_ERR_INVALID;
  if (exec->mode == FA_EXEC_RECORD) return record_launch(exec, name, grid, block, smem_bytes, &p, sizeof(P));
  return emu::launch(name, emu::Dim3{grid.x, grid.y, grid.z}, block, smem_bytes, exec->emu, [=]() { kernel(p); });
}
// True when launches are recorded for a GPU (launchers refuse emulator-only kernels there).
inline bool recording_for_gpu(const FaExec *exec) { return exec != nullptr && exec->mode == FA_EXEC_RECORD; }
#endif

// ------------------------------------------------------------------------------------------- both sides
// High halves of unsigned products (fa/fast_divmod.cuh): IMAD.HI (64-bit: a short IMAD sequence) on the GPU.
FA_HOST_DEVICE uint32_t mul_hi(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __umulhi(a, b);
#else
  return (uint32_t)(((uint64_t)a * b) >> 32);
#endif
}
FA_HOST_DEVICE uint64_t mul_hi(uint64_t a, uint64_t b) {
#if defined(__CUDA_ARCH__)
  return __umul64hi(a, b);
#else
  return (uint64_t)(((unsigned __int128)a * b) >> 64);
#endif
}

// Conversions between fp32 pairs and packed 16-bit pairs (low half = first element), round to nearest even.
template <class T> FA_DEVICE uint32_t pack2(float lo, float hi);
template <class T> FA_DEVICE void unpack2(uint32_t bits, float &lo, float &hi);
#if defined(FA_HOST_BUILD)
template <> FA_DEVICE uint32_t pack2<half_t>(float lo, float hi) {
  return (uint32_t)emu::float_to_half_bits(lo) | (uint32_t)emu::float_to_half_bits(hi) << 16;
}
template <> FA_DEVICE uint32_t pack2<bf16_t>(float lo, float hi) {
  return (uint32_t)emu::float_to_bf16_bits(lo) | (uint32_t)emu::float_to_bf16_bits(hi) << 16;
}
template <> FA_DEVICE void unpack2<half_t>(uint32_t bits, float &lo, float &hi) {
  lo = emu::half_bits_to_float((uint16_t)(bits & 0xffffu));
  hi = emu::half_bits_to_float((uint16_t)(bits >> 16));
}
template <> FA_DEVICE void unpack2<bf16_t>(uint32_t bits, float &lo, float &hi) {
  lo = emu::bf16_bits_to_float((uint16_t)(bits & 0xffffu));
  hi = emu::bf16_bits_to_float((uint16_t)(bits >> 16));
}
#else
template <> FA_DEVICE uint32_t pack2<half_t>(float lo, float hi) {
  __half2 h = __floats2half2_rn(lo, hi);
  uint32_t r;
  __builtin_memcpy(&r, &h, 4);
  return r;
}
template <> FA_DEVICE uint32_t pack2<bf16_t>(float lo, float hi) {
  __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  uint32_t r;
  __builtin_memcpy(&r, &h, 4);
  return r;
}
template <> FA_DEVICE void unpack2<half_t>(uint32_t bits, float &lo, float &hi) {
  const float2 f = __half22float2(*reinterpret_cast<const __half2 *>(&bits));
  lo = f.x;
  hi = f.y;
}
template <> FA_DEVICE void unpack2<bf16_t>(uint32_t bits, float &lo, float &hi) {
  const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&bits));
  lo = f.x;
  hi = f.y;
}
#endif

// FP8 (fa/fp8_model.cuh defines the results bit for bit). fp8x2_to_half2: two codes (low byte = first element)
// -> two fp16 packed (low half = first), exact. float2_to_fp8x2: two fp32 -> two codes (low byte = lo), round to
// nearest even, saturating. sm_89+ (Ada, Hopper): the hardware cvt; below, and in the host build, the model.
template <Fp8Format F> FA_DEVICE uint32_t fp8x2_to_half2(uint16_t codes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint32_t r;
  if constexpr (F == Fp8Format::E4M3) {
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(r) : "h"(codes));
  } else {
    asm("cvt.rn.f16x2.e5m2x2 %0, %1;" : "=r"(r) : "h"(codes));
  }
  return r;
#else
  return (uint32_t)fp8_to_half_bits_model<F>((uint8_t)(codes & 0xffu)) |
         (uint32_t)fp8_to_half_bits_model<F>((uint8_t)(codes >> 8)) << 16;
#endif
}
template <Fp8Format F> FA_DEVICE uint16_t float2_to_fp8x2(float lo, float hi) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint16_t r;
  if constexpr (F == Fp8Format::E4M3) {
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo)); // first source: high byte
  } else {
    asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  }
  return r;
#else
  return (uint16_t)(fp8_from_float_model<F>(lo) | (uint32_t)fp8_from_float_model<F>(hi) << 8);
#endif
}
// a / b correctly rounded (IEEE), whatever the division flags: FP8 quantisation divides by the scale.
#if defined(FA_HOST_BUILD)
FA_DEVICE float div_rn(float a, float b) { return a / b; }
#else
FA_DEVICE float div_rn(float a, float b) { return __fdiv_rn(a, b); }
#endif
// a / b correctly rounded, without div.rn's call to its slow path: the fast path nvcc emits for div.rn.f32
// (MUFU.RCP, one Newton step on the reciprocal, one on the quotient, then FCHK to take the slow path),
// which gives the IEEE quotient bit for bit when no step over- or underflows: the caller guarantees
// |a|, |b| and |a / b| in [2^-100, 2^100] (outside, the last bits may differ from a / b, or an infinite
// operand give NaN). For register-bound code, where the call's caller-saved registers spill
// (fa/hopper/mainloop.cuh). The emulator divides: the same bits in that range.
#if defined(FA_HOST_BUILD)
FA_DEVICE float div_rn_in_range(float a, float b) { return a / b; }
#else
FA_DEVICE float div_rn_in_range(float a, float b) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(b));
  y = fmaf(y, fmaf(-b, y, 1.0f), y);
  const float q = a * y;
  return fmaf(y, fmaf(-b, q, a), q);
}
#endif

FA_NAMESPACE_END

// Hopper (sm_90a): wgmma, mbarrier, TMA, proxy fences, setmaxnreg.
#include "fa/intrinsics_sm90.cuh"

// Launches the FA_KERNEL `kernel` (host build only): its name is the symbol the driver API looks up.
// Arguments after the kernel: grid (Dim3), block, dynamic smem bytes, FaExec*, params.
#define FA_LAUNCH(kernel, ...) ::fa::launch(#kernel, kernel, __VA_ARGS__)
