//! Structural checks of a schedule document before [`super::read`] builds a step from it.
//!
//! A document is input: a hand-written or truncated one must give a one-line error, never a
//! panic deeper down. These checks make every index in the document resolve (stages, replicas,
//! samples, packs, DP ranks, device ranks, rank groups) and bound its size; the verifier then
//! checks the step's invariants as it does for any IR, and the reader compares every derived
//! field with its derivation.

use slimpack_ir::batch::{MAX_SAMPLES, MAX_TOKENS};

use super::{ScheduleDocument, ScheduleError};

/// Checks that `doc`'s layout is valid, it has a device per rank, every run of its rank groups
/// stays below the world size,
/// every op's group index is in range, and each group is exactly the devices whose ops name it:
/// what a reader needs to expand the groups safely. Linear in the runs and ops (a group is
/// expanded no further than the devices naming it).
pub(super) fn groups(doc: &ScheduleDocument) -> Result<(), ScheduleError> {
    let invalid = |message: String| Err(ScheduleError::Invalid(message));
    let parallel = &doc.spec.parallel;
    parallel.validate()?;
    let world = parallel.world();
    if doc.devices.len() as u64 != world {
        return invalid(format!(
            "devices: {} given, but the layout {parallel} has {world}",
            doc.devices.len()
        ));
    }
    for (index, group) in doc.groups.iter().enumerate() {
        if group.runs.is_empty() {
            return invalid(format!("group {index} has no runs of ranks"));
        }
        for (r, run) in group.runs.iter().enumerate() {
            if run.stride == 0 || run.count == 0 {
                return invalid(format!(
                    "group {index}: runs[{r}] has stride {} and count {} (both must be at least 1)",
                    run.stride, run.count
                ));
            }
            if run.last().is_none_or(|last| last >= world) {
                return invalid(format!(
                    "group {index}: runs[{r}] ({} ranks from {}, {} apart) goes past rank {}, the last of the layout {parallel}",
                    run.count,
                    run.first,
                    run.stride,
                    world - 1
                ));
            }
        }
    }
    // The devices whose ops name each group.
    let mut named_by: Vec<Vec<u64>> = vec![Vec::new(); doc.groups.len()];
    for (rank, device) in doc.devices.iter().enumerate() {
        for (at, op) in device.ops.iter().enumerate() {
            let Some(group) = op.group() else { continue };
            let Some(members) = named_by.get_mut(group as usize) else {
                return invalid(format!(
                    "devices (rank {rank}): ops[{at}] names group {group}, but there are {}",
                    doc.groups.len()
                ));
            };
            if members.last() != Some(&(rank as u64)) {
                members.push(rank as u64);
            }
        }
    }
    // A collective's group is exactly the devices that run it: each member names it, and each
    // device naming it is a member, once. Expanding a group stops past the devices naming it,
    // so the check stays linear in the ops.
    for (index, (group, naming)) in doc.groups.iter().zip(&named_by).enumerate() {
        let mut ranks: Vec<u64> = Vec::with_capacity(naming.len());
        for rank in group.ranks() {
            if ranks.len() > naming.len() {
                break;
            }
            ranks.push(rank);
        }
        ranks.sort_unstable();
        if let Some(pair) = ranks.windows(2).find(|pair| pair[0] == pair[1]) {
            return invalid(format!("group {index} lists rank {} twice", pair[0]));
        }
        if let Some(problem) = first_difference(&ranks, naming) {
            let what = match problem {
                Difference::Idle(rank) => {
                    format!("lists rank {rank}, whose ops do not name it (devices (rank {rank}))")
                }
                Difference::Outside(rank) => {
                    format!("does not list rank {rank}, whose ops name it (devices (rank {rank}))")
                }
            };
            return invalid(format!(
                "group {index} {what}: a group is exactly the devices that run its collective"
            ));
        }
    }
    Ok(())
}

/// Where a group's ranks and the devices naming it first differ (both sorted).
enum Difference {
    /// A member whose ops do not name the group.
    Idle(u64),
    /// A device naming the group that is not a member.
    Outside(u64),
}

fn first_difference(members: &[u64], naming: &[u64]) -> Option<Difference> {
    let (mut m, mut n) = (members.iter().peekable(), naming.iter().peekable());
    loop {
        match (m.peek(), n.peek()) {
            (None, None) => return None,
            (Some(&&member), None) => return Some(Difference::Idle(member)),
            (None, Some(&&rank)) => return Some(Difference::Outside(rank)),
            (Some(&&member), Some(&&rank)) if member == rank => {
                m.next();
                n.next();
            }
            (Some(&&member), Some(&&rank)) if member < rank => {
                return Some(Difference::Idle(member))
            }
            (Some(_), Some(&&rank)) => return Some(Difference::Outside(rank)),
        }
    }
}

/// Checks that every reference in `doc` is in range and its stages tile the model's layers.
pub(super) fn check(doc: &ScheduleDocument) -> Result<(), ScheduleError> {
    let invalid = |message: String| Err(ScheduleError::Invalid(message));
    groups(doc)?;
    let parallel = &doc.spec.parallel;
    let stages = parallel.stages() as usize;
    if doc.stages.len() != stages {
        return invalid(format!(
            "stages: {} given, but the layout {parallel} has {stages} pipeline stages (pp x vpp)",
            doc.stages.len()
        ));
    }
    let mut next_layer = 0u64;
    for (index, stage) in doc.stages.iter().enumerate() {
        if stage.layers == 0 || u64::from(stage.first_layer) != next_layer {
            return invalid(format!(
                "stage {index}: layers {}+{} do not continue the previous stage (expected first_layer {next_layer}, at least 1 layer)",
                stage.first_layer, stage.layers
            ));
        }
        next_layer += u64::from(stage.layers);
    }
    if next_layer != u64::from(doc.spec.model.layers) {
        return invalid(format!(
            "stages cover {next_layer} layers, but model '{}' has {}",
            doc.spec.model.name, doc.spec.model.layers
        ));
    }
    if doc.samples.len() > MAX_SAMPLES {
        return invalid(format!(
            "{} samples is more than the {MAX_SAMPLES} a step may hold",
            doc.samples.len()
        ));
    }
    let tokens: u64 = doc.samples.iter().map(|s| u64::from(s.len)).sum();
    if tokens > MAX_TOKENS {
        return invalid(format!(
            "the samples hold {tokens} tokens, more than the {MAX_TOKENS} a step may hold"
        ));
    }
    for (index, replica) in doc.replicas.iter().enumerate() {
        if replica.dp_ranks.is_empty() {
            return invalid(format!("replica {index} has no DP ranks"));
        }
        if let Some(rank) = replica.dp_ranks.iter().find(|&&r| r >= parallel.dp) {
            return invalid(format!(
                "replica {index} names DP rank {rank}, but the layout has dp={}",
                parallel.dp
            ));
        }
    }
    for (p, pack) in doc.packs.iter().enumerate() {
        for slice in &pack.slices {
            let Some(sample) = doc.samples.get(slice.sample as usize) else {
                return invalid(format!(
                    "pack {p} names sample {}, but there are {}",
                    slice.sample,
                    doc.samples.len()
                ));
            };
            if slice.start >= slice.end || slice.end > sample.len {
                return invalid(format!(
                    "pack {p}: slice {}..{} of sample {} is empty or past its {} tokens",
                    slice.start, slice.end, slice.sample, sample.len
                ));
            }
        }
    }
    Ok(())
}
