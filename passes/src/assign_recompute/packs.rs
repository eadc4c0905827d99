//! `assign-recompute{packs=true}`: packs that recompute less than their device's rung.
//!
//! A device's rung (see the parent module) is the least that keeps its peak within the limit,
//! but the peak is one instant: a pack whose whole lifetime on the device (from its forward to
//! the last backward that frees its slices) passes where memory has room can save more of its
//! activations. The search, per device, from its rung down one rung at a time: on the probe's
//! memory timelines of the step (the ops each device group runs, with the bytes held while
//! each runs), a unit (a forward pack, or the forward packs one backward pack replays
//! together, which must save under one mode) goes one rung lower where the extra bytes it then
//! saves fit under the limit over its whole lifetime on every timeline that runs it; units are
//! taken in the order their first forward runs, each taking its room from the ones after it.
//! The extra bytes are held from the unit's first forward to its last backward (a slice freed
//! earlier is counted until then: never less than it holds). The probe then stacks the step
//! with the packs' modes exactly; a device that went over the limit (a backward's temporaries
//! can grow with what it replays) keeps its rung for every pack.

use rustc_hash::FxHashMap as HashMap;

use slimpack_ir::spec::Recompute;
use slimpack_ir::step::{Direction, PackId, Part};
use slimpack_ir::StepIr;
use slimpack_machine::sim::{PeakProbe, Timeline};
use slimpack_machine::MachineError;

use super::ladder_mode;

/// A forward pack's own mode on a stage, `((pack, stage), mode)`.
type OwnMode = ((PackId, u32), Recompute);

/// A set of forward packs on one stage that save under one mode: where they run, their rung.
struct Unit {
    packs: Vec<PackId>,
    stage: u32,
    device: u32,
    rung: u32,
    /// Per timeline that runs them, the positions of their first forward and last backward.
    spans: Vec<(usize, usize, usize)>,
}

/// The forward packs' own modes, `((pack, stage), mode)`, on a step whose pipeline devices run
/// rungs `levels` (chunks of `top` layers), within `limit` bytes per device.
pub(super) fn lower_packs(
    ir: &StepIr,
    probe: &mut PeakProbe,
    levels: &[u32],
    top: u32,
    limit: u64,
) -> Result<Vec<OwnMode>, MachineError> {
    let modes: Vec<Recompute> = levels.iter().map(|&l| ladder_mode(l, top)).collect();
    // The probe stacks no pack's own mode here: the caller cleared the step's.
    let timelines = probe.timelines(&modes)?;
    let mut units = units(ir, &timelines, levels);
    if units.is_empty() {
        return Ok(Vec::new());
    }
    let mut room: Vec<Vec<i128>> = timelines
        .iter()
        .map(|timeline| {
            timeline
                .ops
                .iter()
                .map(|op| i128::from(limit) - i128::from(op.during_bytes))
                .collect()
        })
        .collect();
    // The units in the order their first forward runs.
    units.sort_by_key(|unit| {
        let &(timeline, first, _) = unit.spans.first().expect("a unit runs somewhere");
        (timeline, first)
    });
    let top_rung = levels.iter().copied().max().unwrap_or(0);
    let mut saved: HashMap<(PackId, u32, u32), u64> = HashMap::default();
    let mut saved_bytes = |probe: &mut PeakProbe, pack: PackId, stage: u32, rung: u32| {
        *saved
            .entry((pack, stage, rung))
            .or_insert_with(|| probe.saved_bytes(pack, stage, ladder_mode(rung, top)))
    };
    for _ in 0..top_rung {
        let mut lowered_any = false;
        // One rung per unit and round, so that every unit goes down a rung before any goes
        // down two.
        for unit in &mut units {
            if unit.rung == 0 {
                continue;
            }
            let (from, to) = (unit.rung, unit.rung - 1);
            let mut extra: i128 = 0;
            for &pack in &unit.packs {
                let now = saved_bytes(probe, pack, unit.stage, from);
                let then = saved_bytes(probe, pack, unit.stage, to);
                extra += i128::from(then) - i128::from(now);
            }
            let fits = unit.spans.iter().all(|&(timeline, first, last)| {
                room[timeline][first..=last]
                    .iter()
                    .all(|&free| free >= extra)
            });
            if !fits {
                continue;
            }
            for &(timeline, first, last) in &unit.spans {
                for free in &mut room[timeline][first..=last] {
                    *free -= extra;
                }
            }
            unit.rung = to;
            lowered_any = true;
        }
        if !lowered_any {
            break;
        }
    }
    let own = |units: &[Unit]| -> Vec<OwnMode> {
        units
            .iter()
            .filter(|unit| unit.rung < levels[unit.device as usize])
            .flat_map(|unit| {
                let mode = ladder_mode(unit.rung, top);
                unit.packs
                    .iter()
                    .map(move |&pack| ((pack, unit.stage), mode))
            })
            .collect()
    };
    let chosen = own(&units);
    if chosen.is_empty() {
        return Ok(chosen);
    }
    // Exactly, with the packs' modes; a device over the limit keeps its rung throughout.
    probe.set_pack_modes(&chosen);
    let peaks = probe.device_peaks(&modes)?;
    let over: Vec<bool> = peaks.iter().map(|&peak| peak > limit).collect();
    probe.set_pack_modes(&[]);
    if over.contains(&true) {
        // A device's peak depends on its own packs' modes only: the others' stand.
        units.retain(|unit| !over[unit.device as usize]);
        return Ok(own(&units));
    }
    Ok(chosen)
}

