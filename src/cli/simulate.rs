//! `slimpack simulate FILE`: predict the time and memory of a compiled step, read either as step
//! IR text (`compile --emit ir`) or as schedule JSON (`compile --emit json`); the same step gives
//! the same figures as compile reported.

use anyhow::Context;
use clap::Args;
use std::path::PathBuf;

use slimpack_codegen::schedule_json;
use slimpack_ir::{text, StepIr};

use super::compile::{ReportFormat, SimulationArgs};

#[derive(Debug, Args)]
pub struct SimulateArgs {
    /// A scheduled step: IR text (`.sir`) or schedule JSON (`.json`, or any file starting
    /// with '{').
    input: PathBuf,
    /// Report format: text (stderr) or json (one object on stdout).
    #[arg(long, value_enum, default_value = "text")]
    report: ReportFormat,
    /// Kernel rates measured by `slimpack calibrate` on the step's device (see `compile`).
    #[arg(long, value_name = "FILE.json")]
    calibration: Option<PathBuf>,
    #[command(flatten)]
    pictures: SimulationArgs,
}

/// Reads a step from IR text or schedule JSON, whichever `source` holds.
fn read_step(source: &str, name: &str) -> anyhow::Result<StepIr> {
    let is_json = name.ends_with(".json") || super::input::is_schedule_json(source);
    let ir = if is_json {
        let document = schedule_json::parse(source).with_context(|| name.to_string())?;
        schedule_json::to_ir(&document).with_context(|| name.to_string())?
    } else {
        text::parse(source, name)?
    };
    slimpack_ir::verify::verify(&ir)?;
    Ok(ir)
}

pub fn run(args: SimulateArgs) -> anyhow::Result<()> {
    super::output::check_distinct(
        &[
            ("input", Some(&args.input)),
            ("--calibration", args.calibration.as_deref()),
        ],
        &[&[args.report.output()][..], &args.pictures.outputs()].concat(),
    )?;
    let name = args.input.display().to_string();
    let source = slimpack_ir::file::read_to_string(&args.input)
        .with_context(|| format!("cannot read {name}"))?;
    let ir = read_step(&source, &name)?;
    if ir.phase() < slimpack_ir::step::Phase::Scheduled {
        anyhow::bail!(
            "{name}: a step at phase '{}' has no schedule to simulate (compile it with --strategy, or add the packing and scheduling passes)",
            ir.phase()
        );
    }
    if let Some(path) = &args.calibration {
        super::input::use_calibration_file(path, &ir.spec)?;
    }
    let (result, ms) = args.pictures.simulate(&ir)?;
    args.pictures.write(&result)?;
    match args.report {
        ReportFormat::Json => println!("{}", serde_json::to_string_pretty(&result.metrics)?),
        ReportFormat::Text => {
            eprintln!(
                "simulated {name} ({} samples, {} tokens)",
                ir.samples().len(),
                ir.tokens()
            );
            super::report::print_metrics(&result.metrics, ms);
        }
    }
    Ok(())
}
