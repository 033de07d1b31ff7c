// Global memory as the emulator sees it: only the buffers the caller listed in FaEmuLaunch.regions exist.
// Every global access (loads, stores, cp.async sources, atomics) is checked to lie inside one region
// (writable for stores) and to be aligned as the GPU requires, and a violation is reported with the
// address described relative to the buffers ("o+4096, the first byte past the end of o (4096 bytes)").
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <vector>

#include "fa/abi.h"

namespace fa {
namespace emu {
namespace detail {

struct Thread;

// The alignment the GPU requires of an n-byte access: its largest power-of-two factor, at most 16
// (a 12-byte struct is moved as three 4-byte words).
inline size_t natural_alignment(size_t n) {
  size_t a = n & (~n + 1);
  return a > 16 ? 16 : (a == 0 ? 1 : a);
}

class GlobalMemory {
public:
  // Copies the region list; false (with `why`) if it is malformed.
  bool set_regions(const FaEmuRegion *regions, int count, const char **why);

  // Faults unless [p, p + n) lies in one region, writable if `write`, and p is `align`-aligned. Returns
  // the index of the region the access is attributed to: the first in list order that contains it and
  // allows it (so overlapping views of one buffer are counted deterministically).
  // `what` names the access for the message ("global load", "cp.async source", ...).
  size_t check(const Thread &t, const void *p, size_t n, size_t align, bool write, const char *what);

  // "0x7f3a12340000 (q+128)" or a description of where the address lies relative to the nearest buffer.
  void describe(const void *p, size_t n, char *buf, size_t len) const;

  // The region containing p, or null.
  const FaEmuRegion *find(const void *p) const;

private:
  std::vector<FaEmuRegion> regions_;
  size_t last_hit_ = 0;     // accesses cluster: try the previous region first ...
  bool overlapping_ = false; // ... unless two regions overlap, where only the first match is the right one
};

} // namespace detail
} // namespace emu
} // namespace fa
