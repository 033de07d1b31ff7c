// Host faults inside an emulated kernel (SIGSEGV, SIGBUS, SIGFPE) reported like every other fault.
//
// The checked intrinsics catch bad accesses before they happen, but kernel code can still fault the host
// process directly: a fiber stack overflow hits the guard page below its stack (fiber.cpp), a raw pointer
// dereferenced outside the intrinsics can segfault, and an integer division by zero traps on x86 (the GPU
// returns an unspecified value instead). Without this the whole test process dies with no hint of which
// kernel, block or thread; with it, the launch returns FA_ERR_EMULATOR with that message.
//
// The handler is process-wide but transparent: a signal that is not a fault of a running emulated kernel on
// the faulting thread goes to whatever handler was installed before (Rust's stack-overflow handler, or the
// default action). It runs on an alternate signal stack that launch() installs for its duration, since a
// stack overflow leaves no room on the fiber's own stack.
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <mutex>

#include "launch.h"

namespace fa {
namespace emu {
namespace detail {

namespace {

constexpr int kSignals[] = {SIGSEGV, SIGBUS, SIGFPE};
struct sigaction g_previous[3];
std::once_flag g_installed;

int signal_index(int sig) {
  for (int i = 0; i < 3; ++i) {
    if (kSignals[i] == sig) return i;
  }
  return -1;
}

void chain(int sig, siginfo_t *info, void *uctx) {
  const int i = signal_index(sig);
  const struct sigaction &prev = g_previous[i];
  if ((prev.sa_flags & SA_SIGINFO) && prev.sa_sigaction) {
    prev.sa_sigaction(sig, info, uctx);
    return;
  }
  if (prev.sa_handler != SIG_DFL && prev.sa_handler != SIG_IGN) {
    prev.sa_handler(sig);
    return;
  }
  // Default action: restore it and return, so the faulting instruction re-executes and takes it.
  signal(sig, SIG_DFL);
}

void on_fault_signal(int sig, siginfo_t *info, void *uctx) {
  Launch *l = launch_on_this_thread();
  if (!l || !l->current || l->faulted) {
    chain(sig, info, uctx);
    return;
  }
  Thread &t = *l->current;
  int stack = -1;
  if (sig == SIGFPE) {
    record_fault(*l, t,
                 "arithmetic trap (integer division by zero or overflow) at code address %p: the GPU returns an "
                 "unspecified value instead, so the kernel's result would be garbage",
                 info->si_addr);
  } else if (l->stacks.in_guard(info->si_addr, &stack)) {
    record_fault(*l, t,
                 "stack overflow: thread %d ran past its %zu KiB fiber stack (deep recursion or very large local "
                 "arrays in the kernel?)",
                 stack, fiber_stack_bytes() / 1024);
  } else {
    char where[256];
    l->global.describe(info->si_addr, 1, where, sizeof where);
    record_fault(*l, t,
                 "%s at address %s, reached without a checked intrinsic (a raw pointer dereference in the kernel?)",
                 sig == SIGBUS ? "bus error" : "segmentation fault", where);
  }
  // Never returning from the handler: unblock the signal (the kernel blocked it for the handler's
  // duration) and leave for the scheduler, abandoning the faulted fiber like any other fault.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, sig);
  pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
  fiber_switch(t.fiber, l->scheduler);
  __builtin_trap();
}

} // namespace

void install_fault_handlers() {
  std::call_once(g_installed, [] {
    for (int i = 0; i < 3; ++i) {
      struct sigaction sa;
      memset(&sa, 0, sizeof sa);
      sa.sa_sigaction = on_fault_signal;
      sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
      sigemptyset(&sa.sa_mask);
      sigaction(kSignals[i], &sa, &g_previous[i]);
    }
  });
}

// 64 KiB: the handler formats a message with snprintf, which needs more than MINSIGSTKSZ.
constexpr size_t kAltStackBytes = 64 * 1024;

ScopedAltStack::ScopedAltStack() {
  void *p = mmap(nullptr, kAltStackBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return;
  stack_t ss;
  ss.ss_sp = p;
  ss.ss_size = kAltStackBytes;
  ss.ss_flags = 0;
  if (sigaltstack(&ss, &previous_) != 0) {
    munmap(p, kAltStackBytes);
    return;
  }
  mem_ = p;
}

ScopedAltStack::~ScopedAltStack() {
  if (!mem_) return;
  sigaltstack(&previous_, nullptr);
  munmap(mem_, kAltStackBytes);
}

} // namespace detail
} // namespace emu
} // namespace fa
