//! `slimpack simulate FILE`: predict the time and memory of a compiled step.

use anyhow::Context;
use clap::Args;
use std::path::PathBuf;

use slimpack_ir::text;

use super::compile::{ReportFormat, SimulationArgs};

#[derive(Debug, Args)]
pub struct SimulateArgs {
    /// A scheduled step IR (`.sir`, as `compile --emit ir` writes it).
    input: PathBuf,
    /// Report format: text (stderr) or json (one object on stdout).
    #[arg(long, value_enum, default_value = "text")]
    report: ReportFormat,
    #[command(flatten)]
    pictures: SimulationArgs,
}

pub fn run(args: SimulateArgs) -> anyhow::Result<()> {
    let source = std::fs::read_to_string(&args.input)
        .with_context(|| format!("cannot read {}", args.input.display()))?;
    let ir = text::parse(&source, &args.input.display().to_string())?;
    slimpack_ir::verify::verify(&ir)?;
    let (result, ms) = args.pictures.simulate(&ir)?;
    match args.report {
        ReportFormat::Json => println!("{}", serde_json::to_string_pretty(&result.metrics)?),
        ReportFormat::Text => {
            eprintln!(
                "simulated {} ({} samples, {} tokens)",
                args.input.display(),
                ir.samples().len(),
                ir.tokens()
            );
            super::report::print_metrics(&result.metrics, ms);
        }
    }
    Ok(())
}
