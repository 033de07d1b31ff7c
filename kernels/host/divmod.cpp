// fa_host_divisor / fa_host_divmod (abi.h): the kernels' page-size division (fa/fast_divmod.cuh) as the host
// build runs it, so tests can check it against `/` and `%` and the Rust layer's constants against the
// launchers' definition.
#include "fa/fast_divmod.cuh"

extern "C" int fa_host_divisor(int32_t d, FaDivisor *out) {
  if (d < 1 || out == nullptr) return FA_ERR_INVALID;
  *out = fa::divisor_for(d);
  return FA_OK;
}

extern "C" void fa_host_divmod(FaDivisor div, int32_t d, const int64_t *n, int64_t *quot, int64_t *rem,
                               int64_t count, int32_t wide) {
  for (int64_t i = 0; i < count; ++i) {
    const int64_t q = wide ? fa::fast_div(div, n[i]) : (int64_t)fa::fast_div(div, (int)n[i]);
    quot[i] = q;
    rem[i] = n[i] - q * d;
  }
}
