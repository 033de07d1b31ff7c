// Shared memory: bounds, poison, cp.async in-flight marks and race detection (see shared_memory.h).
#include "shared_memory.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "launch.h"

namespace fa {
namespace emu {
namespace detail {

// The allocation is 1024-byte aligned with 1024 spare bytes, so that the block's dynamic shared memory can
// start at any multiple of 128 past a 1024-byte boundary (its host address and its shared window address
// then agree modulo 1024, as swizzle patterns and alignment checks need).
constexpr size_t kSmemAlign = 1024;
// The poison of a block's shared memory at its start, one of three 4-byte patterns chosen by the block's seed
// (bytes in address order), each non-finite in every element type a kernel reads, so that a read of a byte
// nobody wrote shows up in the output whatever the code does with it:
//  - FF FF FF FF: NaN as fp16, bf16, fp32, E4M3 and E5M2;
//  - 00 7C 80 7F: fp16 +Inf, NaN; bf16 2.6e36, +Inf; fp32 NaN; FP8 0, E5M2 +Inf / E4M3 384, -0, NaN;
//  - 00 FC 80 FF: the same with the sign set (-Inf): a -Inf key scores like a masked one, and a NaN can
//    vanish in fmaxf, so NaN alone could hide a bug that an infinity shows (0 · Inf is NaN).
constexpr uint32_t kPoisonPatterns[3] = {0xFFFFFFFFu, 0x7F807C00u, 0xFF80FC00u};
constexpr size_t kReaderNames = 1024;

SharedMemory::~SharedMemory() { free(alloc_); }

bool SharedMemory::allocate(int bytes, int num_warps, bool race_detection) {
  bytes_ = bytes;
  warps_ = num_warps;
  races_ = race_detection;
  size_t total = ((size_t)bytes + 2 * kSmemAlign - 1) / kSmemAlign * kSmemAlign;
  if (posix_memalign((void **)&alloc_, kSmemAlign, total) != 0) {
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
    async_done_.assign(granules * (size_t)num_warps, 0);
  }
  clock_.assign((size_t)num_warps * num_warps, 0);
  async_reads_.assign(granules, 0);
  async_reader_.assign(granules, 0);
  generic_write_.assign(granules, 0);
  special_.assign(granules, 0);
  proxy_fences_.assign((size_t)num_warps, 0);
  reader_names_.assign(kReaderNames, std::vector<char>(160, 0));
  return true;
}

void SharedMemory::reset_block(uint64_t placement_seed) {
  phase_ = (uint32_t)(128 * (1 + placement_seed % 7));
  placed_ = false;
  base_ = alloc_ + phase_;
  // A different mix of the seed than the placement's, so that every placement meets every pattern.
  const uint32_t pattern = kPoisonPatterns[(placement_seed >> 17) % 3];
  const size_t words = ((size_t)bytes_ + kSmemAlign + 3) / 4; // inside the allocation (1024-byte multiples)
  for (size_t i = 0; i < words; ++i) memcpy(alloc_ + 4 * i, &pattern, 4);
  std::fill(in_flight_.begin(), in_flight_.end(), 0);
  std::fill(last_write_.begin(), last_write_.end(), 0);
  std::fill(last_read_.begin(), last_read_.end(), 0);
  std::fill(async_done_.begin(), async_done_.end(), 0);
  any_async_done_ = false;
  std::fill(clock_.begin(), clock_.end(), 0);
  std::fill(async_reads_.begin(), async_reads_.end(), 0);
  std::fill(generic_write_.begin(), generic_write_.end(), 0);
  std::fill(special_.begin(), special_.end(), 0);
  std::fill(proxy_fences_.begin(), proxy_fences_.end(), 0);
}

unsigned char *SharedMemory::place(const Thread &t, int alignment) {
  if (!placed_) {
    placed_ = true;
    if (alignment >= (int)kSmemAlign) {
      phase_ = 0;
      base_ = alloc_;
    }
  }
  if (phase_ % (uint32_t)alignment != 0) {
    fault(t,
          "dynamic shared memory requested with %d-byte alignment, but this block already placed it at shared "
          "window address %#x (an earlier dynamic_smem() call asked for less): ask for the same alignment "
          "everywhere",
          alignment, window_address(0));
  }
  return base_;
}

uint32_t SharedMemory::check_range(const Thread &t, const void *p, size_t n, size_t align, const char *what) {
  if (!placed_) place(t, 128); // a pointer into shared memory not derived from dynamic_smem()
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

void SharedMemory::report_race(const Thread &t, int warp, uint32_t offset, const char *access, int other_warp,
                               const char *other_access) {
  fault(t,
        "data race on shared memory at address %#llx (shared+%u): warp %d%s bytes that warp %d %s, with no "
        "barrier ordering the two accesses (missing __syncthreads?)",
        (unsigned long long)((uintptr_t)base_ + offset), offset, warp, access, other_warp, other_access);
}

// An access to bytes a cp.async has not landed yet. If a barrier orders the issue before this access, the
// issuer's missing wait is the bug; if nothing orders them, the access races with the copy itself.
void SharedMemory::report_in_flight(const Thread &t, uint32_t g, const char *access) {
  if (in_flight_[g] & kTmaInFlight) {
    const Launch &l = current_launch();
    const TmaLoad &c = l.tma_loads[in_flight_[g] & ~kTmaInFlight];
    const int issuer_warp = c.issuer / kWarpSize;
    const unsigned long long addr = (unsigned long long)((uintptr_t)base_ + 2 * g);
    if (races_ && issuer_warp != t.warp && in_flight_epoch_[g] >= knows(t.warp, issuer_warp)) {
      fault(t,
            "data race on shared memory at address %#llx (shared+%u): warp %d%s bytes that thread %d's TMA load "
            "(%u bytes to shared+%u) writes, with no barrier or mbarrier ordering the two accesses (a stage "
            "refilled while still in use: missing empty-barrier wait?)",
            addr, 2 * g, t.warp, access, c.issuer, c.box.bytes, c.box.smem_offset);
    }
    fault(t,
          "warp %d%s shared memory at address %#llx (shared+%u) with a TMA load in flight: thread %d's "
          "cp.async.bulk.tensor (%u bytes to shared+%u) completes on the mbarrier at shared+%u, whose phase this "
          "warp has not waited for (missing mbarrier_wait?)",
          t.warp, access, addr, 2 * g, c.issuer, c.box.bytes, c.box.smem_offset, c.bar);
  }
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

void SharedMemory::check_not_mbarrier(const Thread &t, uint32_t offset, size_t n, const char *what) {
  const uint32_t g_end = (uint32_t)((offset + n + 1) / 2);
  for (uint32_t g = offset / 2; g < g_end; ++g) {
    if (special_[g] & kMbarrierGranule) {
      fault(t,
            "%s of %zu bytes at address %#llx (shared+%u) touches the mbarrier object at shared+%u: an initialised "
            "mbarrier may only be accessed through the mbarrier intrinsics",
            what, n, (unsigned long long)((uintptr_t)base_ + offset), offset, (2 * g) & ~7u);
    }
  }
}

// The race checks below run for every 2-byte granule of every shared access: the emulator's second hottest
// path. Warp w's clock row (what it knows of each warp) is the same for all granules of one access, so it
// is read once; each granule is first screened with branch-free comparisons over the warps, and only a
// granule that fails the screen takes the ordered checks, which report the first violation in the order
// they always did (the same message).
void SharedMemory::on_read(const Thread &t, uint32_t offset, size_t n) {
  const int w = t.warp;
  const uint32_t *kn = &clock_[(size_t)w * warps_];
  const uint32_t read_mark = kn[w] + 1; // epoch(w) + 1
  const uint32_t g_end = (uint32_t)((offset + n + 1) / 2);
  for (uint32_t g = offset / 2; g < g_end; ++g) {
    if (in_flight_[g]) report_in_flight(t, g, " reads");
    if (!races_) continue;
    uint32_t wr = last_write_[g];
    if (wr) {
      int writer = (int)(wr & 31);
      if (writer != w && (wr >> 5) - 1 >= kn[writer]) report_race(t, t.warp, 2 * g, " reads", writer, "wrote");
    }
    last_read_[(size_t)g * warps_ + w] = read_mark;
  }
}

void SharedMemory::on_write(const Thread &t, uint32_t offset, size_t n, uint16_t in_flight_mark) {
  const int w = t.warp;
  const bool async = in_flight_mark != 0;
  const uint32_t *kn = &clock_[(size_t)w * warps_];
  const uint32_t write_mark = ((kn[w] + 1) << 5) | (uint32_t)w; // (epoch(w) + 1) << 5 | w
  const uint32_t g_end = (uint32_t)((offset + n + 1) / 2);
  const char *access = !async ? " writes" : (in_flight_mark & kTmaInFlight) ? "'s TMA load writes" : "'s cp.async writes";
  for (uint32_t g = offset / 2; g < g_end; ++g) {
    if (in_flight_[g]) report_in_flight(t, g, access);
    if (async_reads_[g]) report_async_read(t, g, access);
    if (races_) {
      uint32_t wr = last_write_[g];
      if (wr) {
        int writer = (int)(wr & 31);
        if (writer != w && (wr >> 5) - 1 >= kn[writer]) report_race(t, t.warp, 2 * g, access, writer, "also wrote");
      }
      const uint32_t *reads = &last_read_[(size_t)g * warps_];
      // Screen: a read unordered before this write (reads[r] = epoch + 1 > what w knows of r).
      bool suspect = false;
      for (int r = 0; r < warps_; ++r) suspect |= (r != w) & (reads[r] > kn[r]);
      if (suspect) {
        for (int r = 0; r < warps_; ++r) {
          if (r != w && reads[r] && reads[r] - 1 >= kn[r]) report_race(t, t.warp, 2 * g, access, r, "read");
        }
      }
      // Completed wgmma reads, per warpgroup: ordered after any one of the warps that observed it (none
      // until a block's first wgmma_wait: skipped, and their memory not touched, before that).
      if (any_async_done_) {
        const uint32_t *done = &async_done_[(size_t)g * warps_];
        for (int g0 = 0; g0 < warps_; g0 += 4) {
          int seen = -1;
          bool ordered = false;
          for (int r = g0; r < g0 + 4 && r < warps_; ++r) {
            if (!done[r]) continue;
            if (seen < 0) seen = r;
            ordered = ordered || r == w || done[r] - 1 < kn[r];
          }
          if (seen >= 0 && !ordered) {
            report_race(t, t.warp, 2 * g, access, seen,
                        "and its warpgroup read through a wgmma (complete at their wgmma_wait; no release by any of "
                        "them orders it before this access: missing empty-barrier arrive?)");
          }
        }
      }
      if (!async) last_write_[g] = write_mark;
    }
    if (async) {
      in_flight_[g] = in_flight_mark;
      in_flight_epoch_[g] = kn[w];
    } else {
      generic_write_[g] = ((proxy_fences_[(size_t)w] + 1) << 5) | (uint32_t)w;
    }
  }
}

void SharedMemory::load(const Thread &t, void *dst, const void *p, size_t n) {
  uint32_t off = check_range(t, p, n, natural_alignment(n), "shared load");
  check_not_mbarrier(t, off, n, "shared load");
  on_read(t, off, n);
  memcpy(dst, base_ + off, n);
}

void SharedMemory::store(const Thread &t, void *p, const void *src, size_t n) {
  uint32_t off = check_range(t, p, n, natural_alignment(n), "shared store");
  check_not_mbarrier(t, off, n, "shared store");
  on_write(t, off, n, 0);
  memcpy(base_ + off, src, n);
}

void SharedMemory::collective_read(const Thread &t, void *dst, const void *p, size_t n, const char *what) {
  uint32_t off = check_range(t, p, n, 16, what);
  check_not_mbarrier(t, off, n, what);
  on_read(t, off, n);
  memcpy(dst, base_ + off, n);
}

uint32_t SharedMemory::begin_async_write(const Thread &t, void *p, size_t n) {
  uint32_t off = check_range(t, p, n, n, "cp.async destination");
  check_not_mbarrier(t, off, n, "cp.async destination");
  on_write(t, off, n, (uint16_t)(t.tid + 1));
  return off;
}

void SharedMemory::end_async_write(const Thread &t, uint32_t offset, size_t n, const void *src) {
  const uint32_t g_end = (uint32_t)((offset + n + 1) / 2);
  const uint32_t mark = races_ ? ((epoch(t.warp) + 1) << 5) | (uint32_t)t.warp : 0;
  for (uint32_t g = offset / 2; g < g_end; ++g) {
    in_flight_[g] = 0;
    if (races_) last_write_[g] = mark;
    generic_write_[g] = ((proxy_fences_[(size_t)t.warp] + 1) << 5) | (uint32_t)t.warp; // cp.async: generic proxy
  }
  if (src) {
    memcpy(base_ + offset, src, n);
  } else {
    memset(base_ + offset, 0, n);
  }
}

void SharedMemory::barrier(uint32_t warp_mask, const uint32_t *released) {
  // Each participant ends its epoch, then all adopt the join of their clocks: everything any of them did
  // before the barrier now happens-before everything any of them does after it. (Epochs are packed into 27
  // bits in last_write_: a block would need 2^27 barriers to wrap them.)
  uint32_t join[kMaxWarps] = {};
  if (released) memcpy(join, released, sizeof(uint32_t) * (size_t)warps_);
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

// ------------------------------------------------------------------------------------------------ sm_90

void SharedMemory::release(int w, uint32_t *into) {
  const uint32_t *c = &clock_[(size_t)w * warps_];
  for (int o = 0; o < warps_; ++o) into[o] = c[o] > into[o] ? c[o] : into[o];
  // Everything w did in its current epoch is covered; what it does next is not.
  if (into[w] < c[w] + 1) into[w] = c[w] + 1;
  clock_[(size_t)w * warps_ + w] += 1;
}

void SharedMemory::acquire(int w, const uint32_t *from) {
  uint32_t *c = &clock_[(size_t)w * warps_];
  for (int o = 0; o < warps_; ++o) {
    // A warp's own epoch is its own business: only its knowledge of the others grows.
    if (o != w && from[o] > c[o]) c[o] = from[o];
  }
}

void SharedMemory::async_proxy_read(const Thread &t, uint32_t offset, size_t n, uint32_t warp_mask, const char *what,
                                    bool check_fence, Record record) {
  check_not_mbarrier(t, offset, n, what);
  const uint32_t g_end = (uint32_t)((offset + n + 1) / 2);
  for (uint32_t g = offset / 2; g < g_end; ++g) {
    if (in_flight_[g]) report_in_flight(t, g, " reads (through the async proxy)");
    const uint32_t gw = generic_write_[g];
    if (check_fence && gw && (gw >> 5) - 1 == proxy_fences_[gw & 31]) {
      fault(t,
            "%s at address %#llx (shared+%u) reads bytes warp %d wrote with ordinary stores (the generic proxy) "
            "and has not fenced since: the async proxy may read stale data (missing fence_proxy_async() after the "
            "stores, before the barrier?)",
            what, (unsigned long long)((uintptr_t)base_ + 2 * g), 2 * g, (int)(gw & 31));
    }
    if (!races_) continue;
    // The warps of the mask in increasing order (a race reports the lowest one, as a plain loop would).
    const uint32_t wr = last_write_[g];
    const int writer = (int)(wr & 31);
    for (uint32_t m = warp_mask & (warps_ >= 32 ? ~0u : (1u << warps_) - 1); m; m &= m - 1) {
      const int w = __builtin_ctz(m);
      if (wr && writer != w && (wr >> 5) - 1 >= knows(w, writer)) {
        char access[96];
        snprintf(access, sizeof access, "'s %s", what);
        report_race(t, w, 2 * g, access, writer, "wrote");
      }
      if (record == Record::Issuer) last_read_[(size_t)g * warps_ + w] = epoch(w) + 1;
      if (record == Record::Completed) {
        async_done_[(size_t)g * warps_ + w] = epoch(w) + 1;
        any_async_done_ = true;
      }
    }
  }
}

void SharedMemory::mark_async_read(uint32_t offset, size_t n, uint32_t id, int delta) {
  const uint32_t g_end = (uint32_t)((offset + n + 1) / 2);
  for (uint32_t g = offset / 2; g < g_end; ++g) {
    async_reads_[g] = (uint16_t)(async_reads_[g] + delta);
    if (delta > 0) async_reader_[g] = id;
  }
}

void SharedMemory::name_async_reader(uint32_t id, const char *text) {
  std::vector<char> &slot = reader_names_[id % kReaderNames];
  snprintf(slot.data(), slot.size(), "%s", text);
}

void SharedMemory::report_async_read(const Thread &t, uint32_t g, const char *access) {
  fault(t,
        "warp %d%s shared memory at address %#llx (shared+%u) while %s still reads it (wait for it to complete "
        "before overwriting: wgmma_wait / tma_store_wait)",
        t.warp, access, (unsigned long long)((uintptr_t)base_ + 2 * g), 2 * g,
        reader_names_[async_reader_[g] % kReaderNames].data());
}

void SharedMemory::begin_tma_write(const Thread &t, uint32_t offset, size_t n, uint32_t slot) {
  check_not_mbarrier(t, offset, n, "TMA load destination");
  on_write(t, offset, n, (uint16_t)(kTmaInFlight | slot));
}

void SharedMemory::end_tma_write(uint32_t offset, size_t n, int warp, uint32_t issue_epoch) {
  const uint32_t g_end = (uint32_t)((offset + n + 1) / 2);
  const uint32_t mark = ((issue_epoch + 1) << 5) | (uint32_t)warp;
  for (uint32_t g = offset / 2; g < g_end; ++g) {
    in_flight_[g] = 0;
    if (races_) last_write_[g] = mark;
    generic_write_[g] = 0; // written by the async proxy: no fence needed before the async proxy reads it
  }
}

void SharedMemory::mark_mbarrier(uint32_t offset, bool on) {
  for (uint32_t g = offset / 2; g < offset / 2 + 4; ++g) {
    special_[g] = on ? (uint8_t)(special_[g] | kMbarrierGranule) : (uint8_t)(special_[g] & ~kMbarrierGranule);
  }
}

} // namespace detail

using namespace detail;

unsigned char *dynamic_smem() {
  Launch &l = current_launch();
  return l.shared.place(*l.current, 128);
}

unsigned char *dynamic_smem_aligned(int alignment) {
  Launch &l = current_launch();
  if (alignment != 128 && alignment != 1024) {
    fault(*l.current, "dynamic_smem_aligned(%d): the alignments are 128 and 1024", alignment);
  }
  return l.shared.place(*l.current, alignment);
}

void check_smem_aligned_1024(const void *smem) {
  Launch &l = current_launch();
  const uint32_t off = l.shared.check_range(*l.current, smem, 1, 1, "check_smem_aligned_1024");
  const uint32_t a = l.shared.window_address(off);
  if (a % 1024 != 0) {
    fault(*l.current,
          "the dynamic shared memory starts at shared window address %#x, not on a 1024-byte boundary: the "
          "kernel's 128B-swizzled tiles and descriptors assume it (the GPU build traps here)",
          a);
  }
}

uint32_t shared_address(const void *smem) {
  Launch &l = current_launch();
  const uint32_t off = l.shared.check_range(*l.current, smem, 1, 1, "shared address conversion");
  return l.shared.window_address(off);
}

void shared_load(void *dst, const void *smem, size_t bytes, SharedSite site) {
  Launch &l = current_launch();
  l.shared.load(*l.current, dst, smem, bytes);
  l.counters.shared_bytes_read += bytes;
  record_shared_access(l, *l.current, site, (uint32_t)((const unsigned char *)smem - l.shared.base()), (uint32_t)bytes);
  count_load(*l.current);
}

void shared_store(void *smem, const void *src, size_t bytes, SharedSite site) {
  Launch &l = current_launch();
  l.shared.store(*l.current, smem, src, bytes);
  l.counters.shared_bytes_written += bytes;
  record_shared_access(l, *l.current, site, (uint32_t)((const unsigned char *)smem - l.shared.base()), (uint32_t)bytes);
}

} // namespace emu
} // namespace fa
