//! Lowering a global batch into a fresh step IR (phase `logical`, one slice per sample).

use super::graph::StepIr;
use super::node::BatchInfo;
use crate::batch::Batch;
use crate::spec::Spec;

impl StepIr {
    /// The logical IR of one global batch: one sample node (with one whole slice) per sample,
    /// in batch order, and one stage node per pipeline stage.
    pub fn from_batch(spec: Spec, batch: &Batch) -> StepIr {
        let info = BatchInfo {
            source: batch.source.clone(),
            context: batch.context,
            documents: batch.documents as u64,
            documents_cut: batch.documents_cut as u64,
        };
        let mut ir = StepIr::new(spec, info);
        ir.reserve_samples(batch.samples.len());
        for sample in &batch.samples {
            ir.add_sample(*sample);
        }
        ir
    }
}
