//! Items grouped by a dense key (compressed rows, filled by a counting sort): how bulk reads
//! of the step graph ([`crate::StepIr::sample_slices`], the verifier's edge index) hold what
//! one pass over the edge table gathered, without an allocation per key.

/// Items grouped by key `0..keys`.
#[derive(Debug, Clone)]
pub(crate) struct Rows<T> {
    start: Vec<u32>,
    items: Vec<T>,
}

impl<T: Copy> Rows<T> {
    /// Groups `pairs` by key (each below `keys`), keeping their order within a key.
    pub fn new(keys: usize, pairs: &[(u32, T)]) -> Rows<T> {
        let mut start = vec![0u32; keys + 1];
        for &(key, _) in pairs {
            start[key as usize + 1] += 1;
        }
        for key in 0..keys {
            start[key + 1] += start[key];
        }
        let mut next = start.clone();
        // Every slot is overwritten: any item fills the vector first.
        let mut items: Vec<T> = pairs
            .first()
            .map_or_else(Vec::new, |&(_, filler)| vec![filler; pairs.len()]);
        for &(key, item) in pairs {
            let at = &mut next[key as usize];
            items[*at as usize] = item;
            *at += 1;
        }
        Rows { start, items }
    }

    /// The items of `key` (none past the last key).
    pub fn row(&self, key: usize) -> &[T] {
        match self.start.get(key..key + 2) {
            Some(&[from, to]) => &self.items[from as usize..to as usize],
            _ => &[],
        }
    }

    /// Sorts every row by `key`.
    pub fn sort_rows_by_key<K: Ord>(&mut self, key: impl Fn(&T) -> K) {
        for window in self.start.windows(2) {
            let row = &mut self.items[window[0] as usize..window[1] as usize];
            if row.len() > 1 {
                row.sort_unstable_by_key(&key);
            }
        }
    }
}

impl<T> Default for Rows<T> {
    fn default() -> Rows<T> {
        Rows {
            start: Vec::new(),
            items: Vec::new(),
        }
    }
}
