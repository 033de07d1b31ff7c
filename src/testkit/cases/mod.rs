//! One harness per op: the shapes of its correctness sweep and performance report, the fixture that makes
//! a case's inputs from its seed, and the runs that compare it with the fp64 reference (emulator or GPU) and
//! time it. A paged case's cache is 16-bit or FP8 by a field of the case ([`kv::KvFormat`]): one case type,
//! fixture and run serve both.

pub mod decode;
pub mod kv;
pub mod paged_prefill;
pub mod prefill;
