// Approximate math as the GPU computes it.
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "fa/abi.h"
#include "launch.h"

namespace fa {
namespace emu {

// ex2.approx.ftz.f32: 2^x with subnormal inputs treated as zero and subnormal results flushed to +0.
// The GPU's result is within 2 ulp of exact; exp2f is within 1 ulp, so emulated softmax can differ from the
// GPU's in the last bits but never in kind (-inf -> +0, +inf -> +inf, NaN -> NaN).
// The model alone (no counting): also what the PTX executor runs for ex2.approx.ftz.f32
// (fa_host_ex2_approx_ftz below, docs/ptx-executor.md).
static float exp2_approx_model(float x) {
  uint32_t bits;
  memcpy(&bits, &x, 4);
  if ((bits & 0x7f800000u) == 0) return 1.0f;
  float y = exp2f(x);
  memcpy(&bits, &y, 4);
  if ((bits & 0x7f800000u) == 0) return 0.0f;
  return y;
}

float exp2_approx(float x) {
  // Counted per calling lane. Outside a launch (host code calling the device function) nothing is counted.
  if (detail::Launch *l = detail::launch_on_this_thread()) l->counters.exp2 += 1;
  return exp2_approx_model(x);
}

} // namespace emu
} // namespace fa

extern "C" float fa_host_ex2_approx_ftz(float x) { return fa::emu::exp2_approx_model(x); }
