/* The C ABI of the self-test kernels (kernels/selftest.cu, kernels/selftest_sm90.cu): the intrinsics layer,
 * the host emulator's fault detection (planted bugs) and the Hopper primitives, each with a launcher that
 * runs through an FaExec like the ops' (abi.h), so the same kernels run on a GPU and on the emulator and can
 * be compared. They verify the crate rather than ship in it: compiled only with the `testkit` feature, and
 * mirrored by bindgen into src/runtime/sys/selftest_abi.rs (scripts/bless-abi; tests/it/abi_bindings.rs checks it is current).
 */
#ifndef FA_SELFTEST_ABI_H
#define FA_SELFTEST_ABI_H

#include "fa/abi.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------------------------
 * Self-tests of the intrinsics layer and the host emulator (kernels/selftest.cu, tests/emulator.rs). Every
 * launcher (fa_selftest_*) runs through an FaExec like the ops, so the same kernels can run on a GPU and be
 * compared with the emulator. All are single-warp or single-block unless stated.
 * ------------------------------------------------------------------------------------------------------- */

/* mma.m16n8k16 on raw fragment registers: lane l's registers are a[4l..4l+3], b[2l..2l+1], c/d[4l..4l+3],
 * so only the test's model of the PTX fragment tables decides which matrix element each one holds.
 * d = A·B + C. One warp. */
typedef struct FaSelftestMmaParams {
  const uint32_t *a; /* [32][4] */
  const uint32_t *b; /* [32][2] */
  const float *c;    /* [32][4] */
  float *d;          /* [32][4] */
  int32_t dtype;     /* FA_DTYPE_F16 or FA_DTYPE_BF16 */
} FaSelftestMmaParams;

/* ldmatrix: `rows` 16-byte rows are staged into shared memory; lane l then passes the address of row
 * row_of_lane[l] to ldmatrix .x{count}{.trans}; out[4l + i] = register i of lane l (others untouched).
 * One warp. */
typedef struct FaSelftestLdmatrixParams {
  const uint16_t *rows_data;  /* [rows][8] */
  const int32_t *row_of_lane; /* [32], each in [0, rows) */
  uint32_t *out;              /* [32][4] */
  int32_t rows;               /* 1..64 */
  int32_t count;              /* 1, 2 or 4 */
  int32_t trans;
} FaSelftestLdmatrixParams;

/* Warp shuffles and votes: out[l] = shfl_xor(values[l], operands[l]), shfl_idx(values[l], operands[l]), or
 * warp_ballot / warp_any / warp_all of (values[l] != 0); EXP2: the bits of fast_exp2 of the float whose
 * bits are values[l]. One warp. */
enum {
  FA_SELFTEST_SHFL_XOR = 0,
  FA_SELFTEST_SHFL_IDX = 1,
  FA_SELFTEST_BALLOT = 2,
  FA_SELFTEST_ANY = 3,
  FA_SELFTEST_ALL = 4,
  FA_SELFTEST_EXP2 = 5,
};
typedef struct FaSelftestWarpParams {
  const uint32_t *values;  /* [32] */
  const int32_t *operands; /* [32] */
  uint32_t *out;           /* [32] */
  int32_t op;              /* FA_SELFTEST_SHFL_XOR .. FA_SELFTEST_ALL */
} FaSelftestWarpParams;

/* cp.async groups and zero-fill, one block of 64 threads: for each group g < groups, thread t copies 16-byte
 * chunk j = 64g + t of src to shared chunk j (predicate preds[j]; false zero-fills) and commits. Then
 * cp_async_wait<wait_pending>, sync_threads, and thread t copies shared chunk 64g + (t + 32) % 64 (another
 * warp's) to the same chunk of out for every g < read_groups. */
typedef struct FaSelftestCpAsyncParams {
  const uint8_t *src;   /* [groups * 64][16] */
  const uint8_t *preds; /* [groups * 64] */
  uint8_t *out;         /* [groups * 64][16] */
  int32_t groups;       /* 1..4 */
  int32_t wait_pending; /* 0..3 */
  int32_t read_groups;  /* 0..groups */
} FaSelftestCpAsyncParams;

