//! Synthetic datasets: lengths drawn from a lognormal or Pareto distribution with a seed.
//!
//! Each draw is rounded to the nearest integer and clamped to `[1, max]`. The generator is
//! ChaCha8 seeded with [`Synthetic::seed`] (`rand_chacha`, whose output stream is fixed by its
//! specification), sampled through `rand_distr` 0.5; `Cargo.lock` pins both, so a seed gives the
//! same lengths on every run and every machine. A test pins the first lengths of one seed: a
//! dependency upgrade that changes them fails it instead of silently changing every benchmark.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::Distribution as _;
use serde::{Deserialize, Serialize};

use super::{batch_error, Dataset};
use crate::error::Result;

/// A length distribution.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum Distribution {
    /// `exp(N(ln median, sigma²))`: the median is `median`, `sigma` sets the tail.
    LogNormal { median: f64, sigma: f64 },
    /// Pareto type I: every draw is at least `scale`; smaller `shape` means a heavier tail.
    Pareto { scale: f64, shape: f64 },
}

/// A seeded synthetic dataset of `count` documents.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Synthetic {
    pub distribution: Distribution,
    /// Number of documents.
    pub count: usize,
    /// Longest length; longer draws are clamped to it.
    pub max: u32,
    pub seed: u64,
}

impl Synthetic {
    /// Checks the parameters: positive finite scale/median/shape, non-negative finite sigma,
    /// and at least one document of at least one token.
    pub fn validate(&self) -> Result<()> {
        let bad = |message: String| Err(batch_error(self.describe(), message));
        let positive = |value: f64| value.is_finite() && value > 0.0;
        match self.distribution {
            Distribution::LogNormal { median, sigma } => {
                if !positive(median) {
                    return bad(format!(
                        "median must be a positive number, got {}",
                        number(median)
                    ));
                }
                if !(sigma.is_finite() && sigma >= 0.0) {
                    return bad(format!(
                        "sigma must be a number >= 0, got {}",
                        number(sigma)
                    ));
                }
            }
            Distribution::Pareto { scale, shape } => {
                if !positive(scale) {
                    return bad(format!(
                        "scale must be a positive number, got {}",
                        number(scale)
                    ));
                }
                if !positive(shape) {
                    return bad(format!(
                        "shape must be a positive number, got {}",
                        number(shape)
                    ));
                }
            }
        }
        if self.count == 0 {
            return bad("count must be at least 1 document, got 0".to_string());
        }
        if self.count > super::MAX_SAMPLES {
            return bad(format!(
                "count={} is more than the {} documents a batch may hold",
                self.count,
                super::MAX_SAMPLES
            ));
        }
        if self.max == 0 {
            return bad("max must be at least 1 token, got 0".to_string());
        }
        Ok(())
    }

    /// Draws the dataset; its name describes the distribution and seed.
    pub fn generate(&self) -> Result<Dataset> {
        self.validate()?;
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
        let invalid = |error: String| batch_error(self.describe(), error);
        let draws: Vec<f64> = match self.distribution {
            Distribution::LogNormal { median, sigma } => {
                let law = rand_distr::LogNormal::new(median.ln(), sigma)
                    .map_err(|e| invalid(e.to_string()))?;
                (0..self.count).map(|_| law.sample(&mut rng)).collect()
            }
            Distribution::Pareto { scale, shape } => {
                let law =
                    rand_distr::Pareto::new(scale, shape).map_err(|e| invalid(e.to_string()))?;
                (0..self.count).map(|_| law.sample(&mut rng)).collect()
            }
        };
        let max = f64::from(self.max);
        // `clamp` keeps +inf at `max`; the parameters checked above never produce NaN.
        let lengths = draws
            .into_iter()
            .map(|draw| draw.round().clamp(1.0, max) as u32)
            .collect();
        Ok(Dataset {
            name: self.describe(),
            lengths,
            empty: 0,
        })
    }

    /// `synthetic lognormal(median=350, sigma=1.2) count=1000 max=131072 seed=0`.
    pub fn describe(&self) -> String {
        let law = match self.distribution {
            Distribution::LogNormal { median, sigma } => {
                format!(
                    "lognormal(median={}, sigma={})",
                    number(median),
                    number(sigma)
                )
            }
            Distribution::Pareto { scale, shape } => {
                format!("pareto(scale={}, shape={})", number(scale), number(shape))
            }
        };
        format!(
            "synthetic {law} count={} max={} seed={}",
            self.count, self.max, self.seed
        )
    }
}

