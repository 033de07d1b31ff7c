// Checked global-memory access: loads, stores and atomics (see global_memory.h).
#include "global_memory.h"

#include <stdio.h>
#include <string.h>

#include "launch.h"

namespace fa {
namespace emu {
namespace detail {

static const char *region_name(const FaEmuRegion &r) { return r.name && r.name[0] ? r.name : "(unnamed)"; }

bool GlobalMemory::set_regions(const FaEmuRegion *regions, int count, const char **why) {
  regions_.clear();
  last_hit_ = 0;
  overlapping_ = false;
  if (count < 0 || (count > 0 && !regions)) {
    *why = "FaEmuLaunch.regions is null or num_regions is negative";
    return false;
  }
  if (count > FA_EMU_MAX_REGIONS) {
    *why = "FaEmuLaunch lists more than FA_EMU_MAX_REGIONS (32) buffers: the cost counters have no slot for them";
    return false;
  }
  regions_.assign(regions, regions + count);
  for (size_t i = 0; i < regions_.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      const uintptr_t a = (uintptr_t)regions_[i].base, b = (uintptr_t)regions_[j].base;
      if (a < b + regions_[j].bytes && b < a + regions_[i].bytes) overlapping_ = true;
    }
  }
  return true;
}

static bool contains(const FaEmuRegion &r, uintptr_t a, size_t n) {
  uintptr_t b = (uintptr_t)r.base;
  return a >= b && n <= r.bytes && a - b <= r.bytes - n;
}

const FaEmuRegion *GlobalMemory::find(const void *p) const {
  for (const FaEmuRegion &r : regions_) {
    if (contains(r, (uintptr_t)p, 1)) return &r;
  }
  return nullptr;
}

size_t GlobalMemory::check(const Thread &t, const void *p, size_t n, size_t align, bool write, const char *what) {
  uintptr_t a = (uintptr_t)p;
  char where[256];
  if (a % align != 0) {
    describe(p, n, where, sizeof where);
    fault(t, "misaligned %s of %zu bytes at address %s: the GPU requires %zu-byte alignment", what, n, where,
          align);
  }
  if (!overlapping_ && last_hit_ < regions_.size()) {
    const FaEmuRegion &r = regions_[last_hit_];
    if (contains(r, a, n) && (!write || r.writable)) return last_hit_;
  }
  // Regions may overlap (two views of one buffer): the first region that contains the access and allows it.
  const FaEmuRegion *read_only = nullptr;
  for (size_t i = 0; i < regions_.size(); ++i) {
    if (!contains(regions_[i], a, n)) continue;
    if (!write || regions_[i].writable) {
      last_hit_ = i;
      return i;
    }
    read_only = &regions_[i];
  }
  describe(p, n, where, sizeof where);
  if (read_only) fault(t, "%s of %zu bytes to read-only buffer %s at address %s", what, n, region_name(*read_only), where);
  fault(t, "out-of-bounds %s of %zu bytes at address %s", what, n, where);
}

void GlobalMemory::describe(const void *p, size_t n, char *buf, size_t len) const {
  uintptr_t a = (uintptr_t)p;
  int k = snprintf(buf, len, "%#llx", (unsigned long long)a);
  if (k < 0 || (size_t)k >= len) return;
  buf += k;
  len -= (size_t)k;
  // The first 64 KiB are never mapped: an address there is a null pointer plus an offset.
  if (a < 65536) {
    snprintf(buf, len, a == 0 ? " (null pointer)" : " (null pointer + %llu)", (unsigned long long)a);
    return;
  }
  // Inside a region, or straddling its end.
  for (const FaEmuRegion &r : regions_) {
    uintptr_t b = (uintptr_t)r.base;
    if (a >= b && a - b < r.bytes) {
      if (n > r.bytes - (a - b)) {
        snprintf(buf, len, " (%s+%llu: the access runs %llu bytes past the end of %s, %llu bytes)", region_name(r),
                 (unsigned long long)(a - b), (unsigned long long)(n - (r.bytes - (a - b))), region_name(r),
                 (unsigned long long)r.bytes);
      } else {
        snprintf(buf, len, " (%s+%llu)", region_name(r), (unsigned long long)(a - b));
      }
      return;
    }
  }
  // Outside every region: relative to the nearest one.
  const FaEmuRegion *nearest = nullptr;
  uintptr_t best = UINTPTR_MAX;
  bool after = false;
  for (const FaEmuRegion &r : regions_) {
    uintptr_t b = (uintptr_t)r.base, e = b + r.bytes;
    uintptr_t d = a >= e ? a - e : b - a;
    if (d < best) {
      best = d;
      nearest = &r;
      after = a >= e;
    }
  }
  // Beyond this distance "the nearest buffer" says nothing useful about where the pointer came from.
  constexpr uintptr_t kNear = (uintptr_t)1 << 30;
  if (!nearest) {
    snprintf(buf, len, " (the launch lists no buffers)");
  } else if (best >= kNear) {
    snprintf(buf, len, " (not in or near any buffer of the launch)");
  } else if (after && best == 0) {
    snprintf(buf, len, " (%s+%llu: just past the end of %s, %llu bytes; no buffer of the launch there)",
             region_name(*nearest), (unsigned long long)nearest->bytes, region_name(*nearest),
             (unsigned long long)nearest->bytes);
  } else if (after) {
    snprintf(buf, len, " (%s+%llu: %llu bytes past the end of %s, %llu bytes; no buffer of the launch there)",
             region_name(*nearest), (unsigned long long)(a - (uintptr_t)nearest->base), (unsigned long long)best,
             region_name(*nearest), (unsigned long long)nearest->bytes);
  } else {
    snprintf(buf, len, " (%s-%llu: before the start of %s; no buffer of the launch there)", region_name(*nearest),
             (unsigned long long)best, region_name(*nearest));
  }
}

} // namespace detail

using namespace detail;

void global_load(void *dst, const void *gmem, size_t bytes) {
  Launch &l = current_launch();
  const size_t r = l.global.check(*l.current, gmem, bytes, natural_alignment(bytes), false, "global load");
  l.counters.global_bytes_read[r] += bytes;
  l.counters.global_loads[r] += 1;
  count_load(*l.current);
  memcpy(dst, gmem, bytes);
}

void global_store(void *gmem, const void *src, size_t bytes) {
  Launch &l = current_launch();
  const size_t r = l.global.check(*l.current, gmem, bytes, natural_alignment(bytes), true, "global store");
  l.counters.global_bytes_written[r] += bytes;
  memcpy(gmem, src, bytes);
}

// An atomic read-modify-write of 4 bytes counts as a 4-byte read and a 4-byte write.
static void count_atomic(Launch &l, size_t region) {
  l.counters.global_bytes_read[region] += 4;
  l.counters.global_bytes_written[region] += 4;
}

// atom.add.f32 flushes subnormal inputs and results to sign-preserving zero (PTX ISA, atom).
static float flush_subnormal(float x) {
  uint32_t bits;
  memcpy(&bits, &x, 4);
  if ((bits & 0x7f800000u) == 0) bits &= 0x80000000u;
  memcpy(&x, &bits, 4);
  return x;
}

// Blocks run one after another and fibers switch only at collectives, so an atomic cannot interleave with
// another thread of the same launch; the __atomic builtins still make it atomic against other host threads.
float atomic_add_f32(float *p, float v) {
  Launch &l = current_launch();
  count_atomic(l, l.global.check(*l.current, p, 4, 4, true, "atomic add"));
  uint32_t old_bits = __atomic_load_n((uint32_t *)p, __ATOMIC_RELAXED);
  for (;;) {
    float old;
    memcpy(&old, &old_bits, 4);
    float sum = flush_subnormal(flush_subnormal(old) + flush_subnormal(v));
    uint32_t new_bits;
    memcpy(&new_bits, &sum, 4);
    if (__atomic_compare_exchange_n((uint32_t *)p, &old_bits, new_bits, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
      return old;
  }
}

int atomic_add_i32(int *p, int v) {
  Launch &l = current_launch();
  count_atomic(l, l.global.check(*l.current, p, 4, 4, true, "atomic add"));
  // Two's-complement wrap-around, as the GPU's atom.add.s32.
  return (int)__atomic_fetch_add((uint32_t *)p, (uint32_t)v, __ATOMIC_RELAXED);
}

} // namespace emu
} // namespace fa