/* Bank conflicts (the emulator's shared_wavefronts counters): one warp makes `repeat` warp-wide shared accesses
 * of one kind, each from one source location, lane l at byte offset offsets[l] of its shared memory
 * (offsets[l] < 0: lane l skips the access). LOAD / STORE: `bytes` (1, 2, 4, 8, 16) per lane; CP_ASYNC: a
 * 16-byte cp.async destination (zero-filled); LDMATRIX_X4: the lanes' row addresses (every lane, bytes 16).
 * Nothing else touches shared memory. out[l] receives a word of what lane l loaded. */
enum {
  FA_SELFTEST_BANK_LOAD = 0,
  FA_SELFTEST_BANK_STORE = 1,
  FA_SELFTEST_BANK_CP_ASYNC = 2,
  FA_SELFTEST_BANK_LDMATRIX_X4 = 3,
};
typedef struct FaSelftestBankParams {
  const int32_t *offsets; /* [32], multiples of `bytes`, below smem_bytes */
  uint32_t *out;          /* [32] */
  int32_t kind;           /* FA_SELFTEST_BANK_* */
  int32_t bytes;
  int32_t repeat;     /* 1..8 */
  int32_t smem_bytes; /* 16..65536 */
} FaSelftestBankParams;

/* Atomics over `blocks` blocks of 128 threads: global thread i stores atomic_add(counter, 1) to olds[i] and
 * adds addends[i] to *sum. */
typedef struct FaSelftestAtomicParams {
  int32_t *counter;
  int32_t *olds;          /* [blocks * 128] */
  float *sum;
  const float *addends;   /* [blocks * 128] */
  int32_t blocks;
} FaSelftestAtomicParams;

/* Named barriers, one block of 4 warps. PAIRS: warp 0 hands data to warp 1 through shared memory ordered by
 * barrier 1 (64 threads), warp 2 to warp 3 by barrier 2; out[t] = what consumer thread t read (producers:
 * -1). CROSS: as PAIRS, but warp 3 reads warp 0's data, which barrier 2 does not order (a race).
 * BLOCK: all four warps pass barrier 3 with 128 threads, then read another warp's data. MISMATCH: warps 0
 * and 1 wait at barrier 1 with different thread counts. */
enum {
  FA_SELFTEST_BARRIER_PAIRS = 0,
  FA_SELFTEST_BARRIER_CROSS = 1,
  FA_SELFTEST_BARRIER_BLOCK = 2,
  FA_SELFTEST_BARRIER_MISMATCH = 3,
};
typedef struct FaSelftestBarrierParams {
  int32_t *out; /* [128] */
  int32_t mode; /* FA_SELFTEST_BARRIER_* */
} FaSelftestBarrierParams;

/* Planted bugs, one block of 128 threads over input/out [512] floats. planted = 0 runs the correct twin of the
 * kernel (out = f(in)); planted = 1 runs it with the bug, which the emulator must report:
 *  MISSING_SYNCTHREADS   shared memory written by one warp, read by another with no barrier between;
 *  OOB_WRITE             thread 0 also writes out[512], one past the end;
 *  MISSING_CP_ASYNC_WAIT shared memory read after cp.async + commit + barrier, but without a wait;
 *  DIVERGENT_BARRIER     only lanes 0-15 of each warp call sync_threads;
 *  DEADLOCK              warp 0 waits at barrier 1 for 64 threads; no other warp ever arrives;
 *  MISALIGNED_16         16-byte global loads from an address 4 bytes past a 16-byte boundary;
 *  STACK_OVERFLOW        deep recursion with large locals (emulator only: the GPU library returns
 *                        FA_ERR_UNSUPPORTED, as its build rejects kernels with a stack frame);
 *  RAW_POINTER           a null pointer dereferenced directly, bypassing the checked intrinsics;
 *  DIV_BY_ZERO           an integer division by zero (garbage on the GPU, a host trap in emulation);
 *  STORE_TO_INPUT        a global store into the read-only input buffer;
 *  SHARED_OOB            a shared store one element past the block's 2048 bytes of shared memory;
 *  GLOBAL_AS_SHARED      ld_shared through a global pointer (works on the GPU by generic addressing, but
 *                        breaks the intrinsics contract the emulator relies on);
 *  SPIN_WAIT             thread 0 spins on a flag that "another block" would set (never, here).
 * race_detection = 0 turns the emulator's race detector off (the GPU ignores it). */
