// The state of one emulated launch, shared by the executor's parts: the scheduler (scheduler.cpp) owns the
// blocks, warps and fibers; the memory checkers (global_memory.*, shared_memory.*) own the address spaces;
// collectives.cpp and cp_async.cpp implement instructions on top. Everything lives in one Launch object on
// the launching OS thread's stack, reached through a thread_local pointer, so launches on different OS
// threads never share state.
#pragma once

#include <signal.h>
#include <stdint.h>

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

// What a lane is waiting at. A barrier blocks its warp until enough warps arrive; the others are warp
// collectives that complete as soon as all 32 lanes of the warp have arrived.
enum class Op : uint8_t { Barrier, SyncWarp, Shfl, Ballot, Ldmatrix, Mma };

enum class LaneState : uint8_t { Ready, Arrived, Exited };

// One cp.async between issue and completion: data moves only when a cp_async_wait covers its group.
struct CpAsyncCopy {
  uint32_t smem_offset;
  uint32_t bytes;
  const void *src; // not read when !pred (zero-fill)
  bool pred;
  uint64_t group; // number of the commit group it belongs to; == Thread::cp_async_groups while still open
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
};

// A lane runs uninterrupted until its next collective or barrier, so one that spin-waits on memory another
// warp (or block) writes would never let the writer run. Past this many loads without reaching a wait point
// the emulator reports a fault instead of hanging (2^26, about a second of emulation: a decode thread
// reading a 32k-token context touches ~2^22 elements).
constexpr uint64_t kMaxLoadsBetweenWaits = 1ull << 26;

struct Warp {
  int arrived = 0; // lanes waiting at the warp's current collective or barrier
  int exited = 0;
  bool at_barrier = false;
  bool done = false;
};

// One bar.sync id: the count the waiting warps asked for and who is waiting.
struct Barrier {
  int expected = 0;
  int arrived = 0; // threads, in whole warps
  uint32_t warps = 0;
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
  Barrier barriers[kNumBarriers];
  Thread *current = nullptr; // the fiber running now; null while the scheduler runs
  int step_start = 0;        // the lane the current warp step started with (lanes run in rotation from it)
  bool faulted = false;
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

// Counts one load of `t` towards kMaxLoadsBetweenWaits; faults past it.
void count_load(Thread &t);

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

} // namespace detail
} // namespace emu
} // namespace fa
