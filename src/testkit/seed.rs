//! Seeds of every randomised fixture (tests, the runner's cases, benches): one portable generator and one
//! seeding policy, so that a run is reproducible by default and a failure can be replayed exactly.
//!
//! - The generator is ChaCha8 ([`rand_chacha::ChaCha8Rng`]): its output for a seed is fixed by the algorithm
//!   (unlike `rand::rngs::StdRng`, which may change between rand versions) and identical on every platform.
//! - Every test starts from [`base_seed`]: [`DEFAULT_BASE_SEED`] unless `FA_SEED` is set (decimal or `0x` hex),
//!   so two runs of the suite use the same inputs and `FA_SEED=<n>` explores others. Each case derives its
//!   own seed from the base and a case index with [`case_seed`].

use rand::SeedableRng;

/// The fixtures' generator.
pub type FixtureRng = rand_chacha::ChaCha8Rng;

/// A generator seeded with `seed`.
pub fn rng(seed: u64) -> FixtureRng {
    FixtureRng::seed_from_u64(seed)
}

/// The base seed when `FA_SEED` is not set.
pub const DEFAULT_BASE_SEED: u64 = 0x9e11_f111;

/// Parses a seed as decimal or `0x`-prefixed hex.
pub fn parse_seed(s: &str) -> Option<u64> {
    let s = s.trim();
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(&hex.replace('_', ""), 16).ok(),
        None => s.replace('_', "").parse().ok(),
    }
}

/// `FA_SEED` if it is set and parses, else [`DEFAULT_BASE_SEED`]. An unparsable `FA_SEED` is not silently
/// ignored by the tests: they print the base seed they used in every failure message.
pub fn base_seed() -> u64 {
    std::env::var("FA_SEED").ok().as_deref().and_then(parse_seed).unwrap_or(DEFAULT_BASE_SEED)
}

/// The seed of case `index` under `base` (distinct, well-mixed streams for neighbouring indices).
pub fn case_seed(base: u64, index: u64) -> u64 {
    base ^ index.wrapping_add(1).wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(17)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::Rng;

    const PINNED_SEED_7: u64 = 2_910_824_217_569_608_635;

    #[test]
    fn seeding_is_reproducible_and_parses_both_bases() {
        let mut a = rng(7);
        let mut b = rng(7);
        let (xa, xb): (Vec<u64>, Vec<u64>) =
            ((0..4).map(|_| a.random()).collect(), (0..4).map(|_| b.random()).collect());
        assert_eq!(xa, xb);
        assert_ne!(rng(7).random::<u64>(), rng(8).random::<u64>());
        // Pinned: the generator's output for a seed must not change under us (every fixture would silently
        // change, and recorded seeds would no longer reproduce their failures).
        assert_eq!(rng(7).random::<u64>(), PINNED_SEED_7);
        assert_eq!(parse_seed("0x10"), Some(16));
        assert_eq!(parse_seed("1_000"), Some(1000));
        assert_eq!(parse_seed("x"), None);
        assert_ne!(case_seed(1, 0), case_seed(1, 1));
        assert_ne!(case_seed(1, 0), 1);
    }
}
