//! Model specs: the shape of a Llama-style decoder-only transformer, and its presets.
//!
//! Presets carry the published shapes (Llama 2 7B/13B/70B, Code Llama 34B), a documented ~150B
//! Llama-style shape, and `tiny` for the CPU runtime. Validation checks what the shapes must satisfy
//! on their own; checks that involve the parallel layout live in [`super::Spec::validate`].

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

use crate::error::{IrError, Result};

/// Element type of weights and activations during the step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    Bf16,
    Fp16,
    Fp32,
}

impl Dtype {
    /// Bytes per element.
    pub fn bytes(self) -> u64 {
        match self {
            Dtype::Bf16 | Dtype::Fp16 => 2,
            Dtype::Fp32 => 4,
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Dtype::Bf16 => "bf16",
            Dtype::Fp16 => "fp16",
            Dtype::Fp32 => "fp32",
        }
    }
}

impl FromStr for Dtype {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "bf16" => Ok(Dtype::Bf16),
            "fp16" => Ok(Dtype::Fp16),
            "fp32" => Ok(Dtype::Fp32),
            _ => Err(format!("unknown dtype '{s}' (valid: bf16, fp16, fp32)")),
        }
    }
}

/// Activation recomputation mode (Megatron-LM's `--recompute-granularity` and
/// `--recompute-method`). Written `none`, `selective`, `full` or `block:K` in specs, TOML and
/// the text IR.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
#[serde(try_from = "String", into = "String")]
#[schemars(with = "String")]
pub enum Recompute {
    /// Every activation the backward needs is kept.
    None,
    /// Attention internals are recomputed (Korthikanti et al. 2022, "selective recomputation").
    Selective,
    /// Only each layer's input is kept; the whole layer is recomputed in the backward.
    Full,
    /// Megatron-LM's `--recompute-granularity full --recompute-method block
    /// --recompute-num-layers K`: the first `K` layers of every model chunk (a pipeline stage,
    /// or a virtual stage under interleaving) recompute fully, the others keep every
    /// activation.
    Block(u32),
}

/// The share of a model chunk's layers under each recomputation, from [`Recompute::mix`]:
/// what the cost and memory models weigh their per-layer terms with.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RecomputeMix {
    /// Layers that keep every activation.
    pub none: f64,
    /// Layers that recompute their attention internals.
    pub selective: f64,
    /// Layers that keep only their input and recompute the whole layer.
    pub full: f64,
}

impl Recompute {
    /// The uniform modes (every layer alike); [`Recompute::Block`] takes a layer count.
    pub const ALL: [Recompute; 3] = [Recompute::None, Recompute::Selective, Recompute::Full];

    /// How a chunk of `layers_per_chunk` layers splits over the uniform modes.
    pub fn mix(self, layers_per_chunk: u32) -> RecomputeMix {
        let only = |none, selective, full| RecomputeMix {
            none,
            selective,
            full,
        };
        match self {
            Recompute::None => only(1.0, 0.0, 0.0),
            Recompute::Selective => only(0.0, 1.0, 0.0),
            Recompute::Full => only(0.0, 0.0, 1.0),
            Recompute::Block(k) => {
                let layers = layers_per_chunk.max(1);
                let full = f64::from(k.min(layers)) / f64::from(layers);
                only(1.0 - full, 0.0, full)
            }
        }
    }
}

impl FromStr for Recompute {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "none" => Ok(Recompute::None),
            "selective" => Ok(Recompute::Selective),
            "full" => Ok(Recompute::Full),
            _ => match s.strip_prefix("block:").map(str::parse::<u32>) {
                Some(Ok(layers)) if layers > 0 => Ok(Recompute::Block(layers)),
                _ => Err(format!(
                    "unknown recompute mode '{s}' (valid: none, selective, full, block:K with K \
                     >= 1 layers per stage)"
                )),
            },
        }
    }
}

