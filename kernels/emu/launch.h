// The state of one emulated launch, shared by the executor's parts: the scheduler (scheduler.cpp) owns the
// blocks, warps and fibers; the memory checkers (global_memory.*, shared_memory.*) own the address spaces;
// collectives.cpp and cp_async.cpp implement instructions on top; warpgroup.cpp (wgmma, setmaxnreg) and
// mbarrier.cpp / tma.cpp (sm_90 mbarriers, TMA loads and stores, proxy fences) the asynchronous machinery. Everything lives in one Launch object on
// the launching OS thread's stack, reached through a thread_local pointer, so launches on different OS
// threads never share state.
#pragma once

#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>

#include <functional>
#include <vector>

#include "fa/emu/runtime.h"
#include "fiber.h"
#include "global_memory.h"
#include "shared_memory.h"

namespace fa {
namespace emu {
namespace detail {

constexpr int kWarpSize = 32;
constexpr int kMaxBlockThreads = 1024;
constexpr int kMaxWarps = kMaxBlockThreads / kWarpSize;
constexpr int kNumBarriers = 16; // bar.sync ids 0..15
// sm_90 capacities, reserved at launch (fibers must not allocate): in-flight wgmmas per warpgroup, mbarriers
// per block, TMA loads in flight per block, TMA stores in flight per thread, register objects a thread may
// touch between two wgmma_fence (more than that: every object counts as touched).
constexpr int kMaxWgmmaInFlight = 64;
constexpr int kMaxMbarriers = 64;
constexpr int kMaxTmaInFlight = 256;
constexpr int kMaxBulkStores = 32;
constexpr int kMaxTouched = 32;

// What a lane is waiting at. A barrier blocks its warp until enough warps arrive; the others are warp
// collectives that complete as soon as all 32 lanes of the warp have arrived.
// Warpgroup ops (Wg*, SetMaxNReg) are .sync.aligned over the 4 warps of a warpgroup: each warp arrives as a
// warp collective, then waits until the other three have arrived with the same op and key (warpgroup.cpp).
// BarArrive is bar.arrive: it counts towards a named barrier without waiting for it.
enum class Op : uint8_t {
  Barrier,
  SyncWarp,
  Shfl,
  Ballot,
  Ldmatrix,
  Mma,
  BarArrive,
  WgFence,
  WgMma,
  WgCommit,
  WgWait,
  SetMaxNReg,
};
inline bool is_warpgroup_op(Op op) { return op >= Op::WgFence; }

// Blocked: the lane waits alone (not as a warp) for an mbarrier phase; its warp steps on without it.
enum class LaneState : uint8_t { Ready, Arrived, Exited, Blocked };

// One lane's shared-memory access within its warp's current step (bank_conflicts.cpp), recorded in program
// order: `site` names the source location.
struct SharedAccess {
  uint64_t site;
  uint32_t offset;
  uint8_t lane;
  uint8_t bytes;
};
// Accesses one warp may make between two collectives before the rest go uncounted (shared_uncounted); the
// index fits the 16 bits account_shared_step packs it in.
constexpr size_t kMaxSharedAccessesPerStep = 16384;
// account_shared_step's working memory, allocated once per launch (it runs on a fiber's small stack).
struct SharedStepScratch {
  static constexpr int kMaxSites = 256; // distinct access sites in one warp step (8 bits of the key)
  std::vector<uint64_t> keys;           // reserved kMaxSharedAccessesPerStep
  uint64_t sites[kMaxSites];
  uint16_t counts[kMaxSites][32]; // per site and lane: accesses so far this step
};

// One cp.async between issue and completion: data moves only when a cp_async_wait covers its group.
struct CpAsyncCopy {
  uint32_t smem_offset;
  uint32_t bytes;
  const void *src; // not read when !pred (zero-fill)
  bool pred;
  uint64_t group; // number of the commit group it belongs to; == Thread::cp_async_groups while still open
};

// The emulator's form of a tensor map (abi.h FaEmuTensorMap), copied at issue: the kernel's own copy may go
// out of scope before a copy completes.
struct TmaBox {
  FaEmuTensorMap map;
  int32_t coords[5];
  uint32_t smem_offset; // start of the box in shared memory (row-major over the box, then swizzled)
  uint32_t bytes;       // the whole box, out-of-bounds elements included
};

// A TMA store (cp.async.bulk.tensor shared -> global) between issue and its bulk wait.
struct BulkStore {
  TmaBox box;
  uint64_t group;     // bulk commit group; == Thread::bulk_groups while still open
  uint32_t reader_id; // its mark on the shared bytes it reads (SharedMemory::async_read)
};

// Registers an in-flight wgmma owns: a thread's accumulator (or A fragment) object, until the wait_group
// that completes the wgmma.
struct RegRange {
  const void *lo;
  size_t bytes;
  uint64_t group; // the wgmma group, for messages
  bool accumulator;
};

// The last phase of one mbarrier a thread has observed through a wait (-1: the phase before the first).
struct PhaseSeen {
  uint32_t offset;
  int64_t phase;
};

struct Thread {
  FiberContext fiber;
  int tid = 0, lane = 0, warp = 0;
  LaneState state = LaneState::Ready;
  Op op = Op::SyncWarp;
  uint32_t op_key = 0;     // the instruction's warp-uniform operands (barrier id/count, ldmatrix shape, ...)
  void *op_args = nullptr; // per-lane operands and results, on this fiber's stack while it waits
  std::vector<CpAsyncCopy> cp_async; // issued and not yet complete, in issue order
  uint64_t cp_async_groups = 0;      // groups committed so far
  uint64_t loads_since_wait = 0;     // see count_load
  // sm_90 state (warpgroup.cpp, mbarrier.cpp, tma.cpp). Reserved at launch: fibers must not allocate.
  uint32_t wait_bar = 0;    // LaneState::Blocked: offset of the mbarrier waited on ...
  int wait_parity = 0;      // ... and the parity of the phase waited for
  std::vector<RegRange> wgmma_regs;        // registers owned by in-flight wgmmas
  std::vector<const void *> wgmma_touched; // register objects read or written since the last wgmma_fence
  bool wgmma_fenced = false;               // executed a wgmma_fence at least once
  bool wgmma_touch_overflow = false;       // touched more objects than wgmma_touched holds: all count
  std::vector<PhaseSeen> phases_seen;
  std::vector<BulkStore> bulk_stores; // issued, not yet complete
  uint64_t bulk_groups = 0;
};

// A lane runs uninterrupted until its next collective or barrier, so one that spin-waits on memory another
// warp (or block) writes would never let the writer run. Past this many loads without reaching a wait point
// the emulator reports a fault instead of hanging (2^26, about a second of emulation: a decode thread
// reading a 32k-token context touches ~2^22 elements).
constexpr uint64_t kMaxLoadsBetweenWaits = 1ull << 26;

struct Warp {
  int arrived = 0; // lanes waiting at the warp's current collective or barrier
  int exited = 0;
  int blocked = 0; // lanes blocked on an mbarrier (LaneState::Blocked)
  bool at_barrier = false;
  bool at_warpgroup = false; // waiting for the other warps of its warpgroup (a warpgroup op)
  bool done = false;
  // Runnable: some lane can run (and the warp waits neither at a barrier nor for its warpgroup).
  bool runnable() const { return !done && !at_barrier && !at_warpgroup && arrived + exited + blocked < 32; }
};

// One bar.sync id: the count the waiting warps asked for and who is waiting. Warps that bar.arrive count
// towards it without waiting; what they did before arriving is released to the waiters (`released`).
struct Barrier {
  int expected = 0;
  int arrived = 0; // threads, in whole warps
  uint32_t warps = 0;    // warps waiting (bar.sync)
  uint32_t arrivers = 0; // warps that arrived without waiting (bar.arrive)
  uint32_t released[32] = {};
};

// One in-flight wgmma.mma_async of a warpgroup (warpgroup.cpp).
struct WgmmaOp {
  float *d[128];          // each thread's accumulator registers (N/2 floats)
  uint32_t a[128][4];     // RS: each thread's A fragment, as it was at issue
  uint64_t desc_a, desc_b;
  uint64_t group;         // commit group number; == Warpgroup::groups while the group is open
  uint32_t serial;        // for the shared-memory read marks
  uint16_t n;
  bool a_from_regs, trans_a, trans_b, accumulate, bf16;
};

// A warpgroup (4 consecutive warps): the rendezvous of its .sync.aligned ops and its wgmma / register state.
struct Warpgroup {
  uint32_t arrived = 0; // warps (bit i: warp 4g + i) waiting at the current op
  Op op = Op::WgFence;
  uint32_t key = 0;
  int regs = 0;         // setmaxnreg: registers per thread now
  uint64_t groups = 0;  // wgmma groups committed
  std::vector<WgmmaOp> wgmma; // in flight, in issue order (reserved at launch)
};

// One mbarrier object (mbarrier.cpp): its phase state and, for the race detector, what its completed phases
// released (the join of the arrivers' vector clocks; a waiter acquires it).
struct MBarrier {
  uint32_t offset = 0;
  int expected = 0, pending = 0;
  int64_t tx = 0;
  int64_t phase = 0; // phases completed
  int64_t tx_expected = 0, tx_landed = 0; // this phase so far, for messages
  int init_tid = 0, init_warp = 0;
  uint32_t init_epoch = 0;
  // fence.mbarrier_init by the initialising warp: the async proxy (a TMA's complete_tx) may signal the
  // barrier only once that fence is ordered before the issuing thread.
  bool init_fenced = false;
  uint32_t fence_epoch = 0;
  uint32_t pending_release[32] = {};
  uint32_t released[32] = {};
};

// A TMA load (cp.async.bulk.tensor global -> shared) between issue and landing. It lands when a thread
// needs the phase its mbarrier completes, or before a deadlock is declared.
struct TmaLoad {
  TmaBox box;
  uint32_t bar = 0;   // mbarrier offset it signals (complete_tx)
  int issuer = 0;     // thread
  uint32_t epoch = 0; // the issuing warp's epoch at issue
  uint64_t seq = 0;   // issue order
  bool live = false;
};

// One stream of TMA tiles: the loads a block issues through one tensor map, tile by tile (a tile: the boxes
// of one outer coordinate, i.e. every panel of it), for the prefetch-slack counters (FaEmuCounters).
constexpr int kMaxTmaStreams = 8;
struct TmaStream {
  const void *map = nullptr; // the kernel's tensor map (its address identifies the stream)
  int32_t tile[4] = {};      // coordinates 1..4 of the current tile
  uint32_t lo = 0, hi = 0;   // shared bytes [lo, hi) the current tile's boxes fill
  int tiles = 0;             // tiles issued so far
  // Per warp: 1 + its epoch when it observed (wgmma_wait) the completion of a wgmma that read the current
  // tile; 0 if none did.
  uint32_t done[32] = {};
  // The same for the tile before the current one (still recorded after the current one was issued: a
  // consumer may finish it later), for the two-tile slack (FaEmuCounters.tma_tiles_two_ahead).
  uint32_t prev_lo = 0, prev_hi = 0;
  uint32_t prev_done[32] = {};
};

struct Launch {
  const char *kernel = "";
  Dim3 grid;
  Dim3 block_idx;
  int block_threads = 0;
  int num_warps = 0;
  FaEmuLaunch *ctx = nullptr;
  const std::function<void()> *body = nullptr;
  uint64_t seed = 0;

