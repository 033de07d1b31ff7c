//! The decode sweep (shared by the tests and the runner's `report` / `run --op decode`) and the host-side
//! fixture it runs on: a paged cache built the adversarial way. Pages are handed out in shuffled order,
//! page 0 is a reserved null page, every slot no sequence owns (the null page, spare pages, the tail of
//! each partial last page) holds NaN, and block-table columns past a sequence's pages point at the null
//! page. A kernel that reads or lets any of that leak produces NaN.

use crate::dtype::{DType, Element};

/// Sequence lengths of every sweep case: all of them in one batch (empty, single token, page and tile edges,
/// a long one that is not a multiple of anything).
pub const SWEEP_SEQ_LENS: [usize; 7] = [0, 1, 15, 16, 17, 1000, 4097];
pub const SWEEP_PAGE_SIZES: [usize; 5] = [1, 8, 16, 64, 256];
/// (Hq, Hkv): MHA, GQA 4, GQA 8, and MQA with 20 query heads (two 16-row CTA blocks, the second partial).
pub const SWEEP_HEADS: [(usize, usize); 4] = [(4, 4), (8, 2), (16, 2), (20, 1)];
pub const SWEEP_HEAD_DIMS: [usize; 3] = [64, 128, 256];
pub const SWEEP_DTYPES: [DType; 2] = [DType::F16, DType::Bf16];
/// Forced split counts, and `None` = the planner's choice.
pub const SWEEP_SPLITS: [Option<usize>; 4] = [Some(1), Some(2), Some(7), None];

/// One decode configuration: a batch of sequences of the given lengths over a paged cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeCase {
    pub dtype: DType,
    pub head_dim: usize,
    pub heads_q: usize,
    pub heads_kv: usize,
    pub page_size: usize,
    pub seq_lens: Vec<usize>,
    pub num_splits: Option<usize>,
}

impl DecodeCase {
    pub fn batch(&self) -> usize {
        self.seq_lens.len()
    }
    pub fn max_seq_len(&self) -> usize {
        self.seq_lens.iter().copied().max().unwrap_or(0)
    }
    /// K and V bytes the kernel must read (each cached token once per KV head), for bandwidth accounting.
    pub fn kv_bytes(&self) -> usize {
        self.seq_lens.iter().sum::<usize>() * self.heads_kv * self.head_dim * 2 * 2
    }
    pub fn label(&self) -> String {
        let splits = self.num_splits.map_or("planned".to_string(), |s| s.to_string());
        format!(
            "{} D={} Hq={} Hkv={} page={} splits={} lens={:?}",
            self.dtype.name(),
            self.head_dim,
            self.heads_q,
            self.heads_kv,
            self.page_size,
            splits,
            self.seq_lens
        )
    }
}

/// The full sweep: every page size x head layout x head dim x dtype x split choice (480 cases), each a
/// batch holding all of [`SWEEP_SEQ_LENS`]. What a GPU runs.
pub fn decode_sweep() -> Vec<DecodeCase> {
    let mut cases = Vec::new();
    for &page_size in &SWEEP_PAGE_SIZES {
        for &(heads_q, heads_kv) in &SWEEP_HEADS {
            for &head_dim in &SWEEP_HEAD_DIMS {
                for &dtype in &SWEEP_DTYPES {
                    for &num_splits in &SWEEP_SPLITS {
                        cases.push(DecodeCase {
                            dtype,
                            head_dim,
                            heads_q,
                            heads_kv,
                            page_size,
                            seq_lens: SWEEP_SEQ_LENS.to_vec(),
                            num_splits,
                        });
                    }
                }
            }
        }
    }
    cases
}

/// A representative subset for the host emulator: every value of every sweep dimension appears, and the
/// five page sizes each meet every split choice and both dtypes; 20 cases instead of 480.
pub fn decode_sweep_emulated() -> Vec<DecodeCase> {
    (0..20)
        .map(|i| DecodeCase {
            dtype: SWEEP_DTYPES[i % 2],
            head_dim: SWEEP_HEAD_DIMS[i % 3],
            heads_q: SWEEP_HEADS[(i / 5 + i) % 4].0,
            heads_kv: SWEEP_HEADS[(i / 5 + i) % 4].1,
            page_size: SWEEP_PAGE_SIZES[i % 5],
            seq_lens: SWEEP_SEQ_LENS.to_vec(),
            num_splits: SWEEP_SPLITS[(i / 5) % 4],
        })
        .collect()
}

/// SplitMix64: a tiny, seedable generator for fixtures (the crate has no RNG dependency).
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [lo, hi).
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64)
    }
    /// Uniform in 0..n (n > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            v.swap(i, self.below(i + 1));
        }
    }
}

/// Host data of one case: the paged cache (NaN wherever no sequence owns a slot), the block table, the
/// lengths and the queries. Element layouts: k/v_cache [num_pages, page_size, Hkv, D], block_table
/// [B, width], q [B, Hq, D].
#[derive(Debug, Clone)]
pub struct PagedFixture<T> {
    pub case: DecodeCase,
    pub num_pages: usize,
    pub width: usize,
    pub k_cache: Vec<T>,
    pub v_cache: Vec<T>,
    pub block_table: Vec<i32>,
    pub seq_lens: Vec<i32>,
    pub q: Vec<T>,
}