impl fmt::Display for Recompute {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Recompute::None => f.write_str("none"),
            Recompute::Selective => f.write_str("selective"),
            Recompute::Full => f.write_str("full"),
            Recompute::Block(layers) => write!(f, "block:{layers}"),
        }
    }
}

impl TryFrom<String> for Recompute {
    type Error = String;
    fn try_from(s: String) -> std::result::Result<Self, String> {
        s.parse()
    }
}

impl From<Recompute> for String {
    fn from(mode: Recompute) -> String {
        mode.to_string()
    }
}

/// The shape of a Llama-style model: RMSNorm, RoPE, grouped-query attention, SwiGLU MLP.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ModelSpec {
    pub name: String,
    pub layers: u32,
    pub hidden: u32,
    pub heads: u32,
    pub kv_heads: u32,
    pub head_dim: u32,
    /// Intermediate size of the SwiGLU MLP (each of the gate, up and down projections).
    pub ffn: u32,
    pub vocab: u32,
    pub dtype: Dtype,
    pub recompute: Recompute,
    /// Input embedding and output projection share one matrix.
    #[serde(default)]
    pub tied_embeddings: bool,
}

/// Names of the model presets, in the order `slimpack passes` and errors list them.
pub const MODEL_PRESETS: [&str; 6] = [
    "tiny",
    "llama-7b",
    "llama-13b",
    "llama-34b",
    "llama-70b",
    "llama-150b",
];

impl ModelSpec {
    /// A preset by name. Shapes: Llama 2 (Touvron et al. 2023, Table 1 and the released
    /// `config.json`s), Code Llama 34B (Rozière et al. 2023; GQA with 8 K/V heads). `llama-150b`
    /// is not a released model: it is the Llama 2 70B recipe scaled to hidden 12288, 96 layers,
    /// 96 heads (8 K/V heads), SwiGLU 32768, i.e. 148.2B parameters with a 32000-token vocabulary;
    /// it stands in for the ~150B class the SlimPack paper evaluates.
    pub fn preset(name: &str) -> Result<ModelSpec> {
        let (layers, hidden, heads, kv_heads, ffn, vocab) = match name {
            "tiny" => (4, 128, 4, 2, 352, 512),
            "llama-7b" => (32, 4096, 32, 32, 11008, 32000),
            "llama-13b" => (40, 5120, 40, 40, 13824, 32000),
            "llama-34b" => (48, 8192, 64, 8, 22016, 32000),
            "llama-70b" => (80, 8192, 64, 8, 28672, 32000),
            "llama-150b" => (96, 12288, 96, 8, 32768, 32000),
            _ => {
                return Err(IrError::UnknownPreset {
                    kind: "model",
                    name: name.to_string(),
                    valid: MODEL_PRESETS.join(", "),
                })
            }
        };
        let tiny = name == "tiny";
        Ok(ModelSpec {
            name: name.to_string(),
            layers,
            hidden,
            heads,
            kv_heads,
            head_dim: hidden / heads,
            ffn,
            vocab,
            dtype: if tiny { Dtype::Fp32 } else { Dtype::Bf16 },
            recompute: Recompute::None,
            tied_embeddings: tiny,
        })
    }

    /// Checks the shape on its own (positive sizes within bounds, heads divisible by K/V heads;
    /// [`crate::Spec::validate`] bounds what one device holds).
    pub fn validate(&self) -> Result<()> {
        let what = format!("model '{}'", self.name);
        for (field, value, most) in [
            ("layers", self.layers, 1 << 16),
            ("hidden", self.hidden, 1 << 20),
            ("heads", self.heads, 1 << 16),
            ("kv_heads", self.kv_heads, 1 << 16),
            ("head_dim", self.head_dim, 1 << 16),
            ("ffn", self.ffn, 1 << 22),
            ("vocab", self.vocab, 1 << 26),
        ] {
            if value == 0 {
                return Err(IrError::spec(
                    &what,
                    format!("{field} must be positive, got 0"),
                ));
            }
            if value > most {
                return Err(IrError::spec(
                    &what,
                    format!("{field} must be at most {most}, got {value}"),
                ));
            }
        }
        if self.heads % self.kv_heads != 0 {
            return Err(IrError::spec(
                &what,
                format!(
                    "heads ({}) must be a multiple of kv_heads ({})",
                    self.heads, self.kv_heads
                ),
            ));
        }
        Ok(())
    }

