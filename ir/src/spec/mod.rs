//! Specs: what is trained (model), on what (cluster), laid out how (parallel), read from presets,
//! TOML files and flags.
//!
//! [`Spec`] bundles the three and owns the checks that span them (TP divides the head counts, PP
//! divides the layers). A TOML config file has `[model]`, `[cluster]`, `[parallel]` and optional
//! `[batch]` tables; `[model]` and `[cluster]` may name a `preset` and override any of its fields.

mod cluster;
mod model;
mod parallel;

pub use cluster::{ClusterSpec, GpuSpec, LinkSpec, CLUSTER_PRESETS};
pub use model::{Dtype, ModelSpec, Recompute, RecomputeMix, MODEL_PRESETS};
pub use parallel::{Coords, ParallelSpec, MAX_WORLD};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::path::Path;

use crate::error::{IrError, Result};

/// Model, cluster and parallel layout of one training job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Spec {
    pub model: ModelSpec,
    pub cluster: ClusterSpec,
    pub parallel: ParallelSpec,
}

impl Spec {
    /// Builds a spec from preset names and a layout string, and validates it.
    pub fn from_presets(model: &str, cluster: &str, parallel: &str) -> Result<Spec> {
        let spec = Spec {
            model: ModelSpec::preset(model)?,
            cluster: ClusterSpec::preset(cluster)?,
            parallel: parallel.parse()?,
        };
        spec.validate()?;
        Ok(spec)
    }

    /// Checks each part and the constraints between them.
    pub fn validate(&self) -> Result<()> {
        self.validate_naming(&format!("--parallel {}", self.parallel))
    }

    /// [`Spec::validate`], its errors about the layout naming it `layout` (the flag, or a
    /// config file's table).
    fn validate_naming(&self, layout: &str) -> Result<()> {
        self.model.validate()?;
        self.cluster.validate()?;
        self.parallel.validate()?;
        let (model, parallel) = (&self.model, &self.parallel);
        if model.heads % parallel.tp != 0 || model.kv_heads % parallel.tp != 0 {
            return Err(IrError::spec(
                layout,
                format!(
                    "tp={} must divide the heads ({}) and kv_heads ({}) of model '{}'",
                    parallel.tp, model.heads, model.kv_heads, model.name
                ),
            ));
        }
        if model.layers % parallel.pp != 0 {
            return Err(IrError::spec(
                layout,
                format!(
                    "pp={} must divide the layers ({}) of model '{}'",
                    parallel.pp, model.layers, model.name
                ),
            ));
        }
        if model.layers % parallel.stages() != 0 {
            return Err(IrError::spec(
                layout,
                format!(
                    "pp={} x vpp={} must divide the layers ({}) of model '{}'",
                    parallel.pp, parallel.vpp, model.layers, model.name
                ),
            ));
        }
        // What a token keeps on a device grows with its layers' widths (tens of bytes per
        // element); bounded so that a batch's bytes (up to 2^32 tokens) fit the memory
        // model's 64-bit counters. The Megatron 1T GPT (128 layers of hidden 25,600) needs 0.8
        // of it on one device, an eighth with pp=8.
        let most = 1u64 << 25;
        let device_layers = u64::from(model.layers / parallel.pp);
        if model.token_widths() * device_layers > most {
            return Err(IrError::spec(
                layout,
                format!(
                    "the layers one device holds x (hidden + ffn + heads x head_dim + 2 x \
                     kv_heads x head_dim) must be at most {most}, got {device_layers} x {} for \
                     model '{}' (more pipeline stages hold fewer layers each)",
                    model.token_widths(),
                    model.name
                ),
            ));
        }
        if parallel.tp > self.cluster.gpus_per_node {
            return Err(IrError::spec(
                layout,
                format!(
                    "tp={} exceeds the {} devices of a '{}' node (TP groups stay inside a node)",
                    parallel.tp, self.cluster.gpus_per_node, self.cluster.name
                ),
            ));
        }
        Ok(())
    }

