//! `pack-symmetric{policy=..,cap=N}`: micro-batches as conventional trainers build them — the
//! same packs for the forward and the backward pass.
//!
//! Phase in: `assigned`. Phase out: `packed`. Per replica, the replica's slices are grouped into
//! packs by `policy`; each pack is added once as a forward pack and once as a backward pack with
//! the same slices, so backward packs run in forward order (as 1F1B does with micro-batches).
//! A sample cut into several slices is kept in one pack, in slice order (the baselines do not
//! split documents across micro-batches), which keeps the per-sample order invariants.
//!
//! Policies:
//! - `per-sample`: one pack per sample, in batch order;
//! - `ffd`: first-fit decreasing by tokens into bins of `cap` tokens (Megatron-style packing of
//!   documents into context-length sequences).

use std::ops::RangeInclusive;

use crate::error::{PassError, Result};
use crate::pass::{OptionInfo, Pass, PassOptions, Statistics};
use crate::registry::PassInfo;
use slimpack_ir::step::{Direction, Pack, Phase, SampleId};
use slimpack_ir::StepIr;

pub(crate) const INFO: PassInfo = PassInfo {
    name: "pack-symmetric",
    summary: "build identical forward and backward micro-batches (conventional packing)",
    description: "Groups each replica's samples into packs by a policy (per-sample, ffd) and \
                  uses the same packs in both directions. Phase assigned -> packed.",
    options: &[
        OptionInfo {
            name: "policy",
            help: "per-sample (default) or ffd (first-fit decreasing into cap-token bins)",
        },
        OptionInfo {
            name: "cap",
            help: "tokens per pack for ffd (default: the batch's context length)",
        },
    ],
    create: |options| Ok(Box::new(PackSymmetric::from_options(options)?)),
};

/// How samples are grouped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    PerSample,
    FirstFitDecreasing,
}

/// The symmetric packing pass.
#[derive(Debug, Clone, Copy)]
pub struct PackSymmetric {
    pub policy: Policy,
    pub cap: Option<u32>,
}

impl PackSymmetric {
    fn from_options(options: &PassOptions) -> Result<PackSymmetric> {
        let policy = match options
            .get::<String>("policy", "per-sample or ffd")?
            .as_deref()
        {
            None | Some("per-sample") => Policy::PerSample,
            Some("ffd") => Policy::FirstFitDecreasing,
            Some(other) => {
                return Err(PassError::BadOption {
                    pass: INFO.name,
                    option: "policy".into(),
                    value: other.into(),
                    message: "expected per-sample or ffd".into(),
                })
            }
        };
        let cap = options.get::<u32>("cap", "a positive integer")?;
        if cap == Some(0) {
            return Err(PassError::BadOption {
                pass: INFO.name,
                option: "cap".into(),
                value: "0".into(),
                message: "expected a positive integer".into(),
            });
        }
        Ok(PackSymmetric { policy, cap })
    }

    fn groups(
        &self,
        ir: &StepIr,
        samples: &[SampleId],
        cap: Option<u32>,
    ) -> Result<Vec<Vec<SampleId>>> {
        match self.policy {
            Policy::PerSample => Ok(samples.iter().map(|&s| vec![s]).collect()),
            Policy::FirstFitDecreasing => {
                let cap = cap.ok_or(PassError::Failed {
                    pass: INFO.name,
                    message: "ffd needs cap=N or a batch with a context length".into(),
                })?;
                let mut order = samples.to_vec();
                order.sort_by_key(|&s| std::cmp::Reverse(ir.sample(s).len));
                let mut bins: Vec<(u64, Vec<SampleId>)> = Vec::new();
                for sample in order {
                    let len = u64::from(ir.sample(sample).len);
                    if len > u64::from(cap) {
                        return Err(PassError::Failed {
                            pass: INFO.name,
                            message: format!("a sample of {len} tokens exceeds cap={cap}"),
                        });
                    }
                    match bins
                        .iter_mut()
                        .find(|(used, _)| used + len <= u64::from(cap))
                    {
                        Some((used, members)) => {
                            *used += len;
                            members.push(sample);
                        }
                        None => bins.push((len, vec![sample])),
                    }
                }
                Ok(bins.into_iter().map(|(_, members)| members).collect())
            }
        }
    }
}

impl Pass for PackSymmetric {
    fn name(&self) -> &'static str {
        INFO.name
    }

    fn accepts(&self) -> RangeInclusive<Phase> {
        Phase::Assigned..=Phase::Assigned
    }

    fn produces(&self) -> Option<Phase> {
        Some(Phase::Packed)
    }

    fn run(&mut self, ir: &mut StepIr) -> Result<Statistics> {
        let cap = self.cap.or(ir.batch.context);
        let recorded_cap = if self.policy == Policy::FirstFitDecreasing {
            cap
        } else {
            None
        };
        let mut packs = 0usize;
        let mut largest = 0u64;
        for replica in ir.replicas().to_vec() {
            let samples = ir.samples_on(replica);
            for group in self.groups(ir, &samples, cap)? {
                let slices: Vec<_> = group.iter().flat_map(|&s| ir.slices_of(s)).collect();
                for direction in [Direction::Forward, Direction::Backward] {
                    ir.add_pack(
                        Pack {
                            direction,
                            cap: recorded_cap,
                        },
                        replica,
                        &slices,
                    );
                }
                largest = largest.max(group.iter().map(|&s| u64::from(ir.sample(s).len)).sum());
                packs += 1;
            }
        }
        Ok(Statistics::new()
            .with("packs_per_direction", packs)
            .with("largest_pack_tokens", largest))
    }
}
