// Rotary position embedding (docs/rope.md; the ABI in fa/abi.h, FaRope): which element pairs rotate, the
// table lookup and the one rotation formula every kernel uses. The frequencies live in the table the host
// built (src/rope.rs), so this header knows nothing of θ or scaling schemes: one code path serves the
// default, linear, NTK, Llama-3 and YaRN tables alike, and large positions lose nothing to an in-kernel
// sincos of a large fp32 angle.
#pragma once

#include <math.h>

#include "fa/abi.h"
#include "fa/intrinsics.cuh"
#include "fa/namespace.cuh"

FA_NAMESPACE_BEGIN

FA_DEVICE bool rope_enabled(const FaRope &r) { return r.cos != nullptr; }

// Table row of position `pos`, clamped into [0, max_pos) (device data: a bad position must not address
// memory outside the table; the Rust layer rejects the ones it can read).
FA_DEVICE int rope_row(const FaRope &r, int64_t pos) {
  return pos < 0 ? 0 : (pos >= r.max_pos ? r.max_pos - 1 : (int)pos);
}

// Element j (< rotary_dim) of a head row: its pair index i (the table column), its partner's column, and
// whether it is the pair's first element (a) or second (b).
struct RopePair {
  int index, partner;
  bool first;
};
FA_DEVICE RopePair rope_pair(int j, int rotary_dim, int style) {
  if (style == FA_ROPE_GPTJ) return RopePair{j >> 1, j ^ 1, (j & 1) == 0};
  const int half = rotary_dim >> 1;
  return j < half ? RopePair{j, j + half, true} : RopePair{j - half, j - half, false};
}

// The rotated value of element x whose partner is y: a' = a c - b s, b' = b c + a s, with one fma each so
// the rounding is the same everywhere (GPU, emulator, the Rust model in src/rope.rs).
FA_DEVICE float rope_rotate(float x, float y, float c, float s, bool first) {
  return first ? fmaf(x, c, -(y * s)) : fmaf(x, c, y * s);
}

// Loads the (cos, sin) of pair `index` at table row `row`.
FA_DEVICE void rope_cos_sin(const FaRope &r, int row, int index, float &c, float &s) {
  c = ld_global_nc(r.cos + (int64_t)row * r.cos_stride + index);
  s = ld_global_nc(r.sin + (int64_t)row * r.sin_stride + index);
}

#if defined(FA_HOST_BUILD)
// The launchers' re-check of what the Rust layer validates (off, or a table that covers the rotated dims).
inline bool valid_rope(const FaRope &r, int head_dim) {
  if (r.cos == nullptr) return true;
  if (r.sin == nullptr || r.max_pos < 1 || r.rotary_dim < 2 || r.rotary_dim % 2 != 0 || r.rotary_dim > head_dim)
    return false;
  if (r.style != FA_ROPE_NEOX && r.style != FA_ROPE_GPTJ) return false;
  if (r.cos_stride < r.rotary_dim / 2 || r.sin_stride < r.rotary_dim / 2) return false;
  return ((uintptr_t)r.cos & 3u) == 0 && ((uintptr_t)r.sin & 3u) == 0 && ((uintptr_t)r.positions & 3u) == 0;
}
#endif

FA_NAMESPACE_END