/// The units of the forward packs on devices that recompute (`levels[d] > 0`), per stage: the
/// forward packs whose slices a backward pack holds are one unit (union over backward packs),
/// with where each runs on the timelines.
fn units(ir: &StepIr, timelines: &[Timeline], levels: &[u32]) -> Vec<Unit> {
    // Union-find over forward packs, joined through the backward packs that replay them.
    let mut parent: HashMap<PackId, PackId> = HashMap::default();
    fn find(parent: &mut HashMap<PackId, PackId>, pack: PackId) -> PackId {
        let mut root = pack;
        while let Some(&up) = parent.get(&root).filter(|&&up| up != root) {
            root = up;
        }
        let mut at = pack;
        while let Some(&up) = parent.get(&at).filter(|&&up| up != at) {
            parent.insert(at, root);
            at = up;
        }
        root
    }
    let mut forwards_of: HashMap<PackId, Vec<PackId>> = HashMap::default();
    for &replica in ir.replicas() {
        for backward in ir.packs_on(replica, Direction::Backward) {
            let mut forwards: Vec<PackId> = ir
                .pack_members(backward)
                .iter()
                .filter_map(|&slice| ir.pack_of(slice, Direction::Forward))
                .collect();
            forwards.dedup();
            for pair in forwards.windows(2) {
                let (a, b) = (find(&mut parent, pair[0]), find(&mut parent, pair[1]));
                if a != b {
                    parent.insert(a, b);
                }
            }
            forwards_of.insert(backward, forwards);
        }
    }
    let pp = ir.spec.parallel.pp;
    let mut index: HashMap<(PackId, u32), usize> = HashMap::default();
    let mut units: Vec<Unit> = Vec::new();
    for (t, timeline) in timelines.iter().enumerate() {
        if levels[timeline.device as usize] == 0 {
            continue;
        }
        // Per unit on this timeline: its first forward and last backward position.
        let mut here: HashMap<usize, (usize, usize)> = HashMap::default();
        for (position, op) in timeline.ops.iter().enumerate() {
            let forwards: Vec<PackId> = match ir.pack(op.pack).direction {
                Direction::Forward => vec![op.pack],
                Direction::Backward if op.part != Part::WeightGrad => {
                    forwards_of.get(&op.pack).cloned().unwrap_or_default()
                }
                Direction::Backward => continue,
            };
            for forward in forwards {
                let root = find(&mut parent, forward);
                let unit = *index.entry((root, op.stage)).or_insert_with(|| {
                    units.push(Unit {
                        packs: Vec::new(),
                        stage: op.stage,
                        device: op.stage % pp,
                        rung: levels[(op.stage % pp) as usize],
                        spans: Vec::new(),
                    });
                    units.len() - 1
                });
                if ir.pack(op.pack).direction == Direction::Forward
                    && !units[unit].packs.contains(&forward)
                {
                    units[unit].packs.push(forward);
                }
                let span = here.entry(unit).or_insert((position, position));
                span.1 = position;
            }
        }
        for (unit, (first, last)) in here {
            units[unit].spans.push((t, first, last));
        }
    }
    for unit in &mut units {
        unit.spans.sort_unstable();
    }
    units
}
