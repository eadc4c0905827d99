//! Flags shared by commands that read a job: the spec (`--config` or `--model/--cluster/
//! --parallel`) and the batch (`--batch FILE` or `--synthetic ...`, with `--context`,
//! `--global-batch`, `--global-batch-tokens`, `--seed`). Flags override a config file's values.

use anyhow::{bail, Context};
use clap::Args;
use std::path::{Path, PathBuf};

use slimpack_ir::batch::{
    Batch, BatchConfig, BatchOptions, Dataset, DatasetFormat, DistributionKind, SyntheticConfig,
    Tokenizer,
};
use slimpack_ir::spec::{ClusterSpec, ConfigFile, ModelSpec, ParallelSpec, Recompute};
use slimpack_ir::Spec;

use slimpack::tune::strategy::Choices;

/// Model, cluster and layout.
#[derive(Debug, Default, Args)]
pub struct SpecArgs {
    /// A TOML job file with [model], [cluster], [parallel] and optionally [batch] tables.
    #[arg(long, value_name = "FILE.toml")]
    pub config: Option<PathBuf>,
    /// Model preset: tiny, llama-7b, llama-13b, llama-34b, llama-70b, llama-150b.
    #[arg(long, value_name = "PRESET")]
    pub model: Option<String>,
    /// Cluster preset: h100-sxm, h800, h200, a100-80g, cpu.
    #[arg(long, value_name = "PRESET")]
    pub cluster: Option<String>,
    /// Parallel layout, e.g. tp=8,pp=4,dp=4 (cp=N fixes a static CP degree).
    #[arg(long, value_name = "tp=..,cp=..,pp=..,dp=..")]
    pub parallel: Option<String>,
    /// Activation recomputation: none, selective, full (overrides the model's).
    #[arg(long, value_name = "MODE")]
    pub recompute: Option<String>,
    /// Kernel rates measured by `slimpack calibrate` on the cluster's device: the machine
    /// model plans and simulates with them instead of its analytic curves.
    #[arg(long, value_name = "FILE.json")]
    pub calibration: Option<PathBuf>,
}

/// The files a job reads, for [`super::output::check_distinct`]: those its flags name
/// (`--config`, `--calibration`, `--batch`) and the lengths file a config's `[batch]` table
/// names, where no `--batch` or `--synthetic` replaces it.
pub struct JobInputs<'a> {
    flags: [super::output::Named<'a>; 3],
    config_batch: Option<PathBuf>,
}

impl JobInputs<'_> {
    pub fn named(&self) -> Vec<super::output::Named<'_>> {
        let mut named = self.flags.to_vec();
        named.push(("--config [batch]", self.config_batch.as_deref()));
        named
    }
}

/// Where the global batch comes from.
#[derive(Debug, Default, Args)]
pub struct BatchArgs {
    /// Lengths (text, one per line; JSON array; JSONL with a length field) or a JSONL corpus; `-`
    /// reads standard input.
    #[arg(long, value_name = "FILE")]
    pub batch: Option<PathBuf>,
    /// Format of --batch: auto, text, json, jsonl, corpus.
    #[arg(long, value_name = "FORMAT")]
    pub batch_format: Option<String>,
    /// JSONL field holding the length (default: length, len, num_tokens, n_tokens).
    #[arg(long, value_name = "NAME")]
    pub length_field: Option<String>,
    /// JSONL field holding the text of a corpus (default: text).
    #[arg(long, value_name = "NAME")]
    pub text_field: Option<String>,
    /// Tokenizer for a text corpus: cl100k_base, o200k_base.
    #[arg(long, value_name = "NAME")]
    pub tokenizer: Option<String>,
    /// Synthetic lengths instead of a file, e.g. lognormal:median=1024,sigma=1.2,count=512
    /// or pareto:scale=256,shape=1.1,count=512 (optional max=N, seed=N).
    #[arg(long, value_name = "DIST:K=V,..")]
    pub synthetic: Option<String>,
    /// Context length: longer documents are cut into context-length samples (and counted).
    #[arg(long, value_name = "N")]
    pub context: Option<u32>,
    /// Global batch size in samples (drawn in a seeded order).
    #[arg(long, value_name = "N")]
    pub global_batch: Option<usize>,
    /// Global batch size in tokens (drawn in a seeded order).
    #[arg(long, value_name = "N")]
    pub global_batch_tokens: Option<u64>,
    /// Seed of the batch draw (and of synthetic lengths).
    #[arg(long, value_name = "S")]
    pub seed: Option<u64>,
}

