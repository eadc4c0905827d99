//! `slimpack calibrate --backend cpu|cuda`: measure this machine's kernels and write the
//! calibration tables the machine model uses for a cluster preset: the `cpu` preset from the
//! CPU backend (see `slimpack_runtime::cpu::calibration` for the method), or the preset of this
//! machine's GPU from the CUDA backend (`slimpack_runtime::cuda`, the same method and JSON;
//! `CostModel::with_calibration` loads either). Without a GPU `--backend cuda` fails in one
//! line saying why.

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::Args;

use slimpack_ir::spec::ClusterSpec;
use slimpack_ir::Spec;
use slimpack_machine::cost::Calibration;
use slimpack_runtime::cpu::calibration::{measure, CalibrationOptions};

use super::run::Backend;

#[derive(Debug, Args)]
pub struct CalibrateArgs {
    /// Backend whose kernels to measure: cpu, or cuda (GPU 0).
    #[arg(long, value_enum)]
    backend: Backend,
    /// Model whose kernel shapes to measure (an fp32 preset).
    #[arg(long, value_name = "PRESET", default_value = "tiny")]
    model: String,
    /// Cluster preset the tables are for (cuda only; default: the preset of the GPU's name).
    #[arg(long, value_name = "PRESET")]
    cluster: Option<String>,
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

/// The longest `--min-seconds` (an hour per point).
const MAX_MIN_SECONDS: f64 = 3600.0;

pub fn run(args: CalibrateArgs) -> anyhow::Result<()> {
    super::output::check_directory("-o", args.output.as_deref())?;
    let gpu = match args.backend {
        Backend::Cpu => {
            if let Some(cluster) = args.cluster.as_deref().filter(|&name| name != "cpu") {
                ClusterSpec::preset(cluster).context("--cluster")?;
                bail!("--cluster {cluster}: the cpu backend calibrates the cpu preset (give --backend cuda for a GPU's)");
            }
            None
        }
        Backend::Cuda => {
            Some(slimpack::gpu::first_gpu().map_err(|e| anyhow::anyhow!("--backend cuda: {e}"))?)
        }
    };
    let cluster = match (&gpu, &args.cluster) {
        (None, _) => "cpu".to_string(),
        (Some(_), Some(cluster)) => cluster.clone(),
        (Some((info, _)), None) => slimpack::gpu::cluster_preset(&info.name)
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "--backend cuda: no cluster preset describes {}; give --cluster PRESET",
                    info.name
                )
            })?
            .to_string(),
    };
    let mut spec = Spec::from_presets(&args.model, "cpu", "tp=1,pp=1,dp=1").context("--model")?;
    spec.cluster = ClusterSpec::preset(&cluster).context("--cluster")?;
    if !(args.min_seconds.is_finite() && (0.0..=MAX_MIN_SECONDS).contains(&args.min_seconds)) {
        bail!(
            "--min-seconds {}: give a number of seconds from 0 to {MAX_MIN_SECONDS}",
            args.min_seconds
        );
    }
    super::input::check_threads(args.threads)?;
    let mut options = CalibrationOptions {
        min_seconds: args.min_seconds,
        threads: args.threads,
        ..CalibrationOptions::default()
    };
    if let Some(tokens) = args.tokens {
        if tokens.is_empty() || tokens.windows(2).any(|w| w[0] >= w[1]) || tokens[0] == 0 {
            bail!("--tokens: give positive, strictly increasing token counts");
        }
        options.tokens = tokens;
    }
    let calibration = match &gpu {
        None => calibrate_cpu(&spec, &options)?,
        Some((_, kernels)) => {
            if args.threads != 1 {
                bail!(
                    "--threads {}: the cuda backend measures one copy (on GPU 0)",
                    args.threads
                );
            }
            slimpack_runtime::cuda::calibrate(&spec, &options, kernels)
                .map_err(|e| anyhow::anyhow!("--backend cuda: {e}"))?
        }
    };
    match super::output::file(args.output.as_deref()) {
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

/// The CPU backend's calibration, after checking that its copies fit in host memory.
fn calibrate_cpu(spec: &Spec, options: &CalibrationOptions) -> anyhow::Result<Calibration> {
    let largest = *options.tokens.last().expect("at least one token count");
    let largest = u32::try_from(largest)
        .map_err(|_| anyhow::anyhow!("--tokens {largest}: at most {} tokens", u32::MAX))?;
    let per_copy = slimpack::limits::single_pack_peak_bytes(spec, largest)?;
    slimpack::limits::check_fits(
        &format!(
            "calibrate --tokens {largest} --threads {} (a pack of {largest} tokens per copy)",
            options.threads
        ),
        per_copy.saturating_mul(options.threads as u64),
    )?;
    measure(spec, options).context("--backend cpu")
}
