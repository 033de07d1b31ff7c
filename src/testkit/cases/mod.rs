//! One harness per op: the shapes of its correctness sweep and performance report, the fixture that makes
//! a case's inputs from its seed, and the runs that compare it with the fp64 reference (emulator or GPU) and
//! time it. A paged case's cache is 16-bit or FP8 by a field of the case ([`kv::KvFormat`]): one case type,
//! fixture and run serve both.

pub mod append;
pub mod decode;
pub mod kv;
pub mod mla;
pub mod paged_prefill;
pub mod prefill;

/// `$body` with `$t` the 16-bit element type of the runtime dtype `$dtype` (`half::f16` or `half::bf16`):
/// how a harness calls its generic run for a case's dtype.
macro_rules! with_dtype {
    ($dtype:expr, $t:ident => $body:expr) => {
        match $dtype {
            $crate::dtype::DType::F16 => {
                type $t = half::f16;
                $body
            }
            $crate::dtype::DType::Bf16 => {
                type $t = half::bf16;
                $body
            }
        }
    };
}
pub(crate) use with_dtype;
