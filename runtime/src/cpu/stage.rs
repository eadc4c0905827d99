//! Pipeline stages: which part of the model a worker holds.
//!
//! A stage is a contiguous, non-empty range of layers. The first stage also holds the token
//! embedding; the last stage holds the final RMSNorm, the output projection and the loss. A
//! single stage holding every layer is the whole model.

use std::fmt;
use std::ops::Range;

use super::config::ModelConfig;
use super::error::{CpuError, Result};

/// A contiguous range of layers of a model with `num_layers` layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LayerRange {
    first_layer: usize,
    end_layer: usize,
    num_layers: usize,
}

impl LayerRange {
    /// The stage holding layers `layers` of `config`'s model.
    pub fn new(config: &ModelConfig, layers: Range<usize>) -> Result<LayerRange> {
        if layers.start >= layers.end || layers.end > config.layers {
            return Err(CpuError::InvalidStages {
                reason: format!(
                    "layers {}..{} is not a non-empty range within the model's {} layers",
                    layers.start, layers.end, config.layers
                ),
            });
        }
        Ok(LayerRange {
            first_layer: layers.start,
            end_layer: layers.end,
            num_layers: config.layers,
        })
    }

    /// The single stage holding the whole model.
    pub fn whole(config: &ModelConfig) -> LayerRange {
        LayerRange {
            first_layer: 0,
            end_layer: config.layers,
            num_layers: config.layers,
        }
    }

    /// `count` stages of as equal a number of layers as possible (earlier stages take the extra).
    pub fn split_even(config: &ModelConfig, count: usize) -> Result<Vec<LayerRange>> {
        if count == 0 || count > config.layers {
            return Err(CpuError::InvalidStages {
                reason: format!(
                    "cannot split {} layers into {count} non-empty stages",
                    config.layers
                ),
            });
        }
        let mut stages = Vec::with_capacity(count);
        let mut start = 0;
        for index in 0..count {
            let len = config.layers / count + usize::from(index < config.layers % count);
            stages.push(LayerRange::new(config, start..start + len)?);
            start += len;
        }
        Ok(stages)
    }

    /// Checks that `stages` are, in order, a partition of all the model's layers.
    pub fn check_partition(stages: &[LayerRange]) -> Result<()> {
        let Some(first) = stages.first() else {
            return Err(CpuError::InvalidStages {
                reason: "no stages".to_string(),
            });
        };
        let mut next = 0;
        for stage in stages {
            if stage.first_layer != next || stage.num_layers != first.num_layers {
                return Err(CpuError::InvalidStages {
                    reason: format!("stage {stage} does not start at layer {next}"),
                });
            }
            next = stage.end_layer;
        }
        if next != first.num_layers {
            return Err(CpuError::InvalidStages {
                reason: format!(
                    "stages end at layer {next}, the model has {}",
                    first.num_layers
                ),
            });
        }
        Ok(())
    }

    /// Global indices of this stage's layers.
    pub fn layers(&self) -> Range<usize> {
        self.first_layer..self.end_layer
    }

    /// Number of layers on this stage.
    pub fn layer_count(&self) -> usize {
        self.end_layer - self.first_layer
    }

    /// Holds the token embedding (takes token ids as input).
    pub fn is_first(&self) -> bool {
        self.first_layer == 0
    }

    /// Holds the final norm, output projection and loss (produces the loss).
    pub fn is_last(&self) -> bool {
        self.end_layer == self.num_layers
    }
}

impl fmt::Display for LayerRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "layers {}..{} of {}",
            self.first_layer, self.end_layer, self.num_layers
        )
    }
}