/// A parameter as given (`1.2`, `350`), in exponent form where plain digits would run long
/// (`1e308`, not 309 digits; `1e-9`).
fn number(value: f64) -> String {
    let magnitude = value.abs();
    if magnitude != 0.0 && magnitude.is_finite() && !(1e-6..1e16).contains(&magnitude) {
        format!("{value:e}")
    } else {
        value.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_print_as_given_or_in_exponent_form() {
        assert_eq!(number(1.2), "1.2");
        assert_eq!(number(350.0), "350");
        assert_eq!(number(0.0), "0");
        assert_eq!(number(1e308), "1e308");
        assert_eq!(number(-2.5e-9), "-2.5e-9");
        assert_eq!(number(f64::INFINITY), "inf");
    }

    fn lognormal(seed: u64) -> Synthetic {
        Synthetic {
            distribution: Distribution::LogNormal {
                median: 350.0,
                sigma: 1.5,
            },
            count: 2000,
            max: 16384,
            seed,
        }
    }

    #[test]
    fn same_seed_same_lengths() {
        let first = lognormal(7).generate().unwrap();
        assert_eq!(first, lognormal(7).generate().unwrap());
        assert_ne!(first.lengths, lognormal(8).generate().unwrap().lengths);
        assert_eq!(first.len(), 2000);
        assert!(first.lengths.iter().all(|&l| (1..=16384).contains(&l)));
    }

    #[test]
    fn lengths_are_pinned_for_a_seed() {
        let dataset = Synthetic {
            count: 6,
            ..lognormal(42)
        }
        .generate()
        .unwrap();
        assert_eq!(dataset.lengths, PINNED_LOGNORMAL_SEED_42);
        let pareto = Synthetic {
            distribution: Distribution::Pareto {
                scale: 100.0,
                shape: 1.1,
            },
            count: 6,
            max: 1_000_000,
            seed: 42,
        }
        .generate()
        .unwrap();
        assert_eq!(pareto.lengths, PINNED_PARETO_SEED_42);
    }

    const PINNED_LOGNORMAL_SEED_42: [u32; 6] = [717, 2589, 255, 715, 162, 86];
    const PINNED_PARETO_SEED_42: [u32; 6] = [142, 105, 217, 153, 309, 561];

    #[test]
    fn median_is_roughly_the_median() {
        let mut lengths = lognormal(1).generate().unwrap().lengths;
        lengths.sort_unstable();
        let median = lengths[lengths.len() / 2];
        assert!((250..=450).contains(&median), "median {median}");
    }

    #[test]
    fn pareto_draws_respect_scale_and_max() {
        let dataset = Synthetic {
            distribution: Distribution::Pareto {
                scale: 100.0,
                shape: 0.8,
            },
            count: 5000,
            max: 4096,
            seed: 3,
        }
        .generate()
        .unwrap();
        assert!(dataset.lengths.iter().all(|&l| (100..=4096).contains(&l)));
        assert!(
            dataset.lengths.contains(&4096),
            "a heavy tail must hit the clamp"
        );
    }

    #[test]
    fn bad_parameters_are_named() {
        let message = Synthetic {
            distribution: Distribution::LogNormal {
                median: -1.0,
                sigma: 1.0,
            },
            ..lognormal(0)
        }
        .generate()
        .unwrap_err()
        .to_string();
        assert_eq!(
            message,
            "synthetic lognormal(median=-1, sigma=1) count=2000 max=16384 seed=0: median must be a positive number, got -1"
        );
        let message = Synthetic {
            count: 0,
            ..lognormal(0)
        }
        .generate()
        .unwrap_err()
        .to_string();
        assert!(
            message.ends_with("count must be at least 1 document, got 0"),
            "{message}"
        );
        let message = Synthetic {
            max: 0,
            ..lognormal(0)
        }
        .generate()
        .unwrap_err()
        .to_string();
        assert!(
            message.ends_with("max must be at least 1 token, got 0"),
            "{message}"
        );
    }
}
