//! The verifier: the invariants of the step IR, checked after every pass.
//!
//! Errors accumulate (all of them are reported, the first is shown on the command line), each
//! naming the node as the printed IR names it. Invariants, by the phase from which they hold:
//!
//! Always:
//! - `stages`: there are `pp` stages; their layer ranges are non-empty, contiguous from layer 0,
//!   and cover every layer of the model.
//! - `stage-recompute`: a stage's own recomputation (`recompute=` on the stage, chosen by
//!   `assign-recompute`) of `block:K` recomputes at most the stage's layers (`K <= layers`).
//! - `sample-len`: every sample has at least one token, and no more than the context length
//!   when the batch was cut to one.
//! - `slice-cover`: the slices of a sample are disjoint and cover `[0, len)` exactly: no token
//!   lost or duplicated; every slice has at least one token.
//! - `slice-chain`: dependency edges chain each sample's slices in offset order (j -> j+1), and
//!   the slice table the passes read agrees with the slice nodes and their edges.
//! - `replica-ranks`: a replica has at least one DP rank, each in `[0, dp)`, none repeated; no
//!   two replicas have the same ranks; DP-Merge groups (replicas of two or more ranks) are
//!   pairwise disjoint.
//! - `pack-placement`: every pack is placed on a replica, is not empty, and holds only slices of
//!   samples placed on that replica; a replica's pack lists (`StepIr::packs_on`) are the order
//!   of its placement edges, and a pack's slice list (`StepIr::pack_members`) the order of its
//!   member edges.
//! - `pack-cap`: a pack's tokens do not exceed its cap.
//! - `pack-size`: a pack's tokens, and the keys its slices attend to (each slice's prefix and
//!   itself), each fit the 32-bit offsets of its varlen layout (`cu_seqlens_q/k`).
//! - `pack-padding`: a padded pack is padded to at least its own tokens.
//! - `pack-unique`: a slice is in at most one pack per direction.
//! - `forward-order`: per sample, forward packs run its slices in increasing slice order (a
//!   later slice sits in a later pack, or later in the same pack).
//! - `backward-order`: per sample, backward packs run its slices in decreasing slice order.
//!
//! From `assigned`:
//! - `assigned`: every sample is placed on a replica.
//!
//! From `packed`:
//! - `packed`: every slice is in exactly one forward and one backward pack.
//!
//! From `scheduled`:
//! - `schedule-complete`: for every replica with packs and every stage, the schedule lists each
//!   of the replica's packs exactly once, forward packs in their order and backward packs in
//!   theirs.
//! - `weight-grad-order`: a zero-bubble stage order (see [`crate::step::Part`]) defers the
//!   weight gradient of a backward pack of the replica at most once per stage, after that
//!   pack's input gradient on the same stage; splits need one model chunk per device.
//! - `deadlock-free`: the task graph (each pack on each stage, ordered by the per-stage
//!   schedules, forward flowing to later stages, backward to earlier ones, and every slice's
//!   backward after its forward on the last stage, hence after its forward on every later
//!   stage) has no cycle, so the schedule runs to completion.
//! - `pack-recompute`: a forward pack's own recomputation on a stage (`recompute %stN MODE
//!   [...]`, chosen by `assign-recompute{packs=true}`) is of a placed forward pack, on a stage
//!   of the step, recomputing at most the stage's layers; the slices of a backward pack were
//!   saved under one mode on each stage (it replays them under that mode).
//! - `rank-order-complete`: an order of a shared DP rank's pipeline device (see
//!   [`StepIr::rank_order`]) is of a rank in several replicas and lists each of them exactly as
//!   often as it runs ops on the device, and no other replica.
//! - `rank-order-deadlock-free`: with such orders, the step's program (which follows them) runs
//!   to completion (the token game of [`crate::program::check`]; from `lowered`, as
//!   `program-executable`).
//!
//! From `lowered`:
//! - `program-stored`: the step carries its program (stored by [`crate::program::lower_into`]).
//! - `program-derived`: the stored program is exactly what the schedule lowers to.
//! - `program-executable`: its per-worker op lists (see [`crate::program`]) reference packs
//!   and workers in range, receive every send exactly once, meet every collective with all its
//!   members, and run to completion (the token game of [`crate::program::check`]).
//!
//! Memory (`peak <= cap`) is checked by the compile driver with the simulator's memory timeline
//! (the verifier has no machine model), and reported as an `oom` error there.

