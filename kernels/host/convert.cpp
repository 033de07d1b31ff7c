// fa_host_float_to_16 / fa_host_16_to_float (abi.h): the host build's 16-bit conversions, for tests.
#include "fa/fp8_convert.cuh"
#include "fa/intrinsics.cuh"

extern "C" void fa_host_float_to_16(const float *in, uint16_t *out, int64_t n, int32_t dtype) {
  for (int64_t i = 0; i < n; ++i)
    out[i] = dtype == FA_DTYPE_BF16 ? fa::emu::float_to_bf16_bits(in[i]) : fa::emu::float_to_half_bits(in[i]);
}

extern "C" void fa_host_16_to_float(const uint16_t *in, float *out, int64_t n, int32_t dtype) {
  for (int64_t i = 0; i < n; ++i)
    out[i] = dtype == FA_DTYPE_BF16 ? fa::emu::bf16_bits_to_float(in[i]) : fa::emu::half_bits_to_float(in[i]);
}

extern "C" void fa_host_fp8_to_half(const uint8_t *in, uint16_t *out, int64_t n, int32_t kv_dtype) {
  using fa::Fp8Format;
  for (int64_t i = 0; i < n; ++i)
    out[i] = kv_dtype == FA_KV_FP8_E5M2 ? fa::fp8_to_half_bits_model<Fp8Format::E5M2>(in[i])
                                        : fa::fp8_to_half_bits_model<Fp8Format::E4M3>(in[i]);
}

extern "C" void fa_host_float_to_fp8(const float *in, uint8_t *out, int64_t n, int32_t kv_dtype) {
  using fa::Fp8Format;
  for (int64_t i = 0; i < n; ++i)
    out[i] = kv_dtype == FA_KV_FP8_E5M2 ? fa::fp8_from_float_model<Fp8Format::E5M2>(in[i])
                                        : fa::fp8_from_float_model<Fp8Format::E4M3>(in[i]);
}

namespace {
template <class T, fa::Fp8Format F> void fp8_to_16_fast(const uint8_t *in, uint16_t *out, int64_t n) {
  for (int64_t i = 0; i + 4 <= n; i += 4) {
    const uint32_t codes = (uint32_t)in[i] | (uint32_t)in[i + 1] << 8 | (uint32_t)in[i + 2] << 16 | (uint32_t)in[i + 3] << 24;
    uint32_t lo, hi;
    fa::fp8x4_to<T, F>(codes, lo, hi);
    const uint32_t w[2] = {lo, hi};
    for (int j = 0; j < 4; ++j) out[i + j] = (uint16_t)(w[j / 2] >> (16 * (j % 2)));
  }
}
} // namespace

extern "C" void fa_host_fp8_to_16_fast(const uint8_t *in, uint16_t *out, int64_t n, int32_t kv_dtype, int32_t dtype) {
  using fa::Fp8Format;
  const bool e5m2 = kv_dtype == FA_KV_FP8_E5M2;
  if (dtype == FA_DTYPE_BF16) {
    e5m2 ? fp8_to_16_fast<fa::bf16_t, Fp8Format::E5M2>(in, out, n) : fp8_to_16_fast<fa::bf16_t, Fp8Format::E4M3>(in, out, n);
  } else {
    e5m2 ? fp8_to_16_fast<fa::half_t, Fp8Format::E5M2>(in, out, n) : fp8_to_16_fast<fa::half_t, Fp8Format::E4M3>(in, out, n);
  }
}