enum {
  FA_SELFTEST_BUG_MISSING_SYNCTHREADS = 0,
  FA_SELFTEST_BUG_OOB_WRITE = 1,
  FA_SELFTEST_BUG_MISSING_CP_ASYNC_WAIT = 2,
  FA_SELFTEST_BUG_DIVERGENT_BARRIER = 3,
  FA_SELFTEST_BUG_DEADLOCK = 4,
  FA_SELFTEST_BUG_MISALIGNED_16 = 5,
  FA_SELFTEST_BUG_STACK_OVERFLOW = 6,
  FA_SELFTEST_BUG_RAW_POINTER = 7,
  FA_SELFTEST_BUG_DIV_BY_ZERO = 8,
  FA_SELFTEST_BUG_STORE_TO_INPUT = 9,
  FA_SELFTEST_BUG_SHARED_OOB = 10,
  FA_SELFTEST_BUG_GLOBAL_AS_SHARED = 11,
  FA_SELFTEST_BUG_SPIN_WAIT = 12,
};
typedef struct FaSelftestBugParams {
  const float *input; /* [512] */
  float *out;      /* [512] */
  int32_t bug;     /* FA_SELFTEST_BUG_* */
  int32_t planted;
  int32_t race_detection;
} FaSelftestBugParams;

/* A known-good tiled GEMM: c = a · b in fp32 from fp16/bf16 inputs, with 64x64 block tiles, 4 warps of 32x32,
 * k tiles of 32 double-buffered through cp.async, fragments loaded with ldmatrix (.trans for k-major b).
 * a [m][k] row-major; b [n][k] row-major (b_k_major = 0) or [k][n] (b_k_major = 1); c [m][n].
 * m >= 1, n a multiple of 8, k a multiple of 32; ragged m/n tiles are zero-filled by predicated cp.async.
 * bug: FA_SELFTEST_GEMM_* plants a pipeline bug (the emulator must report it). */
enum {
  FA_SELFTEST_GEMM_CORRECT = 0,
  FA_SELFTEST_GEMM_NO_TRAILING_BARRIER = 1, /* the next stage's cp.async overwrites a tile others still read */
  FA_SELFTEST_GEMM_NO_WAIT = 2,             /* computes on a stage whose cp.async was never waited for */
};
typedef struct FaSelftestGemmParams {
  const void *a;
  const void *b;
  float *c;
  int32_t m, n, k;
  int32_t dtype;     /* FA_DTYPE_F16 or FA_DTYPE_BF16 */
  int32_t b_k_major;
  int32_t bug;       /* FA_SELFTEST_GEMM_* */
} FaSelftestGemmParams;

/* Microbenchmark: `blocks` blocks of 4 warps, each warp executing `iters` of one operation; out [blocks*128]
 * keeps the results live. */
enum {
  FA_SELFTEST_BENCH_SHFL = 0,
  FA_SELFTEST_BENCH_LDMATRIX = 1,
  FA_SELFTEST_BENCH_MMA = 2,
  FA_SELFTEST_BENCH_SYNCTHREADS = 3,
  FA_SELFTEST_BENCH_SHARED_STORE_LOAD = 4,
};
typedef struct FaSelftestBenchParams {
  uint32_t *out;
  int32_t op;
  int32_t iters;
  int32_t blocks;
} FaSelftestBenchParams;

/* FP8 conversions of the intrinsics layer, one thread per item (the hardware cvt on sm_89+, the scalar model
 * of fa/fp8_model.cuh elsewhere): encode == 0: halves[i] = the two fp16 (packed, low = first) of the two
 * codes codes[i] (low byte = first); encode != 0: codes_out[i] = the two codes of values[2i], values[2i+1].
 * kv_dtype: FA_KV_FP8_E4M3 or FA_KV_FP8_E5M2. Any number of blocks of 128 threads. */
