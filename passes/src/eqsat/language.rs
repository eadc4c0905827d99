//! The schedule language: one replica's forward and backward MicroPacks as a term.
//!
//! ```text
//! (replica
//!   (fseq (fpack (cons s0@0+512 (cons s1@0+300 nil)))      ; forward pack 0
//!   (fseq (fpack (cons s0@512+488 nil))                     ; forward pack 1
//!   (fkeep k2+6 end)))                                      ; forward packs 2..8, as they are
//!   (bseq (bpack (cons s0@512+488 (cons s1@0+300 nil)))     ; backward pack 0
//!   (bseq (bpack (cons s0@0+512 nil)) end)))                ; backward pack 1
//! ```
//!
//! - A slice is a leaf carrying its [`Span`]: the sample (its index among the replica's samples),
//!   the first token and the token count. Costs are not stored in the term; the cost function and
//!   the e-class analysis look them up from the span.
//! - A pack's slices are a binary cons list in canonical order (sample, then offset), so two packs
//!   holding the same slices are the same term and hash-cons to one e-class.
//! - A direction's packs are a cons list of packs in run order (`fseq` / `bseq`, ended by
//!   `end`); forward and backward have their own constructors so that a backward guard is never
//!   applied to a forward sequence that happens to hold the same packs.
//! - Only the packs worth regrouping are spelled out: a run of input packs left as they are is
//!   one `fkeep` / `bkeep` node holding a [`Kept`] leaf (its first position and pack count), so
//!   the e-graph of a replica of a hundred packs stays as small as the few packs in play.
//! - `replica` pairs a forward and a backward sequence.
//! - Rank merging works one level up, on which DP ranks run whole samples
//!   ([`super::rank_merge`]): `(pair A B M)` is an aligned pair of DP ranks `{a, a + 1}`, with
//!   `A` and `B` the samples of their plain replicas and `M` those of the DP-Merge group of the
//!   two; each is a `work` list of [`Whole`] leaves (`w3`: the pair's sample 3, the pair's
//!   samples numbered longest first), in increasing order, ended by `idle`:
//!   `(pair (work w0 (work w2 idle)) (work w3 idle) (work w1 idle))`.

use std::fmt;
use std::str::FromStr;

use egg::{define_language, Id};

/// Tokens `[start, start + len)` of the replica's sample number `sample`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Span {
    /// Index of the sample among the replica's samples (batch order).
    pub sample: u32,
    pub start: u32,
    pub len: u32,
}

impl Span {
    /// One past the last token.
    pub fn end(&self) -> u32 {
        self.start + self.len
    }
}

impl fmt::Display for Span {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "s{}@{}+{}", self.sample, self.start, self.len)
    }
}

impl FromStr for Span {
    type Err = String;

    /// Parses `s<sample>@<start>+<len>` (the form [`Span`]'s `Display` writes).
    fn from_str(text: &str) -> Result<Span, String> {
        let bad = || format!("'{text}' is not a slice (expected s<sample>@<start>+<len>)");
        let rest = text.strip_prefix('s').ok_or_else(bad)?;
        let (sample, rest) = rest.split_once('@').ok_or_else(bad)?;
        let (start, len) = rest.split_once('+').ok_or_else(bad)?;
        let span = Span {
            sample: sample.parse().map_err(|_| bad())?,
            start: start.parse().map_err(|_| bad())?,
            len: len.parse().map_err(|_| bad())?,
        };
        if span.len == 0 {
            return Err(bad());
        }
        Ok(span)
    }
}

/// Input packs `[first, first + count)` of one direction, kept as they are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Kept {
    pub first: u32,
    pub count: u32,
}

impl fmt::Display for Kept {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "k{}+{}", self.first, self.count)
    }
}

impl FromStr for Kept {
    type Err = String;

    /// Parses `k<first>+<count>` (the form [`Kept`]'s `Display` writes).
    fn from_str(text: &str) -> Result<Kept, String> {
        let bad = || format!("'{text}' is not a run of kept packs (expected k<first>+<count>)");
        let (first, count) = text
            .strip_prefix('k')
            .and_then(|rest| rest.split_once('+'))
            .ok_or_else(bad)?;
        let kept = Kept {
            first: first.parse().map_err(|_| bad())?,
            count: count.parse().map_err(|_| bad())?,
        };
        if kept.count == 0 {
            return Err(bad());
        }
        Ok(kept)
    }
}

/// A whole sample of a rank pair: its index among the pair's samples (longest first).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Whole(pub u32);

impl fmt::Display for Whole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "w{}", self.0)
    }
}

impl FromStr for Whole {
    type Err = String;

    /// Parses `w<index>` (the form [`Whole`]'s `Display` writes).
    fn from_str(text: &str) -> Result<Whole, String> {
        text.strip_prefix('w')
            .and_then(|index| index.parse().ok())
            .map(Whole)
            .ok_or_else(|| format!("'{text}' is not a whole sample (expected w<index>)"))
    }
}

define_language! {
    /// One replica's schedule (see the module header).
    pub enum Schedule {
        "nil" = Nil,
        "cons" = Cons([Id; 2]),
        "fpack" = ForwardPack(Id),
        "bpack" = BackwardPack(Id),
        "end" = End,
        "fseq" = ForwardSeq([Id; 2]),
        "bseq" = BackwardSeq([Id; 2]),
        "fkeep" = ForwardKeep([Id; 2]),
        "bkeep" = BackwardKeep([Id; 2]),
        "replica" = Replica([Id; 2]),
        "idle" = Idle,
        "work" = Work([Id; 2]),
        "pair" = Pair([Id; 3]),
        Slice(Span),
        KeptPacks(Kept),
        WholeSample(Whole),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_print_and_parse_back() {
        let span = Span {
            sample: 3,
            start: 4096,
            len: 512,
        };
        assert_eq!(span.to_string(), "s3@4096+512");
        assert_eq!("s3@4096+512".parse::<Span>(), Ok(span));
        assert!("s3@4096+0".parse::<Span>().is_err());
        assert!("x3@1+2".parse::<Span>().is_err());
        assert_eq!("k2+5".parse::<Kept>(), Ok(Kept { first: 2, count: 5 }));
        assert!("k2+0".parse::<Kept>().is_err());
        assert_eq!("w7".parse::<Whole>(), Ok(Whole(7)));
        assert!("w".parse::<Whole>().is_err());
    }

    #[test]
    fn terms_parse_as_the_module_header_shows() {
        let text = "(replica (fseq (fpack (cons s0@0+8 nil)) (fkeep k1+3 end)) (bseq (bpack (cons s0@0+8 nil)) end))";
        let term: egg::RecExpr<Schedule> = text.parse().unwrap();
        assert_eq!(term.to_string(), text);
        let text = "(pair (work w0 (work w2 idle)) (work w3 idle) (work w1 idle))";
        let term: egg::RecExpr<Schedule> = text.parse().unwrap();
        assert_eq!(term.to_string(), text);
    }
}
