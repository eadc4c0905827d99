//! The options that turn a dataset into global batches, and their checks.
//!
//! They mirror the command-line flags `--context`, `--global-batch`, `--global-batch-tokens`
//! and `--seed`; errors name the flag.

use serde::{Deserialize, Serialize};

use super::batch_error;
use crate::error::Result;

/// How global batches are drawn from a dataset (see [`super::Dataset::global_batches`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct BatchOptions {
    /// Maximum sample length (`--context`): longer documents are cut into pieces of this length.
    pub context: Option<u32>,
    /// Budget in samples, counted after cutting (`--global-batch`).
    pub global_batch: Option<usize>,
    /// Budget in tokens (`--global-batch-tokens`).
    pub global_batch_tokens: Option<u64>,
    /// Seed of the document order (`--seed`).
    pub seed: u64,
}

/// What a global batch is filled up to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Budget {
    /// The whole dataset in file order.
    Everything,
    /// At least this many samples.
    Samples(u64),
    /// At least this many tokens.
    Tokens(u64),
}

impl Budget {
    /// Whether a batch of `samples` samples and `tokens` tokens has met the budget.
    pub(super) fn is_met(self, samples: u64, tokens: u64) -> bool {
        match self {
            Budget::Everything => false,
            Budget::Samples(budget) => samples >= budget,
            Budget::Tokens(budget) => tokens >= budget,
        }
    }
}

impl BatchOptions {
    /// Checks that each given value is positive and at most one budget is given; errors name
    /// the command-line flags.
    pub fn validate(&self) -> Result<()> {
        self.check(&|flag: &str| flag.to_string())
    }

    /// [`BatchOptions::validate`] for options a config file's `table` gave: errors name its
    /// keys (`[batch] global_batch`), not the flags the file was not given by.
    pub fn validate_in(&self, table: &str) -> Result<()> {
        self.check(&|flag: &str| {
            format!(
                "{table} {}",
                flag.trim_start_matches("--").replace('-', "_")
            )
        })
    }

    fn check(&self, named: &dyn Fn(&str) -> String) -> Result<()> {
        let zero = |flag: &str, what: &str| {
            Err(batch_error(
                named(flag),
                format!("must be a positive number of {what}, got 0"),
            ))
        };
        if self.context == Some(0) {
            return zero("--context", "tokens per sample");
        }
        if self.global_batch == Some(0) {
            return zero("--global-batch", "samples");
        }
        if self.global_batch_tokens == Some(0) {
            return zero("--global-batch-tokens", "tokens");
        }
        if let Some(tokens) = self.global_batch_tokens.filter(|&n| n > super::MAX_TOKENS) {
            return Err(batch_error(
                named("--global-batch-tokens"),
                format!(
                    "{tokens} tokens is more than the {} a batch may hold",
                    super::MAX_TOKENS
                ),
            ));
        }
        if let Some(samples) = self.global_batch.filter(|&n| n > super::MAX_SAMPLES) {
            return Err(batch_error(
                named("--global-batch"),
                format!(
                    "{samples} samples is more than the {} a batch may hold",
                    super::MAX_SAMPLES
                ),
            ));
        }
        if let (Some(samples), Some(tokens)) = (self.global_batch, self.global_batch_tokens) {
            let (by_samples, by_tokens) = (named("--global-batch"), named("--global-batch-tokens"));
            return Err(batch_error(
                by_samples.clone(),
                format!(
                    "give a budget in samples or in tokens, not both (got {by_samples} {samples} and {by_tokens} {tokens})"
                ),
            ));
        }
        Ok(())
    }

    /// The budget the options set (checked by [`BatchOptions::validate`] first).
    pub(super) fn budget(&self) -> Budget {
        match (self.global_batch, self.global_batch_tokens) {
            (Some(samples), _) => Budget::Samples(samples as u64),
            (None, Some(tokens)) => Budget::Tokens(tokens),
            (None, None) => Budget::Everything,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(options: BatchOptions) -> String {
        options.validate().unwrap_err().to_string()
    }

    #[test]
    fn zeros_name_the_flag() {
        let context = message(BatchOptions {
            context: Some(0),
            ..BatchOptions::default()
        });
        assert_eq!(
            context,
            "--context: must be a positive number of tokens per sample, got 0"
        );
        let samples = message(BatchOptions {
            global_batch: Some(0),
            ..BatchOptions::default()
        });
        assert_eq!(
            samples,
            "--global-batch: must be a positive number of samples, got 0"
        );
        let tokens = message(BatchOptions {
            global_batch_tokens: Some(0),
            ..BatchOptions::default()
        });
        assert_eq!(
            tokens,
            "--global-batch-tokens: must be a positive number of tokens, got 0"
        );
    }

    #[test]
    fn a_config_files_zeros_name_its_keys() {
        let options = BatchOptions {
            global_batch: Some(0),
            ..BatchOptions::default()
        };
        assert_eq!(
            options.validate_in("[batch]").unwrap_err().to_string(),
            "[batch] global_batch: must be a positive number of samples, got 0"
        );
        let both = BatchOptions {
            global_batch: Some(4),
            global_batch_tokens: Some(100),
            ..BatchOptions::default()
        };
        assert!(both
            .validate_in("[batch]")
            .unwrap_err()
            .to_string()
            .contains("(got [batch] global_batch 4 and [batch] global_batch_tokens 100)"));
    }

    #[test]
    fn one_budget_at_most() {
        let both = message(BatchOptions {
            global_batch: Some(4),
            global_batch_tokens: Some(100),
            ..BatchOptions::default()
        });
        assert!(
            both.starts_with("--global-batch: give a budget in samples or in tokens, not both"),
            "{both}"
        );
        assert!(BatchOptions::default().validate().is_ok());
    }

    #[test]
    fn budgets_are_met_when_reached() {
        assert!(Budget::Tokens(10).is_met(1, 10));
        assert!(Budget::Tokens(10).is_met(1, 11));
        assert!(!Budget::Tokens(10).is_met(5, 9));
        assert!(Budget::Samples(3).is_met(3, 0));
        assert!(!Budget::Everything.is_met(u64::MAX, u64::MAX));
    }
}
