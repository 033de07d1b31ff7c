//! What verifies and measures the crate rather than what ships in it (feature `testkit`, off by default;
//! this repository's tests and its runner turn it on): seeded fixtures, the case harnesses of every op (run one
//! case against the fp64 reference on the emulator or a GPU, time it), timing with CUDA events, the
//! analytic cost model the counters are checked against, and the wrappers of the emulator's self-test
//! kernels (kernels/selftest*.cu, which are compiled only with this feature).

pub mod cases;
pub mod cost_model;
pub mod emu_selftest;
pub mod poison;
pub mod rope;
pub mod seed;
pub mod timing;
pub mod variants;
