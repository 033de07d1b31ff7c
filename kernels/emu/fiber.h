// Fibers: one user-space execution context per emulated CUDA thread, and the switch between them.
//
// The executor runs every CUDA thread of a block as a fiber on the launching OS thread and switches between
// them at every warp collective and barrier, so the switch must be cheap: on x86-64 it is ten instructions
// of hand-written assembly (fiber_switch_x86_64.S: callee-saved registers, the SSE/x87 control words and the
// stack pointer), ~5 ns. ucontext's swapcontext also saves the signal mask with a system call per switch
// (~0.5 us), which would dominate the emulation budget; it is only the fallback for other targets.
#pragma once

#include <stddef.h>

#if !(defined(__x86_64__) && defined(__linux__)) || defined(FA_EMU_FORCE_UCONTEXT)
#define FA_EMU_UCONTEXT 1
#include <ucontext.h>
#endif

namespace fa {
namespace emu {
namespace detail {

// A suspended execution context. The scheduler owns one for itself and one per CUDA thread.
struct FiberContext {
#ifdef FA_EMU_UCONTEXT
  ucontext_t uc;
#else
  void *sp = nullptr; // stack pointer of the suspended context; the saved registers sit just above it
#endif
};

// Makes `fiber` start `entry(arg)` on the stack [stack_lo, stack_hi) when first switched to. `entry` must
// never return: a finished fiber switches away for good.
void fiber_prepare(FiberContext &fiber, void *stack_lo, void *stack_hi, void (*entry)(void *), void *arg);

// Saves the running context into `from` and resumes `to`. Returns when something switches back to `from`.
void fiber_switch(FiberContext &from, FiberContext &to);

// Fiber stacks for one launch: `count` stacks of `bytes` each, every one with an inaccessible guard page
// below it, so a kernel that overflows its stack faults instead of silently overwriting its neighbour.
class FiberStacks {
public:
  FiberStacks() = default;
  FiberStacks(const FiberStacks &) = delete;
  FiberStacks &operator=(const FiberStacks &) = delete;
  ~FiberStacks();

  // Maps the stacks; false when the host is out of address space.
  bool allocate(int count, size_t bytes);
  void *lo(int i) const { return base_ + (size_t)i * slot_ + guard_; }
  void *hi(int i) const { return base_ + (size_t)(i + 1) * slot_; }
  // True if `addr` lies in one of the guard pages (a stack overflow); `*which` receives the stack index.
  bool in_guard(const void *addr, int *which) const;

private:
  char *base_ = nullptr;
  size_t slot_ = 0, guard_ = 0, total_ = 0;
  int count_ = 0;
};

} // namespace detail
} // namespace emu
} // namespace fa
