// mbarrier objects (PTX ISA 9.7.13.15) and fence.proxy.async, plus the sm_90 hooks the scheduler calls at
// thread exit, block end and deadlock.
//
// An mbarrier has an expected arrival count, pending arrivals, a transaction count and a phase. arrive counts
// one arrival (release semantics); arrive.expect_tx first adds bytes to the transaction count; a TMA load
// subtracts its bytes when it lands (complete_tx). The current phase completes when pending arrivals and
// the transaction count are both zero; the barrier then starts the next phase with the full count.
// try_wait.parity(P) (acquire) succeeds once the phase with parity P has completed, i.e. while the current
// phase's parity differs from P; the intrinsic loops on it, so here it is a blocking wait of one lane.
//
// Race detection: an arrive releases the arriving warp's vector clock into the phase; a landed TMA releases
// its write; a wait that observes the phase acquires everything its barrier released so far.
//
// Checks: init twice, or a use not ordered after the init by a barrier; a TMA load signalling a barrier
// whose init was not fenced (fence.mbarrier_init, by the initialising warp, ordered before the issuer:
// tma.cpp); ordinary loads or stores to the 8
// bytes (shared_memory.cpp); more arrivals than the count; a phase completing while TMA loads that signal
// it are still attached (expect_tx declared too few bytes); a waiter that skips a phase (it was two or more
// phases behind: the producer overran it); deadlocks name the arrivals and bytes still missing.
#include <stdio.h>
#include <string.h>

#include "launch.h"

