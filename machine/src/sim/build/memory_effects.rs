//! What each pack task does to its devices' memory (the effects `memory` stacks): saved
//! activations and K/V, dK/dV accumulators, temporaries, a split backward's deferred part.

use crate::cost::{CostModel, MemoryModel};
use slimpack_ir::step::{Direction, Part};

use super::super::memory::MemoryEffect;
use super::super::task::PackIndex;
use super::Builder;

impl Builder<'_> {
    /// Per-device memory of `part` of a pack on `stage`: each device of a CP group (merged
    /// replicas times static CP) holds `1 / cp` of every slice's tokens, rounded up. A split
    /// backward's input gradient keeps what its weight gradient needs (it frees that much less,
    /// or allocates the excess), which the weight gradient frees (its GEMMs add into the main
    /// gradients: no temporaries counted).
    pub(super) fn memory_effect(&self, pack: PackIndex, stage: u32, part: Part) -> MemoryEffect {
        self.memory_effect_on(self.pack_cost(pack, stage), pack, stage, part)
    }

    /// [`Builder::memory_effect`] on the machine `cost` (a recomputation mode's).
    pub(super) fn memory_effect_on(
        &self,
        cost: &CostModel,
        pack: PackIndex,
        stage: u32,
        part: Part,
    ) -> MemoryEffect {
        let info = &self.packs[pack.0 as usize];
        let memory = cost.memory();
        let slices = self.slices_of(pack);
        let deferred = |bytes: fn(&MemoryModel, u64, u32) -> u64| {
            slices
                .iter()
                .map(|slice| bytes(memory, slice.share, stage))
                .sum::<u64>()
        };
        match part {
            Part::Whole => {}
            Part::InputGrad => {
                // The input gradient turns each layer's saved activations into what its
                // weight gradient keeps, layer by layer: the net change lands at its end.
                let mut effect = self.memory_effect_on(cost, pack, stage, Part::Whole);
                effect.temporary += deferred(MemoryModel::split_backward_temporary_bytes);
                let kept = deferred(MemoryModel::weight_grad_bytes);
                let released = effect.freed.min(kept);
                effect.freed -= released;
                effect.allocated += kept - released;
                return effect;
            }
            Part::WeightGrad => {
                return MemoryEffect {
                    freed: deferred(MemoryModel::weight_grad_bytes),
                    ..MemoryEffect::default()
                }
            }
        }
        let kept =
            |share: u64| memory.activation_bytes(share, stage) + memory.kv_bytes(share, stage);
        let range = self.pack_slices[pack.0 as usize].clone();
        let pairs = &self.pairs[range.start as usize..range.end as usize];
        let keys = pairs
            .iter()
            .map(|&(len, prefix)| len + prefix)
            .max()
            .unwrap_or(0);
        let temporary = memory.pack_temporary_bytes(
            info.tokens.div_ceil(self.split(info.replica)),
            keys,
            stage,
            info.direction,
        );
        let mut effect = MemoryEffect {
            temporary,
            ..MemoryEffect::default()
        };
        for slice in slices {
            match info.direction {
                Direction::Forward => effect.allocated += kept(slice.share),
                Direction::Backward => {
                    effect.freed += kept(slice.share);
                    if slice.last {
                        effect.temporary += memory.own_kv_grad_bytes(slice.share, stage);
                        let earlier = &self.earlier_shares
                            [slice.earlier.start as usize..slice.earlier.end as usize];
                        for &share in earlier {
                            effect.allocated += memory.kv_grad_bytes(share, stage);
                        }
                    } else {
                        effect.freed += memory.kv_grad_bytes(slice.share, stage);
                    }
                }
            }
        }
        effect
    }
}
