// Shared-memory bank conflicts: how many wavefronts (shared-memory cycles) each warp-wide shared access
// takes on the hardware, summed per launch (FaEmuCounters.shared_requests / shared_wavefronts /
// shared_ideal_wavefronts).
//
// The model (sm_80 .. sm_90; NVIDIA's "shared memory" sections of the tuning guides and Nsight Compute's
// l1tex__data_pipe_lsu_wavefronts_mem_shared): 32 banks of 4 bytes; a warp instruction is served in phases
// of 128 bytes of request, i.e. all 32 lanes for accesses of <= 4 bytes, half-warps for 8 bytes, quarter-warps
// for 16 bytes (and one phase per 8x16-byte matrix of ldmatrix). A phase takes as many wavefronts as the
// largest number of distinct 4-byte words any one bank must deliver: lanes reading the same word share it
// (broadcast), two different words in one bank are a 2-way conflict. A phase with no active lane costs
// nothing. The ideal is one wavefront per phase that has an active lane: wavefronts - ideal is the excess
// the conflicts cost.
//
// Which per-lane accesses form one warp instruction: lanes run uninterrupted from one warp collective or
// barrier to the next (scheduler.cpp), so a warp's step is, per lane, a sequence of accesses. The k-th
// execution, by each lane, of the access at one source location (the intrinsics pass __builtin_FILE /
// __builtin_LINE of their caller) is one instruction: exact for converged code and for code that diverges
// around whole accesses, which is what SIMT hardware issues. ldmatrix is a collective and is counted as it
// completes. Accesses through the async proxy (wgmma operands, TMA) are not counted.
#include <algorithm>

#include "launch.h"

namespace fa {
namespace emu {
namespace detail {

uint32_t phase_wavefronts(const uint32_t *offsets, const uint32_t *bytes, int n) {
  // Distinct words per bank; a phase touches at most 32 lanes x 4 words, each word in one bank.
  uint32_t words[32][32];
  uint8_t count[32] = {};
  uint32_t worst = 0;
  for (int i = 0; i < n; ++i) {
    const uint32_t first = offsets[i] / 4, last = (offsets[i] + (bytes[i] > 0 ? bytes[i] : 1) - 1) / 4;
    for (uint32_t word = first; word <= last; ++word) {
      const uint32_t bank = word & 31u;
      bool seen = false;
      for (int j = 0; j < count[bank]; ++j) seen = seen || words[bank][j] == word;
      if (seen || count[bank] == 32) continue;
      words[bank][count[bank]++] = word;
      worst = count[bank] > worst ? count[bank] : worst;
    }
  }
  return worst;
}

namespace {

void add_instruction(Launch &l, const uint32_t *offsets, const uint32_t *bytes, const bool *active, int lanes_per_phase) {
  uint32_t wavefronts = 0, ideal = 0;
  for (int p = 0; p < kWarpSize; p += lanes_per_phase) {
    uint32_t off[kWarpSize], n_bytes[kWarpSize];
    int n = 0;
    for (int lane = p; lane < p + lanes_per_phase; ++lane) {
      if (!active[lane]) continue;
      off[n] = offsets[lane];
      n_bytes[n++] = bytes[lane];
    }
    if (n == 0) continue;
    wavefronts += phase_wavefronts(off, n_bytes, n);
    ideal += 1;
  }
  l.counters.shared_requests += 1;
  l.counters.shared_wavefronts += wavefronts;
  l.counters.shared_ideal_wavefronts += ideal;
}

int lanes_per_phase(uint32_t bytes) { return bytes <= 4 ? kWarpSize : (int)(128 / bytes); }

} // namespace

void record_shared_access(Launch &l, const Thread &t, const SharedSite &site, uint32_t offset, uint32_t bytes) {
  std::vector<SharedAccess> &step = l.shared_steps[(size_t)t.warp];
  if (step.size() == step.capacity()) { // reserved at launch: fibers never allocate
    l.counters.shared_uncounted += 1;
    return;
  }
  const uint64_t key = (uint64_t)(uintptr_t)site.file * 0x9E3779B97F4A7C15ull ^ (uint64_t)site.line;
  step.push_back(SharedAccess{key, offset, (uint32_t)step.size(), 0, (uint8_t)t.lane, (uint8_t)bytes});
}

void account_shared_step(Launch &l, int w) {
  std::vector<SharedAccess> &step = l.shared_steps[(size_t)w];
  if (step.empty()) return;
  // Occurrence of each access among its lane's accesses at the same site (seq keeps program order).
  std::sort(step.begin(), step.end(), [](const SharedAccess &a, const SharedAccess &b) {
    return a.site != b.site ? a.site < b.site : a.lane != b.lane ? a.lane < b.lane : a.seq < b.seq;
  });
  for (size_t i = 0; i < step.size(); ++i) {
    const bool same_run = i > 0 && step[i - 1].site == step[i].site && step[i - 1].lane == step[i].lane;
    step[i].occurrence = same_run ? step[i - 1].occurrence + 1 : 0;
  }
  std::sort(step.begin(), step.end(), [](const SharedAccess &a, const SharedAccess &b) {
    return a.site != b.site ? a.site < b.site : a.occurrence != b.occurrence ? a.occurrence < b.occurrence : a.lane < b.lane;
  });
  for (size_t i = 0; i < step.size();) {
    size_t j = i;
    uint32_t offsets[kWarpSize] = {}, bytes[kWarpSize] = {};
    bool active[kWarpSize] = {};
    uint32_t widest = 0;
    while (j < step.size() && step[j].site == step[i].site && step[j].occurrence == step[i].occurrence) {
      offsets[step[j].lane] = step[j].offset;
      bytes[step[j].lane] = step[j].bytes;
      active[step[j].lane] = true;
      widest = step[j].bytes > widest ? step[j].bytes : widest;
      ++j;
    }
    add_instruction(l, offsets, bytes, active, lanes_per_phase(widest));
    i = j;
  }
  step.clear();
}

void account_ldmatrix(Launch &l, const uint32_t *row_offsets, int count) {
  uint32_t bytes[kWarpSize];
  bool active[kWarpSize];
  for (int lane = 0; lane < kWarpSize; ++lane) {
    bytes[lane] = 16;
    active[lane] = lane < 8 * count;
  }
  add_instruction(l, row_offsets, bytes, active, 8);
}

} // namespace detail
} // namespace emu
} // namespace fa
