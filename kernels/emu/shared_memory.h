// The running block's shared memory and every check on it:
//  - bounds [0, smem_bytes) and the alignment the GPU requires (natural for loads/stores, 16 bytes for
//    ldmatrix rows, the copy size for cp.async);
//  - poison: at block start every byte is one of three seeded NaN / ±Inf patterns (non-finite in fp16, bf16,
//    fp32 and both FP8 formats; shared_memory.cpp), so reading what nobody wrote shows up as NaN or Inf
//    instead of as a plausible stale value;
//  - cp.async in flight: the bytes an issued cp.async will write are marked until a wait completes it, and
//    any access to them is a fault (the missing-wait bug becomes deterministic instead of timing-dependent);
//  - data races: a cross-warp read-after-write, write-after-read or write-after-write on the same bytes with
//    no barrier ordering the two accesses is a fault naming both warps. Happens-before comes only from
//    barriers (and program order within a warp), tracked as one vector clock per warp: a barrier advances
//    each participant's epoch and joins the participants' clocks, so a named barrier orders only the warps
//    that took part in it. Shadow state per 2-byte granule (exact for fp16/bf16 and wider elements; a 1-byte
//    access is checked as its whole granule): the last write as (warp, epoch) and each warp's last read
//    epoch, FastTrack-style, so each check is O(1) per granule for reads and O(warps) for writes.
//    mbarriers add release/acquire edges (an arrive releases the arriving warp's clock to the phase; a wait
//    that observes the phase acquires it), and so does bar.arrive (released to the warps that bar.sync).
//  - sm_90: the bytes an in-flight wgmma or TMA store reads are marked until it completes, and any write to
//    them is a fault; TMA loads mark their destination in flight like cp.async; each granule remembers
//    whether its last write came through the generic proxy (st_shared, cp.async) and whether the writing
//    warp has executed fence.proxy.async since, so the async proxy (wgmma, TMA store) reading unfenced bytes
//    is a fault; mbarrier objects may only be touched through the mbarrier intrinsics.
//  - placement: the block's dynamic shared memory starts at a seeded multiple of 128 bytes past a 1024-byte
//    boundary (never on one), unless the kernel asks for 1024-byte alignment (dynamic_smem_aligned), so code
//    that silently assumes the 1024-byte alignment swizzled TMA and wgmma tiles need fails in emulation.
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
  // Block start: poison the bytes, forget every access and in-flight copy, restart the clocks; the dynamic
  // allocation will start 128 * (1 + placement_seed % 7) bytes past a 1024-byte boundary unless the first
  // request for it asks for 1024-byte alignment.
  void reset_block(uint64_t placement_seed);
  // The block's dynamic shared memory for a kernel that requires `alignment` (128 or 1024) of it; the
  // first call of a block fixes the placement. Faults if an earlier call placed it less aligned.
  unsigned char *place(const Thread &t, int alignment);

  unsigned char *base() const { return base_; }
  int bytes() const { return bytes_; }
  // Shared window addresses (what cvta.to.shared gives, and what descriptors and the swizzle patterns use):
  // the dynamic allocation starts at kWindowBase + its placement offset.
  static constexpr uint32_t kWindowBase = 1024;
  uint32_t window_address(uint32_t offset) const { return kWindowBase + phase_ + offset; }
  uint32_t offset_of_window(uint32_t address) const { return address - kWindowBase - phase_; }
  // Checks [p, p + n) is in bounds and `align`-aligned; returns its offset. `what` names the access.
  uint32_t check_range(const Thread &t, const void *p, size_t n, size_t align, const char *what);

  // A thread's own load / store (ld_shared / st_shared).
  void load(const Thread &t, void *dst, const void *p, size_t n);
  void store(const Thread &t, void *p, const void *src, size_t n);
  // A read done by a warp collective on behalf of `t`'s warp (an ldmatrix row); `t` supplied the address.
  void collective_read(const Thread &t, void *dst, const void *p, size_t n, const char *what);

  // cp.async: at issue, checks the destination and marks its bytes in flight (returns its offset); at
  // completion, lands the data (`src`, or zeros when null) as a write by `t`'s warp in its current epoch.
  uint32_t begin_async_write(const Thread &t, void *p, size_t n);
  void end_async_write(const Thread &t, uint32_t offset, size_t n, const void *src);

  // A barrier among the warps in `warp_mask` completed; `released` (or null) is what warps that only
  // bar.arrive-d released to them.
  void barrier(uint32_t warp_mask, const uint32_t *released);

  // ---- sm_90
  // Release: joins warp w's clock (covering everything it did so far) into `into` and starts a new epoch.
  void release(int w, uint32_t *into);
  // Acquire: warp w's clock absorbs `from`.
  void acquire(int w, const uint32_t *from);
  uint32_t epoch_of(int w) const { return epoch(w); }
  // Whether warp w is ordered after everything warp `other` did up to its epoch `other_epoch`.
  bool ordered_after(int w, int other, uint32_t other_epoch) const { return knows(w, other) > other_epoch; }
  // A read of [offset, offset + n) by the async proxy (wgmma operand, TMA store source) on behalf of the
  // warps in `warp_mask` (`t` names them in messages): in-flight, mbarrier, proxy-fence (`check_fence`) and
  // race checks, then the read is recorded as `record` says. `what`: "wgmma.mma_async operand read", ...
  //   Issuer:    as a read by each warp of the mask in its current epoch (a TMA store: its thread's warp);
  //   None:      not recorded (a wgmma at issue: its bytes stay marked in flight until it completes);
  //   Completed: as one completed read observed by every warp of the mask at its wgmma_wait. A later write
  //              must be ordered after any one of them (a warp waiting on wait_group sees the whole
  //              warpgroup's wgmma complete, so one thread may release its stage), but nothing else the
  //              other warps did is ordered by that wait (it is no barrier among them).
  enum class Record { Issuer, None, Completed };
  void async_proxy_read(const Thread &t, uint32_t offset, size_t n, uint32_t warp_mask, const char *what,
                        bool check_fence, Record record);
  // Marks [offset, offset + n) as read by in-flight async operation `id` (delta +1) or unmarks it (-1).
  void mark_async_read(uint32_t offset, size_t n, uint32_t id, int delta);
  // Names in-flight async reader `id` for messages ("wgmma group 2 of warpgroup 1 (threads 128-255)").
  void name_async_reader(uint32_t id, const char *text);
  // A TMA load into [offset, offset + n): checked and marked in flight at issue (`slot`: its TmaLoad), landed
  // later as a write by `warp` in its issue epoch. The bytes themselves are written by the caller.
  void begin_tma_write(const Thread &t, uint32_t offset, size_t n, uint32_t slot);
  void end_tma_write(uint32_t offset, size_t n, int warp, uint32_t issue_epoch);
  // fence.proxy.async by warp w: its generic-proxy writes so far become visible to the async proxy.
  void fence_proxy(int w) { proxy_fences_[(size_t)w] += 1; }
  // mbarrier objects: 8 bytes only the mbarrier intrinsics may touch.
  void mark_mbarrier(uint32_t offset, bool on);
  bool is_mbarrier(uint32_t offset) const { return (special_[offset / 2] & kMbarrierGranule) != 0; }

