//! `slimpack lengths`: a dataset's token counts, one per line — how a text corpus becomes the
//! length file every other command reads quickly (tokenizing once, planning many times).
//!
//! Without `--context`, `--global-batch`, `--global-batch-tokens` or `--seed` it prints every
//! document's length in file order (zero-length documents skipped, as everywhere); with any of
//! them, the sample lengths of that global batch (drawn and cut exactly as `compile` draws and
//! cuts it). A summary line (count, tokens, median, p99, max) goes to stderr.

use clap::Args;
use std::path::PathBuf;

use super::input::BatchArgs;

#[derive(Debug, Args)]
pub struct LengthsArgs {
    #[command(flatten)]
    batch: BatchArgs,
    /// Write the lengths here (default: standard output).
    #[arg(short, long, value_name = "FILE")]
    output: Option<PathBuf>,
}

pub fn run(args: LengthsArgs) -> anyhow::Result<()> {
    super::output::check_distinct(
        &[("--batch", args.batch.batch.as_deref())],
        &[("-o", args.output.as_deref())],
    )?;
    let (dataset, options) = args.batch.dataset()?;
    let draws = args.batch.context.is_some()
        || args.batch.global_batch.is_some()
        || args.batch.global_batch_tokens.is_some()
        || args.batch.seed.is_some();
    let (lengths, what) = if draws {
        let batch = dataset.global_batch(&options)?;
        let lengths: Vec<u32> = batch.samples.iter().map(|sample| sample.len).collect();
        (
            lengths,
            format!("samples of one global batch of {}", dataset.name),
        )
    } else {
        (
            dataset.lengths.clone(),
            format!("documents of {}", dataset.name),
        )
    };
    let mut text = String::with_capacity(lengths.len() * 6);
    for length in &lengths {
        text.push_str(&length.to_string());
        text.push('\n');
    }
    super::output::write(args.output.as_deref(), &text)?;
    eprintln!("{}", summary(&lengths, &what, dataset.empty));
    Ok(())
}

/// `N documents, T tokens (median m, p99 p, max x); E empty skipped`.
fn summary(lengths: &[u32], what: &str, empty: u64) -> String {
    let mut sorted = lengths.to_vec();
    sorted.sort_unstable();
    let tokens: u64 = sorted.iter().map(|&l| u64::from(l)).sum();
    let quantile = |q: f64| sorted[((sorted.len() - 1) as f64 * q).round() as usize];
    format!(
        "{} {what}: {tokens} tokens (median {}, p90 {}, p99 {}, max {}); {empty} empty skipped",
        sorted.len(),
        quantile(0.5),
        quantile(0.9),
        quantile(0.99),
        sorted[sorted.len() - 1],
    )
}

#[cfg(test)]
mod tests {
    use super::summary;

    #[test]
    fn summary_quantiles() {
        let lengths: Vec<u32> = (1..=100).collect();
        assert_eq!(
            summary(&lengths, "documents of x", 2),
            "100 documents of x: 5050 tokens (median 51, p90 90, p99 99, max 100); 2 empty skipped"
        );
    }
}
