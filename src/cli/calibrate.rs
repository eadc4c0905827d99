//! `slimpack calibrate --backend cpu`: measure this machine's kernels and write the calibration
//! tables the machine model uses for the `cpu` cluster preset (see
//! `slimpack_runtime::cpu::calibration` for the method).

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::Args;

use slimpack_ir::spec::ClusterSpec;
use slimpack_ir::Spec;
use slimpack_runtime::cpu::calibration::{measure, CalibrationOptions};

use super::run::Backend;

#[derive(Debug, Args)]
pub struct CalibrateArgs {
    /// Backend whose kernels to measure: cpu.
    #[arg(long, value_enum)]
    backend: Backend,
    /// Model whose kernel shapes to measure (an fp32 preset).
    #[arg(long, value_name = "PRESET", default_value = "tiny")]
    model: String,
    /// Token counts to measure at, comma-separated and increasing.
    #[arg(long, value_name = "N,N,..", value_delimiter = ',')]
    tokens: Option<Vec<usize>>,
    /// Least seconds of repeated runs per point.
    #[arg(long, value_name = "S", default_value_t = 0.5)]
    min_seconds: f64,
    /// Copies measured at once (the number of workers the runs will keep busy).
    #[arg(long, value_name = "N", default_value_t = 1)]
    threads: usize,
    /// Write the calibration JSON here (default: standard output).
    #[arg(short, long, value_name = "FILE")]
    output: Option<PathBuf>,
}

pub fn run(args: CalibrateArgs) -> anyhow::Result<()> {
    if args.backend != Backend::Cpu {
        bail!(
            "--backend {:?}: only the cpu backend can calibrate in this build",
            args.backend
        );
    }
    let mut spec = Spec::from_presets(&args.model, "cpu", "tp=1,pp=1,dp=1").context("--model")?;
    spec.cluster = ClusterSpec::preset("cpu")?;
    let mut options = CalibrationOptions {
        min_seconds: args.min_seconds,
        threads: args.threads.max(1),
        ..CalibrationOptions::default()
    };
    if let Some(tokens) = args.tokens {
        if tokens.is_empty() || tokens.windows(2).any(|w| w[0] >= w[1]) || tokens[0] == 0 {
            bail!("--tokens: give positive, strictly increasing token counts");
        }
        options.tokens = tokens;
    }
    let calibration = measure(&spec, &options).context("--backend cpu")?;
    match &args.output {
        Some(path) => {
            calibration.save(path)?;
            eprintln!("wrote {}", path.display());
        }
        None => println!("{}", calibration.to_json()),
    }
    for (op, table) in &calibration.tables {
        let rates: Vec<String> = table
            .points()
            .iter()
            .map(|p| format!("{}:{:.2e}", p.tokens, p.rate))
            .collect();
        eprintln!("  {:<20} {}", op.as_str(), rates.join(" "));
    }
    Ok(())
}
