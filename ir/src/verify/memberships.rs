//! Where each slice sits inside the packs that hold it, as the verifier's order checks read
//! it.

use rustc_hash::FxHashMap;

use crate::step::{PackId, SliceId};

/// The position of each slice inside each pack that holds it: a sound step has each slice in
/// at most two packs (one per direction), kept in two slots per slice indexed by node index;
/// the memberships of a malformed step beyond those go to a map.
pub(super) struct Memberships {
    slots: Vec<[(u32, u32); 2]>,
    more: FxHashMap<(PackId, SliceId), usize>,
}

impl Memberships {
    const FREE: (u32, u32) = (u32::MAX, 0);

    pub fn new(node_bound: usize) -> Memberships {
        Memberships {
            slots: vec![[Memberships::FREE; 2]; node_bound],
            more: FxHashMap::default(),
        }
    }

    pub fn insert(&mut self, pack: PackId, slice: SliceId, position: usize) {
        let pack_index = pack.node().index() as u32;
        let slots = &mut self.slots[slice.node().index()];
        match slots
            .iter_mut()
            .find(|slot| slot.0 == pack_index || slot.0 == u32::MAX)
        {
            Some(slot) => *slot = (pack_index, position as u32),
            None => {
                self.more.insert((pack, slice), position);
            }
        }
    }

    pub fn get(&self, pack: PackId, slice: SliceId) -> Option<usize> {
        let pack_index = pack.node().index() as u32;
        self.slots[slice.node().index()]
            .iter()
            .find(|slot| slot.0 == pack_index)
            .map(|slot| slot.1 as usize)
            .or_else(|| self.more.get(&(pack, slice)).copied())
    }
}
