// Fiber set-up and the portable parts of switching (see fiber.h).
#include "fiber.h"

#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

namespace fa {
namespace emu {
namespace detail {

#ifndef FA_EMU_UCONTEXT

extern "C" void fa_emu_fiber_switch(void **save_sp, void *load_sp);
extern "C" void fa_emu_fiber_start();

void fiber_prepare(FiberContext &fiber, void *stack_lo, void *stack_hi, void (*entry)(void *), void *arg) {
  (void)stack_lo;
  // The frame fa_emu_fiber_switch pops, lowest address first: control words, r15, r14, r13, r12, rbx, rbp,
  // return address. Its start is 16-byte aligned, so after the final `ret` rsp is too, as
  // fa_emu_fiber_start's call requires.
  uintptr_t top = (uintptr_t)stack_hi & ~(uintptr_t)15;
  uint64_t *frame = (uint64_t *)(top - 16 - 8 * 8);
  uint32_t mxcsr = __builtin_ia32_stmxcsr();
  uint16_t fpucw;
  __asm__ volatile("fnstcw %0" : "=m"(fpucw));
  // The fiber inherits the launching thread's rounding and denormal modes.
  frame[0] = (uint64_t)mxcsr | ((uint64_t)fpucw << 32);
  frame[1] = 0;                        // r15
  frame[2] = 0;                        // r14
  frame[3] = (uint64_t)(uintptr_t)entry; // r13
  frame[4] = (uint64_t)(uintptr_t)arg;   // r12
  frame[5] = 0;                        // rbx
  frame[6] = 0;                        // rbp
  frame[7] = (uint64_t)(uintptr_t)&fa_emu_fiber_start;
  fiber.sp = frame;
}

void fiber_switch(FiberContext &from, FiberContext &to) { fa_emu_fiber_switch(&from.sp, to.sp); }

#else

// makecontext passes only int arguments: the entry and its argument travel as 32-bit halves.
static void ucontext_trampoline(unsigned entry_lo, unsigned entry_hi, unsigned arg_lo, unsigned arg_hi) {
  auto entry = (void (*)(void *))(((uintptr_t)entry_hi << 32) | entry_lo);
  void *arg = (void *)(((uintptr_t)arg_hi << 32) | arg_lo);
  entry(arg);
  __builtin_trap(); // entry functions never return
}

void fiber_prepare(FiberContext &fiber, void *stack_lo, void *stack_hi, void (*entry)(void *), void *arg) {
  getcontext(&fiber.uc);
  fiber.uc.uc_stack.ss_sp = stack_lo;
  fiber.uc.uc_stack.ss_size = (size_t)((char *)stack_hi - (char *)stack_lo);
  fiber.uc.uc_link = nullptr;
  uint64_t e = (uint64_t)(uintptr_t)entry, a = (uint64_t)(uintptr_t)arg;
  makecontext(&fiber.uc, (void (*)())ucontext_trampoline, 4, (unsigned)e, (unsigned)(e >> 32), (unsigned)a,
              (unsigned)(a >> 32));
}

void fiber_switch(FiberContext &from, FiberContext &to) { swapcontext(&from.uc, &to.uc); }

#endif

FiberStacks::~FiberStacks() {
  if (base_) munmap(base_, total_);
}

bool FiberStacks::allocate(int count, size_t bytes) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  guard_ = page;
  slot_ = ((bytes + page - 1) / page) * page + guard_;
  total_ = slot_ * (size_t)count;
  count_ = count;
  // MAP_NORESERVE: stacks are large for safety but a kernel touches a few pages of each.
  void *p = mmap(nullptr, total_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    base_ = nullptr;
    return false;
  }
  base_ = (char *)p;
  for (int i = 0; i < count; ++i) {
    if (mprotect(base_ + (size_t)i * slot_, guard_, PROT_NONE) != 0) return false;
  }
  return true;
}

bool FiberStacks::in_guard(const void *addr, int *which) const {
  uintptr_t a = (uintptr_t)addr, b = (uintptr_t)base_;
  if (!base_ || a < b || a >= b + total_) return false;
  size_t i = (a - b) / slot_;
  if ((a - b) % slot_ >= guard_) return false;
  *which = (int)i;
  return true;
}

} // namespace detail
} // namespace emu
} // namespace fa
