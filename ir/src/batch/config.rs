//! The `[batch]` table of a config file: where the dataset comes from and how batches are drawn.
//!
//! ```toml
//! [batch]
//! file = "data/lengths.txt"      # relative to the config file's directory
//! format = "auto"                # auto | text | json | jsonl | corpus
//! field = "num_tokens"           # JSONL length field
//! text_field = "content"         # JSONL text field to tokenize
//! tokenizer = "cl100k_base"      # cl100k_base | o200k_base
//! context = 8192
//! global_batch_tokens = 1048576  # or global_batch = 512 (samples)
//! seed = 0
//! # instead of `file`:
//! synthetic = { dist = "lognormal", median = 350, sigma = 1.5, count = 4096, max = 131072 }
//! ```
//!
//! Exactly one of `file` and `synthetic` is given. Unknown keys are errors. The synthetic
//! distribution's `seed` defaults to the batch `seed`; its `max` defaults to `u32::MAX`.

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

use super::{
    batch_error, BatchOptions, Dataset, DatasetFormat, Distribution, LoadOptions, Synthetic,
    Tokenizer,
};
use crate::error::Result;

/// Where errors about the table point.
const TABLE: &str = "[batch]";

/// The `[batch]` table of a config file.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchConfig {
    /// Dataset file, relative to the config file's directory.
    pub file: Option<PathBuf>,
    pub format: Option<DatasetFormat>,
    pub field: Option<String>,
    pub text_field: Option<String>,
    pub tokenizer: Option<Tokenizer>,
    /// A synthetic dataset instead of a file.
    pub synthetic: Option<SyntheticConfig>,
    pub context: Option<u32>,
    pub global_batch: Option<usize>,
    pub global_batch_tokens: Option<u64>,
    pub seed: Option<u64>,
}

/// The names of the synthetic distributions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DistributionKind {
    /// Needs `median` and `sigma`.
    Lognormal,
    /// Needs `scale` and `shape`.
    Pareto,
}

/// The `synthetic = { dist = .., .. }` value: a flat table whose parameters depend on `dist`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SyntheticConfig {
    pub dist: DistributionKind,
    pub median: Option<f64>,
    pub sigma: Option<f64>,
    pub scale: Option<f64>,
    pub shape: Option<f64>,
    pub count: usize,
    pub max: Option<u32>,
    pub seed: Option<u64>,
}

impl BatchConfig {
    /// Reads the table (as [`crate::spec::ConfigFile`] hands it over); `source_name` names the
    /// config file in errors.
    pub fn from_table(table: toml::Table, source_name: &str) -> Result<BatchConfig> {
        table.try_into().map_err(|error: toml::de::Error| {
            batch_error(
                source_name,
                format!("{TABLE}: {}", crate::spec::one_line(error.message())),
            )
        })
    }

    /// How the dataset file is read.
    pub fn load_options(&self) -> LoadOptions {
        LoadOptions {
            format: self.format.unwrap_or_default(),
            field: self.field.clone(),
            text_field: self.text_field.clone(),
            tokenizer: self.tokenizer,
        }
    }

    /// How batches are drawn (checked).
    pub fn batch_options(&self) -> Result<BatchOptions> {
        let options = BatchOptions {
            context: self.context,
            global_batch: self.global_batch,
            global_batch_tokens: self.global_batch_tokens,
            seed: self.seed.unwrap_or(0),
        };
        options.validate_in(TABLE)?;
        Ok(options)
    }

    /// Loads the dataset (a relative `file` is resolved against `base_dir`) and returns it with
    /// the batch options.
    pub fn resolve(&self, base_dir: &Path) -> Result<(Dataset, BatchOptions)> {
        let options = self.batch_options()?;
        let dataset = match (&self.file, &self.synthetic) {
            (Some(file), None) => Dataset::load(&base_dir.join(file), &self.load_options())?,
            (None, Some(synthetic)) => synthetic.to_synthetic(options.seed)?.generate()?,
            (Some(_), Some(_)) => {
                return Err(batch_error(
                    TABLE,
                    "give either `file` or `synthetic`, not both",
                ))
            }
            (None, None) => {
                return Err(batch_error(
                    TABLE,
                    "no dataset: give `file` (a length file or JSONL corpus) or `synthetic`",
                ))
            }
        };
        Ok((dataset, options))
    }
}

impl SyntheticConfig {
    /// The distribution this table describes; `batch_seed` is the seed when it names none.
    pub fn to_synthetic(&self, batch_seed: u64) -> Result<Synthetic> {
        let distribution = match self.dist {
            DistributionKind::Lognormal => {
                self.only(&["median", "sigma"], [self.scale, self.shape], "lognormal")?;
                Distribution::LogNormal {
                    median: self.required(self.median, "median", "lognormal")?,
                    sigma: self.required(self.sigma, "sigma", "lognormal")?,
                }
            }
            DistributionKind::Pareto => {
                self.only(&["scale", "shape"], [self.median, self.sigma], "pareto")?;
                Distribution::Pareto {
                    scale: self.required(self.scale, "scale", "pareto")?,
                    shape: self.required(self.shape, "shape", "pareto")?,
                }
            }
        };
        let synthetic = Synthetic {
            distribution,
            count: self.count,
            max: self.max.unwrap_or(u32::MAX),
            seed: self.seed.unwrap_or(batch_seed),
        };
        synthetic.validate()?;
        Ok(synthetic)
    }

