// fa_tile_policy (abi.h): which kernel a class of calls runs and its launch shape, per op.
#include "fa/tile_policy.h"

extern "C" int fa_tile_policy(int32_t op, int32_t head_dim, int32_t variant, int32_t kv_dtype, FaTilePolicy *out) {
  if (out == nullptr) return FA_ERR_INVALID;
  if (kv_dtype != FA_KV_SAME && kv_dtype != FA_KV_FP8_E4M3 && kv_dtype != FA_KV_FP8_E5M2) return FA_ERR_UNSUPPORTED;
  const bool fp8 = kv_dtype != FA_KV_SAME;
  switch (op) {
  case FA_OP_PREFILL: return fp8 ? FA_ERR_UNSUPPORTED : fa::prefill::tile_policy(head_dim, variant != 0, out);
  case FA_OP_PREFILL_SM90: return fp8 ? FA_ERR_UNSUPPORTED : fa::hopper::tile_policy(head_dim, head_dim, variant != 0, out);
  case FA_OP_PAGED_PREFILL: return fa::paged_prefill::tile_policy(head_dim, fp8, out);
  case FA_OP_DECODE: return fa::decode::tile_policy(head_dim, fp8, out);
  default: return FA_ERR_INVALID;
  }
}

extern "C" int fa_prefill_tile_policy(int32_t head_dim, int32_t head_dim_v, int32_t variant, FaTilePolicy *out) {
  if (out == nullptr) return FA_ERR_INVALID;
  return fa::prefill::tile_policy_pair(head_dim, head_dim_v, variant != 0, out);
}

extern "C" int fa_prefill_sm90_tile_policy(int32_t head_dim, int32_t head_dim_v, int32_t masked, FaTilePolicy *out) {
  if (out == nullptr) return FA_ERR_INVALID;
  return fa::hopper::tile_policy(head_dim, head_dim_v, masked != 0, out);
}
