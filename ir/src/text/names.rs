//! Canonical names of IR nodes (`%st0`, `%r0`, `%d3`, `%d3.1`, `%f2`, `%b5`), derived from
//! positions. The printer and the verifier's messages use the same names, so an error points at
//! the line of the printed IR that holds the node.

use std::collections::HashMap;

use crate::step::{Direction, PackId, ReplicaId, SampleId, SliceId, StageId, StepIr};

/// Names of every node of one IR.
#[derive(Debug, Default)]
pub struct Names {
    stages: HashMap<StageId, String>,
    replicas: HashMap<ReplicaId, String>,
    samples: HashMap<SampleId, String>,
    slices: HashMap<SliceId, String>,
    packs: HashMap<PackId, String>,
}

impl Names {
    /// Names the nodes of `ir` in canonical order.
    pub fn new(ir: &StepIr) -> Names {
        let mut names = Names::default();
        for (index, &stage) in ir.stages().iter().enumerate() {
            names.stages.insert(stage, format!("%st{index}"));
        }
        for (index, &replica) in ir.replicas().iter().enumerate() {
            names.replicas.insert(replica, format!("%r{index}"));
        }
        for (index, &sample) in ir.samples().iter().enumerate() {
            names.samples.insert(sample, format!("%d{index}"));
            for (j, slice) in ir.slices_of(sample).into_iter().enumerate() {
                names.slices.insert(slice, format!("%d{index}.{j}"));
            }
        }
        names.name_packs(ir);
        names
    }

    /// Names the packs of `ir` only (as [`Names::new`] names them): what the lowering needs,
    /// without a string per sample and slice.
    pub fn of_packs(ir: &StepIr) -> Names {
        let mut names = Names::default();
        names.name_packs(ir);
        names
    }

    fn name_packs(&mut self, ir: &StepIr) {
        let (mut forward, mut backward) = (0, 0);
        for &replica in ir.replicas() {
            for direction in [Direction::Forward, Direction::Backward] {
                for pack in ir.packs_on(replica, direction) {
                    let (prefix, counter) = match direction {
                        Direction::Forward => ('f', &mut forward),
                        Direction::Backward => ('b', &mut backward),
                    };
                    self.packs.insert(pack, format!("%{prefix}{counter}"));
                    *counter += 1;
                }
            }
        }
    }

    pub fn stage(&self, id: StageId) -> &str {
        self.stages.get(&id).map_or("%st?", String::as_str)
    }
    pub fn replica(&self, id: ReplicaId) -> &str {
        self.replicas.get(&id).map_or("%r?", String::as_str)
    }
    pub fn sample(&self, id: SampleId) -> &str {
        self.samples.get(&id).map_or("%d?", String::as_str)
    }
    pub fn slice(&self, id: SliceId) -> &str {
        self.slices.get(&id).map_or("%d?.?", String::as_str)
    }
    /// A pack's name; packs not placed on a replica have none in the text form.
    pub fn pack(&self, id: PackId) -> &str {
        self.packs
            .get(&id)
            .map_or("%<unplaced pack>", String::as_str)
    }
}
