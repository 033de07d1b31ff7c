// fa_host_float_to_16 / fa_host_16_to_float (abi.h): the host build's 16-bit conversions, for tests.
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