    /// Number of nodes: world size / devices per node, rounded up.
    pub fn nodes(&self) -> u64 {
        self.parallel
            .world()
            .div_ceil(u64::from(self.cluster.gpus_per_node))
    }

    /// Layers of each pipeline stage (a model chunk: with `vpp > 1` a device holds `vpp`).
    pub fn layers_per_stage(&self) -> u32 {
        self.model.layers / self.parallel.stages()
    }

    /// Layers of one model chunk: the unit Megatron's block recomputation counts its `K` layers
    /// in (a pipeline stage's layers).
    pub fn layers_per_chunk(&self) -> u32 {
        self.layers_per_stage()
    }
}

/// A TOML config file: the spec plus the raw `[batch]` table (read by [`crate::batch`]).
#[derive(Debug, Clone)]
pub struct ConfigFile {
    pub spec: Spec,
    pub batch: Option<toml::Table>,
    /// Whether the `[model]` table names a `recompute` mode (a choice the user made, as
    /// `--recompute` is, not a preset's default).
    pub recompute_named: bool,
}

impl ConfigFile {
    /// Reads and validates a config file.
    pub fn load(path: &Path) -> Result<ConfigFile> {
        let text = crate::file::read_to_string(path).map_err(|e| IrError::io(path, e))?;
        Self::parse(&text, &path.display().to_string())
    }

    /// Parses config text; `source_name` names it in errors.
    pub fn parse(text: &str, source_name: &str) -> Result<ConfigFile> {
        let mut table: toml::Table = text
            .parse()
            .map_err(|e: toml::de::Error| IrError::spec(source_name, one_line(&e.to_string())))?;
        let known = ["model", "cluster", "parallel", "batch"];
        if let Some(key) = table.keys().find(|k| !known.contains(&k.as_str())) {
            return Err(IrError::spec(
                source_name,
                format!("unknown table [{key}] (valid: {})", known.join(", ")),
            ));
        }
        let mut take = |key: &str| {
            table
                .remove(key)
                .ok_or_else(|| IrError::spec(source_name, format!("missing table [{key}]")))
        };
        let model = take("model")?;
        let recompute_named = model.get("recompute").is_some();
        let model = with_preset(model, source_name, "model", ModelSpec::preset)?;
        let cluster = with_preset(
            take("cluster")?,
            source_name,
            "cluster",
            ClusterSpec::preset,
        )?;
        let mut parallel = take("parallel")?;
        // A degree left out is 1, as in `--parallel tp=8` (the schedule JSON, a written
        // contract, names all three).
        if let toml::Value::Table(degrees) = &mut parallel {
            for degree in ["tp", "pp", "dp"] {
                degrees.entry(degree).or_insert(toml::Value::Integer(1));
            }
        }
        let parallel: ParallelSpec = parallel.try_into().map_err(|e: toml::de::Error| {
            IrError::spec(
                source_name,
                format!("[parallel]: {}", one_line(e.message())),
            )
        })?;
        let batch = match table.remove("batch") {
            None => None,
            Some(toml::Value::Table(batch)) => Some(batch),
            Some(_) => return Err(IrError::spec(source_name, "[batch] must be a table")),
        };
        let spec = Spec {
            model,
            cluster,
            parallel,
        };
        // Named by the file, whose [parallel] table (not --parallel) holds the layout.
        (spec.validate_naming(&format!("[parallel] {}", spec.parallel))).map_err(|error| {
            match error {
                IrError::Spec { what, message } => IrError::Spec {
                    what: format!("{source_name}: {what}"),
                    message,
                },
                other => other,
            }
        })?;
        Ok(ConfigFile {
            spec,
            batch,
            recompute_named,
        })
    }
}