use std::cell::OnceCell;
use std::collections::{HashMap, HashSet};
use std::fmt;

use crate::error::{IrError, Result};
use crate::spec::Recompute;
use crate::step::{Direction, PackId, Phase, ReplicaId, SampleId, Slice, SliceId, StageId, StepIr};
use crate::text::Names;

mod index;
mod memberships;
mod schedules;
use index::Index;
use memberships::Memberships;

/// The invariant a lowered step breaks while its program is not stored yet (what the text
/// parser and the schedule JSON reader look past before they store it).
pub const PROGRAM_STORED: &str = "program-stored";

/// One broken invariant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifyError {
    /// The node as the printed IR names it (`%d3.1`), or the section (`stages`).
    pub location: String,
    /// The invariant's short name (see the module header).
    pub invariant: &'static str,
    pub message: String,
}

impl fmt::Display for VerifyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} [{}]",
            self.location, self.message, self.invariant
        )
    }
}

/// Checks every invariant that holds at the IR's phase.
pub fn verify(ir: &StepIr) -> Result<()> {
    let errors = check(ir);
    if errors.is_empty() {
        Ok(())
    } else {
        Err(IrError::Verify { errors })
    }
}

/// All broken invariants, in a deterministic order.
pub fn check(ir: &StepIr) -> Vec<VerifyError> {
    check_on(ir, ir.samples().len() >= PARALLEL_SAMPLES)
}

/// [`check`], on two threads when `parallel` (the same errors in the same order).
fn check_on(ir: &StepIr, parallel: bool) -> Vec<VerifyError> {
    let index = Index::new(ir, parallel);
    // `packs` records the packs' positions and reads them back; the other sections read
    // neither, so on a large step they run beside it on a second core. Errors keep the
    // sections' order.
    let ((mut errors, schedule_errors), pack_errors) = both(
        parallel,
        || {
            let mut verifier = Verifier::new(ir, &index, 0);
            verifier.stages();
            verifier.samples_and_slices();
            verifier.replicas();
            let before_packs = std::mem::take(&mut verifier.errors);
            if ir.phase() >= Phase::Scheduled {
                verifier.schedules();
            } else if ir.has_pack_recompute() {
                verifier.report(
                    At::Section("recompute"),
                    "pack-recompute",
                    format!(
                        "a step in phase {} has no schedules for a pack's own recomputation to \
                         be chosen on (it belongs to scheduled steps)",
                        ir.phase()
                    ),
                );
            } else if ir.rank_orders().next().is_some() {
                verifier.report(
                    At::Section("order"),
                    "rank-order-complete",
                    format!(
                        "a step in phase {} has no schedules for a shared rank's order to merge \
                         (orders belong to scheduled steps)",
                        ir.phase()
                    ),
                );
            }
            (before_packs, verifier.errors)
        },
        || {
            let mut verifier = Verifier::new(
                ir,
                &index,
                petgraph::visit::NodeIndexable::node_bound(ir.graph()),
            );
            verifier.packs();
            verifier.errors
        },
    );
    errors.extend(pack_errors);
    errors.extend(schedule_errors);
    if ir.phase() >= Phase::Lowered && errors.is_empty() {
        // Lowering needs a sound schedule; with one broken, that error is the one to show.
        let mut verifier = Verifier::new(ir, &index, 0);
        verifier.program();
        errors = verifier.errors;
    }
    errors
}

