//! Calibration tables: measured achieved rates that replace the analytic efficiency curves.
//!
//! A calibration file is JSON, one per device kind (the `cpu` backend writes its own with
//! `slimpack calibrate`; a GPU one is produced where a GPU is available):
//!
//! ```json
//! {
//!   "device": "cpu-2core",
//!   "source": "slimpack calibrate, model tiny, tp=1",
//!   "tables": {
//!     "gemm-forward": [ { "tokens": 64, "rate": 2.1e10 }, { "tokens": 1024, "rate": 8.9e10 } ]
//!   }
//! }
//! ```
//!
//! `device` is the [`slimpack_ir::spec::GpuSpec`] name the tables were measured on; `rate` is FLOP/s
//! for the GEMM and attention kinds and bytes/s for `elementwise` (see [`OpKind`]). Tables are
//! measured for one model shape and TP degree (the GEMM widths per device); `source` should say
//! which. Between points, rates are interpolated piecewise-linearly in log(tokens); below the
//! first point the rate falls in proportion to tokens (the small-n limit of a saturating curve);
//! above the last it stays flat. Kinds without a table keep their analytic curve. Output is
//! deterministic: tables are keyed in [`OpKind`] order.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

use super::efficiency::OpKind;
use crate::error::{MachineError, Result};

/// One measurement: a kernel over `tokens` tokens achieved `rate`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CalibrationPoint {
    pub tokens: f64,
    /// FLOP/s, or bytes/s for [`OpKind::Elementwise`].
    pub rate: f64,
}

/// The slowest rate a table may hold (FLOP/s or bytes/s).
const MIN_RATE: f64 = 1.0;

/// Measured rates of one op kind, sorted by strictly increasing tokens.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "Vec<CalibrationPoint>", into = "Vec<CalibrationPoint>")]
pub struct CalibrationTable {
    points: Vec<CalibrationPoint>,
    /// `ln(tokens)` of each point, precomputed for interpolation.
    log_tokens: Vec<f64>,
}

impl CalibrationTable {
    /// A table from measurements; they must be non-empty, positive and finite, with strictly
    /// increasing token counts.
    pub fn new(points: Vec<CalibrationPoint>) -> std::result::Result<CalibrationTable, String> {
        if points.is_empty() {
            return Err("a table needs at least one point".to_string());
        }
        for (i, point) in points.iter().enumerate() {
            let positive = |v: f64| v.is_finite() && v > 0.0;
            if !positive(point.tokens) || !positive(point.rate) {
                return Err(format!(
                    "point {i} ({{tokens: {}, rate: {}}}) must have positive finite values",
                    point.tokens, point.rate
                ));
            }
            // Anything slower is no measurement of a kernel, and would price a step at
            // infinity (a rate of 1e-300).
            if point.rate < MIN_RATE {
                return Err(format!(
                    "point {i} has rate {}: a measured rate is at least {MIN_RATE} per second",
                    point.rate
                ));
            }
            if i > 0 && point.tokens <= points[i - 1].tokens {
                return Err(format!(
                    "tokens must increase strictly: point {i} has {} after {}",
                    point.tokens,
                    points[i - 1].tokens
                ));
            }
        }
        let log_tokens = points.iter().map(|p| p.tokens.ln()).collect();
        Ok(CalibrationTable { points, log_tokens })
    }

    /// The measurements.
    pub fn points(&self) -> &[CalibrationPoint] {
        &self.points
    }

    /// The rate at `tokens`, interpolated piecewise-linearly in log(tokens).
    pub fn rate_at(&self, tokens: f64) -> f64 {
        let first = self.points[0];
        let last = self.points[self.points.len() - 1];
        if tokens <= first.tokens {
            return first.rate * tokens.max(0.0) / first.tokens;
        }
        if tokens >= last.tokens {
            return last.rate;
        }
        let upper = self.points.partition_point(|p| p.tokens <= tokens);
        let (below, above) = (self.points[upper - 1], self.points[upper]);
        let (log_below, log_above) = (self.log_tokens[upper - 1], self.log_tokens[upper]);
        let t = (tokens.ln() - log_below) / (log_above - log_below);
        below.rate + t * (above.rate - below.rate)
    }
}

impl TryFrom<Vec<CalibrationPoint>> for CalibrationTable {
    type Error = String;
    fn try_from(points: Vec<CalibrationPoint>) -> std::result::Result<Self, String> {
        CalibrationTable::new(points)
    }
}

impl From<CalibrationTable> for Vec<CalibrationPoint> {
    fn from(table: CalibrationTable) -> Self {
        table.points
    }
}