private:
  static constexpr uint8_t kMbarrierGranule = 1;
  static constexpr uint16_t kTmaInFlight = 0x8000; // in_flight_: TMA slot | this; else 1 + tid (cp.async)
  void on_read(const Thread &t, uint32_t offset, size_t n);
  void on_write(const Thread &t, uint32_t offset, size_t n, uint16_t in_flight_mark);
  void check_not_mbarrier(const Thread &t, uint32_t offset, size_t n, const char *what);
  [[noreturn]] void report_async_read(const Thread &t, uint32_t granule, const char *access);
  // `access` continues "warp N" directly: " reads", " writes", "'s cp.async writes".
  [[noreturn]] void report_race(const Thread &t, int warp, uint32_t offset, const char *access, int other_warp,
                                const char *other_access);
  [[noreturn]] void report_in_flight(const Thread &t, uint32_t granule, const char *access);
  uint32_t epoch(int warp) const { return clock_[(size_t)warp * warps_ + warp]; }
  uint32_t knows(int warp, int other) const { return clock_[(size_t)warp * warps_ + other]; }

  unsigned char *alloc_ = nullptr;
  unsigned char *base_ = nullptr;
  uint32_t phase_ = 0; // base_ - alloc_: the placement offset past a 1024-byte boundary
  bool placed_ = false;
  int bytes_ = 0;
  int warps_ = 0;
  bool races_ = true;
  std::vector<uint32_t> last_write_; // per granule: 0, or (epoch + 1) << 5 | warp
  std::vector<uint32_t> last_read_;  // per granule and warp: 0, or epoch + 1
  std::vector<uint32_t> async_done_; // per granule and warp: 0, or epoch + 1 at which it saw a wgmma read complete
  bool any_async_done_ = false;     // whether async_done_ holds anything this block
  std::vector<uint16_t> in_flight_;  // per granule: 0, or 1 + tid of the thread whose cp.async will write it
  std::vector<uint32_t> in_flight_epoch_; // per granule: the issuing warp's epoch at issue
  std::vector<uint32_t> clock_;      // warps x warps; row w is warp w's vector clock, [w][w] its epoch
  std::vector<uint16_t> async_reads_;   // per granule: in-flight async reads (wgmma, TMA store) of it
  std::vector<uint32_t> async_reader_;  // per granule: the id of the latest of them
  std::vector<uint32_t> generic_write_; // per granule: 0, or (proxy fences of the writer at write + 1) << 5 | warp
  std::vector<uint8_t> special_;        // per granule: kMbarrierGranule
  std::vector<uint32_t> proxy_fences_;  // per warp: fence.proxy.async executed
  std::vector<std::vector<char>> reader_names_; // kReaderNames ring of in-flight reader names, by id
};

} // namespace detail
} // namespace emu
} // namespace fa
