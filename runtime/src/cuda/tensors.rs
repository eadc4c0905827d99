//! A stage's tensors on a GPU: one flat buffer laid out as [`Params::tensors`] lays them end to
//! end — the flat space the CPU backend's data-parallel shards index — with the offset of every
//! tensor. Weights, gradients and (for a shard) AdamW moments all use it.

use std::ops::Range;

use crate::cpu::{Params, TensorKind};

use super::device::Gpu;
use super::error::Result;
use super::memory::DeviceVec;

/// Offsets of one layer's tensors.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct LayerOffsets {
    pub attn_norm: usize,
    pub wq: usize,
    pub wk: usize,
    pub wv: usize,
    pub wo: usize,
    pub mlp_norm: usize,
    pub w_gate: usize,
    pub w_up: usize,
    pub w_down: usize,
}

/// Where each tensor of a stage starts in its flat buffer.
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    pub embedding: Option<usize>,
    pub layers: Vec<LayerOffsets>,
    pub final_norm: Option<usize>,
    pub output: Option<usize>,
    /// Every tensor's flat range and kind, in order.
    pub tensors: Vec<(Range<usize>, TensorKind)>,
    pub numel: usize,
    /// The tied embedding's copy on this stage when it is split across stages (as
    /// `Params::tied_copy_mut`): its range.
    pub tied_copy: Option<Range<usize>>,
}

impl Layout {
    /// The layout of `params`' stage.
    pub fn of(params: &Params) -> Layout {
        let mut layout = Layout {
            embedding: None,
            layers: vec![LayerOffsets::default(); params.layers.len()],
            final_norm: None,
            output: None,
            tensors: Vec::new(),
            numel: 0,
            tied_copy: None,
        };
        let first_layer = params.stage().layers().start;
        for tensor in params.tensors() {
            let offset = layout.numel;
            layout.numel += tensor.data.len();
            layout.tensors.push((offset..layout.numel, tensor.kind));
            let mut parts = tensor.name.split('.');
            match (parts.next(), parts.next(), parts.next()) {
                (Some("embedding"), None, None) => layout.embedding = Some(offset),
                (Some("final_norm"), None, None) => layout.final_norm = Some(offset),
                (Some("output"), None, None) => layout.output = Some(offset),
                (Some("layers"), Some(index), Some(field)) => {
                    let local = index.parse::<usize>().expect("bug: a layer index") - first_layer;
                    let layer = &mut layout.layers[local];
                    let slot = match field {
                        "attn_norm" => &mut layer.attn_norm,
                        "wq" => &mut layer.wq,
                        "wk" => &mut layer.wk,
                        "wv" => &mut layer.wv,
                        "wo" => &mut layer.wo,
                        "mlp_norm" => &mut layer.mlp_norm,
                        "w_gate" => &mut layer.w_gate,
                        "w_up" => &mut layer.w_up,
                        "w_down" => &mut layer.w_down,
                        other => panic!("bug: unknown layer tensor {other}"),
                    };
                    *slot = offset;
                }
                _ => panic!("bug: unknown tensor {}", tensor.name),
            }
        }
        let mut probe = params.zeros_like();
        if let Some(copy) = probe.tied_copy_mut() {
            let len = copy.len();
            let start = match params.stage().is_first() {
                true => layout.embedding,
                false => layout.output,
            }
            .expect("bug: a tied copy is a tensor of the stage");
            layout.tied_copy = Some(start..start + len);
        }
        layout
    }

    /// The output projection's offset (`output`, or the embedding when tied on one stage).
    pub fn output_weight(&self) -> usize {
        self.output
            .or(self.embedding)
            .expect("bug: output projection asked of a stage that is not the last")
    }
}

/// A stage's flat tensors on a GPU.
pub(crate) struct DeviceTensors {
    pub data: DeviceVec,
}

impl DeviceTensors {
    /// A copy of `params` (laid out as [`Layout::of`] says).
    pub fn upload(gpu: &Gpu, params: &Params) -> Result<DeviceTensors> {
        let flat: Vec<f32> = params
            .tensors()
            .iter()
            .flat_map(|t| t.data.iter().copied())
            .collect();
        Ok(DeviceTensors {
            data: gpu.upload(&flat)?,
        })
    }

    /// Zeros for tensors of `layout`.
    pub fn zeros(gpu: &Gpu, layout: &Layout) -> Result<DeviceTensors> {
        Ok(DeviceTensors {
            data: gpu.zeros(layout.numel)?,
        })
    }

    /// The device address of flat element `offset`.
    pub fn at(&self, offset: usize) -> u64 {
        self.data.at(offset)
    }

    /// Copies the values back into `params` (same layout).
    pub fn download_into(&self, gpu: &Gpu, params: &mut Params) -> Result<()> {
        let flat = gpu.download(&self.data, 0..self.data.len())?;
        let mut offset = 0;
        for tensor in params.tensors_mut() {
            let len = tensor.data.len();
            tensor.data.copy_from_slice(&flat[offset..offset + len]);
            offset += len;
        }
        Ok(())
    }
}
