//! The [`Pass`] trait, its declaration ([`PassInfo`]), the context every pass receives
//! ([`PassContext`]), pass options and statistics.
//!
//! A pass is declared once, in a `const INFO: PassInfo` of its own file: name, summary,
//! description, the phases it accepts and produces, its options with their defaults. The pass
//! manager reads the phases from there, builds one [`PassContext`] per run, and hands it to
//! every pass. A pass transforms only the IR it is given: what passes share are plain
//! functions, never another pass.

use indexmap::IndexMap;
use serde::Serialize;
use std::ops::RangeInclusive;
use std::str::FromStr;

use crate::error::{PassError, Result};
use slimpack_ir::step::Phase;
use slimpack_ir::{Spec, StepIr};
use slimpack_machine::CostModel;

/// A transformation of the step IR.
///
/// The pass manager checks the IR's phase against [`PassInfo::accepts`], runs the pass, moves
/// the phase on to [`PassInfo::produces`] and runs the verifier.
pub trait Pass {
    /// The pass's declaration.
    fn info(&self) -> &'static PassInfo;
    /// Transforms the IR and reports statistics.
    fn run(&mut self, ir: &mut StepIr, cx: &PassContext) -> Result<Statistics>;
}

/// What the registry and the manager know of a pass without creating it.
pub struct PassInfo {
    /// Stable kebab-case name, as in pipeline strings.
    pub name: &'static str,
    /// One line, shown by `slimpack passes`.
    pub summary: &'static str,
    /// A few sentences: what it does, its contract, the phases in and out.
    pub description: &'static str,
    /// Phases at which the pass may run.
    pub accepts: RangeInclusive<Phase>,
    /// The phase the IR is in afterwards (`None`: unchanged).
    pub produces: Option<Phase>,
    pub options: &'static [OptionInfo],
    /// Builds the pass from its (already name-checked) options.
    pub create: fn(&PassOptions) -> Result<Box<dyn Pass>>,
}

/// What every pass of a pipeline run receives: the machine model of the step's spec, built
/// once by the manager — calibrated where slimpack ships a calibration for the device, so that
/// passes plan on the same machine the simulator judges them on.
pub struct PassContext {
    machine: CostModel,
}

impl PassContext {
    /// A context over `machine`.
    pub fn new(machine: CostModel) -> PassContext {
        PassContext { machine }
    }

    /// The context of a step compiled for `spec` ([`slimpack_machine::machine_model`]).
    pub fn for_spec(spec: &Spec) -> PassContext {
        PassContext::new(slimpack_machine::machine_model(spec))
    }

    /// The cost and memory model passes plan with.
    pub fn machine(&self) -> &CostModel {
        &self.machine
    }
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
    /// The value the pass runs with when the option is not given: a literal (parsed like a
    /// given value), or `None` when the default is computed from the step (the help says how).
    pub default: Option<&'static str>,
}

impl OptionInfo {
    /// The help line with its default (`slimpack passes --verbose`).
    pub fn describe(&self) -> String {
        match self.default {
            Some(default) => format!("{} (default {default})", self.help),
            None => self.help.to_string(),
        }
    }
}

/// The options given to one pass in a pipeline string (`slice{size=4096}`), in order, with the
/// pass's declared options (whose defaults fill what was not given).
#[derive(Debug, Clone, Default)]
pub struct PassOptions {
    pub pass: &'static str,
    values: IndexMap<String, String>,
    declared: &'static [OptionInfo],
}

impl PartialEq for PassOptions {
    fn eq(&self, other: &PassOptions) -> bool {
        self.pass == other.pass && self.values == other.values
    }
}

impl Eq for PassOptions {}

impl PassOptions {
    pub fn new(
        pass: &'static str,
        values: IndexMap<String, String>,
        declared: &'static [OptionInfo],
    ) -> PassOptions {
        PassOptions {
            pass,
            values,
            declared,
        }
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

    /// A typed option value: the given one, else the declared literal default, else `None`.
    pub fn get<T: FromStr>(&self, option: &str, expected: &str) -> Result<Option<T>> {
        let value = self.values.get(option).map(String::as_str).or_else(|| {
            self.declared
                .iter()
                .find(|o| o.name == option)
                .and_then(|o| o.default)
        });
        match value {
            None => Ok(None),
            Some(value) => value.parse().map(Some).map_err(|_| PassError::BadOption {
                pass: self.pass,
                option: option.to_string(),
                value: value.to_string(),
                message: format!("expected {expected}"),
            }),
        }
    }

    /// A positive integer option (as [`PassOptions::get`]); zero is an error.
    pub fn positive<T: FromStr + Default + PartialEq>(&self, option: &str) -> Result<Option<T>> {
        match self.get::<T>(option, "a positive integer")? {
            Some(value) if value == T::default() => Err(PassError::BadOption {
                pass: self.pass,
                option: option.to_string(),
                value: "0".into(),
                message: "expected a positive integer".into(),
            }),
            value => Ok(value),
        }
    }

    /// A fraction in (0, 1] (as [`PassOptions::get`]).
    pub fn fraction(&self, option: &str) -> Result<Option<f64>> {
        match self.get::<f64>(option, "a fraction in (0, 1]")? {
            Some(value) if !(value > 0.0 && value <= 1.0) => Err(PassError::BadOption {
                pass: self.pass,
                option: option.to_string(),
                value: value.to_string(),
                message: "expected a fraction in (0, 1]".into(),
            }),
            value => Ok(value),
        }
    }

    /// A positive integer of at most `max` (as [`PassOptions::positive`]): for search limits,
    /// whose memory grows with them.
    pub fn bounded(&self, option: &str, max: u64) -> Result<Option<u64>> {
        match self.positive::<u64>(option)? {
            Some(value) if value > max => Err(PassError::BadOption {
                pass: self.pass,
                option: option.to_string(),
                value: value.to_string(),
                message: format!("expected 1 to {max}"),
            }),
            value => Ok(value),
        }
    }

    /// One of `valid` (as [`PassOptions::get`]); anything else is an error listing them.
    pub fn choice(&self, option: &str, valid: &[&'static str]) -> Result<Option<&'static str>> {
        let expected = match valid {
            [] => String::new(),
            [one] => one.to_string(),
            [rest @ .., last] => format!("{} or {last}", rest.join(", ")),
        };
        match self.get::<String>(option, &expected)? {
            None => Ok(None),
            Some(value) => match valid.iter().find(|v| **v == value) {
                Some(found) => Ok(Some(found)),
                None => Err(PassError::BadOption {
                    pass: self.pass,
                    option: option.to_string(),
                    value,
                    message: format!("expected {expected}"),
                }),
            },
        }
    }

    /// A required positive integer option.
    pub fn required_positive<T: FromStr + Default + PartialEq>(&self, option: &str) -> Result<T> {
        let declared = self
            .declared
            .iter()
            .find(|o| o.name == option)
            .expect("a pass asks only for options it declares (bug)");
        self.positive(option)?.ok_or(PassError::MissingOption {
            pass: self.pass,
            option: declared.name,
            help: declared.help,
        })
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