    fn required(&self, value: Option<f64>, name: &str, dist: &str) -> Result<f64> {
        value.ok_or_else(|| {
            batch_error(
                format!("{TABLE} synthetic"),
                format!("dist = \"{dist}\" needs `{name}`"),
            )
        })
    }

    /// Rejects the other distribution's parameters.
    fn only(&self, valid: &[&str], others: [Option<f64>; 2], dist: &str) -> Result<()> {
        if others.iter().all(Option::is_none) {
            return Ok(());
        }
        Err(batch_error(
            format!("{TABLE} synthetic"),
            format!(
                "dist = \"{dist}\" takes `{}` and `{}` (median/sigma are lognormal's, scale/shape pareto's)",
                valid[0], valid[1]
            ),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(text: &str) -> Result<BatchConfig> {
        let mut document: toml::Table = text.parse().unwrap();
        let toml::Value::Table(batch) = document.remove("batch").unwrap() else {
            panic!("test config has no [batch] table");
        };
        BatchConfig::from_table(batch, "job.toml")
    }

    #[test]
    fn reads_every_key() {
        let config = config(
            r#"
            [batch]
            file = "lengths.jsonl"
            format = "jsonl"
            field = "n"
            context = 4096
            global_batch_tokens = 65536
            seed = 3
            "#,
        )
        .unwrap();
        assert_eq!(config.file.as_deref(), Some(Path::new("lengths.jsonl")));
        assert_eq!(config.load_options().format, DatasetFormat::Jsonl);
        assert_eq!(config.load_options().field.as_deref(), Some("n"));
        let options = config.batch_options().unwrap();
        assert_eq!(
            options,
            BatchOptions {
                context: Some(4096),
                global_batch: None,
                global_batch_tokens: Some(65536),
                seed: 3
            }
        );
    }

    #[test]
    fn synthetic_table_describes_a_dataset() {
        let config = config(
            r#"
            [batch]
            synthetic = { dist = "lognormal", median = 350, sigma = 1.2, count = 64, max = 8192 }
            global_batch = 8
            seed = 5
            "#,
        )
        .unwrap();
        let (dataset, options) = config.resolve(Path::new("/nowhere")).unwrap();
        assert_eq!(dataset.len(), 64);
        assert_eq!(options.global_batch, Some(8));
        let again = config.resolve(Path::new("/elsewhere")).unwrap().0;
        assert_eq!(dataset, again);
        assert!(dataset.name.ends_with("seed=5"), "{}", dataset.name);
    }

    #[test]
    fn unknown_keys_are_named() {
        let message = config("[batch]\nfiel = \"x\"\n").unwrap_err().to_string();
        assert!(
            message.starts_with("job.toml: [batch]: unknown field `fiel`"),
            "{message}"
        );
        assert!(!message.contains('\n'), "{message}");
        let message = config("[batch]\nsynthetic = { dist = \"zipf\", count = 3 }\n")
            .unwrap_err()
            .to_string();
        assert!(message.contains("zipf"), "{message}");
    }

    #[test]
    fn dataset_source_must_be_exactly_one() {
        let none = BatchConfig::default()
            .resolve(Path::new("."))
            .unwrap_err()
            .to_string();
        assert!(none.starts_with("[batch]: no dataset"), "{none}");
        let both = config("[batch]\nfile = \"x\"\nsynthetic = { dist = \"pareto\", scale = 1, shape = 1, count = 3 }\n")
            .unwrap()
            .resolve(Path::new("."))
            .unwrap_err()
            .to_string();
        assert_eq!(both, "[batch]: give either `file` or `synthetic`, not both");
    }

    #[test]
    fn synthetic_parameters_must_match_the_distribution() {
        let missing = config("[batch]\nsynthetic = { dist = \"pareto\", scale = 1, count = 3 }\n")
            .unwrap()
            .resolve(Path::new("."))
            .unwrap_err()
            .to_string();
        assert_eq!(
            missing,
            "[batch] synthetic: dist = \"pareto\" needs `shape`"
        );
        let mixed = config("[batch]\nsynthetic = { dist = \"lognormal\", median = 3, sigma = 1, shape = 2, count = 3 }\n")
            .unwrap()
            .resolve(Path::new("."))
            .unwrap_err()
            .to_string();
        assert!(mixed.contains("takes `median` and `sigma`"), "{mixed}");
    }

    #[test]
    fn bad_options_name_the_key_not_a_flag() {
        let message = config("[batch]\nfile = \"x\"\nglobal_batch = 0\n")
            .unwrap()
            .resolve(Path::new("."))
            .unwrap_err()
            .to_string();
        assert!(
            message.starts_with("[batch] global_batch: must be a positive"),
            "{message}"
        );
    }
}