/// Reads a `[model]` or `[cluster]` table: fields of the named `preset` (if any), overridden by
/// the fields the table sets.
fn with_preset<T: Serialize + DeserializeOwned>(
    value: toml::Value,
    source_name: &str,
    kind: &str,
    preset: fn(&str) -> Result<T>,
) -> Result<T> {
    let toml::Value::Table(mut table) = value else {
        return Err(IrError::spec(
            source_name,
            format!("[{kind}] must be a table"),
        ));
    };
    let mut merged = match table.remove("preset") {
        Some(toml::Value::String(name)) => {
            let base = preset(&name)?;
            toml::Table::try_from(base).expect("a preset always serializes to a TOML table (bug)")
        }
        Some(_) => {
            return Err(IrError::spec(
                source_name,
                format!("[{kind}] preset must be a string"),
            ))
        }
        None => toml::Table::new(),
    };
    merge(&mut merged, table);
    toml::Value::Table(merged)
        .try_into()
        .map_err(|e: toml::de::Error| {
            IrError::spec(source_name, format!("[{kind}]: {}", one_line(e.message())))
        })
}

/// Recursively overlays `over` onto `base` (nested tables merge, other values replace).
fn merge(base: &mut toml::Table, over: toml::Table) {
    for (key, value) in over {
        match (base.get_mut(&key), value) {
            (Some(toml::Value::Table(inner)), toml::Value::Table(over_inner)) => {
                merge(inner, over_inner)
            }
            (_, value) => {
                base.insert(key, value);
            }
        }
    }
}

/// Folds a multi-line parser message into one line.
pub(crate) fn one_line(message: &str) -> String {
    message
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cross_checks_name_the_layout() {
        let message = Spec::from_presets("llama-7b", "h100-sxm", "tp=3,pp=1,dp=1")
            .unwrap_err()
            .to_string();
        assert!(
            message.contains("tp=3 must divide the heads (32)"),
            "{message}"
        );
        let message = Spec::from_presets("llama-7b", "h100-sxm", "tp=8,pp=3,dp=1")
            .unwrap_err()
            .to_string();
        assert!(
            message.contains("pp=3 must divide the layers (32)"),
            "{message}"
        );
    }

    #[test]
    fn config_file_overrides_preset_fields() {
        let text = r#"
            [model]
            preset = "llama-7b"
            recompute = "selective"
            [cluster]
            preset = "h100-sxm"
            gpus_per_node = 4
            [parallel]
            tp = 4
            pp = 2
            dp = 8
        "#;
        let config = ConfigFile::parse(text, "job.toml").unwrap();
        assert_eq!(config.spec.model.recompute, Recompute::Selective);
        assert_eq!(config.spec.model.layers, 32);
        assert_eq!(config.spec.cluster.gpus_per_node, 4);
        assert_eq!(config.spec.parallel.world(), 64);
        assert!(config.batch.is_none());
    }

    #[test]
    fn a_config_files_left_out_degrees_are_one_as_on_the_command_line() {
        let text = "[model]\npreset = \"llama-7b\"\n[cluster]\npreset = \"h100-sxm\"\n[parallel]\ntp = 8\n";
        let config = ConfigFile::parse(text, "job.toml").unwrap();
        assert_eq!(
            config.spec.parallel,
            Spec::from_presets("llama-7b", "h100-sxm", "tp=8")
                .unwrap()
                .parallel
        );
        // A degree that is not a number is still refused, by name.
        let message =
            ConfigFile::parse(&text.replace("tp = 8", "tp = 8\npp = \"two\""), "job.toml")
                .unwrap_err()
                .to_string();
        assert!(message.starts_with("job.toml: [parallel]"), "{message}");
        // [parallel] must still be a table.
        let message = ConfigFile::parse(
            &text.replace("[parallel]\ntp = 8\n", "parallel = 8\n"),
            "job.toml",
        )
        .unwrap_err()
        .to_string();
        assert!(!message.contains('\n'), "{message}");
    }

    #[test]
    fn config_file_errors_are_one_line() {
        let message = ConfigFile::parse("[model]\npreset = \"llama-7b\"\nlayerz = 3\n[cluster]\npreset=\"cpu\"\n[parallel]\ntp=1\n", "job.toml")
            .unwrap_err()
            .to_string();
        assert!(message.starts_with("job.toml: [model]"), "{message}");
        assert!(message.contains("layerz"), "{message}");
        assert!(!message.contains('\n'), "{message}");
    }
}