typedef struct FaSelftestFp8Params {
  const uint16_t *codes; /* [n] (decode) */
  const float *values;   /* [2n] (encode) */
  uint32_t *halves;      /* [n] (decode) */
  uint16_t *codes_out;   /* [n] (encode) */
  int32_t n;
  int32_t kv_dtype;
  int32_t encode;
} FaSelftestFp8Params;

int fa_selftest_mma(FaSelftestMmaParams params, FaExec *exec);
int fa_selftest_fp8(FaSelftestFp8Params params, FaExec *exec);
int fa_selftest_ldmatrix(FaSelftestLdmatrixParams params, FaExec *exec);
int fa_selftest_warp(FaSelftestWarpParams params, FaExec *exec);
int fa_selftest_cp_async(FaSelftestCpAsyncParams params, FaExec *exec);
int fa_selftest_bank(FaSelftestBankParams params, FaExec *exec);
int fa_selftest_atomic(FaSelftestAtomicParams params, FaExec *exec);
int fa_selftest_barrier(FaSelftestBarrierParams params, FaExec *exec);
int fa_selftest_bug(FaSelftestBugParams params, FaExec *exec);
int fa_selftest_gemm(FaSelftestGemmParams params, FaExec *exec);
int fa_selftest_bench(FaSelftestBenchParams params, FaExec *exec);

/* ---------------------------------------------------------------------------------------------------------
 * sm_90a self-tests (kernels/selftest_sm90.cu, tests/it/hopper.rs).
 * ------------------------------------------------------------------------------------------------------- */

/* wgmma.mma_async m64nNk16 (f16/bf16 -> f32), one warpgroup of 128 threads. The test lays out the shared
 * images of A and B itself (a_smem, b_smem: its own model of the canonical layouts), and the kernel copies
 * them with ordinary stores to 1024-byte aligned offsets (A at 0, B at a_smem_bytes rounded up to 1024),
 * fences the proxy and synchronises. It then runs k_steps wgmmas into the accumulator c (thread t holds
 * c[t][0..n/2), raw fragment registers): step s uses desc_a / desc_b (start address 0: the kernel adds the
 * tile's shared address) advanced by s * a_k_step_bytes / b_k_step_bytes, and, for RS, A registers
 * a_regs[s][t][0..4). The first step accumulates iff `accumulate`, the others always. d = the result. */
typedef struct FaSelftestWgmmaParams {
  const uint8_t *a_smem;
  const uint8_t *b_smem;
  const uint32_t *a_regs; /* RS only: [k_steps][128][4] */
  const float *c;         /* [128][n/2] */
  float *d;               /* [128][n/2] */
  uint64_t desc_a, desc_b;
  uint32_t a_k_step_bytes, b_k_step_bytes;
  int32_t a_smem_bytes, b_smem_bytes; /* multiples of 16 */
  int32_t n;                          /* 8, 16, 32, 64, 128, 176 or 256 */
  int32_t k_steps;                    /* 1..4 */
  int32_t dtype;                      /* FA_DTYPE_F16 or FA_DTYPE_BF16 */
  int32_t a_from_regs, trans_a, trans_b, accumulate;
} FaSelftestWgmmaParams;

/* TMA, one block of 128 threads. LOAD: thread 0 initialises an mbarrier, declares expect_tx bytes and loads
 * the box at `coords` through `map` into 1024-byte aligned shared memory; every thread waits for the phase
 * and the block copies the box's shared image (box_bytes) to `image`. STORE: the block stores `image` into
 * shared memory, fences the proxy, synchronises, and thread 0 stores the box to the tensor at `coords`
 * (then commits and waits). */
enum { FA_SELFTEST_TMA_LOAD = 0, FA_SELFTEST_TMA_STORE = 1 };
typedef struct FaSelftestTmaParams {
  FaTensorMap map;
  uint8_t *image; /* [box_bytes]: LOAD writes it, STORE reads it */
  int32_t coords[5];
  int32_t rank;
  int32_t box_bytes; /* a multiple of 16 */
  int32_t expect_tx; /* LOAD: the bytes thread 0 declares */
  int32_t mode;      /* FA_SELFTEST_TMA_* */
} FaSelftestTmaParams;

