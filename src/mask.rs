//! Which keys a query row sees, and which KV tiles a query tile visits: the window / causal mask of
//! docs/semantics.md as pure functions, shared by the ops' host policy, the reference and the harnesses.
//! Row i (of Tq) sees key j (of Tk) iff `i + δ − left ≤ j ≤ i + δ + right` and `0 ≤ j < Tk`, δ = Tk − Tq;
//! [`kv_block_range`] is exactly the kernels' (kernels/include/fa/prefill/block_range.cuh). A leaf: it
//! depends on nothing else in the crate.

/// The KV tiles one query tile visits: `[n_begin, n_end)`, walked downward: `[n_mask_begin, n_end)` need
/// the mask (right edge, causal diagonal, ragged Tk), `[n_interior_begin, n_mask_begin)` do not, and
/// `[n_begin, n_interior_begin)` need it again (the window's left edge).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvBlockRange {
    pub n_begin: usize,
    pub n_end: usize,
    pub n_mask_begin: usize,
    pub n_interior_begin: usize,
}

/// A query tile's view of the keys: row i sees key j iff `i + δ − left ≤ j ≤ i + δ + right` (and j < Tk),
/// δ = Tk − Tq; `None` bounds are unbounded (causal is `right = Some(0)`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Window {
    pub left: Option<usize>,
    pub right: Option<usize>,
}

impl Window {
    /// Plain attention (`causal = false`) or the causal mask.
    pub fn causal(causal: bool) -> Self {
        Self { left: None, right: causal.then_some(0) }
    }
    /// The window a call applies: `(left, right)` bounds (−1 unbounded) and causal (right 0).
    pub fn new(window: Option<(i32, i32)>, causal: bool) -> Self {
        let (l, r) = window.unwrap_or((-1, -1));
        Self { left: usize::try_from(l).ok(), right: if causal { Some(0) } else { usize::try_from(r).ok() } }
    }
    /// Whether row `i` (of `tq`) sees key `j` (of `tk`).
    pub fn sees(&self, i: usize, j: usize, tq: usize, tk: usize) -> bool {
        let (pos, j) = ((i + tk) as i64 - tq as i64, j as i64);
        j < tk as i64 && self.left.is_none_or(|l| j >= pos - l as i64) && self.right.is_none_or(|r| j <= pos + r as i64)
    }
    /// The keys `[lo, hi)` row `i` (of `tq`) sees among `tk` (empty: lo == hi).
    pub fn visible_range(&self, i: usize, tq: usize, tk: usize) -> (usize, usize) {
        let pos = (i + tk) as i64 - tq as i64;
        let lo = self.left.map_or(0, |l| (pos - l as i64).max(0)).min(tk as i64);
        let hi = self.right.map_or(tk as i64, |r| (pos + r as i64 + 1).clamp(0, tk as i64));
        (lo as usize, hi.max(lo) as usize)
    }
    /// The keys left of every row's window (row 0's first visible key): hidden memory, which the
    /// dense prefill `_mod` kernels never load (kernels/prefill.cu moves the sequence's start past them).
    pub fn hidden_prefix(&self, tq: usize, tk: usize) -> usize {
        self.left.map_or(0, |l| tk.saturating_sub(tq + l))
    }
    /// The kernel's effective bounds: a bound that excludes nothing (None, or ≥ max(Tq, Tk)) is that span.
    fn effective(&self, tq: usize, tk: usize) -> (i64, i64) {
        let span = tq.max(tk) as i64;
        let eff = |b: Option<usize>| b.map_or(span, |b| (b as i64).min(span));
        (eff(self.left), eff(self.right))
    }
}

/// Which KV tiles the query tile of rows `[m0, m0 + block_m)` (clipped to `tq`) visits, and which need the
/// mask: exactly the kernel's `kv_block_range` (kernels/include/fa/prefill/block_range.cuh). Tiles holding
/// no key some row of the tile sees are skipped (above the diagonal, outside the window); a tile is
/// mask-free iff every row sees all its keys. `n_begin == n_end`: no row sees a key (O = 0, LSE = -inf).
pub fn kv_block_range(m0: usize, block_m: usize, block_n: usize, tq: usize, tk: usize, window: Window) -> KvBlockRange {
    let (left, right) = window.effective(tq, tk);
    let (m0, br, bc, tq, tk) = (m0 as i64, block_m as i64, block_n as i64, tq as i64, tk as i64);
    let diag = tk - tq;
    let last_row = if tq - m0 < br { tq } else { m0 + br } - 1;
    let first_key = (m0 + diag - left).max(0);
    let last_key = (last_row + diag + right).min(tk - 1);
    if last_key < first_key {
        return KvBlockRange { n_begin: 0, n_end: 0, n_mask_begin: 0, n_interior_begin: 0 };
    }
    let (n_begin, n_end) = (first_key / bc, last_key / bc + 1);
    let all_lo = (last_row + diag - left).max(0);
    let all_hi = (m0 + diag + right).min(tk - 1);
    let n_mask_begin = if all_hi < 0 { 0 } else { (all_hi + 1) / bc }.clamp(n_begin, n_end);
    let n_interior_begin = ((all_lo + bc - 1) / bc).clamp(n_begin, n_mask_begin);
    let u = |x: i64| x as usize;
    KvBlockRange {
        n_begin: u(n_begin),
        n_end: u(n_end),
        n_mask_begin: u(n_mask_begin),
        n_interior_begin: u(n_interior_begin),
    }
}