/// The first spec or batch flag given, by name: a step read from a file carries its own spec
/// and batch, so such a flag would be silently ignored.
pub fn first_job_flag(spec: &SpecArgs, batch: &BatchArgs) -> Option<&'static str> {
    first_given([
        ("--config", spec.config.is_some()),
        ("--model", spec.model.is_some()),
        ("--cluster", spec.cluster.is_some()),
        ("--parallel", spec.parallel.is_some()),
        ("--recompute", spec.recompute.is_some()),
        ("--calibration", spec.calibration.is_some()),
        ("--batch", batch.batch.is_some()),
        ("--batch-format", batch.batch_format.is_some()),
        ("--length-field", batch.length_field.is_some()),
        ("--text-field", batch.text_field.is_some()),
        ("--tokenizer", batch.tokenizer.is_some()),
        ("--synthetic", batch.synthetic.is_some()),
        ("--context", batch.context.is_some()),
        ("--global-batch", batch.global_batch.is_some()),
        ("--global-batch-tokens", batch.global_batch_tokens.is_some()),
        ("--seed", batch.seed.is_some()),
    ])
}

/// The first of `flags` given (each with whether it was), by name.
pub fn first_given<'a>(flags: impl IntoIterator<Item = (&'a str, bool)>) -> Option<&'a str> {
    flags
        .into_iter()
        .find_map(|(flag, given)| given.then_some(flag))
}

/// A job: the spec, and the raw `[batch]` table of its config file with the file's directory.
pub struct Job {
    pub spec: Spec,
    config_batch: Option<(toml::Table, PathBuf, String)>,
    /// The user named the recompute mode (`--recompute`, or `recompute` in the config file's
    /// `[model]` table when `--model` does not replace it): tuning keeps it.
    recompute_named: bool,
    /// The user named `vpp` in `--parallel`: tuning keeps the layout's model chunks (`vpp=1`
    /// included: a Megatron user's `vpp=2` is tried only where the layout leaves it open).
    vpp_named: bool,
}

impl SpecArgs {
    /// Reads the config file (if any), applies the flags, validates.
    pub fn job(&self) -> anyhow::Result<Job> {
        let (mut spec, config_batch, mut recompute_named) = match &self.config {
            Some(path) => {
                let config = ConfigFile::load(path)?;
                let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
                let batch = config
                    .batch
                    .map(|table| (table, dir, path.display().to_string()));
                (Some(config.spec), batch, config.recompute_named)
            }
            None => (None, None, false),
        };
        if let Some(model) = &self.model {
            let model = ModelSpec::preset(model).context("--model")?;
            recompute_named = false;
            match &mut spec {
                Some(spec) => spec.model = model,
                None => spec = Some(self.spec_from_flags(model)?),
            }
        }
        let Some(mut spec) = spec else {
            bail!("give --config FILE.toml, or --model, --cluster and --parallel");
        };
        if let Some(cluster) = &self.cluster {
            spec.cluster = ClusterSpec::preset(cluster).context("--cluster")?;
        }
        if let Some(parallel) = &self.parallel {
            spec.parallel = parallel.parse()?;
        }
        if let Some(mode) = &self.recompute {
            spec.model.recompute = mode
                .parse::<Recompute>()
                .map_err(|e| anyhow::anyhow!("--recompute: {e}"))?;
            recompute_named = true;
        }
        spec.validate()?;
        if let Recompute::Block(layers) = spec.model.recompute {
            let chunk = spec.layers_per_chunk();
            if layers > chunk {
                bail!(
                    "recompute block:{layers}: a stage of {} at {} has {chunk} layers (block:{chunk} \
                     recomputes all of them, which is recompute=full)",
                    spec.model.name,
                    spec.parallel
                );
            }
        }
        if let Some(path) = &self.calibration {
            use_calibration_file(path, &spec)?;
        }
        let vpp_named =
            (self.parallel.as_deref()).is_some_and(|parallel| ParallelSpec::gives(parallel, "vpp"));
        Ok(Job {
            spec,
            config_batch,
            recompute_named,
            vpp_named,
        })
    }

    fn spec_from_flags(&self, model: ModelSpec) -> anyhow::Result<Spec> {
        let (Some(cluster), Some(parallel)) = (&self.cluster, &self.parallel) else {
            bail!("--model needs --cluster and --parallel too (or use --config FILE.toml)");
        };
        let parallel: ParallelSpec = parallel.parse()?;
        Ok(Spec {
            model,
            cluster: ClusterSpec::preset(cluster).context("--cluster")?,
            parallel,
        })
    }
}

/// Reads a `slimpack calibrate` table and makes the machine model use it; it must have been
/// measured on the spec's device.
pub fn use_calibration_file(path: &Path, spec: &Spec) -> anyhow::Result<()> {
    slimpack_machine::use_calibration_file(path, spec)
        .with_context(|| format!("--calibration {}", path.display()))
}

