// TMA (cp.async.bulk.tensor, tiled mode, PTX ISA 9.7.9.25): box copies between a global tensor, described by
// a tensor map, and shared memory.
//
// A box of box[0] x ... x box[r-1] elements at coordinates c: box element (i0, ..., i_{r-1}) is the tensor's
// element (c0 + i0, ..., c_{r-1} + i_{r-1}); coordinates outside [0, dim) read as zero and are not written.
// In shared memory the box is row-major (dimension 0 innermost), then swizzled like wgmma operands: with a
// swizzle of S bytes, address bits [7, 7 + log2(S/16)) are XORed into bits [4, ...). The emulator requires
// S-byte rows (box[0] x element size == S) and a destination aligned to the pattern's repeat (8 S bytes).
//
// Loads complete on an mbarrier with the whole box's bytes (out-of-bounds elements included). They land as
// late as the hardware allows: when a thread waits for the phase of their mbarrier, when an arrive needs the
// phase completed, or before a deadlock is declared; until then the destination is marked in flight. A
// block that exits with a load never landed is a fault. Stores read their shared source through the async
// proxy (ordinary stores to it need fence.proxy.async first) and complete at the tma_store_wait covering
// their bulk group, or when the thread exits; their source bytes may not be written until then.
#include <stdio.h>
#include <string.h>

#include "launch.h"

