//! The pass manager: runs a pipeline over the IR, checking phases, verifying after each pass,
//! timing passes, printing and dumping the IR around them.
//!
//! Dumps are numbered by position: `00-input.sir`, then for the pass at position `k`,
//! `kk-<name>.before.sir` and `kk-<name>.after.sir`, so `diff` of a pair shows what one pass did.

use serde::Serialize;
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use crate::error::{PassError, Result};
use crate::pass::{describe_phases, PassContext, Statistics};
use crate::pipeline::PipelineEntry;
use slimpack_ir::{text, verify, StepIr};

/// Which IR the manager prints.
#[derive(Debug, Clone, Default)]
pub struct PrintOptions {
    /// Print the IR after every pass.
    pub after_all: bool,
    /// Print the IR after passes with these names.
    pub after: Vec<String>,
    /// Print the IR before passes with these names.
    pub before: Vec<String>,
}

/// Options of a pass-manager run.
#[derive(Debug, Clone)]
pub struct ManagerOptions {
    /// Run the verifier on the input and after every pass (default on).
    pub verify: bool,
    /// With `verify`: verify only the pipeline's result, not its input nor each pass (the
    /// tuner's candidates: the step handed on is checked whole, and a caller that finds it
    /// broken re-runs the pipeline verifying each pass to name the pass that broke it).
    pub verify_result_only: bool,
    pub print: PrintOptions,
    /// Write numbered before/after dumps into this directory.
    pub dump_dir: Option<PathBuf>,
}

impl ManagerOptions {
    /// Whether a run prints or dumps the IR (`--print-ir-*`, `--dump-dir`).
    pub fn shows_ir(&self) -> bool {
        self.dump_dir.is_some()
            || self.print.after_all
            || !self.print.after.is_empty()
            || !self.print.before.is_empty()
    }
}

impl Default for ManagerOptions {
    fn default() -> Self {
        ManagerOptions {
            verify: true,
            verify_result_only: false,
            print: PrintOptions::default(),
            dump_dir: None,
        }
    }
}

/// What one pass did: its name (with options), wall time and statistics.
#[derive(Debug, Clone, Serialize)]
pub struct PassRecord {
    pub name: &'static str,
    /// The entry as written in the pipeline (`slice{size=8192}`).
    pub pipeline_entry: String,
    pub ms: f64,
    /// Wall time of the verifier after the pass (0 with verification off).
    pub verify_ms: f64,
    pub statistics: Statistics,
}

/// The statistic value (`result = kept-input`) with which a pass says it left the step exactly
/// as it found it (`eqsat` where no refinement is cheaper than its input).
pub const KEPT_INPUT: &str = "kept-input";

impl PassRecord {
    /// The pass left the step exactly as it found it (see [`KEPT_INPUT`]).
    pub fn kept_input(&self) -> bool {
        self.statistics
            .get("result")
            .and_then(|value| value.as_str())
            == Some(KEPT_INPUT)
    }
}

/// Runs `pipeline` over `ir` with the machine model of its spec (built once, handed to every
/// pass). Printed IR goes to `print_sink` (stderr for the CLI).
pub fn run_pipeline(
    ir: &mut StepIr,
    pipeline: &[PipelineEntry],
    options: &ManagerOptions,
    print_sink: &mut dyn Write,
) -> Result<Vec<PassRecord>> {
    let cx = PassContext::for_spec(&ir.spec);
    run_pipeline_in(ir, pipeline, &cx, options, print_sink)
}

/// [`run_pipeline`] with a context the caller built (one machine model for several runs over
/// the same spec, as the tuner's candidates share).
pub fn run_pipeline_in(
    ir: &mut StepIr,
    pipeline: &[PipelineEntry],
    cx: &PassContext,
    options: &ManagerOptions,
    print_sink: &mut dyn Write,
) -> Result<Vec<PassRecord>> {
    assert!(
        cx.machine().spec() == &ir.spec,
        "a pass context runs over steps of its own spec (bug)"
    );
    if options.verify && !options.verify_result_only {
        verify::verify(ir).map_err(|source| PassError::Invalid {
            after: None,
            source,
        })?;
    }
    if let Some(dir) = &options.dump_dir {
        std::fs::create_dir_all(dir).map_err(|source| PassError::Dump {
            path: dir.clone(),
            source,
        })?;
        dump(dir, "00-input.sir", ir)?;
    }
    let mut records = Vec::with_capacity(pipeline.len());
    for (index, entry) in pipeline.iter().enumerate() {
        let position = index + 1;
        let mut pass = entry.create()?;
        let info = entry.info;
        let name = info.name;
        if !info.accepts.contains(&ir.phase()) {
            return Err(PassError::Phase {
                pass: name,
                phase: ir.phase(),
                accepts: describe_phases(&info.accepts),
            });
        }
        if options.print.before.iter().any(|p| p == name) {
            emit(print_sink, &format!("IR before {}", entry.render()), ir);
        }
        if let Some(dir) = &options.dump_dir {
            dump(dir, &format!("{position:02}-{name}.before.sir"), ir)?;
        }
        let start = Instant::now();
        let statistics = pass.run(ir, cx)?;
        let ms = start.elapsed().as_secs_f64() * 1e3;
        if let Some(phase) = info.produces {
            ir.advance(phase.max(ir.phase()));
        }
        let verify_start = Instant::now();
        let last = position == pipeline.len();
        if options.verify && (last || !options.verify_result_only) {
            verify::verify(ir).map_err(|source| PassError::Invalid {
                after: Some(name),
                source,
            })?;
        }
        let verify_ms = verify_start.elapsed().as_secs_f64() * 1e3;
        if options.print.after_all || options.print.after.iter().any(|p| p == name) {
            emit(print_sink, &format!("IR after {}", entry.render()), ir);
        }
        if let Some(dir) = &options.dump_dir {
            dump(dir, &format!("{position:02}-{name}.after.sir"), ir)?;
        }
        records.push(PassRecord {
            name,
            pipeline_entry: entry.render(),
            ms,
            verify_ms,
            statistics,
        });
    }
    Ok(records)
}

fn emit(sink: &mut dyn Write, title: &str, ir: &StepIr) {
    // Printing is diagnostics; a closed stderr must not fail the compilation.
    let _ = writeln!(sink, "// ----- {title} -----");
    let _ = sink.write_all(text::print(ir).as_bytes());
}

fn dump(dir: &std::path::Path, file: &str, ir: &StepIr) -> Result<()> {
    let path = dir.join(file);
    std::fs::write(&path, text::print(ir)).map_err(|source| PassError::Dump { path, source })
}
