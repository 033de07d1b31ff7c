// cp.async: asynchronous global -> shared copies with commit groups (PTX ISA "cp.async",
// "cp.async.commit_group", "cp.async.wait_group").
//
// The hardware may land a copy at any moment between issue and the wait that covers it; the emulator takes
// the latest possible moment: data moves only inside cp_async_wait (or when the thread exits), never at a
// barrier. The destination bytes are marked in flight from issue to completion (shared_memory.cpp), so a
// read before the wait is reported as the bug it is instead of silently returning stale data.
#include "launch.h"

namespace fa {
namespace emu {
namespace detail {

static void complete(Launch &l, Thread &t, const CpAsyncCopy &c) {
  l.shared.end_async_write(t, c.smem_offset, c.bytes, c.pred ? c.src : nullptr);
  l.counters.shared_bytes_written += c.bytes;
}

void cp_async_drain(Thread &t) {
  Launch &l = current_launch();
  for (const CpAsyncCopy &c : t.cp_async) complete(l, t, c);
  t.cp_async.clear();
}

} // namespace detail

using namespace detail;

void cp_async(void *smem, const void *gmem, int bytes, bool pred, SharedSite site) {
  Launch &l = current_launch();
  Thread &t = *l.current;
  if (bytes != 4 && bytes != 8 && bytes != 16) fault(t, "cp.async of %d bytes: the copy size must be 4, 8 or 16", bytes);
  // With pred false the source is never read (src-size 0), so it need not be a valid address.
  if (pred) {
    const size_t r = l.global.check(t, gmem, (size_t)bytes, (size_t)bytes, false, "cp.async source read");
    l.counters.global_bytes_read[r] += (uint64_t)bytes;
    l.counters.cp_async_bytes += (uint64_t)bytes;
  } else {
    l.counters.cp_async_zfill_bytes += (uint64_t)bytes;
  }
  uint32_t off = l.shared.begin_async_write(t, smem, (size_t)bytes);
  record_shared_access(l, t, site, off, (uint32_t)bytes); // the landing's bank pattern is the issue's
  t.cp_async.push_back(CpAsyncCopy{off, (uint32_t)bytes, gmem, pred, t.cp_async_groups});
}

// Closes the open group (possibly empty, as on the GPU).
void cp_async_commit() { current_thread().cp_async_groups += 1; }

// wait_group N: every committed group except the N most recent is complete. Copies not yet committed are
// not waited for.
void cp_async_wait(int pending) {
  Launch &l = current_launch();
  Thread &t = *l.current;
  if (pending < 0) fault(t, "cp_async_wait<%d>: the pending-group count cannot be negative", pending);
  size_t kept = 0;
  for (size_t i = 0; i < t.cp_async.size(); ++i) {
    const CpAsyncCopy &c = t.cp_async[i];
    if (c.group + (uint64_t)pending < t.cp_async_groups) {
      complete(l, t, c);
    } else {
      t.cp_async[kept++] = c;
    }
  }
  t.cp_async.resize(kept);
}

} // namespace emu
} // namespace fa
