// Warpgroup instructions (sm_90a): wgmma.fence / mma_async / commit_group / wait_group and setmaxnreg.
//
// Each is .sync.aligned over a warpgroup (4 consecutive warps, 128 threads): every warp arrives as a warp
// collective (scheduler.cpp), then waits here until the other three have arrived with the same op and key;
// the op runs once, with all 128 threads' operands at hand.
//
// wgmma.mma_async (PTX ISA 9.7.15) is asynchronous: it joins the warpgroup's open group, commit_group closes
// the group, and the emulator computes it only inside the wait_group that covers it ("wait_group N": every
// committed group but the N most recent), the latest moment the hardware allows. Until then:
//  - the shared bytes it reads (A and B through matrix descriptors) are marked, and any write to them faults;
//    they are read as the async proxy, so bytes written by ordinary stores need fence.proxy.async first;
//  - the accumulator and A-fragment registers belong to it: the intrinsics layer's register objects
//    (fa::WgmmaAcc, fa::WgmmaFragA) report every access, and one while a wgmma owns them faults;
//  - a register object accessed since the thread's last wgmma.fence may not be an operand of a new wgmma.
// At the wait, the completed reads are recorded as observed by all four warps (any one of them may release
// the bytes: SharedMemory::Record::Completed); the wait orders nothing else between the warps.
// Exiting with wgmmas in flight (uncommitted, or committed and never waited for) faults.
//
// Numerics as mma.sync: each product of two 16-bit values is exact in fp32; each output starts from D (or 0
// with scale-d = 0) and adds the 16 products in k order, rounding after each addition.
//
// setmaxnreg: the CTA's registers are a pool of (registers per thread at launch) x threads; .dec returns
// registers to it, .inc takes them and waits until enough are free (a deadlock if they never are).
#include <stdio.h>
#include <string.h>

#include "launch.h"