namespace fa {
namespace emu {
namespace detail {
namespace {

uint64_t box_elements(const FaEmuTensorMap &m) {
  uint64_t n = 1;
  for (uint32_t d = 0; d < m.rank; ++d) n *= m.box[d];
  return n;
}

// Copies and checks the kernel's map (it may go out of scope before the copy completes).
FaEmuTensorMap read_map(const Thread &t, const void *map, int rank, const char *what) {
  if (!map || (uintptr_t)map % 128 != 0) fault(t, "%s: the tensor map at %p is not 128-byte aligned", what, map);
  FaEmuTensorMap m;
  memcpy(&m, map, sizeof m);
  if (m.magic != FA_EMU_TENSOR_MAP_MAGIC) {
    fault(t,
          "%s: the tensor map is not an emulator tensor map (magic %#x): encode it with fused_attn::tensor_map for the "
          "emulator backend",
          what, m.magic);
  }
  bool ok = m.rank >= 1 && m.rank <= 5 && (m.elem_bytes == 1 || m.elem_bytes == 2 || m.elem_bytes == 4) &&
            (m.swizzle_bytes == 0 || m.swizzle_bytes == 32 || m.swizzle_bytes == 64 || m.swizzle_bytes == 128) &&
            (uintptr_t)m.base % 16 == 0;
  for (uint32_t d = 0; ok && d < m.rank; ++d) {
    ok = m.dims[d] >= 1 && m.box[d] >= 1 && m.box[d] <= 256 && (d == 0 || m.strides[d] % 16 == 0);
  }
  if (ok && m.swizzle_bytes) ok = m.box[0] * m.elem_bytes == m.swizzle_bytes;
  if (!ok) fault(t, "%s: the tensor map is malformed (encode it with fused_attn::tensor_map)", what);
  if ((int)m.rank != rank) fault(t, "%s with %d coordinates through a tensor map of rank %u", what, rank, m.rank);
  return m;
}

// Checks the shared side of a box: bounds, 128-byte alignment, and the swizzle pattern's alignment.
uint32_t box_offset(Launch &l, const Thread &t, const FaEmuTensorMap &m, const void *smem, uint32_t bytes,
                    const char *what) {
  const uint32_t off = l.shared.check_range(t, smem, bytes, 128, what);
  const uint32_t repeat = 8 * m.swizzle_bytes, window = l.shared.window_address(off);
  if (repeat && window % repeat != 0) {
    fault(t,
          "%s at shared window address %#x (shared+%u) is not %u-byte aligned: the %uB swizzle pattern repeats every "
          "%u bytes, and wgmma reads tiles that start on that boundary (is the dynamic shared memory declared "
          "1024-byte aligned with dynamic_smem_aligned<T>()?)",
          what, window, off, repeat, m.swizzle_bytes, repeat);
  }
  return off;
}

// Calls f(byte offset of the element in the box's shared image, global address or null when out of bounds,
// run) for each run of box[0] elements (one box row), row by row.
template <class F> void for_each_row(const TmaBox &b, F f) {
  const FaEmuTensorMap &m = b.map;
  uint32_t box[5] = {1, 1, 1, 1, 1};
  for (uint32_t d = 0; d < m.rank; ++d) box[d] = m.box[d];
  uint64_t row = 0;
  for (uint32_t i4 = 0; i4 < box[4]; ++i4)
    for (uint32_t i3 = 0; i3 < box[3]; ++i3)
      for (uint32_t i2 = 0; i2 < box[2]; ++i2)
        for (uint32_t i1 = 0; i1 < box[1]; ++i1, ++row) {
          const uint32_t idx[5] = {0, i1, i2, i3, i4};
          bool inside = true;
          uint64_t outer = 0;
          for (uint32_t d = 1; d < m.rank; ++d) {
            const int64_t g = (int64_t)b.coords[d] + idx[d];
            inside = inside && g >= 0 && (uint64_t)g < m.dims[d];
            outer += (uint64_t)g * m.strides[d];
          }
          f(row * box[0] * m.elem_bytes, inside, outer);
        }
}

// Window-relative swizzle of the byte at shared offset `off` (the box's destination is aligned to the repeat).
uint32_t swizzled(const Launch &l, const FaEmuTensorMap &m, uint32_t off) {
  if (!m.swizzle_bytes) return off;
  const uint32_t a = l.shared.window_address(off);
  return l.shared.offset_of_window(a ^ (((a >> 7) & (m.swizzle_bytes / 16 - 1)) << 4));
}

// Moves one box between global and shared memory; `load`: global -> shared. `blame` is the issuing thread.
void move_box(Launch &l, const Thread &blame, const TmaBox &b, bool load) {
  const FaEmuTensorMap &m = b.map;
  const char *base = static_cast<const char *>(m.base);
  unsigned char *smem = l.shared.base();
  const uint32_t e = m.elem_bytes;
  for_each_row(b, [&](uint64_t row_off, bool inside, uint64_t outer) {
    // The in-bounds part of this row: elements i with 0 <= c0 + i < dims[0].
    int64_t lo = -(int64_t)b.coords[0], hi = (int64_t)m.dims[0] - b.coords[0];
    if (lo < 0) lo = 0;
    if (hi > (int64_t)m.box[0]) hi = m.box[0];
    if (!inside || hi <= lo) hi = lo = 0;
    if (hi > lo) {
      const char *g = base + outer + (uint64_t)((int64_t)b.coords[0] + lo) * e;
      const size_t bytes = (size_t)(hi - lo) * e;
      const size_t r = l.global.check(blame, g, bytes, 1, !load, load ? "TMA load source read" : "TMA store write");
      (load ? l.counters.global_bytes_read : l.counters.global_bytes_written)[r] += bytes;
    }
    for (uint32_t i = 0; i < m.box[0]; ++i) {
      const uint32_t s = swizzled(l, m, b.smem_offset + (uint32_t)row_off + i * e);
      const bool in = (int64_t)i >= lo && (int64_t)i < hi;
      char *g = const_cast<char *>(base) + outer + (uint64_t)((int64_t)b.coords[0] + i) * e;
      if (load) {
        if (in) {
          memcpy(smem + s, g, e);
        } else {
          memset(smem + s, 0, e);
        }
      } else if (in) {
        memcpy(g, smem + s, e);
      }
    }
  });
}

void land(Launch &l, TmaLoad &c) {
  const Thread &issuer = l.threads[(size_t)c.issuer];
  move_box(l, issuer, c.box, true);
  l.shared.end_tma_write(c.box.smem_offset, c.box.bytes, issuer.warp, c.epoch);
  l.counters.shared_bytes_written += c.box.bytes;
  c.live = false;
  MBarrier *b = find_mbarrier(l, c.bar);
  b->tx -= c.box.bytes;
  b->tx_landed += c.box.bytes;
  // complete_tx releases the copy's writes to whoever observes the phase.
  uint32_t &r = b->pending_release[issuer.warp];
  if (r < c.epoch + 1) r = c.epoch + 1;
  if (b->pending == 0 && b->tx == 0) complete_mbarrier_phase(l, issuer, *b);
}

TmaLoad *oldest_live(Launch &l, const uint32_t *bar) {
  TmaLoad *first = nullptr;
  for (TmaLoad &c : l.tma_loads) {
    if (c.live && (!bar || c.bar == *bar) && (!first || c.seq < first->seq)) first = &c;
  }
  return first;
}

// Completes the stores of every committed bulk group but the `pending` most recent (all: every store).
void complete_stores(Launch &l, Thread &t, int pending, bool all) {
  size_t kept = 0;
  for (size_t i = 0; i < t.bulk_stores.size(); ++i) {
    const BulkStore &s = t.bulk_stores[i];
    if (all || s.group + (uint64_t)pending < t.bulk_groups) {
      move_box(l, t, s.box, false);
      l.shared.mark_async_read(s.box.smem_offset, s.box.bytes, s.reader_id, -1);
      l.counters.tma_store_bytes += s.box.bytes;
    } else {
      t.bulk_stores[kept++] = s;
    }
  }
  t.bulk_stores.resize(kept);
}

// Prefetch slack: the first box of a new tile of a stream asks whether its issuer is ordered after a
// completed wgmma read of the stream's previous tile (see FaEmuCounters.tma_tiles_late).
void track_stream(Launch &l, const Thread &t, const void *map, const TmaBox &box) {
  TmaStream *s = nullptr;
  for (int i = 0; i < l.num_tma_streams; ++i) {
    if (l.tma_streams[i].map == map) s = &l.tma_streams[i];
  }
  if (!s) {
    if (l.num_tma_streams == kMaxTmaStreams) return; // more maps than tracked: the rest go uncounted
    s = &l.tma_streams[l.num_tma_streams++];
    *s = TmaStream{};
    s->map = map;
  }
  const uint32_t lo = box.smem_offset, hi = box.smem_offset + box.bytes;
  if (s->tiles > 0 && memcmp(s->tile, box.coords + 1, sizeof s->tile) == 0) {
    s->lo = lo < s->lo ? lo : s->lo; // another panel of the current tile
    s->hi = hi > s->hi ? hi : s->hi;
    return;
  }
  // Whether the issuer is ordered after a completed wgmma read recorded in `done`.
  auto waited_for = [&](const uint32_t *done) {
    for (int w = 0; w < l.num_warps; ++w) {
      if (done[w] != 0 && (w == t.warp || l.shared.ordered_after(t.warp, w, done[w] - 1))) return true;
    }
    return false;
  };
  if (s->tiles > 0) {
    const bool late = waited_for(s->done);
    (late ? l.counters.tma_tiles_late : l.counters.tma_tiles_prefetched) += 1;
    if (s->tiles > 1 && !late && !waited_for(s->prev_done)) l.counters.tma_tiles_two_ahead += 1;
  }
  memcpy(s->tile, box.coords + 1, sizeof s->tile);
  s->prev_lo = s->lo;
  s->prev_hi = s->hi;
  memcpy(s->prev_done, s->done, sizeof s->done);
  s->lo = lo;
  s->hi = hi;
  s->tiles += 1;
  memset(s->done, 0, sizeof s->done);
}

} // namespace

void tma_streams_read_done(Launch &l, uint32_t lo, uint32_t hi, uint32_t warp_mask) {
  for (int i = 0; i < l.num_tma_streams; ++i) {
    TmaStream &s = l.tma_streams[i];
    const bool current = lo < s.hi && hi > s.lo;
    const bool previous = s.tiles > 1 && lo < s.prev_hi && hi > s.prev_lo;
    for (int w = 0; w < l.num_warps; ++w) {
      if (!(warp_mask >> w & 1)) continue;
      if (current) s.done[w] = l.shared.epoch_of(w) + 1;
      if (previous) s.prev_done[w] = l.shared.epoch_of(w) + 1;
    }
  }
}

void land_tma_for(Launch &l, MBarrier &bar) {
  const uint32_t off = bar.offset;
  while (TmaLoad *c = oldest_live(l, &off)) land(l, *c);
}

void tma_stores_drain(Thread &t) { complete_stores(current_launch(), t, 0, true); }

bool land_all_tma(Launch &l) {
  bool any = false;
  while (TmaLoad *c = oldest_live(l, nullptr)) {
    land(l, *c);
    any = true;
  }
  return any;
}

} // namespace detail

using namespace detail;

void tma_load(void *smem_dst, const void *map, void *bar, const int32_t *coords, int rank, uint64_t l2_policy) {
  Launch &l = current_launch();
  Thread &t = *l.current;
  TmaBox box;
  box.map = read_map(t, map, rank, "TMA load");
  const uint64_t bytes = box_elements(box.map) * box.map.elem_bytes;
  if (bytes > (uint64_t)l.shared.bytes()) {
    fault(t, "TMA load of a %llu-byte box: the block has %d bytes of shared memory", (unsigned long long)bytes,
          l.shared.bytes());
  }
  box.bytes = (uint32_t)bytes;
  for (int d = 0; d < 5; ++d) box.coords[d] = d < rank ? coords[d] : 0;
  box.smem_offset = box_offset(l, t, box.map, smem_dst, box.bytes, "TMA load destination");
  const uint32_t bar_off = l.shared.check_range(t, bar, 8, 8, "TMA load mbarrier");
  MBarrier *b = find_mbarrier(l, bar_off);
  if (!b) fault(t, "TMA load completing on shared+%u, which is not an initialised mbarrier", bar_off);
  if (!b->init_fenced || (b->init_warp != t.warp && !l.shared.ordered_after(t.warp, b->init_warp, b->fence_epoch))) {
    fault(t,
          "TMA load completing on the mbarrier at shared+%u, whose initialisation (thread %d, warp %d) %s: the "
          "TMA unit (async proxy) may see the barrier uninitialised (missing fence_mbarrier_init() after "
          "mbarrier_init, before the barrier that publishes it?)",
          bar_off, b->init_tid, b->init_warp,
          b->init_fenced ? "was fenced, but the fence is not ordered before this thread" : "was never fenced");
  }
  TmaLoad *slot = nullptr;
  for (TmaLoad &c : l.tma_loads) {
    if (!c.live) {
      slot = &c;
      break;
    }
  }
  if (!slot) fault(t, "more than %d TMA loads in flight in one block (none of them waited for?)", kMaxTmaInFlight);
  const uint32_t index = (uint32_t)(slot - l.tma_loads.data());
  // Marks the destination in flight (and checks it against every earlier access) as of now.
  l.shared.begin_tma_write(t, box.smem_offset, box.bytes, index);
  slot->box = box;
  slot->bar = bar_off;
  slot->issuer = t.tid;
  slot->epoch = l.shared.epoch_of(t.warp);
  slot->seq = ++l.tma_seq;
  slot->live = true;
  l.counters.tma_load_bytes += box.bytes;
  if (l2_policy == kL2EvictFirst) l.counters.tma_load_bytes_evict_first += box.bytes;
  else if (l2_policy == kL2EvictLast) l.counters.tma_load_bytes_evict_last += box.bytes;
  else if (l2_policy != 0 && l2_policy != kL2EvictNormal) fault(t, "TMA load with an unknown L2 policy %llu", (unsigned long long)l2_policy);
  track_stream(l, t, map, box);
}

void tma_store(const void *map, const int32_t *coords, int rank, const void *smem_src) {
  Launch &l = current_launch();
  Thread &t = *l.current;
  if (t.bulk_stores.size() == t.bulk_stores.capacity()) {
    fault(t, "thread %d has more than %d TMA stores in flight (missing tma_store_wait?)", t.tid, kMaxBulkStores);
  }
  BulkStore s;
  s.box.map = read_map(t, map, rank, "TMA store");
  const uint64_t bytes = box_elements(s.box.map) * s.box.map.elem_bytes;
  if (bytes > (uint64_t)l.shared.bytes()) {
    fault(t, "TMA store of a %llu-byte box: the block has %d bytes of shared memory", (unsigned long long)bytes,
          l.shared.bytes());
  }
  s.box.bytes = (uint32_t)bytes;
  for (int d = 0; d < 5; ++d) s.box.coords[d] = d < rank ? coords[d] : 0;
  s.box.smem_offset = box_offset(l, t, s.box.map, smem_src, s.box.bytes, "TMA store source");
  l.shared.async_proxy_read(t, s.box.smem_offset, s.box.bytes, 1u << t.warp, "TMA store (cp.async.bulk.tensor) source read",
                            true, SharedMemory::Record::Issuer);
  s.group = t.bulk_groups;
  s.reader_id = ++l.async_serial;
  char name[160];
  snprintf(name, sizeof name, "the TMA store of thread %d (bulk group %llu)", t.tid, (unsigned long long)s.group);
  l.shared.name_async_reader(s.reader_id, name);
  l.shared.mark_async_read(s.box.smem_offset, s.box.bytes, s.reader_id, +1);
  l.counters.shared_bytes_read += s.box.bytes;
  t.bulk_stores.push_back(s);
}

void tma_store_commit() { current_thread().bulk_groups += 1; }

void tma_store_wait(int pending) {
  Launch &l = current_launch();
  Thread &t = *l.current;
  if (pending < 0) fault(t, "tma_store_wait<%d>: the pending-group count cannot be negative", pending);
  complete_stores(l, t, pending, false);
}

} // namespace emu
} // namespace fa
