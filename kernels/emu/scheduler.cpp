// The scheduler: runs a launch block by block, each CUDA thread on its own fiber, and implements the
// points where threads wait for each other (warp collectives and bar.sync barriers).
//
// Execution model. A warp advances in "steps": each of its lanes runs (in a seeded rotation) until it
// reaches the warp's next collective or barrier, or exits. The last lane to get there resolves the step:
// a warp collective is computed from all 32 lanes' operands and the warp stays runnable; at a barrier the
// warp blocks until enough warps arrive. Between steps the scheduler picks the next warp at random among
// the runnable ones (seeded by FaEmuLaunch.seed and the block index), so code that relies on an order the
// hardware does not guarantee produces seed-dependent results, and shared-memory races are reported by
// shared_memory.cpp independently of the order. A block ends when every thread has exited; no runnable
// warp with some threads still waiting is a deadlock, reported instead of hanging.
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <new>

#include "launch.h"

namespace fa {
namespace emu {
namespace detail {

// Fiber stacks are large because kernels keep register tiles (e.g. a 16x128 fp32 accumulator) on them;
// only the pages a kernel touches are ever committed.
constexpr size_t kFiberStackBytes = 256 * 1024;
// The largest dynamic shared memory a block can have (sm_90: 227 KiB; sm_80: 163 KiB; sm_86/89: 99 KiB).
constexpr int kMaxSmemBytes = 227 * 1024;

static thread_local Launch *t_launch = nullptr;
static thread_local bool t_race_detection = true;

Launch *launch_on_this_thread() { return t_launch; }

size_t fiber_stack_bytes() { return kFiberStackBytes; }

Launch &current_launch() {
  if (!t_launch) {
    fputs("fa::emu: a device intrinsic was called outside an emulated kernel launch\n", stderr);
    abort();
  }
  return *t_launch;
}

// splitmix64: a small, well-mixed generator; the state is seeded per block so that the order within one
// block does not depend on how many steps earlier blocks took.
struct Rng {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  uint32_t below(uint32_t n) { return (uint32_t)(((next() >> 32) * n) >> 32); }
};

static void vformat_fault(Launch &l, int tid, const char *fmt, va_list ap) {
  if (l.faulted) return; // the first fault is the one to report
  l.faulted = true;
  char *msg = l.ctx->message;
  size_t cap = sizeof l.ctx->message;
  int n = snprintf(msg, cap, "kernel %s block (%d,%d,%d) thread %d: ", l.kernel, l.block_idx.x, l.block_idx.y,
                   l.block_idx.z, tid);
  if (n >= 0 && (size_t)n < cap) vsnprintf(msg + n, cap - (size_t)n, fmt, ap);
}

static void format_fault(Launch &l, int tid, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void format_fault(Launch &l, int tid, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vformat_fault(l, tid, fmt, ap);
  va_end(ap);
}

void record_fault(Launch &l, const Thread &blame, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vformat_fault(l, blame.tid, fmt, ap);
  va_end(ap);
}

void fault(const Thread &blame, const char *fmt, ...) {
  Launch &l = current_launch();
  va_list ap;
  va_start(ap, fmt);
  vformat_fault(l, blame.tid, fmt, ap);
  va_end(ap);
  // Outside any fiber (the scheduler landing TMA copies before it declares a deadlock): back to run_block.
  if (!l.current) longjmp(*l.scheduler_fault, 1);
  // Abandon the launch: back to the scheduler, which sees `faulted` and unwinds to launch(). This fiber's
  // stack is simply dropped; kernels hold no resources that need destructors.
  fiber_switch(l.current->fiber, l.scheduler);
  __builtin_trap(); // a faulted launch never resumes a fiber
}

void describe_op(Op op, uint32_t key, char *buf, size_t len) {
  switch (op) {
  case Op::Barrier: snprintf(buf, len, "named_barrier_sync(%u, %u)", key & 15, key >> 4); break;
  case Op::SyncWarp: snprintf(buf, len, "sync_warp"); break;
  case Op::Shfl: snprintf(buf, len, key == 0 ? "shfl_xor" : "shfl_idx"); break;
  case Op::Ballot: snprintf(buf, len, "warp_ballot/any/all"); break;
  case Op::Ldmatrix: snprintf(buf, len, "ldmatrix.x%u%s", key & 7, key & 8 ? ".trans" : ""); break;
  case Op::Mma: snprintf(buf, len, "mma.m16n8k16.%s", key == 0 ? "f16" : "bf16"); break;
  case Op::BarArrive: snprintf(buf, len, "named_barrier_arrive(%u, %u)", key & 15, key >> 4); break;
  case Op::WgFence: snprintf(buf, len, "wgmma.fence"); break;
  case Op::WgMma: snprintf(buf, len, "wgmma.mma_async.m64n%uk16", key & 0x1ff); break;
  case Op::WgCommit: snprintf(buf, len, "wgmma.commit_group"); break;
  case Op::WgWait: snprintf(buf, len, "wgmma.wait_group %u", key); break;
  case Op::SetMaxNReg: snprintf(buf, len, "setmaxnreg.%s %u", key & 1 ? "inc" : "dec", key >> 1); break;
  }
}

// "0-15", "3", "0-3,8-11": a lane set for messages.
static void format_lanes(uint32_t mask, char *buf, size_t len) {
  size_t used = 0;
  buf[0] = 0;
  for (int i = 0; i < 32 && used < len;) {
    if (!(mask >> i & 1)) {
      ++i;
      continue;
    }
    int j = i;
    while (j + 1 < 32 && (mask >> (j + 1) & 1)) ++j;
    int n = i == j ? snprintf(buf + used, len - used, "%s%d", used ? "," : "", i)
                   : snprintf(buf + used, len - used, "%s%d-%d", used ? "," : "", i, j);
    if (n < 0) break;
    used += (size_t)n;
    i = j + 1;
  }
}

void release_warp(Launch &l, int w) {
  Warp &warp = l.warps[w];
  for (int i = 0; i < kWarpSize; ++i) {
    Thread &t = l.threads[(size_t)w * kWarpSize + i];
    if (t.state == LaneState::Arrived) t.state = LaneState::Ready;
  }
  warp.arrived = 0;
  warp.at_barrier = false;
  warp.at_warpgroup = false;
}

// bar.sync (waits) or bar.arrive (`wait` false: counts, releases what the warp did so far, moves on).
static void arrive_at_barrier(Launch &l, int w, const Thread &blame, bool wait) {
  int id = (int)(blame.op_key & 15), count = (int)(blame.op_key >> 4);
  Barrier &b = l.barriers[id];
  if (b.arrived > 0 && b.expected != count) {
    fault(blame,
          "named barrier %d: warp %d arrives with a thread count of %d while the warps already waiting there "
          "gave %d",
          id, w, count, b.expected);
  }
  b.expected = count;
  b.arrived += kWarpSize;
  l.counters.barrier_arrivals += 1;
  if (wait) {
    b.warps |= 1u << w;
    l.warps[w].at_barrier = true;
  } else {
    b.arrivers |= 1u << w;
    l.shared.release(w, b.released);
    release_warp(l, w);
  }
  if (b.arrived < count) return;
  l.counters.barriers += 1;
  // Complete: order everything the participants did before against everything the waiters do after.
  l.shared.barrier(b.warps, b.arrivers ? b.released : nullptr);
  for (int o = 0; o < l.num_warps; ++o) {
    if (b.warps >> o & 1) release_warp(l, o);
  }
  b = Barrier{};
}

// All 32 lanes of warp `w` have arrived somewhere or exited; runs on the last lane's fiber.
static void resolve_step(Launch &l, int w) {
  Warp &warp = l.warps[w];
  account_shared_step(l, w); // the step's shared accesses, as warp instructions
  if (warp.arrived == 0) {
    warp.done = true;
    return;
  }
  Thread *lanes = &l.threads[(size_t)w * kWarpSize];
  const Thread *first = nullptr;
  uint32_t same = 0, other = 0, exited = 0;
  const Thread *first_other = nullptr;
  for (int i = 0; i < kWarpSize; ++i) {
    const Thread &t = lanes[i];
    if (t.state == LaneState::Exited) {
      exited |= 1u << i;
    } else if (!first || (t.op == first->op && t.op_key == first->op_key)) {
      if (!first) first = &t;
      same |= 1u << i;
    } else {
      if (!first_other) first_other = &t;
      other |= 1u << i;
    }
  }
  if (other || exited) {
    char op[64], lanes_a[96], lanes_b[96];
    describe_op(first->op, first->op_key, op, sizeof op);
    format_lanes(same, lanes_a, sizeof lanes_a);
    if (other) {
      char op_b[64];
      describe_op(first_other->op, first_other->op_key, op_b, sizeof op_b);
      format_lanes(other, lanes_b, sizeof lanes_b);
      fault(*first,
            "divergent warp %d: lanes %s wait at %s while lanes %s wait at %s (all 32 lanes must reach the same "
            "warp collective or barrier)",
            w, lanes_a, op, lanes_b, op_b);
    }
    format_lanes(exited, lanes_b, sizeof lanes_b);
    fault(*first,
          "divergent warp %d: lanes %s wait at %s but lanes %s have exited (all 32 lanes must reach the same "
          "warp collective or barrier)",
          w, lanes_a, op, lanes_b);
  }
  if (first->op == Op::Barrier || first->op == Op::BarArrive) {
    arrive_at_barrier(l, w, *first, first->op == Op::Barrier);
  } else if (is_warpgroup_op(first->op)) {
    warpgroup_arrive(l, w, *first);
  } else {
    complete_collective(l, w);
    release_warp(l, w);
  }
}

// Ends this lane's part of the warp step: control passes straight to the next lane of the step that has not
// run yet (one switch instead of two through the scheduler), or back to the scheduler after the last one.
static void pass_on(Launch &l, Thread &t) {
  Thread *lanes = &l.threads[(size_t)t.warp * kWarpSize];
  for (int i = ((t.lane - l.step_start) & 31) + 1; i < kWarpSize; ++i) {
    Thread &next = lanes[(l.step_start + i) & 31];
    if (next.state == LaneState::Ready) {
      l.current = &next;
      fiber_switch(t.fiber, next.fiber);
      return;
    }
  }
  l.current = nullptr;
  fiber_switch(t.fiber, l.scheduler);
}

void count_load(Thread &t) {
  if (++t.loads_since_wait > kMaxLoadsBetweenWaits) {
    fault(t,
          "%llu loads without reaching a warp collective or barrier: a spin-wait on memory another warp or "
          "block writes? (the emulator runs a lane uninterrupted between collectives and blocks one at a time)",
          (unsigned long long)kMaxLoadsBetweenWaits);
  }
}

void arrive(Op op, uint32_t key, void *args) {
  Launch &l = current_launch();
  Thread &t = *l.current;
  t.loads_since_wait = 0;
  t.op = op;
  t.op_key = key;
  t.op_args = args;
  t.state = LaneState::Arrived;
  Warp &warp = l.warps[t.warp];
  warp.arrived += 1;
  if (warp.arrived + warp.exited == kWarpSize) resolve_step(l, t.warp);
  pass_on(l, t);
}

void block_lane(Launch &l, Thread &t) {
  t.loads_since_wait = 0;
  t.state = LaneState::Blocked;
  l.warps[t.warp].blocked += 1;
  pass_on(l, t);
}

void unblock_lane(Launch &l, Thread &t) {
  t.state = LaneState::Ready;
  l.warps[t.warp].blocked -= 1;
}

static void thread_exit(Launch &l, Thread &t) {
  cp_async_drain(t);
  sm90_thread_exit(t);
  t.state = LaneState::Exited;
  Warp &warp = l.warps[t.warp];
  warp.exited += 1;
  if (warp.arrived + warp.exited == kWarpSize) resolve_step(l, t.warp);
  pass_on(l, t);
  __builtin_trap(); // an exited fiber is never resumed
}

static void thread_entry(void *arg) noexcept {
  Thread &t = *static_cast<Thread *>(arg);
  Launch &l = current_launch();
  (*l.body)();
  thread_exit(l, t);
}

// Runs one step of warp `w`: every ready lane, in a seeded rotation, up to its next wait point. The lanes
// hand over to each other (pass_on); control comes back here after the last one, or at a fault.
static void step_warp(Launch &l, int w, Rng &rng) {
  l.step_start = (int)(rng.next() & 31);
  Thread *lanes = &l.threads[(size_t)w * kWarpSize];
  for (int i = 0; i < kWarpSize; ++i) {
    Thread &t = lanes[(l.step_start + i) & 31];
    if (t.state != LaneState::Ready) continue;
    l.current = &t;
    fiber_switch(l.scheduler, t.fiber);
    l.current = nullptr;
    return;
  }
}

static void report_deadlock(Launch &l) {
  char text[1536];
  size_t used = 0;
  int blame = -1;
  uint32_t exited = 0;
  for (int w = 0; w < l.num_warps; ++w) {
    if (l.warps[w].done) exited |= 1u << w;
  }
  for (int id = 0; id < kNumBarriers; ++id) {
    const Barrier &b = l.barriers[id];
    if (!b.warps) continue;
    char warps[96];
    format_lanes(b.warps, warps, sizeof warps);
    const bool one = (b.warps & (b.warps - 1)) == 0;
    int n = snprintf(text + used, sizeof text - used, "%s%s %s %s at named_barrier_sync(%d, %d) (%d of %d threads arrived)",
                     used ? "; " : "", one ? "warp" : "warps", warps, one ? "waits" : "wait", id, b.expected,
                     b.arrived, b.expected);
    if (n > 0) used = used + (size_t)n < sizeof text ? used + (size_t)n : sizeof text - 1;
    if (blame < 0) blame = __builtin_ctz(b.warps) * kWarpSize;
  }
  used += describe_async_waits(l, text + used, sizeof text - used, &blame);
  if (used >= sizeof text) used = sizeof text - 1;
  if (exited) {
    char warps[96];
    format_lanes(exited, warps, sizeof warps);
    const bool one = (exited & (exited - 1)) == 0;
    snprintf(text + used, sizeof text - used, "; %s %s %s exited (an exited warp never arrives)", one ? "warp" : "warps",
             warps, one ? "has" : "have");
  }
  // The async-wait entries each start with "; ".
  format_fault(l, blame < 0 ? 0 : blame, "deadlock: no warp can make progress: %s",
               strncmp(text, "; ", 2) == 0 ? text + 2 : text);
}

// Runs `f` in the scheduler's own context, where a fault cannot switch away from a fiber: it jumps back here.
// True if `f` returned normally.
template <class F> static bool outside_fibers(Launch &l, F f, bool *result) {
  jmp_buf here;
  l.scheduler_fault = &here;
  if (setjmp(here) != 0) return false;
  *result = f();
  return true;
}

static void run_block(Launch &l, Dim3 idx, uint64_t linear) {
  l.block_idx = idx;
  l.counters.blocks += 1;
  l.shared.reset_block(Rng{l.seed ^ (0x2545F4914F6CDD1Dull * (linear + 1))}.next());
  for (Barrier &b : l.barriers) b = Barrier{};
  for (Warp &w : l.warps) w = Warp{};
  for (std::vector<SharedAccess> &step : l.shared_steps) step.clear();
  sm90_reset_block(l);
  for (int i = 0; i < l.block_threads; ++i) {
    Thread &t = l.threads[(size_t)i];
    t.state = LaneState::Ready;
    t.cp_async.clear();
    t.cp_async_groups = 0;
    t.loads_since_wait = 0;
    t.wgmma_regs.clear();
    t.wgmma_touched.clear();
    t.wgmma_fenced = false;
    t.wgmma_touch_overflow = false;
    t.phases_seen.clear();
    t.bulk_stores.clear();
    t.bulk_groups = 0;
    fiber_prepare(t.fiber, l.stacks.lo(i), l.stacks.hi(i), thread_entry, &t);
  }
  Rng rng{l.seed ^ (0xD1B54A32D192ED03ull * (linear + 1))};
  int runnable[kMaxWarps];
  for (;;) {
    int n = 0;
    bool all_done = true;
    for (int w = 0; w < l.num_warps; ++w) {
      if (l.warps[w].done) continue;
      all_done = false;
      if (l.warps[w].runnable()) runnable[n++] = w;
    }
    bool progress = false;
    if (all_done) {
      outside_fibers(l, [&] { sm90_block_end(l); return true; }, &progress);
      return;
    }
    if (n == 0) {
      // Before declaring a deadlock: copies still in flight would land and registers freed by setmaxnreg.dec
      // would be handed out on the GPU eventually.
      if (!outside_fibers(l, [&] { return retry_warpgroups(l) || land_all_tma(l); }, &progress)) return;
      if (progress) continue;
      report_deadlock(l);
      return;
    }
    step_warp(l, runnable[rng.below((uint32_t)n)], rng);
    if (l.faulted) return;
  }
}

// The running totals a block's share is the difference of (the balance counters of FaEmuCounters).
struct BlockTotals {
  uint64_t read, written, mma;
};
static BlockTotals block_totals(const FaEmuCounters &c) {
  BlockTotals t{0, 0, c.mma + c.wgmma};
  for (int r = 0; r < FA_EMU_MAX_REGIONS; ++r) {
    t.read += c.global_bytes_read[r];
    t.written += c.global_bytes_written[r];
  }
  return t;
}
// A block that stored nothing found no work (a fixed-size grid's spare CTA): it joins no balance statistic.
static void count_block_balance(FaEmuCounters &c, const BlockTotals &before) {
  const BlockTotals after = block_totals(c);
  if (after.written == before.written) return;
  const uint64_t read = after.read - before.read, mma = after.mma - before.mma;
  c.active_blocks += 1;
  c.active_bytes_read += read;
  c.active_mma += mma;
  if (read > c.max_block_bytes_read) c.max_block_bytes_read = read;
  if (mma > c.max_block_mma) c.max_block_mma = mma;
}

static uint64_t gcd(uint64_t a, uint64_t b) {
  while (b) {
    uint64_t r = a % b;
    a = b;
    b = r;
  }
  return a;
}

// Runs the grid's blocks in a seeded order (block i of the order is (a*i + c) mod N with a coprime to N):
// the hardware gives no order either, and this costs no memory even for huge grids.
static void run_grid(Launch &l) {
  const uint64_t gx = (uint64_t)l.grid.x, gy = (uint64_t)l.grid.y, total = gx * gy * (uint64_t)l.grid.z;
  Rng rng{l.seed ^ 0x5851F42D4C957F2Dull};
  uint64_t c = rng.next() % total, a = 1;
  for (int tries = 0; tries < 64 && total > 1; ++tries) {
    uint64_t cand = 1 + rng.next() % (total - 1);
    if (gcd(cand, total) == 1) {
      a = cand;
      break;
    }
  }
  for (uint64_t i = 0; i < total && !l.faulted; ++i) {
    uint64_t linear = (uint64_t)(((unsigned __int128)a * i + c) % total);
    Dim3 idx{(int)(linear % gx), (int)(linear / gx % gy), (int)(linear / (gx * gy))};
    const BlockTotals before = block_totals(l.counters);
    run_block(l, idx, linear);
    count_block_balance(l.counters, before);
  }
}

static int fail(FaEmuLaunch *ctx, const char *kernel, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(FaEmuLaunch *ctx, const char *kernel, const char *fmt, ...) {
  int n = snprintf(ctx->message, sizeof ctx->message, "kernel %s: ", kernel);
  va_list ap;
  va_start(ap, fmt);
  if (n >= 0 && (size_t)n < sizeof ctx->message) vsnprintf(ctx->message + n, sizeof ctx->message - (size_t)n, fmt, ap);
  va_end(ap);
  return FA_ERR_EMULATOR;
}

} // namespace detail

using namespace detail;

int launch(const char *kernel_name, Dim3 grid, int block, int smem_bytes, FaEmuLaunch *ctx,
           const std::function<void()> &body) {
  if (!ctx) return FA_ERR_EMULATOR;
  ctx->message[0] = 0;
  const char *name = kernel_name ? kernel_name : "(unnamed)";
  if (ctx->num_kernels < 0 || ctx->num_kernels >= FA_EMU_MAX_KERNELS) {
    return fail(ctx, name, "FaEmuLaunch.num_kernels is %d: one context records at most %d kernel launches",
                ctx->num_kernels, (int)FA_EMU_MAX_KERNELS);
  }
  if (t_launch) {
    return fail(ctx, name, "launched from inside the emulated kernel %s: device-side launches are not supported",
                t_launch->kernel);
  }
  if (block < kWarpSize || block > kMaxBlockThreads || block % kWarpSize != 0) {
    return fail(ctx, name, "block of %d threads: the emulator runs whole warps, 32 to 1024 threads per block", block);
  }
  if (grid.x < 1 || grid.y < 1 || grid.z < 1 || grid.y > 65535 || grid.z > 65535) {
    return fail(ctx, name, "invalid grid (%d,%d,%d): each dimension must be >= 1 (y and z <= 65535)", grid.x,
                grid.y, grid.z);
  }
  if (smem_bytes < 0 || smem_bytes > kMaxSmemBytes) {
    return fail(ctx, name, "%d bytes of dynamic shared memory: a block can have at most %d (227 KiB, sm_90)",
                smem_bytes, kMaxSmemBytes);
  }
  try {
    Launch l;
    l.kernel = name;
    l.grid = grid;
    l.block_threads = block;
    l.num_warps = block / kWarpSize;
    l.ctx = ctx;
    l.body = &body;
    l.seed = ctx->seed;
    const char *why = nullptr;
    if (!l.global.set_regions(ctx->regions, ctx->num_regions, &why)) return fail(ctx, name, "%s", why);
    if (!l.stacks.allocate(block, kFiberStackBytes)) return fail(ctx, name, "cannot map %d fiber stacks", block);
    if (!l.shared.allocate(smem_bytes, l.num_warps, t_race_detection)) {
      return fail(ctx, name, "out of host memory for %d bytes of shared memory", smem_bytes);
    }
    l.threads.resize((size_t)block);
    l.warps.resize((size_t)l.num_warps);
    l.shared_steps.resize((size_t)l.num_warps);
    for (std::vector<SharedAccess> &step : l.shared_steps) step.reserve(kMaxSharedAccessesPerStep);
    l.shared_scratch.keys.reserve(kMaxSharedAccessesPerStep);
    // sm_90: warpgroups, and the register pool setmaxnreg redistributes. Launched with one CTA per SM (as
    // warp-specialised kernels are), each thread starts with the registers ptxas can give it:
    // 65536 / threads, rounded down to a multiple of 8, at most 256.
    l.warpgroups.resize((size_t)(l.num_warps / 4));
    for (Warpgroup &g : l.warpgroups) g.wgmma.reserve(kMaxWgmmaInFlight);
    l.entry_regs = 65536 / block / 8 * 8;
    if (l.entry_regs > 256) l.entry_regs = 256;
    l.reg_pool = l.entry_regs * block;
    l.mbarriers.reserve(kMaxMbarriers);
    l.tma_loads.resize(kMaxTmaInFlight);
    for (int i = 0; i < block; ++i) {
      Thread &t = l.threads[(size_t)i];
      t.tid = i;
      t.lane = i % kWarpSize;
      t.warp = i / kWarpSize;
      // Issued-but-unwaited copies per thread stay small (a few pipeline stages); reserving keeps the
      // fibers from allocating, which is the one thing that could throw on them.
      t.cp_async.reserve(64);
      t.wgmma_regs.reserve(2 * kMaxWgmmaInFlight);
      t.wgmma_touched.reserve(kMaxTouched);
      t.phases_seen.reserve(kMaxMbarriers);
      t.bulk_stores.reserve(kMaxBulkStores);
    }
    install_fault_handlers();
    ScopedAltStack alt_stack;
    t_launch = &l;
    run_grid(l);
    t_launch = nullptr;
    snprintf(l.counters.kernel, sizeof l.counters.kernel, "%s", name);
    l.counters.block_threads = (uint64_t)block;
    l.counters.smem_bytes = (uint64_t)smem_bytes;
    ctx->kernels[ctx->num_kernels++] = l.counters;
    return l.faulted ? FA_ERR_EMULATOR : FA_OK;
  } catch (const std::bad_alloc &) {
    t_launch = nullptr;
    return fail(ctx, name, "out of host memory");
  }
}

int thread_idx() { return current_launch().current->tid; }
int block_dim() { return current_launch().block_threads; }
Dim3 block_idx() { return current_launch().block_idx; }
Dim3 grid_dim() { return current_launch().grid; }

void named_barrier_sync(int id, int nthreads) {
  Launch &l = current_launch();
  Thread &t = *l.current;
  if (id < 0 || id >= kNumBarriers) fault(t, "named_barrier_sync(%d, %d): barrier ids are 0..15", id, nthreads);
  if (nthreads <= 0 || nthreads % kWarpSize != 0 || nthreads > l.block_threads) {
    fault(t, "named_barrier_sync(%d, %d): the thread count must be a multiple of 32 between 32 and the block size %d",
          id, nthreads, l.block_threads);
  }
  arrive(Op::Barrier, (uint32_t)id | (uint32_t)nthreads << 4, nullptr);
}

void named_barrier_arrive(int id, int nthreads) {
  Launch &l = current_launch();
  Thread &t = *l.current;
  if (id < 0 || id >= kNumBarriers) fault(t, "named_barrier_arrive(%d, %d): barrier ids are 0..15", id, nthreads);
  if (nthreads <= 0 || nthreads % kWarpSize != 0 || nthreads > l.block_threads) {
    fault(t,
          "named_barrier_arrive(%d, %d): the thread count must be a multiple of 32 between 32 and the block size %d",
          id, nthreads, l.block_threads);
  }
  arrive(Op::BarArrive, (uint32_t)id | (uint32_t)nthreads << 4, nullptr);
}

ScopedRaceDetection::ScopedRaceDetection(bool enabled) : previous_(t_race_detection) { t_race_detection = enabled; }
ScopedRaceDetection::~ScopedRaceDetection() { t_race_detection = previous_; }

} // namespace emu
} // namespace fa
