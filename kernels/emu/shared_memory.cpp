// Shared memory: bounds, poison, cp.async in-flight marks and race detection (see shared_memory.h).
#include "shared_memory.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "launch.h"

namespace fa {
namespace emu {
namespace detail {

// The dynamic shared-memory base is 128-byte aligned, as `extern __shared__ __align__(128)` is on the GPU.
constexpr size_t kSmemAlign = 128;
constexpr unsigned char kPoison = 0xFF;

SharedMemory::~SharedMemory() { free(alloc_); }

bool SharedMemory::allocate(int bytes, int num_warps, bool race_detection) {
  bytes_ = bytes;
  warps_ = num_warps;
  races_ = race_detection;
  size_t rounded = ((size_t)bytes + kSmemAlign - 1) / kSmemAlign * kSmemAlign;
  if (posix_memalign((void **)&alloc_, kSmemAlign, rounded ? rounded : kSmemAlign) != 0) {
    alloc_ = nullptr;
    return false;
  }
  base_ = alloc_;
  size_t granules = ((size_t)bytes + 1) / 2;
  in_flight_.assign(granules, 0);
  in_flight_epoch_.assign(granules, 0);
  if (races_) {
    last_write_.assign(granules, 0);
    last_read_.assign(granules * (size_t)num_warps, 0);
  }
  clock_.assign((size_t)num_warps * num_warps, 0);
  return true;
}

void SharedMemory::reset_block() {
  memset(base_, kPoison, (size_t)bytes_);
  std::fill(in_flight_.begin(), in_flight_.end(), 0);
  std::fill(last_write_.begin(), last_write_.end(), 0);
  std::fill(last_read_.begin(), last_read_.end(), 0);
  std::fill(clock_.begin(), clock_.end(), 0);
}

uint32_t SharedMemory::check_range(const Thread &t, const void *p, size_t n, size_t align, const char *what) {
  uintptr_t a = (uintptr_t)p, b = (uintptr_t)base_;
  if (a < b || a - b > (uintptr_t)bytes_ || n > (size_t)bytes_ - (a - b)) {
    Launch &l = current_launch();
    if (l.global.find(p)) {
      char where[256];
      l.global.describe(p, n, where, sizeof where);
      fault(t, "%s of %zu bytes at address %s: that is global memory, not this block's shared memory", what, n,
            where);
    }
    // Near misses (an index off by a little) are described relative to the base, like global ones.
    if (a >= b && a - b < (uintptr_t)bytes_ + 65536) {
      fault(t, "out-of-bounds %s of %zu bytes at address %#llx (shared+%llu): the block has %d bytes of shared memory",
            what, n, (unsigned long long)a, (unsigned long long)(a - b), bytes_);
    }
    if (a < b && b - a <= 65536) {
      fault(t, "out-of-bounds %s of %zu bytes at address %#llx (shared-%llu): before the block's shared memory", what,
            n, (unsigned long long)a, (unsigned long long)(b - a));
    }
    fault(t, "%s of %zu bytes at address %#llx: not in this block's shared memory [%#llx, +%d bytes)", what, n,
          (unsigned long long)a, (unsigned long long)b, bytes_);
  }
  if (a % align != 0) {
    fault(t, "misaligned %s of %zu bytes at address %#llx (shared+%llu): the GPU requires %zu-byte alignment", what,
          n, (unsigned long long)a, (unsigned long long)(a - b), align);
  }
  return (uint32_t)(a - b);
}

void SharedMemory::report_race(const Thread &t, uint32_t offset, const char *access, int other_warp,
                               const char *other_access) {
  fault(t,
        "data race on shared memory at address %#llx (shared+%u): warp %d%s bytes that warp %d %s, with no "
        "barrier ordering the two accesses (missing __syncthreads?)",
        (unsigned long long)((uintptr_t)base_ + offset), offset, t.warp, access, other_warp, other_access);
}

// An access to bytes a cp.async has not landed yet. If a barrier orders the issue before this access, the
// issuer's missing wait is the bug; if nothing orders them, the access races with the copy itself.
void SharedMemory::report_in_flight(const Thread &t, uint32_t g, const char *access) {
  const int issuer = in_flight_[g] - 1, issuer_warp = issuer / kWarpSize;
  const unsigned long long addr = (unsigned long long)((uintptr_t)base_ + 2 * g);
  if (races_ && issuer_warp != t.warp && in_flight_epoch_[g] >= knows(t.warp, issuer_warp)) {
    fault(t,
          "data race on shared memory at address %#llx (shared+%u): warp %d%s bytes that warp %d's cp.async "
          "(thread %d) writes, with no barrier ordering the two accesses (missing __syncthreads?)",
          addr, 2 * g, t.warp, access, issuer_warp, issuer);
  }
  fault(t,
        "warp %d%s shared memory at address %#llx (shared+%u) with cp.async in flight: thread %d's cp.async to "
        "it has not been waited for (missing cp_async_wait?)",
        t.warp, access, addr, 2 * g, issuer);
}

void SharedMemory::on_read(const Thread &t, uint32_t offset, size_t n) {
  const int w = t.warp;
  const uint32_t g_end = (uint32_t)((offset + n + 1) / 2);
  for (uint32_t g = offset / 2; g < g_end; ++g) {
    if (in_flight_[g]) report_in_flight(t, g, " reads");
    if (!races_) continue;
    uint32_t wr = last_write_[g];
    if (wr) {
      int writer = (int)(wr & 31);
      if (writer != w && (wr >> 5) - 1 >= knows(w, writer)) report_race(t, 2 * g, " reads", writer, "wrote");
    }
    last_read_[(size_t)g * warps_ + w] = epoch(w) + 1;
  }
}

void SharedMemory::on_write(const Thread &t, uint32_t offset, size_t n, bool async) {
  const int w = t.warp;
  const uint32_t g_end = (uint32_t)((offset + n + 1) / 2);
  const char *access = async ? "'s cp.async writes" : " writes";
  for (uint32_t g = offset / 2; g < g_end; ++g) {
    if (in_flight_[g]) report_in_flight(t, g, access);
    if (races_) {
      uint32_t wr = last_write_[g];
      if (wr) {
        int writer = (int)(wr & 31);
        if (writer != w && (wr >> 5) - 1 >= knows(w, writer)) report_race(t, 2 * g, access, writer, "also wrote");
      }
      const uint32_t *reads = &last_read_[(size_t)g * warps_];
      for (int r = 0; r < warps_; ++r) {
        if (r != w && reads[r] && reads[r] - 1 >= knows(w, r)) report_race(t, 2 * g, access, r, "read");
      }
      if (!async) last_write_[g] = ((epoch(w) + 1) << 5) | (uint32_t)w;
    }
    if (async) {
      in_flight_[g] = (uint16_t)(t.tid + 1);
      in_flight_epoch_[g] = epoch(w);
    }
  }
}

void SharedMemory::load(const Thread &t, void *dst, const void *p, size_t n) {
  uint32_t off = check_range(t, p, n, natural_alignment(n), "shared load");
  on_read(t, off, n);
  memcpy(dst, base_ + off, n);
}

void SharedMemory::store(const Thread &t, void *p, const void *src, size_t n) {
  uint32_t off = check_range(t, p, n, natural_alignment(n), "shared store");
  on_write(t, off, n, false);
  memcpy(base_ + off, src, n);
}

void SharedMemory::collective_read(const Thread &t, void *dst, const void *p, size_t n, const char *what) {
  uint32_t off = check_range(t, p, n, 16, what);
  on_read(t, off, n);
  memcpy(dst, base_ + off, n);
}

uint32_t SharedMemory::begin_async_write(const Thread &t, void *p, size_t n) {
  uint32_t off = check_range(t, p, n, n, "cp.async destination");
  on_write(t, off, n, true);
  return off;
}

void SharedMemory::end_async_write(const Thread &t, uint32_t offset, size_t n, const void *src) {
  const uint32_t g_end = (uint32_t)((offset + n + 1) / 2);
  const uint32_t mark = races_ ? ((epoch(t.warp) + 1) << 5) | (uint32_t)t.warp : 0;
  for (uint32_t g = offset / 2; g < g_end; ++g) {
    in_flight_[g] = 0;
    if (races_) last_write_[g] = mark;
  }
  if (src) {
    memcpy(base_ + offset, src, n);
  } else {
    memset(base_ + offset, 0, n);
  }
}

void SharedMemory::barrier(uint32_t warp_mask) {
  // Each participant ends its epoch, then all adopt the join of their clocks: everything any of them did
  // before the barrier now happens-before everything any of them does after it. (Epochs are packed into 27
  // bits in last_write_: a block would need 2^27 barriers to wrap them.)
  uint32_t join[kMaxWarps] = {};
  for (int w = 0; w < warps_; ++w) {
    if (!(warp_mask >> w & 1)) continue;
    uint32_t *c = &clock_[(size_t)w * warps_];
    c[w] += 1;
    for (int o = 0; o < warps_; ++o) join[o] = c[o] > join[o] ? c[o] : join[o];
  }
  for (int w = 0; w < warps_; ++w) {
    if (warp_mask >> w & 1) memcpy(&clock_[(size_t)w * warps_], join, sizeof(uint32_t) * (size_t)warps_);
  }
}

} // namespace detail

using namespace detail;

unsigned char *dynamic_smem() { return current_launch().shared.base(); }

void shared_load(void *dst, const void *smem, size_t bytes) {
  Launch &l = current_launch();
  l.shared.load(*l.current, dst, smem, bytes);
  l.counters.shared_bytes_read += bytes;
  count_load(*l.current);
}

void shared_store(void *smem, const void *src, size_t bytes) {
  Launch &l = current_launch();
  l.shared.store(*l.current, smem, src, bytes);
  l.counters.shared_bytes_written += bytes;
}

} // namespace emu
} // namespace fa
