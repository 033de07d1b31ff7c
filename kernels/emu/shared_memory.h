// The running block's shared memory and every check on it:
//  - bounds [0, smem_bytes) and the alignment the GPU requires (natural for loads/stores, 16 bytes for
//    ldmatrix rows, the copy size for cp.async);
//  - poison: 0xFF bytes at block start (0xFFFF is NaN in fp16 and bf16, 0xFFFFFFFF in fp32), so reading
//    what nobody wrote shows up as NaN instead of as a plausible stale value;
//  - cp.async in flight: the bytes an issued cp.async will write are marked until a wait completes it, and
//    any access to them is a fault (the missing-wait bug becomes deterministic instead of timing-dependent);
//  - data races: a cross-warp read-after-write, write-after-read or write-after-write on the same bytes with
//    no barrier ordering the two accesses is a fault naming both warps. Happens-before comes only from
//    barriers (and program order within a warp), tracked as one vector clock per warp: a barrier advances
//    each participant's epoch and joins the participants' clocks, so a named barrier orders only the warps
//    that took part in it. Shadow state per 2-byte granule (exact for fp16/bf16 and wider elements; a 1-byte
//    access is checked as its whole granule): the last write as (warp, epoch) and each warp's last read
//    epoch, FastTrack-style, so each check is O(1) per granule for reads and O(warps) for writes.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <vector>

namespace fa {
namespace emu {
namespace detail {

struct Thread;

class SharedMemory {
public:
  SharedMemory() = default;
  SharedMemory(const SharedMemory &) = delete;
  SharedMemory &operator=(const SharedMemory &) = delete;
  ~SharedMemory();

  // Sizes everything once per launch; false if the host is out of memory.
  bool allocate(int bytes, int num_warps, bool race_detection);
  // Block start: poison the bytes, forget every access and in-flight copy, restart the clocks.
  void reset_block();

  unsigned char *base() const { return base_; }
  int bytes() const { return bytes_; }

  // A thread's own load / store (ld_shared / st_shared).
  void load(const Thread &t, void *dst, const void *p, size_t n);
  void store(const Thread &t, void *p, const void *src, size_t n);
  // A read done by a warp collective on behalf of `t`'s warp (an ldmatrix row); `t` supplied the address.
  void collective_read(const Thread &t, void *dst, const void *p, size_t n, const char *what);

  // cp.async: at issue, checks the destination and marks its bytes in flight (returns its offset); at
  // completion, lands the data (`src`, or zeros when null) as a write by `t`'s warp in its current epoch.
  uint32_t begin_async_write(const Thread &t, void *p, size_t n);
  void end_async_write(const Thread &t, uint32_t offset, size_t n, const void *src);

  // A barrier among the warps in `warp_mask` completed.
  void barrier(uint32_t warp_mask);

private:
  uint32_t check_range(const Thread &t, const void *p, size_t n, size_t align, const char *what);
  void on_read(const Thread &t, uint32_t offset, size_t n);
  void on_write(const Thread &t, uint32_t offset, size_t n, bool async);
  // `access` continues "warp N" directly: " reads", " writes", "'s cp.async writes".
  [[noreturn]] void report_race(const Thread &t, uint32_t offset, const char *access, int other_warp,
                                const char *other_access);
  [[noreturn]] void report_in_flight(const Thread &t, uint32_t granule, const char *access);
  uint32_t epoch(int warp) const { return clock_[(size_t)warp * warps_ + warp]; }
  uint32_t knows(int warp, int other) const { return clock_[(size_t)warp * warps_ + other]; }

  unsigned char *alloc_ = nullptr;
  unsigned char *base_ = nullptr;
  int bytes_ = 0;
  int warps_ = 0;
  bool races_ = true;
  std::vector<uint32_t> last_write_; // per granule: 0, or (epoch + 1) << 5 | warp
  std::vector<uint32_t> last_read_;  // per granule and warp: 0, or epoch + 1
  std::vector<uint16_t> in_flight_;  // per granule: 0, or 1 + tid of the thread whose cp.async will write it
  std::vector<uint32_t> in_flight_epoch_; // per granule: the issuing warp's epoch at issue
  std::vector<uint32_t> clock_;      // warps x warps; row w is warp w's vector clock, [w][w] its epoch
};

} // namespace detail
} // namespace emu
} // namespace fa
