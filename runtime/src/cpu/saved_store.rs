//! Where a stage worker keeps saved activations between a slice's forward and its backward.
//!
//! A forward pack's activations stay one block (a [`PackRecord`]): splitting them per slice would
//! copy every saved tensor once in the forward and join them again in the backward. A backward
//! pack that takes a forward pack's slices all at once takes the block as it is, rows in the
//! forward's order — no copy. One that takes only some of a record's slices (asymmetric packs)
//! moves their rows out and closes the gap in place, so that memory is freed as soon as each
//! slice is backwarded, exactly as a per-slice store would, and no row ever exists twice.
//!
//! A padded forward pack's record also holds its padding's rows (after the slices' rows) and the
//! padding's keys and values; only a backward pack of the same slices can take it, whole.

use std::collections::BTreeMap;
use std::ops::Range;

use super::batch::TokenSlice;
use super::saved::SavedActivations;

/// A padded pack's padding tokens' keys and values, one `(keys, values)` pair per layer.
pub type PaddingKv = Vec<(Vec<f32>, Vec<f32>)>;

/// One forward pack's saved activations: its slices in row order and their rows, then its
/// padding's rows, if padded.
#[derive(Debug)]
struct PackRecord {
    slices: Vec<TokenSlice>,
    rows: Vec<usize>,
    saved: SavedActivations,
    /// Padding tokens after the slices (0: not padded) and their keys and values per layer.
    padding: usize,
    padding_kv: PaddingKv,
}

impl PackRecord {
    /// Row ranges of the record's slices that `wanted` says to keep, in row order, with them.
    fn ranges(
        &self,
        wanted: impl Fn(&TokenSlice) -> bool,
    ) -> (Vec<TokenSlice>, Vec<usize>, Vec<Range<usize>>) {
        let (mut slices, mut rows, mut ranges) = (Vec::new(), Vec::new(), Vec::new());
        let mut offset = 0;
        for (slice, &len) in self.slices.iter().zip(&self.rows) {
            if wanted(slice) {
                slices.push(*slice);
                rows.push(len);
                ranges.push(offset..offset + len);
            }
            offset += len;
        }
        (slices, rows, ranges)
    }
}

/// The saved activations of one stage worker's forwarded, not yet backwarded slices.
#[derive(Debug, Default)]
pub(crate) struct SavedStore {
    records: BTreeMap<u64, PackRecord>,
    record_of: BTreeMap<TokenSlice, u64>,
    next: u64,
}

impl SavedStore {
    /// Keeps a forward pack's activations: `slices` in row order, `rows` of each, then the rows
    /// of `padding` padding tokens with, per layer, their keys and values.
    pub fn insert(
        &mut self,
        slices: Vec<TokenSlice>,
        rows: Vec<usize>,
        saved: SavedActivations,
        (padding, padding_kv): (usize, PaddingKv),
    ) {
        let id = self.next;
        self.next += 1;
        for slice in &slices {
            self.record_of.insert(*slice, id);
        }
        let record = PackRecord {
            slices,
            rows,
            saved,
            padding,
            padding_kv,
        };
        self.records.insert(id, record);
    }

    /// Whether a backward pack of `slices` padded with `padding` tokens matches the forward:
    /// unpadded, it takes no slice of a padded forward pack; padded, it is exactly one forward
    /// pack with the same padding.
    pub fn padding_matches(&self, slices: &[TokenSlice], padding: usize) -> bool {
        let record = |s: &TokenSlice| self.record_of.get(s).map(|id| &self.records[id]);
        if padding == 0 {
            return slices.iter().filter_map(record).all(|r| r.padding == 0);
        }
        match slices.first().and_then(record) {
            Some(r) => {
                r.padding == padding
                    && r.slices.len() == slices.len()
                    && slices.iter().all(|s| r.slices.contains(s))
            }
            None => false,
        }
    }

    /// Whether the forward of exactly this slice is saved.
    pub fn contains(&self, slice: &TokenSlice) -> bool {
        self.record_of.contains_key(slice)
    }

    /// Nothing is saved.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Bytes allocated: `(padding keys and values, activations)`.
    pub fn bytes(&self) -> (usize, usize) {
        let mut kv = 0;
        let mut activations = 0;
        for record in self.records.values() {
            activations += record.saved.bytes();
            kv += record
                .padding_kv
                .iter()
                .map(|(k, v)| (k.capacity() + v.capacity()) * 4)
                .sum::<usize>();
        }
        (kv, activations)
    }

    /// Takes the activations of `slices` (all saved): returns the slices in the row order of the
    /// block, and the block. Records are visited in the order they were saved. A padded record
    /// is only taken whole (see [`SavedStore::padding_matches`]): its padding's rows end the block.
    #[allow(clippy::type_complexity)]
    pub fn take(
        &mut self,
        slices: &[TokenSlice],
    ) -> (Vec<TokenSlice>, SavedActivations, PaddingKv) {
        let mut ids: Vec<u64> = slices
            .iter()
            .map(|s| {
                *self
                    .record_of
                    .get(s)
                    .expect("bug: the backward check found every slice saved")
            })
            .collect();
        ids.sort_unstable();
        ids.dedup();
        let mut order = Vec::with_capacity(slices.len());
        let mut pieces = Vec::with_capacity(ids.len());
        let mut padding_kv = Vec::new();
        for id in ids {
            let record = self
                .records
                .remove(&id)
                .expect("bug: a slice names a live record");
            let taken = |s: &TokenSlice| slices.contains(s);
            if record.slices.iter().all(taken) {
                for slice in &record.slices {
                    self.record_of.remove(slice);
                }
                order.extend(record.slices);
                pieces.push(record.saved);
                padding_kv = record.padding_kv;
                continue;
            }
            assert!(
                record.padding == 0,
                "bug: a padded forward pack's slices taken apart"
            );
            let mut record = record;
            let (mine, _, mine_rows) = record.ranges(taken);
            pieces.push(record.saved.take_rows(&mine_rows));
            for slice in &mine {
                self.record_of.remove(slice);
            }
            let (rest, rest_lens, _) = record.ranges(|s| !taken(s));
            record.slices = rest;
            record.rows = rest_lens;
            order.extend(mine);
            self.records.insert(id, record);
        }
        (order, SavedActivations::concat(pieces), padding_kv)
    }
}