impl<T: Element> PagedFixture<T> {
    /// Builds the fixture from `seed`. Values: q and K uniform in [-2, 2) (so softmax is far from uniform
    /// at scale 1/sqrt(D)), V uniform in [-0.5, 1.5) (offset so outputs are not ~ 0).
    pub fn new(case: &DecodeCase, seed: u64) -> Self {
        let mut rng = SplitMix64::new(seed);
        let (ps, hkv, d) = (case.page_size, case.heads_kv, case.head_dim);
        let pages_of: Vec<usize> = case.seq_lens.iter().map(|&n| n.div_ceil(ps)).collect();
        // One spare column of table per sequence (pointing at the null page) and two spare pages.
        let width = pages_of.iter().copied().max().unwrap_or(0) + 1;
        let num_pages = 1 + pages_of.iter().sum::<usize>() + 2;
        let mut ids: Vec<i32> = (1..num_pages as i32).collect();
        rng.shuffle(&mut ids);
        let mut block_table = vec![0i32; case.batch() * width];
        let row = ps * hkv * d;
        let mut k_cache = vec![T::nan(); num_pages * row];
        let mut v_cache = vec![T::nan(); num_pages * row];
        let mut next = 0;
        for (b, &len) in case.seq_lens.iter().enumerate() {
            for p in 0..pages_of[b] {
                block_table[b * width + p] = ids[next];
                next += 1;
            }
            for t in 0..len {
                let page = block_table[b * width + t / ps] as usize;
                let base = (page * ps + t % ps) * hkv * d;
                for i in 0..hkv * d {
                    k_cache[base + i] = T::from_f64(rng.uniform(-2.0, 2.0));
                    v_cache[base + i] = T::from_f64(rng.uniform(-0.5, 1.5));
                }
            }
        }
        let q = (0..case.batch() * case.heads_q * d).map(|_| T::from_f64(rng.uniform(-2.0, 2.0))).collect();
        let seq_lens = case.seq_lens.iter().map(|&n| n as i32).collect();
        Self { case: case.clone(), num_pages, width, k_cache, v_cache, block_table, seq_lens, q }
    }

    pub fn cache_shape(&self) -> [usize; 4] {
        [self.num_pages, self.case.page_size, self.case.heads_kv, self.case.head_dim]
    }

    /// Slot (page * page_size + offset) of token t of sequence b.
    pub fn slot(&self, b: usize, t: usize) -> usize {
        let ps = self.case.page_size;
        self.block_table[b * self.width + t / ps] as usize * ps + t % ps
    }

    /// Dense K and V of sequence b, [len, Hkv, D], gathered through the block table.
    pub fn dense_kv(&self, b: usize) -> (Vec<T>, Vec<T>) {
        let row = self.case.heads_kv * self.case.head_dim;
        let (mut k, mut v) = (Vec::new(), Vec::new());
        for t in 0..self.case.seq_lens[b] {
            let s = self.slot(b, t) * row;
            k.extend_from_slice(&self.k_cache[s..s + row]);
            v.extend_from_slice(&self.v_cache[s..s + row]);
        }
        (k, v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::bf16;

    #[test]
    fn sweep_sizes_and_coverage() {
        assert_eq!(decode_sweep().len(), 480);
        let emu = decode_sweep_emulated();
        for &p in &SWEEP_PAGE_SIZES {
            for &s in &SWEEP_SPLITS {
                assert!(emu.iter().any(|c| c.page_size == p && c.num_splits == s), "page {p} splits {s:?}");
            }
        }
        for &h in &SWEEP_HEADS {
            assert!(emu.iter().any(|c| (c.heads_q, c.heads_kv) == h));
        }
        for &d in &SWEEP_HEAD_DIMS {
            for &t in &SWEEP_DTYPES {
                assert!(emu.iter().any(|c| c.head_dim == d && c.dtype == t));
            }
        }
    }

    #[test]
    fn fixture_poisons_everything_unowned() {
        let case = DecodeCase {
            dtype: DType::Bf16,
            head_dim: 64,
            heads_q: 4,
            heads_kv: 2,
            page_size: 8,
            seq_lens: vec![0, 3, 17],
            num_splits: None,
        };
        let f = PagedFixture::<bf16>::new(&case, 1);
        assert_eq!(f.width, 4);
        assert_eq!(f.num_pages, 1 + 0 + 1 + 3 + 2);
        let owned: usize = case.seq_lens.iter().sum::<usize>() * 2 * 64;
        let finite = f.k_cache.iter().filter(|x| x.to_f64().is_finite()).count();
        assert_eq!(finite, owned);
        // Every page id is used at most once and page 0 only as padding.
        let mut used: Vec<i32> = f.block_table.iter().copied().filter(|&p| p != 0).collect();
        used.sort();
        used.dedup();
        assert_eq!(used.len(), 4);
        let (k, _) = f.dense_kv(2);
        assert_eq!(k.len(), 17 * 2 * 64);
        assert!(k.iter().all(|x| x.to_f64().is_finite()));
    }
}