/* Planted Hopper bugs, each with a correct twin (planted = 0), one block of 128 threads (SETMAXNREG_*: 384),
 * over a 64x64 f16 tensor `input` (map: a 2-D map of it, box 64x64, 128B swizzle; the TMA-store bugs store
 * a tile back into it, so it must be writable) and out [384 * 64] floats:
 *  ACC_READ_IN_FLIGHT      the accumulator is read before the wgmma_wait that completes its wgmma;
 *  A_WRITE_IN_FLIGHT       an RS wgmma's A-fragment registers are rewritten while it is in flight;
 *  SMEM_WRITE_IN_FLIGHT    the B tile is overwritten with ordinary stores while a wgmma reads it;
 *  NO_WGMMA_FENCE          the accumulator is zeroed and then used by a wgmma without wgmma_fence;
 *  UNCOMMITTED_AT_EXIT     a wgmma is issued and never committed;
 *  UNWAITED_AT_EXIT        a wgmma group is committed and never waited for;
 *  MBARRIER_DOUBLE_INIT    every lane of warp 0 initialises the mbarrier;
 *  MBARRIER_UNORDERED_INIT warp 0 initialises the mbarrier, warp 1 arrives on it with no barrier between;
 *  MBARRIER_PLAIN_ACCESS   the mbarrier's word is read with ld_shared;
 *  EXPECT_TX_TOO_FEW       expect_tx declares half the bytes of two TMA loads;
 *  EXPECT_TX_TOO_MANY      expect_tx declares twice the bytes of the TMA load (a deadlock);
 *  WAITER_BEHIND           warp 1 arrives twice (two phases) before warp 0 waits for the first;
 *  TMA_READ_BEFORE_WAIT    the TMA destination is read before the mbarrier wait;
 *  TMA_INTO_BUSY_STAGE     a second TMA load refills a stage warp 1 is still reading (no empty barrier);
 *  EXIT_WITH_TMA_IN_FLIGHT a TMA load is issued and never waited for;
 *  MISSING_PROXY_FENCE     a wgmma reads a tile written with ordinary stores and no fence.proxy.async;
 *  TMA_STORE_NO_FENCE      a TMA store reads a tile written with ordinary stores and no fence.proxy.async;
 *  TMA_STORE_SRC_OVERWRITE the TMA store's source is overwritten before tma_store_wait;
 *  SETMAXNREG_EXHAUSTED    3 warpgroups: the consumers' setmaxnreg.inc 232 needs the registers the
 *                          producer's setmaxnreg.dec 40 returns, which the bug leaves out (a deadlock);
 *  SETMAXNREG_MISUSE       setmaxnreg.inc 160 in a warpgroup holding 168 registers per thread (twin: .dec);
 *  SMEM_ALIGNMENT_ASSUMED  a 128B-swizzled TMA tile in dynamic_smem() (only 128-byte alignment declared);
 *  BAR_ARRIVE_ORDER        named_barrier_arrive before the producer warp's stores (twin: after);
 *  MBARRIER_INIT_NO_FENCE  a TMA load completes on an mbarrier whose init was never fenced
 *                          (fence_mbarrier_init) before the barrier that publishes it;
 *  WAIT_GROUP_NOT_A_BARRIER warps 1-3 write the stage's scratch rows before wgmma_wait, thread 0 releases the
 *                          stage for the warpgroup and refills it (twin: a named barrier of the warpgroup
 *                          first): wgmma.wait_group orders no warp's ordinary accesses for another. */
