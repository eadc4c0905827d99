//! Structural checks of a schedule document before [`super::read`] builds a step from it.
//!
//! A document is input: a hand-written or truncated one must give a one-line error, never a
//! panic deeper down. These checks make every index in the document resolve (stages, replicas,
//! samples, packs, DP ranks, device ranks) and bound its size; the verifier then checks the
//! step's invariants as it does for any IR, and the reader compares every derived field with
//! its derivation.

use slimpack_ir::batch::{MAX_SAMPLES, MAX_TOKENS};

use super::{ScheduleDocument, ScheduleError};

/// Checks that every reference in `doc` is in range and its stages tile the model's layers.
pub(super) fn check(doc: &ScheduleDocument) -> Result<(), ScheduleError> {
    let invalid = |message: String| Err(ScheduleError::Invalid(message));
    let parallel = &doc.spec.parallel;
    let pp = parallel.pp as usize;
    if doc.stages.len() != pp {
        return invalid(format!(
            "stages: {} given, but the layout {parallel} has pp={pp}",
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
    let world = parallel.world();
    if doc.devices.len() as u64 != world {
        return invalid(format!(
            "devices: {} given, but the layout {parallel} has {world}",
            doc.devices.len()
        ));
    }
    Ok(())
}