impl Job {
    /// The files this job reads (see [`JobInputs`]).
    pub fn inputs<'a>(&self, spec: &'a SpecArgs, batch: &'a BatchArgs) -> JobInputs<'a> {
        let replaced = batch.batch.is_some() || batch.synthetic.is_some();
        let config_batch = match &self.config_batch {
            Some((table, dir, _)) if !replaced => table
                .get("file")
                .and_then(|file| file.as_str())
                .map(|file| dir.join(file)),
            _ => None,
        };
        JobInputs {
            flags: [
                ("--config", spec.config.as_deref()),
                ("--calibration", spec.calibration.as_deref()),
                ("--batch", batch.batch.as_deref()),
            ],
            config_batch,
        }
    }

    /// The dataset and batch options: the config's `[batch]` table overridden by the flags.
    pub fn dataset(&self, args: &BatchArgs) -> anyhow::Result<(Dataset, BatchOptions)> {
        resolve_dataset(self.config_batch.as_ref(), args)
    }

    /// The global batch of one step.
    pub fn batch(&self, args: &BatchArgs) -> anyhow::Result<Batch> {
        let (dataset, options) = self.dataset(args)?;
        Ok(dataset.global_batch(&options)?)
    }
}

impl BatchArgs {
    /// The dataset and batch options from the flags alone (commands without a spec).
    pub fn dataset(&self) -> anyhow::Result<(Dataset, BatchOptions)> {
        resolve_dataset(None, self)
    }
}

/// A config file's `[batch]` table (if any) overridden by the batch flags.
fn resolve_dataset(
    config_batch: Option<&(toml::Table, PathBuf, String)>,
    args: &BatchArgs,
) -> anyhow::Result<(Dataset, BatchOptions)> {
    if let (Some(file), Some(synthetic)) = (&args.batch, &args.synthetic) {
        bail!(
            "--batch {} and --synthetic {synthetic} both name the batch; give one",
            file.display()
        );
    }
    // The flags' values are checked as flags (the merged options' errors name the config's
    // keys, where only the config can have put a bad value).
    BatchOptions {
        context: args.context,
        global_batch: args.global_batch,
        global_batch_tokens: args.global_batch_tokens,
        seed: 0,
    }
    .validate()?;
    let (mut config, mut base_dir) = match config_batch {
        Some((table, dir, name)) => (BatchConfig::from_table(table.clone(), name)?, dir.clone()),
        None => (BatchConfig::default(), PathBuf::new()),
    };
    if let Some(file) = &args.batch {
        // A path given as a flag is relative to the working directory, not to the config.
        config.file = Some(file.clone());
        config.synthetic = None;
        base_dir = PathBuf::new();
    }
    if let Some(text) = &args.synthetic {
        config.synthetic = Some(parse_synthetic(text)?);
        config.file = None;
    }
    if let Some(format) = &args.batch_format {
        config.format = Some(parse_named(
            format,
            "--batch-format",
            &DatasetFormat::ALL.map(|f| f.name()),
            |f| DatasetFormat::ALL.into_iter().find(|x| x.name() == f),
        )?);
    }
    if let Some(tokenizer) = &args.tokenizer {
        let short = |t: Tokenizer| t.name().trim_end_matches("_base").to_string();
        config.tokenizer = Some(parse_named(
            tokenizer,
            "--tokenizer",
            &Tokenizer::ALL.map(|t| t.name()),
            |name| {
                Tokenizer::ALL
                    .into_iter()
                    .find(|&t| t.name() == name || short(t) == name)
            },
        )?);
    }
    if args.length_field.is_some() {
        config.field = args.length_field.clone();
    }
    if args.text_field.is_some() {
        config.text_field = args.text_field.clone();
    }
    if args.context.is_some() {
        config.context = args.context;
    }
    if args.global_batch.is_some() || args.global_batch_tokens.is_some() {
        config.global_batch = args.global_batch;
        config.global_batch_tokens = args.global_batch_tokens;
    }
    if args.seed.is_some() {
        config.seed = args.seed;
    }
    if config.file.is_none() && config.synthetic.is_none() {
        bail!("no batch: give --batch FILE or --synthetic DIST:K=V,.. (or a [batch] table in --config)");
    }
    Ok(config.resolve(&base_dir)?)
}

fn parse_named<T>(
    value: &str,
    flag: &str,
    valid: &[&str],
    find: impl Fn(&str) -> Option<T>,
) -> anyhow::Result<T> {
    find(value).ok_or_else(|| {
        anyhow::anyhow!(
            "{flag}: unknown value '{value}' (valid: {})",
            valid.join(", ")
        )
    })
}