/// Samples from which [`check`] uses a second thread: below, a thread costs more than it saves.
const PARALLEL_SAMPLES: usize = 1 << 14;

/// `(a(), b())`, `b` on a second thread when `parallel` (and the system starts one; else on
/// this thread after `a`).
fn both<A: Send, B: Send>(
    parallel: bool,
    a: impl FnOnce() -> A + Send,
    b: impl FnOnce() -> B + Send,
) -> (A, B) {
    if !parallel || std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
        return (a(), b());
    }
    // `b` stays here until one thread takes it: a refused spawn leaves it to this one.
    let b = std::sync::Mutex::new(Some(b));
    let run_b = || {
        let b = b
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take();
        b.map(|b| b())
    };
    std::thread::scope(|scope| {
        let second = std::thread::Builder::new().spawn_scoped(scope, run_b);
        let first = a();
        let second = match second {
            Ok(handle) => handle
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
            Err(_) => run_b(),
        };
        (first, second.expect("`b` runs once"))
    })
}

/// Where an error is: a node (named as the printed IR names it only when an error is
/// reported, so that a sound step costs no names) or a section.
#[derive(Debug, Clone, Copy)]
enum At {
    Section(&'static str),
    Stage(StageId),
    Replica(ReplicaId),
    Sample(SampleId),
    Slice(SliceId),
    Pack(PackId),
    Schedule(ReplicaId, StageId),
    ReplicaSchedule(ReplicaId),
}

struct Verifier<'a> {
    ir: &'a StepIr,
    /// The step's edges by node.
    index: &'a Index,
    /// The printed IR's names, built on the first error.
    names: OnceCell<Names>,
    errors: Vec<VerifyError>,
    /// Position of each placed pack among its replica's packs of its direction.
    /// (Indexed by node index: 0 for a node that is no placed pack.)
    pack_position: Vec<u32>,
    /// Position of each slice inside each pack that holds it.
    member_position: Memberships,
}