  GlobalMemory global;
  SharedMemory shared;
  FiberStacks stacks;
  FiberContext scheduler; // the launching thread's own context, resumed whenever a fiber waits or exits
  std::vector<Thread> threads;
  std::vector<Warp> warps;
  std::vector<std::vector<SharedAccess>> shared_steps; // per warp, reserved at launch (bank_conflicts.cpp)
  SharedStepScratch shared_scratch;
  Barrier barriers[kNumBarriers];
  std::vector<Warpgroup> warpgroups;
  std::vector<MBarrier> mbarriers; // initialised this block (few: a pipeline has a handful)
  std::vector<TmaLoad> tma_loads;  // slots; `live` ones are in flight
  TmaStream tma_streams[kMaxTmaStreams];
  int num_tma_streams = 0;
  int entry_regs = 0, reg_pool = 0; // setmaxnreg: registers per thread at launch, and the CTA's pool
  uint32_t async_serial = 0;        // numbers in-flight wgmmas and TMA stores for shared-memory read marks
  uint64_t tma_seq = 0;
  Thread *current = nullptr; // the fiber running now; null while the scheduler runs
  int step_start = 0;        // the lane the current warp step started with (lanes run in rotation from it)
  bool faulted = false;
  jmp_buf *scheduler_fault = nullptr; // where a fault raised in the scheduler's own context returns to
  // Plain increments at each counted event (a few adds per intrinsic call, which already costs a
  // function call and a check); copied into ctx->kernels when the launch ends, faulted or not.
  FaEmuCounters counters{};
};

// The launch running on this OS thread. Calling an intrinsic outside a launch is a usage error of the
// emulator itself (not a kernel fault): it aborts with a message.
Launch &current_launch();
inline Thread &current_thread() { return *current_launch().current; }
// The same, or null outside a launch (for the signal handler).
Launch *launch_on_this_thread();

// Records "kernel <name> block (x,y,z) thread <blame.tid>: <what>" as the launch's fault and abandons the
// launch: control returns to launch(), which reports FA_ERR_EMULATOR. Only callable on a fiber.
[[noreturn]] void fault(const Thread &blame, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
// Only records the message (the first fault of a launch wins); the caller abandons the fiber itself.
void record_fault(Launch &launch, const Thread &blame, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

// Size of each fiber stack (scheduler.cpp), for messages.
size_t fiber_stack_bytes();

// Host signals raised by kernel code become launch faults (fault_signal.cpp): installs the process-wide
// handler once; a ScopedAltStack gives it a stack to run on while a launch is active on this thread.
void install_fault_handlers();
class ScopedAltStack {
public:
  ScopedAltStack();
  ~ScopedAltStack();
  ScopedAltStack(const ScopedAltStack &) = delete;
  ScopedAltStack &operator=(const ScopedAltStack &) = delete;

private:
  void *mem_ = nullptr;
  stack_t previous_{};
};

// Bank conflicts (bank_conflicts.cpp). record_shared_access notes one lane's access of `bytes` at shared
// offset `offset` (ld/st or a cp.async destination) from source location `site`; account_shared_step, when
// warp w's step ends (all lanes at a collective or exited), groups its lanes' accesses into warp instructions
// and counts their wavefronts; account_ldmatrix counts one ldmatrix from its 32 lanes' row offsets.
void record_shared_access(Launch &launch, const Thread &t, const SharedSite &site, uint32_t offset, uint32_t bytes);
void account_shared_step(Launch &launch, int w);
void account_ldmatrix(Launch &launch, const uint32_t *row_offsets, int count);
// Wavefronts of one phase: n lane accesses (byte offset, size), the largest number of distinct 4-byte words
// one of the 32 banks holds.
uint32_t phase_wavefronts(const uint32_t *offsets, const uint32_t *bytes, int n);

// Counts one load of `t` towards kMaxLoadsBetweenWaits; faults past it.
void count_load(Thread &t);

// Blocks the calling lane alone (an mbarrier wait): its warp steps on without it until unblock_lane.
// Returns once unblocked and scheduled again.
void block_lane(Launch &launch, Thread &t);
void unblock_lane(Launch &launch, Thread &t);
// Makes the lanes of warp w that arrived at its current op runnable again.
void release_warp(Launch &launch, int w);

// Makes the calling lane wait at a warp collective or barrier (`key`: its warp-uniform operands, `args`:
// this lane's operands and result slots). Returns once the operation has completed for this lane.
void arrive(Op op, uint32_t key, void *args);

// Computes a warp collective once all 32 lanes of `warp` have arrived with the same op and key
// (collectives.cpp). Runs on the last lane's fiber, so it may fault.
void complete_collective(Launch &launch, int warp);

// Completes every outstanding cp.async of `t` (at thread exit, when the hardware would still land them).
void cp_async_drain(Thread &t);

// Names a collective for messages: "shfl_xor", "named_barrier_sync(1, 64)", "ldmatrix.x4.trans", ...
void describe_op(Op op, uint32_t key, char *buf, size_t len);

// ------------------------------------------------------------------------------------------------ sm_90
// Warp `w` (all its lanes at one warpgroup op) joins its warpgroup's rendezvous (warpgroup.cpp); the op runs
// once all four warps are there. Runs on the last lane's fiber.
void warpgroup_arrive(Launch &launch, int warp, const Thread &first);
// Retries rendezvous that could not complete yet (setmaxnreg.inc waiting for registers); true if any did.
bool retry_warpgroups(Launch &launch);
// Describes what is waiting on warpgroup ops and mbarriers, for the deadlock report; returns chars written.
size_t describe_async_waits(Launch &launch, char *buf, size_t len, int *blame);
// A thread leaves: faults if its warpgroup still has wgmmas in flight; completes its TMA stores.
void sm90_thread_exit(Thread &t);
// The block's threads have all exited: faults if a TMA load never landed.
void sm90_block_end(Launch &launch);
// Lands every TMA load in flight (before declaring a deadlock: the hardware would eventually); true if any.
bool land_all_tma(Launch &launch);
// Block start: forget the warpgroups', mbarriers' and copies' state.
void sm90_reset_block(Launch &launch);
// Makes lanes blocked on mbarrier `bar` runnable again if its phase completed for them.
void wake_mbarrier_waiters(Launch &launch, const MBarrier &bar);
// Parts of the above that live in warpgroup.cpp.
size_t describe_warpgroup_waits(Launch &launch, char *buf, size_t len, int *blame);
void wgmma_thread_exit(Thread &t);
void warpgroups_reset(Launch &launch);
// 16-bit floats to fp32, exactly.
inline float bf16_to_float(uint16_t h) {
  uint32_t bits = (uint32_t)h << 16;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

// Exact IEEE binary16 -> binary32, subnormals included (the tensor cores do not flush fp16 inputs).
inline float f16_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, bits;
  if (exp == 0) {
    float f = (float)mant * 0x1p-24f; // exact: at most 10 significant bits
    memcpy(&bits, &f, 4);
    bits |= sign;
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | mant << 13;
  } else {
    bits = sign | (exp + 112) << 23 | mant << 13;
  }
  float f;
  memcpy(&f, &bits, 4);
  return f;
}
// The mbarrier at shared offset `offset`, or null.
MBarrier *find_mbarrier(Launch &launch, uint32_t offset);
// The current phase of `bar` completes (its arrivals and bytes are in); faults if loads still signal it.
void complete_mbarrier_phase(Launch &launch, const Thread &blame, MBarrier &bar);
// Completes every TMA store of `t` (at thread exit).
void tma_stores_drain(Thread &t);
// Lands the TMA loads that signal mbarrier `bar` (its waiter needs the phase), in issue order.
void land_tma_for(Launch &launch, MBarrier &bar);
// A wgmma that read shared bytes [lo, hi) completed, observed by the warps in `warp_mask` (at their current
// epochs): recorded against the TMA stream whose current tile lies there (prefetch slack).
void tma_streams_read_done(Launch &launch, uint32_t lo, uint32_t hi, uint32_t warp_mask);

} // namespace detail
} // namespace emu
} // namespace fa