enum {
  FA_SM90_BUG_ACC_READ_IN_FLIGHT = 0,
  FA_SM90_BUG_A_WRITE_IN_FLIGHT = 1,
  FA_SM90_BUG_SMEM_WRITE_IN_FLIGHT = 2,
  FA_SM90_BUG_NO_WGMMA_FENCE = 3,
  FA_SM90_BUG_UNCOMMITTED_AT_EXIT = 4,
  FA_SM90_BUG_UNWAITED_AT_EXIT = 5,
  FA_SM90_BUG_MBARRIER_DOUBLE_INIT = 6,
  FA_SM90_BUG_MBARRIER_UNORDERED_INIT = 7,
  FA_SM90_BUG_MBARRIER_PLAIN_ACCESS = 8,
  FA_SM90_BUG_EXPECT_TX_TOO_FEW = 9,
  FA_SM90_BUG_EXPECT_TX_TOO_MANY = 10,
  FA_SM90_BUG_WAITER_BEHIND = 11,
  FA_SM90_BUG_TMA_READ_BEFORE_WAIT = 12,
  FA_SM90_BUG_TMA_INTO_BUSY_STAGE = 13,
  FA_SM90_BUG_EXIT_WITH_TMA_IN_FLIGHT = 14,
  FA_SM90_BUG_MISSING_PROXY_FENCE = 15,
  FA_SM90_BUG_TMA_STORE_NO_FENCE = 16,
  FA_SM90_BUG_TMA_STORE_SRC_OVERWRITE = 17,
  FA_SM90_BUG_SETMAXNREG_EXHAUSTED = 18,
  FA_SM90_BUG_SETMAXNREG_MISUSE = 19,
  FA_SM90_BUG_SMEM_ALIGNMENT_ASSUMED = 20,
  FA_SM90_BUG_BAR_ARRIVE_ORDER = 21,
  FA_SM90_BUG_MBARRIER_INIT_NO_FENCE = 22,
  FA_SM90_BUG_WAIT_GROUP_NOT_A_BARRIER = 23,
  FA_SM90_BUG_COUNT = 24,
};
typedef struct FaSelftestSm90BugParams {
  FaTensorMap map;
  const uint16_t *input; /* [64][64] f16 */
  float *out;            /* [384 * 64] */
  int32_t bug;
  int32_t planted;
} FaSelftestSm90BugParams;

/* A warp-specialised GEMM, c = a · bᵀ (b_mn_major = 0: b [n][k]) or a · b (b_mn_major = 1: b [k][n]), fp32
 * out, f16/bf16 in. Block tile 128 x 128, k tiles of 64, 3 warpgroups: warpgroup 0 produces (setmaxnreg.dec
 * 40; one thread issues TMA loads of A and B tiles into a 4-stage ring of full/empty mbarriers), warpgroups 1
 * and 2 consume (setmaxnreg.inc 232; each 64 rows with wgmma m64n128k16 SS from 128B-swizzled tiles, then
 * releases the stage). a_map: a [m][k] (box 64 x 128 rows); b_map: b with box 64 x 128 (K-major: 64 k x 128
 * n rows; MN-major: 64 n x 64 k, loaded twice per stage). m, n multiples of 128 are not required (TMA zero
 * fills). bug: FA_SELFTEST_WS_GEMM_* plants a pipeline bug. */
enum {
  FA_SELFTEST_WS_GEMM_CORRECT = 0,
  FA_SELFTEST_WS_GEMM_NO_EMPTY_WAIT = 1, /* the producer refills stages without waiting for their release */
  FA_SELFTEST_WS_GEMM_EARLY_RELEASE = 2, /* consumers release a stage before their wgmma on it completed */
  FA_SELFTEST_WS_GEMM_SHORT_TX = 3,      /* expect_tx declares the A tile only */
};
typedef struct FaSelftestWsGemmParams {
  FaTensorMap a_map;
  FaTensorMap b_map;
  float *c; /* [m][n] */
  int32_t m, n, k;
  int32_t dtype;
  int32_t b_mn_major;
  int32_t bug;
} FaSelftestWsGemmParams;

int fa_selftest_wgmma(FaSelftestWgmmaParams params, FaExec *exec);
int fa_selftest_tma(FaSelftestTmaParams params, FaExec *exec);
int fa_selftest_sm90_bug(FaSelftestSm90BugParams params, FaExec *exec);
int fa_selftest_ws_gemm(FaSelftestWsGemmParams params, FaExec *exec);

#ifdef __cplusplus
}
#endif

#endif /* FA_SELFTEST_ABI_H */
