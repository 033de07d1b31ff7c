// The FP8-cache decode kernels as an nvcc job of their own: kernels/decode.cu with FA_DECODE_FP8_JOB
// instantiates only those (and the file itself only the 16-bit-cache ones), so only they pay for the
// compute_89 front end and the sm_89 SASS of the hardware FP8 conversion (build.rs: code_changes_at). Empty in
// the host build, where kernels/decode.cu has every kernel and the launcher.
#if defined(__CUDACC__)
#define FA_DECODE_FP8_JOB 1
#include "decode.cu"
#endif
