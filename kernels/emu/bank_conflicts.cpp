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
  step.push_back(SharedAccess{key, offset, (uint8_t)t.lane, (uint8_t)bytes});
}

void account_shared_step(Launch &l, int w) {
  std::vector<SharedAccess> &step = l.shared_steps[(size_t)w];
  if (step.empty()) return;
  // The step is in program order. An access's occurrence is how many earlier accesses its lane made at the
  // same site; (site, occurrence) is one warp instruction. One sort of packed keys (site by first
  // appearance, occurrence, lane, the access's index) groups them: the emulator runs this after every warp
  // step, so it avoids sorting the records themselves.
  SharedStepScratch &s = l.shared_scratch;
  int n_sites = 0;
  s.keys.clear();
  for (size_t i = 0; i < step.size(); ++i) {
    const SharedAccess &a = step[i];
    int site = 0;
    while (site < n_sites && s.sites[site] != a.site) ++site;
    if (site == n_sites) {
      if (n_sites == SharedStepScratch::kMaxSites) { // more sites than the key holds: count none of it
        l.counters.shared_uncounted += step.size();
        step.clear();
        return;
      }
      s.sites[n_sites++] = a.site;
      for (uint16_t &c : s.counts[site]) c = 0;
    }
    const uint64_t occurrence = s.counts[site][a.lane]++;
    s.keys.push_back((uint64_t)site << 48 | occurrence << 24 | (uint64_t)a.lane << 16 | i);
  }
  std::sort(s.keys.begin(), s.keys.end());
  for (size_t i = 0; i < s.keys.size();) {
    const uint64_t instruction = s.keys[i] >> 24;
    uint32_t offsets[kWarpSize] = {}, bytes[kWarpSize] = {};
    bool active[kWarpSize] = {};
    uint32_t widest = 0;
    for (; i < s.keys.size() && s.keys[i] >> 24 == instruction; ++i) {
      const SharedAccess &a = step[s.keys[i] & 0xffff];
      offsets[a.lane] = a.offset;
      bytes[a.lane] = a.bytes;
      active[a.lane] = true;
      widest = a.bytes > widest ? a.bytes : widest;
    }
    add_instruction(l, offsets, bytes, active, lanes_per_phase(widest));
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
