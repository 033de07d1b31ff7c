//! What the test fixtures put in the memory a call's mask hides (docs/semantics.md, "Hidden memory never
//! matters"; docs/hidden-memory.md): the padding of strided tensors, cache slots past `seq_len`, pages no
//! sequence uses, and cache slots no query row sees (left of every row's window). The kernels must never
//! let those bytes reach an output, so the fixtures fill them with a value that would show if they did.
//!
//! `FA_POISON` picks the value: `nan` (the default), `inf`, `-inf`, or `zero` (to compare a failing case
//! against clean hidden memory). An unknown value panics, naming the choices: a typo must not silently test
//! with NaN.

use crate::dtype::Element;
use crate::mask::Window;

/// The poison of hidden memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Poison {
    Nan,
    PosInf,
    NegInf,
    Zero,
}

impl Poison {
    /// The value `FA_POISON` names (default NaN).
    pub fn from_env() -> Self {
        match std::env::var("FA_POISON").as_deref() {
            Err(_) | Ok("") | Ok("nan") => Poison::Nan,
            Ok("inf") => Poison::PosInf,
            Ok("-inf") => Poison::NegInf,
            Ok("zero") => Poison::Zero,
            Ok(other) => panic!("FA_POISON={other}: expected nan, inf, -inf or zero"),
        }
    }

    pub fn value<T: Element>(self) -> T {
        T::from_f64(match self {
            Poison::Nan => f64::NAN,
            Poison::PosInf => f64::INFINITY,
            Poison::NegInf => f64::NEG_INFINITY,
            Poison::Zero => 0.0,
        })
    }
}

/// The poison `FA_POISON` names, as a `T`.
pub fn hidden<T: Element>() -> T {
    Poison::from_env().value()
}

/// One sequence of a paged cache as the fixtures describe it: its block-table row, how many query rows it
/// has (1 for decode) and its length.
#[derive(Debug, Clone, Copy)]
pub struct SeqRows<'a> {
    pub pages: &'a [i32],
    pub q_len: usize,
    pub seq_len: usize,
}

/// Fills every cache slot (`token` elements each of K, V's slots as many of its own length, `page_size`
/// slots per page) that no query row of any sequence sees under `window` with the poison: slots past
/// `seq_len`, pages nobody names, and keys left of every row's window. A slot shared by several sequences
/// (prefix caching) stays if any of them sees it.
pub fn poison_unseen_slots<'a, T: Element>(
    k: &mut [T],
    v: &mut [T],
    token: usize,
    page_size: usize,
    seqs: impl IntoIterator<Item = SeqRows<'a>>,
    window: Window,
) {
    let slots = k.len() / token;
    // V's slots: as many, of V's own head dim (a V head dim of its own, docs/head-dims.md).
    let v_token = v.len().checked_div(slots).unwrap_or(0);
    let mut seen = vec![false; slots];
    for s in seqs {
        // The keys some row sees: the union of the rows' ranges (each contiguous, moving with the row).
        let (mut lo, mut hi) = (usize::MAX, 0);
        for i in 0..s.q_len {
            let (a, b) = window.visible_range(i, s.q_len, s.seq_len);
            if a < b {
                lo = lo.min(a);
                hi = hi.max(b);
            }
        }
        for t in lo.min(hi)..hi {
            if let Some(&page) = s.pages.get(t / page_size) {
                if let Ok(page) = usize::try_from(page) {
                    if let Some(slot) = seen.get_mut(page * page_size + t % page_size) {
                        *slot = true;
                    }
                }
            }
        }
    }
    let poison = hidden::<T>();
    for (slot, _) in seen.iter().enumerate().filter(|(_, &s)| !s) {
        k[slot * token..(slot + 1) * token].fill(poison);
        v[slot * v_token..(slot + 1) * v_token].fill(poison);
    }
}
