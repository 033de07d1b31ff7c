// The FP8-cache paged prefill kernels as an nvcc job of their own: kernels/paged_prefill.cu with
// FA_PAGED_PREFILL_FP8_JOB instantiates only those (and the file itself only the 16-bit-cache ones), so the two
// halves of its nvcc time run in parallel, and only this half pays for the compute_89 front end its
// hardware FP8 conversions need (build.rs: code_changes_at). Empty in the host build, where
// kernels/paged_prefill.cu has every kernel and the launcher.
#if defined(__CUDACC__)
#define FA_PAGED_PREFILL_FP8_JOB 1
#include "paged_prefill.cu"
#endif