namespace fa {
namespace emu {
namespace detail {

namespace {

struct WgmmaArgs {
  float *d;
  const uint32_t *a_regs;
  uint64_t desc_a, desc_b;
  bool accumulate;
};

// Key of a wgmma.mma_async: the warpgroup-uniform immediates of the instruction.
constexpr uint32_t kKeyBf16 = 1u << 9, kKeyTransA = 1u << 10, kKeyTransB = 1u << 11, kKeyRs = 1u << 12;

// A shared-memory operand as its matrix descriptor describes it (PTX ISA 9.7.15.5.1.2).
struct SmemMatrix {
  uint32_t start, lbo, sbo; // shared window addresses / byte offsets
  uint32_t swizzle;         // bytes: 0, 32, 64, 128
  bool mn_major;
};

uint32_t swizzle_bytes_of(uint64_t desc) {
  switch (desc >> 62) {
  case 1: return 128;
  case 2: return 64;
  case 3: return 32;
  default: return 0;
  }
}

SmemMatrix decode(const Thread &t, uint64_t desc, bool mn_major, const char *which) {
  SmemMatrix m{(uint32_t)(desc & 0x3fff) << 4, (uint32_t)((desc >> 16) & 0x3fff) << 4,
               (uint32_t)((desc >> 32) & 0x3fff) << 4, swizzle_bytes_of(desc), mn_major};
  const uint32_t base_offset = (uint32_t)(desc >> 49) & 7;
  if (base_offset != 0) {
    fault(t,
          "wgmma.mma_async: the %s descriptor %#llx has matrix base offset %u: the emulator models only base offset "
          "0 (tiles whose swizzle pattern starts at its repeat boundary)",
          which, (unsigned long long)desc, base_offset);
  }
  if (m.swizzle) {
    // The pattern repeats every 8 rows of `swizzle` bytes; with base offset 0 the tile must start in the
    // first row of a repeat (a k-step may advance the start within that row).
    const uint32_t repeat = 8 * m.swizzle;
    if (m.start % repeat >= m.swizzle) {
      fault(t,
            "wgmma.mma_async: the %s descriptor starts at shared window address %#x, %u bytes into a %u-byte "
            "repeat of its %uB swizzle pattern: with base offset 0 the tile must start at a %u-byte boundary "
            "(plus at most %u bytes of k offset) — is the shared memory 1024-byte aligned "
            "(dynamic_smem_aligned<T>())?",
            which, m.start, m.start % repeat, repeat, m.swizzle, repeat, m.swizzle - 16);
    }
  }
  return m;
}

// Window address of element (mn, k) of a 16-bit operand in its canonical layout (PTX ISA "Canonical
// Layouts", T = 8 elements = 16 bytes):
//   K-major,  none:     ((8,m),(T,2k)):((1T,SBO),(1,LBO))          -> 16·(mn%8) + SBO·(mn/8) + 2·(k%8) + LBO·(k/8)
//   K-major,  S bytes:  ((8,m),(T,2k)):((S/16·T,SBO),(1,T))        -> S·(mn%8) + SBO·(mn/8) + 2k
//   MN-major, none:     ((T,1,m),(8,k)):((1,T,SBO),(1T,LBO))       -> 2·(mn%8) + SBO·(mn/8) + 16·(k%8) + LBO·(k/8)
//   MN-major, S bytes:  ((T,S/16,m),(8,k)):((1,T,LBO),(S/16·T,SBO)) -> 2·(mn%(S/2)) + LBO·(mn/(S/2)) + S·(k%8) + SBO·(k/8)
// then swizzled: Swizzle<log2(S/16),4,3> XORs address bits [7, 7 + log2(S/16)) into bits [4, ...).
uint32_t element_address(const SmemMatrix &m, int mn, int k) {
  uint32_t a;
  const uint32_t s = m.swizzle;
  if (!m.mn_major) {
    a = s ? m.start + s * (uint32_t)(mn % 8) + m.sbo * (uint32_t)(mn / 8) + 2u * (uint32_t)k
          : m.start + 16u * (uint32_t)(mn % 8) + m.sbo * (uint32_t)(mn / 8) + 2u * (uint32_t)(k % 8) +
                m.lbo * (uint32_t)(k / 8);
  } else {
    a = s ? m.start + 2u * (uint32_t)(mn % (int)(s / 2)) + m.lbo * (uint32_t)(mn / (int)(s / 2)) +
                s * (uint32_t)(k % 8) + m.sbo * (uint32_t)(k / 8)
          : m.start + 2u * (uint32_t)(mn % 8) + m.sbo * (uint32_t)(mn / 8) + 16u * (uint32_t)(k % 8) +
                m.lbo * (uint32_t)(k / 8);
  }
  if (s) a ^= ((a >> 7) & (s / 16 - 1)) << 4;
  return a;
}

// Calls f(offset) for every 16-byte chunk an operand of `rows` x 16 occupies (8 consecutive elements along
// its contiguous dimension are one chunk in every canonical layout, and the swizzle moves whole chunks).
template <class F> void for_each_chunk(Launch &l, const Thread &t, const SmemMatrix &m, int rows, const char *which, F f) {
  for (int mn = 0; mn < rows; mn += m.mn_major ? 8 : 1) {
    for (int k = 0; k < 16; k += m.mn_major ? 1 : 8) {
      const uint32_t a = element_address(m, mn, k);
      const uint32_t off = l.shared.offset_of_window(a);
      if (a < SharedMemory::kWindowBase || off > (uint32_t)l.shared.bytes() || (uint32_t)l.shared.bytes() - off < 16) {
        fault(t,
              "wgmma.mma_async: the %s operand's element (%d, %d) lies at shared window address %#x, outside the "
              "block's %d bytes of shared memory (window %#x..%#x): check the descriptor's start, LBO and SBO",
              which, mn, k, a, l.shared.bytes(), l.shared.window_address(0),
              l.shared.window_address((uint32_t)l.shared.bytes()));
      }
      f(off);
    }
  }
}

float element(const Launch &l, const SmemMatrix &m, int mn, int k, bool bf16) {
  uint16_t h;
  memcpy(&h, l.shared.base() + l.shared.offset_of_window(element_address(m, mn, k)), 2);
  return bf16 ? bf16_to_float(h) : f16_to_float(h);
}

Thread &wg_thread(Launch &l, int g, int i) { return l.threads[(size_t)(128 * g + i)]; }

template <class Args> Args &wg_args(Launch &l, int g, int i) { return *static_cast<Args *>(wg_thread(l, g, i).op_args); }

uint32_t wg_warp_mask(int g) { return 0xfu << (4 * g); }

void name_wgmma(Launch &l, const WgmmaOp &op, int g) {
  char text[160];
  snprintf(text, sizeof text, "wgmma.mma_async.m64n%dk16 of group %llu of warpgroup %d (threads %d-%d)", op.n,
           (unsigned long long)op.group, g, 128 * g, 128 * g + 127);
  l.shared.name_async_reader(op.serial, text);
}

bool touched(const Thread &t, const void *object) {
  if (t.wgmma_touch_overflow) return true;
  for (const void *p : t.wgmma_touched) {
    if (p == object) return true;
  }
  return false;
}

void issue_wgmma(Launch &l, int g) {
  Warpgroup &wg = l.warpgroups[(size_t)g];
  Thread &t0 = wg_thread(l, g, 0);
  const WgmmaArgs &a0 = wg_args<WgmmaArgs>(l, g, 0);
  const uint32_t key = t0.op_key;
  const int n = (int)(key & 0x1ff);
  const bool rs = (key & kKeyRs) != 0;
  if (n < 8 || n > 256 || n % 8 != 0) fault(t0, "wgmma.mma_async.m64n%dk16: N must be a multiple of 8 from 8 to 256", n);
  if ((int)wg.wgmma.size() >= kMaxWgmmaInFlight) {
    fault(t0, "warpgroup %d has %d wgmma.mma_async in flight: the emulator holds at most that many (missing wgmma_wait?)",
          g, kMaxWgmmaInFlight);
  }
  WgmmaOp op{};
  op.desc_a = a0.desc_a;
  op.desc_b = a0.desc_b;
  op.group = wg.groups;
  op.serial = ++l.async_serial;
  op.n = (uint16_t)n;
  op.a_from_regs = rs;
  op.trans_a = (key & kKeyTransA) != 0;
  op.trans_b = (key & kKeyTransB) != 0;
  op.accumulate = a0.accumulate;
  op.bf16 = (key & kKeyBf16) != 0;
  for (int i = 0; i < 128; ++i) {
    Thread &t = wg_thread(l, g, i);
    const WgmmaArgs &a = wg_args<WgmmaArgs>(l, g, i);
    if (a.desc_b != op.desc_b || (!rs && a.desc_a != op.desc_a) || a.accumulate != op.accumulate) {
      fault(t,
            "wgmma.mma_async of warpgroup %d: thread %d passes descriptors %#llx/%#llx and scale-d %d, thread %d "
            "%#llx/%#llx and %d: the operands of a .aligned instruction must be the same in every thread",
            g, t.tid, (unsigned long long)a.desc_a, (unsigned long long)a.desc_b, (int)a.accumulate, t0.tid,
            (unsigned long long)op.desc_a, (unsigned long long)op.desc_b, (int)op.accumulate);
    }
    if (!t.wgmma_fenced) {
      fault(t,
            "wgmma.mma_async of warpgroup %d without a wgmma_fence before it in thread %d: the first wgmma, and "
            "every wgmma whose registers the thread accessed since, needs wgmma.fence",
            g, t.tid);
    }
    if (touched(t, a.d) || (rs && touched(t, a.a_regs))) {
      fault(t,
            "wgmma.mma_async of warpgroup %d: thread %d accessed its %s registers after its last wgmma_fence: "
            "wgmma.fence must order register accesses before the wgmma that uses them",
            g, t.tid, touched(t, a.d) ? "accumulator" : "A-fragment");
    }
    op.d[i] = a.d;
    if (rs) memcpy(op.a[i], a.a_regs, sizeof op.a[i]);
    t.wgmma_regs.push_back(RegRange{a.d, sizeof(float) * (size_t)(n / 2), op.group, true});
    if (rs) t.wgmma_regs.push_back(RegRange{a.a_regs, 4 * sizeof(uint32_t), op.group, false});
  }
  // The operands in shared memory: read through the async proxy (fence and race checks now, for all four
  // warps) and marked until the wgmma completes.
  auto read = [&](uint64_t desc, bool mn_major, int rows, const char *which) {
    const SmemMatrix m = decode(t0, desc, mn_major, which);
    for_each_chunk(l, t0, m, rows, which, [&](uint32_t off) {
      l.shared.async_proxy_read(t0, off, 16, wg_warp_mask(g), "wgmma.mma_async operand read", true,
                                SharedMemory::Record::None);
      l.shared.mark_async_read(off, 16, op.serial, +1);
      l.counters.shared_bytes_read += 16;
    });
  };
  if (!rs) read(op.desc_a, op.trans_a, 64, "A");
  read(op.desc_b, op.trans_b, n, "B");
  name_wgmma(l, op, g);
  wg.wgmma.push_back(op);
  l.counters.wgmma += 1;
}

// Computes op and hands its registers back (inside the wait_group that covers it).
void complete_wgmma(Launch &l, int g, const WgmmaOp &op) {
  Thread &t0 = wg_thread(l, g, 0);
  float a[64][16], b[16][256];
  if (op.a_from_regs) {
    // m16n8k16's A layout per warp: register j of thread (w, g, q) holds row 16w + g + 8(j&1), columns
    // 2q + 8(j>>1) + {0, 1} (low half first).
    for (int i = 0; i < 128; ++i) {
      const int w = i / 32, gr = (i % 32) / 4, q = i % 4;
      for (int j = 0; j < 4; ++j) {
        const int row = 16 * w + gr + 8 * (j & 1), col = 2 * q + 8 * (j >> 1);
        const uint32_t r = op.a[i][j];
        a[row][col] = op.bf16 ? bf16_to_float((uint16_t)r) : f16_to_float((uint16_t)r);
        a[row][col + 1] = op.bf16 ? bf16_to_float((uint16_t)(r >> 16)) : f16_to_float((uint16_t)(r >> 16));
      }
    }
  } else {
    const SmemMatrix m = decode(t0, op.desc_a, op.trans_a, "A");
    for (int r = 0; r < 64; ++r)
      for (int k = 0; k < 16; ++k) a[r][k] = element(l, m, r, k, op.bf16);
  }
  const SmemMatrix mb = decode(t0, op.desc_b, op.trans_b, "B");
  for (int c = 0; c < op.n; ++c)
    for (int k = 0; k < 16; ++k) b[k][c] = element(l, mb, c, k, op.bf16);
  // D: register i of thread (w, g, q) holds row 16w + g + 8((i>>1)&1), column 8(i>>2) + 2q + (i&1).
  // Registers 4s .. 4s + 3 are rows {R, R + 8} x columns {C, C + 1}: their four sums run side by side
  // (independent chains for the host's adders), each still adding its 16 products in k order.
  for (int i = 0; i < 128; ++i) {
    const int w = i / 32, gr = (i % 32) / 4, q = i % 4;
    float *d = op.d[i];
    const int row = 16 * w + gr;
    for (int s = 0; s < op.n / 8; ++s) {
      const int col = 8 * s + 2 * q;
      float acc0 = op.accumulate ? d[4 * s] : 0.0f, acc1 = op.accumulate ? d[4 * s + 1] : 0.0f;
      float acc2 = op.accumulate ? d[4 * s + 2] : 0.0f, acc3 = op.accumulate ? d[4 * s + 3] : 0.0f;
      for (int k = 0; k < 16; ++k) {
        const float a0 = a[row][k], a1 = a[row + 8][k], b0 = b[k][col], b1 = b[k][col + 1];
        acc0 += a0 * b0;
        acc1 += a0 * b1;
        acc2 += a1 * b0;
        acc3 += a1 * b1;
      }
      d[4 * s] = acc0;
      d[4 * s + 1] = acc1;
      d[4 * s + 2] = acc2;
      d[4 * s + 3] = acc3;
    }
  }
  // Hand back the shared bytes (recording the reads as of now: a stage released before this point is a
  // race with whoever refills it) and the registers.
  auto unmark = [&](uint64_t desc, bool mn_major, int rows, const char *which) {
    const SmemMatrix m = decode(t0, desc, mn_major, which);
    uint32_t lo = UINT32_MAX, hi = 0;
    for_each_chunk(l, t0, m, rows, which, [&](uint32_t off) {
      l.shared.mark_async_read(off, 16, op.serial, -1);
      l.shared.async_proxy_read(t0, off, 16, wg_warp_mask(g), "wgmma.mma_async operand read", false,
                                SharedMemory::Record::Completed);
      lo = off < lo ? off : lo;
      hi = off + 16 > hi ? off + 16 : hi;
    });
    tma_streams_read_done(l, lo, hi, wg_warp_mask(g));
  };
  if (!op.a_from_regs) unmark(op.desc_a, op.trans_a, 64, "A");
  unmark(op.desc_b, op.trans_b, op.n, "B");
  for (int i = 0; i < 128; ++i) {
    Thread &t = wg_thread(l, g, i);
    for (int pass = 0; pass < (op.a_from_regs ? 2 : 1); ++pass) {
      const bool acc = pass == 0;
      for (size_t r = 0; r < t.wgmma_regs.size(); ++r) {
        const RegRange &rr = t.wgmma_regs[r];
        if (rr.group == op.group && rr.accumulator == acc) {
          t.wgmma_regs.erase(t.wgmma_regs.begin() + (ptrdiff_t)r);
          break;
        }
      }
    }
  }
}

void wait_wgmma(Launch &l, int g, int pending) {
  Warpgroup &wg = l.warpgroups[(size_t)g];
  size_t kept = 0;
  for (size_t i = 0; i < wg.wgmma.size(); ++i) {
    const WgmmaOp &op = wg.wgmma[i];
    if (op.group < wg.groups && op.group + (uint64_t)pending < wg.groups) {
      complete_wgmma(l, g, op);
    } else {
      wg.wgmma[kept++] = op;
    }
  }
  wg.wgmma.resize(kept);
}

// The registers all warpgroups hold now.
int regs_in_use(const Launch &l) {
  int used = 0;
  for (const Warpgroup &g : l.warpgroups) used += g.regs * 128;
  return used + (l.block_threads % 128) * l.entry_regs;
}

// false: setmaxnreg.inc must wait for registers.
bool run_setmaxnreg(Launch &l, int g) {
  Warpgroup &wg = l.warpgroups[(size_t)g];
  const bool inc = (wg.key & 1) != 0;
  const int regs = (int)(wg.key >> 1);
  const Thread &t0 = wg_thread(l, g, 0);
  if (inc && regs < wg.regs) {
    fault(t0, "setmaxnreg.inc %d in warpgroup %d, which holds %d registers per thread: .inc may only raise the count",
          regs, g, wg.regs);
  }
  if (!inc && regs > wg.regs) {
    fault(t0, "setmaxnreg.dec %d in warpgroup %d, which holds %d registers per thread: .dec may only lower the count",
          regs, g, wg.regs);
  }
  if (inc && (regs - wg.regs) * 128 > l.reg_pool - regs_in_use(l)) return false;
  wg.regs = regs;
  return true;
}

// Runs the warpgroup's op once all four warps arrived; false if it must wait (setmaxnreg.inc).
bool complete_warpgroup(Launch &l, int g) {
  Warpgroup &wg = l.warpgroups[(size_t)g];
  switch (wg.op) {
  case Op::WgFence:
    for (int i = 0; i < 128; ++i) {
      Thread &t = wg_thread(l, g, i);
      t.wgmma_touched.clear();
      t.wgmma_touch_overflow = false;
      t.wgmma_fenced = true;
    }
    break;
  case Op::WgMma: issue_wgmma(l, g); break;
  case Op::WgCommit: wg.groups += 1; break;
  case Op::WgWait:
    // A wgmma's completion is one event all four warps observe (their reads of it are recorded as such:
    // one thread may release a stage for its whole warpgroup, the common pipeline idiom). The wait is no
    // barrier among the warps for anything else: their ordinary shared accesses stay unordered.
    wait_wgmma(l, g, (int)wg.key);
    break;
  case Op::SetMaxNReg:
    if (!run_setmaxnreg(l, g)) return false;
    break;
  default: break;
  }
  for (int w = 4 * g; w < 4 * g + 4; ++w) release_warp(l, w);
  wg.arrived = 0;
  return true;
}

Thread &current_checked(const char *what) {
  Launch &l = current_launch();
  Thread &t = *l.current;
  if (l.block_threads % 128 != 0) {
    fault(t, "%s is warpgroup-wide: the block's %d threads are not a whole number of warpgroups (128 threads)", what,
          l.block_threads);
  }
  return t;
}

} // namespace

void warpgroup_arrive(Launch &l, int w, const Thread &first) {
  const int g = w / 4;
  Warpgroup &wg = l.warpgroups[(size_t)g];
  if (wg.arrived && (wg.op != first.op || wg.key != first.op_key)) {
    char mine[64], theirs[64];
    describe_op(first.op, first.op_key, mine, sizeof mine);
    describe_op(wg.op, wg.key, theirs, sizeof theirs);
    fault(first,
          "divergent warpgroup %d: warp %d reaches %s while warps of the same warpgroup wait at %s (a .sync.aligned "
          "warpgroup instruction must be executed by all 128 threads together)",
          g, w, mine, theirs);
  }
  wg.op = first.op;
  wg.key = first.op_key;
  wg.arrived |= 1u << (w % 4);
  l.warps[w].at_warpgroup = true;
  if (wg.arrived == 0xf) complete_warpgroup(l, g);
}

bool retry_warpgroups(Launch &l) {
  for (size_t g = 0; g < l.warpgroups.size(); ++g) {
    if (l.warpgroups[g].arrived == 0xf && complete_warpgroup(l, (int)g)) return true;
  }
  return false;
}

size_t describe_warpgroup_waits(Launch &l, char *buf, size_t len, int *blame) {
  size_t used = 0;
  for (size_t g = 0; g < l.warpgroups.size() && used < len; ++g) {
    const Warpgroup &wg = l.warpgroups[g];
    if (!wg.arrived) continue;
    char op[64];
    describe_op(wg.op, wg.key, op, sizeof op);
    int n;
    if (wg.arrived == 0xf) {
      const int regs = (int)(wg.key >> 1);
      n = snprintf(buf + used, len - used,
                   "; warpgroup %zu waits at %s for %d more registers: the CTA's pool of %d (%d per thread at launch "
                   "x %d threads) has %d free",
                   g, op, (regs - wg.regs) * 128, l.reg_pool, l.entry_regs, l.block_threads,
                   l.reg_pool - regs_in_use(l));
    } else {
      n = snprintf(buf + used, len - used, "; warpgroup %zu waits at %s with only warps %s%s%s%s of its 4 arrived", g, op,
                   wg.arrived & 1 ? "0" : "", wg.arrived & 2 ? "1" : "", wg.arrived & 4 ? "2" : "",
                   wg.arrived & 8 ? "3" : "");
    }
    if (n > 0) used += (size_t)n;
    if (*blame < 0) *blame = (int)(128 * g);
  }
  return used < len ? used : len - 1;
}

void wgmma_thread_exit(Thread &t) {
  Launch &l = current_launch();
  const size_t g = (size_t)(t.warp / 4);
  if (g >= l.warpgroups.size() || l.warpgroups[g].wgmma.empty()) return;
  const Warpgroup &wg = l.warpgroups[g];
  size_t open = 0;
  for (const WgmmaOp &op : wg.wgmma) open += op.group == wg.groups;
  fault(t,
        "thread %d exits with %zu wgmma.mma_async of warpgroup %zu in flight (%zu never committed, %zu committed and "
        "never waited for): wgmma_commit() and wgmma_wait<0>() before exit",
        t.tid, wg.wgmma.size(), g, open, wg.wgmma.size() - open);
}

void warpgroups_reset(Launch &l) {
  for (Warpgroup &g : l.warpgroups) {
    g.arrived = 0;
    g.regs = l.entry_regs;
    g.groups = 0;
    g.wgmma.clear();
  }
}

} // namespace detail

using namespace detail;

void wgmma_fence() {
  current_checked("wgmma.fence");
  arrive(Op::WgFence, 0, nullptr);
}

void wgmma_mma(float *d, int n, const uint32_t *a_regs, uint64_t desc_a, uint64_t desc_b, MmaType type, bool trans_a,
               bool trans_b, bool accumulate) {
  Thread &t = current_checked("wgmma.mma_async");
  if (a_regs && trans_a) fault(t, "wgmma.mma_async with A from registers has no transpose-A (imm-trans-a)");
  WgmmaArgs args{d, a_regs, desc_a, desc_b, accumulate};
  const uint32_t key = ((uint32_t)n & 0x1ff) | (type == MmaType::Bf16 ? kKeyBf16 : 0u) | (trans_a ? kKeyTransA : 0u) |
                       (trans_b ? kKeyTransB : 0u) | (a_regs ? kKeyRs : 0u);
  arrive(Op::WgMma, key, &args);
}

void wgmma_commit() {
  current_checked("wgmma.commit_group");
  arrive(Op::WgCommit, 0, nullptr);
}

void wgmma_wait(int pending) {
  Thread &t = current_checked("wgmma.wait_group");
  if (pending < 0 || pending > 7) fault(t, "wgmma_wait<%d>: the pending-group count is 0..7", pending);
  arrive(Op::WgWait, (uint32_t)pending, nullptr);
}

void wgmma_register_access(const void *object) {
  Launch &l = current_launch();
  Thread &t = *l.current;
  for (const RegRange &r : t.wgmma_regs) {
    const uintptr_t p = (uintptr_t)object, lo = (uintptr_t)r.lo;
    if (p >= lo && p < lo + r.bytes) {
      fault(t,
            "thread %d accesses %s registers while a wgmma.mma_async of group %llu of warpgroup %d that uses them "
            "is in flight: wgmma_wait for its group first",
            t.tid, r.accumulator ? "accumulator" : "A-fragment", (unsigned long long)r.group, t.warp / 4);
    }
  }
  if (touched(t, object)) return;
  if (t.wgmma_touched.size() < t.wgmma_touched.capacity()) {
    t.wgmma_touched.push_back(object);
  } else {
    t.wgmma_touch_overflow = true;
  }
}

void setmaxnreg(bool inc, int regs) {
  Thread &t = current_checked(inc ? "setmaxnreg.inc" : "setmaxnreg.dec");
  if (regs < 24 || regs > 256 || regs % 8 != 0) {
    fault(t, "setmaxnreg.%s %d: the register count must be a multiple of 8 from 24 to 256", inc ? "inc" : "dec", regs);
  }
  arrive(Op::SetMaxNReg, (uint32_t)regs << 1 | (inc ? 1u : 0u), nullptr);
}

} // namespace emu
} // namespace fa
