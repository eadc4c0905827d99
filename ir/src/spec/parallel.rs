//! The parallel layout `tp=..,cp=..,pp=..,dp=..`.
//!
//! `dp` is the pool of data-parallel ranks. When `cp` is not given, a strategy that uses context
//! parallelism statically (Megatron-style) takes its CP degree out of that pool and reports the
//! choice; when `cp` is given it is fixed. Rank order is Megatron's: tp fastest, then cp, then
//! dp, then pp (so a TP group sits inside a node and DP replicas of one stage are neighbours).

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

use crate::error::{IrError, Result};

/// Degrees of tensor, context, pipeline and data parallelism.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ParallelSpec {
    pub tp: u32,
    /// Static context-parallel degree; `None` lets the strategy choose from the DP pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cp: Option<u32>,
    pub pp: u32,
    pub dp: u32,
}

/// The largest world (tp x cp x pp x dp) slimpack plans: the simulator and the schedule hold
/// per-device state, and a step's samples spread over DP replicas, so a larger world is work
/// without a plan at the end (a world of millions ran for minutes before this bound).
pub const MAX_WORLD: u64 = 16_384;

/// Coordinates of one device in the layout.
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
#[serde(deny_unknown_fields)]
pub struct Coords {
    pub tp: u32,
    pub cp: u32,
    pub dp: u32,
    pub pp: u32,
}

impl ParallelSpec {
    /// The static CP degree (1 when not given).
    pub fn cp_degree(&self) -> u32 {
        self.cp.unwrap_or(1)
    }

    /// Number of devices: tp x cp x pp x dp.
    pub fn world(&self) -> u64 {
        u64::from(self.tp) * u64::from(self.cp_degree()) * u64::from(self.pp) * u64::from(self.dp)
    }

    /// Checks that every degree is positive and the world is at most [`MAX_WORLD`] devices.
    pub fn validate(&self) -> Result<()> {
        for (name, value) in [
            ("tp", self.tp),
            ("cp", self.cp_degree()),
            ("pp", self.pp),
            ("dp", self.dp),
        ] {
            if value == 0 {
                return Err(IrError::spec(
                    "--parallel",
                    format!("{name} must be a positive integer, got 0"),
                ));
            }
        }
        if self.world() > MAX_WORLD {
            return Err(IrError::spec(
                "--parallel",
                format!(
                    "{self} is {} devices; slimpack plans at most {MAX_WORLD} devices (tp x cp x pp x dp)",
                    self.world()
                ),
            ));
        }
        Ok(())
    }

    /// Global rank of the device at `coords` (tp fastest, then cp, dp, pp).
    pub fn rank(&self, coords: Coords) -> u64 {
        let (tp, cp, dp) = (
            u64::from(self.tp),
            u64::from(self.cp_degree()),
            u64::from(self.dp),
        );
        u64::from(coords.tp)
            + tp * (u64::from(coords.cp) + cp * (u64::from(coords.dp) + dp * u64::from(coords.pp)))
    }

    /// Coordinates of a global rank; the inverse of [`ParallelSpec::rank`].
    pub fn coords(&self, rank: u64) -> Coords {
        let (tp, cp, dp) = (
            u64::from(self.tp),
            u64::from(self.cp_degree()),
            u64::from(self.dp),
        );
        Coords {
            tp: (rank % tp) as u32,
            cp: (rank / tp % cp) as u32,
            dp: (rank / (tp * cp) % dp) as u32,
            pp: (rank / (tp * cp * dp)) as u32,
        }
    }
}

impl FromStr for ParallelSpec {
    type Err = IrError;

    /// Parses `tp=8,cp=2,pp=4,dp=4`; omitted degrees are 1 (cp: not given).
    fn from_str(text: &str) -> Result<Self> {
        let mut spec = ParallelSpec {
            tp: 1,
            cp: None,
            pp: 1,
            dp: 1,
        };
        let bad = |message: String| IrError::spec("--parallel", message);
        let parts: Vec<&str> = text
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .collect();
        if parts.is_empty() {
            return Err(bad(
                "empty layout: give degrees as key=value (e.g. tp=8,pp=4,dp=4)".to_string(),
            ));
        }
        let mut seen: Vec<&str> = Vec::new();
        for part in parts {
            let (key, value) = part.split_once('=').ok_or_else(|| {
                bad(format!(
                    "expected key=value in '{part}' (e.g. tp=8,cp=1,pp=4,dp=4)"
                ))
            })?;
            let value: u32 = value.trim().parse().map_err(|_| {
                bad(format!(
                    "'{}' is not a positive integer in '{part}'",
                    value.trim()
                ))
            })?;
            let key = key.trim();
            if seen.contains(&key) {
                return Err(bad(format!("degree '{key}' is given twice in '{text}'")));
            }
            seen.push(key);
            match key {
                "tp" => spec.tp = value,
                "cp" => spec.cp = Some(value),
                "pp" => spec.pp = value,
                "dp" => spec.dp = value,
                other => {
                    return Err(bad(format!(
                        "unknown degree '{other}' (valid: tp, cp, pp, dp)"
                    )))
                }
            }
        }
        spec.validate()?;
        Ok(spec)
    }
}

impl fmt::Display for ParallelSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "tp={}", self.tp)?;
        if let Some(cp) = self.cp {
            write!(f, ",cp={cp}")?;
        }
        write!(f, ",pp={},dp={}", self.pp, self.dp)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_layouts() {
        let spec: ParallelSpec = "tp=8,pp=4,dp=4".parse().unwrap();
        assert_eq!(spec.cp, None);
        assert_eq!(spec.world(), 128);
        assert_eq!(spec.to_string(), "tp=8,pp=4,dp=4");
        let spec: ParallelSpec = "tp=2,cp=2,pp=1,dp=3".parse().unwrap();
        assert_eq!(spec.to_string(), "tp=2,cp=2,pp=1,dp=3");
    }

    #[test]
    fn rejects_bad_layouts() {
        for (text, needle) in [
            ("tp=0", "tp must be a positive integer"),
            ("tp=x", "'x' is not a positive integer"),
            ("ep=2", "unknown degree 'ep'"),
            ("tp8", "expected key=value"),
            ("tp=1,tp=2", "degree 'tp' is given twice"),
            ("", "empty layout"),
            (" , ", "empty layout"),
            ("dp=1000000", "at most 16384 devices"),
        ] {
            let message = text.parse::<ParallelSpec>().unwrap_err().to_string();
            assert!(message.contains(needle), "{text}: {message}");
        }
    }

    #[test]
    fn rank_and_coords_are_inverse() {
        let spec: ParallelSpec = "tp=2,cp=2,pp=3,dp=2".parse().unwrap();
        for rank in 0..spec.world() {
            assert_eq!(spec.rank(spec.coords(rank)), rank);
        }
        assert_eq!(spec.coords(1).tp, 1);
        assert_eq!(spec.coords(2).cp, 1);
    }
}