namespace fa {
namespace emu {
namespace detail {

MBarrier *find_mbarrier(Launch &l, uint32_t offset) {
  for (MBarrier &b : l.mbarriers) {
    if (b.offset == offset) return &b;
  }
  return nullptr;
}

void wake_mbarrier_waiters(Launch &l, const MBarrier &b) {
  for (Thread &t : l.threads) {
    if (t.state == LaneState::Blocked && t.wait_bar == b.offset && (b.phase & 1) != t.wait_parity) unblock_lane(l, t);
  }
}

namespace {

// The mbarrier at `bar`, checked: initialised, and the initialisation ordered before this use.
MBarrier &use(Launch &l, Thread &t, void *bar, const char *what) {
  const uint32_t off = l.shared.check_range(t, bar, 8, 8, what);
  MBarrier *b = find_mbarrier(l, off);
  if (!b) {
    fault(t, "%s on shared+%u, which is not an initialised mbarrier (missing mbarrier_init, or the wrong address?)",
          what, off);
  }
  if (b->init_warp != t.warp && !l.shared.ordered_after(t.warp, b->init_warp, b->init_epoch)) {
    fault(t,
          "%s: warp %d uses the mbarrier at shared+%u that thread %d (warp %d) initialised, with no barrier ordering "
          "the initialisation before this use (missing sync_threads() after mbarrier_init?)",
          what, t.warp, off, b->init_tid, b->init_warp);
  }
  return *b;
}

const TmaLoad *attached_load(const Launch &l, uint32_t bar) {
  const TmaLoad *first = nullptr;
  for (const TmaLoad &c : l.tma_loads) {
    if (c.live && c.bar == bar && (!first || c.seq < first->seq)) first = &c;
  }
  return first;
}

} // namespace

void complete_mbarrier_phase(Launch &l, const Thread &blame, MBarrier &b) {
  if (const TmaLoad *c = attached_load(l, b.offset)) {
    fault(blame,
          "the mbarrier at shared+%u completed phase %lld (all %d arrivals; transaction count back to 0 after %lld "
          "bytes declared by expect_tx) while thread %d's TMA load of %u bytes to shared+%u still signals it: "
          "expect_tx declared fewer bytes than the copies bring",
          b.offset, (long long)b.phase, b.expected, (long long)b.tx_expected, c->issuer, c->box.bytes,
          c->box.smem_offset);
  }
  for (int w = 0; w < 32; ++w) {
    if (b.pending_release[w] > b.released[w]) b.released[w] = b.pending_release[w];
    b.pending_release[w] = 0;
  }
  b.phase += 1;
  b.pending = b.expected;
  b.tx = 0;
  b.tx_expected = 0;
  b.tx_landed = 0;
  wake_mbarrier_waiters(l, b);
}

namespace {

void arrive_on(Launch &l, Thread &t, MBarrier &b, uint32_t tx) {
  if (b.pending == 0) {
    // Every arrival of this phase is in and it waits for bytes: its copies land first (they would have by
    // now on the GPU, and nothing can delay them past this arrive).
    land_tma_for(l, b);
    if (b.pending == 0) {
      fault(t,
            "arrive on the mbarrier at shared+%u: phase %lld already has all %d arrivals (and waits for %lld "
            "transaction bytes): more arrivals than the count it was initialised with",
            b.offset, (long long)b.phase, b.expected, (long long)b.tx);
    }
  }
  b.tx += tx;
  b.tx_expected += tx;
  l.shared.release(t.warp, b.pending_release);
  b.pending -= 1;
  if (b.pending == 0 && b.tx == 0) complete_mbarrier_phase(l, t, b);
}

int64_t &phase_seen(Thread &t, uint32_t offset) {
  for (PhaseSeen &p : t.phases_seen) {
    if (p.offset == offset) return p.phase;
  }
  if (t.phases_seen.size() == t.phases_seen.capacity()) {
    fault(t, "thread %d waits on more than %d mbarriers", t.tid, kMaxMbarriers);
  }
  t.phases_seen.push_back(PhaseSeen{offset, -1});
  return t.phases_seen.back().phase;
}

void check_not_behind(Thread &t, const MBarrier &b, int parity, int64_t phase) {
  const int64_t last = phase_seen(t, b.offset);
  if (phase > last + 1) {
    fault(t,
          "thread %d waits on the mbarrier at shared+%u with parity %d, which now means phase %lld, but the last "
          "phase it observed there was %lld: phase %lld completed without it, so its wait stands for the wrong "
          "phase (the arriving side ran two phases ahead: a stage refilled before its consumer released it, "
          "missing empty-barrier wait?)",
          t.tid, b.offset, parity, (long long)phase, (long long)last, (long long)(last + 1));
  }
}

} // namespace

size_t describe_async_waits(Launch &l, char *buf, size_t len, int *blame) {
  size_t used = describe_warpgroup_waits(l, buf, len, blame);
  for (int w = 0; w < l.num_warps && used < len; ++w) {
    // Lanes of warp w blocked on mbarriers, one entry per barrier.
    uint32_t done = 0;
    for (int i = 0; i < kWarpSize; ++i) {
      const Thread &t = l.threads[(size_t)(w * kWarpSize + i)];
      if (t.state != LaneState::Blocked || (done >> i & 1)) continue;
      uint32_t lanes = 0;
      for (int j = i; j < kWarpSize; ++j) {
        const Thread &u = l.threads[(size_t)(w * kWarpSize + j)];
        if (u.state == LaneState::Blocked && u.wait_bar == t.wait_bar) lanes |= 1u << j;
      }
      done |= lanes;
      const MBarrier *b = find_mbarrier(l, t.wait_bar);
      if (!b) continue;
      const int n = snprintf(buf + used, len - used,
                             "; warp %d (%d lane%s from lane %d) waits at mbarrier_wait(shared+%u, parity %d) for phase "
                             "%lld: %d of %d arrivals pending, %lld transaction bytes outstanding (expect_tx declared "
                             "%lld, TMA loads landed %lld)",
                             w, __builtin_popcount(lanes), __builtin_popcount(lanes) == 1 ? "" : "s", i, b->offset,
                             t.wait_parity, (long long)b->phase, b->pending, b->expected, (long long)b->tx,
                             (long long)b->tx_expected, (long long)b->tx_landed);
      if (n > 0) used += (size_t)n;
      if (*blame < 0) *blame = t.tid;
    }
  }
  return used < len ? used : len - 1;
}

void sm90_thread_exit(Thread &t) {
  wgmma_thread_exit(t);
  tma_stores_drain(t);
}

void sm90_block_end(Launch &l) {
  for (const TmaLoad &c : l.tma_loads) {
    if (c.live) {
      fault(l.threads[(size_t)c.issuer],
            "the block exits with a TMA load in flight: thread %d's cp.async.bulk.tensor of %u bytes to shared+%u "
            "(completing on the mbarrier at shared+%u) was never waited for",
            c.issuer, c.box.bytes, c.box.smem_offset, c.bar);
    }
  }
}

void sm90_reset_block(Launch &l) {
  warpgroups_reset(l);
  l.mbarriers.clear();
  l.num_tma_streams = 0;
  for (TmaLoad &c : l.tma_loads) c.live = false;
}

} // namespace detail

using namespace detail;

void mbarrier_init(void *bar, int count) {
  Launch &l = current_launch();
  Thread &t = *l.current;
  const uint32_t off = l.shared.check_range(t, bar, 8, 8, "mbarrier_init");
  if (count < 1 || count > (1 << 20) - 1) fault(t, "mbarrier_init(shared+%u, %d): the count is 1..2^20-1", off, count);
  if (const MBarrier *b = find_mbarrier(l, off)) {
    fault(t,
          "mbarrier_init: the mbarrier at shared+%u is initialised a second time (by thread %d; thread %d did it "
          "first): initialise each barrier from one thread",
          off, t.tid, b->init_tid);
  }
  if ((int)l.mbarriers.size() >= kMaxMbarriers) fault(t, "more than %d mbarriers in one block", kMaxMbarriers);
  MBarrier b;
  b.offset = off;
  b.expected = b.pending = count;
  b.init_tid = t.tid;
  b.init_warp = t.warp;
  b.init_epoch = l.shared.epoch_of(t.warp);
  l.mbarriers.push_back(b);
  l.shared.mark_mbarrier(off, true);
}

void mbarrier_arrive(void *bar) {
  Launch &l = current_launch();
  Thread &t = *l.current;
  arrive_on(l, t, use(l, t, bar, "mbarrier_arrive"), 0);
}

void mbarrier_arrive_expect_tx(void *bar, uint32_t bytes) {
  Launch &l = current_launch();
  Thread &t = *l.current;
  arrive_on(l, t, use(l, t, bar, "mbarrier_arrive_expect_tx"), bytes);
}

void mbarrier_wait(void *bar, int parity) {
  Launch &l = current_launch();
  Thread &t = *l.current;
  MBarrier &b = use(l, t, bar, "mbarrier_wait");
  if (parity != 0 && parity != 1) fault(t, "mbarrier_wait(shared+%u, %d): the parity is 0 or 1", b.offset, parity);
  const int64_t current = b.phase;
  int64_t observed = current - 1; // the phase with parity P already completed (-1: the one before init)
  if ((current & 1) == parity) {
    // The waiter needs the current phase: its copies land now.
    land_tma_for(l, b);
    observed = current;
    if (b.phase == current) {
      check_not_behind(t, b, parity, current);
      t.wait_bar = b.offset;
      t.wait_parity = parity;
      block_lane(l, t);
    }
  }
  check_not_behind(t, b, parity, observed);
  int64_t &seen = phase_seen(t, b.offset);
  if (observed > seen) seen = observed;
  l.shared.acquire(t.warp, b.released);
}

void fence_proxy_async() {
  Launch &l = current_launch();
  l.shared.fence_proxy(l.current->warp);
}

void fence_mbarrier_init() {
  Launch &l = current_launch();
  Thread &t = *l.current;
  // Covers every barrier this warp initialised so far (the fence orders the warp's earlier inits).
  for (MBarrier &b : l.mbarriers) {
    if (b.init_warp == t.warp && !b.init_fenced) {
      b.init_fenced = true;
      b.fence_epoch = l.shared.epoch_of(t.warp);
    }
  }
}

} // namespace emu
} // namespace fa
