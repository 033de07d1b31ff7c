// Warp collectives: shuffles, votes, sync_warp, ldmatrix and mma.sync.m16n8k16. Each lane arrives with its
// operands (scheduler.cpp); once all 32 have, complete_collective computes every lane's result from all
// lanes' inputs, following the PTX ISA's lane/element tables (quoted at each function), so a kernel that
// gets a fragment layout wrong gets the same wrong answer here as on the GPU.
#include <string.h>

#include "launch.h"

namespace fa {
namespace emu {
namespace detail {

namespace {

struct ShflArgs {
  uint32_t value;
  int operand; // lane mask (xor) or source lane (idx)
  uint32_t result;
};

struct BallotArgs {
  bool pred;
  uint32_t result;
};

struct LdmatrixArgs {
  const void *row;
  uint32_t regs[4];
};

struct MmaArgs {
  const uint32_t *a;
  const uint32_t *b;
  float *d;
};

template <class Args> Args &args_of(Launch &l, int w, int lane) {
  return *static_cast<Args *>(l.threads[(size_t)w * kWarpSize + lane].op_args);
}

// shfl.sync.bfly / .idx with c = 0x1f (full-warp segment), PTX ISA "shfl.sync":
//   bfly: j = lane ^ b, and a lane whose j falls outside the warp (j > 31) keeps its own value;
//   idx:  j = b[4:0].
void complete_shfl(Launch &l, int w, bool xor_mode) {
  uint32_t value[kWarpSize];
  for (int i = 0; i < kWarpSize; ++i) value[i] = args_of<ShflArgs>(l, w, i).value;
  for (int i = 0; i < kWarpSize; ++i) {
    ShflArgs &a = args_of<ShflArgs>(l, w, i);
    uint32_t j = xor_mode ? (uint32_t)i ^ (uint32_t)a.operand : (uint32_t)a.operand & 31u;
    a.result = value[j < (uint32_t)kWarpSize ? j : (uint32_t)i];
  }
}

void complete_ballot(Launch &l, int w) {
  uint32_t bits = 0;
  for (int i = 0; i < kWarpSize; ++i) bits |= (uint32_t)args_of<BallotArgs>(l, w, i).pred << i;
  for (int i = 0; i < kWarpSize; ++i) args_of<BallotArgs>(l, w, i).result = bits;
}

// ldmatrix.sync.aligned.m8n8.x{1,2,4}{.trans}.shared.b16, PTX ISA "ldmatrix":
//  - matrix i (of `count`) has its 8 rows of 16 bytes at the addresses held by lanes 8i .. 8i+7 (the other
//    lanes' addresses are not used for .x1/.x2);
//  - register i of lane l receives matrix i's row l/4, elements 2(l%4) and 2(l%4)+1 (low half = the lower
//    column); with .trans it receives column l/4, elements 2(l%4) and 2(l%4)+1 instead.
void complete_ldmatrix(Launch &l, int w, int count, bool trans) {
  uint16_t m[4][8][8];
  uint32_t row_offsets[kWarpSize] = {};
  for (int i = 0; i < count; ++i) {
    for (int r = 0; r < 8; ++r) {
      const int src = 8 * i + r;
      const Thread &t = l.threads[(size_t)w * kWarpSize + src];
      const void *row = args_of<LdmatrixArgs>(l, w, src).row;
      l.shared.collective_read(t, m[i][r], row, 16, "ldmatrix row read");
      row_offsets[src] = (uint32_t)((const unsigned char *)row - l.shared.base());
    }
  }
  account_ldmatrix(l, row_offsets, count);
  for (int lane = 0; lane < kWarpSize; ++lane) {
    LdmatrixArgs &a = args_of<LdmatrixArgs>(l, w, lane);
    const int g = lane / 4, c = 2 * (lane % 4);
    for (int i = 0; i < count; ++i) {
      uint32_t lo = trans ? m[i][c][g] : m[i][g][c];
      uint32_t hi = trans ? m[i][c + 1][g] : m[i][g][c + 1];
      a.regs[i] = lo | hi << 16;
    }
  }
}

// mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32, PTX ISA "Matrix Fragments for
// mma.m16n8k16 with floating point type", with groupID g = lane >> 2 and t = lane % 4:
//  A (16x16, 4 regs, two elements each, low half first): a_i (element i) is at
//    row g for i in {0,1,4,5}, g + 8 otherwise; col 2t + (i & 1), plus 8 for i >= 4;
//    so register j holds row g + 8*(j & 1), cols 2t + 8*(j >> 1) + {0,1}.
//  B (16x8, 2 regs): b_i at row 2t + (i & 1), plus 8 for i >= 2; col g;
//    so register j holds rows 2t + 8j + {0,1} of column g.
//  C/D (16x8 fp32, 4 values): c_i at row g for i < 2, g + 8 otherwise; col 2t + (i & 1).
// Arithmetic: every product of two 16-bit values is exact in fp32; each output starts from C and adds the 16
// products in k order, rounding to nearest after each addition.
template <bool kBf16> float to_float(uint16_t h) { return kBf16 ? bf16_to_float(h) : f16_to_float(h); }

template <bool kBf16> void complete_mma(Launch &l, int w) {
  float a[16][16], b[16][8], c[16][8];
  for (int lane = 0; lane < kWarpSize; ++lane) {
    const MmaArgs &m = args_of<MmaArgs>(l, w, lane);
    const int g = lane >> 2, t = lane & 3;
    for (int j = 0; j < 4; ++j) {
      const int row = g + 8 * (j & 1), col = 2 * t + 8 * (j >> 1);
      const uint32_t r = m.a[j];
      a[row][col] = to_float<kBf16>((uint16_t)r);
      a[row][col + 1] = to_float<kBf16>((uint16_t)(r >> 16));
    }
    for (int j = 0; j < 2; ++j) {
      const int row = 2 * t + 8 * j;
      const uint32_t r = m.b[j];
      b[row][g] = to_float<kBf16>((uint16_t)r);
      b[row + 1][g] = to_float<kBf16>((uint16_t)(r >> 16));
    }
    for (int i = 0; i < 4; ++i) c[g + 8 * (i >> 1)][2 * t + (i & 1)] = m.d[i];
  }
  // Two rows at a time, each row's 8 sums as two 4-wide vectors (GCC vector extensions): every output still
  // adds its 16 products in k order, one rounding per product (exact anyway) and per addition, as the
  // scalar loop would; four independent chains keep the host's adders busy (the emulator's hottest loop).
  typedef float f32x4 __attribute__((vector_size(16)));
  for (int row = 0; row < 16; row += 2) {
    f32x4 acc[4];
    memcpy(acc, &c[row][0], sizeof acc); // rows row and row + 1: c is contiguous
    for (int k = 0; k < 16; ++k) {
      f32x4 b_lo, b_hi;
      memcpy(&b_lo, &b[k][0], sizeof b_lo);
      memcpy(&b_hi, &b[k][4], sizeof b_hi);
      const float x0 = a[row][k], x1 = a[row + 1][k];
      acc[0] += x0 * b_lo;
      acc[1] += x0 * b_hi;
      acc[2] += x1 * b_lo;
      acc[3] += x1 * b_hi;
    }
    memcpy(&c[row][0], acc, sizeof acc);
  }
  for (int lane = 0; lane < kWarpSize; ++lane) {
    MmaArgs &m = args_of<MmaArgs>(l, w, lane);
    const int g = lane >> 2, t = lane & 3;
    for (int i = 0; i < 4; ++i) m.d[i] = c[g + 8 * (i >> 1)][2 * t + (i & 1)];
  }
}

} // namespace

void complete_collective(Launch &l, int w) {
  // The scheduler only gets here when all 32 lanes arrived with the same op and key: lane 0 speaks for all.
  const Thread *t = &l.threads[(size_t)w * kWarpSize];
  switch (t->op) {
  case Op::SyncWarp: break;
  case Op::Shfl:
    complete_shfl(l, w, t->op_key == 0);
    l.counters.shuffles += 1;
    break;
  case Op::Ballot: complete_ballot(l, w); break;
  case Op::Ldmatrix:
    complete_ldmatrix(l, w, (int)(t->op_key & 7), (t->op_key & 8) != 0);
    l.counters.ldmatrix += 1;
    l.counters.shared_bytes_read += 8 * 16 * (t->op_key & 7); // 8 rows of 16 bytes per matrix
    break;
  case Op::Mma:
    if (t->op_key != 0) {
      complete_mma<true>(l, w);
    } else {
      complete_mma<false>(l, w);
    }
    l.counters.mma += 1;
    break;
  default: break; // barriers and warpgroup ops are resolved by the scheduler
  }
}

} // namespace detail

using namespace detail;

void sync_warp() { arrive(Op::SyncWarp, 0, nullptr); }

uint32_t shfl(uint32_t v, ShflMode mode, int arg) {
  ShflArgs args{v, arg, 0};
  arrive(Op::Shfl, mode == ShflMode::Xor ? 0 : 1, &args);
  return args.result;
}

uint32_t ballot(bool p) {
  BallotArgs args{p, 0};
  arrive(Op::Ballot, 0, &args);
  return args.result;
}

void ldmatrix(uint32_t *r, int count, bool trans, const void *row) {
  if (count != 1 && count != 2 && count != 4) fault(current_thread(), "ldmatrix.x%d: only x1, x2 and x4 exist", count);
  LdmatrixArgs args{row, {0, 0, 0, 0}};
  arrive(Op::Ldmatrix, (uint32_t)count | (trans ? 8u : 0u), &args);
  memcpy(r, args.regs, sizeof(uint32_t) * (size_t)count);
}

void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], MmaType type) {
  MmaArgs args{a, b, d};
  arrive(Op::Mma, type == MmaType::F16 ? 0 : 1, &args);
}

} // namespace emu
} // namespace fa