/// Measured rates of one device, per op kind.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Calibration {
    /// Name of the device measured ([`slimpack_ir::spec::GpuSpec::name`]).
    pub device: String,
    /// How and for which model/TP shape the tables were measured.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub source: String,
    /// One table per calibrated op kind.
    pub tables: BTreeMap<OpKind, CalibrationTable>,
}

impl Calibration {
    /// An empty calibration of `device`.
    pub fn new(device: impl Into<String>) -> Calibration {
        Calibration {
            device: device.into(),
            source: String::new(),
            tables: BTreeMap::new(),
        }
    }

    /// Sets the table of `op`.
    pub fn insert(&mut self, op: OpKind, table: CalibrationTable) {
        self.tables.insert(op, table);
    }

    /// Parses calibration JSON; `source_name` names it in errors.
    pub fn from_json(text: &str, source_name: &str) -> Result<Calibration> {
        serde_json::from_str(text)
            .map_err(|e| MachineError::calibration(source_name, e.to_string()))
    }

    /// Pretty JSON, tables in [`OpKind`] order.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a calibration always serializes (bug)")
    }

    /// Reads a calibration file.
    pub fn load(path: &Path) -> Result<Calibration> {
        let text =
            slimpack_ir::file::read_to_string(path).map_err(|source| MachineError::Read {
                path: path.into(),
                source,
            })?;
        Calibration::from_json(&text, &path.display().to_string())
    }

    /// Writes a calibration file.
    pub fn save(&self, path: &Path) -> Result<()> {
        std::fs::write(path, self.to_json() + "\n").map_err(|source| MachineError::Write {
            path: path.into(),
            source,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(tokens: f64, rate: f64) -> CalibrationPoint {
        CalibrationPoint { tokens, rate }
    }

    fn sample() -> Calibration {
        let mut calibration = Calibration::new("cpu-2core");
        calibration.source = "hand-written test table".to_string();
        let gemm = vec![point(16.0, 1e10), point(256.0, 5e10), point(4096.0, 9e10)];
        calibration.insert(OpKind::GemmForward, CalibrationTable::new(gemm).unwrap());
        let bytes = vec![point(1.0, 4e9)];
        calibration.insert(OpKind::Elementwise, CalibrationTable::new(bytes).unwrap());
        calibration
    }

    #[test]
    fn json_round_trip_is_identity_and_deterministic() {
        let calibration = sample();
        let json = calibration.to_json();
        let back = Calibration::from_json(&json, "round-trip").unwrap();
        assert_eq!(back, calibration);
        assert_eq!(back.to_json(), json);
        assert!(json.find("gemm-forward").unwrap() < json.find("elementwise").unwrap());
    }

    #[test]
    fn save_and_load_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("calibration.json");
        sample().save(&path).unwrap();
        let loaded = Calibration::load(&path).unwrap();
        assert_eq!(loaded, sample());
    }

    #[test]
    fn interpolates_linearly_in_log_tokens() {
        let table = &sample().tables[&OpKind::GemmForward];
        assert_eq!(table.rate_at(16.0), 1e10);
        assert_eq!(table.rate_at(256.0), 5e10);
        // 64 is halfway between 16 and 256 in log space.
        assert!((table.rate_at(64.0) - 3e10).abs() < 1.0);
        // 1024 is halfway between 256 and 4096.
        assert!((table.rate_at(1024.0) - 7e10).abs() < 1.0);
        // Flat above the last point, proportional to tokens below the first.
        assert_eq!(table.rate_at(1e6), 9e10);
        assert_eq!(table.rate_at(8.0), 0.5e10);
    }

    #[test]
    fn rejects_bad_tables_with_one_line_errors() {
        let cases = [
            (
                r#"{"device":"x","tables":{"gemm-forward":[]}}"#,
                "at least one point",
            ),
            (
                r#"{"device":"x","tables":{"gemm-forward":[{"tokens":8,"rate":1},{"tokens":8,"rate":2}]}}"#,
                "increase strictly",
            ),
            (
                r#"{"device":"x","tables":{"gemm-forward":[{"tokens":8,"rate":-1}]}}"#,
                "positive finite",
            ),
            (
                r#"{"device":"x","tables":{"gemm-forward":[{"tokens":8,"rate":1e-300}]}}"#,
                "at least 1 per second",
            ),
            (
                r#"{"device":"x","tables":{"matmul":[]}}"#,
                "unknown variant",
            ),
        ];
        for (json, needle) in cases {
            let message = Calibration::from_json(json, "cal.json")
                .unwrap_err()
                .to_string();
            assert!(message.starts_with("cal.json: "), "{message}");
            assert!(message.contains(needle), "{message}");
            assert!(!message.contains('\n'), "{message}");
        }
    }
}