/// Parses `lognormal:median=1024,sigma=1.2,count=512[,max=N][,seed=N]` or
/// `pareto:scale=256,shape=1.1,count=512[,...]`.
fn parse_synthetic(text: &str) -> anyhow::Result<SyntheticConfig> {
    let usage = "expected lognormal:median=M,sigma=S,count=N or pareto:scale=X,shape=A,count=N (optional max=N,seed=N)";
    let (dist, rest) = text
        .split_once(':')
        .ok_or_else(|| anyhow::anyhow!("--synthetic '{text}': {usage}"))?;
    let dist = match dist.trim() {
        "lognormal" => DistributionKind::Lognormal,
        "pareto" => DistributionKind::Pareto,
        other => bail!("--synthetic: unknown distribution '{other}' (valid: lognormal, pareto)"),
    };
    let mut config = SyntheticConfig {
        dist,
        median: None,
        sigma: None,
        scale: None,
        shape: None,
        count: 0,
        max: None,
        seed: None,
    };
    let mut seen: Vec<&str> = Vec::new();
    for part in rest.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (key, value) = part
            .split_once('=')
            .ok_or_else(|| anyhow::anyhow!("--synthetic: '{part}' is not key=value; {usage}"))?;
        if seen.contains(&key.trim()) {
            bail!("--synthetic: '{}' is given twice in '{text}'", key.trim());
        }
        seen.push(key.trim());
        let number = |what: &str| -> anyhow::Result<f64> {
            value
                .trim()
                .parse::<f64>()
                .map_err(|_| anyhow::anyhow!("--synthetic: {key}='{value}' is not {what}"))
        };
        let integer = |what: &str| -> anyhow::Result<u64> {
            value
                .trim()
                .parse::<u64>()
                .map_err(|_| anyhow::anyhow!("--synthetic: {key}='{value}' is not {what}"))
        };
        match key.trim() {
            "median" => config.median = Some(number("a number")?),
            "sigma" => config.sigma = Some(number("a number")?),
            "scale" => config.scale = Some(number("a number")?),
            "shape" => config.shape = Some(number("a number")?),
            "count" => config.count = integer("a document count")? as usize,
            "max" => {
                config.max = Some(
                    u32::try_from(integer("a length")?)
                        .map_err(|_| anyhow::anyhow!("--synthetic: max={value} is too large"))?,
                )
            }
            "seed" => config.seed = Some(integer("a seed")?),
            other => bail!("--synthetic: unknown parameter '{other}' (valid: median, sigma, scale, shape, count, max, seed)"),
        }
    }
    // Said in the flag's terms here (the config table's checks name `[batch]` keys).
    let (name, own, others) = match dist {
        DistributionKind::Lognormal => ("lognormal", ["median", "sigma"], ["scale", "shape"]),
        DistributionKind::Pareto => ("pareto", ["scale", "shape"], ["median", "sigma"]),
    };
    if let Some(other) = others.iter().find(|key| seen.contains(key)) {
        bail!(
            "--synthetic: {name} takes {} and {}, not {other}",
            own[0],
            own[1]
        );
    }
    let missing: Vec<&str> = [own[0], own[1], "count"]
        .into_iter()
        .filter(|key| !seen.contains(key))
        .collect();
    if !missing.is_empty() {
        bail!(
            "--synthetic '{text}': {name} needs {}; {usage}",
            missing.join(", ")
        );
    }
    Ok(config)
}

/// What a strategy's tuning may choose among: every recompute mode unless the user named one
/// (`--recompute`, or `recompute` in the config file's `[model]`), within `--memory-limit` (a
/// fraction of device memory in (0, 1]; default 0.92).
/// Whether `source` is schedule JSON rather than text IR: a JSON document starts with `{`,
/// the text IR never does.
pub fn is_schedule_json(source: &str) -> bool {
    source.trim_start().starts_with('{')
}

pub fn tuning_choices(job: &Job, memory_limit: Option<&str>) -> anyhow::Result<Choices> {
    let mut choices = if job.recompute_named {
        Choices::fixed(job.spec.model.recompute)
    } else {
        Choices::all()
    };
    if let Some(text) = memory_limit {
        choices.memory_limit = parse_memory_limit(text)?;
    }
    if job.vpp_named {
        choices = choices.one_chunk_per_device();
    }
    Ok(choices)
}

/// `--memory-limit`: a fraction of device memory in (0, 1].
pub fn parse_memory_limit(text: &str) -> anyhow::Result<f64> {
    match text.trim().parse::<f64>() {
        Ok(fraction) if fraction > 0.0 && fraction <= 1.0 => Ok(fraction),
        _ => bail!("--memory-limit {text}: give a fraction of device memory in (0, 1], e.g. 0.92"),
    }
}

/// Refuses a `--threads` outside 1 to four per core (more only measure the scheduler, or spawn
/// threads that wait; a huge count used to abort allocating their table).
pub fn check_threads(threads: usize) -> anyhow::Result<()> {
    let max = 4 * std::thread::available_parallelism().map_or(1, |n| n.get());
    if !(1..=max).contains(&threads) {
        bail!("--threads {threads}: give 1 to {max} (4 per core of this machine)");
    }
    Ok(())
}
