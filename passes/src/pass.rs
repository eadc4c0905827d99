//! The [`Pass`] trait, pass options and statistics.

use indexmap::IndexMap;
use serde::Serialize;
use std::ops::RangeInclusive;
use std::str::FromStr;

use crate::error::{PassError, Result};
use slimpack_ir::step::Phase;
use slimpack_ir::StepIr;

/// A transformation of the step IR.
///
/// A pass states the phases it accepts and the phase it leaves the IR in; the pass manager
/// checks the first, sets the second, and runs the verifier after it.
pub trait Pass {
    /// Stable kebab-case name, as in pipeline strings.
    fn name(&self) -> &'static str;
    /// Phases at which the pass may run.
    fn accepts(&self) -> RangeInclusive<Phase>;
    /// The phase the IR is in afterwards (`None`: unchanged).
    fn produces(&self) -> Option<Phase>;
    /// Transforms the IR and reports statistics.
    fn run(&mut self, ir: &mut StepIr) -> Result<Statistics>;
}

/// Named counters a pass reports (in insertion order).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(transparent)]
pub struct Statistics(IndexMap<String, serde_json::Value>);

impl Statistics {
    pub fn new() -> Statistics {
        Statistics::default()
    }

    /// Records a value under `name` (replacing an earlier one).
    pub fn set(&mut self, name: &str, value: impl Into<serde_json::Value>) {
        self.0.insert(name.to_string(), value.into());
    }

    /// Builder form of [`Statistics::set`].
    pub fn with(mut self, name: &str, value: impl Into<serde_json::Value>) -> Statistics {
        self.set(name, value);
        self
    }

    pub fn get(&self, name: &str) -> Option<&serde_json::Value> {
        self.0.get(name)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&String, &serde_json::Value)> {
        self.0.iter()
    }
}

/// Description of one option of a pass.
#[derive(Debug, Clone, Copy)]
pub struct OptionInfo {
    pub name: &'static str,
    pub help: &'static str,
}

/// The options given to one pass in a pipeline string (`slice{size=4096}`), in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PassOptions {
    pub pass: &'static str,
    values: IndexMap<String, String>,
}

impl PassOptions {
    pub fn new(pass: &'static str, values: IndexMap<String, String>) -> PassOptions {
        PassOptions { pass, values }
    }

    /// Rejects options the pass does not declare.
    pub fn check_known(&self, known: &[OptionInfo]) -> Result<()> {
        match self
            .values
            .keys()
            .find(|k| !known.iter().any(|o| o.name == k.as_str()))
        {
            None => Ok(()),
            Some(option) => Err(PassError::UnknownOption {
                pass: self.pass,
                option: option.clone(),
                valid: if known.is_empty() {
                    "none".to_string()
                } else {
                    known.iter().map(|o| o.name).collect::<Vec<_>>().join(", ")
                },
            }),
        }
    }

    /// A typed option value, or `None` when not given.
    pub fn get<T: FromStr>(&self, option: &str, expected: &str) -> Result<Option<T>> {
        match self.values.get(option) {
            None => Ok(None),
            Some(value) => value.parse().map(Some).map_err(|_| PassError::BadOption {
                pass: self.pass,
                option: option.to_string(),
                value: value.clone(),
                message: format!("expected {expected}"),
            }),
        }
    }

    /// Renders the options as in a pipeline string (`{size=4096}`), or nothing.
    pub fn render(&self) -> String {
        if self.values.is_empty() {
            return String::new();
        }
        let parts: Vec<String> = self
            .values
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        format!("{{{}}}", parts.join(","))
    }
}

/// Renders a phase range for messages (`logical..assigned`).
pub fn describe_phases(range: &RangeInclusive<Phase>) -> String {
    if range.start() == range.end() {
        format!("phase '{}'", range.start())
    } else {
        format!("phases '{}' to '{}'", range.start(), range.end())
    }
}
