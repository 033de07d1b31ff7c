// Each op's tile policy (host build): the kernel its launcher dispatches for a class of calls and that
// kernel's launch shape, read from the same traits the launcher uses. fa_tile_policy (abi.h,
// kernels/host/tile_policy.cpp) is their one entry point for the Rust side.
#pragma once

#include "fa/abi.h"

namespace fa {
namespace prefill {
int tile_policy(int head_dim, bool variant, FaTilePolicy *out); // kernels/prefill.cu
int tile_policy_pair(int head_dim, int head_dim_v, bool variant, FaTilePolicy *out); // kernels/prefill.cu
}
namespace hopper {
int tile_policy(int head_dim, int head_dim_v, bool masked, FaTilePolicy *out); // kernels/prefill_sm90.cu
}
namespace paged_prefill {
int tile_policy(int head_dim, bool fp8, FaTilePolicy *out); // kernels/paged_prefill.cu
}
namespace decode {
int tile_policy(int head_dim, bool fp8, FaTilePolicy *out); // kernels/decode.cu
}
} // namespace fa
