//! The parallel layout `tp=..,cp=..,pp=..,vpp=..,dp=..`.
//!
//! `vpp` is the number of model chunks per pipeline device (Megatron's virtual pipeline stages,
//! `--num-layers-per-virtual-pipeline-stage`): with `vpp = v` the model is cut into `pp · v`
//! pipeline stages of `layers / (pp · v)` layers, and stage `k` runs on pipeline device `k mod
//! pp`, so every device holds `v` chunks spread over the model (interleaved 1F1B). `vpp` does
//! not change the device count.
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
    /// Model chunks per pipeline device (virtual pipeline stages); 1: plain pipeline stages.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub vpp: u32,
    pub dp: u32,
}

fn one() -> u32 {
    1
}

fn is_one(value: &u32) -> bool {
    *value == 1
}

/// The largest world (tp x cp x pp x dp) slimpack plans: the simulator and the schedule hold
/// per-device state, and a step's samples spread over DP replicas, so a larger world is work
/// without a plan at the end (a world of millions ran for minutes before this bound).
pub const MAX_WORLD: u64 = 16_384;

/// The most pipeline stages (`pp · vpp`) a layout may have: more than any model has layers.
pub const MAX_STAGES: u64 = 65_536;

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

    /// Pipeline stages of the model: `pp · vpp` (a device holds `vpp` of them).
    pub fn stages(&self) -> u32 {
        self.pp * self.vpp
    }

    /// The pipeline device (`pp` coordinate) that runs pipeline stage `stage`.
    pub fn device_of_stage(&self, stage: u32) -> u32 {
        stage % self.pp
    }

    /// The pipeline stages (model chunks) pipeline device `device` runs, in chunk order.
    pub fn stages_on(&self, device: u32) -> impl Iterator<Item = u32> {
        (device..self.stages()).step_by(self.pp.max(1) as usize)
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
            ("vpp", self.vpp),
            ("dp", self.dp),
        ] {
            if value == 0 {
                return Err(IrError::spec(
                    "--parallel",
                    format!("{name} must be a positive integer, got 0"),
                ));
            }
        }
        if self.vpp > 1 && self.pp < 2 {
            return Err(IrError::spec(
                "--parallel",
                format!(
                    "vpp={} needs pp >= 2 (model chunks interleave across pipeline devices)",
                    self.vpp
                ),
            ));
        }
        let stages = u64::from(self.pp) * u64::from(self.vpp);
        if stages > MAX_STAGES {
            return Err(IrError::spec(
                "--parallel",
                format!(
                    "pp={} x vpp={} is {stages} pipeline stages; slimpack plans at most {MAX_STAGES}",
                    self.pp, self.vpp
                ),
            ));
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
            vpp: 1,
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
                "vpp" => spec.vpp = value,
                "dp" => spec.dp = value,
                other => {
                    return Err(bad(format!(
                        "unknown degree '{other}' (valid: tp, cp, pp, vpp, dp)"
                    )))
                }
            }
        }
        spec.validate()?;
        Ok(spec)
    }
}

impl ParallelSpec {
    /// Whether the layout text `text` gives `degree` (`vpp=1` does, which the parsed spec
    /// cannot tell from a layout that leaves it to its default).
    pub fn gives(text: &str, degree: &str) -> bool {
        (text.split(','))
            .filter_map(|part| part.split_once('='))
            .any(|(key, _)| key.trim() == degree)
    }
}

impl fmt::Display for ParallelSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "tp={}", self.tp)?;
        if let Some(cp) = self.cp {
            write!(f, ",cp={cp}")?;
        }
        write!(f, ",pp={}", self.pp)?;
        if self.vpp != 1 {
            write!(f, ",vpp={}", self.vpp)?;
        }
        write!(f, ",dp={}", self.dp)
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
        let spec: ParallelSpec = "tp=8,pp=4,vpp=2,dp=2".parse().unwrap();
        assert_eq!((spec.stages(), spec.world()), (8, 64));
        assert_eq!(spec.device_of_stage(5), 1);
        assert_eq!(spec.stages_on(1).collect::<Vec<_>>(), [1, 5]);
        assert_eq!(spec.to_string(), "tp=8,pp=4,vpp=2,dp=2");
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
            ("pp=1,vpp=2", "vpp=2 needs pp >= 2"),
            ("pp=2,vpp=0", "vpp must be a positive integer"),
            ("pp=2,vpp=4294967295", "slimpack plans at most 65536"),
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