    /// Width of the query projection output (`heads * head_dim`).
    pub fn q_width(&self) -> u64 {
        u64::from(self.heads) * u64::from(self.head_dim)
    }

    /// Width of each of the K and V projection outputs (`kv_heads * head_dim`).
    pub fn kv_width(&self) -> u64 {
        u64::from(self.kv_heads) * u64::from(self.head_dim)
    }

    /// The widths a token's saved bytes per layer grow with: hidden, ffn, the query and the
    /// key and value projections.
    pub fn token_widths(&self) -> u64 {
        u64::from(self.hidden) + u64::from(self.ffn) + self.q_width() + 2 * self.kv_width()
    }

    /// Parameters of one transformer layer: Q, K, V, O projections, the three SwiGLU matrices,
    /// and two RMSNorm weight vectors.
    pub fn params_per_layer(&self) -> u64 {
        let h = u64::from(self.hidden);
        let attention = h * self.q_width() + 2 * h * self.kv_width() + self.q_width() * h;
        let mlp = 3 * h * u64::from(self.ffn);
        attention + mlp + 2 * h
    }

    /// Parameters outside the layers: embedding, output projection (unless tied), final norm.
    pub fn params_outside_layers(&self) -> u64 {
        let embedding = u64::from(self.vocab) * u64::from(self.hidden);
        let output = if self.tied_embeddings { 0 } else { embedding };
        embedding + output + u64::from(self.hidden)
    }

    /// Total parameter count.
    pub fn params(&self) -> u64 {
        u64::from(self.layers) * self.params_per_layer() + self.params_outside_layers()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preset_parameter_counts_match_published_sizes() {
        // Published totals: 6.74B, 13.0B, 33.7B, 69.0B (Llama 2 / Code Llama papers).
        let billions = |name: &str| ModelSpec::preset(name).unwrap().params() as f64 / 1e9;
        assert!((billions("llama-7b") - 6.74).abs() < 0.01);
        assert!((billions("llama-13b") - 13.02).abs() < 0.01);
        assert!((billions("llama-34b") - 33.74).abs() < 0.05);
        assert!((billions("llama-70b") - 68.98).abs() < 0.05);
        assert!((billions("llama-150b") - 148.2).abs() < 0.5);
    }

    #[test]
    fn unknown_preset_lists_the_valid_ones() {
        let message = ModelSpec::preset("gpt-5").unwrap_err().to_string();
        assert!(
            message.contains("unknown model preset 'gpt-5'"),
            "{message}"
        );
        assert!(message.contains("llama-70b"), "{message}");
    }

    #[test]
    fn recompute_modes_round_trip_as_text() {
        for mode in [
            Recompute::None,
            Recompute::Selective,
            Recompute::Full,
            Recompute::Block(4),
        ] {
            assert_eq!(mode.to_string().parse::<Recompute>(), Ok(mode));
            let json = serde_json::to_string(&mode).unwrap();
            assert_eq!(serde_json::from_str::<Recompute>(&json).unwrap(), mode);
        }
        assert_eq!(Recompute::Block(4).to_string(), "block:4");
        for bad in ["block:0", "block:", "block:x", "blocks:2", "Full"] {
            assert!(bad.parse::<Recompute>().is_err(), "{bad}");
        }
        // block:K of a chunk of n layers: K/n of them full, the rest keep everything.
        let mix = Recompute::Block(2).mix(8);
        assert_eq!((mix.none, mix.selective, mix.full), (0.75, 0.0, 0.25));
        assert_eq!(Recompute::Block(9).mix(8).full, 1.0);
    }
}
