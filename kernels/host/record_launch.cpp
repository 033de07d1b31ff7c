// FA_EXEC_RECORD: a launcher's launch, kept for the Rust side to enqueue with cuLaunchKernel (abi.h, FaExec).
#include <string.h>

#include "fa/intrinsics.cuh"

namespace fa {

int record_launch(FaExec *exec, const char *name, Dim3 grid, int block, int smem_bytes, const void *params,
                  size_t params_bytes) {
  if (exec->num_launches < 0 || exec->num_launches >= FA_MAX_LAUNCHES) return FA_ERR_TOO_MANY_LAUNCHES;
  if (params_bytes > sizeof(FaKernelLaunch::params)) return FA_ERR_INVALID;
  if (grid.x < 1 || grid.y < 1 || grid.z < 1 || grid.y > 65535 || grid.z > 65535 || block < 1 || smem_bytes < 0)
    return FA_ERR_INVALID;
  FaKernelLaunch &l = exec->launches[exec->num_launches++];
  l.kernel = name;
  l.grid[0] = grid.x;
  l.grid[1] = grid.y;
  l.grid[2] = grid.z;
  l.block = block;
  l.smem_bytes = smem_bytes;
  l.params_bytes = (int32_t)params_bytes;
  memset(l.params, 0, sizeof l.params);
  memcpy(l.params, params, params_bytes);
  return FA_OK;
}

} // namespace fa
