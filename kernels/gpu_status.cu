// GPU-backend status strings for the Rust error layer (the emulator reports through FaEmuLaunch.message).
#include "fa/abi.h"

#if defined(__CUDACC__)
#include <cuda_runtime.h>

extern "C" const char *fa_gpu_error_string(int status) {
  switch (status) {
  case FA_ERR_INVALID: return "invalid launch parameters";
  case FA_ERR_UNSUPPORTED: return "no kernel for this configuration";
  case FA_ERR_NO_ARCH: return "no kernel image for this GPU architecture";
  default: return status > 0 ? cudaGetErrorString((cudaError_t)status) : "unknown status";
  }
}
#endif