impl<'a> Verifier<'a> {
    /// A verifier of `ir` with room for pack positions of nodes below `node_bound` (0 for
    /// the sections that read none).
    fn new(ir: &'a StepIr, index: &'a Index, node_bound: usize) -> Verifier<'a> {
        Verifier {
            ir,
            index,
            names: OnceCell::new(),
            errors: Vec::new(),
            pack_position: vec![0; node_bound],
            member_position: Memberships::new(node_bound),
        }
    }

    fn names(&self) -> &Names {
        self.names.get_or_init(|| Names::new(self.ir))
    }

    fn location(&self, at: At) -> String {
        let names = self.names();
        match at {
            At::Section(section) => section.to_string(),
            At::Stage(id) => names.stage(id).to_string(),
            At::Replica(id) => names.replica(id).to_string(),
            At::Sample(id) => names.sample(id).to_string(),
            At::Slice(id) => names.slice(id).to_string(),
            At::Pack(id) => names.pack(id).to_string(),
            At::Schedule(replica, stage) => {
                format!("schedule {} {}", names.replica(replica), names.stage(stage))
            }
            At::ReplicaSchedule(replica) => format!("schedule {}", names.replica(replica)),
        }
    }

    /// The stored program is the schedule's lowering, and executable.
    fn program(&mut self) {
        let Some(stored) = self.ir.program() else {
            self.report(
                At::Section("program"),
                PROGRAM_STORED,
                "a lowered step carries its program (made by the lower pass)".into(),
            );
            return;
        };
        if *stored != crate::program::lower(self.ir) {
            self.report(
                At::Section("program"),
                "program-derived",
                "the stored op lists are not what the schedule lowers to".into(),
            );
        } else if let Err(e) = crate::program::check(stored) {
            self.report(At::Section("program"), "program-executable", e.message);
        }
    }

    fn report(&mut self, at: At, invariant: &'static str, message: String) {
        let location = self.location(at);
        self.report_located(location, invariant, message);
    }

    fn report_located(&mut self, location: String, invariant: &'static str, message: String) {
        self.errors.push(VerifyError {
            location,
            invariant,
            message,
        });
    }

    fn stages(&mut self) {
        let ir = self.ir;
        let parallel = ir.spec.parallel;
        if ir.stages().len() != parallel.stages() as usize {
            self.report(
                At::Section("stages"),
                "stages",
                format!(
                    "{} stages for pp={} x vpp={}",
                    ir.stages().len(),
                    parallel.pp,
                    parallel.vpp
                ),
            );
        }
        let mut next_layer = 0;
        for &id in ir.stages() {
            let stage = *ir.stage(id);
            if stage.layers == 0 || stage.first_layer != next_layer {
                self.report(
                    At::Stage(id),
                    "stages",
                    format!(
                        "layers {}..{} do not continue from layer {next_layer} with at least one layer",
                        stage.first_layer,
                        stage.first_layer + stage.layers
                    ),
                );
            }
            next_layer = stage.first_layer + stage.layers;
            if let Some(Recompute::Block(recomputed)) = stage.recompute {
                if recomputed > stage.layers {
                    self.report(
                        At::Stage(id),
                        "stage-recompute",
                        format!(
                            "recompute=block:{recomputed} names more layers than the stage's {} \
                             (all of them is recompute=full)",
                            stage.layers
                        ),
                    );
                }
            }
        }
        if next_layer != ir.spec.model.layers {
            self.report(
                At::Section("stages"),
                "stages",
                format!(
                    "stages cover {next_layer} layers, the model has {}",
                    ir.spec.model.layers
                ),
            );
        }
    }

    fn samples_and_slices(&mut self) {
        let ir = self.ir;
        for &sample_id in ir.samples() {
            let sample = *ir.sample(sample_id);
            let name = At::Sample(sample_id);
            if sample.len == 0 {
                self.report(name, "sample-len", "sample has no tokens".into());
            }
            if let Some(context) = ir.batch.context {
                if sample.len > context {
                    self.report(
                        name,
                        "sample-len",
                        format!("{} tokens exceed the context length {context}", sample.len),
                    );
                }
            }
            let slices = self.index.slices_of(ir, sample_id).to_vec();
            let mut covered = 0u32;
            for (j, &slice_id) in slices.iter().enumerate() {
                let slice = slice_node(ir, slice_id);
                let slice_name = At::Slice(slice_id);
                if slice.len == 0 {
                    self.report(slice_name, "slice-cover", "slice has no tokens".into());
                }
                if slice.start != covered {
                    let what = if slice.start < covered {
                        "overlaps the previous slice"
                    } else {
                        "leaves a gap after the previous slice"
                    };
                    self.report(
                        slice_name,
                        "slice-cover",
                        format!(
                            "slice {}..{} {what} (expected to start at {covered})",
                            slice.start,
                            slice.end()
                        ),
                    );
                }
                covered = covered.max(slice.end());
                let expected_next = slices.get(j + 1).map(|next| Some(next.node()));
                if self.index.next_slice(slice_id) != expected_next {
                    self.report(
                        slice_name,
                        "slice-chain",
                        "dependency edge does not lead to the next slice in offset order".into(),
                    );
                }
                // The slice table the passes read must say what the graph says.
                if ir.slice_row(slice_id) != Some((slice, sample_id, slices.get(j + 1).copied())) {
                    self.report(
                        slice_name,
                        "slice-chain",
                        "the slice table disagrees with the graph's slice node or edges".into(),
                    );
                }
            }
            if covered != sample.len {
                self.report(
                    name,
                    "slice-cover",
                    format!(
                        "slices cover {covered} of the sample's {} tokens",
                        sample.len
                    ),
                );
            }
            if ir.phase() >= Phase::Assigned && ir.replica_of_sample(sample_id).is_none() {
                self.report(
                    name,
                    "assigned",
                    format!("sample is not placed on a replica at phase {}", ir.phase()),
                );
            }
        }
    }

    fn replicas(&mut self) {
        let ir = self.ir;
        let dp = ir.spec.parallel.dp;
        let mut seen_sets: HashSet<&[u32]> = HashSet::new();
        let mut merged_owner: HashMap<u32, ReplicaId> = HashMap::new();
        for &replica_id in ir.replicas() {
            let name = At::Replica(replica_id);
            let ranks = &ir.replica(replica_id).ranks;
            if ranks.is_empty() {
                self.report(name, "replica-ranks", "replica has no DP ranks".into());
            }
            if let Some(&rank) = ranks.iter().find(|&&r| r >= dp) {
                self.report(
                    name,
                    "replica-ranks",
                    format!("DP rank {rank} is out of range (dp={dp})"),
                );
            }
            if ranks.windows(2).any(|w| w[0] == w[1]) {
                self.report(name, "replica-ranks", "a DP rank is repeated".into());
            }
            if !seen_sets.insert(ranks.as_slice()) {
                self.report(
                    name,
                    "replica-ranks",
                    "another replica has the same DP ranks".into(),
                );
            }
            if ranks.len() > 1 {
                for &rank in ranks {
                    if let Some(&other) = merged_owner.get(&rank) {
                        self.report(
                            name,
                            "replica-ranks",
                            format!(
                                "DP-Merge group shares DP rank {rank} with {}",
                                self.names().replica(other)
                            ),
                        );
                    }
                    merged_owner.insert(rank, replica_id);
                }
            }
        }
    }

    fn packs(&mut self) {
        let ir = self.ir;
        for pack in self.index.unplaced_packs().to_vec() {
            let slices = self.index.pack_slices(pack).count();
            self.report_located(
                format!("pack with {slices} slices"),
                "pack-placement",
                "pack is not placed on a replica".into(),
            );
        }
        for &replica in ir.replicas() {
            for direction in [Direction::Forward, Direction::Backward] {
                let packs = self.index.packs_on(ir, replica, direction);
                // The list the passes read (`StepIr::packs_on`) is what the edges say.
                if ir.packs_on(replica, direction) != packs {
                    self.report(
                        At::Replica(replica),
                        "pack-placement",
                        format!(
                            "its {} pack list is not the order of its placement edges",
                            direction.keyword()
                        ),
                    );
                }
                for (position, pack) in packs.into_iter().enumerate() {
                    self.pack_position[pack.node().index()] = position as u32;
                    // The slice list the passes read (`StepIr::pack_members`) is what the
                    // edges say.
                    if !ir
                        .pack_members(pack)
                        .iter()
                        .copied()
                        .eq(self.index.pack_slices(pack))
                    {
                        self.report(
                            At::Pack(pack),
                            "pack-placement",
                            "its slice list is not the order of its member edges".into(),
                        );
                    }
                    for (member, slice) in self.index.pack_slices(pack).enumerate() {
                        self.member_position.insert(pack, slice, member);
                    }
                    self.pack(pack, replica);
                }
            }
        }
        for &sample in ir.samples() {
            let slices = self.index.slices_of(ir, sample).to_vec();
            for direction in [Direction::Forward, Direction::Backward] {
                self.slice_order(&slices, direction);
            }
        }
    }

    fn pack(&mut self, pack: PackId, replica: ReplicaId) {
        let ir = self.ir;
        let name = At::Pack(pack);
        let slices: Vec<SliceId> = self.index.pack_slices(pack).collect();
        if slices.is_empty() {
            self.report(name, "pack-placement", "pack has no slices".into());
        }
        // One pass over the slices (each read once: a large step's are spread over memory).
        let (mut keys, mut tokens) = (0u64, 0u64);
        for &slice in &slices {
            let node = slice_node(ir, slice);
            keys += u64::from(node.end());
            tokens += u64::from(node.len);
            let sample = self.index.sample_of(ir, slice);
            if ir.replica_of_sample(sample) != Some(replica) {
                self.report(
                    name,
                    "pack-placement",
                    format!(
                        "holds {} whose sample {} is not placed on {}",
                        self.names().slice(slice),
                        self.names().sample(sample),
                        self.names().replica(replica)
                    ),
                );
            }
        }
        if tokens > u64::from(u32::MAX) || keys > u64::from(u32::MAX) {
            self.report(
                name,
                "pack-size",
                format!(
                    "{tokens} tokens attending to {keys} keys: a pack holds at most {} of each",
                    u32::MAX
                ),
            );
        }
        if let Some(cap) = ir.pack(pack).cap {
            if tokens > u64::from(cap) {
                self.report(
                    name,
                    "pack-cap",
                    format!("{tokens} tokens exceed the pack's cap of {cap}"),
                );
            }
        }
        if let Some(padded) = ir.padding(pack) {
            if tokens > u64::from(padded) {
                self.report(
                    name,
                    "pack-padding",
                    format!("padded to {padded} tokens but holds {tokens}"),
                );
            }
        }
    }

    /// Per-direction membership and order of one sample's slices.
    fn slice_order(&mut self, slices: &[crate::step::SliceId], direction: Direction) {
        let ir = self.ir;
        let mut previous: Option<(crate::step::SliceId, (usize, usize))> = None;
        for &slice in slices {
            let mut packs = self.index.packs_of(slice, direction);
            let first = packs.next();
            let name = At::Slice(slice);
            let others = packs.count();
            if others > 0 {
                self.report(
                    name,
                    "pack-unique",
                    format!("slice is in {} {} packs", others + 1, direction.keyword()),
                );
            }
            let Some(pack) = first else {
                if ir.phase() >= Phase::Packed {
                    self.report(
                        name,
                        "packed",
                        format!("slice is in no {} pack", direction.keyword()),
                    );
                }
                previous = None;
                continue;
            };
            let key = self.order_key(pack, slice);
            if let Some((earlier, earlier_key)) = previous {
                let in_order = match direction {
                    Direction::Forward => earlier_key < key,
                    Direction::Backward => {
                        earlier_key.0 > key.0 || (earlier_key.0 == key.0 && earlier_key.1 != key.1)
                    }
                };
                if !in_order {
                    let (invariant, verb, rule) = match direction {
                        Direction::Forward => ("forward-order", "forward", "before"),
                        Direction::Backward => ("backward-order", "backward", "after"),
                    };
                    let earlier_pack = (self.index.pack_of(earlier, direction))
                        .expect("the earlier slice has a pack (checked above)");
                    let order = match direction {
                        Direction::Forward => "from its first slice to its last",
                        Direction::Backward => "from its last slice to its first",
                    };
                    self.report(
                        name,
                        invariant,
                        format!(
                            "runs {verb} in {}, {rule} {} of the earlier slice {}; a sample runs {verb} {order}",
                            self.names().pack(pack),
                            self.names().pack(earlier_pack),
                            self.names().slice(earlier)
                        ),
                    );
                }
            }
            previous = Some((slice, key));
        }
    }

    /// (position of the pack among its replica's packs of that direction, position inside it).
    fn order_key(&self, pack: PackId, slice: crate::step::SliceId) -> (usize, usize) {
        (
            self.pack_position[pack.node().index()] as usize,
            self.member_position.get(pack, slice).unwrap_or(0),
        )
    }
}

#[cfg(test)]
mod tests;

/// A slice as its graph node says (the verifier's reference; the slice table beside it is
/// checked against it): a node that is no slice reads as an empty slice, which `slice-cover`
/// reports.
fn slice_node(ir: &StepIr, slice: SliceId) -> Slice {
    ir.slice_node(slice).unwrap_or(Slice { start: 0, len: 0 })
}
