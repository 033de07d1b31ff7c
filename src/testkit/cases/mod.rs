//! One harness per op: the shapes of its correctness sweep and performance report, the fixture that makes
//! a case's inputs from its seed, and the runs that compare it with the fp64 reference (emulator or GPU) and
//! time it. FP8 caches are cases of the decode and paged-prefill harnesses.

pub mod decode;
pub mod decode_fp8;
pub mod paged_prefill;
pub mod paged_prefill_fp8;
pub mod prefill;
